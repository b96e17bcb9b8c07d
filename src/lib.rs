//! synth: a data-synthesis pipeline orchestrator. A pipeline is a TOML file of
//! stages; stages form a DAG through their `inputs`; every stage output is
//! materialized as Parquet, fingerprinted and reused when nothing changed.
//!
//! Layout (see ARCHITECTURE.md for the invariants):
//! - [`config`]: TOML → checked [`config::Pipeline`] with `path:line:col` diagnostics.
//! - [`dag`]: the graph, fingerprints and the scheduler that runs stages.
//! - [`stages`]: the `Stage` trait and one file per stage kind.
//! - [`store`]: crash-safe files, Parquet, failures, state records, the manifest.
//! - [`data`]: records as Arrow batches and their JSON view.
//! - [`template`]: minijinja templates and expressions over record columns.
//! - [`hub`]: Hugging Face Hub downloads (hf-hub).
//! - [`llm`]: chat providers, rate control, retries, parsers, the cached call path.
//! - [`embed`]: embedders (hashing, fastembed, OpenAI-compatible endpoints).
//! - [`rolemrc`]: the RoleMRC answer formats and planner.
//! - [`eval`]: reference metrics (BLEU, ROUGE, METEOR) equal to the official code.
//! - [`secrets`]: API keys kept out of every log and artifact.
//! - [`progress`]: progress bars and log lines.
//! - [`retrieval`]: exact (AVX-512) and HNSW max/min inner-product search.
//! - [`bench`]: `synth bench` measurements.
//! - [`cli`]: the command line.

pub mod bench;
pub mod cli;
pub mod config;
pub mod dag;
pub mod data;
pub mod embed;
pub mod eval;
pub mod hub;
pub mod llm;
pub mod progress;
pub mod retrieval;
pub mod rng;
pub mod rolemrc;
pub mod secrets;
pub mod stages;
pub mod store;
pub mod template;
