//! `characterbench_score`: the benchmark's scores of one model from its judged records
//! (one row per record and language with the judge score, e.g. `aggregate`'s mean of
//! CharacterJudge's samples): per language and dimension the mean score, `score5 =
//! 5·mean/scale_max` with the fixed scale of the definition (P12), AVG over the dimension
//! files and the six aspects (`characterbench::scores`). Summary tables for `report`, per
//! language: `<table>_<lang>` (Table 4 layout: AVG then the 13 dimensions), `<table>_aspects_<lang>`
//! (Table 5) and `<table>_fallbacks_<lang>` (how many judge samples fell back to the
//! parser's default score, per dimension: the official 3.0, counted, never hidden).
//!
//! A second input (optional) lists the records that were to be scored (e.g. the judge
//! prompts): a record without a score (its judge call failed) is counted as missing in
//! `invalid` and left out of the mean. `avg_over = "all"` makes AVG undefined (NaN)
//! unless every dimension of the definition has scores, as the official script (which
//! stops without all 13 files); the default averages the dimensions present and says how
//! many in the table title.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, SchemaRef};

use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use crate::scores;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::parquet::read_all;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("label", Ty::Str, "the model's name in the report (default: the input stage's name)"),
    OptionSpec::default("score_column", Ty::Str, "\"score\"", "the judge score of a record"),
    OptionSpec::default(
        "fallback_column",
        Ty::Str,
        "\"score_fallback_count\"",
        "judge samples that fell back to the default score (counted when the column exists)",
    ),
    OptionSpec::default(
        "dimensions",
        Ty::File,
        DEFAULT_DIMENSIONS,
        "the benchmark definition (scales, aspects, order)",
    ),
    OptionSpec::default(
        "avg_over",
        Ty::Enum(&["present", "all"]),
        "\"present\"",
        "AVG over the dimensions with scores, or over all of the definition's (NaN unless complete)",
    ),
    OptionSpec::default("table", Ty::Str, "\"characterbench\"", "summary table name prefix"),
    OptionSpec::default("title", Ty::Str, "\"CharacterBench\"", "summary table heading prefix"),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_score",
    about: "CharacterBench scores of a model: per dimension 5·mean/scale_max, AVG, aspects (Tables 4-5 layout) and judge fallbacks, as a summary",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    summary: true,
    example: "label = \"model\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    label: Option<String>,
    score_column: String,
    fallback_column: String,
    dimensions: String,
    avg_over: String,
    table: String,
    title: String,
}

struct Score {
    opts: Options,
    bench: Bench,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    Some(Box::new(Score { opts, bench }))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    data::schema_with_id([
        s("label"),
        s("lang"),
        s("dimension"),
        s("abbr"),
        s("aspect"),
        i("n"),
        i("missing"),
        f("mean"),
        i("scale_max"),
        f("score5"),
        i("fallback_samples"),
        f("gold_max"),
    ])
}

/// Per (lang, dimension): scores, fallback samples, the largest human score.
#[derive(Default)]
struct Acc {
    scores: Vec<f64>,
    fallbacks: i64,
    gold_max: Option<f64>,
    missing: i64,
}

fn texts(col: &ArrayRef) -> Result<Vec<String>> {
    let t = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
    let s = t.as_string::<i32>();
    Ok((0..s.len()).map(|i| s.value(i).to_string()).collect())
}

#[async_trait]
impl Stage for Score {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["dimension", "lang", self.opts.score_column.as_str()]);
        if ctx.inputs.len() > 1 {
            ctx.require_columns("inputs", 1, ["dimension", "lang"]);
        }
        if ctx.inputs.len() > 2 {
            ctx.error("inputs", "one input with the scores, optionally a second with the records to score");
        }
        ctx.files.extend(self.bench.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let label = self.opts.label.clone().unwrap_or_else(|| ctx.inputs[0].name.clone());
        let mut acc: BTreeMap<(String, String), Acc> = BTreeMap::new();
        let mut scored_ids: BTreeSet<String> = BTreeSet::new();
        let mut langs: Vec<String> = Vec::new();
        let (_, batches) = read_all(&ctx.inputs[0].path)?;
        let mut rows_in = 0u64;
        for b in &batches {
            rows_in += b.num_rows() as u64;
            let col = |n: &str| b.column_by_name(n).cloned().ok_or_else(|| anyhow!("no column \"{n}\""));
            let dims = texts(&col("dimension")?)?;
            let lang = texts(&col("lang")?)?;
            let score = synth_core::data::arrow::compute::cast(&col(&self.opts.score_column)?, &DataType::Float64)?;
            let score = score.as_primitive::<Float64Type>();
            let fallback = match b.column_by_name(&self.opts.fallback_column) {
                Some(c) => Some(synth_core::data::arrow::compute::cast(c, &DataType::Int64)?),
                None => None,
            };
            let gold = match b.column_by_name("gold") {
                Some(c) => Some(synth_core::data::arrow::compute::cast(c, &DataType::Float64)?),
                None => None,
            };
            let ids = data::ids(b);
            for i in 0..b.num_rows() {
                if !langs.contains(&lang[i]) {
                    langs.push(lang[i].clone());
                }
                let a = acc.entry((lang[i].clone(), dims[i].clone())).or_default();
                if score.is_valid(i) && score.value(i).is_finite() {
                    a.scores.push(score.value(i));
                    scored_ids.insert(ids.value(i).to_string());
                } else {
                    a.missing += 1;
                }
                if let Some(f) = &fallback {
                    let f = f.as_primitive::<Int64Type>();
                    if f.is_valid(i) {
                        a.fallbacks += f.value(i);
                    }
                }
                if let Some(g) = &gold {
                    let g = g.as_primitive::<Float64Type>();
                    if g.is_valid(i) {
                        a.gold_max = Some(a.gold_max.map_or(g.value(i), |m: f64| m.max(g.value(i))));
                    }
                }
            }
        }
        // Records planned but never scored (their judge call failed).
        if ctx.inputs.len() > 1 {
            let (_, planned) = read_all(&ctx.inputs[1].path)?;
            for b in &planned {
                let col = |n: &str| b.column_by_name(n).cloned().ok_or_else(|| anyhow!("no column \"{n}\""));
                let dims = texts(&col("dimension")?)?;
                let lang = texts(&col("lang")?)?;
                let ids = data::ids(b);
                for i in 0..b.num_rows() {
                    if !scored_ids.contains(ids.value(i)) {
                        if !langs.contains(&lang[i]) {
                            langs.push(lang[i].clone());
                        }
                        acc.entry((lang[i].clone(), dims[i].clone())).or_default().missing += 1;
                    }
                }
            }
        }
        let unknown: Vec<&String> = acc.keys().map(|(_, d)| d).filter(|d| self.bench.dimension(d).is_none()).collect();
        if let Some(d) = unknown.first() {
            return Err(anyhow!(
                "dimension \"{d}\" is not in the definition {} (it knows: {})",
                self.opts.dimensions,
                self.bench.ids()
            ));
        }

        let mut out_rows: Vec<(String, String, String, i64, i64, Option<f64>, i64, Option<f64>, i64, Option<f64>)> =
            Vec::new();
        let mut summary: Vec<SummaryRow> = Vec::new();
        let total = self.bench.dimensions.len();
        for lang in &langs {
            let mut by_dim: BTreeMap<String, f64> = BTreeMap::new();
            let mut dim_rows: Vec<SummaryRow> = Vec::new();
            let mut fallback_rows: Vec<SummaryRow> = Vec::new();
            let mut present = 0usize;
            let mut invalid_total = 0u64;
            for d in &self.bench.dimensions {
                let a = acc.get(&(lang.clone(), d.id.clone()));
                let (n, missing, fallbacks) =
                    a.map(|a| (a.scores.len() as i64, a.missing, a.fallbacks)).unwrap_or((0, 0, 0));
                let mean = a.and_then(|a| scores::mean(&a.scores));
                let s5 = mean.map(|m| scores::score5(m, d.scale.1 as f64));
                if let Some(s) = s5 {
                    by_dim.insert(d.id.clone(), s);
                    present += 1;
                }
                invalid_total += missing as u64;
                if a.is_some() {
                    out_rows.push((
                        lang.clone(),
                        d.id.clone(),
                        d.abbr.clone(),
                        n,
                        missing,
                        mean,
                        d.scale.1,
                        s5,
                        fallbacks,
                        a.and_then(|a| a.gold_max),
                    ));
                }
                dim_rows.push(SummaryRow {
                    label: label.clone(),
                    table: format!("{}_{lang}", self.opts.table),
                    title: String::new(),
                    group: OVERALL.into(),
                    metric: d.id.clone(),
                    heading: d.abbr.clone(),
                    n: n as u64,
                    value: s5.unwrap_or(f64::NAN),
                    std: None,
                    invalid: missing as u64,
                });
                fallback_rows.push(SummaryRow {
                    label: label.clone(),
                    table: format!("{}_fallbacks_{lang}", self.opts.table),
                    title: format!("{}: judge samples that fell back to the default score ({lang})", self.opts.title),
                    group: OVERALL.into(),
                    metric: d.id.clone(),
                    heading: d.abbr.clone(),
                    n: n as u64,
                    value: if a.is_some() { fallbacks as f64 } else { f64::NAN },
                    std: None,
                    invalid: 0,
                });
            }
            let values: Vec<f64> = by_dim.values().copied().collect();
            let avg = match self.opts.avg_over.as_str() {
                "all" if present < total => f64::NAN,
                _ => scores::mean(&values).unwrap_or(f64::NAN),
            };
            let coverage = if present < total {
                format!(", AVG over {present} of {total} dimension files")
            } else {
                String::new()
            };
            let title = format!("{} (Table 4 layout, 5-point scale): {lang}{coverage}", self.opts.title);
            summary.push(SummaryRow {
                label: label.clone(),
                table: format!("{}_{lang}", self.opts.table),
                title: title.clone(),
                group: OVERALL.into(),
                metric: "avg".into(),
                heading: "AVG".into(),
                n: present as u64,
                value: avg,
                std: None,
                invalid: invalid_total,
            });
            summary.extend(dim_rows.into_iter().map(|r| SummaryRow { title: title.clone(), ..r }));
            for (aspect, value, dims, got) in scores::aspects(&self.bench, &by_dim) {
                let heading =
                    self.bench.aspects.iter().find(|a| a.id == aspect).map(|a| a.heading.clone()).unwrap_or_default();
                summary.push(SummaryRow {
                    label: label.clone(),
                    table: format!("{}_aspects_{lang}", self.opts.table),
                    title: format!("{} aspects (Table 5 layout, 5-point scale): {lang}", self.opts.title),
                    group: OVERALL.into(),
                    metric: aspect,
                    heading,
                    n: got as u64,
                    value: if self.opts.avg_over == "all" && got < dims { f64::NAN } else { value.unwrap_or(f64::NAN) },
                    std: None,
                    invalid: 0,
                });
            }
            summary.extend(fallback_rows);
        }
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&summary)?)?;

        let bench = &self.bench;
        let aspect_of = |d: &str| bench.dimension(d).map(|x| x.aspect.clone()).unwrap_or_default();
        let text = |v: Vec<String>| Arc::new(StringArray::from(v)) as ArrayRef;
        let batch = RecordBatch::try_new(
            output_schema(),
            vec![
                text(out_rows.iter().map(|r| format!("{}/{}", r.0, r.1)).collect()),
                text(out_rows.iter().map(|_| label.clone()).collect()),
                text(out_rows.iter().map(|r| r.0.clone()).collect()),
                text(out_rows.iter().map(|r| r.1.clone()).collect()),
                text(out_rows.iter().map(|r| r.2.clone()).collect()),
                text(out_rows.iter().map(|r| aspect_of(&r.1)).collect()),
                Arc::new(Int64Array::from_iter_values(out_rows.iter().map(|r| r.3))),
                Arc::new(Int64Array::from_iter_values(out_rows.iter().map(|r| r.4))),
                Arc::new(Float64Array::from_iter(out_rows.iter().map(|r| r.5))),
                Arc::new(Int64Array::from_iter_values(out_rows.iter().map(|r| r.6))),
                Arc::new(Float64Array::from_iter(out_rows.iter().map(|r| r.7))),
                Arc::new(Int64Array::from_iter_values(out_rows.iter().map(|r| r.8))),
                Arc::new(Float64Array::from_iter(out_rows.iter().map(|r| r.9))),
            ],
        )?;
        let mut out = ctx.create_output(output_schema())?;
        out.write(&batch)?;
        ctx.report.rows_in = rows_in;
        ctx.set_output(out)
    }
}
