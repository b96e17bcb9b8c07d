//! CharacterBench: the official prompts (files against the spec's sha256 sums, renderings of
//! every shipped record against reference renderings), the agreement of the shipped judge
//! predictions with human scores (the spec's Pearson values, scipy's p-values), the
//! benchmark's arithmetic, the pipelines end to end offline, and bad input.

mod agreement;
mod bad_input;
mod build;
mod e2e;
mod prompts;

use std::path::PathBuf;

pub use crate::support::{failures, repo};

/// The shipped release files in ../shared, or `None` after saying why.
pub fn shared_release() -> Option<PathBuf> {
    crate::support::shared("data/characterbench/eval_data/raw_data", "memory_consistency_test.json")
}

/// The generated demo release of the repository (all 13 dimension files).
pub fn demo_release() -> PathBuf {
    repo().join("pipelines/data/characterbench-demo")
}

/// The benchmark definition.
pub fn bench() -> synth::methods::characterbench::bench::Bench {
    synth::methods::characterbench::bench::Bench::read(&repo().join("pipelines/prompts/characterbench/dimensions.json"))
        .unwrap()
}
