//! The checked `[regenerate]` table of a pipeline as a struct, and which files of a run
//! make a release: the export stages and the card.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::pipeline::Pipeline;
use synth_core::store::state::{Manifest, StageStatus};
use synth_engine::stages::Role;

#[derive(Debug, Clone, Deserialize)]
pub struct HubTarget {
    pub repo: String,
    pub branch: String,
    pub repo_type: String,
    pub endpoint: Option<String>,
    pub token_env: String,
    /// Tag template: `{id}`, `{date}`, `{fingerprint}`, `{name}`; empty for no tag.
    pub tag: String,
}

impl HubTarget {
    /// `--push REPO` without a `[regenerate.hub]` table.
    pub fn for_repo(repo: &str) -> HubTarget {
        HubTarget {
            repo: repo.to_string(),
            branch: "main".into(),
            repo_type: "dataset".into(),
            endpoint: None,
            token_env: "HF_TOKEN".into(),
            tag: "{id}".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct RegenConfig {
    pub exports: Option<Vec<String>>,
    pub card: Option<String>,
    pub snapshots_dir: String,
    pub keep: Option<usize>,
    pub hub: Option<HubTarget>,
    pub on_success: Option<String>,
    pub on_failure: Option<String>,
    pub on_unchanged: Option<String>,
    pub hook_timeout_seconds: u64,
}

impl RegenConfig {
    pub fn of(p: &Pipeline) -> Result<RegenConfig> {
        let mut v = p.regenerate.clone();
        if v.as_object().is_some_and(|o| o.is_empty()) {
            // No [regenerate] table: the defaults of the schema.
            let mut defaults = serde_json::Map::new();
            for spec in crate::pipeline::regenerate_options() {
                if let Some(d) = spec.default_json() {
                    defaults.insert(spec.name.to_string(), d);
                }
            }
            v = serde_json::Value::Object(defaults);
        }
        serde_json::from_value(v).context("[regenerate]")
    }

    /// The export stages: configured, or every sink.
    pub fn export_stages(&self, p: &Pipeline) -> Vec<String> {
        match &self.exports {
            Some(e) => e.clone(),
            None => p.stages.iter().filter(|s| s.kind.role == Role::Sink).map(|s| s.name.clone()).collect(),
        }
    }

    pub fn snapshots_dir(&self, out_dir: &std::path::Path) -> PathBuf {
        out_dir.join(&self.snapshots_dir)
    }
}

/// One export of a finished run: its stage and its files (relative to the output directory).
#[derive(Debug, Clone)]
pub struct Export {
    pub stage: String,
    pub files: Vec<String>,
    /// The stage's first input (the table a sink wrote from), for row diffs.
    pub input: Option<String>,
    pub is_sink: bool,
}

/// The exports of a complete run, checked: every export stage ran or is up to date and
/// its files exist. A partial or failed run never makes a snapshot.
pub fn exports(p: &Pipeline, cfg: &RegenConfig, manifest: &Manifest) -> Result<Vec<Export>> {
    let mut out = Vec::new();
    for name in cfg.export_stages(p) {
        let Some(ms) = manifest.stages.get(&name) else { bail!("export stage \"{name}\" is not in the manifest") };
        if !matches!(ms.status, StageStatus::Ran | StageStatus::UpToDate) {
            bail!("export stage \"{name}\" did not complete (status {:?}): no snapshot of a partial run", ms.status);
        }
        let decl = &p.stages[p.stage_index(&name).expect("checked by the compiler")];
        let files: Vec<String> = ms.outputs.iter().map(|o| o.path.clone()).collect();
        if files.is_empty() {
            bail!("export stage \"{name}\" has no output files");
        }
        out.push(Export {
            stage: name,
            files,
            input: decl.inputs.first().cloned(),
            is_sink: decl.kind.role == Role::Sink,
        });
    }
    if out.is_empty() {
        bail!("the pipeline has no export (no sink stage, and [regenerate] exports is not set)");
    }
    Ok(out)
}

/// The card file among the exports: the configured card stage's README.md (or first
/// Markdown file), else any export file named README.md.
pub fn card_file(cfg: &RegenConfig, exports: &[Export]) -> Option<String> {
    let is_readme = |f: &str| f.rsplit('/').next().is_some_and(|n| n.eq_ignore_ascii_case("readme.md"));
    match &cfg.card {
        Some(stage) => exports.iter().find(|e| &e.stage == stage).and_then(|e| {
            e.files.iter().find(|f| is_readme(f)).or_else(|| e.files.iter().find(|f| f.ends_with(".md"))).cloned()
        }),
        None => exports.iter().flat_map(|e| &e.files).find(|f| is_readme(f)).cloned(),
    }
}
