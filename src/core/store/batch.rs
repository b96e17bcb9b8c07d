//! Provider batches of an output directory: the batch journal
//! (`_synth/batches.log`) and the part files under `_synth/batches/`.
//!
//! A *part* is one batch's worth of a stage's requests: `synth-<part>.jsonl` (the
//! lines sent, in the API's format; each `custom_id` is a cache key) and
//! `synth-<part>.keys.jsonl` (per line: the key, its cache document, its token
//! estimates), written complete before the part is journaled. Results are downloaded
//! into memory and parsed there (never saved: until the part is journaled done, the
//! provider's copy is the durable one).
//!
//! The journal is append-only JSON lines, each fsynced before the action it announces
//! and after the one it records: `part` (planned), `uploading` → `uploaded` (file id),
//! `creating` → `created` (batch id), `status` (on change), `requeued` (a batch the
//! provider refused before running it, e.g. over its enqueued-token limit: the part is
//! created again), `done` (every answer stored in the cache, resubmissions planned) or
//! `abandoned`. A process killed between `creating` and `created` leaves a part whose
//! batch may exist: the next run looks for it (batch metadata) before creating again.
//! Replaying the journal gives each part's [`PartState`]; a torn last line (a kill
//! mid-write) is ignored.

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::atomic::{PendingFile, create_tmp};

/// Folder of part files, under the output directory's `_synth/`.
pub const BATCH_DIR: &str = "batches";
/// The batch journal, under `_synth/`.
pub const BATCH_JOURNAL: &str = "batches.log";

/// A planned part: what it holds and where it goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PartInfo {
    pub part: String,
    pub stage: String,
    /// The `[providers.NAME]` it was planned for.
    pub provider: String,
    /// `openai`, `anthropic` or `vllm`.
    pub api: String,
    /// Secrets scrubbed.
    pub base_url: String,
    pub model: String,
    /// Where the key is read from (never the key).
    pub api_key_env: String,
    pub endpoint: String,
    pub requests: u64,
    pub bytes: u64,
    /// Estimated prompt tokens (what an enqueued-token limit counts).
    pub tokens: u64,
    /// The most it can cost at the batch price (every prompt's bound + every max_tokens).
    pub max_cost_usd: f64,
    /// 1 for a first submission; a resubmission of a part's unanswered lines counts on.
    pub attempt: u32,
    /// The part whose unanswered lines this one resubmits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub at: u64,
}

/// What a finished part gave.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DoneInfo {
    pub succeeded: u64,
    pub failed: u64,
    pub resubmitted: u64,
    pub cost_usd: f64,
}

/// One journal record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Record {
    Part(PartInfo),
    Uploading {
        part: String,
        at: u64,
    },
    Uploaded {
        part: String,
        file: String,
    },
    Creating {
        part: String,
        file: Option<String>,
        at: u64,
    },
    Created {
        part: String,
        batch: String,
        at: u64,
    },
    Status {
        part: String,
        status: String,
        total: u64,
        completed: u64,
        failed: u64,
        at: u64,
    },
    Requeued {
        part: String,
        reason: String,
        at: u64,
    },
    Done {
        part: String,
        #[serde(flatten)]
        done: DoneInfo,
        at: u64,
    },
    Abandoned {
        part: String,
        reason: String,
        at: u64,
    },
}

impl Record {
    fn part(&self) -> &str {
        match self {
            Record::Part(p) => &p.part,
            Record::Uploading { part, .. }
            | Record::Uploaded { part, .. }
            | Record::Creating { part, .. }
            | Record::Created { part, .. }
            | Record::Status { part, .. }
            | Record::Requeued { part, .. }
            | Record::Done { part, .. }
            | Record::Abandoned { part, .. } => part,
        }
    }
}

/// Where a part is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Written and journaled, not sent.
    Planned,
    /// An upload started; its file id may exist at the provider without being journaled.
    Uploading,
    Uploaded,
    /// A create started; the batch may exist without its id being journaled.
    Creating,
    /// Submitted; polled until it ends.
    Created,
    Done,
    Abandoned,
}

impl Phase {
    pub fn live(self) -> bool {
        !matches!(self, Phase::Done | Phase::Abandoned)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planned => "planned",
            Phase::Uploading => "uploading",
            Phase::Uploaded => "uploaded",
            Phase::Creating => "creating",
            Phase::Created => "submitted",
            Phase::Done => "done",
            Phase::Abandoned => "abandoned",
        }
    }
}

/// A part as the journal tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartState {
    pub info: PartInfo,
    pub phase: Phase,
    pub file: Option<String>,
    pub batch: Option<String>,
    /// Every batch id this part has had (a requeued part gets a new one).
    pub batches: Vec<String>,
    /// When the last create started (unix seconds).
    pub creating_at: u64,
    /// The provider's last known status and counts.
    pub status: Option<String>,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub done: Option<DoneInfo>,
    pub reason: Option<String>,
}

impl PartState {
    fn apply(&mut self, rec: &Record) {
        match rec {
            Record::Part(_) => {}
            Record::Uploading { .. } => self.phase = Phase::Uploading,
            Record::Uploaded { file, .. } => {
                self.phase = Phase::Uploaded;
                self.file = Some(file.clone());
            }
            Record::Creating { file, at, .. } => {
                self.phase = Phase::Creating;
                if file.is_some() {
                    self.file = file.clone();
                }
                self.creating_at = *at;
            }
            Record::Created { batch, .. } => {
                self.phase = Phase::Created;
                self.batch = Some(batch.clone());
                if !self.batches.contains(batch) {
                    self.batches.push(batch.clone());
                }
            }
            Record::Status { status, total, completed, failed, .. } => {
                self.status = Some(status.clone());
                (self.total, self.completed, self.failed) = (*total, *completed, *failed);
            }
            Record::Requeued { reason, .. } => {
                self.phase = if self.file.is_some() { Phase::Uploaded } else { Phase::Planned };
                self.batch = None;
                self.status = None;
                self.reason = Some(reason.clone());
            }
            Record::Done { done, .. } => {
                self.phase = Phase::Done;
                self.done = Some(done.clone());
            }
            Record::Abandoned { reason, .. } => {
                self.phase = Phase::Abandoned;
                self.reason = Some(reason.clone());
            }
        }
    }
}

/// Replay journal text into part states (a torn or unknown line is skipped).
fn replay(text: &str) -> IndexMap<String, PartState> {
    let mut parts: IndexMap<String, PartState> = IndexMap::new();
    for line in text.lines() {
        let Ok(rec) = serde_json::from_str::<Record>(line) else { continue };
        if let Record::Part(info) = &rec {
            parts.insert(
                info.part.clone(),
                PartState {
                    info: info.clone(),
                    phase: Phase::Planned,
                    file: None,
                    batch: None,
                    batches: Vec::new(),
                    creating_at: 0,
                    status: None,
                    total: info.requests,
                    completed: 0,
                    failed: 0,
                    done: None,
                    reason: None,
                },
            );
        } else if let Some(p) = parts.get_mut(rec.part()) {
            p.apply(&rec);
        }
    }
    parts
}

/// The batch journal of one output directory (one process holds it: the run lock).
pub struct BatchLog {
    internal: PathBuf,
    file: Mutex<std::fs::File>,
    parts: Mutex<IndexMap<String, PartState>>,
}

impl BatchLog {
    /// Open (creating) the journal in `internal` (`<out>/_synth`), replay it, and remove
    /// the part files no live part needs.
    pub fn open(internal: &Path) -> Result<BatchLog> {
        let dir = internal.join(BATCH_DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = internal.join(BATCH_JOURNAL);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let parts = replay(&text);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if !text.is_empty() && !text.ends_with('\n') {
            // A torn last record: end its line so the next record starts on its own.
            file.write_all(b"\n").with_context(|| format!("writing {}", path.display()))?;
        }
        let live: HashSet<&str> = parts.values().filter(|p| p.phase.live()).map(|p| p.info.part.as_str()).collect();
        if let Ok(read) = std::fs::read_dir(&dir) {
            for entry in read.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let part = name.strip_prefix("synth-").and_then(|n| n.split('.').next()).unwrap_or_default();
                if !live.contains(part) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(BatchLog { internal: internal.to_path_buf(), file: Mutex::new(file), parts: Mutex::new(parts) })
    }

    /// The parts of a journal, without opening it for writing (for `synth batch status`).
    pub fn read(internal: &Path) -> Result<Vec<PartState>> {
        let path = internal.join(BATCH_JOURNAL);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(replay(&text).into_values().collect())
    }

    /// The folder of part files.
    pub fn dir(&self) -> PathBuf {
        self.internal.join(BATCH_DIR)
    }

    /// Append a record and fsync it; then it counts.
    pub fn append(&self, rec: &Record) -> Result<()> {
        let line = format!("{}\n", serde_json::to_string(rec).expect("serializable"));
        let path = self.internal.join(BATCH_JOURNAL);
        {
            let mut f = self.file.lock().expect("batch journal");
            f.write_all(line.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
            f.sync_data().with_context(|| format!("syncing {}", path.display()))?;
        }
        let mut parts = self.parts.lock().expect("batch parts");
        match rec {
            Record::Part(_) => {
                parts.extend(replay(&line));
            }
            other => {
                if let Some(p) = parts.get_mut(other.part()) {
                    p.apply(other);
                }
            }
        }
        Ok(())
    }

    pub fn get(&self, part: &str) -> Option<PartState> {
        self.parts.lock().expect("batch parts").get(part).cloned()
    }

    pub fn parts(&self) -> Vec<PartState> {
        self.parts.lock().expect("batch parts").values().cloned().collect()
    }

    /// Every batch id any part has had (a batch found by listing must not be one).
    pub fn known_batches(&self) -> HashSet<String> {
        self.parts.lock().expect("batch parts").values().flat_map(|p| p.batches.iter().cloned()).collect()
    }

    /// The part that resubmits `parent`'s unanswered lines, if one was planned.
    pub fn child_of(&self, parent: &str) -> Option<PartState> {
        self.parts.lock().expect("batch parts").values().find(|p| p.info.parent.as_deref() == Some(parent)).cloned()
    }
}

/// The files of a part.
pub struct PartFiles {
    pub input: PathBuf,
    pub keys: PathBuf,
}

pub fn part_files(dir: &Path, part: &str) -> PartFiles {
    PartFiles { input: dir.join(format!("synth-{part}.jsonl")), keys: dir.join(format!("synth-{part}.keys.jsonl")) }
}

/// Remove a finished part's local files.
pub fn remove_part_files(dir: &Path, part: &str) {
    if let Ok(read) = std::fs::read_dir(dir) {
        let prefix = format!("synth-{part}.");
        for entry in read.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// One line of a part's keys file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyLine {
    pub key: String,
    /// The request's cache document (stored with its answer).
    pub doc: String,
    pub endpoint: String,
    pub tokens_in: u64,
    /// The most prompt tokens it can be (its UTF-8 bytes: a byte-level tokenizer's bound),
    /// which the cost cap counts.
    #[serde(default)]
    pub max_in: u64,
    pub max_out: u64,
}

/// Writes a part's two files; they appear under their names, complete, on `finish`.
pub struct PartWriter {
    pub part: String,
    input: BufWriter<std::fs::File>,
    keys: BufWriter<std::fs::File>,
    pending: [PendingFile; 2],
    pub requests: u64,
    pub bytes: u64,
    pub tokens: u64,
    pub max_in: u64,
    pub max_out: u64,
}

impl PartWriter {
    pub fn create(dir: &Path, part: &str) -> Result<PartWriter> {
        let files = part_files(dir, part);
        let (input, p1) = create_tmp(&files.input)?;
        let (keys, p2) = create_tmp(&files.keys)?;
        Ok(PartWriter {
            part: part.to_string(),
            input: BufWriter::with_capacity(1 << 20, input),
            keys: BufWriter::with_capacity(1 << 20, keys),
            pending: [p1, p2],
            requests: 0,
            bytes: 0,
            tokens: 0,
            max_in: 0,
            max_out: 0,
        })
    }

    /// Add one line (without its newline) and its key line.
    pub fn push(&mut self, line: &str, key: &KeyLine) -> Result<()> {
        let what = || format!("writing batch part {}", self.part);
        self.input.write_all(line.as_bytes()).with_context(what)?;
        self.input.write_all(b"\n").with_context(what)?;
        serde_json::to_writer(&mut self.keys, key).with_context(what)?;
        self.keys.write_all(b"\n").with_context(what)?;
        self.requests += 1;
        self.bytes += line.len() as u64 + 1;
        self.tokens += key.tokens_in;
        self.max_in += key.max_in;
        self.max_out += key.max_out;
        Ok(())
    }

    /// Flush, fsync and put both files under their names.
    pub fn finish(self) -> Result<()> {
        let [p1, p2] = self.pending;
        for (w, p) in [(self.input, &p1), (self.keys, &p2)] {
            let f = w.into_inner().map_err(|e| anyhow::anyhow!("writing {}: {}", p.tmp.display(), e.error()))?;
            super::atomic::finish_file(f, p)?;
        }
        p1.commit()?;
        p2.commit()?;
        Ok(())
    }
}

/// Read a part's keys file.
pub fn read_keys(dir: &Path, part: &str) -> Result<Vec<KeyLine>> {
    let path = part_files(dir, part).keys;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}: not a key line", path.display(), i + 1)))
        .collect()
}

/// The keys of a part's lines, without their documents.
pub fn read_key_names(dir: &Path, part: &str) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Key<'a> {
        #[serde(borrow)]
        key: std::borrow::Cow<'a, str>,
    }
    let path = part_files(dir, part).keys;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str::<Key>(l)
                .map(|k| k.key.into_owned())
                .with_context(|| format!("{}:{}: not a key line", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(part: &str) -> PartInfo {
        PartInfo {
            part: part.into(),
            stage: "s".into(),
            provider: "p".into(),
            api: "openai".into(),
            base_url: "http://h/v1".into(),
            model: "m".into(),
            api_key_env: "K".into(),
            endpoint: "/v1/chat/completions".into(),
            requests: 2,
            bytes: 10,
            tokens: 5,
            max_cost_usd: 0.0,
            attempt: 1,
            parent: None,
            at: 1,
        }
    }

    #[test]
    fn the_journal_replays_each_part_and_survives_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = BatchLog::open(dir.path()).unwrap();
            let mut w = PartWriter::create(&log.dir(), "a1").unwrap();
            let key = KeyLine {
                key: "k".into(),
                doc: "{}".into(),
                endpoint: "/v1/chat/completions".into(),
                tokens_in: 3,
                max_in: 12,
                max_out: 7,
            };
            w.push("{\"custom_id\":\"k\"}", &key).unwrap();
            w.finish().unwrap();
            log.append(&Record::Part(info("a1"))).unwrap();
            log.append(&Record::Uploading { part: "a1".into(), at: 2 }).unwrap();
            log.append(&Record::Uploaded { part: "a1".into(), file: "file-1".into() }).unwrap();
            log.append(&Record::Creating { part: "a1".into(), file: Some("file-1".into()), at: 3 }).unwrap();
            log.append(&Record::Part(info("b2"))).unwrap();
            log.append(&Record::Done {
                part: "b2".into(),
                done: DoneInfo { succeeded: 2, ..Default::default() },
                at: 4,
            })
            .unwrap();
            assert_eq!(read_keys(&log.dir(), "a1").unwrap()[0].max_out, 7);
            assert_eq!(read_key_names(&log.dir(), "a1").unwrap(), vec!["k".to_string()]);
        }
        // A kill mid-record.
        let path = dir.path().join(BATCH_JOURNAL);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"op\":\"created\",\"part\":\"a1\",\"ba");
        std::fs::write(&path, text).unwrap();
        std::fs::write(part_files(&dir.path().join(BATCH_DIR), "b2").keys, "x").unwrap();

        let log = BatchLog::open(dir.path()).unwrap();
        let a = log.get("a1").unwrap();
        assert_eq!((a.phase, a.file.as_deref(), a.creating_at), (Phase::Creating, Some("file-1"), 3));
        assert_eq!(log.get("b2").unwrap().phase, Phase::Done);
        // The done part's files are gone, the live part's kept.
        assert!(!part_files(&log.dir(), "b2").keys.exists());
        assert!(part_files(&log.dir(), "a1").input.exists());
        log.append(&Record::Created { part: "a1".into(), batch: "batch_1".into(), at: 5 }).unwrap();
        log.append(&Record::Requeued { part: "a1".into(), reason: "token_limit_exceeded".into(), at: 6 }).unwrap();
        drop(log);
        let parts = BatchLog::read(dir.path()).unwrap();
        let a = parts.iter().find(|p| p.info.part == "a1").unwrap();
        assert_eq!((a.phase, a.batch.as_deref(), a.batches.len()), (Phase::Uploaded, None, 1));
    }
}
