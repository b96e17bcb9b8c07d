//! `synth cache stats|gc|export`: the size and hit rate of an output directory's
//! LLM/embedding cache and its entries per model; removal of entries no current
//! stage of the pipeline refers to; export to Parquet.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use synth_core::data::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema};
use tokio_util::sync::CancellationToken;

use super::args::CacheCommand;
use super::common::{EXIT_OK, EXIT_RUNTIME};
use synth_core::progress::{Mode, ProgressHub};
use synth_core::store::cache::admin;
use synth_core::store::state::StageState;
use synth_runner::dag::runner::{RunOptions, run as run_pipeline};

pub fn run(cmd: CacheCommand) -> i32 {
    let result = match cmd {
        CacheCommand::Stats { output_dir, json } => stats(&output_dir, json),
        CacheCommand::Gc { pipeline, out, dry_run } => gc(&pipeline, out.as_deref(), dry_run),
        CacheCommand::Export { output_dir, out } => export(&output_dir, &out),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(code) => code,
    }
}

fn fail(e: anyhow::Error) -> i32 {
    eprintln!("error: {e:#}");
    EXIT_RUNTIME
}

fn stats(dir: &Path, json: bool) -> Result<(), i32> {
    let s = admin::stats(&dir.join(synth_core::store::state::INTERNAL_DIR)).map_err(fail)?;
    if json {
        println!("{}", serde_json::to_string(&s).map_err(|e| fail(e.into()))?);
        return Ok(());
    }
    println!("cache {} ({:.1} MiB)", s.path, s.bytes as f64 / (1024.0 * 1024.0));
    println!(
        "  responses: {}   lookups: {}   hits: {}   hit rate: {:.1}%   in flight at last stop: {}",
        s.responses,
        s.lookups,
        s.hits,
        s.hit_rate * 100.0,
        s.in_flight
    );
    println!("  vectors: {}   vector lookups: {}   vector hits: {}", s.vectors, s.vector_lookups, s.vector_hits);
    if !s.by_model.is_empty() {
        println!(
            "  {:10} {:28} {:>9} {:>11} {:>11} {:>10} {:>7}",
            "provider", "model", "entries", "tokens in", "tokens out", "cost $", "hits"
        );
        for m in &s.by_model {
            println!(
                "  {:10} {:28} {:>9} {:>11} {:>11} {:>10.4} {:>7}",
                m.provider, m.model, m.entries, m.tokens_in, m.tokens_out, m.cost_usd, m.hits
            );
        }
    }
    for (e, n) in &s.vectors_by_embedder {
        println!("  vectors of {e}: {n}");
    }
    Ok(())
}

fn gc(pipeline: &super::args::PipelineArgs, out: Option<&Path>, dry_run: bool) -> Result<(), i32> {
    let p = Arc::new(super::common::load_or_report(pipeline)?);
    let out_dir = out.map(Path::to_path_buf).unwrap_or_else(|| p.output_dir.clone());
    // Keep what the committed stages used and what the current config would ask for.
    let mut keep: BTreeSet<(String, String)> = BTreeSet::new();
    for s in &p.stages {
        if let Some(state) = StageState::load(&out_dir, &s.name) {
            keep.insert((s.name.clone(), state.fingerprint));
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| fail(e.into()))?;
    let plan = runtime
        .block_on(run_pipeline(
            p.clone(),
            RunOptions { out_dir: out_dir.clone(), dry_run: true, ..Default::default() },
            ProgressHub::new(Mode::Quiet),
            CancellationToken::new(),
        ))
        .map_err(|e| fail(anyhow::anyhow!("{e}")))?;
    for line in &plan.lines {
        if let Some(fp) = &line.fingerprint {
            keep.insert((line.stage.clone(), fp.clone()));
        }
    }
    let (responses, vectors) =
        admin::gc(&out_dir.join(synth_core::store::state::INTERNAL_DIR), &keep, dry_run).map_err(fail)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    println!("{verb} {responses} response(s) and {vectors} vector(s) that no current stage of {} uses", p.name);
    Ok(())
}

fn export(dir: &Path, dest: &Path) -> Result<(), i32> {
    export_inner(dir, dest).map_err(fail)
}

fn export_inner(dir: &Path, dest: &Path) -> Result<()> {
    let conn = admin::open_existing(&dir.join(synth_core::store::state::INTERNAL_DIR))?;
    let mut stmt = conn.prepare(
        "SELECT key, provider, base_url, model, request, response, tokens_in, tokens_out, cost_usd, created_at, hits
         FROM responses ORDER BY created_at, key",
    )?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("provider", DataType::Utf8, false),
        Field::new("base_url", DataType::Utf8, false),
        Field::new("model", DataType::Utf8, false),
        Field::new("request", DataType::Utf8, false),
        Field::new("response", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, true),
        Field::new("tokens_in", DataType::Int64, false),
        Field::new("tokens_out", DataType::Int64, false),
        Field::new("cost_usd", DataType::Float64, false),
        Field::new("created_at", DataType::Int64, false),
        Field::new("hits", DataType::Int64, false),
    ]));
    struct Entry {
        key: String,
        provider: String,
        base_url: String,
        model: String,
        request: String,
        response: String,
        tokens_in: i64,
        tokens_out: i64,
        cost: f64,
        created: i64,
        hits: i64,
    }
    let write = |b: &[Entry], out: &mut synth_core::store::parquet::ParquetOut| -> Result<()> {
        let strings = |f: fn(&Entry) -> &str| Arc::new(StringArray::from_iter_values(b.iter().map(f)));
        let text: StringArray = b
            .iter()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(&r.response)
                    .ok()
                    .and_then(|v| v["text"].as_str().map(str::to_string))
            })
            .collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                strings(|r| &r.key),
                strings(|r| &r.provider),
                strings(|r| &r.base_url),
                strings(|r| &r.model),
                strings(|r| &r.request),
                strings(|r| &r.response),
                Arc::new(text),
                Arc::new(Int64Array::from_iter_values(b.iter().map(|r| r.tokens_in))),
                Arc::new(Int64Array::from_iter_values(b.iter().map(|r| r.tokens_out))),
                Arc::new(Float64Array::from_iter_values(b.iter().map(|r| r.cost))),
                Arc::new(Int64Array::from_iter_values(b.iter().map(|r| r.created))),
                Arc::new(Int64Array::from_iter_values(b.iter().map(|r| r.hits))),
            ],
        )?;
        out.write(&batch)
    };
    let mut out = synth_core::store::parquet::ParquetOut::create(dest, schema.clone(), vec![], false)?;
    let mut rows = stmt.query([])?;
    let mut buf: Vec<Entry> = Vec::new();
    let mut total = 0u64;
    while let Some(r) = rows.next()? {
        buf.push(Entry {
            key: r.get(0)?,
            provider: r.get(1)?,
            base_url: r.get(2)?,
            model: r.get(3)?,
            request: r.get(4)?,
            response: r.get(5)?,
            tokens_in: r.get(6)?,
            tokens_out: r.get(7)?,
            cost: r.get(8)?,
            created: r.get(9)?,
            hits: r.get(10)?,
        });
        total += 1;
        if buf.len() >= 4096 {
            write(&buf, &mut out)?;
            buf.clear();
        }
    }
    if !buf.is_empty() {
        write(&buf, &mut out)?;
    }
    let (pending, _) = out.finish()?;
    pending.commit().with_context(|| format!("writing {}", dest.display()))?;
    println!("exported {total} response(s) to {}", dest.display());
    Ok(())
}
