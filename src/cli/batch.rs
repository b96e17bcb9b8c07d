//! `synth batch status DIR` (each batch of an output directory: stage, provider, batch
//! id, state, answered / total, attempt; `--refresh` asks the providers for the
//! current state and lists batches of this directory the journal does not know) and
//! `synth batch cancel DIR` (cancel the running ones at the provider; a later run
//! collects what they answered and asks the rest again).

use std::path::Path;
use std::sync::Arc;

use super::args::BatchCommand;
use super::common::{EXIT_OK, EXIT_RUNTIME};
use synth_core::store::batch::{BatchLog, PartState, Phase, Record};
use synth_core::store::state::INTERNAL_DIR;
use synth_llm::batch::{BatchApi, BatchInfo};

pub fn run(cmd: BatchCommand) -> i32 {
    let result = match cmd {
        BatchCommand::Status { output_dir, json, refresh } => status(&output_dir, json, refresh),
        BatchCommand::Cancel { output_dir } => cancel(&output_dir),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: {}", synth_core::secrets::scrub(&format!("{e:#}")));
            EXIT_RUNTIME
        }
    }
}

/// The batch API a part was submitted to (the provider kind that lists it by the name the
/// part records), its key read from the variable it names.
fn api_of(p: &PartState, dir: &Path) -> anyhow::Result<Arc<dyn BatchApi>> {
    let i = &p.info;
    let kind = crate::registry::registry()
        .providers
        .iter()
        .flat_map(|k| k.batch_apis.iter())
        .find(|a| a.name == i.api)
        .ok_or_else(|| anyhow::anyhow!("part {}: no provider kind has the batch API \"{}\"", i.part, i.api))?;
    (kind.open)(i, synth_core::secrets::key_from_env(&i.api_key_env), dir)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn state(p: &PartState) -> String {
    match (p.phase, &p.status) {
        (Phase::Created, Some(s)) => s.clone(),
        (Phase::Done, _) => "done".into(),
        (phase, _) => phase.as_str().into(),
    }
}

fn status(out: &Path, json: bool, refresh: bool) -> anyhow::Result<()> {
    let internal = out.join(INTERNAL_DIR);
    if !internal.exists() {
        anyhow::bail!("{} is not a synth output directory", out.display());
    }
    let mut parts = BatchLog::read(&internal)?;
    let mut orphans: Vec<BatchInfo> = Vec::new();
    if refresh {
        let rt = runtime()?;
        let dir = internal.join(synth_core::store::batch::BATCH_DIR);
        for p in parts.iter_mut().filter(|p| p.phase == Phase::Created) {
            let (Ok(api), Some(id)) = (api_of(p, &dir), p.batch.clone()) else { continue };
            match rt.block_on(api.retrieve(&id)) {
                Ok(info) => {
                    p.status = Some(info.state.as_str().into());
                    (p.completed, p.failed) = (info.completed, info.failed);
                }
                Err(e) => eprintln!("warning: batch {id}: {e}"),
            }
        }
        // Batches of this directory the journal does not hold (a create whose answer was lost;
        // only APIs whose batches carry metadata can tell).
        let tag = synth_engine::services::batch::dir_tag(out);
        let known: std::collections::HashSet<String> = parts.iter().flat_map(|p| p.batches.iter().cloned()).collect();
        let mut seen_endpoints = std::collections::HashSet::new();
        for p in parts.iter() {
            if !seen_endpoints.insert((p.info.api.clone(), p.info.base_url.clone(), p.info.api_key_env.clone())) {
                continue;
            }
            if let Ok(api) = api_of(p, &dir) {
                match rt.block_on(api.list_tagged(&tag)) {
                    Ok(found) => orphans.extend(found.into_iter().filter(|b| !known.contains(&b.id))),
                    Err(e) => eprintln!("warning: listing batches at {}: {e}", p.info.base_url),
                }
            }
        }
    }
    if json {
        let rows: Vec<serde_json::Value> = parts
            .iter()
            .map(|p| {
                serde_json::json!({"part": p.info.part, "stage": p.info.stage, "provider": p.info.provider,
                    "api": p.info.api, "batch": p.batch, "state": state(p), "requests": p.info.requests,
                    "completed": p.completed, "failed": p.failed, "attempt": p.info.attempt, "done": p.done})
            })
            .collect();
        let orphans: Vec<&str> = orphans.iter().map(|b| b.id.as_str()).collect();
        println!("{}", serde_json::json!({"batches": rows, "orphans": orphans}));
        return Ok(());
    }
    if parts.is_empty() {
        println!("no batches in {}", out.display());
        return Ok(());
    }
    print!("{}", render(&parts));
    for o in &orphans {
        println!(
            "orphan: batch {} ({}, {}/{} answered) has this directory's metadata but is not in its journal",
            o.id,
            o.state.as_str(),
            o.completed,
            o.total
        );
    }
    Ok(())
}

/// The table of `synth batch status`.
pub fn render(parts: &[PartState]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let w = parts.iter().map(|p| p.info.stage.len()).max().unwrap_or(5).max(5);
    let _ = writeln!(
        out,
        "{:16}  {:w$}  {:10}  {:9}  {:22}  {:11}  {:>17}  {:>7}",
        "part", "stage", "provider", "api", "batch", "state", "answered/total", "attempt"
    );
    for p in parts {
        let answered = match &p.done {
            Some(d) => format!("{}/{}", d.succeeded, p.info.requests),
            None => format!("{}/{}", p.completed, p.info.requests),
        };
        let _ = writeln!(
            out,
            "{:16}  {:w$}  {:10}  {:9}  {:22}  {:11}  {:>17}  {:>7}",
            p.info.part,
            p.info.stage,
            p.info.provider,
            p.info.api,
            p.batch.clone().unwrap_or_else(|| "-".into()),
            state(p),
            answered,
            p.info.attempt
        );
    }
    let live = parts.iter().filter(|p| p.phase.live()).count();
    if live > 0 {
        let _ = writeln!(out, "{live} batch part(s) not yet collected: run the pipeline again to collect them");
    }
    out
}

fn cancel(out: &Path) -> anyhow::Result<()> {
    let internal = out.join(INTERNAL_DIR);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(internal.join("lock"))
        .map_err(|e| anyhow::anyhow!("{} is not a synth output directory: {e}", out.display()))?;
    if lock.try_lock().is_err() {
        anyhow::bail!("a synth run is using {}: stop it first (Ctrl-C leaves its batches running)", out.display());
    }
    let log = BatchLog::open(&internal)?;
    let rt = runtime()?;
    let mut n = 0;
    for p in log.parts().into_iter().filter(|p| p.phase == Phase::Created) {
        let Some(id) = p.batch.clone() else { continue };
        let api = api_of(&p, &log.dir())?;
        let info = rt.block_on(api.cancel(&id)).map_err(|e| anyhow::anyhow!("cancelling batch {id}: {e}"))?;
        log.append(&Record::Status {
            part: p.info.part.clone(),
            status: info.state.as_str().into(),
            total: info.total.max(p.info.requests),
            completed: info.completed,
            failed: info.failed,
            at: synth_llm::batch::now(),
        })?;
        println!("batch {id} (stage \"{}\"): {}", p.info.stage, info.state.as_str());
        n += 1;
    }
    println!(
        "{n} batch(es) cancelled at the provider; the next run collects what they answered (it is paid for) and asks the rest again"
    );
    Ok(())
}
