//! The engine's stage kinds, one file each (a kind's name is its file's stem), and
//! [`KINDS`], the list the registry reads; `external.rs` is what the kinds that run an
//! external program share (`train`, `neurons`). The stage API they implement is
//! [`synth_engine::stages`].

pub mod aggregate;
pub mod check;
pub mod concat;
pub mod correlate;
pub mod dedup;
pub mod embed;
pub mod external;
pub mod filter;
pub mod generate;
pub mod join;
pub mod jsonl;
pub mod judge_plan;
pub mod judge_score;
pub mod llm;
pub mod loglik;
pub mod map;
pub mod metrics;
pub mod neurons;
pub mod parquet;
pub mod report;
pub mod retrieve;
pub mod review;
pub mod sample;
pub mod source;
pub mod train;

use synth_engine::stages::KindInfo;

/// The engine's stage kinds, in the order `synth list` shows them (a method's kinds
/// are listed by the method, `crate::methods`; the registry joins both).
pub static KINDS: &[&KindInfo] = &[
    &source::KIND,
    &sample::KIND,
    &filter::KIND,
    &map::KIND,
    &concat::KIND,
    &join::KIND,
    &llm::KIND,
    &check::KIND,
    &dedup::KIND,
    &review::KIND,
    &generate::KIND,
    &loglik::KIND,
    &embed::KIND,
    &retrieve::KIND,
    &judge_plan::KIND,
    &judge_score::KIND,
    &aggregate::KIND,
    &metrics::KIND,
    &correlate::KIND,
    &report::KIND,
    &train::KIND,
    &neurons::KIND,
    &parquet::KIND,
    &jsonl::KIND,
];
