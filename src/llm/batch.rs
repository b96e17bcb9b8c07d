//! Provider batch APIs: what one batch line carries, the normalised state of a
//! batch, the [`BatchApi`] a provider kind implements (in `synth-providers`: OpenAI's Files
//! and Batches through async-openai, Anthropic Message Batches, a local `vllm run-batch`),
//! including how a result line becomes the same [`ChatResponse`] an online call returns,
//! and [`BatchRoute`]: where the call path
//! (`synth_engine::services`) sends a request that is not cached when a stage runs in batch
//! mode. Every line's `custom_id` is the request's cache key, so results land in the
//! cache under the key an online call would have used.
//!
//! Control calls (upload, create, retrieve, list, download) retry transient failures
//! here ([`with_retries`]); a batch `create` is never retried blindly: the caller looks
//! for the batch first (`find_batch`), since a create whose answer was lost may exist.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::error::{ErrorKind, LlmError};
use super::response::ChatResponse;

/// The online endpoint a batch line stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Endpoint {
    #[serde(rename = "/v1/chat/completions")]
    Chat,
    #[serde(rename = "/v1/completions")]
    Completions,
    #[serde(rename = "/v1/messages")]
    Messages,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Messages => "/v1/messages",
        }
    }
}

/// The body of one request as a batch line carries it, and its endpoint.
#[derive(Debug, Clone)]
pub struct BatchBody {
    pub endpoint: Endpoint,
    pub body: serde_json::Value,
}

/// A request the call path did not send because its stage runs in batch mode.
#[derive(Debug, Clone)]
pub struct Deferred {
    /// The cache key: the line's `custom_id`.
    pub key: String,
    /// The cache document (what the key hashes; stored with the answer).
    pub doc: String,
    pub body: BatchBody,
    /// Estimated prompt tokens (what the enqueued-token limit counts).
    pub tokens_in: u64,
    /// The most prompt tokens it can be (what the cost cap counts).
    pub max_in: u64,
    /// Most completion tokens it may cost (its `max_tokens`, or a default).
    pub max_out: u64,
}

/// What the call path does with a request that is not cached, in batch mode.
#[derive(Debug, Clone)]
pub enum Route {
    /// Hand it to [`BatchRoute::defer`]; the caller gets an [`ErrorKind::Deferred`] error.
    Defer,
    /// Send it online (the batch gave up on it and `batch_fallback = "online"`).
    Online,
    /// The batch gave up on it: the record fails with this error.
    Fail(LlmError),
}

/// Where uncached requests go when a stage runs in batch mode.
pub trait BatchRoute: Send + Sync {
    fn route(&self, key: &str) -> Route;
    fn defer(&self, item: Deferred) -> Result<(), LlmError>;
}

/// The error a deferred call returns.
pub fn deferred() -> LlmError {
    LlmError::new(ErrorKind::Deferred, "waiting for a provider batch")
}

/// The state of a batch, in OpenAI's vocabulary (Anthropic's `in_progress` /
/// `canceling` / `ended` map onto it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    Validating,
    InProgress,
    Finalizing,
    Completed,
    Failed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchState {
    /// No further change: results (if any) can be downloaded.
    pub fn ended(self) -> bool {
        matches!(self, BatchState::Completed | BatchState::Failed | BatchState::Expired | BatchState::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Validating => "validating",
            BatchState::InProgress => "in_progress",
            BatchState::Finalizing => "finalizing",
            BatchState::Completed => "completed",
            BatchState::Failed => "failed",
            BatchState::Expired => "expired",
            BatchState::Cancelling => "cancelling",
            BatchState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<BatchState> {
        serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
    }
}

/// A batch as the provider describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInfo {
    pub id: String,
    pub state: BatchState,
    pub total: u64,
    /// Lines answered (OpenAI `completed`, Anthropic `succeeded`).
    pub completed: u64,
    /// Lines that did not get an answer (errored, expired, cancelled).
    pub failed: u64,
    /// Where the answers are (an output file id, or a results URL).
    pub output: Option<String>,
    /// Where the per-line errors are, when apart from the answers.
    pub errors: Option<String>,
    /// Why a batch failed as a whole: (code, message).
    pub failure: Option<(String, String)>,
    /// Unix seconds.
    pub created_at: u64,
    /// The `synth_part` of its metadata (OpenAI), if any.
    pub part: Option<String>,
}

/// One result line's outcome.
#[derive(Debug, Clone)]
pub enum LineOutcome {
    /// The endpoint's answer body (a chat completion, a text completion, a message),
    /// as its JSON text: parsed once, into the endpoint's own type, by [`BatchApi::answer`].
    Answer(Box<RawValue>),
    /// No answer: why, and whether sending it again may succeed.
    Error { kind: ErrorKind, message: String },
}

impl LineOutcome {
    /// Expired, cancelled, rate-limited or server-side failures are worth another try;
    /// a request the provider rejects (400, 404, 422) is not.
    pub fn retryable(&self) -> bool {
        match self {
            LineOutcome::Answer(_) => false,
            LineOutcome::Error { kind, .. } => kind.retryable(),
        }
    }
}

/// What a part of a stage's requests is to the provider.
#[derive(Debug, Clone)]
pub struct PartRef {
    pub part: String,
    pub stage: String,
    /// A short hash of the output directory, in the batch's metadata (finds orphans).
    pub dir_tag: String,
    pub endpoint: Endpoint,
    /// The part's file of lines.
    pub input: PathBuf,
    pub requests: u64,
    pub bytes: u64,
}

impl PartRef {
    /// The name the input file carries at the provider.
    pub fn filename(&self) -> String {
        format!("synth-{}.jsonl", self.part)
    }
}

/// A provider's batch API.
#[async_trait::async_trait]
pub trait BatchApi: Send + Sync {
    /// `openai`, `anthropic` or `vllm`.
    fn kind(&self) -> &'static str;

    /// One line of a part file; its `custom_id` is `key`.
    fn line(&self, key: &str, body: &BatchBody) -> String;

    /// Upload a part's file; its id (`None`: the API takes requests inline).
    async fn upload(&self, part: &PartRef) -> Result<Option<String>, LlmError>;

    /// A part's file that a stopped process uploaded without journaling its id.
    async fn find_file(&self, part: &PartRef) -> Result<Option<String>, LlmError>;

    /// Submit a part (one batch). Called once per part unless [`BatchApi::find_batch`]
    /// found nothing after a create that may have happened.
    async fn create(&self, part: &PartRef, file: Option<&str>) -> Result<BatchInfo, LlmError>;

    /// A batch of this part created at or after `since` (unix seconds) whose id the
    /// journal does not hold (a create whose answer was lost), not one of `known`.
    async fn find_batch(
        &self,
        part: &PartRef,
        since: u64,
        known: &HashSet<String>,
    ) -> Result<Option<BatchInfo>, LlmError>;

    async fn retrieve(&self, id: &str) -> Result<BatchInfo, LlmError>;

    async fn cancel(&self, id: &str) -> Result<BatchInfo, LlmError>;

    /// An ended batch's result lines (and its error lines, when they are apart), in
    /// memory: they are parsed at once and never saved (a run that stops before
    /// journaling the part done downloads them again; the provider's copy is the durable
    /// one).
    async fn download(&self, info: &BatchInfo) -> Result<Results, LlmError>;

    /// Batches whose metadata names this output directory (`synth batch status --refresh`
    /// lists those its journal does not hold); empty where batches carry no metadata.
    async fn list_tagged(&self, _dir_tag: &str) -> Result<Vec<BatchInfo>, LlmError> {
        Ok(Vec::new())
    }

    /// Remove a file at the provider (after its results are stored); no-op by default.
    async fn delete_file(&self, _id: &str) -> Result<(), LlmError> {
        Ok(())
    }

    /// One result line: its `custom_id` and outcome.
    fn parse_line(&self, line: &str) -> Result<(String, LineOutcome), String>;

    /// The answer body of a line for `endpoint` as the same [`ChatResponse`] the online
    /// call returns; `doc` is the request's cache document (JSON text), read only where
    /// the answer needs it (an answer without usage, a log-likelihood).
    fn answer(&self, endpoint: Endpoint, body: &RawValue, doc: &str, model: &str) -> Result<ChatResponse, LlmError>;

    /// The API's own limits of one batch: (most requests, most bytes of its file).
    fn limits(&self) -> (u64, u64);

    /// When batches are run by the user rather than by synth: what to tell them for
    /// a part (`None`: synth runs them).
    fn external(&self, _part: &PartRef) -> Option<String> {
        None
    }
}

/// A request line in OpenAI's batch input format (also `vllm run-batch`'s), serialized
/// from references (a `json!` value would copy the body first).
pub fn openai_line(key: &str, body: &BatchBody) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        custom_id: &'a str,
        method: &'static str,
        url: &'static str,
        body: &'a serde_json::Value,
    }
    serde_json::to_string(&Line { custom_id: key, method: "POST", url: body.endpoint.path(), body: &body.body })
        .expect("a JSON value serializes")
}

/// A result line in OpenAI's batch output format (also `vllm run-batch`'s).
#[derive(Deserialize)]
struct OpenAiLine {
    custom_id: String,
    #[serde(default)]
    response: Option<OpenAiLineResponse>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct OpenAiLineResponse {
    status_code: u16,
    #[serde(default)]
    body: Option<Box<RawValue>>,
}

/// A result line's non-2xx response.
struct OpenAiErrorResponse {
    status_code: u16,
    body: serde_json::Value,
}

/// Parse one line of an OpenAI-format output or error file.
pub fn parse_openai_line(line: &str) -> Result<(String, LineOutcome), String> {
    let l: OpenAiLine = serde_json::from_str(line).map_err(|e| format!("not a batch result line: {e}"))?;
    let outcome = match (l.response, l.error) {
        (Some(r), _) if (200..300).contains(&r.status_code) => match r.body {
            Some(body) => LineOutcome::Answer(body),
            None => LineOutcome::Error { kind: ErrorKind::Malformed, message: "an answer line without a body".into() },
        },
        (Some(r), _) => {
            let body: serde_json::Value =
                r.body.and_then(|b| serde_json::from_str(b.get()).ok()).unwrap_or(serde_json::Value::Null);
            let r = OpenAiErrorResponse { status_code: r.status_code, body };
            let message = r.body["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| r.body.to_string());
            let code = r.body["error"]["code"].as_str().unwrap_or_default();
            let mut kind = ErrorKind::from_status(r.status_code);
            // A line's auth / not-found error concerns that line, not the run.
            if kind.fatal() || code == "model_not_found" {
                kind = ErrorKind::Rejected;
            }
            LineOutcome::Error { kind, message: format!("HTTP {}: {}", r.status_code, clip(&message)) }
        }
        (None, Some(e)) => {
            let code = e["code"].as_str().unwrap_or_default().to_string();
            let message = e["message"].as_str().unwrap_or_default().to_string();
            // `batch_expired`, `batch_cancelled`, `batch_failed`... are not the line's fault.
            LineOutcome::Error {
                kind: if code.starts_with("batch_") || code.is_empty() {
                    ErrorKind::Server
                } else {
                    ErrorKind::Rejected
                },
                message: clip(&format!("{code}: {message}")),
            }
        }
        (None, None) => LineOutcome::Error {
            kind: ErrorKind::Malformed,
            message: "a result line with neither response nor error".into(),
        },
    };
    Ok((l.custom_id, outcome))
}

fn clip(s: &str) -> String {
    synth_core::secrets::scrub(&s.chars().take(500).collect::<String>())
}

/// The result files of an ended batch, as downloaded.
#[derive(Debug, Default)]
pub struct Results {
    pub output: Option<bytes::Bytes>,
    pub errors: Option<bytes::Bytes>,
}

/// Retry a batch control call (never a create) on transient failures: 429, 5xx,
/// timeouts, resets, malformed answers; exponential backoff with jitter from 0.5 s to
/// 30 s, honouring Retry-After, at most `tries` attempts.
pub async fn with_retries<T, F, Fut>(tries: u32, mut f: F) -> Result<T, LlmError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LlmError>>,
{
    use backoff::backoff::Backoff;
    let mut backoff = backoff::ExponentialBackoff {
        initial_interval: Duration::from_millis(500),
        max_interval: Duration::from_secs(30),
        max_elapsed_time: None,
        ..Default::default()
    };
    let mut n = 0;
    loop {
        n += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if e.kind.retryable() && n < tries.max(1) => {
                let wait = e.retry_after.or_else(|| backoff.next_backoff()).unwrap_or(Duration::from_secs(30));
                tracing::debug!("batch API call failed ({e}); again in {wait:?}");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_of_every_shape() {
        let ok = r#"{"id":"r1","custom_id":"k1","response":{"status_code":200,"request_id":"q","body":{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"model":"m"}},"error":null}"#;
        let (id, o) = parse_openai_line(ok).unwrap();
        assert_eq!(id, "k1");
        let LineOutcome::Answer(body) = o else { panic!("answer") };
        let body: serde_json::Value = serde_json::from_str(body.get()).unwrap();
        assert_eq!(body["choices"][0]["message"]["content"], "hi");

        let rejected =
            r#"{"custom_id":"k2","response":{"status_code":400,"body":{"error":{"message":"bad","code":null}}}}"#;
        let (_, o) = parse_openai_line(rejected).unwrap();
        assert!(!o.retryable(), "{o:?}");
        let server = r#"{"custom_id":"k3","response":{"status_code":500,"body":{"error":{"message":"oops"}}}}"#;
        assert!(parse_openai_line(server).unwrap().1.retryable());
        let expired = r#"{"custom_id":"k4","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}"#;
        let (_, o) = parse_openai_line(expired).unwrap();
        assert!(o.retryable());
        assert!(parse_openai_line("{\"custom_id\":").is_err());
    }

    /// The line is byte for byte what the `json!` value it replaced serialized to.
    #[test]
    fn request_lines_keep_their_bytes() {
        let body =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "é \"q\"\n"}], "stream": false});
        let b = BatchBody { endpoint: Endpoint::Chat, body: body.clone() };
        let old = serde_json::json!({"custom_id": "k1", "method": "POST", "url": "/v1/chat/completions", "body": body});
        assert_eq!(openai_line("k1", &b), old.to_string());
    }

    #[test]
    fn states_and_their_end() {
        assert_eq!(BatchState::parse("in_progress"), Some(BatchState::InProgress));
        assert!(BatchState::Expired.ended() && !BatchState::Finalizing.ended());
        assert_eq!(BatchState::parse("nope"), None);
    }
}
