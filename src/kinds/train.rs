//! `train` — the hand-off to GPU training. synth prepares the data, launches an
//! external trainer, follows its progress and records its artifacts:
//!
//! 1. writes the SFT rows (input 1, `conversations`) as TRL conversational language
//!    modeling (`{"messages": [{"role", "content"}...]}`) and the DPO rows (input 2,
//!    `prompt`/`chosen`/`rejected`) as TRL conversational preference
//!    (`{"prompt": [...], "chosen": [assistant], "rejected": [assistant]}`) to
//!    `<out>/<stage>/train_data/{sft,dpo}.jsonl`, roles lowercased;
//! 2. runs `command` (each element a minijinja template over the data paths, the
//!    output directory, the base model and every hyperparameter) in the pipeline root;
//! 3. streams every stdout/stderr line into the log, and reads the protocol lines
//!    `SYNTH_PROGRESS {json}`, `SYNTH_CHECKPOINT {json}`, `SYNTH_METRICS {json}`
//!    (documented in `pipelines/trainers/README.md`) into the stage progress, the
//!    manifest (report `info` / `metrics`) and the output table;
//! 4. fails with the trainer's last lines when it exits non-zero; cancellation and
//!    `timeout_minutes` terminate its whole process group.
//!
//! The stage directory `<out>/<stage>/` is the trainer's working directory for data and
//! checkpoints (written by the trainer, so not committed by the engine); the stage's
//! materialized output is the small table of checkpoints (`phase`, `path`, `step`,
//! `metrics` as JSON text, `gguf`: the checkpoint exported for the `local` provider when
//! the trainer reported one, checked to be a GGUF file) that downstream stages depend on
//! (`generate`'s `checkpoint`, `neurons`' `checkpoint:PHASE`). Its summary (table
//! `training`) holds the loss curve: every step the trainer logged, per phase (the
//! `report` draws it as a line chart), and each phase's final metrics.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::array::{Int64Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::external::{self, absolute};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, RATIO, Ty};
use synth_core::data::chat;
use synth_core::store::failures::FailureKind;
use synth_core::store::state::relative_to;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_core::template::Templates;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

/// Training hyperparameters and their defaults (a method's pipelines pin their own).
const HYPERPARAMETERS: &[OptionSpec] = &[
    OptionSpec::default("sft_lr", Ty::Float(0.0, f64::INFINITY), "1e-5", "SFT learning rate"),
    OptionSpec::default("dpo_lr", Ty::Float(0.0, f64::INFINITY), "2e-5", "DPO learning rate"),
    OptionSpec::default("beta", Ty::Float(0.0, f64::INFINITY), "0.1", "DPO β"),
    OptionSpec::default("batch_size", POSITIVE, "8", "per-device train batch size"),
    OptionSpec::default("grad_acc", POSITIVE, "2", "gradient accumulation steps"),
    OptionSpec::default("epochs", Ty::Float(0.0, f64::INFINITY), "1", "training epochs per phase"),
    OptionSpec::default("warmup_ratio", RATIO, "0.04", "warmup share of the steps"),
    OptionSpec::default("scheduler", Ty::Str, "\"cosine\"", "learning-rate scheduler (transformers name)"),
    OptionSpec::default("bf16", Ty::Bool, "true", "train in bfloat16"),
    OptionSpec::optional("max_steps", POSITIVE, "stop each phase after this many steps (template value -1 when unset)"),
];

const DEFAULT_COMMAND: &str = r#"["python3", "pipelines/trainers/trl_train.py", "--sft", "{{ sft }}", "--dpo", "{{ dpo }}", "--output-dir", "{{ output_dir }}", "--base-model", "{{ base_model }}", "--sft-lr", "{{ sft_lr }}", "--dpo-lr", "{{ dpo_lr }}", "--beta", "{{ beta }}", "--batch-size", "{{ batch_size }}", "--grad-acc", "{{ grad_acc }}", "--epochs", "{{ epochs }}", "--warmup-ratio", "{{ warmup_ratio }}", "--scheduler", "{{ scheduler }}", "--bf16", "{{ bf16 }}", "--max-steps", "{{ max_steps }}"]"#;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "command",
        Ty::List(&Ty::Str),
        DEFAULT_COMMAND,
        "trainer command line, run in the pipeline root; each element a template over sft, dpo, output_dir, base_model, stage and the hyperparameters (elements rendering empty are dropped)",
    ),
    OptionSpec::required("base_model", Ty::Str, "model to start from (hub id or local path), passed to the trainer"),
    OptionSpec::default(
        "hyperparameters",
        Ty::Struct(HYPERPARAMETERS),
        r#"{ sft_lr = 1e-5, dpo_lr = 2e-5, beta = 0.1, batch_size = 8, grad_acc = 2, epochs = 1, warmup_ratio = 0.04, scheduler = "cosine", bf16 = true }"#,
        "training hyperparameters (pipelines pin their own; defaults as listed)",
    ),
    OptionSpec::optional("env", Ty::Map(&Ty::Str), "extra environment variables for the trainer"),
    OptionSpec::optional("timeout_minutes", Ty::Float(0.0, f64::INFINITY), "stop the trainer after this long")
        .runtime_only(),
];

pub static KIND: KindInfo = KindInfo {
    name: "train",
    // 2: the `gguf` column and the summary (loss per step, final metrics).
    version: 2,
    about: "write SFT/DPO splits in TRL's format, run an external trainer, record its checkpoints and metrics",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    summary: true,
    example: "base_model = \"base\"",
    build,
    ..KindInfo::DEFAULT
};

/// Variables every command template may use besides the hyperparameters.
const VARIABLES: &[&str] = &["sft", "dpo", "output_dir", "base_model", "stage", "root"];

#[derive(Debug, Clone, Deserialize)]
struct Hyper {
    #[serde(default = "d_sft_lr")]
    sft_lr: f64,
    #[serde(default = "d_dpo_lr")]
    dpo_lr: f64,
    #[serde(default = "d_beta")]
    beta: f64,
    #[serde(default = "d_batch")]
    batch_size: i64,
    #[serde(default = "d_grad_acc")]
    grad_acc: i64,
    #[serde(default = "d_epochs")]
    epochs: f64,
    #[serde(default = "d_warmup")]
    warmup_ratio: f64,
    #[serde(default = "d_scheduler")]
    scheduler: String,
    #[serde(default = "d_bf16")]
    bf16: bool,
    #[serde(default)]
    max_steps: Option<i64>,
}

fn d_sft_lr() -> f64 {
    1e-5
}
fn d_dpo_lr() -> f64 {
    2e-5
}
fn d_beta() -> f64 {
    0.1
}
fn d_batch() -> i64 {
    8
}
fn d_grad_acc() -> i64 {
    2
}
fn d_epochs() -> f64 {
    1.0
}
fn d_warmup() -> f64 {
    0.04
}
fn d_scheduler() -> String {
    "cosine".into()
}
fn d_bf16() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Options {
    command: Vec<String>,
    base_model: String,
    hyperparameters: Hyper,
    #[serde(default)]
    env: BTreeMap<String, String>,
    timeout_minutes: Option<f64>,
}

struct Train {
    opts: Options,
    templates: Templates,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut templates = Templates::new();
    let mut ok = true;
    if opts.command.is_empty() {
        ctx.error(diags, "command", "command must not be empty");
        ok = false;
    }
    for (i, arg) in opts.command.iter().enumerate() {
        match templates.add(&arg_name(i), arg) {
            Ok(vars) => {
                for v in vars {
                    if !VARIABLES.contains(&v.as_str())
                        && !HYPERPARAMETERS.iter().any(|h| h.name == v)
                        && !synth_core::template::is_global(&v)
                    {
                        let names = VARIABLES.iter().copied().chain(HYPERPARAMETERS.iter().map(|h| h.name));
                        let hint = synth_core::config::diag::did_you_mean(&v, names).unwrap_or_default();
                        ctx.error(diags, "command", format!("command[{i}] uses unknown variable \"{v}\"{hint}"));
                        ok = false;
                    }
                }
            }
            Err(e) => {
                ctx.error(diags, "command", format!("command[{i}]: {e}"));
                ok = false;
            }
        }
    }
    ok.then(|| Box::new(Train { opts, templates }) as Box<dyn Stage>)
}

fn arg_name(i: usize) -> String {
    format!("arg{i}")
}

fn output_schema() -> SchemaRef {
    synth_core::data::schema_with_id([
        Field::new("phase", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("step", DataType::Int64, true),
        Field::new("metrics", DataType::Utf8, true),
        Field::new("gguf", DataType::Utf8, true),
    ])
}

/// TRL role names: lowercase `system` / `user` / `assistant`.
fn trl_role(role: &str) -> Option<&'static str> {
    chat::Role::parse(role).map(chat::Role::as_str)
}

/// A list of `{role, content}` messages with TRL role names.
fn trl_messages(v: &Value) -> Result<Vec<Value>, String> {
    let Value::Array(items) = v else {
        return Err(format!("expected a list of messages, found {}", synth_core::data::json_type(v)));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| format!("message {i} has no role"))?;
            let content =
                m.get("content").and_then(Value::as_str).ok_or_else(|| format!("message {i} has no text content"))?;
            let role = trl_role(role).ok_or_else(|| format!("message {i}: unknown role \"{role}\""))?;
            Ok(json!({"role": role, "content": content}))
        })
        .collect()
}

/// `chosen` / `rejected`: a reply string becomes one assistant message; a message list is kept.
fn trl_completion(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::String(s) => Ok(vec![json!({"role": "assistant", "content": s})]),
        Value::Array(_) => trl_messages(v),
        other => Err(format!("expected a string or a list of messages, found {}", synth_core::data::json_type(other))),
    }
}

fn sft_record(row: &synth_core::data::Row) -> Result<Value, String> {
    let conv = row.get("conversations").unwrap_or(&Value::Null);
    let messages = trl_messages(conv).map_err(|e| format!("conversations: {e}"))?;
    if messages.is_empty() {
        return Err("conversations: empty".into());
    }
    Ok(json!({"messages": messages}))
}

fn dpo_record(row: &synth_core::data::Row) -> Result<Value, String> {
    let get = |c: &str| row.get(c).unwrap_or(&Value::Null);
    let prompt = match get("prompt") {
        Value::String(s) => vec![json!({"role": "user", "content": s})],
        v => trl_messages(v).map_err(|e| format!("prompt: {e}"))?,
    };
    let chosen = trl_completion(get("chosen")).map_err(|e| format!("chosen: {e}"))?;
    let rejected = trl_completion(get("rejected")).map_err(|e| format!("rejected: {e}"))?;
    Ok(json!({"prompt": prompt, "chosen": chosen, "rejected": rejected}))
}

/// One reported checkpoint.
#[derive(Debug, Clone)]
struct Checkpoint {
    phase: String,
    path: String,
    step: Option<i64>,
    /// The checkpoint as GGUF (relative to the output directory), when exported.
    gguf: Option<String>,
}

/// What the trainer reported through the protocol lines.
#[derive(Debug, Default)]
struct Reported {
    checkpoints: Vec<Checkpoint>,
    /// phase → final metrics (without `phase`).
    metrics: BTreeMap<String, serde_json::Map<String, Value>>,
    /// Every logged step, in first-logged order.
    curves: Vec<Logged>,
}

/// The numbers a trainer logged at one step of one phase (loss, reward margin, ...).
#[derive(Debug)]
struct Logged {
    phase: String,
    step: i64,
    values: Vec<(String, f64)>,
}

/// Logged numbers drawn as the loss curve: (protocol key, summary metric, heading).
const CURVE: &[(&str, &str, &str)] = &[
    ("loss", "loss", "Loss"),
    ("rewards/margins", "reward_margin", "Reward margin"),
    ("rewards/accuracies", "reward_accuracy", "Reward accuracy"),
];

/// Final metrics of a phase in the summary's overall rows: (metric, heading).
const FINAL: &[(&str, &str)] = &[
    ("train_loss", "Train loss"),
    ("reward_margin", "Reward margin"),
    ("reward_accuracy", "Reward accuracy"),
    ("global_step", "Steps"),
    ("train_runtime", "Seconds"),
];

const TRAINING_TABLE: &str = "training";
const TRAINING_TITLE: &str = "Training (loss per logged step; final values per phase)";

impl Reported {
    /// The summary rows: the curve (group = the step) and each phase's final metrics (overall).
    fn summary(&self) -> Vec<SummaryRow> {
        let row = |label: &str, group: String, metric: &str, heading: &str, value: f64| SummaryRow {
            label: label.to_string(),
            table: TRAINING_TABLE.into(),
            title: TRAINING_TITLE.into(),
            group,
            metric: metric.to_string(),
            heading: heading.to_string(),
            n: 1,
            value,
            std: None,
            invalid: 0,
        };
        let mut rows = Vec::new();
        // Phases in the order the trainer reported them (sft before dpo).
        let mut phases: Vec<&String> = Vec::new();
        for p in self.checkpoints.iter().map(|c| &c.phase).chain(self.metrics.keys()) {
            if !phases.contains(&p) {
                phases.push(p);
            }
        }
        // The curves first: the report's chart panels and labels follow first-seen order.
        for Logged { phase, step, values } in &self.curves {
            for (metric, v) in values {
                let heading = CURVE.iter().find(|c| c.1 == metric).map_or(metric.as_str(), |c| c.2);
                rows.push(row(phase, step.to_string(), metric, heading, *v));
            }
        }
        for (phase, m) in phases.into_iter().filter_map(|p| self.metrics.get(p).map(|m| (p, m))) {
            for (metric, heading) in FINAL {
                if let Some(v) = m.get(*metric).and_then(number) {
                    rows.push(row(phase, OVERALL.into(), metric, heading, v));
                }
            }
        }
        rows
    }
}

/// A logged number: a JSON number, or a non-finite one the trainer wrote as text ("nan").
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        _ => None,
    }
}

impl Train {
    fn variables(&self, sft: &Path, dpo: &Path, output_dir: &Path, stage: &str, root: &Path) -> Value {
        let h = &self.opts.hyperparameters;
        json!({
            "sft": sft.to_string_lossy(),
            "dpo": dpo.to_string_lossy(),
            "output_dir": output_dir.to_string_lossy(),
            "base_model": self.opts.base_model,
            "stage": stage,
            "root": root.to_string_lossy(),
            "sft_lr": h.sft_lr,
            "dpo_lr": h.dpo_lr,
            "beta": h.beta,
            "batch_size": h.batch_size,
            "grad_acc": h.grad_acc,
            "epochs": h.epochs,
            "warmup_ratio": h.warmup_ratio,
            "scheduler": h.scheduler,
            "bf16": h.bf16,
            "max_steps": h.max_steps.unwrap_or(-1),
        })
    }

    /// A protocol line other than `SYNTH_PROGRESS`; returns whether the tag is known.
    fn protocol(
        ctx: &RunCtx,
        tag: &str,
        phase: String,
        parsed: Value,
        reported: &mut Reported,
        out_dir: &Path,
    ) -> bool {
        match tag {
            "SYNTH_PROGRESS" => {
                let Some(step) = parsed.get("step").and_then(Value::as_i64) else { return true };
                let values: Vec<(String, f64)> = CURVE
                    .iter()
                    .filter_map(|(key, metric, _)| parsed.get(*key).and_then(number).map(|v| (metric.to_string(), v)))
                    .collect();
                if !values.is_empty() {
                    reported.curves.retain(|l| !(l.phase == phase && l.step == step));
                    reported.curves.push(Logged { phase, step, values });
                }
                true
            }
            "SYNTH_CHECKPOINT" => {
                let Some(path) = parsed.get("path").and_then(Value::as_str) else {
                    tracing::warn!(stage = %ctx.name, "trainer: SYNTH_CHECKPOINT without \"path\"");
                    return true;
                };
                let full = absolute(&ctx.root.join(path));
                let stored = relative_to(&absolute(out_dir), &full);
                tracing::info!(stage = %ctx.name, "checkpoint ({phase}): {stored}");
                let step = parsed.get("step").and_then(Value::as_i64);
                let gguf = parsed
                    .get("gguf")
                    .and_then(Value::as_str)
                    .map(|g| relative_to(&absolute(out_dir), &absolute(&ctx.root.join(g))));
                reported.checkpoints.retain(|c| c.path != stored);
                reported.checkpoints.push(Checkpoint { phase, path: stored, step, gguf });
                true
            }
            "SYNTH_METRICS" => {
                let mut m = parsed.as_object().cloned().unwrap_or_default();
                m.shift_remove("phase");
                tracing::info!(stage = %ctx.name, "metrics ({phase}): {}", serde_json::Value::Object(m.clone()));
                reported.metrics.entry(phase).or_default().extend(m);
                true
            }
            _ => false,
        }
    }
}

#[async_trait]
impl Stage for Train {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["conversations"]);
        ctx.require_columns("inputs", 1, ["prompt", "chosen", "rejected"]);
        // A trainer script under the pipeline root is part of what the stage runs.
        for p in external::command_files(ctx.root, &self.opts.command) {
            if !ctx.files.contains(&p) {
                ctx.files.push(p);
            }
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let out_dir = absolute(&ctx.out_dir);
        let work = out_dir.join(&ctx.name);
        let data_dir = work.join("train_data");
        let (sft_path, dpo_path) = (data_dir.join("sft.jsonl"), data_dir.join("dpo.jsonl"));

        // 1. The data, in TRL's conversational formats.
        let (sft_in, dpo_in) = (ctx.inputs[0].path.clone(), ctx.inputs[1].path.clone());
        let (s, d) = (sft_path.clone(), dpo_path.clone());
        let ((sft_rows, sft_failed), (dpo_rows, dpo_failed)) = tokio::task::spawn_blocking(move || -> Result<_> {
            Ok((
                external::write_work_jsonl(&sft_in, &s, None, sft_record)?,
                external::write_work_jsonl(&dpo_in, &d, None, dpo_record)?,
            ))
        })
        .await??;
        for (id, e) in sft_failed.iter().chain(&dpo_failed) {
            ctx.fail(id, FailureKind::BadRecord, e.clone(), None);
        }
        ctx.report.rows_in = ctx.inputs[0].num_rows + ctx.inputs[1].num_rows;
        if sft_rows == 0 && dpo_rows == 0 {
            bail!("no training data: both inputs are empty after conversion");
        }
        tracing::info!(stage = %ctx.name, sft = sft_rows, dpo = dpo_rows, "training data written to {}", data_dir.display());

        // 2. The command.
        let root = absolute(&ctx.root);
        let vars = self.variables(&sft_path, &dpo_path, &work, &ctx.name, &root);
        let mut argv = Vec::new();
        for i in 0..self.opts.command.len() {
            let a = self
                .templates
                .render_value(&arg_name(i), minijinja::Value::from(minijinja::value::Serde(&vars)))
                .map_err(|e| anyhow::anyhow!("command[{i}]: {e}"))?;
            if !a.is_empty() {
                argv.push(a);
            }
        }
        // 3. Run it, following its output.
        let mut reported = Reported::default();
        let launch = external::Launch {
            what: "trainer",
            argv,
            cwd: root.clone(),
            env: self.opts.env.clone(),
            timeout_minutes: self.opts.timeout_minutes,
        };
        external::run(ctx, launch, |tag, phase, v| Self::protocol(ctx, tag, phase, v, &mut reported, &out_dir)).await?;
        if reported.checkpoints.is_empty() {
            bail!(
                "trainer exited successfully but reported no checkpoint (expected `SYNTH_CHECKPOINT {{\"phase\": ..., \"path\": ...}}` lines; see pipelines/trainers/README.md)"
            );
        }

        // An exported checkpoint the local provider is to load: a GGUF file, or an error naming it.
        for c in reported.checkpoints.iter().filter(|c| c.gguf.is_some()) {
            let file = out_dir.join(c.gguf.as_deref().unwrap_or_default());
            match synth_core::hub::is_gguf(&file) {
                Ok(true) => {}
                Ok(false) => bail!("the trainer's {} checkpoint {} is not a GGUF file", c.phase, file.display()),
                Err(e) => bail!("the trainer's {} checkpoint {} cannot be read: {e}", c.phase, file.display()),
            }
        }

        // 4. Record the artifacts.
        ctx.report.info.insert("base_model".into(), self.opts.base_model.clone());
        ctx.report.info.insert("train_data.sft".into(), relative_to(&out_dir, &sft_path));
        ctx.report.info.insert("train_data.dpo".into(), relative_to(&out_dir, &dpo_path));
        ctx.report.metrics.insert("train_data.sft_rows".into(), sft_rows as f64);
        ctx.report.metrics.insert("train_data.dpo_rows".into(), dpo_rows as f64);
        for c in &reported.checkpoints {
            // The last checkpoint of each phase is the phase's result.
            ctx.report.info.insert(format!("checkpoint.{}", c.phase), c.path.clone());
            if let Some(g) = &c.gguf {
                ctx.report.info.insert(format!("gguf.{}", c.phase), g.clone());
            }
        }
        for (phase, m) in &reported.metrics {
            for (k, v) in m {
                match v {
                    Value::Number(n) => {
                        if let Some(x) = n.as_f64() {
                            ctx.report.metrics.insert(format!("{phase}.{k}"), x);
                        }
                    }
                    Value::String(s) => {
                        ctx.report.info.insert(format!("{phase}.{k}"), s.clone());
                    }
                    _ => {}
                }
            }
        }
        let metrics_text = |phase: &str| reported.metrics.get(phase).map(|m| Value::Object(m.clone()).to_string());
        let cps = &reported.checkpoints;
        let batch = RecordBatch::try_new(
            output_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(cps.iter().map(|c| format!("{}:{}", c.phase, c.path)))),
                Arc::new(StringArray::from_iter_values(cps.iter().map(|c| c.phase.as_str()))),
                Arc::new(StringArray::from_iter_values(cps.iter().map(|c| c.path.as_str()))),
                Arc::new(Int64Array::from_iter(cps.iter().map(|c| c.step))),
                Arc::new(StringArray::from_iter(cps.iter().map(|c| metrics_text(&c.phase)))),
                Arc::new(StringArray::from_iter(cps.iter().map(|c| c.gguf.as_deref()))),
            ],
        )?;
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&reported.summary())?)?;
        let mut w = ctx.create_output(output_schema())?;
        w.write(&batch)?;
        ctx.set_output(w)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_rows_to_trl_layouts() {
        let row: synth_core::data::Row = serde_json::from_value(json!({
            "id": "a",
            "conversations": [{"role": "System", "content": "s"}, {"role": "User", "content": "u"}, {"role": "Assistant", "content": "a"}],
        }))
        .unwrap();
        assert_eq!(
            sft_record(&row).unwrap(),
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})
        );
        let row: synth_core::data::Row = serde_json::from_value(json!({
            "id": "b", "prompt": [{"role": "User", "content": "q"}], "chosen": "yes", "rejected": "no",
        }))
        .unwrap();
        assert_eq!(
            dpo_record(&row).unwrap(),
            json!({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "yes"}], "rejected": [{"role": "assistant", "content": "no"}]})
        );
        let bad: synth_core::data::Row =
            serde_json::from_value(json!({"id": "c", "conversations": [{"role": "Narrator", "content": "x"}]}))
                .unwrap();
        assert!(sft_record(&bad).unwrap_err().contains("unknown role"));
    }
}
