//! The pipeline compiler (`synth_runner::pipeline`) with [`load`] checking against the
//! built-in registry.

pub use synth_runner::pipeline::*;

use std::path::Path;

use synth_core::config::diag::Diagnostics;

/// Load and check a pipeline file against the built-in registry (engine kinds and
/// every method's): [`synth_runner::pipeline::load`] with [`crate::registry::builtin`].
pub fn load(path: &Path, opts: &LoadOptions) -> (Option<Pipeline>, Diagnostics) {
    synth_runner::pipeline::load(path, opts, crate::registry::builtin())
}
