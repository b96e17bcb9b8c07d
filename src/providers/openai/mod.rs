//! The `openai` provider kind: chat completions (and log-likelihoods through
//! `/completions`) on any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM, TGI),
//! over the OpenAI wire format and client of `synth_llm::openai`; its batches go to the
//! server's Files and Batches API (`batch.rs`) or, with `batch_api = "vllm"`, to a local
//! `vllm run-batch` (`vllm.rs`).

pub mod batch;
pub mod vllm;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_openai::Client;
use async_openai::config::OpenAIConfig;
use serde::Deserialize;

use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::store::batch::PartInfo;
use synth_llm::batch::{BatchApi, BatchBody};
use synth_llm::endpoint::{DEFAULT_BASE_URL, ENDPOINT_OPTIONS, resolve_endpoint};
use synth_llm::openai::{Endpoint, client};
use synth_llm::provider::{
    BATCH_OPTIONS, BatchApiKind, BatchSettings, BuildCtx, GEN_OPTIONS, Provider, ProviderDesc, RateOptions, endpoint,
    rate_options,
};
use synth_llm::schema::{Form, Negotiation};
use synth_llm::{Call, ChatBackend, ChatRequest, ChatResponse, GenParams, LlmError, LoglikRequest};

const RATE: [OptionSpec; 14] = rate_options(
    "120",
    "pace by the limits the server advertises (x-ratelimit-limit-requests / -tokens): the lower of those and the configured ones",
    "retries of 429, 5xx, timeouts, resets, malformed answers",
);

const OPTIONS: &[OptionSpec] = &[
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

/// The `openai` provider kind.
pub static PROVIDER: ProviderDesc = ProviderDesc {
    kind: ProviderKind {
        name: "openai",
        about: "chat completions on any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM, TGI)",
        options: OPTIONS,
        check: Some(synth_llm::endpoint::check_model),
    },
    networked: true,
    identity,
    build,
    with_model: None,
    hub_model: None,
    pin_hub_model: None,
    batch_apis: &[
        BatchApiKind { name: "openai", open: open_openai_batches },
        BatchApiKind { name: "vllm", open: open_vllm_batches },
    ],
};

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
    #[serde(flatten)]
    rate: RateOptions,
}

fn identity(decl: &Decl, _root: &Path) -> Result<serde_json::Value> {
    let o: OpenAiOptions = serde_json::from_value(decl.options.clone())?;
    let r = resolve_endpoint(&decl.name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
    let (field, value) = endpoint(&r.base_url, o.cache_identity.as_deref());
    Ok(serde_json::json!({"kind": "openai", field: value, "model": r.model, "params": o.generation}))
}

fn build(decl: &Decl, ctx: &BuildCtx) -> Result<Provider> {
    let name = decl.name.as_str();
    let o: OpenAiOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
    let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
    let api_key = synth_core::secrets::key_from_env(&o.api_key_env);
    if api_key.is_none() && r.base_url == DEFAULT_BASE_URL && !ctx.keyless {
        bail!(
            "provider \"{name}\": the environment variable {} is not set (the OpenAI API needs a key)",
            o.api_key_env
        );
    }
    let endpoint = Endpoint { base_url: r.base_url.clone(), model: r.model.clone(), api_key: api_key.clone() };
    let backend = OpenAiChat::new(endpoint.clone()).map_err(|e| anyhow!("provider \"{name}\": {e}"))?;
    let batch: BatchSettings = serde_json::from_value(decl.options.clone()).context("provider batch options")?;
    let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
    let rate = ctx.rates.get(&format!("openai|{}|{}|{key_hash}", r.base_url, r.model), name, o.rate.rate());
    let mut p = Provider::new(name, &PROVIDER, r.model.clone(), o.generation, Arc::new(backend), rate);
    p.base_url = r.base_url;
    p.price = o.rate.price(&r.model);
    p.cache_identity = o.cache_identity.clone();
    p.api_key_env = o.api_key_env.clone();
    p.structured = Negotiation::new(match o.structured_output.as_str() {
        "openai" => vec![Form::OpenAi],
        "vllm" => vec![Form::Vllm],
        "llama_cpp" => vec![Form::LlamaCpp],
        "none" => vec![],
        _ => vec![Form::OpenAi, Form::LlamaCpp],
    });
    Ok(if batch.api.as_deref() == Some("vllm") {
        let model = p.model.clone();
        p.with_batch(
            batch,
            "vllm",
            Box::new(move |s: &BatchSettings, dir: &Path| -> Result<Arc<dyn BatchApi>> {
                Ok(Arc::new(vllm::LocalBatch::new(s.command.clone().unwrap_or_default(), &model, dir)))
            }),
        )
    } else {
        p.with_batch(
            batch,
            "openai",
            Box::new(move |s: &BatchSettings, _dir: &Path| -> Result<Arc<dyn BatchApi>> {
                Ok(Arc::new(batch::OpenAiBatches::new(endpoint.clone(), &s.completion_window).map_err(|e| anyhow!(e))?))
            }),
        )
    })
}

/// The Files and Batches API a part was submitted to (`synth batch`).
fn open_openai_batches(i: &PartInfo, api_key: Option<String>, _dir: &Path) -> Result<Arc<dyn BatchApi>> {
    let endpoint = Endpoint { base_url: i.base_url.clone(), model: i.model.clone(), api_key };
    Ok(Arc::new(batch::OpenAiBatches::new(endpoint, "24h").map_err(anyhow::Error::msg)?))
}

/// The local `vllm run-batch` files of a part (`synth batch`): nothing to run.
fn open_vllm_batches(i: &PartInfo, _api_key: Option<String>, dir: &Path) -> Result<Arc<dyn BatchApi>> {
    Ok(Arc::new(vllm::LocalBatch::new(Vec::new(), &i.model, dir)))
}

/// Chat completions and log-likelihoods of one endpoint and model.
pub struct OpenAiChat {
    client: Client<OpenAIConfig>,
    endpoint: Endpoint,
}

impl OpenAiChat {
    pub fn new(endpoint: Endpoint) -> Result<OpenAiChat, String> {
        Ok(OpenAiChat { client: client(&endpoint)?, endpoint })
    }
}

#[async_trait::async_trait]
impl ChatBackend for OpenAiChat {
    async fn chat_once(&self, req: &ChatRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        synth_llm::openai::chat_once(&self.client, &self.endpoint.model, req, params).await
    }

    async fn loglik_once(&self, req: &LoglikRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        synth_llm::openai::loglik_once(&self.client, &self.endpoint.model, req, params).await
    }

    fn batch_body(&self, call: &Call, params: &GenParams) -> Option<BatchBody> {
        Some(synth_llm::openai::batch_body(&self.endpoint.model, call, params))
    }
}
