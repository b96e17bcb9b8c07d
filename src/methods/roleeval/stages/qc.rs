//! `roleeval_qc`: the paper's automatic quality check (§3.2) per character: a strong
//! and a weak model answered every question (x, y: their accuracies over the
//! character's questions); the character passes when 0.3 ≤ x ≤ 0.9, y ≤ 0.8 and
//! x − y ≥ 0.15 (bounds are options; compared with `tolerance`). Inputs: the
//! questions (with `answer` and the character column), the strong model's answers,
//! the weak model's (`pred` by `qkey` = question id, e.g. `llm` + `roleeval_mcq` over
//! `roleeval_prompts`). Output: the questions with `qc_strong`, `qc_weak`, `qc_pass`,
//! `qc_reason`; the summary (table `qc`: one row per character, accuracies in %);
//! `<stage>.revise.csv`, the failing characters with their accuracies and reasons
//! (the paper sends them back to the annotators rather than dropping them). The
//! questions of a failing character go to the failure table (kind `check`, check
//! `roleeval_qc`, with the accuracies and reasons), so the check is counted with the
//! pipeline's other content checks (`check.roleeval_qc.*`, the manifest's `quality`).

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::build::{QcBounds, qc_reasons};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("strong_min", Ty::Float(0.0, 1.0), "0.3", "lowest accuracy of the strong model (x_l)"),
    OptionSpec::default("strong_max", Ty::Float(0.0, 1.0), "0.9", "highest accuracy of the strong model (x_u)"),
    OptionSpec::default("weak_max", Ty::Float(0.0, 1.0), "0.8", "highest accuracy of the weak model (y_u)"),
    OptionSpec::default("min_gap", Ty::Float(-1.0, 1.0), "0.15", "smallest x - y (d)"),
    OptionSpec::default(
        "tolerance",
        Ty::Float(0.0, 0.01),
        "1e-9",
        "slack of every comparison (0.15 is not exact in binary)",
    ),
    OptionSpec::default("character_column", Ty::Str, "\"char_id\"", "column identifying the character"),
    OptionSpec::default("name_column", Ty::Str, "\"name\"", "column naming the character in the report (if present)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_qc",
    // 2: questions of failing characters go to the failure table, not the output.
    version: 2,
    about: "RoleEval construction: per-character automatic quality check (0.3 <= x <= 0.9, y <= 0.8, x - y >= 0.15)",
    arity: Arity::Exactly(3),
    options: OPTIONS,
    summary: true,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    strong_min: f64,
    strong_max: f64,
    weak_max: f64,
    min_gap: f64,
    tolerance: f64,
    character_column: String,
    name_column: String,
}

struct Qc {
    bounds: QcBounds,
    character: String,
    name: String,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let bounds = QcBounds {
        strong_min: o.strong_min,
        strong_max: o.strong_max,
        weak_max: o.weak_max,
        min_gap: o.min_gap,
        tolerance: o.tolerance,
    };
    Some(Box::new(Qc { bounds, character: o.character_column, name: o.name_column }))
}

const ADDED: [(&str, DataType, bool); 6] = [
    ("strong_pred", DataType::Utf8, true),
    ("weak_pred", DataType::Utf8, true),
    ("qc_strong", DataType::Float64, false),
    ("qc_weak", DataType::Float64, false),
    ("qc_pass", DataType::Boolean, false),
    ("qc_reason", DataType::Utf8, true),
];

fn schema(input: &SchemaRef) -> SchemaRef {
    let kept = input.fields().iter().skip(1).filter(|f| !ADDED.iter().any(|(n, _, _)| n == f.name()));
    data::schema_with_id(
        kept.map(|f| f.as_ref().clone()).chain(ADDED.iter().map(|(n, t, null)| Field::new(*n, t.clone(), *null))),
    )
}

fn text(r: &Row, c: &str) -> Option<String> {
    match r.get(c) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// Predictions by question id (`qkey`) from an answers input.
fn predictions(path: &std::path::Path) -> Result<HashMap<String, Option<String>>> {
    let (_, batches) = synth_core::store::parquet::read_all(path)?;
    let mut out = HashMap::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            let r = data::row_json(b, i);
            let key = text(&r, "qkey").or_else(|| text(&r, data::ID)).unwrap_or_default();
            out.insert(key, text(&r, "pred"));
        }
    }
    Ok(out)
}

#[async_trait]
impl Stage for Qc {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("character_column", 0, [self.character.as_str(), "answer"]);
        ctx.require_columns("inputs", 1, ["pred"]);
        ctx.require_columns("inputs", 2, ["pred"]);
        Some(schema(&ctx.input_schema(0)?))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let strong = predictions(&ctx.inputs[1].path)?;
        let weak = predictions(&ctx.inputs[2].path)?;
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let questions: Vec<Row> =
            batches.iter().flat_map(|b| (0..b.num_rows()).map(move |i| data::row_json(b, i))).collect();
        // Per character (first-seen order): name, n, strong correct, weak correct.
        let mut order: Vec<String> = Vec::new();
        let mut per: BTreeMap<String, (String, u64, u64, u64)> = BTreeMap::new();
        for r in &questions {
            let id = text(r, data::ID).unwrap_or_default();
            let c = text(r, &self.character).unwrap_or_default();
            let gold = text(r, "answer");
            let e = per.entry(c.clone()).or_insert_with(|| {
                order.push(c.clone());
                (text(r, &self.name).unwrap_or_else(|| c.clone()), 0, 0, 0)
            });
            e.1 += 1;
            e.2 += u64::from(gold.is_some() && strong.get(&id).cloned().flatten() == gold);
            e.3 += u64::from(gold.is_some() && weak.get(&id).cloned().flatten() == gold);
        }
        let verdict: HashMap<String, (f64, f64, Vec<String>)> = per
            .iter()
            .map(|(c, (_, n, s, w))| {
                let (x, y) = (*s as f64 / *n as f64, *w as f64 / *n as f64);
                (c.clone(), (x, y, qc_reasons(x, y, &self.bounds)))
            })
            .collect();
        let schema = schema(&ctx.inputs[0].schema);
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut rows = Vec::with_capacity(questions.len());
        let (checked, mut failed) = (questions.len() as u64, 0u64);
        for r in questions {
            let id = text(&r, data::ID).unwrap_or_default();
            let c = text(&r, &self.character).unwrap_or_default();
            let (x, y, reasons) = &verdict[&c];
            // The predictions and the verdict travel with the row, kept or failed: a failed
            // question's record in the failure table shows what the models answered.
            let mut row = r;
            row.insert(
                "strong_pred".into(),
                strong.get(&id).cloned().flatten().map(Value::String).unwrap_or(Value::Null),
            );
            row.insert("weak_pred".into(), weak.get(&id).cloned().flatten().map(Value::String).unwrap_or(Value::Null));
            row.insert("qc_strong".into(), json!(x));
            row.insert("qc_weak".into(), json!(y));
            row.insert("qc_pass".into(), json!(reasons.is_empty()));
            row.insert("qc_reason".into(), if reasons.is_empty() { Value::Null } else { json!(reasons.join("; ")) });
            if !reasons.is_empty() {
                failed += 1;
                let message = format!(
                    "character {c} fails the automatic quality check (strong {:.0}%, weak {:.0}%): {}; see {}.revise.csv",
                    x * 100.0,
                    y * 100.0,
                    reasons.join("; "),
                    ctx.name
                );
                ctx.fail_check(&id, "roleeval_qc", message, Some(Value::Object(row).to_string()));
                continue;
            }
            rows.push(row);
        }
        ctx.report.rows_in = checked;
        let counts = synth_quality::Counts { checked, failed, reasked: 0, dropped: failed, flagged: 0 };
        ctx.report.metrics.extend(counts.metrics("roleeval_qc"));
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }

        let mut summary_rows = Vec::new();
        let mut revise = String::from("char_id,name,questions,strong_accuracy,weak_accuracy,reasons\n");
        for c in &order {
            let (name, n, _, _) = &per[c];
            let (x, y, reasons) = &verdict[c];
            for (metric, heading, value) in [
                ("strong", "Strong (%)", x * 100.0),
                ("weak", "Weak (%)", y * 100.0),
                ("gap", "x - y (points)", (x - y) * 100.0),
                ("pass", "Pass", if reasons.is_empty() { 1.0 } else { 0.0 }),
            ] {
                summary_rows.push(SummaryRow {
                    label: name.clone(),
                    table: "qc".into(),
                    title: "Automatic quality check per character (paper §3.2)".into(),
                    group: OVERALL.into(),
                    metric: metric.into(),
                    heading: heading.into(),
                    n: *n,
                    value,
                    std: None,
                    invalid: 0,
                });
            }
            if !reasons.is_empty() {
                let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
                w.write_record([
                    c.as_str(),
                    name,
                    &n.to_string(),
                    &format!("{x:.2}"),
                    &format!("{y:.2}"),
                    &reasons.join("; "),
                ])?;
                revise.push_str(&String::from_utf8(w.into_inner().map_err(|e| anyhow!("{e}"))?)?);
            }
        }
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&summary_rows)?)?;
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(format!("{}.revise.csv", ctx.name)))?;
        std::io::Write::write_all(&mut f, revise.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);
        ctx.set_output(out)
    }
}
