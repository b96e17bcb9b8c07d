//! synth: a data-synthesis pipeline orchestrator. A pipeline is a TOML file of
//! stages; stages form a DAG through their `inputs`; every stage output is
//! materialized as Parquet, fingerprinted and reused when nothing changed.
//!
//! Layers, lowest first (ARCHITECTURE.md, "Layers"; `tests/tidy.rs` enforces them: a
//! module uses only modules of its own layer or below):
//! - L0 leaves: [`data`] (records as Arrow batches, their JSON view), [`rng`],
//!   [`secrets`] (keys kept out of every artifact, redaction), [`template`] (minijinja),
//!   [`progress`], [`config`] (spanned TOML, diagnostics, option schemas, declarations),
//!   [`store`] (crash-safe files, Parquet, failures, state, the summary protocol, the
//!   response cache), [`eval`] (reference metric ports), [`retrieval`] (exact and HNSW
//!   max/min inner-product search), [`onnx`] (ONNX Runtime), [`hub`] (hf-hub, Hub
//!   commits), [`fetch`] (files from http(s) URLs), [`quality`] (content checks,
//!   near-duplicate removal, review decisions).
//! - L1 capabilities: [`llm`] (providers, rate control, retries, parsers, the offline
//!   stand-in), [`embed`] (hashing, fastembed, OpenAI-compatible embedders).
//! - L2 run services: [`services`] (what a run shares: providers, embedders, cache,
//!   network runtime, the cached call path).
//! - L3 stage API and L4 kinds: [`stages`] (the `Stage` trait, contexts, `exec`; one file
//!   per engine kind), [`methods`] (one folder per benchmark method).
//! - L5 compile and run: [`pipeline`] (TOML → checked pipeline), [`dag`] (graph,
//!   fingerprints, the runner), [`registry`] (engine kinds + every method's),
//!   [`regen`] (locks, scheduled regeneration, snapshots, Hub releases).
//! - L6 front ends: [`cli`], [`bench`].

pub mod bench;
pub mod cli;
pub mod config;
pub mod dag;
pub mod data;
pub mod embed;
pub mod eval;
pub mod fetch;
pub mod hub;
pub mod llm;
pub mod methods;
pub mod onnx;
pub mod pipeline;
pub mod progress;
pub mod quality;
pub mod regen;
pub mod registry;
pub mod retrieval;
pub mod rng;
pub mod secrets;
pub mod services;
pub mod stages;
pub mod store;
pub mod template;
pub mod view;
