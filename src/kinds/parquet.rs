//! `parquet` sink: export an input as a Parquet file (zstd), optionally selecting
//! and ordering columns. Paths are relative to the run's output directory.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::RecordBatch;
use synth_core::data::arrow::datatypes::{Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::parquet::{ParquetOut, open_reader};
use synth_engine::stages::exec::BATCH_ROWS;
use synth_engine::stages::{BuildCtx, Cancelled, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional(
        "path",
        Ty::OutPath,
        "output file, relative to the output directory (default: <stage>.parquet)",
    ),
    OptionSpec::optional("columns", Ty::List(&Ty::Str), "columns to write, in this order (default: all)"),
    OptionSpec::default("include_id", Ty::Bool, "true", "write the record id column"),
];

pub static KIND: KindInfo = KindInfo {
    name: "parquet",
    about: "sink: write an input as a Parquet file",
    role: Role::Sink,
    options: OPTIONS,
    example: "path = \"out.parquet\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: Option<String>,
    columns: Option<Vec<String>>,
    include_id: bool,
}

struct ParquetSink {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(ParquetSink { opts: ctx.parse(diags)? }))
}

/// Indices of the columns to export (shared with the JSONL sink).
pub fn export_columns(schema: &Schema, columns: Option<&[String]>, include_id: bool) -> Result<Vec<usize>> {
    let mut idx = Vec::new();
    if include_id {
        idx.push(0);
    }
    match columns {
        Some(cols) => {
            for c in cols.iter().filter(|c| !(include_id && *c == data::ID)) {
                idx.push(
                    schema
                        .index_of(c)
                        .map_err(|_| anyhow!("no column \"{c}\" to export (columns: {})", data::column_list(schema)))?,
                );
            }
        }
        None => idx.extend(1..schema.fields().len()),
    }
    Ok(idx)
}

#[async_trait]
impl Stage for ParquetSink {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if let Some(cols) = &self.opts.columns {
            ctx.require_columns("columns", 0, cols.iter().map(String::as_str));
        }
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input = ctx.inputs[0].clone();
        let idx = export_columns(&input.schema, self.opts.columns.as_deref(), self.opts.include_id)?;
        let schema = Arc::new(input.schema.project(&idx)?);
        let rel = self.opts.path.clone().unwrap_or_else(|| format!("{}.parquet", ctx.name));
        let dest = ctx.out_dir.join(rel);
        let mut out = ParquetOut::create(&dest, schema.clone(), ctx.footer_meta(), false)?;
        let (cancel, progress) = (ctx.cancel.clone(), ctx.progress.clone());
        progress.set_total(input.num_rows);
        let out = tokio::task::spawn_blocking(move || -> Result<ParquetOut> {
            for batch in open_reader(&input.path, BATCH_ROWS)? {
                if cancel.is_cancelled() {
                    bail!(Cancelled);
                }
                let batch: RecordBatch = batch?.project(&idx)?;
                out.write(&batch)?;
                progress.inc(batch.num_rows() as u64);
            }
            Ok(out)
        })
        .await
        .context("parquet sink panicked")??;
        let (pending, rows) = out.finish()?;
        ctx.report.rows_in = rows;
        ctx.report.rows_out = rows;
        ctx.add_artifact(pending, Some(rows));
        Ok(())
    }
}
