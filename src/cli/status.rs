//! `synth status`: where a run stands, from its state alone (a directory or an object
//! store): the last run's outcome and, for sharded runs, each wave's plan, the shards
//! done and missing, whether it was merged, and the retry set of the missing shards as
//! Kubernetes indices and a Slurm `--array` expression.

use super::{EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME, StatusArgs};
use crate::dag::shard::{WAVES_DIR, WavePlan, array_expr, indices};
use crate::store::object::StateStore;
use crate::store::state::{MANIFEST, Manifest, StageStatus};

pub fn run(args: &StatusArgs) -> i32 {
    let store = match (&args.state, &args.dir) {
        (Some(url), None) => {
            let work = std::env::temp_dir().join(format!("synth-status-{}", std::process::id()));
            match StateStore::open(url, &work) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return EXIT_CONFIG;
                }
            }
        }
        (None, Some(dir)) => StateStore::local(dir),
        _ => {
            eprintln!("error: give an output directory or --state URL");
            return EXIT_CONFIG;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_RUNTIME;
        }
    };
    let result = runtime.block_on(report(&store, args.shards.map(|n| n as usize)));
    if store.is_remote() {
        let _ = std::fs::remove_dir_all(store.dir());
    }
    match result {
        Ok(r) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).expect("serializable"));
            } else {
                print!("{}", render(&r));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}

#[derive(serde::Serialize)]
struct Report {
    state: String,
    run: Option<serde_json::Value>,
    waves: Vec<WaveReport>,
}

#[derive(serde::Serialize)]
struct WaveReport {
    wave: usize,
    shards: usize,
    rate_split: usize,
    stages: Vec<String>,
    plan: String,
    done: usize,
    missing: Vec<usize>,
    merged: bool,
    /// Kubernetes: the indices to run again; Slurm: the `--array` expression.
    retry_indices: String,
    retry_array: String,
}

async fn report(store: &StateStore, shards: Option<usize>) -> anyhow::Result<Report> {
    let run = match store.read(MANIFEST).await? {
        None => None,
        Some(bytes) => {
            let m: Manifest = serde_json::from_slice(&bytes)?;
            let count = |st: StageStatus| m.stages.values().filter(|s| s.status == st).count();
            Some(serde_json::json!({
                "pipeline": m.pipeline.name,
                "status": m.status,
                "started_at": m.started_at,
                "finished_at": m.finished_at,
                "stages": m.stages.len(),
                "ran": count(StageStatus::Ran),
                "up_to_date": count(StageStatus::UpToDate),
                "failed": count(StageStatus::Failed),
                "error": m.error,
            }))
        }
    };
    let mut waves = Vec::new();
    for (rel, _) in store.list(&format!("{WAVES_DIR}/")).await? {
        let Some(name) = rel.strip_prefix(&format!("{WAVES_DIR}/")) else { continue };
        // Pointers are `w<K>-n<N>.json`, directly in the folder.
        let Some((k, n)) = name
            .strip_suffix(".json")
            .and_then(|x| x.strip_prefix('w'))
            .and_then(|x| x.split_once("-n"))
            .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
        else {
            continue;
        };
        if shards.is_some_and(|s| s != n) {
            continue;
        }
        let Some(plan) = WavePlan::load(store, k, n).await? else { continue };
        let missing = if plan.stages.is_empty() { Vec::new() } else { plan.missing(store).await? };
        waves.push(WaveReport {
            wave: k,
            shards: n,
            rate_split: plan.rate_split,
            stages: plan.stages.iter().map(|s| s.name.clone()).collect(),
            plan: plan.dir.clone(),
            done: n - missing.len(),
            merged: plan.stages.is_empty() || plan.merged(store).await?,
            retry_indices: indices(&missing),
            retry_array: array_expr(&missing),
            missing,
        });
    }
    waves.sort_by_key(|w| (w.shards, w.wave));
    Ok(Report { state: store.display(), run, waves })
}

/// The waves of a local output directory as JSON (what `synth view` shows; `[]` when
/// the run was not sharded or its state cannot be read).
pub(crate) async fn waves_json(dir: &std::path::Path) -> serde_json::Value {
    match report(&StateStore::local(dir), None).await {
        Ok(r) => serde_json::to_value(&r.waves).unwrap_or_default(),
        Err(_) => serde_json::json!([]),
    }
}

fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "state: {}", r.state);
    match &r.run {
        None => {
            let _ = writeln!(out, "no run has written a manifest here yet");
        }
        Some(m) => {
            let _ = writeln!(
                out,
                "pipeline \"{}\": last run {} (started {}), {} stages: {} ran, {} up to date, {} failed",
                m["pipeline"].as_str().unwrap_or_default(),
                m["status"].as_str().unwrap_or_default(),
                m["started_at"].as_str().unwrap_or_default(),
                m["stages"],
                m["ran"],
                m["up_to_date"],
                m["failed"],
            );
        }
    }
    if r.waves.is_empty() {
        let _ = writeln!(out, "no sharded run has planned a wave here");
    }
    for w in &r.waves {
        if w.stages.is_empty() {
            let _ = writeln!(out, "wave {} ({} shards): nothing to run, every stage up to date", w.wave, w.shards);
            continue;
        }
        let _ = writeln!(
            out,
            "wave {} ({} shards, limits divided by {}): {}",
            w.wave,
            w.shards,
            w.rate_split,
            w.stages.join(", ")
        );
        let _ = writeln!(
            out,
            "  {} of {} shards done, {}; plan {}",
            w.done,
            w.shards,
            if w.merged { "merged" } else { "not merged" },
            w.plan
        );
        if !w.missing.is_empty() {
            let _ = writeln!(out, "  missing shards: {}", w.retry_indices);
            let _ =
                writeln!(out, "  retry set: Kubernetes indices {}; Slurm --array={}", w.retry_indices, w.retry_array);
        }
    }
    out
}
