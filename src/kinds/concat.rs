//! `concat`: the records of several inputs one after another (inputs in the
//! declared order). Columns are united by name; a column missing from an input is
//! null there; the same column with different types is an error.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{ArrayRef, RecordBatch, StringArray, new_null_array};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::parquet::open_reader;
use synth_engine::stages::exec::BATCH_ROWS;
use synth_engine::stages::{Arity, BuildCtx, Cancelled, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("tag_column", Ty::Str, "add a column holding the name of the input each record came from"),
    OptionSpec::default(
        "prefix_ids",
        Ty::Bool,
        "false",
        "prefix ids with the input name (\"input/id\") to keep them unique",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "concat",
    about: "records of several inputs one after another, columns united by name",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    tag_column: Option<String>,
    prefix_ids: bool,
}

struct Concat {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Concat { opts: ctx.parse(diags)? }))
}

/// United schema of the inputs, or a message naming the conflicting column.
fn unite(inputs: &[(String, SchemaRef)], tag: Option<&str>) -> std::result::Result<Schema, String> {
    let mut fields: Vec<Field> = vec![data::id_field()];
    let mut origin: Vec<String> = vec![String::new()];
    for (name, schema) in inputs {
        for f in schema.fields().iter().skip(1) {
            match fields.iter().position(|g| g.name() == f.name()) {
                Some(i) if fields[i].data_type() == f.data_type() || f.data_type() == &DataType::Null => {}
                Some(i) if fields[i].data_type() == &DataType::Null => {
                    fields[i] = f.as_ref().clone().with_nullable(true)
                }
                Some(i) => {
                    return Err(format!(
                        "column \"{}\" is {} in \"{}\" but {} in \"{name}\"",
                        f.name(),
                        data::type_display(fields[i].data_type()),
                        origin[i],
                        data::type_display(f.data_type())
                    ));
                }
                None => {
                    fields.push(f.as_ref().clone().with_nullable(true));
                    origin.push(name.clone());
                }
            }
        }
    }
    if let Some(tag) = tag {
        if fields.iter().any(|f| f.name() == tag) {
            return Err(format!("tag_column \"{tag}\" already exists in an input"));
        }
        fields.push(Field::new(tag, DataType::Utf8, false));
    }
    Ok(Schema::new(fields))
}

#[async_trait]
impl Stage for Concat {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let inputs: Option<Vec<(String, SchemaRef)>> =
            ctx.inputs.iter().map(|i| i.schema.clone().map(|s| (i.name.clone(), s))).collect();
        match unite(&inputs?, self.opts.tag_column.as_deref()) {
            Ok(s) => Some(Arc::new(s)),
            Err(msg) => {
                ctx.error("inputs", msg);
                None
            }
        }
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let inputs: Vec<(String, SchemaRef)> = ctx.inputs.iter().map(|i| (i.name.clone(), i.schema.clone())).collect();
        let schema = Arc::new(unite(&inputs, self.opts.tag_column.as_deref()).map_err(|m| anyhow::anyhow!(m))?);
        let mut out = ctx.create_output(schema.clone())?;
        let paths: Vec<(String, std::path::PathBuf)> =
            ctx.inputs.iter().map(|i| (i.name.clone(), i.path.clone())).collect();
        ctx.progress.set_total(ctx.inputs.iter().map(|i| i.num_rows).sum());
        let (cancel, progress) = (ctx.cancel.clone(), ctx.progress.clone());
        let tag = self.opts.tag_column.is_some();
        let prefix = self.opts.prefix_ids;
        let (out, rows_in) = tokio::task::spawn_blocking(move || -> Result<_> {
            let mut rows_in = 0u64;
            for (name, path) in paths {
                for batch in open_reader(&path, BATCH_ROWS)? {
                    if cancel.is_cancelled() {
                        bail!(Cancelled);
                    }
                    let batch = batch.with_context(|| format!("reading {}", path.display()))?;
                    let n = batch.num_rows();
                    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
                    for (i, f) in schema.fields().iter().enumerate() {
                        let col: ArrayRef = if i == 0 && prefix {
                            Arc::new(StringArray::from_iter_values(
                                data::ids(&batch).iter().map(|id| format!("{name}/{}", id.unwrap_or_default())),
                            ))
                        } else if tag && i == schema.fields().len() - 1 {
                            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(name.as_str(), n)))
                        } else {
                            match batch.schema().index_of(f.name()) {
                                Ok(j) => batch.column(j).clone(),
                                Err(_) => new_null_array(f.data_type(), n),
                            }
                        };
                        cols.push(col);
                    }
                    out.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
                    rows_in += n as u64;
                    progress.inc(n as u64);
                }
            }
            Ok((out, rows_in))
        })
        .await
        .context("concat worker panicked")??;
        ctx.report.rows_in = rows_in;
        ctx.set_output(out)
    }
}
