//! Everything synth persists: crash-safe files, Parquet outputs, failure tables,
//! per-stage state records, the run manifest, input file hashes, the SQLite
//! cache and journal of LLM responses and vectors, and the journal and files of
//! provider batches.

pub mod atomic;
pub mod batch;
pub mod cache;
pub mod failures;
pub mod filehash;
pub mod idcheck;
pub mod parquet;
pub mod state;
pub mod summary;
