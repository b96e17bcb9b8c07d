//! RoleMRC (Lu et al., 2025, `../shared/papers/`): role-playing machine reading
//! comprehension synthesis and its evaluation. Here: the planner that decides which
//! profile, triplet, seed script and rule each sample uses ([`plan`]); the parsers
//! that read and check what its prompts produce ([`parsers`]) and their offline
//! stand-ins ([`offline`]); when a preference pair is degenerate ([`pairs`]); its stage kinds ([`stages`]: plan, assemble, card,
//! chat_format, judge plan/score, the RoleBench sets of Table 4). Prompts, seed scripts and rules are data files
//! under `pipelines/prompts/rolemrc/`, `seeds/rolemrc/` and `rules/rolemrc/`.

use synth_engine::registry::Method;

pub mod offline;
pub mod pairs;
pub mod parsers;
pub mod plan;
pub mod stages;

pub static METHOD: Method = Method {
    name: "rolemrc",
    about: "role-playing machine reading comprehension: synthesis (SFT, DPO, test) and evaluation (Lu et al., 2025)",
    kinds: &[
        &stages::plan::KIND,
        &stages::assemble::KIND,
        &stages::card::KIND,
        &stages::judge_plan::KIND,
        &stages::judge_score::KIND,
        &stages::chat_format::KIND,
        &stages::rolebench::KIND,
    ],
    parsers: parsers::KINDS,
    shapes: offline::SHAPES,
};
