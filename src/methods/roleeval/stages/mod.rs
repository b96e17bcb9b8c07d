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
