//! The configuration vocabulary every layer shares: the spanned TOML document
//! ([`node`]), diagnostics that name `path:line:col` ([`diag`]), option schemas and
//! their checks ([`options`]), and provider / embedder declarations ([`decl`]). The
//! compiler that turns a pipeline file into a checked pipeline is `synth_runner::pipeline`.

pub mod decl;
pub mod diag;
pub mod node;
pub mod options;

use std::path::{Path, PathBuf};

/// Lexically clean a path: drop `.` components and fold `dir/..` (no filesystem access).
pub fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() { PathBuf::from(".") } else { out }
}
