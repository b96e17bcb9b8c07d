//! What the viewer's handlers share: what is viewed (`Viewed`), the server's state
//! (`App`: caches of table orders and searches, the review desk's token), the JSON answer
//! and error of one view, and safe paths inside the output directory.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::table::{self, Table};
use synth_core::store::state::{INTERNAL_DIR, MANIFEST};

/// What is viewed: an output directory and where its snapshots are.
#[derive(Debug, Clone)]
pub struct Viewed {
    pub dir: PathBuf,
    pub snapshots: PathBuf,
    /// Another output directory shown beside this one (`--compare`).
    pub compare: Option<PathBuf>,
}

impl Viewed {
    /// An output directory (its snapshots under `snapshots/`). A directory that does not
    /// exist yet, or is empty, is one a run is about to write: the page shows its stages as
    /// they appear. A directory with files but no run state is refused.
    pub fn dir(dir: &Path, snapshots: Option<PathBuf>) -> Result<Viewed> {
        let canon = future_canonical(dir).with_context(|| format!("{}: cannot resolve this path", dir.display()))?;
        if canon.exists() {
            if !canon.is_dir() {
                bail!("{}: not a directory", dir.display());
            }
            let empty = std::fs::read_dir(&canon).map(|mut r| r.next().is_none()).unwrap_or(false);
            if !empty && !canon.join(MANIFEST).is_file() && !canon.join(INTERNAL_DIR).join("state").is_dir() {
                bail!(
                    "{}: not a synth output directory (no {MANIFEST} and no {INTERNAL_DIR}/state/): give the \
                     pipeline's output_dir or the pipeline file",
                    dir.display()
                );
            }
        }
        let snapshots = snapshots.unwrap_or_else(|| canon.join("snapshots"));
        Ok(Viewed { dir: canon, snapshots, compare: None })
    }

    /// Show `other` (an output directory) beside this one.
    pub fn compared_with(mut self, other: &Path) -> Result<Viewed> {
        let o = Viewed::dir(other, None)?;
        if !o.dir.join(MANIFEST).is_file() {
            bail!("{}: no {MANIFEST} to compare with (a run has not finished there)", other.display());
        }
        self.compare = Some(o.dir);
        Ok(self)
    }

    /// Whether a run has written here yet.
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }
}

/// The canonical form `path` has, or will have once it is created: its deepest existing
/// ancestor resolved (symlinks and all), the rest appended as written (`..` refused).
pub fn future_canonical(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    let mut rest = Vec::new();
    let mut at = abs.as_path();
    loop {
        match at.canonicalize() {
            Ok(c) => {
                let mut out = c;
                for part in rest.iter().rev() {
                    out.push(part);
                }
                return Ok(out);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else { return Err(e) };
                rest.push(name.to_os_string());
                at = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Cached orders of big tables, by (file, its mtime and size, what).
pub(super) type Cache = Mutex<HashMap<(PathBuf, SystemTime, u64, String), Arc<Vec<u32>>>>;

/// Text filters of tables, running or done, by (file, its mtime and size, needle).
pub(super) type Searches = Mutex<HashMap<(PathBuf, SystemTime, u64, String), Arc<table::Search>>>;

pub(super) struct App {
    pub(super) viewed: Viewed,
    pub(super) positions: Cache,
    pub(super) searches: Searches,
    /// The review desk's token: in the page this server sends, asked of every decision
    /// posted (a page of another origin cannot read it).
    pub(super) token: String,
    /// Who decides at this desk ($SYNTH_REVIEWER, else $USER).
    pub(super) reviewer: Option<String>,
}

pub(super) fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found").into_response()
}

/// An error of one view: its status and message (the rest of the page keeps working).
pub(super) struct Fail(pub(super) StatusCode, pub(super) String);

impl Fail {
    pub(super) fn not_found() -> Fail {
        Fail(StatusCode::NOT_FOUND, "not found".into())
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        if self.0 == StatusCode::NOT_FOUND && self.1 == "not found" {
            return not_found();
        }
        fail(self.0, self.1)
    }
}

/// A JSON answer, secrets scrubbed.
pub(super) fn answer(v: &Value) -> Response {
    let body = synth_core::secrets::scrub(&serde_json::to_string(&synth_core::secrets::redact(v)).expect("json"));
    let mut r = body.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An error of one view (the rest of the page keeps working).
pub(super) fn fail(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    let body = json!({"error": synth_core::secrets::scrub(&msg.to_string())});
    let mut r = (status, serde_json::to_string(&body).expect("json")).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A path a request names, if it is a plain relative path that stays inside `dir`
/// once symlinks are resolved (`..`, absolute paths and links out are refused).
pub fn inside(dir: &Path, rel: &str) -> Option<PathBuf> {
    if rel.is_empty() || rel.contains('\\') || rel.contains('\0') {
        return None;
    }
    let p = Path::new(rel);
    if p.is_absolute() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let canon = dir.join(p).canonicalize().ok()?;
    canon.starts_with(dir).then_some(canon)
}

pub(super) fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

pub(super) fn parquet_path(v: &Viewed, rel: &str) -> Result<PathBuf, Fail> {
    if !rel.ends_with(".parquet") || rel.starts_with(INTERNAL_DIR) {
        return Err(Fail::not_found());
    }
    inside(&v.dir, rel).filter(|p| p.is_file()).ok_or_else(Fail::not_found)
}

impl App {
    /// Positions of a table's rows for an order or a filter, computed once per file version.
    pub(super) fn positions(
        &self,
        t: &Table,
        what: String,
        f: impl FnOnce() -> Result<Vec<u32>>,
    ) -> Result<Arc<Vec<u32>>> {
        let meta = std::fs::metadata(&t.path)?;
        let key = (t.path.clone(), meta.modified()?, meta.len(), what);
        if let Some(hit) = self.positions.lock().expect("cache").get(&key) {
            return Ok(hit.clone());
        }
        let computed = Arc::new(f()?);
        let mut cache = self.positions.lock().expect("cache");
        if cache.len() >= 16 {
            cache.clear();
        }
        cache.insert(key, computed.clone());
        Ok(computed)
    }

    /// The search of a table for a text: the one started earlier for this file version, or
    /// a new one.
    pub(super) fn search(&self, t: &Table, needle: &str) -> Result<Arc<table::Search>> {
        let meta = std::fs::metadata(&t.path)?;
        let key = (t.path.clone(), meta.modified()?, meta.len(), needle.to_string());
        let mut searches = self.searches.lock().expect("searches");
        if let Some(s) = searches.get(&key) {
            return Ok(s.clone());
        }
        if searches.len() >= 16 {
            searches.clear();
        }
        Ok(searches.entry(key).or_insert_with(|| table::Search::start(t, needle)).clone())
    }
}

pub(super) fn open_table(app: &App, file: &str) -> Result<Table, Fail> {
    let path = parquet_path(&app.viewed, file)?;
    Table::open(&path).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{:#}", e)))
}

pub(super) async fn blocking(f: impl FnOnce() -> Result<Value, Fail> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => answer(&v),
        Ok(Err(f)) => f.into_response(),
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}
