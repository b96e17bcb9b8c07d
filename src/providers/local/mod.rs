//! The `local` provider: a GGUF model run inside synth through llama.cpp (the
//! `llama-cpp-2` crate). Requests of every stage on the provider are decoded together by
//! one engine thread ([`engine`]): continuous batching over sequences, decoding constrained
//! by the stage's JSON Schema (llguidance), the model's own chat template ([`template`]),
//! seeded sampling, and log-likelihoods of a continuation for the `loglik` kind. The model
//! is a local file or a file of a Hugging Face repository (through `synth_core::hub`), checked
//! at plan time (it exists and is a GGUF file) and identified by its content hash in cache
//! keys and fingerprints.

pub mod engine;
pub mod template;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::Value;

use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
pub use synth_core::hub::{HubModel, is_gguf};
use synth_llm::provider::{BuildCtx, Provider, ProviderDesc};
use synth_llm::rate::RateConfig;
use synth_llm::schema::Form;
use synth_llm::schema::Negotiation;
use synth_llm::{
    ChatBackend, ChatRequest, ChatResponse, EngineStats, ErrorKind, GenParams, LlmError, Loglik, LoglikRequest, Usage,
};

/// Options of the `local` provider kind.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("model", Ty::Str, "a GGUF file (path relative to the pipeline's root)"),
    OptionSpec::optional(
        "hub",
        Ty::Any,
        "the GGUF file from a Hugging Face model repository: { repo, file, revision = \"main\", endpoint, cache_dir }; downloaded once into the hub cache (HF_HOME), used when `model` is unset or its file is absent",
    ),
    OptionSpec::optional("sha256", Ty::Str, "the file's SHA-256: another file is refused"),
    OptionSpec::default(
        "context",
        POSITIVE,
        "4096",
        "tokens per sequence (prompt and answer); a longer prompt fails its record",
    ),
    OptionSpec::default(
        "kv_cache",
        Ty::Enum(&["f16", "q8_0"]),
        "\"f16\"",
        "type of the attention cache: q8_0 halves its memory and makes attention over long prompts faster (numbers differ slightly from f16)",
    ),
    OptionSpec::default(
        "flash_attention",
        Ty::Enum(&["auto", "on", "off"]),
        "\"auto\"",
        "llama.cpp's flash attention (attention computed in one pass, without the matrix of scores): \"auto\" and \"on\" turn it on (as llama.cpp's own server does on a CPU: ~1.2× the tokens/s of \"off\" with 16 sequences, BENCHMARKS.md); answers repeat their bytes in any batch either way (a lone token is decoded beside a ballast token, see ARCHITECTURE.md); \"off\" gives the numbers of synth before flash attention was on by default",
    ),
    OptionSpec::optional(
        "max_string_chars",
        POSITIVE,
        "structured answers: every string of the schema without a maxLength is decoded with this one (a small model otherwise can repeat itself inside a string until max_tokens); answers are still validated against the stage's schema as written",
    ),
    OptionSpec::optional(
        "max_items",
        POSITIVE,
        "structured answers: every array of the schema is decoded with at most this many items (at least its minItems), so an answer fits max_tokens; answers are still validated against the stage's schema as written",
    ),
    OptionSpec::default("parallel", POSITIVE, "8", "sequences decoded together (continuous batching)").runtime_only(),
    OptionSpec::default(
        "share_prompts",
        Ty::Bool,
        "true",
        "a prompt whose first tokens another sequence has decoded (the template's default system prompt, a shared system prompt, a question's likelihood choices) copies them from that sequence's cache instead of decoding them again; answers are the same bytes either way",
    )
    .runtime_only(),
    OptionSpec::default("batch_tokens", POSITIVE, "512", "tokens per decode call").runtime_only(),
    OptionSpec::default(
        "chunk_tokens",
        POSITIVE,
        "64",
        "a generation prompt is decoded in chunks that end at each message start and every this many tokens after it (at most `batch_tokens`): where a later prompt can copy the start it shares (a role profile before the question that differs is shared but for its last partial chunk; 512, synth's grid before, shared only whole 512-token chunks). The numbers of an answer depend on it, so it is part of the cache identity",
    ),
    OptionSpec::optional("threads", POSITIVE, "CPU threads of llama.cpp (default: $SYNTH_LOCAL_THREADS, else the machine's cores). On a machine busy with other work, set the cores left free: llama.cpp's threads spin at every barrier, so one that waits for a thread the OS has put aside loses its time slice (beside two compilers on 2 cores, 2 threads decoded 4.5 tokens/s and 1 thread 35; BENCHMARKS.md)").runtime_only(),
    OptionSpec::optional("temperature", Ty::Float(0.0, 2.0), "sampling temperature (default 0.8; 0: greedy)"),
    OptionSpec::optional("top_p", synth_core::config::options::RATIO, "nucleus sampling"),
    OptionSpec::optional("max_tokens", POSITIVE, "most tokens per answer (default 1024)"),
    OptionSpec::optional(
        "seed",
        Ty::Int(i64::MIN, i64::MAX),
        "sampling seed (with the sample index: each request's own)",
    ),
    OptionSpec::optional("stop", Ty::StrList, "stop sequences"),
    OptionSpec::optional(
        "extra",
        Ty::Map(&Ty::Any),
        "more of llama.cpp's samplers, by vLLM's parameter names: top_k, min_p, repetition_penalty, frequency_penalty, presence_penalty, penalty_last_n (64), dry_multiplier, dry_base (1.75), dry_allowed_length (2)",
    ),
    OptionSpec::default("max_concurrency", POSITIVE, "16", "requests in flight (queued for a free sequence)")
        .runtime_only(),
];

/// The `local` kind's options.
#[derive(Debug, Clone, Deserialize)]
pub struct LocalOptions {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub hub: Option<HubModel>,
    #[serde(default)]
    pub sha256: Option<String>,
    pub context: u32,
    #[serde(default = "f16")]
    pub kv_cache: String,
    #[serde(default = "auto")]
    pub flash_attention: String,
    #[serde(default)]
    pub max_string_chars: Option<u32>,
    #[serde(default)]
    pub max_items: Option<u32>,
    pub parallel: usize,
    #[serde(default = "yes")]
    pub share_prompts: bool,
    pub batch_tokens: u32,
    #[serde(default = "chunk_tokens")]
    pub chunk_tokens: u32,
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(flatten)]
    pub generation: GenParams,
    pub max_concurrency: usize,
}

/// The default of `chunk_tokens` (options built without the kind's defaults: tests, benches).
fn chunk_tokens() -> u32 {
    64
}

fn f16() -> String {
    "f16".into()
}

fn yes() -> bool {
    true
}

fn auto() -> String {
    "auto".into()
}

/// Plan-time check of a `local` provider's options: a model is named, and a named local
/// file (unless the hub stands in for a missing one) exists and is GGUF. (option, message).
pub fn check(options: &serde_json::Map<String, Value>, root: &Path) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let model = options.get("model").and_then(Value::as_str);
    let hub = options.get("hub");
    if let Some(h) = hub
        && let Err(e) = serde_json::from_value::<HubModel>(h.clone())
    {
        out.push(("hub", format!("hub must be {{ repo, file, revision, endpoint, cache_dir }}: {e}")));
    }
    match (model, hub) {
        (None, None) => out.push(("model", "set `model` (a GGUF file) or `hub` ({ repo, file })".to_string())),
        (Some(m), _) => {
            let path = root.join(m);
            match is_gguf(&path) {
                Ok(true) => {}
                Ok(false) => {
                    out.push(("model", format!("{} is not a GGUF file (no GGUF magic bytes)", path.display())))
                }
                Err(_) if hub.is_some() => {}
                Err(e) => out.push(("model", format!("cannot read the model {}: {e}", path.display()))),
            }
        }
        (None, Some(_)) => {}
    }
    if let Some(extra) = options.get("extra").and_then(Value::as_object)
        && let Some(k) = extra.keys().find(|k| !EXTRA_SAMPLERS.contains(&k.as_str()))
    {
        out.push(("extra", format!("\"{k}\" is not a sampler of the local provider ({})", EXTRA_SAMPLERS.join(", "))));
    }
    if let Some(sha) = options.get("sha256").and_then(Value::as_str)
        && (sha.len() != 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()))
    {
        out.push(("sha256", format!("\"{sha}\" is not a SHA-256 (64 hexadecimal digits)")));
    }
    out
}

/// The model file of a `local` provider: `model` when it exists, else the hub's file
/// (downloaded unless `offline`), and the hub commit it came from.
pub fn model_file(o: &LocalOptions, root: &Path, offline: bool) -> Result<(PathBuf, Option<String>)> {
    if let Some(m) = &o.model {
        let path = root.join(m);
        if path.is_file() || o.hub.is_none() {
            if !is_gguf(&path).with_context(|| format!("reading the model {}", path.display()))? {
                bail!("{} is not a GGUF file", path.display());
            }
            return Ok((path, None));
        }
    }
    let Some(hub) = &o.hub else { bail!("set `model` (a GGUF file) or `hub`") };
    let spec = hub.spec();
    let root = root.to_path_buf();
    // hf-hub is async: resolve on a thread of its own with a small runtime (once per run).
    let files = std::thread::scope(|s| {
        s.spawn(|| -> Result<synth_core::hub::HubFiles> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(spec.resolve(&root, offline))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the hub download panicked"))?
    })
    .with_context(|| format!("the model {} of {}", hub.file, hub.repo))?;
    let (_, path) = files.files.into_iter().next().context("the hub returned no file")?;
    if !is_gguf(&path).with_context(|| format!("reading the model {}", path.display()))? {
        bail!("{}/{}@{} ({}) is not a GGUF file", hub.repo, hub.file, files.commit, path.display());
    }
    Ok((path, Some(files.commit)))
}

/// What a `local` provider's answers depend on: the model's content (BLAKE3 of the file when
/// it is on this machine, else the hub file and revision), its context and generation.
pub fn identity(o: &LocalOptions, root: &Path) -> Value {
    let model = match model_file(o, root, true) {
        Ok((path, _)) => match synth_core::store::filehash::hash_file(&path) {
            Ok(h) => format!("gguf:{h}"),
            Err(_) => format!("gguf:{}", path.display()),
        },
        Err(_) => match &o.hub {
            Some(h) => format!("hub:{}/{}@{}", h.repo, h.file, h.revision),
            None => format!("file:{}", o.model.clone().unwrap_or_default()),
        },
    };
    let mut id = serde_json::json!({"kind": "local", "model": model, "context": o.context, "params": o.generation});
    // Only when not the default, so identities of the default keep their bytes.
    if o.kv_cache != "f16" {
        id["kv_cache"] = o.kv_cache.clone().into();
    }
    // Flash attention off gives other numbers than on ("auto" and "on" are the same: on);
    // only "off" is named, so identities of the default keep their bytes.
    if o.flash_attention == "off" {
        id["flash_attention"] = "off".into();
    }
    // Generation prompts' chunk grid (likelihoods keep `batch_tokens`): answers cached with
    // another grid are other numbers.
    id["chunk_tokens"] = o.chunk_tokens.min(o.batch_tokens.max(16)).into();
    if let Some(n) = o.max_string_chars {
        id["max_string_chars"] = n.into();
    }
    if let Some(n) = o.max_items {
        id["max_items"] = n.into();
    }
    id
}

/// A loaded `local` provider: the engine (started at the first request) and its identity.
pub struct LocalChat {
    settings: engine::Settings,
    engine: OnceLock<engine::Engine>,
    /// Shown as the answering model.
    pub name: String,
}

/// `SYNTH_LOCAL_THREADS`: the thread count of `local` providers that set none (a machine
/// shared with other work: the cores left free; a test suite running tests side by side).
/// Not a number, or 0: unset.
fn threads_from_env() -> Option<usize> {
    std::env::var(THREADS_ENV).ok()?.trim().parse().ok().filter(|n| *n > 0)
}

/// The environment variable [`threads_from_env`] reads.
pub const THREADS_ENV: &str = "SYNTH_LOCAL_THREADS";

impl LocalChat {
    pub fn new(o: &LocalOptions, path: PathBuf, provider: &str) -> LocalChat {
        let threads = o
            .threads
            .or_else(threads_from_env)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        LocalChat {
            settings: engine::Settings {
                path,
                parallel: o.parallel,
                share_prompts: o.share_prompts,
                context: o.context,
                batch_tokens: o.batch_tokens.max(16),
                chunk_tokens: o.chunk_tokens,
                kv_q8: o.kv_cache == "q8_0",
                max_string_chars: o.max_string_chars,
                max_items: o.max_items,
                // Decided here, not by llama.cpp's own "auto", so the engine knows whether a
                // lone token needs its ballast.
                flash_attention: Some(o.flash_attention != "off"),
                threads: threads as i32,
                provider: provider.to_string(),
            },
            engine: OnceLock::new(),
            name,
        }
    }

    fn engine(&self) -> &engine::Engine {
        self.engine.get_or_init(|| engine::Engine::start(self.settings.clone()))
    }

    /// The engine's counters so far (zero before the first request).
    pub fn stats(&self) -> engine::Stats {
        self.engine.get().map(|e| e.stats()).unwrap_or_default()
    }

    /// A log-likelihood with the log-probability of each continuation token.
    pub async fn loglik_tokens(&self, req: &LoglikRequest) -> Result<(Loglik, Vec<f64>), LlmError> {
        let done = self
            .engine()
            .submit(engine::Work::Loglik { context: req.context.clone(), continuation: req.continuation.clone() })
            .await?;
        let logprob = done.token_logprobs.iter().sum();
        Ok((Loglik { logprob, tokens: done.token_logprobs.len() as u64 }, done.token_logprobs))
    }
}

/// The samplers `extra` may set (vLLM's names).
pub const EXTRA_SAMPLERS: [&str; 9] = [
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "penalty_last_n",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
];

/// A request's samplers from its generation parameters.
fn sampling(params: &GenParams, sample: u32) -> Result<engine::Sampling, String> {
    let num = |k: &str| -> Result<Option<f64>, String> {
        match params.extra.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("extra.{k} must be a number, found {v}")),
        }
    };
    if let Some(k) = params.extra.keys().find(|k| !EXTRA_SAMPLERS.contains(&k.as_str())) {
        return Err(format!("extra.{k} is not a sampler of the local provider ({})", EXTRA_SAMPLERS.join(", ")));
    }
    Ok(engine::Sampling {
        temperature: params.temperature.unwrap_or(0.8) as f32,
        top_p: params.top_p.map(|p| p as f32),
        top_k: num("top_k")?.map(|k| k as i32),
        min_p: num("min_p")?.map(|p| p as f32),
        repetition_penalty: num("repetition_penalty")?.unwrap_or(1.0) as f32,
        frequency_penalty: num("frequency_penalty")?.unwrap_or(0.0) as f32,
        presence_penalty: num("presence_penalty")?.unwrap_or(0.0) as f32,
        penalty_last_n: num("penalty_last_n")?.unwrap_or(64.0) as i32,
        dry: num("dry_multiplier")?.filter(|m| *m > 0.0).map(|m| {
            let base = num("dry_base").ok().flatten().unwrap_or(1.75);
            let allowed = num("dry_allowed_length").ok().flatten().unwrap_or(2.0);
            (m as f32, base as f32, allowed as i32)
        }),
        seed: request_seed(params.seed, sample),
    })
}

/// Each request's sampling seed: the configured seed and the sample index (so `n` samples
/// of one prompt differ, and the same request always draws the same).
fn request_seed(seed: Option<i64>, sample: u32) -> u32 {
    let h = blake3::hash(format!("local-seed/{}/{sample}", seed.unwrap_or(0)).as_bytes());
    // u32::MAX is llama.cpp's "random seed".
    u32::from_le_bytes(h.as_bytes()[..4].try_into().expect("4 bytes")).min(u32::MAX - 1)
}

#[async_trait::async_trait]
impl ChatBackend for LocalChat {
    async fn chat_once(&self, req: &ChatRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        let schema = match &req.structured {
            Some(s) if s.form == Form::Grammar => Some(s.schema.schema.clone()),
            Some(s) => {
                return Err(LlmError::new(
                    ErrorKind::Rejected,
                    format!("unsupported structured form {}", s.form.name()),
                ));
            }
            None => None,
        };
        let sampling = sampling(params, req.sample).map_err(|e| LlmError::new(ErrorKind::Rejected, e))?;
        let work = engine::Work::Generate(engine::Generate {
            messages: req.messages.clone(),
            max_tokens: params.max_tokens.unwrap_or(1024),
            sampling,
            stop: params.stop.clone().unwrap_or_default(),
            schema,
        });
        let done = self.engine().submit(work).await?;
        Ok(ChatResponse {
            text: done.text,
            finish_reason: done.finish_reason.to_string(),
            usage: Usage { prompt_tokens: done.prompt_tokens, completion_tokens: done.completion_tokens },
            model: self.name.clone(),
            system_fingerprint: None,
        })
    }

    async fn loglik_once(&self, req: &LoglikRequest, _params: &GenParams) -> Result<ChatResponse, LlmError> {
        let (ll, tokens) = self.loglik_tokens(req).await?;
        Ok(ChatResponse {
            text: ll.to_text(),
            finish_reason: "loglik".into(),
            usage: Usage { prompt_tokens: tokens.len() as u64, completion_tokens: 0 },
            model: self.name.clone(),
            system_fingerprint: None,
        })
    }

    fn engine_stats(&self) -> Option<EngineStats> {
        Some(self.stats())
    }
}

/// A built `local` provider's parts for [`synth_llm::provider::Provider`].
pub struct Built {
    pub backend: Arc<LocalChat>,
    pub path: PathBuf,
    /// `gguf:<BLAKE3 of the file>`: stands for the model in cache keys.
    pub cache_identity: String,
    pub hub_commit: Option<String>,
}

/// Resolve the model (downloading it from the hub when needed), check its hash, and make
/// the backend (its engine starts at the first request).
pub fn build(o: &LocalOptions, root: &Path, provider: &str) -> Result<Built> {
    let (path, hub_commit) = model_file(o, root, false).with_context(|| format!("provider \"{provider}\""))?;
    if let Some(want) = &o.sha256 {
        let got = sha256_file(&path)?;
        if !got.eq_ignore_ascii_case(want) {
            bail!("provider \"{provider}\": {} has SHA-256 {got}, not the configured {want}", path.display());
        }
    }
    let hash = synth_core::store::filehash::hash_file(&path).with_context(|| format!("hashing {}", path.display()))?;
    let backend = Arc::new(LocalChat::new(o, path.clone(), provider));
    Ok(Built { backend, path, cache_identity: format!("gguf:{hash}"), hub_commit })
}

fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:x}", h.finalize()))
}

/// The `local` provider kind.
pub static PROVIDER: ProviderDesc = ProviderDesc {
    kind: ProviderKind {
        name: "local",
        about: "a GGUF model run inside synth through llama.cpp: continuous batching, JSON-Schema constrained decoding, the model's chat template, log-likelihoods",
        options: OPTIONS,
        check: Some(check),
    },
    networked: false,
    identity: provider_identity,
    build: build_provider,
    with_model: Some(with_model),
    hub_model: Some(hub_model),
    pin_hub_model: Some(pin_hub_model),
    batch_apis: &[],
};

fn provider_identity(decl: &Decl, root: &Path) -> Result<Value> {
    let o: LocalOptions = serde_json::from_value(decl.options.clone())?;
    Ok(identity(&o, root))
}

fn build_provider(decl: &Decl, ctx: &BuildCtx) -> Result<Provider> {
    let name = decl.name.as_str();
    let o: LocalOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
    let built = build(&o, ctx.root, name)?;
    // An in-process model: no limits to learn, nothing to retry (its errors are the
    // request's or the engine's), and a request waits for its turn however long
    // the queue (a timeout would send it again beside the one still decoding).
    let cfg = RateConfig {
        max_concurrency: o.max_concurrency,
        initial_concurrency: o.max_concurrency,
        timeout: std::time::Duration::from_secs(7 * 24 * 3600),
        max_retries: 0,
        learn_limits: false,
        ..Default::default()
    };
    let rate = ctx.rates.get(&format!("local|{name}|{}", built.cache_identity), name, cfg);
    let model = built.backend.name.clone();
    let mut p = Provider::new(name, &PROVIDER, model, o.generation, built.backend, rate);
    p.base_url = built.path.display().to_string();
    p.price = Some(synth_llm::pricing::Price { input: 0.0, output: 0.0 });
    // The model's content stands for its path and name in cache keys.
    p.cache_identity = Some(built.cache_identity);
    p.model_by_content = true;
    p.structured = Negotiation::new(vec![Form::Grammar]);
    Ok(p)
}

/// A checkpoint's file instead of the declared model (it has its own hash, and no hub).
fn with_model(decl: &mut Decl, model: &Path) {
    if let Some(o) = decl.options.as_object_mut() {
        o.insert("model".into(), model.display().to_string().into());
        o.remove("hub");
        o.remove("sha256");
    }
}

/// Read the hub file at `commit` (the lock's).
fn pin_hub_model(decl: &mut Decl, commit: &str) {
    if let Some(h) = decl.options.get_mut("hub").and_then(|h| h.as_object_mut()) {
        h.insert("revision".into(), commit.into());
    }
}

/// The hub file a declaration reads, and whether its `model` file is on this machine.
fn hub_model(decl: &Decl, root: &Path) -> Option<(HubModel, bool)> {
    let o: LocalOptions = serde_json::from_value(decl.options.clone()).ok()?;
    let on_disk = o.model.as_ref().is_some_and(|m| root.join(m).is_file());
    Some((o.hub?, on_disk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_by_sample_and_repeat() {
        assert_eq!(request_seed(Some(1), 0), request_seed(Some(1), 0));
        assert_ne!(request_seed(Some(1), 0), request_seed(Some(1), 1));
        assert_ne!(request_seed(Some(1), 0), request_seed(Some(2), 0));
        assert_ne!(request_seed(None, 0), u32::MAX);
    }

    #[test]
    fn plan_checks_name_the_file() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("notes.gguf"), "hello").unwrap();
        let opts = |m: &str| serde_json::json!({"model": m}).as_object().unwrap().clone();
        let e = check(&opts("notes.gguf"), &dir);
        assert!(e[0].1.contains("notes.gguf") && e[0].1.contains("not a GGUF"), "{e:?}");
        let e = check(&opts("missing.gguf"), &dir);
        assert!(e[0].1.contains("missing.gguf"), "{e:?}");
        std::fs::write(dir.join("m.gguf"), b"GGUF\x03\x00\x00\x00").unwrap();
        assert!(check(&opts("m.gguf"), &dir).is_empty());
        let e = check(&serde_json::Map::new(), &dir);
        assert_eq!(e[0].0, "model");
        // A missing file with a hub to fall back on is fine at plan time.
        let mut o = opts("missing.gguf");
        o.insert("hub".into(), serde_json::json!({"repo": "a/b", "file": "m.gguf"}));
        assert!(check(&o, &dir).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_identity_names_what_changes_the_numbers() {
        let opts = |extra: serde_json::Value| -> LocalOptions {
            let mut o = serde_json::json!({"model": "/nowhere/m.gguf", "context": 1024, "parallel": 2, "batch_tokens": 512, "max_concurrency": 4});
            o.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            serde_json::from_value(o).unwrap()
        };
        let root = Path::new("/nowhere");
        let base = identity(&opts(serde_json::json!({})), root);
        assert_eq!(base, identity(&opts(serde_json::json!({"flash_attention": "on", "parallel": 8})), root));
        for other in [
            serde_json::json!({"flash_attention": "off"}),
            serde_json::json!({"chunk_tokens": 512}),
            serde_json::json!({"kv_cache": "q8_0"}),
            serde_json::json!({"context": 2048}),
        ] {
            assert_ne!(base, identity(&opts(other.clone()), root), "{other}");
        }
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("synth-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
