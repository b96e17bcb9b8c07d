//! The one integration-test binary (ripgrep's layout: one link instead of one per
//! file). Engine tests are modules here; a method's tests live under
//! `tests/methods/<method>/`, its fixtures under `tests/fixtures/<method>/`.

mod support;

mod bad_input;
mod batch;
mod config_fixtures;
mod conformance;
mod correlate;
mod crash;
mod deploy;
mod engine;
mod estimate;
mod eval;
mod faq;
mod fastembed_embedder;
mod hub;
mod judge;
mod llm;
mod local;
mod methods;
mod neurons;
mod quality;
mod regen;
mod scheduling;
mod shard;
mod starter;
mod structured;
mod tidy;
mod train;
mod view;
