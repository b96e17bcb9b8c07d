//! `sharp_card` sink: the card of a SHARP run (`card.md`), rendered from a template file
//! (`pipelines/prompts/sharp/card.md.j2`: the prose is data) with what its inputs hold:
//! claims (counts by label, counterfactual rule, relation, language, render, licence;
//! verification), roles (script, main character, affection, interaction counts), and the
//! reconstructed ([R]) choices each SHARP input stage recorded (`<stage>.choices.json`),
//! with the paper version they follow.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::SchemaRef;

use crate::{PAPER_VERSION, choices_file};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::template::Templates;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("path", Ty::OutPath, "\"card.md\"", "card file, relative to the output directory"),
    OptionSpec::default(
        "template",
        Ty::File,
        "\"pipelines/prompts/sharp/card.md.j2\"",
        "minijinja template of the card",
    ),
    OptionSpec::default("title", Ty::Str, "\"SHARP relationship-fidelity run\"", "first heading"),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_card",
    about: "the card of a SHARP run: claims and roles statistics, licences, the reconstructed choices in force",
    role: Role::Sink,
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: String,
    template: String,
    title: String,
}

struct CardStage {
    o: Options,
    templates: Templates,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let path = ctx.root.join(&o.template);
    let mut templates = Templates::new();
    match std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| templates.add("card", &t).map(|_| ()))
    {
        Ok(()) => Some(Box::new(CardStage { o, templates })),
        Err(e) => {
            ctx.error(diags, "template", format!("{}: {e}", path.display()));
            None
        }
    }
}

/// `[{name, n}]`, largest first (ties by name).
fn tally(counts: BTreeMap<String, u64>) -> Value {
    let mut v: Vec<(String, u64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Value::Array(v.into_iter().map(|(name, n)| json!({"name": name, "n": n})).collect())
}

fn text(r: &Row, k: &str) -> Option<String> {
    r.get(k).and_then(Value::as_str).map(str::to_string)
}

#[async_trait]
impl Stage for CardStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.files.push(ctx.root.join(&self.o.template));
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let mut claims: Option<Value> = None;
        let mut roles: BTreeMap<(String, String), Value> = BTreeMap::new();
        let mut inputs = Vec::new();
        let mut choices = Vec::new();
        for input in &ctx.inputs {
            let (schema, batches) = synth_core::store::parquet::read_all(&input.path)?;
            let rows: Vec<Row> =
                batches.iter().flat_map(|b| (0..b.num_rows()).map(move |i| data::row_json(b, i))).collect();
            inputs.push(json!({"name": input.name, "rows": rows.len()}));
            let has = |c: &str| schema.field_with_name(c).is_ok();
            if has("factual_claim") && has("label") && claims.is_none() {
                let mut by: BTreeMap<&str, BTreeMap<String, u64>> =
                    ["label", "rule", "relation", "lang", "render", "license", "dataset", "verified"]
                        .into_iter()
                        .map(|k| (k, BTreeMap::new()))
                        .collect();
                for r in &rows {
                    for (k, col) in [
                        ("label", "label"),
                        ("rule", "cf_rule"),
                        ("relation", "rel"),
                        ("lang", "lang"),
                        ("render", "render"),
                        ("license", "license"),
                        ("dataset", "dataset"),
                    ] {
                        if let Some(v) = text(r, col) {
                            *by.entry(k).or_default().entry(v).or_default() += 1;
                        }
                    }
                    if has("verified") {
                        let v = match r.get("verified") {
                            Some(Value::Bool(true)) => "verified",
                            Some(Value::Bool(false)) => "rejected",
                            _ => "not reviewed",
                        };
                        *by.entry("verified").or_default().entry(v.into()).or_default() += 1;
                    }
                }
                let mut c = serde_json::Map::new();
                c.insert("stage".into(), json!(input.name));
                c.insert("total".into(), json!(rows.len()));
                for (k, v) in by {
                    c.insert(k.into(), tally(v));
                }
                claims = Some(Value::Object(c));
            }
            if has("script") && has("main") && has("role") && has("affection") {
                for r in &rows {
                    let key = (text(r, "script").unwrap_or_default(), text(r, "role").unwrap_or_default());
                    roles.entry(key.clone()).or_insert_with(|| {
                        json!({
                            "script": key.0,
                            "main": text(r, "main"),
                            "role": key.1,
                            "affection": text(r, "affection"),
                            "relation": text(r, "relation"),
                            "n_interactions": r.get("n_interactions").cloned().unwrap_or(Value::Null),
                        })
                    });
                }
            }
            let file = ctx.out_dir.join(choices_file(&input.name));
            if let Ok(bytes) = std::fs::read(&file) {
                let doc: Value = serde_json::from_slice(&bytes).map_err(|e| anyhow!("{}: {e}", file.display()))?;
                let options: Vec<Value> = doc
                    .get("reconstructed")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(k, v)| json!({"name": k, "value": v.to_string()})).collect())
                    .unwrap_or_default();
                choices.push(json!({"stage": input.name, "kind": doc.get("kind"), "options": options}));
            }
        }
        let context = json!({
            "title": self.o.title,
            "paper_version": PAPER_VERSION,
            "synth_version": env!("CARGO_PKG_VERSION"),
            "inputs": inputs,
            "claims": claims,
            "roles": roles.into_values().collect::<Vec<_>>(),
            "choices": choices,
        });
        let md = self
            .templates
            .render_value("card", minijinja::Value::from(minijinja::value::Serde(&context)))
            .map_err(|e| anyhow!("card template: {e}"))?;
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(&self.o.path))?;
        f.write_all(md.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);
        ctx.report.rows_in = ctx.inputs.iter().map(|i| i.num_rows).sum();
        ctx.report.info.insert("paper_version".into(), PAPER_VERSION.into());
        Ok(())
    }
}
