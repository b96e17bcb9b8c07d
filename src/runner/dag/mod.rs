//! The stage graph's execution: fingerprints (`fingerprint`), the scheduler that runs
//! ready stages concurrently, skips up-to-date ones and commits outputs (`runner`), and
//! sharded runs in waves (`waves`, `shard`) and where a run stands (`status`). The graph itself (edges from `inputs`,
//! topological order, cycles) is the compiler's ([`crate::pipeline::graph`]).

pub mod fingerprint;
pub mod runner;
pub mod shard;
pub mod status;
pub mod waves;
