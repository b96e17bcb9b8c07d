//! The decode loop of the `local` provider: one OS thread owns the llama.cpp model and
//! context and decodes every admitted request together (continuous batching: each request
//! is a sequence of its own in the KV cache, up to `parallel`; a generation step decodes the
//! next token of every generating sequence in one call, and new prompts are fed between
//! steps). Requests arrive over a channel and are answered over oneshot channels, so callers
//! never block.
//!
//! **Invariant:** a sequence's numbers do not depend on what else is decoded: each sequence
//! has its own KV stream (`kv_unified = false`), starting at cell 0; a decode call is either
//! a generation step (one token per sequence) or a chunk of one prompt cut at fixed places,
//! never a mix (llama.cpp computes a token's attention in another order when many tokens of
//! its sequence share the call); and llama.cpp is built without the llamafile kernels
//! (`.cargo/config.toml`), whose many-token products sum in another order than the one-token
//! path; and flash attention is off unless the cache is q8_0 (with an f16 cache, llama.cpp's
//! flash attention splits the cache of a sequence decoded alone across threads once it holds
//! 512 tokens, and merges the parts in another order than when it decodes beside others; a
//! q8_0 cache never takes that path). With a per-request sampler seeded by the request, the same request gives the same
//! bytes however requests interleave (`tests/local.rs` compares answers decoded alone and
//! sixteen at a time).

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Instant;

/// Held around every `decode` call of every engine of the process (see its use).
static DECODE_TURN: Mutex<()> = Mutex::new(());

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::llm::{ErrorKind, LlmError};

/// How the engine runs (from the provider's options).
#[derive(Debug, Clone)]
pub struct Settings {
    pub path: PathBuf,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Tokens per sequence (prompt and answer).
    pub context: u32,
    /// Tokens per decode call.
    pub batch_tokens: u32,
    pub threads: i32,
    /// Strings of a schema without a `maxLength` get this one in the grammar.
    pub max_string_chars: Option<u32>,
    /// Arrays of a schema get at most this many items in the grammar.
    pub max_items: Option<u32>,
    /// A q8_0 attention cache (else f16).
    pub kv_q8: bool,
    /// Flash attention on / off (`None`: llama.cpp decides).
    pub flash_attention: Option<bool>,
    /// Provider name, for messages.
    pub provider: String,
}

/// What a request asks.
#[derive(Debug, Clone)]
pub enum Work {
    /// Continue a rendered prompt.
    Generate(Generate),
    /// The log-probability of `continuation` right after `context`.
    Loglik { context: String, continuation: String },
}

#[derive(Debug, Clone)]
pub struct Generate {
    /// The conversation, rendered with the model's chat template.
    pub messages: Vec<crate::llm::Message>,
    pub max_tokens: u32,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    /// A JSON Schema the answer is constrained to.
    pub schema: Option<serde_json::Value>,
}

/// How the next token is drawn (llama.cpp's samplers, in its usual order).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    /// Penalties on tokens of the last `penalty_last_n` generated: repeat (1 = off),
    /// frequency and presence (0 = off).
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: i32,
    /// DRY (penalizes extending a repeated sequence): multiplier (0 = off), base, allowed length.
    pub dry: Option<(f32, f32, i32)>,
    pub seed: u32,
}

/// A finished request.
#[derive(Debug, Clone, Default)]
pub struct Done {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub finish_reason: &'static str,
    /// Loglik: the log-probability of each continuation token.
    pub token_logprobs: Vec<f64>,
}

/// Counters of the engine, for the manifest and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub decode_calls: u64,
    pub decode_seconds: f64,
    pub sample_seconds: f64,
    pub load_seconds: f64,
}

struct Job {
    work: Work,
    reply: tokio::sync::oneshot::Sender<Result<Done, LlmError>>,
}

/// A running engine; dropping it (with every clone of its sender) stops the thread.
pub struct Engine {
    tx: mpsc::Sender<Job>,
    stats: Arc<Mutex<Stats>>,
}

impl Engine {
    /// Start the thread; the model loads there (a load error answers every request).
    pub fn start(settings: Settings) -> Engine {
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let shared = stats.clone();
        std::thread::Builder::new()
            .name("synth-llama".into())
            .spawn(move || run(settings, rx, shared))
            .expect("spawning the local model's thread");
        Engine { tx, stats }
    }

    pub async fn submit(&self, work: Work) -> Result<Done, LlmError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send(Job { work, reply })
            .map_err(|_| LlmError::new(ErrorKind::Unavailable, "the local model's thread has stopped"))?;
        answer.await.map_err(|_| LlmError::new(ErrorKind::Unavailable, "the local model's thread has stopped"))?
    }

    pub fn stats(&self) -> Stats {
        self.stats.lock().expect("stats").clone()
    }
}

/// llama.cpp's backend, initialized once per process (a second init fails).
pub fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp's own log lines go to tracing (target `llama-cpp-2`; warnings and
            // errors show, its chatter is filtered by the CLI).
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| format!("initializing llama.cpp: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn fail(message: impl Into<String>) -> LlmError {
    LlmError::new(ErrorKind::Unavailable, message)
}

fn run(settings: Settings, rx: mpsc::Receiver<Job>, stats: Arc<Mutex<Stats>>) {
    let started = Instant::now();
    let loaded = load(&settings);
    stats.lock().expect("stats").load_seconds = started.elapsed().as_secs_f64();
    let (backend, model) = match loaded {
        Ok(x) => x,
        Err(message) => {
            // Every request gets the load error (fatal: the run stops with it).
            while let Ok(job) = rx.recv() {
                let _ = job.reply.send(Err(fail(message.clone())));
            }
            return;
        }
    };
    let n_seq = settings.parallel.clamp(1, 256);
    let context = settings.context.min(model.n_ctx_train().max(1));
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(context * n_seq as u32))
        .with_n_batch(settings.batch_tokens)
        .with_n_ubatch(settings.batch_tokens)
        .with_n_seq_max(n_seq as u32)
        .with_n_threads(settings.threads)
        .with_n_threads_batch(settings.threads)
        .with_kv_unified(false);
    if settings.kv_q8 {
        use llama_cpp_2::context::params::KvCacheType;
        params = params.with_type_k(KvCacheType::Q8_0).with_type_v(KvCacheType::Q8_0);
    }
    if let Some(on) = settings.flash_attention {
        // llama.cpp's LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED.
        params = params.with_flash_attention_policy(i32::from(on));
    }
    let ctx = match model.new_context(backend, params) {
        Ok(c) => c,
        Err(e) => {
            let message = format!("{}: cannot create a llama.cpp context: {e}", settings.path.display());
            while let Ok(job) = rx.recv() {
                let _ = job.reply.send(Err(fail(message.clone())));
            }
            return;
        }
    };
    let mut engine = Loop {
        model: &model,
        ctx,
        slots: (0..n_seq).map(|_| None).collect(),
        queue: VecDeque::new(),
        context,
        batch_tokens: settings.batch_tokens as usize,
        grammars: Grammars {
            max_string_chars: settings.max_string_chars,
            max_items: settings.max_items,
            ..Default::default()
        },
        template: super::template::ChatTemplate::from_model(&model),
        stats,
        provider: settings.provider.clone(),
        admitted: 0,
        last_was_step: false,
    };
    engine.serve(&rx);
}

fn load(settings: &Settings) -> Result<(&'static LlamaBackend, LlamaModel), String> {
    let backend = backend()?;
    let model = LlamaModel::load_from_file(backend, &settings.path, &LlamaModelParams::default()).map_err(|e| {
        format!(
            "llama.cpp cannot load {} ({e}; its log above says why: e.g. an architecture it does not support)",
            settings.path.display()
        )
    })?;
    Ok((backend, model))
}

/// One admitted request.
struct Slot {
    seq: i32,
    job: Job,
    tokens: Vec<LlamaToken>,
    /// Tokens of `tokens` already in the KV cache.
    fed: usize,
    prompt_tokens: usize,
    /// Admission order (prompts are processed in it).
    order: u64,
    state: State,
}

enum State {
    Generate {
        sampler: LlamaSampler,
        max_tokens: usize,
        stop: Vec<String>,
        out: Vec<u8>,
        generated: usize,
        /// The batch row whose logits give the next token (set when it is in the batch).
        row: Option<i32>,
    },
    Loglik {
        /// Index in `tokens` of the first continuation token.
        first: usize,
        logprobs: Vec<f64>,
        /// (batch row, token it predicts) of the rows in the last decode.
        rows: Vec<(i32, LlamaToken)>,
    },
}

/// Compiled JSON Schema grammars, one per schema text: a request clones the matcher.
#[derive(Default)]
struct Grammars {
    factory: Option<llguidance::ParserFactory>,
    compiled: HashMap<String, Result<llguidance::Matcher, String>>,
    max_string_chars: Option<u32>,
    max_items: Option<u32>,
}

/// A schema with `maxLength = cap` on every string that has no bound, no enum and no const.
pub fn cap_strings(schema: &mut serde_json::Value, cap: u32) {
    match schema {
        serde_json::Value::Object(obj) => {
            let is_string = match obj.get("type") {
                Some(serde_json::Value::String(t)) => t == "string",
                Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            if is_string && !obj.contains_key("maxLength") && !obj.contains_key("enum") && !obj.contains_key("const") {
                obj.insert("maxLength".into(), cap.into());
            }
            for (k, v) in obj.iter_mut() {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    cap_strings(v, cap);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| cap_strings(v, cap)),
        _ => {}
    }
}

/// A schema whose arrays allow at most `cap` items (at least their `minItems`).
pub fn cap_items(schema: &mut serde_json::Value, cap: u32) {
    match schema {
        serde_json::Value::Object(obj) => {
            let is_array = match obj.get("type") {
                Some(serde_json::Value::String(t)) => t == "array",
                Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "array"),
                _ => false,
            };
            if is_array {
                let min = obj.get("minItems").and_then(serde_json::Value::as_u64).unwrap_or(0);
                let max = obj.get("maxItems").and_then(serde_json::Value::as_u64).unwrap_or(u64::MAX);
                obj.insert("maxItems".into(), max.min(u64::from(cap)).max(min).into());
            }
            for (k, v) in obj.iter_mut() {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    cap_items(v, cap);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| cap_items(v, cap)),
        _ => {}
    }
}

impl Grammars {
    fn matcher(&mut self, model: &LlamaModel, schema: &serde_json::Value) -> Result<llguidance::Matcher, String> {
        if self.factory.is_none() {
            let env = LlamaSampler::llguidance_tok_env(model);
            let factory = llguidance::ParserFactory::new_simple(&env)
                .map_err(|e| format!("building the grammar engine for this vocabulary: {e}"))?;
            self.factory = Some(factory);
        }
        let factory = self.factory.as_ref().expect("set above");
        let key = schema.to_string();
        let entry = self.compiled.entry(key).or_insert_with(|| {
            // Compact JSON without free whitespace: a small model otherwise pads it with
            // newlines until max_tokens.
            let mut schema = schema.clone();
            if let Some(cap) = self.max_string_chars {
                cap_strings(&mut schema, cap);
            }
            if let Some(cap) = self.max_items {
                cap_items(&mut schema, cap);
            }
            if let Some(obj) = schema.as_object_mut() {
                obj.insert(
                    "x-guidance".into(),
                    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": true}),
                );
            }
            let grammar = llguidance::api::TopLevelGrammar::from_json_schema(schema);
            factory
                .create_parser(grammar)
                .map(|p| llguidance::Matcher::new(Ok(p)))
                .map_err(|e| format!("the JSON Schema cannot be compiled for constrained decoding: {e}"))
        });
        match entry {
            Ok(m) => Ok(m.deep_clone()),
            Err(e) => Err(e.clone()),
        }
    }
}

struct Loop<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    slots: Vec<Option<Slot>>,
    queue: VecDeque<Job>,
    context: u32,
    batch_tokens: usize,
    grammars: Grammars,
    template: super::template::ChatTemplate,
    stats: Arc<Mutex<Stats>>,
    provider: String,
    /// Requests admitted so far.
    admitted: u64,
    /// Whether the last decode was a generation step (the kinds alternate).
    last_was_step: bool,
}

impl Loop<'_> {
    fn serve(&mut self, rx: &mpsc::Receiver<Job>) {
        let mut batch = LlamaBatch::new(self.batch_tokens, 1);
        loop {
            if self.slots.iter().all(Option::is_none) && self.queue.is_empty() {
                match rx.recv() {
                    Ok(job) => self.queue.push_back(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = rx.try_recv() {
                self.queue.push_back(job);
            }
            // A caller that stopped waiting (a cancelled run) frees its place.
            self.queue.retain(|j| !j.reply.is_closed());
            for i in 0..self.slots.len() {
                if self.slots[i].as_ref().is_some_and(|s| s.job.reply.is_closed()) {
                    self.finish(i, Err(fail("cancelled")));
                }
            }
            self.admit();
            if !self.fill(&mut batch) {
                continue;
            }
            let t = Instant::now();
            let decoded = {
                // One decode call at a time in the process: engines of several models (a base
                // and its fine-tuned checkpoints answering side by side) each use every core,
                // and interleaving their calls beats their threads fighting over the cores.
                let _turn = DECODE_TURN.lock().unwrap_or_else(|e| e.into_inner());
                self.ctx.decode(&mut batch)
            };
            let elapsed = t.elapsed().as_secs_f64();
            tracing::debug!(
                tokens = batch.n_tokens(),
                active = self.slots.iter().flatten().count(),
                queued = self.queue.len(),
                seconds = elapsed,
                "local model: decode"
            );
            {
                let mut s = self.stats.lock().expect("stats");
                s.decode_calls += 1;
                s.decode_seconds += elapsed;
            }
            if let Err(e) = decoded {
                // Every sequence in this batch fails (its cache is in an unknown state).
                let message = format!("llama.cpp could not decode a batch: {e}");
                for i in 0..self.slots.len() {
                    if self.slots[i].is_some() {
                        self.finish(i, Err(fail(message.clone())));
                    }
                }
                continue;
            }
            let t = Instant::now();
            self.after_decode();
            self.stats.lock().expect("stats").sample_seconds += t.elapsed().as_secs_f64();
        }
    }

    /// Move queued jobs into free slots (a job that cannot start is answered at once).
    fn admit(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].is_some() {
                continue;
            }
            let Some(job) = self.queue.pop_front() else { return };
            match self.start(&job.work) {
                Ok((tokens, state, prompt_tokens)) => {
                    self.admitted += 1;
                    let order = self.admitted;
                    self.slots[i] = Some(Slot { seq: i as i32, job, tokens, fed: 0, prompt_tokens, order, state });
                    self.stats.lock().expect("stats").requests += 1;
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                }
            }
        }
    }

    fn start(&mut self, work: &Work) -> Result<(Vec<LlamaToken>, State, usize), LlmError> {
        let vocab = self.model.vocab();
        let too_long = |n: usize, what: &str| {
            LlmError::new(
                ErrorKind::Rejected,
                format!(
                    "the {what} has {n} tokens but the model's context per sequence is {} tokens (`context` of provider \"{}\")",
                    self.context, self.provider
                ),
            )
        };
        match work {
            Work::Generate(g) => {
                let prompt =
                    self.template.render(self.model, &g.messages).map_err(|e| LlmError::new(ErrorKind::Rejected, e))?;
                let tokens = vocab.tokenize(prompt.as_bytes(), true, true);
                if tokens.len() + 1 > self.context as usize {
                    return Err(too_long(tokens.len(), "prompt"));
                }
                let mut chain = Vec::new();
                if let Some(schema) = &g.schema {
                    let matcher =
                        self.grammars.matcher(self.model, schema).map_err(|e| LlmError::new(ErrorKind::Rejected, e))?;
                    chain.push(LlamaSampler::from(matcher));
                }
                let sp = &g.sampling;
                if sp.repetition_penalty != 1.0 || sp.frequency_penalty != 0.0 || sp.presence_penalty != 0.0 {
                    chain.push(LlamaSampler::penalties(
                        self.model.n_vocab(),
                        sp.penalty_last_n,
                        sp.repetition_penalty,
                        sp.frequency_penalty,
                        sp.presence_penalty,
                    ));
                }
                if let Some((multiplier, base, allowed)) = sp.dry {
                    chain.push(LlamaSampler::dry(self.model, multiplier, base, allowed, -1, ["\n", ":", "\"", "*"]));
                }
                if sp.temperature <= 0.0 {
                    chain.push(LlamaSampler::greedy());
                } else {
                    if let Some(k) = sp.top_k.filter(|k| *k > 0) {
                        chain.push(LlamaSampler::top_k(k));
                    }
                    if let Some(p) = sp.top_p.filter(|p| *p < 1.0) {
                        chain.push(LlamaSampler::top_p(p, 1));
                    }
                    if let Some(p) = sp.min_p.filter(|p| *p > 0.0) {
                        chain.push(LlamaSampler::min_p(p, 1));
                    }
                    chain.push(LlamaSampler::temp(sp.temperature));
                    chain.push(LlamaSampler::dist(sp.seed));
                }
                let n = tokens.len();
                let state = State::Generate {
                    sampler: LlamaSampler::chain_simple(chain),
                    max_tokens: g.max_tokens as usize,
                    stop: g.stop.clone(),
                    out: Vec::new(),
                    generated: 0,
                    row: None,
                };
                Ok((tokens, state, n))
            }
            Work::Loglik { context, continuation } => {
                // As lm-evaluation-harness: the whole text's tokens, the continuation being
                // those past the context's own tokens (a token straddling the boundary counts
                // for the continuation).
                let whole = vocab.tokenize(format!("{context}{continuation}").as_bytes(), true, false);
                let ctx_tokens = vocab.tokenize(context.as_bytes(), true, false);
                let common = whole.iter().zip(&ctx_tokens).take_while(|(a, b)| a == b).count();
                let first = common.min(ctx_tokens.len());
                if first >= whole.len() {
                    return Err(LlmError::new(ErrorKind::Rejected, "the continuation adds no token to the context"));
                }
                if first == 0 {
                    return Err(LlmError::new(
                        ErrorKind::Rejected,
                        "the first token of the continuation has nothing before it to be predicted from (empty context and no BOS token)",
                    ));
                }
                if whole.len() > self.context as usize {
                    return Err(too_long(whole.len(), "context and continuation"));
                }
                let n = whole.len();
                Ok((whole, State::Loglik { first, logprobs: Vec::new(), rows: Vec::new() }, n))
            }
        }
    }

    /// Put the next tokens into the batch. A decode call is one of two kinds, never both, so
    /// a sequence's numbers do not depend on what else is decoded: a generation step (the
    /// next token of every generating sequence, one each, each in its own KV stream) or a
    /// chunk of one sequence's prompt (cut at multiples of `batch_tokens` from its start). The
    /// two kinds alternate while both have work. False when there is nothing to decode.
    fn fill(&mut self, batch: &mut LlamaBatch) -> bool {
        batch.clear();
        let generating = |s: &Slot| s.fed >= s.prompt_tokens && s.tokens.len() > s.fed;
        let prefilling = |s: &Slot| s.fed < s.prompt_tokens;
        let any_generating = self.slots.iter().flatten().any(generating);
        let any_prefilling = self.slots.iter().flatten().any(prefilling);
        let step = any_generating && !(any_prefilling && self.last_was_step);
        self.last_was_step = step;
        if step {
            for slot in self.slots.iter_mut().flatten().filter(|s| generating(s)) {
                let i = slot.fed;
                batch.add(slot.tokens[i], i as i32, &[slot.seq], true).expect("one token per sequence fits");
                if let State::Generate { row, .. } = &mut slot.state {
                    *row = Some(batch.n_tokens() - 1);
                }
                slot.fed += 1;
            }
            return batch.n_tokens() > 0;
        }
        // The prompt of the sequence admitted first (lowest order) goes on.
        let Some(slot) = self.slots.iter_mut().flatten().filter(|s| prefilling(s)).min_by_key(|s| s.order) else {
            return false;
        };
        let take = (slot.prompt_tokens - slot.fed).min(self.batch_tokens);
        let seq = slot.seq;
        match &mut slot.state {
            State::Generate { row, .. } => {
                for k in 0..take {
                    let i = slot.fed + k;
                    let last = i + 1 == slot.prompt_tokens;
                    batch.add(slot.tokens[i], i as i32, &[seq], last).expect("the batch holds batch_tokens");
                    if last {
                        *row = Some(batch.n_tokens() - 1);
                    }
                }
            }
            State::Loglik { first, rows, .. } => {
                rows.clear();
                for k in 0..take {
                    let i = slot.fed + k;
                    // Row i predicts token i + 1: wanted from the token before the first
                    // continuation token to the one before the last.
                    let wanted = i + 1 >= *first && i + 1 < slot.tokens.len();
                    batch.add(slot.tokens[i], i as i32, &[seq], wanted).expect("the batch holds batch_tokens");
                    if wanted {
                        rows.push((batch.n_tokens() - 1, slot.tokens[i + 1]));
                    }
                }
            }
        }
        slot.fed += take;
        batch.n_tokens() > 0
    }

    /// Read what the last decode computed: log-probabilities of scored rows, the next token
    /// of every sequence whose last token was in it; answer the requests that are done.
    fn after_decode(&mut self) {
        let model: &LlamaModel = self.model;
        let vocab = model.vocab();
        for i in 0..self.slots.len() {
            let Some(slot) = self.slots[i].as_mut() else { continue };
            let complete = slot.fed == slot.tokens.len();
            let done = match &mut slot.state {
                State::Loglik { logprobs, rows, .. } => {
                    for (row, target) in rows.drain(..) {
                        logprobs.push(log_softmax_at(self.ctx.get_logits_ith(row), target));
                    }
                    complete.then(|| Done {
                        text: String::new(),
                        prompt_tokens: slot.tokens.len() as u64,
                        completion_tokens: 0,
                        finish_reason: "loglik",
                        token_logprobs: std::mem::take(logprobs),
                    })
                }
                State::Generate { sampler, max_tokens, stop, out, generated, row } => {
                    let Some(r) = row.take() else { continue };
                    // `sample` also feeds the token to the sampler chain (the grammar).
                    let token = sampler.sample(&self.ctx, r);
                    let finish = if vocab.is_eog(token) {
                        Some("stop")
                    } else {
                        vocab.token_to_piece_into(token, out, false, None);
                        *generated += 1;
                        slot.tokens.push(token);
                        if let Some(cut) = stop_at(out, stop) {
                            out.truncate(cut);
                            Some("stop")
                        } else if *generated >= *max_tokens || slot.tokens.len() >= self.context as usize {
                            Some("length")
                        } else {
                            None
                        }
                    };
                    finish.map(|reason| Done {
                        text: String::from_utf8_lossy(out).into_owned(),
                        prompt_tokens: slot.prompt_tokens as u64,
                        completion_tokens: *generated as u64,
                        finish_reason: reason,
                        token_logprobs: Vec::new(),
                    })
                }
            };
            if let Some(done) = done {
                self.finish(i, Ok(done));
            }
        }
    }

    /// Answer slot `i`'s request and free its sequence.
    fn finish(&mut self, i: usize, result: Result<Done, LlmError>) {
        let Some(slot) = self.slots[i].take() else { return };
        if let Ok(done) = &result {
            let mut s = self.stats.lock().expect("stats");
            s.prompt_tokens += done.prompt_tokens;
            s.generated_tokens += done.completion_tokens;
        }
        // Removing a whole sequence always succeeds; its stream starts at cell 0 again.
        let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
        let _ = slot.job.reply.send(result);
    }
}

/// Where to cut an answer that contains a stop sequence (the first one found).
fn stop_at(out: &[u8], stop: &[String]) -> Option<usize> {
    stop.iter().filter(|s| !s.is_empty()).filter_map(|s| out.windows(s.len()).position(|w| w == s.as_bytes())).min()
}

/// `log softmax(logits)[target]` in f64.
fn log_softmax_at(logits: &[f32], target: LlamaToken) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[target.0 as usize] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_get_a_cap_unless_bounded() {
        let mut s = serde_json::json!({"type": "object", "properties": {
            "a": {"type": "string"}, "b": {"type": "string", "maxLength": 5}, "c": {"type": "string", "enum": ["x"]},
            "d": {"type": "array", "items": {"type": ["string", "null"]}}}});
        cap_strings(&mut s, 100);
        let p = &s["properties"];
        assert_eq!((p["a"]["maxLength"].as_u64(), p["b"]["maxLength"].as_u64()), (Some(100), Some(5)));
        assert!(p["c"].get("maxLength").is_none());
        assert_eq!(p["d"]["items"]["maxLength"], 100);
    }

    #[test]
    fn arrays_get_a_cap_above_their_minimum() {
        let mut s = serde_json::json!({"type": "object", "properties": {
            "a": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
            "b": {"type": "array", "maxItems": 2}, "c": {"type": "array", "minItems": 5}}});
        cap_items(&mut s, 3);
        let p = &s["properties"];
        assert_eq!((p["a"]["maxItems"].as_u64(), p["a"]["items"]["maxItems"].as_u64()), (Some(3), Some(3)));
        assert_eq!((p["b"]["maxItems"].as_u64(), p["c"]["maxItems"].as_u64()), (Some(2), Some(5)));
        assert!(s.get("maxItems").is_none());
    }

    #[test]
    fn stops_and_log_softmax() {
        assert_eq!(stop_at(b"abc</s>def", &["</s>".into()]), Some(3));
        assert_eq!(stop_at(b"abc", &["x".into(), String::new()]), None);
        let lp = log_softmax_at(&[0.0, 0.0], LlamaToken(1));
        assert!((lp - 0.5f64.ln()).abs() < 1e-12);
    }
}
