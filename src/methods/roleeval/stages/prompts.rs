//! `roleeval_prompts`: every question × every shot setting as one prompt record
//! (id `<qkey>/<k>shot`): the single-message prompt of spec §3.1 (header, k dev
//! exemplars of the same subset and category in file order, the question), its
//! SHA-256, and the chat messages in the chosen `chat_style`. Inputs: the test
//! questions and the dev exemplars (`roleeval_release`); zero-shot alone needs no
//! exemplars, so the second input may be left out. A question whose category
//! has fewer than k exemplars goes to the failure table (`incomplete`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, Fields, SchemaRef};

use super::release::DEFAULT_FORMAT;
use crate::format::{Format, Question, Render};
use crate::pyrandom::PyRandom;
use crate::sha256;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};
use synth_llm::Message;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("format", Ty::File, DEFAULT_FORMAT, "language file: header, answer cue, category words"),
    OptionSpec::default(
        "shots",
        Ty::List(&Ty::Int(0, 64)),
        "[0, 5]",
        "shot settings; each question gets one prompt per setting",
    ),
    OptionSpec::default(
        "strip_question",
        Ty::Bool,
        "false",
        "strip the question's surrounding whitespace as lm-eval's ceval/cmmlu YAMLs do (reconstructed; the spec keeps it)",
    ),
    OptionSpec::default(
        "fewshot_order",
        Ty::Enum(&["file", "lm_eval_random_1234"]),
        "\"file\"",
        "exemplar order: the dev file's (C-Eval/CMMLU first_n; reconstructed), or lm-eval's default sampler (Python's random.Random(1234).sample over the dev exemplars, once per question in file order, per subset, category and k)",
    ),
    OptionSpec::default(
        "chat_style",
        Ty::Enum(&["single_message", "ceval_messages"]),
        "\"single_message\"",
        "`messages` column: the whole prompt as one user message, or C-Eval's system + exemplar turns (reconstructed)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_prompts",
    about: "zero-/k-shot RoleEval prompts (byte layout of the spec's §3.1), their SHA-256 and chat messages, per question and shot setting",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    format: String,
    shots: Vec<u32>,
    strip_question: bool,
    #[allow(dead_code)]
    fewshot_order: String,
    chat_style: String,
}

struct Prompts {
    opts: Options,
    format: Format,
    file: PathBuf,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let file = ctx.root.join(&opts.format);
    let format = super::read_format(ctx, diags, &opts.format)?;
    if opts.shots.is_empty() {
        ctx.error(diags, "shots", "give at least one shot setting");
        return None;
    }
    let mut sorted = opts.shots.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != opts.shots.len() {
        ctx.error(diags, "shots", "a shot setting is listed twice");
        return None;
    }
    Some(Box::new(Prompts { opts, format, file }))
}

fn messages_type() -> DataType {
    let item = DataType::Struct(Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("content", DataType::Utf8, false),
    ]));
    DataType::List(Arc::new(Field::new("item", item, true)))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    data::schema_with_id([
        s("qkey"),
        s("lang"),
        s("subset"),
        s("category"),
        s("code"),
        s("qid"),
        Field::new("shots", DataType::Int64, false),
        s("prompt"),
        s("prompt_sha256"),
        Field::new("messages", messages_type(), false),
        Field::new("answer", DataType::Utf8, true),
        Field::new("duplicate_options", DataType::Boolean, false),
    ])
}

/// Columns both inputs need (`qid`, `row` and `answer` are read when present: the id,
/// position 0 and no answer otherwise, so drafted questions can be prompted too).
const INPUT_COLUMNS: &[&str] = &["subset", "category", "question", "A", "B", "C", "D"];

fn text(row: &Row, col: &str) -> String {
    row.get(col).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn question(row: &Row, choices: &[String]) -> Question {
    Question {
        question: text(row, "question"),
        options: choices.iter().map(|c| text(row, c)).collect(),
        answer: row.get("answer").and_then(Value::as_str).map(str::to_string),
    }
}

#[async_trait]
impl Stage for Prompts {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if ctx.inputs.len() > 2 {
            ctx.error("inputs", "give the questions and, for k-shot prompts, the dev exemplars: two inputs at most");
        }
        ctx.require_columns("inputs", 0, INPUT_COLUMNS.iter().copied());
        if ctx.inputs.len() == 2 {
            ctx.require_columns("inputs", 1, INPUT_COLUMNS.iter().copied());
        }
        ctx.files.push(self.file.clone());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let choices = &self.format.choices;
        // Exemplars by (subset, category), in file order.
        let mut dev: BTreeMap<(String, String), Vec<(i64, Question)>> = BTreeMap::new();
        let batches = match ctx.inputs.get(1) {
            Some(dev) => synth_core::store::parquet::read_all(&dev.path)?.1,
            None => Vec::new(),
        };
        for b in &batches {
            for i in 0..b.num_rows() {
                let r = data::row_json(b, i);
                let order = r.get("row").and_then(Value::as_i64).unwrap_or_default();
                dev.entry((text(&r, "subset"), text(&r, "category"))).or_default().push((order, question(&r, choices)));
            }
        }
        for v in dev.values_mut() {
            v.sort_by_key(|(o, _)| *o);
        }
        let render = Render { strip_question: self.opts.strip_question };
        // lm-eval's sampler: one Random(1234) per task (subset, category) and setting k.
        let mut samplers: BTreeMap<(String, String, u32), PyRandom> = BTreeMap::new();
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let reader = synth_core::store::parquet::open_reader(&ctx.inputs[0].path, 1024)?;
        let mut n_in = 0u64;
        for batch in reader {
            let b = batch?;
            let mut rows = Vec::with_capacity(b.num_rows() * self.opts.shots.len());
            for i in 0..b.num_rows() {
                if ctx.cancel.is_cancelled() {
                    return Err(synth_engine::stages::Cancelled.into());
                }
                n_in += 1;
                let r = data::row_json(&b, i);
                let qkey = text(&r, data::ID);
                let (subset, stem) = (text(&r, "subset"), text(&r, "category"));
                let Some(category) = self.format.category(&stem) else {
                    ctx.fail(&qkey, FailureKind::Input, format!("category \"{stem}\" is not in the format file"), None);
                    continue;
                };
                let q = question(&r, choices);
                let mut seen = std::collections::BTreeSet::new();
                // Options equal up to surrounding whitespace (spec §5: 15 test rows).
                let duplicate = !q.options.iter().all(|o| seen.insert(o.trim()));
                let pool = dev.get(&(subset.clone(), stem.clone())).map(Vec::as_slice).unwrap_or_default();
                for &k in &self.opts.shots {
                    let id = format!("{qkey}/{k}shot");
                    if pool.len() < k as usize {
                        ctx.fail(
                            &id,
                            FailureKind::Incomplete,
                            format!(
                                "{k}-shot needs {k} dev exemplars of {subset}/{stem}, the dev input has {}",
                                pool.len()
                            ),
                            None,
                        );
                        continue;
                    }
                    let shots: Vec<Question> = if self.opts.fewshot_order == "lm_eval_random_1234" && k > 0 {
                        let rng =
                            samplers.entry((subset.clone(), stem.clone(), k)).or_insert_with(|| PyRandom::new(1234));
                        rng.sample(pool.len(), k as usize).into_iter().map(|j| pool[j].1.clone()).collect()
                    } else {
                        pool[..k as usize].iter().map(|(_, q)| q.clone()).collect()
                    };
                    let prompt = self.format.prompt(category, &shots, &q, render);
                    let messages: Vec<Message> = match self.opts.chat_style.as_str() {
                        "ceval_messages" => self.format.ceval_messages(category, &shots, &q, render),
                        _ => vec![Message::new(synth_core::data::chat::Role::User, prompt.clone())],
                    };
                    let mut row = Row::new();
                    row.insert(data::ID.into(), json!(id));
                    row.insert("qkey".into(), json!(qkey));
                    row.insert("lang".into(), json!(self.format.lang));
                    row.insert("subset".into(), json!(subset));
                    row.insert("category".into(), json!(stem));
                    row.insert("code".into(), json!(category.code));
                    let qid = r.get("qid").and_then(Value::as_str).unwrap_or(&qkey).to_string();
                    row.insert("qid".into(), json!(qid));
                    row.insert("shots".into(), json!(k));
                    row.insert("prompt_sha256".into(), json!(sha256::hex(prompt.as_bytes())));
                    row.insert("prompt".into(), json!(prompt));
                    row.insert("messages".into(), serde_json::to_value(&messages)?);
                    row.insert("answer".into(), r.get("answer").cloned().unwrap_or(Value::Null));
                    row.insert("duplicate_options".into(), json!(duplicate));
                    rows.push(row);
                }
            }
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = n_in;
        ctx.set_output(out)
    }
}
