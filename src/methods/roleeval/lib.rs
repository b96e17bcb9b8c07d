//! RoleEval (Shen, Li, Xiong, 2023, `../shared/papers/roleeval.md`; spec
//! `../shared/specs/roleeval.md`): role knowledge as four-option questions, zero- and
//! five-shot, answered by chat models (generation + answer extraction) or scored by
//! log-likelihood (open models). Here: the release reader ([`release`]), the prompt
//! format ([`format`], data in `pipelines/prompts/roleeval/`), the extraction cascade
//! ([`extract`], rules in `rules/roleeval/`) with its parser ([`parsers`]) and offline
//! stand-in ([`offline`]), the paper's accuracy arithmetic ([`metrics`]) and the stage
//! kinds ([`stages`]: release, prompts, score). Construction of RoleEval-style data
//! (question slots, the quality check, the release layout): [`build`] and the kinds
//! slots, qc, export.

use synth_engine::registry::Method;

pub mod build;
pub mod extract;
pub mod format;
pub mod metrics;
pub mod offline;
pub mod parsers;
pub mod pyrandom;
pub mod release;
pub mod sha256;
pub mod stages;

pub static METHOD: Method = Method {
    name: "roleeval",
    about: "role knowledge as multiple-choice questions: zero/five-shot prompts, chat extraction or log-likelihood, accuracy tables (Shen et al., 2023)",
    kinds: &[
        &stages::release::KIND,
        &stages::prompts::KIND,
        &stages::score::KIND,
        &stages::slots::KIND,
        &stages::qc::KIND,
        &stages::export::KIND,
    ],
    parsers: parsers::KINDS,
    shapes: offline::SHAPES,
};
