//! Chat provider kinds (`openai`, `anthropic`, `offline`): their option schemas, their
//! identity (what their answers depend on, for fingerprints and cache keys), their
//! batch settings, and how a checked declaration becomes a [`Provider`].

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::anthropic::{AnthropicChat, AnthropicEndpoint};
use super::batch::{BatchApi, Endpoint as LineEndpoint};
use super::endpoint::{DEFAULT_BASE_URL, ENDPOINT_OPTIONS, resolve_endpoint};
use super::offline::{Offline, OfflineShape};
use super::openai::{Endpoint, OpenAiChat};
use super::pricing::{Price, default_price};
use super::rate::{RateConfig, RateControl, RateRegistry};
use super::schema::{Form, Negotiation};
use super::{
    ChatBackend, ChatRequest, ChatResponse, ErrorKind, GenParams, LlmError, LoglikRequest, Usage, estimate_tokens,
};
use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{NUMBER, OptionSpec, POSITIVE, RATIO, Ty, UINT};

/// Options of the batch API, shared by the `openai` and `anthropic` kinds (none
/// changes an answer: batch and online calls share cache keys).
const BATCH_OPTIONS: [OptionSpec; 10] = [
    OptionSpec::default(
        "batch",
        Ty::Bool,
        "false",
        "stages on this provider send their uncached requests through its batch API (half price, answers within 24 h) unless they set `batch` themselves",
    )
    .runtime_only(),
    OptionSpec::default(
        "batch_fallback",
        Ty::Enum(&["batch", "online"]),
        "\"batch\"",
        "what happens to lines a batch did not answer (expired, failed, cancelled, server errors): \"batch\" resubmits them in a new batch (up to batch_attempts), \"online\" sends them online at once",
    )
    .runtime_only(),
    OptionSpec::default("batch_attempts", POSITIVE, "3", "batches a request may go through before its record fails")
        .runtime_only(),
    OptionSpec::default("batch_poll_seconds", NUMBER, "60", "seconds between polls of running batches (with jitter)")
        .runtime_only(),
    OptionSpec::optional(
        "batch_max_requests",
        POSITIVE,
        "most requests per batch (default: the API's limit, 50,000 for OpenAI, 100,000 for Anthropic)",
    )
    .runtime_only(),
    OptionSpec::optional(
        "batch_max_bytes",
        POSITIVE,
        "largest batch file in bytes (default: the API's limit, 200 MB for OpenAI, 256 MB for Anthropic)",
    )
    .runtime_only(),
    OptionSpec::optional(
        "batch_enqueued_tokens",
        POSITIVE,
        "the model's enqueued-token limit (prompt tokens of batches not yet ended): batches are submitted in waves that stay under it",
    )
    .runtime_only(),
    OptionSpec::default("batch_price_factor", NUMBER, "0.5", "batch price as a share of the online price").runtime_only(),
    OptionSpec::default(
        "batch_delete_files",
        Ty::Bool,
        "true",
        "delete a batch's input, output and error files at the provider once its answers are stored",
    )
    .runtime_only(),
    OptionSpec::default("batch_completion_window", Ty::Str, "\"24h\"", "the batch's completion window").runtime_only(),
];

const GEN_OPTIONS: [OptionSpec; 6] = [
    OptionSpec::optional("temperature", Ty::Float(0.0, 2.0), "sampling temperature"),
    OptionSpec::optional("top_p", RATIO, "nucleus sampling"),
    OptionSpec::optional("max_tokens", POSITIVE, "most tokens per answer"),
    OptionSpec::optional(
        "seed",
        Ty::Int(i64::MIN, i64::MAX),
        "server-side sampling seed (sample k of a prompt, `n` or `candidates`, sends seed + k)",
    ),
    OptionSpec::optional("stop", Ty::StrList, "stop sequences"),
    OptionSpec::optional("extra", Ty::Map(&Ty::Any), "extra body parameters, sent as they are"),
];

const OPENAI_OPTIONS: &[OptionSpec] = &[
    ENDPOINT_OPTIONS[0],
    ENDPOINT_OPTIONS[1],
    ENDPOINT_OPTIONS[2],
    ENDPOINT_OPTIONS[3],
    ENDPOINT_OPTIONS[4],
    GEN_OPTIONS[0],
    GEN_OPTIONS[1],
    GEN_OPTIONS[2],
    GEN_OPTIONS[3],
    GEN_OPTIONS[4],
    GEN_OPTIONS[5],
    OptionSpec::default(
        "structured_output",
        Ty::Enum(&["auto", "openai", "vllm", "llama_cpp", "none"]),
        "\"auto\"",
        "how a stage's JSON Schema (`schema`) is sent: \"openai\" (response_format json_schema, strict when the schema allows), \"vllm\" (json_schema without strict), \"llama_cpp\" (response_format json_object + schema: llama-server, llama-cpp-python), \"auto\" (openai, then llama_cpp when the server refuses it), \"none\" (the server has no structured mode: the text protocol)",
    )
    .runtime_only(),
    OptionSpec::optional(
        "cache_identity",
        Ty::Str,
        "stands for the base URL in cache keys and fingerprints (e.g. \"openai:gpt-4o\"): set it to move a pipeline behind a proxy or to another region of the same provider without paying again; only where both URLs serve the same model",
    ),
    OptionSpec::optional("requests_per_minute", POSITIVE, "client-side request limit").runtime_only(),
    OptionSpec::optional("tokens_per_minute", POSITIVE, "client-side token limit (prompt estimate + max_tokens)")
        .runtime_only(),
    OptionSpec::default(
        "learn_limits",
        Ty::Bool,
        "true",
        "pace by the limits the server advertises (x-ratelimit-limit-requests / -tokens): the lower of those and the configured ones",
    )
    .runtime_only(),
    OptionSpec::default("max_concurrency", POSITIVE, "16", "most requests in flight").runtime_only(),
    OptionSpec::default("initial_concurrency", POSITIVE, "4", "requests in flight at start (grows on success)")
        .runtime_only(),
    OptionSpec::default("timeout_seconds", NUMBER, "120", "per-request timeout").runtime_only(),
    OptionSpec::default("max_retries", UINT, "8", "retries of 429, 5xx, timeouts, resets, malformed answers")
        .runtime_only(),
    OptionSpec::default("backoff_initial_ms", POSITIVE, "500", "first retry delay (doubles, with jitter)")
        .runtime_only(),
    OptionSpec::default("backoff_max_seconds", NUMBER, "60", "longest retry delay").runtime_only(),
    OptionSpec::default("breaker_after_seconds", NUMBER, "120", "continuous failure that opens the circuit breaker")
        .runtime_only(),
    OptionSpec::default("breaker_pause_seconds", NUMBER, "30", "pause while the breaker is open").runtime_only(),
    OptionSpec::default("breaker_max_trips", UINT, "5", "trips in a row after which the run stops").runtime_only(),
    OptionSpec::optional("price_input_per_mtok", NUMBER, "USD per million prompt tokens (default: known models)")
        .runtime_only(),
    OptionSpec::optional("price_output_per_mtok", NUMBER, "USD per million completion tokens").runtime_only(),
    BATCH_OPTIONS[0],
    BATCH_OPTIONS[1],
    BATCH_OPTIONS[2],
    BATCH_OPTIONS[3],
    BATCH_OPTIONS[4],
    BATCH_OPTIONS[5],
    BATCH_OPTIONS[6],
    BATCH_OPTIONS[7],
    BATCH_OPTIONS[8],
    BATCH_OPTIONS[9],
    OptionSpec::default(
        "batch_api",
        Ty::Enum(&["openai", "vllm"]),
        "\"openai\"",
        "\"openai\": the server's Files and Batches API (OpenAI and compatible providers); \"vllm\": write the batch file for `vllm run-batch` and run `batch_command` on it (or tell you which command to run)",
    )
    .runtime_only(),
    OptionSpec::optional(
        "batch_command",
        Ty::StrList,
        "with batch_api = \"vllm\": the command that answers a batch file, `{input}`, `{output}` and `{model}` replaced (e.g. [\"vllm\", \"run-batch\", \"-i\", \"{input}\", \"-o\", \"{output}\", \"--model\", \"{model}\"]); unset: synth says which command to run and stops until its output exists",
    )
    .runtime_only(),
];

const ANTHROPIC_OPTIONS: &[OptionSpec] = &[
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
    OptionSpec::optional("requests_per_minute", POSITIVE, "client-side request limit").runtime_only(),
    OptionSpec::optional("tokens_per_minute", POSITIVE, "client-side token limit (prompt estimate + max_tokens)")
        .runtime_only(),
    OptionSpec::default(
        "learn_limits",
        Ty::Bool,
        "true",
        "pace by the limits the server advertises (anthropic-ratelimit-requests-limit / -tokens-limit): the lower of those and the configured ones",
    )
    .runtime_only(),
    OptionSpec::default("max_concurrency", POSITIVE, "16", "most requests in flight").runtime_only(),
    OptionSpec::default("initial_concurrency", POSITIVE, "4", "requests in flight at start (grows on success)")
        .runtime_only(),
    OptionSpec::default("timeout_seconds", NUMBER, "600", "per-request timeout").runtime_only(),
    OptionSpec::default("max_retries", UINT, "8", "retries of 429, 529, 5xx, timeouts, resets, malformed answers")
        .runtime_only(),
    OptionSpec::default("backoff_initial_ms", POSITIVE, "500", "first retry delay (doubles, with jitter)")
        .runtime_only(),
    OptionSpec::default("backoff_max_seconds", NUMBER, "60", "longest retry delay").runtime_only(),
    OptionSpec::default("breaker_after_seconds", NUMBER, "120", "continuous failure that opens the circuit breaker")
        .runtime_only(),
    OptionSpec::default("breaker_pause_seconds", NUMBER, "30", "pause while the breaker is open").runtime_only(),
    OptionSpec::default("breaker_max_trips", UINT, "5", "trips in a row after which the run stops").runtime_only(),
    OptionSpec::optional("price_input_per_mtok", NUMBER, "USD per million prompt tokens (default: known models)")
        .runtime_only(),
    OptionSpec::optional("price_output_per_mtok", NUMBER, "USD per million completion tokens").runtime_only(),
    BATCH_OPTIONS[0],
    BATCH_OPTIONS[1],
    BATCH_OPTIONS[2],
    BATCH_OPTIONS[3],
    BATCH_OPTIONS[4],
    BATCH_OPTIONS[5],
    BATCH_OPTIONS[6],
    BATCH_OPTIONS[7],
];

const OFFLINE_OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("model", Ty::Str, "\"offline\"", "name recorded in outputs"),
    OptionSpec::default("seed", Ty::Int(i64::MIN, i64::MAX), "0", "generator seed"),
    OptionSpec::default("score_one", RATIO, "0.7", "probability that a judge score is 1"),
    GEN_OPTIONS[0],
    GEN_OPTIONS[1],
    GEN_OPTIONS[2],
    GEN_OPTIONS[4],
    GEN_OPTIONS[5],
    OptionSpec::default("max_concurrency", POSITIVE, "64", "most requests in flight").runtime_only(),
];

pub static OPENAI: ProviderKind = ProviderKind {
    name: "openai",
    about: "chat completions on any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM, TGI)",
    options: OPENAI_OPTIONS,
    check: None,
};
pub static OFFLINE: ProviderKind = ProviderKind {
    name: "offline",
    about: "deterministic generator without network, for demos and CI (its output is not training data)",
    options: OFFLINE_OPTIONS,
    check: None,
};

pub static ANTHROPIC: ProviderKind = ProviderKind {
    name: "anthropic",
    about: "Claude through Anthropic's Messages API (plain HTTP), online or as Message Batches",
    options: ANTHROPIC_OPTIONS,
    check: None,
};

pub static LOCAL: ProviderKind = ProviderKind {
    name: "local",
    about: "a GGUF model run inside synth through llama.cpp: continuous batching, JSON-Schema constrained decoding, the model's chat template, log-likelihoods",
    options: super::local::OPTIONS,
    check: Some(super::local::check),
};

pub static PROVIDER_KINDS: &[&ProviderKind] = &[&OPENAI, &ANTHROPIC, &LOCAL, &OFFLINE];

/// A provider's batch settings (the `batch_*` options).
#[derive(Debug, Clone, Deserialize)]
pub struct BatchSettings {
    /// Stages use batch mode unless they say otherwise.
    #[serde(rename = "batch")]
    pub default_on: bool,
    #[serde(rename = "batch_fallback")]
    pub fallback: String,
    #[serde(rename = "batch_attempts")]
    pub attempts: u32,
    #[serde(rename = "batch_poll_seconds")]
    pub poll_seconds: f64,
    #[serde(rename = "batch_max_requests")]
    pub max_requests: Option<u64>,
    #[serde(rename = "batch_max_bytes")]
    pub max_bytes: Option<u64>,
    #[serde(rename = "batch_enqueued_tokens")]
    pub enqueued_tokens: Option<u64>,
    #[serde(rename = "batch_price_factor")]
    pub price_factor: f64,
    #[serde(rename = "batch_delete_files", default)]
    pub delete_files: bool,
    #[serde(rename = "batch_completion_window", default = "default_window")]
    pub completion_window: String,
    #[serde(rename = "batch_api", default)]
    pub api: Option<String>,
    #[serde(rename = "batch_command", default)]
    pub command: Option<Vec<String>>,
}

fn default_window() -> String {
    "24h".into()
}

/// What a provider's batch API is built from (its key is read once, with the provider's).
enum BatchTarget {
    OpenAi(Endpoint),
    Anthropic(AnthropicEndpoint),
}

impl BatchSettings {
    /// The API limits: (most requests, most bytes) per batch.
    pub fn limits(&self, api: &str) -> (u64, u64) {
        let (n, bytes) = if api == "anthropic" { (100_000, 256_000_000) } else { (50_000, 200_000_000) };
        (self.max_requests.unwrap_or(n), self.max_bytes.unwrap_or(bytes))
    }
}

#[derive(Debug, Clone, Deserialize)]
struct OpenAiOptions {
    base_url: Option<String>,
    base_url_env: String,
    model: Option<String>,
    model_env: Option<String>,
    api_key_env: String,
    #[serde(flatten)]
    generation: GenParams,
    structured_output: String,
    cache_identity: Option<String>,
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    learn_limits: bool,
    max_concurrency: usize,
    initial_concurrency: usize,
    timeout_seconds: f64,
    max_retries: u32,
    backoff_initial_ms: u64,
    backoff_max_seconds: f64,
    breaker_after_seconds: f64,
    breaker_pause_seconds: f64,
    breaker_max_trips: u32,
    price_input_per_mtok: Option<f64>,
    price_output_per_mtok: Option<f64>,
}

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
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    learn_limits: bool,
    max_concurrency: usize,
    initial_concurrency: usize,
    timeout_seconds: f64,
    max_retries: u32,
    backoff_initial_ms: u64,
    backoff_max_seconds: f64,
    breaker_after_seconds: f64,
    breaker_pause_seconds: f64,
    breaker_max_trips: u32,
    price_input_per_mtok: Option<f64>,
    price_output_per_mtok: Option<f64>,
}

impl AnthropicOptions {
    /// Base URL (without `/v1`) and model, from the options and the environment.
    fn resolve(&self, name: &str) -> Result<(String, String)> {
        let base_url = self
            .base_url
            .clone()
            .or_else(|| std::env::var(&self.base_url_env).ok().filter(|v| !v.trim().is_empty()))
            .unwrap_or_else(|| super::anthropic::DEFAULT_BASE_URL.to_string());
        let base_url = base_url.trim_end_matches('/').trim_end_matches("/v1").to_string();
        let r = resolve_endpoint(name, &Some(base_url), "", &self.model, &self.model_env, &self.api_key_env)?;
        Ok((r.base_url, r.model))
    }

    fn rate(&self) -> RateConfig {
        RateConfig {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            max_concurrency: self.max_concurrency,
            initial_concurrency: self.initial_concurrency,
            timeout: Duration::from_secs_f64(self.timeout_seconds.max(0.001)),
            max_retries: self.max_retries,
            backoff_initial: Duration::from_millis(self.backoff_initial_ms),
            backoff_max: Duration::from_secs_f64(self.backoff_max_seconds.max(0.001)),
            breaker_after: Duration::from_secs_f64(self.breaker_after_seconds.max(0.001)),
            breaker_pause: Duration::from_secs_f64(self.breaker_pause_seconds.max(0.001)),
            breaker_max_trips: self.breaker_max_trips,
            learn_limits: self.learn_limits,
            limit_share: 1.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct OfflineOptions {
    model: String,
    seed: i64,
    score_one: f64,
    #[serde(flatten)]
    generation: GenParams,
    max_concurrency: usize,
}

/// A built chat provider.
pub struct Provider {
    pub name: String,
    pub kind: &'static str,
    pub base_url: String,
    pub model: String,
    pub params: GenParams,
    pub backend: Arc<dyn ChatBackend>,
    /// The `local` provider's backend (its engine's counters), besides `backend`.
    pub local: Option<Arc<super::local::LocalChat>>,
    pub rate: Arc<RateControl>,
    pub price: Option<Price>,
    /// What else an offline provider's answers depend on (its seed and `score_one`): part of
    /// every cache key, so two offline providers never share answers.
    pub offline_identity: Option<serde_json::Value>,
    /// `cache_identity`: replaces the base URL in cache keys and fingerprints.
    pub cache_identity: Option<String>,
    /// The environment variable its key is read from (recorded with its batches, never the key).
    pub api_key_env: String,
    /// Its structured-output forms, and which one it is at.
    pub structured: Negotiation,
    /// Batch settings (`None`: the kind has no batch API, e.g. `offline`).
    pub batch: Option<BatchSettings>,
    batch_target: Option<BatchTarget>,
    batch_api: OnceLock<Arc<dyn BatchApi>>,
    /// Prompt tokens of this provider's batches submitted and not yet ended, over every
    /// stage of the run (the enqueued-token limit is the model's, not a stage's).
    pub batch_enqueued: AtomicU64,
}

/// The endpoint's field of an identity or cache document: the base URL, or the
/// `cache_identity` that stands for it. Second in every document (serde_json keeps key
/// order here), so documents without a `cache_identity` keep the bytes, and the keys,
/// they always had.
fn endpoint<'a>(base_url: &'a str, cache_identity: Option<&'a str>) -> (&'static str, &'a str) {
    match cache_identity {
        Some(id) => ("cache_identity", id),
        None => ("base_url", base_url),
    }
}

impl Provider {
    /// The model's name in cache documents: a `local` model is its file's content (the
    /// `cache_identity`), whatever the file is called.
    fn key_model(&self) -> &str {
        if self.kind == "local" { "" } else { &self.model }
    }

    /// Whether calls leave the process (and so run on the network runtime).
    pub fn networked(&self) -> bool {
        networked_kind(self.kind)
    }
}

/// Whether a provider kind's calls leave the process.
pub fn networked_kind(kind: &str) -> bool {
    kind == "openai" || kind == "anthropic"
}

impl Provider {
    /// The name of its batch API (`openai`, `anthropic`, `vllm`), when it has one.
    pub fn batch_api_kind(&self) -> Option<&'static str> {
        let settings = self.batch.as_ref()?;
        Some(match (&self.batch_target, settings.api.as_deref()) {
            (Some(BatchTarget::Anthropic(_)), _) => "anthropic",
            (_, Some("vllm")) => "vllm",
            (Some(BatchTarget::OpenAi(_)), _) => "openai",
            (None, _) => return None,
        })
    }

    /// Its batch API (built once; `dir` holds the part files, which the local API runs on).
    pub fn batch_api(&self, dir: &Path) -> Result<Arc<dyn BatchApi>> {
        if let Some(api) = self.batch_api.get() {
            return Ok(api.clone());
        }
        let settings = self.batch.as_ref().ok_or_else(|| anyhow!("provider \"{}\" has no batch API", self.name))?;
        let api: Arc<dyn BatchApi> = match (&self.batch_target, self.batch_api_kind()) {
            (_, Some("vllm")) => {
                let command = settings.command.clone().unwrap_or_default();
                Arc::new(super::local_batch::LocalBatch::new(command, &self.model, dir))
            }
            (Some(BatchTarget::OpenAi(e)), _) => Arc::new(
                super::openai_batch::OpenAiBatches::new(e.clone(), &settings.completion_window)
                    .map_err(|e| anyhow!("provider \"{}\": {e}", self.name))?,
            ),
            (Some(BatchTarget::Anthropic(e)), _) => Arc::new(
                super::anthropic::AnthropicBatches::new(e.clone())
                    .map_err(|e| anyhow!("provider \"{}\": {e}", self.name))?,
            ),
            (None, _) => bail!("provider \"{}\" has no batch API", self.name),
        };
        Ok(self.batch_api.get_or_init(|| api).clone())
    }
}

impl Provider {
    /// What a provider's answers depend on, without building it (for fingerprints).
    pub fn identity(decl: &Decl, root: &Path) -> Result<serde_json::Value> {
        let name = decl.name.as_str();
        Ok(match decl.kind.as_str() {
            "local" => {
                let o: super::local::LocalOptions = serde_json::from_value(decl.options.clone())?;
                super::local::identity(&o, root)
            }
            "openai" => {
                let o: OpenAiOptions = serde_json::from_value(decl.options.clone())?;
                let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
                let (field, value) = endpoint(&r.base_url, o.cache_identity.as_deref());
                serde_json::json!({"kind": "openai", field: value, "model": r.model, "params": o.generation})
            }
            "anthropic" => {
                let o: AnthropicOptions = serde_json::from_value(decl.options.clone())?;
                let (base_url, model) = o.resolve(name)?;
                serde_json::json!({"kind": "anthropic", "base_url": base_url, "model": model, "version": o.anthropic_version, "params": o.generation})
            }
            _ => {
                let o: OfflineOptions = serde_json::from_value(decl.options.clone())?;
                serde_json::json!({"kind": "offline", "model": o.model, "seed": o.seed, "score_one": o.score_one, "params": o.generation})
            }
        })
    }

    /// Build a provider from its checked declaration; `shapes` are what the offline
    /// provider can imitate, `rates` shares one controller per endpoint, model and key.
    pub fn build(
        decl: &Decl,
        root: &Path,
        rates: &RateRegistry,
        shapes: &Arc<[&'static OfflineShape]>,
    ) -> Result<Provider> {
        Provider::build_with(decl, root, rates, shapes, false)
    }

    /// [`Provider::build`]; `keyless`: a provider whose API needs a key builds without it
    /// (`--dry-run`'s estimate counts its calls and sends none).
    pub fn build_with(
        decl: &Decl,
        root: &Path,
        rates: &RateRegistry,
        shapes: &Arc<[&'static OfflineShape]>,
        keyless: bool,
    ) -> Result<Provider> {
        let name = decl.name.as_str();
        let provider = match decl.kind.as_str() {
            "local" => {
                let o: super::local::LocalOptions =
                    serde_json::from_value(decl.options.clone()).context("provider options")?;
                let built = super::local::build(&o, root, name)?;
                // An in-process model: no limits to learn, nothing to retry (its errors are the
                // request's or the engine's), and a request waits for its turn however long
                // the queue (a timeout would send it again beside the one still decoding).
                let cfg = RateConfig {
                    max_concurrency: o.max_concurrency,
                    initial_concurrency: o.max_concurrency,
                    timeout: Duration::from_secs(7 * 24 * 3600),
                    max_retries: 0,
                    learn_limits: false,
                    ..Default::default()
                };
                let rate = rates.get(&format!("local|{name}|{}", built.cache_identity), name, cfg);
                Provider {
                    name: name.to_string(),
                    kind: "local",
                    base_url: built.path.display().to_string(),
                    model: built.backend.name.clone(),
                    params: o.generation,
                    local: Some(built.backend.clone()),
                    backend: built.backend,
                    rate,
                    price: Some(Price { input: 0.0, output: 0.0 }),
                    offline_identity: None,
                    // The model's content stands for its path in cache keys.
                    cache_identity: Some(built.cache_identity),
                    api_key_env: String::new(),
                    structured: Negotiation::new(vec![Form::Grammar]),
                    batch: None,
                    batch_target: None,
                    batch_api: OnceLock::new(),
                    batch_enqueued: AtomicU64::new(0),
                }
            }
            "openai" => {
                let o: OpenAiOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
                let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
                let api_key = synth_core::secrets::key_from_env(&o.api_key_env);
                if api_key.is_none() && r.base_url == DEFAULT_BASE_URL && !keyless {
                    bail!(
                        "provider \"{name}\": the environment variable {} is not set (the OpenAI API needs a key)",
                        o.api_key_env
                    );
                }
                let endpoint =
                    Endpoint { base_url: r.base_url.clone(), model: r.model.clone(), api_key: api_key.clone() };
                let backend = OpenAiChat::new(endpoint.clone()).map_err(|e| anyhow!("provider \"{name}\": {e}"))?;
                let batch: BatchSettings =
                    serde_json::from_value(decl.options.clone()).context("provider batch options")?;
                let cfg = RateConfig {
                    requests_per_minute: o.requests_per_minute,
                    tokens_per_minute: o.tokens_per_minute,
                    max_concurrency: o.max_concurrency,
                    initial_concurrency: o.initial_concurrency,
                    timeout: Duration::from_secs_f64(o.timeout_seconds.max(0.001)),
                    max_retries: o.max_retries,
                    backoff_initial: Duration::from_millis(o.backoff_initial_ms),
                    backoff_max: Duration::from_secs_f64(o.backoff_max_seconds.max(0.001)),
                    breaker_after: Duration::from_secs_f64(o.breaker_after_seconds.max(0.001)),
                    breaker_pause: Duration::from_secs_f64(o.breaker_pause_seconds.max(0.001)),
                    breaker_max_trips: o.breaker_max_trips,
                    learn_limits: o.learn_limits,
                    ..Default::default()
                };
                let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
                let rate = rates.get(&format!("openai|{}|{}|{key_hash}", r.base_url, r.model), name, cfg);
                let price = match (o.price_input_per_mtok, o.price_output_per_mtok) {
                    (None, None) => default_price(&r.model),
                    (i, out) => Some(Price { input: i.unwrap_or(0.0), output: out.unwrap_or(0.0) }),
                };
                Provider {
                    name: name.to_string(),
                    kind: "openai",
                    base_url: r.base_url,
                    model: r.model,
                    params: o.generation,
                    backend: Arc::new(backend),
                    local: None,
                    rate,
                    price,
                    offline_identity: None,
                    cache_identity: o.cache_identity.clone(),
                    api_key_env: o.api_key_env.clone(),
                    structured: Negotiation::new(match o.structured_output.as_str() {
                        "openai" => vec![Form::OpenAi],
                        "vllm" => vec![Form::Vllm],
                        "llama_cpp" => vec![Form::LlamaCpp],
                        "none" => vec![],
                        _ => vec![Form::OpenAi, Form::LlamaCpp],
                    }),
                    batch: Some(batch),
                    batch_target: Some(BatchTarget::OpenAi(endpoint)),
                    batch_api: OnceLock::new(),
                    batch_enqueued: AtomicU64::new(0),
                }
            }
            "anthropic" => {
                let o: AnthropicOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
                let (base_url, model) = o.resolve(name)?;
                let api_key = synth_core::secrets::key_from_env(&o.api_key_env);
                if api_key.is_none() && base_url == super::anthropic::DEFAULT_BASE_URL && !keyless {
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
                let batch: BatchSettings =
                    serde_json::from_value(decl.options.clone()).context("provider batch options")?;
                let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
                let rate = rates.get(&format!("anthropic|{base_url}|{model}|{key_hash}"), name, o.rate());
                let price = match (o.price_input_per_mtok, o.price_output_per_mtok) {
                    (None, None) => default_price(&model),
                    (i, out) => Some(Price { input: i.unwrap_or(0.0), output: out.unwrap_or(0.0) }),
                };
                Provider {
                    name: name.to_string(),
                    kind: "anthropic",
                    base_url,
                    model,
                    params: o.generation,
                    backend: Arc::new(backend),
                    local: None,
                    rate,
                    price,
                    offline_identity: None,
                    cache_identity: None,
                    api_key_env: o.api_key_env.clone(),
                    structured: Negotiation::new(match o.structured_output.as_str() {
                        "none" => vec![],
                        _ => vec![Form::AnthropicTool],
                    }),
                    batch: Some(batch),
                    batch_target: Some(BatchTarget::Anthropic(endpoint)),
                    batch_api: OnceLock::new(),
                    batch_enqueued: AtomicU64::new(0),
                }
            }
            "offline" => {
                let o: OfflineOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
                let cfg = RateConfig {
                    max_concurrency: o.max_concurrency,
                    initial_concurrency: o.max_concurrency,
                    ..Default::default()
                };
                let rate = rates.get(&format!("offline|{name}"), name, cfg);
                let backend = Offline { seed: o.seed as u64, score_one: o.score_one, shapes: shapes.clone() };
                Provider {
                    name: name.to_string(),
                    kind: "offline",
                    base_url: String::new(),
                    model: o.model,
                    params: o.generation,
                    backend: Arc::new(backend),
                    local: None,
                    rate,
                    price: Some(Price { input: 0.0, output: 0.0 }),
                    offline_identity: Some(serde_json::json!({"seed": o.seed, "score_one": o.score_one})),
                    cache_identity: None,
                    api_key_env: String::new(),
                    // A stand-in answers in the parser's text shape: no structured mode.
                    structured: Negotiation::new(vec![]),
                    batch: None,
                    batch_target: None,
                    batch_api: OnceLock::new(),
                    batch_enqueued: AtomicU64::new(0),
                }
            }
            other => bail!("provider \"{name}\": unknown kind \"{other}\""),
        };
        Ok(provider)
    }

    /// The cache key of a request: everything that determines the answer.
    pub fn request_doc(provider: &Provider, req: &ChatRequest, params: &GenParams) -> serde_json::Value {
        let (field, value) = endpoint(&provider.base_url, provider.cache_identity.as_deref());
        let mut doc = serde_json::json!({
            "kind": provider.kind,
            field: value,
            "model": provider.key_model(),
            "messages": req.messages,
            "params": params,
            "sample": req.sample,
        });
        if provider.kind == "offline" {
            // The offline generator's answer depends on the expected shape.
            doc["expect"] = req.expect.clone().into();
        }
        if let Some(id) = &provider.offline_identity {
            doc["offline"] = id.clone();
        }
        if let Some(structured) = &req.structured {
            // The schema (and its name) decide the answer; the form it travels in does not.
            doc["structured"] = serde_json::to_value(structured).expect("serializable");
        }
        doc
    }

    /// The cache document of a log-likelihood request (no `messages`, so it never equals a chat's).
    pub fn loglik_doc(provider: &Provider, req: &super::LoglikRequest, params: &GenParams) -> serde_json::Value {
        let (field, value) = endpoint(&provider.base_url, provider.cache_identity.as_deref());
        serde_json::json!({
            "kind": provider.kind,
            field: value,
            "model": provider.key_model(),
            "loglik": req,
            "seed": params.seed,
            "extra": params.extra,
            "offline": provider.offline_identity,
        })
    }
}

/// The answer of a line as the same [`ChatResponse`] the online call returns. `doc`
/// is the request's cache document (a log-likelihood answer needs its text).
/// `doc` is the request's cache document (JSON text), read only where the answer needs
/// it: a chat answer without usage (its prompt tokens are estimated), a log-likelihood.
pub fn answer_response(
    endpoint: LineEndpoint,
    body: &serde_json::value::RawValue,
    doc: &str,
    model: &str,
) -> Result<ChatResponse, LlmError> {
    let doc = || serde_json::from_str::<serde_json::Value>(doc).unwrap_or_default();
    match endpoint {
        LineEndpoint::Chat => {
            let estimate = || Usage {
                prompt_tokens: doc()["messages"]
                    .as_array()
                    .map(|m| m.iter().map(|x| estimate_tokens(x["content"].as_str().unwrap_or_default())).sum())
                    .unwrap_or(1),
                completion_tokens: 0,
            };
            super::openai::chat_response(body.get(), model, estimate)
        }
        LineEndpoint::Completions => {
            let req: LoglikRequest = serde_json::from_value(doc()["loglik"].take()).map_err(|e| {
                LlmError::new(ErrorKind::Malformed, format!("the cached request is not a log-likelihood request: {e}"))
            })?;
            let body = serde_json::from_str(body.get())
                .map_err(|e| LlmError::new(ErrorKind::Malformed, format!("response is not valid JSON: {e}")))?;
            super::openai::loglik_response(body, &req, model)
        }
        LineEndpoint::Messages => {
            let body = serde_json::from_str(body.get())
                .map_err(|e| LlmError::new(ErrorKind::Malformed, format!("response is not valid JSON: {e}")))?;
            super::anthropic::message_response(body, model)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_answer_line_reads_as_the_online_answer() {
        let body = serde_json::value::RawValue::from_string(
            r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"model":"m"}"#.into(),
        )
        .unwrap();
        let r = answer_response(LineEndpoint::Chat, &body, "{}", "x").unwrap();
        assert_eq!((r.text.as_str(), r.usage.prompt_tokens, r.model.as_str()), ("hi", 3, "m"));
        // Without usage, the prompt tokens are estimated from the cached request's messages.
        let bare = serde_json::value::RawValue::from_string(
            r#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}"#.into(),
        )
        .unwrap();
        let doc = r#"{"messages":[{"role":"user","content":"a question of some length here"}]}"#;
        let r = answer_response(LineEndpoint::Chat, &bare, doc, "x").unwrap();
        assert!(r.usage.prompt_tokens > 1, "{:?}", r.usage);
        assert!(answer_response(LineEndpoint::Completions, &bare, "{}", "x").is_err());
    }

    use super::*;

    #[test]
    fn without_a_cache_identity_documents_keep_their_bytes() {
        // The order of the document's keys is part of every cache key.
        let (field, value) = endpoint("http://h/v1", None);
        let doc = serde_json::json!({"kind": "openai", field: value, "model": "m"});
        assert_eq!(doc.to_string(), r#"{"kind":"openai","base_url":"http://h/v1","model":"m"}"#);
        let (field, value) = endpoint("http://h/v1", Some("openai:m"));
        let doc = serde_json::json!({"kind": "openai", field: value, "model": "m"});
        assert_eq!(doc.to_string(), r#"{"kind":"openai","cache_identity":"openai:m","model":"m"}"#);
    }
}
