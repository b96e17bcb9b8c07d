//! Running an external program for a stage (a trainer for `train`, an analysis script
//! for `neurons`): the files it reads, written into the stage working directory
//! (`<out>/<stage>/`) and committed before it starts; its launch in the pipeline root
//! in its own process group, with synth's environment plus the stage's; every line it
//! prints followed into the log (progress-bar redraws collapsed, secrets scrubbed); the
//! protocol lines `SYNTH_<TAG> {json}` (`pipelines/trainers/README.md`) — `SYNTH_PROGRESS`
//! drives the stage's progress here, the others go to the stage; cancellation and a time
//! limit stop the whole group (SIGTERM, SIGKILL 10 s later); a failure carries its last
//! lines.
//!
//! The stage working directory is the one named exception to "only the runner commits"
//! (ARCHITECTURE.md): its files are the program's inputs and outputs, not stage outputs.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::parquet::open_reader;
use synth_engine::stages::{Cancelled, RunCtx};

/// Lines of the program's output kept for an error message.
const TAIL_LINES: usize = 20;

/// What to run.
pub struct Launch<'a> {
    /// What the program is, in messages ("trainer", "analysis script").
    pub what: &'a str,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub timeout_minutes: Option<f64>,
}

/// `p` made absolute (against the current directory), unchanged when that fails.
pub fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Convert one input (its first `max_rows` rows, or all) to a JSONL file in the stage
/// working directory (committed before the program starts); returns (rows written,
/// failures as (id, message)).
pub fn write_work_jsonl(
    input: &Path,
    dest: &Path,
    max_rows: Option<u64>,
    convert: impl Fn(&synth_core::data::Row) -> Result<Value, String>,
) -> Result<(u64, Vec<(String, String)>)> {
    let reader = open_reader(input, 1024)?;
    let (file, pending) = create_tmp(dest)?;
    let mut w = std::io::BufWriter::new(file);
    let (mut rows, mut failed) = (0u64, Vec::new());
    let mut seen = 0u64;
    'batches: for batch in reader {
        let batch = batch?;
        for i in 0..batch.num_rows() {
            if max_rows.is_some_and(|m| seen >= m) {
                break 'batches;
            }
            seen += 1;
            let row = synth_core::data::row_json(&batch, i);
            match convert(&row) {
                Ok(v) => {
                    serde_json::to_writer(&mut w, &v)?;
                    w.write_all(b"\n")?;
                    rows += 1;
                }
                Err(e) => {
                    let id = row.get(synth_core::data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                    failed.push((id, e));
                }
            }
        }
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    finish_file(file, &pending)?;
    pending.commit()?;
    Ok((rows, failed))
}

/// Write a small file (e.g. the program's configuration) into the stage working directory.
pub fn write_work_file(dest: &Path, bytes: &[u8]) -> Result<()> {
    let (mut file, pending) = create_tmp(dest)?;
    file.write_all(bytes)?;
    finish_file(file, &pending)?;
    pending.commit()?;
    Ok(())
}

/// Split a read chunk on `\r` (progress bars redraw with it) and keep the last non-empty part.
pub fn clean_line(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let text = text.trim_end_matches(['\n', '\r']);
    let last = text.rsplit('\r').find(|s| !s.trim().is_empty())?;
    Some(last.to_string())
}

async fn pump(stream: impl AsyncRead + Unpin, name: &'static str, tx: mpsc::Sender<(&'static str, String)>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if let Some(line) = clean_line(&buf)
                    && tx.send((name, line)).await.is_err()
                {
                    break;
                }
            }
        }
    }
}

/// Terminate the program's process group: SIGTERM, then SIGKILL after a grace period.
async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: plain syscall on the process group we created for the child.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_ok() {
            return;
        }
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

fn tail_text(tail: &VecDeque<String>) -> String {
    tail.iter().map(|l| format!("  | {l}")).collect::<Vec<_>>().join("\n")
}

/// A protocol line `SYNTH_<TAG> {json object}`: (tag, phase — `train` when missing —, object).
/// `Some(None)` for a protocol line whose payload is not a JSON object (logged, ignored).
fn protocol_line(line: &str) -> Option<Option<(&str, String, Value)>> {
    let (tag, rest) = match line.split_once(' ') {
        Some((t, r)) if t.starts_with("SYNTH_") => (t, r),
        _ => return None,
    };
    match serde_json::from_str(rest.trim()) {
        Ok(v @ Value::Object(_)) => {
            let phase = v.get("phase").and_then(Value::as_str).unwrap_or("train").to_string();
            Some(Some((tag, phase, v)))
        }
        _ => Some(None),
    }
}

/// `SYNTH_PROGRESS`: the stage's progress and a log line.
fn progress(ctx: &RunCtx, phase: &str, v: &Value) {
    let step = v.get("step").and_then(Value::as_u64);
    let total = v.get("total").and_then(Value::as_u64);
    if let Some(t) = total {
        ctx.progress.set_total(t);
    }
    if let Some(s) = step {
        ctx.progress.done.store(s, Ordering::Relaxed);
    }
    let loss = v.get("loss").and_then(Value::as_f64).map(|l| format!(" loss {l:.4}")).unwrap_or_default();
    tracing::info!(
        stage = %ctx.name,
        "{phase} step {}/{}{loss}",
        step.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
        total.map(|s| s.to_string()).unwrap_or_else(|| "?".into())
    );
}

/// Run the program to its end, following its output. `on_protocol(tag, phase, object)`
/// gets every protocol line and returns whether it knows the tag (`SYNTH_PROGRESS` also
/// goes to the stage's progress, known or not).
/// Errors: a non-zero exit or the time limit (with the last lines of output), or
/// [`Cancelled`].
pub async fn run(
    ctx: &RunCtx,
    launch: Launch<'_>,
    mut on_protocol: impl FnMut(&str, String, Value) -> bool,
) -> Result<()> {
    let what = launch.what;
    let Some((program, args)) = launch.argv.split_first() else {
        bail!("command renders to nothing");
    };
    // The program sees synth's environment and `env`: values of variables named like
    // secrets (WANDB_API_KEY, HF_TOKEN...) are scrubbed from every line of its output
    // that synth logs or keeps in an error.
    let inherited: Vec<(String, String)> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    let named = inherited.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    synth_core::secrets::register_env(named.chain(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
    tracing::info!(stage = %ctx.name, "launching {what}: {}", synth_core::secrets::scrub(&launch.argv.join(" ")));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&launch.cwd)
        .env("PYTHONUNBUFFERED", "1")
        .env("SYNTH_STAGE", &ctx.name)
        .envs(&launch.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = cmd.spawn().with_context(|| format!("starting {what} \"{program}\""))?;

    let (tx, mut rx) = mpsc::channel::<(&'static str, String)>(256);
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    tokio::spawn(pump(out, "stdout", tx.clone()));
    tokio::spawn(pump(err, "stderr", tx));
    let deadline = launch.timeout_minutes.map(|m| tokio::time::Instant::now() + Duration::from_secs_f64(m * 60.0));
    let sleep_until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep_until);
    let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
    let cancel = ctx.cancel.clone();
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some((stream, line)) = msg else { break };
                match protocol_line(&line) {
                    Some(Some((tag, phase, v))) => {
                        if tag == "SYNTH_PROGRESS" {
                            progress(ctx, &phase, &v);
                            // Also to the caller (e.g. the loss curve); knowing it is optional.
                            on_protocol(tag, phase, v);
                        } else if !on_protocol(tag, phase, v) {
                            tracing::warn!(stage = %ctx.name, "{what}: unknown protocol line {tag}");
                        }
                        continue;
                    }
                    Some(None) => {
                        let (tag, rest) = line.split_once(' ').unwrap_or((&line, ""));
                        tracing::warn!(stage = %ctx.name, "{what}: {tag} line is not a JSON object: {}", synth_core::secrets::scrub(rest));
                        continue;
                    }
                    None => {}
                }
                let line = synth_core::secrets::scrub(&line);
                tracing::info!(stage = %ctx.name, stream, "{line}");
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            _ = cancel.cancelled() => {
                tracing::warn!(stage = %ctx.name, "cancelled: stopping the {what}");
                terminate(&mut child).await;
                return Err(Cancelled.into());
            }
            _ = &mut sleep_until => {
                terminate(&mut child).await;
                bail!(
                    "{what} ran past timeout_minutes = {}; its last output:\n{}",
                    launch.timeout_minutes.unwrap_or_default(),
                    tail_text(&tail)
                );
            }
        }
    }
    let status = tokio::select! {
        s = child.wait() => s.with_context(|| format!("waiting for the {what}"))?,
        _ = cancel.cancelled() => {
            terminate(&mut child).await;
            return Err(Cancelled.into());
        }
    };
    if !status.success() {
        let how = match status.code() {
            Some(c) => format!("exit code {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("signal {}", status.signal().unwrap_or_default())
            }
        };
        bail!("{what} failed ({how}); its last output:\n{}", tail_text(&tail));
    }
    Ok(())
}

/// Under the pipeline root, the plain files a command names (e.g. the script it runs):
/// part of what the stage runs, so of its fingerprint. Template arguments are skipped.
pub fn command_files(root: &Path, command: &[String]) -> Vec<PathBuf> {
    let root = absolute(root);
    let mut out: Vec<PathBuf> = Vec::new();
    for arg in command {
        if arg.contains("{{") || arg.contains("{%") || arg.is_empty() {
            continue;
        }
        let p = absolute(&root.join(arg));
        if p.starts_with(&root) && p.is_file() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bars_keep_their_last_redraw() {
        assert_eq!(clean_line(b"10%\r50%\r100%\r\n").as_deref(), Some("100%"));
        assert_eq!(clean_line(b"plain\n").as_deref(), Some("plain"));
        assert_eq!(clean_line(b"\r\n"), None);
    }

    #[test]
    fn protocol_lines_are_a_tag_and_a_json_object() {
        let (tag, phase, v) = protocol_line("SYNTH_METRICS {\"phase\": \"dpo\", \"loss\": 1}").unwrap().unwrap();
        assert_eq!((tag, phase.as_str(), &v["loss"]), ("SYNTH_METRICS", "dpo", &serde_json::json!(1)));
        assert_eq!(protocol_line("SYNTH_PROGRESS {\"step\": 1}").unwrap().unwrap().1, "train");
        assert!(protocol_line("SYNTH_PROGRESS [1]").unwrap().is_none());
        assert!(protocol_line("an ordinary line").is_none());
    }
}
