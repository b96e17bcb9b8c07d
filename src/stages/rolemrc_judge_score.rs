//! `rolemrc_judge_score`: score the judge's answers as the official
//! `llm_judge.py` does — remove `Score:`, parse the rest as a Python `int()`; anything
//! else scores 0 and counts as a bad judge response — with optional self-consistency
//! (several samples per query, majority vote, ties to the lower score), and the
//! accuracy per dimension written beside the output as `<stage>.summary.parquet`.
//!
//! Inputs: the queries (`rolemrc_judge_plan`) and the `llm` stage that answered them.
//! A query with no answer (its LLM call failed) scores 0 and counts as bad, so the
//! denominators stay those of the official code.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{Result, anyhow};
use arrow::array::{Array, AsArray, Float64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use super::rolemrc_judge_plan::DIMENSIONS;
use super::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};
use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::store::parquet::read_all;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("answer_column", Ty::Str, "\"raw\"", "column of the LLM stage with the judge's answer"),
    OptionSpec::optional("label", Ty::Str, "name of the judged model in the summary; default: the queries' input name"),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_judge_score",
    version: 1,
    about: "RoleMRC judge scores (official extraction, majority vote over samples) and accuracy per dimension",
    role: Role::Transform,
    arity: Arity::Exactly(2),
    options: OPTIONS,
    uses_seed: false,
    build,
};

#[derive(Deserialize)]
struct Options {
    answer_column: String,
    label: Option<String>,
}

struct JudgeScore {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(JudgeScore { opts: ctx.parse(diags)? }))
}

/// The official score extraction: `int(response.replace("Score:", ""))`, or `None`
/// (a bad judge response) when Python's `int()` would raise.
pub fn extract_score(answer: &str) -> Option<i64> {
    let s = answer.replace("Score:", "");
    let t = s.trim_matches(|c: char| c.is_whitespace());
    let (sign, digits) = match t.strip_prefix(['+', '-']) {
        Some(rest) => (if t.starts_with('-') { -1 } else { 1 }, rest),
        None => (1, t),
    };
    // Digits with single underscores between them (PEP 515), as int() accepts.
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    let mut value: i64 = 0;
    for c in digits.chars().filter(|&c| c != '_') {
        let d = c.to_digit(10)?;
        value = value.checked_mul(10)?.checked_add(d as i64)?;
    }
    Some(sign * value)
}

/// Majority vote; ties go to the lower score.
fn vote(scores: &[i64]) -> i64 {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for s in scores {
        *counts.entry(*s).or_default() += 1;
    }
    let best = counts.values().copied().max().unwrap_or(0);
    counts.into_iter().find(|(_, c)| *c == best).map(|(s, _)| s).unwrap_or(0)
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    data::schema_with_id([
        s("source_id"),
        s("task"),
        s("dimension"),
        Field::new("score", DataType::Int64, false),
        Field::new("bad", DataType::Boolean, false),
        Field::new("samples", DataType::Int64, false),
        s("answers"),
    ])
}

fn summary_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("dimension", DataType::Utf8, false),
        Field::new("n", DataType::UInt64, false),
        Field::new("accuracy", DataType::Float64, false),
        Field::new("bad", DataType::UInt64, false),
    ]))
}

#[async_trait]
impl Stage for JudgeScore {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["source_id", "task", "dimension"]);
        ctx.require_columns("inputs", 1, [self.opts.answer_column.as_str()]);
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Answers by query id (an `llm` stage with n > 1 writes "<id>/<k>" and `sample`).
        let mut answers: HashMap<String, Vec<Option<String>>> = HashMap::new();
        let (_, batches) = read_all(&ctx.inputs[1].path)?;
        for b in &batches {
            let ids = data::ids(b);
            let col = b.column_by_name(&self.opts.answer_column).ok_or_else(|| anyhow!("no answer column"))?;
            let col = arrow::compute::cast(col, &DataType::Utf8)?;
            let text = col.as_string::<i32>();
            let sample = b.column_by_name("sample").map(|c| c.as_primitive::<Int64Type>().clone());
            for i in 0..b.num_rows() {
                let id = ids.value(i);
                let query = match &sample {
                    Some(s) if s.is_valid(i) => id.strip_suffix(&format!("/{}", s.value(i))).unwrap_or(id),
                    _ => id,
                };
                answers.entry(query.to_string()).or_default().push(text.is_valid(i).then(|| text.value(i).to_string()));
            }
        }
        let (_, queries) = read_all(&ctx.inputs[0].path)?;
        let schema = output_schema();
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut per_dim: BTreeMap<String, (u64, i64, u64)> = BTreeMap::new();
        let mut n = 0u64;
        for b in &queries {
            let ids = data::ids(b);
            let col = |name: &str| b.column_by_name(name).expect("planned column").as_string::<i32>().clone();
            let (source, task, dim) = (col("source_id"), col("task"), col("dimension"));
            let mut rows: Vec<Row> = Vec::with_capacity(b.num_rows());
            for i in 0..b.num_rows() {
                n += 1;
                let got = answers.get(ids.value(i)).cloned().unwrap_or_default();
                let parsed: Vec<Option<i64>> = got.iter().map(|a| a.as_deref().and_then(extract_score)).collect();
                let bad = parsed.is_empty() || parsed.iter().all(Option::is_none);
                let score = vote(&parsed.iter().map(|p| p.unwrap_or(0)).collect::<Vec<_>>());
                let e = per_dim.entry(dim.value(i).to_string()).or_default();
                e.0 += 1;
                e.1 += score;
                e.2 += u64::from(bad);
                let mut r = Row::new();
                r.insert(data::ID.into(), json!(ids.value(i)));
                r.insert("source_id".into(), json!(source.value(i)));
                r.insert("task".into(), json!(task.value(i)));
                r.insert("dimension".into(), json!(dim.value(i)));
                r.insert("score".into(), json!(score));
                r.insert("bad".into(), json!(bad));
                r.insert("samples".into(), json!(got.len()));
                r.insert("answers".into(), json!(serde_json::to_string(&got)?));
                rows.push(r);
            }
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = n;

        // Accuracy per dimension (every dimension listed; 0 with n = 0 when absent, as the official code).
        let label = self.opts.label.clone().unwrap_or_else(|| ctx.inputs[0].name.clone());
        let dims: Vec<&str> = DIMENSIONS.to_vec();
        let stat = |d: &str| per_dim.get(d).copied().unwrap_or_default();
        let batch = RecordBatch::try_new(
            summary_schema(),
            vec![
                Arc::new(StringArray::from(vec![label.as_str(); dims.len()])),
                Arc::new(StringArray::from(dims.clone())),
                Arc::new(UInt64Array::from_iter_values(dims.iter().map(|d| stat(d).0))),
                Arc::new(Float64Array::from_iter_values(dims.iter().map(|d| {
                    let (n, sum, _) = stat(d);
                    if n == 0 { 0.0 } else { sum as f64 / n as f64 }
                }))),
                Arc::new(UInt64Array::from_iter_values(dims.iter().map(|d| stat(d).2))),
            ],
        )?;
        ctx.write_side_parquet(&format!("{}.summary.parquet", ctx.name), &batch)?;
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_extraction() {
        assert_eq!(extract_score("Score: 1"), Some(1));
        assert_eq!(extract_score("1"), Some(1));
        assert_eq!(extract_score(" 0\n"), Some(0));
        assert_eq!(extract_score("Score:1"), Some(1));
        assert_eq!(extract_score("+1"), Some(1));
        assert_eq!(extract_score("1_0"), Some(10));
        assert_eq!(extract_score(""), None);
        assert_eq!(extract_score("Score: 1."), None);
        assert_eq!(extract_score("The score is 1"), None);
        assert_eq!(extract_score("1 0"), None);
        assert_eq!(vote(&[1, 0, 1]), 1);
        assert_eq!(vote(&[1, 0]), 0, "ties go to the lower score");
    }
}
