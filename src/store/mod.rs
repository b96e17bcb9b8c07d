//! Everything synth persists: crash-safe files, Parquet outputs, failure tables,
//! per-stage state records, the run manifest, the lock file of upstream versions,
//! input file hashes, and the SQLite cache and journal of LLM responses and vectors.

pub mod atomic;
pub mod cache;
pub mod failures;
pub mod filehash;
pub mod idcheck;
pub mod lock;
pub mod parquet;
pub mod state;
pub mod summary;
