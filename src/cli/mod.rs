//! The `synth` command line: argument definitions, logging setup and the mapping
//! from outcomes to exit codes (0 ok, 1 quality gate, 2 runtime failure, 78 bad
//! config, 130 interrupted). Each subcommand lives in its own file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod batch;
mod cache;
mod graph;
mod inspect;
mod list;
mod run;
mod score;
mod stats;
mod validate;

pub const EXIT_OK: i32 = 0;
pub const EXIT_RUNTIME: i32 = 2;
pub const EXIT_CONFIG: i32 = 78;
pub const EXIT_INTERRUPTED: i32 = 130;

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
    List,
    /// Run a pipeline (incrementally: up-to-date stages are skipped).
    Run(RunArgs),
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
    /// Provider batches of an output directory (stages run with `batch = true`).
    #[command(subcommand)]
    Batch(BatchCommand),
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
        /// the ratio); fused: the one-pass kernel; hnsw: usearch with measured recall.
        #[arg(long, value_parser = ["exact", "fused", "hnsw"], default_value = "exact")]
        method: String,
        /// exact: queries per GEMM.
        #[arg(long, default_value_t = crate::retrieval::gemm::QUERY_BLOCK)]
        query_block: usize,
        /// exact: corpus vectors per score tile.
        #[arg(long, default_value_t = crate::retrieval::gemm::CORPUS_TILE)]
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
    pub fn load_options(&self) -> crate::pipeline::LoadOptions {
        crate::pipeline::LoadOptions {
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
    /// Show what would run and what is up to date; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stages in batch mode stop once their batches are submitted (exit 0); run the same
    /// command again later to collect the results.
    #[arg(long)]
    pub detach: bool,
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
    #[arg(long, default_value = crate::eval::score::DEFAULT_WORDNET)]
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

/// Parse arguments, run the command, return the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging(&cli);
    match cli.command {
        Command::Validate(a) => validate::run(&a),
        Command::Graph(a) => graph::run(&a),
        Command::List => list::run(),
        Command::Run(a) => run::run(&a, cli.quiet),
        Command::Inspect(a) => inspect::run(&a),
        Command::Stats(a) => stats::run(&a),
        Command::Score(a) => score::run(&a),
        Command::Bench(b) => bench(b),
        Command::Cache(c) => cache::run(c),
        Command::Batch(c) => batch::run(c),
    }
}

fn bench(cmd: BenchCommand) -> i32 {
    let result = match cmd {
        BenchCommand::Engine { records, dir } => crate::bench::engine(records, dir),
        BenchCommand::Llm(args) => {
            if args.baseline {
                crate::bench::llm_baseline(&args)
            } else {
                crate::bench::llm(&args)
            }
        }
        BenchCommand::Retrieve {
            queries,
            passages,
            dim,
            method,
            query_block,
            corpus_tile,
            seed,
            threads,
            recall_sample,
        } => {
            if query_block == 0 || corpus_tile == 0 {
                eprintln!("error: --query-block and --corpus-tile must be positive");
                return EXIT_RUNTIME;
            }
            crate::bench::retrieve(&crate::bench::RetrieveBench {
                queries,
                passages,
                dim,
                method,
                tiles: crate::retrieval::gemm::Tiles { query_block, corpus_tile },
                seed,
                threads,
                recall_sample,
            })
        }
        BenchCommand::Embed { model_dir, passages, words, batch, ort_dylib } => {
            crate::bench::embed(&model_dir, passages, words, batch, ort_dylib.as_deref())
        }
    };
    match result {
        Ok(line) => {
            println!("{line}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}

fn init_logging(cli: &Cli) {
    use tracing_subscriber::EnvFilter;
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("SYNTH_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},hyper=warn,reqwest=warn,h2=warn,rustls=warn,hf_hub=warn")));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| crate::progress::LogWriter);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_target(false).compact().init(),
    }
}

/// Print config diagnostics; returns true when there were errors.
pub fn report_diagnostics(diags: &crate::config::diag::Diagnostics) -> bool {
    for d in diags.iter() {
        eprintln!("{d}");
    }
    diags.has_errors()
}

/// Load a pipeline or print why not.
pub fn load_or_report(args: &PipelineArgs) -> Result<crate::pipeline::Pipeline, i32> {
    let (pipeline, diags) = crate::pipeline::load(&args.pipeline, &args.load_options());
    report_diagnostics(&diags);
    match pipeline {
        Some(p) if !diags.has_errors() => Ok(p),
        _ => {
            eprintln!("{}: {} error(s); nothing was run", args.pipeline.display(), diags.n_errors());
            Err(EXIT_CONFIG)
        }
    }
}
