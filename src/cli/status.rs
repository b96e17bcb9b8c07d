//! `synth status`: where a run stands, from its state alone (a directory or an object
//! store): the last run's outcome and, for sharded runs, each wave's plan, the shards
//! done and missing, whether it was merged, and the retry set of the missing shards as
//! Kubernetes indices and a Slurm `--array` expression.

use super::args::StatusArgs;
use super::common::{EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME};
use synth_core::store::object::StateStore;
use synth_runner::dag::status::{Report, report};

pub fn run(args: &StatusArgs) -> i32 {
    let store = match (&args.state, &args.dir) {
        (Some(url), None) => {
            let work = std::env::temp_dir().join(format!("synth-status-{}", std::process::id()));
            match StateStore::open(url, &work) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return EXIT_CONFIG;
                }
            }
        }
        (None, Some(dir)) => StateStore::local(dir),
        _ => {
            eprintln!("error: give an output directory or --state URL");
            return EXIT_CONFIG;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_RUNTIME;
        }
    };
    let result = runtime.block_on(report(&store, args.shards.map(|n| n as usize)));
    if store.is_remote() {
        let _ = std::fs::remove_dir_all(store.dir());
    }
    match result {
        Ok(r) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r).expect("serializable"));
            } else {
                print!("{}", render(&r));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}

fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "state: {}", r.state);
    match &r.run {
        None => {
            let _ = writeln!(out, "no run has written a manifest here yet");
        }
        Some(m) => {
            let _ = writeln!(
                out,
                "pipeline \"{}\": last run {} (started {}), {} stages: {} ran, {} up to date, {} failed",
                m["pipeline"].as_str().unwrap_or_default(),
                m["status"].as_str().unwrap_or_default(),
                m["started_at"].as_str().unwrap_or_default(),
                m["stages"],
                m["ran"],
                m["up_to_date"],
                m["failed"],
            );
        }
    }
    if r.waves.is_empty() {
        let _ = writeln!(out, "no sharded run has planned a wave here");
    }
    for w in &r.waves {
        if w.stages.is_empty() {
            let _ = writeln!(out, "wave {} ({} shards): nothing to run, every stage up to date", w.wave, w.shards);
            continue;
        }
        let _ = writeln!(
            out,
            "wave {} ({} shards, limits divided by {}): {}",
            w.wave,
            w.shards,
            w.rate_split,
            w.stages.join(", ")
        );
        let _ = writeln!(
            out,
            "  {} of {} shards done, {}; plan {}",
            w.done,
            w.shards,
            if w.merged { "merged" } else { "not merged" },
            w.plan
        );
        if !w.missing.is_empty() {
            let _ = writeln!(out, "  missing shards: {}", w.retry_indices);
            let _ =
                writeln!(out, "  retry set: Kubernetes indices {}; Slurm --array={}", w.retry_indices, w.retry_array);
        }
    }
    out
}
