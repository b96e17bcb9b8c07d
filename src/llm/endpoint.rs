//! Where an OpenAI-compatible endpoint points: base URL and model resolved from a
//! declaration's options and the environment (no key needed), shared by chat
//! providers and embedders.

use anyhow::{Result, anyhow, bail};

use synth_core::config::options::{OptionSpec, Ty};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The options that say where an endpoint is (`base_url`, `base_url_env`, `model`,
/// `model_env`, `api_key_env`), shared by the `openai` provider and embedder kinds.
pub const ENDPOINT_OPTIONS: [OptionSpec; 5] = [
    OptionSpec::optional("base_url", Ty::Str, "API base URL (default: $base_url_env, else https://api.openai.com/v1)"),
    OptionSpec::default(
        "base_url_env",
        Ty::Str,
        "\"OPENAI_BASE_URL\"",
        "environment variable read when base_url is not set",
    )
    .instead_of(&["base_url"]),
    OptionSpec::optional("model", Ty::Str, "model name"),
    OptionSpec::optional("model_env", Ty::Str, "environment variable holding the model name (when model is not set)")
        .instead_of(&["model"]),
    OptionSpec::default("api_key_env", Ty::Str, "\"OPENAI_API_KEY\"", "environment variable holding the API key")
        .runtime_only(),
];

/// The plan-time check of an OpenAI-compatible provider or embedder: a model is named, here
/// or through an environment variable.
pub fn check_model(
    options: &serde_json::Map<String, serde_json::Value>,
    _root: &std::path::Path,
) -> Vec<(&'static str, String)> {
    if options.contains_key("model") || options.contains_key("model_env") {
        return Vec::new();
    }
    vec![("model", "set \"model\" or \"model_env\" (an environment variable holding the model name)".into())]
}

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
