//! `report` sink: one evaluation report from the summaries of its inputs (the summary
//! protocol, `store::summary`: every evaluation kind writes `<stage>.summary.parquet`
//! beside its output in the same run). One Markdown table per summary `table` (in
//! first-seen order, headed by its `title`): models × metrics, metric columns in
//! first-seen order with their headings, the `overall` group; a breakdown table per
//! other group when there is one. An SVG radar chart per table named in `charts`
//! (values clamped to 0..1), an SVG line chart per table named in `lines` (its groups
//! are the x axis, e.g. a trainer's steps: a loss curve), and the same numbers as Parquet. The report knows no
//! method or metric: what it shows is what the summaries say (a table's title is the
//! first one its rows carry).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{Float64Array, RecordBatch, StringArray, UInt64Array};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("path", Ty::OutPath, "\"report.md\"", "Markdown report, relative to the output directory"),
    OptionSpec::default(
        "chart",
        Ty::OutPath,
        "\"judge.svg\"",
        "SVG radar chart of the first charted table in report order (a further one is <stem>-<table>.svg)",
    ),
    OptionSpec::default("charts", Ty::StrList, "[\"judge\"]", "summary tables drawn as radar charts"),
    OptionSpec::default(
        "lines",
        Ty::StrList,
        "[\"training\"]",
        "summary tables whose groups are numbers (a trainer's steps) drawn as line charts, <table>.svg, one panel per metric and a line per label; their per-group rows stay out of the Markdown (they are in the Parquet)",
    ),
    OptionSpec::default(
        "table",
        Ty::OutPath,
        "\"report.parquet\"",
        "the numbers as Parquet (label, table, group, metric, n, value)",
    ),
    OptionSpec::default("title", Ty::Str, "\"Evaluation report\"", "first heading"),
    OptionSpec::default("decimals", Ty::Int(0, 12), "4", "digits after the decimal point in the Markdown tables"),
    OptionSpec::default(
        "chart_max",
        Ty::Float(1e-9, 1e12),
        "1.0",
        "the value at a radar chart's rim (e.g. 100 for percentages)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "report",
    // 2: driven by the summary protocol (any table; report.parquet gains group and n).
    // 3: a label with no overall value gets no row in the overall table (a matrix-like table
    // shows only its breakdown).
    // 4: line charts (`lines`, default the `training` table of a train stage).
    version: 4,
    about: "evaluation report from the inputs' summaries: one Markdown table per summary table, SVG radar charts, Parquet",
    role: Role::Sink,
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "inputs = [\"scored\"]\n\n[stages.scored]\nkind = \"metrics\"\ninputs = [\"in0\"]",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: String,
    chart: String,
    charts: Vec<String>,
    lines: Vec<String>,
    table: String,
    title: String,
    decimals: usize,
    chart_max: f64,
}

struct Report {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Report { opts: ctx.parse(diags)? }))
}

/// One report table: its title, metric columns (id, heading) and label → group → metric → value.
#[derive(Default)]
struct Table {
    title: String,
    metrics: Vec<(String, String)>,
    labels: Vec<String>,
    values: BTreeMap<(String, String, String), (f64, u64)>,
    groups: Vec<String>,
}

/// A radar chart (one axis per metric, 0..1) with one polygon per label.
fn radar_svg(axes: &[(String, String)], labels: &[String], value: impl Fn(&str, &str) -> Option<f64>) -> String {
    const W: f64 = 640.0;
    const R: f64 = 200.0;
    let (cx, cy) = (W / 2.0, 280.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    let n = axes.len().max(1);
    let point = |k: usize, v: f64| {
        let a = -std::f64::consts::FRAC_PI_2 + 2.0 * std::f64::consts::PI * k as f64 / n as f64;
        (cx + R * v * a.cos(), cy + R * v * a.sin())
    };
    let height = 560.0 + 22.0 * labels.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for ring in [0.25, 0.5, 0.75, 1.0] {
        let pts: Vec<String> = (0..n).map(|k| point(k, ring)).map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(s, "<polygon points=\"{}\" fill=\"none\" stroke=\"#ccc\"/>", pts.join(" "));
    }
    for (k, (_, heading)) in axes.iter().enumerate() {
        let (x, y) = point(k, 1.0);
        let (lx, ly) = point(k, 1.12);
        let _ = writeln!(s, "<line x1=\"{cx}\" y1=\"{cy}\" x2=\"{x:.1}\" y2=\"{y:.1}\" stroke=\"#ccc\"/>");
        let _ = writeln!(s, "<text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"middle\">{}</text>", xml_escape(heading));
    }
    for (i, label) in labels.iter().enumerate() {
        let color = colors[i % colors.len()];
        let pts: Vec<String> = axes
            .iter()
            .enumerate()
            .map(|(k, (m, _))| point(k, value(label, m).filter(|v| !v.is_nan()).unwrap_or(0.0).clamp(0.0, 1.0)))
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

/// Line charts, one panel per metric with points (its own y range), one line per label over x.
fn line_svg(metrics: &[(String, String)], labels: &[String], points: impl Fn(&str, &str) -> Vec<(f64, f64)>) -> String {
    let metrics: Vec<(String, String)> =
        metrics.iter().filter(|(m, _)| labels.iter().any(|l| !points(l, m).is_empty())).cloned().collect();
    const W: f64 = 640.0;
    const PANEL: f64 = 220.0;
    let (left, right, top) = (70.0, 20.0, 40.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    let height = top + PANEL * metrics.len().max(1) as f64 + 22.0 * labels.len() as f64 + 20.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (k, (metric, heading)) in metrics.iter().enumerate() {
        let y0 = top + PANEL * k as f64;
        let metric = metric.as_str();
        let (plot_top, plot_bottom) = (y0 + 20.0, y0 + PANEL - 40.0);
        let series: Vec<Vec<(f64, f64)>> = labels.iter().map(|l| points(l, metric)).collect();
        let all = series.iter().flatten().filter(|(x, y)| x.is_finite() && y.is_finite());
        let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) =
            (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for (x, y) in all {
            (x_lo, x_hi, y_lo, y_hi) = (x_lo.min(*x), x_hi.max(*x), y_lo.min(*y), y_hi.max(*y));
        }
        let _ = writeln!(
            s,
            "<text x=\"{left}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
            y0 + 12.0,
            xml_escape(heading)
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{plot_top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#ccc\"/>",
            W - left - right,
            plot_bottom - plot_top
        );
        if !x_lo.is_finite() {
            continue;
        }
        if x_hi == x_lo {
            x_hi = x_lo + 1.0;
        }
        if y_hi == y_lo {
            (y_lo, y_hi) = (y_lo - 0.5, y_hi + 0.5);
        }
        let px = |x: f64| left + (x - x_lo) / (x_hi - x_lo) * (W - left - right);
        let py = |y: f64| plot_bottom - (y - y_lo) / (y_hi - y_lo) * (plot_bottom - plot_top);
        for (v, y) in [(y_hi, plot_top), (y_lo, plot_bottom)] {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                left - 6.0,
                y + 4.0,
                short(v)
            );
        }
        for (v, anchor) in [(x_lo, "start"), (x_hi, "end")] {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
                px(v),
                plot_bottom + 16.0,
                short(v)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">step</text>",
            (left + W - right) / 2.0,
            plot_bottom + 16.0
        );
        for (i, pts) in series.iter().enumerate() {
            let pts: Vec<String> = pts
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let c = colors[i % colors.len()];
            let _ =
                writeln!(s, "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>", pts.join(" "));
            if pts.len() == 1 {
                let (x, y) = pts[0].split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(s, "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{c}\"/>");
            }
        }
    }
    let legend_top = top + PANEL * metrics.len().max(1) as f64;
    for (i, label) in labels.iter().enumerate() {
        let y = legend_top + 22.0 * i as f64;
        let c = colors[i % colors.len()];
        let _ = writeln!(s, "<rect x=\"{left}\" y=\"{:.1}\" width=\"14\" height=\"4\" fill=\"{c}\"/>", y - 4.0);
        let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{y:.1}\">{}</text>", left + 20.0, xml_escape(label));
    }
    s.push_str("</svg>\n");
    s
}

/// A chart tick: at most four significant digits.
fn short(v: f64) -> String {
    let t = format!("{v:.4}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    if t.is_empty() || t == "-" { "0".into() } else { t.to_string() }
}

fn xml_escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn table_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("table", DataType::Utf8, false),
        Field::new("group", DataType::Utf8, false),
        Field::new("metric", DataType::Utf8, false),
        Field::new("n", DataType::UInt64, false),
        Field::new("value", DataType::Float64, false),
    ]))
}

/// Group summary rows into tables, refusing one number from two inputs.
fn tables(inputs: &[(String, Vec<SummaryRow>)]) -> Result<Vec<(String, Table)>> {
    let mut out: Vec<(String, Table)> = Vec::new();
    // Which input gave each (table, label, group, metric): inputs with the same label merge
    // into one row (e.g. BERTScore in its own metrics stage), but one number from two
    // inputs would silently keep the last.
    let mut origin: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
    for (input, rows) in inputs {
        for r in rows {
            let key = (r.table.clone(), r.label.clone(), r.group.clone(), r.metric.clone());
            match origin.insert(key, input.clone()) {
                Some(other) if &other != input => bail!(
                    "inputs \"{other}\" and \"{input}\" both report {} for the model labelled \"{}\": give each candidate its own `label`",
                    r.metric,
                    r.label
                ),
                _ => {}
            }
            let i = match out.iter().position(|(t, _)| t == &r.table) {
                Some(i) => i,
                None => {
                    out.push((r.table.clone(), Table { title: r.title.clone(), ..Default::default() }));
                    out.len() - 1
                }
            };
            let t = &mut out[i].1;
            if !t.metrics.iter().any(|(m, _)| m == &r.metric) {
                t.metrics.push((r.metric.clone(), r.heading.clone()));
            }
            if !t.labels.contains(&r.label) {
                t.labels.push(r.label.clone());
            }
            if r.group != OVERALL && !t.groups.contains(&r.group) {
                t.groups.push(r.group.clone());
            }
            t.values.insert((r.label.clone(), r.group.clone(), r.metric.clone()), (r.value, r.n));
        }
    }
    Ok(out)
}

#[async_trait]
impl Stage for Report {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let bad: Vec<(String, &str)> =
            ctx.inputs.iter().filter_map(|i| i.kind.filter(|k| !k.summary).map(|k| (i.name.clone(), k.name))).collect();
        for (name, kind) in bad {
            ctx.error(
                "inputs",
                format!("input \"{name}\" ({kind}) writes no summary: report reads evaluation stages (metrics, judge_score, ...)"),
            );
        }
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let mut inputs = Vec::new();
        for input in &ctx.inputs {
            let path = ctx.out_dir.join(summary::file_name(&input.name));
            if !path.exists() {
                bail!(
                    "input \"{}\" has no summary ({} is missing): report reads evaluation stages (metrics, judge_score, ...)",
                    input.name,
                    path.display()
                );
            }
            inputs.push((input.name.clone(), summary::read(&path)?));
        }
        let tables = tables(&inputs)?;

        let mut md = String::new();
        writeln!(md, "# {}\n", self.opts.title)?;
        let mut rows: Vec<(String, String, String, String, u64, f64)> = Vec::new();
        let decimals = self.opts.decimals;
        // A value with no data behind it (NaN over n = 0) shows as missing, like an absent one.
        let cell = |v: Option<&(f64, u64)>| match v {
            Some((v, n)) if !(v.is_nan() && *n == 0) => format!("{v:.decimals$}"),
            _ => "–".into(),
        };
        let mut charts = 0;
        for (name, t) in &tables {
            writeln!(md, "## {}\n", t.title)?;
            // The overall table: a row per label with an overall value (a table whose rows
            // are all breakdown groups, e.g. a matrix, shows only its breakdown).
            let overall: Vec<(&String, Vec<String>)> = t
                .labels
                .iter()
                .map(|label| {
                    let cells = t
                        .metrics
                        .iter()
                        .map(|(m, _)| cell(t.values.get(&(label.clone(), OVERALL.to_string(), m.clone()))));
                    (label, cells.collect::<Vec<_>>())
                })
                .filter(|(_, cells)| cells.iter().any(|c| c != "–"))
                .collect();
            if !overall.is_empty() || t.groups.is_empty() {
                // A line chart's table: only the metrics with an overall value (the curve's
                // metrics are in the chart).
                let is_line = self.opts.lines.iter().any(|l| l == name);
                let shown: Vec<usize> = (0..t.metrics.len())
                    .filter(|&k| !is_line || overall.iter().any(|(_, cells)| cells[k] != "–"))
                    .collect();
                writeln!(
                    md,
                    "| Model | {} |",
                    shown.iter().map(|&k| t.metrics[k].1.as_str()).collect::<Vec<_>>().join(" | ")
                )?;
                writeln!(md, "|---|{}", "---:|".repeat(shown.len()))?;
                for (label, cells) in &overall {
                    let cells: Vec<&str> = shown.iter().map(|&k| cells[k].as_str()).collect();
                    writeln!(md, "| {label} | {} |", cells.join(" | "))?;
                }
                writeln!(md)?;
            }
            let is_line = self.opts.lines.iter().any(|l| l == name);
            if is_line && !t.groups.is_empty() {
                let file = format!("{name}.svg");
                writeln!(md, "![{}]({file})\n", t.title)?;
                let svg = line_svg(&t.metrics, &t.labels, |label, m| {
                    t.groups
                        .iter()
                        .filter_map(|g| {
                            let x = g.parse::<f64>().ok()?;
                            t.values.get(&(label.to_string(), g.clone(), m.to_string())).map(|v| (x, v.0))
                        })
                        .collect()
                });
                let (mut f, pending) = create_tmp(&ctx.out_dir.join(&file))?;
                std::io::Write::write_all(&mut f, svg.as_bytes())?;
                finish_file(f, &pending)?;
                ctx.add_artifact(pending, None);
            }
            if !t.groups.is_empty() && !is_line {
                writeln!(md, "### {} by group\n", t.title)?;
                writeln!(
                    md,
                    "| Model | Group | {} |",
                    t.metrics.iter().map(|(_, h)| h.as_str()).collect::<Vec<_>>().join(" | ")
                )?;
                writeln!(md, "|---|---|{}", "---:|".repeat(t.metrics.len()))?;
                for label in &t.labels {
                    for g in &t.groups {
                        let cells: Vec<String> = t
                            .metrics
                            .iter()
                            .map(|(m, _)| cell(t.values.get(&(label.clone(), g.clone(), m.clone()))))
                            .collect();
                        if cells.iter().all(|c| c == "–") {
                            continue;
                        }
                        writeln!(md, "| {label} | {g} | {} |", cells.join(" | "))?;
                    }
                }
                writeln!(md)?;
            }
            for ((label, group, metric), (value, n)) in &t.values {
                rows.push((label.clone(), name.clone(), group.clone(), metric.clone(), *n, *value));
            }
            if self.opts.charts.iter().any(|c| c == name) {
                let file = if charts == 0 {
                    self.opts.chart.clone()
                } else {
                    let p = std::path::Path::new(&self.opts.chart);
                    let stem = p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
                    p.with_file_name(format!("{stem}-{name}.svg")).to_string_lossy().to_string()
                };
                charts += 1;
                writeln!(md, "![{} per model]({file})\n", t.title)?;
                let svg = radar_svg(&t.metrics, &t.labels, |label, m| {
                    t.values
                        .get(&(label.to_string(), OVERALL.to_string(), m.to_string()))
                        .map(|v| v.0 / self.opts.chart_max)
                });
                let (mut f, pending) = create_tmp(&ctx.out_dir.join(&file))?;
                std::io::Write::write_all(&mut f, svg.as_bytes())?;
                finish_file(f, &pending)?;
                ctx.add_artifact(pending, None);
            }
        }
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(&self.opts.path))?;
        std::io::Write::write_all(&mut f, md.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);

        let batch = RecordBatch::try_new(
            table_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0.as_str()))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1.as_str()))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2.as_str()))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3.as_str()))),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.4))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.5))),
            ],
        )?;
        let n = ctx.write_side_parquet(&self.opts.table.clone(), &batch)?;
        ctx.report.rows_in = tables.iter().map(|(_, t)| t.labels.len() as u64).sum();
        ctx.report.rows_out = n;
        Ok(())
    }
}
