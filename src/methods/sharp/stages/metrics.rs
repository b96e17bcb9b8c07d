//! `sharp_metrics`: factual-based labels and the paper's metrics per (script, role) —
//! counts, SR, AR, ER, the conservative ratio and CRF ([`crate::methods::sharp::metrics`])
//! — as its output, and as a summary (`report` reads it): one table, the model level
//! (mean over scripts of the mean over roles, [R]) as the overall group and each
//! `script/role` cell as a group, in percent; with `gold_column`, the stance detector's
//! accuracy and macro-F1 against human labels (Table 3) as a second table. A record with no stance or an unknown
//! label is counted as `invalid`, never silently dropped.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::methods::sharp::metrics::{Affection, Cell, Rates, Stance, macro_average};
use crate::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};
use crate::store::failures::FailureKind;
use crate::store::summary::{self, OVERALL, SummaryRow};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("label", Ty::Str, "the model's name in the report (default: the input stage's name)"),
    OptionSpec::default("stance_column", Ty::Str, "\"stance\"", "column of the detected stance"),
    OptionSpec::optional(
        "gold_column",
        Ty::Str,
        "column of human stance labels (FAVOR / AGAINST / NEUTRAL; null where unlabelled): adds the detector's accuracy and macro-F1 (Table 3)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_metrics",
    version: 1,
    about: "SHARP's factual-based metrics per (script, role) and per model: SR, AR, ER, conservative ratio, CRF (a summary for `report`)",
    role: Role::Transform,
    arity: Arity::Exactly(1),
    options: OPTIONS,
    uses_seed: false,
    summary: true,
    example: "label = \"rpa\"",
    build,
};

#[derive(Deserialize)]
struct Options {
    label: Option<String>,
    stance_column: String,
    gold_column: Option<String>,
}

struct MetricsStage {
    o: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(MetricsStage { o: ctx.parse(diags)? }))
}

pub fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let u = |n: &str| Field::new(n, DataType::UInt64, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    data::schema_with_id([
        s("script"),
        s("role"),
        s("affection"),
        u("n_f"),
        u("n_cf"),
        u("n_syc"),
        u("n_adv"),
        u("n_neutral"),
        u("n_strict"),
        u("invalid"),
        f("sr"),
        f("ar"),
        f("er"),
        f("csvt"),
        f("crf"),
    ])
}

const METRICS: [(&str, &str); 5] = [("sr", "SR"), ("ar", "AR"), ("er", "ER"), ("csvt", "Csvt"), ("crf", "CRF")];

fn values(r: &Rates) -> [Option<f64>; 5] {
    [r.sr, r.ar, r.er, r.csvt, r.crf]
}

#[async_trait]
impl Stage for MetricsStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let col = self.o.stance_column.clone();
        ctx.require_columns("inputs", 0, ["script", "role", "affection", "label", col.as_str()]);
        if let Some(g) = self.o.gold_column.clone() {
            ctx.require_columns("gold_column", 0, [g.as_str()]);
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (_, batches) = crate::store::parquet::read_all(&ctx.inputs[0].path)?;
        let text = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        // (script, role) -> (affection, cell, invalid)
        let mut cells: BTreeMap<(String, String), (String, Cell, u64)> = BTreeMap::new();
        let mut n_in = 0u64;
        let mut gold_pairs = Vec::new();
        for b in &batches {
            for i in 0..b.num_rows() {
                n_in += 1;
                let r = data::row_json(b, i);
                let key = (text(&r, "script"), text(&r, "role"));
                let entry = cells.entry(key).or_insert_with(|| (text(&r, "affection"), Cell::default(), 0));
                let stance = Stance::parse(&text(&r, &self.o.stance_column));
                if let (Some(g), Some(s)) = (self.o.gold_column.as_ref().and_then(|g| Stance::parse(&text(&r, g))), stance) {
                    gold_pairs.push((g, s));
                }
                let factual = match text(&r, "label").as_str() {
                    "factual" => Some(true),
                    "counterfactual" => Some(false),
                    _ => None,
                };
                match (stance, factual) {
                    (Some(s), Some(f)) => entry.1.add(f, s),
                    _ => entry.2 += 1,
                }
            }
        }
        let mut rows = Vec::new();
        let mut rated = Vec::new();
        let mut invalid_total = 0;
        for ((script, role), (aff, cell, invalid)) in &cells {
            let Some(affection) = Affection::parse(aff) else {
                ctx.fail(&format!("{script}/{role}"), FailureKind::Input, format!("unknown affection class \"{aff}\" (one of high, low, neutral)"), None);
                continue;
            };
            invalid_total += invalid;
            let rates = cell.rates(affection);
            rated.push((script.clone(), role.clone(), cell.n_f + cell.n_cf, *invalid, rates));
            let mut row = Row::from_iter([
                (data::ID.to_string(), json!(format!("{script}/{role}"))),
                ("script".into(), json!(script)),
                ("role".into(), json!(role)),
                ("affection".into(), json!(aff)),
            ]);
            for (k, v) in [
                ("n_f", cell.n_f),
                ("n_cf", cell.n_cf),
                ("n_syc", cell.n_syc),
                ("n_adv", cell.n_adv),
                ("n_neutral", cell.n_neutral),
                ("n_strict", cell.n_strict),
                ("invalid", *invalid),
            ] {
                row.insert(k.into(), json!(v));
            }
            for ((k, _), v) in METRICS.iter().zip(values(&rates)) {
                row.insert(k.to_string(), v.map(|x| json!(x)).unwrap_or(Value::Null));
            }
            rows.push(row);
        }
        ctx.report.rows_in = n_in;
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;

        let label = self.o.label.clone().unwrap_or_else(|| ctx.inputs[0].name.clone());
        let model = macro_average(&rated.iter().map(|(s, _, _, _, r)| (s.clone(), *r)).collect::<Vec<_>>());
        let n_total: u64 = rated.iter().map(|x| x.2).sum();
        let mut summary_rows = Vec::new();
        let mut push = |group: String, n: u64, invalid: u64, rates: &Rates| {
            for ((metric, heading), v) in METRICS.iter().zip(values(rates)) {
                if let Some(v) = v {
                    summary_rows.push(SummaryRow {
                        label: label.clone(),
                        table: "sharp".into(),
                        title: "Relationship fidelity (factual-based mode, %; model = mean over scripts of the mean over roles)".into(),
                        group: group.clone(),
                        metric: metric.to_string(),
                        heading: heading.to_string(),
                        n,
                        value: v * 100.0,
                        std: None,
                        invalid,
                    });
                }
            }
        };
        push(OVERALL.into(), n_total, invalid_total, &model);
        for (script, role, n, invalid, rates) in &rated {
            push(format!("{script}/{role}"), *n, *invalid, rates);
        }
        if let Some((acc, f1)) = crate::methods::sharp::metrics::reliability(&gold_pairs) {
            for (metric, heading, v) in [("accuracy", "Accuracy", acc), ("macro_f1", "Macro-F1", f1)] {
                summary_rows.push(SummaryRow {
                    label: label.clone(),
                    table: "sharp_detector".into(),
                    title: "Stance detector against human labels (%)".into(),
                    group: OVERALL.into(),
                    metric: metric.into(),
                    heading: heading.into(),
                    n: gold_pairs.len() as u64,
                    value: v * 100.0,
                    std: None,
                    invalid: 0,
                });
            }
        }
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&summary_rows)?)?;
        ctx.set_output(out)
    }
}
