//! The LLM response cache and the embedding cache, in one SQLite database per
//! output directory (`_synth/cache.sqlite`, WAL mode), and the request journal
//! beside it (`_synth/journal.log`).
//!
//! The journal is an append-only file of one-line records: `S` (a request is queued
//! to be sent), `H` (its first HTTP attempt left: from here an answer may be billed),
//! `E` (it ended without a response to store) and `R` (its response, the whole row as
//! JSON). Each is copied into a shared mapping of the file, no `write` and no fsync: the
//! page cache holds it, so it survives a killed process.
//! A response is journaled the moment it arrives, so a paid answer is never lost to
//! a kill; a request started, neither ended nor answered, and not in the database was
//! in flight when the process stopped (the next run sends it again, nothing else).
//! Opening the cache replays journaled responses missing from the database, then
//! rewrites the journal with only the requests still in flight; a long run compacts
//! it past 64 MiB after a commit and its fsync, before acknowledging them, keeping the
//! requests in flight and the responses queued but not yet committed (never after a
//! failed commit: the journal then holds the only copy).
//!
//! One writer thread applies writes in windows: the first command queued opens a
//! window that stays open while requests that could join it are still waiting for
//! their responses, for at most 1 s (it closes at once when none are, at 256 paid
//! results, or on a flush; vectors, which are not journaled, are committed at once);
//! everything queued is committed in one transaction and the WAL is fsynced before
//! paid results are acknowledged. A lone request is acknowledged right after its
//! fsync; concurrent ones share it. A
//! response is therefore durable, even across a power loss, before the record counts
//! as done, and concurrent requests share transactions and fsyncs. The writer is
//! woken only when it sleeps with nothing pending, so a request costs it nothing but
//! its share of the window's commit. The database is opened in exclusive locking mode
//! (one process: synth's run lock guarantees it), so commits take no file locks;
//! lookups share the connection under a mutex. Every use of a cache entry is tagged
//! with the stage and stage fingerprint that needed it, which is what `synth cache
//! gc` keeps.
//!
//! A provider batch's answers are stored in bulk ([`Cache::put_many`]): a part's answers
//! queued as one command, one transaction in row-id order, not journaled (the batch's
//! result file at the provider is their durable copy until its part is journaled done,
//! after the fsync), so 40,000 answers cost one commit and fsync, not 160 windows. They
//! are held in memory from the moment they are queued until their stage lets them go, so
//! lookups find them before the commit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use indexmap::IndexMap;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

pub const CACHE_FILE: &str = "cache.sqlite";
pub const JOURNAL_FILE: &str = "journal.log";

/// Longest wait before queued writes are committed and paid results made durable. A
/// record waiting here holds no sending slot (`llm::slot`), so a longer window costs
/// throughput nothing; it saves commits and fsyncs (1 s instead of 250 ms: ~10 % less
/// client CPU per request at 50 requests/s, BENCHMARKS.md).
const DURABLE_WINDOW: std::time::Duration = std::time::Duration::from_millis(1000);
/// Paid results waiting that close the window at once.
const DURABLE_BATCH: usize = 256;
/// Journal size past which the writer compacts it (after a commit).
const JOURNAL_COMPACT_BYTES: u64 = 64 << 20;
/// Bytes the journal's file is grown ahead of its records.
const JOURNAL_GROW: u64 = 256 << 10;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS responses (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    stage TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    provider TEXT NOT NULL,
    base_url TEXT NOT NULL,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    created_at INTEGER NOT NULL,
    last_used_at INTEGER NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS embeddings (
    id INTEGER PRIMARY KEY,
    embedder TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    stage TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS uses (
    key TEXT NOT NULL,
    stage TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    PRIMARY KEY (key, stage, fingerprint)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
";

/// Row id of a key: its first 8 bytes as an integer (rowid lookups need no index;
/// the full key is stored and compared too).
fn row_id(key: &str) -> i64 {
    let h = blake3::hash(key.as_bytes());
    i64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A cached LLM response.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    /// Shared: an answer held in memory is handed out without a copy.
    pub response: std::sync::Arc<str>,
    pub tokens_in: u64,
    pub tokens_out: u64,
}

/// One response to store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponseRow {
    pub key: String,
    pub provider: String,
    pub base_url: String,
    pub model: String,
    pub request: String,
    pub response: String,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// Who needed an entry (for gc).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Use {
    pub stage: String,
    pub fingerprint: String,
}

/// A journaled response (`R` record).
#[derive(Serialize, Deserialize)]
struct Journaled {
    #[serde(flatten)]
    row: ResponseRow,
    #[serde(rename = "use")]
    usage: Use,
}

/// The `R` record of a response (the borrowed form of [`Journaled`]).
fn response_line(row: &ResponseRow, usage: &Use) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        #[serde(flatten)]
        row: &'a ResponseRow,
        #[serde(rename = "use")]
        usage: &'a Use,
    }
    format!("R\t{}\n", serde_json::to_string(&Line { row, usage }).expect("serializable"))
}

enum Cmd {
    PutResponse(ResponseRow, Use, oneshot::Sender<Result<()>>),
    PutVectors(String, Vec<(String, Vec<f32>)>, Use, oneshot::Sender<Result<()>>),
    /// Responses whose durable copy is elsewhere until this is acknowledged (not journaled).
    PutMany(Vec<ResponseRow>, Use, oneshot::Sender<Result<()>>),
    Hit(String, Use),
    VectorUses(String, Vec<String>, Use),
    Flush(oneshot::Sender<Result<()>>),
}

/// Lookup counters, kept in memory and added to the database with the next write.
#[derive(Default)]
struct Counts {
    lookups: AtomicI64,
    hits: AtomicI64,
    vector_lookups: AtomicI64,
    vector_hits: AtomicI64,
}

/// Commands waiting for the writer.
#[derive(Default)]
struct Queue {
    cmds: Vec<Cmd>,
    /// When the oldest queued command arrived (opens the window).
    first_at: Option<Instant>,
    /// Paid results queued.
    durable: usize,
    /// Something queued must not wait for the window (vectors, a flush).
    urgent: bool,
    /// No request is waiting for its response: nothing more will join the window.
    settled: bool,
    closing: bool,
    /// The writer sleeps with nothing pending: the next command must wake it.
    idle: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    cond: std::sync::Condvar,
}

/// The append-only journal and what it says is open.
///
/// Records are copied into a shared mapping of the file (no `write` per record: this
/// runs on the network thread for each request). The page cache owns those pages, so a
/// record survives a killed process exactly as a `write` would. The file is grown
/// ahead in [`JOURNAL_GROW`] steps with `posix_fallocate` (a full disk is an error
/// here, never a SIGBUS on a later copy) and cut back to its records when the journal
/// is closed; after a kill it ends in zeros, which [`recover`] skips.
struct Journal {
    file: std::fs::File,
    /// The file mapped from byte 0 to `cap` (none until the first record past `create`).
    map: Option<memmap2::MmapMut>,
    /// Bytes the file holds (records, then zeros up to here).
    cap: u64,
    path: PathBuf,
    /// Requests started, neither ended nor answered (key → stage), in start order.
    open: IndexMap<String, String>,
    /// Those of `open` whose first HTTP attempt has left (`H` records).
    sent: std::collections::HashSet<String>,
    /// Bytes of records in the file (written since it was last rewritten): the next
    /// record goes here.
    bytes: u64,
    /// Requests of this process sent and not yet answered or ended.
    live: usize,
    /// Size past which the writer compacts it.
    limit: u64,
}

impl Journal {
    /// Write a journal holding `open` and the `R` records in `kept`, nothing else.
    fn create(
        path: PathBuf,
        open: IndexMap<String, String>,
        sent: std::collections::HashSet<String>,
        kept: &str,
    ) -> Result<Journal> {
        let sent: std::collections::HashSet<String> = sent.into_iter().filter(|k| open.contains_key(k)).collect();
        let mut text: String = open.iter().map(|(k, s)| format!("S\t{k}\t{s}\n")).collect();
        for k in open.keys().filter(|k| sent.contains(*k)) {
            text.push_str(&format!("H\t{k}\n"));
        }
        text.push_str(kept);
        super::atomic::write_atomic(&path, text.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let bytes = text.len() as u64;
        Ok(Journal { file, map: None, cap: bytes, path, open, sent, bytes, live: 0, limit: JOURNAL_COMPACT_BYTES })
    }

    fn append(&mut self, line: &str) -> Result<()> {
        let end = self.bytes + line.len() as u64;
        if end > self.cap || self.map.is_none() {
            self.grow(end).with_context(|| format!("writing {}", self.path.display()))?;
        }
        let map = self.map.as_mut().expect("mapped by grow");
        map[self.bytes as usize..end as usize].copy_from_slice(line.as_bytes());
        self.bytes = end;
        Ok(())
    }

    /// Make the file and its mapping hold at least `end` bytes (and the next few records).
    fn grow(&mut self, end: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        let page = 4096;
        let cap = (end.max(self.cap) + JOURNAL_GROW).div_ceil(page) * page;
        self.map = None;
        // SAFETY: plain call on an open descriptor; blocks are reserved, nothing is read.
        let rc = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, cap as libc::off_t) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc).into());
        }
        // SAFETY: this process alone writes the journal (the run lock), and only through
        // this mapping; the file is never shortened while it is mapped (`Drop` and
        // `create` unmap first).
        self.map = Some(unsafe { memmap2::MmapOptions::new().len(cap as usize).map_mut(&self.file)? });
        self.cap = cap;
        Ok(())
    }

    /// Rewrite the file with only the open requests and the `R` records in `kept`
    /// (atomically).
    fn rewrite(&mut self, kept: &str) -> Result<()> {
        self.map = None;
        let (limit, live) = (self.limit, self.live);
        *self =
            Journal::create(self.path.clone(), std::mem::take(&mut self.open), std::mem::take(&mut self.sent), kept)?;
        (self.limit, self.live) = (limit, live);
        Ok(())
    }

    /// A request of this process got its answer or ended; true when none is left waiting.
    fn settle_one(&mut self, key: &str) -> bool {
        // A response that was never journaled as sent (a batch's answer) settles nothing.
        if self.open.shift_remove(key).is_some() {
            self.sent.remove(key);
            self.live = self.live.saturating_sub(1);
        }
        self.live == 0
    }
}

impl Drop for Journal {
    /// Cut the zeros grown ahead: a closed journal holds its records and nothing else.
    fn drop(&mut self) {
        if self.map.take().is_some() && self.cap > self.bytes {
            let _ = self.file.set_len(self.bytes);
        }
    }
}

/// Handle to the cache database of one output directory.
pub struct Cache {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    counts: Arc<Counts>,
    journal: Arc<Mutex<Journal>>,
    /// Responses replayed from the journal when the cache was opened.
    recovered: usize,
    /// Responses this process stored in bulk, with the use they were tagged with: reading
    /// one back for that same use (a batch stage's output pass) is not a reuse, so it is
    /// neither counted in `hits` nor tagged again (its insert tagged it). Without this
    /// the pass costs an UPDATE and an INSERT per answer on random pages.
    bulk: Mutex<std::collections::HashSet<(i64, u64)>>,
    /// Answers stored in bulk, from the moment they are queued until their stage lets
    /// them go ([`Cache::forget_held`]; at most [`HELD_BYTES`] of text): lookups find
    /// them before their transaction commits (a batch stage's output pass runs while the
    /// writer commits), and without a SQLite read.
    held: Mutex<Held>,
}

/// Most bytes of answers [`Cache::put_many`] keeps in memory.
const HELD_BYTES: usize = 128 << 20;

/// Bulk-stored answers held in memory: key → (use, answer).
#[derive(Default)]
struct Held {
    answers: std::collections::HashMap<String, (u64, StoredResponse)>,
    bytes: usize,
}

/// A use as a number (for [`Cache::bulk`]).
fn use_hash(usage: &Use) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&usage.stage, &usage.fingerprint).hash(&mut h);
    h.finish()
}

fn open(path: &Path, exclusive: bool) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening cache {}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(if exclusive { 30 } else { 5 }))?;
    if exclusive {
        // Before WAL is first touched: the WAL index then lives in heap memory.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // Commits write the WAL without fsync; the writer fsyncs the WAL itself before
    // acknowledging paid results (see `writer_loop`).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

impl Cache {
    /// Open (creating) the cache in `dir`, replaying responses the journal holds.
    pub fn open(dir: &Path) -> Result<Cache> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(CACHE_FILE);
        let mut conn = open(&path, true)?;
        conn.execute_batch(SCHEMA).with_context(|| format!("creating cache tables in {}", path.display()))?;
        let journal_path = dir.join(JOURNAL_FILE);
        let (journal, recovered) = settle(&journal_path, &mut conn)?;
        let conn = Arc::new(Mutex::new(conn));
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), cond: std::sync::Condvar::new() });
        let counts = Arc::new(Counts::default());
        let journal = Arc::new(Mutex::new(journal));
        let (c, sh, co, p, j) = (conn.clone(), shared.clone(), counts.clone(), path.clone(), journal.clone());
        let writer = std::thread::Builder::new()
            .name("synth-cache-writer".into())
            .spawn(move || writer_loop(c, sh, p, co, j))
            .context("starting the cache writer")?;
        Ok(Cache {
            path,
            conn,
            shared,
            writer: Mutex::new(Some(writer)),
            counts,
            journal,
            recovered,
            bulk: Mutex::new(Default::default()),
            held: Mutex::new(Held::default()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Responses that a stopped process had received but not committed, replayed
    /// from the journal when this cache was opened.
    pub fn recovered(&self) -> usize {
        self.recovered
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        let mut q = self.shared.queue.lock().expect("cache queue");
        enqueue(&mut q, cmd, &self.shared.cond)
    }

    /// A cached response, if any (counts the lookup and, on a hit, tags the use).
    pub fn get_response(&self, key: &str, usage: &Use) -> Result<Option<StoredResponse>> {
        let held = {
            let held = self.held.lock().expect("held");
            if held.answers.is_empty() { None } else { held.answers.get(key).map(|(u, a)| (*u, a.clone())) }
        };
        let held_use = held.as_ref().map(|(u, _)| *u);
        let found = if let Some((_, a)) = held {
            Some(a)
        } else {
            let conn = self.conn.lock().expect("cache connection");
            let mut stmt = conn
                .prepare_cached("SELECT response, tokens_in, tokens_out FROM responses WHERE id = ?1 AND key = ?2")?;
            stmt.query_row(params![row_id(key), key], |r| {
                Ok(StoredResponse {
                    response: r.get::<_, String>(0)?.into(),
                    tokens_in: r.get::<_, i64>(1)? as u64,
                    tokens_out: r.get::<_, i64>(2)? as u64,
                })
            })
            .optional()
            .with_context(|| format!("reading {}", self.path.display()))?
        };
        self.counts.lookups.fetch_add(1, Ordering::Relaxed);
        if found.is_some() {
            self.counts.hits.fetch_add(1, Ordering::Relaxed);
            let stored_here = {
                let bulk = self.bulk.lock().expect("bulk");
                !bulk.is_empty() && {
                    let u = use_hash(usage);
                    // `put_many` marks in `bulk` every answer it holds, under the same use.
                    held_use == Some(u) || bulk.contains(&(row_id(key), u))
                }
            };
            if !stored_here {
                self.send(Cmd::Hit(key.to_string(), usage.clone()))?;
            }
        }
        Ok(found)
    }

    /// Whether a response is stored under `key` (no lookup counted, no use tagged).
    pub fn contains(&self, key: &str) -> Result<bool> {
        let conn = self.conn.lock().expect("cache connection");
        let mut stmt = conn.prepare_cached("SELECT 1 FROM responses WHERE id = ?1 AND key = ?2")?;
        Ok(stmt.query_row(params![row_id(key), key], |_| Ok(())).optional()?.is_some())
    }

    /// Store a response: journaled at once (it survives a killed process from here
    /// on), then committed and fsynced with its window before this returns.
    pub async fn put_response(&self, row: ResponseRow, usage: &Use) -> Result<()> {
        let (done, wait) = oneshot::channel();
        {
            let mut held = self.held.lock().expect("held");
            if !held.answers.is_empty()
                && let Some((_, old)) = held.answers.remove(&row.key)
            {
                held.bytes -= old.response.len();
            }
        }
        {
            let line = response_line(&row, usage);
            // The journal lock is held until the command is queued: compaction (which
            // takes the same lock) keeps every queued response, so it never drops one
            // the database does not hold.
            let mut j = self.journal.lock().expect("journal");
            j.append(&line)?;
            let settled = j.settle_one(&row.key);
            let mut q = self.shared.queue.lock().expect("cache queue");
            q.settled |= settled;
            enqueue(&mut q, Cmd::PutResponse(row, usage.clone(), done), &self.shared.cond)?;
        }
        wait.await.map_err(|_| anyhow!("the cache writer stopped"))?
    }

    /// Which of `keys` have no stored response (one lookup each, under one lock).
    pub fn missing(&self, keys: &[&str]) -> Result<Vec<bool>> {
        let conn = self.conn.lock().expect("cache connection");
        let mut stmt = conn.prepare_cached("SELECT 1 FROM responses WHERE id = ?1 AND key = ?2")?;
        keys.iter().map(|k| Ok(stmt.query_row(params![row_id(k), k], |_| Ok(())).optional()?.is_none())).collect()
    }

    /// Store many responses in bulk: queued now as one command (one transaction, no
    /// journal records), durable (committed and fsynced) when the returned future
    /// resolves. Only for responses that have a durable copy elsewhere until then (a
    /// provider batch's result file, which the next run downloads again while its part
    /// is not journaled done): a killed process loses the transaction, not the answers.
    /// Commands queued back to back are committed in one transaction and one fsync, so
    /// a caller can prepare the next chunk while the writer commits this one.
    ///
    /// Also says whether every answer is held in memory until [`Cache::forget_held`]:
    /// then lookups find them at once, before the commit; otherwise (past [`HELD_BYTES`])
    /// the caller must await the commit before anything looks them up.
    pub fn put_many(
        &self,
        rows: Vec<ResponseRow>,
        usage: &Use,
    ) -> Result<(impl std::future::Future<Output = Result<()>> + use<>, bool)> {
        let (done, wait) = oneshot::channel();
        let u = use_hash(usage);
        {
            let mut bulk = self.bulk.lock().expect("bulk");
            bulk.extend(rows.iter().map(|r| (row_id(&r.key), u)));
        }
        let all_held = {
            let mut held = self.held.lock().expect("held");
            let mut all = true;
            for r in &rows {
                if held.bytes + r.response.len() > HELD_BYTES {
                    all = false;
                    break;
                }
                let answer = StoredResponse {
                    response: r.response.as_str().into(),
                    tokens_in: r.tokens_in,
                    tokens_out: r.tokens_out,
                };
                held.bytes += answer.response.len();
                if let Some((_, old)) = held.answers.insert(r.key.clone(), (u, answer)) {
                    held.bytes -= old.response.len();
                }
            }
            all
        };
        self.send(Cmd::PutMany(rows, usage.clone(), done))?;
        Ok((async move { wait.await.map_err(|_| anyhow!("the cache writer stopped"))? }, all_held))
    }

    /// Let go of the answers a use stored in bulk (once they are committed: lookups
    /// read them from the database from then on).
    pub fn forget_held(&self, usage: &Use) {
        let u = use_hash(usage);
        let mut held = self.held.lock().expect("held");
        let mut freed = 0;
        held.answers.retain(|_, (v, a)| {
            let keep = *v != u;
            if !keep {
                freed += a.response.len();
            }
            keep
        });
        held.bytes -= freed;
    }

    /// Record a request as in flight before it is sent (survives a killed process).
    pub fn journal_start(&self, key: &str, stage: &str) -> Result<()> {
        let mut j = self.journal.lock().expect("journal");
        j.append(&format!("S\t{key}\t{stage}\n"))?;
        j.open.insert(key.to_string(), stage.to_string());
        j.live += 1;
        Ok(())
    }

    /// The request's first HTTP attempt is leaving (later attempts write nothing): if the
    /// process dies before its answer is journaled, the answer may be billed and lost.
    pub fn journal_sent(&self, key: &str) -> Result<()> {
        let mut j = self.journal.lock().expect("journal");
        if j.open.contains_key(key) && !j.sent.contains(key) {
            j.append(&format!("H\t{key}\n"))?;
            j.sent.insert(key.to_string());
        }
        Ok(())
    }

    /// Of the requests in flight (see [`Cache::in_flight`]): how many had left on the
    /// wire, and how many were only queued.
    pub fn in_flight_split(&self) -> (usize, usize) {
        let j = self.journal.lock().expect("journal");
        let sent = j.open.keys().filter(|k| j.sent.contains(*k)).count();
        (sent, j.open.len() - sent)
    }

    /// The request ended without a response to store.
    pub fn journal_end(&self, key: &str) {
        let mut j = self.journal.lock().expect("journal");
        let _ = j.append(&format!("E\t{key}\n"));
        if j.settle_one(key) {
            // Results waiting for the window need not wait for this one.
            let mut q = self.shared.queue.lock().expect("cache queue");
            q.settled = true;
            q.idle = false;
            drop(q);
            self.shared.cond.notify_one();
        }
    }

    /// Requests started but neither ended nor answered: in flight now, or in flight
    /// when the process that wrote the journal before this one stopped.
    pub fn in_flight(&self) -> Result<Vec<(String, String)>> {
        Ok(self.journal.lock().expect("journal").open.iter().map(|(k, s)| (k.clone(), s.clone())).collect())
    }

    /// Cached vectors of `embedder` for these text hashes (missing ones are absent).
    pub fn get_vectors(&self, embedder: &str, hashes: &[String], usage: &Use) -> Result<Vec<Option<Vec<f32>>>> {
        let mut out = Vec::with_capacity(hashes.len());
        let mut hit_keys = Vec::new();
        {
            let conn = self.conn.lock().expect("cache connection");
            let mut stmt = conn
                .prepare_cached("SELECT vector FROM embeddings WHERE id = ?1 AND embedder = ?2 AND text_hash = ?3")?;
            for h in hashes {
                let id = row_id(&vector_use_key(embedder, h));
                let v: Option<Vec<u8>> = stmt.query_row(params![id, embedder, h], |r| r.get(0)).optional()?;
                if v.is_some() {
                    hit_keys.push(h.clone());
                }
                out.push(v.map(|bytes| {
                    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
                }));
            }
        }
        self.counts.vector_lookups.fetch_add(hashes.len() as i64, Ordering::Relaxed);
        if !hit_keys.is_empty() {
            self.counts.vector_hits.fetch_add(hit_keys.len() as i64, Ordering::Relaxed);
            self.send(Cmd::VectorUses(embedder.to_string(), hit_keys, usage.clone()))?;
        }
        Ok(out)
    }

    /// Store vectors durably (committed at once, acknowledged after the fsync).
    pub async fn put_vectors(&self, embedder: &str, items: Vec<(String, Vec<f32>)>, usage: &Use) -> Result<()> {
        let (embedder, usage) = (embedder.to_string(), usage.clone());
        let (done, wait) = oneshot::channel();
        self.send(Cmd::PutVectors(embedder, items, usage, done))?;
        wait.await.map_err(|_| anyhow!("the cache writer stopped"))?
    }

    /// Wait until every write sent so far is committed and fsynced.
    pub async fn flush(&self) -> Result<()> {
        let (done, wait) = oneshot::channel();
        self.send(Cmd::Flush(done))?;
        wait.await.map_err(|_| anyhow!("the cache writer stopped"))?
    }

    /// Write a consistent copy of the database to `dest` (after [`Cache::flush`]: what
    /// was acknowledged is in it), for upload to a run's object store.
    pub fn snapshot(&self, dest: &Path) -> Result<()> {
        let _ = std::fs::remove_file(dest);
        let conn = self.conn.lock().expect("cache connection");
        conn.execute("VACUUM INTO ?1", params![dest.to_string_lossy()])
            .with_context(|| format!("copying the cache to {}", dest.display()))?;
        Ok(())
    }
}

/// A cache another process wrote, read-only: where a shard of a sharded run looks for
/// an answer its own cache lacks (its run's cache, merged from earlier runs), so a
/// request answered before is not paid for again whatever the shard count.
pub struct Fallback {
    conn: Mutex<Connection>,
}

impl Fallback {
    pub fn open(path: &Path) -> Result<Fallback> {
        let uri = format!("file:{}?immutable=1", path.to_string_lossy());
        let conn = Connection::open_with_flags(
            &uri,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
        )
        .with_context(|| format!("opening cache {}", path.display()))?;
        Ok(Fallback { conn: Mutex::new(conn) })
    }

    /// The stored response of `key`, whole (to be stored in the caller's own cache).
    pub fn get(&self, key: &str) -> Result<Option<ResponseRow>> {
        let conn = self.conn.lock().expect("fallback cache");
        let mut stmt = conn.prepare_cached(
            "SELECT provider, base_url, model, request, response, tokens_in, tokens_out, cost_usd \
             FROM responses WHERE id = ?1 AND key = ?2",
        )?;
        Ok(stmt
            .query_row(params![row_id(key), key], |r| {
                Ok(ResponseRow {
                    key: key.to_string(),
                    provider: r.get(0)?,
                    base_url: r.get(1)?,
                    model: r.get(2)?,
                    request: r.get(3)?,
                    response: r.get(4)?,
                    tokens_in: r.get::<_, i64>(5)? as u64,
                    tokens_out: r.get::<_, i64>(6)? as u64,
                    cost_usd: r.get(7)?,
                })
            })
            .optional()?)
    }
}

/// Add every entry of the cache database `other` that the cache in `dir` lacks
/// (entries are content-addressed, so merging two caches never conflicts): a shard's
/// cache into its run's, or a cache another machine uploaded into the local one.
/// Returns the number of responses added. The cache in `dir` must not be open.
pub fn import(dir: &Path, other: &Path) -> Result<u64> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(CACHE_FILE);
    let conn = open(&path, false)?;
    conn.execute_batch(SCHEMA).with_context(|| format!("creating cache tables in {}", path.display()))?;
    conn.execute("ATTACH DATABASE ?1 AS other", params![other.to_string_lossy()])
        .with_context(|| format!("opening {}", other.display()))?;
    let before: i64 = conn.query_row("SELECT count(*) FROM responses", [], |r| r.get(0))?;
    conn.execute_batch(
        "BEGIN;
         INSERT OR IGNORE INTO main.responses SELECT * FROM other.responses;
         INSERT OR IGNORE INTO main.embeddings SELECT * FROM other.embeddings;
         INSERT OR IGNORE INTO main.uses SELECT * FROM other.uses;
         COMMIT;",
    )
    .with_context(|| format!("merging {} into {}", other.display(), path.display()))?;
    let after: i64 = conn.query_row("SELECT count(*) FROM responses", [], |r| r.get(0))?;
    conn.execute_batch("DETACH DATABASE other")?;
    Ok((after - before).max(0) as u64)
}

/// Queue a command, waking the writer only when it would not wake by itself.
fn enqueue(q: &mut Queue, cmd: Cmd, cond: &std::sync::Condvar) -> Result<()> {
    if q.closing {
        return Err(anyhow!("the cache writer stopped"));
    }
    let mut wake = q.idle;
    match &cmd {
        Cmd::PutResponse(..) => {
            q.durable += 1;
            wake |= q.durable == DURABLE_BATCH || q.settled;
        }
        Cmd::PutVectors(..) | Cmd::PutMany(..) | Cmd::Flush(..) => {
            q.urgent = true;
            wake = true;
        }
        Cmd::Hit(..) | Cmd::VectorUses(..) => {}
    }
    if q.cmds.is_empty() {
        q.first_at = Some(Instant::now());
    }
    q.cmds.push(cmd);
    if wake {
        q.idle = false;
        cond.notify_one();
    }
    Ok(())
}

/// What a journal says, checked against the database.
struct Replay {
    /// Started, neither ended nor answered, not in the database: (key, stage).
    in_flight: Vec<(String, String)>,
    /// Keys with an `H` record (their first attempt had left).
    sent: std::collections::HashSet<String>,
    /// Journaled responses that were missing from the database (now inserted).
    recovered: usize,
}

/// Read a journal: insert the responses it holds that the database lacks (one
/// transaction), and list the requests that were in flight. A torn last line (a
/// killed writer) is ignored: its request counts as in flight.
fn recover(journal: &Path, conn: &mut Connection) -> Result<Replay> {
    let bytes = match std::fs::read(journal) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", journal.display())),
    };
    // A killed writer leaves the zeros grown ahead of its records (and a record cut
    // anywhere, even inside a character): no record holds a zero byte.
    let text = String::from_utf8_lossy(&bytes);
    let mut started: Vec<(String, String)> = Vec::new();
    let mut closed = std::collections::HashSet::new();
    let mut sent = std::collections::HashSet::new();
    let mut answers: Vec<Journaled> = Vec::new();
    for line in text.lines().map(|l| l.trim_matches('\0')) {
        let mut parts = line.splitn(3, '\t');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("S"), Some(k), Some(s)) => started.push((k.to_string(), s.to_string())),
            (Some("E"), Some(k), _) => {
                closed.insert(k.to_string());
            }
            (Some("H"), Some(k), _) => {
                sent.insert(k.to_string());
            }
            (Some("R"), Some(_), _) => {
                if let Ok(j) = serde_json::from_str::<Journaled>(&line[2..]) {
                    closed.insert(j.row.key.clone());
                    answers.push(j);
                }
            }
            _ => {}
        }
    }
    let stored = |conn: &Connection, key: &str| -> Result<bool> {
        let mut stmt = conn.prepare_cached("SELECT 1 FROM responses WHERE id = ?1 AND key = ?2")?;
        Ok(stmt.query_row(params![row_id(key), key], |_| Ok(())).optional()?.is_some())
    };
    let mut missing = Vec::new();
    for j in answers {
        if !stored(conn, &j.row.key)? {
            missing.push(j);
        }
    }
    let recovered = missing.len();
    if recovered > 0 {
        let tx = conn.transaction()?;
        let t = now();
        for j in &missing {
            insert_response(&tx, &j.row, &j.usage, t)?;
        }
        tx.commit().with_context(|| format!("replaying {}", journal.display()))?;
        conn.execute_batch("PRAGMA wal_checkpoint(FULL)")?;
    }
    let mut in_flight = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, s) in started {
        if closed.contains(&k) || !seen.insert(k.clone()) {
            continue;
        }
        if !stored(conn, &k)? {
            in_flight.push((k, s));
        }
    }
    Ok(Replay { in_flight, sent, recovered })
}

/// Replay a journal into the database, then rewrite it with only the requests still
/// in flight (a replayed response must not come back after `synth cache gc`).
/// Returns the new journal and how many responses were replayed.
fn settle(path: &Path, conn: &mut Connection) -> Result<(Journal, usize)> {
    let replay = recover(path, conn)?;
    let journal = Journal::create(path.to_path_buf(), replay.in_flight.into_iter().collect(), replay.sent, "")?;
    Ok((journal, replay.recovered))
}

/// The key under which an embedding's uses are tagged.
pub fn vector_use_key(embedder: &str, text_hash: &str) -> String {
    format!("emb:{embedder}:{text_hash}")
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Let the writer commit what is queued (and the last counts), sync, and stop.
        let (done, _wait) = oneshot::channel();
        let _ = self.send(Cmd::Flush(done));
        self.shared.queue.lock().expect("cache queue").closing = true;
        self.shared.cond.notify_one();
        if let Some(w) = self.writer.lock().expect("writer").take() {
            let _ = w.join();
        }
    }
}

fn writer_loop(
    conn: Arc<Mutex<Connection>>,
    shared: Arc<Shared>,
    path: PathBuf,
    counts: Arc<Counts>,
    journal: Arc<Mutex<Journal>>,
) {
    let wal_path = PathBuf::from(format!("{}-wal", path.display()));
    let mut wal: Option<std::fs::File> = None;
    // Acknowledgements of committed results waiting for the next fsync, and when the
    // oldest of them was queued.
    let mut waiting: Vec<oneshot::Sender<Result<()>>> = Vec::new();
    let mut deadline: Option<Instant> = None;
    let mut commit_failed = false;
    loop {
        let (batch, closing) = {
            let mut q = shared.queue.lock().expect("cache queue");
            loop {
                let pending = !q.cmds.is_empty() || !waiting.is_empty();
                if let Some(first) = q.first_at {
                    let d = first + DURABLE_WINDOW;
                    deadline = Some(deadline.map_or(d, |cur| cur.min(d)));
                }
                let now = Instant::now();
                let due = deadline.is_some_and(|d| now >= d);
                if q.closing || q.urgent || due || q.durable >= DURABLE_BATCH || (q.settled && pending) {
                    break;
                }
                match deadline {
                    None => {
                        q.idle = true;
                        q = shared.cond.wait(q).expect("cache queue");
                        q.idle = false;
                    }
                    Some(d) => q = shared.cond.wait_timeout(q, d - now).expect("cache queue").0,
                }
            }
            q.first_at = None;
            q.durable = 0;
            q.urgent = false;
            q.settled = false;
            (std::mem::take(&mut q.cmds), q.closing)
        };
        let flush = batch.iter().any(|c| matches!(c, Cmd::Flush(_)));
        if !batch.is_empty() {
            let result = {
                let mut c = conn.lock().expect("cache connection");
                apply(&mut c, &batch, &counts).map_err(|e| format!("writing {}: {e:#}", path.display()))
            };
            commit_failed |= result.is_err();
            for cmd in batch {
                let done = match cmd {
                    Cmd::PutResponse(_, _, d) | Cmd::PutVectors(_, _, _, d) | Cmd::PutMany(_, _, d) | Cmd::Flush(d) => {
                        d
                    }
                    _ => continue,
                };
                match &result {
                    Ok(()) => waiting.push(done),
                    Err(e) => {
                        let _ = done.send(Err(anyhow!(e.clone())));
                    }
                }
            }
        }
        let due = deadline.is_some_and(|d| Instant::now() >= d);
        let settled = || journal.lock().expect("journal").live == 0;
        if !waiting.is_empty() && (flush || closing || due || waiting.len() >= DURABLE_BATCH || settled()) {
            // Make everything committed so far survive a power loss too.
            if wal.is_none() {
                wal = std::fs::File::open(&wal_path).ok();
            }
            let synced = match &wal {
                Some(f) => f.sync_data().map_err(|e| format!("syncing {}: {e}", wal_path.display())),
                None => Ok(()),
            };
            // Compacted before the acknowledgements: a caller that saw its response
            // stored never finds the journal past its limit by more than what was
            // appended since.
            // After a failed commit the journal alone holds those responses: it is
            // left whole for the next run to replay.
            if synced.is_ok() && !commit_failed {
                compact_journal(&journal, &shared);
            }
            for done in waiting.drain(..) {
                let _ = done.send(synced.clone().map_err(|e| anyhow!(e)));
            }
        }
        if waiting.is_empty() {
            deadline = None;
        }
        if closing && shared.queue.lock().expect("cache queue").cmds.is_empty() && waiting.is_empty() {
            return;
        }
    }
}

/// Rewrite a journal grown past its limit, after a commit and its fsync: it keeps the
/// requests still open and the responses queued but not yet committed (the journal
/// and queue locks are both held, and `put_response` appends and queues under the
/// journal lock, so no response is in the file that is neither committed nor queued).
fn compact_journal(journal: &Mutex<Journal>, shared: &Shared) {
    let mut j = journal.lock().expect("journal");
    if j.bytes < j.limit {
        return;
    }
    let q = shared.queue.lock().expect("cache queue");
    let kept: String = q
        .cmds
        .iter()
        .filter_map(|c| match c {
            Cmd::PutResponse(row, usage, _) => Some(response_line(row, usage)),
            _ => None,
        })
        .collect();
    if let Err(e) = j.rewrite(&kept) {
        tracing::warn!("compacting the request journal: {e:#}");
    }
    drop(q);
}

fn apply(conn: &mut Connection, batch: &[Cmd], counts: &Counts) -> Result<()> {
    // Prepared BEGIN/COMMIT: a transaction per batch without re-parsing SQL.
    conn.prepare_cached("BEGIN")?.execute([])?;
    let result = apply_in(conn, batch, counts);
    match result {
        Ok(()) => {
            conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(())
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn insert_response(tx: &Connection, row: &ResponseRow, usage: &Use, t: i64) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO responses (id, key, stage, fingerprint, provider, base_url, model, request, response,
             tokens_in, tokens_out, cost_usd, created_at, last_used_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13)",
    )?
    .execute(params![
        row_id(&row.key),
        row.key,
        usage.stage,
        usage.fingerprint,
        row.provider,
        row.base_url,
        row.model,
        row.request,
        row.response,
        row.tokens_in as i64,
        row.tokens_out as i64,
        row.cost_usd,
        t
    ])?;
    Ok(())
}

fn apply_in(tx: &Connection, batch: &[Cmd], counts: &Counts) -> Result<()> {
    let t = now();
    for (name, counter) in [
        ("lookups", &counts.lookups),
        ("hits", &counts.hits),
        ("vector_lookups", &counts.vector_lookups),
        ("vector_hits", &counts.vector_hits),
    ] {
        let n = counter.swap(0, Ordering::Relaxed);
        if n != 0 {
            tx.prepare_cached(
                "INSERT INTO counters (name, value) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2",
            )?
            .execute(params![name, n])?;
        }
    }
    for cmd in batch {
        match cmd {
            Cmd::PutResponse(row, usage, _) => insert_response(tx, row, usage, t)?,
            Cmd::PutMany(rows, usage, _) => {
                // In row-id order: the ids are hashes, so in arrival order every insert
                // lands on a random leaf page and a transaction rewrites most of the
                // table's pages into the WAL; sorted, each page is written once.
                let mut order: Vec<(i64, &ResponseRow)> = rows.iter().map(|r| (row_id(&r.key), r)).collect();
                order.sort_unstable_by_key(|(id, _)| *id);
                for (_, row) in order {
                    insert_response(tx, row, usage, t)?;
                }
            }
            Cmd::PutVectors(embedder, items, usage, _) => {
                let mut stmt = tx.prepare_cached(
                    "INSERT OR REPLACE INTO embeddings (id, embedder, text_hash, stage, fingerprint, dim, vector, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?;
                for (hash, v) in items {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    let id = row_id(&vector_use_key(embedder, hash));
                    stmt.execute(params![
                        id,
                        embedder,
                        hash,
                        usage.stage,
                        usage.fingerprint,
                        v.len() as i64,
                        bytes,
                        t
                    ])?;
                }
            }
            Cmd::Hit(key, usage) => {
                tx.prepare_cached(
                    "UPDATE responses SET hits = hits + 1, last_used_at = ?3 WHERE id = ?1 AND key = ?2",
                )?
                .execute(params![row_id(key), key, t])?;
                tag(tx, key, usage)?;
            }
            Cmd::VectorUses(embedder, hashes, usage) => {
                for h in hashes {
                    tag(tx, &vector_use_key(embedder, h), usage)?;
                }
            }
            Cmd::Flush(_) => {}
        }
    }
    Ok(())
}

fn tag(tx: &Connection, key: &str, usage: &Use) -> Result<()> {
    tx.prepare_cached("INSERT OR IGNORE INTO uses (key, stage, fingerprint) VALUES (?1, ?2, ?3)")?.execute(params![
        key,
        usage.stage,
        usage.fingerprint
    ])?;
    Ok(())
}

/// Read-only views for `synth cache`.
pub mod admin {
    use std::collections::BTreeSet;

    use super::*;

    pub fn open_existing(dir: &Path) -> Result<Connection> {
        let path = dir.join(super::CACHE_FILE);
        if !path.exists() {
            anyhow::bail!("no cache at {} (run a pipeline with LLM or embedding stages first)", path.display());
        }
        let mut conn =
            open(&path, false).map_err(|e| anyhow!("{e:#} (is a synth run using this output directory?)"))?;
        conn.execute_batch(SCHEMA).map_err(|e| anyhow!("{e} (is a synth run using this output directory?)"))?;
        // Responses a killed run had journaled but not committed belong to the cache.
        let journal = dir.join(super::JOURNAL_FILE);
        if journal.exists() {
            settle(&journal, &mut conn)?;
        }
        Ok(conn)
    }

    #[derive(Debug, serde::Serialize)]
    pub struct ModelStats {
        pub provider: String,
        pub model: String,
        pub entries: u64,
        pub tokens_in: u64,
        pub tokens_out: u64,
        pub cost_usd: f64,
        pub hits: u64,
    }

    #[derive(Debug, serde::Serialize)]
    pub struct Stats {
        pub path: String,
        pub bytes: u64,
        pub responses: u64,
        pub vectors: u64,
        pub lookups: u64,
        pub hits: u64,
        pub hit_rate: f64,
        pub vector_lookups: u64,
        pub vector_hits: u64,
        pub in_flight: u64,
        pub by_model: Vec<ModelStats>,
        pub vectors_by_embedder: Vec<(String, u64)>,
    }

    pub fn stats(dir: &Path) -> Result<Stats> {
        let mut conn = open_existing(dir)?;
        let in_flight = recover(&dir.join(super::JOURNAL_FILE), &mut conn)?.in_flight.len() as u64;
        let path = dir.join(super::CACHE_FILE);
        let bytes = ["", "-wal", "-shm"]
            .iter()
            .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok().map(|m| m.len()))
            .sum();
        let count = |sql: &str| -> Result<u64> { Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64) };
        let counter = |name: &str| -> Result<u64> {
            Ok(conn
                .query_row("SELECT value FROM counters WHERE name = ?1", params![name], |r| r.get::<_, i64>(0))
                .optional()?
                .unwrap_or(0) as u64)
        };
        let mut stmt = conn.prepare(
            "SELECT provider, model, COUNT(*), SUM(tokens_in), SUM(tokens_out), SUM(cost_usd), SUM(hits)
             FROM responses GROUP BY provider, model ORDER BY provider, model",
        )?;
        let by_model = stmt
            .query_map([], |r| {
                Ok(ModelStats {
                    provider: r.get(0)?,
                    model: r.get(1)?,
                    entries: r.get::<_, i64>(2)? as u64,
                    tokens_in: r.get::<_, i64>(3)? as u64,
                    tokens_out: r.get::<_, i64>(4)? as u64,
                    cost_usd: r.get(5)?,
                    hits: r.get::<_, i64>(6)? as u64,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut stmt = conn.prepare("SELECT embedder, COUNT(*) FROM embeddings GROUP BY embedder ORDER BY embedder")?;
        let vectors_by_embedder =
            stmt.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?.collect::<Result<Vec<_>, _>>()?;
        let lookups = counter("lookups")?;
        let hits = counter("hits")?;
        Ok(Stats {
            path: path.display().to_string(),
            bytes,
            responses: count("SELECT COUNT(*) FROM responses")?,
            vectors: count("SELECT COUNT(*) FROM embeddings")?,
            lookups,
            hits,
            hit_rate: if lookups == 0 { 0.0 } else { hits as f64 / lookups as f64 },
            vector_lookups: counter("vector_lookups")?,
            vector_hits: counter("vector_hits")?,
            in_flight,
            by_model,
            vectors_by_embedder,
        })
    }

    /// Delete entries not used by any of `keep` ((stage, fingerprint) pairs).
    /// Returns (responses removed, vectors removed).
    pub fn gc(dir: &Path, keep: &BTreeSet<(String, String)>, dry_run: bool) -> Result<(u64, u64)> {
        let mut conn = open_existing(dir)?;
        let tx = conn.transaction()?;
        tx.execute_batch("CREATE TEMP TABLE keep (stage TEXT, fingerprint TEXT)")?;
        for (stage, fp) in keep {
            tx.execute("INSERT INTO keep VALUES (?1, ?2)", params![stage, fp])?;
        }
        // Live: created by a kept (stage, fingerprint), or used by one since.
        let used = "SELECT u.key FROM uses u JOIN keep k ON u.stage = k.stage AND u.fingerprint = k.fingerprint";
        let not_kept = "(stage, fingerprint) NOT IN (SELECT stage, fingerprint FROM keep)";
        let dead_r = format!("{not_kept} AND key NOT IN ({used})");
        let dead_v = format!("{not_kept} AND 'emb:' || embedder || ':' || text_hash NOT IN ({used})");
        let dead_responses: i64 =
            tx.query_row(&format!("SELECT COUNT(*) FROM responses WHERE {dead_r}"), [], |r| r.get(0))?;
        let dead_vectors: i64 =
            tx.query_row(&format!("SELECT COUNT(*) FROM embeddings WHERE {dead_v}"), [], |r| r.get(0))?;
        if !dry_run {
            tx.execute(&format!("DELETE FROM responses WHERE {dead_r}"), [])?;
            tx.execute(&format!("DELETE FROM embeddings WHERE {dead_v}"), [])?;
            tx.execute("DELETE FROM uses WHERE (stage, fingerprint) NOT IN (SELECT stage, fingerprint FROM keep)", [])?;

            tx.commit()?;
            conn.execute_batch("VACUUM")?;
        }
        Ok((dead_responses as u64, dead_vectors as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str) -> ResponseRow {
        ResponseRow {
            key: key.into(),
            provider: "offline".into(),
            base_url: "".into(),
            model: "offline".into(),
            request: "{}".into(),
            response: format!("{{\"text\":\"{key}\"}}"),
            tokens_in: 3,
            tokens_out: 4,
            cost_usd: 0.0,
        }
    }

    #[test]
    fn sent_and_queued_requests_are_told_apart_after_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        {
            let cache = Cache::open(dir.path()).unwrap();
            for k in ["a", "b", "c"] {
                cache.journal_start(k, "s").unwrap();
            }
            cache.journal_sent("a").unwrap();
            cache.journal_sent("a").unwrap(); // a retry writes nothing more
            cache.journal_sent("b").unwrap();
            cache.journal_end("b");
            assert_eq!(cache.in_flight_split(), (1, 1));
            // Dropped without answers: as after a kill, the journal holds S/H/E lines.
        }
        let journal = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
        assert_eq!(journal.matches("H\ta\n").count(), 1, "{journal}");
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(cache.in_flight_split(), (1, 1), "a was on the wire, c only queued");
        // The rewritten journal keeps the distinction for a second restart.
        drop(cache);
        assert_eq!(Cache::open(dir.path()).unwrap().in_flight_split(), (1, 1));
    }

    #[tokio::test]
    async fn responses_journal_and_gc() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let u1 = Use { stage: "a".into(), fingerprint: "f1".into() };
        cache.journal_start("k1", "a").unwrap();
        cache.journal_start("k2", "a").unwrap();
        assert_eq!(cache.in_flight().unwrap().len(), 2);
        cache.put_response(row("k1"), &u1).await.unwrap();
        assert_eq!(cache.in_flight().unwrap(), vec![("k2".to_string(), "a".to_string())]);
        assert_eq!(cache.get_response("k1", &u1).unwrap().unwrap().tokens_out, 4);
        assert!(cache.get_response("nope", &u1).unwrap().is_none());
        cache.put_vectors("hashing", vec![("h1".into(), vec![0.5, -0.25])], &u1).await.unwrap();
        assert_eq!(
            cache.get_vectors("hashing", &["h1".into(), "h2".into()], &u1).unwrap(),
            vec![Some(vec![0.5, -0.25]), None]
        );
        let u2 = Use { stage: "a".into(), fingerprint: "f2".into() };
        cache.put_response(row("k3"), &u2).await.unwrap();
        cache.flush().await.unwrap();
        drop(cache);

        let s = admin::stats(dir.path()).unwrap();
        assert_eq!((s.responses, s.vectors, s.lookups, s.hits, s.in_flight), (2, 1, 2, 1, 1));
        let keep = [("a".to_string(), "f2".to_string())].into_iter().collect();
        assert_eq!(admin::gc(dir.path(), &keep, true).unwrap(), (1, 1));
        assert_eq!(admin::gc(dir.path(), &keep, false).unwrap(), (1, 1));
        let s = admin::stats(dir.path()).unwrap();
        assert_eq!((s.responses, s.vectors), (1, 0));
        // gc removed k1 for good: its journaled response does not come back.
        let cache = Cache::open(dir.path()).unwrap();
        assert!(cache.get_response("k1", &u1).unwrap().is_none());
    }

    /// Answers stored in bulk are held in memory until their use lets them go: the same
    /// answer from memory, then from the database; an online answer for the same key
    /// replaces the held one.
    #[tokio::test]
    async fn bulk_answers_are_held_until_their_use_lets_them_go() {
        let dir = tempfile::tempdir().unwrap();
        let u = Use { stage: "batch".into(), fingerprint: "f1".into() };
        let other = Use { stage: "other".into(), fingerprint: "f2".into() };
        let cache = Cache::open(dir.path()).unwrap();
        let (commit, held) = cache.put_many(vec![row("h1"), row("h2")], &u).unwrap();
        assert!(held);
        let from_memory = cache.get_response("h1", &u).unwrap().expect("held");
        assert_eq!((&*from_memory.response, from_memory.tokens_in), ("{\"text\":\"h1\"}", 3));
        assert_eq!(cache.held.lock().unwrap().answers.len(), 2);
        commit.await.unwrap();
        // Another use lets go only of its own.
        cache.forget_held(&other);
        assert_eq!(cache.held.lock().unwrap().answers.len(), 2);
        cache.put_response(ResponseRow { response: "{\"text\":\"new\"}".into(), ..row("h2") }, &other).await.unwrap();
        assert_eq!(&*cache.get_response("h2", &u).unwrap().unwrap().response, "{\"text\":\"new\"}");
        cache.forget_held(&u);
        let held = cache.held.lock().unwrap();
        assert!(held.answers.is_empty() && held.bytes == 0, "{} bytes left", held.bytes);
        drop(held);
        let from_db = cache.get_response("h1", &u).unwrap().expect("stored");
        assert_eq!((from_db.response, from_db.tokens_out), (from_memory.response, 4));
    }

    /// Reading back what this process stored in bulk, for the use it was stored for, is
    /// not a hit; for another use it is (counted and tagged, so gc keeps it for both).
    #[tokio::test]
    async fn bulk_answers_read_back_by_their_own_stage_are_not_hits() {
        let dir = tempfile::tempdir().unwrap();
        let hits = |dir: &Path| -> (i64, i64) {
            let conn = Connection::open(dir.join(CACHE_FILE)).unwrap();
            let h = conn.query_row("SELECT COALESCE(SUM(hits), 0) FROM responses", [], |r| r.get(0)).unwrap();
            let later = conn.query_row("SELECT COUNT(*) FROM uses WHERE stage = 'later'", [], |r| r.get(0)).unwrap();
            (h, later)
        };
        let u = Use { stage: "batch".into(), fingerprint: "f1".into() };
        let other = Use { stage: "later".into(), fingerprint: "f9".into() };
        {
            let cache = Cache::open(dir.path()).unwrap();
            let (commit, held) = cache.put_many(vec![row("b1"), row("b2")], &u).unwrap();
            assert!(held);
            commit.await.unwrap();
            for k in ["b1", "b2"] {
                assert!(cache.get_response(k, &u).unwrap().is_some());
            }
            cache.flush().await.unwrap();
        }
        assert_eq!(hits(dir.path()), (0, 0), "the output pass is not a reuse");
        {
            let cache = Cache::open(dir.path()).unwrap();
            assert!(cache.get_response("b1", &other).unwrap().is_some());
            // A new process reading its own stage's answers: a hit (they were stored before).
            assert!(cache.get_response("b2", &u).unwrap().is_some());
            cache.flush().await.unwrap();
        }
        assert_eq!(hits(dir.path()), (2, 1), "another stage's read, and a later run's, are");
        // gc keeping only the later stage keeps b1 (tagged by that read) and drops b2.
        let keep = [("later".to_string(), "f9".to_string())].into_iter().collect();
        assert_eq!(admin::gc(dir.path(), &keep, false).unwrap().0, 1);
        let cache = Cache::open(dir.path()).unwrap();
        assert!(cache.get_response("b1", &other).unwrap().is_some());
        assert!(cache.get_response("b2", &other).unwrap().is_none());
    }

    /// What a killed process leaves: a response journaled but not committed, a request
    /// in flight, and a torn last record.
    #[tokio::test]
    async fn journaled_responses_are_replayed_after_a_kill() {
        let dir = tempfile::tempdir().unwrap();
        drop(Cache::open(dir.path()).unwrap());
        let u = Use { stage: "s".into(), fingerprint: "f".into() };
        let answered = serde_json::to_string(&Journaled { row: row("kx"), usage: u.clone() }).unwrap();
        let torn = serde_json::to_string(&Journaled { row: row("kz"), usage: u.clone() }).unwrap();
        let text = format!("S\tkx\ts\nS\tky\ts\nS\tkz\ts\nR\t{answered}\nR\t{}", &torn[..torn.len() / 2]);
        std::fs::write(dir.path().join(JOURNAL_FILE), text).unwrap();

        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(cache.recovered(), 1);
        assert_eq!(&*cache.get_response("kx", &u).unwrap().unwrap().response, "{\"text\":\"kx\"}");
        let in_flight: Vec<String> = cache.in_flight().unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(in_flight, ["ky", "kz"]);
        // The rewritten journal keeps only those two.
        let journal = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
        assert_eq!(journal, "S\tky\ts\nS\tkz\ts\n");
        drop(cache);
        let s = admin::stats(dir.path()).unwrap();
        assert_eq!((s.responses, s.in_flight), (1, 2));
    }

    /// A long run's journal is compacted once every response it holds is committed.
    #[tokio::test]
    async fn the_journal_is_compacted_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        // A request a previous run left in flight.
        std::fs::write(dir.path().join(JOURNAL_FILE), "S\topen\ts\n").unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        cache.journal.lock().unwrap().limit = 256 << 10;
        let u = Use { stage: "s".into(), fingerprint: "f".into() };
        let big = "x".repeat(32 << 10);
        // The records in the file (it is grown ahead of them by `JOURNAL_GROW`).
        let size = || cache.journal.lock().unwrap().bytes;
        let mut peak = 0;
        for n in 0..40 {
            let key = format!("k{n}");
            cache.journal_start(&key, "s").unwrap();
            cache.put_response(ResponseRow { request: big.clone(), ..row(&key) }, &u).await.unwrap();
            peak = peak.max(size());
        }
        cache.flush().await.unwrap();
        // 40 responses of 32 KiB were journaled (1.3 MB); the file never held much more
        // than the limit, and it still starts with the one open request.
        assert!(peak < (256 << 10) + (64 << 10), "journal grew to {peak} bytes");
        let journal = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
        assert!(journal.starts_with("S\topen\ts\n"), "{}", &journal[..journal.len().min(80)]);
        for n in 0..40 {
            assert!(cache.get_response(&format!("k{n}"), &u).unwrap().is_some(), "k{n}");
        }
        assert_eq!(cache.in_flight().unwrap(), vec![("open".to_string(), "s".to_string())]);
    }

    /// A killed process leaves its records followed by the zeros the file was grown
    /// by, and maybe a record cut inside a character: all of it replays.
    #[test]
    fn a_killed_writers_journal_replays_past_its_zeros_and_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut j = Journal::create(path.clone(), IndexMap::new(), Default::default(), "").unwrap();
        let u = Use { stage: "s".into(), fingerprint: "f".into() };
        for k in ["a", "b", "c"] {
            j.append(&format!("S\t{k}\ts\n")).unwrap();
        }
        j.append("H\ta\n").unwrap();
        j.append(&response_line(&ResponseRow { response: "é".into(), ..row("b") }, &u)).unwrap();
        let written = j.bytes as usize;
        std::mem::forget(j); // killed: nothing cuts the file back
        // c's answer, cut by the kill inside "é" (two bytes).
        let torn = response_line(&ResponseRow { response: "é".into(), ..row("c") }, &u);
        let cut = torn.find('é').unwrap() + 1;
        let mut raw = std::fs::read(&path).unwrap();
        raw[written..written + cut].copy_from_slice(&torn.as_bytes()[..cut]);
        std::fs::write(&path, &raw).unwrap();
        assert!(raw.len() >= written + JOURNAL_GROW as usize && raw[raw.len() - 1] == 0, "grown ahead");
        let mut conn = Connection::open(dir.path().join(CACHE_FILE)).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let replay = recover(&path, &mut conn).unwrap();
        assert_eq!(replay.recovered, 1, "b's answer");
        let stored: String = conn.query_row("SELECT response FROM responses", [], |r| r.get(0)).unwrap();
        assert_eq!(stored, "é");
        assert_eq!(replay.in_flight, vec![("a".to_string(), "s".to_string()), ("c".to_string(), "s".to_string())]);
        assert!(replay.sent.contains("a") && !replay.sent.contains("c"));
    }

    /// A journal closed cleanly holds its records and nothing more; one reopened after a
    /// kill is rewritten without the zeros.
    #[test]
    fn a_closed_journal_is_cut_back_to_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut j = Journal::create(path.clone(), IndexMap::new(), Default::default(), "").unwrap();
        j.append("S\ta\ts\n").unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 8, "grown ahead while open");
        drop(j);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "S\ta\ts\n");
        let mut j = Journal::create(path.clone(), IndexMap::new(), Default::default(), "").unwrap();
        j.append("S\tb\ts\n").unwrap();
        std::mem::forget(j);
        let cache = Cache::open(dir.path()).unwrap();
        assert_eq!(cache.in_flight().unwrap(), vec![("b".to_string(), "s".to_string())]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "S\tb\ts\n");
    }

    /// Compaction keeps the responses queued but not yet committed: a kill right
    /// after it still replays them.
    #[test]
    fn compaction_keeps_queued_responses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let open: IndexMap<String, String> = [("o".to_string(), "s".to_string())].into_iter().collect();
        let mut j = Journal::create(path.clone(), open, Default::default(), "").unwrap();
        j.limit = 1;
        let u = Use { stage: "s".into(), fingerprint: "f".into() };
        j.append(&response_line(&row("committed"), &u)).unwrap();
        j.append(&response_line(&row("queued"), &u)).unwrap();
        let (done, _wait) = oneshot::channel();
        let queue = Queue { cmds: vec![Cmd::PutResponse(row("queued"), u.clone(), done)], ..Queue::default() };
        let shared = Shared { queue: Mutex::new(queue), cond: std::sync::Condvar::new() };
        let journal = Mutex::new(j);
        compact_journal(&journal, &shared);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("S\to\ts\nR\t"), "{text}");
        assert_eq!(text.lines().count(), 2, "{text}");
        let mut conn = Connection::open(dir.path().join(CACHE_FILE)).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let replay = recover(&path, &mut conn).unwrap();
        assert_eq!(replay.recovered, 1);
        let keys: Vec<String> = conn
            .prepare("SELECT key FROM responses")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        assert_eq!(keys, ["queued"]);
        assert_eq!(replay.in_flight, [("o".to_string(), "s".to_string())]);
    }
}
