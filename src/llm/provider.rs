//! Chat provider kinds (`openai`, `offline`): their option schemas, their identity
//! (what their answers depend on, for fingerprints and cache keys) and how a
//! checked declaration becomes a [`Provider`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::endpoint::{DEFAULT_BASE_URL, ENDPOINT_OPTIONS, resolve_endpoint};
use super::offline::{Offline, OfflineShape};
use super::openai::{Endpoint, OpenAiChat};
use super::pricing::{Price, default_price};
use super::rate::{RateConfig, RateControl, RateRegistry};
use super::{ChatBackend, ChatRequest, GenParams};
use crate::config::decl::{Decl, ProviderKind};
use crate::config::options::{NUMBER, OptionSpec, POSITIVE, RATIO, Ty, UINT};

const GEN_OPTIONS: [OptionSpec; 6] = [
    OptionSpec::optional("temperature", Ty::Float(0.0, 2.0), "sampling temperature"),
    OptionSpec::optional("top_p", RATIO, "nucleus sampling"),
    OptionSpec::optional("max_tokens", POSITIVE, "most tokens per answer"),
    OptionSpec::optional("seed", Ty::Int(i64::MIN, i64::MAX), "server-side sampling seed"),
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

#[derive(Debug, Clone, Deserialize)]
struct OpenAiOptions {
    base_url: Option<String>,
    base_url_env: String,
    model: Option<String>,
    model_env: Option<String>,
    api_key_env: String,
    #[serde(flatten)]
    generation: GenParams,
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
    pub(crate) backend: Arc<dyn ChatBackend>,
    pub rate: Arc<RateControl>,
    pub(crate) price: Option<Price>,
    /// What else an offline provider's answers depend on (its seed and `score_one`): part of
    /// every cache key, so two offline providers never share answers.
    pub(crate) offline_identity: Option<serde_json::Value>,
    /// `cache_identity`: replaces the base URL in cache keys and fingerprints.
    pub(crate) cache_identity: Option<String>,
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
    /// Whether calls leave the process (and so run on the network runtime).
    pub fn networked(&self) -> bool {
        networked_kind(self.kind)
    }
}

/// Whether a provider kind's calls leave the process.
pub fn networked_kind(kind: &str) -> bool {
    kind == "openai"
}

impl Provider {
    /// What a provider's answers depend on, without building it (for fingerprints).
    pub fn identity(decl: &Decl) -> Result<serde_json::Value> {
        let name = decl.name.as_str();
        Ok(match decl.kind.as_str() {
            "openai" => {
                let o: OpenAiOptions = serde_json::from_value(decl.options.clone())?;
                let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
                let (field, value) = endpoint(&r.base_url, o.cache_identity.as_deref());
                serde_json::json!({"kind": "openai", field: value, "model": r.model, "params": o.generation})
            }
            _ => {
                let o: OfflineOptions = serde_json::from_value(decl.options.clone())?;
                serde_json::json!({"kind": "offline", "model": o.model, "seed": o.seed, "score_one": o.score_one, "params": o.generation})
            }
        })
    }

    /// Build a provider from its checked declaration; `shapes` are what the offline
    /// provider can imitate, `rates` shares one controller per endpoint, model and key.
    pub fn build(decl: &Decl, rates: &RateRegistry, shapes: &Arc<[&'static OfflineShape]>) -> Result<Provider> {
        let name = decl.name.as_str();
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
                    rate,
                    price,
                    offline_identity: None,
                    cache_identity: o.cache_identity.clone(),
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
                    rate,
                    price: Some(Price { input: 0.0, output: 0.0 }),
                    offline_identity: Some(serde_json::json!({"seed": o.seed, "score_one": o.score_one})),
                    cache_identity: None,
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
            "model": provider.model,
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
        doc
    }

    /// The cache document of a log-likelihood request (no `messages`, so it never equals a chat's).
    pub fn loglik_doc(provider: &Provider, req: &super::LoglikRequest, params: &GenParams) -> serde_json::Value {
        let (field, value) = endpoint(&provider.base_url, provider.cache_identity.as_deref());
        serde_json::json!({
            "kind": provider.kind,
            field: value,
            "model": provider.model,
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
