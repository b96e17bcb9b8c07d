//! RoleEval: the evaluation pipeline end to end offline (demo release with its key, and
//! the real release in `../shared/data/roleeval` when present), bad input, and the
//! log-likelihood path against the loopback completions server; the construction
//! pipeline (slots, quality check, release layout).

mod bad_input;
mod build;
mod e2e;
mod loglik;

use std::path::PathBuf;

use crate::support::{Project, Run};
pub use crate::support::{failures, repo};

pub fn pipeline() -> String {
    repo().join("pipelines/roleeval.toml").to_string_lossy().to_string()
}

/// `synth run pipelines/roleeval.toml --offline ARGS... --out <p>/<out>`.
pub fn run(p: &Project, out: &str, args: &[&str]) -> (PathBuf, Run) {
    let dir = p.path().join(out);
    let pipeline = pipeline();
    let mut all = vec!["run", pipeline.as_str(), "--offline", "--out", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    let run = p.synth(&all);
    (dir, run)
}

/// The shared release, or `None` after saying why.
pub fn shared_release() -> Option<PathBuf> {
    crate::support::shared("data/roleeval", "zh/global/test/celebrities_test.csv")
}
