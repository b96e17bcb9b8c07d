//! The `anthropic` provider over plain HTTP (reqwest): the Messages API online
//! (`POST /v1/messages`) and Message Batches (`POST /v1/messages/batches` with the
//! requests inline, poll `GET /v1/messages/batches/{id}`, results as JSONL at its
//! `results_url`, `POST .../cancel`, `GET /v1/messages/batches` to list). System
//! messages become the top-level `system` text; `stop` becomes `stop_sequences`;
//! `stop_reason` is reported in OpenAI's words (`end_turn` and `stop_sequence` →
//! `stop`, `max_tokens` → `length`), so parsers and outputs do not depend on the
//! provider. Message Batches carry no metadata: a create whose answer was lost is
//! found by listing batches created since, with the part's request count, that no
//! part of the journal holds (see `find_batch`).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::store::batch::PartInfo;
use synth_llm::batch::{
    BatchApi, BatchBody, BatchInfo, BatchState, Endpoint as BatchEndpoint, LineOutcome, PartRef, Results,
};
use synth_llm::endpoint::{ENDPOINT_OPTIONS, resolve_endpoint};
use synth_llm::provider::{
    BATCH_OPTIONS, BatchApiKind, BatchSettings, BuildCtx, GEN_OPTIONS, Provider, ProviderDesc, RateOptions,
    rate_options,
};
use synth_llm::schema::{Form, Negotiation};
use synth_llm::{Call, ChatBackend, ChatRequest, ChatResponse, ErrorKind, GenParams, LlmError, Role, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the Messages API: the default when none is set.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;
const TRIES: u32 = 8;

const RATE: [OptionSpec; 14] = rate_options(
    "600",
    "pace by the limits the server advertises (anthropic-ratelimit-requests-limit / -tokens-limit): the lower of those and the configured ones",
    "retries of 429, 529, 5xx, timeouts, resets, malformed answers",
);

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional(
        "base_url",
        Ty::Str,
        "API base URL, without /v1 (default: $base_url_env, else https://api.anthropic.com)",
    ),
    OptionSpec::default(
        "base_url_env",
        Ty::Str,
        "\"ANTHROPIC_BASE_URL\"",
        "environment variable read when base_url is not set",
    )
    .instead_of(&["base_url"]),
    ENDPOINT_OPTIONS[2],
    ENDPOINT_OPTIONS[3],
    OptionSpec::default("api_key_env", Ty::Str, "\"ANTHROPIC_API_KEY\"", "environment variable holding the API key")
        .runtime_only(),
    OptionSpec::default("anthropic_version", Ty::Str, "\"2023-06-01\"", "the anthropic-version header"),
    OptionSpec::default(
        "structured_output",
        Ty::Enum(&["tool", "none"]),
        "\"tool\"",
        "how a stage's JSON Schema (`schema`) is sent: \"tool\" (a forced tool whose input_schema is the schema; its input is the answer), \"none\" (the text protocol)",
    )
    .runtime_only(),
    GEN_OPTIONS[0],
    GEN_OPTIONS[1],
    OptionSpec::optional(
        "max_tokens",
        POSITIVE,
        "most tokens per answer (the Messages API requires one: default 1024)",
    ),
    GEN_OPTIONS[4],
    GEN_OPTIONS[5],
    RATE[0],
    RATE[1],
    RATE[2],
    RATE[3],
    RATE[4],
    RATE[5],
    RATE[6],
    RATE[7],
    RATE[8],
    RATE[9],
    RATE[10],
    RATE[11],
    RATE[12],
    RATE[13],
    BATCH_OPTIONS[0],
    BATCH_OPTIONS[1],
    BATCH_OPTIONS[2],
    BATCH_OPTIONS[3],
    BATCH_OPTIONS[4],
    BATCH_OPTIONS[5],
    BATCH_OPTIONS[6],
    BATCH_OPTIONS[7],
];

/// The `anthropic` provider kind.
pub static PROVIDER: ProviderDesc = ProviderDesc {
    kind: ProviderKind {
        name: "anthropic",
        about: "Claude through Anthropic's Messages API (plain HTTP), online or as Message Batches",
        options: OPTIONS,
        check: None,
    },
    networked: true,
    identity,
    build,
    with_model: None,
    hub_model: None,
    pin_hub_model: None,
    batch_apis: &[BatchApiKind { name: "anthropic", open: open_batches }],
};

#[derive(Debug, Clone, Deserialize)]
struct AnthropicOptions {
    base_url: Option<String>,
    base_url_env: String,
    model: Option<String>,
    model_env: Option<String>,
    api_key_env: String,
    anthropic_version: String,
    structured_output: String,
    #[serde(flatten)]
    generation: GenParams,
    #[serde(flatten)]
    rate: RateOptions,
}

impl AnthropicOptions {
    /// Base URL (without `/v1`) and model, from the options and the environment.
    fn resolve(&self, name: &str) -> Result<(String, String)> {
        let base_url = self
            .base_url
            .clone()
            .or_else(|| std::env::var(&self.base_url_env).ok().filter(|v| !v.trim().is_empty()))
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let base_url = base_url.trim_end_matches('/').trim_end_matches("/v1").to_string();
        let r = resolve_endpoint(name, &Some(base_url), "", &self.model, &self.model_env, &self.api_key_env)?;
        Ok((r.base_url, r.model))
    }
}

fn identity(decl: &Decl, _root: &Path) -> Result<serde_json::Value> {
    let o: AnthropicOptions = serde_json::from_value(decl.options.clone())?;
    let (base_url, model) = o.resolve(&decl.name)?;
    Ok(
        serde_json::json!({"kind": "anthropic", "base_url": base_url, "model": model, "version": o.anthropic_version, "params": o.generation}),
    )
}

fn build(decl: &Decl, ctx: &BuildCtx) -> Result<Provider> {
    let name = decl.name.as_str();
    let o: AnthropicOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
    let (base_url, model) = o.resolve(name)?;
    let api_key = synth_core::secrets::key_from_env(&o.api_key_env);
    if api_key.is_none() && base_url == DEFAULT_BASE_URL && !ctx.keyless {
        bail!(
            "provider \"{name}\": the environment variable {} is not set (the Anthropic API needs a key)",
            o.api_key_env
        );
    }
    let endpoint = AnthropicEndpoint {
        base_url: base_url.clone(),
        model: model.clone(),
        api_key: api_key.clone(),
        version: o.anthropic_version.clone(),
    };
    let backend = AnthropicChat::new(endpoint.clone()).map_err(|e| anyhow!("provider \"{name}\": {e}"))?;
    let batch: BatchSettings = serde_json::from_value(decl.options.clone()).context("provider batch options")?;
    let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
    let rate = ctx.rates.get(&format!("anthropic|{base_url}|{model}|{key_hash}"), name, o.rate.rate());
    let mut p = Provider::new(name, &PROVIDER, model.clone(), o.generation, Arc::new(backend), rate);
    p.base_url = base_url;
    p.price = o.rate.price(&model);
    p.api_key_env = o.api_key_env.clone();
    p.structured = Negotiation::new(match o.structured_output.as_str() {
        "none" => vec![],
        _ => vec![Form::AnthropicTool],
    });
    Ok(p.with_batch(
        batch,
        "anthropic",
        Box::new(move |_: &BatchSettings, _dir: &Path| -> Result<Arc<dyn BatchApi>> {
            Ok(Arc::new(AnthropicBatches::new(endpoint.clone()).map_err(|e| anyhow!(e))?))
        }),
    ))
}

/// The Message Batches a part was submitted to (`synth batch`).
fn open_batches(i: &PartInfo, api_key: Option<String>, _dir: &Path) -> Result<Arc<dyn BatchApi>> {
    let endpoint = AnthropicEndpoint {
        base_url: i.base_url.clone(),
        model: i.model.clone(),
        api_key,
        version: API_VERSION.into(),
    };
    Ok(Arc::new(AnthropicBatches::new(endpoint).map_err(anyhow::Error::msg)?))
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct AnthropicEndpoint {
    /// Without `/v1` (as Anthropic's SDKs take it).
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub version: String,
}

fn http() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

impl AnthropicEndpoint {
    fn request(&self, http: &reqwest::Client, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let mut r = http.request(method, url).header("anthropic-version", &self.version);
        if let Some(k) = &self.api_key {
            r = r.header("x-api-key", k);
        }
        r
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }
}

/// The JSON body of a Messages request.
pub fn message_body(model: &str, req: &ChatRequest, params: &GenParams) -> serde_json::Value {
    let system: Vec<&str> =
        req.messages.iter().filter(|m| m.role == Role::System).map(|m| m.content.as_str()).collect();
    let messages: Vec<serde_json::Value> = req
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect();
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": params.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
    });
    let obj = body.as_object_mut().expect("object");
    if !system.is_empty() {
        obj.insert("system".into(), system.join("\n\n").into());
    }
    if let Some(t) = params.temperature {
        obj.insert("temperature".into(), t.into());
    }
    if let Some(p) = params.top_p {
        obj.insert("top_p".into(), p.into());
    }
    if let Some(stop) = &params.stop {
        obj.insert("stop_sequences".into(), stop.clone().into());
    }
    for (k, v) in &params.extra {
        obj.insert(k.clone(), v.clone());
    }
    if let Some(st) = &req.structured
        && st.form == Form::AnthropicTool
    {
        // A forced tool: the answer is the tool's input, an object of the schema.
        obj.insert(
            "tools".into(),
            serde_json::json!([{
                "name": st.schema.name,
                "description": "Give your answer through this tool: its input is the answer.",
                "input_schema": st.schema.schema,
            }]),
        );
        obj.insert("tool_choice".into(), serde_json::json!({"type": "tool", "name": st.schema.name}));
    }
    body
}

#[derive(Deserialize)]
struct MessageBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Vec<ContentBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<MessageUsage>,
}

#[derive(Deserialize)]
struct ContentBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    /// A `tool_use` block's input (a structured answer through a forced tool).
    #[serde(default)]
    input: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct MessageUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

/// A Messages answer as a [`ChatResponse`] (online or from a batch's result line).
pub fn message_response(body: serde_json::Value, model: &str) -> Result<ChatResponse, LlmError> {
    let body: MessageBody = serde_json::from_value(body)
        .map_err(|e| LlmError::new(ErrorKind::Malformed, format!("response is not a valid message: {e}")))?;
    // A forced tool's input is the answer (as JSON text, like a structured answer of any
    // provider); otherwise the text blocks.
    let tool_input = body.content.iter().find(|b| b.kind == "tool_use").and_then(|b| b.input.as_ref());
    let text = match tool_input {
        Some(input) => input.to_string(),
        None => {
            let texts: Vec<&str> =
                body.content.iter().filter(|b| b.kind == "text").filter_map(|b| b.text.as_deref()).collect();
            if texts.is_empty() {
                return Err(LlmError::new(ErrorKind::Malformed, "the message has no text content"));
            }
            texts.concat()
        }
    };
    let usage = body
        .usage
        .map(|u| Usage { prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens })
        .unwrap_or_default();
    let finish_reason = match body.stop_reason.as_deref() {
        None | Some("end_turn") | Some("stop_sequence") | Some("tool_use") => "stop".to_string(),
        Some("max_tokens") => "length".to_string(),
        Some(other) => other.to_string(),
    };
    Ok(ChatResponse {
        text,
        finish_reason,
        usage,
        model: body.model.unwrap_or_else(|| model.to_string()),
        system_fingerprint: None,
    })
}

/// Anthropic's error types → our classification (status first: 529 is overload).
fn classify(status: u16, body: &str) -> ErrorKind {
    let kind = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["type"].as_str().map(str::to_string))
        .unwrap_or_default();
    match kind.as_str() {
        "overloaded_error" | "rate_limit_error" => ErrorKind::RateLimited,
        "api_error" => ErrorKind::Server,
        "authentication_error" | "permission_error" => ErrorKind::Auth,
        "not_found_error" => ErrorKind::NotFound,
        "invalid_request_error" | "request_too_large" => ErrorKind::Rejected,
        _ => ErrorKind::from_status(status),
    }
}

fn error_message(status: u16, body: &str) -> String {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect());
    synth_core::secrets::scrub(&format!("HTTP {status}: {}", message.chars().take(500).collect::<String>()))
}

/// Send a request; a 2xx answer's body, else a classified error (with the server's wait).
async fn send(request: reqwest::RequestBuilder) -> Result<Vec<u8>, LlmError> {
    let response = request.send().await.map_err(transport)?;
    let status = response.status().as_u16();
    let retry_after = synth_llm::rate::retry_after(response.headers());
    synth_llm::rate::observe(response.headers());
    let body = response.bytes().await.map_err(transport)?;
    if (200..300).contains(&status) {
        return Ok(body.to_vec());
    }
    let text = String::from_utf8_lossy(&body);
    let mut err = LlmError::new(classify(status, &text), error_message(status, &text));
    err.retry_after = retry_after;
    Err(err)
}

fn transport(e: reqwest::Error) -> LlmError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_decode() || e.is_body() {
        ErrorKind::Malformed
    } else {
        ErrorKind::Connection
    };
    LlmError::new(kind, synth_core::secrets::scrub(&format!("HTTP error: {e}")))
}

fn json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, LlmError> {
    serde_json::from_slice(body).map_err(|e| {
        LlmError::new(
            ErrorKind::Malformed,
            synth_core::secrets::scrub(&format!(
                "{what}: not a valid answer: {e}: {}",
                String::from_utf8_lossy(body).chars().take(200).collect::<String>()
            )),
        )
    })
}

/// The Messages API online.
pub struct AnthropicChat {
    http: reqwest::Client,
    endpoint: AnthropicEndpoint,
}

impl AnthropicChat {
    pub fn new(endpoint: AnthropicEndpoint) -> Result<AnthropicChat, String> {
        Ok(AnthropicChat { http: http()?, endpoint })
    }
}

#[async_trait::async_trait]
impl ChatBackend for AnthropicChat {
    async fn chat_once(&self, req: &ChatRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        let body = message_body(&self.endpoint.model, req, params);
        let e = &self.endpoint;
        let answer = send(e.request(&self.http, reqwest::Method::POST, &e.url("/v1/messages")).json(&body)).await?;
        message_response(json(&answer, "a message")?, &e.model)
    }

    fn batch_body(&self, call: &Call, params: &GenParams) -> Option<BatchBody> {
        match call {
            Call::Chat(req) => Some(BatchBody {
                endpoint: BatchEndpoint::Messages,
                body: message_body(&self.endpoint.model, req, params),
            }),
            Call::Loglik(_) => None,
        }
    }
}

/// Message Batches.
pub struct AnthropicBatches {
    http: reqwest::Client,
    endpoint: AnthropicEndpoint,
}

impl AnthropicBatches {
    pub fn new(endpoint: AnthropicEndpoint) -> Result<AnthropicBatches, String> {
        Ok(AnthropicBatches { http: http()?, endpoint })
    }
}

#[derive(Deserialize, Default)]
struct Counts {
    #[serde(default)]
    processing: u64,
    #[serde(default)]
    succeeded: u64,
    #[serde(default)]
    errored: u64,
    #[serde(default)]
    canceled: u64,
    #[serde(default)]
    expired: u64,
}

#[derive(Deserialize)]
struct MessageBatch {
    id: String,
    processing_status: String,
    #[serde(default)]
    request_counts: Counts,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    results_url: Option<String>,
    #[serde(default)]
    cancel_initiated_at: Option<String>,
}

#[derive(Deserialize)]
struct BatchList {
    #[serde(default)]
    data: Vec<MessageBatch>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

impl MessageBatch {
    fn info(self) -> Result<BatchInfo, LlmError> {
        let c = &self.request_counts;
        let ended_badly = c.errored + c.canceled + c.expired;
        let state = match self.processing_status.as_str() {
            "in_progress" => BatchState::InProgress,
            "canceling" => BatchState::Cancelling,
            "ended" if self.cancel_initiated_at.is_some() => BatchState::Cancelled,
            "ended" if c.expired > 0 => BatchState::Expired,
            "ended" => BatchState::Completed,
            other => {
                return Err(LlmError::new(
                    ErrorKind::Malformed,
                    format!("message batch {}: unknown processing_status \"{other}\"", self.id),
                ));
            }
        };
        let created_at = self
            .created_at
            .as_deref()
            .and_then(|t| humantime::parse_rfc3339_weak(t.split('.').next().unwrap_or(t).trim_end_matches('Z')).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(BatchInfo {
            id: self.id,
            state,
            total: c.processing + c.succeeded + ended_badly,
            completed: c.succeeded,
            failed: ended_badly,
            output: self.results_url,
            errors: None,
            failure: None,
            created_at,
            part: None,
        })
    }
}

#[derive(Deserialize)]
struct ResultLine {
    custom_id: String,
    result: serde_json::Value,
}

#[async_trait::async_trait]
impl BatchApi for AnthropicBatches {
    fn kind(&self) -> &'static str {
        "anthropic"
    }

    fn answer(
        &self,
        endpoint: BatchEndpoint,
        body: &serde_json::value::RawValue,
        _doc: &str,
        model: &str,
    ) -> Result<ChatResponse, LlmError> {
        if endpoint != BatchEndpoint::Messages {
            return Err(LlmError::new(
                ErrorKind::Malformed,
                format!("Message Batches have no {} lines", endpoint.path()),
            ));
        }
        let body = serde_json::from_str(body.get())
            .map_err(|e| LlmError::new(ErrorKind::Malformed, format!("response is not valid JSON: {e}")))?;
        message_response(body, model)
    }

    fn limits(&self) -> (u64, u64) {
        (100_000, 256_000_000)
    }

    fn line(&self, key: &str, body: &BatchBody) -> String {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            custom_id: &'a str,
            params: &'a serde_json::Value,
        }
        serde_json::to_string(&Line { custom_id: key, params: &body.body }).expect("a JSON value serializes")
    }

    async fn upload(&self, _part: &PartRef) -> Result<Option<String>, LlmError> {
        Ok(None)
    }

    async fn find_file(&self, _part: &PartRef) -> Result<Option<String>, LlmError> {
        Ok(None)
    }

    async fn create(&self, part: &PartRef, _file: Option<&str>) -> Result<BatchInfo, LlmError> {
        // The requests go inline: `{"requests": [line, line, ...]}` from the part's lines.
        let lines = std::fs::read(&part.input)
            .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("reading {}: {e}", part.input.display())))?;
        let mut body = Vec::with_capacity(lines.len() + 32);
        body.extend_from_slice(b"{\"requests\":[");
        for (i, line) in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()).enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(line);
        }
        body.extend_from_slice(b"]}");
        let e = &self.endpoint;
        let request = e
            .request(&self.http, reqwest::Method::POST, &e.url("/v1/messages/batches"))
            .header("content-type", "application/json")
            .body(body);
        let answer = send(request).await?;
        json::<MessageBatch>(&answer, "a message batch")?.info()
    }

    async fn find_batch(
        &self,
        part: &PartRef,
        since: u64,
        known: &HashSet<String>,
    ) -> Result<Option<BatchInfo>, LlmError> {
        // No metadata here: a batch created since (allowing for clock skew) with exactly
        // this part's request count, that no journaled part holds; only when exactly one.
        let mut found = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let e = &self.endpoint;
            let mut url = e.url("/v1/messages/batches?limit=100");
            if let Some(a) = &after {
                url.push_str(&format!("&after_id={a}"));
            }
            let answer =
                synth_llm::batch::with_retries(TRIES, || send(e.request(&self.http, reqwest::Method::GET, &url)))
                    .await?;
            let list: BatchList = json(&answer, "a list of message batches")?;
            let mut older = false;
            let last = list.last_id.clone().or_else(|| list.data.last().map(|b| b.id.clone()));
            for b in list.data {
                let info = b.info()?;
                if info.created_at != 0 && info.created_at + 300 < since {
                    older = true;
                    continue;
                }
                if info.total == part.requests && !known.contains(&info.id) {
                    found.push(info);
                }
            }
            match (list.has_more && !older, last) {
                (true, Some(last)) => after = Some(last),
                _ => break,
            }
        }
        Ok(if found.len() == 1 { found.pop() } else { None })
    }

    async fn retrieve(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let e = &self.endpoint;
        let url = e.url(&format!("/v1/messages/batches/{id}"));
        let answer =
            synth_llm::batch::with_retries(TRIES, || send(e.request(&self.http, reqwest::Method::GET, &url))).await?;
        json::<MessageBatch>(&answer, "a message batch")?.info()
    }

    async fn cancel(&self, id: &str) -> Result<BatchInfo, LlmError> {
        let e = &self.endpoint;
        let url = e.url(&format!("/v1/messages/batches/{id}/cancel"));
        let answer =
            synth_llm::batch::with_retries(TRIES, || send(e.request(&self.http, reqwest::Method::POST, &url))).await?;
        json::<MessageBatch>(&answer, "a message batch")?.info()
    }

    async fn download(&self, info: &BatchInfo) -> Result<Results, LlmError> {
        let Some(url) = &info.output else { return Ok(Results::default()) };
        let e = &self.endpoint;
        let answer =
            synth_llm::batch::with_retries(TRIES, || send(e.request(&self.http, reqwest::Method::GET, url))).await?;
        Ok(Results { output: Some(answer.into()), errors: None })
    }

    fn parse_line(&self, line: &str) -> Result<(String, LineOutcome), String> {
        let l: ResultLine = serde_json::from_str(line).map_err(|e| format!("not a batch result line: {e}"))?;
        let r = &l.result;
        let outcome = match r["type"].as_str().unwrap_or_default() {
            "succeeded" => LineOutcome::Answer(
                serde_json::value::to_raw_value(&r["message"]).map_err(|e| format!("not a batch result line: {e}"))?,
            ),
            "errored" => {
                let err = &r["error"]["error"];
                let kind = match err["type"].as_str().unwrap_or_default() {
                    "invalid_request_error" | "request_too_large" | "not_found_error" | "permission_error" => {
                        ErrorKind::Rejected
                    }
                    _ => ErrorKind::Server,
                };
                let message = err["message"].as_str().map(str::to_string).unwrap_or_else(|| r["error"].to_string());
                LineOutcome::Error {
                    kind,
                    message: synth_core::secrets::scrub(&message.chars().take(500).collect::<String>()),
                }
            }
            "canceled" => {
                LineOutcome::Error { kind: ErrorKind::Server, message: "canceled before it was processed".into() }
            }
            "expired" => {
                LineOutcome::Error { kind: ErrorKind::Server, message: "expired (the batch's 24 hours ran out)".into() }
            }
            other => {
                LineOutcome::Error { kind: ErrorKind::Malformed, message: format!("unknown result type \"{other}\"") }
            }
        };
        Ok((l.custom_id, outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use synth_llm::Message;

    #[test]
    fn system_messages_go_to_the_top_and_stop_reasons_read_as_openai() {
        let req = ChatRequest {
            messages: vec![Message::new(Role::System, "be brief"), Message::new(Role::User, "hi")],
            params: GenParams::default(),
            sample: 0,
            expect: "text".into(),
            structured: None,
        };
        let params = GenParams { stop: Some(vec!["END".into()]), ..Default::default() };
        let body = message_body("claude", &req, &params);
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["messages"].as_array().unwrap().len(), 1);
        assert_eq!((body["max_tokens"].as_u64(), &body["stop_sequences"][0]), (Some(1024), &serde_json::json!("END")));
        let answer = serde_json::json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens",
            "usage": {"input_tokens": 5, "output_tokens": 2}, "model": "claude-x"});
        let r = message_response(answer, "claude").unwrap();
        assert_eq!((r.text.as_str(), r.finish_reason.as_str(), r.usage.prompt_tokens), ("ok", "length", 5));
        assert_eq!(
            classify(529, "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}"),
            ErrorKind::RateLimited
        );
        assert_eq!(classify(400, ""), ErrorKind::Rejected);
    }

    #[test]
    fn result_lines() {
        let api = AnthropicBatches::new(AnthropicEndpoint {
            base_url: "http://x".into(),
            model: "m".into(),
            api_key: None,
            version: API_VERSION.into(),
        })
        .unwrap();
        let (id, o) = api.parse_line(r#"{"custom_id":"a","result":{"type":"expired"}}"#).unwrap();
        assert_eq!(id, "a");
        assert!(o.retryable());
        let (_, o) = api
            .parse_line(r#"{"custom_id":"b","result":{"type":"errored","error":{"type":"error","error":{"type":"invalid_request_error","message":"no"}}}}"#)
            .unwrap();
        assert!(!o.retryable());
    }
}
