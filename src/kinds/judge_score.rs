//! `judge_score`: score a judge's answers and summarize them per dimension. The
//! score of an answer is extracted by `extract`:
//! - `int` (default): remove every `score_prefix` (e.g. `Score:`; default none) and read the rest
//!   as Python's `int()` does (surrounding whitespace, a sign, `_` between digits);
//! - `regex`: the first capture group (or the whole match) of `pattern`, read the same way.
//!
//! Anything else scores 0 and counts as a bad judge response. Several samples per
//! query (an `llm` stage with `n > 1`) are a majority vote, ties to the lower score. A
//! query with no answer (its LLM call failed) scores 0 and counts as bad, so the
//! denominators stay those of the query plan. The mean score per dimension goes to
//! `<stage>.summary.parquet` (the summary protocol, table `judge` by default): every
//! dimension of `dimensions` (a judge folder's `dimensions.json`) in its order, with
//! its heading; a dimension without queries is 0 with n = 0.
//!
//! Inputs: the queries (`judge_plan` or a method's preset) and the `llm` stage that
//! answered them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;
use synth_core::data::arrow::array::{Array, AsArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Int64Type, SchemaRef};

use super::judge_plan::{Dimension, read_dimensions};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::parquet::read_all;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

/// The options of `judge_score`; a method preset declares the same names with its own defaults.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("answer_column", Ty::Str, "\"raw\"", "column of the LLM stage with the judge's answer"),
    OptionSpec::optional("label", Ty::Str, "name of the judged model in the summary; default: the queries' input name"),
    OptionSpec::required(
        "dimensions",
        Ty::File,
        "dimensions.json of the judge folder: [{id, heading}] in report order",
    ),
    OptionSpec::default("extract", Ty::Enum(&["int", "regex"]), "\"int\"", "how a score is read from an answer"),
    OptionSpec::default(
        "score_prefix",
        Ty::Str,
        "\"\"",
        "extract = int: text removed before reading the integer (e.g. \"Score:\")",
    ),
    OptionSpec::optional("pattern", Ty::Str, "extract = regex: the score is its first capture group (or the match)"),
    OptionSpec::default("table", Ty::Str, "\"judge\"", "report table of the summary rows"),
    OptionSpec::default(
        "title",
        Ty::Str,
        "\"LLM-as-judge (accuracy per dimension)\"",
        "heading of that table in the report",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "judge_score",
    about: "judge scores (score extraction, majority vote over samples) and the mean per dimension as a summary",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    summary: true,
    example: "dimensions = \"tests/fixtures/judge/dimensions.json\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
pub struct Options {
    pub answer_column: String,
    pub label: Option<String>,
    pub dimensions: String,
    pub extract: String,
    pub score_prefix: String,
    pub pattern: Option<String>,
    pub table: String,
    pub title: String,
}

struct JudgeScore {
    opts: Options,
    dimensions: Vec<Dimension>,
    file: PathBuf,
    pattern: Option<regex::Regex>,
}

/// Build `judge_score` (or a preset with the same option names).
pub fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let file = ctx.root.join(&opts.dimensions);
    let dimensions = match read_dimensions(&file) {
        Ok(d) => d,
        Err(e) => {
            ctx.error(diags, "dimensions", e);
            return None;
        }
    };
    let pattern = match (opts.extract.as_str(), &opts.pattern) {
        ("regex", None) => {
            ctx.error(diags, "pattern", "extract = \"regex\" needs a pattern");
            return None;
        }
        ("regex", Some(p)) => match regex::Regex::new(p) {
            Ok(r) => Some(r),
            Err(e) => {
                ctx.error(diags, "pattern", format!("bad regular expression: {e}"));
                return None;
            }
        },
        (_, Some(_)) => {
            ctx.error(diags, "pattern", "a pattern is only read with extract = \"regex\"");
            return None;
        }
        _ => None,
    };
    Some(Box::new(JudgeScore { opts, dimensions, file, pattern }))
}

/// `int(answer.replace(prefix, ""))` (with `Score:`, an official judge script's extraction), or
/// `None` (a bad judge response) when Python's `int()` would raise.
pub fn extract_score(answer: &str, prefix: &str) -> Option<i64> {
    let s = if prefix.is_empty() { answer.to_string() } else { answer.replace(prefix, "") };
    python_int(&s)
}

/// The integer Python's `int(text)` reads, or `None` where it raises.
pub fn python_int(text: &str) -> Option<i64> {
    let t = text.trim_matches(|c: char| c.is_whitespace());
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

impl JudgeScore {
    fn extract(&self, answer: &str) -> Option<i64> {
        match &self.pattern {
            Some(re) => {
                let caps = re.captures(answer)?;
                python_int(caps.get(1).or_else(|| caps.get(0))?.as_str())
            }
            None => extract_score(answer, &self.opts.score_prefix),
        }
    }
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

#[async_trait]
impl Stage for JudgeScore {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["source_id", "task", "dimension"]);
        ctx.require_columns("inputs", 1, [self.opts.answer_column.as_str()]);
        ctx.files.push(self.file.clone());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Answers by query id (an `llm` stage with n > 1 writes "<id>/<k>" and `sample`).
        let mut answers: HashMap<String, Vec<Option<String>>> = HashMap::new();
        let (_, batches) = read_all(&ctx.inputs[1].path)?;
        for b in &batches {
            let ids = data::ids(b);
            let col = b.column_by_name(&self.opts.answer_column).ok_or_else(|| anyhow!("no answer column"))?;
            let col = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
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
                let parsed: Vec<Option<i64>> = got.iter().map(|a| a.as_deref().and_then(|a| self.extract(a))).collect();
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

        // The mean score per dimension (every dimension listed; 0 with n = 0 when absent, as the official code).
        let label = self.opts.label.clone().unwrap_or_else(|| ctx.inputs[0].name.clone());
        let rows: Vec<SummaryRow> = self
            .dimensions
            .iter()
            .map(|d| {
                let (n, sum, bad) = per_dim.get(&d.id).copied().unwrap_or_default();
                SummaryRow {
                    label: label.clone(),
                    table: self.opts.table.clone(),
                    title: self.opts.title.clone(),
                    group: OVERALL.to_string(),
                    metric: d.id.clone(),
                    heading: d.heading.clone(),
                    n,
                    value: if n == 0 { 0.0 } else { sum as f64 / n as f64 },
                    std: None,
                    invalid: bad,
                }
            })
            .collect();
        let unknown: Vec<&String> = per_dim.keys().filter(|k| !self.dimensions.iter().any(|d| &d.id == *k)).collect();
        if !unknown.is_empty() {
            tracing::warn!(
                "stage \"{}\": queries of dimensions not in {} are scored but left out of the summary: {unknown:?}",
                ctx.name,
                self.file.display()
            );
        }
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&rows)?)?;
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_extraction() {
        let e = |a: &str| extract_score(a, "Score:");
        assert_eq!(e("Score: 1"), Some(1));
        assert_eq!(e("1"), Some(1));
        assert_eq!(e(" 0\n"), Some(0));
        assert_eq!(e("Score:1"), Some(1));
        assert_eq!(e("+1"), Some(1));
        assert_eq!(e("1_0"), Some(10));
        assert_eq!(e(""), None);
        assert_eq!(e("Score: 1."), None);
        assert_eq!(e("The score is 1"), None);
        assert_eq!(e("1 0"), None);
        assert_eq!(extract_score("Rating: 4", "Rating:"), Some(4));
        assert_eq!(vote(&[1, 0, 1]), 1);
        assert_eq!(vote(&[1, 0]), 0, "ties go to the lower score");
    }
}
