//! CharacterBench's stage kinds, one file each, named `characterbench_<file stem>`.
//! Evaluation: the release as one record per language (`release`), the official
//! role-play prompt (`roleplay`), the official judge prompt (`judge`), the benchmark's
//! scores in the Tables 4–5 layout (`score`). Construction: target-oriented query plans
//! per character and dimension (`targets`), test scripts in the release's record layout
//! (`script`), the release files with a card (`export`). Sampling several judge answers, their mean and the correlation with human
//! scores are the engine's `llm` (`n`), `aggregate` and `correlate`.

pub mod export;
pub mod judge;
pub mod release;
pub mod roleplay;
pub mod score;
pub mod script;
pub mod targets;

use crate::bench::Bench;
use synth_core::config::diag::Diagnostics;
use synth_engine::stages::BuildCtx;

/// The default of every kind's `dimensions` option.
pub const DEFAULT_DIMENSIONS: &str = "\"pipelines/prompts/characterbench/dimensions.json\"";

/// The benchmark definition named by a kind's `dimensions` option, or a diagnostic there.
pub fn read_bench(ctx: &BuildCtx<'_>, diags: &mut Diagnostics, path: &str) -> Option<Bench> {
    match Bench::read(&ctx.root.join(path)) {
        Ok(b) => Some(b),
        Err(e) => {
            ctx.error(diags, "dimensions", e);
            None
        }
    }
}

/// Languages named by an option, checked against the definition.
pub fn check_langs(ctx: &BuildCtx<'_>, diags: &mut Diagnostics, bench: &Bench, langs: &[String]) -> bool {
    for l in langs {
        if !bench.languages.contains_key(l) {
            let known: Vec<&str> = bench.languages.keys().map(String::as_str).collect();
            ctx.error(diags, "langs", format!("unknown language \"{l}\" (the definition has: {})", known.join(", ")));
            return false;
        }
    }
    true
}
