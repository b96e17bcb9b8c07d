//! Scheduled regeneration (`synth regenerate`) and lock files (`synth lock`): resolve
//! every upstream without downloading, compare with the last release, run only what
//! the change touches with the upstreams pinned to what was resolved, write an immutable
//! snapshot, publish it as one Hub commit, move `latest`, run the hooks.
//!
//! Guards: one regeneration per output directory (`guard`), the run's cost cap
//! (`[pipeline] max_cost_usd`, `services/cost.rs`), a failed or partial run is never
//! snapshotted or published, and `latest` moves only after everything succeeded.

pub mod config;
pub mod diff;
pub mod guard;
pub mod hooks;
pub mod lock;
pub mod publish;
pub mod schedule;
pub mod snapshot;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use self::config::{HubTarget, RegenConfig};
use self::hooks::{SnapshotRef, Status, Summary};
use self::snapshot::{NewSnapshot, Snapshot, Snapshots};
use crate::dag::runner::{self, RunError, RunOptions, StageLine};
use crate::pipeline::Pipeline;
use synth_core::progress::{Mode, ProgressHub};
use synth_core::store::lock::{LockFile, PipelineLock};
use synth_core::store::state::{Manifest, RunStatus, StageStatus, now_rfc3339};

/// How a regeneration ended badly; each maps to an exit status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegenError {
    /// The request or the configuration is wrong: exit 78.
    #[error("{0}")]
    Config(String),
    /// Another regeneration holds the output directory: exit 75.
    #[error("{0}")]
    Busy(String),
    /// The run, the snapshot or the push failed: exit 2.
    #[error("{0}")]
    Failed(String),
    /// Stopped by a signal: exit 130.
    #[error("{0}")]
    Interrupted(String),
}

fn failed(e: anyhow::Error) -> RegenError {
    RegenError::Failed(synth_core::secrets::scrub(&format!("{e:#}")))
}

fn from_run(e: RunError) -> RegenError {
    match e {
        RunError::Usage(m) => RegenError::Config(m),
        RunError::Failed(m) => RegenError::Failed(m),
        RunError::Interrupted(m) => RegenError::Interrupted(m),
        RunError::Busy(m) => RegenError::Busy(m),
        // Regeneration runs whole (never --shards), so no part waits on another.
        RunError::NotReady(m) => RegenError::Failed(m),
    }
}

#[derive(Debug, Clone, Default)]
pub struct RegenOptions {
    /// The pipeline file (the lock's key).
    pub pipeline_file: PathBuf,
    pub out_dir: PathBuf,
    /// Do nothing (exit 0, "unchanged") when nothing moved since the last release.
    pub if_changed: bool,
    /// Write a snapshot of the release (implied by `push`).
    pub snapshot: bool,
    /// Publish to the Hub: `Some("")` is the configured `[regenerate.hub]`, else a repository id.
    pub push: Option<String>,
    /// Use the upstream versions of the lock file instead of resolving them anew.
    pub locked: bool,
    pub lockfile: Option<PathBuf>,
    pub max_cost_usd: Option<f64>,
    pub keep: Option<usize>,
}

/// What happened: the summary (also what hooks get), the error if any, warnings.
pub struct RegenResult {
    pub summary: Summary,
    pub error: Option<RegenError>,
    pub warnings: Vec<String>,
}

/// The release fingerprint: a hash of the export stages' fingerprints.
pub fn release_fingerprint<'a>(exports: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(&str, &str)> = exports.into_iter().collect();
    pairs.sort();
    let text: String = pairs.iter().map(|(s, f)| format!("{s}={f}\n")).collect();
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// Resolve every upstream (network, no downloads) and compute every fingerprint: a dry
/// run whose stage lines carry what each stage resolved to.
pub async fn resolve(
    p: &Arc<Pipeline>,
    out_dir: &std::path::Path,
    pins: Option<&PipelineLock>,
    cancel: &CancellationToken,
) -> Result<Vec<StageLine>, RegenError> {
    let opts = RunOptions {
        out_dir: out_dir.to_path_buf(),
        dry_run: true,
        resolve_only: true,
        lock: pins.cloned().map(Arc::new),
        ..Default::default()
    };
    let plan = runner::run(p.clone(), opts, ProgressHub::new(Mode::Quiet), cancel.clone()).await.map_err(from_run)?;
    Ok(plan.lines)
}

/// The lock entry `--locked` uses.
pub fn locked_entry(lock_path: &std::path::Path, key: &str, profile: Option<&str>) -> Result<PipelineLock, RegenError> {
    let file = LockFile::load(lock_path).map_err(|e| RegenError::Config(format!("{e:#}")))?;
    file.find(key, profile).cloned().ok_or_else(|| {
        RegenError::Config(format!(
            "{} has no entry for {key}{}: run `synth lock` first",
            lock_path.display(),
            profile.map(|p| format!(" with profile {p}")).unwrap_or_default()
        ))
    })
}

struct Run {
    p: Arc<Pipeline>,
    opts: RegenOptions,
    cfg: Option<RegenConfig>,
    summary: Summary,
    warnings: Vec<String>,
}

/// Regenerate a pipeline (see the module doc); hooks run before this returns.
pub async fn regenerate(
    p: Arc<Pipeline>,
    opts: RegenOptions,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> RegenResult {
    let started = Instant::now();
    let summary = Summary {
        status: Status::Failed,
        pipeline: p.name.clone(),
        pipeline_file: p.file.display.clone(),
        profile: p.profile.clone(),
        output_dir: opts.out_dir.display().to_string(),
        started_at: now_rfc3339(),
        finished_at: String::new(),
        duration_seconds: 0.0,
        snapshot: None,
        previous_snapshot: None,
        changes: Vec::new(),
        stages_ran: Vec::new(),
        stages_up_to_date: 0,
        diff: Default::default(),
        requests: 0,
        cache_hits: 0,
        tokens_in: 0,
        tokens_out: 0,
        cost_usd: 0.0,
        hub: None,
        error: None,
    };
    let mut run = Run { p, opts, cfg: None, summary, warnings: Vec::new() };
    let outcome = run.attempt(hub, cancel).await;
    run.summary.finished_at = now_rfc3339();
    run.summary.duration_seconds = started.elapsed().as_secs_f64();
    let error = match outcome {
        Ok(status) => {
            run.summary.status = status;
            None
        }
        Err(e) => {
            run.summary.status = Status::Failed;
            run.summary.error = Some(synth_core::secrets::scrub(&e.to_string()));
            Some(e)
        }
    };
    // A second regeneration that found the first one running reports nothing to hooks.
    if !matches!(error, Some(RegenError::Busy(_)))
        && let Some(cfg) = &run.cfg
    {
        let hook = match run.summary.status {
            Status::Regenerated => ("on_success", &cfg.on_success),
            Status::Unchanged => ("on_unchanged", &cfg.on_unchanged),
            Status::Failed => ("on_failure", &cfg.on_failure),
        };
        if let (name, Some(command)) = hook {
            let (command, summary) = (command.clone(), run.summary.clone());
            let timeout = Duration::from_secs(cfg.hook_timeout_seconds);
            let name = name.to_string();
            let warning =
                tokio::task::spawn_blocking(move || hooks::run_hook(&name, &command, &summary, timeout)).await;
            match warning {
                Ok(Some(w)) => run.warnings.push(w),
                Ok(None) => {}
                Err(e) => run.warnings.push(format!("hook panicked: {e}")),
            }
        }
    }
    RegenResult { summary: run.summary, error, warnings: run.warnings }
}

impl Run {
    fn push_target(&self, cfg: &RegenConfig) -> Result<Option<HubTarget>, RegenError> {
        let target = match &self.opts.push {
            None => return Ok(None),
            Some(r) if r.is_empty() => cfg.hub.clone().ok_or_else(|| {
                RegenError::Config(
                    "--push without a repository: give --push OWNER/NAME or set [regenerate.hub] repo".into(),
                )
            })?,
            Some(r) => match cfg.hub.clone() {
                Some(mut h) => {
                    h.repo = r.clone();
                    h
                }
                None => HubTarget::for_repo(r),
            },
        };
        publish::check_repo_id(&target.repo).map_err(|e| RegenError::Config(format!("{e:#}")))?;
        Ok(Some(target))
    }

    async fn attempt(&mut self, hub: Arc<ProgressHub>, cancel: CancellationToken) -> Result<Status, RegenError> {
        let p = self.p.clone();
        let cfg = RegenConfig::of(&p).map_err(|e| RegenError::Config(format!("{e:#}")))?;
        self.cfg = Some(cfg.clone());
        let out_dir = self.opts.out_dir.clone();
        let snapshots = Snapshots::new(cfg.snapshots_dir(&out_dir));
        let target = self.push_target(&cfg)?;
        let want_snapshot = self.opts.snapshot || target.is_some();
        let _guard = guard::acquire(&out_dir, &format!("regenerate of {}", p.name)).map_err(RegenError::Busy)?;

        // Before any work: the token and the branch head the commit will build on.
        let push = match &target {
            Some(t) => Some(publish::connect(t).await.map_err(failed)?),
            None => None,
        };

        // What every upstream resolves to now, and every fingerprint.
        let (lock_path, key) = lock::location(&self.opts.pipeline_file, self.opts.lockfile.as_deref());
        let pinned = match self.opts.locked {
            true => Some(locked_entry(&lock_path, &key, p.profile.as_deref())?),
            false => None,
        };
        let plan = resolve(&p, &out_dir, pinned.as_ref(), &cancel).await?;
        let mut new_lock = lock::from_plan(&plan, key, p.profile.clone()).map_err(failed)?;
        if let Some(pinned) = &pinned {
            new_lock.providers = pinned.providers.clone();
        }
        let export_names = cfg.export_stages(&p);
        let planned: Vec<(&str, &str)> = plan
            .iter()
            .filter(|l| export_names.contains(&l.stage))
            .filter_map(|l| Some((l.stage.as_str(), l.fingerprint.as_deref()?)))
            .collect();
        let planned_fp = release_fingerprint(planned);
        let would_run: Vec<&StageLine> =
            plan.iter().filter(|l| !matches!(l.status, StageStatus::UpToDate | StageStatus::Skipped)).collect();
        let latest = snapshots.latest().map_err(failed)?;
        self.summary.previous_snapshot = latest.as_ref().map(|s| s.meta.id.clone());
        let latest_lock = latest.as_ref().and_then(Snapshot::lock);
        if let Some(old) = &latest_lock {
            self.summary.changes = synth_core::store::lock::changes(old, &new_lock).lines().cloned().collect();
        }
        if latest.is_some() {
            for l in &would_run {
                let reason = l.reason.as_deref().unwrap_or_default();
                if matches!(reason, "configuration changed" | "stage kind changed") {
                    self.summary.changes.push(format!("{}: {reason}", l.stage));
                }
            }
        }

        let unchanged = match want_snapshot {
            true => latest.as_ref().is_some_and(|s| s.meta.fingerprint == planned_fp),
            false => would_run.is_empty(),
        };
        if self.opts.if_changed && unchanged {
            // Nothing moved. A release not yet on the Hub (its push failed) goes now.
            if let (Some(push), Some(latest)) = (&push, &latest)
                && !latest.published_to(&push.target.repo, &push.target.branch)
            {
                self.summary.snapshot = Some(snapshot_ref(latest));
                self.publish(push, &snapshots, latest, None).await?;
                return Ok(Status::Regenerated);
            }
            self.summary.snapshot = latest.as_ref().map(snapshot_ref);
            return Ok(Status::Unchanged);
        }

        // Run what changed, with every upstream pinned to what was just resolved.
        // The cost cap is the run's own (`[pipeline] max_cost_usd`, or --max-cost-usd): it
        // stops sending before the cap, and a stopped run is a failed one (nothing released).
        let run_opts = RunOptions {
            out_dir: out_dir.clone(),
            lock: Some(Arc::new(new_lock.clone())),
            max_cost_usd: self.opts.max_cost_usd,
            ..Default::default()
        };
        let result = runner::run(p.clone(), run_opts, hub.clone(), cancel.clone()).await;
        let manifest = Manifest::load(&out_dir).ok();
        if let Some(m) = &manifest {
            self.account(m);
        }
        self.account_usage(hub.usage());
        if let Err(e) = result {
            return Err(from_run(e));
        }
        let manifest = manifest.ok_or_else(|| RegenError::Failed("the run left no manifest".into()))?;
        if manifest.status == RunStatus::Detached {
            // A batch stage handed its work to the provider (or to a local batch command
            // left to the user): the run is not complete, so nothing is released.
            let waiting: Vec<&str> = manifest
                .stages
                .iter()
                .filter(|(_, st)| st.status == StageStatus::Waiting)
                .map(|(n, _)| n.as_str())
                .collect();
            return Err(RegenError::Failed(format!(
                "stages {} wait for provider batches: nothing was snapshotted or published; run the same regenerate again to collect them",
                waiting.join(", ")
            )));
        }
        lock::record_served(&mut new_lock, &manifest);
        if let Some(old) = &latest_lock {
            let moved = synth_core::store::lock::changes(old, &new_lock);
            for line in moved.models {
                if !self.summary.changes.contains(&line) {
                    self.summary.changes.push(line);
                }
            }
        }
        if self.opts.locked
            && let Some(pinned) = &pinned
        {
            let bad = lock::served_mismatches(pinned, &manifest);
            if !bad.is_empty() {
                return Err(RegenError::Failed(format!(
                    "{}\nrun without --locked (or `synth lock --update`) to accept the new model",
                    bad.join("\n")
                )));
            }
        }
        if !want_snapshot {
            return Ok(if self.summary.stages_ran.is_empty() { Status::Unchanged } else { Status::Regenerated });
        }

        // The snapshot: only of a complete run.
        let exports = config::exports(&p, &cfg, &manifest).map_err(failed)?;
        let ran: Vec<(&str, &str)> = exports
            .iter()
            .filter_map(|e| Some((e.stage.as_str(), manifest.stages.get(&e.stage)?.fingerprint.as_deref()?)))
            .collect();
        let fingerprint = release_fingerprint(ran);
        let (snap, new) = match latest.as_ref().filter(|l| l.meta.fingerprint == fingerprint) {
            Some(same) => (same.clone(), false),
            None => {
                let card = config::card_file(&cfg, &exports);
                let snap = snapshots
                    .create(NewSnapshot {
                        out_dir: &out_dir,
                        manifest: &manifest,
                        exports: &exports,
                        card,
                        lock: &new_lock,
                        fingerprint,
                        changes: self.summary.changes.clone(),
                        previous: latest.as_ref(),
                    })
                    .map_err(failed)?;
                (snap, true)
            }
        };
        self.summary.snapshot = Some(snapshot_ref(&snap));
        self.summary.diff = snap.meta.changelog.diff.clone();
        let mut published = false;
        if let Some(push) = &push
            && !snap.published_to(&push.target.repo, &push.target.branch)
        {
            let previous = latest.as_ref().and_then(|l| l.release.clone());
            self.publish(push, &snapshots, &snap, previous.as_ref()).await?;
            published = true;
        }
        // Last: `latest`, then retention.
        if new {
            snapshots.set_latest(snap.id()).map_err(failed)?;
        }
        if let Some(keep) = self.opts.keep.or(cfg.keep) {
            match snapshots.gc(keep, false) {
                Ok(removed) if !removed.is_empty() => tracing::info!("removed old snapshots: {}", removed.join(", ")),
                Ok(_) => {}
                Err(e) => self.warnings.push(format!("removing old snapshots: {e:#}")),
            }
        }
        Ok(if new || published { Status::Regenerated } else { Status::Unchanged })
    }

    async fn publish(
        &mut self,
        push: &publish::Push,
        snapshots: &Snapshots,
        snap: &Snapshot,
        previous: Option<&snapshot::Publication>,
    ) -> Result<(), RegenError> {
        let (publication, warnings) = publish::publish(push, snapshots, snap, previous).await.map_err(failed)?;
        self.warnings.extend(warnings);
        // The output directory's manifest records it too.
        if let Ok(mut m) = Manifest::load(&self.opts.out_dir) {
            m.release = serde_json::to_value(&publication).ok();
            if let Err(e) = m.save(&self.opts.out_dir) {
                self.warnings.push(format!("recording the release in the manifest: {e:#}"));
            }
        }
        self.summary.hub = Some(publication);
        Ok(())
    }

    fn account(&mut self, m: &Manifest) {
        let s = &mut self.summary;
        s.stages_ran =
            m.stages.iter().filter(|(_, st)| st.status == StageStatus::Ran).map(|(n, _)| n.clone()).collect();
        s.stages_up_to_date = m.stages.values().filter(|st| st.status == StageStatus::UpToDate).count();
    }

    /// What the run's provider calls came to, a failed or stopped stage's included
    /// (the manifest has reports of completed stages only).
    fn account_usage(&mut self, u: synth_core::progress::Usage) {
        let s = &mut self.summary;
        (s.requests, s.cache_hits, s.tokens_in, s.tokens_out, s.cost_usd) =
            (u.requests, u.cache_hits, u.tokens_in, u.tokens_out, u.cost_usd);
    }
}

fn snapshot_ref(s: &Snapshot) -> SnapshotRef {
    SnapshotRef { id: s.meta.id.clone(), path: s.path.display().to_string(), fingerprint: s.meta.fingerprint.clone() }
}
