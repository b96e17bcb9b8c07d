//! `sharp_turns`: every role of the roles file puts every claim to its script's main
//! character (spec §2 `sh_cross` + `sh_render_turn`, the full grid): one record per
//! (claim, script, role), id `<claim id>/<script>/<role>`, with the Appendix-B turn in
//! `user_turn`. A bad roles file stops the stage naming `file:line`.

use anyhow::{Result, anyhow};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::methods::sharp::roles::{self, RoleRow};
use crate::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("roles", Ty::File, "roles file: tab-separated script, main, role, affection (high / low / neutral)"),
    OptionSpec::default("lang", Ty::Enum(&["en", "zh"]), "\"en\"", "language of the turn template"),
    OptionSpec::default("keep_case", Ty::Bool, "false", "[R] keep an English claim's first letter (default: lower-cased unless an acronym)"),
    OptionSpec::default("zh_ascii_punct", Ty::Bool, "false", "[R] ASCII `:`, `,`, `?` in the zh turn (the extracted paper text's form)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_turns",
    version: 1,
    about: "claims × roles (full grid): each role puts each claim to the main character, Appendix B's turn in user_turn",
    role: Role::Transform,
    arity: Arity::Exactly(1),
    options: OPTIONS,
    uses_seed: false,
    summary: false,
    example: "roles = \"seeds/sharp/roles.tsv\"",
    build,
};

#[derive(Deserialize)]
struct Options {
    roles: String,
    lang: String,
    keep_case: bool,
    zh_ascii_punct: bool,
}

struct TurnsStage {
    roles: Vec<RoleRow>,
    o: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let path = ctx.root.join(&o.roles);
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|t| roles::parse_roles(&t, &o.roles));
    match parsed {
        Ok(roles) => Some(Box::new(TurnsStage { roles, o })),
        Err(e) => {
            ctx.error(diags, "roles", e);
            None
        }
    }
}

pub fn output_schema() -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    data::schema_with_id([
        s("claim_id", false),
        s("claim", false),
        s("label", false),
        s("cf_rule", true),
        s("script", false),
        s("main", false),
        s("role", false),
        s("affection", false),
        s("user_turn", false),
    ])
}

#[async_trait]
impl Stage for TurnsStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["claim", "label"]);
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (_, batches) = crate::store::parquet::read_all(&ctx.inputs[0].path)?;
        let text = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let mut rows = Vec::new();
        ctx.report.rows_in = batches.iter().map(|b| b.num_rows() as u64).sum();
        for b in &batches {
            for i in 0..b.num_rows() {
                let r = data::row_json(b, i);
                let (id, claim) = (text(&r, data::ID), text(&r, "claim"));
                for role in &self.roles {
                    let turn = roles::render_turn(&role.role, &claim, &self.o.lang, self.o.keep_case, self.o.zh_ascii_punct);
                    rows.push(Row::from_iter([
                        (data::ID.to_string(), json!(format!("{id}/{}/{}", role.script, role.role))),
                        ("claim_id".into(), json!(id)),
                        ("claim".into(), json!(claim)),
                        ("label".into(), json!(text(&r, "label"))),
                        ("cf_rule".into(), r.get("cf_rule").cloned().unwrap_or(Value::Null)),
                        ("script".into(), json!(role.script)),
                        ("main".into(), json!(role.main)),
                        ("role".into(), json!(role.role)),
                        ("affection".into(), json!(role.affection_name)),
                        ("user_turn".into(), json!(turn)),
                    ]));
                }
            }
        }
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.set_output(out)
    }
}
