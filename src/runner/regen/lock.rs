//! Building a `synth.lock` entry: from a resolve plan (every stage's upstream versions
//! and file hashes), from a run's manifest (the models providers served) and from the hub
//! (the commit of each `local` provider's model file); checking a run against a lock's
//! served models, and pinning `local` models to their locked commits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::dag::runner::StageLine;
use crate::pipeline::Pipeline;
use synth_core::store::lock::{PipelineLock, ProviderLock, StageLock, Upstream, default_location, file_key};
use synth_core::store::state::{Manifest, StageStatus, now_rfc3339};

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

/// The lock's record of a provider's hub file (`commit` empty for a lookup key).
fn model_upstream(hub: &synth_core::hub::HubModel, commit: String) -> Upstream {
    Upstream::Hub {
        repo: hub.repo.clone(),
        repo_type: "model".into(),
        revision: hub.revision.clone(),
        commit,
        files: vec![hub.file.clone()],
    }
}

/// The providers of `p` that read a model through the hub (their kind says which, a `local`
/// provider's `hub`): name, hub file, whether the file it names instead is on this machine.
fn hub_models(p: &Pipeline) -> Vec<(String, synth_core::hub::HubModel, bool)> {
    p.providers
        .iter()
        .filter_map(|(name, d)| {
            let (hub, on_disk) = (p.registry.provider(&d.kind)?.hub_model?)(d, &p.root)?;
            Some((name.clone(), hub, on_disk))
        })
        .collect()
}

/// Resolve each `local` provider's hub file to the commit its revision points to now
/// (nothing is downloaded) into `lock`'s `providers.NAME.upstream`. When the hub cannot
/// be reached, a provider whose `model` file is on this machine gets a warning and no
/// record; one that would need the hub is an error naming it.
pub async fn record_models(lock: &mut PipelineLock, p: &Pipeline) -> Result<()> {
    for (name, hub, on_disk) in hub_models(p) {
        let how = synth_core::hub::Resolve { resolve_only: true, ..Default::default() };
        match hub.spec().resolve_with(&p.root, &how).await {
            Ok(files) => {
                let served = std::path::Path::new(&hub.file).file_name().map(|f| f.to_string_lossy().to_string());
                let entry = lock
                    .providers
                    .entry(name.clone())
                    .or_insert_with(|| ProviderLock { model: served.unwrap_or_default(), ..Default::default() });
                entry.upstream = vec![model_upstream(&hub, files.commit)];
            }
            Err(e) if on_disk => eprintln!(
                "warning: provider \"{name}\": {}/{}@{} not locked, the hub cannot tell its commit ({e:#}); the model file on this machine is used",
                hub.repo, hub.file, hub.revision
            ),
            Err(e) => {
                bail!("provider \"{name}\": cannot resolve the model {}/{}@{}: {e:#}", hub.repo, hub.file, hub.revision)
            }
        }
    }
    Ok(())
}

/// Under `synth run --locked`: each `local` provider that reads its model through the hub
/// reads it at the commit `synth.lock` records, not where its revision points now. A
/// provider the lock has no commit for is an error (unless its `model` file is on this
/// machine, which the hub does not stand in for).
pub fn pin_models(p: &mut Pipeline, lock: &PipelineLock) -> std::result::Result<(), String> {
    for (name, hub, on_disk) in hub_models(p) {
        let key = model_upstream(&hub, String::new()).key();
        let pinned = lock.providers.get(&name).and_then(|l| l.upstream.iter().find(|u| u.key() == key));
        match pinned {
            Some(up) => {
                let commit = up.version().to_string();
                let registry = p.registry.clone();
                if let Some(decl) = p.providers.get_mut(&name)
                    && let Some(pin) = registry.provider(&decl.kind).and_then(|k| k.pin_hub_model)
                {
                    pin(decl, &commit);
                }
            }
            None if on_disk => {}
            None => {
                return Err(format!(
                    "provider \"{name}\": the model {}/{}@{} is not in synth.lock; run `synth lock --update` to lock it",
                    hub.repo, hub.file, hub.revision
                ));
            }
        }
    }
    Ok(())
}
