//! `jsonl` sink: export an input as JSON Lines, one object per record with keys in
//! column order; nested lists and structs become JSON arrays and objects (how
//! official dataset layouts such as `{"conversations": [...]}` are written). Paths are relative to the output
//! directory.

use std::io::{BufWriter, Write};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::datatypes::SchemaRef;

use super::parquet::export_columns;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::failures::FailureKind;
use synth_core::store::parquet::open_reader;
use synth_engine::stages::exec::BATCH_ROWS;
use synth_engine::stages::{BuildCtx, Cancelled, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("path", Ty::OutPath, "output file, relative to the output directory (default: <stage>.jsonl)"),
    OptionSpec::optional("columns", Ty::List(&Ty::Str), "columns to write, in this order (default: all)"),
    OptionSpec::default("include_id", Ty::Bool, "true", "write the record id as \"id\""),
    OptionSpec::optional("json_columns", Ty::List(&Ty::Str), "text columns holding JSON, written as JSON values"),
];

pub static KIND: KindInfo = KindInfo {
    name: "jsonl",
    about: "sink: write an input as JSON Lines",
    role: Role::Sink,
    options: OPTIONS,
    example: "path = \"out.jsonl\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: Option<String>,
    columns: Option<Vec<String>>,
    include_id: bool,
    json_columns: Option<Vec<String>>,
}

struct JsonlSink {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(JsonlSink { opts: ctx.parse(diags)? }))
}

#[async_trait]
impl Stage for JsonlSink {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if let Some(cols) = &self.opts.columns {
            ctx.require_columns("columns", 0, cols.iter().map(String::as_str));
        }
        if let Some(cols) = &self.opts.json_columns {
            ctx.require_columns("json_columns", 0, cols.iter().map(String::as_str));
        }
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input = ctx.inputs[0].clone();
        let idx = export_columns(&input.schema, self.opts.columns.as_deref(), self.opts.include_id)?;
        let json_cols = self.opts.json_columns.clone().unwrap_or_default();
        let rel = self.opts.path.clone().unwrap_or_else(|| format!("{}.jsonl", ctx.name));
        let dest = ctx.out_dir.join(rel);
        let (file, pending) = create_tmp(&dest)?;
        let (cancel, progress) = (ctx.cancel.clone(), ctx.progress.clone());
        progress.set_total(input.num_rows);
        let failures = ctx.failures.clone();
        let (pending, rows) = tokio::task::spawn_blocking(move || -> Result<_> {
            let mut w = BufWriter::with_capacity(1 << 20, file);
            let mut rows = 0u64;
            for batch in open_reader(&input.path, BATCH_ROWS)? {
                if cancel.is_cancelled() {
                    bail!(Cancelled);
                }
                let batch = batch?;
                let ids = data::ids(&batch).clone();
                let batch = batch.project(&idx)?;
                for i in 0..batch.num_rows() {
                    let mut row = data::row_json(&batch, i);
                    let mut bad = None;
                    for c in &json_cols {
                        if let Some(serde_json::Value::String(text)) = row.get(c) {
                            match serde_json::from_str(text) {
                                Ok(v) => {
                                    row.insert(c.clone(), v);
                                }
                                Err(e) => bad = Some(format!("column \"{c}\" is not valid JSON: {e}")),
                            }
                        }
                    }
                    if let Some(msg) = bad {
                        failures.record(ids.value(i), FailureKind::Export, msg, None);
                        continue;
                    }
                    serde_json::to_writer(&mut w, &row)?;
                    w.write_all(b"\n").with_context(|| format!("writing {}", pending.tmp.display()))?;
                    rows += 1;
                }
                progress.inc(batch.num_rows() as u64);
            }
            let file = w
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", pending.tmp.display()))?;
            finish_file(file, &pending)?;
            Ok((pending, rows))
        })
        .await
        .context("jsonl sink panicked")??;
        ctx.report.rows_in = input.num_rows;
        ctx.report.rows_out = rows;
        ctx.add_artifact(pending, Some(rows));
        Ok(())
    }
}
