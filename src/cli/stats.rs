//! `synth stats`: per-stage figures (rows in/out/failed, wall time, requests,
//! tokens, cost) from an output directory's manifest.

use super::args::StatsArgs;
use super::common::{EXIT_OK, EXIT_RUNTIME};
use synth_core::store::state::{Manifest, StageStatus};

pub fn run(args: &StatsArgs) -> i32 {
    let manifest = match Manifest::load(&args.output_dir) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e:#} (is {} a synth output directory?)", args.output_dir.display());
            return EXIT_RUNTIME;
        }
    };
    if args.json {
        let stages: serde_json::Map<String, serde_json::Value> = manifest
            .stages
            .iter()
            .map(|(k, s)| (k.clone(), serde_json::json!({"kind": s.kind, "status": s.status, "report": s.report})))
            .collect();
        println!(
            "{}",
            serde_json::json!({"pipeline": manifest.pipeline.name, "status": manifest.status, "stages": stages, "totals": manifest.totals})
        );
        return EXIT_OK;
    }
    print!("{}", render(&manifest));
    EXIT_OK
}

pub fn render(m: &Manifest) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pipeline \"{}\" ({}), last run {} at {}{}",
        m.pipeline.name,
        m.pipeline.path,
        serde_json::to_value(m.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        m.started_at,
        m.profile.as_ref().map(|p| format!(", profile {p}")).unwrap_or_default()
    );
    let width = m.stages.keys().map(String::len).max().unwrap_or(5).max(5);
    let _ = writeln!(
        out,
        "{:width$}  {:10}  {:>9}  {:>9}  {:>7}  {:>9}  {:>8}  {:>7}  {:>10}  {:>10}  {:>9}",
        "stage",
        "status",
        "rows in",
        "rows out",
        "failed",
        "wall s",
        "requests",
        "cached",
        "tokens in",
        "tokens out",
        "cost $"
    );
    let (mut tin, mut tout, mut cost, mut req, mut wall) = (0u64, 0u64, 0f64, 0u64, 0f64);
    for (name, s) in &m.stages {
        let status =
            serde_json::to_value(s.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        match &s.report {
            Some(r) => {
                let _ = writeln!(
                    out,
                    "{name:width$}  {status:10}  {:>9}  {:>9}  {:>7}  {:>9.2}  {:>8}  {:>7}  {:>10}  {:>10}  {:>9.4}",
                    r.rows_in,
                    r.rows_out,
                    r.rows_failed,
                    r.wall_seconds,
                    r.requests,
                    r.cache_hits,
                    r.tokens_in,
                    r.tokens_out,
                    r.cost_usd
                );
                if s.status == StageStatus::Ran || s.status == StageStatus::UpToDate {
                    tin += r.tokens_in;
                    tout += r.tokens_out;
                    cost += r.cost_usd;
                    req += r.requests;
                    wall += r.wall_seconds;
                }
            }
            None => {
                let _ = writeln!(out, "{name:width$}  {status:10}");
            }
        }
    }
    let _ = writeln!(
        out,
        "{:width$}  {:10}  {:>9}  {:>9}  {:>7}  {:>9.2}  {:>8}  {:>7}  {:>10}  {:>10}  {:>9.4}",
        "total", "", "", "", "", wall, req, "", tin, tout, cost
    );
    // Stages that ran through provider batches: their cost is at the batch price.
    for (name, s) in &m.stages {
        let Some(r) = &s.report else { continue };
        if r.info.get("mode").map(String::as_str) != Some("batch") {
            continue;
        }
        let metric = |k: &str| r.metrics.get(k).copied().unwrap_or(0.0);
        let _ = writeln!(
            out,
            "batch: stage \"{name}\": {} answer(s) from {} batch(es) ({} api) at the batch price (x{}): ${:.4} (online: ${:.4}); {} resubmitted, {} sent online, {} rejected, {} gave up",
            metric("batch.answered"),
            metric("batch.batches"),
            r.info.get("batch_api").map(String::as_str).unwrap_or("?"),
            r.info.get("batch_price_factor").map(String::as_str).unwrap_or("?"),
            metric("batch.cost_usd"),
            metric("batch.online_cost_usd"),
            metric("batch.resubmitted"),
            metric("batch.online_fallback"),
            metric("batch.rejected"),
            metric("batch.gave_up"),
        );
    }
    out
}
