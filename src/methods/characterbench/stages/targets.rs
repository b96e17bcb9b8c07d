//! `characterbench_targets` (construction): one script plan per character and dimension,
//! from characters that already have a dialogue context (the `characterbench_dialogue`
//! parser's `context`): what the dimension's target is and where it comes from, what the
//! user's query must do (`build/plan.json`, reconstructed), and the hand-written material
//! the paper describes: for behavior_consistency_human a behaviour description appended to
//! the profile (it is the target), for morality_robustness an immoral setting appended to
//! the profile, for the morality dimensions a query category. Every draw (which characters
//! serve a dimension when `characters_per_dimension` is set, which description, setting or
//! category) derives from the pipeline seed and the ids, never from input order.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use crate::build::{self, BuildPlan, Turn};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "plan",
        Ty::File,
        "\"pipelines/prompts/characterbench/build/plan.json\"",
        "per dimension: target source, what the target and the query are ([R], reconstructed)",
    ),
    OptionSpec::default("dimensions", Ty::File, DEFAULT_DIMENSIONS, "the benchmark definition"),
    OptionSpec::optional("only", Ty::StrList, "build these dimensions (default: every dimension of the plan)"),
    OptionSpec::optional(
        "characters_per_dimension",
        POSITIVE,
        "a seeded sample of this many characters per dimension (default: all)",
    ),
    OptionSpec::default("lang", Ty::Enum(&["zh", "en"]), "\"zh\"", "the language of the scripts"),
    OptionSpec::default(
        "behaviors",
        Ty::File,
        "\"rules/characterbench/behaviors.tsv\"",
        "behaviour descriptions for behavior_consistency_human (columns zh, en)",
    ),
    OptionSpec::default(
        "settings",
        Ty::File,
        "\"rules/characterbench/immoral_settings.tsv\"",
        "immoral settings for morality_robustness (columns category, zh, en)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_targets",
    about: "construction: a script plan per character and dimension (target source and instruction, query instruction, behaviour / immoral setting / category draws)",
    options: OPTIONS,
    uses_seed: true,
    example: "lang = \"zh\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    plan: String,
    dimensions: String,
    only: Option<Vec<String>>,
    characters_per_dimension: Option<usize>,
    lang: String,
    behaviors: String,
    settings: String,
}

struct Targets {
    opts: Options,
    bench: Bench,
    plan: BuildPlan,
    behaviors: Vec<String>,
    /// (category index, text)
    settings: Vec<(usize, String)>,
    files: Vec<PathBuf>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    let fail = |diags: &mut Diagnostics, option: &str, e: String| {
        ctx.error(diags, option, e);
        None
    };
    let plan_path = ctx.root.join(&opts.plan);
    let plan = match BuildPlan::read(&plan_path) {
        Ok(p) => p,
        Err(e) => return fail(diags, "plan", e),
    };
    for d in plan.dimensions.keys() {
        if bench.dimension(d).is_none() {
            return fail(
                diags,
                "plan",
                format!("{}: unknown dimension \"{d}\" (the definition has: {})", plan_path.display(), bench.ids()),
            );
        }
    }
    for d in opts.only.iter().flatten() {
        if !plan.dimensions.contains_key(d) {
            return fail(diags, "only", format!("no plan for dimension \"{d}\" in {}", plan_path.display()));
        }
    }
    let lang = opts.lang.clone();
    let categories = plan.morality_categories.get(&lang).cloned().unwrap_or_default();
    if categories.is_empty() {
        return fail(diags, "plan", format!("{}: no morality_categories for {lang}", plan_path.display()));
    }
    let behaviors_path = ctx.root.join(&opts.behaviors);
    let behaviors = match build::read_tsv(&behaviors_path).and_then(|rows| build::column(&behaviors_path, &rows, &lang))
    {
        Ok(b) if !b.is_empty() => b,
        Ok(_) => return fail(diags, "behaviors", format!("{}: no description", behaviors_path.display())),
        Err(e) => return fail(diags, "behaviors", e),
    };
    let settings_path = ctx.root.join(&opts.settings);
    let zh_categories = plan.morality_categories.get("zh").cloned().unwrap_or_default();
    let settings = match build::read_tsv(&settings_path) {
        Ok(rows) => {
            let texts = match build::column(&settings_path, &rows, &lang) {
                Ok(t) => t,
                Err(e) => return fail(diags, "settings", e),
            };
            let mut out = Vec::new();
            for (i, (row, text)) in rows.iter().zip(texts).enumerate() {
                let cat = row.get("category").cloned().unwrap_or_default();
                match zh_categories.iter().position(|c| *c == cat) {
                    Some(k) => out.push((k, text)),
                    None => {
                        return fail(
                            diags,
                            "settings",
                            format!(
                                "{}: row {}: unknown category {cat:?} (the plan's: {})",
                                settings_path.display(),
                                i + 1,
                                zh_categories.join(", ")
                            ),
                        );
                    }
                }
            }
            out
        }
        Err(e) => return fail(diags, "settings", e),
    };
    let files = vec![plan_path, behaviors_path, settings_path];
    Some(Box::new(Targets { opts, bench, plan, behaviors, settings, files }))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let o = |n: &str| Field::new(n, DataType::Utf8, true);
    data::schema_with_id([
        s("char_id"),
        s("dimension"),
        s("abbr"),
        s("kind"),
        s("target_from"),
        s("lang"),
        s("character_name"),
        s("character_profile"),
        o("user_name"),
        o("user_profile"),
        o("greeting"),
        s("context"),
        s("context_text"),
        s("target_instruction"),
        s("query_instruction"),
        o("given_target"),
        o("category"),
    ])
}

fn pick(key: u64, n: usize) -> usize {
    (key % n as u64) as usize
}

#[async_trait]
impl Stage for Targets {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["character_name", "character_profile", "context"]);
        ctx.files.extend(self.files.iter().cloned());
        ctx.files.extend(self.bench.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let lang = self.opts.lang.as_str();
        let user = &self.bench.languages.get(lang).ok_or_else(|| anyhow!("no language {lang}"))?.user;
        // Characters with a usable context.
        let mut characters: Vec<(String, Row, Vec<Turn>)> = Vec::new();
        let mut n = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                let turns: Option<Vec<Turn>> = row
                    .get("context")
                    .and_then(Value::as_str)
                    .and_then(|c| serde_json::from_str::<Vec<Value>>(c).ok())
                    .map(|list| {
                        list.iter()
                            .map(|t| Turn {
                                speaker: t["speaker"].as_str().unwrap_or_default().to_string(),
                                utterance: t["utterance"].as_str().unwrap_or_default().to_string(),
                            })
                            .collect()
                    });
                match turns {
                    Some(t) if !t.is_empty() => characters.push((id, row, t)),
                    _ => ctx.fail(
                        &id,
                        FailureKind::Input,
                        "no dialogue context (column \"context\": a JSON list of turns)",
                        serde_json::to_string(&row).ok(),
                    ),
                }
            }
        }
        let mut rows: Vec<Row> = Vec::new();
        for d in &self.bench.dimensions {
            let Some(p) = self.plan.dimensions.get(&d.id) else { continue };
            if self.opts.only.as_ref().is_some_and(|o| !o.contains(&d.id)) {
                continue;
            }
            // Which characters serve this dimension: all, or a seeded sample (distinct characters).
            let mut chosen: Vec<&(String, Row, Vec<Turn>)> = characters.iter().collect();
            if let Some(k) = self.opts.characters_per_dimension {
                chosen.sort_by_key(|(id, _, _)| ctx.record_key(id, &format!("characters/{}", d.id)));
                chosen.truncate(k);
                chosen.sort_by(|a, b| a.0.cmp(&b.0));
            }
            for (cid, row, turns) in chosen {
                let id = format!("{}/{cid}", d.id);
                let text = |k: &str| row.get(k).and_then(Value::as_str).map(str::to_string);
                let name = text("character_name").unwrap_or_default();
                let mut profile = text("character_profile").unwrap_or_default();
                let (mut given_target, mut category) = (None, None);
                match p.target_from.as_str() {
                    "style" => {
                        let style = &self.behaviors[pick(ctx.record_key(&id, "behavior"), self.behaviors.len())];
                        profile.push_str(style);
                        given_target = Some(style.clone());
                    }
                    "setting" => {
                        let (cat, setting) = &self.settings[pick(ctx.record_key(&id, "setting"), self.settings.len())];
                        profile.push_str(setting);
                        category = Some(self.plan.morality_categories[lang][*cat].clone());
                    }
                    _ => {}
                }
                if d.aspect == "morality" && category.is_none() {
                    let cats = &self.plan.morality_categories[lang];
                    category = Some(cats[pick(ctx.record_key(&id, "category"), cats.len())].clone());
                }
                let mut r = Row::new();
                r.insert(data::ID.into(), json!(id));
                r.insert("char_id".into(), json!(cid));
                r.insert("dimension".into(), json!(d.id));
                r.insert("abbr".into(), json!(d.abbr));
                r.insert("kind".into(), json!(d.kind));
                r.insert("target_from".into(), json!(p.target_from));
                r.insert("lang".into(), json!(lang));
                r.insert("character_name".into(), json!(name));
                r.insert("character_profile".into(), json!(profile));
                for k in ["user_name", "user_profile", "greeting"] {
                    r.insert(k.into(), text(k).map(Value::from).unwrap_or(Value::Null));
                }
                r.insert("context".into(), row.get("context").cloned().unwrap_or(Value::Null));
                r.insert("context_text".into(), json!(build::transcript(turns, &name, user)));
                r.insert("target_instruction".into(), json!(p.target.get(lang).cloned().unwrap_or_default()));
                r.insert("query_instruction".into(), json!(p.query.get(lang).cloned().unwrap_or_default()));
                r.insert("given_target".into(), json!(given_target));
                r.insert("category".into(), json!(category));
                rows.push(r);
            }
        }
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(512) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = n;
        ctx.set_output(out)
    }
}
