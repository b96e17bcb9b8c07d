//! CharacterBench (Zhou et al., AAAI 2025, `../shared/papers/characterbench.md`; spec
//! `../shared/specs/characterbench.md`): character customization scored on 11
//! dimensions (13 test files) by CharacterJudge, a fine-tuned judge, with the official
//! prompts (data under `pipelines/prompts/characterbench/`, verbatim from
//! thu-coai/CharacterBench @ f4ec56a4). Here: the benchmark definition ([`bench`]:
//! dimensions, fixed scales, aspects, templates), the release reader with the official
//! session normalization and judge view ([`release`]), the byte-exact prompt renderers
//! ([`prompts`]), the score arithmetic of Tables 4–5 ([`scores`]), the role-play reply
//! parser ([`parsers`]) and offline stand-ins ([`offline`]), construction plans of
//! target-oriented queries ([`build`], reconstructed prompts), and the stage kinds
//! ([`stages`]). Judge sampling, its mean, and the agreement with human scores are the
//! engine's `llm`, `aggregate` and `correlate`.

use synth_engine::registry::Method;

pub mod bench;
pub mod build;
pub mod offline;
pub mod parsers;
pub mod prompts;
pub mod release;
pub mod scores;
pub mod stages;

pub static METHOD: Method = Method {
    name: "characterbench",
    about: "character customization on 11 dimensions: the official role-play and judge prompts, CharacterJudge scores (5-point, AVG, aspects), agreement with human scores, target-oriented construction (Zhou et al., 2025)",
    kinds: &[
        &stages::release::KIND,
        &stages::roleplay::KIND,
        &stages::judge::KIND,
        &stages::score::KIND,
        &stages::targets::KIND,
        &stages::script::KIND,
        &stages::export::KIND,
    ],
    parsers: parsers::KINDS,
    shapes: offline::SHAPES,
};
