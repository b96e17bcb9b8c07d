//! The scheduler: starts each stage as soon as its inputs are done (independent
//! stages run concurrently on tokio), computes its fingerprint, skips it when its
//! committed outputs match, otherwise runs it and commits its files — failures
//! first, then outputs, then the state record that proves them — and keeps
//! `manifest.json` current after every stage, so a crash or Ctrl-C loses at most
//! the stages that were running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::fingerprint::{combine, config_part, explain};
use crate::pipeline::Pipeline;
use crate::progress::ProgressHub;
use crate::services::Services;
use crate::services::batch::Detached;
use crate::stages::{Cancelled, Input, PrepareCtx, Prepared, Role, RunCtx, failures_path, output_path};
use crate::store::atomic::clean_debris;
use crate::store::failures::write_failures;
use crate::store::filehash::FileHasher;
use crate::store::parquet::{FINGERPRINT_KEY, read_footer};
use crate::store::state::{
    FingerprintParts, INTERNAL_DIR, Manifest, ManifestStage, OutputRecord, PipelineInfo, RunStatus, StageReport,
    StageState, StageStatus, now_rfc3339, relative_to,
};

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub out_dir: PathBuf,
    pub only: Option<String>,
    pub from: Option<String>,
    pub until: Option<String>,
    pub limit: Option<u64>,
    pub force: bool,
    pub dry_run: bool,
    /// Batch stages stop once their batches are submitted; a later run collects them.
    pub detach: bool,
}

/// How a run ended badly; each carries the message for the user.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The request itself is wrong (unknown stage in --only...): exit 78.
    #[error("{0}")]
    Usage(String),
    /// A stage or the run failed: exit 2.
    #[error("{0}")]
    Failed(String),
    /// Stopped by a signal: exit 130.
    #[error("{0}")]
    Interrupted(String),
}

/// One line of the run summary (or of a dry-run plan).
#[derive(Debug, Clone)]
pub struct StageLine {
    pub stage: String,
    pub kind: String,
    pub status: StageStatus,
    /// Why it ran / would run, or why it did not.
    pub reason: Option<String>,
    pub report: Option<StageReport>,
    /// The stage's fingerprint (when known).
    pub fingerprint: Option<String>,
    /// Records this run sent to the failures table: the first one's id and reason, and
    /// the table's path (the CLI warns about them at the end of the run).
    pub failures: Option<FailureNote>,
}

#[derive(Debug, Clone)]
pub struct FailureNote {
    pub count: u64,
    pub first: String,
    pub path: PathBuf,
}

#[derive(Debug, Clone)]
pub struct RunSummary {
    pub lines: Vec<StageLine>,
    pub out_dir: PathBuf,
}

impl RunSummary {
    pub fn n_ran(&self) -> usize {
        self.lines.iter().filter(|l| l.status == StageStatus::Ran).count()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Run unless up to date (or forced).
    Run { forced: bool },
    /// Only check it is up to date (an input of `--only`).
    Check,
    /// Dry run: report, never run.
    Plan { forced: bool },
}

enum Outcome {
    UpToDate { fp: String, state: Box<StageState> },
    Ran { fp: String, parts: FingerprintParts, ctx: Box<RunCtx> },
    NotUpToDate { reason: String },
    WouldRun { fp: Option<String>, reason: String },
}

struct TaskResult {
    idx: usize,
    outcome: Result<Outcome>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Pending,
    Running,
    /// Finished; its fingerprint (None: unknown in a dry run).
    Done(Option<String>),
    Failed,
    Cancelled,
    Skipped,
}

/// Run (or plan) the pipeline.
pub async fn run(
    p: Arc<Pipeline>,
    opts: RunOptions,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> Result<RunSummary, RunError> {
    let n = p.stages.len();
    let out_dir = opts.out_dir.clone();

    // Which stages take part, and how.
    let mut modes: Vec<Option<Mode>> = vec![Some(Mode::Run { forced: opts.force }); n];
    let find = |name: &str, flag: &str| {
        p.stage_index(name).ok_or_else(|| {
            let hint =
                crate::config::diag::did_you_mean(name, p.stages.iter().map(|s| s.name.as_str())).unwrap_or_default();
            RunError::Usage(format!("{flag} {name}: no such stage{hint}"))
        })
    };
    if let Some(from) = &opts.from {
        let k = find(from, "--from")?;
        for i in p.graph.descendants(k) {
            modes[i] = Some(Mode::Run { forced: true });
        }
    }
    if let Some(until) = &opts.until {
        let k = find(until, "--until")?;
        let needed = p.graph.ancestors(k);
        for (i, m) in modes.iter_mut().enumerate() {
            if !needed.contains(&i) {
                *m = None;
            }
        }
    }
    if let Some(only) = &opts.only {
        let k = find(only, "--only")?;
        modes = vec![None; n];
        modes[k] = Some(Mode::Run { forced: opts.force });
        let mut stack = p.graph.inputs[k].clone();
        while let Some(i) = stack.pop() {
            if modes[i].is_none() {
                modes[i] = Some(Mode::Check);
                stack.extend(p.graph.inputs[i].iter().copied());
            }
        }
    }
    if opts.dry_run {
        for m in modes.iter_mut().flatten() {
            *m = Mode::Plan { forced: matches!(m, Mode::Run { forced: true }) };
        }
    }

    // Output directory: create, lock, clear debris of interrupted runs.
    let _lock = if opts.dry_run { None } else { Some(prepare_out_dir(&out_dir)?) };
    let previous = Manifest::load(&out_dir).ok();
    let mut manifest = new_manifest(&p, &previous);
    if !opts.dry_run {
        manifest.save(&out_dir).map_err(fail)?;
    }
    let hasher = Arc::new(Mutex::new(if opts.dry_run { FileHasher::ephemeral() } else { FileHasher::load(&out_dir) }));
    let services =
        Services::new(&out_dir, &p.root, p.providers.clone(), p.embedders.clone(), p.registry.shapes.clone());
    services.set_run_options(opts.detach, p.max_cost_usd);
    let mut detached: Vec<String> = Vec::new();

    let mut nodes: Vec<Node> = (0..n).map(|i| if modes[i].is_none() { Node::Skipped } else { Node::Pending }).collect();
    for (i, node) in nodes.iter().enumerate() {
        if *node == Node::Skipped
            && let Some(ms) = manifest.stages.get_mut(&p.stages[i].name)
        {
            ms.status = StageStatus::Skipped;
        }
    }
    let mut lines: BTreeMap<usize, StageLine> = BTreeMap::new();
    let mut errors: Vec<String> = Vec::new();
    let mut stopping = false;
    let mut tasks: JoinSet<TaskResult> = JoinSet::new();

    loop {
        if !stopping {
            for &i in &p.graph.order {
                if nodes[i] != Node::Pending {
                    continue;
                }
                let ins = &p.graph.inputs[i];
                if ins.iter().any(|&k| matches!(nodes[k], Node::Failed | Node::Cancelled)) {
                    nodes[i] = Node::Cancelled;
                    continue;
                }
                if !ins.iter().all(|&k| matches!(nodes[k], Node::Done(_))) {
                    continue;
                }
                let input_fps: BTreeMap<String, Option<String>> = ins
                    .iter()
                    .map(|&k| {
                        let fp = match &nodes[k] {
                            Node::Done(fp) => fp.clone(),
                            _ => None,
                        };
                        (p.stages[k].name.clone(), fp)
                    })
                    .collect();
                nodes[i] = Node::Running;
                if let Some(ms) = manifest.stages.get_mut(&p.stages[i].name)
                    && !opts.dry_run
                {
                    ms.status = StageStatus::Running;
                }
                let job = StageJob {
                    p: p.clone(),
                    idx: i,
                    mode: modes[i].expect("selected"),
                    input_fps,
                    out_dir: out_dir.clone(),
                    limit: opts.limit,
                    cancel: cancel.clone(),
                    hub: hub.clone(),
                    hasher: hasher.clone(),
                    services: services.clone(),
                };
                let task = async move {
                    let idx = job.idx;
                    TaskResult { idx, outcome: job.run().await }
                };
                // Stages waiting on a network provider run on the network runtime.
                let net = if p.stages[i].stage.network_bound(&services) && !opts.dry_run {
                    services.net().map_err(|e| tracing::warn!("{e:#}; the stage runs on the main runtime")).ok()
                } else {
                    None
                };
                match net {
                    Some(net) => tasks.spawn_on(task, net.handle()),
                    None => tasks.spawn(task),
                };
            }
        }
        if tasks.is_empty() {
            break;
        }
        let joined = tokio::select! {
            _ = cancel.cancelled(), if !stopping => {
                stopping = true;
                tracing::warn!("interrupted: no new stages start; stages in flight finish what they hold");
                continue;
            }
            joined = tasks.join_next() => joined,
        };
        let Some(joined) = joined else { break };
        let TaskResult { idx, outcome } = match joined {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("a stage task panicked: {e}"));
                stopping = true;
                continue;
            }
        };
        let decl = &p.stages[idx];
        let name = decl.name.clone();
        let kind = decl.kind.name.to_string();
        let mut line = StageLine {
            stage: name.clone(),
            kind: kind.clone(),
            status: StageStatus::Pending,
            reason: None,
            report: None,
            fingerprint: None,
            failures: None,
        };
        match outcome {
            Ok(Outcome::UpToDate { fp, state }) => {
                line.fingerprint = Some(fp.clone());
                nodes[idx] = Node::Done(Some(fp.clone()));
                line.status = StageStatus::UpToDate;
                line.report = Some(state.report.clone());
                set_manifest(&mut manifest, &name, StageStatus::UpToDate, Some(fp), Some(&state), None);
            }
            Ok(Outcome::WouldRun { fp, reason }) => {
                line.fingerprint = fp.clone();
                nodes[idx] = Node::Done(fp);
                line.status = StageStatus::Pending;
                line.reason = Some(reason);
            }
            Ok(Outcome::NotUpToDate { reason }) => {
                nodes[idx] = Node::Failed;
                let only = opts.only.clone().unwrap_or_default();
                errors.push(format!(
                    "stage \"{only}\" depends on \"{name}\", which is not up to date ({reason}); run without --only (or with --from {name})"
                ));
                line.status = StageStatus::Failed;
                stopping = true;
            }
            Ok(Outcome::Ran { fp, parts, ctx }) => match finish_stage(&out_dir, decl, &fp, parts, *ctx) {
                Ok((state, failures)) => {
                    line.failures = failures;
                    let r = &state.report;
                    tracing::info!(
                        "stage \"{name}\" done: {} in, {} out, {} failed, {:.2}s",
                        r.rows_in,
                        r.rows_out,
                        r.rows_failed,
                        r.wall_seconds
                    );
                    line.fingerprint = Some(fp.clone());
                    nodes[idx] = Node::Done(Some(fp.clone()));
                    line.status = StageStatus::Ran;
                    line.report = Some(state.report.clone());
                    set_manifest(&mut manifest, &name, StageStatus::Ran, Some(fp), Some(&state), None);
                }
                Err(e) => {
                    let msg = stage_error(&name, &e, &out_dir);
                    tracing::error!("{msg}");
                    errors.push(msg.clone());
                    nodes[idx] = Node::Failed;
                    line.status = StageStatus::Failed;
                    set_manifest(&mut manifest, &name, StageStatus::Failed, None, None, Some(msg));
                    stopping = true;
                }
            },
            Err(e) if e.downcast_ref::<Detached>().is_some() => {
                // Its batches run at the provider; what depends on it waits for the next run.
                nodes[idx] = Node::Cancelled;
                line.status = StageStatus::Waiting;
                line.reason = Some(e.to_string());
                tracing::info!("{e}");
                detached.push(e.to_string());
                set_manifest(&mut manifest, &name, StageStatus::Waiting, None, None, None);
            }
            Err(e) if e.downcast_ref::<Cancelled>().is_some() => {
                nodes[idx] = Node::Cancelled;
                line.status = StageStatus::Cancelled;
                set_manifest(&mut manifest, &name, StageStatus::Cancelled, None, None, None);
            }
            Err(e) => {
                let msg = stage_error(&name, &e, &out_dir);
                tracing::error!("{msg}");
                errors.push(msg.clone());
                nodes[idx] = Node::Failed;
                line.status = StageStatus::Failed;
                set_manifest(&mut manifest, &name, StageStatus::Failed, None, None, Some(msg));
                stopping = true;
            }
        }
        lines.insert(idx, line);
        if !opts.dry_run
            && let Err(e) = manifest.save(&out_dir)
        {
            let why = crate::store::atomic::explain_disk_full(&e).unwrap_or_else(|| format!("{e:#}"));
            errors.push(format!("after stage \"{name}\", writing the manifest: {why}"));
            stopping = true;
        }
    }

    // Stages never reached.
    for (i, node) in nodes.iter().enumerate() {
        lines.entry(i).or_insert_with(|| StageLine {
            stage: p.stages[i].name.clone(),
            kind: p.stages[i].kind.name.to_string(),
            status: if *node == Node::Skipped { StageStatus::Skipped } else { StageStatus::Cancelled },
            reason: None,
            report: None,
            fingerprint: None,
            failures: None,
        });
    }
    let mut ordered: Vec<StageLine> = p.graph.order.iter().filter_map(|i| lines.remove(i)).collect();
    ordered.extend(lines.into_values());
    let summary = RunSummary { lines: ordered, out_dir: out_dir.clone() };
    if opts.dry_run {
        return Ok(summary);
    }
    let _ = hasher.lock().expect("hasher").save();
    let interrupted = cancel.is_cancelled();
    manifest.finished_at = Some(now_rfc3339());
    manifest.status = if interrupted {
        RunStatus::Interrupted
    } else if errors.is_empty() && !detached.is_empty() {
        RunStatus::Detached
    } else if errors.is_empty() {
        RunStatus::Ok
    } else {
        RunStatus::Failed
    };
    if !errors.is_empty() {
        manifest.error = Some(errors.join("\n"));
    }
    manifest.save(&out_dir).map_err(fail)?;
    if interrupted {
        let done =
            summary.lines.iter().filter(|l| matches!(l.status, StageStatus::Ran | StageStatus::UpToDate)).count();
        return Err(RunError::Interrupted(format!(
            "interrupted: {done} of {n} stages are complete and kept in {}; run the same command again to resume",
            out_dir.display()
        )));
    }
    if !errors.is_empty() {
        return Err(RunError::Failed(format!(
            "{}\ncompleted stages are kept in {}; fix the problem and run again to resume",
            errors.join("\n"),
            out_dir.display()
        )));
    }
    Ok(summary)
}

/// The message of a stage that failed; a full disk is said in words, with what to do.
fn stage_error(name: &str, e: &anyhow::Error, out_dir: &Path) -> String {
    match crate::store::atomic::explain_disk_full(e) {
        Some(full) => format!(
            "stage \"{name}\": {full}; free space on the device that holds {} and run the same command again: completed stages are kept and the run resumes with \"{name}\"",
            out_dir.display()
        ),
        None => format!("stage \"{name}\": {e:#}"),
    }
}

fn fail(e: anyhow::Error) -> RunError {
    match crate::store::atomic::explain_disk_full(&e) {
        Some(full) => RunError::Failed(format!("{full}; free space and run the same command again to resume")),
        None => RunError::Failed(format!("{e:#}")),
    }
}

/// Create the output directory, take its lock and remove debris of interrupted runs.
fn prepare_out_dir(out_dir: &Path) -> Result<std::fs::File, RunError> {
    let internal = out_dir.join(INTERNAL_DIR);
    std::fs::create_dir_all(&internal)
        .map_err(|e| RunError::Failed(format!("cannot create output directory {}: {e}", out_dir.display())))?;
    let lock_path = internal.join("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| RunError::Failed(format!("output directory {} is not writable: {e}", out_dir.display())))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(RunError::Failed(format!("another synth run is using {}", out_dir.display())));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(RunError::Failed(format!("cannot lock {}: {e}", lock_path.display())));
        }
    }
    // Probe writability for real (a read-only mount passes the checks above for root).
    crate::store::atomic::write_atomic(&internal.join("probe"), b"ok")
        .map_err(|e| RunError::Failed(format!("output directory {} is not writable: {e:#}", out_dir.display())))?;
    let mut stack = vec![out_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let _ = clean_debris(&dir);
        if let Ok(read) = std::fs::read_dir(&dir) {
            for entry in read.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) && entry.file_name() != "hub" {
                    stack.push(entry.path());
                }
            }
        }
    }
    Ok(lock)
}

fn new_manifest(p: &Pipeline, previous: &Option<Manifest>) -> Manifest {
    let mut stages = indexmap::IndexMap::new();
    for &i in &p.graph.order {
        let d = &p.stages[i];
        let prev = previous.as_ref().and_then(|m| m.stages.get(&d.name));
        stages.insert(
            d.name.clone(),
            ManifestStage {
                kind: d.kind.name.to_string(),
                status: StageStatus::Pending,
                fingerprint: prev.and_then(|s| s.fingerprint.clone()),
                inputs: d.inputs.clone(),
                report: prev.and_then(|s| s.report.clone()),
                outputs: prev.map(|s| s.outputs.clone()).unwrap_or_default(),
                failures: prev.and_then(|s| s.failures.clone()),
                error: None,
            },
        );
    }
    Manifest {
        synth_version: env!("CARGO_PKG_VERSION").to_string(),
        pipeline: PipelineInfo { name: p.name.clone(), path: p.file.display.clone(), hash: p.file_hash.clone() },
        profile: p.profile.clone(),
        seed: p.seed,
        status: RunStatus::Running,
        started_at: now_rfc3339(),
        finished_at: None,
        error: None,
        config: crate::secrets::redact(&p.resolved),
        stages,
        totals: Default::default(),
    }
}

fn set_manifest(
    m: &mut Manifest,
    name: &str,
    status: StageStatus,
    fp: Option<String>,
    state: Option<&StageState>,
    error: Option<String>,
) {
    if let Some(s) = m.stages.get_mut(name) {
        s.status = status;
        if fp.is_some() {
            s.fingerprint = fp;
        }
        if let Some(state) = state {
            s.report = Some(state.report.clone());
            s.outputs = state.outputs.clone();
            s.failures = state.failures.clone();
        }
        s.error = error;
    }
}

/// Everything one stage task needs.
struct StageJob {
    p: Arc<Pipeline>,
    idx: usize,
    mode: Mode,
    input_fps: BTreeMap<String, Option<String>>,
    out_dir: PathBuf,
    limit: Option<u64>,
    cancel: CancellationToken,
    hub: Arc<ProgressHub>,
    hasher: Arc<Mutex<FileHasher>>,
    services: Arc<Services>,
}

impl StageJob {
    async fn run(self) -> Result<Outcome> {
        let decl = &self.p.stages[self.idx];
        let dry = matches!(self.mode, Mode::Plan { .. });
        let prepare_ctx = PrepareCtx {
            name: &decl.name,
            services: &self.services,
            root: &self.p.root,
            out_dir: &self.out_dir,
            offline_only: dry,
            limit: self.limit,
        };
        let prepared = decl.stage.prepare(&prepare_ctx).await?;
        let unknown_input = self.input_fps.iter().find(|(_, fp)| fp.is_none()).map(|(n, _)| n.clone());
        let Some(prepared) = prepared else {
            return Ok(Outcome::WouldRun { fp: None, reason: "needs the network to check its source".into() });
        };
        if let Some(input) = unknown_input {
            return Ok(Outcome::WouldRun { fp: None, reason: format!("input \"{input}\" would run") });
        }
        let parts = self.parts(&prepared).await?;
        let fp = combine(&parts);
        let state = StageState::load(&self.out_dir, &decl.name);
        let up_to_date = state.as_ref().is_some_and(|s| s.fingerprint == fp && self.outputs_match(s, &fp));
        let forced = matches!(self.mode, Mode::Run { forced: true } | Mode::Plan { forced: true });
        let reason = || {
            if forced && up_to_date { "forced".to_string() } else { explain(state.as_ref().map(|s| &s.parts), &parts) }
        };
        match self.mode {
            _ if up_to_date && !forced => {
                return Ok(Outcome::UpToDate { fp, state: Box::new(state.expect("up to date")) });
            }
            Mode::Check => return Ok(Outcome::NotUpToDate { reason: reason() }),
            Mode::Plan { .. } => {
                return Ok(Outcome::WouldRun { fp: Some(fp), reason: reason() });
            }
            Mode::Run { .. } => {}
        }
        tracing::info!("stage \"{}\" ({}) starts: {}", decl.name, decl.kind.name, reason());

        let inputs = decl
            .inputs
            .iter()
            .map(|name| Input::open(name, output_path(&self.out_dir, name)))
            .collect::<Result<Vec<_>>>()?;
        let progress = self.hub.start(&decl.name);
        let mut ctx = RunCtx {
            name: decl.name.clone(),
            seed: self.p.seed,
            fingerprint: fp.clone(),
            inputs,
            out_dir: self.out_dir.clone(),
            root: self.p.root.clone(),
            limit: self.limit,
            prepared,
            cancel: self.cancel.clone(),
            progress: progress.clone(),
            failures: Default::default(),
            report: StageReport::default(),
            services: self.services.clone(),
            output: None,
            artifacts: Vec::new(),
        };
        let started = Instant::now();
        let result = decl.stage.run(&mut ctx).await;
        self.hub.finish(&progress);
        result?;
        let r = &mut ctx.report;
        r.wall_seconds = started.elapsed().as_secs_f64();
        r.requests = progress.requests.load(Ordering::Relaxed);
        r.cache_hits = progress.cache_hits.load(Ordering::Relaxed);
        r.tokens_in = progress.tokens_in.load(Ordering::Relaxed);
        r.tokens_out = progress.tokens_out.load(Ordering::Relaxed);
        r.cost_usd = progress.cost_usd();
        if decl.kind.role != Role::Sink && ctx.output.is_none() {
            return Err(anyhow!("stage produced no output (a bug in the {} kind)", decl.kind.name));
        }
        Ok(Outcome::Ran { fp, parts, ctx: Box::new(ctx) })
    }

    async fn parts(&self, prepared: &Prepared) -> Result<FingerprintParts> {
        let decl = &self.p.stages[self.idx];
        let mut files: Vec<PathBuf> = decl.files.clone();
        if prepared.hash_files {
            files.extend(prepared.files.iter().cloned());
        }
        files.sort();
        files.dedup();
        let root = self.p.root.clone();
        let hasher = self.hasher.clone();
        let hashed = tokio::task::spawn_blocking(move || -> Result<BTreeMap<String, String>> {
            let mut h = hasher.lock().expect("hasher");
            files
                .iter()
                .map(|f| Ok((f.strip_prefix(&root).unwrap_or(f).to_string_lossy().to_string(), h.hash(f)?)))
                .collect()
        })
        .await
        .context("hashing input files")??;
        Ok(FingerprintParts {
            kind: format!("{}@{}", decl.kind.name, decl.kind.version),
            config: config_part(decl, self.p.seed, self.limit),
            inputs: self.input_fps.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect(),
            files: hashed,
            extra: prepared.fingerprint.clone(),
        })
    }

    /// Committed outputs are on disk, unmodified, and the materialized Parquet
    /// carries the fingerprint in its footer.
    fn outputs_match(&self, state: &StageState, fp: &str) -> bool {
        if !state.outputs_intact(&self.out_dir) {
            return false;
        }
        let decl = &self.p.stages[self.idx];
        if decl.kind.role == Role::Sink {
            return true;
        }
        read_footer(&output_path(&self.out_dir, &decl.name))
            .map(|f| f.meta.get(FINGERPRINT_KEY).map(String::as_str) == Some(fp))
            .unwrap_or(false)
    }
}

/// Check the failure ratio, then commit: failures, outputs, state record.
fn finish_stage(
    out_dir: &Path,
    decl: &crate::pipeline::StageDecl,
    fp: &str,
    parts: FingerprintParts,
    mut ctx: RunCtx,
) -> Result<(StageState, Option<FailureNote>)> {
    let failures = ctx.failures.take();
    let n_failed = failures.len() as u64;
    ctx.report.rows_failed = n_failed;
    // The first in the table's order (by id), so the warning is the same every run.
    let first =
        failures.iter().min_by(|a, b| a.id.cmp(&b.id).then_with(|| a.kind.as_str().cmp(b.kind.as_str()))).cloned();
    let fpath = failures_path(out_dir, &decl.name);
    let note = first.as_ref().map(|f| FailureNote {
        count: n_failed,
        first: format!("{}: {}: {}", f.id, f.kind.as_str(), f.message),
        path: fpath.clone(),
    });
    let failures_rec = if n_failed > 0 {
        let pending = write_failures(&fpath, failures, ctx.footer_meta())?;
        let bytes = pending.bytes();
        pending.commit()?;
        Some(OutputRecord { path: relative_to(out_dir, &fpath), bytes, rows: Some(n_failed) })
    } else {
        if fpath.exists() {
            std::fs::remove_file(&fpath).with_context(|| format!("removing stale {}", fpath.display()))?;
        }
        None
    };
    let denominator = ctx.report.rows_in.max(n_failed).max(1);
    let ratio = n_failed as f64 / denominator as f64;
    if n_failed > 0 && ratio > decl.max_failure_ratio {
        let first = first.map(|f| format!("; first: {}: {}", f.id, f.message)).unwrap_or_default();
        anyhow::bail!(
            "{n_failed} of {denominator} records failed ({:.1}% > max_failure_ratio {:.1}%){first}; all failures are in {}",
            ratio * 100.0,
            decl.max_failure_ratio * 100.0,
            fpath.display()
        );
    }
    let mut outputs = Vec::new();
    if let Some((pending, rows)) = ctx.output.take() {
        let bytes = pending.bytes();
        let dest = pending.commit()?;
        outputs.push(OutputRecord { path: relative_to(out_dir, &dest), bytes, rows: Some(rows) });
    }
    for (pending, rows) in ctx.artifacts.drain(..) {
        let bytes = pending.bytes();
        let dest = pending.commit()?;
        outputs.push(OutputRecord { path: relative_to(out_dir, &dest), bytes, rows });
    }
    let state = StageState {
        stage: decl.name.clone(),
        kind: decl.kind.name.to_string(),
        fingerprint: fp.to_string(),
        parts,
        outputs,
        failures: failures_rec,
        report: ctx.report.clone(),
        finished_at: now_rfc3339(),
    };
    state.save(out_dir)?;
    Ok((state, note))
}
