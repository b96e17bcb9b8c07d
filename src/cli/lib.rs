//! The `synth` command line: argument definitions, logging setup and the mapping
//! from outcomes to exit codes (0 ok, 2 runtime failure, 75 another run holds the
//! output directory, 78 bad config, 130 interrupted). Each subcommand lives in its own file;
//! [`bench`] holds `synth bench`'s measurements. The registry pipelines are checked against
//! is handed to [`main`] (the `synth` crate passes the built-in one), so this crate names no
//! method and a change in one never rebuilds it.

use clap::Parser;

pub use args::*;
pub use common::{
    EXIT_BUSY, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NOT_READY, EXIT_OK, EXIT_RUNTIME, load_or_report, report_diagnostics,
};
pub use registry::registry;

pub mod bench;

mod args;
mod batch;
mod cache;
mod clidoc;
mod common;
mod emit;
mod graph;
mod inspect;
mod list;
mod lock;
mod regenerate;
mod registry;
mod review;
mod run;
mod score;
mod snapshot;
mod stats;
pub(crate) mod status;
mod validate;
mod view;

/// Commands that read files and print, and start no process and no connection.
fn only_prints(command: &Command) -> bool {
    matches!(
        command,
        Command::Validate(_)
            | Command::Graph(_)
            | Command::List { .. }
            | Command::Inspect(_)
            | Command::Stats(_)
            | Command::Emit(_)
    )
}

/// `synth validate p.toml | head`: when the reader of stdout goes away, end quietly as
/// Unix tools do (killed by SIGPIPE, exit status 141 in a shell) instead of a panic from
/// `println!`. Only for the commands of `only_prints`: a process that writes to a child's
/// pipe must not die of its child's end, so Rust's default (SIGPIPE ignored) stays for them.
fn quiet_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: sets a signal's disposition before any thread of ours starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parse arguments, run the command against `registry`, return the exit code.
pub fn main(registry: &'static synth_engine::registry::Registry) -> i32 {
    registry::set_registry(registry);
    let cli = Cli::parse();
    init_logging(&cli);
    if only_prints(&cli.command) {
        quiet_on_closed_stdout();
    }
    match cli.command {
        Command::Validate(a) => validate::run(&a),
        Command::Graph(a) => graph::run(&a),
        Command::List { cli: true, .. } => {
            print!("{}", clidoc::render());
            EXIT_OK
        }
        Command::List { markdown, .. } => list::run(markdown),
        Command::Run(a) => run::run(&a, cli.quiet, cli.log_format),
        Command::Lock(a) => lock::run(&a),
        Command::Regenerate(a) => regenerate::run(&a, cli.quiet),
        Command::Snapshot(c) => snapshot::run(c),
        Command::Inspect(a) => inspect::run(&a),
        Command::Stats(a) => stats::run(&a),
        Command::Score(a) => score::run(&a),
        Command::Bench(b) => bench(b),
        Command::Cache(c) => cache::run(c),
        Command::Status(a) => status::run(&a),
        Command::View(a) => view::run(&a),
        Command::Emit(e) => emit::run(&e),
        Command::Batch(c) => batch::run(c),
        Command::Review(a) => review::run(&a),
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
                tiles: synth_retrieval::gemm::Tiles { query_block, corpus_tile },
                seed,
                threads,
                recall_sample,
            })
        }
        BenchCommand::View { rows, dir } => crate::bench::view(rows, dir),
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
    let filter = EnvFilter::try_from_env("SYNTH_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!("{level},hyper=warn,reqwest=warn,h2=warn,rustls=warn,hf_hub=warn,llama-cpp-2=warn"))
    });
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(synth_core::progress::LogSink);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_target(false).compact().init(),
    }
}
