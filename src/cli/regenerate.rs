//! `synth regenerate`: the scheduled job. Prints what moved, what ran, the snapshot and
//! where it was published; `--json` prints the summary hooks receive. Exit status 0 when
//! regenerated or unchanged, 2 on failure, 75 when another regeneration holds the output
//! directory, 78 for a configuration problem, 130 when interrupted.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::args::RegenerateArgs;
use super::common::EXIT_OK;
use synth_core::progress::ProgressHub;
use synth_runner::regen::hooks::Status;
use synth_runner::regen::{self, RegenError, RegenOptions};

pub fn run(args: &RegenerateArgs, quiet: bool) -> i32 {
    let p = match super::common::load_or_report(&args.pipeline) {
        Ok(p) => Arc::new(p),
        Err(code) => return code,
    };
    let opts = RegenOptions {
        pipeline_file: args.pipeline.pipeline.clone(),
        out_dir: args.out.clone().unwrap_or_else(|| p.output_dir.clone()),
        if_changed: args.if_changed,
        snapshot: args.snapshot,
        push: args.push.push.clone(),
        locked: args.locked,
        lockfile: args.lockfile.lockfile.clone(),
        max_cost_usd: args.max_cost_usd,
        keep: args.keep,
    };
    let runtime = match super::run::runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let result = runtime.block_on(async move {
        let cancel = CancellationToken::new();
        super::run::spawn_signal_handler(cancel.clone());
        let hub = ProgressHub::auto(quiet);
        let stop_ticker = CancellationToken::new();
        let ticker = tokio::spawn(hub.clone().tick(stop_ticker.clone()));
        let result = regen::regenerate(p, opts, hub, cancel).await;
        stop_ticker.cancel();
        let _ = ticker.await;
        result
    });
    let s = &result.summary;
    if args.json {
        println!("{}", s.to_json());
    } else {
        match s.status {
            Status::Unchanged => println!(
                "unchanged: nothing moved since {}",
                s.snapshot.as_ref().map(|x| x.id.as_str()).or(s.previous_snapshot.as_deref()).unwrap_or("the last run")
            ),
            Status::Regenerated => {
                println!("regenerated {}", s.pipeline);
                for c in &s.changes {
                    println!("  moved: {c}");
                }
                if !s.stages_ran.is_empty() {
                    println!("  ran: {} ({} up to date)", s.stages_ran.join(", "), s.stages_up_to_date);
                }
                for (export, d) in &s.diff {
                    println!(
                        "  {export}: {} rows, +{} added, -{} removed, {} changed",
                        d.rows, d.added, d.removed, d.changed
                    );
                }
                if let Some(snap) = &s.snapshot {
                    println!("  snapshot {} ({})", snap.id, snap.path);
                }
                if let Some(h) = &s.hub {
                    println!(
                        "  published {}@{} as commit {}{}",
                        h.repo,
                        h.branch,
                        h.commit,
                        h.tag.as_ref().map(|t| format!(", tag {t}")).unwrap_or_default()
                    );
                }
            }
            Status::Failed => {}
        }
    }
    for w in &result.warnings {
        eprintln!("warning: {}", synth_core::secrets::scrub(w));
    }
    match &result.error {
        None => EXIT_OK,
        Some(e) => {
            match e {
                RegenError::Interrupted(m) => eprintln!("{m}"),
                other => eprintln!("error: {}", synth_core::secrets::scrub(&other.to_string())),
            }
            if !matches!(e, RegenError::Busy(_)) {
                eprintln!("nothing was published and `latest` was not moved");
            }
            super::lock::exit_code(e)
        }
    }
}
