//! `join`: combine two inputs on key columns (inner or left). The right input is
//! held in memory and indexed; the left one streams. Output ids are the left ids
//! when right keys are unique, else `left_id+right_id` for every row.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array, UInt64Array};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, ID};
use synth_core::store::parquet::{open_reader, read_all};
use synth_engine::stages::exec::BATCH_ROWS;
use synth_engine::stages::{Arity, BuildCtx, Cancelled, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("on", Ty::Str, "key column present in both inputs (default \"id\")"),
    OptionSpec::optional("left_on", Ty::Str, "key column of the first input"),
    OptionSpec::optional("right_on", Ty::Str, "key column of the second input"),
    OptionSpec::default(
        "how",
        Ty::Enum(&["inner", "left"]),
        "\"inner\"",
        "inner: matched rows only; left: every left row",
    ),
    OptionSpec::default("suffix", Ty::Str, "\"_right\"", "suffix for right columns whose names clash with left ones"),
];

pub static KIND: KindInfo = KindInfo {
    name: "join",
    about: "join two inputs on key columns (inner or left)",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    example: "on = \"id\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    on: Option<String>,
    left_on: Option<String>,
    right_on: Option<String>,
    how: String,
    suffix: String,
}

struct Join {
    left_on: String,
    right_on: String,
    left_join: bool,
    suffix: String,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    if opts.on.is_some() && (opts.left_on.is_some() || opts.right_on.is_some()) {
        ctx.error(diags, "on", "give \"on\" or \"left_on\"/\"right_on\", not both");
    }
    let on = opts.on.clone().unwrap_or_else(|| ID.to_string());
    Some(Box::new(Join {
        left_on: opts.left_on.clone().unwrap_or_else(|| on.clone()),
        right_on: opts.right_on.clone().unwrap_or(on),
        left_join: opts.how == "left",
        suffix: opts.suffix,
    }))
}

impl Join {
    /// Output schema and, for each right column kept, its index in the right schema.
    fn output(&self, left: &Schema, right: &Schema) -> std::result::Result<(Schema, Vec<usize>), String> {
        let mut fields: Vec<Field> = left.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut right_cols = Vec::new();
        for (j, f) in right.fields().iter().enumerate() {
            if f.name() == ID || (f.name() == &self.right_on && self.right_on == self.left_on) {
                continue;
            }
            let mut name = f.name().clone();
            if fields.iter().any(|g| g.name() == &name) {
                name = format!("{name}{}", self.suffix);
                if fields.iter().any(|g| g.name() == &name) {
                    return Err(format!("column \"{name}\" exists on both sides even with the suffix"));
                }
            }
            fields.push(Field::new(name, f.data_type().clone(), true));
            right_cols.push(j);
        }
        Ok((Schema::new(fields), right_cols))
    }
}

fn key_strings(batch: &RecordBatch, col: &str, side: &str) -> Result<StringArray> {
    let idx = batch.schema().index_of(col).map_err(|_| {
        anyhow!("{side} input has no column \"{col}\" (columns: {})", data::column_list(&batch.schema()))
    })?;
    let arr = synth_core::data::arrow::compute::cast(batch.column(idx), &DataType::Utf8)
        .with_context(|| format!("key column \"{col}\" cannot be compared as text"))?;
    Ok(arr.as_any().downcast_ref::<StringArray>().expect("utf8").clone())
}

#[async_trait]
impl Stage for Join {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let key_opt = if self.left_on == self.right_on { "on" } else { "left_on" };
        ctx.require_columns(key_opt, 0, [self.left_on.as_str()]);
        let key_opt = if self.left_on == self.right_on { "on" } else { "right_on" };
        ctx.require_columns(key_opt, 1, [self.right_on.as_str()]);
        let (left, right) = (ctx.input_schema(0)?, ctx.input_schema(1)?);
        match self.output(&left, &right) {
            Ok((s, _)) => Some(Arc::new(s)),
            Err(msg) => {
                ctx.error("suffix", msg);
                None
            }
        }
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (left, right) = (ctx.inputs[0].clone(), ctx.inputs[1].clone());
        let (schema, right_cols) = self.output(&left.schema, &right.schema).map_err(|m| anyhow!(m))?;
        let schema = Arc::new(schema);
        let mut out = ctx.create_output(schema.clone())?;
        let (cancel, progress) = (ctx.cancel.clone(), ctx.progress.clone());
        progress.set_total(left.num_rows);
        let (left_on, right_on, left_join) = (self.left_on.clone(), self.right_on.clone(), self.left_join);
        let (out, rows_in) = tokio::task::spawn_blocking(move || -> Result<_> {
            let (rschema, rbatches) = read_all(&right.path)?;
            let right_all = synth_core::data::arrow::compute::concat_batches(&rschema, &rbatches)?;
            let rkeys = key_strings(&right_all, &right_on, "second")?;
            let mut index: HashMap<&str, Vec<u64>> = HashMap::new();
            for i in 0..rkeys.len() {
                if rkeys.is_valid(i) {
                    index.entry(rkeys.value(i)).or_default().push(i as u64);
                }
            }
            let unique = index.values().all(|v| v.len() == 1);
            let rids = data::ids(&right_all).clone();
            let mut rows_in = 0u64;
            for batch in open_reader(&left.path, BATCH_ROWS)? {
                if cancel.is_cancelled() {
                    bail!(Cancelled);
                }
                let batch = batch?;
                let lkeys = key_strings(&batch, &left_on, "first")?;
                let lids = data::ids(&batch);
                let mut lidx: Vec<u32> = Vec::new();
                let mut ridx: Vec<Option<u64>> = Vec::new();
                for i in 0..batch.num_rows() {
                    let hits = if lkeys.is_valid(i) { index.get(lkeys.value(i)) } else { None };
                    match hits {
                        Some(h) => {
                            for r in h {
                                lidx.push(i as u32);
                                ridx.push(Some(*r));
                            }
                        }
                        None if left_join => {
                            lidx.push(i as u32);
                            ridx.push(None);
                        }
                        None => {}
                    }
                }
                let lidx = UInt32Array::from(lidx);
                let ridx = UInt64Array::from(ridx);
                let mut cols: Vec<ArrayRef> = batch
                    .columns()
                    .iter()
                    .map(|c| synth_core::data::arrow::compute::take(c.as_ref(), &lidx, None))
                    .collect::<Result<_, _>>()?;
                if !unique {
                    let ids: StringArray = lidx
                        .values()
                        .iter()
                        .zip(ridx.iter())
                        .map(|(l, r)| {
                            let l = lids.value(*l as usize);
                            Some(match r {
                                Some(r) => format!("{l}+{}", rids.value(r as usize)),
                                None => l.to_string(),
                            })
                        })
                        .collect();
                    cols[0] = Arc::new(ids);
                }
                for j in &right_cols {
                    cols.push(synth_core::data::arrow::compute::take(right_all.column(*j).as_ref(), &ridx, None)?);
                }
                out.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
                rows_in += batch.num_rows() as u64;
                progress.inc(batch.num_rows() as u64);
            }
            Ok((out, rows_in))
        })
        .await
        .context("join worker panicked")??;
        ctx.report.rows_in = rows_in;
        ctx.set_output(out)
    }
}
