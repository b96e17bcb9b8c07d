//! `characterbench_judge`: the official per-dimension judge prompt of each record
//! (`process_wo_context_{zh,en}_all.py`; `characterbench::prompts`), its SHA-256, and the
//! chat request CharacterJudge gets (`model_generation_qwen_chat.py`: system "You are a
//! helpful assistant.", the prompt as the user message) in `judge_messages`, for an
//! `llm` stage (`n` samples, the `number` parser, then `aggregate`).
//!
//! The judged reply is `response_column`: the shipped `response` (human agreement) or a
//! model's parsed reply (benchmark mode). `parity_dict_repr` reproduces the official
//! benchmark scripts, which put the Python repr of the parsed reply object
//! (`{'response': '…'}`) after the character's name (P6; off by default).
//! `append` adds a file per language after the prompt: an approximate baseline for chat
//! models that were not fine-tuned as judges (a JSON `score` instruction; reconstructed,
//! the paper's GPT-judge prompts are unpublished). An empty reply is not judged (the
//! official builder skips it) and goes to the failure table, as does a missing one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::roleplay::{messages_type, with_columns};
use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use crate::prompts::{self, JudgeInput};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row, python};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::exec::{Ids, map_batches};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "dimensions",
        Ty::File,
        DEFAULT_DIMENSIONS,
        "the benchmark definition (judge template per dimension and language)",
    ),
    OptionSpec::default(
        "response_column",
        Ty::Str,
        "\"response\"",
        "the reply judged (the shipped one, or a model's parsed reply)",
    ),
    OptionSpec::default(
        "parity_dict_repr",
        Ty::Bool,
        "false",
        "judge the Python repr of the parsed reply object, {'response': '...'}, as the official benchmark scripts do (P6)",
    ),
    OptionSpec::default(
        "object_column",
        Ty::Str,
        "\"response_object\"",
        "with parity_dict_repr: the column with the parsed reply object as JSON text",
    ),
    OptionSpec::default(
        "system",
        Ty::File,
        "\"pipelines/prompts/characterbench/judge/system.txt\"",
        "the judge's system message (the official script's)",
    ),
    OptionSpec::optional(
        "append",
        Ty::Map(&Ty::Str),
        "language -> file appended after the prompt (an approximate baseline's output instruction)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_judge",
    about: "the official per-dimension judge prompt per record (judge_prompt, judge_prompt_sha256) and CharacterJudge's chat request (judge_messages)",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    dimensions: String,
    response_column: String,
    parity_dict_repr: bool,
    object_column: String,
    system: String,
    append: Option<BTreeMap<String, String>>,
}

#[derive(Clone)]
struct Judge {
    opts: Options,
    bench: Bench,
    system: String,
    append: BTreeMap<String, String>,
    files: Vec<PathBuf>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    let mut files = vec![ctx.root.join(&opts.system)];
    let system = match std::fs::read_to_string(&files[0]) {
        Ok(s) => s,
        Err(e) => {
            ctx.error(diags, "system", format!("{}: {e}", files[0].display()));
            return None;
        }
    };
    let mut append = BTreeMap::new();
    for (lang, file) in opts.append.clone().unwrap_or_default() {
        if !bench.languages.contains_key(&lang) {
            ctx.error(diags, "append", format!("unknown language \"{lang}\""));
            return None;
        }
        let path = ctx.root.join(&file);
        match std::fs::read_to_string(&path) {
            Ok(t) => {
                append.insert(lang, t);
                files.push(path);
            }
            Err(e) => {
                ctx.error(diags, "append", format!("{}: {e}", path.display()));
                return None;
            }
        }
    }
    Some(Box::new(Judge { opts, bench, system, append, files }))
}

const NEEDS: &[&str] =
    &["dimension", "lang", "judge_profile", "judge_dialogue", "user_query", "speaker", "target_slot", "target"];

fn added() -> Vec<Field> {
    vec![
        Field::new("judged_response", DataType::Utf8, false),
        Field::new("judge_prompt", DataType::Utf8, false),
        Field::new("judge_prompt_sha256", DataType::Utf8, false),
        Field::new("judge_messages", messages_type(), false),
    ]
}

impl Judge {
    fn render(&self, row: &Row) -> std::result::Result<(String, String), (FailureKind, String)> {
        let text = |k: &str| {
            row.get(k).and_then(Value::as_str).ok_or_else(|| (FailureKind::Input, format!("no text in column \"{k}\"")))
        };
        let col = &self.opts.response_column;
        let response = match row.get(col) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) => {
                return Err((
                    FailureKind::Input,
                    format!("the reply (\"{col}\") is empty: the official builder does not judge it"),
                ));
            }
            _ => return Err((FailureKind::Input, format!("no reply in column \"{col}\""))),
        };
        let judged = if self.opts.parity_dict_repr {
            let obj = text(&self.opts.object_column)?;
            let v: Value = serde_json::from_str(obj).map_err(|e| {
                (FailureKind::Input, format!("column \"{}\" is not JSON: {e}", self.opts.object_column))
            })?;
            python::py_repr(&v)
        } else {
            response
        };
        let dim_id = text("dimension")?;
        let lang = text("lang")?;
        let dim = self.bench.dimension(dim_id).ok_or_else(|| {
            (
                FailureKind::Input,
                format!("dimension \"{dim_id}\" is not in the definition (it knows: {})", self.bench.ids()),
            )
        })?;
        let input = JudgeInput {
            profile: text("judge_profile")?,
            dialogue: text("judge_dialogue")?,
            user_query: text("user_query")?,
            speaker: text("speaker")?,
            response: &judged,
            target_slot: row.get("target_slot").and_then(Value::as_str),
            target: row.get("target").and_then(Value::as_str),
        };
        let mut prompt = prompts::judge(&self.bench, dim, lang, &input).map_err(|e| (FailureKind::Template, e))?;
        if let Some(extra) = self.append.get(lang) {
            prompt.push_str(extra);
        }
        Ok((judged, prompt))
    }
}

#[async_trait]
impl Stage for Judge {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, NEEDS.iter().copied().chain([self.opts.response_column.as_str()]));
        if self.opts.parity_dict_repr {
            ctx.require_columns("object_column", 0, [self.opts.object_column.as_str()]);
        }
        ctx.files.extend(self.bench.files.iter().cloned());
        ctx.files.extend(self.files.iter().cloned());
        Some(with_columns(&ctx.input_schema(0)?, added()))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = with_columns(&ctx.inputs[0].schema, added());
        let out_schema = schema.clone();
        let this = self.clone();
        map_batches(ctx, 0, schema, Ids::Kept, move |batch, failures| {
            let mut rows = Vec::with_capacity(batch.num_rows());
            for i in 0..batch.num_rows() {
                let mut row = data::row_json(batch, i);
                match this.render(&row) {
                    Ok((judged, p)) => {
                        row.insert("judged_response".into(), json!(judged));
                        row.insert("judge_prompt_sha256".into(), json!(prompts::sha256(&p)));
                        row.insert(
                            "judge_messages".into(),
                            json!([{"role": "system", "content": this.system}, {"role": "user", "content": p}]),
                        );
                        row.insert("judge_prompt".into(), json!(p));
                        rows.push(row);
                    }
                    Err((kind, e)) => {
                        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        failures.record(&id, kind, e, serde_json::to_string(&row).ok());
                    }
                }
            }
            data::rows_to_batch(&out_schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))
        })
        .await
    }
}
