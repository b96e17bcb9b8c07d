//! RoleMRC: the offline synthesis end to end, its parsers against fixtures, degenerate
//! preference pairs, the judge, the RoleBench cross-evaluation,
//! the neuron-level analysis, sharded runs.

mod e2e;
mod judge;
mod neurons;
mod pairs;
mod parsers;
mod rolebench;
mod shard;
