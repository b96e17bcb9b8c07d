//! `sharp_vote`: self-consistency for stance detection. The stance stage asks `n` times
//! (`llm` with `n > 1`: rows `<id>/<k>` with a `sample` column, consecutive per record);
//! this stage gives one row per record, id `<id>`, with the majority stance and how the
//! samples voted (`votes`, e.g. `FAVOR:2 AGAINST:1`; `agreement`, the winning share).
//! Samples without a stance (the parser's `unparsed = "keep"`) do not vote; a record none
//! of whose samples has one keeps a null stance, which `sharp_metrics` counts as unparsed.
//! Ties follow `tie` ([R]). The other columns are the first sample's.

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::metrics::{Stance, Tie, vote};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("stance_column", Ty::Str, "\"stance\"", "the samples' stance column"),
    OptionSpec::default(
        "tie",
        Ty::Enum(&["neutral", "first", "none"]),
        "\"neutral\"",
        "[R] no single most frequent stance: NEUTRAL (the samples disagree), the earliest tied sample's, or none (unparsed)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_vote",
    about: "self-consistency: the majority stance over an llm stage's n samples per record (votes, agreement)",
    options: OPTIONS,
    example: "tie = \"neutral\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    stance_column: String,
    tie: String,
}

struct VoteStage {
    o: Options,
    tie: Tie,
    choices: Map<String, Value>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let tie = match o.tie.as_str() {
        "first" => Tie::First,
        "none" => Tie::None,
        _ => Tie::Neutral,
    };
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    Some(Box::new(VoteStage { o, tie, choices }))
}

fn output(input: &SchemaRef, stance: &str) -> SchemaRef {
    let fields = input.fields().iter().skip(1).filter(|f| f.name() != "sample").map(|f| {
        let f = f.as_ref().clone();
        if f.name() == stance { f.with_nullable(true) } else { f }
    });
    data::schema_with_id(fields.chain([
        Field::new("votes", DataType::Utf8, false),
        Field::new("samples", DataType::UInt64, false),
        Field::new("agreement", DataType::Float64, true),
    ]))
}

/// The base id of a sample row (`<id>/<k>` → `<id>`).
fn base_id(id: &str, sample: Option<i64>) -> String {
    match sample {
        Some(k) => id.strip_suffix(&format!("/{k}")).unwrap_or(id).to_string(),
        None => id.to_string(),
    }
}

#[async_trait]
impl Stage for VoteStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, [self.o.stance_column.as_str(), "sample"]);
        for c in ["votes", "samples", "agreement"] {
            if ctx.input_schema(0).is_some_and(|s| s.field_with_name(c).is_ok()) {
                ctx.error("inputs", format!("the input has a column \"{c}\" already"));
            }
        }
        let input = ctx.input_schema(0)?;
        Some(output(&input, &self.o.stance_column))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (schema_in, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let schema = output(&schema_in, &self.o.stance_column);
        let col = self.o.stance_column.as_str();
        let mut rows: Vec<Row> = Vec::new();
        let mut group: Vec<Row> = Vec::new();
        let mut key = String::new();
        let (mut ties, mut n_in) = (0u64, 0u64);
        let mut flush = |group: &mut Vec<Row>, rows: &mut Vec<Row>, key: &str| {
            if group.is_empty() {
                return;
            }
            let stances: Vec<Option<Stance>> =
                group.iter().map(|r| r.get(col).and_then(Value::as_str).and_then(Stance::parse)).collect();
            let won = vote(&stances, self.tie);
            let mut tally: Vec<(Stance, usize)> = [Stance::Favor, Stance::Against, Stance::Neutral]
                .into_iter()
                .map(|s| (s, stances.iter().filter(|x| **x == Some(s)).count()))
                .filter(|(_, n)| *n > 0)
                .collect();
            tally.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
            let top = tally.first().map_or(0, |t| t.1);
            ties += u64::from(tally.iter().filter(|t| t.1 == top).count() > 1);
            let voted: usize = tally.iter().map(|t| t.1).sum();
            let mut row = std::mem::take(&mut group[0]);
            row.remove("sample");
            row.insert(data::ID.into(), json!(key));
            row.insert(col.into(), won.map(|s| json!(s.name())).unwrap_or(Value::Null));
            let votes: Vec<String> = tally.iter().map(|(s, n)| format!("{}:{n}", s.name())).collect();
            row.insert("votes".into(), json!(votes.join(" ")));
            row.insert("samples".into(), json!(voted));
            let agreement = won
                .filter(|_| voted > 0)
                .map(|w| stances.iter().filter(|x| **x == Some(w)).count() as f64 / voted as f64);
            row.insert("agreement".into(), agreement.map(|a| json!(a)).unwrap_or(Value::Null));
            rows.push(row);
            group.clear();
        };
        for b in &batches {
            for i in 0..b.num_rows() {
                n_in += 1;
                let r = data::row_json(b, i);
                let id = r.get(data::ID).and_then(Value::as_str).unwrap_or_default();
                let k = base_id(id, r.get("sample").and_then(Value::as_i64));
                if k != key {
                    flush(&mut group, &mut rows, &key);
                    key = k;
                }
                group.push(r);
            }
        }
        flush(&mut group, &mut rows, &key);
        ctx.report.rows_in = n_in;
        ctx.report.metrics.insert("ties".into(), ties as f64);
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sample_ids_lose_their_suffix() {
        assert_eq!(super::base_id("c/HP/Ron/2", Some(2)), "c/HP/Ron");
        assert_eq!(super::base_id("c/HP/Ron", None), "c/HP/Ron");
        assert_eq!(super::base_id("x/1", Some(2)), "x/1");
    }
}
