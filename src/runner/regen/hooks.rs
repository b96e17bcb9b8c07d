//! The summary of one regeneration (status, snapshot, what moved, rows added / removed /
//! changed, tokens, cost, duration, where it was published) and the hook commands that
//! receive it: `sh -c COMMAND` with the summary as JSON on stdin and `SYNTH_STATUS`,
//! `SYNTH_SNAPSHOT` in the environment. Secrets are scrubbed from the summary.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::diff::DiffCounts;
use super::snapshot::Publication;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// A new snapshot was written (and published when asked), or the run rebuilt something.
    Regenerated,
    /// Nothing moved: no work was done (`--if-changed`), or the release is identical.
    Unchanged,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Regenerated => "regenerated",
            Status::Unchanged => "unchanged",
            Status::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotRef {
    pub id: String,
    pub path: String,
    pub fingerprint: String,
}

/// What a hook (and `synth regenerate --json`) is told.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub status: Status,
    pub pipeline: String,
    pub pipeline_file: String,
    pub profile: Option<String>,
    pub output_dir: String,
    pub started_at: String,
    pub finished_at: String,
    pub duration_seconds: f64,
    pub snapshot: Option<SnapshotRef>,
    pub previous_snapshot: Option<String>,
    /// What moved upstream since the last release (hub commits, files, served models).
    pub changes: Vec<String>,
    /// Stages that ran (the others were up to date).
    pub stages_ran: Vec<String>,
    pub stages_up_to_date: usize,
    /// Per export file: rows, added, removed, changed, unchanged.
    pub diff: BTreeMap<String, DiffCounts>,
    pub requests: u64,
    pub cache_hits: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub hub: Option<Publication>,
    pub error: Option<String>,
}

impl Summary {
    /// The summary as JSON, with every known secret and secret-looking token scrubbed.
    pub fn to_json(&self) -> String {
        synth_core::secrets::scrub(&serde_json::to_string(self).expect("serializable"))
    }
}

/// Run a hook: `sh -c command`, the summary on stdin, killed after `timeout`. Returns a
/// warning to print when it failed (a failing hook does not change synth's exit status).
pub fn run_hook(name: &str, command: &str, summary: &Summary, timeout: Duration) -> Option<String> {
    let json = summary.to_json();
    let mut child = match Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("SYNTH_STATUS", summary.status.as_str())
        .env("SYNTH_SNAPSHOT", summary.snapshot.as_ref().map(|s| s.path.as_str()).unwrap_or(""))
        .stdin(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Some(format!("hook {name} could not start: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its input is fine: a broken pipe is not an error.
        let _ = stdin.write_all(json.as_bytes());
        let _ = stdin.write_all(b"\n");
    }
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return None,
            Ok(Some(status)) => return Some(format!("hook {name} exited with {status}")),
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Some(format!("hook {name} was still running after {}s and was killed", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Some(format!("hook {name}: {e}")),
        }
    }
}
