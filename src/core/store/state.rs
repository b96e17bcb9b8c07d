//! What a run leaves behind besides data: the per-stage state record written after a
//! stage's outputs are committed (`_synth/state/<stage>.json`, the proof that the
//! outputs match a fingerprint), the run manifest (`manifest.json`), and secret
//! redaction (`crate::secrets::redact`) for anything that ends up in them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::atomic::write_atomic;

/// Internal directory inside an output directory.
pub const INTERNAL_DIR: &str = "_synth";
pub const MANIFEST: &str = "manifest.json";

/// Counters and accounting of one stage execution.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StageReport {
    pub rows_in: u64,
    pub rows_out: u64,
    pub rows_failed: u64,
    pub wall_seconds: f64,
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub cache_hits: u64,
    #[serde(default)]
    pub tokens_in: u64,
    #[serde(default)]
    pub tokens_out: u64,
    #[serde(default)]
    pub cost_usd: f64,
    /// Provider, model and other descriptive facts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub info: BTreeMap<String, String>,
    /// Any further numeric measurements a stage reports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

/// Whether a stage metric is a count (or a time) that adds up over the shards of a
/// sharded stage: content checks (`check.<name>.*`, `checks.seconds`), answers by
/// attempt (`answers.*`), rejections by kind (`rejected.*`), review (`review.*`) and
/// drops by kind (`dropped.*`). Other metrics describe the run (a flag, a ratio) and are
/// the first shard's.
pub fn additive_metric(key: &str) -> bool {
    ["check.", "checks.", "answers.", "rejected.", "review.", "dropped."].iter().any(|p| key.starts_with(p))
}

/// One committed output file, relative to the output directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutputRecord {
    pub path: String,
    pub bytes: u64,
    #[serde(default)]
    pub rows: Option<u64>,
}

/// The parts a fingerprint was computed from, kept to explain why a stage re-runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FingerprintParts {
    pub kind: String,
    pub config: String,
    pub inputs: BTreeMap<String, String>,
    pub files: BTreeMap<String, String>,
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageState {
    pub stage: String,
    pub kind: String,
    pub fingerprint: String,
    pub parts: FingerprintParts,
    pub outputs: Vec<OutputRecord>,
    pub failures: Option<OutputRecord>,
    pub report: StageReport,
    pub finished_at: String,
}

pub fn state_path(out_dir: &Path, stage: &str) -> PathBuf {
    out_dir.join(INTERNAL_DIR).join("state").join(format!("{stage}.json"))
}

impl StageState {
    pub fn load(out_dir: &Path, stage: &str) -> Option<StageState> {
        let bytes = std::fs::read(state_path(out_dir, stage)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn save(&self, out_dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self)?;
        write_atomic(&state_path(out_dir, &self.stage), &bytes)
    }

    /// True when every recorded output is still on disk with its recorded size.
    pub fn outputs_intact(&self, out_dir: &Path) -> bool {
        self.outputs.iter().chain(self.failures.iter()).all(|o| {
            let p = resolve(out_dir, &o.path);
            std::fs::metadata(&p).map(|m| m.len() == o.bytes).unwrap_or(false)
        })
    }
}

/// Output paths are stored relative to the output directory when inside it.
pub fn relative_to(out_dir: &Path, path: &Path) -> String {
    path.strip_prefix(out_dir).unwrap_or(path).to_string_lossy().to_string()
}

pub fn resolve(out_dir: &Path, stored: &str) -> PathBuf {
    let p = Path::new(stored);
    if p.is_absolute() { p.to_path_buf() } else { out_dir.join(p) }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Ok,
    Failed,
    Interrupted,
    /// Stopped after submitting provider batches (`--detach`): the next run collects them.
    Detached,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Not reached (yet).
    Pending,
    Running,
    Ran,
    UpToDate,
    Failed,
    Cancelled,
    /// Left out by `--only` / `--from`.
    Skipped,
    /// Its provider batches run; a later run collects their results (`--detach`).
    Waiting,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestStage {
    pub kind: String,
    pub status: StageStatus,
    pub fingerprint: Option<String>,
    pub inputs: Vec<String>,
    /// Figures of the run that produced the current outputs (this run or an earlier one).
    pub report: Option<StageReport>,
    pub outputs: Vec<OutputRecord>,
    pub failures: Option<OutputRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Totals {
    pub stages_ran: usize,
    pub stages_up_to_date: usize,
    pub rows_out: u64,
    pub rows_failed: u64,
    pub requests: u64,
    pub cache_hits: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub wall_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineInfo {
    pub name: String,
    pub path: String,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub synth_version: String,
    pub pipeline: PipelineInfo,
    pub profile: Option<String>,
    pub seed: u64,
    pub status: RunStatus,
    pub started_at: String,
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The resolved configuration (profile and `--set` applied), secrets redacted.
    pub config: serde_json::Value,
    pub stages: IndexMap<String, ManifestStage>,
    pub totals: Totals,
    /// Where `synth regenerate --push` published this run's snapshot (repository, commit, tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<serde_json::Value>,
    /// What the content checks, near-duplicate removal and review did, per stage and in
    /// all (`quality::summary`; absent when no stage reported any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<serde_json::Value>,
}

impl Manifest {
    pub fn path(out_dir: &Path) -> PathBuf {
        out_dir.join(MANIFEST)
    }

    pub fn load(out_dir: &Path) -> Result<Manifest> {
        let path = Self::path(out_dir);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("{}: not a synth manifest", path.display()))
    }

    pub fn save(&mut self, out_dir: &Path) -> Result<()> {
        self.totals = Totals::default();
        for stage in self.stages.values() {
            match stage.status {
                StageStatus::Ran => self.totals.stages_ran += 1,
                StageStatus::UpToDate => self.totals.stages_up_to_date += 1,
                _ => {}
            }
            if let (Some(r), StageStatus::Ran) = (&stage.report, stage.status) {
                self.totals.rows_out += r.rows_out;
                self.totals.rows_failed += r.rows_failed;
                self.totals.requests += r.requests;
                self.totals.cache_hits += r.cache_hits;
                self.totals.tokens_in += r.tokens_in;
                self.totals.tokens_out += r.tokens_out;
                self.totals.cost_usd += r.cost_usd;
            }
        }
        let bytes = serde_json::to_vec_pretty(self)?;
        write_atomic(&Self::path(out_dir), &bytes)
    }
}

/// Now as an RFC 3339 timestamp (UTC, seconds).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
