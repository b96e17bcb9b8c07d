//! `correlate`: agreement between score columns and a reference column (e.g. a judge's
//! scores and human ratings; two benchmarks' per-model scores), with `scipy.stats`
//! semantics (`eval::correlation`): Pearson's r, Spearman's ρ and Kendall's τ-b, each
//! with n and a two-sided p-value, optionally a seeded percentile bootstrap CI.
//!
//! Each `x` column is compared with `y` over the input's rows, per value of `group_by`
//! (e.g. a benchmark dimension) and per value of `split_by` (e.g. a language); a row with
//! a null or non-finite value on either side is left out and counted as invalid. With
//! groups, `average` adds the mean of the groups' coefficients (the AVG column of a
//! per-dimension table) and `pooled` the coefficient over all rows of the split. A
//! coefficient that is not defined (fewer than two pairs, a constant side) is NaN, never
//! 0, and is left out of the average (counted in its `invalid`).
//!
//! Output: one row per (x, split, group, method) with `n`, `statistic`, `p_value`,
//! `ci_low`, `ci_high`, `invalid`; and `<stage>.summary.parquet` for `report`: a table
//! per method (and split), the x columns as rows (their `labels`), the groups as columns.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use async_trait::async_trait;
use rayon::prelude::*;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringArray, UInt64Array};
use synth_core::data::arrow::datatypes::{DataType, Field, Float64Type, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{NUMBER, OptionSpec, RATIO, Ty, UINT};
use synth_core::data;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};
use synth_eval::correlation::{self, Method};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("x", Ty::StrList, "the score column(s) compared with y (each a row of the report tables)"),
    OptionSpec::required("y", Ty::Str, "the reference column (e.g. human scores)"),
    OptionSpec::optional("labels", Ty::Map(&Ty::Str), "x column -> its name in the report (default: the column name)"),
    OptionSpec::optional("group_by", Ty::Str, "one coefficient per value of this column (the report's columns)"),
    OptionSpec::optional("group_order", Ty::StrList, "group values in this order first (default: first seen)"),
    OptionSpec::optional("group_headings", Ty::Map(&Ty::Str), "group value -> column heading in the report"),
    OptionSpec::optional("split_by", Ty::Str, "a separate table per value of this column (e.g. a language)"),
    OptionSpec::default(
        "methods",
        Ty::StrList,
        "[\"pearson\", \"spearman\", \"kendall\"]",
        "pearson, spearman, kendall (scipy.stats semantics: Kendall's tau-b)",
    ),
    OptionSpec::default("average", Ty::Bool, "true", "with group_by: the mean of the groups' coefficients (AVG)"),
    OptionSpec::default("pooled", Ty::Bool, "false", "with group_by: the coefficient over all rows of the split"),
    OptionSpec::default("bootstrap", UINT, "0", "resamples for a percentile bootstrap CI (0: none)"),
    OptionSpec::default("ci", RATIO, "0.95", "the bootstrap CI's level"),
    OptionSpec::default("scale", NUMBER, "1.0", "summary values are the coefficient times this (e.g. 100 for percent)"),
    OptionSpec::default("table", Ty::Str, "\"correlation\"", "summary table name prefix (<table>_<method>[_<split>])"),
    OptionSpec::default("title", Ty::Str, "\"Agreement with the reference\"", "summary table heading prefix"),
];

pub static KIND: KindInfo = KindInfo {
    name: "correlate",
    about: "Pearson / Spearman / Kendall tau-b between score columns and a reference (scipy.stats semantics), per group and split, with p-values or bootstrap CIs",
    options: OPTIONS,
    uses_seed: true,
    summary: true,
    example: "x = [\"judge\"]\ny = \"human\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    x: Vec<String>,
    y: String,
    labels: Option<BTreeMap<String, String>>,
    group_by: Option<String>,
    group_order: Option<Vec<String>>,
    group_headings: Option<BTreeMap<String, String>>,
    split_by: Option<String>,
    methods: Vec<String>,
    average: bool,
    pooled: bool,
    bootstrap: usize,
    ci: f64,
    scale: f64,
    table: String,
    title: String,
}

struct Correlate {
    opts: Options,
    methods: Vec<Method>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut methods = Vec::new();
    for m in &opts.methods {
        match Method::parse(m) {
            Some(m) if !methods.contains(&m) => methods.push(m),
            Some(_) => {}
            None => {
                ctx.error(diags, "methods", format!("unknown method \"{m}\" (methods: {})", Method::NAMES.join(", ")));
                return None;
            }
        }
    }
    if methods.is_empty() {
        ctx.error(diags, "methods", "no method");
        return None;
    }
    if opts.x.is_empty() {
        ctx.error(diags, "x", "no column to compare");
        return None;
    }
    if let Some(labels) = &opts.labels
        && let Some(k) = labels.keys().find(|k| !opts.x.contains(k))
    {
        ctx.error(diags, "labels", format!("\"{k}\" is not one of x"));
        return None;
    }
    Some(Box::new(Correlate { opts, methods }))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    data::schema_with_id([
        s("label"),
        s("x"),
        s("y"),
        s("split"),
        s("group"),
        s("method"),
        Field::new("n", DataType::UInt64, false),
        f("statistic"),
        f("p_value"),
        f("ci_low"),
        f("ci_high"),
        Field::new("invalid", DataType::UInt64, false),
    ])
}

/// The group of the average of groups and of all rows pooled.
pub const AVERAGE: &str = "avg";
pub const POOLED: &str = "all";

/// One result row.
struct Cell {
    label: String,
    x: String,
    split: String,
    group: String,
    method: Method,
    n: u64,
    statistic: f64,
    p_value: f64,
    ci: Option<(f64, f64)>,
    invalid: u64,
}

/// A column as f64 (null where null or not a finite number).
fn numbers(col: &ArrayRef, name: &str) -> Result<Vec<Option<f64>>> {
    let cast = match col.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            // Text that reads as a number counts; anything else is invalid.
            let text = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
            let s = text.as_string::<i32>();
            return Ok((0..s.len())
                .map(|i| s.is_valid(i).then(|| s.value(i).trim().parse::<f64>().ok()).flatten())
                .collect());
        }
        DataType::Boolean => synth_core::data::arrow::compute::cast(col, &DataType::Float64)?,
        t if t.is_numeric() => synth_core::data::arrow::compute::cast(col, &DataType::Float64)?,
        other => return Err(anyhow!("column \"{name}\" is {other}, not numbers")),
    };
    let a = cast.as_primitive::<Float64Type>();
    Ok((0..a.len()).map(|i| (a.is_valid(i) && a.value(i).is_finite()).then(|| a.value(i) + 0.0)).collect())
}

/// The distinct values of a label column (`first` ones first, then first-seen order; a null
/// is "null") and each row's index into them; without a column, every row is `none`.
fn codes(col: &Option<ArrayRef>, n: usize, first: &[String], none: &str) -> Result<(Vec<String>, Vec<usize>)> {
    let Some(col) = col else { return Ok((vec![none.to_string()], vec![0; n])) };
    let text = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
    let s = text.as_string::<i32>();
    let mut order: Vec<String> = first.to_vec();
    let mut index: std::collections::HashMap<String, usize> =
        order.iter().cloned().enumerate().map(|(i, v)| (v, i)).collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..s.len() {
        let v = if s.is_valid(i) { s.value(i) } else { "null" };
        let code = match index.get(v) {
            Some(c) => *c,
            None => {
                order.push(v.to_string());
                index.insert(v.to_string(), order.len() - 1);
                order.len() - 1
            }
        };
        out.push(code);
    }
    Ok((order, out))
}

impl Correlate {
    fn label(&self, x: &str) -> String {
        if let Some(l) = self.opts.labels.as_ref().and_then(|m| m.get(x)) {
            return l.clone();
        }
        x.to_string()
    }

    fn heading(&self, group: &str) -> String {
        match group {
            AVERAGE => "AVG".into(),
            POOLED | OVERALL => "All".into(),
            g => self.opts.group_headings.as_ref().and_then(|m| m.get(g)).cloned().unwrap_or_else(|| g.to_string()),
        }
    }
}

#[async_trait]
impl Stage for Correlate {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let cols: Vec<&str> = self
            .opts
            .x
            .iter()
            .map(String::as_str)
            .chain([self.opts.y.as_str()])
            .chain(self.opts.group_by.as_deref())
            .chain(self.opts.split_by.as_deref())
            .collect();
        ctx.require_columns("inputs", 0, cols);
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Only the named columns are read and decoded (1M rows of a few numbers).
        let mut wanted: Vec<&str> = self.opts.x.iter().map(String::as_str).collect();
        wanted.push(&self.opts.y);
        wanted.extend(self.opts.group_by.as_deref());
        wanted.extend(self.opts.split_by.as_deref());
        wanted.sort_unstable();
        wanted.dedup();
        let batches = synth_core::store::parquet::read_columns(&ctx.inputs[0].path, &wanted)?;
        let concat = |name: &str| -> Result<ArrayRef> {
            let parts: Vec<ArrayRef> = batches
                .iter()
                .map(|b| b.column_by_name(name).cloned().ok_or_else(|| anyhow!("input has no column \"{name}\"")))
                .collect::<Result<_>>()?;
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            if refs.is_empty() {
                return Ok(synth_core::data::arrow::array::new_empty_array(&DataType::Float64));
            }
            Ok(synth_core::data::arrow::compute::concat(&refs)?)
        };
        let y = numbers(&concat(&self.opts.y)?, &self.opts.y)?;
        let n_rows = y.len();
        // Rows per (split, group) as codes: 1M rows need no string per row.
        let (split_order, split_code) =
            codes(&self.opts.split_by.as_ref().map(|s| concat(s)).transpose()?, n_rows, &[], "")?;
        let (group_order, group_code) = codes(
            &self.opts.group_by.as_ref().map(|g| concat(g)).transpose()?,
            n_rows,
            self.opts.group_order.as_deref().unwrap_or_default(),
            OVERALL,
        )?;
        let mut cells: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for i in 0..n_rows {
            cells.entry((split_code[i], group_code[i])).or_default().push(i);
        }
        let seed = ctx.record_key("", "bootstrap");
        let mut results: Vec<Cell> = Vec::new();
        for x_name in &self.opts.x {
            let x = numbers(&concat(x_name)?, x_name)?;
            for (si, split) in split_order.iter().enumerate() {
                let mut tasks: Vec<(String, &[usize])> = group_order
                    .iter()
                    .enumerate()
                    .filter_map(|(gi, g)| cells.get(&(si, gi)).map(|idx| (g.clone(), idx.as_slice())))
                    .collect();
                let pooled: Vec<usize>;
                if self.opts.group_by.is_some() && self.opts.pooled {
                    pooled = (0..n_rows).filter(|&i| split_code[i] == si).collect();
                    tasks.push((POOLED.to_string(), pooled.as_slice()));
                }
                let computed: Vec<Vec<Cell>> = tasks
                    .par_iter()
                    .map(|(group, idx)| {
                        let (mut xs, mut ys) = (Vec::with_capacity(idx.len()), Vec::with_capacity(idx.len()));
                        for &i in idx.iter() {
                            if let (Some(a), Some(b)) = (x[i], y[i]) {
                                xs.push(a);
                                ys.push(b);
                            }
                        }
                        let invalid = (idx.len() - xs.len()) as u64;
                        self.methods
                            .par_iter()
                            .map(|&m| {
                                let c = correlation::correlate(m, &xs, &ys);
                                let ci = (self.opts.bootstrap > 0)
                                    .then(|| {
                                        let key = blake3::hash(
                                            format!("{seed}/{x_name}/{split}/{group}/{}", m.name()).as_bytes(),
                                        );
                                        let s = u64::from_le_bytes(key.as_bytes()[..8].try_into().expect("8 bytes"));
                                        correlation::bootstrap_ci(m, &xs, &ys, self.opts.bootstrap, self.opts.ci, s)
                                    })
                                    .flatten();
                                Cell {
                                    label: self.label(x_name),
                                    x: x_name.clone(),
                                    split: split.clone(),
                                    group: group.clone(),
                                    method: m,
                                    n: c.n as u64,
                                    statistic: c.statistic,
                                    p_value: c.p_value,
                                    ci,
                                    invalid,
                                }
                            })
                            .collect()
                    })
                    .collect();
                let computed: Vec<Cell> = computed.into_iter().flatten().collect();
                if self.opts.group_by.is_some() && self.opts.average {
                    for &m in &self.methods {
                        let per_group: Vec<&Cell> =
                            computed.iter().filter(|r| r.method == m && r.group != POOLED).collect();
                        let defined: Vec<f64> = per_group.iter().map(|r| r.statistic).filter(|s| !s.is_nan()).collect();
                        results.push(Cell {
                            label: self.label(x_name),
                            x: x_name.clone(),
                            split: split.clone(),
                            group: AVERAGE.to_string(),
                            method: m,
                            n: defined.len() as u64,
                            statistic: if defined.is_empty() {
                                f64::NAN
                            } else {
                                defined.iter().sum::<f64>() / defined.len() as f64
                            },
                            p_value: f64::NAN,
                            ci: None,
                            invalid: (per_group.len() - defined.len()) as u64,
                        });
                    }
                }
                results.extend(computed);
            }
        }
        // Output rows: by x, split, method, then AVG, the groups, pooled.
        let rank = |r: &Cell| match r.group.as_str() {
            AVERAGE => 0usize,
            POOLED => usize::MAX,
            g => 1 + group_order.iter().position(|o| o == g).unwrap_or(0),
        };
        let xi = |r: &Cell| self.opts.x.iter().position(|x| x == &r.x).unwrap_or(0);
        let si = |r: &Cell| split_order.iter().position(|s| s == &r.split).unwrap_or(0);
        let mi = |r: &Cell| self.methods.iter().position(|m| *m == r.method).unwrap_or(0);
        results.sort_by_key(|r| (mi(r), si(r), xi(r), rank(r)));

        let schema = output_schema();
        let id = |r: &Cell| {
            let mut parts = vec![r.x.as_str()];
            if self.opts.split_by.is_some() {
                parts.push(&r.split);
            }
            parts.push(&r.group);
            parts.push(r.method.name());
            parts.join("/")
        };
        let text =
            |f: &dyn Fn(&Cell) -> String| Arc::new(StringArray::from_iter_values(results.iter().map(f))) as ArrayRef;
        let float =
            |f: &dyn Fn(&Cell) -> Option<f64>| Arc::new(Float64Array::from_iter(results.iter().map(f))) as ArrayRef;
        let y_name = self.opts.y.clone();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                text(&id),
                text(&|r| r.label.clone()),
                text(&|r| r.x.clone()),
                text(&|_| y_name.clone()),
                text(&|r| r.split.clone()),
                text(&|r| r.group.clone()),
                text(&|r| r.method.name().to_string()),
                Arc::new(UInt64Array::from_iter_values(results.iter().map(|r| r.n))),
                float(&|r| Some(r.statistic)),
                float(&|r| Some(r.p_value)),
                float(&|r| r.ci.map(|c| c.0)),
                float(&|r| r.ci.map(|c| c.1)),
                Arc::new(UInt64Array::from_iter_values(results.iter().map(|r| r.invalid))),
            ],
        )
        .context("building the correlation table")?;
        let mut out = ctx.create_output(schema)?;
        out.write(&batch)?;

        let summary: Vec<SummaryRow> = results
            .iter()
            .map(|r| {
                let split_suffix = if self.opts.split_by.is_some() { format!("_{}", r.split) } else { String::new() };
                let split_title = if self.opts.split_by.is_some() { format!(" ({})", r.split) } else { String::new() };
                SummaryRow {
                    label: r.label.clone(),
                    table: format!("{}_{}{split_suffix}", self.opts.table, r.method.name()),
                    title: format!("{}: {}{split_title}", self.opts.title, r.method.heading()),
                    group: OVERALL.to_string(),
                    metric: r.group.clone(),
                    heading: self.heading(&r.group),
                    n: r.n,
                    value: r.statistic * self.opts.scale,
                    std: None,
                    invalid: r.invalid,
                }
            })
            .collect();
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&summary)?)?;
        ctx.report.rows_in = n_rows as u64;
        ctx.set_output(out)
    }
}
