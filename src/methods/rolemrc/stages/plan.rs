//! `rolemrc_plan`: from the meta-pool (profiles with their most and least relevant
//! triplets) and the seed-script and rule files, decide every RoleMRC sample —
//! category, type, variant, profile, triplet, seed, rule, split — and emit one row
//! per LLM request that produces it (`crate::plan`). Counts per category
//! are options; the defaults reproduce Table 2 and the official test mix. The
//! role's system prompt and the MRC user turn are rendered here from template files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::plan::{self, Counts, Planner, Profile, TestCounts, Triplet};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::template::Templates;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "seeds",
        Ty::File,
        "\"seeds/rolemrc/seed_scripts.jsonl\"",
        "seed scripts (JSONL: id, category, text)",
    ),
    OptionSpec::default("rules", Ty::File, "\"rules/rolemrc/rules.jsonl\"", "system rules (JSONL: id, category, text)"),
    OptionSpec::required(
        "system_template",
        Ty::File,
        "template of the role's system prompt (profile, role_name, rule)",
    ),
    OptionSpec::required("user_template", Ty::File, "template of the MRC user turn (passages, question)"),
    OptionSpec::optional(
        "counts",
        Ty::Map(&Ty::Int(0, i64::MAX)),
        "train samples per category (free_chat, onscene_chat, answer, no_answer, refusal, attempt, multi_turn, nested, prioritized); default Table 2",
    ),
    OptionSpec::optional(
        "test",
        Ty::Map(&Ty::Any),
        "held-out test counts: per_task (100), nested_content ([20, 22]), nested_format ([58, 58]), prioritized ([22, 20]) — [with, without] narration",
    ),
    OptionSpec::default(
        "spares",
        Ty::Struct(SPARE_OPTIONS),
        "{ ratio = 0.02, min = 1 }",
        "spare instances per sample group (category type × split), planned after the counted ones; rolemrc_assemble uses them in place of failed instances so the counts are met",
    ),
    OptionSpec::default("attempt_join", Ty::Str, "\" \"", "text between an attempt seed script and the answer"),
    OptionSpec::default("most_prefix", Ty::Str, "\"most_\"", "prefix of the most relevant triplet's columns"),
    OptionSpec::default("least_prefix", Ty::Str, "\"least_\"", "prefix of the least relevant triplet's columns"),
];

const SPARE_OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("ratio", Ty::Float(0.0, 1.0), "0.02", "spares as a share of the group's count, rounded up"),
    OptionSpec::default("min", Ty::Int(0, i64::MAX), "1", "at least this many per group with any sample"),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_plan",
    // 2: spare instances (columns `group`, `spare`), planned after the counted ones.
    version: 2,
    about: "RoleMRC: assign categories, types, variants, seeds, rules and splits; one row per LLM request",
    options: OPTIONS,
    uses_seed: true,
    example: "system_template = \"pipelines/prompts/rolemrc/system.j2\"\nuser_template = \"pipelines/prompts/rolemrc/user_mrc.j2\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    seeds: String,
    rules: String,
    system_template: String,
    user_template: String,
    counts: Option<Value>,
    test: Option<Value>,
    spares: plan::Spares,
    attempt_join: String,
    most_prefix: String,
    least_prefix: String,
}

struct PlanStage {
    opts: Options,
    counts: Counts,
    test: TestCounts,
    seeds: BTreeMap<String, Vec<plan::Script>>,
    rules: BTreeMap<String, Vec<plan::Script>>,
    templates: Arc<Templates>,
    vars: BTreeMap<String, Vec<String>>,
    files: Vec<PathBuf>,
}

/// Columns the profiles input must have (besides the triplet columns).
const PROFILE_COLUMNS: &[&str] = &["role_name", "profile_text", "profile_text_no_narration"];
const TRIPLET_COLUMNS: &[&str] = &["id", "question", "passages", "answer", "answerable"];

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let counts: Counts = match opts.counts.clone().map(serde_json::from_value).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            ctx.error(diags, "counts", format!("{e} (keys: {})", plan::CATEGORIES.join(", ")));
            return None;
        }
    };
    let test: TestCounts = match opts.test.clone().map(serde_json::from_value).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            ctx.error(diags, "test", format!("{e} (keys: per_task, nested_content, nested_format, prioritized)"));
            return None;
        }
    };
    let mut ok = true;
    let mut read = |option: &str, path: &str, known: &[&str]| match plan::read_scripts(&ctx.root.join(path), known) {
        Ok(s) => s,
        Err(e) => {
            ctx.error(diags, option, e);
            ok = false;
            BTreeMap::new()
        }
    };
    let seeds = read("seeds", &opts.seeds, plan::SEED_CATEGORIES);
    let rules = read("rules", &opts.rules, plan::RULE_CATEGORIES);
    let mut templates = Templates::new();
    let mut vars = BTreeMap::new();
    for (option, path) in [("system_template", &opts.system_template), ("user_template", &opts.user_template)] {
        let full = ctx.root.join(path);
        match std::fs::read_to_string(&full).map_err(|e| e.to_string()).and_then(|t| templates.add(option, &t)) {
            Ok(v) => {
                vars.insert(option.to_string(), v.into_iter().collect());
            }
            Err(e) => {
                ctx.error(diags, option, format!("template {}: {e}", full.display()));
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    let files = [&opts.seeds, &opts.rules, &opts.system_template, &opts.user_template]
        .iter()
        .map(|p| ctx.root.join(p))
        .collect();
    let stage = PlanStage { counts, test, seeds, rules, templates: Arc::new(templates), vars, files, opts };
    if let Err(e) = stage.planner(0, "").check() {
        ctx.error(diags, "", e);
        return None;
    }
    Some(Box::new(stage))
}

/// Output columns: the request fields, then the rendered `system` and `user` turns.
fn output_schema() -> SchemaRef {
    let mut fields = Vec::new();
    let probe = serde_json::to_value(plan::Request::default()).expect("request serializes");
    for (k, v) in probe.as_object().expect("object") {
        if k == "id" {
            continue;
        }
        let ty = match v {
            Value::Bool(_) => DataType::Boolean,
            Value::Number(_) => DataType::Int64,
            _ => DataType::Utf8,
        };
        fields.push(Field::new(k, ty, false));
    }
    fields.push(Field::new("system", DataType::Utf8, false));
    fields.push(Field::new("user", DataType::Utf8, false));
    data::schema_with_id(fields)
}

impl PlanStage {
    fn planner<'s>(&'s self, seed: u64, stage: &'s str) -> Planner<'s> {
        Planner {
            seed,
            stage,
            counts: &self.counts,
            test: &self.test,
            seeds: self.seeds.clone(),
            rules: self.rules.clone(),
            attempt_join: &self.opts.attempt_join,
            spares: self.opts.spares,
        }
    }

    fn triplet(&self, row: &Row, prefix: &str) -> Option<Triplet> {
        let s = |c: &str| row.get(&format!("{prefix}{c}")).and_then(Value::as_str).map(str::to_string);
        Some(Triplet {
            id: s("id")?,
            question: s("question").unwrap_or_default(),
            passages: s("passages").unwrap_or_default(),
            answer: s("answer").unwrap_or_default(),
            answerable: row.get(&format!("{prefix}answerable")).and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

#[async_trait]
impl Stage for PlanStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("", 0, PROFILE_COLUMNS.iter().copied());
        for (option, prefix) in [("most_prefix", &self.opts.most_prefix), ("least_prefix", &self.opts.least_prefix)] {
            let cols: Vec<String> = TRIPLET_COLUMNS.iter().map(|c| format!("{prefix}{c}")).collect();
            ctx.require_columns(option, 0, cols.iter().map(String::as_str));
        }
        for (option, vars) in &self.vars {
            let known = ["profile", "role_name", "rule", "passages", "question"];
            for v in vars {
                if !known.contains(&v.as_str()) {
                    ctx.error(option, format!("template variable \"{v}\" is not one of {}", known.join(", ")));
                }
            }
        }
        ctx.files.extend(self.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input = ctx.inputs[0].clone();
        let (_, batches) = synth_core::store::parquet::read_all(&input.path)?;
        let mut profiles = Vec::new();
        for b in &batches {
            for i in 0..b.num_rows() {
                let row = data::row_json(b, i);
                let s = |c: &str| row.get(c).and_then(Value::as_str).unwrap_or_default().to_string();
                profiles.push(Profile {
                    id: s(data::ID),
                    role_name: s("role_name"),
                    text: s("profile_text"),
                    text_no_narration: s("profile_text_no_narration"),
                    most: self.triplet(&row, &self.opts.most_prefix),
                    least: self.triplet(&row, &self.opts.least_prefix),
                });
            }
        }
        let planner = self.planner(ctx.seed, &ctx.name);
        let result = planner.plan(&profiles);
        if !result.empty_pools.is_empty() {
            tracing::warn!(stage = %ctx.name, pools = ?result.empty_pools, "no eligible profile for some categories; they get no samples");
            ctx.report.info.insert("empty_pools".into(), result.empty_pools.join(","));
        }
        if result.reused > 0 {
            tracing::warn!(stage = %ctx.name, reused = result.reused, "fewer eligible profiles than samples asked; profiles are reused");
        }
        ctx.report.info.insert("reused_profiles".into(), result.reused.to_string());
        ctx.report.info.insert("spares".into(), result.spares.to_string());
        for ((split, cat), n) in &result.samples {
            ctx.report.info.insert(format!("samples.{split}.{cat}"), n.to_string());
        }
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        ctx.progress.set_total(result.requests.len() as u64);
        for chunk in result.requests.chunks(4096) {
            let mut rows = Vec::with_capacity(chunk.len());
            for r in chunk {
                let Value::Object(mut row) = serde_json::to_value(r)? else { unreachable!() };
                let Value::Object(ctx_vars) = serde_json::json!({
                    "profile": r.profile, "role_name": r.role_name, "rule": r.system_rule,
                    "passages": r.passages, "question": r.question,
                }) else {
                    unreachable!()
                };
                let system = self.templates.render("system_template", &ctx_vars).map_err(|e| anyhow!(e))?;
                let user = if r.question.is_empty() {
                    String::new()
                } else {
                    self.templates.render("user_template", &ctx_vars).map_err(|e| anyhow!(e))?
                };
                row.insert("system".into(), Value::String(system));
                row.insert("user".into(), Value::String(user));
                rows.push(row);
            }
            let batch =
                data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("request {}: {e}", chunk[i].id))?;
            out.write(&batch)?;
            ctx.progress.inc(chunk.len() as u64);
        }
        ctx.report.rows_in = input.num_rows;
        ctx.set_output(out)
    }
}
