//! The OpenAI wire format and client, shared by the `openai` provider kind
//! (`synth-providers`), vLLM batch files, OpenAI-compatible embedders and `synth bench`:
//! an async-openai client whose retry layer is replaced by a tower service that sends
//! each request exactly once and records the response status and rate-limit headers for
//! the rate-control layer (which owns retries); request bodies built as JSON (`byot`), so
//! any extra body parameter passes through; lenient answer types (compatible servers
//! differ in optional fields); and a batch result line read as the online answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use serde::Deserialize;

use super::batch::{BatchBody, Endpoint as BatchEndpoint};
use super::{
    Call, ChatRequest, ChatResponse, ErrorKind, GenParams, LlmError, Loglik, LoglikRequest, Usage, estimate_tokens,
};

/// Status and headers of the last HTTP response seen in this task.
#[derive(Debug, Clone, Default)]
struct Seen {
    retry_after: Option<Duration>,
    /// HTTP status of the last response (a non-JSON error body hides it from async-openai's error).
    status: Option<u16>,
}

tokio::task_local! {
    static SEEN: Arc<Mutex<Seen>>;
}

/// Run one async-openai call, classifying its error with the status and wait hint the
/// HTTP service saw.
pub async fn observed<T>(call: impl std::future::Future<Output = Result<T, OpenAIError>>) -> Result<T, LlmError> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let result = SEEN.scope(seen.clone(), call).await;
    let (retry_after, status) = {
        let seen = seen.lock().expect("seen");
        (seen.retry_after, seen.status)
    };
    result.map_err(|e| classify(e, retry_after, status))
}

/// Sends each request once (no retries) and records what the retry layer needs.
#[derive(Clone)]
struct OnceService {
    http: reqwest::Client,
}

impl tower::Service<HttpRequestFactory> for OnceService {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let http = self.http.clone();
        Box::pin(async move {
            let request = factory.build().await?;
            let response = http.execute(request).await.map_err(OpenAIError::Reqwest)?;
            let retry_after = super::rate::retry_after(response.headers());
            super::rate::observe(response.headers());
            let status = response.status().as_u16();
            let _ = SEEN.try_with(|seen| {
                let mut seen = seen.lock().expect("seen");
                seen.retry_after = retry_after;
                seen.status = Some(status);
            });
            Ok(response)
        })
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub model: String,
    /// The key itself (read from the environment); never logged or stored.
    pub api_key: Option<String>,
}

/// Build an async-openai client that never retries on its own.
pub fn client(endpoint: &Endpoint) -> Result<Client<OpenAIConfig>, String> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut config = OpenAIConfig::new().with_api_base(endpoint.base_url.trim_end_matches('/'));
    // Always set a key: without one async-openai reads OPENAI_API_KEY by itself.
    config = config.with_api_key(endpoint.api_key.clone().unwrap_or_default());
    // `Client::build` takes our HTTP client (`with_config` would build and discard one).
    Ok(Client::build(http.clone(), config).with_http_service(OnceService { http }))
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    system_fingerprint: Option<String>,
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
    /// A structured request the model declined (OpenAI: content is then null).
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct UsageBody {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// The JSON body of a chat completion request.
pub fn chat_body(model: &str, req: &ChatRequest, params: &GenParams) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": model,
        "messages": req.messages,
        "stream": false,
    });
    let obj = body.as_object_mut().expect("object");
    if let Some(t) = params.temperature {
        obj.insert("temperature".into(), t.into());
    }
    if let Some(p) = params.top_p {
        obj.insert("top_p".into(), p.into());
    }
    if let Some(m) = params.max_tokens {
        obj.insert("max_tokens".into(), m.into());
    }
    if let Some(s) = params.seed {
        // Each sample of a prompt its own seed (sample 0 sends the configured one): `n`
        // samples and `candidates` of one prompt would otherwise be the same answer on a
        // server that honours the seed.
        obj.insert("seed".into(), s.wrapping_add(i64::from(req.sample)).into());
    }
    if let Some(stop) = &params.stop {
        obj.insert("stop".into(), stop.clone().into());
    }
    for (k, v) in &params.extra {
        obj.insert(k.clone(), v.clone());
    }
    if let Some(st) = &req.structured
        && let Some(format) = st.form.response_format(&st.schema)
    {
        obj.insert("response_format".into(), format);
    }
    body
}

/// An error of a structured request that names the form's parameters is the server
/// refusing the form (llama-cpp-python answers `json_schema` with a 500, not a 400): never
/// retried, so the stage can move to the next form or the text protocol.
fn refused_form(req: &ChatRequest, mut err: LlmError) -> LlmError {
    if let Some(st) = &req.structured
        && matches!(err.kind, ErrorKind::Rejected | ErrorKind::Server)
        && st.form.refused_by(&err.message)
    {
        err.kind = ErrorKind::Rejected;
    }
    err
}

/// Map an async-openai error to our classification (with the server's wait hint).
pub fn classify(e: OpenAIError, retry_after: Option<Duration>, status: Option<u16>) -> LlmError {
    let scrub = synth_core::secrets::scrub;
    let mut err = match e {
        // An error status whose body async-openai could not read (a proxy's HTML page, an
        // empty 404 from a wrong base URL): the status decides, not the body.
        OpenAIError::JSONDeserialize(_, content) if status.is_some_and(|s| s >= 400) => {
            let status = status.expect("checked");
            let body = content.chars().take(200).collect::<String>();
            let hint =
                if status == 404 { " (is the base URL right? it should end where /chat/completions goes)" } else { "" };
            LlmError::new(ErrorKind::from_status(status), scrub(&format!("HTTP {status}{hint}: {body}")))
        }
        OpenAIError::ApiError(api) => {
            let status = api.status_code.as_u16();
            let code = api.api_error.code.clone().unwrap_or_default();
            let mut kind = ErrorKind::from_status(status);
            if code == "model_not_found" {
                kind = ErrorKind::NotFound;
            }
            if status == 429 && code == "insufficient_quota" {
                kind = ErrorKind::Auth;
            }
            let msg = api.api_error.message.chars().take(500).collect::<String>();
            LlmError::new(kind, scrub(&format!("HTTP {status}: {msg}")))
        }
        OpenAIError::JSONDeserialize(e, content) => LlmError::new(
            ErrorKind::Malformed,
            scrub(&format!(
                "response is not a valid completion: {e}: {}",
                content.chars().take(200).collect::<String>()
            )),
        ),
        OpenAIError::Reqwest(e) => {
            let kind = if e.is_timeout() {
                ErrorKind::Timeout
            } else if let Some(status) = e.status() {
                ErrorKind::from_status(status.as_u16())
            } else if e.is_decode() || e.is_body() {
                ErrorKind::Malformed
            } else {
                ErrorKind::Connection
            };
            LlmError::new(kind, scrub(&format!("HTTP error: {}", error_chain(&e))))
        }
        other => LlmError::new(ErrorKind::Connection, scrub(&other.to_string())),
    };
    err.retry_after = retry_after;
    err
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// One chat completion attempt of `model` (no retries: the rate-control layer owns them).
pub async fn chat_once(
    client: &Client<OpenAIConfig>,
    model: &str,
    req: &ChatRequest,
    params: &GenParams,
) -> Result<ChatResponse, LlmError> {
    let body = chat_body(model, req, params);
    let body: CompletionBody = observed(client.chat().create_byot(body)).await.map_err(|e| refused_form(req, e))?;
    completion(body, model, || Usage {
        prompt_tokens: req.messages.iter().map(|m| estimate_tokens(&m.content)).sum(),
        completion_tokens: 0,
    })
}

/// One log-likelihood attempt through `/completions` (echo and logprobs).
pub async fn loglik_once(
    client: &Client<OpenAIConfig>,
    model: &str,
    req: &LoglikRequest,
    params: &GenParams,
) -> Result<ChatResponse, LlmError> {
    let body = loglik_body(model, req, params);
    let body: TextCompletionBody = observed(client.completions().create_byot(body)).await?;
    text_completion(body, req, model)
}

/// A call's body as a batch line carries it, and its endpoint.
pub fn batch_body(model: &str, call: &Call, params: &GenParams) -> BatchBody {
    match call {
        Call::Chat(req) => BatchBody { endpoint: BatchEndpoint::Chat, body: chat_body(model, req, params) },
        Call::Loglik(req) => BatchBody { endpoint: BatchEndpoint::Completions, body: loglik_body(model, req, params) },
    }
}

/// The answer of an OpenAI-format batch line as the same [`ChatResponse`] the online call
/// returns. `doc` is the request's cache document (JSON text), read only where the answer
/// needs it: a chat answer without usage (its prompt tokens are estimated), a
/// log-likelihood (its request).
pub fn answer_line(
    endpoint: BatchEndpoint,
    body: &serde_json::value::RawValue,
    doc: &str,
    model: &str,
) -> Result<ChatResponse, LlmError> {
    let doc = || serde_json::from_str::<serde_json::Value>(doc).unwrap_or_default();
    match endpoint {
        BatchEndpoint::Chat => {
            let estimate = || Usage {
                prompt_tokens: doc()["messages"]
                    .as_array()
                    .map(|m| m.iter().map(|x| estimate_tokens(x["content"].as_str().unwrap_or_default())).sum())
                    .unwrap_or(1),
                completion_tokens: 0,
            };
            chat_response(body.get(), model, estimate)
        }
        BatchEndpoint::Completions => {
            let req: LoglikRequest = serde_json::from_value(doc()["loglik"].take()).map_err(|e| {
                LlmError::new(ErrorKind::Malformed, format!("the cached request is not a log-likelihood request: {e}"))
            })?;
            let body = serde_json::from_str(body.get())
                .map_err(|e| LlmError::new(ErrorKind::Malformed, format!("response is not valid JSON: {e}")))?;
            loglik_response(body, &req, model)
        }
        other => {
            Err(LlmError::new(ErrorKind::Malformed, format!("an OpenAI-format batch has no {} lines", other.path())))
        }
    }
}

/// A chat completion body (a batch result line's, as JSON text) as a [`ChatResponse`];
/// `estimate` gives the usage when the server reports none (the completion tokens are
/// then estimated from the text).
pub fn chat_response(body: &str, model: &str, estimate: impl FnOnce() -> Usage) -> Result<ChatResponse, LlmError> {
    let body = serde_json::from_str(body).map_err(|e| {
        LlmError::new(
            ErrorKind::Malformed,
            synth_core::secrets::scrub(&format!("response is not a valid completion: {e}")),
        )
    })?;
    completion(body, model, estimate)
}

fn from_value<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, LlmError> {
    serde_json::from_value(body).map_err(|e| {
        LlmError::new(
            ErrorKind::Malformed,
            synth_core::secrets::scrub(&format!("response is not a valid completion: {e}")),
        )
    })
}

fn completion(body: CompletionBody, model: &str, estimate: impl FnOnce() -> Usage) -> Result<ChatResponse, LlmError> {
    let Some(choice) = body.choices.into_iter().next() else {
        return Err(LlmError::new(ErrorKind::Malformed, "response has no choices"));
    };
    if let (None, Some(refusal)) = (&choice.message.content, &choice.message.refusal) {
        // Asking again gives the same refusal: the record fails with the model's words.
        let refusal = refusal.chars().take(500).collect::<String>();
        return Err(LlmError::new(ErrorKind::Rejected, format!("the model refused: {refusal}")));
    }
    let Some(text) = choice.message.content else {
        return Err(LlmError::new(ErrorKind::Malformed, "response message has no content"));
    };
    let usage = match body.usage {
        Some(u) => Usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens },
        None => Usage { completion_tokens: estimate_tokens(&text), ..estimate() },
    };
    Ok(ChatResponse {
        text,
        finish_reason: choice.finish_reason.unwrap_or_else(|| "stop".into()),
        usage,
        model: body.model.unwrap_or_else(|| model.to_string()),
        system_fingerprint: body.system_fingerprint,
    })
}

/// A completions body with echoed log-probabilities as the [`ChatResponse`] of a
/// log-likelihood request (its text is the [`Loglik`] as JSON).
pub fn loglik_response(body: serde_json::Value, req: &LoglikRequest, model: &str) -> Result<ChatResponse, LlmError> {
    text_completion(from_value(body)?, req, model)
}

fn text_completion(body: TextCompletionBody, req: &LoglikRequest, model: &str) -> Result<ChatResponse, LlmError> {
    let Some(lp) = body.choices.into_iter().next().and_then(|c| c.logprobs) else {
        return Err(LlmError::new(ErrorKind::Malformed, "response has no choice with logprobs"));
    };
    let view = LogprobsView { tokens: &lp.tokens, token_logprobs: &lp.token_logprobs, text_offset: &lp.text_offset };
    let ll = continuation_logprob(req, &view).map_err(|m| LlmError::new(ErrorKind::Malformed, m))?;
    let usage = match body.usage {
        Some(u) => Usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens },
        None => Usage { prompt_tokens: lp.tokens.len() as u64, completion_tokens: 0 },
    };
    Ok(ChatResponse {
        text: ll.to_text(),
        finish_reason: "loglik".into(),
        usage,
        model: body.model.unwrap_or_else(|| model.to_string()),
        system_fingerprint: body.system_fingerprint,
    })
}

/// A completions answer with echoed log-probabilities.
#[derive(Deserialize)]
struct TextCompletionBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    system_fingerprint: Option<String>,
    choices: Vec<TextChoice>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct TextChoice {
    #[serde(default)]
    logprobs: Option<Logprobs>,
}

#[derive(Deserialize)]
struct Logprobs {
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    token_logprobs: Vec<Option<f64>>,
    #[serde(default)]
    text_offset: Vec<usize>,
}

/// The JSON body of a log-likelihood request: the context and continuation as one
/// prompt, echoed with the log-probability of every prompt token (lm-eval's
/// `local-completions` sends the same: `echo`, `logprobs = 1`, `max_tokens = 1`,
/// temperature 0).
pub fn loglik_body(model: &str, req: &LoglikRequest, params: &GenParams) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": model,
        "prompt": format!("{}{}", req.context, req.continuation),
        "echo": true,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0.0,
    });
    let obj = body.as_object_mut().expect("object");
    if let Some(s) = params.seed {
        obj.insert("seed".into(), s.into());
    }
    for (k, v) in &params.extra {
        obj.insert(k.clone(), v.clone());
    }
    body
}

/// Sum the log-probabilities of the echoed tokens that overlap the continuation
/// (character offsets `text_offset`, as OpenAI and vLLM report them; the generated
/// token after the prompt is left out).
pub fn continuation_logprob(req: &LoglikRequest, lp: &LogprobsView<'_>) -> Result<Loglik, String> {
    let start = req.context.chars().count();
    let end = start + req.continuation.chars().count();
    let n = lp.text_offset.len();
    if lp.token_logprobs.len() != n || lp.tokens.len() != n {
        return Err(format!(
            "logprobs has {} tokens, {} log-probabilities and {} offsets",
            lp.tokens.len(),
            lp.token_logprobs.len(),
            n
        ));
    }
    let mut sum = 0.0;
    let mut tokens = 0u64;
    for i in 0..n {
        let from = lp.text_offset[i];
        let to = if i + 1 < n { lp.text_offset[i + 1] } else { from + lp.tokens[i].chars().count() };
        if from >= end || to <= start {
            continue;
        }
        let Some(v) = lp.token_logprobs[i] else {
            return Err(format!("token {i} of the continuation has no log-probability (is echo supported?)"));
        };
        sum += v;
        tokens += 1;
    }
    if tokens == 0 {
        return Err(format!(
            "no echoed token covers characters {start}..{end} of the prompt (does the server echo the prompt?)"
        ));
    }
    Ok(Loglik { logprob: sum, tokens })
}

/// The parts of a `logprobs` object [`continuation_logprob`] reads.
pub struct LogprobsView<'a> {
    pub tokens: &'a [String],
    pub token_logprobs: &'a [Option<f64>],
    pub text_offset: &'a [usize],
}

/// One chat completion with a bare reqwest client: no retries, cache, journal or
/// async-openai, for `synth bench llm --baseline` (the machine's floor to compare with).
/// Returns whether the server answered 2xx with a JSON body that has choices.
pub async fn bare_chat(http: &reqwest::Client, base_url: &str, key: &str, body: &serde_json::Value) -> bool {
    let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
    let Ok(response) = http.post(url).bearer_auth(key).json(body).send().await else { return false };
    if !response.status().is_success() {
        return false;
    }
    response.json::<CompletionBody>().await.is_ok_and(|b| !b.choices.is_empty())
}

/// Embeddings over the same client (TEI, vLLM or OpenAI `/embeddings`).
pub struct OpenAiEmbed {
    client: Client<OpenAIConfig>,
    endpoint: Endpoint,
}

#[derive(Deserialize)]
struct EmbeddingBody {
    data: Vec<EmbeddingItem>,
    #[serde(default)]
    usage: Option<UsageBody>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

impl OpenAiEmbed {
    pub fn new(endpoint: Endpoint) -> Result<OpenAiEmbed, String> {
        Ok(OpenAiEmbed { client: client(&endpoint)?, endpoint })
    }

    /// One attempt for a batch of texts; vectors in input order, and prompt tokens.
    pub async fn embed_once(
        &self,
        texts: &[String],
        dimensions: Option<usize>,
    ) -> Result<(Vec<Vec<f32>>, u64), LlmError> {
        let mut body = serde_json::json!({"model": self.endpoint.model, "input": texts, "encoding_format": "float"});
        if let Some(d) = dimensions {
            body["dimensions"] = d.into();
        }
        let body: EmbeddingBody = observed(self.client.embeddings().create_byot(body)).await?;
        if body.data.len() != texts.len() {
            return Err(LlmError::new(
                ErrorKind::Malformed,
                format!("asked for {} embeddings, got {}", texts.len(), body.data.len()),
            ));
        }
        let mut items = body.data;
        items.sort_by_key(|i| i.index.unwrap_or(0));
        let tokens =
            body.usage.map(|u| u.prompt_tokens).unwrap_or_else(|| texts.iter().map(|t| estimate_tokens(t)).sum());
        Ok((items.into_iter().map(|i| i.embedding).collect(), tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answer_line_reads_as_the_online_answer() {
        let body = serde_json::value::RawValue::from_string(
            r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"model":"m"}"#.into(),
        )
        .unwrap();
        let r = answer_line(BatchEndpoint::Chat, &body, "{}", "x").unwrap();
        assert_eq!((r.text.as_str(), r.usage.prompt_tokens, r.model.as_str()), ("hi", 3, "m"));
        // Without usage, the prompt tokens are estimated from the cached request's messages.
        let bare = serde_json::value::RawValue::from_string(
            r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}"#.into(),
        )
        .unwrap();
        let doc = r#"{"messages":[{"role":"user","content":"a question of some length here"}]}"#;
        let r = answer_line(BatchEndpoint::Chat, &bare, doc, "x").unwrap();
        assert!(r.usage.prompt_tokens > 1, "{:?}", r.usage);
        assert!(answer_line(BatchEndpoint::Completions, &bare, "{}", "x").is_err());
        assert!(answer_line(BatchEndpoint::Messages, &bare, "{}", "x").is_err());
    }

    #[test]
    fn continuation_tokens_by_offset() {
        let req = LoglikRequest { context: "答案：".into(), continuation: "A".into() };
        let toks = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // "答案", "：", "A", then the generated token.
        let tokens = toks(&["答案", "：", "A", "\n"]);
        let lps = [None, Some(-1.0), Some(-0.25), Some(-3.0)];
        let view = LogprobsView { tokens: &tokens, token_logprobs: &lps, text_offset: &[0, 2, 3, 4] };
        assert_eq!(continuation_logprob(&req, &view).unwrap(), Loglik { logprob: -0.25, tokens: 1 });
        // A token straddling the boundary (": A" merged) counts for the continuation.
        let req2 = LoglikRequest { context: "x:".into(), continuation: " A".into() };
        let tokens2 = toks(&["x", ": A"]);
        let view2 = LogprobsView { tokens: &tokens2, token_logprobs: &[None, Some(-2.0)], text_offset: &[0, 1] };
        assert_eq!(continuation_logprob(&req2, &view2).unwrap(), Loglik { logprob: -2.0, tokens: 1 });
        // Nothing echoed past the context: malformed.
        let tokens3 = toks(&["答案"]);
        let view3 = LogprobsView { tokens: &tokens3, token_logprobs: &[None], text_offset: &[0] };
        assert!(continuation_logprob(&req, &view3).is_err());
        let body = loglik_body("m", &req, &GenParams::default());
        assert_eq!(body["prompt"], "答案：A");
        assert_eq!(
            (body["echo"].as_bool(), body["logprobs"].as_i64(), body["max_tokens"].as_i64()),
            (Some(true), Some(1), Some(1))
        );
    }
}
