//! Batch mode of an LLM stage: its uncached requests go to the provider's batch API
//! instead of the wire, and their answers land in the same cache under the same keys,
//! so the stage's last pass reads every answer from the cache and writes the same
//! output an online run writes.
//!
//! - [`Collector`]: where the call path defers requests during a collecting pass
//!   (`stages::exec::batch_map_rows`). Each request becomes a line of a *part* file
//!   (`custom_id` = its cache key); a part closes at the API's request or byte limit, or
//!   at the enqueued-token limit, and is journaled (`store::batch`) once written.
//! - [`BatchStage::run_parts`]: submits the stage's parts in waves (the provider's
//!   enqueued tokens under `batch_enqueued_tokens`, each part's most possible cost
//!   under `max_cost_usd`), journaling every file id and batch id before and after it
//!   is created; polls; downloads ended batches and stores every answer in the cache at
//!   the batch price (in bulk; the part is journaled done once they are committed,
//!   [`BatchStage::finish_stores`], while the output pass already reads them). Lines without an answer that may get one (expired, cancelled,
//!   server errors, a failed batch) are resubmitted as a new part (the part's child,
//!   planned once even across restarts) up to `batch_attempts`, or sent online with
//!   `batch_fallback = "online"`; lines the provider rejects fail their record, as
//!   online. A restarted run resumes parts where the journal left them: an upload or a
//!   create that may have happened is looked for at the provider before it is done
//!   again, so nothing is paid twice.
//! - Ctrl-C leaves submitted batches running (the next run collects them); `--detach`
//!   stops the stage once everything is submitted ([`Detached`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio_util::sync::CancellationToken;

use super::Services;
use super::cost::Reserved;
use synth_core::progress::StageProgress;
use synth_core::store::batch::{
    BatchLog, DoneInfo, KeyLine, PartInfo, PartState, PartWriter, Phase, Record, part_files, read_key_names, read_keys,
    remove_part_files,
};
use synth_core::store::cache::{ResponseRow, Use};
use synth_llm::batch::{
    BatchApi, BatchInfo, BatchRoute, BatchState, Deferred, Endpoint, LineOutcome, PartRef, Results, Route, now,
};
use synth_llm::provider::Provider;
use synth_llm::{CallCtx, ChatResponse, ErrorKind, LlmError};

/// A stage stopped once its batches were submitted (`synth run --detach`, or a batch
/// API whose batches the user runs); the message says how to collect the results.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Detached(pub String);

/// A stage in batch mode stopped on Ctrl-C; its submitted batches keep running.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// How a stage runs in batch mode (its own options over the provider's).
#[derive(Debug, Clone)]
pub struct StageBatch {
    pub fallback_online: bool,
}

/// Collects a stage's deferred requests into part files.
pub struct Collector {
    stage: String,
    provider: Arc<Provider>,
    api: Arc<dyn BatchApi>,
    log: Arc<BatchLog>,
    /// Most requests, bytes and prompt tokens per part.
    limits: (u64, u64, Option<u64>),
    state: Mutex<Collecting>,
    routes: Mutex<HashMap<String, Route>>,
    /// Set after the collecting passes: a request deferred now was not collected.
    closed: AtomicBool,
}

#[derive(Default)]
struct Collecting {
    /// The open part and the endpoint of its lines (a part never mixes endpoints).
    writer: Option<(PartWriter, String)>,
    /// Keys written this pass, and keys in parts still live (never written twice).
    seen: HashSet<String>,
    in_parts: HashSet<String>,
    /// Requests deferred this pass.
    deferred: u64,
    /// The keys of the open part, and of the live parts this process wrote or read (so a
    /// pass need not read their key files again).
    open_keys: Vec<String>,
    part_keys: HashMap<String, Vec<String>>,
}

impl Collector {
    fn new_part_id(&self) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let seed = format!("{}|{nanos}|{}|{}", self.stage, std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        blake3::hash(seed.as_bytes()).to_hex()[..16].to_string()
    }

    /// Close the open part (files complete, then journaled).
    fn close_part(&self, c: &mut Collecting) -> Result<()> {
        let Some((w, endpoint)) = c.writer.take() else { return Ok(()) };
        let keys = std::mem::take(&mut c.open_keys);
        if w.requests == 0 {
            return Ok(());
        }
        let (part, requests, bytes, tokens) = (w.part.clone(), w.requests, w.bytes, w.tokens);
        c.part_keys.insert(part.clone(), keys);
        let (max_in, max_out) = (w.max_in, w.max_out);
        w.finish()?;
        let settings = self.provider.batch.as_ref().expect("batch settings");
        let max_cost = self.provider.price.map(|p| p.cost(max_in, max_out)).unwrap_or(0.0) * settings.price_factor;
        self.log.append(&Record::Part(PartInfo {
            part,
            stage: self.stage.clone(),
            provider: self.provider.name.clone(),
            api: self.api.kind().to_string(),
            base_url: synth_core::secrets::scrub(&self.provider.base_url),
            model: self.provider.model.clone(),
            api_key_env: self.provider.api_key_env.clone(),
            endpoint,
            requests,
            bytes,
            tokens,
            max_cost_usd: max_cost,
            attempt: 1,
            parent: None,
            at: now(),
        }))
    }

    /// Start a collecting pass: the keys of the stage's live parts are not written again.
    pub fn begin_pass(&self) -> Result<()> {
        let mut c = self.state.lock().expect("collector");
        let live: Vec<String> = self
            .log
            .parts()
            .into_iter()
            .filter(|p| p.info.stage == self.stage && p.phase.live())
            .map(|p| p.info.part)
            .collect();
        c.part_keys.retain(|part, _| live.contains(part));
        let mut in_parts = HashSet::new();
        for part in live {
            let keys = match c.part_keys.entry(part) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let keys = read_key_names(&self.log.dir(), e.key())?;
                    e.insert(keys)
                }
            };
            in_parts.extend(keys.iter().cloned());
        }
        c.in_parts = in_parts;
        c.seen.clear();
        c.deferred = 0;
        Ok(())
    }

    /// End a collecting pass: close the open part. Returns how many requests it deferred.
    pub fn end_pass(&self) -> Result<u64> {
        let mut c = self.state.lock().expect("collector");
        self.close_part(&mut c)?;
        Ok(c.deferred)
    }

    /// After the collecting passes: nothing more is deferred.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn set_route(&self, key: &str, route: Route) {
        self.routes.lock().expect("routes").insert(key.to_string(), route);
    }
}

impl BatchRoute for Collector {
    fn route(&self, key: &str) -> Route {
        self.routes.lock().expect("routes").get(key).cloned().unwrap_or(Route::Defer)
    }

    fn defer(&self, item: Deferred) -> Result<(), LlmError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(LlmError::new(
                ErrorKind::Rejected,
                "this request was not asked when the stage's batches were planned (does a prompt change between renderings?)",
            ));
        }
        let io = |e: anyhow::Error| LlmError::new(ErrorKind::Unavailable, format!("writing a batch part: {e:#}"));
        let mut c = self.state.lock().expect("collector");
        c.deferred += 1;
        if c.in_parts.contains(&item.key) || !c.seen.insert(item.key.clone()) {
            return Ok(());
        }
        let line = self.api.line(&item.key, &item.body);
        let key = KeyLine {
            key: item.key,
            doc: item.doc,
            endpoint: item.body.endpoint.path().to_string(),
            tokens_in: item.tokens_in,
            max_in: item.max_in,
            max_out: item.max_out,
        };
        let (max_requests, max_bytes, max_tokens) = self.limits;
        let full = c.writer.as_ref().is_some_and(|(w, endpoint)| {
            w.requests + 1 > max_requests
                || w.bytes + line.len() as u64 + 1 > max_bytes
                || max_tokens.is_some_and(|t| w.tokens + key.tokens_in > t)
                || *endpoint != key.endpoint
        });
        if full {
            self.close_part(&mut c).map_err(io)?;
        }
        if c.writer.is_none() {
            let part = self.new_part_id();
            c.writer = Some((PartWriter::create(&self.log.dir(), &part).map_err(io)?, key.endpoint.clone()));
        }
        c.writer.as_mut().expect("open part").0.push(&line, &key).map_err(io)?;
        c.open_keys.push(key.key);
        Ok(())
    }
}

/// A record's view of the collector: remembers whether it deferred anything.
pub struct RowRoute {
    collector: Arc<Collector>,
    deferred: AtomicBool,
}

impl RowRoute {
    pub fn new(collector: &Arc<Collector>) -> Arc<RowRoute> {
        Arc::new(RowRoute { collector: collector.clone(), deferred: AtomicBool::new(false) })
    }

    pub fn deferred(&self) -> bool {
        self.deferred.load(Ordering::Acquire)
    }
}

impl BatchRoute for RowRoute {
    fn route(&self, key: &str) -> Route {
        self.collector.route(key)
    }

    fn defer(&self, item: Deferred) -> Result<(), LlmError> {
        self.deferred.store(true, Ordering::Release);
        self.collector.defer(item)
    }
}

/// Figures of a stage's batch work in this run.
#[derive(Debug, Default, Clone)]
pub struct BatchFigures {
    /// Parts submitted by this run.
    pub batches: u64,
    /// Lines submitted by this run.
    pub submitted: u64,
    /// Answers stored in the cache by this run.
    pub answered: u64,
    pub resubmitted: u64,
    pub rejected: u64,
    pub gave_up: u64,
    pub online_fallback: u64,
    pub cost_usd: f64,
    /// What the answers would have cost online.
    pub online_cost_usd: f64,
}

/// A stage in batch mode.
pub struct BatchStage {
    services: Arc<Services>,
    provider: Arc<Provider>,
    api: Arc<dyn BatchApi>,
    log: Arc<BatchLog>,
    stage: String,
    fingerprint: String,
    progress: Arc<StageProgress>,
    cancel: CancellationToken,
    opts: StageBatch,
    dir_tag: String,
    pub collector: Arc<Collector>,
    /// Parts whose tokens count in the provider's enqueued tokens, and their reservations.
    enqueued: Mutex<HashMap<String, (u64, Reserved)>>,
    figures: Mutex<BatchFigures>,
    /// The last status line shown.
    shown: Mutex<String>,
    /// Collected parts whose answers the cache writer is committing (see
    /// [`BatchStage::finish_stores`]): no longer live, not yet journaled done.
    storing: Mutex<Vec<Storing>>,
}

/// A batch's lines read against its part's keys ([`BatchStage::read_results`]).
#[derive(Default)]
struct Read {
    answers: Vec<(KeyLine, ChatResponse)>,
    /// Keys to ask again, and why.
    retry: Vec<(String, String)>,
    /// Lines whose error fails their record.
    rejected: u64,
}

/// Answers queued for the cache ([`BatchStage::store_answers`]): their commits, whether the
/// cache holds them all in memory meanwhile, and their figures.
#[derive(Default)]
struct Stored {
    commits: Vec<futures::future::BoxFuture<'static, Result<()>>>,
    all_held: bool,
    cost: f64,
    online_cost: f64,
    succeeded: u64,
    tokens_in: u64,
    tokens_out: u64,
}

/// A collected part waiting for its answers' commit: then it is journaled done, its
/// files at the provider are deleted and its local files removed.
struct Storing {
    part: String,
    commits: futures::future::BoxFuture<'static, Result<()>>,
    done: Record,
    delete: Vec<String>,
}

impl BatchStage {
    /// Batch mode for a stage calling `provider` (which must have a batch API).
    pub fn start(
        services: &Arc<Services>,
        provider: &Arc<Provider>,
        call: &CallCtx,
        cancel: &CancellationToken,
        opts: StageBatch,
    ) -> Result<Arc<BatchStage>> {
        let settings = provider
            .batch
            .as_ref()
            .ok_or_else(|| anyhow!("provider \"{}\" ({}) has no batch API", provider.name, provider.kind))?;
        let log = services.batch_log()?;
        let api = provider.batch_api(&log.dir())?;
        let (max_requests, max_bytes) = settings.limits(api.as_ref());
        let collector = Arc::new(Collector {
            stage: call.stage.clone(),
            provider: provider.clone(),
            api: api.clone(),
            log: log.clone(),
            limits: (max_requests, max_bytes, settings.enqueued_tokens),
            state: Mutex::new(Collecting::default()),
            routes: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        });
        let dir_tag = dir_tag(services.out_dir());
        let this = Arc::new(BatchStage {
            services: services.clone(),
            provider: provider.clone(),
            api,
            log,
            stage: call.stage.clone(),
            fingerprint: call.fingerprint.clone(),
            progress: call.progress.clone(),
            cancel: cancel.clone(),
            opts,
            dir_tag,
            collector,
            enqueued: Mutex::new(HashMap::new()),
            figures: Mutex::new(BatchFigures::default()),
            shown: Mutex::new(String::new()),
            storing: Mutex::new(Vec::new()),
        });
        // Batches an earlier run submitted: enqueued at the provider, and paid when they run.
        for p in this.live_parts() {
            if p.phase == Phase::Created {
                this.count_enqueued(&p, this.services.costs.force(&this.stage, p.info.max_cost_usd));
            }
        }
        Ok(this)
    }

    pub fn figures(&self) -> BatchFigures {
        self.figures.lock().expect("figures").clone()
    }

    fn settings(&self) -> &synth_llm::provider::BatchSettings {
        self.provider.batch.as_ref().expect("batch settings")
    }

    /// This stage's parts not yet done, in journal order (those collected and waiting
    /// for their answers' commit are not).
    fn live_parts(&self) -> Vec<PartState> {
        let storing: HashSet<String> = self.storing.lock().expect("storing").iter().map(|s| s.part.clone()).collect();
        self.log
            .parts()
            .into_iter()
            .filter(|p| p.info.stage == self.stage && p.info.provider == self.provider.name && p.phase.live())
            .filter(|p| !storing.contains(&p.info.part))
            .collect()
    }

    /// Wait for the answers of every collected part to be committed and fsynced, then
    /// journal each part done (until then its result file at the provider is the
    /// answers' durable copy: a killed run downloads it again). Collection returns
    /// before the commit so that the output pass, which finds the answers held in
    /// memory by the cache, runs while the writer commits them.
    pub async fn finish_stores(&self) -> Result<()> {
        loop {
            let Some(s) = self.storing.lock().expect("storing").first_mut().map(|s| {
                let commits: futures::future::BoxFuture<'static, Result<()>> = Box::pin(async { Ok(()) });
                (s.part.clone(), std::mem::replace(&mut s.commits, commits))
            }) else {
                break;
            };
            let (part, commits) = s;
            commits.await.context("storing batch answers")?;
            let s = {
                let mut storing = self.storing.lock().expect("storing");
                let i = storing.iter().position(|x| x.part == part).expect("storing part");
                storing.remove(i)
            };
            self.journal(s.done)?;
            self.delete_files(&s.delete).await;
            remove_part_files(&self.log.dir(), &part);
        }
        let usage = Use { stage: self.stage.clone(), fingerprint: self.fingerprint.clone() };
        self.services.cache()?.forget_held(&usage);
        Ok(())
    }

    /// Delete a collected part's files at the provider (`batch_delete_files`).
    async fn delete_files(&self, ids: &[String]) {
        for id in ids {
            if let Err(e) = self.api.delete_file(id).await {
                tracing::warn!("stage \"{}\": deleting file {id} at the provider: {e}", self.stage);
            }
        }
    }

    fn part_ref(&self, p: &PartInfo) -> PartRef {
        let endpoint = serde_json::from_value(serde_json::Value::String(p.endpoint.clone())).unwrap_or(Endpoint::Chat);
        PartRef {
            part: p.part.clone(),
            stage: p.stage.clone(),
            dir_tag: self.dir_tag.clone(),
            endpoint,
            input: part_files(&self.log.dir(), &p.part).input,
            requests: p.requests,
            bytes: p.bytes,
        }
    }

    fn count_enqueued(&self, p: &PartState, reserved: Reserved) {
        let mut e = self.enqueued.lock().expect("enqueued");
        if !e.contains_key(&p.info.part) {
            self.provider.batch_enqueued.fetch_add(p.info.tokens, Ordering::AcqRel);
            e.insert(p.info.part.clone(), (p.info.tokens, reserved));
        }
    }

    /// The part no longer counts as enqueued; its reservation settles to `actual`.
    fn release(&self, part: &str, actual: f64) {
        let released = self.enqueued.lock().expect("enqueued").remove(part);
        let (tokens, reserved) = released.unwrap_or((0, Reserved(0.0)));
        self.provider
            .batch_enqueued
            .fetch_sub(tokens.min(self.provider.batch_enqueued.load(Ordering::Acquire)), Ordering::AcqRel);
        self.services.costs.settle(&self.stage, reserved, actual);
    }

    fn journal(&self, rec: Record) -> Result<()> {
        self.log.append(&rec)
    }

    /// Drive the stage's live parts until every one is done: submit, poll, collect.
    pub async fn run_parts(&self) -> Result<()> {
        loop {
            let live = self.live_parts();
            if live.is_empty() {
                self.progress.set_note(String::new());
                return Ok(());
            }
            let limit = self.settings().enqueued_tokens;
            for p in live.iter().filter(|p| p.phase != Phase::Created) {
                if self.cancel.is_cancelled() {
                    break;
                }
                if p.phase != Phase::Creating {
                    let enqueued = self.provider.batch_enqueued.load(Ordering::Acquire);
                    if limit.is_some_and(|l| enqueued > 0 && enqueued + p.info.tokens > l) {
                        continue; // the next wave
                    }
                }
                let reserved = if p.phase == Phase::Creating {
                    // It may run already: count it whatever the cap says.
                    self.services.costs.force(&self.stage, p.info.max_cost_usd)
                } else {
                    match self.services.costs.reserve(&self.stage, p.info.max_cost_usd) {
                        Ok(r) => r,
                        // With batches of ours in flight, their answers may cost less than
                        // reserved: wait for them and try again; with none, this is final.
                        Err(e) if self.live_parts().iter().any(|q| q.phase == Phase::Created) => {
                            let _ = e;
                            break;
                        }
                        Err(e) => bail!("{}", e.message),
                    }
                };
                match self.submit(p).await {
                    Ok(()) => {
                        let p = self.log.get(&p.info.part).expect("journaled part");
                        self.count_enqueued(&p, reserved);
                    }
                    Err(e) => {
                        self.services.costs.settle(&self.stage, reserved, 0.0);
                        return Err(e);
                    }
                }
            }
            for p in self.live_parts().into_iter().filter(|p| p.phase == Phase::Created) {
                if self.cancel.is_cancelled() {
                    break;
                }
                let info = self.poll(&p).await?;
                if info.state.ended() {
                    self.collect(&p, info).await?;
                }
            }
            self.show();
            let live = self.live_parts();
            if live.is_empty() {
                continue;
            }
            let submitted: Vec<&PartState> = live.iter().filter(|p| p.phase == Phase::Created).collect();
            if self.cancel.is_cancelled() {
                self.say_running(&submitted);
                bail!(Interrupted);
            }
            // User-run batches (a local API without a command) or --detach: stop here.
            let external: Vec<String> = submitted
                .iter()
                .filter_map(|p| {
                    let r = self.part_ref(&p.info);
                    self.api.external(&r)
                })
                .collect();
            let unsent = live.iter().any(|p| p.phase != Phase::Created);
            if !external.is_empty() && !unsent {
                let out = self.services.out_dir().display().to_string();
                bail!(Detached(format!(
                    "stage \"{}\": {} batch file(s) wait to be run; run:\n  {}\nthen run the same synth command again to collect the results (`synth batch status {out}`)",
                    self.stage,
                    external.len(),
                    external.join("\n  ")
                )));
            }
            if self.services.detach() && !submitted.is_empty() && !unsent {
                let ids: Vec<String> = submitted.iter().filter_map(|p| p.batch.clone()).collect();
                let out = self.services.out_dir().display().to_string();
                bail!(Detached(format!(
                    "stage \"{}\": {} batch(es) submitted ({}); run the same command again to collect their results (`synth batch status {out}` shows their state)",
                    self.stage,
                    ids.len(),
                    ids.join(", ")
                )));
            }
            let poll = Duration::from_secs_f64(self.settings().poll_seconds.max(0.001));
            let jitter = poll.mul_f64(rand::random::<f64>() * 0.1);
            tokio::select! {
                _ = tokio::time::sleep(poll + jitter) => {}
                _ = self.cancel.cancelled() => {}
            }
        }
    }

    fn say_running(&self, submitted: &[&PartState]) {
        if submitted.is_empty() {
            return;
        }
        let ids: Vec<String> = submitted.iter().filter_map(|p| p.batch.clone()).collect();
        tracing::warn!(
            "stage \"{}\": {} batch(es) keep running at the provider ({}); they are not cancelled: run the same command again to collect their results (`synth batch status {}` shows them, `synth batch cancel` cancels them)",
            self.stage,
            ids.len(),
            ids.join(", "),
            self.services.out_dir().display()
        );
    }

    /// Upload (or find an upload that may have happened) and create (or find a create
    /// that may have happened), journaling each step before and after.
    async fn submit(&self, p: &PartState) -> Result<()> {
        let part = p.info.part.clone();
        let r = self.part_ref(&p.info);
        let what = |step: &str| format!("batch part {part}: {step}");
        let mut file = p.file.clone();
        if matches!(p.phase, Phase::Planned | Phase::Uploading) {
            let found = if p.phase == Phase::Uploading {
                self.api.find_file(&r).await.map_err(|e| anyhow!("{}: {e}", what("finding an earlier upload")))?
            } else {
                None
            };
            if found.is_none() {
                self.journal(Record::Uploading { part: part.clone(), at: now() })?;
            }
            file = match found {
                Some(f) => Some(f),
                None => self.api.upload(&r).await.map_err(|e| anyhow!("{}: {e}", what("uploading")))?,
            };
            if let Some(f) = &file {
                self.journal(Record::Uploaded { part: part.clone(), file: f.clone() })?;
            }
        }
        let info = if p.phase == Phase::Creating {
            let known = self.log.known_batches();
            match self
                .api
                .find_batch(&r, p.creating_at, &known)
                .await
                .map_err(|e| anyhow!("{}: {e}", what("looking for its batch")))?
            {
                Some(info) => {
                    tracing::info!(
                        "stage \"{}\": batch part {part}: found batch {} created before the restart",
                        self.stage,
                        info.id
                    );
                    info
                }
                None => self.create(&r, file.as_deref()).await?,
            }
        } else {
            self.create(&r, file.as_deref()).await?
        };
        self.journal(Record::Created { part: part.clone(), batch: info.id.clone(), at: now() })?;
        let mut f = self.figures.lock().expect("figures");
        f.batches += 1;
        f.submitted += p.info.requests;
        self.progress.requests.fetch_add(p.info.requests, Ordering::Relaxed);
        tracing::info!(
            "stage \"{}\": batch {} submitted ({} requests, part {part}, attempt {})",
            self.stage,
            info.id,
            p.info.requests,
            p.info.attempt
        );
        Ok(())
    }

    /// Create a part's batch. A create whose answer was lost may have happened: before
    /// trying again, look for it.
    async fn create(&self, r: &PartRef, file: Option<&str>) -> Result<BatchInfo> {
        let since = now();
        self.journal(Record::Creating { part: r.part.clone(), file: file.map(str::to_string), at: since })?;
        let mut tries = 0;
        loop {
            match self.api.create(r, file).await {
                Ok(info) => return Ok(info),
                Err(e) if e.kind.retryable() && tries < 8 => {
                    tries += 1;
                    let wait = e.retry_after.unwrap_or(Duration::from_millis(500 << tries.min(6)));
                    tracing::warn!(
                        "stage \"{}\": creating batch part {}: {e}; looking for it, then again in {wait:?}",
                        self.stage,
                        r.part
                    );
                    tokio::time::sleep(wait).await;
                    let known = self.log.known_batches();
                    if let Some(info) = self
                        .api
                        .find_batch(r, since, &known)
                        .await
                        .map_err(|e| anyhow!("batch part {}: looking for its batch: {e}", r.part))?
                    {
                        return Ok(info);
                    }
                }
                Err(e) => bail!("batch part {}: creating the batch: {e}", r.part),
            }
        }
    }

    /// Retrieve a submitted part's batch; journal a changed status.
    async fn poll(&self, p: &PartState) -> Result<BatchInfo> {
        let id = p.batch.clone().expect("a submitted part has a batch");
        let info = self.api.retrieve(&id).await.map_err(|e| anyhow!("batch {id}: {e}"))?;
        let status = info.state.as_str().to_string();
        if p.status.as_deref() != Some(&status) || p.completed != info.completed || p.failed != info.failed {
            self.journal(Record::Status {
                part: p.info.part.clone(),
                status,
                total: info.total.max(p.info.requests),
                completed: info.completed,
                failed: info.failed,
                at: now(),
            })?;
        }
        Ok(info)
    }

    /// One progress line: batches by state with their counts.
    fn show(&self) {
        let parts = self.live_parts();
        if parts.is_empty() {
            return;
        }
        let mut by: std::collections::BTreeMap<String, (u64, u64, u64)> = Default::default();
        for p in &parts {
            let state = match p.phase {
                Phase::Created => p.status.clone().unwrap_or_else(|| "submitted".into()),
                other => other.as_str().to_string(),
            };
            let e = by.entry(state).or_default();
            e.0 += 1;
            e.1 += p.completed;
            e.2 += p.info.requests;
        }
        let text =
            by.iter().map(|(s, (n, done, total))| format!("{n} {s} ({done}/{total})")).collect::<Vec<_>>().join(" · ");
        let line = format!("batches: {text}");
        self.progress.set_note(line.clone());
        let mut shown = self.shown.lock().expect("shown");
        if *shown != line {
            tracing::info!("stage \"{}\": {line}", self.stage);
            *shown = line;
        }
    }

    /// An ended batch: download its lines, store every answer, plan what is left.
    async fn collect(&self, p: &PartState, info: BatchInfo) -> Result<()> {
        let part = p.info.part.clone();
        if self.requeue_refused(&part, &info).await? {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let results = if info.state != BatchState::Failed {
            self.api.download(&info).await.map_err(|e| anyhow!("batch {}: downloading its results: {e}", info.id))?
        } else {
            Default::default()
        };
        let downloaded = started.elapsed();
        let keys = read_keys(&self.log.dir(), &part)?;
        let read = self.read_results(&info, &results, keys)?;
        drop(results);
        let parsed = started.elapsed();
        let Read { answers, retry, rejected } = read;
        let stored = self.store_answers(answers).await?;
        tracing::debug!(
            "stage \"{}\": batch {}: results downloaded in {:.0?}, read in {:.0?}, {} answer(s) queued for the cache in {:.0?}",
            self.stage,
            info.id,
            downloaded,
            parsed - downloaded,
            stored.succeeded,
            started.elapsed() - parsed
        );
        let Stored { commits, all_held, cost, online_cost, succeeded, tokens_in, tokens_out } = stored;
        let commits: futures::future::BoxFuture<'static, Result<()>> =
            Box::pin(async move { futures::future::try_join_all(commits).await.map(|_| ()) });
        let pr = &self.progress;
        pr.tokens_in.fetch_add(tokens_in, Ordering::Relaxed);
        pr.tokens_out.fetch_add(tokens_out, Ordering::Relaxed);
        pr.cost_micro_usd.fetch_add((cost * 1e6).round() as u64, Ordering::Relaxed);
        let (resubmitted, online, gave_up) = self.plan_unanswered(p, &info, &retry)?;
        let done = Record::Done {
            part: part.clone(),
            done: DoneInfo { succeeded, failed: retry.len() as u64 + rejected, resubmitted, cost_usd: cost },
            at: now(),
        };
        // The batch has ended at the provider: its tokens are no longer enqueued there,
        // and its cost is known.
        self.release(&part, cost);
        {
            let mut f = self.figures.lock().expect("figures");
            f.answered += succeeded;
            f.resubmitted += resubmitted;
            f.rejected += rejected;
            f.gave_up += gave_up;
            f.online_fallback += online;
            f.cost_usd += cost;
            f.online_cost_usd += online_cost;
        }
        let delete = if self.settings().delete_files {
            [p.file.as_ref(), info.output.as_ref(), info.errors.as_ref()]
                .into_iter()
                .flatten()
                .filter(|id| !id.starts_with("http") && !id.starts_with('/'))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        self.storing.lock().expect("storing").push(Storing { part, commits, done, delete });
        if !all_held {
            // Answers the cache does not hold in memory are found only once committed.
            self.finish_stores().await?;
        }
        Ok(())
    }

    /// A batch the provider refused before it ran (its enqueued-token limit): nothing was
    /// processed or paid; it is journaled to be submitted again once the batches ahead of it
    /// have ended. Whether it was one.
    async fn requeue_refused(&self, part: &str, info: &BatchInfo) -> Result<bool> {
        let Some((code, message)) = info.failure.as_ref().filter(|_| info.state == BatchState::Failed) else {
            return Ok(false);
        };
        if !(code.contains("token_limit") || message.contains("enqueued token")) {
            return Ok(false);
        }
        tracing::warn!(
            "stage \"{}\": batch {} was refused ({code}: {message}); it is submitted again later",
            self.stage,
            info.id
        );
        self.journal(Record::Requeued { part: part.to_string(), reason: format!("{code}: {message}"), at: now() })?;
        self.release(part, 0.0);
        if self.enqueued.lock().expect("enqueued").is_empty() {
            // Nothing of ours is ahead: wait a poll before trying again.
            let poll = Duration::from_secs_f64(self.settings().poll_seconds.max(0.001));
            tokio::time::sleep(poll).await;
        }
        Ok(true)
    }

    /// A batch's result and error lines against the part's keys: the answers (read as the
    /// online call's), the keys to ask again and why (a retryable error, an unreadable
    /// answer, no line at all), and the count of lines that failed their record.
    fn read_results(&self, info: &BatchInfo, results: &Results, keys: Vec<KeyLine>) -> Result<Read> {
        let mut by_key: HashMap<String, KeyLine> = keys.into_iter().map(|k| (k.key.clone(), k)).collect();
        let mut read = Read::default();
        let mut bad_lines = 0u64;
        // A part's lines share one endpoint: its name is read once.
        let mut endpoints: HashMap<String, Endpoint> = HashMap::new();
        for (bytes, what) in [(&results.output, "results"), (&results.errors, "errors")] {
            let Some(bytes) = bytes else { continue };
            let text = std::str::from_utf8(bytes)
                .with_context(|| format!("batch {}: its {what} file is not UTF-8", info.id))?;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let (key, outcome) = match self.api.parse_line(line) {
                    Ok(x) => x,
                    Err(e) => {
                        bad_lines += 1;
                        tracing::warn!("stage \"{}\": batch {}: {e}", self.stage, info.id);
                        continue;
                    }
                };
                let Some(k) = by_key.remove(&key) else { continue };
                match outcome {
                    LineOutcome::Answer(body) => {
                        let endpoint = match endpoints.get(&k.endpoint) {
                            Some(e) => *e,
                            None => {
                                let e = serde_json::from_value(serde_json::Value::String(k.endpoint.clone()))
                                    .unwrap_or(Endpoint::Chat);
                                endpoints.insert(k.endpoint.clone(), e);
                                e
                            }
                        };
                        match self.api.answer(endpoint, &body, &k.doc, &self.provider.model) {
                            Ok(r) => read.answers.push((k, r)),
                            Err(e) => read.retry.push((k.key, e.to_string())),
                        }
                    }
                    LineOutcome::Error { kind, message } if !kind.retryable() => {
                        read.rejected += 1;
                        self.collector.set_route(
                            &k.key,
                            Route::Fail(LlmError::new(kind, format!("batch {}: {message}", info.id))),
                        );
                    }
                    LineOutcome::Error { message, .. } => read.retry.push((k.key, message)),
                }
            }
        }
        let why_missing = match &info.failure {
            Some((code, message)) => format!("the batch {} {}: {code}: {message}", info.id, info.state.as_str()),
            None => format!("no result for this line (the batch {} ended {})", info.id, info.state.as_str()),
        };
        read.retry.extend(by_key.into_keys().map(|k| (k, why_missing.clone())));
        if bad_lines > 0 {
            tracing::warn!(
                "stage \"{}\": batch {}: {bad_lines} result line(s) could not be read; their requests are asked again",
                self.stage,
                info.id
            );
        }
        Ok(read)
    }

    /// Store every answer new to the cache, in bulk: chunks of one transaction each,
    /// queued while the next is prepared, all committed and fsynced before the part is
    /// journaled done. Until then the provider's result file is the answers' durable
    /// copy (a killed run downloads it again), so they are not journaled one by one.
    /// An answer already stored (an earlier run stored it, then stopped before
    /// journaling the part done) is neither stored nor counted again.
    async fn store_answers(&self, answers: Vec<(KeyLine, ChatResponse)>) -> Result<Stored> {
        let cache = self.services.cache()?;
        let usage = Use { stage: self.stage.clone(), fingerprint: self.fingerprint.clone() };
        let price = self.provider.price.unwrap_or(synth_llm::pricing::Price { input: 0.0, output: 0.0 });
        let factor = self.settings().price_factor;
        let keys: Vec<&str> = answers.iter().map(|(k, _)| k.key.as_str()).collect();
        let missing = cache.missing(&keys)?;
        drop(keys);
        let provider = &self.provider;
        let base_url = synth_core::secrets::scrub(&provider.base_url);
        let mut s = Stored { all_held: true, ..Default::default() };
        let mut rows = Vec::with_capacity(STORE_CHUNK.min(answers.len()));
        let new = answers.into_iter().zip(missing).filter_map(|(a, m)| m.then_some(a));
        for (k, r) in new {
            let (tin, tout) = (r.usage.prompt_tokens, r.usage.completion_tokens);
            let online = price.cost(tin, tout);
            s.cost += online * factor;
            s.online_cost += online;
            s.succeeded += 1;
            s.tokens_in += tin;
            s.tokens_out += tout;
            rows.push(ResponseRow {
                key: k.key,
                provider: provider.kind.to_string(),
                base_url: base_url.clone(),
                model: provider.model.clone(),
                request: synth_core::secrets::scrub_owned(k.doc),
                response: serde_json::to_string(&r).expect("serializable"),
                tokens_in: tin,
                tokens_out: tout,
                cost_usd: online * factor,
            });
            if rows.len() == STORE_CHUNK {
                let (commit, held) = cache.put_many(std::mem::take(&mut rows), &usage)?;
                s.commits.push(Box::pin(commit));
                s.all_held &= held;
            }
        }
        if !rows.is_empty() {
            let (commit, held) = cache.put_many(rows, &usage)?;
            s.commits.push(Box::pin(commit));
            s.all_held &= held;
        }
        Ok(s)
    }

    /// What is left of a part (`retry`: keys and why): a new batch (its child part, up to
    /// `batch_attempts`), online (`batch_fallback = "online"`), or the records fail.
    /// (resubmitted, sent online, given up).
    fn plan_unanswered(&self, p: &PartState, info: &BatchInfo, retry: &[(String, String)]) -> Result<(u64, u64, u64)> {
        let (mut resubmitted, mut online, mut gave_up) = (0, 0, 0);
        if retry.is_empty() {
            return Ok((resubmitted, online, gave_up));
        }
        if self.opts.fallback_online {
            for (k, _) in retry {
                self.collector.set_route(k, Route::Online);
            }
            online = retry.len() as u64;
        } else if p.info.attempt < self.settings().attempts {
            if self.log.child_of(&p.info.part).is_none() {
                self.resubmit(p, retry)?;
            }
            resubmitted = retry.len() as u64;
        } else {
            for (k, why) in retry {
                self.collector.set_route(
                    k,
                    Route::Fail(LlmError::new(
                        ErrorKind::Server,
                        format!("no answer after {} batch attempt(s): {why}", p.info.attempt),
                    )),
                );
            }
            gave_up = retry.len() as u64;
        }
        tracing::warn!(
            "stage \"{}\": batch {}: {} line(s) without an answer ({}): {}",
            self.stage,
            info.id,
            retry.len(),
            retry[0].1,
            if online > 0 {
                "sent online (batch_fallback = \"online\")".to_string()
            } else if resubmitted > 0 {
                format!("resubmitted (attempt {} of {})", p.info.attempt + 1, self.settings().attempts)
            } else {
                "their records fail".to_string()
            }
        );
        Ok((resubmitted, online, gave_up))
    }

    /// Plan a part of `parent`'s lines that got no answer (its child), then journal it.
    fn resubmit(&self, parent: &PartState, keys: &[(String, String)]) -> Result<()> {
        let dir = self.log.dir();
        let wanted: HashSet<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let part = self.collector.new_part_id();
        let mut w = PartWriter::create(&dir, &part)?;
        let input = std::fs::read_to_string(part_files(&dir, &parent.info.part).input)
            .with_context(|| format!("reading batch part {}", parent.info.part))?;
        let key_lines = read_keys(&dir, &parent.info.part)?;
        let by_key: HashMap<&str, &KeyLine> = key_lines.iter().map(|k| (k.key.as_str(), k)).collect();
        for line in input.lines() {
            let key = custom_id(line);
            if let Some(k) = key.and_then(|k| by_key.get(k.as_str())).filter(|k| wanted.contains(k.key.as_str())) {
                w.push(line, k)?;
            }
        }
        let (requests, bytes, tokens, max_in, max_out) = (w.requests, w.bytes, w.tokens, w.max_in, w.max_out);
        w.finish()?;
        let factor = self.settings().price_factor;
        self.journal(Record::Part(PartInfo {
            part,
            requests,
            bytes,
            tokens,
            max_cost_usd: self.provider.price.map(|p| p.cost(max_in, max_out)).unwrap_or(0.0) * factor,
            attempt: parent.info.attempt + 1,
            parent: Some(parent.info.part.clone()),
            at: now(),
            ..parent.info.clone()
        }))
    }
}

/// Answers stored in one transaction of a batch's collection: a whole part of the
/// OpenAI API (at most 50,000 lines) in one. A transaction writes each page it touches
/// once, and answers' row ids are spread over the whole table, so smaller transactions
/// rewrite the same pages again and again (40,000 answers: 4,096 per transaction took
/// twice as long as one).
const STORE_CHUNK: usize = 65_536;

/// The `custom_id` of a part line.
fn custom_id(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        custom_id: String,
    }
    serde_json::from_str::<Id>(line).ok().map(|i| i.custom_id)
}

/// The tag of an output directory in its batches' metadata (`synth_dir`): a hash of
/// its canonical path, so two directories never adopt each other's batches.
pub fn dir_tag(out_dir: &std::path::Path) -> String {
    let dir = std::fs::canonicalize(out_dir).unwrap_or_else(|_| out_dir.to_path_buf());
    blake3::hash(dir.to_string_lossy().as_bytes()).to_hex()[..16].to_string()
}
