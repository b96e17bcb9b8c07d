//! `sharp_turns`: every role puts every claim to its script's main character (spec §2
//! `sh_cross` + `sh_render_turn`, the full grid): one record per (claim, script, role), id
//! `<claim id>/<script>/<role>`, with the Appendix-B turn in `user_turn`. Roles come from a
//! roles file (`roles`; a bad line stops the stage naming `file:line`) or from a second
//! input (e.g. `sharp_roles`), whose other columns (interaction counts, a profile text for
//! the agent's system prompt, ...) are carried into every turn.

use anyhow::{Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::metrics::Affection;
use crate::roles::{self, RoleRow};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional(
        "roles",
        Ty::File,
        "roles file: tab-separated script, main, role, affection (high / low / neutral); or give the roles as a second input",
    ),
    OptionSpec::default("lang", Ty::Enum(&["en", "zh"]), "\"en\"", "language of the turn template"),
    OptionSpec::default(
        "claim_column",
        Ty::Str,
        "\"claim\"",
        "the claims' column put to the roles (e.g. a translation)",
    ),
    OptionSpec::default(
        "keep_case",
        Ty::Bool,
        "false",
        "[R] keep an English claim's first letter (default: lower-cased unless an acronym)",
    ),
    OptionSpec::default(
        "zh_ascii_punct",
        Ty::Bool,
        "false",
        "[R] ASCII `:`, `,`, `?` in the zh turn (the extracted paper text's form)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_turns",
    // 2: roles from a second input, claim_column, the lang column.
    version: 2,
    about: "claims × roles (full grid): each role puts each claim to the main character, Appendix B's turn in user_turn",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "roles = \"seeds/sharp/roles.tsv\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    roles: Option<String>,
    lang: String,
    claim_column: String,
    keep_case: bool,
    zh_ascii_punct: bool,
}

struct TurnsStage {
    roles: Option<Vec<RoleRow>>,
    o: Options,
    choices: Map<String, Value>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    let Some(file) = &o.roles else {
        return Some(Box::new(TurnsStage { roles: None, o, choices }));
    };
    let path = ctx.root.join(file);
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|t| roles::parse_roles(&t, file));
    match parsed {
        Ok(roles) => Some(Box::new(TurnsStage { roles: Some(roles), o, choices })),
        Err(e) => {
            ctx.error(diags, "roles", e);
            None
        }
    }
}

/// The columns every turn has; a roles input adds its other columns.
const BASE: [&str; 11] =
    ["claim_id", "claim", "label", "cf_rule", "lang", "script", "main", "role", "affection", "user_turn", "id"];

fn schema(extra: &[Field]) -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    data::schema_with_id(
        [
            s("claim_id", false),
            s("claim", false),
            s("label", false),
            s("cf_rule", true),
            s("lang", false),
            s("script", false),
            s("main", false),
            s("role", false),
            s("affection", false),
            s("user_turn", false),
        ]
        .into_iter()
        .chain(extra.iter().cloned()),
    )
}

impl TurnsStage {
    /// The roles input's columns carried into the turns.
    fn extra(roles: Option<&SchemaRef>) -> Vec<Field> {
        roles
            .map(|s| {
                s.fields().iter().filter(|f| !BASE.contains(&f.name().as_str())).map(|f| f.as_ref().clone()).collect()
            })
            .unwrap_or_default()
    }
}

#[async_trait]
impl Stage for TurnsStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, [self.o.claim_column.as_str(), "label"]);
        if let Some(f) = &self.o.roles {
            ctx.files.push(ctx.root.join(f));
        }
        match (&self.roles, ctx.inputs.len()) {
            (_, n) if n > 2 => ctx.error("inputs", "one input of claims, and optionally one of roles"),
            (Some(_), 2) => ctx.error("roles", "roles come from the `roles` file or a second input, not both"),
            (None, 1) => ctx.error(
                "roles",
                "no roles: set `roles` (a file) or give a second input with script, main, role, affection",
            ),
            (None, _) => ctx.require_columns("inputs", 1, ["script", "main", "role", "affection"]),
            _ => {}
        }
        let roles = if self.roles.is_none() { ctx.input_schema(1) } else { None };
        Some(schema(&Self::extra(roles.as_ref())))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // The roles, with the columns to carry.
        let mut roles: Vec<(RoleRow, Row)> = Vec::new();
        let extra = Self::extra(ctx.inputs.get(1).map(|i| &i.schema));
        match &self.roles {
            Some(r) => roles.extend(r.iter().map(|r| (r.clone(), Row::new()))),
            None => {
                let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[1].path)?;
                let text = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                for b in &batches {
                    for i in 0..b.num_rows() {
                        let r = data::row_json(b, i);
                        let aff = text(&r, "affection");
                        let Some(affection) = Affection::parse(&aff) else {
                            bail!(
                                "input \"{}\", role \"{}\" of \"{}\": unknown affection class \"{aff}\" (one of high, low, neutral)",
                                ctx.inputs[1].name,
                                text(&r, "role"),
                                text(&r, "script")
                            );
                        };
                        let row = RoleRow {
                            script: text(&r, "script"),
                            main: text(&r, "main"),
                            role: text(&r, "role"),
                            affection,
                            affection_name: affection.name().to_string(),
                        };
                        let carried: Row = extra
                            .iter()
                            .map(|f| (f.name().clone(), r.get(f.name()).cloned().unwrap_or(Value::Null)))
                            .collect();
                        roles.push((row, carried));
                    }
                }
            }
        }
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let text = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let mut rows = Vec::new();
        ctx.report.rows_in = batches.iter().map(|b| b.num_rows() as u64).sum();
        for b in &batches {
            for i in 0..b.num_rows() {
                let r = data::row_json(b, i);
                let (id, claim) = (text(&r, data::ID), text(&r, &self.o.claim_column));
                if text(&r, "cf_rule") == "llm"
                    && r.get("factual_claim").and_then(Value::as_str) == Some(claim.as_str())
                {
                    let why = format!(
                        "{id}: a counterfactual left to the LLM rewrite step (cf_rule \"llm\") that no step rewrote: it still reads as the factual claim"
                    );
                    ctx.fail(
                        &id,
                        synth_core::store::failures::FailureKind::Input,
                        why,
                        Some(Value::Object(r.clone()).to_string()),
                    );
                    continue;
                }
                for (role, carried) in &roles {
                    let turn =
                        roles::render_turn(&role.role, &claim, &self.o.lang, self.o.keep_case, self.o.zh_ascii_punct);
                    let mut row = Row::from_iter([
                        (data::ID.to_string(), json!(format!("{id}/{}/{}", role.script, role.role))),
                        ("claim_id".into(), json!(id)),
                        ("claim".into(), json!(claim)),
                        ("label".into(), json!(text(&r, "label"))),
                        ("cf_rule".into(), r.get("cf_rule").cloned().unwrap_or(Value::Null)),
                        ("lang".into(), json!(self.o.lang)),
                        ("script".into(), json!(role.script)),
                        ("main".into(), json!(role.main)),
                        ("role".into(), json!(role.role)),
                        ("affection".into(), json!(role.affection_name)),
                        ("user_turn".into(), json!(turn)),
                    ]);
                    row.extend(carried.iter().map(|(k, v)| (k.clone(), v.clone())));
                    rows.push(row);
                }
            }
        }
        let schema = schema(&extra);
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        ctx.set_output(out)
    }
}
