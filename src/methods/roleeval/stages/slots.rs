//! `roleeval_slots`: the questions to draft for each character (one record per
//! slot, id `<character>/<slot>`): 17 basic-knowledge + 3 multi-hop reasoning by
//! default, the knowledge types (attribute, relationship, experience) and reasoning
//! types (character relationship, event participant, timeline) in turn, some
//! knowledge questions in the negation and non-occurrence formats
//! (`roleeval::build::slots`; the counts per format are reconstructed).

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::build::{self, Slot, SlotCounts};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty, UINT};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("knowledge", UINT, "17", "basic-knowledge questions per character (paper: 17)"),
    OptionSpec::default("reasoning", UINT, "3", "multi-hop reasoning questions per character (paper: 3, one per type)"),
    OptionSpec::default("negation", UINT, "2", "knowledge questions in the negation format (reconstructed count)"),
    OptionSpec::default(
        "non_occurrence",
        UINT,
        "1",
        "knowledge questions in the non-occurrence format (reconstructed count)",
    ),
    OptionSpec::default("character_column", Ty::Str, "\"char_id\"", "column identifying the character"),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_slots",
    about: "RoleEval construction: the question slots of each character (17 knowledge + 3 reasoning, types and formats)",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    knowledge: usize,
    reasoning: usize,
    negation: usize,
    non_occurrence: usize,
    character_column: String,
}

struct Slots {
    slots: Vec<Slot>,
    column: String,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let counts = SlotCounts {
        knowledge: o.knowledge,
        reasoning: o.reasoning,
        negation: o.negation,
        non_occurrence: o.non_occurrence,
    };
    match build::slots(&counts) {
        Ok(slots) => Some(Box::new(Slots { slots, column: o.character_column })),
        Err(e) => {
            ctx.error(diags, "negation", e);
            None
        }
    }
}

const ADDED: [&str; 3] = ["kind", "qtype", "format"];

fn schema(input: &SchemaRef) -> SchemaRef {
    let kept = input.fields().iter().skip(1).filter(|f| !ADDED.contains(&f.name().as_str()) && f.name() != "slot");
    data::schema_with_id(
        kept.map(|f| f.as_ref().clone())
            .chain([Field::new("slot", DataType::Int64, false)])
            .chain(ADDED.iter().map(|n| Field::new(*n, DataType::Utf8, false))),
    )
}

#[async_trait]
impl Stage for Slots {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("character_column", 0, [self.column.as_str()]);
        Some(schema(&ctx.input_schema(0)?))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = schema(&ctx.inputs[0].schema);
        let mut out = ctx.create_output(schema.clone())?;
        let reader = synth_core::store::parquet::open_reader(&ctx.inputs[0].path, 256)?;
        let mut n = 0u64;
        for batch in reader {
            let b = batch?;
            let mut rows = Vec::new();
            for i in 0..b.num_rows() {
                n += 1;
                let r = data::row_json(&b, i);
                let character = match r.get(&self.column) {
                    Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
                    Some(Value::Number(x)) => x.to_string(),
                    _ => {
                        let id = r.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        ctx.fail(&id, FailureKind::Input, format!("no \"{}\"", self.column), None);
                        continue;
                    }
                };
                for s in &self.slots {
                    let mut row: Row = r.clone();
                    row.insert(data::ID.into(), json!(format!("{character}/{:02}", s.index)));
                    row.insert("slot".into(), json!(s.index));
                    row.insert("kind".into(), json!(s.kind));
                    row.insert("qtype".into(), json!(s.qtype));
                    row.insert("format".into(), json!(s.format));
                    rows.push(row);
                }
            }
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = n;
        ctx.set_output(out)
    }
}
