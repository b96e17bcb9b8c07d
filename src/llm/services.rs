//! What LLM and embedding stages share during a run: the provider and embedder
//! declarations from `[providers.*]` / `[embedders.*]`, built lazily (so a run that
//! never calls a provider never needs its key), one rate controller per
//! (kind, base URL, model, key) shared by every stage, the cache database, the
//! network runtime, and the call path: cache lookup → single-flight → journal →
//! rate-limited call → durable store. A request identical to one already answered is
//! never paid for again. Calls to network providers run that whole path on the
//! network runtime (`net.rs`); the offline provider runs on the caller's.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::net::NetRuntime;
use super::offline::Offline;
use super::openai::{Endpoint, OpenAiChat};
use super::pricing::{Price, default_price};
use super::rate::{RateConfig, RateControl};
use super::{ChatBackend, ChatRequest, ChatResponse, ErrorKind, GenParams, LlmError, estimate_tokens};
use crate::config::options::{NUMBER, OptionSpec, POSITIVE, RATIO, Ty, UINT};
use crate::progress::StageProgress;
use crate::store::cache::{Cache, ResponseRow, Use};

/// A provider or embedder kind: its options and what it does.
pub struct ProviderKind {
    pub name: &'static str,
    pub about: &'static str,
    pub options: &'static [OptionSpec],
}

const GEN_OPTIONS: [OptionSpec; 6] = [
    OptionSpec::optional("temperature", Ty::Float(0.0, 2.0), "sampling temperature"),
    OptionSpec::optional("top_p", RATIO, "nucleus sampling"),
    OptionSpec::optional("max_tokens", POSITIVE, "most tokens per answer"),
    OptionSpec::optional("seed", Ty::Int(i64::MIN, i64::MAX), "server-side sampling seed"),
    OptionSpec::optional("stop", Ty::StrList, "stop sequences"),
    OptionSpec::optional("extra", Ty::Map(&Ty::Any), "extra body parameters, sent as they are"),
];

const OPENAI_OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("base_url", Ty::Str, "API base URL (default: $base_url_env, else https://api.openai.com/v1)"),
    OptionSpec::default(
        "base_url_env",
        Ty::Str,
        "\"OPENAI_BASE_URL\"",
        "environment variable read when base_url is not set",
    ),
    OptionSpec::optional("model", Ty::Str, "model name"),
    OptionSpec::optional("model_env", Ty::Str, "environment variable holding the model name (when model is not set)"),
    OptionSpec::default("api_key_env", Ty::Str, "\"OPENAI_API_KEY\"", "environment variable holding the API key")
        .runtime_only(),
    GEN_OPTIONS[0],
    GEN_OPTIONS[1],
    GEN_OPTIONS[2],
    GEN_OPTIONS[3],
    GEN_OPTIONS[4],
    GEN_OPTIONS[5],
    OptionSpec::optional("requests_per_minute", POSITIVE, "client-side request limit").runtime_only(),
    OptionSpec::optional("tokens_per_minute", POSITIVE, "client-side token limit (prompt estimate + max_tokens)")
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
};
pub static OFFLINE: ProviderKind = ProviderKind {
    name: "offline",
    about: "deterministic generator without network, for demos and CI (its output is not training data)",
    options: OFFLINE_OPTIONS,
};

pub static PROVIDER_KINDS: &[&ProviderKind] = &[&OPENAI, &OFFLINE];

/// A checked `[providers.NAME]` or `[embedders.NAME]` table.
#[derive(Debug, Clone)]
pub struct Decl {
    pub name: String,
    pub kind: String,
    pub options: serde_json::Value,
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
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
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
struct OfflineOptions {
    model: String,
    seed: i64,
    score_one: f64,
    #[serde(flatten)]
    generation: GenParams,
    max_concurrency: usize,
}

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Where an OpenAI-compatible provider points, resolved from config and environment.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub base_url: String,
    pub model: String,
    pub api_key_env: String,
}

/// Resolve base URL and model of an `openai` declaration (no key needed).
pub fn resolve_endpoint(
    name: &str,
    base_url: &Option<String>,
    base_url_env: &str,
    model: &Option<String>,
    model_env: &Option<String>,
    api_key_env: &str,
) -> Result<Resolved> {
    let base_url = base_url
        .clone()
        .or_else(|| std::env::var(base_url_env).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
    let model = match (model, model_env) {
        (Some(m), _) => m.clone(),
        (None, Some(var)) => std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| anyhow!("provider \"{name}\": no model: set the environment variable {var}"))?,
        (None, None) => bail!("provider \"{name}\": no model: set `model` (or `model_env`)"),
    };
    Ok(Resolved { base_url: base_url.trim_end_matches('/').to_string(), model, api_key_env: api_key_env.to_string() })
}

/// A built chat provider.
pub struct Provider {
    pub name: String,
    pub kind: &'static str,
    pub base_url: String,
    pub model: String,
    pub params: GenParams,
    backend: Arc<dyn ChatBackend>,
    pub rate: Arc<RateControl>,
    price: Option<Price>,
}

impl Provider {
    /// Whether calls leave the process (and so run on the network runtime).
    pub fn networked(&self) -> bool {
        self.kind == "openai"
    }

    /// What identifies answers of this provider (part of cache keys and fingerprints).
    pub fn identity(&self) -> serde_json::Value {
        serde_json::json!({"kind": self.kind, "base_url": self.base_url, "model": self.model})
    }
}

/// Who is calling, for accounting and cache tagging.
#[derive(Clone)]
pub struct CallCtx {
    pub stage: String,
    pub fingerprint: String,
    pub progress: Arc<StageProgress>,
}

impl CallCtx {
    fn usage(&self) -> Use {
        Use { stage: self.stage.clone(), fingerprint: self.fingerprint.clone() }
    }
}

/// A finished chat call.
#[derive(Debug, Clone)]
pub struct Completed {
    pub response: ChatResponse,
    pub cached: bool,
    pub retries: u32,
}

type Flight = Arc<tokio::sync::OnceCell<Result<Completed, LlmError>>>;

/// Shared services of one run.
pub struct Services {
    out_dir: PathBuf,
    root: PathBuf,
    providers: BTreeMap<String, Decl>,
    embedders: BTreeMap<String, Decl>,
    cache: Mutex<Option<Arc<Cache>>>,
    built: Mutex<HashMap<String, Arc<Provider>>>,
    rates: Mutex<HashMap<String, Arc<RateControl>>>,
    built_embedders: Mutex<HashMap<String, Arc<dyn crate::embed::Embedder>>>,
    inflight: Mutex<HashMap<String, Flight>>,
    warned_price: Mutex<std::collections::BTreeSet<String>>,
    net: Mutex<Option<Arc<NetRuntime>>>,
}

impl Services {
    pub fn new(
        out_dir: &Path,
        root: &Path,
        providers: BTreeMap<String, Decl>,
        embedders: BTreeMap<String, Decl>,
    ) -> Arc<Services> {
        Arc::new(Services {
            out_dir: out_dir.to_path_buf(),
            root: root.to_path_buf(),
            providers,
            embedders,
            cache: Mutex::new(None),
            built: Mutex::new(HashMap::new()),
            rates: Mutex::new(HashMap::new()),
            built_embedders: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            warned_price: Mutex::new(Default::default()),
            net: Mutex::new(None),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cache database of the output directory (opened on first use).
    pub fn cache(&self) -> Result<Arc<Cache>> {
        let mut c = self.cache.lock().expect("cache");
        if let Some(cache) = c.as_ref() {
            return Ok(cache.clone());
        }
        let cache = Arc::new(Cache::open(&self.out_dir.join(crate::store::state::INTERNAL_DIR))?);
        if cache.recovered() > 0 {
            tracing::info!(
                "{} response(s) received before the previous run stopped were recovered from the journal",
                cache.recovered()
            );
        }
        let stale = cache.in_flight().unwrap_or_default();
        if !stale.is_empty() {
            tracing::warn!(
                "{} request(s) were in flight when the previous run stopped; they are sent again, everything else comes from the cache",
                stale.len()
            );
        }
        *c = Some(cache.clone());
        Ok(cache)
    }

    pub fn provider_decl(&self, name: &str) -> Result<&Decl> {
        self.providers.get(name).ok_or_else(|| anyhow!("no provider \"{name}\" in [providers]"))
    }

    pub fn embedder_decl(&self, name: &str) -> Result<&Decl> {
        self.embedders.get(name).ok_or_else(|| anyhow!("no embedder \"{name}\" in [embedders]"))
    }

    /// What a provider's answers depend on, without building it (for fingerprints).
    pub fn provider_identity(&self, name: &str) -> Result<serde_json::Value> {
        let decl = self.provider_decl(name)?;
        Ok(match decl.kind.as_str() {
            "openai" => {
                let o: OpenAiOptions = serde_json::from_value(decl.options.clone())?;
                let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
                serde_json::json!({"kind": "openai", "base_url": r.base_url, "model": r.model, "params": o.generation})
            }
            _ => {
                let o: OfflineOptions = serde_json::from_value(decl.options.clone())?;
                serde_json::json!({"kind": "offline", "model": o.model, "seed": o.seed, "score_one": o.score_one, "params": o.generation})
            }
        })
    }

    fn rate_for(&self, key: &str, name: &str, cfg: RateConfig) -> Arc<RateControl> {
        let mut rates = self.rates.lock().expect("rates");
        if let Some(r) = rates.get(key) {
            if r.cfg != cfg {
                tracing::warn!(
                    "provider \"{name}\" shares its endpoint, model and key with \"{}\": using the limits of \"{}\"",
                    r.name,
                    r.name
                );
            }
            return r.clone();
        }
        let r = RateControl::new(name, cfg);
        rates.insert(key.to_string(), r.clone());
        r
    }

    /// Build (once) and return a provider.
    pub fn provider(&self, name: &str) -> Result<Arc<Provider>> {
        if let Some(p) = self.built.lock().expect("built").get(name) {
            return Ok(p.clone());
        }
        let decl = self.provider_decl(name)?.clone();
        let provider = match decl.kind.as_str() {
            "openai" => {
                let o: OpenAiOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
                let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
                let api_key = crate::secrets::key_from_env(&o.api_key_env);
                if api_key.is_none() && r.base_url == DEFAULT_BASE_URL {
                    bail!(
                        "provider \"{name}\": the environment variable {} is not set (the OpenAI API needs a key)",
                        o.api_key_env
                    );
                }
                let backend = OpenAiChat::new(Endpoint {
                    base_url: r.base_url.clone(),
                    model: r.model.clone(),
                    api_key: api_key.clone(),
                })
                .map_err(|e| anyhow!("provider \"{name}\": {e}"))?;
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
                };
                let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
                let rate = self.rate_for(&format!("openai|{}|{}|{key_hash}", r.base_url, r.model), name, cfg);
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
                    rate,
                    price,
                }
            }
            "offline" => {
                let o: OfflineOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
                let cfg = RateConfig {
                    max_concurrency: o.max_concurrency,
                    initial_concurrency: o.max_concurrency,
                    ..Default::default()
                };
                let rate = self.rate_for(&format!("offline|{name}"), name, cfg);
                let backend = Offline { seed: o.seed as u64, score_one: o.score_one };
                Provider {
                    name: name.to_string(),
                    kind: "offline",
                    base_url: String::new(),
                    model: o.model,
                    params: o.generation,
                    backend: Arc::new(backend),
                    rate,
                    price: Some(Price { input: 0.0, output: 0.0 }),
                }
            }
            other => bail!("provider \"{name}\": unknown kind \"{other}\""),
        };
        let provider = Arc::new(provider);
        self.built.lock().expect("built").insert(name.to_string(), provider.clone());
        Ok(provider)
    }

    /// The cache key of a request: everything that determines the answer.
    pub fn request_doc(provider: &Provider, req: &ChatRequest, params: &GenParams) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "kind": provider.kind,
            "base_url": provider.base_url,
            "model": provider.model,
            "messages": req.messages,
            "params": params,
            "sample": req.sample,
        });
        if provider.kind == "offline" {
            // The offline generator's answer depends on the expected shape.
            doc["expect"] = req.expect.clone().into();
        }
        doc
    }

    /// The network runtime (started on first use).
    pub fn net(&self) -> Result<Arc<NetRuntime>> {
        let mut net = self.net.lock().expect("net");
        if let Some(n) = net.as_ref() {
            return Ok(n.clone());
        }
        let n = Arc::new(NetRuntime::start()?);
        *net = Some(n.clone());
        Ok(n)
    }

    /// Whether calls to this provider go over the network (an unknown name: no).
    pub fn provider_networked(&self, name: &str) -> bool {
        self.providers.get(name).is_some_and(|d| d.kind == "openai")
    }

    /// One chat call through cache, single-flight, journal and rate control: on the
    /// network runtime for network providers (inline when the caller already runs
    /// there), here for the offline one.
    pub async fn chat(
        self: &Arc<Self>,
        provider: &Arc<Provider>,
        req: ChatRequest,
        ctx: &CallCtx,
    ) -> Result<Completed, LlmError> {
        if !provider.networked() || super::net::on_net_thread() {
            return self.chat_here(provider, req, ctx).await;
        }
        let net = self.net().map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("{e:#}")))?;
        let (this, provider, ctx) = (self.clone(), provider.clone(), ctx.clone());
        net.run(async move { this.chat_here(&provider, req, &ctx).await })
            .await
            .unwrap_or_else(|e| Err(LlmError::new(ErrorKind::Unavailable, e.to_string())))
    }

    async fn chat_here(
        &self,
        provider: &Arc<Provider>,
        req: ChatRequest,
        ctx: &CallCtx,
    ) -> Result<Completed, LlmError> {
        let params = provider.params.overlay(&req.params);
        let doc = Self::request_doc(provider, &req, &params);
        let doc_text = doc.to_string();
        let key = blake3::hash(doc_text.as_bytes()).to_hex().to_string();
        let cache = self.cache().map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("{e:#}")))?;
        let usage = ctx.usage();
        match cache.get_response(&key, &usage) {
            Ok(Some(hit)) => {
                if let Ok(response) = serde_json::from_str::<ChatResponse>(&hit.response) {
                    ctx.progress.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(Completed { response, cached: true, retries: 0 });
                }
            }
            Ok(None) => {}
            Err(e) => return Err(LlmError::new(ErrorKind::Unavailable, format!("cache: {e:#}"))),
        }
        // Identical requests in flight at the same time are sent once.
        let flight: Flight = self.inflight.lock().expect("inflight").entry(key.clone()).or_default().clone();
        let result = flight
            .get_or_init(|| async {
                if let Err(e) = cache.journal_start(&key, &ctx.stage) {
                    return Err(LlmError::new(ErrorKind::Unavailable, format!("cache journal: {e:#}")));
                }
                let estimate = req.messages.iter().map(|m| estimate_tokens(&m.content)).sum::<u64>()
                    + params.max_tokens.unwrap_or(256) as u64;
                let outcome = provider
                    .rate
                    .call(estimate, Some(&ctx.progress), || provider.backend.chat_once(&req, &params))
                    .await;
                match outcome {
                    Ok((response, retries)) => {
                        let (tin, tout) = (response.usage.prompt_tokens, response.usage.completion_tokens);
                        let cost = self.cost(provider, tin, tout);
                        let row = ResponseRow {
                            key: key.clone(),
                            provider: provider.kind.to_string(),
                            base_url: crate::secrets::scrub(&provider.base_url),
                            model: provider.model.clone(),
                            request: crate::secrets::scrub(&doc_text),
                            response: serde_json::to_string(&response).expect("serializable"),
                            tokens_in: tin,
                            tokens_out: tout,
                            cost_usd: cost,
                        };
                        // Durable before the record counts as done.
                        if let Err(e) = cache.put_response(row, &usage).await {
                            return Err(LlmError::new(
                                ErrorKind::Unavailable,
                                format!("storing a paid response: {e:#}"),
                            ));
                        }
                        let p = &ctx.progress;
                        p.tokens_in.fetch_add(tin, std::sync::atomic::Ordering::Relaxed);
                        p.tokens_out.fetch_add(tout, std::sync::atomic::Ordering::Relaxed);
                        p.cost_micro_usd.fetch_add((cost * 1e6).round() as u64, std::sync::atomic::Ordering::Relaxed);
                        Ok(Completed { response, cached: false, retries })
                    }
                    Err(e) => {
                        cache.journal_end(&key);
                        Err(e)
                    }
                }
            })
            .await
            .clone();
        self.inflight.lock().expect("inflight").remove(&key);
        result
    }

    fn cost(&self, provider: &Provider, tin: u64, tout: u64) -> f64 {
        match &provider.price {
            Some(p) => p.cost(tin, tout),
            None => {
                if self.warned_price.lock().expect("warned").insert(provider.model.clone()) {
                    tracing::warn!(
                        "no price known for model \"{}\": cost is reported as 0 (set price_input_per_mtok / price_output_per_mtok on provider \"{}\")",
                        provider.model,
                        provider.name
                    );
                }
                0.0
            }
        }
    }

    /// Build (once) and return an embedder.
    pub fn embedder(&self, name: &str) -> Result<Arc<dyn crate::embed::Embedder>> {
        if let Some(e) = self.built_embedders.lock().expect("embedders").get(name) {
            return Ok(e.clone());
        }
        let decl = self.embedder_decl(name)?.clone();
        let e = crate::embed::build(&decl, self)?;
        self.built_embedders.lock().expect("embedders").insert(name.to_string(), e.clone());
        Ok(e)
    }

    /// A rate controller for an embedding endpoint (shared like chat providers').
    pub fn embed_rate(&self, key: &str, name: &str, cfg: RateConfig) -> Arc<RateControl> {
        self.rate_for(key, name, cfg)
    }

    /// Rate-control counters of every endpoint used so far (for benchmarks and logs).
    pub fn rate_controls(&self) -> Vec<Arc<RateControl>> {
        self.rates.lock().expect("rates").values().cloned().collect()
    }
}
