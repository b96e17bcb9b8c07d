//! The services one run shares, above the capabilities they combine: the provider
//! and embedder declarations from `[providers.*]` / `[embedders.*]`, built lazily (so
//! a run that never calls a provider never needs its key), one rate controller per
//! (kind, base URL, model, key) shared by every stage, the cache database, the
//! network runtime, and the call path: cache lookup → single-flight → journal →
//! rate-limited call → durable store. A request identical to one already answered is
//! never paid for again. Calls to network providers run that whole path on the
//! network runtime (`llm/net.rs`); the offline provider runs on the caller's. In batch
//! mode (`batch.rs`) a request that is not cached is deferred to a provider batch
//! instead of sent; the cost cap (`cost.rs`, `max_cost_usd`) guards both paths.

pub mod batch;
pub mod cost;
pub mod estimate;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};

use synth_core::config::decl::Decl;
use synth_core::store::batch::BatchLog;
use synth_core::store::cache::{Cache, ResponseRow, Use};
use synth_llm::batch::{Deferred, Route};
use synth_llm::net::NetRuntime;
use synth_llm::offline::OfflineShape;
use synth_llm::provider::{BuildCtx, Provider, ProviderDesc, find_kind};
use synth_llm::rate::{RateControl, RateRegistry};
use synth_llm::{
    Call, CallCtx, ChatRequest, ChatResponse, Completed, ErrorKind, LlmError, LoglikRequest, estimate_tokens,
};

type Flight = Arc<tokio::sync::OnceCell<Result<Completed, LlmError>>>;

/// Completion tokens a request without `max_tokens` is assumed to take at most (batch
/// token and cost estimates; the cost cap: set `max_tokens` for a cap that holds
/// whatever the model answers).
const DEFAULT_MAX_OUT: u32 = 4096;
/// Tokens a chat format adds per message (role, separators), counted by the cost cap.
const MESSAGE_OVERHEAD: u64 = 8;
/// Tokens a chat format adds per message, as the estimate counts them (ChatML's
/// `<|im_start|>role\n … <|im_end|>\n`: about 4).
const ESTIMATE_MESSAGE_TOKENS: u64 = 4;

/// Shared services of one run.
pub struct Services {
    out_dir: PathBuf,
    root: PathBuf,
    providers: BTreeMap<String, Decl>,
    embedders: BTreeMap<String, Decl>,
    cache: Mutex<Option<Arc<Cache>>>,
    built: Mutex<HashMap<String, Arc<Provider>>>,
    rates: RateRegistry,
    catalog: Catalog,
    built_embedders: Mutex<HashMap<String, Arc<dyn synth_embed::Embedder>>>,
    inflight: Mutex<HashMap<String, Flight>>,
    warned_price: Mutex<std::collections::BTreeSet<String>>,
    net: Mutex<Option<Arc<NetRuntime>>>,
    /// A read-only cache consulted on a miss (a shard's run cache, `dag::shard`).
    fallback: Option<synth_core::store::cache::Fallback>,
    /// Claims shared with the other shards of a wave, so a request two shards both
    /// need is paid once (`store::claims`).
    claims: Option<synth_core::store::claims::Claims>,
    /// `max_cost_usd` of the run and its stages.
    pub costs: cost::CostGuard,
    batch_log: Mutex<Option<Arc<BatchLog>>>,
    /// `synth run --detach`: batch stages stop once their batches are submitted.
    detach: std::sync::atomic::AtomicBool,
    /// `--dry-run`'s estimate: calls are counted and answered by a stand-in (a sample
    /// sent), not sent (`estimate.rs`).
    estimate: std::sync::OnceLock<Arc<estimate::Estimator>>,
    /// The response cache's directory when it is not this run's (the estimate's
    /// simulation reads and fills the real run's).
    cache_dir: std::sync::OnceLock<PathBuf>,
}

/// What providers are built from: the provider kinds a run knows (the registry's) and the
/// shapes the offline provider imitates (the engine's and every method's).
#[derive(Debug, Clone)]
pub struct Catalog {
    pub kinds: Arc<[&'static ProviderDesc]>,
    pub shapes: Arc<[&'static OfflineShape]>,
}

impl Catalog {
    /// The kind of a declaration, or an error naming it.
    pub fn kind_of(&self, decl: &Decl) -> Result<&'static ProviderDesc> {
        find_kind(&self.kinds, &decl.kind)
            .ok_or_else(|| anyhow!("provider \"{}\": unknown kind \"{}\"", decl.name, decl.kind))
    }
}

impl Services {
    pub fn new(
        out_dir: &Path,
        root: &Path,
        providers: BTreeMap<String, Decl>,
        embedders: BTreeMap<String, Decl>,
        catalog: Catalog,
    ) -> Arc<Services> {
        Arc::new(Services {
            out_dir: out_dir.to_path_buf(),
            root: root.to_path_buf(),
            providers,
            embedders,
            cache: Mutex::new(None),
            built: Mutex::new(HashMap::new()),
            rates: RateRegistry::default(),
            catalog,
            built_embedders: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            warned_price: Mutex::new(Default::default()),
            net: Mutex::new(None),
            fallback: None,
            claims: None,
            costs: Default::default(),
            batch_log: Mutex::new(None),
            detach: Default::default(),
            estimate: Default::default(),
            cache_dir: Default::default(),
        })
    }

    /// Services for one shard of a sharded run (from fresh ones, [`Services::new`], not
    /// shared yet): each provider's and embedder's limits
    /// scaled by `share` (the shard's part of them), and answers missing from the
    /// shard's own cache looked up in `fallback` (the run's cache) before paying.
    pub fn for_shard(
        base: Arc<Services>,
        share: f64,
        fallback: Option<&Path>,
        claims: Option<synth_core::store::claims::Claims>,
    ) -> Result<Arc<Services>> {
        let mut s = Arc::into_inner(base).expect("services not shared yet");
        s.rates = RateRegistry::with_share(share);
        s.fallback = fallback.map(synth_core::store::cache::Fallback::open).transpose()?;
        s.claims = claims;
        Ok(Arc::new(s))
    }

    /// What a run asks beyond its stages: `--detach`, and `[pipeline] max_cost_usd`.
    pub fn set_run_options(&self, detach: bool, max_cost_usd: Option<f64>) {
        self.detach.store(detach, std::sync::atomic::Ordering::Relaxed);
        self.costs.set_run_cap(max_cost_usd);
    }

    /// Make this run `--dry-run`'s estimate: its calls are counted by `estimate` and
    /// answered by a stand-in (a sample sent); the response cache read (and, for the
    /// sample, filled) is the one in `cache_dir`.
    pub fn set_estimate(&self, estimate: Arc<estimate::Estimator>, cache_dir: PathBuf) {
        let _ = self.estimate.set(estimate);
        let _ = self.cache_dir.set(cache_dir);
    }

    /// Whether this run is `--dry-run`'s simulation (its answers stand-ins).
    pub fn estimating(&self) -> bool {
        self.estimate.get().is_some()
    }

    pub fn detach(&self) -> bool {
        self.detach.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cache, if this run opened it.
    pub fn opened_cache(&self) -> Option<Arc<Cache>> {
        self.cache.lock().expect("cache").clone()
    }

    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// The batch journal of the output directory (opened on first use).
    pub fn batch_log(&self) -> Result<Arc<BatchLog>> {
        let mut l = self.batch_log.lock().expect("batch log");
        if let Some(log) = l.as_ref() {
            return Ok(log.clone());
        }
        let log = Arc::new(BatchLog::open(&self.out_dir.join(synth_core::store::state::INTERNAL_DIR))?);
        *l = Some(log.clone());
        Ok(log)
    }

    /// The cache database of the output directory (opened on first use).
    pub fn cache(&self) -> Result<Arc<Cache>> {
        let mut c = self.cache.lock().expect("cache");
        if let Some(cache) = c.as_ref() {
            return Ok(cache.clone());
        }
        let dir = match self.cache_dir.get() {
            Some(d) => d.clone(),
            None => self.out_dir.join(synth_core::store::state::INTERNAL_DIR),
        };
        let cache = Arc::new(Cache::open(&dir)?);
        if cache.recovered() > 0 {
            tracing::info!(
                "{} response(s) received before the previous run stopped were recovered from the journal",
                cache.recovered()
            );
        }
        let (sent, queued) = cache.in_flight_split();
        if sent > 0 {
            tracing::warn!(
                "{sent} request(s) had been sent and were not answered when the previous run stopped: they are sent again, and may be billed twice (an answer in transit is lost with the process); {queued} more were only queued; everything else comes from the cache"
            );
        } else if queued > 0 {
            tracing::info!(
                "{queued} request(s) were queued, not yet sent, when the previous run stopped: they are sent now; everything else comes from the cache"
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
    /// Build (once) and return a provider.
    pub fn provider(&self, name: &str) -> Result<Arc<Provider>> {
        if let Some(p) = self.built.lock().expect("built").get(name) {
            return Ok(p.clone());
        }
        let decl = self.provider_decl(name)?.clone();
        let keyless = self.estimate.get().is_some_and(|e| e.sample == 0);
        let provider = Arc::new(self.build_provider(&decl, keyless)?);
        self.built.lock().expect("built").insert(name.to_string(), provider.clone());
        Ok(provider)
    }

    /// A `local` provider with another model file: a checkpoint a stage upstream exported
    /// (`generate`'s `checkpoint`). Its identity, cache keys included, is that file's content
    /// hash; built once per file and run.
    pub fn provider_with_model(&self, name: &str, model: &std::path::Path) -> Result<Arc<Provider>> {
        let key = format!("{name}\u{0}{}", model.display());
        if let Some(p) = self.built.lock().expect("built").get(&key) {
            return Ok(p.clone());
        }
        let mut decl = self.provider_decl(name)?.clone();
        let Some(with_model) = self.catalog.kind_of(&decl)?.with_model else {
            anyhow::bail!(
                "provider \"{name}\" is of kind \"{}\": a checkpoint's model runs on a \"local\" provider",
                decl.kind
            );
        };
        // The checkpoint is this file, not the declared one (nor the hub's), and has its own hash.
        with_model(&mut decl, model);
        let provider = Arc::new(
            self.build_provider(&decl, false)
                .with_context(|| format!("loading the checkpoint {} on provider \"{name}\"", model.display()))?,
        );
        self.built.lock().expect("built").insert(key, provider.clone());
        Ok(provider)
    }

    /// Build a provider from its declaration (`keyless`: an API that needs a key builds without one).
    fn build_provider(&self, decl: &Decl, keyless: bool) -> Result<Provider> {
        let ctx = BuildCtx { root: &self.root, rates: &self.rates, shapes: &self.catalog.shapes, keyless };
        (self.catalog.kind_of(decl)?.build)(decl, &ctx)
    }

    /// What a provider's answers depend on, without building it (for fingerprints).
    pub fn provider_identity(&self, name: &str) -> Result<serde_json::Value> {
        let decl = self.provider_decl(name)?;
        (self.catalog.kind_of(decl)?.identity)(decl, &self.root)
    }

    /// The provider kinds this run knows.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
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
        self.providers.get(name).and_then(|d| find_kind(&self.catalog.kinds, &d.kind)).is_some_and(|k| k.networked)
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
        self.dispatch(provider, Call::Chat(req), ctx).await
    }

    /// One log-likelihood call through the same path as [`Services::chat`]; the response's
    /// text is a [`synth_llm::Loglik`] as JSON.
    pub async fn loglik(
        self: &Arc<Self>,
        provider: &Arc<Provider>,
        req: LoglikRequest,
        ctx: &CallCtx,
    ) -> Result<Completed, LlmError> {
        self.dispatch(provider, Call::Loglik(req), ctx).await
    }

    async fn dispatch(
        self: &Arc<Self>,
        provider: &Arc<Provider>,
        call: Call,
        ctx: &CallCtx,
    ) -> Result<Completed, LlmError> {
        if !provider.networked() || synth_llm::net::on_net_thread() {
            return self.call_here(provider, call, ctx).await;
        }
        let net = self.net().map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("{e:#}")))?;
        let (this, provider, ctx) = (self.clone(), provider.clone(), ctx.clone());
        // The record's sending slot goes along (`llm::slot`): given back once answered.
        let slot = synth_llm::slot::current();
        net.run(synth_llm::slot::within(slot, async move { this.call_here(&provider, call, &ctx).await }))
            .await
            .unwrap_or_else(|e| Err(LlmError::new(ErrorKind::Unavailable, e.to_string())))
    }

    /// One call in this process's runtime: the cache (and a shard's run cache), the
    /// estimate's stand-in, the batch route, then the paid call. Each step is its own
    /// function below; the order is the invariant (nothing is sent that a cache holds).
    async fn call_here(&self, provider: &Arc<Provider>, call: Call, ctx: &CallCtx) -> Result<Completed, LlmError> {
        let req = Request::of(provider, &call);
        let cache = self.cache().map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("{e:#}")))?;
        let usage = Use { stage: ctx.stage.clone(), fingerprint: ctx.fingerprint.clone() };
        let estimating = self.estimate.get();
        let batch_factor = provider.batch.as_ref().filter(|_| ctx.batch.is_some()).map(|b| b.price_factor);
        let caller = estimate::Caller {
            stage: &ctx.stage,
            provider: &provider.name,
            model: &provider.model,
            // A model in this process costs nothing.
            price: provider
                .price
                .or_else(|| (!provider.networked()).then_some(synth_llm::pricing::Price { input: 0.0, output: 0.0 })),
            batch_factor,
            rate: &provider.rate.cfg,
        };
        if let Some(done) = self.lookup(&cache, &req.key, &usage, ctx, estimating, &caller).await? {
            return Ok(done);
        }
        // The estimate: a stand-in answers (nothing sent), unless the call is one of the
        // stage's sample (sent online, then measured).
        let sampling = match estimating {
            None => None,
            Some(est) if est.take_sample(&caller) => Some((est, std::time::Instant::now())),
            Some(est) => return self.stand_in(est, &caller, &call, &req).await,
        };
        if sampling.is_none() {
            Self::route_to_batch(provider, &call, &req, ctx)?;
        }
        let result = self.paid_call(provider, &call, &req, ctx, &cache, &usage).await;
        if let Some((est, started)) = sampling {
            match &result {
                Ok(done) => {
                    let u = &done.response.usage;
                    est.measured(
                        &caller,
                        u.prompt_tokens,
                        u.completion_tokens,
                        req.prompt + ESTIMATE_MESSAGE_TOKENS * messages_of(&call),
                        started.elapsed().as_secs_f64(),
                    );
                }
                Err(_) => est.sample_failed(&caller),
            }
        }
        result
    }

    /// The answer this run's cache (or a shard's run cache) holds for `key`.
    async fn lookup(
        &self,
        cache: &Cache,
        key: &str,
        usage: &Use,
        ctx: &CallCtx,
        estimating: Option<&Arc<estimate::Estimator>>,
        caller: &estimate::Caller<'_>,
    ) -> Result<Option<Completed>, LlmError> {
        match cache.get_response(key, usage) {
            Ok(Some(hit)) => {
                if let Ok(response) = serde_json::from_str::<ChatResponse>(&hit.response) {
                    if let Some(est) = estimating {
                        est.cached(caller);
                    }
                    ctx.progress.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    ctx.progress.note_served(&response.model, response.system_fingerprint.as_deref());
                    return Ok(Some(Completed { response, cached: true, retries: 0 }));
                }
            }
            Ok(None) => {}
            Err(e) => return Err(LlmError::new(ErrorKind::Unavailable, format!("cache: {e:#}"))),
        }
        if let Some(fallback) = &self.fallback {
            match fallback.get(key) {
                Ok(Some(row)) => {
                    if let Ok(response) = serde_json::from_str::<ChatResponse>(&row.response) {
                        // Kept in this run's own cache too (a shard's cache is merged into its run's).
                        keep_answer(cache, key, row, usage, ctx, "a cached response").await?;
                        return Ok(Some(Completed { response, cached: true, retries: 0 }));
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("the run's cache: {e:#}"),
            }
        }
        Ok(None)
    }

    /// `--dry-run`'s estimate of a call outside the sample: counted, and answered by a
    /// stand-in (a JSON value valid against a structured request's schema, else the
    /// offline generator), nothing sent.
    async fn stand_in(
        &self,
        est: &estimate::Estimator,
        caller: &estimate::Caller<'_>,
        call: &Call,
        req: &Request,
    ) -> Result<Completed, LlmError> {
        if est.first_time(&req.key) {
            // Prompt tokens by the rule, plus what a chat format adds per message.
            est.stood_in(caller, req.prompt + ESTIMATE_MESSAGE_TOKENS * messages_of(call), req.max_out);
        } else {
            // The run answers an identical request from its cache.
            est.cached(caller);
        }
        use synth_llm::ChatBackend;
        let stand_in = synth_llm::offline::Offline { seed: 0, score_one: 0.5, shapes: self.catalog.shapes.clone() };
        let response = match call {
            // A structured request: a JSON value valid against its schema.
            Call::Chat(chat) if chat.structured.is_some() => {
                use rand::SeedableRng;
                let schema = &chat.structured.as_ref().expect("structured").schema.schema;
                let asked = chat.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
                let mut rng = rand_chacha::ChaCha8Rng::from_seed(*blake3::hash(req.key.as_bytes()).as_bytes());
                let text = synth_llm::offline::schema_instance(schema, &asked, &mut rng).to_string();
                ChatResponse {
                    usage: synth_llm::Usage { prompt_tokens: req.prompt, completion_tokens: estimate_tokens(&text) },
                    text,
                    finish_reason: "stop".into(),
                    model: synth_llm::offline::MODEL.into(),
                    system_fingerprint: None,
                }
            }
            Call::Chat(chat) => stand_in.chat_once(chat, &req.params).await?,
            Call::Loglik(ll) => stand_in.loglik_once(ll, &req.params).await?,
        };
        Ok(Completed { response, cached: false, retries: 0 })
    }

    /// In batch mode, where a call that is not cached goes: deferred to the stage's batch
    /// (an error the stage's loop knows), failed, or `Ok` to be sent online.
    fn route_to_batch(provider: &Provider, call: &Call, req: &Request, ctx: &CallCtx) -> Result<(), LlmError> {
        let Some(route) = ctx.batch.as_ref() else { return Ok(()) };
        match route.route(&req.key) {
            Route::Defer => {
                let body = provider.backend.batch_body(call, &req.params).ok_or_else(|| {
                    LlmError::new(
                        ErrorKind::Rejected,
                        format!("provider \"{}\" cannot send this request in a batch", provider.name),
                    )
                })?;
                route.defer(Deferred {
                    key: req.key.clone(),
                    doc: req.doc_text.clone(),
                    body,
                    tokens_in: req.prompt,
                    max_in: req.max_in,
                    max_out: req.max_out,
                })?;
                Err(synth_llm::batch::deferred())
            }
            Route::Fail(e) => Err(e),
            Route::Online => Ok(()),
        }
    }

    /// The paid call: its slot, its most cost reserved against `max_cost_usd`, sent once
    /// however many records ask it at the same time (and once over a wave's shards: a
    /// claim), journaled before it leaves, through the provider's rate control, and stored
    /// durably before it counts as done.
    async fn paid_call(
        &self,
        provider: &Arc<Provider>,
        call: &Call,
        req: &Request,
        ctx: &CallCtx,
        cache: &Arc<Cache>,
        usage: &Use,
    ) -> Result<Completed, LlmError> {
        let key = &req.key;
        // A record that gave its slot back after an earlier answer takes one again.
        synth_llm::slot::sending().await;
        // The most this call may cost, held against `max_cost_usd` until it is paid.
        let reserved = if self.costs.capped(&ctx.stage) {
            let most = provider.price.map(|p| p.cost(req.max_in, req.max_out)).unwrap_or(0.0);
            self.costs.reserve(&ctx.stage, most)?
        } else {
            cost::Reserved(0.0)
        };
        // Claims across the wave's shards are for paid network calls: the offline
        // provider answers the same for free, a claim would only cost two file writes.
        let claims = self.claims.as_ref().filter(|_| provider.networked());
        // Identical requests in flight at the same time are sent once.
        let flight: Flight = self.inflight.lock().expect("inflight").entry(key.clone()).or_default().clone();
        let result = flight
            .get_or_init(|| async {
                if let Some(claims) = claims {
                    match claims.claim(key).await {
                        Ok(synth_core::store::claims::Claim::Mine) => {}
                        Ok(synth_core::store::claims::Claim::Answered(bytes)) => {
                            // Another shard paid for it: keep its answer in this cache too.
                            let row: ResponseRow = serde_json::from_slice(&bytes)
                                .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("a shared answer: {e}")))?;
                            let response: ChatResponse = serde_json::from_str(&row.response)
                                .map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("a shared answer: {e}")))?;
                            // Another shard paid: nothing of this reservation is spent here.
                            self.costs.settle(&ctx.stage, reserved, 0.0);
                            keep_answer(cache, key, row, usage, ctx, "a shared answer").await?;
                            return Ok(Completed { response, cached: true, retries: 0 });
                        }
                        Err(e) => {
                            self.costs.settle(&ctx.stage, reserved, 0.0);
                            return Err(LlmError::new(ErrorKind::Unavailable, format!("claiming a request: {e:#}")));
                        }
                    }
                }
                if let Err(e) = cache.journal_start(key, &ctx.stage) {
                    return Err(LlmError::new(ErrorKind::Unavailable, format!("cache journal: {e:#}")));
                }
                let outcome = provider
                    .rate
                    .call(req.estimate, Some(&ctx.progress), || {
                        // From here an answer may be billed: journaled apart from queued.
                        if let Err(e) = cache.journal_sent(key) {
                            tracing::warn!("cache journal: {e:#}");
                        }
                        match call {
                            Call::Chat(chat) => provider.backend.chat_once(chat, &req.params),
                            Call::Loglik(ll) => provider.backend.loglik_once(ll, &req.params),
                        }
                    })
                    .await;
                match outcome {
                    Ok((response, retries)) => {
                        // Answered: the record's slot goes to the next one while the
                        // answer is made durable.
                        synth_llm::slot::answered();
                        self.store_answer(provider, req, ctx, cache, usage, claims, reserved, &response).await?;
                        Ok(Completed { response, cached: false, retries })
                    }
                    Err(e) => {
                        self.costs.settle(&ctx.stage, reserved, 0.0);
                        cache.journal_end(key);
                        if let Some(claims) = claims {
                            claims.release(key).await;
                        }
                        Err(e)
                    }
                }
            })
            .await
            .clone();
        self.inflight.lock().expect("inflight").remove(key);
        result
    }

    /// A paid answer made durable: shared with the wave's other shards, stored in the cache
    /// (the record counts as done only then), its cost settled and counted.
    #[allow(clippy::too_many_arguments)]
    async fn store_answer(
        &self,
        provider: &Provider,
        req: &Request,
        ctx: &CallCtx,
        cache: &Cache,
        usage: &Use,
        claims: Option<&synth_core::store::claims::Claims>,
        reserved: cost::Reserved,
        response: &ChatResponse,
    ) -> Result<(), LlmError> {
        let (tin, tout) = (response.usage.prompt_tokens, response.usage.completion_tokens);
        let cost = self.cost(provider, tin, tout);
        let row = ResponseRow {
            key: req.key.clone(),
            provider: provider.kind.to_string(),
            base_url: synth_core::secrets::scrub(&provider.base_url),
            model: provider.model.clone(),
            request: synth_core::secrets::scrub(&req.doc_text),
            response: serde_json::to_string(response).expect("serializable"),
            tokens_in: tin,
            tokens_out: tout,
            cost_usd: cost,
        };
        // Shared with the wave's other shards before it is journaled: once journaled here,
        // nobody sends it again.
        if let Some(claims) = claims
            && let Err(e) = claims.answer(&req.key, &serde_json::to_vec(&row).expect("serializable")).await
        {
            tracing::warn!("sharing an answer with the other shards: {e:#}");
        }
        // Durable before the record counts as done.
        if let Err(e) = cache.put_response(row, usage).await {
            return Err(LlmError::new(ErrorKind::Unavailable, format!("storing a paid response: {e:#}")));
        }
        self.costs.settle(&ctx.stage, reserved, cost);
        let p = &ctx.progress;
        p.tokens_in.fetch_add(tin, std::sync::atomic::Ordering::Relaxed);
        p.tokens_out.fetch_add(tout, std::sync::atomic::Ordering::Relaxed);
        p.cost_micro_usd.fetch_add((cost * 1e6).round() as u64, std::sync::atomic::Ordering::Relaxed);
        p.note_served(&response.model, response.system_fingerprint.as_deref());
        Ok(())
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
    pub fn embedder(&self, name: &str) -> Result<Arc<dyn synth_embed::Embedder>> {
        if let Some(e) = self.built_embedders.lock().expect("embedders").get(name) {
            return Ok(e.clone());
        }
        let decl = self.embedder_decl(name)?.clone();
        let e = synth_embed::build(&decl, &self.root, &self.rates)?;
        self.built_embedders.lock().expect("embedders").insert(name.to_string(), e.clone());
        Ok(e)
    }

    /// Rate-control counters of every endpoint used so far (for benchmarks and logs).
    pub fn rate_controls(&self) -> Vec<Arc<RateControl>> {
        self.rates.all()
    }
}

/// A call as the call path sees it: its parameters (the provider's, overlaid by the
/// request's), its cache document and key, and its token counts.
struct Request {
    params: synth_llm::GenParams,
    /// The cache document (JSON text) and its BLAKE3: the cache key and batch `custom_id`.
    doc_text: String,
    key: String,
    /// The prompt's tokens (an estimate).
    prompt: u64,
    /// The most the prompt can be (UTF-8 bytes: no byte-level tokenizer makes more).
    max_in: u64,
    /// The most the answer may take (`DEFAULT_MAX_OUT` when `max_tokens` is unset).
    max_out: u64,
    /// What the rate limiter counts (as it always has: 256 when `max_tokens` is unset).
    estimate: u64,
}

impl Request {
    fn of(provider: &Provider, call: &Call) -> Request {
        let no_params = synth_llm::GenParams::default();
        let params = provider.params.overlay(match call {
            Call::Chat(req) => &req.params,
            Call::Loglik(_) => &no_params,
        });
        let (doc, prompt, max_in, max_out) = match call {
            Call::Chat(req) => (
                Provider::request_doc(provider, req, &params),
                req.messages.iter().map(|m| estimate_tokens(&m.content)).sum::<u64>(),
                req.messages.iter().map(|m| m.content.len() as u64 + MESSAGE_OVERHEAD).sum::<u64>(),
                params.max_tokens.map(u64::from),
            ),
            Call::Loglik(req) => (
                Provider::loglik_doc(provider, req, &params),
                estimate_tokens(&req.context) + estimate_tokens(&req.continuation),
                (req.context.len() + req.continuation.len()) as u64 + MESSAGE_OVERHEAD,
                Some(1),
            ),
        };
        let estimate = prompt + max_out.unwrap_or(256);
        let doc_text = doc.to_string();
        let key = blake3::hash(doc_text.as_bytes()).to_hex().to_string();
        Request { params, doc_text, key, prompt, max_in, max_out: max_out.unwrap_or(DEFAULT_MAX_OUT as u64), estimate }
    }
}

/// Messages of a call (a log-likelihood is one), for the estimate's per-message tokens.
fn messages_of(call: &Call) -> u64 {
    match call {
        Call::Chat(req) => req.messages.len() as u64,
        Call::Loglik(_) => 1,
    }
}

/// Keep an answer paid for elsewhere (the run's cache, another shard of the wave) in this
/// run's cache, journaled as one received here would be, and count it as a cache hit.
async fn keep_answer(
    cache: &Cache,
    key: &str,
    row: ResponseRow,
    usage: &Use,
    ctx: &CallCtx,
    what: &str,
) -> Result<(), LlmError> {
    synth_llm::slot::answered();
    let kept = match cache.journal_start(key, &ctx.stage) {
        Ok(()) => cache.put_response(row, usage).await,
        Err(e) => Err(e),
    };
    kept.map_err(|e| LlmError::new(ErrorKind::Unavailable, format!("storing {what}: {e:#}")))?;
    ctx.progress.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}
