//! Everything synth persists: crash-safe files, Parquet outputs, failure tables,
//! per-stage state records, the run manifest and input file hashes. (The LLM
//! response cache and journal join this module with the provider layer.)

pub mod atomic;
pub mod failures;
pub mod filehash;
pub mod idcheck;
pub mod parquet;
pub mod state;
