//! `synth snapshot list|diff|gc`: the snapshots of an output directory, found from a
//! pipeline file, an output directory or the snapshots directory itself.

use std::path::PathBuf;

use super::args::{PipelineArgs, SnapshotCommand, SnapshotsArg};
use super::common::{EXIT_BUSY, EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME};
use synth_runner::regen::config::RegenConfig;
use synth_runner::regen::snapshot::{self, Snapshots};

/// The snapshots directory (and the output directory it belongs to, for the lock).
fn locate(at: &SnapshotsArg) -> Result<(Snapshots, Option<PathBuf>), i32> {
    let t = &at.target;
    if t.is_file() {
        let args =
            PipelineArgs { pipeline: t.clone(), profile: at.profile.clone(), offline: at.offline, sets: Vec::new() };
        let p = super::common::load_or_report(&args)?;
        let cfg = RegenConfig::of(&p).map_err(|e| {
            eprintln!("error: {e:#}");
            EXIT_CONFIG
        })?;
        return Ok((Snapshots::new(cfg.snapshots_dir(&p.output_dir)), Some(p.output_dir.clone())));
    }
    if t.join(synth_core::store::state::MANIFEST).exists() && !t.join(snapshot::LATEST).exists() {
        // An output directory.
        return Ok((Snapshots::new(t.join("snapshots")), Some(t.clone())));
    }
    if t.is_dir() {
        return Ok((Snapshots::new(t.clone()), t.parent().map(PathBuf::from)));
    }
    eprintln!("error: {}: no such pipeline file or directory", t.display());
    Err(EXIT_CONFIG)
}

pub fn run(cmd: SnapshotCommand) -> i32 {
    match cmd {
        SnapshotCommand::List { at, json } => list(&at, json),
        SnapshotCommand::Diff { at, old, new, ids, json } => diff(&at, old, new, ids, json),
        SnapshotCommand::Gc { at, keep, dry_run } => gc(&at, keep, dry_run),
    }
}

fn list(at: &SnapshotsArg, json: bool) -> i32 {
    let (snaps, _) = match locate(at) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let (all, latest) = match (snaps.list(), snaps.latest()) {
        (Ok(a), Ok(l)) => (a, l.map(|s| s.meta.id)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e:#}");
            return EXIT_RUNTIME;
        }
    };
    if json {
        for s in &all {
            let v = serde_json::json!({
                "id": s.meta.id,
                "created_at": s.meta.created_at,
                "fingerprint": s.meta.fingerprint,
                "latest": latest.as_deref() == Some(s.id()),
                "path": s.path,
                "exports": s.meta.exports,
                "diff": s.meta.changelog.diff,
                "release": s.release,
            });
            println!("{v}");
        }
        return EXIT_OK;
    }
    if all.is_empty() {
        println!("no snapshots in {}", snaps.dir.display());
        return EXIT_OK;
    }
    for s in &all {
        let mark = if latest.as_deref() == Some(s.id()) { "*" } else { " " };
        let rows: u64 = s.meta.exports.iter().filter_map(|e| e.rows).sum();
        let published = s
            .release
            .as_ref()
            .map(|r| {
                format!("  {}@{} {}", r.repo, &r.commit[..r.commit.len().min(8)], r.tag.clone().unwrap_or_default())
            })
            .unwrap_or_default();
        println!(
            "{mark} {}  {}  {} exports, {rows} rows{published}",
            s.meta.id,
            s.meta.created_at,
            s.meta.exports.len()
        );
    }
    EXIT_OK
}

fn diff(at: &SnapshotsArg, old: Option<String>, new: Option<String>, ids: usize, json: bool) -> i32 {
    let (snaps, _) = match locate(at) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let pick = || -> anyhow::Result<(Option<snapshot::Snapshot>, snapshot::Snapshot)> {
        let new = match &new {
            Some(id) => snaps.get(id)?,
            None => snaps.latest()?.ok_or_else(|| anyhow::anyhow!("{}: no snapshots", snaps.dir.display()))?,
        };
        let old = match &old {
            Some(id) => Some(snaps.get(id)?),
            // The release it was compared with when it was made (if still kept).
            None => match &new.meta.changelog.previous {
                Some(prev) => snaps.get(prev).ok(),
                None => None,
            },
        };
        Ok((old, new))
    };
    let (old, new) = match pick() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e:#}");
            return EXIT_CONFIG;
        }
    };
    let diffs = snapshot::compare(old.as_ref(), &new);
    let old_id = old.as_ref().map(|o| o.meta.id.clone());
    if json {
        for (export, (c, list)) in &diffs {
            let take = |v: &Vec<String>| v.iter().take(ids).cloned().collect::<Vec<_>>();
            println!(
                "{}",
                serde_json::json!({
                    "old": old_id, "new": new.meta.id, "export": export,
                    "rows": c.rows, "added": c.added, "removed": c.removed, "changed": c.changed, "unchanged": c.unchanged,
                    "added_ids": take(&list.added), "removed_ids": take(&list.removed), "changed_ids": take(&list.changed),
                })
            );
        }
        return EXIT_OK;
    }
    println!("{} → {}", old_id.as_deref().unwrap_or("(nothing)"), new.meta.id);
    for (export, (c, list)) in &diffs {
        println!(
            "  {export}: {} rows, +{} added, -{} removed, {} changed, {} unchanged",
            c.rows, c.added, c.removed, c.changed, c.unchanged
        );
        for (what, v) in [("added", &list.added), ("removed", &list.removed), ("changed", &list.changed)] {
            if ids > 0 && !v.is_empty() {
                println!("    {what}: {}", v.iter().take(ids).cloned().collect::<Vec<_>>().join(", "));
            }
        }
    }
    for e in &new.meta.exports {
        if e.indexed.is_none() && e.files.iter().any(|f| f.ends_with(".jsonl") || f.ends_with(".parquet")) {
            println!("  {}: no record ids, rows not compared", e.files.join(", "));
        }
    }
    EXIT_OK
}

fn gc(at: &SnapshotsArg, keep: usize, dry_run: bool) -> i32 {
    let (snaps, out_dir) = match locate(at) {
        Ok(s) => s,
        Err(c) => return c,
    };
    // Never beside a regeneration that is writing a snapshot.
    let _guard = match out_dir {
        Some(dir) if !dry_run => match synth_runner::regen::guard::acquire(&dir, "regenerate or snapshot gc") {
            Ok(g) => Some(g),
            Err(m) => {
                eprintln!("error: {m}");
                return EXIT_BUSY;
            }
        },
        _ => None,
    };
    match snaps.gc(keep, dry_run) {
        Ok(removed) => {
            let verb = if dry_run { "would remove" } else { "removed" };
            if removed.is_empty() {
                println!("nothing to remove: {} keeps its newest {keep}", snaps.dir.display());
            } else {
                println!("{verb} {} snapshot(s): {}", removed.len(), removed.join(", "));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}
