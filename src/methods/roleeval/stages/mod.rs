//! RoleEval's stage kinds, one file each, named `roleeval_<file stem>`. Evaluation:
//! the release as records (`release`), zero-/k-shot prompts (`prompts`), scoring and
//! the paper's tables as a summary (`score`). Construction: question slots per
//! character (`slots`), the per-character quality check (`qc`), the release layout
//! (`export`).

pub mod export;
pub mod prompts;
pub mod qc;
pub mod release;
pub mod score;
pub mod slots;

use crate::format::Format;
use synth_core::config::diag::Diagnostics;
use synth_engine::stages::BuildCtx;

/// The language file named by a kind's `format` option (relative to the pipeline root),
/// or a diagnostic on that option.
pub fn read_format(ctx: &BuildCtx<'_>, diags: &mut Diagnostics, format: &str) -> Option<Format> {
    match Format::read(&ctx.root.join(format)) {
        Ok(f) => Some(f),
        Err(e) => {
            ctx.error(diags, "format", e);
            None
        }
    }
}
