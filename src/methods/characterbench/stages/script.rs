//! `characterbench_script` (construction): a planned query becomes a test script, a record
//! of the release layout (`characterbench::build::record`: the dialogue context, the query
//! as the last user turn, the target at its dimension's path, human scores null) in
//! `record` (JSON), and the same row the release reader gives for it (read back through
//! `characterbench::release::item`, so a script is normalized and judged exactly as an
//! official record). Record ids count from `first_id` per dimension, in input order. A
//! script the release rules reject (an empty query, a missing target) goes to the failure
//! table with the field at fault.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::release::{item_row, output_schema as release_schema};
use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use crate::build::{self, Script, Turn};
use crate::release;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty, UINT};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("dimensions", Ty::File, DEFAULT_DIMENSIONS, "the benchmark definition (target paths)"),
    OptionSpec::default("query_column", Ty::Str, "\"query\"", "the user's query"),
    OptionSpec::default(
        "target_column",
        Ty::Str,
        "\"target\"",
        "the extracted target (null: the plan's given_target, or none)",
    ),
    OptionSpec::default(
        "model_column",
        Ty::Str,
        "\"model\"",
        "the model that wrote the query (messages.model of the record)",
    ),
    OptionSpec::default("first_id", UINT, "1", "the first record id of each dimension"),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_script",
    about: "construction: a planned query as a test script in the release's record layout (record JSON) and as the release reader's row",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    dimensions: String,
    query_column: String,
    target_column: String,
    model_column: String,
    first_id: i64,
}

struct ScriptStage {
    opts: Options,
    bench: Bench,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    Some(Box::new(ScriptStage { opts, bench }))
}

/// The release reader's columns plus the script's record and plan id.
pub fn output_schema() -> SchemaRef {
    let release = release_schema();
    let fields = release
        .fields()
        .iter()
        .skip(1)
        .map(|f| f.as_ref().clone())
        .chain([Field::new("script_id", DataType::Utf8, false), Field::new("record", DataType::Utf8, false)]);
    data::schema_with_id(fields)
}

impl ScriptStage {
    fn script(&self, row: &Row, id: i64) -> std::result::Result<(Row, Value), (String, String)> {
        let text = |k: &str| row.get(k).and_then(Value::as_str);
        let bad = |f: &str, m: &str| (f.to_string(), m.to_string());
        let dim_id = text("dimension").ok_or_else(|| bad("dimension", "missing"))?;
        let dim = self.bench.dimension(dim_id).ok_or_else(|| bad("dimension", "not in the definition"))?;
        let lang = text("lang").ok_or_else(|| bad("lang", "missing"))?;
        let context: Vec<Turn> = serde_json::from_str::<Vec<Value>>(text("context").unwrap_or("[]"))
            .map_err(|e| bad("context", &format!("not a JSON list of turns: {e}")))?
            .iter()
            .map(|t| Turn {
                speaker: t["speaker"].as_str().unwrap_or_default().to_string(),
                utterance: t["utterance"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        let query = text(&self.opts.query_column).map(str::trim).filter(|q| !q.is_empty());
        let query = query.ok_or_else(|| bad(&self.opts.query_column, "no query"))?;
        let target =
            text(&self.opts.target_column).or_else(|| text("given_target")).map(str::trim).filter(|t| !t.is_empty());
        if dim.target.is_some() && target.is_none() {
            return Err(bad(&self.opts.target_column, &format!("{} needs a target", dim.id)));
        }
        let script = Script {
            id,
            lang,
            character_name: text("character_name").unwrap_or_default(),
            character_profile: text("character_profile").unwrap_or_default(),
            user_name: text("user_name"),
            user_profile: text("user_profile"),
            greeting: text("greeting"),
            context: &context,
            query,
            target,
            generator: text(&self.opts.model_column).unwrap_or("synth"),
        };
        let record = build::record(dim, &script);
        let item = release::item(record.as_object().expect("an object"), dim, &self.bench, lang, &id.to_string(), 0)?;
        let mut out = item_row(&item, &self.bench, "");
        out.insert("script_id".into(), json!(row.get(data::ID).and_then(Value::as_str).unwrap_or_default()));
        out.insert("record".into(), json!(record.to_string()));
        Ok((out, record))
    }
}

#[async_trait]
impl Stage for ScriptStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns(
            "inputs",
            0,
            ["dimension", "lang", "context", "character_name", "character_profile", self.opts.query_column.as_str()],
        );
        ctx.files.extend(self.bench.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let mut next: BTreeMap<String, i64> = BTreeMap::new();
        let mut rows = Vec::new();
        let mut n = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                let dim = row.get("dimension").and_then(Value::as_str).unwrap_or_default().to_string();
                let id = *next.entry(dim).or_insert(self.opts.first_id);
                match self.script(&row, id) {
                    Ok((out, _)) => {
                        *next.get_mut(row["dimension"].as_str().unwrap_or_default()).expect("entry") += 1;
                        rows.push(out);
                    }
                    Err((field, why)) => {
                        let rid = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        ctx.fail(
                            &rid,
                            FailureKind::BadRecord,
                            format!("script {rid}: field \"{field}\": {why}"),
                            serde_json::to_string(&row).ok(),
                        );
                    }
                }
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
