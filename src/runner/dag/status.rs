//! Where a run stands, from its state alone (a directory or an object store): the last
//! run's outcome and, for sharded runs, each wave's plan, the shards done and missing,
//! whether it was merged, and the retry set of the missing shards (`synth status` prints
//! it, `synth view` shows the waves).

use super::shard::{WAVES_DIR, WavePlan, array_expr, indices};
use synth_core::store::object::StateStore;
use synth_core::store::state::{MANIFEST, Manifest, StageStatus};

/// A run's standing (`synth status --json` prints it as is).
#[derive(serde::Serialize)]
pub struct Report {
    pub state: String,
    pub run: Option<serde_json::Value>,
    pub waves: Vec<WaveReport>,
}

/// One planned wave of a sharded run.
#[derive(serde::Serialize)]
pub struct WaveReport {
    pub wave: usize,
    pub shards: usize,
    pub rate_split: usize,
    pub stages: Vec<String>,
    pub plan: String,
    pub done: usize,
    pub missing: Vec<usize>,
    pub merged: bool,
    /// Kubernetes: the indices to run again; Slurm: the `--array` expression.
    pub retry_indices: String,
    pub retry_array: String,
}

/// Read a run's standing from its state (`shards`: only the waves planned for that many).
pub async fn report(store: &StateStore, shards: Option<usize>) -> anyhow::Result<Report> {
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
pub async fn waves_json(dir: &std::path::Path) -> serde_json::Value {
    match report(&StateStore::local(dir), None).await {
        Ok(r) => serde_json::to_value(&r.waves).unwrap_or_default(),
        Err(_) => serde_json::json!([]),
    }
}
