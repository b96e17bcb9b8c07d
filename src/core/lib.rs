//! synth's leaves (layer L0): what every other crate builds on and nothing here knows a
//! stage, a provider or a method.
//! - [`data`]: records as Arrow batches, their JSON view.
//! - [`config`]: spanned TOML, diagnostics, option schemas, declarations.
//! - [`store`]: crash-safe files, Parquet, failures, state, the summary protocol, the
//!   response cache.
//! - [`rng`], [`secrets`] (keys kept out of every artifact, redaction), [`template`]
//!   (minijinja), [`progress`], [`onnx`] (ONNX Runtime), [`hub`] (hf-hub, Hub commits),
//!   [`fetch`] (files from http(s) URLs).

pub mod config;
pub mod data;
pub mod fetch;
pub mod hub;
pub mod onnx;
pub mod progress;
pub mod rng;
pub mod secrets;
pub mod store;
pub mod template;
