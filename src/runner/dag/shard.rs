//! Sharded runs (`synth run --shards N`): the shard protocol over a state store
//! (a directory or an object store, `store::object`). The pipeline is cut into waves
//! (`dag::waves`); a coordinator step runs the stages that need their inputs whole and
//! plans the next wave; each of the wave's N shards runs the wave's record-parallel
//! stages on the records whose id hashes to it; the next step merges the shards'
//! parts back into the input order. Every shard is an ordinary run of the runner in
//! its own directory and store prefix, so it resumes from its own state records,
//! cache and journal like any run, and commits in the same protocol order.
//!
//! In the state (relative paths; `w2-3fa9...-n7` = wave 2, plan hash, 7 shards):
//!
//! ```text
//! _synth/waves/w2-n7.json                 the current plan of wave 2 for 7 shards (the step writes it)
//! _synth/waves/w2-<hash>-n7/plan.json     the same plan, create-only, beside its parts
//! _synth/waves/w2-<hash>-n7/s00003/       shard 3: <stage>.parquet, <stage>.keys, failures,
//!                                         _synth/state/*.json, _synth/cache.sqlite, manifest.json
//! _synth/waves/w2-<hash>-n7/s00003/_done.json    its completion marker: create-only, last
//! _synth/waves/w2-<hash>-n7/s00003/lease.json    its lease (object stores; a directory: an OS lock)
//! _synth/waves/w2-<hash>-n7/merged.json   create-only, after the step merged the wave
//! ```
//!
//! A record's shard is `blake3(id)[..8] % N`. A shard reads the merged first input of
//! a wave stage, keeps its records and their positions (`_synth/entry/<input>.keys`);
//! every stage reports the input row of each output row (`stages::Lineage`), so
//! every part carries the position of the entry record each row descends from
//! (`<stage>.keys`, little-endian u64). The merge interleaves the parts by that
//! position: the rows come back in exactly the order one process writes them, and
//! since a Parquet file's bytes depend only on its rows (`store::parquet`), the merged
//! output is byte-identical to an unsharded run's, whatever N. Fingerprints never
//! contain N: a sharded run's state is an unsharded run's state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use synth_core::data::arrow::array::RecordBatch;
use tokio_util::sync::CancellationToken;

use super::runner::{self, Mode, RunError, RunOptions, RunSummary, ShardPart};
use super::waves::{Placement, Waves, shard_of};
use crate::pipeline::Pipeline;
use synth_core::progress::ProgressHub;
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::lease::{Lease, LeaseError};
use synth_core::store::object::{Conditional, StateStore};
use synth_core::store::parquet::{FINGERPRINT_KEY, ParquetOut, STAGE_KEY, open_reader};
use synth_core::store::state::{INTERNAL_DIR, StageReport, StageState, StageStatus, relative_to, state_path};
use synth_engine::services::Services;
use synth_engine::stages::{Partitioning, RunCtx};

/// Folder of the waves in a run's state.
pub const WAVES_DIR: &str = "_synth/waves";
const DONE: &str = "_done.json";
const MERGED: &str = "merged.json";
const PLAN: &str = "plan.json";
const SHARD_LEASE: &str = "lease.json";
/// A claim on a request held this long by a process of another host counts as abandoned
/// (a process of this host: as soon as it is gone).
const CLAIM_STALE: Duration = Duration::from_secs(900);

/// How a sharded run is laid out.
#[derive(Debug, Clone)]
pub struct Sharding {
    pub shards: usize,
    /// Shards running at the same time: each provider's limits are divided by it.
    pub parallel: usize,
    /// Local directory for object-store state (the coordinator's mirror and the shards'
    /// work directories).
    pub work: PathBuf,
    pub lease_ttl: Duration,
    /// Wait (polling) until a wave is planned or its shards are done, up to this long,
    /// instead of failing at once: jobs started together by a scheduler.
    pub wait: Option<Duration>,
    /// Set by launchers that start every job of a run at once (`synth emit`): a shard
    /// or step accepts only a plan written by a step of the same run id, not one left
    /// by an earlier run of the same state.
    pub run_id: Option<String>,
}

/// The plan of one wave: what its shards run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WavePlan {
    pub pipeline: String,
    pub wave: usize,
    pub shards: usize,
    /// Shards running at once; each provider's limits (configured and advertised) are
    /// divided by it, so N shards together keep to the provider's limit.
    pub rate_split: usize,
    /// The stages to run, in order, with the fingerprints the plan computed (a shard
    /// whose configuration gives another fingerprint stops: it would commit parts of
    /// another pipeline).
    pub stages: Vec<PlannedStage>,
    /// Inputs from outside the wave (merged or global), with their fingerprints.
    pub given: BTreeMap<String, String>,
    /// The plan's folder, relative to the state.
    pub dir: String,
    /// The run id of the step that wrote it (`Sharding::run_id`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlannedStage {
    pub name: String,
    pub fingerprint: String,
}

/// The completion marker of a shard.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Done {
    pub shard: usize,
    pub stages: BTreeMap<String, StageReport>,
    pub finished_at: String,
    pub host: String,
    /// Bytes the shard sent to and read from the object store (0 for a directory).
    #[serde(default)]
    pub bytes_up: u64,
    #[serde(default)]
    pub bytes_down: u64,
}

impl WavePlan {
    fn pointer(wave: usize, shards: usize) -> String {
        format!("{WAVES_DIR}/w{wave}-n{shards}.json")
    }

    pub fn shard_dir(&self, i: usize) -> String {
        format!("{}/s{i:05}", self.dir)
    }

    pub fn done_path(&self, i: usize) -> String {
        format!("{}/{DONE}", self.shard_dir(i))
    }

    /// The current plan of wave `wave` for `shards` shards, if a step wrote one.
    pub async fn load(store: &StateStore, wave: usize, shards: usize) -> Result<Option<WavePlan>> {
        match store.read(&Self::pointer(wave, shards)).await? {
            None => Ok(None),
            Some(b) => Ok(Some(serde_json::from_slice(&b).context("a wave plan")?)),
        }
    }

    /// Shards whose marker is missing.
    pub async fn missing(&self, store: &StateStore) -> Result<Vec<usize>> {
        let done: BTreeSet<String> = store.list(&format!("{}/", self.dir)).await?.into_iter().map(|(r, _)| r).collect();
        Ok((0..self.shards).filter(|&i| !done.contains(&self.done_path(i))).collect())
    }

    pub async fn merged(&self, store: &StateStore) -> Result<bool> {
        Ok(store.size(&format!("{}/{MERGED}", self.dir)).await?.is_some())
    }
}

/// What a part of a sharded run changes in the runner.
pub struct PartRole {
    modes: Vec<Option<Mode>>,
    /// (stage, input) → local file read instead of the input's output.
    inputs: BTreeMap<(usize, String), PathBuf>,
    /// Stage → its whole first input, for fitting.
    whole: BTreeMap<usize, PathBuf>,
    /// Stages running as shards → the keys file of their first input.
    keys_in: BTreeMap<usize, PathBuf>,
    /// Split-input stages running as shards → the keys file of their part of the split
    /// input (the global positions of its records).
    part_keys: BTreeMap<usize, PathBuf>,
    /// Stages dividing their own work ([`Partitioning::OwnParts`]) → `(part, parts)`.
    own_parts: BTreeMap<usize, (usize, usize)>,
    sharded_names: BTreeSet<String>,
    /// A coordinator step: the plan of the wave it merges.
    merging: Option<(WavePlan, usize)>,
    /// What to do when an earlier stage is not up to date.
    hint: String,
    /// A shard's services: its share of the limits, the run's cache to look in, and the
    /// wave's claims on requests.
    share: f64,
    fallback: Option<PathBuf>,
    claims: Option<synth_core::store::claims::Claims>,
}

#[async_trait::async_trait]
impl ShardPart for PartRole {
    fn modes(&self) -> Vec<Option<Mode>> {
        self.modes.clone()
    }

    fn input_path(&self, idx: usize, input: &str) -> Option<PathBuf> {
        self.inputs.get(&(idx, input.to_string())).cloned()
    }

    fn whole_input(&self, idx: usize) -> Option<PathBuf> {
        self.whole.get(&idx).cloned()
    }

    /// For a split-input stage running as a shard: the global positions of the records
    /// of its part of the split input.
    fn part_positions(&self, idx: usize) -> Result<Option<Vec<u64>>> {
        self.part_keys.get(&idx).map(|p| read_keys(p)).transpose()
    }

    /// For a stage dividing its own work, running as a shard: its part and the count.
    fn own_part(&self, idx: usize) -> Option<(usize, usize)> {
        self.own_parts.get(&idx).copied()
    }

    fn sharded(&self, idx: usize) -> bool {
        self.keys_in.contains_key(&idx)
    }

    fn sharded_name(&self, name: &str) -> bool {
        self.sharded_names.contains(name)
    }

    fn not_up_to_date(&self, name: &str, reason: &str) -> String {
        format!("stage \"{name}\" is not up to date ({reason}): {}", self.hint)
    }

    fn services(&self, p: &Pipeline, out_dir: &Path) -> Arc<Services> {
        let plain = || Services::new(out_dir, &p.root, p.providers.clone(), p.embedders.clone(), p.registry.catalog());
        if self.share >= 1.0 && self.fallback.is_none() && self.claims.is_none() {
            return plain();
        }
        let base = Services::new(out_dir, &p.root, p.providers.clone(), p.embedders.clone(), p.registry.catalog());
        match Services::for_shard(base, self.share, self.fallback.as_deref(), self.claims.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("the run's cache cannot be read ({e:#}); this shard uses its own only");
                plain()
            }
        }
    }

    /// After a stage ran as a shard: the entry position of each output row, from its
    /// input's positions and the stage's lineage, as the `<stage>.keys` artifact.
    fn write_keys(&self, idx: usize, ctx: &mut RunCtx) -> Result<()> {
        let lineage = ctx.lineage.as_ref().map(|l| l.take()).unwrap_or_default();
        let rows = ctx.output.as_ref().map(|(_, r)| *r).unwrap_or(0);
        if lineage.len() as u64 != rows {
            bail!(
                "the stage wrote {rows} rows but reported the input row of {} (a bug in its kind: it cannot run as shards)",
                lineage.len()
            );
        }
        let keys_in = read_keys(&self.keys_in[&idx])?;
        let mut keys = Vec::with_capacity(lineage.len());
        for r in lineage {
            keys.push(*keys_in.get(r as usize).ok_or_else(|| anyhow!("lineage points past the input ({r})"))?);
        }
        let pending = write_keys_file(&ctx.out_dir.join(format!("{}.keys", ctx.name)), &keys)?;
        ctx.add_artifact(pending, Some(keys.len() as u64));
        Ok(())
    }

    /// A coordinator step: complete a wave stage by merging its shards' parts (by their
    /// keys; a split-input stage's partial results by the stage's own `combine`).
    async fn merge(
        &self,
        decl: &crate::pipeline::StageDecl,
        fp: &str,
        ctx: &mut RunCtx,
        store: &StateStore,
    ) -> Result<()> {
        let (plan, _) = self.merging.as_ref().ok_or_else(|| anyhow!("no wave to merge"))?;
        let name = ctx.name.clone();
        let planned = plan.stages.iter().find(|s| s.name == name);
        if planned.map(|s| s.fingerprint.as_str()) != Some(fp) {
            bail!(
                "the plan of wave {} ({}) does not build this stage with fingerprint {fp}: the configuration changed since the wave was planned; run the step before it again",
                plan.wave,
                plan.dir
            );
        }
        let split = matches!(decl.partitioning, Partitioning::SplitInput { .. } | Partitioning::OwnParts);
        let mut parts = Vec::new();
        let mut report = StageReport::default();
        for i in 0..plan.shards {
            let dir = plan.shard_dir(i);
            let rec = format!("{dir}/{INTERNAL_DIR}/state/{name}.json");
            let bytes = store.read(&rec).await?.ok_or_else(|| anyhow!("shard {i}: {rec} is missing"))?;
            let state: StageState = serde_json::from_slice(&bytes).with_context(|| format!("shard {i}: {rec}"))?;
            if state.fingerprint != fp {
                bail!("shard {i} built \"{name}\" with fingerprint {}, the plan {fp}", state.fingerprint);
            }
            let data = store.fetch(&format!("{dir}/{name}.parquet")).await?;
            let keys = if split { PathBuf::new() } else { store.fetch(&format!("{dir}/{name}.keys")).await? };
            let failures = match &state.failures {
                Some(f) => Some(store.fetch(&format!("{dir}/{}", f.path)).await?),
                None => None,
            };
            add_report(&mut report, &state.report, i == 0);
            parts.push(Part { data, keys, failures });
        }
        report.info.insert("shards".into(), plan.shards.to_string());
        let collect_failures = |ctx: &mut RunCtx| -> Result<()> {
            for part in &parts {
                if let Some(f) = &part.failures {
                    for row in synth_core::store::failures::read_failures(f)?.0 {
                        ctx.failures.push(row);
                    }
                }
            }
            Ok(())
        };
        if split {
            // The stage sets what only it knows (rows in, its own facts) over the sums,
            // and which of the parts' failures stand.
            ctx.report = report;
            let outputs: Vec<synth_engine::stages::PartOutput> = parts
                .iter()
                .map(|p| synth_engine::stages::PartOutput { data: p.data.clone(), failures: p.failures.clone() })
                .collect();
            decl.stage.combine(ctx, &outputs).await?;
            let rows = ctx.output.as_ref().map(|(_, r)| *r).ok_or_else(|| anyhow!("combine wrote no output"))?;
            ctx.report.rows_out = rows;
            return Ok(());
        }
        let out_path = ctx.output_path();
        let meta = ctx.footer_meta();
        let (out, rows_in_parts) = tokio::task::spawn_blocking({
            let parts = parts.iter().map(|p| (p.data.clone(), p.keys.clone())).collect::<Vec<_>>();
            move || merge_parts(&parts, &out_path, meta)
        })
        .await
        .context("merge worker panicked")??;
        debug_assert_eq!(rows_in_parts, report.rows_out);
        collect_failures(ctx)?;
        let (pending, rows) = out.finish()?;
        ctx.output = Some((pending, rows));
        ctx.report = report;
        ctx.report.rows_out = rows;
        Ok(())
    }
}

struct Part {
    data: PathBuf,
    keys: PathBuf,
    failures: Option<PathBuf>,
}

/// Sum what the shards did (counts, and the metrics that are counts:
/// [`synth_core::store::state::additive_metric`]); descriptive facts are the first shard's.
fn add_report(into: &mut StageReport, part: &StageReport, first: bool) {
    into.rows_in += part.rows_in;
    into.rows_out += part.rows_out;
    into.requests += part.requests;
    into.cache_hits += part.cache_hits;
    into.tokens_in += part.tokens_in;
    into.tokens_out += part.tokens_out;
    into.cost_usd += part.cost_usd;
    into.wall_seconds = into.wall_seconds.max(part.wall_seconds);
    if first {
        into.info = part.info.clone();
        into.metrics = part.metrics.clone();
        return;
    }
    for (k, v) in &part.metrics {
        if synth_core::store::state::additive_metric(k) {
            *into.metrics.entry(k.clone()).or_default() += v;
        } else {
            into.metrics.entry(k.clone()).or_insert(*v);
        }
    }
}

/// Interleave the parts by their keys into one file written like one process writes
/// it. Returns the writer (to be finished) and the rows merged.
fn merge_parts(parts: &[(PathBuf, PathBuf)], dest: &Path, meta: Vec<(String, String)>) -> Result<(ParquetOut, u64)> {
    const WINDOW: usize = synth_core::store::parquet::WRITE_CHUNK_ROWS;
    struct Cursor {
        reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
        keys: Vec<u64>,
        /// Index into `keys` of the next row.
        at: usize,
        batch: Option<RecordBatch>,
        /// Next row within `batch`, and the window slot holding `batch`.
        row: usize,
        slot: usize,
        path: PathBuf,
    }
    let mut cursors = Vec::new();
    let mut schema = None;
    for (data, keys) in parts {
        let reader = open_reader(data, WINDOW)?;
        if schema.is_none() {
            schema = Some(synth_core::store::parquet::writer_schema(data)?);
        }
        let keys = read_keys(keys)?;
        if keys.windows(2).any(|w| w[0] > w[1]) {
            bail!("{}: keys out of order (a shard wrote rows out of input order)", data.display());
        }
        cursors.push(Cursor { reader, keys, at: 0, batch: None, row: 0, slot: 0, path: data.clone() });
    }
    let schema = schema.ok_or_else(|| anyhow!("no parts to merge"))?;
    let mut out = ParquetOut::create(dest, schema.clone(), meta, true)?;
    let mut window: Vec<RecordBatch> = Vec::new();
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(WINDOW);
    let mut total = 0u64;
    let flush = |schema: &synth_core::data::arrow::datatypes::SchemaRef,
                 window: &mut Vec<RecordBatch>,
                 picks: &mut Vec<(usize, usize)>,
                 out: &mut ParquetOut,
                 cursors: &mut [Cursor]|
     -> Result<()> {
        if !picks.is_empty() {
            let refs: Vec<&RecordBatch> = window.iter().collect();
            let batch = synth_core::data::arrow::compute::interleave_record_batch(&refs, picks)?;
            out.write(&batch.with_schema(schema.clone())?)?;
            picks.clear();
        }
        // Keep only the batches still being read.
        window.clear();
        for c in cursors.iter_mut() {
            if let Some(b) = &c.batch {
                c.slot = window.len();
                window.push(b.clone());
            }
        }
        Ok(())
    };
    loop {
        // The cursor whose next key is smallest (keys never tie across shards: a
        // record belongs to one shard).
        let mut best: Option<(u64, usize)> = None;
        for (ci, c) in cursors.iter().enumerate() {
            if let Some(&k) = c.keys.get(c.at) {
                match best {
                    Some((bk, _)) if bk < k => {}
                    Some((bk, bi)) if bk == k => {
                        bail!(
                            "{} and {} both hold rows of input position {k}",
                            cursors[bi].path.display(),
                            c.path.display()
                        )
                    }
                    _ => best = Some((k, ci)),
                }
            }
        }
        let Some((_, ci)) = best else { break };
        let needs_batch = cursors[ci].batch.as_ref().is_none_or(|b| cursors[ci].row >= b.num_rows());
        if needs_batch {
            let next = cursors[ci]
                .reader
                .next()
                .transpose()
                .with_context(|| format!("reading {}", cursors[ci].path.display()))?;
            let Some(b) = next else {
                bail!("{}: fewer rows than keys", cursors[ci].path.display());
            };
            cursors[ci].batch = Some(b.clone());
            cursors[ci].row = 0;
            cursors[ci].slot = window.len();
            window.push(b);
        }
        let c = &mut cursors[ci];
        picks.push((c.slot, c.row));
        c.row += 1;
        c.at += 1;
        total += 1;
        if picks.len() == WINDOW {
            flush(&schema, &mut window, &mut picks, &mut out, &mut cursors)?;
        }
    }
    flush(&schema, &mut window, &mut picks, &mut out, &mut cursors)?;
    for c in &mut cursors {
        let rest = c.batch.as_ref().map_or(0, |b| b.num_rows() - c.row)
            + c.reader.by_ref().map(|b| b.map(|b| b.num_rows()).unwrap_or(0)).sum::<usize>();
        if rest > 0 {
            bail!("{}: {rest} more rows than keys", c.path.display());
        }
    }
    Ok((out, total))
}

fn read_keys(path: &Path) -> Result<Vec<u64>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() % 8 != 0 {
        bail!("{}: not a keys file", path.display());
    }
    Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

fn write_keys_file(dest: &Path, keys: &[u64]) -> Result<synth_core::store::atomic::PendingFile> {
    let (mut file, pending) = create_tmp(dest)?;
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(&mut file);
        for k in keys {
            w.write_all(&k.to_le_bytes()).with_context(|| format!("writing {}", pending.tmp.display()))?;
        }
        w.flush().with_context(|| format!("writing {}", pending.tmp.display()))?;
    }
    finish_file(file, &pending)?;
    Ok(pending)
}

/// Keep the records of shard `shard` of `input` (their positions in `keys`), with the
/// input's footer (its fingerprint), into `dest`.
fn split_entry(input: &Path, dest: &Path, keys_dest: &Path, shard: usize, shards: usize) -> Result<u64> {
    let footer = synth_core::store::parquet::read_footer(input)?;
    let meta: Vec<(String, String)> = [FINGERPRINT_KEY, STAGE_KEY]
        .iter()
        .filter_map(|k| footer.meta.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let mut out = ParquetOut::create(dest, footer.schema.clone(), meta, false)?;
    let mut keys = Vec::new();
    let mut at = 0u64;
    for batch in open_reader(input, synth_engine::stages::exec::BATCH_ROWS)? {
        let batch = batch.with_context(|| format!("reading {}", input.display()))?;
        let ids = synth_core::data::ids(&batch);
        let mut keep = Vec::with_capacity(batch.num_rows());
        for (i, id) in ids.iter().enumerate() {
            let mine = shard_of(id.unwrap_or_default(), shards) == shard;
            if mine {
                keys.push(at + i as u64);
            }
            keep.push(mine);
        }
        at += batch.num_rows() as u64;
        let kept = synth_core::data::arrow::compute::filter_record_batch(
            &batch,
            &synth_core::data::arrow::array::BooleanArray::from(keep),
        )?;
        out.write(&kept)?;
    }
    let (pending, rows) = out.finish()?;
    write_keys_file(keys_dest, &keys)?.commit()?;
    pending.commit()?;
    Ok(rows)
}

/// The wave plan of a pipeline, with `--until` applied (stages outside it are left out).
pub fn waves(p: &Pipeline) -> Waves {
    let parts: Vec<Partitioning> = p.stages.iter().map(|s| s.partitioning).collect();
    Waves::plan(&p.graph, &parts)
}

/// The stages `opts` selects (`--until`); `None` = every stage.
fn selected(p: &Pipeline, opts: &RunOptions) -> Result<Option<BTreeSet<usize>>, RunError> {
    match &opts.until {
        None => Ok(None),
        Some(u) => match p.stage_index(u) {
            Some(k) => Ok(Some(p.graph.ancestors(k))),
            None => Err(RunError::Usage(format!("--until {u}: no such stage"))),
        },
    }
}

/// Coordinator step `k`: check the earlier steps and waves are complete, merge wave `k`
/// (when `k >= 1`), run the global stages of step `k`, and plan wave `k + 1`.
pub async fn step(
    p: Arc<Pipeline>,
    base: &RunOptions,
    sh: &Sharding,
    k: usize,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> Result<RunSummary, RunError> {
    let w = waves(&p);
    let sel = selected(&p, base)?;
    let store = base.state.clone().unwrap_or_else(|| StateStore::local(&base.out_dir));
    let fail = |e: anyhow::Error| RunError::Failed(format!("{e:#}"));
    let mut merging = None;
    if k > w.n_waves {
        return Err(RunError::Usage(format!("--step {k}: this pipeline has steps 0 to {}", w.n_waves)));
    }
    if k >= 1 {
        let plan = wait_for_plan(&store, k, sh, &cancel).await?;
        let deadline = sh.wait.map(|d| std::time::Instant::now() + d);
        let mut missing = plan.missing(&store).await.map_err(fail)?;
        while !plan.stages.is_empty()
            && !missing.is_empty()
            && deadline.is_some_and(|d| std::time::Instant::now() < d)
            && !cancel.is_cancelled()
        {
            tokio::time::sleep(Duration::from_secs(2)).await;
            missing = plan.missing(&store).await.map_err(fail)?;
        }
        if !plan.stages.is_empty() && !missing.is_empty() {
            return Err(RunError::NotReady(format!(
                "wave {k}: {} of {} shards are not done (missing: {}); run them (retry set: {}), then this step again",
                missing.len(),
                plan.shards,
                indices(&missing),
                array_expr(&missing)
            )));
        }
        merging = Some((plan, k));
    }
    let mut modes: Vec<Option<Mode>> = vec![None; p.stages.len()];
    for (i, m) in modes.iter_mut().enumerate() {
        if sel.as_ref().is_some_and(|s| !s.contains(&i)) {
            continue;
        }
        *m = match w.placement[i] {
            Placement::Step(s) if s < k => Some(Mode::Check),
            Placement::Step(s) if s == k => Some(Mode::Run { forced: false }),
            Placement::Wave(v) if v < k => Some(Mode::Check),
            Placement::Wave(v) if v == k => Some(Mode::Merge),
            Placement::Wave(v) if v == k + 1 => Some(Mode::Plan { forced: false }),
            _ => None,
        };
    }
    let role = PartRole {
        modes,
        inputs: BTreeMap::new(),
        whole: BTreeMap::new(),
        keys_in: BTreeMap::new(),
        part_keys: BTreeMap::new(),
        own_parts: BTreeMap::new(),
        sharded_names: BTreeSet::new(),
        merging: merging.clone(),
        hint: "run the earlier steps and waves of this sharded run first (`synth status` lists them)".into(),
        share: 1.0,
        fallback: None,
        claims: None,
    };
    let shard_caches: Vec<String> = match &merging {
        Some((plan, _)) => {
            (0..plan.shards).map(|i| format!("{}/{INTERNAL_DIR}/cache.sqlite", plan.shard_dir(i))).collect()
        }
        None => Vec::new(),
    };
    let opts = RunOptions { state: Some(store.clone()), role: Some(Arc::new(role)), ..base.clone() };
    if !shard_caches.is_empty() && !base.dry_run {
        // The shards' answers join the run's cache before anything else opens it.
        import_caches(&store, &shard_caches).await.map_err(fail)?;
    }
    let summary = runner::run(p.clone(), opts, hub, cancel).await?;
    if base.dry_run {
        return Ok(summary);
    }
    if let Some((plan, _)) = &merging
        && !plan.stages.is_empty()
    {
        let _ = store.create(&format!("{}/{MERGED}", plan.dir), br#"{"merged": true}"#).await.map_err(fail)?;
        // The wave's shared answers are in the run's cache now.
        if let Err(e) = store.remove_all(&format!("{}/requests", plan.dir)).await {
            tracing::warn!("removing the wave's request claims: {e:#}");
        }
    }
    if k < w.n_waves {
        let next = plan_wave(&p, &w, &summary, sel.as_ref(), k + 1, sh);
        let bytes = serde_json::to_vec_pretty(&next).expect("serializable");
        if let Conditional::Lost = store.create(&format!("{}/{PLAN}", next.dir), &bytes).await.map_err(fail)? {
            // Planned before (the same plan: the folder is named by its hash).
        }
        let pointer = WavePlan::pointer(k + 1, sh.shards);
        let local = store.dir().join(&pointer);
        synth_core::store::atomic::write_atomic(&local, &bytes).map_err(fail)?;
        store.publish(&pointer).await.map_err(fail)?;
        if next.stages.is_empty() {
            tracing::info!("wave {}: every stage is up to date; its shards have nothing to do", k + 1);
        } else {
            tracing::info!(
                "wave {} planned: {} for {} shards ({})",
                k + 1,
                next.stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
                sh.shards,
                next.dir
            );
        }
    }
    Ok(summary)
}

/// The plan of wave `k` from the step's summary: the wave's stages that would run,
/// with their fingerprints, and their inputs from outside the wave.
fn plan_wave(
    p: &Pipeline,
    w: &Waves,
    summary: &RunSummary,
    sel: Option<&BTreeSet<usize>>,
    k: usize,
    sh: &Sharding,
) -> WavePlan {
    let line = |name: &str| summary.lines.iter().find(|l| l.stage == name);
    let mut stages = Vec::new();
    for i in w.wave(&p.graph, k) {
        if sel.is_some_and(|s| !s.contains(&i)) {
            continue;
        }
        let name = &p.stages[i].name;
        if let Some(l) = line(name)
            && l.status == StageStatus::Pending
            && let Some(fp) = &l.fingerprint
        {
            stages.push(PlannedStage { name: name.clone(), fingerprint: fp.clone() });
        }
    }
    let planned: BTreeSet<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    let mut given = BTreeMap::new();
    for s in &stages {
        let i = p.stage_index(&s.name).expect("stage");
        for input in &p.stages[i].inputs {
            if !planned.contains(input.as_str())
                && let Some(fp) = line(input).and_then(|l| l.fingerprint.clone())
            {
                given.insert(input.clone(), fp);
            }
        }
    }
    let id = serde_json::json!({"stages": stages, "given": given, "shards": sh.shards, "rate_split": sh.parallel});
    let hash = blake3::hash(id.to_string().as_bytes()).to_hex()[..16].to_string();
    WavePlan {
        pipeline: p.name.clone(),
        wave: k,
        shards: sh.shards,
        rate_split: sh.parallel.clamp(1, sh.shards.max(1)),
        stages,
        given,
        dir: format!("{WAVES_DIR}/w{k}-{hash}-n{}", sh.shards),
        run_id: sh.run_id.clone(),
    }
}

async fn wait_for_plan(
    store: &StateStore,
    k: usize,
    sh: &Sharding,
    cancel: &CancellationToken,
) -> Result<WavePlan, RunError> {
    let deadline = sh.wait.map(|w| std::time::Instant::now() + w);
    loop {
        match WavePlan::load(store, k, sh.shards).await {
            Ok(Some(plan)) if sh.run_id.is_none() || plan.run_id == sh.run_id => return Ok(plan),
            Ok(_) => {}
            Err(e) => return Err(RunError::Failed(format!("{e:#}"))),
        }
        if deadline.is_none_or(|d| std::time::Instant::now() >= d) || cancel.is_cancelled() {
            return Err(RunError::NotReady(format!(
                "wave {k} is not planned yet for {} shards in {}: run step {} first (`synth run ... --shards {} --step {}`)",
                sh.shards,
                store.display(),
                k - 1,
                sh.shards,
                k - 1
            )));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Merge the shards' caches into the run's cache (answers paid for by a shard are
/// then found by any later run, whatever its shard count).
async fn import_caches(store: &StateStore, shard_caches: &[String]) -> Result<()> {
    let dir = store.dir().join(INTERNAL_DIR);
    let mut added = 0;
    for rel in shard_caches {
        if store.size(rel).await?.is_none() {
            continue;
        }
        let local = store.fetch(rel).await?;
        let d = dir.clone();
        added += tokio::task::spawn_blocking(move || synth_core::store::cache::import(&d, &local))
            .await
            .context("cache merge")??;
    }
    if added > 0 {
        tracing::info!("{added} answer(s) of the shards joined the run's cache");
    }
    Ok(())
}

/// What a shard run did.
#[derive(Debug)]
pub enum ShardOutcome {
    /// The wave has nothing to run.
    Nothing,
    /// Its marker was already there.
    AlreadyDone,
    Done(RunSummary),
}

/// Run shard `i` of wave `k`.
pub async fn shard(
    p: Arc<Pipeline>,
    base: &RunOptions,
    sh: &Sharding,
    k: usize,
    i: usize,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> Result<ShardOutcome, RunError> {
    let fail = |e: anyhow::Error| RunError::Failed(format!("{e:#}"));
    if i >= sh.shards {
        return Err(RunError::Usage(format!("--shard {i}: there are {} shards (0 to {})", sh.shards, sh.shards - 1)));
    }
    let parent = base.state.clone().unwrap_or_else(|| StateStore::local(&base.out_dir));
    let plan = wait_for_plan(&parent, k, sh, &cancel).await?;
    if plan.stages.is_empty() {
        tracing::info!("wave {k}: nothing to run");
        return Ok(ShardOutcome::Nothing);
    }
    if parent.size(&plan.done_path(i)).await.map_err(fail)?.is_some() {
        tracing::info!("wave {k} shard {i} is already done ({})", plan.done_path(i));
        return Ok(ShardOutcome::AlreadyDone);
    }
    let rel = plan.shard_dir(i);
    let work = if parent.is_remote() { sh.work.join(&rel) } else { parent.dir().join(&rel) };
    let store = parent.child(&rel, &work).map_err(fail)?;
    let what = format!("shard {i} of wave {k}");
    let lease = if store.is_remote() {
        match Lease::acquire(&store, SHARD_LEASE, sh.lease_ttl, &what).await {
            Ok(l) => Some(l),
            Err(LeaseError::Held(m)) => return Err(RunError::Failed(m)),
            Err(LeaseError::Other(e)) => return Err(fail(e)),
        }
    } else {
        None
    };
    let cancel_all = cancel.clone();
    if let Some(l) = &lease {
        let lost = l.lost();
        tokio::spawn(async move {
            lost.cancelled().await;
            cancel_all.cancel();
        });
    }

    // Which stages run here, and where their inputs come from.
    let index = |name: &str| {
        p.stage_index(name).ok_or_else(|| {
            RunError::Failed(format!(
                "the plan names an unknown stage \"{name}\": the pipeline differs from the one planned"
            ))
        })
    };
    let planned: BTreeMap<usize, &PlannedStage> =
        plan.stages.iter().map(|s| Ok((index(&s.name)?, s))).collect::<Result<_, RunError>>()?;
    let mut modes: Vec<Option<Mode>> = vec![None; p.stages.len()];
    for (name, fp) in &plan.given {
        modes[index(name)?] = Some(Mode::Given(fp.clone()));
    }
    for &idx in planned.keys() {
        modes[idx] = Some(Mode::Run { forced: false });
    }
    let mut inputs = BTreeMap::new();
    let mut whole = BTreeMap::new();
    let mut keys_in = BTreeMap::new();
    let mut part_keys = BTreeMap::new();
    let mut own_parts = BTreeMap::new();
    let entry_dir = work.join(INTERNAL_DIR).join("entry");
    for &idx in planned.keys() {
        let decl = &p.stages[idx];
        let fits = matches!(decl.partitioning, Partitioning::ByRecord(s) if s.fits_whole_input);
        if decl.partitioning == Partitioning::OwnParts {
            // Reads nothing of the pipeline's (a source): the stage divides its own work.
            own_parts.insert(idx, (i, sh.shards));
            continue;
        }
        if let Partitioning::SplitInput { split } = decl.partitioning {
            // Its inputs come from outside the wave (`dag::waves`): the split one in parts.
            for (pos, input) in decl.inputs.iter().enumerate() {
                let merged = fetch_merged(&parent, input).await.map_err(fail)?;
                if pos == split {
                    let fp = plan.given.get(input).ok_or_else(|| {
                        RunError::Failed(format!("the plan of wave {k} does not give input \"{input}\""))
                    })?;
                    let (data, keys) = entry(&merged, &entry_dir, input, fp, i, sh.shards).await.map_err(fail)?;
                    inputs.insert((idx, input.clone()), data);
                    part_keys.insert(idx, keys);
                } else {
                    inputs.insert((idx, input.clone()), merged);
                }
            }
            continue;
        }
        for (pos, input) in decl.inputs.iter().enumerate() {
            if pos == 0 && planned.keys().any(|&j| p.stages[j].name == *input) {
                keys_in.insert(idx, work.join(format!("{input}.keys")));
                continue;
            }
            let merged = fetch_merged(&parent, input).await.map_err(fail)?;
            if pos == 0 {
                let fp = &plan.given[input];
                let (data, keys) = entry(&merged, &entry_dir, input, fp, i, sh.shards).await.map_err(fail)?;
                inputs.insert((idx, input.clone()), data);
                keys_in.insert(idx, keys);
                if fits {
                    whole.insert(idx, merged);
                }
            } else {
                inputs.insert((idx, input.clone()), merged);
            }
        }
    }
    let fallback = run_cache(&parent, sh).await.map_err(fail)?;
    let role = PartRole {
        modes,
        inputs,
        whole,
        keys_in,
        part_keys,
        own_parts,
        sharded_names: planned.values().map(|s| s.name.clone()).collect(),
        merging: None,
        hint: format!("wave {k} shard {i} reads it as planned; plan the wave again (run step {})", k - 1),
        share: 1.0 / plan.rate_split.max(1) as f64,
        fallback,
        claims: Some(synth_core::store::claims::Claims::new(
            parent.clone(),
            &format!("{}/requests", plan.dir),
            CLAIM_STALE,
        )),
    };
    tracing::info!(
        "wave {k} shard {i} of {}: {} (limits divided by {})",
        plan.shards,
        plan.stages.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
        plan.rate_split
    );
    let opts = RunOptions {
        out_dir: work.clone(),
        state: Some(store.clone()),
        role: Some(Arc::new(role)),
        only: None,
        from: None,
        until: None,
        force: false,
        dry_run: true,
        ..base.clone()
    };
    // A shard whose configuration gives other fingerprints than the plan's must not run
    // (it would pay for other requests) nor complete (its parts would be merged as
    // another pipeline's): check first, as a dry run, and again after.
    let planned_ok = |summary: &RunSummary| -> Result<(), RunError> {
        for s in &plan.stages {
            let got = summary.lines.iter().find(|l| l.stage == s.name).and_then(|l| l.fingerprint.clone());
            if got.as_deref() != Some(s.fingerprint.as_str()) {
                return Err(RunError::Failed(format!(
                    "wave {k} shard {i}: stage \"{}\" has fingerprint {} here but {} in the plan ({}): this process's pipeline, profile or --set differ from the step's",
                    s.name,
                    got.unwrap_or_else(|| "none".into()),
                    s.fingerprint,
                    plan.dir
                )));
            }
        }
        Ok(())
    };
    planned_ok(&runner::run(p.clone(), opts.clone(), hub.clone(), cancel.clone()).await?)?;
    let summary = runner::run(p.clone(), RunOptions { dry_run: false, ..opts }, hub, cancel).await?;
    planned_ok(&summary)?;
    if let Some(l) = &lease {
        synth_core::store::lease::check(l, &what).map_err(fail)?;
    }
    let done = Done {
        shard: i,
        stages: summary
            .lines
            .iter()
            .filter(|l| planned.values().any(|s| s.name == l.stage))
            .filter_map(|l| Some((l.stage.clone(), l.report.clone()?)))
            .collect(),
        finished_at: synth_core::store::state::now_rfc3339(),
        host: synth_core::store::lease::hostname(),
        bytes_up: parent.moved().0,
        bytes_down: parent.moved().1,
    };
    let bytes = serde_json::to_vec_pretty(&done).expect("serializable");
    if let Conditional::Lost = parent.create(&plan.done_path(i), &bytes).await.map_err(fail)? {
        tracing::warn!("wave {k} shard {i}: another process marked it done first; its parts are the same");
    }
    if let Some(l) = lease {
        let _ = l.release().await;
    }
    Ok(ShardOutcome::Done(summary))
}

/// How the local executor starts one shard (the front end builds the command line).
pub type Launch = dyn Fn(usize, usize) -> tokio::process::Command + Send + Sync;

/// The local executor (`--executor local`): every step here, every shard as a local
/// process of this program (the same code path as a scheduler's jobs), at most
/// `sh.parallel` at once. A shard that fails or is killed stops the run after the
/// wave's other shards end; run the same command again to resume (done shards are
/// skipped, the others resume from their own state, cache and journal).
pub async fn run_local(
    p: Arc<Pipeline>,
    base: &RunOptions,
    sh: &Sharding,
    launch: &Launch,
    hub: Arc<ProgressHub>,
    cancel: CancellationToken,
) -> Result<RunSummary, RunError> {
    let w = waves(&p);
    let store = base.state.clone().unwrap_or_else(|| StateStore::local(&base.out_dir));
    let fail = |e: anyhow::Error| RunError::Failed(format!("{e:#}"));
    let mut best: BTreeMap<String, runner::StageLine> = BTreeMap::new();
    let mut last = None;
    let mut ran_here: BTreeSet<String> = BTreeSet::new();
    for k in 0..=w.n_waves {
        let summary = step(p.clone(), base, sh, k, hub.clone(), cancel.clone()).await?;
        for l in &summary.lines {
            let keep = match best.get(&l.stage) {
                None => true,
                Some(old) => old.status != StageStatus::Ran && l.status != StageStatus::Skipped,
            };
            if keep {
                best.insert(l.stage.clone(), l.clone());
            }
        }
        last = Some(summary);
        if k == w.n_waves || base.dry_run {
            break;
        }
        let plan = WavePlan::load(&store, k + 1, sh.shards)
            .await
            .map_err(fail)?
            .ok_or_else(|| RunError::Failed(format!("step {k} did not plan wave {}", k + 1)))?;
        if plan.stages.is_empty() {
            continue;
        }
        let todo = plan.missing(&store).await.map_err(fail)?;
        ran_here.insert(plan.dir.clone());
        tracing::info!(
            "wave {}: {} shard(s) to run, {} at a time ({} already done)",
            k + 1,
            todo.len(),
            sh.parallel,
            plan.shards - todo.len()
        );
        let mut failed: Vec<(usize, String)> = Vec::new();
        let mut queue = todo.iter().copied();
        let mut running = tokio::task::JoinSet::new();
        loop {
            while running.len() < sh.parallel.max(1) && !cancel.is_cancelled() {
                let Some(i) = queue.next() else { break };
                let mut cmd = launch(k + 1, i);
                running.spawn(async move { (i, cmd.status().await) });
            }
            let Some(joined) = running.join_next().await else { break };
            let (i, status) = joined.map_err(|e| RunError::Failed(format!("a shard task panicked: {e}")))?;
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => failed.push((i, describe_exit(&s))),
                Err(e) => failed.push((i, format!("could not start: {e}"))),
            }
        }
        if cancel.is_cancelled() {
            return Err(RunError::Interrupted(format!(
                "interrupted during wave {}: done shards are kept; run the same command again to resume",
                k + 1
            )));
        }
        let missing = plan.missing(&store).await.map_err(fail)?;
        if !failed.is_empty() || !missing.is_empty() {
            let why: Vec<String> = failed.iter().map(|(i, w)| format!("shard {i}: {w}")).collect();
            return Err(RunError::Failed(format!(
                "wave {}: {} of {} shards did not finish ({}); completed shards are kept in {}: run the same command again to resume (or only the retry set: --wave {} --shard {{{}}})",
                k + 1,
                missing.len(),
                plan.shards,
                why.join("; "),
                store.display(),
                k + 1,
                indices(&missing)
            )));
        }
    }
    // Traffic: the steps' (each summary has this process's so far) and the shards'.
    let mut traffic = last.as_ref().map_or((0, 0), |s| s.traffic);
    for (rel, _) in store.list(&format!("{WAVES_DIR}/")).await.map_err(fail)? {
        if rel.ends_with(DONE)
            && let Some(bytes) = store.read(&rel).await.map_err(fail)?
            && let Ok(done) = serde_json::from_slice::<Done>(&bytes)
            && ran_here.contains(rel.rsplit_once("/s").map_or("", |(dir, _)| dir))
        {
            traffic.0 += done.bytes_up;
            traffic.1 += done.bytes_down;
        }
    }
    let mut summary = last.expect("step 0 ran");
    summary.traffic = traffic;
    for l in summary.lines.iter_mut() {
        if let Some(b) = best.remove(&l.stage) {
            *l = b;
        }
    }
    if !base.dry_run {
        mark_ran(&store, &summary).await.map_err(fail)?;
    }
    Ok(summary)
}

/// The last step's manifest lists what earlier steps ran as up to date: say they ran.
async fn mark_ran(store: &StateStore, summary: &RunSummary) -> Result<()> {
    let Ok(mut m) = synth_core::store::state::Manifest::load(store.dir()) else { return Ok(()) };
    for l in &summary.lines {
        if l.status == StageStatus::Ran
            && let Some(s) = m.stages.get_mut(&l.stage)
        {
            s.status = StageStatus::Ran;
            s.report = l.report.clone();
        }
    }
    m.save(store.dir())?;
    store.publish(synth_core::store::state::MANIFEST).await
}

fn describe_exit(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended".into(),
    }
}

/// The local path of a merged (or global) stage output, fetched from the state.
async fn fetch_merged(store: &StateStore, stage: &str) -> Result<PathBuf> {
    let state = match store.read(&relative_to(store.dir(), &state_path(store.dir(), stage))).await? {
        Some(b) => {
            serde_json::from_slice::<StageState>(&b).with_context(|| format!("the state record of \"{stage}\""))?
        }
        None => bail!("stage \"{stage}\" has no state record in {}: its step has not run", store.display()),
    };
    for o in &state.outputs {
        if !Path::new(&o.path).is_absolute() {
            store.fetch(&o.path).await?;
        }
    }
    Ok(synth_engine::stages::output_path(store.dir(), stage))
}

/// This shard's records of a merged input (made once per input fingerprint).
async fn entry(
    merged: &Path,
    dir: &Path,
    input: &str,
    fp: &str,
    shard: usize,
    shards: usize,
) -> Result<(PathBuf, PathBuf)> {
    let data = dir.join(format!("{input}.parquet"));
    let keys = dir.join(format!("{input}.keys"));
    let stamp = dir.join(format!("{input}.json"));
    let want = serde_json::json!({"fingerprint": fp, "shard": shard, "shards": shards}).to_string();
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) && data.exists() && keys.exists() {
        return Ok((data, keys));
    }
    let (m, d, kf) = (merged.to_path_buf(), data.clone(), keys.clone());
    tokio::task::spawn_blocking(move || split_entry(&m, &d, &kf, shard, shards)).await.context("split worker")??;
    synth_core::store::atomic::write_atomic(&stamp, want.as_bytes())?;
    Ok((data, keys))
}

/// The run's cache, for shards to look in before paying: in place in a directory, a
/// copy downloaded once per machine from an object store.
async fn run_cache(parent: &StateStore, sh: &Sharding) -> Result<Option<PathBuf>> {
    let rel = format!("{INTERNAL_DIR}/{}", synth_core::store::cache::CACHE_FILE);
    if !parent.is_remote() {
        let p = parent.dir().join(&rel);
        return Ok(p.exists().then_some(p));
    }
    let Some(_) = parent.size(&rel).await? else { return Ok(None) };
    let copy = parent.child("", &sh.work.join("run-cache"))?;
    Ok(Some(copy.fetch(&rel).await?))
}

/// `1,4,5` for printing a retry set.
pub fn indices(v: &[usize]) -> String {
    v.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// A Slurm `--array` expression of indices (`1,4-6`).
pub fn array_expr(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = v.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end = it.next().expect("peeked");
        }
        out.push(if end == start { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_sets() {
        assert_eq!(array_expr(&[1, 4, 5, 6, 9]), "1,4-6,9");
        assert_eq!(array_expr(&[]), "");
        assert_eq!(indices(&[0, 2]), "0,2");
    }
}
