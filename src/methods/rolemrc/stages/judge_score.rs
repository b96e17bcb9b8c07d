//! `rolemrc_judge_score`: the engine's `judge_score` with RoleMRC's defaults — the
//! official `llm_judge.py` extraction (remove `Score:`, Python `int()`; anything else
//! scores 0 and counts as a bad judge response), the five dimensions of
//! `pipelines/prompts/rolemrc/judge/dimensions.json` (Table 9 order) — and the
//! accuracy per dimension in `<stage>.summary.parquet` (table `judge`).

use synth_core::config::options::{OptionSpec, Ty};
use synth_engine::stages::{Arity, KindInfo};
use synth_kinds::judge_score;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("answer_column", Ty::Str, "\"raw\"", "column of the LLM stage with the judge's answer"),
    OptionSpec::optional("label", Ty::Str, "name of the judged model in the summary; default: the queries' input name"),
    OptionSpec::default(
        "dimensions",
        Ty::File,
        "\"pipelines/prompts/rolemrc/judge/dimensions.json\"",
        "the judge dimensions and their headings, in report order",
    ),
    OptionSpec::default("extract", Ty::Enum(&["int", "regex"]), "\"int\"", "how a score is read (see judge_score)"),
    OptionSpec::default("score_prefix", Ty::Str, "\"Score:\"", "removed before reading the integer (official)"),
    OptionSpec::optional("pattern", Ty::Str, "extract = regex: the score is its first capture group"),
    OptionSpec::default("table", Ty::Str, "\"judge\"", "report table of the summary rows"),
    OptionSpec::default(
        "title",
        Ty::Str,
        "\"LLM-as-judge (Table 9 layout; accuracy per dimension)\"",
        "heading of that table in the report",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_judge_score",
    // 2: a preset of judge_score; the summary protocol (store::summary) instead of (label, dimension, n, accuracy, bad).
    version: 2,
    about: "RoleMRC judge scores (official extraction, majority vote over samples) and accuracy per dimension",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    summary: true,
    example: "",
    build: judge_score::build,
    ..KindInfo::DEFAULT
};
