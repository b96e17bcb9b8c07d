//! `aggregate`: collapse the samples of each record (an `llm` stage with `n > 1` writes
//! one row per sample, ids `<id>/<k>` with a `sample` column) into one row per record:
//! a numeric `column` by `mean` (self-consistency as a mean), `vote` (majority, ties to
//! the lower value), `median`, `min` or `max`; boolean flag columns counted
//! (`<name>_count`, e.g. how many samples fell back to a default score); text columns
//! collected as lists (`<name>_samples`, e.g. every raw judge answer); token counts
//! summed. Other columns are the record's (taken from its first sample). Without a
//! `sample` column each row is its own record. A record's samples must be adjacent
//! (as `llm` writes them); a record id seen twice is an error. Streams: memory holds one
//! record's samples.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const HOW: &[&str] = &["mean", "vote", "median", "min", "max"];

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("column", Ty::Str, "the numeric column to aggregate over a record's samples"),
    OptionSpec::default(
        "how",
        Ty::Enum(HOW),
        "\"mean\"",
        "mean, vote (majority; ties to the lower value), median, min, max",
    ),
    OptionSpec::optional("count", Ty::StrList, "boolean columns whose true samples are counted in <name>_count"),
    OptionSpec::optional(
        "collect",
        Ty::StrList,
        "columns whose sample values become a list <name>_samples (default: raw, when present)",
    ),
    OptionSpec::optional(
        "sum",
        Ty::StrList,
        "integer columns summed over samples (default: tokens_in, tokens_out, when present)",
    ),
    OptionSpec::optional(
        "drop",
        Ty::StrList,
        "per-sample columns left out (default: finish_reason, attempts, when present)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "aggregate",
    about: "one row per record from its samples (llm n > 1): mean / vote / median of a score, flags counted, answers collected",
    options: OPTIONS,
    example: "column = \"score\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    column: String,
    how: String,
    count: Option<Vec<String>>,
    collect: Option<Vec<String>>,
    sum: Option<Vec<String>>,
    drop: Option<Vec<String>>,
}

struct Aggregate {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    Some(Box::new(Aggregate { opts }))
}

/// How each input column is treated.
struct Layout {
    schema: SchemaRef,
    count: Vec<String>,
    collect: Vec<String>,
    sum: Vec<String>,
    /// Columns copied from the first sample.
    keep: Vec<String>,
    has_sample: bool,
}

/// Majority vote; ties go to the lower value.
pub fn vote(values: &[f64]) -> f64 {
    let mut counts: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    for v in values {
        // Order-preserving key of an f64 (no NaN here).
        let bits = v.to_bits();
        let key = if bits >> 63 == 1 { !bits } else { bits | (1 << 63) };
        counts.entry(key).or_insert((*v, 0)).1 += 1;
    }
    let best = counts.values().map(|c| c.1).max().unwrap_or(0);
    counts.values().find(|c| c.1 == best).map(|c| c.0).unwrap_or(f64::NAN)
}

/// The aggregate of `values` by `how` (`None` for no values).
pub fn aggregate(how: &str, values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(match how {
        "mean" => values.iter().sum::<f64>() / values.len() as f64,
        "vote" => vote(values),
        "median" => {
            let mut v = values.to_vec();
            v.sort_by(f64::total_cmp);
            let m = v.len() / 2;
            if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
        }
        "min" => values.iter().copied().fold(f64::INFINITY, f64::min),
        "max" => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        other => unreachable!("checked option how = {other}"),
    })
}

impl Aggregate {
    fn layout(&self, input: &Schema) -> std::result::Result<Layout, String> {
        let has = |c: &str| input.field_with_name(c).is_ok();
        let need = |c: &str, what: &str| -> std::result::Result<(), String> {
            if has(c) {
                Ok(())
            } else {
                Err(format!("no column \"{c}\" to {what} (columns: {})", data::column_list(input)))
            }
        };
        let col = &self.opts.column;
        need(col, "aggregate")?;
        if !input.field_with_name(col).map(|f| f.data_type().is_numeric()).unwrap_or(false) {
            return Err(format!("column \"{col}\" is not numeric"));
        }
        let pick =
            |given: &Option<Vec<String>>, default: &[&str], what: &str| -> std::result::Result<Vec<String>, String> {
                match given {
                    Some(list) => {
                        for c in list {
                            need(c, what)?;
                        }
                        Ok(list.clone())
                    }
                    None => Ok(default.iter().filter(|c| has(c)).map(|c| c.to_string()).collect()),
                }
            };
        let count = pick(&self.opts.count, &[], "count")?;
        for c in &count {
            if input.field_with_name(c).map(|f| f.data_type() != &DataType::Boolean).unwrap_or(true) {
                return Err(format!("column \"{c}\" to count is not boolean"));
            }
        }
        let collect = pick(&self.opts.collect, &["raw"], "collect")?;
        let sum = pick(&self.opts.sum, &["tokens_in", "tokens_out"], "sum")?;
        for c in &sum {
            if !input.field_with_name(c).map(|f| f.data_type().is_integer()).unwrap_or(false) {
                return Err(format!("column \"{c}\" to sum is not an integer column"));
            }
        }
        let drop = pick(&self.opts.drop, &["finish_reason", "attempts"], "drop")?;
        let special: Vec<&String> = std::iter::once(col).chain(&count).chain(&collect).chain(&drop).collect();
        let mut fields: Vec<Field> = Vec::new();
        let mut keep = Vec::new();
        for f in input.fields().iter().skip(1) {
            let name = f.name();
            if name == "sample" || special.contains(&name) {
                continue;
            }
            if sum.contains(name) {
                fields.push(Field::new(name, DataType::Int64, f.is_nullable()));
            } else {
                keep.push(name.clone());
                fields.push(f.as_ref().clone());
            }
        }
        fields.push(Field::new(col, DataType::Float64, true));
        fields.push(Field::new(
            format!("{col}_samples"),
            DataType::List(Arc::new(Field::new("item", DataType::Float64, true))),
            false,
        ));
        fields.push(Field::new("samples", DataType::Int64, false));
        for c in &count {
            fields.push(Field::new(format!("{c}_count"), DataType::Int64, false));
        }
        for c in &collect {
            let item = input.field_with_name(c).expect("checked").data_type().clone();
            fields.push(Field::new(
                format!("{c}_samples"),
                DataType::List(Arc::new(Field::new("item", item, true))),
                false,
            ));
        }
        for f in &fields {
            if fields.iter().filter(|g| g.name() == f.name()).count() > 1 {
                return Err(format!("the output would have two columns \"{}\"; rename one in the input", f.name()));
            }
        }
        Ok(Layout { schema: data::schema_with_id(fields), count, collect, sum, keep, has_sample: has("sample") })
    }
}

impl Layout {
    fn record(&self, opts: &Options, id: &str, samples: &[Row]) -> Row {
        let (layout, col) = (self, &opts.column);
        let values: Vec<f64> = samples.iter().filter_map(|r| r.get(col).and_then(Value::as_f64)).collect();
        let mut out = Row::new();
        out.insert(data::ID.into(), json!(id));
        for k in &layout.keep {
            out.insert(k.clone(), samples[0].get(k).cloned().unwrap_or(Value::Null));
        }
        for k in &layout.sum {
            let s: i64 = samples.iter().filter_map(|r| r.get(k).and_then(Value::as_i64)).sum();
            out.insert(k.clone(), json!(s));
        }
        out.insert(col.clone(), aggregate(&opts.how, &values).map(Value::from).unwrap_or(Value::Null));
        out.insert(
            format!("{col}_samples"),
            Value::Array(samples.iter().map(|r| r.get(col).cloned().unwrap_or(Value::Null)).collect()),
        );
        out.insert("samples".into(), json!(samples.len()));
        for c in &layout.count {
            let n = samples.iter().filter(|r| r.get(c).and_then(Value::as_bool) == Some(true)).count();
            out.insert(format!("{c}_count"), json!(n));
        }
        for c in &layout.collect {
            out.insert(
                format!("{c}_samples"),
                Value::Array(samples.iter().map(|r| r.get(c).cloned().unwrap_or(Value::Null)).collect()),
            );
        }
        out
    }
}

/// The record id of a sample row: `<id>/<k>` → `<id>` when the row has `sample = k`.
fn record_id(row: &Row) -> String {
    let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default();
    match row.get("sample").and_then(Value::as_i64) {
        Some(k) => id.strip_suffix(&format!("/{k}")).unwrap_or(id).to_string(),
        None => id.to_string(),
    }
}

#[async_trait]
impl Stage for Aggregate {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let input = ctx.input_schema(0)?;
        match self.layout(&input) {
            Ok(l) => Some(l.schema),
            Err(e) => {
                ctx.error("column", e);
                None
            }
        }
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let layout = self.layout(&ctx.inputs[0].schema).map_err(|e| anyhow!(e))?;
        let mut out = ctx.create_output(layout.schema.clone())?;
        let path = ctx.inputs[0].path.clone();
        ctx.progress.set_total(ctx.inputs[0].num_rows);
        let (progress, cancel, opts) = (ctx.progress.clone(), ctx.cancel.clone(), self.opts.clone());
        let (out, rows_in, records) = tokio::task::spawn_blocking(move || -> Result<_> {
            let reader = synth_core::store::parquet::open_reader(&path, synth_engine::stages::exec::BATCH_ROWS)?;
            let (mut rows_in, mut records) = (0u64, 0u64);
            let mut current: Option<(String, Vec<Row>)> = None;
            let mut pending: Vec<Row> = Vec::new();
            let flush = |out: &mut synth_core::store::parquet::ParquetOut, pending: &mut Vec<Row>| -> Result<()> {
                if !pending.is_empty() {
                    let batch =
                        data::rows_to_batch(&layout.schema, pending).map_err(|(i, e)| anyhow!("row {i}: {e}"))?;
                    out.write(&batch)?;
                    pending.clear();
                }
                Ok(())
            };
            for batch in reader {
                if cancel.is_cancelled() {
                    bail!(synth_engine::stages::Cancelled);
                }
                let batch = batch.with_context(|| format!("reading {}", path.display()))?;
                for i in 0..batch.num_rows() {
                    rows_in += 1;
                    let row = data::row_json(&batch, i);
                    let rid = if layout.has_sample {
                        record_id(&row)
                    } else {
                        row[data::ID].as_str().unwrap_or_default().to_string()
                    };
                    match &mut current {
                        Some((id, samples)) if *id == rid => samples.push(row),
                        _ => {
                            if let Some((id, samples)) = current.take() {
                                pending.push(layout.record(&opts, &id, &samples));
                                records += 1;
                            }
                            current = Some((rid, vec![row]));
                        }
                    }
                    if pending.len() >= 1024 {
                        flush(&mut out, &mut pending)?;
                    }
                }
                progress.inc(batch.num_rows() as u64);
            }
            if let Some((id, samples)) = current.take() {
                pending.push(layout.record(&opts, &id, &samples));
                records += 1;
            }
            flush(&mut out, &mut pending)?;
            Ok((out, rows_in, records))
        })
        .await
        .context("stage worker panicked")??;
        ctx.report.rows_in = rows_in;
        ctx.report.info.insert("records".into(), records.to_string());
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates() {
        assert_eq!(aggregate("mean", &[2.0, 2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 2.0, 2.0, 2.0]), Some(1.8));
        assert_eq!(aggregate("vote", &[1.0, 3.0, 3.0, 1.0]), Some(1.0), "ties go to the lower value");
        assert_eq!(aggregate("vote", &[4.0, 3.0, 4.0]), Some(4.0));
        assert_eq!(aggregate("vote", &[-1.0, 2.0]), Some(-1.0));
        assert_eq!(aggregate("median", &[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(aggregate("min", &[3.0, 1.0]), Some(1.0));
        assert_eq!(aggregate("max", &[3.0, 1.0]), Some(3.0));
        assert_eq!(aggregate("mean", &[]), None);
        let row = |id: &str, s: i64| Row::from_iter([("id".to_string(), json!(id)), ("sample".to_string(), json!(s))]);
        assert_eq!(record_id(&row("a/b/3", 3)), "a/b");
        assert_eq!(record_id(&row("x/1", 2)), "x/1");
    }
}
