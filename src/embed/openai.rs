//! The `openai` embedder: an OpenAI-compatible `/embeddings` endpoint (OpenAI,
//! TEI, vLLM — how a user runs SFR-Embedding on a GPU server), through the same
//! rate control, retries and accounting as chat providers.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;

use super::embedder::Embedder;
use synth_llm::endpoint::resolve_endpoint;
use synth_llm::openai::{Endpoint, OpenAiEmbed};
use synth_llm::pricing::{Price, default_price};
use synth_llm::rate::{RateConfig, RateControl, RateRegistry};
use synth_llm::{CallCtx, ChatResponse, LlmError, Usage};
use synth_retrieval::l2_normalize;

#[derive(Debug, Clone, Deserialize)]
pub struct Options {
    pub base_url: Option<String>,
    pub base_url_env: String,
    pub model: Option<String>,
    pub model_env: Option<String>,
    pub api_key_env: String,
    dim: usize,
    pub cache_identity: Option<String>,
    send_dimensions: bool,
    batch_size: usize,
    requests_per_minute: Option<u32>,
    max_concurrency: usize,
    timeout_seconds: f64,
    max_retries: u32,
    price_input_per_mtok: Option<f64>,
}

pub struct OpenAiEmbedder {
    id: String,
    dim: usize,
    send_dimensions: bool,
    batch_size: usize,
    client: OpenAiEmbed,
    rate: Arc<RateControl>,
    price: Option<Price>,
}

impl OpenAiEmbedder {
    pub fn from_options(name: &str, v: &serde_json::Value, rates: &RateRegistry) -> Result<OpenAiEmbedder> {
        let o: Options = serde_json::from_value(v.clone())?;
        let r = resolve_endpoint(name, &o.base_url, &o.base_url_env, &o.model, &o.model_env, &o.api_key_env)?;
        let api_key = synth_core::secrets::key_from_env(&o.api_key_env);
        let client = OpenAiEmbed::new(Endpoint {
            base_url: r.base_url.clone(),
            model: r.model.clone(),
            api_key: api_key.clone(),
        })
        .map_err(|e| anyhow!("embedder \"{name}\": {e}"))?;
        let cfg = RateConfig {
            requests_per_minute: o.requests_per_minute,
            max_concurrency: o.max_concurrency,
            initial_concurrency: o.max_concurrency,
            timeout: Duration::from_secs_f64(o.timeout_seconds.max(0.001)),
            max_retries: o.max_retries,
            ..Default::default()
        };
        let key_hash = blake3::hash(api_key.unwrap_or_default().as_bytes()).to_hex().to_string();
        let rate = rates.get(&format!("embed|{}|{}|{key_hash}", r.base_url, r.model), name, cfg);
        Ok(OpenAiEmbedder {
            id: match &o.cache_identity {
                Some(identity) => format!("openai:{identity}:{}:dim={}", r.model, o.dim),
                None => format!("openai:{}:{}:dim={}", synth_core::secrets::scrub(&r.base_url), r.model, o.dim),
            },
            dim: o.dim,
            send_dimensions: o.send_dimensions,
            batch_size: o.batch_size,
            client,
            rate,
            price: o.price_input_per_mtok.map(|p| Price { input: p, output: 0.0 }).or_else(|| default_price(&r.model)),
        })
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn id(&self) -> String {
        self.id.clone()
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn batch_size(&self) -> usize {
        self.batch_size
    }
    async fn embed(&self, texts: &[String], ctx: &CallCtx) -> Result<Vec<Vec<f32>>> {
        let dims = self.send_dimensions.then_some(self.dim);
        let estimate: u64 = texts.iter().map(|t| synth_llm::estimate_tokens(t)).sum();
        // The rate layer speaks chat responses; carry the vectors alongside.
        let slot: std::sync::Mutex<Option<Vec<Vec<f32>>>> = std::sync::Mutex::new(None);
        let (resp, _) = self
            .rate
            .call(estimate, Some(&ctx.progress), || async {
                let (vectors, tokens) = self.client.embed_once(texts, dims).await?;
                *slot.lock().expect("slot") = Some(vectors);
                Ok::<_, LlmError>(ChatResponse {
                    text: String::new(),
                    finish_reason: "stop".into(),
                    usage: Usage { prompt_tokens: tokens, completion_tokens: 0 },
                    model: String::new(),
                    system_fingerprint: None,
                })
            })
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let mut vectors = slot.lock().expect("slot").take().ok_or_else(|| anyhow!("no vectors"))?;
        for v in &mut vectors {
            if v.len() != self.dim {
                return Err(anyhow!("the endpoint returned {}-dimensional vectors but `dim` is {}", v.len(), self.dim));
            }
            l2_normalize(v);
        }
        let p = &ctx.progress;
        p.tokens_in.fetch_add(resp.usage.prompt_tokens, std::sync::atomic::Ordering::Relaxed);
        if let Some(price) = &self.price {
            p.cost_micro_usd.fetch_add(
                (price.cost(resp.usage.prompt_tokens, 0) * 1e6).round() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        Ok(vectors)
    }
}
