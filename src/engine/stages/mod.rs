//! The stage API: the one `Stage` trait, the `KindInfo` description of a kind, and the
//! contexts a stage sees at each phase — build (options from checked config), plan
//! (columns and checks, no side effects), prepare (resolve what it reads, for the
//! fingerprint) and run (stream records, write output). `exec` holds the shared execution
//! loops; the engine's kinds are in `kinds` (one file each), a method's in its folder, and
//! the registry joins both.
//!
//! Stages never see TOML and never commit files: they hand finished temporary files
//! to the engine, which commits them only when the stage as a whole succeeded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use serde::de::DeserializeOwned;
use synth_core::data::arrow::datatypes::SchemaRef;
use tokio_util::sync::CancellationToken;

use crate::services::Services;
use synth_core::config::decl::Decl;
use synth_core::config::diag::{Diagnostics, stage_subject};
use synth_core::config::options::{OptionSpans, OptionSpec};
use synth_core::hub::{HubFiles, HubSpec};
use synth_core::progress::StageProgress;
use synth_core::store::atomic::PendingFile;
use synth_core::store::failures::FailureLog;
use synth_core::store::lock::{StageLock, Upstream};
use synth_core::store::parquet::{FINGERPRINT_KEY, Footer, ParquetOut, STAGE_KEY};
use synth_core::store::state::StageReport;

pub mod exec;

/// What a stage kind is in the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads data from outside the pipeline; takes no inputs.
    Source,
    /// Turns inputs into a materialized Parquet output.
    Transform,
    /// Writes an export; nothing consumes it.
    Sink,
}

/// How a stage can be split across machines (`dag::waves` places it): kinds that
/// process each record of their first input on its own, in input order, say so for
/// the configuration at hand; everything else needs its inputs whole and runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioning {
    /// The stage needs its inputs whole (sampling, joins, aggregates, exports, sources).
    Whole,
    /// Each record of the first input is processed on its own, in input order; other
    /// inputs are read whole. The stage reports, per output row, the input row it came
    /// from ([`Lineage`]): the merge restores the input order by it.
    ByRecord(Sharding),
    /// The records of input `split` (e.g. a retrieval corpus) are divided among the
    /// shards by id hash; the other inputs are read whole. Each shard writes a partial
    /// result in the stage's own layout (it knows the global position of each of its
    /// records: [`RunCtx::part_positions`]), and the merge step combines the partials
    /// with [`Stage::combine`], exactly. Always worth a wave (heavy); the stage's inputs
    /// are complete before its wave, and its output only after the merge.
    SplitInput { split: usize },
    /// The stage divides its own work into one part per shard (a source splits its
    /// files at line or row boundaries: [`RunCtx::part`]); each shard writes a partial
    /// result and the merge step combines the partials with [`Stage::combine`], exactly.
    /// A wave of its own, like [`Partitioning::SplitInput`].
    OwnParts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sharding {
    /// Worth a wave of its own (LLM calls, embeddings), unlike a filter or a map.
    pub heavy: bool,
    /// The stage first fits statistics on its whole first input (a TF-IDF): in a shard it
    /// reads the merged input for fitting ([`RunCtx::whole_input`]) and its share of the
    /// records for the work.
    pub fits_whole_input: bool,
}

impl Sharding {
    pub const LIGHT: Partitioning = Partitioning::ByRecord(Sharding { heavy: false, fits_whole_input: false });
    pub const HEAVY: Partitioning = Partitioning::ByRecord(Sharding { heavy: true, fits_whole_input: false });
}

/// What a stage may look at to say how it can be split: the declarations it refers to.
pub struct PartitionCtx<'a> {
    pub providers: &'a BTreeMap<String, Decl>,
    pub embedders: &'a BTreeMap<String, Decl>,
    /// The stage's `shard` option: `Some(true)` asks for shards where the kind would
    /// otherwise judge its work too small for a wave of its own.
    pub shard: Option<bool>,
}

/// A shard's partial result of a [`Partitioning::SplitInput`] or
/// [`Partitioning::OwnParts`] stage, as the merge step hands it to [`Stage::combine`].
pub struct PartOutput {
    /// The partial output (the stage's own layout).
    pub data: PathBuf,
    /// The shard's failure table for the stage, if it recorded any.
    pub failures: Option<PathBuf>,
}

impl PartOutput {
    /// Record this part's failures as the stage's (a combine that keeps the part's work).
    pub fn keep_failures(&self, ctx: &RunCtx) -> Result<()> {
        if let Some(f) = &self.failures {
            for row in synth_core::store::failures::read_failures(f)?.0 {
                ctx.failures.push(row);
            }
        }
        Ok(())
    }
}

/// How many inputs a stage kind takes.
#[derive(Debug, Clone, Copy)]
pub enum Arity {
    None,
    Exactly(usize),
    AtLeast(usize),
}

/// Static description of a stage kind.
pub struct KindInfo {
    pub name: &'static str,
    /// Bump when the kind's output for the same config changes; part of fingerprints.
    pub version: u32,
    pub about: &'static str,
    pub role: Role,
    pub arity: Arity,
    pub options: &'static [OptionSpec],
    /// Whether the output depends on the pipeline seed.
    pub uses_seed: bool,
    /// Whether it writes `<stage>.summary.parquet` (the summary protocol, `store::summary`),
    /// which `report` reads.
    pub summary: bool,
    /// The stage's options in their simplest valid form (TOML lines of its table, without
    /// `kind` and `inputs`; paths relative to the repository root). The conformance test
    /// validates it for every registered kind, with `inputs` of unknown columns (`in0`,
    /// `in1`, ...), a provider `p` and an embedder `e`; an example that starts with
    /// `inputs = [...]` names its own and may add their tables after its keys.
    pub example: &'static str,
    pub build: fn(&BuildCtx<'_>, &mut Diagnostics) -> Option<Box<dyn Stage>>,
}

impl KindInfo {
    /// What most kinds are: version 1, a transform of exactly one input, without the seed
    /// and without a summary. A kind's static says what differs and takes the rest from
    /// here (`..KindInfo::DEFAULT`); its `name`, `about`, `options`, `example` and `build`
    /// are always its own (tests/tidy.rs checks that every static names them).
    pub const DEFAULT: KindInfo = KindInfo {
        name: "",
        version: 1,
        about: "",
        role: Role::Transform,
        arity: Arity::Exactly(1),
        options: &[],
        uses_seed: false,
        summary: false,
        example: "",
        build: |_, _| None,
    };
}

impl std::fmt::Debug for KindInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KindInfo({})", self.name)
    }
}

/// Options every stage takes, handled by the engine.
pub const COMMON_OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("kind", synth_core::config::options::Ty::Str, "stage kind (see `synth list`)"),
    OptionSpec::default("inputs", synth_core::config::options::Ty::StrList, "[]", "names of the stages this stage reads"),
    OptionSpec::optional(
        "max_failure_ratio",
        synth_core::config::options::RATIO,
        "abort the run when more than this share of records fail (default: [pipeline] max_failure_ratio)",
    ),
    OptionSpec::optional("description", synth_core::config::options::Ty::Str, "free text").runtime_only(),
    OptionSpec::optional(
        "shard",
        synth_core::config::options::Ty::Bool,
        "in a sharded run (`--shards N`): false runs this record-parallel stage once; true gives a cheap one (filter, map) a wave of its own and splits a source of any size (a hub dataset or URL only then)",
    )
    .runtime_only(),
];

/// The one trait every stage kind implements.
#[async_trait]
pub trait Stage: Send + Sync {
    /// Output columns given the inputs' columns (`None` = not known before running),
    /// plus stage-specific checks reported through `ctx`. No network, no writes.
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef>;

    /// Resolve what the stage will read (files, remote revisions) for the fingerprint.
    /// With `ctx.offline_only` it must not touch the network and may return
    /// `Ok(None)` for "cannot tell".
    async fn prepare(&self, _ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        Ok(Some(Prepared::default()))
    }

    /// Produce the output: read inputs, write through `ctx`, record failures.
    async fn run(&self, ctx: &mut RunCtx) -> Result<()>;

    /// Whether the stage's work is waiting on a network provider (then the runner runs
    /// it on the network runtime, `llm/net.rs`, where its calls need no hand-over).
    fn network_bound(&self, _services: &Services) -> bool {
        false
    }

    /// Whether the stage can run as shards of a wave (`synth run --shards N`); the
    /// default, [`Partitioning::Whole`], runs it once.
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Partitioning::Whole
    }

    /// Why this configuration of the stage runs once (said when `shard = true` asks for
    /// shards it cannot have); `None` for the kind's general reason.
    fn why_whole(&self) -> Option<String> {
        None
    }

    /// For a kind whose [`Partitioning::SplitInput`] or [`Partitioning::OwnParts`]
    /// divides its work among shards: the merge step's work. `parts` are the shards'
    /// partial outputs in shard order; the stage writes its complete output through
    /// `ctx` (no inputs are open), exactly as one process over the whole input writes
    /// it, and records the failures that stand ([`PartOutput::keep_failures`]).
    async fn combine(&self, _ctx: &mut RunCtx, _parts: &[PartOutput]) -> Result<()> {
        anyhow::bail!("this stage kind cannot combine partial results (a bug: it declared SplitInput or OwnParts)")
    }
}

/// Build phase: the checked options of one stage.
pub struct BuildCtx<'a> {
    pub name: &'a str,
    pub options: &'a serde_json::Value,
    pub spans: &'a OptionSpans,
    pub root: &'a Path,
    /// Every parser `llm` stages may name (the engine's and every method's).
    pub parsers: &'a [&'static synth_llm::parse::ParserKind],
}

impl BuildCtx<'_> {
    pub fn subject(&self) -> String {
        stage_subject(self.name)
    }

    /// Deserialize the options into the kind's struct (they were checked already,
    /// so an error here is a mismatch between schema and struct, or a value serde rejects).
    pub fn parse<T: DeserializeOwned>(&self, diags: &mut Diagnostics) -> Option<T> {
        match serde_json::from_value(strip_common(self.options)) {
            Ok(v) => Some(v),
            Err(e) => {
                diags.error(&self.spans.get(""), Some(&self.subject()), format!("invalid options: {e}"));
                None
            }
        }
    }

    pub fn error(&self, diags: &mut Diagnostics, option: &str, message: impl Into<String>) {
        diags.error(&self.spans.get(option), Some(&self.subject()), message);
    }
}

fn strip_common(options: &serde_json::Value) -> serde_json::Value {
    match options {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.iter()
                .filter(|(k, _)| !COMMON_OPTIONS.iter().any(|c| c.name == k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// An input as known at plan time.
#[derive(Debug, Clone)]
pub struct PlanInput {
    pub name: String,
    pub schema: Option<SchemaRef>,
    /// The input's kind (`None` when its kind is unknown, after an error).
    pub kind: Option<&'static KindInfo>,
}

/// Plan phase context.
pub struct PlanCtx<'a> {
    pub name: &'a str,
    pub spans: &'a OptionSpans,
    pub root: &'a Path,
    pub inputs: Vec<PlanInput>,
    /// Declared `[providers.*]` and `[embedders.*]`.
    pub providers: &'a BTreeMap<String, Decl>,
    pub embedders: &'a BTreeMap<String, Decl>,
    /// The provider kinds the pipeline may name (the registry's).
    pub provider_kinds: &'a [&'static synth_llm::provider::ProviderDesc],
    pub diags: &'a mut Diagnostics,
    /// Local files this stage reads; their content is part of the fingerprint.
    pub files: Vec<PathBuf>,
}

impl PlanCtx<'_> {
    /// The provider kind called `name`.
    pub fn provider_kind(&self, name: &str) -> Option<&'static synth_llm::provider::ProviderDesc> {
        synth_llm::provider::find_kind(self.provider_kinds, name)
    }

    pub fn subject(&self) -> String {
        stage_subject(self.name)
    }

    pub fn error(&mut self, option: &str, message: impl Into<String>) {
        let span = self.spans.get(option);
        let subject = self.subject();
        self.diags.error(&span, Some(&subject), message);
    }

    pub fn warning(&mut self, option: &str, message: impl Into<String>) {
        let span = self.spans.get(option);
        let subject = self.subject();
        self.diags.warning(&span, Some(&subject), message);
    }

    /// The first input's schema, if known.
    pub fn input_schema(&self, idx: usize) -> Option<SchemaRef> {
        self.inputs.get(idx).and_then(|i| i.schema.clone())
    }

    /// Report each variable a template/expression uses that no input column provides.
    /// `extra` are names the stage itself provides. Unknown input columns skip the check.
    pub fn check_variables<'v>(
        &mut self,
        option: &str,
        what: &str,
        vars: impl IntoIterator<Item = &'v str>,
        extra: &[&str],
    ) {
        let mut available: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for input in &self.inputs {
            match &input.schema {
                Some(s) => available.extend(s.fields().iter().map(|f| f.name().clone())),
                None => return,
            }
        }
        let mut missing: Vec<&str> = vars
            .into_iter()
            .filter(|v| !available.iter().any(|a| a == v) && !synth_core::template::is_global(v))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        for var in missing {
            let hint =
                synth_core::config::diag::did_you_mean(var, available.iter().map(String::as_str)).unwrap_or_default();
            let inputs = self.inputs.iter().map(|i| format!("\"{}\"", i.name)).collect::<Vec<_>>().join(", ");
            self.error(
                option,
                format!("{what} uses variable \"{var}\" but no input provides it (inputs: {inputs}){hint}"),
            );
        }
    }

    /// Check that named columns exist in input `idx` (when its columns are known).
    pub fn require_columns<'c>(&mut self, option: &str, idx: usize, columns: impl IntoIterator<Item = &'c str>) {
        let Some(schema) = self.input_schema(idx) else {
            return;
        };
        let input = self.inputs[idx].name.clone();
        for col in columns {
            if schema.field_with_name(col).is_err() {
                let hint =
                    synth_core::config::diag::did_you_mean(col, schema.fields().iter().map(|f| f.name().as_str()))
                        .unwrap_or_default();
                self.error(option, format!("input \"{input}\" has no column \"{col}\"{hint}"));
            }
        }
    }
}

/// Prepare phase context.
pub struct PrepareCtx<'a> {
    pub name: &'a str,
    pub services: &'a Arc<Services>,
    pub root: &'a Path,
    pub out_dir: &'a Path,
    /// Do not use the network (dry runs).
    pub offline_only: bool,
    /// Resolve upstream versions (e.g. a hub revision to its commit) but download
    /// nothing: a plan that must know every fingerprint (`synth lock`, `regenerate`).
    pub resolve_only: bool,
    /// This stage's entry of `synth.lock` under `synth run --locked`: upstreams resolve
    /// to the versions recorded there, not to what their revisions point to now.
    pub pins: Option<&'a StageLock>,
    pub limit: Option<u64>,
    /// The run's review decisions (`review.jsonl` in the output directory).
    pub review: &'a synth_quality::review::Review,
}

impl PrepareCtx<'_> {
    /// Resolve a hub dataset this stage reads: the configured revision, or the commit
    /// `synth.lock` pins it to. `None` when offline and the local cache cannot tell.
    /// The returned `Upstream` belongs in [`Prepared::upstream`].
    pub async fn resolve_hub(&self, spec: &HubSpec, root: &Path) -> Result<Option<(HubFiles, Upstream)>> {
        let pin = match self.pins {
            None => None,
            Some(lock) => {
                let key = hub_upstream(spec, String::new(), Vec::new()).key();
                let pinned = lock.upstream.iter().find(|u| u.key() == key).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}@{} is not in synth.lock for this stage (locked: {}); run `synth lock --update` to lock it",
                        spec.repo,
                        spec.revision,
                        if lock.upstream.is_empty() {
                            "no hub repository".to_string()
                        } else {
                            lock.upstream.iter().map(Upstream::describe).collect::<Vec<_>>().join(", ")
                        }
                    )
                })?;
                Some(pinned.version().to_string())
            }
        };
        let how = synth_core::hub::Resolve {
            offline_only: self.offline_only,
            resolve_only: self.resolve_only,
            pin: pin.as_deref(),
        };
        match spec.resolve_with(root, &how).await {
            Ok(files) => {
                let up = hub_upstream(spec, files.commit.clone(), files.files.iter().map(|(n, _)| n.clone()).collect());
                Ok(Some((files, up)))
            }
            Err(_) if self.offline_only => Ok(None),
            Err(e) => Err(e.context(format!("resolving {} on the hub", spec.repo))),
        }
    }
}

impl PrepareCtx<'_> {
    /// The `wanted` files of a hub dataset, in that order (all of them unless `spec`
    /// names its own `files`), prepared with the repository and commit as fingerprint.
    /// `layout` names what a missing file breaks, for the error. `None` when offline
    /// and the local cache cannot tell.
    pub async fn hub_files(
        &self,
        spec: &HubSpec,
        root: &Path,
        wanted: &[String],
        layout: &str,
    ) -> Result<Option<Prepared>> {
        let mut spec = spec.clone();
        if spec.files.is_none() {
            spec.files = Some(wanted.to_vec());
        }
        let Some((resolved, upstream)) = self.resolve_hub(&spec, root).await? else {
            return Ok(None);
        };
        let by_path: BTreeMap<&str, &PathBuf> = resolved.files.iter().map(|(r, l)| (r.as_str(), l)).collect();
        let mut files = Vec::new();
        for w in wanted {
            match by_path.get(w.as_str()) {
                Some(local) => files.push((*local).clone()),
                None => return Err(anyhow::anyhow!("{} has no {w} at {} ({layout})", spec.repo, resolved.commit)),
            }
        }
        let mut fingerprint = BTreeMap::new();
        fingerprint.insert("hf.repo".into(), spec.repo.clone());
        fingerprint.insert("hf.commit".into(), resolved.commit.clone());
        Ok(Some(Prepared { fingerprint, files, hash_files: false, upstream: vec![upstream] }))
    }
}

impl PrepareCtx<'_> {
    /// Fetch a file from an http(s) URL into the output directory's download cache
    /// (`_synth/downloads/`; a conditional request, so an unchanged file is not
    /// downloaded again), or read the version `synth.lock` pins. `None` when offline and
    /// not cached. The `Upstream` belongs in [`Prepared::upstream`].
    pub async fn fetch_url(&self, url: &str) -> Result<Option<(synth_core::fetch::Fetched, Upstream)>> {
        let key = format!("url:{url}");
        let pin = match self.pins {
            None => None,
            Some(lock) => Some(
                lock.upstream.iter().find(|u| u.key() == key).map(|u| u.version().to_string()).ok_or_else(|| {
                    anyhow::anyhow!("{url} is not in synth.lock for this stage; run `synth lock --update` to lock it")
                })?,
            ),
        };
        let cache = self.out_dir.join(synth_core::store::state::INTERNAL_DIR).join("downloads");
        let how = synth_core::fetch::Fetch { offline_only: self.offline_only, pin: pin.as_deref() };
        let Some(f) = synth_core::fetch::fetch(url, &cache, &how).await? else { return Ok(None) };
        let up = Upstream::Url {
            url: url.to_string(),
            blake3: f.blake3.clone(),
            etag: f.etag.clone(),
            last_modified: f.last_modified.clone(),
        };
        Ok(Some((f, up)))
    }
}

fn hub_upstream(spec: &HubSpec, commit: String, files: Vec<String>) -> Upstream {
    Upstream::Hub {
        repo: spec.repo.clone(),
        repo_type: spec.repo_type.clone(),
        revision: spec.revision.clone(),
        commit,
        files,
    }
}

/// What prepare resolved.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    /// Extra fingerprint parts (e.g. a resolved dataset commit).
    pub fingerprint: BTreeMap<String, String>,
    /// Local files to read; content-hashed into the fingerprint when `hash_files`.
    pub files: Vec<PathBuf>,
    pub hash_files: bool,
    /// The versions outside the pipeline this stage resolved to (what `synth.lock` records).
    pub upstream: Vec<Upstream>,
}

/// An upstream stage's materialized output.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub path: PathBuf,
    pub schema: SchemaRef,
    pub num_rows: u64,
}

impl Input {
    pub fn open(name: &str, path: PathBuf) -> Result<Input> {
        let Footer { schema, num_rows, .. } = synth_core::store::parquet::read_footer(&path)?;
        Ok(Input { name: name.to_string(), path, schema, num_rows })
    }

    /// The records this input's stage sent to its failure table in the run that wrote the
    /// input (`<stage>.failures.parquet` beside it; none when it has no such table). The
    /// table must carry the input's fingerprint: the runner writes both in one commit.
    pub fn failures(&self) -> Result<Vec<synth_core::store::failures::Failure>> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let path = failures_path(dir, &self.name);
        if !path.exists() {
            return Ok(Vec::new());
        }
        let (failures, meta) = synth_core::store::failures::read_failures(&path)?;
        let ours = synth_core::store::parquet::read_footer(&self.path)?.meta.get(FINGERPRINT_KEY).cloned();
        if meta.get(FINGERPRINT_KEY) != ours.as_ref() {
            anyhow::bail!(
                "{} does not belong to {} (another fingerprint): re-run stage \"{}\"",
                path.display(),
                self.path.display(),
                self.name
            );
        }
        Ok(failures)
    }
}

/// Run phase context.
pub struct RunCtx {
    pub name: String,
    pub seed: u64,
    pub fingerprint: String,
    pub inputs: Vec<Input>,
    pub out_dir: PathBuf,
    pub root: PathBuf,
    pub limit: Option<u64>,
    pub prepared: Prepared,
    pub cancel: CancellationToken,
    pub progress: Arc<StageProgress>,
    pub failures: FailureLog,
    pub report: StageReport,
    /// Providers, embedders and the cache, shared by every stage of the run.
    pub services: Arc<Services>,
    pub output: Option<(PendingFile, u64)>,
    pub artifacts: Vec<(PendingFile, Option<u64>)>,
    /// In a shard of a wave: the input row of every output row, in output order (the
    /// exec helpers fill it); `None` otherwise.
    pub lineage: Option<Lineage>,
    /// In a shard of a wave, for a kind that fits statistics on its whole first input
    /// ([`Sharding::fits_whole_input`]): that whole input (the stage's `inputs[0]` holds
    /// only this shard's records). `None` otherwise.
    pub whole_input: Option<Input>,
    /// In a shard of a wave, for a [`Partitioning::SplitInput`] stage: the position in
    /// the whole input of each record of the shard's part of the split input (ascending).
    /// `None` otherwise (the stage then writes its complete output).
    pub part_positions: Option<Vec<u64>>,
    /// In a shard of a wave, for a [`Partitioning::OwnParts`] stage: `(part, parts)`,
    /// the shard's part of the stage's own work. `None` otherwise.
    pub part: Option<(usize, usize)>,
    /// The run's review decisions (`review.jsonl` in the output directory), read once
    /// when the run starts.
    pub review: Arc<synth_quality::review::Review>,
    /// The stages upstream of this one, in the pipeline's order (their reports are
    /// committed before this stage runs: [`RunCtx::ancestor_reports`]).
    pub ancestors: Vec<String>,
}

impl RunCtx {
    /// Footer metadata every output of this stage carries.
    pub fn footer_meta(&self) -> Vec<(String, String)> {
        vec![(FINGERPRINT_KEY.to_string(), self.fingerprint.clone()), (STAGE_KEY.to_string(), self.name.clone())]
    }

    /// Where this stage's materialized output lives.
    pub fn output_path(&self) -> PathBuf {
        output_path(&self.out_dir, &self.name)
    }

    /// Start writing the stage's output (unique ids enforced).
    pub fn create_output(&self, schema: SchemaRef) -> Result<ParquetOut> {
        ParquetOut::create(&self.output_path(), schema, self.footer_meta(), true)
    }

    /// Start writing an output whose ids are a subset of one input's ids, kept
    /// unchanged (filter, sample, map without re-keying): unique by construction,
    /// so the check and its memory are skipped.
    pub fn create_output_keeping_ids(&self, schema: SchemaRef) -> Result<ParquetOut> {
        ParquetOut::create(&self.output_path(), schema, self.footer_meta(), false)
    }

    /// Hand the finished output to the engine.
    pub fn set_output(&mut self, out: ParquetOut) -> Result<()> {
        let (pending, rows) = out.finish()?;
        self.report.rows_out = rows;
        self.output = Some((pending, rows));
        Ok(())
    }

    /// Hand a finished export file (sinks) to the engine.
    pub fn add_artifact(&mut self, pending: PendingFile, rows: Option<u64>) {
        self.artifacts.push((pending, rows));
    }

    /// Write a small Parquet file beside the output (e.g. `<stage>.summary.parquet`),
    /// committed with the stage like any artifact. Returns its row count.
    pub fn write_side_parquet(
        &mut self,
        file_name: &str,
        batch: &synth_core::data::arrow::array::RecordBatch,
    ) -> Result<u64> {
        let mut w = ParquetOut::create(&self.out_dir.join(file_name), batch.schema(), self.footer_meta(), false)?;
        w.write(batch)?;
        let (pending, rows) = w.finish()?;
        self.add_artifact(pending, Some(rows));
        Ok(rows)
    }

    pub fn fail(
        &self,
        id: &str,
        kind: synth_core::store::failures::FailureKind,
        message: impl Into<String>,
        record: Option<String>,
    ) {
        self.fail_answered(id, kind, message, record, None);
    }

    /// [`RunCtx::fail`] for a record a content check (or a method's quality check) dropped:
    /// kind `check`, the check's name in the failure table's `check` column.
    pub fn fail_check(&self, id: &str, check: &str, message: impl Into<String>, record: Option<String>) {
        let scrub = synth_core::secrets::scrub;
        let mut failure = synth_core::store::failures::Failure::new(
            id,
            synth_core::store::failures::FailureKind::Check,
            scrub(&message.into()),
            record.map(|r| scrub(&r)),
        );
        failure.check = Some(check.to_string());
        self.failures.push(failure);
        self.progress.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`RunCtx::fail`] for a record a model answered: its last answer and the reason each
    /// answer was rejected go to the failure table too (secrets scrubbed like the rest).
    pub fn fail_answered(
        &self,
        id: &str,
        kind: synth_core::store::failures::FailureKind,
        message: impl Into<String>,
        record: Option<String>,
        answers: Option<Answers>,
    ) {
        let scrub = synth_core::secrets::scrub;
        let mut failure =
            synth_core::store::failures::Failure::new(id, kind, scrub(&message.into()), record.map(|r| scrub(&r)));
        if let Some(a) = answers {
            failure.raw = a.raw.map(|r| scrub(&r));
            failure.attempts = a.attempts.iter().map(|m| scrub(m)).collect();
            failure.check = a.check;
        }
        self.failures.push(failure);
        self.progress.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The committed reports of the stages upstream of this one, in pipeline order (a
    /// stage without a state record is left out). What a dataset card reads to say what
    /// the checks upstream did.
    pub fn ancestor_reports(&self) -> Vec<(String, StageReport)> {
        self.ancestors
            .iter()
            .filter_map(|name| {
                synth_core::store::state::StageState::load(&self.out_dir, name).map(|s| (name.clone(), s.report))
            })
            .collect()
    }

    /// The quality figures of the stages upstream of this one (`quality::summary`).
    pub fn upstream_quality(&self) -> Vec<synth_quality::summary::StageQuality> {
        self.ancestor_reports()
            .iter()
            .filter_map(|(name, r)| synth_quality::summary::of_stage(name, &r.metrics))
            .collect()
    }

    pub fn record_key(&self, id: &str, purpose: &str) -> u64 {
        synth_core::rng::record_key(self.seed, &self.name, id, purpose)
    }

    pub fn input(&self, idx: usize) -> &Input {
        &self.inputs[idx]
    }
}

/// Path of a stage's materialized output in an output directory.
pub fn output_path(out_dir: &Path, stage: &str) -> PathBuf {
    out_dir.join(format!("{stage}.parquet"))
}

/// Path of a stage's failure table.
pub fn failures_path(out_dir: &Path, stage: &str) -> PathBuf {
    out_dir.join(format!("{stage}.failures.parquet"))
}

/// Error returned by a stage that stopped because the run was cancelled.
#[derive(Debug, thiserror::Error)]
#[error("cancelled")]
pub struct Cancelled;

/// For a stage running as a shard of a wave: the input row (index in its first
/// input) each output row came from, in output order. The merge of the shards puts
/// rows back in the order of the whole input by it (`dag::shard`).
#[derive(Clone, Default)]
pub struct Lineage {
    rows: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Lineage {
    /// `n` output rows from input row `input_row`.
    pub fn push(&self, input_row: u64, n: usize) {
        self.rows.lock().expect("lineage").extend(std::iter::repeat_n(input_row, n));
    }

    /// The input rows `first..` whose `keep` flag is set, one output row each.
    pub fn push_kept(&self, first: u64, keep: &[bool]) {
        let mut rows = self.rows.lock().expect("lineage");
        rows.extend(keep.iter().enumerate().filter(|(_, k)| **k).map(|(i, _)| first + i as u64));
    }

    /// Output rows that keep their input's ids, a subset of `input` in order.
    pub fn push_same_ids(
        &self,
        first: u64,
        input: &synth_core::data::arrow::array::RecordBatch,
        output: &synth_core::data::arrow::array::RecordBatch,
    ) -> Result<()> {
        use synth_core::data::arrow::array::Array;
        let (ins, outs) = (synth_core::data::ids(input), synth_core::data::ids(output));
        let mut rows = self.rows.lock().expect("lineage");
        let mut at = 0;
        for j in 0..outs.len() {
            let id = outs.value(j);
            while at < ins.len() && ins.value(at) != id {
                at += 1;
            }
            if at == ins.len() {
                anyhow::bail!(
                    "output record \"{id}\" is not among the input's records in order (cannot run as shards)"
                );
            }
            rows.push(first + at as u64);
            at += 1;
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.rows.lock().expect("lineage").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.rows.lock().expect("lineage"))
    }
}

/// What a model answered a record that failed.
#[derive(Debug, Clone, Default)]
pub struct Answers {
    pub raw: Option<String>,
    pub attempts: Vec<String>,
    /// The content check that failed the last answer (the failure table's `check`).
    pub check: Option<String>,
}
