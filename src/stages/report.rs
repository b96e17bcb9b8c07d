//! `report` sink: one evaluation report from the summaries of `metrics` stages
//! (Table 3 layout: models × BLEU, ROUGE-1/2/L/Lsum, METEOR) and `rolemrc_judge_score`
//! stages (Table 9 layout: models × the 5 judge dimensions): a Markdown file, an SVG
//! radar chart of the judge dimensions per model (as Figure 4), and the same numbers as
//! Parquet. Each input's summary is the `<input>.summary.parquet` it wrote beside its
//! output in the same run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{AsArray, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;

use super::rolemrc_judge_plan::DIMENSIONS;
use super::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};
use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::store::atomic::{create_tmp, finish_file};
use crate::store::parquet::read_all;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("path", Ty::OutPath, "\"report.md\"", "Markdown report, relative to the output directory"),
    OptionSpec::default("chart", Ty::OutPath, "\"judge.svg\"", "SVG radar chart of the judge dimensions"),
    OptionSpec::default(
        "table",
        Ty::OutPath,
        "\"report.parquet\"",
        "the numbers as Parquet (label, table, metric, value)",
    ),
    OptionSpec::default("title", Ty::Str, "\"Evaluation report\"", "first heading"),
];

pub static KIND: KindInfo = KindInfo {
    name: "report",
    version: 1,
    about: "evaluation report: Table 3 (reference metrics) and Table 9 (judge) layouts, SVG radar chart, Parquet",
    role: Role::Sink,
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    uses_seed: false,
    build,
};

#[derive(Deserialize)]
struct Options {
    path: String,
    chart: String,
    table: String,
    title: String,
}

struct Report {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Report { opts: ctx.parse(diags)? }))
}

use crate::eval::score::OVERALL;

/// Table 3 columns: (summary metric, heading).
const METRIC_COLUMNS: &[(&str, &str)] = &[
    ("bleu", "BLEU"),
    ("rouge1", "ROUGE-1"),
    ("rouge2", "ROUGE-2"),
    ("rougeL", "ROUGE-L"),
    ("rougeLsum", "ROUGE-Lsum"),
    ("meteor", "METEOR"),
    ("bertscore_f1", "BERTScore F1"),
];

fn dimension_heading(d: &str) -> &str {
    match d {
        "knowledge_range" => "Knowledge Range",
        "style_compliance" => "Style Compliance",
        "nested_instruction" => "Nested Instruction",
        "multi_turn_instruction" => "Multi-turn Instruction",
        "instruction_priority" => "Instruction Priority",
        other => other,
    }
}

/// label → metric → value, in first-seen label order.
type Table = Vec<(String, BTreeMap<String, f64>)>;

fn entry<'t>(t: &'t mut Table, label: &str) -> &'t mut BTreeMap<String, f64> {
    if let Some(i) = t.iter().position(|(l, _)| l == label) {
        return &mut t[i].1;
    }
    t.push((label.to_string(), BTreeMap::new()));
    &mut t.last_mut().expect("just pushed").1
}

/// A radar chart (one axis per dimension, 0..1) with one polygon per model.
pub fn radar_svg(models: &Table) -> String {
    const W: f64 = 640.0;
    const R: f64 = 200.0;
    let (cx, cy) = (W / 2.0, 280.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    let n = DIMENSIONS.len();
    let point = |k: usize, v: f64| {
        let a = -std::f64::consts::FRAC_PI_2 + 2.0 * std::f64::consts::PI * k as f64 / n as f64;
        (cx + R * v * a.cos(), cy + R * v * a.sin())
    };
    let height = 560.0 + 22.0 * models.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for ring in [0.25, 0.5, 0.75, 1.0] {
        let pts: Vec<String> = (0..n).map(|k| point(k, ring)).map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(s, "<polygon points=\"{}\" fill=\"none\" stroke=\"#ccc\"/>", pts.join(" "));
    }
    for (k, d) in DIMENSIONS.iter().enumerate() {
        let (x, y) = point(k, 1.0);
        let (lx, ly) = point(k, 1.12);
        let _ = writeln!(s, "<line x1=\"{cx}\" y1=\"{cy}\" x2=\"{x:.1}\" y2=\"{y:.1}\" stroke=\"#ccc\"/>");
        let _ = writeln!(s, "<text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"middle\">{}</text>", dimension_heading(d));
    }
    for (i, (label, values)) in models.iter().enumerate() {
        let color = colors[i % colors.len()];
        let pts: Vec<String> = DIMENSIONS
            .iter()
            .enumerate()
            .map(|(k, d)| point(k, values.get(*d).copied().unwrap_or(0.0).clamp(0.0, 1.0)))
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "<polygon points=\"{}\" fill=\"{color}\" fill-opacity=\"0.15\" stroke=\"{color}\" stroke-width=\"2\"/>",
            pts.join(" ")
        );
        let ly = 540.0 + 22.0 * i as f64;
        let _ = writeln!(s, "<rect x=\"40\" y=\"{:.1}\" width=\"14\" height=\"14\" fill=\"{color}\"/>", ly - 11.0);
        let _ = writeln!(s, "<text x=\"62\" y=\"{ly:.1}\">{}</text>", xml_escape(label));
    }
    s.push_str("</svg>\n");
    s
}

fn xml_escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn table_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("table", DataType::Utf8, false),
        Field::new("metric", DataType::Utf8, false),
        Field::new("value", DataType::Float64, false),
    ]))
}

#[async_trait]
impl Stage for Report {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        for i in 0..ctx.inputs.len() {
            if let Some(s) = ctx.input_schema(i)
                && s.field_with_name("dimension").is_err()
                && !METRIC_COLUMNS.iter().any(|(c, _)| s.field_with_name(c).is_ok())
            {
                let name = ctx.inputs[i].name.clone();
                ctx.error("inputs", format!("input \"{name}\" is neither a metrics nor a rolemrc_judge_score stage"));
            }
        }
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (mut metrics, mut judge): (Table, Table) = (Vec::new(), Vec::new());
        // Which input gave each (table, label, metric): inputs with the same label merge
        // into one row (e.g. BERTScore in its own metrics stage), but one number from two
        // inputs would silently keep the last.
        let mut origin: BTreeMap<(bool, String, String), String> = BTreeMap::new();
        let mut claim = |judge: bool, label: &str, metric: &str, input: &str| -> Result<()> {
            match origin.insert((judge, label.to_string(), metric.to_string()), input.to_string()) {
                Some(other) if other != input => bail!(
                    "inputs \"{other}\" and \"{input}\" both report {metric} for the model labelled \"{label}\": give each candidate its own `label`"
                ),
                _ => Ok(()),
            }
        };
        for input in &ctx.inputs {
            let path = ctx.out_dir.join(format!("{}.summary.parquet", input.name));
            if !path.exists() {
                bail!("input \"{}\" has no summary ({} is missing)", input.name, path.display());
            }
            let (schema, batches) = read_all(&path).with_context(|| format!("reading {}", path.display()))?;
            let judge_summary = schema.field_with_name("dimension").is_ok();
            for b in &batches {
                let s = |n: &str| b.column_by_name(n).expect("summary column").as_string::<i32>().clone();
                let label = s("label");
                if judge_summary {
                    let (dim, acc) = (
                        s("dimension"),
                        b.column_by_name("accuracy").expect("accuracy").as_primitive::<Float64Type>().clone(),
                    );
                    for i in 0..b.num_rows() {
                        claim(true, label.value(i), dim.value(i), &input.name)?;
                        entry(&mut judge, label.value(i)).insert(dim.value(i).to_string(), acc.value(i));
                    }
                } else {
                    let (group, metric) = (s("group"), s("metric"));
                    let mean = b.column_by_name("mean").expect("mean").as_primitive::<Float64Type>().clone();
                    for i in 0..b.num_rows() {
                        if group.value(i) == OVERALL {
                            claim(false, label.value(i), metric.value(i), &input.name)?;
                            entry(&mut metrics, label.value(i)).insert(metric.value(i).to_string(), mean.value(i));
                        }
                    }
                }
            }
        }

        let mut md = String::new();
        writeln!(md, "# {}\n", self.opts.title)?;
        let mut rows: Vec<(String, &str, String, f64)> = Vec::new();
        if !metrics.is_empty() {
            let cols: Vec<&(&str, &str)> =
                METRIC_COLUMNS.iter().filter(|(c, _)| metrics.iter().any(|(_, m)| m.contains_key(*c))).collect();
            writeln!(md, "## Reference-based metrics (Table 3 layout; means over the test set)\n")?;
            writeln!(md, "| Model | {} |", cols.iter().map(|(_, h)| *h).collect::<Vec<_>>().join(" | "))?;
            writeln!(md, "|---|{}", "---:|".repeat(cols.len()))?;
            for (label, m) in &metrics {
                let cells: Vec<String> = cols
                    .iter()
                    .map(|(c, _)| m.get(*c).map(|v| format!("{v:.4}")).unwrap_or_else(|| "–".into()))
                    .collect();
                writeln!(md, "| {label} | {} |", cells.join(" | "))?;
                rows.extend(m.iter().map(|(k, v)| (label.clone(), "metrics", k.clone(), *v)));
            }
            writeln!(md)?;
        }
        if !judge.is_empty() {
            writeln!(md, "## LLM-as-judge (Table 9 layout; accuracy per dimension)\n")?;
            writeln!(
                md,
                "| Model | {} |",
                DIMENSIONS.iter().map(|d| dimension_heading(d)).collect::<Vec<_>>().join(" | ")
            )?;
            writeln!(md, "|---|{}", "---:|".repeat(DIMENSIONS.len()))?;
            for (label, m) in &judge {
                let cells: Vec<String> = DIMENSIONS
                    .iter()
                    .map(|d| m.get(*d).map(|v| format!("{v:.4}")).unwrap_or_else(|| "–".into()))
                    .collect();
                writeln!(md, "| {label} | {} |", cells.join(" | "))?;
                rows.extend(m.iter().map(|(k, v)| (label.clone(), "judge", k.clone(), *v)));
            }
            writeln!(md, "\n![judge dimensions per model]({})\n", self.opts.chart)?;
            let svg = radar_svg(&judge);
            let (mut f, pending) = create_tmp(&ctx.out_dir.join(&self.opts.chart))?;
            std::io::Write::write_all(&mut f, svg.as_bytes())?;
            finish_file(f, &pending)?;
            ctx.add_artifact(pending, None);
        }
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(&self.opts.path))?;
        std::io::Write::write_all(&mut f, md.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);

        let batch = RecordBatch::try_new(
            table_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0.as_str()))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2.as_str()))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )?;
        let n = ctx.write_side_parquet(&self.opts.table.clone(), &batch)?;
        ctx.report.rows_in = (metrics.len() + judge.len()) as u64;
        ctx.report.rows_out = n;
        Ok(())
    }
}
