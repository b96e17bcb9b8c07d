//! The command line's definitions (clap): every subcommand's arguments, parsed by
//! `cli::main` and read by the subcommand's own file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "synth", version, about = "Run data-synthesis pipelines declared in TOML", long_about = None)]
pub struct Cli {
    /// More log output (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only warnings and errors; no progress display.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check a pipeline without network or side effects; report every problem.
    Validate(ValidateArgs),
    /// Show the stage graph.
    Graph(GraphArgs),
    /// List stage kinds with their options and defaults.
    List {
        /// As the Markdown page docs/reference.md (`synth list --markdown > docs/reference.md`).
        #[arg(long)]
        markdown: bool,
        /// The command line instead: every command, argument and exit code, as the
        /// Markdown page docs/cli.md (`synth list --cli > docs/cli.md`).
        #[arg(long, conflicts_with = "markdown")]
        cli: bool,
    },
    /// Run a pipeline (incrementally: up-to-date stages are skipped).
    Run(RunArgs),
    /// Pin every upstream (hub commits, file hashes, served models) in synth.lock.
    Lock(LockArgs),
    /// Re-resolve upstreams, run what changed, snapshot and publish (for schedulers).
    Regenerate(RegenerateArgs),
    /// The snapshots of an output directory.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Look into a Parquet file.
    Inspect(InspectArgs),
    /// Per-stage figures of the last run in an output directory.
    Stats(StatsArgs),
    /// Score a file of (response, reference) pairs: BLEU, ROUGE, METEOR as the official code.
    Score(ScoreArgs),
    /// Measurements that print one JSON line each.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The LLM response and embedding cache of an output directory.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Where a run stands: its last outcome and, for sharded runs, each wave's shards
    /// done and missing, with the retry set.
    Status(StatusArgs),
    /// A local web page over a run: its stages (live while a run writes there), any
    /// stage's output as a table with chats rendered, failures by reason, reports and
    /// snapshots. Serves 127.0.0.1 only unless --host says otherwise.
    View(ViewArgs),
    /// Print a ready recipe for another system: a schedule for `synth regenerate`
    /// (systemd, cron, Kubernetes CronJob), or what a scheduler needs to run a sharded
    /// pipeline (Kubernetes Jobs, a Slurm script).
    #[command(subcommand)]
    Emit(EmitCommand),
    /// Provider batches of an output directory (stages run with `batch = true`).
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Review decisions of an output directory (review.jsonl): record keep / drop with a
    /// note; the next run drops what was dropped (a spare takes its place where the
    /// method plans spares). Without --keep / --drop: the decisions so far.
    Review(ReviewArgs),
}

#[derive(Args, Debug)]
pub struct ReviewArgs {
    /// An output directory of `synth run`.
    pub output_dir: PathBuf,
    /// Drop these records (their ids).
    #[arg(long, value_name = "ID", num_args = 1.., conflicts_with = "keep")]
    pub drop: Vec<String>,
    /// Keep these records (their ids): reviewed and approved.
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub keep: Vec<String>,
    /// Why (goes with each decision of this call).
    #[arg(long)]
    pub note: Option<String>,
    /// Who decides (default: $SYNTH_REVIEWER, else $USER).
    #[arg(long)]
    pub reviewer: Option<String>,
    /// The stage (table) the records were read in: each id must be one of its records.
    #[arg(long)]
    pub stage: Option<String>,
    /// Print the decisions as JSON lines (the current decision per id).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// An output directory (or give --state).
    pub dir: Option<PathBuf>,
    /// The run's object store state (s3://..., file://...).
    #[arg(long, value_name = "URL", conflicts_with = "dir")]
    pub state: Option<String>,
    /// Only the waves planned for this many shards.
    #[arg(long, value_name = "N")]
    pub shards: Option<u32>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ViewArgs {
    /// An output directory, or a pipeline file (its output_dir and snapshots).
    #[arg(default_value = ".")]
    pub target: PathBuf,
    /// Port to listen on (0: any free port; the URL is printed).
    #[arg(long, default_value_t = 8765)]
    pub port: u16,
    /// Address to listen on. Anything but a loopback address shows the data to the
    /// network: a warning is printed.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// With a pipeline file: its profile (changes the output directory of some pipelines).
    #[arg(long, value_name = "NAME[,NAME]")]
    pub profile: Option<String>,
    #[arg(long)]
    pub offline: bool,
    /// Another run's output directory, compared with this one on the Compare page (per
    /// stage rows in / out / failed; per table rows added, removed, changed).
    #[arg(long, value_name = "OTHER_DIR")]
    pub compare: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum EmitCommand {
    /// A recipe that runs `synth regenerate` on a schedule.
    Schedule(EmitScheduleArgs),
    /// Kubernetes: a Job per coordinator step and an Indexed Job per wave (apply all at once).
    K8s(EmitK8sArgs),
    /// Slurm: a script submitting the steps and the `sbatch --array` waves in order.
    Slurm(EmitSlurmArgs),
}

/// What every emitted job runs.
#[derive(Args, Debug)]
pub struct EmitArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Number of shards of each wave.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub shards: u32,
    /// Shards running at once (and the divisor of each provider's limits) [default: N].
    #[arg(long)]
    pub parallel: Option<u32>,
    /// The run's state (s3://bucket/prefix, gs://, az://, file:///shared/path).
    #[arg(long, value_name = "URL")]
    pub state: Option<String>,
    /// Instead of --state: an output directory on a file system every node shares.
    #[arg(long = "out-dir", value_name = "DIR", conflicts_with = "state")]
    pub out: Option<PathBuf>,
    /// The synth program as the jobs call it.
    #[arg(long, default_value = "synth")]
    pub synth: String,
    /// Name prefix of the jobs [default: the pipeline's name].
    #[arg(long)]
    pub name: Option<String>,
    /// Run id shared by the jobs [default: <pipeline>-<unix time>].
    #[arg(long)]
    pub run_id: Option<String>,
    /// How long a job waits for what it needs before failing, in seconds.
    #[arg(long, default_value_t = 86_400)]
    pub wait: u64,
    /// The jobs run with `--locked`: upstreams resolve to the versions of synth.lock (which
    /// must be where the jobs run: next to the pipeline, or --lockfile).
    #[arg(long)]
    pub locked: bool,
    #[command(flatten)]
    pub lockfile: LockfileArg,
    /// Write to this file instead of standard output.
    #[arg(long = "output", short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct EmitK8sArgs {
    #[command(flatten)]
    pub common: EmitArgs,
    /// Container image with synth and the project (pipelines, prompts, data).
    #[arg(long)]
    pub image: String,
    /// A Secret whose keys become environment variables (OPENAI_API_KEY, AWS_ACCESS_KEY_ID, ...).
    #[arg(long)]
    pub secret: Option<String>,
    #[arg(long)]
    pub namespace: Option<String>,
    #[arg(long)]
    pub service_account: Option<String>,
    /// The container's working directory (where the pipeline's paths resolve).
    #[arg(long)]
    pub workdir: Option<String>,
    #[arg(long, default_value = "1")]
    pub cpu: String,
    #[arg(long, default_value = "2Gi")]
    pub memory: String,
    /// Retries of each failed index (Indexed Jobs) or step.
    #[arg(long, default_value_t = 3)]
    pub backoff_limit_per_index: u32,
}

#[derive(Args, Debug)]
pub struct EmitSlurmArgs {
    #[command(flatten)]
    pub common: EmitArgs,
    #[arg(long)]
    pub partition: Option<String>,
    /// Time limit of each job (sbatch --time).
    #[arg(long)]
    pub time: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub cpus_per_task: u32,
    #[arg(long)]
    pub mem: Option<String>,
    /// Folder of the jobs' logs.
    #[arg(long, default_value = "slurm-logs")]
    pub logs: String,
}

#[derive(Subcommand, Debug)]
pub enum BatchCommand {
    /// Each batch: stage, provider, batch id, state, answered / total, attempt.
    Status {
        /// An output directory of `synth run`.
        output_dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// Ask the providers for the current state (keys from the environment), and list
        /// batches of this directory that its journal does not hold.
        #[arg(long)]
        refresh: bool,
    },
    /// Cancel the directory's running batches at the provider (a later run collects what
    /// they answered and asks the rest again).
    Cancel {
        /// An output directory of `synth run`.
        output_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Size, hit rate and entries per model.
    Stats {
        /// An output directory of `synth run`.
        output_dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Remove entries that no current stage of the pipeline refers to.
    Gc {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Output directory (default: the pipeline's output_dir).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Write every cached response to a Parquet file.
    Export {
        /// An output directory of `synth run`.
        output_dir: PathBuf,
        /// Parquet file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Engine overhead: Parquet source and a no-op map over N records, then an up-to-date re-run.
    Engine {
        /// Number of records.
        #[arg(long, default_value_t = 1_000_000)]
        records: usize,
        /// Work directory (default: a temporary one, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Send N distinct chat requests through the provider layer (rate control, retries, journal).
    Llm(crate::bench::LlmBench),
    /// Most and least similar passage of every query by inner product, on seeded random unit
    /// vectors, with the retrieval stage's own code (exact kernel or HNSW).
    Retrieve {
        #[arg(long, default_value_t = 2000)]
        queries: usize,
        #[arg(long, default_value_t = 100_000)]
        passages: usize,
        #[arg(long, default_value_t = 384)]
        dim: usize,
        /// exact: the GEMM search (prints the same-shape sgemm peak of this machine and
        /// the ratio, and with fewer queries than a block that many rows' peak too);
        /// hnsw: usearch with measured recall.
        #[arg(long, value_parser = ["exact", "hnsw"], default_value = "exact")]
        method: String,
        /// exact: queries per GEMM.
        #[arg(long, default_value_t = synth_retrieval::gemm::QUERY_BLOCK)]
        query_block: usize,
        /// exact: corpus vectors per score tile.
        #[arg(long, default_value_t = synth_retrieval::gemm::CORPUS_TILE)]
        corpus_tile: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// Queries checked against the exact kernel for hnsw recall.
        #[arg(long, default_value_t = 500)]
        recall_sample: usize,
    },
    /// `synth view` on a generated stage output of N chat samples: time of the first page,
    /// page 1,000, sorted and filtered pages through the HTTP API, and the server's memory.
    View {
        #[arg(long, default_value_t = 808_700)]
        rows: usize,
        /// Where the generated file is kept (reused when it has N rows; default: a
        /// temporary directory, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Passages per second of a local ONNX embedding model (fastembed).
    Embed {
        /// Model directory with model.onnx and tokenizer files.
        #[arg(long)]
        model_dir: PathBuf,
        #[arg(long, default_value_t = 2000)]
        passages: usize,
        /// Words per generated passage.
        #[arg(long, default_value_t = 60)]
        words: usize,
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// ONNX Runtime library (default: $ORT_DYLIB_PATH, then .tools/onnxruntime).
        #[arg(long)]
        ort_dylib: Option<String>,
    },
}

/// Options shared by commands that load a pipeline.
#[derive(Args, Debug, Clone)]
pub struct PipelineArgs {
    /// Pipeline file (TOML).
    pub pipeline: PathBuf,
    /// Apply the overrides of [profiles.NAME]; `a,b` applies a then b.
    #[arg(long, value_name = "NAME[,NAME]")]
    pub profile: Option<String>,
    /// Short for --profile offline (applied before any --profile).
    #[arg(long)]
    pub offline: bool,
    /// Override a config value by dotted path (e.g. stages.sample.n=100); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

impl PipelineArgs {
    pub fn load_options(&self) -> synth_runner::pipeline::LoadOptions {
        synth_runner::pipeline::LoadOptions {
            profile: match (self.offline, &self.profile) {
                (true, Some(p)) => Some(format!("offline,{p}")),
                (true, None) => Some("offline".into()),
                (false, p) => p.clone(),
            },
            sets: self.sets.clone(),
            extra_kinds: Vec::new(),
        }
    }
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Treat warnings as errors.
    #[arg(long)]
    pub deny_warnings: bool,
}

#[derive(Args, Debug)]
pub struct GraphArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
    pub format: GraphFormat,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    Text,
    Dot,
    Mermaid,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Output directory (default: the pipeline's output_dir).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run only this stage (its inputs must be up to date).
    #[arg(long, value_name = "STAGE", conflicts_with = "from")]
    pub only: Option<String>,
    /// Re-run this stage and everything downstream of it.
    #[arg(long, value_name = "STAGE")]
    pub from: Option<String>,
    /// Build this stage and what it needs, nothing downstream of it (combines with --from).
    #[arg(long, value_name = "STAGE", conflicts_with = "only")]
    pub until: Option<String>,
    /// Cap every source at N records.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Rebuild even when up to date.
    #[arg(long)]
    pub force: bool,
    /// Show what would run and what is up to date, and estimate per stage the requests,
    /// tokens, cost and time of the model calls (a simulated run: nothing is sent, unless
    /// --sample); run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: send the first N uncached calls of each stage for real (paid; kept in
    /// the cache, so the run does not pay for them again) to measure answer lengths and
    /// latency instead of counting answers at max_tokens.
    #[arg(long, value_name = "N", requires = "dry_run", default_value_t = 0)]
    pub sample: u64,
    /// With --dry-run: only the plan, no estimate (the estimate runs the pipeline's local
    /// stages in a scratch directory).
    #[arg(long, requires = "dry_run", conflicts_with = "sample")]
    pub no_estimate: bool,
    /// Keep outputs, state and caches in an object store instead of --out:
    /// s3://bucket/prefix, gs://, az://, file:///path (credentials and endpoint from the
    /// environment, as the providers' SDKs read them).
    #[arg(long, value_name = "URL", conflicts_with = "out")]
    pub state: Option<String>,
    /// Local work directory for --state (its mirror, the shards' work) [default:
    /// $SYNTH_WORK_DIR, else ~/.cache/synth/work/<hash of the URL>].
    #[arg(long, value_name = "DIR")]
    pub work: Option<PathBuf>,
    /// Run the record-parallel stages as N shards (docs/operations/sharding.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub shards: Option<u32>,
    /// With --shards: run only shard I of --wave [default: $JOB_COMPLETION_INDEX
    /// (Kubernetes Indexed Job), else $SLURM_ARRAY_TASK_ID].
    #[arg(long, value_name = "I", requires = "shards", conflicts_with = "step")]
    pub shard: Option<u32>,
    /// With --shard: the wave the shard belongs to.
    #[arg(long, value_name = "K", requires = "shards")]
    pub wave: Option<u32>,
    /// With --shards: run only coordinator step K (merge wave K, run the stages that
    /// need their inputs whole, plan wave K+1).
    #[arg(long, value_name = "K", requires = "shards")]
    pub step: Option<u32>,
    /// With --shards: run every step here and every shard as a local process (the
    /// default when neither --shard nor --step is given).
    #[arg(long, value_enum, requires = "shards")]
    pub executor: Option<Executor>,
    /// Shards running at once (the local executor starts this many; each provider's
    /// limits are divided by it) [default: N].
    #[arg(long, value_name = "P", requires = "shards", value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: Option<u32>,
    /// Wait up to this many seconds for the wave's plan or its shards instead of failing
    /// at once (jobs a scheduler starts together).
    #[arg(long, value_name = "SECONDS", requires = "shards")]
    pub wait: Option<u64>,
    /// Lifetime of leases on an object store (renewed every third of it).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub lease_seconds: u64,
    /// With --shards, for jobs started together (`synth emit`): accept only wave plans
    /// written by a step with this run id.
    #[arg(long, value_name = "ID", requires = "shards")]
    pub run_id: Option<String>,
    /// Use exactly the upstream versions of synth.lock (hub commits, file contents,
    /// served models); a stage whose upstream differs fails.
    #[arg(long)]
    pub locked: bool,
    #[command(flatten)]
    pub lockfile: LockfileArg,
    /// Stages in batch mode stop once their batches are submitted (exit 0); run the same
    /// command again later to collect the results.
    #[arg(long)]
    pub detach: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Executor {
    /// Shards as processes of this machine.
    Local,
}

#[derive(Args, Debug, Clone)]
pub struct LockfileArg {
    /// Lock file (default: synth.lock next to the pipeline file).
    #[arg(long, value_name = "FILE")]
    pub lockfile: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct PushArg {
    /// Publish each snapshot to the Hugging Face Hub as one commit (implies --snapshot);
    /// REPO defaults to [regenerate.hub] repo.
    #[arg(long, value_name = "REPO", num_args = 0..=1, default_missing_value = "")]
    pub push: Option<String>,
}

#[derive(Args, Debug)]
pub struct LockArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Re-resolve every upstream (the explicit bump); without it, what is locked stays.
    #[arg(long)]
    pub update: bool,
    /// Output directory whose last run tells which models providers served (default: the
    /// pipeline's output_dir).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub lockfile: LockfileArg,
}

#[derive(Args, Debug)]
pub struct RegenerateArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// When nothing moved since the last release, do nothing and exit 0 ("unchanged").
    #[arg(long)]
    pub if_changed: bool,
    /// Write an immutable snapshot of the release and move `latest` to it.
    #[arg(long)]
    pub snapshot: bool,
    #[command(flatten)]
    pub push: PushArg,
    /// Use the upstream versions of synth.lock instead of resolving them anew.
    #[arg(long)]
    pub locked: bool,
    #[command(flatten)]
    pub lockfile: LockfileArg,
    /// Stop sending provider requests before this regeneration's spending would pass this
    /// many USD (overrides [pipeline] max_cost_usd, the run's cost cap).
    #[arg(long, value_name = "USD")]
    pub max_cost_usd: Option<f64>,
    /// Keep only the newest N snapshots (overrides [regenerate] keep).
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Output directory (default: the pipeline's output_dir).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the summary (what hooks receive) as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Where the snapshots are: a pipeline file (its output_dir and [regenerate]
/// snapshots_dir), an output directory, or a snapshots directory.
#[derive(Args, Debug, Clone)]
pub struct SnapshotsArg {
    /// A pipeline file, an output directory or a snapshots directory.
    pub target: PathBuf,
    /// With a pipeline file: its profile (changes the output directory of some pipelines).
    #[arg(long, value_name = "NAME[,NAME]")]
    pub profile: Option<String>,
    #[arg(long)]
    pub offline: bool,
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Every snapshot: id, creation time, rows, where it was published; `*` marks latest.
    List {
        #[command(flatten)]
        at: SnapshotsArg,
        #[arg(long)]
        json: bool,
    },
    /// Rows added / removed / changed per export between two snapshots (by stable id).
    Diff {
        #[command(flatten)]
        at: SnapshotsArg,
        /// The older snapshot (default: the one before NEW).
        old: Option<String>,
        /// The newer snapshot (default: latest).
        new: Option<String>,
        /// List up to N ids of each kind of change.
        #[arg(long, value_name = "N", default_value_t = 0)]
        ids: usize,
        #[arg(long)]
        json: bool,
    },
    /// Remove all but the newest N snapshots (never the one `latest` points to).
    Gc {
        #[command(flatten)]
        at: SnapshotsArg,
        #[arg(long, value_name = "N")]
        keep: usize,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScheduleTarget {
    /// A systemd service + timer (Persistent=true).
    Systemd,
    /// A crontab line under flock -n.
    Cron,
    /// A Kubernetes CronJob (concurrencyPolicy: Forbid).
    K8s,
}

#[derive(Args, Debug)]
pub struct EmitScheduleArgs {
    pub target: ScheduleTarget,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// hourly, daily, weekly, monthly, <N>m, <N>h, or a 5-field cron expression ("0 3 * * 1").
    #[arg(long)]
    pub every: String,
    /// Time of day for daily / weekly / monthly (HH:MM, 24-hour) [default: 03:00].
    #[arg(long, value_name = "HH:MM")]
    pub at: Option<String>,
    /// Day of the week for weekly [default: mon].
    #[arg(long, value_name = "DAY")]
    pub on: Option<String>,
    /// Time zone of the schedule.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
    #[command(flatten)]
    pub push: PushArg,
    /// Directory the job runs in (default: the current directory; k8s: /work).
    #[arg(long)]
    pub workdir: Option<String>,
    /// The synth executable the job runs (default: this one; k8s: synth).
    #[arg(long)]
    pub synth: Option<String>,
    /// Container image (k8s).
    #[arg(long, default_value = "synth:latest")]
    pub image: String,
    /// Longest a run may take.
    #[arg(long, default_value = "36h")]
    pub timeout: String,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A Parquet file.
    pub file: PathBuf,
    /// Rows to show.
    #[arg(long, default_value_t = 10)]
    pub rows: usize,
    /// Show the schema and file metadata instead of rows.
    #[arg(long)]
    pub schema: bool,
    /// Only rows whose column equals the value (as text).
    #[arg(long = "where", value_name = "COL=VALUE")]
    pub filter: Option<String>,
    /// Print rows as JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Truncate table cells to this many characters (0 = never).
    #[arg(long, default_value_t = 60)]
    pub width: usize,
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// JSONL or Parquet file of pairs.
    #[arg(long)]
    pub input: PathBuf,
    /// Field with the model's answer.
    #[arg(long, default_value = "response")]
    pub response_field: String,
    /// Field with the reference answer.
    #[arg(long, default_value = "reference")]
    pub reference_field: String,
    /// Comma-separated: bleu, rouge, meteor, bertscore [default: bleu,rouge,meteor, and
    /// bertscore when --bertscore-model is given].
    #[arg(long)]
    pub metrics: Option<String>,
    /// Field whose values group the summary (e.g. task).
    #[arg(long)]
    pub group_by: Option<String>,
    /// WordNet 3.0 dict files (for METEOR).
    #[arg(long, default_value = synth_eval::score::DEFAULT_WORDNET)]
    pub wordnet_dir: PathBuf,
    /// NLTK punkt_tab/english directory for METEOR's sentence splitting (default: untrained Punkt).
    #[arg(long)]
    pub punkt_dir: Option<PathBuf>,
    /// BERTScore encoder: a directory with model.onnx and tokenizer.json (e.g.
    /// ../shared/models/all-MiniLM-L6-v2).
    #[arg(long)]
    pub bertscore_model: Option<PathBuf>,
    /// ONNX output with the hidden states [default: last_hidden_state, else the first output].
    #[arg(long)]
    pub bertscore_output: Option<String>,
    /// Encoder sessions run side by side, each with its own copy of the weights
    /// [default: 2 with 2+ cores]; 1 halves the memory (large encoders).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub bertscore_sessions: Option<u16>,
    /// Pairs per BERTScore matching batch, as bert_score's batch_size (its zero padding
    /// enters the max); 1 scores each pair alone, as the official evaluation.py calls it.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub bertscore_pair_batch: u32,
    /// Per-sample scores: .parquet, else JSONL. Rows that cannot be scored go to
    /// `<out stem>.failures.parquet` with their reason, and the rest are scored.
    #[arg(long)]
    pub out: PathBuf,
    /// Stop at the first row that cannot be scored instead (nothing is written).
    #[arg(long)]
    pub strict: bool,
    /// rouge_score's target: `reference` (rouge_score's documented order, as the `metrics`
    /// kind's default) or `response` (score(response, reference), as some official
    /// evaluation scripts call it). Only ROUGE-Lsum of multi-line texts differs.
    #[arg(long, default_value = "reference", value_parser = ["response", "reference"])]
    pub rouge_target: String,
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// An output directory of `synth run`.
    pub output_dir: PathBuf,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}
