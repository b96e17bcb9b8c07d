//! `synth run`: load and check the pipeline, run it on a tokio runtime with Ctrl-C
//! handling (first signal: stop taking new work and keep what is complete; second:
//! exit at once), then print what ran.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::args::RunArgs;
use super::common::{EXIT_BUSY, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NOT_READY, EXIT_OK, EXIT_RUNTIME};
use synth_core::progress::ProgressHub;
use synth_core::store::object::StateStore;
use synth_core::store::state::StageStatus;
use synth_runner::dag::runner::{self, RunError, RunOptions, RunSummary};
use synth_runner::dag::shard::{self, ShardOutcome, Sharding};

/// What this process is in a sharded run.
enum Part {
    Whole,
    Local(Sharding),
    Step(Sharding, usize),
    Shard(Sharding, usize, usize),
}

pub fn run(args: &RunArgs, quiet: bool, log_format: super::args::LogFormat) -> i32 {
    let mut p = match super::common::load_or_report(&args.pipeline) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let out_dir = args.out.clone().unwrap_or_else(|| p.output_dir.clone());
    let lock = match args.locked {
        false => None,
        true => {
            let (path, key) =
                synth_runner::regen::lock::location(&args.pipeline.pipeline, args.lockfile.lockfile.as_deref());
            match synth_runner::regen::locked_entry(&path, &key, p.profile.as_deref()) {
                Ok(entry) => Some(Arc::new(entry)),
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_CONFIG;
                }
            }
        }
    };
    // `local` models read through the hub come from the locked commit.
    if let Some(lock) = &lock
        && let Err(e) = synth_runner::regen::lock::pin_models(&mut p, lock)
    {
        eprintln!("error: {e}");
        return EXIT_CONFIG;
    }
    let p = Arc::new(p);
    let (state, work) = match &args.state {
        None => (None, out_dir.clone()),
        Some(url) => {
            let work = work_dir(args, url);
            match StateStore::open(url, &work) {
                Ok(s) => (Some(s), work),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return EXIT_CONFIG;
                }
            }
        }
    };
    let part = match part(args, work.clone()) {
        Ok(part) => part,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_CONFIG;
        }
    };
    // A dry run of a sharded run: what would run, and where (wave or step).
    let placement = match (&part, args.dry_run) {
        (Part::Whole, _) | (_, false) => None,
        (_, true) => Some((shard::waves(&p), p.clone())),
    };
    let part = if placement.is_some() { Part::Whole } else { part };
    if !matches!(part, Part::Whole) && (args.only.is_some() || args.from.is_some() || args.force || args.detach) {
        eprintln!(
            "error: --only, --from, --force and --detach do not combine with --shards (a sharded run builds what is not up to date; remove outputs to rebuild them)"
        );
        return EXIT_CONFIG;
    }
    let opts = RunOptions {
        out_dir,
        state,
        only: args.only.clone(),
        from: args.from.clone(),
        until: args.until.clone(),
        limit: args.limit,
        force: args.force,
        dry_run: args.dry_run,
        lease_ttl: Some(std::time::Duration::from_secs(args.lease_seconds.max(1))),
        role: None,
        resolve_only: false,
        lock: lock.clone(),
        detach: args.detach,
        max_cost_usd: None,
        estimate: None,
    };
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let dry_run = opts.dry_run;
    // The estimate, for a pipeline that declares a model (a run on one machine).
    let estimating = (dry_run
        && !args.no_estimate
        && !p.providers.is_empty()
        && matches!(part, Part::Whole)
        && args.state.is_none())
    .then(|| (p.clone(), opts.out_dir.clone()));
    let result = runtime.block_on(async move {
        let cancel = CancellationToken::new();
        spawn_signal_handler(cancel.clone());
        let hub = ProgressHub::auto(quiet || dry_run);
        let stop_ticker = CancellationToken::new();
        let ticker = tokio::spawn(hub.clone().tick(stop_ticker.clone()));
        let result = match &part {
            Part::Whole => runner::run(p, opts, hub, cancel).await,
            Part::Step(sh, k) => shard::step(p, &opts, sh, *k, hub, cancel).await,
            Part::Shard(sh, k, i) => match shard::shard(p, &opts, sh, *k, *i, hub, cancel).await {
                Ok(ShardOutcome::Done(summary)) => Ok(summary),
                Ok(other) => {
                    eprintln!(
                        "{}",
                        match other {
                            ShardOutcome::Nothing => format!("wave {k}: nothing to run"),
                            _ => format!("wave {k} shard {i}: already done"),
                        }
                    );
                    return Ok(None);
                }
                Err(e) => Err(e),
            },
            Part::Local(sh) => {
                let launch = launcher(args, sh, quiet, log_format);
                shard::run_local(p, &opts, sh, &launch, hub, cancel).await
            }
        };
        stop_ticker.cancel();
        let _ = ticker.await;
        result.map(Some)
    });
    let result = match result {
        Ok(None) => return EXIT_OK,
        Ok(Some(s)) => Ok(s),
        Err(e) => Err(e),
    };
    match result {
        Ok(summary) if dry_run => {
            print_plan(&summary, placement.as_ref().map(|(w, p)| (w, p.as_ref(), args.shards.unwrap_or(1))));
            match estimating {
                Some((p, out_dir)) if summary.lines.iter().any(would_run) => {
                    estimate(&runtime, p, args, &out_dir, quiet)
                }
                _ => EXIT_OK,
            }
        }
        Ok(summary) => {
            print_summary(&summary);
            // Under --locked, the models that answered must be the locked ones.
            // (The manifest of where this process ran: the --out directory, the work
            // mirror of --state, a shard's own work directory.)
            if let Some(lock) = &lock
                && let Ok(manifest) = synth_core::store::state::Manifest::load(&summary.out_dir)
            {
                let bad = synth_runner::regen::lock::served_mismatches(lock, &manifest);
                if !bad.is_empty() {
                    eprintln!(
                        "error: {}\nthe outputs are kept; run `synth lock --update` to accept the model that answered",
                        bad.join("\n")
                    );
                    return EXIT_RUNTIME;
                }
            }
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
        Err(RunError::NotReady(msg)) => {
            eprintln!("not ready: {msg}");
            EXIT_NOT_READY
        }
        Err(RunError::Busy(msg)) => {
            eprintln!("error: {msg}");
            EXIT_BUSY
        }
    }
}

/// A stage a dry run's plan says would run.
fn would_run(l: &synth_runner::dag::runner::StageLine) -> bool {
    !matches!(l.status, StageStatus::UpToDate | StageStatus::Skipped | StageStatus::Failed | StageStatus::Cancelled)
}

/// `--dry-run`'s estimate: the run simulated in a scratch directory (its local stages
/// run, every model call is counted and answered by a stand-in, `--sample N` of each
/// stage's sent), then a table per stage of requests, tokens, cost and time.
fn estimate(
    runtime: &tokio::runtime::Runtime,
    p: Arc<synth_runner::pipeline::Pipeline>,
    args: &RunArgs,
    out_dir: &std::path::Path,
    quiet: bool,
) -> i32 {
    use synth_core::store::state::INTERNAL_DIR;
    use synth_engine::services::estimate::{Estimator, table};
    let scratch = match tempfile::Builder::new().prefix("synth-estimate-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: a scratch directory for the estimate: {e}");
            return EXIT_RUNTIME;
        }
    };
    let internal = out_dir.join(INTERNAL_DIR);
    let real_cache = internal.join(synth_core::store::cache::CACHE_FILE).exists();
    let result = runtime.block_on(async {
        // The run's response cache says which calls are paid already; a sample fills it. It
        // is used under the run's lock (a run in progress owns it).
        let _lock = if real_cache || args.sample > 0 { Some(runner::prepare_out_dir(out_dir).await?) } else { None };
        let cache_dir = if _lock.is_some() { internal.clone() } else { scratch.path().join(INTERNAL_DIR) };
        // Files the run's sources downloaded are read, not fetched again.
        let downloads = internal.join("downloads");
        if downloads.is_dir() {
            let _ = std::fs::create_dir_all(scratch.path().join(INTERNAL_DIR));
            #[cfg(unix)]
            let _ = std::os::unix::fs::symlink(&downloads, scratch.path().join(INTERNAL_DIR).join("downloads"));
        }
        let estimator = Arc::new(Estimator::new(args.sample));
        let opts = RunOptions {
            out_dir: scratch.path().to_path_buf(),
            until: args.until.clone(),
            limit: args.limit,
            estimate: Some((estimator.clone(), cache_dir)),
            ..Default::default()
        };
        let cancel = CancellationToken::new();
        spawn_signal_handler(cancel.clone());
        if !quiet {
            eprintln!(
                "estimating: the run simulated in {} (local stages run; model calls counted, not sent{})",
                scratch.path().display(),
                if args.sample > 0 { format!(", except {} a stage", args.sample) } else { String::new() }
            );
        }
        let hub = ProgressHub::new(synth_core::progress::Mode::Quiet);
        // The simulated stages' "starts" / "done" lines are not the user's run (warnings and
        // errors still show).
        synth_core::progress::mute_info(true);
        let outcome = runner::run(p.clone(), opts, hub, cancel).await;
        synth_core::progress::mute_info(false);
        Ok::<_, RunError>((outcome, estimator))
    });
    let (outcome, estimator) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: the estimate: {e}");
            return if matches!(e, RunError::Busy(_)) { EXIT_BUSY } else { EXIT_RUNTIME };
        }
    };
    let order: Vec<String> = p.graph.order.iter().map(|&i| p.stages[i].name.clone()).collect();
    let stages = estimator.stages();
    println!();
    if stages.is_empty() {
        println!("estimate: no stage that would run calls a model");
    } else {
        println!("estimate (a simulated run; calls answered from the cache are free):");
        print!("{}", table(&stages, &order, args.sample));
    }
    // The plan stands either way (exit 0); an estimate cut short says so, and why.
    if let Err(e) = outcome {
        // (Its first line: the rest is about resuming a scratch directory that is gone.)
        let why = e.to_string();
        println!(
            "estimate incomplete: the simulated run stopped, so it covers the stages before: {}",
            why.lines().next().unwrap_or_default()
        );
    }
    EXIT_OK
}

/// The local work directory of an object-store state.
fn work_dir(args: &RunArgs, url: &str) -> std::path::PathBuf {
    if let Some(w) = &args.work {
        return w.clone();
    }
    if let Some(w) = std::env::var_os("SYNTH_WORK_DIR") {
        return w.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("synth").join("work").join(&blake3::hash(url.as_bytes()).to_hex()[..16])
}

/// What this process is, from --shards, --shard / the scheduler's index, --step.
fn part(args: &RunArgs, work: std::path::PathBuf) -> Result<Part, String> {
    let Some(n) = args.shards else {
        if args.shard.is_some() || args.step.is_some() {
            return Err("--shard and --step need --shards".into());
        }
        return Ok(Part::Whole);
    };
    let n = n as usize;
    let sh = Sharding {
        shards: n,
        parallel: args.parallel.map_or(n, |p| p as usize).min(n),
        work,
        lease_ttl: std::time::Duration::from_secs(args.lease_seconds.max(1)),
        wait: args.wait.map(std::time::Duration::from_secs),
        run_id: args.run_id.clone(),
    };
    if let Some(k) = args.step {
        return Ok(Part::Step(sh, k as usize));
    }
    let index = match args.shard {
        Some(i) => Some(i as usize),
        None if args.executor.is_some() => None,
        None => ["JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID"]
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .map(|v| v.trim().parse::<usize>().map_err(|_| format!("the shard index \"{v}\" is not a number")))
            .transpose()?,
    };
    match (index, args.wave) {
        (Some(i), Some(k)) if k >= 1 => Ok(Part::Shard(sh, k as usize, i)),
        (Some(_), _) => Err("a shard needs --wave K (K >= 1; `synth status` lists the waves)".into()),
        (None, Some(_)) => Err("--wave needs --shard (or $JOB_COMPLETION_INDEX / $SLURM_ARRAY_TASK_ID)".into()),
        (None, None) => Ok(Part::Local(sh)),
    }
}

/// The command line of one shard of the local executor: this program with the same
/// pipeline arguments, quiet, its log in `_synth/logs/` of the state (or work) folder
/// (`wK-sI.log`, every attempt appended under a header line).
fn launcher(
    args: &RunArgs,
    sh: &Sharding,
    quiet: bool,
    log_format: super::args::LogFormat,
) -> impl Fn(usize, usize) -> tokio::process::Command + Send + Sync + use<> {
    let exe = std::env::current_exe().unwrap_or_else(|_| "synth".into());
    let mut base: Vec<std::ffi::OsString> = vec!["run".into(), args.pipeline.pipeline.clone().into()];
    if let Some(p) = &args.pipeline.profile {
        base.extend(["--profile".into(), p.into()]);
    }
    if args.pipeline.offline {
        base.push("--offline".into());
    }
    for s in &args.pipeline.sets {
        base.extend(["--set".into(), s.into()]);
    }
    if let Some(l) = args.limit {
        base.extend(["--limit".into(), l.to_string().into()]);
    }
    match &args.state {
        Some(url) => base.extend(["--state".into(), url.into(), "--work".into(), sh.work.clone().into()]),
        None => {
            if let Some(o) = &args.out {
                base.extend(["--out".into(), o.clone().into()]);
            }
        }
    }
    base.extend([
        "--shards".into(),
        sh.shards.to_string().into(),
        "--parallel".into(),
        sh.parallel.to_string().into(),
        "--lease-seconds".into(),
        args.lease_seconds.to_string().into(),
    ]);
    if let Some(id) = &args.run_id {
        base.extend(["--run-id".into(), id.into()]);
    }
    // Each shard resolves its upstreams to the same locked versions (and checks its files
    // and served models against the lock) as the steps do.
    if args.locked {
        base.push("--locked".into());
        if let Some(l) = &args.lockfile.lockfile {
            base.extend(["--lockfile".into(), l.clone().into()]);
        }
    }
    if matches!(log_format, super::args::LogFormat::Json) {
        base.extend(["--log-format".into(), "json".into()]);
    }
    let _ = quiet;
    let logs = sh.work.join(synth_core::store::state::INTERNAL_DIR).join("logs");
    move |k: usize, i: usize| {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(&base).args(["--wave", &k.to_string(), "--shard", &i.to_string(), "-q"]);
        let _ = std::fs::create_dir_all(&logs);
        // Appended, never truncated: a re-run (or a shard started again after a failure)
        // adds its attempt below the earlier ones, which are the evidence of why they ended.
        let path = logs.join(format!("w{k}-s{i:05}.log"));
        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            Ok(mut f) => {
                use std::io::Write;
                let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
                let _ = writeln!(f, "==== synth shard {i} of wave {k}: attempt started {now} ====");
                cmd.stderr(f);
            }
            Err(_) => {
                cmd.stderr(std::process::Stdio::inherit());
            }
        }
        cmd.stdout(std::process::Stdio::null()).stdin(std::process::Stdio::null()).kill_on_drop(false);
        cmd.env_remove("JOB_COMPLETION_INDEX").env_remove("SLURM_ARRAY_TASK_ID");
        cmd
    }
}

/// The multi-threaded runtime a command runs on (or the exit code when it cannot start).
pub(super) fn runtime() -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the async runtime: {e}");
        EXIT_RUNTIME
    })
}

pub(super) fn spawn_signal_handler(cancel: CancellationToken) {
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
            summary.location
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
    println!("outputs in {}", summary.location);
    if summary.traffic != (0, 0) {
        println!(
            "object store traffic: {:.1} MiB up, {:.1} MiB down",
            summary.traffic.0 as f64 / (1 << 20) as f64,
            summary.traffic.1 as f64 / (1 << 20) as f64
        );
    }
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
                synth_core::store::failures::one_line(&f.first, 300),
                f.path.display()
            );
        }
    }
}

fn print_plan(
    summary: &RunSummary,
    waves: Option<(&synth_runner::dag::waves::Waves, &synth_runner::pipeline::Pipeline, u32)>,
) {
    let width = summary.lines.iter().map(|l| l.stage.len()).max().unwrap_or(5);
    if let Some((w, p, n)) = waves {
        println!("{} wave(s) of {n} shards; steps 0 to {} run once:", w.n_waves, w.n_waves);
        for l in &summary.lines {
            let Some(i) = p.stage_index(&l.stage) else { continue };
            let at = match w.placement[i] {
                synth_runner::dag::waves::Placement::Wave(k) => format!("wave {k} ({n} shards)"),
                synth_runner::dag::waves::Placement::Step(k) => format!("step {k}"),
            };
            println!("{:width$}  {at}", l.stage);
        }
        println!();
    }
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
