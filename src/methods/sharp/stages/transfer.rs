//! `sharp_transfer`: the stance-transfer ratio differences of the paper's Table 5 (spec
//! §3.4), pooled over every script and model of the input per language (the paper:
//! "aggregating the role stance shifts across all scripts in the models"; `exclude_scripts`
//! / `exclude_models` leave some out, as Table 5 left out 天龙八部 and Pygmalion).
//!
//! For each affection group (high, low):
//! - factual mode: among answers to factual claims the share AGAINST / NEUTRAL, to
//!   counterfactual ones the share FAVOR / NEUTRAL;
//! - snowballing mode (with `backbone_column`: the unaligned backbone's stance on the same
//!   turn): for each backbone stance b and another agent stance s, #(b→s) / #(backbone
//!   stance b) ([R] row-normalised).
//!
//! The reported difference is `high − low` for sycophancy cells and `low − high` for
//! adversary cells: positive = consistent with the paper's hypothesis. Output: one row per
//! (label, mode, from, to) with both ratios and counts; summary tables
//! `sharp_transfer_snowballing` (backbone stance rows × agent stance columns) and
//! `sharp_transfer_factual` (claim type rows × stance columns), in percent. Records without
//! a readable stance (or, snowballing, without the backbone's) are counted, not used.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::metrics::{Affection, Stance, claim_difference, claim_ratio, transfer_difference, transfer_ratio};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::summary::{self, SummaryRow};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("stance_column", Ty::Str, "\"stance\"", "the agent's stance"),
    OptionSpec::optional(
        "backbone_column",
        Ty::Str,
        "the backbone's stance on the same turn: adds the snowballing half",
    ),
    OptionSpec::default(
        "lang_column",
        Ty::Str,
        "\"lang\"",
        "the language column, where present: one table row set per language",
    ),
    OptionSpec::optional(
        "model_column",
        Ty::Str,
        "a column naming each record's model (for exclude_models, and per_model)",
    ),
    OptionSpec::default("per_model", Ty::Bool, "false", "one row set per model instead of pooling models"),
    OptionSpec::default("exclude_scripts", Ty::StrList, "[]", "scripts left out (Table 5 left out 天龙八部)"),
    OptionSpec::default(
        "exclude_models",
        Ty::StrList,
        "[]",
        "models left out (Table 5 left out Pygmalion; needs model_column)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_transfer",
    about: "Table 5: stance-transfer ratio differences between high- and low-affection roles (factual mode; snowballing mode with the backbone's stances), a summary for `report`",
    options: OPTIONS,
    summary: true,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    stance_column: String,
    backbone_column: Option<String>,
    lang_column: String,
    model_column: Option<String>,
    per_model: bool,
    exclude_scripts: Vec<String>,
    exclude_models: Vec<String>,
}

struct TransferStage {
    o: Options,
    choices: Map<String, Value>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    if (o.per_model || !o.exclude_models.is_empty()) && o.model_column.is_none() {
        ctx.error(diags, "model_column", "per_model and exclude_models need model_column");
        return None;
    }
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    Some(Box::new(TransferStage { o, choices }))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let u = |n: &str| Field::new(n, DataType::UInt64, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    data::schema_with_id([
        s("label"),
        s("mode"),
        s("from"),
        s("to"),
        f("ratio_high"),
        f("ratio_low"),
        f("difference"),
        u("n_high"),
        u("n_low"),
    ])
}

/// One label's answers per affection group.
#[derive(Default)]
struct Group {
    /// (factual claim, agent stance) per affection group (0 high, 1 low).
    claims: [Vec<(bool, Stance)>; 2],
    /// (backbone stance, agent stance) per affection group.
    pairs: [Vec<(Stance, Stance)>; 2],
    unparsed: u64,
    unpaired: u64,
    neutral_roles: u64,
}

const STANCES: [Stance; 3] = [Stance::Favor, Stance::Against, Stance::Neutral];

fn title_case(s: Stance) -> &'static str {
    match s {
        Stance::Favor => "Favor",
        Stance::Against => "Against",
        Stance::Neutral => "Neutral",
    }
}

/// One cell of Table 5: label, mode, from, to, the difference, pairs counted, records not used.
type TransferCell = (String, String, String, Stance, Option<f64>, u64, u64);

/// The summary: per label and mode, an overall row (the mean difference of the cells of
/// each agent stance column: how consistent transfers into that stance are on average),
/// then a group per row of Table 5, columns in the paper's order (Favor, Against, Neutral).
fn summary_rows(cells: &[TransferCell]) -> Vec<SummaryRow> {
    let mut out = Vec::new();
    let mut labels: Vec<&String> = cells.iter().map(|c| &c.0).collect();
    labels.dedup();
    for label in labels {
        for (mode, table, title, rows) in [
            (
                "snowballing",
                "sharp_transfer_snowballing",
                "Stance-transfer ratio difference, snowballing mode (Table 5 layout, %): backbone stance (rows) → agent stance (columns); sycophancy high − low, adversary low − high [R denominators]; overall = the column's mean",
                &["Favor", "Against", "Neutral"][..],
            ),
            (
                "factual",
                "sharp_transfer_factual",
                "Stance-transfer ratio difference, factual mode (Table 5 layout, %): claim (rows) → agent stance (columns); sycophancy high − low, adversary low − high; overall = the column's mean",
                &["Factual", "Counter-Factual"][..],
            ),
        ] {
            let mine: Vec<_> = cells.iter().filter(|c| &c.0 == label && c.1 == mode && c.4.is_some()).collect();
            let invalid = mine.first().map_or(0, |c| c.6);
            let mut push = |group: &str, to: Stance, n: u64, v: f64| {
                out.push(SummaryRow {
                    label: label.clone(),
                    table: table.into(),
                    title: title.into(),
                    group: group.into(),
                    metric: to.name().to_lowercase(),
                    heading: title_case(to).into(),
                    n,
                    value: v * 100.0,
                    std: None,
                    invalid,
                });
            };
            for to in STANCES {
                let col: Vec<_> = mine.iter().filter(|c| c.3 == to).collect();
                if !col.is_empty() {
                    let mean = col.iter().filter_map(|c| c.4).sum::<f64>() / col.len() as f64;
                    push(synth_core::store::summary::OVERALL, to, col.iter().map(|c| c.5).sum(), mean);
                }
            }
            for from in rows {
                for to in STANCES {
                    if let Some(c) = mine.iter().find(|c| c.2 == *from && c.3 == to) {
                        push(from, to, c.5, c.4.expect("filtered"));
                    }
                }
            }
        }
    }
    out
}

#[async_trait]
impl Stage for TransferStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["script", "affection", "label", self.o.stance_column.as_str()]);
        if let Some(b) = self.o.backbone_column.clone() {
            ctx.require_columns("backbone_column", 0, [b.as_str()]);
        }
        if let Some(m) = self.o.model_column.clone() {
            ctx.require_columns("model_column", 0, [m.as_str()]);
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (schema, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let has_lang = schema.field_with_name(&self.o.lang_column).is_ok();
        let text = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        let (mut n_in, mut excluded) = (0u64, 0u64);
        for b in &batches {
            for i in 0..b.num_rows() {
                n_in += 1;
                let r = data::row_json(b, i);
                let model = self.o.model_column.as_ref().map(|c| text(&r, c));
                if self.o.exclude_scripts.contains(&text(&r, "script"))
                    || model.as_ref().is_some_and(|m| self.o.exclude_models.contains(m))
                {
                    excluded += 1;
                    continue;
                }
                let lang = has_lang.then(|| text(&r, &self.o.lang_column)).filter(|l| !l.is_empty());
                let label = match (self.o.per_model.then_some(model).flatten(), lang) {
                    (Some(m), Some(l)) => format!("{m} ({l})"),
                    (Some(m), None) => m,
                    (None, Some(l)) => l,
                    (None, None) => "all".into(),
                };
                let g = groups.entry(label).or_default();
                let idx = match Affection::parse(&text(&r, "affection")) {
                    Some(Affection::High) => 0,
                    Some(Affection::Low) => 1,
                    _ => {
                        g.neutral_roles += 1;
                        continue;
                    }
                };
                let factual = match text(&r, "label").as_str() {
                    "factual" => Some(true),
                    "counterfactual" => Some(false),
                    _ => None,
                };
                let Some((s, f)) = Stance::parse(&text(&r, &self.o.stance_column)).zip(factual) else {
                    g.unparsed += 1;
                    continue;
                };
                g.claims[idx].push((f, s));
                if let Some(bc) = &self.o.backbone_column {
                    match Stance::parse(&text(&r, bc)) {
                        Some(b) => g.pairs[idx].push((b, s)),
                        None => g.unpaired += 1,
                    }
                }
            }
        }
        let mut rows = Vec::new();
        let mut cells: Vec<TransferCell> = Vec::new();
        let pct = |x: Option<f64>| x.map(|v| json!(v)).unwrap_or(Value::Null);
        for (label, g) in &groups {
            let mut cell = |mode: &str,
                            from: &str,
                            to: Stance,
                            rh: Option<f64>,
                            rl: Option<f64>,
                            d: Option<f64>,
                            n: (usize, usize)| {
                rows.push(Row::from_iter([
                    (data::ID.to_string(), json!(format!("{label}/{mode}/{from}/{}", to.name()))),
                    ("label".into(), json!(label)),
                    ("mode".into(), json!(mode)),
                    ("from".into(), json!(from)),
                    ("to".into(), json!(to.name())),
                    ("ratio_high".into(), pct(rh)),
                    ("ratio_low".into(), pct(rl)),
                    ("difference".into(), pct(d)),
                    ("n_high".into(), json!(n.0)),
                    ("n_low".into(), json!(n.1)),
                ]));
                cells.push((
                    label.clone(),
                    mode.to_string(),
                    from.to_string(),
                    to,
                    d,
                    (n.0 + n.1) as u64,
                    g.unparsed + g.unpaired,
                ));
            };
            if self.o.backbone_column.is_some() {
                for b in STANCES {
                    for s in STANCES.into_iter().filter(|s| *s != b) {
                        let n = |i: usize| g.pairs[i].iter().filter(|(x, _)| *x == b).count();
                        cell(
                            "snowballing",
                            title_case(b),
                            s,
                            transfer_ratio(&g.pairs[0], b, s),
                            transfer_ratio(&g.pairs[1], b, s),
                            transfer_difference(&g.pairs[0], &g.pairs[1], b, s),
                            (n(0), n(1)),
                        );
                    }
                }
            }
            for (factual, name, wrong) in [
                (true, "Factual", [Stance::Against, Stance::Neutral]),
                (false, "Counter-Factual", [Stance::Favor, Stance::Neutral]),
            ] {
                for s in wrong {
                    let n = |i: usize| g.claims[i].iter().filter(|(f, _)| *f == factual).count();
                    cell(
                        "factual",
                        name,
                        s,
                        claim_ratio(&g.claims[0], factual, s),
                        claim_ratio(&g.claims[1], factual, s),
                        claim_difference(&g.claims[0], &g.claims[1], factual, s),
                        (n(0), n(1)),
                    );
                }
            }
        }
        let sum = summary_rows(&cells);
        let m = &mut ctx.report.metrics;
        m.insert("excluded".into(), excluded as f64);
        m.insert("unparsed".into(), groups.values().map(|g| g.unparsed).sum::<u64>() as f64);
        m.insert("unpaired".into(), groups.values().map(|g| g.unpaired).sum::<u64>() as f64);
        m.insert("neutral_roles".into(), groups.values().map(|g| g.neutral_roles).sum::<u64>() as f64);
        ctx.report.rows_in = n_in;
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&sum)?)?;
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        ctx.set_output(out)
    }
}
