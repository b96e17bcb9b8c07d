//! The `offline` provider: a deterministic stand-in for an LLM that needs no
//! network, for demos, dry runs and CI. It answers in the *shape* the stage's parser
//! expects (`ChatRequest::expect`, e.g. `score` or `json:a,b`), built from the
//! prompt's own content with a RNG seeded by the prompt. The engine's shapes are
//! here (`score`: a `Score: 0/1` judgement; `json`: a JSON object with the named
//! fields; anything else: a short paragraph); a method registers the shapes of its
//! own parsers ([`OfflineShape`], found through the registry). Its output is marked
//! model `offline`; it is not training data.

use std::sync::Arc;

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use synth_core::config::decl::{Decl, ProviderKind};
use synth_core::config::options::{OptionSpec, POSITIVE, RATIO, Ty};

use super::pricing::Price;
use super::provider::{BuildCtx, Provider, ProviderDesc};
use super::rate::RateConfig;

use super::{
    ChatBackend, ChatRequest, ChatResponse, GenParams, LlmError, Loglik, LoglikRequest, Usage, estimate_tokens,
};

pub use super::shape::{OfflineShape, ShapeInput};

pub const MODEL: &str = "offline";

/// The `offline` kind's options.
const OFFLINE_OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("model", Ty::Str, "\"offline\"", "name recorded in outputs"),
    OptionSpec::default("seed", Ty::Int(i64::MIN, i64::MAX), "0", "generator seed"),
    OptionSpec::default("score_one", RATIO, "0.7", "probability that a judge score is 1"),
    crate::provider::GEN_OPTIONS[0],
    crate::provider::GEN_OPTIONS[1],
    crate::provider::GEN_OPTIONS[2],
    crate::provider::GEN_OPTIONS[4],
    crate::provider::GEN_OPTIONS[5],
    OptionSpec::default("max_concurrency", POSITIVE, "64", "most requests in flight").runtime_only(),
];

/// The `offline` provider kind.
pub static PROVIDER: ProviderDesc = ProviderDesc {
    kind: ProviderKind {
        name: "offline",
        about: "deterministic generator without network, for demos and CI (its output is not training data)",
        options: OFFLINE_OPTIONS,
        check: None,
    },
    networked: false,
    identity,
    build,
    with_model: None,
    hub_model: None,
    pin_hub_model: None,
    batch_apis: &[],
};

#[derive(Debug, Clone, serde::Deserialize)]
struct OfflineOptions {
    model: String,
    seed: i64,
    score_one: f64,
    #[serde(flatten)]
    generation: GenParams,
    max_concurrency: usize,
}

fn identity(decl: &Decl, _root: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let o: OfflineOptions = serde_json::from_value(decl.options.clone())?;
    Ok(
        serde_json::json!({"kind": "offline", "model": o.model, "seed": o.seed, "score_one": o.score_one, "params": o.generation}),
    )
}

fn build(decl: &Decl, ctx: &BuildCtx) -> anyhow::Result<Provider> {
    use anyhow::Context;
    let name = decl.name.as_str();
    let o: OfflineOptions = serde_json::from_value(decl.options.clone()).context("provider options")?;
    let cfg =
        RateConfig { max_concurrency: o.max_concurrency, initial_concurrency: o.max_concurrency, ..Default::default() };
    let rate = ctx.rates.get(&format!("offline|{name}"), name, cfg);
    let backend = Offline { seed: o.seed as u64, score_one: o.score_one, shapes: ctx.shapes.clone() };
    let mut p = Provider::new(name, &PROVIDER, o.model, o.generation, Arc::new(backend), rate);
    p.price = Some(Price { input: 0.0, output: 0.0 });
    p.offline_identity = Some(serde_json::json!({"seed": o.seed, "score_one": o.score_one}));
    // A stand-in answers in the parser's text shape: no structured mode.
    Ok(p)
}

/// The engine's shapes (those of the generic `text`, `json` and `score` parsers).
pub static SHAPES: &[&OfflineShape] = &[&SCORE, &JSON, &NUMBER];

pub static SCORE: OfflineShape = OfflineShape {
    name: "score",
    generate: |input, rng| format!("Score: {}", u8::from(rng.random_bool(input.score_one.clamp(0.0, 1.0)))),
};

/// A bare integer score (the `number` parser's default shape): uniform in `lo..=hi` of
/// `number:lo,hi`, 1..=5 without arguments.
pub static NUMBER: OfflineShape = OfflineShape {
    name: "number",
    generate: |input, rng| {
        let mut bounds = input.args.split(',').filter_map(|a| a.trim().parse::<i64>().ok());
        let (lo, hi) = match (bounds.next(), bounds.next()) {
            (Some(lo), Some(hi)) if lo <= hi => (lo, hi),
            _ => (1, 5),
        };
        rng.random_range(lo..=hi).to_string()
    },
};

pub static JSON: OfflineShape =
    OfflineShape { name: "json", generate: |input, rng| json_object(input.prompt, input.args, rng) };

pub struct Offline {
    pub seed: u64,
    /// Probability that a judge answers 1.
    pub score_one: f64,
    /// The shapes it knows (the engine's and every method's); an unknown shape gets a paragraph.
    pub shapes: Arc<[&'static OfflineShape]>,
}

#[async_trait::async_trait]
impl ChatBackend for Offline {
    async fn chat_once(&self, req: &ChatRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        let text = self.generate(req, params);
        Ok(ChatResponse {
            usage: Usage {
                prompt_tokens: req.messages.iter().map(|m| estimate_tokens(&m.content)).sum(),
                completion_tokens: estimate_tokens(&text),
            },
            text,
            finish_reason: "stop".into(),
            model: MODEL.into(),
            system_fingerprint: None,
        })
    }

    async fn loglik_once(&self, req: &LoglikRequest, params: &GenParams) -> Result<ChatResponse, LlmError> {
        let ll = self.loglik(req, params);
        Ok(ChatResponse {
            usage: Usage { prompt_tokens: estimate_tokens(&req.context) + ll.tokens, completion_tokens: 0 },
            text: ll.to_text(),
            finish_reason: "loglik".into(),
            model: MODEL.into(),
            system_fingerprint: None,
        })
    }
}

impl Offline {
    /// A log-likelihood drawn from the request's seeded RNG: one token, a log-probability
    /// in (-8, 0], the same for the same request and provider seed.
    pub fn loglik(&self, req: &LoglikRequest, params: &GenParams) -> Loglik {
        let mut h = blake3::Hasher::new();
        h.update(b"loglik");
        h.update(&self.seed.to_le_bytes());
        h.update(serde_json::to_string(req).unwrap_or_default().as_bytes());
        h.update(&params.seed.unwrap_or(0).to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(*h.finalize().as_bytes());
        let u: f64 = rng.random_range(0.0..8.0);
        Loglik { logprob: -u, tokens: 1 }
    }

    pub fn generate(&self, req: &ChatRequest, params: &GenParams) -> String {
        let mut h = blake3::Hasher::new();
        h.update(&self.seed.to_le_bytes());
        h.update(serde_json::to_string(&req.messages).unwrap_or_default().as_bytes());
        h.update(&req.sample.to_le_bytes());
        h.update(&params.seed.unwrap_or(0).to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(*h.finalize().as_bytes());
        let prompt = req.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
        let (name, args) = req.expect.split_once(':').unwrap_or((req.expect.as_str(), ""));
        match self.shapes.iter().find(|s| s.name == name) {
            Some(shape) => (shape.generate)(&ShapeInput { prompt: &prompt, args, score_one: self.score_one }, &mut rng),
            None => paragraph_of(&prompt, &mut rng, 3),
        }
    }
}

pub const STOP: &[&str] = &[
    "about",
    "above",
    "after",
    "again",
    "their",
    "there",
    "these",
    "those",
    "which",
    "while",
    "would",
    "could",
    "should",
    "other",
    "every",
    "where",
    "being",
    "based",
    "following",
    "provide",
    "provided",
    "answer",
    "question",
    "passages",
    "role",
    "profile",
    "dialogue",
    "speech",
    "example",
    "examples",
    "content",
    "character",
    "entered",
    "rewritten",
    "setting",
    "settings",
    "setting,",
    "needs",
    "include",
    "including",
    "users",
    "user",
    "turns",
    "synthesized",
];

/// Distinct lower-case content words of a text, in order of appearance.
pub fn content_words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_alphanumeric() && c != '-') {
        let w = w.trim_matches('-').to_lowercase();
        if w.chars().count() >= 5
            && w.chars().all(|c| c.is_alphabetic() || c == '-')
            && !STOP.contains(&w.as_str())
            && !out.contains(&w)
        {
            out.push(w);
        }
    }
    if out.is_empty() {
        out.push("stories".into());
    }
    out
}

pub fn title(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

pub fn pick<'a, R: Rng>(rng: &mut R, items: &'a [&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

pub fn pick_word<R: Rng>(rng: &mut R, words: &[String]) -> String {
    words[rng.random_range(0..words.len())].clone()
}

pub fn paragraph<R: Rng>(words: &[String], rng: &mut R, sentences: usize) -> String {
    (0..sentences)
        .map(|_| {
            let a = pick_word(rng, words);
            let b = pick_word(rng, words);
            format!("{} matters here because of {}, and it is worth a closer look.", title(&a), b)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a prompt is written mostly in Chinese characters (more Han letters than Latin).
pub fn mostly_han(text: &str) -> bool {
    let (mut han, mut latin) = (0usize, 0usize);
    for c in text.chars() {
        if is_han(c) {
            han += 1;
        } else if c.is_ascii_alphabetic() {
            latin += 1;
        }
    }
    han > latin
}

fn is_han(c: char) -> bool {
    matches!(c, '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}' | '\u{f900}'..='\u{faff}')
}

/// A stand-in paragraph in the prompt's script: Chinese sentences built from the prompt's
/// Chinese phrases when it is written mostly in Chinese (so an answer asked for in Chinese
/// is in Chinese, as the language check asks of a real model), [`paragraph`] otherwise.
pub fn paragraph_of<R: Rng>(prompt: &str, rng: &mut R, sentences: usize) -> String {
    let words = content_words(prompt);
    if !mostly_han(prompt) {
        return paragraph(&words, rng, sentences);
    }
    let mut han: Vec<String> =
        words.iter().filter(|w| w.chars().all(is_han)).map(|w| w.chars().take(6).collect()).collect();
    if han.is_empty() {
        han.push("这个故事".into());
    }
    (0..sentences)
        .map(|_| format!("{}在这里很重要，因为{}，值得细看。", pick_word(rng, &han), pick_word(rng, &han)))
        .collect()
}

/// Text between the last `start` marker and the next `end` marker after it.
pub fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let s = text.rfind(start)? + start.len();
    let rest = &text[s..];
    let e = rest.find(end).unwrap_or(rest.len());
    Some(rest[..e].trim())
}

/// The first fenced block (```) after `marker`.
pub fn block_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let s = text.find(marker)? + marker.len();
    let rest = &text[s..];
    let open = rest.find("```")? + 3;
    let inner = &rest[open..];
    let inner = inner.strip_prefix('\n').unwrap_or(inner);
    let close = inner.find("```")?;
    Some(inner[..close].trim())
}

/// A JSON value valid against `schema` (most of JSON Schema's keywords: types, `enum`,
/// `const`, string and array length bounds, `prefixItems`, numeric bounds, `anyOf` /
/// `oneOf` / `allOf` (the first), local `$ref`s), texts made of the prompt's words: what a
/// structured answer looks like, for `--dry-run`'s simulated run. `pattern` and `format` are
/// not followed (the words are letters, which the bracket-free patterns of the shipped
/// schemas accept).
pub fn schema_instance<R: Rng>(schema: &serde_json::Value, prompt: &str, rng: &mut R) -> serde_json::Value {
    let words = content_words(prompt);
    instance(schema, schema, &words, rng, 0, None)
}

/// `item`: the index of the array item this value is in (or under): an `enum` there takes
/// its values in turn (a dialogue's `speaker` alternates), elsewhere one at random.
fn instance<R: Rng>(
    s: &serde_json::Value,
    root: &serde_json::Value,
    words: &[String],
    rng: &mut R,
    depth: usize,
    item: Option<usize>,
) -> serde_json::Value {
    use serde_json::Value;
    if depth > 32 {
        return Value::Null;
    }
    let Some(o) = s.as_object() else { return Value::Null };
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let target = r.strip_prefix('#').and_then(|p| root.pointer(p)).unwrap_or(&Value::Null);
        return instance(target, root, words, rng, depth + 1, item);
    }
    if let Some(c) = o.get("const") {
        return c.clone();
    }
    if let Some(e) = o.get("enum").and_then(Value::as_array).filter(|e| !e.is_empty()) {
        let i = item.unwrap_or_else(|| rng.random_range(0..e.len()));
        return e[i % e.len()].clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = o.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
            return instance(first, root, words, rng, depth + 1, item);
        }
    }
    let ty = match o.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null"),
        _ if o.contains_key("properties") => "object",
        _ if o.contains_key("items") || o.contains_key("prefixItems") => "array",
        _ => "string",
    };
    let num = |k: &str| o.get(k).and_then(Value::as_f64);
    match ty {
        "object" => {
            let mut out = serde_json::Map::new();
            if let Some(props) = o.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    out.insert(k.clone(), instance(v, root, words, rng, depth + 1, item));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = num("minItems").unwrap_or(0.0) as usize;
            let max = num("maxItems").map(|m| m as usize).unwrap_or(usize::MAX);
            let n = min.max(2.min(max)).min(max);
            let prefix = o.get("prefixItems").and_then(Value::as_array).cloned().unwrap_or_default();
            let items = o.get("items").cloned().unwrap_or(Value::Bool(true));
            (0..n)
                .map(|i| instance(prefix.get(i).unwrap_or(&items), root, words, rng, depth + 1, Some(i)))
                .collect::<Vec<_>>()
                .into()
        }
        "integer" | "number" => {
            let lo = num("minimum").or(num("exclusiveMinimum").map(|m| m + 1.0)).unwrap_or(1.0);
            let hi = num("maximum").or(num("exclusiveMaximum").map(|m| m - 1.0)).unwrap_or(lo.max(5.0));
            let v = if hi > lo { lo + ((hi - lo) * rng.random::<f64>()).floor() } else { lo };
            if ty == "integer" { Value::from(v as i64) } else { Value::from(v) }
        }
        "boolean" => Value::Bool(rng.random_bool(0.5)),
        "null" => Value::Null,
        _ => {
            let min = num("minLength").unwrap_or(0.0) as usize;
            let max = num("maxLength").map(|m| m as usize).unwrap_or(usize::MAX);
            // About a sentence, or the length the schema asks for.
            let goal = min.max(60.min(max));
            // (No colon: a dialogue's parser reads `Name:` as a speaker.)
            let mut text = paragraph(words, rng, 1).replace(':', ",");
            while text.chars().count() < goal {
                text.push(' ');
                text.push_str(&paragraph(words, rng, 1).replace(':', ","));
            }
            let mut cut: String = text.chars().take(max.max(goal)).collect();
            if cut.chars().count() > max {
                cut = cut.chars().take(max).collect();
            }
            Value::String(cut.trim_end().to_string())
        }
    }
}

fn json_object<R: Rng>(prompt: &str, fields: &str, rng: &mut R) -> String {
    let mut obj = serde_json::Map::new();
    for f in fields.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        obj.insert(f.to_string(), serde_json::Value::String(paragraph_of(prompt, rng, 1)));
    }
    if obj.is_empty() {
        obj.insert("text".into(), serde_json::Value::String(paragraph_of(prompt, rng, 1)));
    }
    serde_json::Value::Object(obj).to_string()
}

/// One user message expecting `expect`: what the tests of offline shapes ask, here and in
/// the methods' crates (so not `cfg(test)`, which is per crate).
pub fn request(expect: &str, prompt: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![super::Message::new(super::Role::User, prompt)],
        params: Default::default(),
        sample: 0,
        expect: expect.into(),
        structured: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_instance_is_valid_against_its_schema() {
        let schema = serde_json::json!({
            "type": "object",
            "$defs": {"turn": {"type": "object", "properties": {
                "speaker": {"enum": ["role"]},
                "content": {"type": "string", "minLength": 40, "maxLength": 200}}, "required": ["speaker", "content"]}},
            "properties": {
                "turns": {"type": "array", "minItems": 4, "maxItems": 6, "items": {"$ref": "#/$defs/turn"}},
                "score": {"type": "integer", "minimum": 1, "maximum": 5},
                "short": {"type": "string", "maxLength": 10},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
                "flag": {"type": ["boolean", "null"]}
            },
            "required": ["turns", "score", "short", "tags", "flag"],
            "additionalProperties": false
        });
        let validator = jsonschema::validator_for(&schema).unwrap();
        let prompt = "Write a dialogue between a lighthouse keeper and a sailor about storms, ropes and lanterns.";
        for seed in 0..20u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let v = schema_instance(&schema, prompt, &mut rng);
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{v}: {errors:?}");
        }
    }

    fn req(expect: &str, prompt: &str) -> ChatRequest {
        request(expect, prompt)
    }

    #[test]
    fn deterministic_and_shaped() {
        let o = Offline { seed: 1, score_one: 0.5, shapes: SHAPES.into() };
        let sc = o.generate(&req("score", "... Score:"), &Default::default());
        assert!(sc == "Score: 0" || sc == "Score: 1");
        assert_eq!(sc, o.generate(&req("score", "... Score:"), &Default::default()));
        let j: serde_json::Value =
            serde_json::from_str(&o.generate(&req("json:title,summary", "x"), &Default::default())).unwrap();
        assert!(j["title"].is_string() && j["summary"].is_string());
        let n = o.generate(&req("number:2,3", "judge"), &Default::default());
        assert!(n == "2" || n == "3", "{n}");
        // A shape nobody registered gets a paragraph built from the prompt's words.
        let p = o.generate(&req("profile", "gardening tomatoes"), &Default::default());
        assert!(p.contains("matters here because of"), "{p}");
    }

    #[test]
    fn score_one_is_honoured() {
        let o = Offline { seed: 1, score_one: 1.0, shapes: SHAPES.into() };
        for i in 0..20 {
            assert_eq!(o.generate(&req("score", &format!("q{i}")), &Default::default()), "Score: 1");
        }
    }
}
