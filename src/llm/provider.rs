//! The provider API: what a provider kind is ([`ProviderDesc`], its descriptor: options,
//! identity, build, network-bound or not, batch APIs), what the run holds of a built one
//! ([`Provider`]), and the option sets kinds share (generation, rate / retry / breaker /
//! price, batch). The kinds themselves are components: `offline` is here (`offline.rs`,
//! the demo and CI stand-in every method's shapes extend); `openai`, `anthropic` and
//! `local` are the `synth-providers` crate's, which only the top crate depends on. The
//! registry lists them; nothing else names a kind.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Result, anyhow};
use serde::Deserialize;

use super::batch::BatchApi;
use super::pricing::{Price, default_price};
use super::rate::{RateConfig, RateControl, RateRegistry};
use super::schema::Negotiation;
use super::shape::OfflineShape;
use super::{ChatBackend, ChatRequest, GenParams};
use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{NUMBER, OptionSpec, POSITIVE, RATIO, Ty, UINT};
use synth_core::hub::HubModel;
use synth_core::store::batch::PartInfo;

/// Options of the batch API, shared by the `openai` and `anthropic` kinds (none
/// changes an answer: batch and online calls share cache keys).
pub const BATCH_OPTIONS: [OptionSpec; 10] = [
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

pub const GEN_OPTIONS: [OptionSpec; 6] = [
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

/// The rate, retry, circuit-breaker and price options every networked kind shares, in
/// `synth list` order; `timeout` is the default of `timeout_seconds`, `headers` the
/// rate-limit headers `learn_limits` reads, `retried` what `max_retries` retries (the kind's
/// own words). Read by [`RateOptions`].
pub const fn rate_options(timeout: &'static str, headers: &'static str, retried: &'static str) -> [OptionSpec; 14] {
    [
        OptionSpec::optional("requests_per_minute", POSITIVE, "client-side request limit").runtime_only(),
        OptionSpec::optional("tokens_per_minute", POSITIVE, "client-side token limit (prompt estimate + max_tokens)")
            .runtime_only(),
        OptionSpec::default("learn_limits", Ty::Bool, "true", headers).runtime_only(),
        OptionSpec::default("max_concurrency", POSITIVE, "16", "most requests in flight").runtime_only(),
        OptionSpec::default("initial_concurrency", POSITIVE, "4", "requests in flight at start (grows on success)")
            .runtime_only(),
        OptionSpec::default("timeout_seconds", NUMBER, timeout, "per-request timeout").runtime_only(),
        OptionSpec::default("max_retries", UINT, "8", retried).runtime_only(),
        OptionSpec::default("backoff_initial_ms", POSITIVE, "500", "first retry delay (doubles, with jitter)")
            .runtime_only(),
        OptionSpec::default("backoff_max_seconds", NUMBER, "60", "longest retry delay").runtime_only(),
        OptionSpec::default(
            "breaker_after_seconds",
            NUMBER,
            "120",
            "continuous failure that opens the circuit breaker",
        )
        .runtime_only(),
        OptionSpec::default("breaker_pause_seconds", NUMBER, "30", "pause while the breaker is open").runtime_only(),
        OptionSpec::default("breaker_max_trips", UINT, "5", "trips in a row after which the run stops").runtime_only(),
        OptionSpec::optional("price_input_per_mtok", NUMBER, "USD per million prompt tokens (default: known models)")
            .runtime_only(),
        OptionSpec::optional("price_output_per_mtok", NUMBER, "USD per million completion tokens").runtime_only(),
    ]
}

/// The options of [`rate_options`], read (a kind's options struct flattens it in).
#[derive(Debug, Clone, Deserialize)]
pub struct RateOptions {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    pub learn_limits: bool,
    pub max_concurrency: usize,
    pub initial_concurrency: usize,
    pub timeout_seconds: f64,
    pub max_retries: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_seconds: f64,
    pub breaker_after_seconds: f64,
    pub breaker_pause_seconds: f64,
    pub breaker_max_trips: u32,
    pub price_input_per_mtok: Option<f64>,
    pub price_output_per_mtok: Option<f64>,
}

impl RateOptions {
    /// The rate controller's settings.
    pub fn rate(&self) -> RateConfig {
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
            ..Default::default()
        }
    }

    /// The configured price, else the known one of `model`.
    pub fn price(&self, model: &str) -> Option<Price> {
        match (self.price_input_per_mtok, self.price_output_per_mtok) {
            (None, None) => default_price(model),
            (i, out) => Some(Price { input: i.unwrap_or(0.0), output: out.unwrap_or(0.0) }),
        }
    }
}

/// A provider kind: one static per kind, in the kind's own module, listed by the registry.
/// Everything the engine asks of a kind is here; nothing else tests a kind's name.
pub struct ProviderDesc {
    /// Its name, description, options and plan-time check (what the compiler reads).
    pub kind: ProviderKind,
    /// Its calls leave the process: they run on the network runtime, may be paid for
    /// (shards claim them), and need their API key's variable in a schedule's secrets.
    pub networked: bool,
    /// What a declaration's answers depend on, without building it (fingerprints).
    pub identity: fn(&Decl, &Path) -> Result<serde_json::Value>,
    /// A provider from its checked declaration.
    pub build: fn(&Decl, &BuildCtx) -> Result<Provider>,
    /// Point a declaration at another model file (a checkpoint a stage upstream exported,
    /// `generate`'s `checkpoint`); `None`: the kind does not run model files.
    pub with_model: Option<fn(&mut Decl, &Path)>,
    /// The model file on the Hub a declaration reads (the lock records its commit), and
    /// whether the file it names instead is on this machine (under the pipeline's root).
    pub hub_model: Option<HubModelOf>,
    /// Read that hub file at this commit (`synth run --locked`).
    pub pin_hub_model: Option<fn(&mut Decl, &str)>,
    /// The batch APIs its providers submit to, by the name batch records keep.
    pub batch_apis: &'static [BatchApiKind],
}

/// [`ProviderDesc::hub_model`]: a declaration and the pipeline's root.
pub type HubModelOf = fn(&Decl, &Path) -> Option<(HubModel, bool)>;

/// [`BatchApiKind::open`]: a part's record, its key, the directory of part files.
pub type OpenBatchApi = fn(&PartInfo, Option<String>, &Path) -> Result<Arc<dyn BatchApi>>;

impl ProviderDesc {
    pub fn name(&self) -> &'static str {
        self.kind.name
    }
}

impl std::fmt::Debug for ProviderDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderDesc").field("name", &self.kind.name).finish_non_exhaustive()
    }
}

/// A batch API as `synth batch status | cancel` reopens it from a part's record: the part,
/// the key read from the variable it names, the directory of part files.
pub struct BatchApiKind {
    pub name: &'static str,
    pub open: OpenBatchApi,
}

/// The kind called `name` among `kinds`.
pub fn find_kind(kinds: &[&'static ProviderDesc], name: &str) -> Option<&'static ProviderDesc> {
    kinds.iter().copied().find(|k| k.kind.name == name)
}

/// What building a provider may use: the pipeline's root, the run's rate controllers (one
/// per endpoint, model and key), the offline shapes, and whether it builds without a key.
pub struct BuildCtx<'a> {
    pub root: &'a Path,
    pub rates: &'a RateRegistry,
    pub shapes: &'a Arc<[&'static OfflineShape]>,
    /// `--dry-run`'s estimate: an API that needs a key builds without one (no call is sent).
    pub keyless: bool,
}

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

impl BatchSettings {
    /// The limits of a batch of `api`: (most requests, most bytes), the API's own unless set.
    pub fn limits(&self, api: &dyn BatchApi) -> (u64, u64) {
        let (n, bytes) = api.limits();
        (self.max_requests.unwrap_or(n), self.max_bytes.unwrap_or(bytes))
    }
}

fn default_window() -> String {
    "24h".into()
}

/// Makes a provider's batch API (once, at the first batch stage) in the directory of its part files.
pub type BatchMaker = Box<dyn Fn(&BatchSettings, &Path) -> Result<Arc<dyn BatchApi>> + Send + Sync>;

/// A built chat provider.
pub struct Provider {
    pub name: String,
    pub kind: &'static str,
    /// Its calls leave the process ([`ProviderDesc::networked`]).
    pub networked: bool,
    pub base_url: String,
    pub model: String,
    pub params: GenParams,
    pub backend: Arc<dyn ChatBackend>,
    pub rate: Arc<RateControl>,
    pub price: Option<Price>,
    /// What else an offline provider's answers depend on (its seed and `score_one`): part of
    /// every cache key, so two offline providers never share answers; its answers also
    /// follow the expected shape, which joins the key.
    pub offline_identity: Option<serde_json::Value>,
    /// `cache_identity`: replaces the base URL in cache keys and fingerprints.
    pub cache_identity: Option<String>,
    /// Its model is named by its content in cache keys (the `cache_identity`), not by its
    /// name: a local file, whatever it is called.
    pub model_by_content: bool,
    /// The environment variable its key is read from (recorded with its batches, never the key).
    pub api_key_env: String,
    /// Its structured-output forms, and which one it is at.
    pub structured: Negotiation,
    /// Batch settings (`None`: the kind has no batch API, e.g. `offline`).
    pub batch: Option<BatchSettings>,
    /// The name of its batch API (`openai`, `anthropic`, `vllm`), when it has one.
    pub batch_api_name: Option<&'static str>,
    batch_maker: Option<BatchMaker>,
    batch_api: OnceLock<Arc<dyn BatchApi>>,
    /// Prompt tokens of this provider's batches submitted and not yet ended, over every
    /// stage of the run (the enqueued-token limit is the model's, not a stage's).
    pub batch_enqueued: AtomicU64,
}

/// The endpoint's field of an identity or cache document: the base URL, or the
/// `cache_identity` that stands for it. Second in every document (serde_json keeps key
/// order here), so documents without a `cache_identity` keep the bytes, and the keys,
/// they always had.
pub fn endpoint<'a>(base_url: &'a str, cache_identity: Option<&'a str>) -> (&'static str, &'a str) {
    match cache_identity {
        Some(id) => ("cache_identity", id),
        None => ("base_url", base_url),
    }
}

impl Provider {
    /// A provider of kind `kind` called `name`: the fields a kind sets beyond these start
    /// empty (no price, identity, batch API; no structured form).
    pub fn new(
        name: &str,
        kind: &ProviderDesc,
        model: String,
        params: GenParams,
        backend: Arc<dyn ChatBackend>,
        rate: Arc<RateControl>,
    ) -> Provider {
        Provider {
            name: name.to_string(),
            kind: kind.kind.name,
            networked: kind.networked,
            base_url: String::new(),
            model,
            params,
            backend,
            rate,
            price: None,
            offline_identity: None,
            cache_identity: None,
            model_by_content: false,
            api_key_env: String::new(),
            structured: Negotiation::new(vec![]),
            batch: None,
            batch_api_name: None,
            batch_maker: None,
            batch_api: OnceLock::new(),
            batch_enqueued: AtomicU64::new(0),
        }
    }

    /// Give it a batch API called `name`, made by `maker` from `settings` when first needed.
    pub fn with_batch(mut self, settings: BatchSettings, name: &'static str, maker: BatchMaker) -> Provider {
        self.batch = Some(settings);
        self.batch_api_name = Some(name);
        self.batch_maker = Some(maker);
        self
    }

    /// The model's name in cache documents: a model named by its content has none here
    /// (the `cache_identity` stands for it).
    fn key_model(&self) -> &str {
        if self.model_by_content { "" } else { &self.model }
    }

    /// Whether calls leave the process (and so run on the network runtime).
    pub fn networked(&self) -> bool {
        self.networked
    }

    /// The name of its batch API (`openai`, `anthropic`, `vllm`), when it has one.
    pub fn batch_api_kind(&self) -> Option<&'static str> {
        self.batch_api_name
    }

    /// Its batch API (built once; `dir` holds the part files, which a local API runs on).
    pub fn batch_api(&self, dir: &Path) -> Result<Arc<dyn BatchApi>> {
        if let Some(api) = self.batch_api.get() {
            return Ok(api.clone());
        }
        let (Some(settings), Some(maker)) = (&self.batch, &self.batch_maker) else {
            return Err(anyhow!("provider \"{}\" has no batch API", self.name));
        };
        let api = maker(settings, dir).map_err(|e| anyhow!("provider \"{}\": {e:#}", self.name))?;
        Ok(self.batch_api.get_or_init(|| api).clone())
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
        if let Some(id) = &provider.offline_identity {
            // The offline generator's answer depends on the expected shape.
            doc["expect"] = req.expect.clone().into();
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

#[cfg(test)]
mod tests {
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
