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
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::fingerprint::{combine, config_part, explain};
use crate::pipeline::Pipeline;
use synth_core::progress::ProgressHub;
use synth_core::store::atomic::clean_debris;
use synth_core::store::failures::write_failures;
use synth_core::store::filehash::FileHasher;
use synth_core::store::lease::Lease;
use synth_core::store::lock::{PipelineLock, StageLock, Upstream};
use synth_core::store::object::StateStore;
use synth_core::store::parquet::FINGERPRINT_KEY;
use synth_core::store::state::{
    FingerprintParts, INTERNAL_DIR, MANIFEST, Manifest, ManifestStage, OutputRecord, PipelineInfo, RunStatus,
    StageReport, StageState, StageStatus, now_rfc3339, relative_to,
};
use synth_engine::services::Services;
use synth_engine::services::batch::Detached;
use synth_engine::stages::{Cancelled, Input, PrepareCtx, Prepared, Role, RunCtx, failures_path, output_path};

#[derive(Clone, Default)]
pub struct RunOptions {
    /// The output directory (when `state` is `None`).
    pub out_dir: PathBuf,
    /// Where outputs and state live when not in `out_dir`: an object store worked on
    /// through a local mirror (`synth run --state URL`).
    pub state: Option<StateStore>,
    pub only: Option<String>,
    pub from: Option<String>,
    pub until: Option<String>,
    pub limit: Option<u64>,
    pub force: bool,
    pub dry_run: bool,
    /// Lifetime of the coordinator's lease on an object store (renewed every third).
    pub lease_ttl: Option<Duration>,
    /// A part of a sharded run (`dag::shard` sets it): which stages run how, and where
    /// their inputs come from.
    pub role: Option<Arc<dyn ShardPart>>,
    /// With `dry_run`: resolve upstreams over the network (without downloading) so every
    /// stage's fingerprint is known (`synth lock`, `synth regenerate`).
    pub resolve_only: bool,
    /// `synth run --locked`: upstreams resolve to the versions of this `synth.lock` entry,
    /// and a stage reading a file whose content differs from the lock fails.
    pub lock: Option<Arc<PipelineLock>>,
    /// Batch stages stop once their batches are submitted; a later run collects them.
    pub detach: bool,
    /// Overrides `[pipeline] max_cost_usd` for this run (`synth regenerate --max-cost-usd`).
    pub max_cost_usd: Option<f64>,
    /// `--dry-run`'s estimate: this run is its simulation (calls counted and stood in,
    /// `services::estimate`), reading the response cache in the given directory.
    pub estimate: Option<(Arc<synth_engine::services::estimate::Estimator>, PathBuf)>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("out_dir", &self.out_dir)
            .field("state", &self.state.as_ref().map(StateStore::display))
            .field("only", &self.only)
            .field("from", &self.from)
            .field("until", &self.until)
            .field("limit", &self.limit)
            .field("force", &self.force)
            .field("dry_run", &self.dry_run)
            .field("lease_ttl", &self.lease_ttl)
            .field("resolve_only", &self.resolve_only)
            .field("locked", &self.lock.is_some())
            .field("detach", &self.detach)
            .field("max_cost_usd", &self.max_cost_usd)
            .finish()
    }
}

/// Default lifetime of a lease (renewed every third of it while the holder works).
pub const LEASE_TTL: Duration = Duration::from_secs(60);

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
    /// A sharded run's part whose prerequisites are not there yet (the wave is not
    /// planned, shards are missing): exit 75, try again later.
    #[error("{0}")]
    NotReady(String),
    /// Another run holds the output directory: exit 75.
    #[error("{0}")]
    Busy(String),
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
    /// What the fingerprint was computed from and the upstream versions the stage
    /// resolved to (when it got that far).
    pub resolved: Option<Resolved>,
}

/// A stage's fingerprint parts and resolved upstreams.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub parts: FingerprintParts,
    pub upstream: Vec<Upstream>,
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
    /// The local directory the run worked in (the output directory, or the mirror of
    /// an object store).
    pub out_dir: PathBuf,
    /// Where the outputs are: the output directory, or the object store URL.
    pub location: String,
    /// Bytes this run (and, for a sharded run, its shards) sent to and read from an
    /// object store: (up, down); zero for a local directory.
    pub traffic: (u64, u64),
}

impl RunSummary {
    pub fn n_ran(&self) -> usize {
        self.lines.iter().filter(|l| l.status == StageStatus::Ran).count()
    }
}

/// What a part of a sharded run changes in the runner: which stages run how, where their
/// inputs come from, what a shard's services share, and how a coordinator step completes a
/// wave stage from its shards' parts. `dag::shard` provides it (the runner knows nothing
/// of waves and shards beyond this).
#[async_trait::async_trait]
pub trait ShardPart: Send + Sync {
    /// How each stage is treated (`None`: not in this part).
    fn modes(&self) -> Vec<Option<Mode>>;
    /// The local file stage `idx` reads as `input`, instead of the input's output.
    fn input_path(&self, idx: usize, input: &str) -> Option<PathBuf>;
    /// Stage `idx`'s whole first input, for fitting.
    fn whole_input(&self, idx: usize) -> Option<PathBuf>;
    /// For a split-input stage running as a shard: the global positions of the records
    /// of its part of the split input.
    fn part_positions(&self, idx: usize) -> Result<Option<Vec<u64>>>;
    /// For a stage dividing its own work, running as a shard: its part and the count.
    fn own_part(&self, idx: usize) -> Option<(usize, usize)>;
    /// Stage `idx` runs as a shard (on its part of the records).
    fn sharded(&self, idx: usize) -> bool;
    /// The stage of this name runs as a shard somewhere in the run.
    fn sharded_name(&self, name: &str) -> bool;
    /// The error for a stage this part needs complete and finds out of date.
    fn not_up_to_date(&self, name: &str, reason: &str) -> String;
    /// This part's services (its share of the limits, the caches it reads).
    fn services(&self, p: &Pipeline, out_dir: &Path) -> Arc<Services>;
    /// After stage `idx` ran as a shard: the entry position of each output row.
    fn write_keys(&self, idx: usize, ctx: &mut RunCtx) -> Result<()>;
    /// A coordinator step: complete a wave stage by merging its shards' parts.
    async fn merge(
        &self,
        decl: &crate::pipeline::StageDecl,
        fp: &str,
        ctx: &mut RunCtx,
        store: &StateStore,
    ) -> Result<()>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Run unless up to date (or forced).
    Run { forced: bool },
    /// Only check it is up to date (an input of `--only`, or of a step of a sharded run).
    Check,
    /// Dry run: report, never run.
    Plan { forced: bool },
    /// Complete elsewhere with this fingerprint: an input of a shard's wave, read from
    /// the merged state (`dag::shard`).
    Given(String),
    /// Complete it by merging the parts its shards committed (`dag::shard`), unless up
    /// to date.
    Merge,
}

enum Outcome {
    UpToDate { fp: String, state: Box<StageState>, resolved: Resolved },
    Ran { fp: String, resolved: Resolved, ctx: Box<RunCtx> },
    NotUpToDate { reason: String },
    WouldRun { fp: Option<String>, reason: String, resolved: Option<Resolved> },
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

/// Run (or plan) the pipeline: choose which stages take part ([`select_modes`]), open
/// the output directory ([`open_run`]), start each stage once its inputs are done and
/// settle it when it ends ([`Scheduler`]), then close the run ([`Scheduler::finish`]).
pub async fn run(
    p: Arc<Pipeline>,
    opts: RunOptions,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> Result<RunSummary, RunError> {
    let modes = select_modes(&p, &opts)?;
    let opened = open_run(&p, &opts, &hub, &cancel).await?;
    let mut s = Scheduler::new(p, opts, hub, cancel, modes, opened);
    let mut tasks: JoinSet<TaskResult> = JoinSet::new();
    loop {
        if !s.stopping {
            s.start_ready(&mut tasks);
        }
        if tasks.is_empty() {
            break;
        }
        let joined = tokio::select! {
            _ = s.cancel.cancelled(), if !s.stopping => {
                s.stopping = true;
                tracing::warn!("interrupted: no new stages start; stages in flight finish what they hold");
                continue;
            }
            joined = tasks.join_next() => joined,
        };
        let Some(joined) = joined else { break };
        match joined {
            Ok(r) => s.settle(r).await,
            Err(e) => {
                s.errors.push(format!("a stage task panicked: {e}"));
                s.stopping = true;
            }
        }
    }
    s.finish().await
}

/// Which stages take part, and how: every stage runs, unless `--from`, `--until`, `--only`,
/// a shard's role or `--dry-run` say otherwise (`None`: not selected).
fn select_modes(p: &Pipeline, opts: &RunOptions) -> Result<Vec<Option<Mode>>, RunError> {
    let n = p.stages.len();
    let mut modes: Vec<Option<Mode>> = vec![Some(Mode::Run { forced: opts.force }); n];
    let find = |name: &str, flag: &str| {
        p.stage_index(name).ok_or_else(|| {
            let hint = synth_core::config::diag::did_you_mean(name, p.stages.iter().map(|s| s.name.as_str()))
                .unwrap_or_default();
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
    if let Some(role) = &opts.role {
        modes = role.modes();
    }
    if opts.dry_run {
        for m in modes.iter_mut().flatten() {
            if let Mode::Run { forced } = m {
                *m = Mode::Plan { forced: *forced };
            }
        }
    }
    Ok(modes)
}

/// What a run holds from its start to its end besides the stages.
struct Opened {
    store: StateStore,
    out_dir: PathBuf,
    /// The output directory's lock (none in a dry run), held until the run ends.
    _lock: Option<std::fs::File>,
    /// The coordinator's lease on an object store.
    lease: Option<Lease>,
    review: Arc<synth_quality::review::Review>,
    manifest: Manifest,
    hasher: Arc<Mutex<FileHasher>>,
    services: Arc<Services>,
}

/// Open the run: create, lock and clear the output directory (debris of interrupted runs);
/// on an object store, take the coordinator's lease and bring the state records into the
/// mirror; read the review decisions; write the manifest; make the run's services.
async fn open_run(
    p: &Arc<Pipeline>,
    opts: &RunOptions,
    hub: &Arc<ProgressHub>,
    cancel: &CancellationToken,
) -> Result<Opened, RunError> {
    let store = opts.state.clone().unwrap_or_else(|| StateStore::local(&opts.out_dir));
    let out_dir = store.dir().to_path_buf();
    let lock = if opts.dry_run { None } else { Some(prepare_out_dir(&out_dir).await?) };
    if !opts.dry_run && opts.state.is_none() {
        hub.write_live_to(out_dir.join(INTERNAL_DIR).join(synth_core::progress::LIVE_FILE));
    }
    let lease = match (&opts.role, store.is_remote() && !opts.dry_run) {
        (None, true) => Some(
            Lease::acquire(&store, COORDINATOR_LEASE, opts.lease_ttl.unwrap_or(LEASE_TTL), "coordinator of this run")
                .await
                .map_err(|e| RunError::Failed(format!("{e:#}")))?,
        ),
        _ => None,
    };
    if let Some(lease) = &lease {
        // A lost lease stops the run before its next commit.
        let (lost, cancel) = (lease.lost(), cancel.clone());
        tokio::spawn(async move {
            lost.cancelled().await;
            cancel.cancel();
        });
    }
    store.pull_state().await.map_err(fail)?;
    // The review decisions: read once, before anything runs; a bad line stops the run here
    // (exit 78, file and line), with nothing made lost.
    let review = Arc::new(
        synth_quality::review::Review::load(&out_dir.join(synth_quality::review::FILE))
            .map_err(|e| RunError::Usage(format!("{e}")))?,
    );
    let previous = Manifest::load(&out_dir).ok();
    let mut manifest = new_manifest(p, &previous);
    if !opts.dry_run {
        save_manifest(&mut manifest, &store).await.map_err(fail)?;
    }
    // A dry run reads the memo (an unchanged input is not read again) but never saves it.
    let hasher = Arc::new(Mutex::new(FileHasher::load(&out_dir)));
    let services = match &opts.role {
        Some(role) => role.services(p, &out_dir),
        None => Services::new(&out_dir, &p.root, p.providers.clone(), p.embedders.clone(), p.registry.catalog()),
    };
    services.set_run_options(opts.detach, opts.max_cost_usd.or(p.max_cost_usd));
    if let Some((estimate, cache_dir)) = &opts.estimate {
        services.set_estimate(estimate.clone(), cache_dir.clone());
    }
    Ok(Opened { store, out_dir, _lock: lock, lease, review, manifest, hasher, services })
}

/// The run's stages as they go: each node's state, the manifest kept current, a line per
/// stage for the summary, the errors met, and whether new stages may still start.
struct Scheduler {
    p: Arc<Pipeline>,
    opts: RunOptions,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
    modes: Vec<Option<Mode>>,
    run: Opened,
    nodes: Vec<Node>,
    lines: BTreeMap<usize, StageLine>,
    errors: Vec<String>,
    /// Stages whose batches run at the provider (`--detach`).
    detached: Vec<String>,
    /// No new stage starts (a failure, an interruption).
    stopping: bool,
}

impl Scheduler {
    fn new(
        p: Arc<Pipeline>,
        opts: RunOptions,
        hub: Arc<ProgressHub>,
        cancel: CancellationToken,
        modes: Vec<Option<Mode>>,
        mut run: Opened,
    ) -> Scheduler {
        let nodes: Vec<Node> = modes
            .iter()
            .map(|m| match m {
                None => Node::Skipped,
                Some(Mode::Given(fp)) => Node::Done(Some(fp.clone())),
                Some(_) => Node::Pending,
            })
            .collect();
        for (i, node) in nodes.iter().enumerate() {
            if matches!(node, Node::Skipped | Node::Done(_))
                && let Some(ms) = run.manifest.stages.get_mut(&p.stages[i].name)
            {
                ms.status = StageStatus::Skipped;
            }
        }
        Scheduler {
            p,
            opts,
            hub,
            cancel,
            modes,
            run,
            nodes,
            lines: BTreeMap::new(),
            errors: Vec::new(),
            detached: Vec::new(),
            stopping: false,
        }
    }

    /// Start every pending stage whose inputs are done (cancel those whose inputs failed);
    /// a stage waiting on a network provider runs on the network runtime.
    fn start_ready(&mut self, tasks: &mut JoinSet<TaskResult>) {
        let p = self.p.clone();
        for &i in &p.graph.order {
            if self.nodes[i] != Node::Pending {
                continue;
            }
            let ins = &p.graph.inputs[i];
            if ins.iter().any(|&k| matches!(self.nodes[k], Node::Failed | Node::Cancelled)) {
                self.nodes[i] = Node::Cancelled;
                continue;
            }
            if !ins.iter().all(|&k| matches!(self.nodes[k], Node::Done(_))) {
                continue;
            }
            let input_fps: BTreeMap<String, Option<String>> = ins
                .iter()
                .map(|&k| {
                    let fp = match &self.nodes[k] {
                        Node::Done(fp) => fp.clone(),
                        _ => None,
                    };
                    (p.stages[k].name.clone(), fp)
                })
                .collect();
            self.nodes[i] = Node::Running;
            let opts = &self.opts;
            if let Some(ms) = self.run.manifest.stages.get_mut(&p.stages[i].name)
                && !opts.dry_run
            {
                ms.status = StageStatus::Running;
            }
            let services = &self.run.services;
            let job = StageJob {
                p: p.clone(),
                idx: i,
                mode: self.modes[i].clone().expect("selected"),
                input_fps,
                out_dir: self.run.out_dir.clone(),
                limit: opts.limit,
                cancel: self.cancel.clone(),
                hub: self.hub.clone(),
                hasher: self.run.hasher.clone(),
                services: services.clone(),
                store: self.run.store.clone(),
                role: opts.role.clone(),
                dry_run: opts.dry_run,
                resolve_only: opts.resolve_only && opts.dry_run,
                estimating: opts.estimate.is_some(),
                lock: opts.lock.clone(),
                review: self.run.review.clone(),
            };
            let task = async move {
                let idx = job.idx;
                TaskResult { idx, outcome: job.run().await }
            };
            let net = if p.stages[i].stage.network_bound(services) && !opts.dry_run {
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

    /// A stage ended: its node, its line, the manifest (saved), and whether the run stops.
    async fn settle(&mut self, TaskResult { idx, outcome }: TaskResult) {
        let p = self.p.clone();
        let decl = &p.stages[idx];
        let name = decl.name.clone();
        let mut line = StageLine {
            stage: name.clone(),
            kind: decl.kind.name.to_string(),
            status: StageStatus::Pending,
            reason: None,
            report: None,
            fingerprint: None,
            failures: None,
            resolved: None,
        };
        let (opts, run) = (&self.opts, &mut self.run);
        let manifest = &mut run.manifest;
        match outcome {
            Ok(Outcome::UpToDate { fp, state, resolved }) => {
                line.resolved = Some(resolved);
                line.fingerprint = Some(fp.clone());
                self.nodes[idx] = Node::Done(Some(fp.clone()));
                line.status = StageStatus::UpToDate;
                line.report = Some(state.report.clone());
                set_manifest(manifest, &name, StageStatus::UpToDate, Some(fp), Some(&state), None);
            }
            Ok(Outcome::WouldRun { fp, reason, resolved }) => {
                line.resolved = resolved;
                line.fingerprint = fp.clone();
                self.nodes[idx] = Node::Done(fp);
                line.status = StageStatus::Pending;
                line.reason = Some(reason);
            }
            Ok(Outcome::NotUpToDate { reason }) => {
                self.nodes[idx] = Node::Failed;
                self.errors.push(match (&opts.role, &opts.only) {
                    (Some(role), _) => role.not_up_to_date(&name, &reason),
                    (None, only) => format!(
                        "stage \"{}\" depends on \"{name}\", which is not up to date ({reason}); run without --only (or with --from {name})",
                        only.clone().unwrap_or_default()
                    ),
                });
                line.status = StageStatus::Failed;
                self.stopping = true;
            }
            Ok(Outcome::Ran { fp, resolved, ctx }) => {
                match finish_stage(&run.store, decl, &fp, resolved.parts.clone(), *ctx, &opts.role, &run.lease).await {
                    Ok((state, failures)) => {
                        line.resolved = Some(resolved);
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
                        self.nodes[idx] = Node::Done(Some(fp.clone()));
                        line.status = StageStatus::Ran;
                        line.report = Some(state.report.clone());
                        set_manifest(manifest, &name, StageStatus::Ran, Some(fp), Some(&state), None);
                    }
                    Err(e) => {
                        let msg = stage_error(&name, &e, &run.out_dir);
                        tracing::error!("{msg}");
                        self.errors.push(msg.clone());
                        self.nodes[idx] = Node::Failed;
                        line.status = StageStatus::Failed;
                        set_manifest(manifest, &name, StageStatus::Failed, None, None, Some(msg));
                        self.stopping = true;
                    }
                }
            }
            Err(e) if e.downcast_ref::<Detached>().is_some() => {
                // Its batches run at the provider; what depends on it waits for the next run.
                self.nodes[idx] = Node::Cancelled;
                line.status = StageStatus::Waiting;
                line.reason = Some(e.to_string());
                tracing::info!("{e}");
                self.detached.push(e.to_string());
                set_manifest(manifest, &name, StageStatus::Waiting, None, None, None);
            }
            Err(e) if e.downcast_ref::<Cancelled>().is_some() => {
                self.nodes[idx] = Node::Cancelled;
                line.status = StageStatus::Cancelled;
                set_manifest(manifest, &name, StageStatus::Cancelled, None, None, None);
            }
            Err(e) => {
                let msg = stage_error(&name, &e, &run.out_dir);
                if !opts.dry_run {
                    tracing::error!("{msg}");
                }
                self.errors.push(msg.clone());
                self.nodes[idx] = Node::Failed;
                line.status = StageStatus::Failed;
                line.reason = Some(msg.clone());
                set_manifest(manifest, &name, StageStatus::Failed, None, None, Some(msg));
                self.stopping = true;
            }
        }
        self.lines.insert(idx, line);
        if !opts.dry_run
            && let Err(e) = save_manifest(&mut run.manifest, &run.store).await
        {
            let why = synth_core::store::atomic::explain_disk_full(&e).unwrap_or_else(|| format!("{e:#}"));
            self.errors.push(format!("after stage \"{name}\", writing the manifest: {why}"));
            self.stopping = true;
        }
    }

    /// Close the run: lines for the stages never reached, the memo and the manifest saved
    /// with the run's status, the cache published to an object store, the lease released;
    /// the summary, or why the run did not complete.
    async fn finish(self) -> Result<RunSummary, RunError> {
        let Scheduler { p, opts, cancel, run, nodes, mut lines, mut errors, detached, .. } = self;
        let Opened { store, out_dir, lease, mut manifest, hasher, services, .. } = run;
        for (i, node) in nodes.iter().enumerate() {
            lines.entry(i).or_insert_with(|| StageLine {
                stage: p.stages[i].name.clone(),
                kind: p.stages[i].kind.name.to_string(),
                // Given stages (inputs of a shard, complete elsewhere) count as not selected.
                status: match node {
                    Node::Skipped | Node::Done(_) => StageStatus::Skipped,
                    _ => StageStatus::Cancelled,
                },
                reason: None,
                report: None,
                fingerprint: None,
                failures: None,
                resolved: None,
            });
        }
        let mut ordered: Vec<StageLine> = p.graph.order.iter().filter_map(|i| lines.remove(i)).collect();
        ordered.extend(lines.into_values());
        let mut summary =
            RunSummary { lines: ordered, out_dir: out_dir.clone(), location: store.display(), traffic: (0, 0) };
        if opts.dry_run {
            return Ok(summary);
        }
        let _ = hasher.lock().expect("hasher").save();
        let lost = lease.as_ref().is_some_and(|l| l.lost().is_cancelled());
        if lost {
            errors.push(format!(
                "another process took over the lease of this run's state ({}): this process stopped committing",
                store.display()
            ));
        }
        let interrupted = cancel.is_cancelled() && !lost;
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
        if store.is_remote()
            && let Err(e) = publish_cache(&services, &store).await
        {
            errors.push(format!("uploading the cache: {e:#}"));
        }
        save_manifest(&mut manifest, &store).await.map_err(fail)?;
        if let Some(lease) = lease {
            let _ = lease.release().await;
        }
        summary.traffic = store.moved();
        if interrupted {
            let done =
                summary.lines.iter().filter(|l| matches!(l.status, StageStatus::Ran | StageStatus::UpToDate)).count();
            return Err(RunError::Interrupted(format!(
                "interrupted: {done} of {} stages are complete and kept in {}; run the same command again to resume",
                p.stages.len(),
                store.display()
            )));
        }
        if !errors.is_empty() {
            return Err(RunError::Failed(format!(
                "{}\ncompleted stages are kept in {}; fix the problem and run again to resume",
                errors.join("\n"),
                store.display()
            )));
        }
        Ok(summary)
    }
}

/// The message of a stage that failed; a full disk is said in words, with what to do.
fn stage_error(name: &str, e: &anyhow::Error, out_dir: &Path) -> String {
    match synth_core::store::atomic::explain_disk_full(e) {
        Some(full) => format!(
            "stage \"{name}\": {full}; free space on the device that holds {} and run the same command again: completed stages are kept and the run resumes with \"{name}\"",
            out_dir.display()
        ),
        None => format!("stage \"{name}\": {e:#}"),
    }
}

fn fail(e: anyhow::Error) -> RunError {
    match synth_core::store::atomic::explain_disk_full(&e) {
        Some(full) => RunError::Failed(format!("{full}; free space and run the same command again to resume")),
        None => RunError::Failed(format!("{e:#}")),
    }
}

/// How long a run waits for the output directory's lock before it says another run holds
/// it. A lock is an open file description: a child process forked by any thread of this
/// process (a sibling run's worker, a training script) holds a copy of it until its `exec`
/// closes it, so a lock whose run has just ended can stay taken for a few milliseconds.
const LOCK_GRACE: Duration = Duration::from_millis(1000);

/// Create the output directory, take its lock and remove debris of interrupted runs.
pub async fn prepare_out_dir(out_dir: &Path) -> Result<std::fs::File, RunError> {
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
    let waited = Instant::now();
    let mut taken = lock.try_lock();
    while matches!(taken, Err(std::fs::TryLockError::WouldBlock)) && waited.elapsed() < LOCK_GRACE {
        tokio::time::sleep(Duration::from_millis(10)).await;
        taken = lock.try_lock();
    }
    match taken {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(RunError::Busy(format!(
                "another synth run is using {}; this one did nothing (it holds {})",
                out_dir.display(),
                lock_path.display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(RunError::Failed(format!("cannot lock {}: {e}", lock_path.display())));
        }
    }
    // Probe writability for real (a read-only mount passes the checks above for root).
    synth_core::store::atomic::write_atomic(&internal.join("probe"), b"ok")
        .map_err(|e| RunError::Failed(format!("output directory {} is not writable: {e:#}", out_dir.display())))?;
    let mut stack = vec![out_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let _ = clean_debris(&dir);
        if let Ok(read) = std::fs::read_dir(&dir) {
            for entry in read.flatten() {
                // Shards clean their own folders (`_synth/waves/`), maybe while this runs.
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false)
                    && entry.file_name() != "hub"
                    && entry.path() != internal.join("waves")
                {
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
        config: synth_core::secrets::redact(&p.resolved),
        stages,
        totals: Default::default(),
        release: None,
        quality: None,
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
    store: StateStore,
    role: Option<Arc<dyn ShardPart>>,
    dry_run: bool,
    resolve_only: bool,
    /// `--dry-run`'s simulated run: sources read only what this machine holds.
    estimating: bool,
    lock: Option<Arc<PipelineLock>>,
    review: Arc<synth_quality::review::Review>,
}

impl StageJob {
    async fn run(self) -> Result<Outcome> {
        let decl = &self.p.stages[self.idx];
        let dry = self.dry_run;
        let pins = match &self.lock {
            None => None,
            Some(lock) => Some(lock.stages.get(&decl.name).ok_or_else(|| {
                anyhow!("not in synth.lock (locked {}); run `synth lock --update` to lock it", lock.locked_at)
            })?),
        };
        let prepare_ctx = PrepareCtx {
            name: &decl.name,
            services: &self.services,
            root: &self.p.root,
            out_dir: &self.out_dir,
            offline_only: (dry || self.estimating) && !self.resolve_only,
            resolve_only: self.resolve_only,
            pins,
            limit: self.limit,
            review: &self.review,
        };
        let prepared = decl.stage.prepare(&prepare_ctx).await?;
        let unknown_input = self.input_fps.iter().find(|(_, fp)| fp.is_none()).map(|(n, _)| n.clone());
        if prepared.is_none() && self.estimating {
            anyhow::bail!(
                "the estimate reads only sources this machine holds, and this one needs the network: `synth run PIPELINE --until {}` downloads it (no model is called)",
                decl.name
            );
        }
        let Some(prepared) = prepared else {
            return Ok(Outcome::WouldRun {
                fp: None,
                reason: "needs the network to check its source".into(),
                resolved: None,
            });
        };
        if let Some(input) = unknown_input {
            return Ok(Outcome::WouldRun { fp: None, reason: format!("input \"{input}\" would run"), resolved: None });
        }
        let parts = self.parts(&prepared).await?;
        if let Some(pins) = pins {
            check_locked_files(pins, &parts)?;
        }
        let fp = combine(&parts);
        let resolved = Resolved { parts: parts.clone(), upstream: prepared.upstream.clone() };
        let state = StageState::load(&self.out_dir, &decl.name);
        let up_to_date = match &state {
            Some(s) if s.fingerprint == fp => self.outputs_match(s, &fp).await,
            _ => false,
        };
        let forced = matches!(self.mode, Mode::Run { forced: true } | Mode::Plan { forced: true });
        let reason = || {
            if forced && up_to_date { "forced".to_string() } else { explain(state.as_ref().map(|s| &s.parts), &parts) }
        };
        match self.mode {
            _ if up_to_date && !forced => {
                return Ok(Outcome::UpToDate { fp, state: Box::new(state.expect("up to date")), resolved });
            }
            Mode::Check => return Ok(Outcome::NotUpToDate { reason: reason() }),
            Mode::Plan { .. } => {
                return Ok(Outcome::WouldRun { fp: Some(fp), reason: reason(), resolved: Some(resolved) });
            }
            Mode::Given(_) => unreachable!("given stages do not run"),
            Mode::Run { .. } | Mode::Merge => {}
        }
        let merging = self.mode == Mode::Merge;
        if merging {
            tracing::info!("stage \"{}\" ({}): merging its shards ({})", decl.name, decl.kind.name, reason());
        } else {
            tracing::info!("stage \"{}\" ({}) starts: {}", decl.name, decl.kind.name, reason());
        }

        let mut inputs = Vec::new();
        if !merging {
            for name in &decl.inputs {
                let path = match self.role.as_ref().and_then(|r| r.input_path(self.idx, name)) {
                    Some(path) => path,
                    None => self.fetch_input(name).await?,
                };
                inputs.push(Input::open(name, path)?);
            }
        }
        let whole_input = match self.role.as_ref().and_then(|r| r.whole_input(self.idx)) {
            Some(path) => Some(Input::open(&decl.inputs[0], path)?),
            None => None,
        };
        let lineage = self.role.as_ref().filter(|r| r.sharded(self.idx)).map(|_| Default::default());
        let part_positions = match &self.role {
            Some(r) if !merging => r.part_positions(self.idx)?,
            _ => None,
        };
        let part = match &self.role {
            Some(r) if !merging => r.own_part(self.idx),
            _ => None,
        };
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
            lineage,
            whole_input,
            part_positions,
            part,
            review: self.review.clone(),
            ancestors: {
                let up = self.p.graph.ancestors(self.idx);
                self.p
                    .graph
                    .order
                    .iter()
                    .filter(|i| **i != self.idx && up.contains(i))
                    .map(|&i| self.p.stages[i].name.clone())
                    .collect()
            },
        };
        let started = Instant::now();
        let result = match (merging, &self.role) {
            (true, Some(role)) => role.merge(decl, &fp, &mut ctx, &self.store).await,
            _ => decl.stage.run(&mut ctx).await,
        };
        self.hub.finish(&progress);
        result?;
        if merging {
            // The shards' figures, summed by the merge; the wall time is the wave's.
            return Ok(Outcome::Ran { fp, resolved, ctx: Box::new(ctx) });
        }
        if let Some(role) = &self.role
            && role.sharded(self.idx)
        {
            role.write_keys(self.idx, &mut ctx)?;
        }
        let r = &mut ctx.report;
        r.wall_seconds = started.elapsed().as_secs_f64();
        r.requests = progress.requests.load(Ordering::Relaxed);
        r.cache_hits = progress.cache_hits.load(Ordering::Relaxed);
        r.tokens_in = progress.tokens_in.load(Ordering::Relaxed);
        r.tokens_out = progress.tokens_out.load(Ordering::Relaxed);
        r.cost_usd = progress.cost_usd();
        for (key, values) in
            [("served_model", progress.served_models()), ("system_fingerprint", progress.system_fingerprints())]
        {
            if !values.is_empty() {
                r.info.insert(key.into(), values.into_iter().collect::<Vec<_>>().join(","));
            }
        }
        if decl.kind.role != Role::Sink && ctx.output.is_none() {
            return Err(anyhow!("stage produced no output (a bug in the {} kind)", decl.kind.name));
        }
        Ok(Outcome::Ran { fp, resolved, ctx: Box::new(ctx) })
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

    /// Committed outputs are stored, unmodified, and the materialized Parquet carries
    /// the fingerprint in its footer.
    async fn outputs_match(&self, state: &StageState, fp: &str) -> bool {
        for o in state.outputs.iter().chain(state.failures.iter()) {
            let size = if std::path::Path::new(&o.path).is_absolute() {
                std::fs::metadata(&o.path).ok().map(|m| m.len())
            } else {
                self.store.size(&o.path).await.ok().flatten()
            };
            if size != Some(o.bytes) {
                return false;
            }
        }
        let decl = &self.p.stages[self.idx];
        if decl.kind.role == Role::Sink {
            return true;
        }
        let rel = relative_to(&self.out_dir, &output_path(&self.out_dir, &decl.name));
        self.store.parquet_meta(&rel).await.and_then(|m| m.get(FINGERPRINT_KEY).cloned()).as_deref() == Some(fp)
    }

    /// The local path of an input's materialized output, fetched from the store (with
    /// the files beside it, e.g. its summary) when the store is not this directory.
    async fn fetch_input(&self, name: &str) -> Result<PathBuf> {
        let local = output_path(&self.out_dir, name);
        if !self.store.is_remote() {
            return Ok(local);
        }
        let state = StageState::load(&self.out_dir, name)
            .with_context(|| format!("input \"{name}\" has no state record in {}", self.store.display()))?;
        for o in &state.outputs {
            if !std::path::Path::new(&o.path).is_absolute() {
                self.store.fetch(&o.path).await?;
            }
        }
        Ok(local)
    }
}

/// Under `--locked`: every file the stage reads has the content `synth.lock` recorded.
fn check_locked_files(pins: &StageLock, parts: &FingerprintParts) -> Result<()> {
    let mut problems = Vec::new();
    for (file, hash) in &parts.files {
        match pins.files.get(file) {
            Some(h) if h == hash => {}
            Some(_) => problems.push(format!("{file} changed since it was locked")),
            None => problems.push(format!("{file} is not in the lock")),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(anyhow!("{} (run `synth lock --update` to accept the current files)", problems.join("; ")))
}

/// Check the failure ratio, then commit: failures, outputs, state record (each
/// published to the store right after its local commit, in that order).
async fn finish_stage(
    store: &StateStore,
    decl: &crate::pipeline::StageDecl,
    fp: &str,
    parts: FingerprintParts,
    mut ctx: RunCtx,
    role: &Option<Arc<dyn ShardPart>>,
    lease: &Option<Lease>,
) -> Result<(StageState, Option<FailureNote>)> {
    if let Some(lease) = lease {
        synth_core::store::lease::check(lease, "coordinator of this run")?;
    }
    let out_dir = store.dir();
    // A shard sees only its share of the records: the merge checks the whole stage.
    let check_ratio = !role.as_ref().is_some_and(|r| r.sharded_name(&decl.name));
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
        let rel = relative_to(out_dir, &fpath);
        store.publish(&rel).await?;
        Some(OutputRecord { path: rel, bytes, rows: Some(n_failed) })
    } else {
        let rel = relative_to(out_dir, &fpath);
        if fpath.exists() || (store.is_remote() && store.size(&rel).await?.is_some()) {
            store.remove(&rel).await?;
        }
        None
    };
    let denominator = ctx.report.rows_in.max(n_failed).max(1);
    let ratio = n_failed as f64 / denominator as f64;
    if check_ratio && n_failed > 0 && ratio > decl.max_failure_ratio {
        let first = first.map(|f| format!("; first: {}: {}", f.id, f.message)).unwrap_or_default();
        anyhow::bail!(
            "{n_failed} of {denominator} records failed ({:.1}% > max_failure_ratio {:.1}%){first}; all failures are in {}",
            ratio * 100.0,
            decl.max_failure_ratio * 100.0,
            fpath.display()
        );
    }
    let mut outputs = Vec::new();
    let committed = ctx.output.take().map(|(p, rows)| (p, Some(rows))).into_iter().chain(ctx.artifacts.drain(..));
    for (pending, rows) in committed.collect::<Vec<_>>() {
        let bytes = pending.bytes();
        let dest = pending.commit()?;
        let rel = relative_to(out_dir, &dest);
        if !std::path::Path::new(&rel).is_absolute() {
            store.publish(&rel).await?;
        }
        outputs.push(OutputRecord { path: rel, bytes, rows });
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
    store.publish(&relative_to(out_dir, &synth_core::store::state::state_path(out_dir, &decl.name))).await?;
    Ok((state, note))
}

/// The lease of the coordinator of a run whose state is in an object store.
pub const COORDINATOR_LEASE: &str = "_synth/leases/coordinator.json";

/// Save the manifest locally, then publish it.
async fn save_manifest(m: &mut Manifest, store: &StateStore) -> Result<()> {
    let quality: Vec<synth_quality::summary::StageQuality> = m
        .stages
        .iter()
        .filter_map(|(name, s)| s.report.as_ref().and_then(|r| synth_quality::summary::of_stage(name, &r.metrics)))
        .collect();
    m.quality = (!quality.is_empty()).then(|| synth_quality::summary::to_json(&quality));
    m.save(store.dir())?;
    store.publish(MANIFEST).await
}

/// Upload a consistent copy of the run's cache, if the run opened one.
async fn publish_cache(services: &Services, store: &StateStore) -> Result<()> {
    let Some(cache) = services.opened_cache() else { return Ok(()) };
    let rel = format!("{INTERNAL_DIR}/{}", synth_core::store::cache::CACHE_FILE);
    let snapshot = store.dir().join(format!("{INTERNAL_DIR}/cache.snapshot.sqlite"));
    cache.flush().await?;
    let s = snapshot.clone();
    tokio::task::spawn_blocking(move || cache.snapshot(&s)).await.context("cache snapshot")??;
    store.publish_as(&snapshot, &rel).await?;
    let _ = std::fs::remove_file(&snapshot);
    Ok(())
}
