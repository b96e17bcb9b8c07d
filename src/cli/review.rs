//! `synth review`: append keep / drop decisions to an output directory's review file
//! (`review.jsonl`, `quality::review`), or show the decisions so far. A bad line in the
//! file is reported with its file and line (exit 78) and nothing is written.

use super::args::ReviewArgs;
use super::common::{EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME};
use synth_quality::review::{self, Decision, Review, Verdict};

pub fn run(args: &ReviewArgs) -> i32 {
    let path = args.output_dir.join(review::FILE);
    let current = match Review::load(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_CONFIG;
        }
    };
    let (ids, verdict) = match (&args.drop[..], &args.keep[..]) {
        ([], []) => return show(&current, args.json),
        (drop, []) => (drop, Verdict::Drop),
        ([], keep) => (keep, Verdict::Keep),
        _ => unreachable!("clap refuses both"),
    };
    if let Some(stage) = &args.stage {
        match missing_ids(&args.output_dir, stage, ids) {
            Ok(missing) if missing.is_empty() => {}
            Ok(missing) => {
                eprintln!("error: stage \"{stage}\" has no record with id {}", missing.join(", "));
                return EXIT_CONFIG;
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                return EXIT_CONFIG;
            }
        }
    }
    let reviewer = args
        .reviewer
        .clone()
        .or_else(|| std::env::var("SYNTH_REVIEWER").ok())
        .or_else(|| std::env::var("USER").ok())
        .filter(|r| !r.trim().is_empty());
    let time = review::now();
    let decisions: Vec<Decision> = ids
        .iter()
        .map(|id| Decision {
            id: id.clone(),
            decision: verdict,
            note: args.note.clone(),
            reviewer: reviewer.clone(),
            time: Some(time.clone()),
            stage: args.stage.clone(),
        })
        .collect();
    if let Err(e) = review::append(&path, &decisions) {
        eprintln!("error: writing {}: {e}", path.display());
        return EXIT_RUNTIME;
    }
    println!(
        "{} {} record(s) in {}; the next `synth run` applies it",
        if verdict == Verdict::Drop { "dropped" } else { "kept" },
        decisions.len(),
        path.display()
    );
    EXIT_OK
}

fn show(review: &Review, json: bool) -> i32 {
    if json {
        for d in review.decisions() {
            println!("{}", serde_json::to_string(d).expect("serializable"));
        }
        return EXIT_OK;
    }
    let (kept, dropped) = review.counts();
    println!("{}: {} decision(s): {kept} kept, {dropped} dropped", review.path.display(), kept + dropped);
    for d in review.decisions() {
        let who = d.reviewer.as_deref().unwrap_or("?");
        let note = d.note.as_deref().map(|n| format!(" — {n}")).unwrap_or_default();
        println!(
            "  {:<4} {} ({who}{}){note}",
            d.decision.as_str(),
            d.id,
            d.time.as_deref().map(|t| format!(", {t}")).unwrap_or_default()
        );
    }
    EXIT_OK
}

/// The ids among `ids` that are not records of `stage`'s output.
fn missing_ids(dir: &std::path::Path, stage: &str, ids: &[String]) -> anyhow::Result<Vec<String>> {
    use synth_core::data::arrow::array::Array;
    let path = synth_engine::stages::output_path(dir, stage);
    if !path.exists() {
        anyhow::bail!("no output of stage \"{stage}\" in {} ({} is missing)", dir.display(), path.display());
    }
    let mut want: std::collections::BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    for batch in synth_core::store::parquet::open_reader(&path, 8192)? {
        let batch = batch?;
        let col = synth_core::data::ids(&batch);
        for i in 0..col.len() {
            want.remove(col.value(i));
        }
        if want.is_empty() {
            break;
        }
    }
    Ok(want.into_iter().map(str::to_string).collect())
}
