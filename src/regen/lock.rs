//! Building a `synth.lock` entry: from a resolve plan (every stage's upstream versions
//! and file hashes) and from a run's manifest (the models providers served), and
//! checking a run against a lock's served models.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::dag::runner::StageLine;
use crate::store::lock::{PipelineLock, ProviderLock, StageLock, default_location, file_key};
use crate::store::state::{Manifest, StageStatus, now_rfc3339};

/// Where the lock of a pipeline lives and the key of its entry: `--lockfile`, or
/// `synth.lock` next to the pipeline file.
pub fn location(pipeline: &Path, lockfile: Option<&Path>) -> (PathBuf, String) {
    match lockfile {
        Some(path) => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            (path.to_path_buf(), file_key(pipeline, dir))
        }
        None => default_location(pipeline),
    }
}

/// The lock entry of a resolve plan (a dry run that resolved upstreams). A stage that
/// could not be resolved is an error naming it and why.
pub fn from_plan(lines: &[StageLine], file: String, profile: Option<String>) -> Result<PipelineLock> {
    let mut stages = BTreeMap::new();
    let mut problems = Vec::new();
    for line in lines {
        if line.status == StageStatus::Skipped {
            continue;
        }
        match &line.resolved {
            Some(r) => {
                stages.insert(
                    line.stage.clone(),
                    StageLock {
                        kind: r.parts.kind.clone(),
                        upstream: r.upstream.clone(),
                        files: r.parts.files.clone(),
                    },
                );
            }
            None => problems.push(match &line.reason {
                Some(reason) => reason.clone(),
                None => format!("stage \"{}\": not resolved (an input failed)", line.stage),
            }),
        }
    }
    if !problems.is_empty() {
        bail!("cannot resolve every upstream:\n{}", problems.join("\n"));
    }
    Ok(PipelineLock {
        file,
        profile,
        locked_at: now_rfc3339(),
        synth_version: env!("CARGO_PKG_VERSION").to_string(),
        stages,
        providers: BTreeMap::new(),
    })
}

/// The providers of a run's stages with the models they served (stages that ran now or
/// earlier keep their report), merged into `lock`.
pub fn record_served(lock: &mut PipelineLock, manifest: &Manifest) {
    for stage in manifest.stages.values() {
        let Some(report) = &stage.report else { continue };
        let Some(provider) = report.info.get("provider") else { continue };
        let entry = lock.providers.entry(provider.clone()).or_insert_with(|| ProviderLock {
            model: report.info.get("model").cloned().unwrap_or_default(),
            ..Default::default()
        });
        let split = |key: &str| {
            report.info.get(key).map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>())
        };
        entry.served.extend(split("served_model").unwrap_or_default());
        entry.system_fingerprint.extend(split("system_fingerprint").unwrap_or_default());
    }
}

/// Under `--locked`: the models stages of this run were served that the lock does not
/// list (for providers whose served models it recorded).
pub fn served_mismatches(lock: &PipelineLock, manifest: &Manifest) -> Vec<String> {
    let mut out = Vec::new();
    for (name, stage) in &manifest.stages {
        if stage.status != StageStatus::Ran {
            continue;
        }
        let Some(report) = &stage.report else { continue };
        let (Some(provider), Some(served)) = (report.info.get("provider"), report.info.get("served_model")) else {
            continue;
        };
        let Some(locked) = lock.providers.get(provider).filter(|p| !p.served.is_empty()) else { continue };
        for model in served.split(',').filter(|m| !m.is_empty() && !locked.served.contains(*m)) {
            out.push(format!(
                "stage \"{name}\": provider \"{provider}\" served {model}, but synth.lock records {}",
                locked.served.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    out
}
