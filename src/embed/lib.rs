//! Embedders: `hashing` (offline default: hashed words and bigrams, TF-IDF
//! weighted), `fastembed` (local ONNX models: a named model or a model directory)
//! and `openai` (an embeddings endpoint: TEI, vLLM, OpenAI). All return
//! L2-normalised f32 vectors of a declared dimension.

pub mod embedder;
pub mod fastembed;
pub mod hashing;
pub mod openai;

use std::sync::Arc;

use anyhow::{Result, bail};

use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{NUMBER, OptionSpec, POSITIVE, Ty, UINT};
use synth_llm::rate::RateRegistry;

pub use self::embedder::{Embedder, Fitter};
pub use synth_retrieval::l2_normalize;

const HASHING_OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("dim", POSITIVE, "384", "vector dimension"),
    OptionSpec::default("ngrams", Ty::Int(1, 3), "2", "longest word n-gram used as a feature"),
    OptionSpec::default(
        "idf",
        Ty::Bool,
        "true",
        "weight features by inverse document frequency over the stage's input",
    ),
];

const FASTEMBED_OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("model", Ty::Str, "a fastembed model name, e.g. \"sentence-transformers/all-MiniLM-L6-v2\""),
    OptionSpec::optional(
        "model_dir",
        Ty::Str,
        "a directory with model.onnx and tokenizer files (relative to the pipeline root)",
    ),
    OptionSpec::default("pooling", Ty::Enum(&["mean", "cls"]), "\"mean\"", "token pooling (model_dir only)"),
    OptionSpec::default("max_length", POSITIVE, "256", "longest input in tokens"),
    OptionSpec::optional("dim", POSITIVE, "vector dimension (required with model_dir)"),
    OptionSpec::default("batch_size", POSITIVE, "64", "texts per forward pass").runtime_only(),
    OptionSpec::optional(
        "ort_dylib",
        Ty::Str,
        "ONNX Runtime library (default: $ORT_DYLIB_PATH, then .tools/onnxruntime)",
    )
    .runtime_only(),
    OptionSpec::optional("cache_dir", Ty::Str, "download cache for named models (relative to the pipeline root)")
        .runtime_only(),
    OptionSpec::optional("threads", POSITIVE, "intra-op threads (default: all cores)").runtime_only(),
];

const OPENAI_EMBED_OPTIONS: &[OptionSpec] = &[
    synth_llm::endpoint::ENDPOINT_OPTIONS[0],
    synth_llm::endpoint::ENDPOINT_OPTIONS[1],
    synth_llm::endpoint::ENDPOINT_OPTIONS[2],
    synth_llm::endpoint::ENDPOINT_OPTIONS[3],
    synth_llm::endpoint::ENDPOINT_OPTIONS[4],
    OptionSpec::required("dim", POSITIVE, "vector dimension the endpoint returns"),
    OptionSpec::optional(
        "cache_identity",
        Ty::Str,
        "stands for the base URL in the vector cache and fingerprints (e.g. \"openai:text-embedding-3-small\"): move behind a proxy without paying again; only where both URLs serve the same model",
    ),
    OptionSpec::default("send_dimensions", Ty::Bool, "false", "send `dimensions` in the request (OpenAI v3 models)"),
    OptionSpec::default("batch_size", POSITIVE, "64", "texts per request").runtime_only(),
    OptionSpec::optional("requests_per_minute", POSITIVE, "client-side request limit").runtime_only(),
    OptionSpec::default("max_concurrency", POSITIVE, "8", "most requests in flight").runtime_only(),
    OptionSpec::default("timeout_seconds", NUMBER, "120", "per-request timeout").runtime_only(),
    OptionSpec::default("max_retries", UINT, "8", "retries of transient errors").runtime_only(),
    OptionSpec::optional("price_input_per_mtok", NUMBER, "USD per million tokens (default: known models)")
        .runtime_only(),
];

pub static HASHING: ProviderKind = ProviderKind {
    name: "hashing",
    about: "offline: hashed words and bigrams, TF-IDF weighted, L2-normalised; no model needed",
    options: HASHING_OPTIONS,
    check: None,
};
pub static FASTEMBED: ProviderKind = ProviderKind {
    name: "fastembed",
    about: "local ONNX model through fastembed: a named model or a model directory",
    options: FASTEMBED_OPTIONS,
    check: None,
};
pub static OPENAI: ProviderKind = ProviderKind {
    name: "openai",
    about: "an OpenAI-compatible /embeddings endpoint (OpenAI, TEI, vLLM)",
    options: OPENAI_EMBED_OPTIONS,
    check: Some(synth_llm::endpoint::check_model),
};

pub static EMBEDDER_KINDS: &[&ProviderKind] = &[&HASHING, &FASTEMBED, &OPENAI];

/// Build an embedder from its declaration.
pub fn build(decl: &Decl, root: &std::path::Path, rates: &RateRegistry) -> Result<Arc<dyn Embedder>> {
    match decl.kind.as_str() {
        "hashing" => Ok(Arc::new(hashing::Hashing::from_options(&decl.options)?)),
        "fastembed" => Ok(Arc::new(fastembed::FastEmbed::from_options(&decl.name, &decl.options, root)?)),
        "openai" => Ok(Arc::new(openai::OpenAiEmbedder::from_options(&decl.name, &decl.options, rates)?)),
        other => bail!("embedder \"{}\": unknown kind \"{other}\"", decl.name),
    }
}

/// Whether the embedder learns statistics of the corpus before embedding (its
/// [`Embedder::fitter`]), read from its declaration: `hashing` with `idf`.
pub fn fits_corpus(decl: &Decl) -> bool {
    decl.kind == "hashing" && decl.options.get("idf").and_then(|v| v.as_bool()).unwrap_or(true)
}

/// The identity of an embedder without building it (for fingerprints).
pub fn identity(decl: &Decl) -> Result<serde_json::Value> {
    let mut v = serde_json::json!({"kind": decl.kind});
    let opts = decl.options.as_object().cloned().unwrap_or_default();
    let spec = EMBEDDER_KINDS.iter().find(|k| k.name == decl.kind).map(|k| k.options).unwrap_or(&[]);
    for (k, val) in opts {
        if spec.iter().find(|s| s.name == k).is_none_or(|s| s.affects_output) {
            v[k] = val;
        }
    }
    if decl.kind == "openai" {
        let o: openai::Options = serde_json::from_value(decl.options.clone())?;
        let r = synth_llm::endpoint::resolve_endpoint(
            &decl.name,
            &o.base_url,
            &o.base_url_env,
            &o.model,
            &o.model_env,
            &o.api_key_env,
        )?;
        // `cache_identity` (already in `v` as an option) stands for the URL.
        match o.cache_identity {
            None => v["base_url"] = r.base_url.into(),
            Some(_) => {
                if let Some(m) = v.as_object_mut() {
                    m.remove("base_url");
                    m.remove("base_url_env");
                }
            }
        }
        v["model"] = r.model.into();
    }
    Ok(v)
}
