//! `synth run`: load and check the pipeline, run it on a tokio runtime with Ctrl-C
//! handling (first signal: stop taking new work and keep what is complete; second:
//! exit at once), then print what ran.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNTIME, RunArgs};
use crate::dag::runner::{self, RunError, RunOptions, RunSummary};
use crate::progress::ProgressHub;
use crate::store::state::StageStatus;

pub fn run(args: &RunArgs, quiet: bool) -> i32 {
    let p = match super::load_or_report(&args.pipeline) {
        Ok(p) => Arc::new(p),
        Err(code) => return code,
    };
    let out_dir = args.out.clone().unwrap_or_else(|| p.output_dir.clone());
    let opts = RunOptions {
        out_dir,
        only: args.only.clone(),
        from: args.from.clone(),
        until: args.until.clone(),
        limit: args.limit,
        force: args.force,
        dry_run: args.dry_run,
        detach: args.detach,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return EXIT_RUNTIME;
        }
    };
    let dry_run = opts.dry_run;
    let result = runtime.block_on(async move {
        let cancel = CancellationToken::new();
        spawn_signal_handler(cancel.clone());
        let hub = ProgressHub::auto(quiet || dry_run);
        let stop_ticker = CancellationToken::new();
        let ticker = tokio::spawn(hub.clone().tick(stop_ticker.clone()));
        let result = runner::run(p, opts, hub, cancel).await;
        stop_ticker.cancel();
        let _ = ticker.await;
        result
    });
    match result {
        Ok(summary) if dry_run => {
            print_plan(&summary);
            EXIT_OK
        }
        Ok(summary) => {
            print_summary(&summary);
            EXIT_OK
        }
        Err(RunError::Usage(msg)) => {
            eprintln!("error: {msg}");
            EXIT_CONFIG
        }
        Err(RunError::Failed(msg)) => {
            eprintln!("error: {msg}");
            EXIT_RUNTIME
        }
        Err(RunError::Interrupted(msg)) => {
            eprintln!("{msg}");
            EXIT_INTERRUPTED
        }
    }
}

fn spawn_signal_handler(cancel: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            #[cfg(unix)]
            let got = async {
                match term.as_mut() {
                    Some(t) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {},
                            _ = t.recv() => {},
                        }
                    }
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            };
            #[cfg(not(unix))]
            let got = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            got.await;
            if cancel.is_cancelled() {
                eprintln!("second interrupt: exiting now; completed stages are kept, the next run resumes");
                std::process::exit(EXIT_INTERRUPTED);
            }
            eprintln!("interrupt: finishing work in flight, then stopping (press Ctrl-C again to exit at once)");
            cancel.cancel();
        }
    });
}

fn print_summary(summary: &RunSummary) {
    let waiting: Vec<&str> =
        summary.lines.iter().filter(|l| l.status == StageStatus::Waiting).filter_map(|l| l.reason.as_deref()).collect();
    if summary.n_ran() == 0 && waiting.is_empty() {
        println!(
            "everything is up to date ({} stages); outputs in {}",
            summary.lines.iter().filter(|l| l.status == StageStatus::UpToDate).count(),
            summary.out_dir.display()
        );
        return;
    }
    let width = summary.lines.iter().map(|l| l.stage.len()).max().unwrap_or(5).max(5);
    println!(
        "{:width$}  {:10}  {:>10}  {:>10}  {:>8}  {:>9}",
        "stage", "status", "rows in", "rows out", "failed", "seconds"
    );
    for l in &summary.lines {
        let status = match l.status {
            StageStatus::Ran => "ran",
            StageStatus::UpToDate => "up to date",
            StageStatus::Skipped => "skipped",
            StageStatus::Cancelled => "cancelled",
            StageStatus::Failed => "failed",
            StageStatus::Waiting => "waiting",
            _ => "pending",
        };
        match (&l.report, l.status) {
            (Some(r), StageStatus::Ran) => println!(
                "{:width$}  {:10}  {:>10}  {:>10}  {:>8}  {:>9.2}",
                l.stage, status, r.rows_in, r.rows_out, r.rows_failed, r.wall_seconds
            ),
            (Some(r), _) => println!(
                "{:width$}  {:10}  {:>10}  {:>10}  {:>8}  {:>9}",
                l.stage, status, r.rows_in, r.rows_out, r.rows_failed, "-"
            ),
            (None, _) => println!("{:width$}  {status}", l.stage),
        }
    }
    println!("outputs in {}", summary.out_dir.display());
    for w in waiting {
        eprintln!("{w}");
    }
    // Records that failed are kept, with their reasons, and the run goes on: say so loudly.
    for l in &summary.lines {
        if let Some(f) = &l.failures {
            eprintln!(
                "warning: stage \"{}\": {} record(s) failed (first: {}); all are in {}",
                l.stage,
                f.count,
                crate::store::failures::one_line(&f.first, 300),
                f.path.display()
            );
        }
    }
}

fn print_plan(summary: &RunSummary) {
    let width = summary.lines.iter().map(|l| l.stage.len()).max().unwrap_or(5);
    let mut n_run = 0;
    for l in &summary.lines {
        let (what, why) = match l.status {
            StageStatus::UpToDate => ("up to date", String::new()),
            StageStatus::Skipped => ("not selected", String::new()),
            StageStatus::Failed | StageStatus::Cancelled => ("blocked", l.reason.clone().unwrap_or_default()),
            _ => {
                n_run += 1;
                ("would run", l.reason.clone().unwrap_or_default())
            }
        };
        let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
        println!("{:width$}  [{}]  {what}{why}", l.stage, l.kind);
    }
    if n_run == 0 {
        println!("everything is up to date; nothing would run");
    } else {
        println!("{n_run} stage(s) would run (dry run: nothing was run)");
    }
}
