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
//! path; and no token is decoded alone when flash attention runs on an f16 cache. llama.cpp
//! decodes a call in parts, each a run of sequences with consecutive ids (one stream each);
//! its flash attention splits the cache of a token alone in its part across threads once it
//! holds 512 tokens, and merges the pieces in another order than when the token is decoded
//! beside others (and than with another thread count). So a token that would be alone in its
//! part (a generating sequence whose neighbours do not generate, a one-token prompt chunk)
//! gets a *ballast* token in the next stream (at that stream's next position, no logits,
//! removed after the call; the stream after the requests' ones serves the last sequence),
//! which keeps it on the path every other token takes (a q8_0 cache never takes the split
//! path). With a per-request sampler seeded by the request, the same request gives the same
//! bytes however requests interleave (`tests/local.rs` compares answers decoded alone and
//! sixteen at a time).
//!
//! **Shared prompt starts.** A prompt is cut at fixed places: at the token where a message's
//! text begins (for a likelihood, before the context's last token) and every `chunk_tokens`
//! (a likelihood: `batch_tokens`) after each of those and after the start
//! ([`with_chunk_ends`]): its *cuts*, where its
//! chunks end. So the cache of a prompt's first `c` tokens, for a cut `c`, is a function of
//! those tokens and the cuts below `c` alone. When a live sequence (or a free one still
//! holding its last prompt) has already decoded the same first `c` tokens with the same cuts
//! below `c`, a new prompt copies that sequence's stream (the same bytes in the same cells)
//! instead of decoding them again: what the template puts before every conversation, a shared
//! system prompt, a one-shot example before the part that differs (all of it but its last
//! partial chunk), the prompt of a re-asked request, the question of the four likelihood
//! choices. A request alone cuts its prompt at the same places, so sharing changes no number.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Instant;

/// Taken around every `decode` call of every engine of the process (see its use).
static DECODE_TURN: CoreGate = CoreGate::new();

/// The process's cores, lent to decode calls: a call takes as many as its engine has threads
/// (at most all of them) and waits its turn, first come first served, until that many are
/// free. Engines of several models (a base and its fine-tuned checkpoints answering side by
/// side) that each use every core then take turns instead of their threads fighting over the
/// cores (ggml's threads spin at every barrier of a graph, so a thread put aside stalls the
/// others); engines of one thread each, as many as there are cores, decode side by side.
/// Which call goes first changes no number: each engine has its own context.
struct CoreGate {
    state: Mutex<GateState>,
    turn: std::sync::Condvar,
}

struct GateState {
    /// Cores of the process (0 until the first call asks).
    cores: usize,
    in_use: usize,
    /// Tickets handed out and the one whose turn it is.
    next_ticket: u64,
    serving: u64,
}

/// Cores held by one decode call; given back when dropped.
struct GateTurn<'a> {
    gate: &'a CoreGate,
    held: usize,
}

impl CoreGate {
    const fn new() -> Self {
        Self::with_cores(0)
    }

    /// A gate of `cores` cores (0: the machine's, counted at the first call).
    const fn with_cores(cores: usize) -> Self {
        CoreGate {
            state: Mutex::new(GateState { cores, in_use: 0, next_ticket: 0, serving: 0 }),
            turn: std::sync::Condvar::new(),
        }
    }

    /// Waits until `threads` cores (at most all of them) are free and this call is the oldest
    /// waiting, then holds them.
    fn enter(&self, threads: usize) -> GateTurn<'_> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.cores == 0 {
            s.cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        let want = threads.clamp(1, s.cores);
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        while s.serving != ticket || s.in_use + want > s.cores {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.in_use += want;
        s.serving += 1;
        // The next in line may fit beside this call.
        self.turn.notify_all();
        GateTurn { gate: self, held: want }
    }
}

impl Drop for GateTurn<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
        s.in_use -= self.held;
        self.gate.turn.notify_all();
    }
}

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use synth_llm::{ErrorKind, LlmError};

/// How the engine runs (from the provider's options).
#[derive(Debug, Clone)]
pub struct Settings {
    pub path: PathBuf,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Copy prompt starts other sequences decoded (see the module's invariant).
    pub share_prompts: bool,
    /// Tokens per sequence (prompt and answer).
    pub context: u32,
    /// Tokens per decode call.
    pub batch_tokens: u32,
    /// A generation prompt's chunks end every this many tokens after each message start
    /// (at most `batch_tokens`): where another prompt can share its start from.
    pub chunk_tokens: u32,
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
    pub messages: Vec<synth_llm::Message>,
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
pub use synth_llm::EngineStats as Stats;

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
        *self.stats.lock().expect("stats")
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
    // Ballast tokens (see the module's invariant) need a stream after the requests' ones.
    let ballast = settings.flash_attention == Some(true) && !settings.kv_q8;
    let streams = n_seq as u32 + u32::from(ballast);
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(context * streams))
        // A generation step holds a token per sequence and up to a ballast for every other.
        .with_n_batch(settings.batch_tokens.max(2 * n_seq as u32 + 2))
        .with_n_ubatch(settings.batch_tokens.max(2 * n_seq as u32 + 2))
        .with_n_seq_max(streams)
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
        kept: (0..n_seq).map(|_| None).collect(),
        share_prompts: settings.share_prompts,
        queue: VecDeque::new(),
        context,
        batch_tokens: settings.batch_tokens as usize,
        chunk_tokens: settings.chunk_tokens.clamp(1, settings.batch_tokens) as usize,
        grammars: Grammars {
            max_string_chars: settings.max_string_chars,
            max_items: settings.max_items,
            ..Default::default()
        },
        template: super::template::ChatTemplate::from_model(&model),
        stats,
        provider: settings.provider.clone(),
        admitted: 0,
        chunks_since_step: 0,
        threads: settings.threads.max(1) as usize,
        ballast,
        ballasts: Vec::new(),
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
    /// Where the prompt's chunks end ([`with_chunk_ends`]; ascending, each in 1..prompt_tokens).
    cuts: Vec<usize>,
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
    /// What a free sequence's stream still holds from its last request (tokens in the cache
    /// and their cuts), to be shared with a later prompt; `None`: the stream is empty.
    kept: Vec<Option<(Vec<LlamaToken>, Vec<usize>)>>,
    share_prompts: bool,
    queue: VecDeque<Job>,
    context: u32,
    batch_tokens: usize,
    /// Generation prompts' chunk grid (see [`Settings::chunk_tokens`]).
    chunk_tokens: usize,
    grammars: Grammars,
    template: super::template::ChatTemplate,
    stats: Arc<Mutex<Stats>>,
    provider: String,
    /// Requests admitted so far.
    admitted: u64,
    /// Prompt chunks decoded since the last generation step.
    chunks_since_step: usize,
    /// Threads that draw the next tokens (llama.cpp's own count).
    threads: usize,
    /// Whether a token alone in its part of a decode call gets a ballast token (flash
    /// attention on an f16 cache; see the module's invariant).
    ballast: bool,
    /// The ballast tokens of the call being decoded (stream, position), removed after it.
    ballasts: Vec<(i32, i32)>,
}

impl Loop<'_> {
    fn serve(&mut self, rx: &mpsc::Receiver<Job>) {
        let mut batch = LlamaBatch::new(self.batch_tokens.max(2 * self.slots.len() + 2), 1);
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
                // The cores this call's threads use, shared with the process's other engines
                // (`CoreGate`).
                let _turn = DECODE_TURN.enter(self.threads);
                self.ctx.decode(&mut batch)
            };
            // The ballast tokens go again: each stream holds what it held before the call.
            for (stream, position) in std::mem::take(&mut self.ballasts) {
                let _ = self.ctx.clear_kv_cache_seq(Some(stream as u32), Some(position as u32), None);
            }
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
                    // Nor is a kept stream trusted after a failed decode.
                    if self.kept[i].take().is_some() {
                        let _ = self.ctx.clear_kv_cache_seq(Some(i as u32), None, None);
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
    /// Conversations that go on (a re-ask: an answer of the model is in them) go first, in
    /// arrival order, then the rest: a record asked again has waited once already, and a
    /// chain of tries is what a stage of few records waits for. (Which job starts first
    /// changes no number: see the module's invariant.)
    fn admit(&mut self) {
        while self.slots.iter().any(Option::is_none) {
            let goes_on = |j: &Job| matches!(&j.work, Work::Generate(g) if g.messages.iter().any(|m| m.role == synth_llm::Role::Assistant));
            let next = self.queue.iter().position(goes_on).unwrap_or(0);
            let Some(job) = self.queue.remove(next) else { return };
            match self.start(&job.work) {
                Ok((tokens, state, prompt_tokens, cuts)) => {
                    let i = self.free_slot_for(&tokens, &cuts);
                    self.admitted += 1;
                    let order = self.admitted;
                    // The stream keeps the start it shares with its last request; the rest goes.
                    let seq = i as i32;
                    let mut fed = 0;
                    if let Some((kept, kept_cuts)) = self.kept[i].take() {
                        let c =
                            if self.share_prompts { shared_start(&cuts, &tokens, 0, &kept_cuts, &kept) } else { None };
                        let trimmed = c.is_some_and(|c| {
                            self.ctx.clear_kv_cache_seq(Some(seq as u32), Some(c as u32), None).unwrap_or(false)
                        });
                        match c {
                            Some(c) if trimmed => {
                                fed = c;
                                self.stats.lock().expect("stats").reused_prompt_tokens += c as u64;
                            }
                            _ => {
                                let _ = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
                            }
                        }
                    }
                    self.slots[i] = Some(Slot { seq, job, tokens, fed, prompt_tokens, cuts, order, state });
                    self.stats.lock().expect("stats").requests += 1;
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                }
            }
        }
    }

    /// The free sequence for a new prompt: the one whose kept stream shares the longest
    /// start with it, else one holding nothing (a kept stream stays for later prompts), else
    /// the first.
    fn free_slot_for(&self, tokens: &[LlamaToken], cuts: &[usize]) -> usize {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_none())
            .max_by_key(|&i| {
                let shared = match (&self.kept[i], self.share_prompts) {
                    (Some((held, held_cuts)), true) => shared_start(cuts, tokens, 0, held_cuts, held).unwrap_or(0),
                    _ => 0,
                };
                (shared, self.kept[i].is_none(), std::cmp::Reverse(i))
            })
            .expect("admit is called with a free sequence")
    }

    /// A request's tokens, state, prompt length and cuts.
    fn start(&mut self, work: &Work) -> Result<(Vec<LlamaToken>, State, usize, Vec<usize>), LlmError> {
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
                let mut text = Vec::with_capacity(prompt.len());
                let ends: Vec<usize> = tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        // A beginning-of-sequence token the tokenizer added is not in the text.
                        if !(i == 0 && *t == vocab.bos() && !prompt.starts_with(&self.template.bos)) {
                            vocab.token_to_piece_into(*t, &mut text, true, None);
                        }
                        text.len()
                    })
                    .collect();
                let contents: Vec<&str> = g.messages.iter().map(|m| m.content.as_str()).collect();
                let cuts = with_chunk_ends(
                    spaced(token_index_at(&ends, &content_starts(&prompt, &contents)), n),
                    n,
                    self.chunk_tokens,
                );
                let state = State::Generate {
                    sampler: LlamaSampler::chain_simple(chain),
                    max_tokens: g.max_tokens as usize,
                    stop: g.stop.clone(),
                    out: Vec::new(),
                    generated: 0,
                    row: None,
                };
                Ok((tokens, state, n, cuts))
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
                // The context but its last token (whose row scores the first continuation
                // token) is what the choices of one question share.
                let cuts = with_chunk_ends(spaced(vec![first - 1], n), n, self.batch_tokens);
                Ok((whole, State::Loglik { first, logprobs: Vec::new(), rows: Vec::new() }, n, cuts))
            }
        }
    }

    /// Put the next tokens into the batch. A decode call is one of two kinds, never both, so
    /// a sequence's numbers do not depend on what else is decoded: a generation step (the
    /// next token of every generating sequence, one each, each in its own KV stream) or a
    /// chunk of one sequence's prompt (cut at its cuts and at multiples of `batch_tokens` from
    /// the last cut; a start another sequence already decoded is copied, not decoded).
    /// Prompts go first, at most one chunk per sequence between two steps. False when there
    /// is nothing to decode.
    fn fill(&mut self, batch: &mut LlamaBatch) -> bool {
        batch.clear();
        let generating = |s: &Slot| s.fed >= s.prompt_tokens && s.tokens.len() > s.fed;
        let prefilling = |s: &Slot| s.fed < s.prompt_tokens;
        let any_generating = self.slots.iter().flatten().any(generating);
        let any_prefilling = self.slots.iter().flatten().any(prefilling);
        // Prompts first (a step then advances every sequence that has its prompt), but at most
        // one chunk per sequence between two steps, so generating sequences keep moving.
        let step = any_generating && (!any_prefilling || self.chunks_since_step >= self.slots.len());
        self.chunks_since_step = if step { 0 } else { self.chunks_since_step + 1 };
        if step {
            let stepping: Vec<bool> = self.slots.iter().map(|s| s.as_ref().is_some_and(generating)).collect();
            for k in 0..self.slots.len() {
                let Some(slot) = self.slots[k].as_mut().filter(|_| stepping[k]) else { continue };
                let i = slot.fed;
                let token = slot.tokens[i];
                batch.add(token, i as i32, &[slot.seq], true).expect("one token per sequence fits");
                if let State::Generate { row, .. } = &mut slot.state {
                    *row = Some(batch.n_tokens() - 1);
                }
                slot.fed += 1;
                // Alone between its neighbours: llama.cpp would decode it in a part of its own.
                let beside = |j: Option<usize>| j.and_then(|j| stepping.get(j)).copied().unwrap_or(false);
                if !beside(k.checked_sub(1)) && !beside(Some(k + 1)) {
                    self.add_ballast(batch, k + 1, token);
                }
            }
            return batch.n_tokens() > 0;
        }
        // The prompt of the sequence admitted first (lowest order) goes on.
        let Some(index) = (0..self.slots.len())
            .filter(|&i| self.slots[i].as_ref().is_some_and(prefilling))
            .min_by_key(|&i| self.slots[i].as_ref().map(|s| s.order))
        else {
            return false;
        };
        self.share_start(index);
        let Some(slot) = self.slots[index].as_mut() else { return false };
        let segment_end = slot.cuts.iter().copied().find(|&c| c > slot.fed).unwrap_or(slot.prompt_tokens);
        let take = (segment_end - slot.fed).min(self.batch_tokens);
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
        if take == 1 {
            let token = slot.tokens[slot.fed - 1];
            self.add_ballast(batch, index + 1, token);
        }
        batch.n_tokens() > 0
    }

    /// With flash attention on an f16 cache, a token of sequence `stream - 1` that llama.cpp
    /// would decode in a part of its own gets a ballast `token` in the next stream, at that
    /// stream's next position, logits not computed (removed after the call; see the module's
    /// invariant). That stream is not in the call otherwise: a sequence being fed or
    /// generating outside this call, a free one (empty or holding its last prompt), or the
    /// stream after the requests' ones.
    fn add_ballast(&mut self, batch: &mut LlamaBatch, stream: usize, token: LlamaToken) {
        if !self.ballast {
            return;
        }
        let position = match self.slots.get(stream) {
            Some(Some(slot)) => slot.fed,
            Some(None) => self.kept[stream].as_ref().map_or(0, |(tokens, _)| tokens.len()),
            None => 0,
        } as i32;
        batch.add(token, position, &[stream as i32], false).expect("the batch holds 2 tokens per sequence");
        self.ballasts.push((stream as i32, position));
    }

    /// Copy into slot `index`'s stream the longest start of its prompt that another sequence
    /// (live, or free and still holding its last request) has decoded with the same tokens
    /// and cuts (see the module's invariant).
    fn share_start(&mut self, index: usize) {
        let Some(slot) = self.slots[index].as_ref().filter(|_| self.share_prompts) else { return };
        let mut best: Option<(usize, i32)> = None;
        for j in (0..self.slots.len()).filter(|&j| j != index) {
            let (cuts, held) = match (&self.slots[j], &self.kept[j]) {
                (Some(other), _) => (&other.cuts, &other.tokens[..other.fed]),
                (None, Some((tokens, cuts))) => (cuts, &tokens[..]),
                (None, None) => continue,
            };
            let from = best.map_or(slot.fed, |(c, _)| c.max(slot.fed));
            if let Some(c) = shared_start(&slot.cuts, &slot.tokens, from, cuts, held) {
                best = Some((c, j as i32));
            }
        }
        let Some((c, src)) = best else { return };
        let dst = slot.seq;
        // Streams differ, so llama.cpp copies the whole stream (at the next decode, before its
        // tokens) and the positions from `c` on are dropped again.
        let copied = self.ctx.copy_kv_cache_seq(src, dst, None, None).is_ok()
            && self.ctx.clear_kv_cache_seq(Some(dst as u32), Some(c as u32), None).unwrap_or(false);
        let Some(slot) = self.slots[index].as_mut() else { return };
        if copied {
            let reused = c - slot.fed;
            slot.fed = c;
            self.stats.lock().expect("stats").reused_prompt_tokens += reused as u64;
        } else {
            // Start over from cell 0 (the stream is in an unknown state).
            let _ = self.ctx.clear_kv_cache_seq(Some(dst as u32), None, None);
            slot.fed = 0;
        }
    }

    /// Read what the last decode computed: log-probabilities of scored rows, the next token
    /// of every sequence whose last token was in it; answer the requests that are done.
    fn after_decode(&mut self) {
        let model: &LlamaModel = self.model;
        let vocab = model.vocab();
        let mut picked = self.sample_all();
        for (i, pick) in picked.iter_mut().enumerate() {
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
                State::Generate { max_tokens, stop, out, generated, .. } => {
                    let Some(token) = pick.take() else { continue };
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

    /// The next token of every sequence whose row was in the last decode (by slot), drawn on
    /// up to `threads` threads: the samplers are independent (each its own chain, grammar and
    /// random state) and the context is only read (its logits are put in batch order by the
    /// first read, done here before the threads start). `sample` also feeds the token to the
    /// chain (the grammar).
    fn sample_all(&mut self) -> Vec<Option<LlamaToken>> {
        let mut picked: Vec<Option<LlamaToken>> = vec![None; self.slots.len()];
        let mut work: Vec<Unshared<(&mut LlamaSampler, i32, &mut Option<LlamaToken>)>> = Vec::new();
        for (slot, pick) in self.slots.iter_mut().zip(picked.iter_mut()) {
            if let Some(Slot { state: State::Generate { sampler, row, .. }, .. }) = slot
                && let Some(r) = row.take()
            {
                work.push(Unshared((sampler, r, pick)));
            }
        }
        let Some(first) = work.first() else { return picked };
        let _ = self.ctx.get_logits_ith(first.0.1);
        let ctx = Unshared(&self.ctx);
        let threads = self.threads.clamp(1, work.len());
        let per = work.len().div_ceil(threads);
        let draw = |part: Vec<Unshared<(&mut LlamaSampler, i32, &mut Option<LlamaToken>)>>| {
            let ctx = &ctx;
            for Unshared((sampler, r, pick)) in part {
                *pick = Some(sampler.sample(ctx.0, r));
            }
        };
        std::thread::scope(|scope| {
            let mut rest = work;
            while rest.len() > per {
                let part = rest.split_off(rest.len() - per);
                scope.spawn(move || draw(part));
            }
            draw(rest);
        });
        picked
    }

    /// Answer slot `i`'s request and free its sequence.
    fn finish(&mut self, i: usize, result: Result<Done, LlmError>) {
        let Some(slot) = self.slots[i].take() else { return };
        if let Ok(done) = &result {
            let mut s = self.stats.lock().expect("stats");
            s.prompt_tokens += done.prompt_tokens;
            s.generated_tokens += done.completion_tokens;
        }
        if result.is_ok() && self.share_prompts {
            // The stream stays as it is until its sequence is used again (then its start is
            // kept if the new prompt shares it, the rest removed): prompts admitted later can
            // still copy from it.
            let mut tokens = slot.tokens;
            tokens.truncate(slot.fed);
            self.kept[i] = Some((tokens, slot.cuts));
        } else {
            // Removing a whole sequence always succeeds; its stream starts at cell 0 again.
            let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
        }
        let _ = slot.job.reply.send(result);
    }
}

/// The longest cut `c > from` of a prompt (`cuts`, `tokens`) whose first `c` tokens another
/// stream holds (`held`) with the same cuts below `c` and `c` itself one of its cuts: those
/// tokens' cache is then the same bytes the prompt would compute.
fn shared_start(
    cuts: &[usize],
    tokens: &[LlamaToken],
    from: usize,
    held_cuts: &[usize],
    held: &[LlamaToken],
) -> Option<usize> {
    // Cuts are ascending: `n` of them lie below `cuts[n]`.
    cuts.iter().enumerate().rev().take_while(|(_, c)| **c > from).find_map(|(n, &c)| {
        (held.len() >= c && held_cuts.get(n) == Some(&c) && held_cuts[..n] == cuts[..n] && held[..c] == tokens[..c])
            .then_some(c)
    })
}

/// A value moved to a sampling thread of [`Loop::sample_all`]: llama.cpp's samplers and
/// context are raw pointers to Rust; each sampler is used by one thread at a time and the
/// context is only read while the threads run.
struct Unshared<T>(T);
// SAFETY: see the type's comment; the threads end (scope) before the loop touches either again.
unsafe impl<T> Send for Unshared<T> {}
unsafe impl<T> Sync for Unshared<T> {}

/// Cuts closer than this to the prompt's start or to the last cut are left out (a start that
/// short saves little, and every cut is one more decode call).
const MIN_SHARED: usize = 16;

/// Byte offsets in `prompt` where each of `contents` begins, looked for in order, each after
/// the last found (contents that are empty or not found are passed over).
fn content_starts(prompt: &str, contents: &[&str]) -> Vec<usize> {
    let mut from = 0;
    let mut starts = Vec::new();
    for content in contents.iter().filter(|c| !c.is_empty()) {
        if let Some(at) = prompt[from..].find(content) {
            starts.push(from + at);
            from += at + content.len();
        }
    }
    starts
}

/// For each byte offset, how many tokens end at or before it (`ends[i]`: the text's length
/// after token `i`).
fn token_index_at(ends: &[usize], offsets: &[usize]) -> Vec<usize> {
    offsets.iter().map(|&o| ends.partition_point(|&e| e <= o)).collect()
}

/// Cuts kept: ascending, inside the prompt (`1..n`), each at least [`MIN_SHARED`] after the
/// start and the last kept one.
fn spaced(mut cuts: Vec<usize>, n: usize) -> Vec<usize> {
    cuts.sort_unstable();
    let mut kept: Vec<usize> = Vec::new();
    for c in cuts {
        if c < n && c >= kept.last().copied().unwrap_or(0) + MIN_SHARED {
            kept.push(c);
        }
    }
    kept
}

/// The cuts and, between two of them (and before the first, after the last), every
/// `batch_tokens` from the lower one: where the prompt's chunks end (`fill` cuts there anyway),
/// so also where a start can be shared (a chunk's cache depends on the chunks below it alone).
/// A one-shot example before the part that differs is shared but for its last partial chunk.
fn with_chunk_ends(cuts: Vec<usize>, n: usize, batch_tokens: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(cuts.len() + n / batch_tokens.max(1));
    let mut start = 0;
    for end in cuts.iter().copied().chain([n]) {
        out.extend((start + batch_tokens..end).step_by(batch_tokens.max(1)));
        if end < n {
            out.push(end);
        }
        start = end;
    }
    out
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
    fn the_core_gate_lets_one_thread_engines_decode_side_by_side_and_keeps_arrival_order() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        static GATE: CoreGate = CoreGate::with_cores(2);
        let a = GATE.enter(1);
        // A second one-thread call fits beside the first.
        let b = GATE.enter(1);
        // A call that wants every core waits for both, and a later one-thread call waits
        // behind it (first come, first served: a two-thread engine is not starved).
        let (tx, rx) = channel();
        let t2 = tx.clone();
        let wide = std::thread::spawn(move || {
            let _t = GATE.enter(4); // capped at the gate's 2 cores
            t2.send("wide").unwrap();
            std::thread::sleep(Duration::from_millis(50));
        });
        std::thread::sleep(Duration::from_millis(100));
        let narrow = std::thread::spawn(move || {
            let _t = GATE.enter(1);
            tx.send("narrow").unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "nobody may enter while two cores are held");
        drop(a);
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "the wide call needs both cores; the narrow one waits behind it");
        drop(b);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "wide");
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "narrow");
        wide.join().unwrap();
        narrow.join().unwrap();
        let s = GATE.state.lock().unwrap();
        assert_eq!(s.in_use, 0);
    }

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
    fn prompts_are_cut_where_message_texts_begin() {
        let prompt = "<s>system\nBe brief.</s><s>user\nHello there</s><s>assistant\n";
        let starts = content_starts(prompt, &["Be brief.", "", "Hello there", "missing"]);
        assert_eq!(starts, vec![10, 31]);
        // Tokens ending at bytes 3, 10, 19, 25, 31, 42: 2 tokens end at or before 10, 5 before 31.
        assert_eq!(token_index_at(&[3, 10, 19, 25, 31, 42], &starts), vec![2, 5]);
        // Not within MIN_SHARED of the start or of each other, never the whole prompt.
        assert_eq!(spaced(vec![40, 5, 20, 30, 90], 90), vec![20, 40]);
        assert_eq!(spaced(vec![16], 16), Vec::<usize>::new());
        // Chunk ends every batch_tokens from each cut (and from 0), never the prompt's end.
        assert_eq!(with_chunk_ends(vec![20, 40], 100, 8), vec![8, 16, 20, 28, 36, 40, 48, 56, 64, 72, 80, 88, 96]);
        assert_eq!(with_chunk_ends(vec![], 1024, 512), vec![512]);
        assert_eq!(with_chunk_ends(vec![600], 1100, 512), vec![512, 600]);
        assert_eq!(with_chunk_ends(vec![30], 40, 512), vec![30]);
    }

    #[test]
    fn a_start_is_shared_only_with_the_same_tokens_and_cuts() {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken::new(x)).collect::<Vec<_>>();
        let prompt = t(&(0..60).collect::<Vec<_>>());
        let cuts = [20, 40];
        // Held with the same cuts: the longest cut it holds whole.
        assert_eq!(shared_start(&cuts, &prompt, 0, &[20, 40], &prompt[..45]), Some(40));
        assert_eq!(shared_start(&cuts, &prompt, 0, &[20, 40], &prompt[..39]), Some(20));
        // Nothing past what is already fed.
        assert_eq!(shared_start(&cuts, &prompt, 40, &[20, 40], &prompt), None);
        // Other cuts below: the tokens were cut elsewhere, their cache differs.
        assert_eq!(shared_start(&cuts, &prompt, 0, &[18, 40], &prompt), None);
        // 40 is not a cut of the other stream: it decoded across it.
        assert_eq!(shared_start(&cuts, &prompt, 0, &[20], &prompt), Some(20));
        // Other tokens.
        let mut other = prompt.clone();
        other[30] = LlamaToken::new(999);
        assert_eq!(shared_start(&cuts, &prompt, 0, &[20, 40], &other), Some(20));
        other[3] = LlamaToken::new(999);
        assert_eq!(shared_start(&cuts, &prompt, 0, &[20, 40], &other), None);
    }

    #[test]
    fn stops_and_log_softmax() {
        assert_eq!(stop_at(b"abc</s>def", &["</s>".into()]), Some(3));
        assert_eq!(stop_at(b"abc", &["x".into(), String::new()]), None);
        let lp = log_softmax_at(&[0.0, 0.0], LlamaToken(1));
        assert!((lp - 0.5f64.ln()).abs() < 1e-12);
    }
}
