//! A loopback fake of the provider batch APIs (127.0.0.1 only, bounded in time and in
//! requests): OpenAI's Files (multipart upload, list, retrieve, content, delete) and
//! Batches (create with metadata, retrieve, list newest first with `after`, cancel),
//! Anthropic's Message Batches (inline create, retrieve, list, cancel, JSONL results),
//! and the online `/v1/chat/completions` and `/v1/messages` for fallbacks and
//! reference runs. A batch is `validating`, then `in_progress` for `processing`, then
//! ends as scripted per batch ([`Fate`]): completed, partly expired, or failed; a
//! batch over the enqueued-token limit fails with `token_limit_exceeded`. Lines whose
//! prompt holds `reject_marker` get a 400, those holding `flaky_marker` a 500 the first
//! time. Answers are those of `openai_server` for the same body, so a batch run and an
//! online run of the same prompts write the same outputs. It counts every line it
//! answered per `custom_id`, uploads, creates and lists; and it can hold an upload's,
//! a create's or a download's answer back (`*_delay`) so a test can kill the client
//! in the middle. Used by the tests and by `benches/mock_batch.rs`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::openai_server::{chat_completion, text_completion};

/// How a batch ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    Complete,
    /// This share of its lines expire (error `batch_expired`); the batch ends `expired`.
    Expire(f64),
    /// The batch fails as a whole (no output): (code, message).
    Fail(String, String),
    /// The batch stays in progress until it is cancelled (then the first half of its
    /// lines ran).
    Hold,
}

#[derive(Clone)]
pub struct Behaviour {
    /// The answer's text for a request body.
    pub responder: Arc<dyn Fn(&serde_json::Value) -> String + Send + Sync>,
    pub validating: Duration,
    /// How long a batch is `in_progress` (the simulated processing time).
    pub processing: Duration,
    /// The fate of the n-th batch created (0-based).
    pub fate: Arc<dyn Fn(usize) -> Fate + Send + Sync>,
    pub reject_marker: Option<String>,
    pub flaky_marker: Option<String>,
    /// Output lines in another order than the input's.
    pub shuffle: bool,
    /// Prompt tokens of batches not yet ended; a create past it fails `token_limit_exceeded`.
    pub enqueued_limit: Option<u64>,
    pub upload_delay: Duration,
    pub create_delay: Duration,
    pub content_delay: Duration,
    pub api_key: Option<String>,
    pub lifetime: Duration,
    /// Requests served at most (503 after).
    pub max_requests: u64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            responder: Arc::new(super::openai_server::default_answer),
            validating: Duration::from_millis(20),
            processing: Duration::from_millis(100),
            fate: Arc::new(|_| Fate::Complete),
            reject_marker: None,
            flaky_marker: None,
            shuffle: true,
            enqueued_limit: None,
            upload_delay: Duration::ZERO,
            create_delay: Duration::ZERO,
            content_delay: Duration::ZERO,
            api_key: None,
            lifetime: Duration::from_secs(600),
            max_requests: 100_000,
        }
    }
}

#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub uploads: AtomicU64,
    /// Uploads received (counted before the delayed answer).
    pub uploads_received: AtomicU64,
    pub creates: AtomicU64,
    pub lists: AtomicU64,
    pub retrieves: AtomicU64,
    pub contents_requested: AtomicU64,
    pub cancels: AtomicU64,
    pub online: AtomicU64,
    pub deleted_files: AtomicU64,
    /// The most prompt tokens enqueued at once (batches not ended).
    pub enqueued_max: AtomicU64,
    /// custom_id -> lines answered with 200 (a request paid for).
    pub answered: Mutex<HashMap<String, u64>>,
    /// custom_id -> lines processed (any outcome, expiry excluded).
    pub processed: Mutex<HashMap<String, u64>>,
    /// The line count of each batch created, in order.
    pub batch_sizes: Mutex<Vec<usize>>,
}

impl Counters {
    /// (distinct requests answered, the most times one was answered).
    pub fn answered_once(&self) -> (usize, u64) {
        let a = self.answered.lock().unwrap();
        (a.len(), a.values().copied().max().unwrap_or(0))
    }
}

struct File {
    filename: String,
    bytes: Vec<u8>,
    purpose: String,
    created_at: u64,
}

struct Outcome {
    status: &'static str,
    output: Option<String>,
    errors: Option<String>,
    completed: u64,
    failed: u64,
    failure: Option<(String, String)>,
}

struct Batch {
    id: String,
    anthropic: bool,
    input_file_id: String,
    endpoint: String,
    metadata: serde_json::Value,
    created: Instant,
    created_at: u64,
    lines: Vec<(String, serde_json::Value)>,
    fate: Fate,
    tokens: u64,
    cancelled: bool,
    outcome: Option<Outcome>,
}

#[derive(Default)]
struct World {
    files: HashMap<String, File>,
    batches: Vec<Batch>,
    next: u64,
    flaky_seen: HashMap<String, u64>,
}

struct Shared {
    b: Behaviour,
    c: Arc<Counters>,
    w: Mutex<World>,
}

pub struct Server {
    pub addr: SocketAddr,
    pub counters: Arc<Counters>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Anthropic's base URL (without `/v1`).
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn json(status: StatusCode, v: serde_json::Value) -> Response {
    (status, [("content-type", "application/json")], v.to_string()).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    json(status, serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "code": null}}))
}

/// Counted and bounded; the key checked.
fn admit(s: &Shared, headers: &HeaderMap) -> Option<Response> {
    let n = s.c.requests.fetch_add(1, Ordering::SeqCst);
    if n >= s.b.max_requests {
        return Some(error(StatusCode::SERVICE_UNAVAILABLE, "the test server's request budget is spent"));
    }
    if let Some(key) = &s.b.api_key {
        let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        let x = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("");
        if bearer != format!("Bearer {key}") && x != key {
            return Some(error(StatusCode::UNAUTHORIZED, "bad key"));
        }
    }
    None
}

fn last_user(body: &serde_json::Value) -> String {
    super::openai_server::last_user(body)
}

/// Rough prompt tokens of a request body (what the enqueued limit counts).
fn tokens(body: &serde_json::Value) -> u64 {
    let text = last_user(body);
    (text.chars().count() as u64).div_ceil(4).max(1)
}

/// An Anthropic message answering `body`.
fn message(s: &Shared, body: &serde_json::Value) -> serde_json::Value {
    // The same text as an OpenAI-style answer to the same messages.
    let text = (s.b.responder)(body);
    let input: usize = body["messages"]
        .as_array()
        .map(|m| m.iter().map(|x| x["content"].as_str().unwrap_or("").len() / 4 + 1).sum())
        .unwrap_or(1)
        + body["system"].as_str().map(|t| t.len() / 4 + 1).unwrap_or(0);
    serde_json::json!({"id": "msg_test", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "usage": {"input_tokens": input, "output_tokens": text.len() / 4 + 1}})
}

fn answer_line(s: &Shared, endpoint: &str, body: &serde_json::Value) -> serde_json::Value {
    let model = body["model"].as_str().unwrap_or_default();
    match endpoint {
        "/v1/completions" => {
            text_completion(body, model, &(Arc::new(|_: &str, _: &str| -1.0) as super::openai_server::TokenLogprob))
        }
        "/v1/messages" => message(s, body),
        _ => chat_completion(body, model, &(s.b.responder)(body)),
    }
}

impl Batch {
    fn status(
        &mut self,
        s: &Shared,
        files: &mut HashMap<String, File>,
        flaky: &mut HashMap<String, u64>,
    ) -> (&'static str, u64) {
        if let Some(o) = &self.outcome {
            return (o.status, o.completed);
        }
        let elapsed = self.created.elapsed();
        if !self.cancelled && elapsed < s.b.validating {
            return ("validating", 0);
        }
        if !self.cancelled && matches!(self.fate, Fate::Hold) {
            return ("in_progress", 0);
        }
        let failing = matches!(self.fate, Fate::Fail(..));
        if !self.cancelled && !failing && elapsed < s.b.validating + s.b.processing {
            let share = (elapsed - s.b.validating).as_secs_f64() / s.b.processing.as_secs_f64().max(1e-9);
            return ("in_progress", (share * self.lines.len() as f64) as u64);
        }
        self.finish(s, files, flaky);
        let o = self.outcome.as_ref().unwrap();
        (o.status, o.completed)
    }

    fn finish(&mut self, s: &Shared, files: &mut HashMap<String, File>, flaky: &mut HashMap<String, u64>) {
        if let Fate::Fail(code, message) = &self.fate {
            self.outcome = Some(Outcome {
                status: "failed",
                output: None,
                errors: None,
                completed: 0,
                failed: 0,
                failure: Some((code.clone(), message.clone())),
            });
            return;
        }
        let n = self.lines.len();
        let expire = match self.fate {
            Fate::Expire(f) => (f * n as f64).round() as usize,
            _ => 0,
        };
        let mut order: Vec<usize> = (0..n).collect();
        if s.b.shuffle {
            // Out of order: odd positions first, then even ones, reversed.
            order.sort_by_key(|i| (i % 2 == 0, std::cmp::Reverse(*i)));
        }
        let (mut out, mut err) = (String::new(), String::new());
        let (mut completed, mut failed) = (0u64, 0u64);
        for i in order {
            let (id, body) = &self.lines[i];
            let line_id = format!("batch_req_{i}");
            // The last `expire` lines of the input did not run in time; a cancelled batch
            // ran the first half.
            let not_run = (self.cancelled && i >= n / 2) || i >= n - expire;
            if not_run {
                failed += 1;
                let code = if self.cancelled { "batch_cancelled" } else { "batch_expired" };
                if self.anthropic {
                    let kind = if self.cancelled { "canceled" } else { "expired" };
                    out.push_str(&serde_json::json!({"custom_id": id, "result": {"type": kind}}).to_string());
                    out.push('\n');
                } else {
                    err.push_str(&serde_json::json!({"id": line_id, "custom_id": id, "response": null,
                        "error": {"code": code, "message": "This request could not be executed before the completion window expired."}}).to_string());
                    err.push('\n');
                }
                continue;
            }
            *s.c.processed.lock().unwrap().entry(id.clone()).or_default() += 1;
            let user = last_user(body);
            let status = if s.b.reject_marker.as_ref().is_some_and(|m| user.contains(m.as_str())) {
                400
            } else if s.b.flaky_marker.as_ref().is_some_and(|m| user.contains(m.as_str())) && {
                let seen = flaky.entry(id.clone()).or_default();
                *seen += 1;
                *seen == 1
            } {
                500
            } else {
                200
            };
            if status == 200 {
                completed += 1;
                *s.c.answered.lock().unwrap().entry(id.clone()).or_default() += 1;
                let answer = answer_line(s, &self.endpoint, body);
                let line = if self.anthropic {
                    serde_json::json!({"custom_id": id, "result": {"type": "succeeded", "message": answer}})
                } else {
                    serde_json::json!({"id": line_id, "custom_id": id, "response": {"status_code": 200, "request_id": format!("req_{i}"), "body": answer}, "error": null})
                };
                out.push_str(&line.to_string());
                out.push('\n');
            } else {
                failed += 1;
                let message = if status == 400 { "this request is not acceptable" } else { "internal error" };
                if self.anthropic {
                    let kind = if status == 400 { "invalid_request_error" } else { "api_error" };
                    out.push_str(&serde_json::json!({"custom_id": id, "result": {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message}}}}).to_string());
                    out.push('\n');
                } else {
                    err.push_str(&serde_json::json!({"id": line_id, "custom_id": id, "response": {"status_code": status, "request_id": format!("req_{i}"), "body": {"error": {"message": message, "type": "invalid_request_error", "code": null}}}, "error": null}).to_string());
                    err.push('\n');
                }
            }
        }
        let mut save = |text: String, name: &str| -> Option<String> {
            if text.is_empty() {
                return None;
            }
            let id = format!("file-{}-{name}", self.id);
            files.insert(
                id.clone(),
                File {
                    filename: format!("{}_{name}.jsonl", self.id),
                    bytes: text.into_bytes(),
                    purpose: "batch_output".into(),
                    created_at: unix(),
                },
            );
            Some(id)
        };
        let output = save(out, "output");
        let errors = save(err, "errors");
        let status = if self.cancelled {
            "cancelled"
        } else if expire > 0 {
            "expired"
        } else {
            "completed"
        };
        self.outcome = Some(Outcome { status, output, errors, completed, failed, failure: None });
    }

    fn openai_json(&self, status: &str, done: u64) -> serde_json::Value {
        let o = self.outcome.as_ref();
        let errors = o.and_then(|o| o.failure.clone()).map(|(code, message)| {
            serde_json::json!({"object": "list", "data": [{"code": code, "message": message, "param": null, "line": null}]})
        });
        serde_json::json!({
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
            "input_file_id": self.input_file_id, "completion_window": "24h", "status": status,
            "output_file_id": o.and_then(|o| o.output.clone()), "error_file_id": o.and_then(|o| o.errors.clone()),
            "created_at": self.created_at,
            "request_counts": {"total": self.lines.len(), "completed": o.map(|o| o.completed).unwrap_or(done), "failed": o.map(|o| o.failed).unwrap_or(0)},
            "metadata": self.metadata,
        })
    }

    fn anthropic_json(&self, addr: &str, status: &str, done: u64) -> serde_json::Value {
        let n = self.lines.len() as u64;
        let ended = self.outcome.is_some();
        let o = self.outcome.as_ref();
        let (succeeded, errored) = o.map(|o| (o.completed, o.failed)).unwrap_or((0, 0));
        let (expired, canceled, errored) = match o.map(|o| o.status) {
            Some("expired") => (errored.min(n), 0, 0),
            Some("cancelled") => (0, errored, 0),
            _ => (0, 0, errored),
        };
        let _ = done;
        let processing = if ended { 0 } else { n };
        let created = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(self.created_at));
        serde_json::json!({
            "id": self.id, "type": "message_batch",
            "processing_status": if ended { "ended" } else if status == "cancelling" { "canceling" } else { "in_progress" },
            "request_counts": {"processing": processing, "succeeded": succeeded, "errored": errored, "canceled": canceled, "expired": expired},
            "created_at": created.to_string(), "expires_at": null, "ended_at": null, "archived_at": null,
            "cancel_initiated_at": if self.cancelled { serde_json::json!(created.to_string()) } else { serde_json::Value::Null },
            "results_url": if ended { serde_json::json!(format!("http://{addr}/v1/messages/batches/{}/results", self.id)) } else { serde_json::Value::Null },
        })
    }
}

fn enqueued(w: &World) -> u64 {
    w.batches.iter().filter(|b| b.outcome.is_none() && !matches!(b.fate, Fate::Fail(..))).map(|b| b.tokens).sum()
}

/// A `multipart/form-data` body: field name → bytes, and the file's name.
type Form = (HashMap<String, Vec<u8>>, Option<String>);

/// Parse `multipart/form-data`.
fn multipart(headers: &HeaderMap, body: &[u8]) -> Option<Form> {
    let ct = headers.get("content-type")?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"').to_string();
    let delim = format!("--{boundary}");
    let mut out = HashMap::new();
    let mut filename = None;
    let text = body;
    let mut pos = 0;
    let find = |hay: &[u8], needle: &[u8], from: usize| -> Option<usize> {
        hay[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
    };
    while let Some(start) = find(text, delim.as_bytes(), pos) {
        let head_start = start + delim.len();
        if text[head_start..].starts_with(b"--") {
            break;
        }
        let head_end = find(text, b"\r\n\r\n", head_start)?;
        let head = String::from_utf8_lossy(&text[head_start..head_end]).to_string();
        let data_start = head_end + 4;
        let next = find(text, format!("\r\n{delim}").as_bytes(), data_start)?;
        let name = head.split("name=\"").nth(1)?.split('"').next()?.to_string();
        if let Some(f) = head.split("filename=\"").nth(1).and_then(|r| r.split('"').next()) {
            filename = Some(f.to_string());
        }
        out.insert(name, text[data_start..next].to_vec());
        pos = next + 2;
    }
    Some((out, filename))
}

async fn upload(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let Some((fields, filename)) = multipart(&headers, &body) else {
        return error(StatusCode::BAD_REQUEST, "expected multipart/form-data");
    };
    let (Some(bytes), Some(purpose)) = (fields.get("file"), fields.get("purpose")) else {
        return error(StatusCode::BAD_REQUEST, "file and purpose are required");
    };
    s.c.uploads_received.fetch_add(1, Ordering::SeqCst);
    let obj = {
        let mut w = s.w.lock().unwrap();
        w.next += 1;
        let id = format!("file-{:04}", w.next);
        let f = File {
            filename: filename.unwrap_or_else(|| "upload.jsonl".into()),
            bytes: bytes.clone(),
            purpose: String::from_utf8_lossy(purpose).to_string(),
            created_at: unix(),
        };
        let obj = file_json(&id, &f);
        w.files.insert(id, f);
        obj
    };
    tokio::time::sleep(s.b.upload_delay).await;
    s.c.uploads.fetch_add(1, Ordering::SeqCst);
    json(StatusCode::OK, obj)
}

fn file_json(id: &str, f: &File) -> serde_json::Value {
    serde_json::json!({"id": id, "object": "file", "bytes": f.bytes.len(), "created_at": f.created_at,
        "filename": f.filename, "purpose": f.purpose})
}

async fn list_files(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let w = s.w.lock().unwrap();
    let mut data: Vec<(String, serde_json::Value)> =
        w.files.iter().map(|(id, f)| (id.clone(), file_json(id, f))).collect();
    data.sort_by(|a, b| a.0.cmp(&b.0));
    let data: Vec<serde_json::Value> = data.into_iter().map(|d| d.1).collect();
    json(StatusCode::OK, serde_json::json!({"object": "list", "data": data, "has_more": false}))
}

async fn get_file(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let w = s.w.lock().unwrap();
    match w.files.get(&id) {
        Some(f) => json(StatusCode::OK, file_json(&id, f)),
        None => error(StatusCode::NOT_FOUND, "no such file"),
    }
}

async fn delete_file(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let removed = s.w.lock().unwrap().files.remove(&id).is_some();
    if removed {
        s.c.deleted_files.fetch_add(1, Ordering::SeqCst);
    }
    json(StatusCode::OK, serde_json::json!({"id": id, "object": "file", "deleted": removed}))
}

async fn file_content(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.contents_requested.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(s.b.content_delay).await;
    let bytes = s.w.lock().unwrap().files.get(&id).map(|f| f.bytes.clone());
    match bytes {
        Some(b) => (StatusCode::OK, [("content-type", "application/octet-stream")], b).into_response(),
        None => error(StatusCode::NOT_FOUND, "no such file"),
    }
}

fn new_batch(
    s: &Shared,
    w: &mut World,
    anthropic: bool,
    input_file_id: String,
    endpoint: String,
    metadata: serde_json::Value,
    lines: Vec<(String, serde_json::Value)>,
) -> usize {
    let index = w.batches.len();
    w.next += 1;
    let id = if anthropic { format!("msgbatch_{:04}", w.next) } else { format!("batch_{:04}", w.next) };
    let tokens: u64 = lines.iter().map(|(_, b)| tokens(b)).sum();
    let mut fate = (s.b.fate)(index);
    if let Some(limit) = s.b.enqueued_limit {
        let now = enqueued(w);
        if now + tokens > limit {
            fate = Fate::Fail(
                "token_limit_exceeded".into(),
                format!("Enqueued token limit reached for the model. Limit: {limit} enqueued tokens."),
            );
        } else {
            s.c.enqueued_max.fetch_max(now + tokens, Ordering::SeqCst);
        }
    }
    s.c.batch_sizes.lock().unwrap().push(lines.len());
    w.batches.push(Batch {
        id,
        anthropic,
        input_file_id,
        endpoint,
        metadata,
        created: Instant::now(),
        created_at: unix(),
        lines,
        fate,
        tokens,
        cancelled: false,
        outcome: None,
    });
    index
}

async fn create_batch(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    let file_id = req["input_file_id"].as_str().unwrap_or_default().to_string();
    let endpoint = req["endpoint"].as_str().unwrap_or_default().to_string();
    let obj = {
        let mut w = s.w.lock().unwrap();
        // Sweep ended batches so the enqueued count is current.
        let World { batches, files, flaky_seen, .. } = &mut *w;
        for b in batches.iter_mut() {
            b.status(&s, files, flaky_seen);
        }
        let Some(f) = w.files.get(&file_id) else {
            return error(StatusCode::BAD_REQUEST, "no such input file");
        };
        let mut lines = Vec::new();
        for (i, l) in String::from_utf8_lossy(&f.bytes).lines().enumerate() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
                return error(StatusCode::BAD_REQUEST, &format!("line {} is not JSON", i + 1));
            };
            if v["url"].as_str() != Some(endpoint.as_str()) || v["method"] != "POST" {
                return error(StatusCode::BAD_REQUEST, &format!("line {}: url or method does not match", i + 1));
            }
            lines.push((v["custom_id"].as_str().unwrap_or_default().to_string(), v["body"].clone()));
        }
        let i = new_batch(&s, &mut w, false, file_id, endpoint, req["metadata"].clone(), lines);
        w.batches[i].openai_json("validating", 0)
    };
    s.c.creates.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(s.b.create_delay).await;
    json(StatusCode::OK, obj)
}

fn find(w: &World, id: &str) -> Option<usize> {
    w.batches.iter().position(|b| b.id == id)
}

async fn retrieve_batch(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.retrieves.fetch_add(1, Ordering::SeqCst);
    let mut w = s.w.lock().unwrap();
    let Some(i) = find(&w, &id) else { return error(StatusCode::NOT_FOUND, "no such batch") };
    let World { batches, files, flaky_seen, .. } = &mut *w;
    let (status, done) = batches[i].status(&s, files, flaky_seen);
    json(StatusCode::OK, batches[i].openai_json(status, done))
}

async fn cancel_batch(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.cancels.fetch_add(1, Ordering::SeqCst);
    let mut w = s.w.lock().unwrap();
    let Some(i) = find(&w, &id) else { return error(StatusCode::NOT_FOUND, "no such batch") };
    if w.batches[i].outcome.is_none() {
        w.batches[i].cancelled = true;
    }
    let World { batches, files, flaky_seen, .. } = &mut *w;
    let (status, done) = batches[i].status(&s, files, flaky_seen);
    let addr = String::new();
    if batches[i].anthropic {
        return json(StatusCode::OK, batches[i].anthropic_json(&addr, status, done));
    }
    json(StatusCode::OK, batches[i].openai_json(status, done))
}

#[derive(serde::Deserialize)]
struct ListQuery {
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    after_id: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

fn page(
    w: &mut World,
    s: &Shared,
    anthropic: bool,
    q: &ListQuery,
    render: impl Fn(&Batch, &str, u64) -> serde_json::Value,
) -> serde_json::Value {
    let World { batches, files, flaky_seen, .. } = w;
    let mut newest_first: Vec<usize> =
        (0..batches.len()).filter(|i| batches[*i].anthropic == anthropic).rev().collect();
    if let Some(after) = q.after.as_ref().or(q.after_id.as_ref())
        && let Some(p) = newest_first.iter().position(|i| batches[*i].id == *after)
    {
        newest_first.drain(..=p);
    }
    let limit = q.limit.unwrap_or(20).max(1);
    let has_more = newest_first.len() > limit;
    newest_first.truncate(limit);
    let data: Vec<serde_json::Value> = newest_first
        .iter()
        .map(|i| {
            let (status, done) = batches[*i].status(s, files, flaky_seen);
            render(&batches[*i], status, done)
        })
        .collect();
    let last = newest_first.last().map(|i| batches[*i].id.clone());
    serde_json::json!({"object": "list", "data": data, "has_more": has_more, "first_id": null, "last_id": last})
}

async fn list_batches(State(s): State<Arc<Shared>>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.lists.fetch_add(1, Ordering::SeqCst);
    let mut w = s.w.lock().unwrap();
    let body = page(&mut w, &s, false, &q, |b, status, done| b.openai_json(status, done));
    json(StatusCode::OK, body)
}

// Anthropic.

async fn messages(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.online.fetch_add(1, Ordering::SeqCst);
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    json(StatusCode::OK, message(&s, &req))
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.online.fetch_add(1, Ordering::SeqCst);
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    let model = req["model"].as_str().unwrap_or_default();
    json(StatusCode::OK, chat_completion(&req, model, &(s.b.responder)(&req)))
}

async fn create_message_batch(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    let Ok(req) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "body is not JSON");
    };
    let Some(requests) = req["requests"].as_array() else {
        return error(StatusCode::BAD_REQUEST, "requests: a list is required");
    };
    let lines: Vec<(String, serde_json::Value)> = requests
        .iter()
        .map(|r| (r["custom_id"].as_str().unwrap_or_default().to_string(), r["params"].clone()))
        .collect();
    let addr = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let obj = {
        let mut w = s.w.lock().unwrap();
        let i = new_batch(&s, &mut w, true, String::new(), "/v1/messages".into(), serde_json::Value::Null, lines);
        w.batches[i].anthropic_json(&addr, "in_progress", 0)
    };
    s.c.creates.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(s.b.create_delay).await;
    json(StatusCode::OK, obj)
}

async fn retrieve_message_batch(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.retrieves.fetch_add(1, Ordering::SeqCst);
    let addr = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let mut w = s.w.lock().unwrap();
    let Some(i) = find(&w, &id) else { return error(StatusCode::NOT_FOUND, "no such batch") };
    let World { batches, files, flaky_seen, .. } = &mut *w;
    let (status, done) = batches[i].status(&s, files, flaky_seen);
    json(StatusCode::OK, batches[i].anthropic_json(&addr, status, done))
}

async fn list_message_batches(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.lists.fetch_add(1, Ordering::SeqCst);
    let addr = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    let mut w = s.w.lock().unwrap();
    let body = page(&mut w, &s, true, &q, |b, status, done| b.anthropic_json(&addr, status, done));
    json(StatusCode::OK, body)
}

async fn message_batch_results(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if let Some(r) = admit(&s, &headers) {
        return r;
    }
    s.c.contents_requested.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(s.b.content_delay).await;
    let w = s.w.lock().unwrap();
    let Some(i) = find(&w, &id) else { return error(StatusCode::NOT_FOUND, "no such batch") };
    let bytes = w.batches[i]
        .outcome
        .as_ref()
        .and_then(|o| o.output.as_ref())
        .and_then(|f| w.files.get(f))
        .map(|f| f.bytes.clone());
    match bytes {
        Some(b) => (StatusCode::OK, [("content-type", "application/x-jsonl")], b).into_response(),
        None => error(StatusCode::NOT_FOUND, "no results yet"),
    }
}

async fn unrouted() -> StatusCode {
    StatusCode::NOT_FOUND
}

pub fn start(b: Behaviour) -> Server {
    start_on(0, b)
}

/// Start on 127.0.0.1:`port` (0 = any free port).
pub fn start_on(port: u16, b: Behaviour) -> Server {
    let counters = Arc::new(Counters::default());
    let shared = Arc::new(Shared { c: counters.clone(), w: Mutex::new(World::default()), b });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let lifetime = shared.b.lifetime;
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/v1/files", post(upload).get(list_files))
                .route("/v1/files/{id}", get(get_file).delete(delete_file))
                .route("/v1/files/{id}/content", get(file_content))
                .route("/v1/batches", post(create_batch).get(list_batches))
                .route("/v1/batches/{id}", get(retrieve_batch))
                .route("/v1/batches/{id}/cancel", post(cancel_batch))
                .route("/v1/chat/completions", post(chat))
                .route("/v1/messages", post(messages))
                .route("/v1/messages/batches", post(create_message_batch).get(list_message_batches))
                .route("/v1/messages/batches/{id}", get(retrieve_message_batch))
                .route("/v1/messages/batches/{id}/cancel", post(cancel_batch))
                .route("/v1/messages/batches/{id}/results", get(message_batch_results))
                .fallback(unrouted)
                // Batch files are up to 200 MB (OpenAI) or 256 MB (Anthropic, inline).
                .layer(axum::extract::DefaultBodyLimit::max(300 << 20))
                .with_state(shared);
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            tokio::select! {
                _ = axum::serve(listener, app) => {}
                _ = rx => {}
                _ = tokio::time::sleep(lifetime) => {}
            }
        });
        rt.shutdown_timeout(Duration::from_millis(100));
    });
    let addr = addr_rx.recv().unwrap();
    Server { addr, counters, stop: Some(tx), thread: Some(thread) }
}
