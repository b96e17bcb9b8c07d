//! RoleMRC's stage kinds: one file each, named `rolemrc_<file stem>` (the one
//! exception, `chat_format`, kept its name from before the method folders).

pub mod assemble;
pub mod card;
pub mod chat_format;
pub mod judge_plan;
pub mod judge_score;
pub mod plan;
pub mod rolebench;
