//! Provider batch APIs against the loopback fake batch server: a stage with
//! `batch = true` writes the same outputs as the online run of the same prompts with the
//! same scripted answers; partly expired, failed and cancelled batches, results out of
//! order and lines with errors lose nothing and pay nothing twice; a run killed during
//! an upload, after a create, while polling or during a download resumes and answers
//! every request once (the server counts); waves stay under the enqueued-token limit;
//! the cost is the batch price and `max_cost_usd` stops submitting before the cap;
//! `--detach`, Ctrl-C, `synth batch status`; Anthropic Message Batches; a local
//! `vllm run-batch`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::batch_server::{self, Behaviour, Fate};
use support::openai_server;
use support::{Project, assert_same_outputs, parquet_rows};

const KEY: &str = "sk-batch-SECRET-0123456789abcdef";

/// Answers: a record whose number ends in 3 first answers "x" (too short for the parser,
/// so it is asked again); everything else "answer to: <prompt start>".
fn responder(body: &serde_json::Value) -> String {
    let users = body["messages"].as_array().map(|m| m.iter().filter(|m| m["role"] == "user").count()).unwrap_or(1);
    let last = openai_server::last_user(body);
    if users == 1 && last.starts_with("Record ") && last.split(':').next().unwrap_or_default().ends_with('3') {
        return "x".into();
    }
    openai_server::default_answer(body)
}

fn records(n: usize) -> String {
    (0..n).map(|i| format!("{{\"name\": \"item {i}\", \"topic\": \"topic {}\"}}\n", i % 7)).collect()
}

/// records → answers (llm, 2 samples, re-asks) → export, against `url`.
fn project(n: usize, provider: &str, stage_extra: &str) -> Project {
    let p = Project::new();
    p.write("records.jsonl", records(n));
    p.write("prompt.j2", "Record {{ id }}: write one sentence about {{ name }} and {{ topic }}.\n");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "batch-test"
output_dir = "out"

[providers.api]
{provider}

[stages.records]
kind = "source"
path = "records.jsonl"

[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "api"
prompt = "prompt.j2"
n = 2
parser_options = {{ min_chars = 5 }}
{stage_extra}

[stages.export]
kind = "jsonl"
inputs = ["answers"]
"#
        ),
    );
    p
}

/// An `openai` provider at `url`. The reference and the batch runs use two servers
/// standing for one model: `cache_identity` makes their keys and fingerprints the same.
fn openai_provider(url: &str, extra: &str) -> String {
    format!(
        "kind = \"openai\"\nbase_url = \"{url}\"\nmodel = \"test-model\"\napi_key_env = \"SYNTH_TEST_KEY\"\ncache_identity = \"test:test-model\"\nmax_retries = 3\nbackoff_initial_ms = 10\nbatch_poll_seconds = 0.05\n{extra}"
    )
}

fn run(p: &Project, out: &str, args: &[&str]) -> support::Run {
    let mut all = vec!["run", "p.toml", "--out", out];
    all.extend_from_slice(args);
    p.synth_env(&all, &[("SYNTH_TEST_KEY", KEY)])
}

/// The online reference: the same pipeline against the online server, same answers.
fn reference(n: usize, stage_extra: &str) -> (Project, openai_server::Server) {
    let online = openai_server::start(openai_server::Behaviour { responder: Arc::new(responder), ..Default::default() });
    let p = project(n, &openai_provider(&online.base_url(), ""), stage_extra);
    run(&p, "out", &[]).ok();
    (p, online)
}

fn batch_behaviour() -> Behaviour {
    Behaviour { responder: Arc::new(responder), api_key: Some(KEY.into()), ..Default::default() }
}

/// Every request the server answered was answered once; `n` of them.
fn assert_answered_once(server: &batch_server::Server, n: usize) {
    let (distinct, most) = server.counters.answered_once();
    assert_eq!(distinct, n, "requests answered");
    assert_eq!(most, 1, "a request was answered (paid) twice");
}

/// Requests of `n` records: 2 samples each, plus a re-ask per sample of records ending in 3.
fn requests_of(n: usize) -> usize {
    2 * n + 2 * (0..n).filter(|i| i % 10 == 3).count()
}

#[test]
fn batch_outputs_equal_online_outputs() {
    let n = 60;
    let (reference, online) = reference(n, "");
    assert_eq!(online.counters.ok.load(Ordering::SeqCst) as usize, requests_of(n));
    let server = batch_server::start(batch_behaviour());
    let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "");
    let out = run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, requests_of(n));
    assert_eq!(server.counters.online.load(Ordering::SeqCst), 0, "nothing went online");
    // Two passes: first answers, then the re-asks; one batch each.
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 2, "{}", out.stderr);
    let m = support::manifest(&p.path().join("out"));
    let r = &m["stages"]["answers"]["report"];
    assert_eq!(r["info"]["mode"], "batch");
    assert_eq!(r["metrics"]["batch.answered"].as_f64(), Some(requests_of(n) as f64));
    assert_eq!(r["cache_hits"].as_u64(), Some(0), "batch answers are not cache hits: {r}");
    // A second run is up to date; with --force everything comes from the cache.
    let again = run(&p, "out", &["--force"]).ok();
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 2, "{}", again.stderr);
    // The key is in no artifact.
    for (name, bytes) in support::output_files(&p.path().join("out")) {
        assert!(!String::from_utf8_lossy(&bytes).contains(KEY), "the key leaked into {name}");
    }
    for f in ["_synth/batches.log", "manifest.json"] {
        assert!(!p.read(&format!("out/{f}")).contains(KEY), "the key leaked into {f}");
    }
}
