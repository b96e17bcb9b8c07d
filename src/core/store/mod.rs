//! Everything synth persists: crash-safe files, Parquet outputs, failure tables,
//! per-stage state records, the run manifest, the lock file of upstream versions,
//! input file hashes, the SQLite cache and journal of LLM responses and vectors, the
//! journal and files of provider batches; where they live (a local directory or an
//! object store, `object`) and the leases of sharded runs (`lease`).

pub mod atomic;
pub mod batch;
pub mod cache;
pub mod claims;
pub mod failures;
pub mod filehash;
pub mod idcheck;
pub mod lease;
pub mod lock;
pub mod object;
pub mod parquet;
pub mod state;
pub mod summary;
