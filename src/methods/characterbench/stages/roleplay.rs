//! `characterbench_roleplay`: the official role-play prompt of each record
//! (`Role_Play_PROMPT_ZH` / `_EN` with the profile, the user profile and the normalized
//! session as `role: content` lines; `process.py`), its SHA-256, and the chat request
//! the official code sends: the prompt as one user message, no system prompt
//! (`rp_messages`, for an `llm` stage's `messages`). The model's answer is read by the
//! `characterbench_response` parser.

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use crate::prompts;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::exec::{Ids, map_batches};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[OptionSpec::default(
    "dimensions",
    Ty::File,
    DEFAULT_DIMENSIONS,
    "the benchmark definition (names the role-play template of each language)",
)];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_roleplay",
    about: "the official role-play prompt per record (rp_prompt, rp_prompt_sha256) and its chat request (rp_messages: one user message)",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    dimensions: String,
}

struct Roleplay {
    bench: Bench,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    Some(Box::new(Roleplay { bench: read_bench(ctx, diags, &o.dimensions)? }))
}

const NEEDS: &[&str] = &["lang", "character_profile", "user_profile", "messages"];

pub(super) fn messages_type() -> DataType {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let message = DataType::Struct(synth_core::data::arrow::datatypes::Fields::from(vec![s("role"), s("content")]));
    DataType::List(std::sync::Arc::new(Field::new("item", message, true)))
}

/// The input's columns plus `added` (replacing same-named ones).
pub(super) fn with_columns(input: &SchemaRef, added: Vec<Field>) -> SchemaRef {
    let names: Vec<String> = added.iter().map(|f| f.name().clone()).collect();
    let kept = input.fields().iter().skip(1).filter(|f| !names.contains(f.name())).map(|f| f.as_ref().clone());
    data::schema_with_id(kept.chain(added))
}

fn added() -> Vec<Field> {
    vec![
        Field::new("rp_prompt", DataType::Utf8, false),
        Field::new("rp_prompt_sha256", DataType::Utf8, false),
        Field::new("rp_messages", messages_type(), false),
    ]
}

fn render(bench: &Bench, row: &Row) -> std::result::Result<String, String> {
    let text = |k: &str| row.get(k).and_then(Value::as_str).ok_or_else(|| format!("no text in column \"{k}\""));
    let messages: Vec<(String, String)> = row
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("no list in column \"messages\"")?
        .iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or_default().to_string();
            let content = m.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
            (role, content)
        })
        .collect();
    prompts::roleplay(bench, text("lang")?, text("character_profile")?, text("user_profile")?, &messages)
}

#[async_trait]
impl Stage for Roleplay {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, NEEDS.iter().copied());
        ctx.files.extend(self.bench.files.iter().cloned());
        Some(with_columns(&ctx.input_schema(0)?, added()))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = with_columns(&ctx.inputs[0].schema, added());
        let bench = self.bench.clone();
        let out_schema = schema.clone();
        map_batches(ctx, 0, schema, Ids::Kept, move |batch, failures| {
            let mut rows = Vec::with_capacity(batch.num_rows());
            for i in 0..batch.num_rows() {
                let mut row = data::row_json(batch, i);
                match render(&bench, &row) {
                    Ok(p) => {
                        row.insert("rp_prompt_sha256".into(), json!(prompts::sha256(&p)));
                        row.insert("rp_messages".into(), json!([{"role": "user", "content": p}]));
                        row.insert("rp_prompt".into(), json!(p));
                        rows.push(row);
                    }
                    Err(e) => {
                        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        failures.record(&id, FailureKind::Template, e, serde_json::to_string(&row).ok());
                    }
                }
            }
            data::rows_to_batch(&out_schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))
        })
        .await
    }
}
