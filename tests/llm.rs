//! The provider layer against the project's loopback OpenAI-compatible server:
//! faults never lose a record, a 401 or an unknown model stops the run with one
//! message, a 429 storm slows the client down (honouring Retry-After) without losing
//! items, a SIGKILLed run resumes without re-sending completed requests, requests
//! left unchanged by a config change come from the cache, the circuit breaker
//! gives up instead of burning retries, and the API key appears in no artifact.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::openai_server::{self, Behaviour, Server};
use support::{Project, manifest, parquet_rows, statuses};

const KEY: &str = "sk-test-SECRET-0123456789abcdef";

fn records(n: usize) -> String {
    (0..n).map(|i| format!("{{\"name\": \"item {i}\", \"topic\": \"topic {}\"}}\n", i % 7)).collect()
}

/// A pipeline: records → llm (text) → jsonl, against `server`. `provider_extra`
/// lines override the provider defaults below.
fn project(server: &Server, n: usize, provider_extra: &str, stage_extra: &str) -> Project {
    let defaults = [
        "timeout_seconds = 0.5",
        "backoff_initial_ms = 10",
        "backoff_max_seconds = 0.2",
        "max_retries = 30",
        "max_concurrency = 8",
    ];
    let overridden = |line: &str| {
        let key = line.split('=').next().unwrap().trim();
        provider_extra.lines().any(|l| l.split('=').next().unwrap().trim() == key)
    };
    let provider_defaults: Vec<&str> = defaults.into_iter().filter(|l| !overridden(l)).collect();
    let provider_defaults = provider_defaults.join("\n");
    let p = Project::new();
    p.write("records.jsonl", records(n));
    p.write("prompt.j2", "Record {{ id }}: write one sentence about {{ name }} and {{ topic }}.\n");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "llm-test"
output_dir = "out"

[providers.api]
kind = "openai"
base_url = "{url}"
model = "test-model"
api_key_env = "SYNTH_TEST_KEY"
{provider_defaults}
{provider_extra}

[stages.records]
kind = "source"
path = "records.jsonl"

[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "api"
prompt = "prompt.j2"
{stage_extra}

[stages.export]
kind = "jsonl"
inputs = ["answers"]
"#,
            url = server.base_url()
        ),
    );
    p
}

fn run(p: &Project, args: &[&str]) -> support::Run {
    let mut all = vec!["run", "p.toml"];
    all.extend_from_slice(args);
    p.synth_env(&all, &[("SYNTH_TEST_KEY", KEY)])
}

/// Requests the server received per record id (from the prompt text).
fn requests_per_record(server: &Server) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (_, msg) in server.counters.log.lock().unwrap().iter() {
        let id = msg.trim_start_matches("Record ").split(':').next().unwrap_or_default().to_string();
        *out.entry(id).or_default() += 1;
    }
    out
}

#[test]
fn injected_faults_lose_no_record() {
    let server = openai_server::start(Behaviour {
        p_500: 0.10,
        p_hang: 0.05,
        hang: Duration::from_secs(2),
        p_malformed: 0.05,
        api_key: Some(KEY.into()),
        seed: 11,
        ..Default::default()
    });
    let p = project(&server, 200, "", "");
    run(&p, &[]).ok();
    let rows = parquet_rows(&p.path().join("out/answers.parquet"));
    assert_eq!(rows.len(), 200, "every record completes");
    assert!(!p.path().join("out/answers.failures.parquet").exists());
    // Each answer belongs to its own record.
    for r in &rows {
        let id = r["id"].as_str().unwrap();
        assert!(r["text"].as_str().unwrap().starts_with(&format!("answer to: Record {id}:")), "{r:?}");
        assert_eq!(r["model"], "test-model");
        assert!(r["tokens_in"].as_i64().unwrap() > 0);
    }
    let c = &server.counters;
    assert!(c.s500.load(Ordering::SeqCst) > 5, "faults were injected");
    assert!(c.hangs.load(Ordering::SeqCst) > 2);
    assert!(c.malformed.load(Ordering::SeqCst) > 2);
    let m = manifest(&p.path().join("out"));
    let report = &m["stages"]["answers"]["report"];
    assert_eq!(report["rows_out"], 200);
    assert!(report["requests"].as_u64().unwrap() > 200, "retries counted: {report}");
    assert_eq!(report["info"]["model"], "test-model");
    assert_eq!(
        report["tokens_out"].as_u64().unwrap(),
        rows.iter().map(|r| r["tokens_out"].as_u64().unwrap()).sum::<u64>()
    );
}

#[test]
fn every_record_ends_done_or_failed_with_a_reason() {
    let server = openai_server::start(Behaviour { reject_marker: Some("item 3".into()), ..Default::default() });
    let p = project(&server, 40, "", "max_failure_ratio = 0.5");
    run(&p, &[]).ok();
    let done = parquet_rows(&p.path().join("out/answers.parquet"));
    let failed = parquet_rows(&p.path().join("out/answers.failures.parquet"));
    // "item 3", "item 30".."item 39": 11 records are rejected with 400.
    assert_eq!(failed.len(), 11);
    assert_eq!(done.len() + failed.len(), 40);
    for f in &failed {
        assert_eq!(f["kind"], "llm");
        assert!(f["message"].as_str().unwrap().contains("HTTP 400"), "{f:?}");
        assert!(f["record"].as_str().unwrap().contains("item 3"), "the input record is kept: {f:?}");
    }
    // A 400 is never retried.
    let per = requests_per_record(&server);
    for f in &failed {
        assert_eq!(per[f["id"].as_str().unwrap()], 1, "rejected request retried");
    }
}

#[test]
fn unauthorized_stops_the_run_with_one_message_and_no_key_leaks() {
    let server = openai_server::start(Behaviour { api_key: Some("the-right-key-000000".into()), ..Default::default() });
    let p = project(&server, 100, "", "");
    let out = run(&p, &[]).code(2);
    assert_eq!(out.stderr.matches("HTTP 401").count(), 2, "one log line and one final error:\n{}", out.stderr);
    assert!(out.stderr.contains("stage \"answers\""), "{}", out.stderr);
    assert!(!out.stderr.contains(KEY), "the key leaked into the error:\n{}", out.stderr);
    assert!(out.stderr.contains("***"), "the echoed key is shown redacted:\n{}", out.stderr);
    assert!(server.counters.total.load(Ordering::SeqCst) <= 16, "stopped at once, not per record");
    assert!(!p.path().join("out/answers.failures.parquet").exists(), "no per-record failures");
    assert_eq!(manifest(&p.path().join("out"))["stages"]["answers"]["status"], "failed");
}

#[test]
fn an_unknown_model_stops_the_run() {
    let server = openai_server::start(Behaviour { models: vec!["real-model".into()], ..Default::default() });
    let p = project(&server, 50, "", "");
    let out = run(&p, &[]).code(2);
    assert!(out.stderr.contains("HTTP 404") && out.stderr.contains("test-model"), "{}", out.stderr);
    assert!(out.stderr.contains("not_found"), "{}", out.stderr);
    assert!(server.counters.total.load(Ordering::SeqCst) <= 16);
}

/// A wrong base URL: the server answers 404 without a JSON error body. That is not a
/// malformed answer to retry: the run stops at once with the status and a hint.
#[test]
fn a_wrong_base_url_stops_the_run_without_retries() {
    let server = openai_server::start(Behaviour::default());
    let p = project(&server, 50, "max_concurrency = 2\ninitial_concurrency = 2", "");
    let toml = p.read("p.toml").replace(&server.base_url(), &format!("{}/v1", server.base_url()));
    p.write("p.toml", toml);
    let out = run(&p, &[]).code(2);
    assert!(out.stderr.contains("HTTP 404") && out.stderr.contains("base URL"), "{}", out.stderr);
    let sent = server.counters.unrouted.load(Ordering::SeqCst);
    assert!((1..=4).contains(&sent), "{sent} requests: a 404 was retried");
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 0);
}

#[test]
fn a_429_storm_slows_the_client_down_without_losing_items() {
    // 300 requests per minute (5 per second) against a client allowed 8 at once.
    let server = openai_server::start(Behaviour { rpm: Some(300), ..Default::default() });
    let p = project(&server, 30, "", "");
    run(&p, &[]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/answers.parquet")).len(), 30);
    let c = &server.counters;
    assert!(c.s429.load(Ordering::SeqCst) > 0, "the server pushed back");
    assert_eq!(c.ok.load(Ordering::SeqCst), 30, "each record answered exactly once");
    // The client honoured the waits: 30 answers at 5/s take at least ~5 s after the burst of 5.
    let log = c.log.lock().unwrap();
    let span = log.last().unwrap().0 - log.first().unwrap().0;
    assert!(span >= Duration::from_secs(4), "{span:?}");
    let report = &manifest(&p.path().join("out"))["stages"]["answers"]["report"];
    assert!(report["requests"].as_u64().unwrap() > 30);
}

/// A server that counts requests per sliding 10 s window and refuses the first one
/// over its limit: the configured rate holds in every window, from the first request on
/// (a client that starts with a full bucket overruns the first window), and the client
/// still uses nearly all of it.
#[test]
fn the_configured_rate_holds_in_every_window_of_a_strict_server() {
    let window = Duration::from_secs(10);
    let server = openai_server::start(Behaviour { rpm: Some(6000), strict_window: Some(window), ..Default::default() });
    let n = 1100;
    let p = project(&server, n, "requests_per_minute = 6000\nmax_concurrency = 16\ninitial_concurrency = 16", "");
    run(&p, &[]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/answers.parquet")).len(), n);
    let c = &server.counters;
    assert_eq!(c.s429.load(Ordering::SeqCst), 0, "the client went over 1,000 requests in some 10 s window");
    assert_eq!(c.ok.load(Ordering::SeqCst), n as u64);
    let log = c.log.lock().unwrap();
    let span = (log.last().unwrap().0 - log.first().unwrap().0).as_secs_f64();
    let report = &manifest(&p.path().join("out"))["stages"]["answers"]["report"];
    let filled = c.max_in_window.load(Ordering::SeqCst);
    assert!(filled >= 980, "the window was not filled: {filled} (all {n} in {span:.2} s); {report}");
    // 1,100 requests at 100/s: about 11 s, not much more.
    assert!((10.9..13.0).contains(&span), "{n} requests took {span:.2} s at 100/s; {report}");
}

#[test]
fn limits_the_server_advertises_pace_the_client() {
    // 1,200 requests per minute (20/s, burst 20), advertised on every answer; no limit
    // configured. The same run with learning off is the control: it floods the server.
    let run_with = |learn: bool| {
        let server = openai_server::start(Behaviour {
            rpm: Some(1200),
            advertise_limits: true,
            latency: Duration::from_millis(20),
            ..Default::default()
        });
        let extra = format!("max_concurrency = 16\ninitial_concurrency = 16\nlearn_limits = {learn}");
        let p = project(&server, 100, &extra, "");
        run(&p, &[]).ok();
        assert_eq!(parquet_rows(&p.path().join("out/answers.parquet")).len(), 100);
        assert_eq!(server.counters.ok.load(Ordering::SeqCst), 100, "each record answered once");
        let report = manifest(&p.path().join("out"))["stages"]["answers"]["report"].clone();
        (server.counters.s429.load(Ordering::SeqCst), report)
    };
    let (learned_429, report) = run_with(true);
    let info = &report["info"];
    assert_eq!(info["advertised_requests_per_minute"], "1200", "{report}");
    assert_eq!(info["requests_per_minute"], "1182", "paced at 98.5% of the advertised limit: {report}");
    let (blind_429, _) = run_with(false);
    // Before the first answer, up to 16 requests leave at once into a burst of 20.
    assert!(learned_429 <= 2, "{learned_429} answers were 429 with the advertised limits learned");
    assert!(blind_429 > 10 * learned_429.max(1), "control run: {blind_429} 429s vs {learned_429}");
}

#[test]
fn retry_after_is_honoured() {
    let server = openai_server::start(Behaviour { p_429: 0.3, retry_after_secs: 1, seed: 3, ..Default::default() });
    let p = project(&server, 12, "max_concurrency = 1", "");
    run(&p, &[]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/answers.parquet")).len(), 12);
    assert!(server.counters.s429.load(Ordering::SeqCst) > 0);
    // With one request at a time, a retried record's next request comes >= 1 s later.
    let log = server.counters.log.lock().unwrap();
    let mut last: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut checked = 0;
    for (t, msg) in log.iter() {
        if let Some(prev) = last.insert(msg.as_str(), *t) {
            assert!(*t - prev >= Duration::from_millis(950), "retried after {:?}", *t - prev);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn the_circuit_breaker_gives_up_instead_of_burning_retries() {
    let server = openai_server::start(Behaviour { p_500: 1.0, ..Default::default() });
    let p = project(
        &server,
        40,
        "breaker_after_seconds = 0.3\nbreaker_pause_seconds = 0.2\nbreaker_max_trips = 1\nmax_retries = 1000",
        "",
    );
    let out = run(&p, &[]).code(2);
    assert!(out.stderr.contains("kept failing"), "{}", out.stderr);
    let sent = server.counters.total.load(Ordering::SeqCst);
    assert!(sent < 1000, "{sent} requests: retries were burnt");
}

#[test]
fn sigkill_then_rerun_sends_no_completed_request_twice() {
    let server = openai_server::start(Behaviour {
        latency: Duration::from_millis(60),
        api_key: Some(KEY.into()),
        ..Default::default()
    });
    let p = project(&server, 300, "max_concurrency = 4\ninitial_concurrency = 4", "");
    let mut child = std::process::Command::new(support::synth_bin())
        .args(["run", "p.toml", "-q"])
        .current_dir(p.path())
        .env("SYNTH_TEST_KEY", KEY)
        .env("CI", "1")
        .stderr(std::fs::File::create(p.path().join("child.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.counters.ok.load(Ordering::SeqCst) < 80 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "the run ended before the kill ({status}):\n{}", p.read("child.log"));
    let before = requests_per_record(&server);

    // What the cache holds now is what completed.
    let conn = rusqlite::Connection::open(p.path().join("out/_synth/cache.sqlite")).unwrap();
    let mut stmt = conn.prepare("SELECT request FROM responses").unwrap();
    let completed: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|r| {
            let req: serde_json::Value = serde_json::from_str(&r.unwrap()).unwrap();
            let msg = req["messages"][0]["content"].as_str().unwrap().to_string();
            msg.trim_start_matches("Record ").split(':').next().unwrap().to_string()
        })
        .collect();
    drop(stmt);
    drop(conn);
    // 80 were answered at the kill; the cache commits in windows, so on a busy machine (the
    // whole suite on two cores) fewer are on disk (59 once): enough to test that none is sent again.
    assert!(completed.len() >= 40, "{} completed before the kill", completed.len());

    let out = run(&p, &[]).ok();
    assert!(out.stderr.is_empty() || !out.stderr.contains("error"), "{}", out.stderr);
    let after = requests_per_record(&server);
    for id in &completed {
        assert_eq!(after[id], before[id], "record {id} was completed before the kill but sent again");
    }
    assert_eq!(parquet_rows(&p.path().join("out/answers.parquet")).len(), 300);
    // Every record was sent at least once, and only in-flight ones were sent twice.
    let resent = after.iter().filter(|(id, n)| **n > 1 && !completed.contains(id)).count();
    assert!(resent <= 8, "{resent} records were sent twice; at most the ones in flight at the kill");
    // The restart says how many were on the wire (at most max_concurrency = 4: those may be
    // billed twice) apart from those only queued; only the former were sent twice.
    let on_wire = match out.stderr.split_once(" request(s) had been sent and were not answered") {
        Some((head, _)) => head.rsplit(' ').next().unwrap().parse::<usize>().unwrap(),
        None => 0,
    };
    assert!(on_wire <= 4, "{}", out.stderr);
    assert!(resent <= on_wire, "{resent} records sent twice, but the restart counted {on_wire} on the wire");
}

#[test]
fn a_cache_identity_keeps_answers_when_the_url_changes() {
    // The same model behind another URL (a proxy, another region): with `cache_identity`
    // nothing is paid again; without it (the safe default) everything is.
    let (a, b) = (openai_server::start(Behaviour::default()), openai_server::start(Behaviour::default()));
    let p = project(&a, 20, "cache_identity = \"openai:test-model\"", "");
    run(&p, &[]).ok();
    assert_eq!(a.counters.ok.load(Ordering::SeqCst), 20);
    p.write("p.toml", p.read("p.toml").replace(&a.base_url(), &b.base_url()));
    let again = run(&p, &[]).ok();
    assert_eq!(b.counters.total.load(Ordering::SeqCst), 0, "answers came from the cache");
    assert!(again.stdout.contains("everything is up to date"), "{}", again.stdout);
    // Without it, a new URL is a new endpoint.
    p.write("p.toml", p.read("p.toml").replace("cache_identity = \"openai:test-model\"", ""));
    run(&p, &[]).ok();
    assert_eq!(b.counters.ok.load(Ordering::SeqCst), 20);
}

#[test]
fn unchanged_requests_come_from_the_cache_after_a_config_change() {
    let server = openai_server::start(Behaviour::default());
    let p = project(&server, 25, "", "");
    run(&p, &[]).ok();
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 25);

    // A change that does not touch requests: the stage re-runs, the server sees nothing.
    run(&p, &["--set", "stages.answers.output_prefix=a_"]).ok();
    assert_eq!(statuses(&p.path().join("out"))["answers"], "ran");
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 25);
    let rows = parquet_rows(&p.path().join("out/answers.parquet"));
    assert!(rows[0].contains_key("a_text"));
    let report = &manifest(&p.path().join("out"))["stages"]["answers"]["report"];
    assert_eq!(report["cache_hits"], 25);
    assert_eq!(report["requests"], 0);

    // A runtime-only option does not even re-run the stage.
    run(&p, &["--set", "stages.answers.output_prefix=a_", "--set", "providers.api.max_concurrency=3"]).ok();
    assert_eq!(statuses(&p.path().join("out"))["answers"], "up_to_date");

    // A generation parameter changes every request.
    run(&p, &["--set", "providers.api.temperature=0.5"]).ok();
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 50);
}

#[test]
fn samples_reasks_and_accounting() {
    // Answers are JSON only when the conversation already holds a re-ask.
    let responder = Arc::new(|body: &serde_json::Value| {
        let n = body["messages"].as_array().map(|m| m.len()).unwrap_or(0);
        if n >= 3 { "{\"title\": \"fixed\"}".to_string() } else { "not json at all".to_string() }
    });
    let server = openai_server::start(Behaviour { responder, ..Default::default() });
    let p = project(&server, 5, "", "parser = \"json\"\nparser_options = { fields = { title = \"utf8\" } }\nn = 2");
    p.write("p.toml", p.read("p.toml").replace("model = \"test-model\"", "model = \"gpt-4o\""));
    run(&p, &[]).ok();
    let rows = parquet_rows(&p.path().join("out/answers.parquet"));
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().any(|r| r["id"] == "records-0/0") && rows.iter().any(|r| r["id"] == "records-0/1"));
    for r in &rows {
        assert_eq!(r["title"], "fixed");
        assert_eq!(r["attempts"], 2);
    }
    // 5 records x 2 samples x 2 attempts.
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 20);
    let m = manifest(&p.path().join("out"));
    let cost = m["stages"]["answers"]["report"]["cost_usd"].as_f64().unwrap();
    assert!(cost > 0.0, "gpt-4o has a default price");
    assert!((m["totals"]["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-12);
    let stats = p.synth(&["stats", "out"]).ok();
    assert!(stats.stdout.lines().any(|l| l.starts_with("answers") && l.contains(" 20 ")), "{}", stats.stdout);
}

#[test]
fn the_api_key_is_in_no_artifact() {
    let server = openai_server::start(Behaviour {
        api_key: Some(KEY.into()),
        reject_marker: Some("item 2".into()),
        ..Default::default()
    });
    let p = project(&server, 30, "", "max_failure_ratio = 0.5");
    let out = p.synth_env(&["run", "p.toml", "-vv"], &[("SYNTH_TEST_KEY", KEY)]).ok();
    let export = p.synth(&["cache", "export", "out", "--out", "out/cache.parquet"]).ok();
    let stats = p.synth(&["cache", "stats", "out"]).ok();
    for text in [&out.stdout, &out.stderr, &export.stdout, &stats.stdout] {
        assert!(!text.contains(KEY), "the key is in the output");
    }
    let mut checked = 0;
    let mut stack = vec![p.path().join("out")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
                continue;
            }
            let bytes = std::fs::read(e.path()).unwrap();
            let found = bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes());
            assert!(!found, "the key is in {}", e.path().display());
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} files checked");
}

#[test]
fn cache_stats_gc_and_export() {
    let server = openai_server::start(Behaviour::default());
    let p = project(&server, 10, "", "");
    run(&p, &[]).ok();
    run(&p, &["--force"]).ok();
    let s = p.synth(&["cache", "stats", "out", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    assert_eq!(v["responses"], 10);
    assert_eq!(v["lookups"], 20);
    assert_eq!(v["hits"], 10);
    assert_eq!(v["by_model"][0]["model"], "test-model");
    assert_eq!(v["in_flight"], 0);

    let e = p.synth(&["cache", "export", "out", "--out", "cache.parquet"]).ok();
    assert!(e.stdout.contains("exported 10 response(s)"));
    let rows = parquet_rows(&p.path().join("cache.parquet"));
    assert_eq!(rows.len(), 10);
    assert!(rows[0]["text"].as_str().unwrap().starts_with("answer to: Record"));

    // Change the prompt: old entries are no longer used by any current stage.
    p.write("prompt.j2", "Record {{ id }}: now something else about {{ name }}.\n");
    run(&p, &[]).ok();
    let dry = p.synth(&["cache", "gc", "p.toml", "--dry-run"]).ok();
    assert!(dry.stdout.contains("would remove 10 response(s)"), "{}", dry.stdout);
    let gc = p.synth(&["cache", "gc", "p.toml"]).ok();
    assert!(gc.stdout.contains("removed 10 response(s)"), "{}", gc.stdout);
    let s = p.synth(&["cache", "stats", "out", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    assert_eq!(v["responses"], 10);
    // And the current stage still runs from the cache.
    let before = server.counters.total.load(Ordering::SeqCst);
    run(&p, &["--force"]).ok();
    assert_eq!(server.counters.total.load(Ordering::SeqCst), before);
}

#[test]
fn embeddings_are_cached_and_normalised() {
    let server = openai_server::start(Behaviour { embedding_dim: 8, ..Default::default() });
    let p = Project::new();
    p.write("records.jsonl", records(20));
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
output_dir = "out"

[embedders.remote]
kind = "openai"
base_url = "{}"
model = "embed-model"
api_key_env = "SYNTH_TEST_KEY"
dim = 8
batch_size = 6

[embedders.local]
kind = "hashing"
dim = 32

[stages.records]
kind = "source"
path = "records.jsonl"

[stages.remote_vectors]
kind = "embed"
inputs = ["records"]
embedder = "remote"
template = "{{{{ name }}}} about {{{{ topic }}}}"

[stages.local_vectors]
kind = "embed"
inputs = ["remote_vectors"]
embedder = "local"
column = "name"
output = "hashed"

[stages.out]
kind = "parquet"
inputs = ["local_vectors"]
"#,
            server.base_url()
        ),
    );
    run(&p, &[]).ok();
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 4, "20 texts in batches of 6");
    let rows = parquet_rows(&p.path().join("out/local_vectors.parquet"));
    assert_eq!(rows.len(), 20);
    for r in &rows {
        for col in ["embedding", "hashed"] {
            let v: Vec<f64> = r[col].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{col} not normalised: {norm}");
        }
        assert_eq!(r["embedding"].as_array().unwrap().len(), 8);
        assert_eq!(r["hashed"].as_array().unwrap().len(), 32);
    }
    run(&p, &["--force"]).ok();
    assert_eq!(server.counters.total.load(Ordering::SeqCst), 4, "vectors come from the cache");
    let m = manifest(&p.path().join("out"));
    assert_eq!(m["stages"]["remote_vectors"]["report"]["cache_hits"], 20);
    // Hashing vectors are computed again (on every core), never cached: the same vectors.
    assert_eq!(m["stages"]["local_vectors"]["report"]["cache_hits"], 0);
    assert_eq!(parquet_rows(&p.path().join("out/local_vectors.parquet")), rows);

    // With a cache_identity, the same model behind another URL costs nothing more: set it
    // (one re-run, vectors now cached under the identity), then move the URL.
    let other = openai_server::start(Behaviour { embedding_dim: 8, ..Default::default() });
    let with_identity = p.read("p.toml").replace("dim = 8\n", "dim = 8\ncache_identity = \"tei:embed-model\"\n");
    p.write("p.toml", &with_identity);
    run(&p, &[]).ok();
    let before = server.counters.total.load(Ordering::SeqCst);
    p.write("p.toml", with_identity.replace(&server.base_url(), &other.base_url()));
    let again = run(&p, &[]).ok();
    assert_eq!(other.counters.total.load(Ordering::SeqCst), 0, "nothing sent to the new URL");
    assert!(again.stdout.contains("everything is up to date"), "{}", again.stdout);
    assert_eq!(server.counters.total.load(Ordering::SeqCst), before);
}

/// `synth bench llm` goes through the provider layer (every request reaches the server
/// once, the key is sent) and `--baseline` sends the same requests with a bare client;
/// both print one JSON line with their counts.
#[test]
fn bench_llm_and_its_baseline_send_every_request_once() {
    let server = openai_server::start(Behaviour { api_key: Some(KEY.into()), ..Default::default() });
    let p = Project::new();
    let base = server.base_url();
    let bench = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["bench", "llm", "--base-url", &base, "--model", "m", "--requests", "40"];
        args.extend_from_slice(&["--rpm", "6000", "--concurrency", "4", "--api-key-env", "SYNTH_TEST_KEY"]);
        args.extend_from_slice(extra);
        let out = p.synth_env(&args, &[("SYNTH_TEST_KEY", KEY)]).ok();
        let line = out.stdout.lines().last().unwrap_or_default().to_string();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let layer = bench(&[]);
    assert_eq!(
        (layer["bench"].as_str(), layer["ok"].as_u64(), layer["failed"].as_u64()),
        (Some("llm"), Some(40), Some(0))
    );
    assert_eq!(server.counters.ok.load(Ordering::SeqCst), 40);
    assert!(layer["cpu_ms_per_request"].as_f64().unwrap() > 0.0);
    let floor = bench(&["--baseline"]);
    assert_eq!((floor["bench"].as_str(), floor["ok"].as_u64()), (Some("llm-baseline"), Some(40)));
    assert_eq!(server.counters.ok.load(Ordering::SeqCst), 80);
    // Each run's 40 prompts are distinct.
    assert_eq!(server.counters.ok_by_body.lock().unwrap().len(), 80);
}
