//! Pipeline configuration, compiled in two phases: the raw spanned TOML document
//! (with the chosen profile and `--set` overrides merged in), then a checked
//! [`Pipeline`] whose stages are built, whose graph is acyclic and whose columns
//! were planned. Only a checked pipeline can be run; every problem found on the way
//! is collected as a [`diag::Diagnostic`] naming `path:line:col`.

pub mod diag;
pub mod node;
pub mod options;
mod pipeline;

pub use pipeline::{LoadOptions, Pipeline, StageDecl, TOP_LEVEL, load, normalize, pipeline_options};
