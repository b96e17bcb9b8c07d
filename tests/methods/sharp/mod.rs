//! SHARP: claims from ConceptNet dumps (the fixtures here and the official test files in
//! `../shared/data/conceptnet` when present), gzip, bad lines, sampling; the pipeline end to
//! end offline; the metrics on the spec's toy vector.

mod claims;
mod e2e;
mod metrics;

use std::path::{Path, PathBuf};

use crate::support::{Project, Run};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A one-stage pipeline `claims` of kind `sharp_claims` with the given extra option lines,
/// run into `<project>/out`.
pub fn run_claims(p: &Project, path: &Path, extra: &str) -> (PathBuf, Run) {
    let toml = format!(
        "[pipeline]\nname = \"sharp-claims\"\nseed = 7\n\n[stages.claims]\nkind = \"sharp_claims\"\npath = {:?}\nmax_failure_ratio = 1.0\n{extra}\n",
        path.to_string_lossy()
    );
    p.write("p.toml", toml);
    let out = p.path().join("out");
    let run = p.synth(&["run", "p.toml", "--out", out.to_str().unwrap()]);
    (out, run)
}

/// The shared ConceptNet fixtures, or `None` after saying why.
pub fn shared_conceptnet() -> Option<PathBuf> {
    let dir = repo().join("../shared/data/conceptnet");
    if dir.join("assertions.csv").exists() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: {} is absent (the shared data folder is not on this machine)", dir.display());
        None
    }
}

/// Rows of a stage's failure table (empty when it has none).
pub fn failures(dir: &Path, stage: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let p = dir.join(format!("{stage}.failures.parquet"));
    if p.exists() { crate::support::parquet_rows(&p) } else { Vec::new() }
}
