//! The LLM provider API: the request/response types, the backend trait, the provider
//! descriptor and built provider (`provider`), structured answers (`schema`), the batch
//! API trait, rate control and retries, output parsers, prices, the OpenAI wire format
//! (`openai`: the client, bodies and answers the `openai` kind, vLLM batches, embedders
//! and `synth bench` share), and the `offline` kind for demos and CI. The other kinds
//! (`openai`, `anthropic`, `local`) are the `synth-providers` crate's. The call path every
//! LLM stage goes through (cache lookup, single-flight, journal, rate-limited provider
//! call, durable store; batch mode) is `synth_engine::services`, a layer above.
//!
//! **Invariant:** the only modules that do network I/O are `llm/openai.rs`,
//! `providers/openai/`, `providers/anthropic.rs`, `embed/openai.rs`, `embed/fastembed.rs`
//! (model download), `hub.rs` (with `hub/commit.rs`) and `fetch.rs`;
//! `providers/openai/vllm.rs` runs a local batch command; `providers/local/` reaches the
//! Hub only through `hub.rs`.

pub mod batch;
pub mod endpoint;
pub mod error;
pub mod net;
pub mod offline;
pub mod openai;
pub mod parse;
pub mod pricing;
pub mod provider;
pub mod rate;
pub mod response;
pub mod schema;
pub mod shape;
pub mod slot;

use serde::{Deserialize, Serialize};

pub use self::error::{ErrorKind, LlmError};
pub use self::response::{ChatResponse, Usage};
pub use synth_core::data::chat::Role;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message { role, content: content.into() }
    }
}

/// Generation parameters, as configured on a provider (a stage may override).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenParams {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// Extra body parameters sent as they are (vLLM's `top_k`, `repetition_penalty`...).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty", default)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl GenParams {
    /// `other`'s values where set, ours otherwise.
    pub fn overlay(&self, other: &GenParams) -> GenParams {
        let mut extra = self.extra.clone();
        extra.extend(other.extra.clone());
        GenParams {
            temperature: other.temperature.or(self.temperature),
            top_p: other.top_p.or(self.top_p),
            max_tokens: other.max_tokens.or(self.max_tokens),
            seed: other.seed.or(self.seed),
            stop: other.stop.clone().or_else(|| self.stop.clone()),
            extra,
        }
    }
}

/// A chat request as the provider layer sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub params: GenParams,
    /// Sample index (n samples of the same prompt are distinct cache entries).
    pub sample: u32,
    /// The parser that will read the answer; the offline provider generates that shape.
    pub expect: String,
    /// A structured request: the answer must be a JSON object valid against a schema,
    /// enforced by the provider's structured-output mode (`None`: the text protocol).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured: Option<schema::Structured>,
}

/// A log-likelihood request (lm-evaluation-harness's `loglikelihood`): how likely
/// `continuation` is right after `context`. Sent to an OpenAI-compatible completions
/// endpoint as one prompt with `echo` and `logprobs`; the answer is a [`Loglik`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoglikRequest {
    pub context: String,
    pub continuation: String,
}

/// The answer to a [`LoglikRequest`], carried as JSON in [`ChatResponse::text`] (so it is
/// cached, journaled and priced as any answer).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Loglik {
    /// Sum of the log-probabilities of the continuation's tokens.
    pub logprob: f64,
    /// How many tokens the continuation took (a token straddling the boundary counts).
    pub tokens: u64,
}

impl Loglik {
    pub fn to_text(self) -> String {
        serde_json::to_string(&self).expect("serializable")
    }

    pub fn from_text(text: &str) -> Result<Loglik, String> {
        serde_json::from_str(text).map_err(|e| format!("not a log-likelihood answer ({e}): {text}"))
    }
}

/// What a call asks of a provider.
#[derive(Debug, Clone)]
pub enum Call {
    Chat(ChatRequest),
    Loglik(LoglikRequest),
}

/// A chat-completion backend.
#[async_trait::async_trait]
pub trait ChatBackend: Send + Sync {
    /// One attempt: no retries here (the rate-control layer owns them).
    async fn chat_once(&self, req: &ChatRequest, params: &GenParams) -> Result<ChatResponse, LlmError>;

    /// One log-likelihood attempt (the answer's text is a [`Loglik`] as JSON); a backend
    /// without completions rejects it.
    async fn loglik_once(&self, _req: &LoglikRequest, _params: &GenParams) -> Result<ChatResponse, LlmError> {
        Err(LlmError::new(ErrorKind::Rejected, "this provider cannot score log-likelihoods"))
    }

    /// The body of this call as a batch line carries it (the same body an online call
    /// sends), and the endpoint it goes to; `None` when the backend has no batch API.
    fn batch_body(&self, _call: &Call, _params: &GenParams) -> Option<batch::BatchBody> {
        None
    }

    /// The counters of an in-process engine (`None`: the backend has none): a stage
    /// reports the difference over its run.
    fn engine_stats(&self) -> Option<EngineStats> {
        None
    }
}

/// An in-process engine's counters since it started.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineStats {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Prompt tokens copied from another sequence's cache instead of decoded.
    pub reused_prompt_tokens: u64,
    pub decode_calls: u64,
    pub decode_seconds: f64,
    pub sample_seconds: f64,
    pub load_seconds: f64,
}

/// Rough token count of a text (4 characters per token, as OpenAI's rule of thumb).
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

/// Who is calling, for accounting and cache tagging.
#[derive(Clone)]
pub struct CallCtx {
    pub stage: String,
    pub fingerprint: String,
    pub progress: std::sync::Arc<synth_core::progress::StageProgress>,
    /// Batch mode: where a request that is not in the cache goes instead of the wire
    /// (`None`: online).
    pub batch: Option<std::sync::Arc<dyn batch::BatchRoute>>,
}

impl CallCtx {
    /// An online call context.
    pub fn new(
        stage: &str,
        fingerprint: &str,
        progress: std::sync::Arc<synth_core::progress::StageProgress>,
    ) -> CallCtx {
        CallCtx { stage: stage.to_string(), fingerprint: fingerprint.to_string(), progress, batch: None }
    }

    /// The same caller, with requests routed by `route`.
    pub fn with_batch(&self, route: std::sync::Arc<dyn batch::BatchRoute>) -> CallCtx {
        CallCtx { batch: Some(route), ..self.clone() }
    }
}

/// A finished chat call.
#[derive(Debug, Clone)]
pub struct Completed {
    pub response: ChatResponse,
    pub cached: bool,
    pub retries: u32,
}
