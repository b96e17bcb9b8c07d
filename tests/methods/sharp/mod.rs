//! SHARP: claims from ConceptNet dumps (the fixtures here and the official test files in
//! `../shared/data/conceptnet` when present), gzip, bad lines, sampling, threads, Chinese,
//! antonyms; the pipeline end to end offline with its profiles (snowballing, self-consistency,
//! Chinese, translation, rewrite and the human check, roles from dialogues and RoleMRC
//! profiles) and bad role inputs; the metrics, Table 5 and the vote on hand-computed vectors.

mod claims;
mod e2e;
mod metrics;

use std::path::{Path, PathBuf};

use crate::support::{Project, Run};
pub use crate::support::{failures, repo};

/// A one-stage pipeline `claims` of kind `sharp_claims` with the given extra option lines,
/// run into `<project>/out`.
pub fn run_claims(p: &Project, path: &Path, extra: &str) -> (PathBuf, Run) {
    let toml = format!(
        "[pipeline]\nname = \"sharp-claims\"\nseed = 7\n\n[stages.claims]\nkind = \"sharp_claims\"\npath = {:?}\nrules = {:?}\nmax_failure_ratio = 1.0\n{extra}\n",
        path.to_string_lossy(),
        repo().join("rules/sharp").to_string_lossy()
    );
    p.write("p.toml", toml);
    let out = p.path().join("out");
    let run = p.synth(&["run", "p.toml", "--out", out.to_str().unwrap()]);
    (out, run)
}

/// The shared ConceptNet fixtures, or `None` after saying why.
pub fn shared_conceptnet() -> Option<PathBuf> {
    crate::support::shared("data/conceptnet", "assertions.csv")
}
