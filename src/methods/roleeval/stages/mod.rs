//! RoleEval's stage kinds, one file each, named `roleeval_<file stem>`: the release
//! as records (`release`), zero-/k-shot prompts (`prompts`), scoring and the paper's
//! tables as a summary (`score`).

pub mod prompts;
pub mod release;
pub mod score;
