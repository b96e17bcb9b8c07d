//! The project's loopback OpenAI-compatible test server (127.0.0.1 only, bounded
//! in time). It serves `/v1/chat/completions`, `/v1/completions` (with `echo` +
//! `logprobs`: one token per character, log-probabilities from `token_logprob`) and
//! `/v1/embeddings`, and can inject
//! latency, a requests-per-minute limit answered with 429 + Retry-After, random 429s,
//! 500s, hangs past the client's timeout, malformed JSON, 401 for a wrong key and
//! 404 for an unknown model. It counts requests by body hash and by status.
//! Used by the tests and by `benches/mock_openai.rs` (for `synth bench llm`).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

/// The log-probability of a token given the text before it.
pub type TokenLogprob = Arc<dyn Fn(&str, &str) -> f64 + Send + Sync>;

/// What the server does.
#[derive(Clone)]
pub struct Behaviour {
    pub latency: Duration,
    /// Token bucket: this many requests per minute, burst of one second's worth.
    pub rpm: Option<u32>,
    /// With `rpm`: a strict limiter instead of the bucket, counting the requests it
    /// accepted in the last `window` (a sliding log): one more than `rpm` allows in any
    /// such window is answered 429, as servers that count per window do.
    pub strict_window: Option<Duration>,
    /// Seconds sent in Retry-After with a 429.
    pub retry_after_secs: u64,
    /// With `rpm`: send OpenAI's `x-ratelimit-{limit,remaining,reset}-requests` on every
    /// answer, and an exact `retry-after-ms` (the time until a request is back) with a 429.
    pub advertise_limits: bool,
    pub p_429: f64,
    pub p_500: f64,
    pub p_hang: f64,
    pub hang: Duration,
    pub p_malformed: f64,
    /// The key clients must send (401 otherwise; the message echoes what was sent).
    pub api_key: Option<String>,
    /// Models that exist (404 model_not_found otherwise); empty = any.
    pub models: Vec<String>,
    /// 400 for requests whose last user message contains this text.
    pub reject_marker: Option<String>,
    /// 400 naming `response_format` for any request that has one, as a server without
    /// structured outputs answers (synth then asks in the text protocol).
    pub refuse_structured: bool,
    /// A 429 storm on some requests: those whose last user message contains this text
    /// are refused (429, Retry-After) until this many refusals have been sent.
    pub storm: Option<(String, u64)>,
    /// Answer for a request body.
    pub responder: Arc<dyn Fn(&serde_json::Value) -> String + Send + Sync>,
    pub embedding_dim: usize,
    /// `/v1/completions`: the log-probability of a one-character token after the text before it.
    pub token_logprob: TokenLogprob,
    pub seed: u64,
    /// The server stops by itself after this long.
    pub lifetime: Duration,
    /// The `model` and `system_fingerprint` answers name (default: the requested model,
    /// no fingerprint); changeable while the server runs, as an alias moves to a new snapshot.
    pub served_as: Arc<Mutex<Option<(String, String)>>>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            latency: Duration::ZERO,
            rpm: None,
            strict_window: None,
            retry_after_secs: 1,
            advertise_limits: false,
            p_429: 0.0,
            p_500: 0.0,
            p_hang: 0.0,
            hang: Duration::from_secs(30),
            p_malformed: 0.0,
            api_key: None,
            models: Vec::new(),
            reject_marker: None,
            refuse_structured: false,
            storm: None,
            responder: Arc::new(default_answer),
            embedding_dim: 8,
            token_logprob: Arc::new(|_, _| -1.0),
            seed: 7,
            lifetime: Duration::from_secs(600),
            served_as: Arc::new(Mutex::new(None)),
        }
    }
}

/// "answer to: <start of the last user message>".
pub fn default_answer(body: &serde_json::Value) -> String {
    let last = last_user(body);
    format!("answer to: {}", last.chars().take(60).collect::<String>())
}

pub fn last_user(body: &serde_json::Value) -> String {
    if let Some(prompt) = body["prompt"].as_str() {
        return prompt.to_string();
    }
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[derive(Default)]
pub struct Counters {
    pub total: AtomicU64,
    pub ok: AtomicU64,
    pub s429: AtomicU64,
    /// The most requests the strict limiter held in one window.
    pub max_in_window: AtomicU64,
    pub s500: AtomicU64,
    pub hangs: AtomicU64,
    pub malformed: AtomicU64,
    pub s401: AtomicU64,
    pub s404: AtomicU64,
    pub s400: AtomicU64,
    /// Requests to paths the server does not serve (answered 404 with an empty body).
    pub unrouted: AtomicU64,
    /// body hash -> requests
    pub by_body: Mutex<HashMap<String, u64>>,
    /// body hash -> successful (200) answers
    pub ok_by_body: Mutex<HashMap<String, u64>>,
    /// Requests whose body had already been answered with a 200 (a request repeated
    /// after its success).
    pub repeated_after_ok: AtomicU64,
    /// 429s sent by the storm.
    pub storm_429: AtomicU64,
    /// (time since start, last user message) of every request
    pub log: Mutex<Vec<(Duration, String)>>,
}

struct Shared {
    b: Behaviour,
    c: Arc<Counters>,
    bucket: Mutex<(f64, Instant)>,
    /// Times of the requests the strict limiter accepted within its window.
    accepted: Mutex<std::collections::VecDeque<Instant>>,
    rng: Mutex<u64>,
    started: Instant,
}

/// A running server; dropping it stops it.
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

fn next_unit(shared: &Shared) -> f64 {
    let mut x = shared.rng.lock().unwrap();
    // xorshift64*
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    let v = x.wrapping_mul(0x2545F4914F6CDD1D);
    (v >> 11) as f64 / (1u64 << 53) as f64
}

fn error(status: StatusCode, message: &str, kind: &str, code: Option<&str>) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (status, [("content-type", "application/json")], body.to_string()).into_response()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Completions,
    Embeddings,
}

async fn chat(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, headers, body, Route::Chat).await
}

async fn completions(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, headers, body, Route::Completions).await
}

async fn embeddings(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, headers, body, Route::Embeddings).await
}

/// A text completion: with `echo`, the prompt back with one token per character (the
/// first without a log-probability, as servers answer), then one generated token `.`.
fn completion_body(s: &Shared, json: &serde_json::Value, model: &str) -> serde_json::Value {
    text_completion(json, model, &s.b.token_logprob)
}

/// The body `/v1/completions` answers `json` with (also the batch server's).
pub fn text_completion(json: &serde_json::Value, model: &str, token_logprob: &TokenLogprob) -> serde_json::Value {
    let prompt = json["prompt"].as_str().unwrap_or_default();
    let echo = json["echo"].as_bool().unwrap_or(false);
    let chars: Vec<char> = prompt.chars().collect();
    let (mut tokens, mut logprobs, mut offsets) = (Vec::new(), Vec::new(), Vec::new());
    if echo {
        for (i, c) in chars.iter().enumerate() {
            let before: String = chars[..i].iter().collect();
            tokens.push(c.to_string());
            logprobs.push(if i == 0 { None } else { Some(token_logprob(&before, &c.to_string())) });
            offsets.push(i);
        }
    }
    tokens.push(".".to_string());
    logprobs.push(Some(-0.5));
    offsets.push(if echo { chars.len() } else { 0 });
    let text = if echo { format!("{prompt}.") } else { ".".to_string() };
    serde_json::json!({
        "id": "cmpl-test", "object": "text_completion", "created": 0, "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "length",
                     "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "text_offset": offsets}}],
        "usage": {"prompt_tokens": chars.len(), "completion_tokens": 1, "total_tokens": chars.len() + 1}
    })
}

/// The body `/v1/chat/completions` answers `json` with, given the answer's text (also
/// the batch server's, so batch and online answers are the same bytes).
pub fn chat_completion(json: &serde_json::Value, model: &str, text: &str) -> serde_json::Value {
    let prompt_tokens: usize = json["messages"]
        .as_array()
        .map(|m| m.iter().map(|x| x["content"].as_str().unwrap_or("").len() / 4 + 1).sum())
        .unwrap_or(1);
    serde_json::json!({
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": text.len() / 4 + 1, "total_tokens": prompt_tokens + text.len() / 4 + 1}
    })
}

async fn handle(s: Arc<Shared>, headers: HeaderMap, body: Bytes, route: Route) -> Response {
    let mut advertised = Vec::new();
    let mut r = answer(s, headers, body, route, &mut advertised).await;
    for (k, v) in advertised {
        r.headers_mut().insert(k, v.parse().unwrap());
    }
    r
}

async fn answer(
    s: Arc<Shared>,
    headers: HeaderMap,
    body: Bytes,
    route: Route,
    advertised: &mut Vec<(&'static str, String)>,
) -> Response {
    let c = &s.c;
    c.total.fetch_add(1, Ordering::SeqCst);
    let hash = blake3::hash(&body).to_hex().to_string();
    *c.by_body.lock().unwrap().entry(hash.clone()).or_default() += 1;
    if c.ok_by_body.lock().unwrap().get(&hash).is_some_and(|n| *n > 0) {
        c.repeated_after_ok.fetch_add(1, Ordering::SeqCst);
    }
    let json: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            c.s400.fetch_add(1, Ordering::SeqCst);
            return error(StatusCode::BAD_REQUEST, "body is not JSON", "invalid_request_error", None);
        }
    };
    c.log.lock().unwrap().push((s.started.elapsed(), last_user(&json)));
    if let Some(key) = &s.b.api_key {
        let sent = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if sent != format!("Bearer {key}") {
            c.s401.fetch_add(1, Ordering::SeqCst);
            let shown = sent.strip_prefix("Bearer ").unwrap_or(sent);
            return error(
                StatusCode::UNAUTHORIZED,
                &format!("Incorrect API key provided: {shown}"),
                "invalid_request_error",
                Some("invalid_api_key"),
            );
        }
    }
    let model = json["model"].as_str().unwrap_or_default();
    if !s.b.models.is_empty() && !s.b.models.iter().any(|m| m == model) {
        c.s404.fetch_add(1, Ordering::SeqCst);
        return error(
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` does not exist"),
            "invalid_request_error",
            Some("model_not_found"),
        );
    }
    if s.b.refuse_structured && json.get("response_format").is_some() {
        c.s400.fetch_add(1, Ordering::SeqCst);
        return error(
            StatusCode::BAD_REQUEST,
            "response_format is not supported by this server",
            "invalid_request_error",
            Some("unsupported_parameter"),
        );
    }
    if let Some(marker) = &s.b.reject_marker
        && last_user(&json).contains(marker.as_str())
    {
        c.s400.fetch_add(1, Ordering::SeqCst);
        return error(StatusCode::BAD_REQUEST, "this request is not acceptable", "invalid_request_error", None);
    }
    if let Some((marker, n)) = &s.b.storm
        && last_user(&json).contains(marker.as_str())
        && c.storm_429.fetch_add(1, Ordering::SeqCst) < *n
    {
        c.s429.fetch_add(1, Ordering::SeqCst);
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "Rate limit reached", "requests", Some("rate_limit_exceeded"));
        r.headers_mut().insert("retry-after", "0".parse().unwrap());
        return r;
    }
    // Strict rate limit: at most rpm * window / 60 accepted in any window.
    if let (Some(rpm), Some(window)) = (s.b.rpm, s.b.strict_window) {
        let allowed = (rpm as f64 * window.as_secs_f64() / 60.0).floor() as usize;
        let mut log = s.accepted.lock().unwrap();
        let now = Instant::now();
        while log.front().is_some_and(|t| now.duration_since(*t) >= window) {
            log.pop_front();
        }
        if log.len() >= allowed {
            let wait = log.front().map(|t| window.saturating_sub(now.duration_since(*t))).unwrap_or_default();
            drop(log);
            let mut r = over_the_limit(c);
            r.headers_mut().insert("retry-after-ms", wait.as_millis().to_string().parse().unwrap());
            return r;
        }
        log.push_back(now);
        c.max_in_window.fetch_max(log.len() as u64, Ordering::SeqCst);
    } else if let Some(rpm) = s.b.rpm {
        // Rate limit: token bucket refilled at rpm/60 per second, burst rpm/60.
        let per_sec = rpm as f64 / 60.0;
        let mut bucket = s.bucket.lock().unwrap();
        let now = Instant::now();
        let burst = per_sec.max(1.0);
        bucket.0 = (bucket.0 + now.duration_since(bucket.1).as_secs_f64() * per_sec).min(burst);
        bucket.1 = now;
        let ok = bucket.0 >= 1.0;
        if ok {
            bucket.0 -= 1.0;
        }
        let (level, until_one) = (bucket.0, ((1.0 - bucket.0).max(0.0) / per_sec * 1000.0).ceil() as u64);
        drop(bucket);
        if s.b.advertise_limits {
            advertised.push(("x-ratelimit-limit-requests", rpm.to_string()));
            advertised.push(("x-ratelimit-remaining-requests", (level.floor() as u64).to_string()));
            advertised
                .push(("x-ratelimit-reset-requests", format!("{}ms", ((burst - level) / per_sec * 1000.0).ceil())));
        }
        if !ok {
            if s.b.advertise_limits {
                advertised.push(("retry-after-ms", until_one.to_string()));
            }
            let mut r = over_the_limit(c);
            r.headers_mut().insert("retry-after", s.b.retry_after_secs.to_string().parse().unwrap());
            r.headers_mut().insert(
                "x-ratelimit-reset-requests",
                format!("{}ms", (1000.0 / per_sec).ceil() as u64).parse().unwrap(),
            );
            return r;
        }
    }
    let roll = next_unit(&s);
    let mut edge = s.b.p_429;
    if roll < edge {
        c.s429.fetch_add(1, Ordering::SeqCst);
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "Rate limit reached", "requests", Some("rate_limit_exceeded"));
        r.headers_mut().insert("retry-after", s.b.retry_after_secs.to_string().parse().unwrap());
        return r;
    }
    edge += s.b.p_500;
    if roll < edge {
        c.s500.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response();
    }
    edge += s.b.p_hang;
    if roll < edge {
        c.hangs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(s.b.hang).await;
        return (StatusCode::GATEWAY_TIMEOUT, "hung").into_response();
    }
    if !s.b.latency.is_zero() {
        tokio::time::sleep(s.b.latency).await;
    }
    edge += s.b.p_malformed;
    if roll < edge {
        c.malformed.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::OK, [("content-type", "application/json")], "{\"choices\": [ {\"message\": ")
            .into_response();
    }
    c.ok.fetch_add(1, Ordering::SeqCst);
    *c.ok_by_body.lock().unwrap().entry(hash).or_default() += 1;
    let body = if route == Route::Completions {
        completion_body(&s, &json, model)
    } else if route == Route::Embeddings {
        let inputs: Vec<String> = match &json["input"] {
            serde_json::Value::String(s) => vec![s.clone()],
            serde_json::Value::Array(a) => a.iter().map(|v| v.as_str().unwrap_or_default().to_string()).collect(),
            _ => vec![],
        };
        let data: Vec<serde_json::Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let h = blake3::hash(t.as_bytes());
                let v: Vec<f32> =
                    h.as_bytes().iter().cycle().take(s.b.embedding_dim).map(|b| *b as f32 / 255.0 - 0.5).collect();
                serde_json::json!({"object": "embedding", "index": i, "embedding": v})
            })
            .collect();
        let tokens: usize = inputs.iter().map(|t| t.len() / 4 + 1).sum();
        serde_json::json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
    } else {
        let mut answer = chat_completion(&json, model, &(s.b.responder)(&json));
        if let Some((served, fingerprint)) = s.b.served_as.lock().unwrap().clone() {
            answer["model"] = serde_json::json!(served);
            answer["system_fingerprint"] = serde_json::json!(fingerprint);
        }
        answer
    };
    (StatusCode::OK, [("content-type", "application/json")], body.to_string()).into_response()
}

/// A 429 for a request over the server's rate limit (counted).
fn over_the_limit(c: &Counters) -> Response {
    c.s429.fetch_add(1, Ordering::SeqCst);
    error(StatusCode::TOO_MANY_REQUESTS, "Rate limit reached for requests", "requests", Some("rate_limit_exceeded"))
}

/// Start a server on 127.0.0.1:`port` (0 = any free port) on its own thread.
/// Any other path: an empty 404, as most servers answer a wrong base URL.
async fn unrouted(State(s): State<Arc<Shared>>) -> axum::http::StatusCode {
    s.c.unrouted.fetch_add(1, Ordering::SeqCst);
    axum::http::StatusCode::NOT_FOUND
}

pub fn start_on(port: u16, b: Behaviour) -> Server {
    let counters = Arc::new(Counters::default());
    let shared = Arc::new(Shared {
        bucket: Mutex::new((b.rpm.map(|r| (r as f64 / 60.0).max(1.0)).unwrap_or(0.0), Instant::now())),
        accepted: Mutex::new(Default::default()),
        rng: Mutex::new(b.seed.max(1)),
        started: Instant::now(),
        c: counters.clone(),
        b,
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let lifetime = shared.b.lifetime;
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/v1/chat/completions", post(chat))
                .route("/v1/completions", post(completions))
                .route("/v1/embeddings", post(embeddings))
                .fallback(unrouted)
                .with_state(shared);
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            // Stop at once on request (hung handlers are dropped with the runtime).
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

pub fn start(b: Behaviour) -> Server {
    start_on(0, b)
}
