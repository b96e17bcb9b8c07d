//! A fake Hugging Face Hub on 127.0.0.1 (bounded in time) with real revisions: every
//! repository has commits, branches and tags; datasets and models are read through the same
//! endpoints hf-hub uses (revision info, ranged `resolve` downloads), and the write
//! path checks what the real Hub checks: a Bearer token, the preupload call, the Git
//! LFS batch API (basic and multipart uploads, SHA-256 and size verified), the NDJSON
//! commit (`header` first with `parentCommit`: 412 "A commit has happened since" when
//! the branch moved; `lfsFile` only for uploaded objects; `deletedFile` only for files
//! that exist), and tags (409 when the tag exists). A gate can hold revision requests
//! (to keep a client busy), and a one-shot hook lands a foreign commit just before the
//! next commit request (a concurrent push).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest;

#[derive(Debug, Clone)]
pub struct FakeCommit {
    pub parent: Option<String>,
    pub files: BTreeMap<String, Vec<u8>>,
    pub summary: String,
    /// Files the commit received as LFS pointers.
    pub lfs: BTreeSet<String>,
}

#[derive(Debug, Clone, Default)]
pub struct FakeRepo {
    pub branches: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub commits: BTreeMap<String, FakeCommit>,
    /// Commits made through the commit API, in order.
    pub api_commits: Vec<String>,
}

impl FakeRepo {
    fn resolve(&self, rev: &str) -> Option<String> {
        self.branches
            .get(rev)
            .or_else(|| self.tags.get(rev))
            .cloned()
            .or_else(|| self.commits.contains_key(rev).then(|| rev.to_string()))
    }
}

#[derive(Default)]
pub struct HubState {
    pub repos: BTreeMap<String, FakeRepo>,
    /// LFS objects by SHA-256.
    pub lfs: BTreeMap<String, Vec<u8>>,
    parts: BTreeMap<(String, u64), Vec<u8>>,
    counter: u64,
}

impl HubState {
    /// Add a commit on `branch` with `files` (the whole tree); returns its sha.
    pub fn commit(&mut self, repo: &str, branch: &str, files: BTreeMap<String, Vec<u8>>, summary: &str) -> String {
        self.counter += 1;
        let r = self.repos.entry(repo.to_string()).or_default();
        let parent = r.branches.get(branch).cloned();
        let mut h = blake3::Hasher::new();
        h.update(repo.as_bytes());
        h.update(&self.counter.to_le_bytes());
        for (k, v) in &files {
            h.update(k.as_bytes());
            h.update(v);
        }
        let sha = h.finalize().to_hex()[..40].to_string();
        r.commits.insert(sha.clone(), FakeCommit { parent, files, summary: summary.into(), lfs: BTreeSet::new() });
        r.branches.insert(branch.to_string(), sha.clone());
        sha
    }
}

/// Something that happens to the hub's state just before the next commit is checked.
pub type ConcurrentPush = Box<dyn FnOnce(&mut HubState) + Send>;

pub struct FakeHub {
    pub state: Mutex<HubState>,
    /// The token writes need.
    pub token: String,
    /// Files of at least this size (and every `.parquet`) go through LFS.
    pub lfs_threshold: usize,
    /// LFS objects larger than this are uploaded in parts of this size.
    pub multipart_chunk: Option<usize>,
    pub info_requests: AtomicUsize,
    pub commit_requests: AtomicUsize,
    pub downloads: Mutex<Vec<String>>,
    gate_closed: AtomicBool,
    gate: tokio::sync::Notify,
    /// Run once at the next commit request, before it is checked (a concurrent push).
    pub before_next_commit: Mutex<Option<ConcurrentPush>>,
    base: OnceLock<String>,
}

impl FakeHub {
    pub fn new(token: &str) -> Arc<FakeHub> {
        Arc::new(FakeHub {
            state: Mutex::new(HubState::default()),
            token: token.into(),
            lfs_threshold: 4096,
            multipart_chunk: None,
            info_requests: AtomicUsize::new(0),
            commit_requests: AtomicUsize::new(0),
            downloads: Mutex::new(Vec::new()),
            gate_closed: AtomicBool::new(false),
            gate: tokio::sync::Notify::new(),
            before_next_commit: Mutex::new(None),
            base: OnceLock::new(),
        })
    }

    /// Like `new`, with multipart LFS uploads in parts of `chunk` bytes.
    pub fn with_multipart(token: &str, chunk: usize) -> Arc<FakeHub> {
        let mut hub = Arc::into_inner(FakeHub::new(token)).expect("fresh");
        hub.multipart_chunk = Some(chunk);
        hub.lfs_threshold = 1;
        Arc::new(hub)
    }

    /// Commit `files` (the whole tree) to `repo`'s `main`; returns the sha.
    pub fn push(&self, repo: &str, files: &[(&str, &[u8])]) -> String {
        let files = files.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        self.state.lock().unwrap().commit(repo, "main", files, "upstream update")
    }

    pub fn head(&self, repo: &str) -> String {
        self.state.lock().unwrap().repos[repo].branches["main"].clone()
    }

    pub fn repo(&self, repo: &str) -> FakeRepo {
        self.state.lock().unwrap().repos[repo].clone()
    }

    /// Hold revision requests until `open_gate`.
    pub fn close_gate(&self) {
        self.gate_closed.store(true, Ordering::SeqCst);
    }

    pub fn open_gate(&self) {
        self.gate_closed.store(false, Ordering::SeqCst);
        self.gate.notify_waiters();
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {}", self.token))
    }

    fn base(&self) -> &str {
        self.base.get().expect("serving")
    }
}

fn hub_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

fn repo_id(kind: &str, org: &str, name: &str) -> Option<String> {
    matches!(kind, "datasets" | "models").then(|| format!("{org}/{name}"))
}

async fn info(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name, rev)): Path<(String, String, String, String)>,
) -> Response {
    hub.info_requests.fetch_add(1, Ordering::SeqCst);
    while hub.gate_closed.load(Ordering::SeqCst) {
        let notified = hub.gate.notified();
        if !hub.gate_closed.load(Ordering::SeqCst) {
            break;
        }
        let _ = tokio::time::timeout(std::time::Duration::from_millis(100), notified).await;
    }
    let Some(id) = repo_id(&kind, &org, &name) else { return hub_error(StatusCode::NOT_FOUND, "unknown repo type") };
    let state = hub.state.lock().unwrap();
    let Some(repo) = state.repos.get(&id) else { return hub_error(StatusCode::NOT_FOUND, "Repository not found") };
    let Some(sha) = repo.resolve(&rev) else { return hub_error(StatusCode::NOT_FOUND, "Revision not found") };
    let siblings: Vec<Value> = repo.commits[&sha].files.keys().map(|f| json!({"rfilename": f})).collect();
    axum::Json(json!({"id": id, "sha": sha, "siblings": siblings})).into_response()
}

async fn resolve(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name, rev, path)): Path<(String, String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(id) = repo_id(&kind, &org, &name) else { return hub_error(StatusCode::NOT_FOUND, "unknown repo type") };
    let (sha, bytes) = {
        let state = hub.state.lock().unwrap();
        let Some(repo) = state.repos.get(&id) else { return hub_error(StatusCode::NOT_FOUND, "Repository not found") };
        let Some(sha) = repo.resolve(&rev) else { return hub_error(StatusCode::NOT_FOUND, "Revision not found") };
        let Some(bytes) = repo.commits[&sha].files.get(&path).cloned() else {
            return hub_error(StatusCode::NOT_FOUND, "Entry not found");
        };
        (sha, bytes)
    };
    let size = bytes.len();
    let ranged = headers.get(header::RANGE).and_then(|r| r.to_str().ok()).and_then(|r| r.strip_prefix("bytes="));
    let (start, end) = ranged
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().unwrap_or(size.saturating_sub(1))))
        .unwrap_or((0, size.saturating_sub(1)));
    let end = end.min(size.saturating_sub(1));
    if ranged.is_none() || end > start {
        hub.downloads.lock().unwrap().push(format!("{id}/{path}@{sha}"));
    }
    let etag = format!("\"{}\"", blake3::hash(&bytes).to_hex());
    let body = if size == 0 { Vec::new() } else { bytes[start..=end].to_vec() };
    let status = if ranged.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    (
        status,
        [
            (header::ETAG.as_str(), etag),
            ("x-repo-commit", sha),
            (header::CONTENT_RANGE.as_str(), format!("bytes {start}-{end}/{size}")),
        ],
        body,
    )
        .into_response()
}

async fn resolve_model(
    state: State<Arc<FakeHub>>,
    Path((org, name, rev, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    resolve(state, Path(("models".to_string(), org, name, rev, path)), headers).await
}

async fn preupload(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name, _rev)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !hub.authorized(&headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "Invalid credentials in Authorization header");
    }
    if repo_id(&kind, &org, &name).is_none_or(|id| !hub.state.lock().unwrap().repos.contains_key(&id)) {
        return hub_error(StatusCode::NOT_FOUND, "Repository not found");
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return hub_error(StatusCode::BAD_REQUEST, "bad JSON") };
    let files: Vec<Value> = v["files"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap_or_default();
            let size = f["size"].as_u64().unwrap_or(0) as usize;
            let lfs = size >= hub.lfs_threshold || path.ends_with(".parquet");
            json!({"path": path, "uploadMode": if lfs { "lfs" } else { "regular" }, "shouldIgnore": false})
        })
        .collect();
    axum::Json(json!({"files": files})).into_response()
}

async fn lfs_batch(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name_git)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !hub.authorized(&headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "Invalid credentials");
    }
    let Some(name) = name_git.strip_suffix(".git") else { return hub_error(StatusCode::NOT_FOUND, "not a git path") };
    if repo_id(&kind, &org, name).is_none() {
        return hub_error(StatusCode::NOT_FOUND, "unknown repo type");
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return hub_error(StatusCode::BAD_REQUEST, "bad JSON") };
    if v["operation"] != "upload" || v["hash_algo"] != "sha256" {
        return hub_error(StatusCode::UNPROCESSABLE_ENTITY, "only sha256 uploads");
    }
    let base = hub.base();
    let state = hub.state.lock().unwrap();
    let objects: Vec<Value> = v["objects"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|o| {
            let oid = o["oid"].as_str().unwrap_or_default().to_string();
            let size = o["size"].as_u64().unwrap_or(0);
            if state.lfs.contains_key(&oid) {
                return json!({"oid": oid, "size": size});
            }
            let verify = json!({"href": format!("{base}/lfs/verify")});
            match hub.multipart_chunk.filter(|c| size as usize > *c) {
                Some(chunk) => {
                    let mut header = serde_json::Map::new();
                    header.insert("chunk_size".into(), json!(chunk.to_string()));
                    for n in 1..=size.div_ceil(chunk as u64) {
                        header.insert(n.to_string(), json!(format!("{base}/lfs/part/{oid}/{n}")));
                    }
                    json!({"oid": oid, "size": size, "actions": {
                        "upload": {"href": format!("{base}/lfs/complete/{oid}"), "header": header},
                        "verify": verify,
                    }})
                }
                None => json!({"oid": oid, "size": size, "actions": {
                    "upload": {"href": format!("{base}/lfs/upload/{oid}")},
                    "verify": verify,
                }}),
            }
        })
        .collect();
    (
        [(header::CONTENT_TYPE, "application/vnd.git-lfs+json")],
        json!({"transfer": "basic", "objects": objects}).to_string(),
    )
        .into_response()
}

fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

async fn lfs_upload(State(hub): State<Arc<FakeHub>>, Path(oid): Path<String>, body: Bytes) -> Response {
    if sha256_hex(&body) != oid {
        return hub_error(StatusCode::BAD_REQUEST, "content does not match the oid");
    }
    hub.state.lock().unwrap().lfs.insert(oid, body.to_vec());
    StatusCode::OK.into_response()
}

async fn lfs_part(State(hub): State<Arc<FakeHub>>, Path((oid, n)): Path<(String, u64)>, body: Bytes) -> Response {
    let etag = format!("\"part-{n}-{}\"", &blake3::hash(&body).to_hex()[..16]);
    hub.state.lock().unwrap().parts.insert((oid, n), body.to_vec());
    (StatusCode::OK, [(header::ETAG, etag)]).into_response()
}

async fn lfs_complete(State(hub): State<Arc<FakeHub>>, Path(oid): Path<String>, body: Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return hub_error(StatusCode::BAD_REQUEST, "bad JSON") };
    let mut state = hub.state.lock().unwrap();
    let mut data = Vec::new();
    for (i, p) in v["parts"].as_array().cloned().unwrap_or_default().iter().enumerate() {
        let n = p["partNumber"].as_u64().unwrap_or(0);
        if n != i as u64 + 1 {
            return hub_error(StatusCode::BAD_REQUEST, "parts out of order");
        }
        let Some(part) = state.parts.get(&(oid.clone(), n)) else {
            return hub_error(StatusCode::BAD_REQUEST, "missing part");
        };
        let etag = format!("\"part-{n}-{}\"", &blake3::hash(part).to_hex()[..16]);
        if p["etag"].as_str() != Some(etag.as_str()) {
            return hub_error(StatusCode::BAD_REQUEST, "etag mismatch");
        }
        data.extend_from_slice(part);
    }
    if sha256_hex(&data) != oid || v["oid"].as_str() != Some(oid.as_str()) {
        return hub_error(StatusCode::BAD_REQUEST, "assembled content does not match the oid");
    }
    state.lfs.insert(oid, data);
    axum::Json(json!({})).into_response()
}

async fn lfs_verify(State(hub): State<Arc<FakeHub>>, headers: HeaderMap, body: Bytes) -> Response {
    if !hub.authorized(&headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "Invalid credentials");
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return hub_error(StatusCode::BAD_REQUEST, "bad JSON") };
    let state = hub.state.lock().unwrap();
    match state.lfs.get(v["oid"].as_str().unwrap_or_default()) {
        Some(b) if Some(b.len() as u64) == v["size"].as_u64() => StatusCode::OK.into_response(),
        _ => hub_error(StatusCode::NOT_FOUND, "object not found"),
    }
}

async fn commit(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name, rev)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    hub.commit_requests.fetch_add(1, Ordering::SeqCst);
    if !hub.authorized(&headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "Invalid credentials in Authorization header");
    }
    if headers.get(header::CONTENT_TYPE).and_then(|c| c.to_str().ok()) != Some("application/x-ndjson") {
        return hub_error(StatusCode::BAD_REQUEST, "expected application/x-ndjson");
    }
    let Some(id) = repo_id(&kind, &org, &name) else { return hub_error(StatusCode::NOT_FOUND, "unknown repo type") };
    let mut state = hub.state.lock().unwrap();
    if let Some(concurrent) = hub.before_next_commit.lock().unwrap().take() {
        concurrent(&mut state);
    }
    let Some(repo) = state.repos.get(&id) else { return hub_error(StatusCode::NOT_FOUND, "Repository not found") };
    let Some(head) = repo.branches.get(&rev).cloned() else {
        return hub_error(StatusCode::NOT_FOUND, "Branch not found");
    };
    let lines: Vec<Value> = match String::from_utf8_lossy(&body).lines().map(serde_json::from_str).collect() {
        Ok(l) => l,
        Err(_) => return hub_error(StatusCode::BAD_REQUEST, "bad NDJSON"),
    };
    let Some(header_line) = lines.first().filter(|l| l["key"] == "header") else {
        return hub_error(StatusCode::BAD_REQUEST, "the first line must be the header");
    };
    let summary = header_line["value"]["summary"].as_str().unwrap_or_default().to_string();
    if summary.is_empty() {
        return hub_error(StatusCode::BAD_REQUEST, "a commit needs a summary");
    }
    if let Some(parent) = header_line["value"]["parentCommit"].as_str()
        && parent != head
    {
        return hub_error(
            StatusCode::PRECONDITION_FAILED,
            "A commit has happened since. Please refresh and try again.",
        );
    }
    let mut files = repo.commits[&head].files.clone();
    let mut lfs_paths = BTreeSet::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    for line in &lines[1..] {
        let v = &line["value"];
        let path = v["path"].as_str().unwrap_or_default().to_string();
        match line["key"].as_str() {
            Some("file") => {
                let Ok(bytes) = b64.decode(v["content"].as_str().unwrap_or_default()) else {
                    return hub_error(StatusCode::BAD_REQUEST, "content is not base64");
                };
                files.insert(path, bytes);
            }
            Some("lfsFile") => {
                let oid = v["oid"].as_str().unwrap_or_default();
                match state.lfs.get(oid) {
                    Some(bytes) if Some(bytes.len() as u64) == v["size"].as_u64() => {
                        files.insert(path.clone(), bytes.clone());
                        lfs_paths.insert(path);
                    }
                    _ => return hub_error(StatusCode::UNPROCESSABLE_ENTITY, &format!("LFS object {oid} not found")),
                }
            }
            Some("deletedFile") => {
                if files.remove(&path).is_none() {
                    return hub_error(StatusCode::NOT_FOUND, &format!("cannot delete {path}: not in the repo"));
                }
            }
            other => return hub_error(StatusCode::BAD_REQUEST, &format!("unknown operation {other:?}")),
        }
    }
    let sha = state.commit(&id, &rev, files, &summary);
    let repo = state.repos.get_mut(&id).expect("exists");
    repo.commits.get_mut(&sha).expect("new").lfs = lfs_paths;
    repo.api_commits.push(sha.clone());
    let url = format!("{}/datasets/{id}/commit/{sha}", hub.base());
    axum::Json(json!({"success": true, "commitOid": sha, "commitUrl": url})).into_response()
}

async fn tag(
    State(hub): State<Arc<FakeHub>>,
    Path((kind, org, name, rev)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !hub.authorized(&headers) {
        return hub_error(StatusCode::UNAUTHORIZED, "Invalid credentials");
    }
    let Some(id) = repo_id(&kind, &org, &name) else { return hub_error(StatusCode::NOT_FOUND, "unknown repo type") };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else { return hub_error(StatusCode::BAD_REQUEST, "bad JSON") };
    let mut state = hub.state.lock().unwrap();
    let Some(repo) = state.repos.get_mut(&id) else { return hub_error(StatusCode::NOT_FOUND, "Repository not found") };
    let Some(sha) = repo.resolve(&rev) else { return hub_error(StatusCode::NOT_FOUND, "Revision not found") };
    let name = v["tag"].as_str().unwrap_or_default().to_string();
    if repo.tags.contains_key(&name) {
        return hub_error(StatusCode::CONFLICT, "Tag already exists");
    }
    repo.tags.insert(name, sha);
    axum::Json(json!({})).into_response()
}

/// Serve `hub` on 127.0.0.1 (at most 300 s): its endpoint URL and a stop handle.
pub fn serve(hub: Arc<FakeHub>) -> (String, tokio::sync::oneshot::Sender<()>) {
    let app = Router::new()
        .route("/api/{kind}/{org}/{name}/revision/{rev}", get(info))
        .route("/api/{kind}/{org}/{name}/preupload/{rev}", post(preupload))
        .route("/api/{kind}/{org}/{name}/commit/{rev}", post(commit))
        .route("/api/{kind}/{org}/{name}/tag/{rev}", post(tag))
        .route("/{kind}/{org}/{name}/resolve/{rev}/{*path}", get(resolve))
        // A model repository's files have no kind in their URL: /{org}/{name}/resolve/...
        .route("/{kind}/{org}/resolve/{rev}/{*path}", get(resolve_model))
        .route("/{kind}/{org}/{name}/info/lfs/objects/batch", post(lfs_batch))
        .route("/lfs/upload/{oid}", put(lfs_upload))
        .route("/lfs/part/{oid}/{n}", put(lfs_part))
        .route("/lfs/complete/{oid}", post(lfs_complete))
        .route("/lfs/verify", post(lfs_verify))
        .with_state(hub.clone());
    let (url, stop) = super::serve_router(app);
    let _ = hub.base.set(url.clone());
    (url, stop)
}
