//! synth: a data-synthesis pipeline orchestrator. A pipeline is a TOML file of
//! stages; stages form a DAG through their `inputs`; every stage output is
//! materialized as Parquet, fingerprinted and reused when nothing changed.
//!
//! synth is a Cargo workspace along its layer map (ARCHITECTURE.md, "Crates"); Cargo's
//! dependency graph keeps each crate to the ones below it. This crate is the top: the
//! built-in [`registry`] (the only place that knows every method), the binary (which hands
//! it to `synth-cli`) and, for the library's users and the tests, every lower crate's
//! modules under their one-crate names (`synth::config`, `synth::llm`, `synth::dag`, ...).
//! - L0 `synth-core`: [`data`], [`rng`], [`secrets`], [`template`], [`progress`],
//!   [`config`], [`store`], [`onnx`], [`hub`], [`fetch`]; beside it `synth-eval`
//!   ([`eval`]), `synth-retrieval` ([`retrieval`]), `synth-quality` ([`quality`]).
//! - L1 `synth-llm` ([`llm`]), `synth-embed` ([`embed`]).
//! - `synth-providers` ([`providers`]): the provider kinds beside `offline`, which only
//!   this crate depends on (the registry hands them down).
//! - L2-L3 `synth-engine`: [`services`], [`stages`] (the stage API), the registry type.
//! - L4 `synth-kinds` ([`kinds`]), the method crates ([`methods`]).
//! - L5 `synth-runner`: [`pipeline`], [`dag`], [`regen`].
//! - L6 `synth-view` ([`view`]), `synth-cli` ([`cli`], [`bench`]), then this crate.

pub mod methods;
pub mod pipeline;
pub mod registry;

pub use synth_cli::{self as cli, bench};
pub use synth_core::{config, data, fetch, hub, onnx, progress, rng, secrets, store, template};
pub use synth_embed as embed;
pub use synth_engine::{services, stages};
pub use synth_eval as eval;
pub use synth_kinds as kinds;
pub use synth_llm as llm;
pub use synth_providers as providers;
pub use synth_quality as quality;
pub use synth_retrieval as retrieval;
pub use synth_runner::{dag, regen};
pub use synth_view as view;
