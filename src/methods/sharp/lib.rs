//! SHARP / role-relationship fidelity (Kong et al., arXiv:2411.07965 v1,
//! `../shared/papers/relationship-fidelity.txt`; spec `../shared/specs/sharp.md`):
//! commonsense claims from ConceptNet put to a role-play agent by roles it loves and
//! hates, stance detection, SR / AR / ER / CRF. Here: ConceptNet lines, the claim filter
//! and rendering ([`conceptnet`], [`text`]), the rule files of `rules/sharp/<lang>/`
//! ([`rules`]) and the counterfactual rules ([`counterfact`]), the labels and metrics
//! ([`metrics`]), the parsers ([`parsers`]: stance, claim rewrites, a profile's relations)
//! and their offline stand-ins ([`offline`]), roles and Appendix B's turn ([`roles`], seeds
//! in `seeds/sharp/`), the stage kinds ([`stages`]).
//!
//! No code or data of the paper was released: every reconstructed choice is an option whose
//! help starts with `[R]`; each SHARP stage records the values in force (its report info,
//! hence the manifest, and `<stage>.choices.json`, which `sharp_card` lists).

use std::io::Write as _;

use anyhow::Result;
use serde_json::{Map, Value};

use synth_core::config::options::OptionSpec;
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_engine::registry::Method;
use synth_engine::stages::RunCtx;

pub mod conceptnet;
pub mod counterfact;
pub mod metrics;
pub mod offline;
pub mod parsers;
pub mod roles;
pub mod rules;
pub mod stages;
pub mod text;

/// The paper version this implementation follows (spec P1: later versions are retitled
/// SHARP and may revise metrics); in every SHARP stage's manifest entry.
pub const PAPER_VERSION: &str = "arxiv-2411.07965v1";

pub static METHOD: Method = Method {
    name: "sharp",
    about: "relationship fidelity: ConceptNet claims put to a role-play agent by roles of high / low affection, stance detection, SR / AR / ER / CRF (Kong et al., 2024)",
    kinds: &[
        &stages::claims::KIND,
        &stages::verify::KIND,
        &stages::roles::KIND,
        &stages::turns::KIND,
        &stages::vote::KIND,
        &stages::metrics::KIND,
        &stages::transfer::KIND,
        &stages::card::KIND,
    ],
    parsers: parsers::KINDS,
    shapes: offline::SHAPES,
};

/// The reconstructed ([R]) options of a kind with the values in force: the options whose
/// help starts with `[R]`, from the checked options (defaults filled).
pub fn reconstructed(specs: &[OptionSpec], options: &Value) -> Map<String, Value> {
    specs
        .iter()
        .filter(|s| s.doc.starts_with("[R]"))
        .map(|s| (s.name.to_string(), options.get(s.name).cloned().unwrap_or(Value::Null)))
        .collect()
}

/// Provenance of a SHARP stage: `paper_version` and its reconstructed choices in the stage
/// report (so in the manifest), and `<stage>.choices.json` beside its output.
pub fn record_choices(ctx: &mut RunCtx, kind: &str, choices: &Map<String, Value>) -> Result<()> {
    ctx.report.info.insert("paper_version".into(), PAPER_VERSION.into());
    if !choices.is_empty() {
        ctx.report.info.insert("reconstructed".into(), Value::Object(choices.clone()).to_string());
    }
    let doc = serde_json::json!({ "stage": ctx.name, "kind": kind, "paper_version": PAPER_VERSION, "reconstructed": choices });
    let (mut f, pending) = create_tmp(&ctx.out_dir.join(choices_file(&ctx.name)))?;
    f.write_all(serde_json::to_string_pretty(&doc)?.as_bytes())?;
    f.write_all(b"\n")?;
    finish_file(f, &pending)?;
    ctx.add_artifact(pending, None);
    Ok(())
}

/// The provenance file of a stage.
pub fn choices_file(stage: &str) -> String {
    format!("{stage}.choices.json")
}
