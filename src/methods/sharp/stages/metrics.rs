//! `sharp_metrics`: factual-based labels and the paper's metrics per (model, language,
//! script, role) — counts, SR, AR, ER, the conservative ratio and CRF
//! ([`crate::metrics`]) — as its output, and as a summary (`report` reads
//! it) in the paper's layouts:
//!
//! - `sharp` (Table 4): a row per model and language, the model level (mean over scripts of
//!   the mean over roles, or pooled counts: `model_level`, [R]) with the share of answers
//!   whose stance could not be read (`Unparsed`); each `script / role` cell as a group;
//! - `sharp_backbone` (Tables 6 and 7), with `backbone_column` (the snowballing join): the
//!   backbone's conservative ratio, error, sycophancy and adversary rates beside the aligned
//!   model's differences;
//! - `sharp_correlation` (Figure 3), where the roles carry interaction counts: Pearson's r
//!   over roles among frequency, SR and AR;
//! - `sharp_detector` (Table 3), with `gold_column`: the stance detector's accuracy and
//!   macro-F1 against human labels.
//!
//! A record with no stance (a null or unknown label) counts as unparsed in its cell, and
//! so does every record of the optional second input (the records that were asked, e.g.
//! the agent's answers) that has no row here (a stance reply that never parsed is a failure
//! row of the stance stage): never silently dropped.

use std::collections::{BTreeMap, HashSet};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::metrics::{Affection, Cell, Rates, Stance, macro_average, pearson, pooled, reliability};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("label", Ty::Str, "the model's name in the report (default: the input stage's name)"),
    OptionSpec::optional(
        "model_column",
        Ty::Str,
        "a column naming the model of each record (several models in one input): one report row each",
    ),
    OptionSpec::default(
        "lang_column",
        Ty::Str,
        "\"lang\"",
        "the language column, where present: a report row per model and language",
    ),
    OptionSpec::default("stance_column", Ty::Str, "\"stance\"", "column of the detected stance"),
    OptionSpec::default(
        "model_level",
        Ty::Enum(&["macro", "pooled"]),
        "\"macro\"",
        "[R] the model level: mean over scripts of the mean over roles, or the rates of the summed counts (spec P6)",
    ),
    OptionSpec::optional(
        "backbone_column",
        Ty::Str,
        "the unaligned backbone's stance on the same turn (snowballing join): adds the backbone-vs-aligned table (Tables 6/7)",
    ),
    OptionSpec::default("backbone_label", Ty::Str, "\"backbone\"", "the backbone's name in the report"),
    OptionSpec::default(
        "frequency_column",
        Ty::Str,
        "\"n_interactions\"",
        "role interaction counts, where present: Figure 3's correlations",
    ),
    OptionSpec::optional(
        "gold_column",
        Ty::Str,
        "column of human stance labels (FAVOR / AGAINST / NEUTRAL; null where unlabelled): adds the detector's accuracy and macro-F1 (Table 3)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_metrics",
    // 2: per model and language, unparsed counts, pooled option, backbone table, correlation.
    version: 2,
    about: "SHARP's factual-based metrics per (model, language, script, role) and per model: SR, AR, ER, conservative ratio, CRF; backbone vs aligned, Figure 3, detector reliability (summaries for `report`)",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    summary: true,
    example: "label = \"rpa\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    label: Option<String>,
    model_column: Option<String>,
    lang_column: String,
    stance_column: String,
    model_level: String,
    backbone_column: Option<String>,
    backbone_label: String,
    frequency_column: String,
    gold_column: Option<String>,
}

struct MetricsStage {
    o: Options,
    choices: Map<String, Value>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    Some(Box::new(MetricsStage { o: ctx.parse(diags)?, choices }))
}

pub fn output_schema() -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    let u = |n: &str| Field::new(n, DataType::UInt64, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    data::schema_with_id([
        s("model", false),
        s("stances", false),
        s("lang", true),
        s("script", false),
        s("role", false),
        s("affection", false),
        u("n_f"),
        u("n_cf"),
        u("n_syc"),
        u("n_adv"),
        u("n_neutral"),
        u("n_strict"),
        u("unparsed"),
        f("sr"),
        f("ar"),
        f("er"),
        f("csvt"),
        f("crf"),
        f("n_interactions"),
    ])
}

const METRICS: [(&str, &str); 5] = [("sr", "SR"), ("ar", "AR"), ("er", "ER"), ("csvt", "Csvt"), ("crf", "CRF")];

fn values(r: &Rates) -> [Option<f64>; 5] {
    [r.sr, r.ar, r.er, r.csvt, r.crf]
}

/// One (model, lang, script, role) cell: the agent's and the backbone's counts.
#[derive(Default)]
struct Acc {
    affection: String,
    agent: Cell,
    backbone: Cell,
    unparsed: u64,
    unparsed_backbone: u64,
    freq: Option<f64>,
}

type Key = (String, Option<String>, String, String);

fn text(r: &Row, k: &str) -> String {
    r.get(k).and_then(Value::as_str).unwrap_or_default().to_string()
}

impl MetricsStage {
    fn key(&self, r: &Row, default_label: &str, has_lang: bool) -> Key {
        let model = match &self.o.model_column {
            Some(c) => text(r, c),
            None => self.o.label.clone().unwrap_or_else(|| default_label.to_string()),
        };
        let lang = has_lang.then(|| text(r, &self.o.lang_column));
        (model, lang, text(r, "script"), text(r, "role"))
    }

    fn model_rates(&self, cells: &[(&Key, &Acc)], backbone: bool) -> Rates {
        let cell = |a: &Acc| if backbone { a.backbone } else { a.agent };
        let valid: Vec<(Affection, Cell, String)> = cells
            .iter()
            .filter_map(|(k, a)| Affection::parse(&a.affection).map(|aff| (aff, cell(a), k.2.clone())))
            .collect();
        if self.o.model_level == "pooled" {
            pooled(&valid.iter().map(|(a, c, _)| (*a, *c)).collect::<Vec<_>>())
        } else {
            macro_average(&valid.iter().map(|(a, c, s)| (s.clone(), c.rates(*a))).collect::<Vec<_>>())
        }
    }
}

fn label_of(model: &str, lang: &Option<String>) -> String {
    match lang {
        Some(l) if !l.is_empty() => format!("{model} ({l})"),
        _ => model.to_string(),
    }
}

#[async_trait]
impl Stage for MetricsStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let col = self.o.stance_column.clone();
        ctx.require_columns("inputs", 0, ["script", "role", "affection", "label", col.as_str()]);
        for (option, c) in [
            ("gold_column", &self.o.gold_column),
            ("backbone_column", &self.o.backbone_column),
            ("model_column", &self.o.model_column),
        ] {
            if let Some(c) = c.clone() {
                ctx.require_columns(option, 0, [c.as_str()]);
            }
        }
        if ctx.inputs.len() > 2 {
            ctx.error("inputs", "the stances, and optionally the records that were asked (to count the missing ones)");
        }
        if ctx.inputs.len() == 2 {
            ctx.require_columns("inputs", 1, ["script", "role", "affection", "label"]);
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (schema, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let has_lang = schema.field_with_name(&self.o.lang_column).is_ok();
        let has_freq = schema.field_with_name(&self.o.frequency_column).is_ok();
        let default_label = ctx.inputs[0].name.clone();
        let mut cells: BTreeMap<Key, Acc> = BTreeMap::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut gold_pairs = Vec::new();
        let mut n_in = 0u64;
        let factual = |r: &Row| match text(r, "label").as_str() {
            "factual" => Some(true),
            "counterfactual" => Some(false),
            _ => None,
        };
        for b in &batches {
            for i in 0..b.num_rows() {
                n_in += 1;
                let r = data::row_json(b, i);
                seen.insert(text(&r, data::ID));
                let acc = cells.entry(self.key(&r, &default_label, has_lang)).or_default();
                acc.affection = text(&r, "affection");
                if has_freq {
                    acc.freq = r.get(&self.o.frequency_column).and_then(Value::as_f64).or(acc.freq);
                }
                let stance = Stance::parse(&text(&r, &self.o.stance_column));
                if let (Some(g), Some(s)) =
                    (self.o.gold_column.as_ref().and_then(|g| Stance::parse(&text(&r, g))), stance)
                {
                    gold_pairs.push((g, s));
                }
                match (stance, factual(&r)) {
                    (Some(s), Some(f)) => acc.agent.add(f, s),
                    _ => acc.unparsed += 1,
                }
                if let Some(bc) = &self.o.backbone_column {
                    match (Stance::parse(&text(&r, bc)), factual(&r)) {
                        (Some(s), Some(f)) => acc.backbone.add(f, s),
                        _ => acc.unparsed_backbone += 1,
                    }
                }
            }
        }
        // Records that were asked and have no stance row.
        let mut missing = 0u64;
        if ctx.inputs.len() == 2 {
            let (schema1, asked) = synth_core::store::parquet::read_all(&ctx.inputs[1].path)?;
            let lang1 = schema1.field_with_name(&self.o.lang_column).is_ok();
            for b in &asked {
                for i in 0..b.num_rows() {
                    let r = data::row_json(b, i);
                    if seen.contains(&text(&r, data::ID)) {
                        continue;
                    }
                    missing += 1;
                    let acc = cells.entry(self.key(&r, &default_label, lang1)).or_default();
                    acc.affection = text(&r, "affection");
                    acc.unparsed += 1;
                    acc.unparsed_backbone += u64::from(self.o.backbone_column.is_some());
                }
            }
        }
        ctx.report.rows_in = n_in;
        ctx.report.metrics.insert("missing_stances".into(), missing as f64);

        // Per-cell rows.
        let mut rows = Vec::new();
        let mut bad_affection = Vec::new();
        for (k @ (model, lang, script, role), a) in &cells {
            let Some(affection) = Affection::parse(&a.affection) else {
                bad_affection.push(k.clone());
                continue;
            };
            let mut sources = vec![("agent", model.clone(), a.agent, a.unparsed)];
            if self.o.backbone_column.is_some() {
                sources.push(("backbone", self.o.backbone_label.clone(), a.backbone, a.unparsed_backbone));
            }
            for (source, name, cell, unparsed) in sources {
                let rates = cell.rates(affection);
                let mut row = Row::from_iter([
                    (
                        data::ID.to_string(),
                        json!(format!("{name}/{}/{script}/{role}", lang.clone().unwrap_or_default())),
                    ),
                    ("model".into(), json!(name)),
                    ("stances".into(), json!(source)),
                    ("lang".into(), lang.clone().map(Value::String).unwrap_or(Value::Null)),
                    ("script".into(), json!(script)),
                    ("role".into(), json!(role)),
                    ("affection".into(), json!(a.affection)),
                    ("n_interactions".into(), a.freq.map(|x| json!(x)).unwrap_or(Value::Null)),
                ]);
                for (k, v) in [
                    ("n_f", cell.n_f),
                    ("n_cf", cell.n_cf),
                    ("n_syc", cell.n_syc),
                    ("n_adv", cell.n_adv),
                    ("n_neutral", cell.n_neutral),
                    ("n_strict", cell.n_strict),
                    ("unparsed", unparsed),
                ] {
                    row.insert(k.into(), json!(v));
                }
                for ((k, _), v) in METRICS.iter().zip(values(&rates)) {
                    row.insert(k.to_string(), v.map(|x| json!(x)).unwrap_or(Value::Null));
                }
                rows.push(row);
            }
        }
        for (model, lang, script, role) in &bad_affection {
            let id = format!("{model}/{}/{script}/{role}", lang.clone().unwrap_or_default());
            let aff = &cells[&(model.clone(), lang.clone(), script.clone(), role.clone())].affection;
            ctx.fail(
                &id,
                FailureKind::Input,
                format!("{id}: unknown affection class \"{aff}\" (one of high, low, neutral)"),
                None,
            );
        }
        for c in bad_affection {
            cells.remove(&c);
        }
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        ctx.write_side_parquet(
            &summary::file_name(&ctx.name),
            &summary::to_batch(&self.summary(&cells, &gold_pairs, has_freq))?,
        )?;
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        ctx.set_output(out)
    }
}

/// The label, table and title shared by the rows of one summary table.
struct Head<'a> {
    label: &'a str,
    table: &'a str,
    title: &'a str,
}

impl Head<'_> {
    fn row(&self, group: &str, metric: &str, heading: &str, n: u64, value: f64, invalid: u64) -> SummaryRow {
        SummaryRow {
            label: self.label.into(),
            table: self.table.into(),
            title: self.title.into(),
            group: group.into(),
            metric: metric.into(),
            heading: heading.into(),
            n,
            value,
            std: None,
            invalid,
        }
    }
}

/// The cells of one (model, language).
type ByModel<'a> = BTreeMap<(String, Option<String>), Vec<(&'a Key, &'a Acc)>>;

impl MetricsStage {
    fn summary(&self, cells: &BTreeMap<Key, Acc>, gold: &[(Stance, Stance)], has_freq: bool) -> Vec<SummaryRow> {
        let level = if self.o.model_level == "pooled" {
            "the rates of the counts pooled over scripts and roles"
        } else {
            "the mean over scripts of the mean over roles"
        };
        let title = format!(
            "Relationship fidelity, factual-based mode (Table 4 layout, %): model level = {level} [R]; ER and Csvt derived [D]; Unparsed = answers without a readable stance, left out"
        );
        let mut by_model: ByModel = BTreeMap::new();
        for (k, a) in cells {
            by_model.entry((k.0.clone(), k.1.clone())).or_default().push((k, a));
        }
        let mut out = Vec::new();
        for ((model, lang), group) in &by_model {
            let label = label_of(model, lang);
            let sharp = Head { label: &label, table: "sharp", title: &title };
            let parsed: u64 = group.iter().map(|(_, a)| a.agent.n_f + a.agent.n_cf).sum();
            let unparsed: u64 = group.iter().map(|(_, a)| a.unparsed).sum();
            let unparsed_share = |p: u64, u: u64| if p + u == 0 { 0.0 } else { 100.0 * u as f64 / (p + u) as f64 };
            let model_rates = self.model_rates(group, false);
            for ((metric, heading), v) in METRICS.iter().zip(values(&model_rates)) {
                if let Some(v) = v {
                    out.push(sharp.row(OVERALL, metric, heading, parsed, v * 100.0, unparsed));
                }
            }
            out.push(sharp.row(
                OVERALL,
                "unparsed",
                "Unparsed",
                parsed + unparsed,
                unparsed_share(parsed, unparsed),
                unparsed,
            ));
            for ((_, _, script, role), a) in group {
                let Some(aff) = Affection::parse(&a.affection) else { continue };
                let n = a.agent.n_f + a.agent.n_cf;
                let g = format!("{script} / {role}");
                for ((metric, heading), v) in METRICS.iter().zip(values(&a.agent.rates(aff))) {
                    if let Some(v) = v {
                        out.push(sharp.row(&g, metric, heading, n, v * 100.0, a.unparsed));
                    }
                }
                out.push(sharp.row(
                    &g,
                    "unparsed",
                    "Unparsed",
                    n + a.unparsed,
                    unparsed_share(n, a.unparsed),
                    a.unparsed,
                ));
            }
            if self.o.backbone_column.is_some() {
                let b = self.model_rates(group, true);
                let bl = format!("{} → {label}", self.o.backbone_label);
                let backbone_title = "Backbone vs aligned (Tables 6 and 7 layout, %): the backbone's conservative ratio, error, sycophancy and adversary rates on the same turns; (Δ) = aligned − backbone";
                let backbone = Head { label: &bl, table: "sharp_backbone", title: backbone_title };
                let n: u64 = group.iter().map(|(_, a)| a.backbone.n_f + a.backbone.n_cf).sum();
                let u: u64 = group.iter().map(|(_, a)| a.unparsed_backbone).sum();
                let d = |x: Option<f64>, y: Option<f64>| Some(x? - y?);
                let cols = [
                    ("csvt", "Csvt.", b.csvt),
                    ("er", "Error.", b.er),
                    ("sr", "Syco.", b.sr),
                    ("ar", "Advs.", b.ar),
                    ("d_ar", "Advs. (Δ)", d(model_rates.ar, b.ar)),
                    ("d_sr", "Syco. (Δ)", d(model_rates.sr, b.sr)),
                    ("d_er", "Error. (Δ)", d(model_rates.er, b.er)),
                ];
                for (metric, heading, v) in cols {
                    if let Some(v) = v {
                        out.push(backbone.row(OVERALL, metric, heading, n, v * 100.0, u));
                    }
                }
                out.push(backbone.row(OVERALL, "unparsed", "Unparsed", n + u, unparsed_share(n, u), u));
            }
            if has_freq {
                let corr = Head {
                    label: &label,
                    table: "sharp_correlation",
                    title: "Role interaction frequency, SR and AR over roles (Figure 3 layout): Pearson's r",
                };
                let pts: Vec<(f64, f64, f64)> = group
                    .iter()
                    .filter_map(|(_, a)| {
                        let r = a.agent.rates(Affection::parse(&a.affection)?);
                        Some((a.freq?, r.sr?, r.ar?))
                    })
                    .collect();
                let series: [(&str, &str, Vec<f64>); 3] = [
                    ("frequency", "Frequency", pts.iter().map(|p| p.0).collect()),
                    ("sr", "SR", pts.iter().map(|p| p.1).collect()),
                    ("ar", "AR", pts.iter().map(|p| p.2).collect()),
                ];
                for (gm, gh, x) in &series {
                    let _ = gm;
                    for (m, h, y) in &series {
                        if let Some(r) = pearson(x, y) {
                            out.push(corr.row(gh, m, h, pts.len() as u64, r, 0));
                        }
                    }
                }
            }
        }
        if let Some((acc, f1)) = reliability(gold) {
            let label = self.o.label.clone().unwrap_or_else(|| "stance detector".into());
            let detector = Head {
                label: &label,
                table: "sharp_detector",
                title: "Stance detector against human labels (Table 3 layout, %)",
            };
            out.push(detector.row(OVERALL, "accuracy", "Accuracy", gold.len() as u64, acc * 100.0, 0));
            out.push(detector.row(OVERALL, "macro_f1", "Macro-F1", gold.len() as u64, f1 * 100.0, 0));
        }
        out
    }
}
