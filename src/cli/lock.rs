//! `synth lock`: resolve every upstream of a pipeline (hub revisions to commits, local
//! files to hashes, `local` providers' hub models to commits; nothing is downloaded) and write its entry of `synth.lock`, with the
//! models the providers served in the last run of its output directory. Without
//! `--update` what is locked stays (new stages are added, drift is reported); `--update`
//! takes everything as it is now.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::args::LockArgs;
use super::common::{EXIT_BUSY, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNTIME};
use synth_core::store::lock::{LockFile, PipelineLock, changes};
use synth_core::store::state::Manifest;
use synth_runner::regen::{self, RegenError};

pub fn run(args: &LockArgs) -> i32 {
    let p = match super::common::load_or_report(&args.pipeline) {
        Ok(p) => Arc::new(p),
        Err(code) => return code,
    };
    let out_dir = args.out.clone().unwrap_or_else(|| p.output_dir.clone());
    let (path, key) = regen::lock::location(&args.pipeline.pipeline, args.lockfile.lockfile.as_deref());
    let mut file = match LockFile::load(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e:#}");
            return EXIT_CONFIG;
        }
    };
    let existing = file.find(&key, p.profile.as_deref()).cloned();
    let runtime = match super::run::runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let resolved = runtime.block_on(async {
        let cancel = CancellationToken::new();
        super::run::spawn_signal_handler(cancel.clone());
        regen::resolve(&p, &out_dir, None, &cancel).await
    });
    let lines = match resolved {
        Ok(l) => l,
        Err(e) => return report(e),
    };
    let mut fresh = match regen::lock::from_plan(&lines, key.clone(), p.profile.clone()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e:#}");
            return EXIT_RUNTIME;
        }
    };
    if let Ok(manifest) = Manifest::load(&out_dir)
        && manifest.pipeline.name == p.name
    {
        regen::lock::record_served(&mut fresh, &manifest);
    }
    if let Err(e) = runtime.block_on(regen::lock::record_models(&mut fresh, &p)) {
        eprintln!("error: {e:#}");
        return EXIT_RUNTIME;
    }
    match &existing {
        Some(old) => {
            let moved = changes(old, &fresh);
            if moved.is_empty() {
                println!("{}: {key} is up to date", path.display());
            } else if args.update {
                println!("updating {key}:");
            } else {
                println!("{key}: moved since it was locked, not taken (`synth lock --update` takes them):");
            }
            for line in moved.lines() {
                println!("  {line}");
            }
        }
        None => println!("locking {key}{}", p.profile.as_ref().map(|p| format!(" (profile {p})")).unwrap_or_default()),
    }
    let entry = match (&existing, args.update) {
        (Some(old), false) => keep_locked(old, fresh),
        _ => fresh,
    };
    let hub_pins: usize = entry.stages.values().map(|s| s.upstream.len()).sum();
    let files: usize = entry.stages.values().map(|s| s.files.len()).sum();
    let served: usize = entry.providers.values().map(|p| p.served.len()).sum();
    file.upsert(entry);
    if let Err(e) = file.save(&path) {
        eprintln!("error: writing {}: {e:#}", path.display());
        return EXIT_RUNTIME;
    }
    println!(
        "wrote {}: {} upstream commit(s), {} file hash(es), {} served model(s)",
        path.display(),
        hub_pins,
        files,
        served
    );
    EXIT_OK
}

/// Without `--update`: stages keep their locked upstreams and file hashes (drift is
/// reported by the caller and `--locked` refuses it); new stages and providers are added.
fn keep_locked(old: &PipelineLock, fresh: PipelineLock) -> PipelineLock {
    let mut out = fresh;
    for (name, stage) in out.stages.iter_mut() {
        if let Some(locked) = old.stages.get(name) {
            *stage = locked.clone();
        }
    }
    for (name, provider) in &old.providers {
        out.providers.insert(name.clone(), provider.clone());
    }
    out.locked_at = old.locked_at.clone();
    out
}

fn report(e: RegenError) -> i32 {
    match &e {
        RegenError::Interrupted(m) => eprintln!("{m}"),
        other => eprintln!("error: {other}"),
    }
    exit_code(&e)
}

pub(super) fn exit_code(e: &RegenError) -> i32 {
    match e {
        RegenError::Config(_) => EXIT_CONFIG,
        RegenError::Busy(_) => EXIT_BUSY,
        RegenError::Failed(_) => EXIT_RUNTIME,
        RegenError::Interrupted(_) => EXIT_INTERRUPTED,
    }
}
