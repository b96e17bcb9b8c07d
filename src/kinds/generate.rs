//! `generate`: answer every row's conversation (a test `question`, a list of
//! {role, content}) with a model behind an OpenAI-compatible endpoint — typically vLLM
//! serving a fine-tuned checkpoint: greedy (temperature 0) and 256 new tokens unless
//! set (a method's pipelines pin their own values), the answer kept as the model wrote it
//! (column `response`), cached and rate-limited like every LLM stage. One stage per
//! candidate model; a `report` compares them. This is the `llm` kind with those presets.
//! With `checkpoint = "PHASE"` and a `train` stage as second input, the model is that
//! phase's checkpoint as the trainer exported it to GGUF, run on the (`local`) provider
//! in place of its own model file: base, SFT and DPO answer the same questions.

use serde::Deserialize;
use serde_json::json;

use super::llm::{self, Options as LlmOptions, build_with};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("provider", Ty::Str, "name of a [providers.NAME] table (the model under test)"),
    OptionSpec::default("messages", Ty::Str, "\"question\"", "column with the conversation to answer"),
    OptionSpec::default("temperature", Ty::Float(0.0, 2.0), "0.0", "sampling temperature"),
    OptionSpec::default("max_tokens", POSITIVE, "256", "new tokens per answer"),
    llm::TOP_P,
    llm::SEED,
    llm::STOP,
    llm::EXTRA,
    llm::KEEP_COLUMNS,
    llm::CONCURRENCY,
    llm::BATCH,
    llm::BATCH_FALLBACK,
    llm::MAX_COST_USD,
    OptionSpec::optional(
        "checkpoint",
        Ty::Str,
        "answer with this phase's checkpoint (e.g. \"sft\"), the GGUF a `train` stage given as second input exported, on the provider (kind \"local\") in place of its model",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "generate",
    about: "answer each row's conversation with a model (temperature 0, 256 tokens): column `response`",
    // A second input only with `checkpoint` (checked at plan time).
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "provider = \"p\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    provider: String,
    messages: String,
    temperature: f64,
    max_tokens: u32,
    top_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
    extra: Option<serde_json::Map<String, serde_json::Value>>,
    keep_columns: Option<Vec<String>>,
    concurrency: Option<usize>,
    batch: Option<bool>,
    batch_fallback: Option<String>,
    max_cost_usd: Option<f64>,
    checkpoint: Option<String>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let opts = LlmOptions {
        provider: o.provider,
        prompt: None,
        messages: Some(o.messages),
        system: None,
        parser: "text".into(),
        // Every answer is kept as written, even an empty one (it scores 0).
        parser_options: Some(json!({"min_chars": 0, "column": "response", "trim": false})),
        schema: None,
        structured: "off".into(),
        // A model under evaluation is scored on what it wrote: nothing is re-asked.
        checks: None,
        schemas: None,
        schema_column: None,
        n: 1,
        max_attempts: 1,
        candidates: 1,
        reask: String::new(),
        reask_history: "all".into(),
        temperature: Some(o.temperature),
        top_p: o.top_p,
        max_tokens: Some(o.max_tokens),
        seed: o.seed,
        stop: o.stop,
        extra: o.extra,
        output_prefix: String::new(),
        record_rejections: false,
        keep_columns: o.keep_columns,
        concurrency: o.concurrency,
        batch: o.batch,
        batch_fallback: o.batch_fallback,
        max_cost_usd: o.max_cost_usd,
        checkpoint: o.checkpoint,
    };
    build_with(opts, ctx, diags)
}
