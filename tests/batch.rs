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
    let online =
        openai_server::start(openai_server::Behaviour { responder: Arc::new(responder), ..Default::default() });
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

/// Rows of the stage's output keyed by id.
fn rows_by_id(
    path: &std::path::Path,
) -> std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>> {
    parquet_rows(path).into_iter().map(|r| (r["id"].as_str().unwrap().to_string(), r)).collect()
}

#[test]
fn expired_failed_and_errored_lines_lose_nothing_and_pay_nothing_twice() {
    let n = 40;
    let (reference, _online) = reference(n, "");
    // Batches of at most 30 lines: the first expires for 30% of its lines, the second
    // fails as a whole; answers come out of order; "item 7" is rejected (400) and
    // "item 5" fails with a 500 the first time.
    let server = batch_server::start(Behaviour {
        fate: Arc::new(|i| match i {
            0 => Fate::Expire(0.3),
            1 => Fate::Fail("server_error".into(), "the batch could not be processed".into()),
            _ => Fate::Complete,
        }),
        reject_marker: Some("item 7 ".into()),
        flaky_marker: Some("item 5 ".into()),
        ..batch_behaviour()
    });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true\nbatch_max_requests = 30"), "");
    let out = run(&p, "out", &[]).ok();
    let dir = p.path().join("out");
    // The rejected record failed, with the provider's reason; both its samples were asked once.
    let failures = support::failures(&dir, "answers");
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["id"], "records-7");
    assert!(failures[0]["message"].as_str().unwrap().contains("HTTP 400"), "{failures:?}");
    assert!(out.stderr.contains("1 record(s) failed"), "{}", out.stderr);
    // Every other record has the answers the online run got.
    let want = rows_by_id(&reference.path().join("out/answers.parquet"));
    let got = rows_by_id(&dir.join("answers.parquet"));
    assert_eq!(got.len(), want.len() - 2);
    for (id, row) in &got {
        assert_eq!(row, &want[id], "{id}");
    }
    // Paid once each: expired, failed and 500 lines were asked again, answered lines never.
    assert_answered_once(&server, requests_of(n) - 2);
    let processed = server.counters.processed.lock().unwrap().clone();
    assert!(processed.values().all(|n| *n <= 2), "{processed:?}");
    // First answers in batches of 30, 30, 20; then the failed batch's 30 lines and the
    // first batch's 9 expired and 2 flaky lines again (a part per batch); then the re-asks.
    let mut sizes = server.counters.batch_sizes.lock().unwrap().clone();
    assert_eq!(&sizes[..3], &[30, 30, 20], "{sizes:?}");
    sizes.sort();
    assert_eq!(sizes, [8, 11, 20, 30, 30, 30]);
    // Resubmitted: 9 expired, 30 of the failed batch, the 2 flaky lines.
    let m = support::manifest(&dir);
    let r = &m["stages"]["answers"]["report"]["metrics"];
    assert_eq!(r["batch.resubmitted"].as_f64(), Some(41.0), "{r}");
    assert_eq!(r["batch.rejected"].as_f64(), Some(2.0), "{r}");
    // `synth batch status` lists every batch, done.
    let status = p.synth(&["batch", "status", "out"]).ok();
    assert!(status.stdout.lines().filter(|l| l.contains(" done ")).count() >= 6, "{}", status.stdout);
    assert!(!status.stdout.contains("not yet collected"), "{}", status.stdout);
}

#[test]
fn batch_fallback_online_sends_unanswered_lines_online() {
    let n = 10;
    let (reference, _online) = reference(n, "");
    let server = batch_server::start(Behaviour {
        fate: Arc::new(|i| if i == 0 { Fate::Expire(0.5) } else { Fate::Complete }),
        ..batch_behaviour()
    });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "batch_fallback = \"online\"");
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    // The first batch held the 20 first answers; its 10 expired lines went online.
    assert_eq!(server.counters.online.load(Ordering::SeqCst), 10);
    assert_answered_once(&server, requests_of(n) - 10);
    let m = support::manifest(&p.path().join("out"));
    assert_eq!(m["stages"]["answers"]["report"]["metrics"]["batch.online_fallback"].as_f64(), Some(10.0));
}

fn spawn(p: &Project, out: &str, extra: &[&str]) -> std::process::Child {
    std::process::Command::new(support::synth_bin())
        .args(["run", "p.toml", "--out", out])
        .args(extra)
        .current_dir(p.path())
        .env("SYNTH_TEST_KEY", KEY)
        .env("CI", "1")
        .env_remove("SYNTH_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(p.path().join(format!("{out}.log"))).unwrap())
        .spawn()
        .expect("spawn synth")
}

/// Wait (at most a minute) until `ready`, then SIGKILL the child; it must not have ended.
fn kill_when(p: &Project, out: &str, child: &mut std::process::Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ready() && std::time::Instant::now() < deadline {
        assert!(child.try_wait().unwrap().is_none(), "{what}: synth ended first:\n{}", p.read(&format!("{out}.log")));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(ready(), "{what}: never reached:\n{}", p.read(&format!("{out}.log")));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "{what}: synth ended before the kill");
}

#[test]
fn sigkill_during_upload_create_polling_or_download_then_resume_pays_each_request_once() {
    let n = 30;
    let (reference, _online) = reference(n, "");
    type Ready = fn(&batch_server::Counters) -> bool;
    let scenarios: [(&str, Behaviour, Ready); 4] = [
        ("during the upload", Behaviour { upload_delay: Duration::from_secs(2), ..batch_behaviour() }, |c| {
            c.uploads_received.load(Ordering::SeqCst) >= 1
        }),
        ("after the create", Behaviour { create_delay: Duration::from_secs(2), ..batch_behaviour() }, |c| {
            c.creates.load(Ordering::SeqCst) >= 1
        }),
        ("while polling", Behaviour { processing: Duration::from_millis(1500), ..batch_behaviour() }, |c| {
            c.retrieves.load(Ordering::SeqCst) >= 2
        }),
        ("during the download", Behaviour { content_delay: Duration::from_secs(2), ..batch_behaviour() }, |c| {
            c.contents_requested.load(Ordering::SeqCst) >= 1
        }),
    ];
    for (what, behaviour, ready) in scenarios {
        let server = batch_server::start(behaviour);
        let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "");
        let mut child = spawn(&p, "out", &[]);
        let c = server.counters.clone();
        kill_when(&p, "out", &mut child, what, || ready(&c));
        let resumed = run(&p, "out", &[]).ok();
        assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
        assert_answered_once(&server, requests_of(n));
        // One batch for the first answers, one for the re-asks: none created twice, and
        // the killed upload was found by its name rather than sent again.
        assert_eq!(c.creates.load(Ordering::SeqCst), 2, "{what}: batches created\n{}", resumed.stderr);
        assert_eq!(c.uploads_received.load(Ordering::SeqCst), 2, "{what}: files uploaded\n{}", resumed.stderr);
        if what == "after the create" {
            assert!(resumed.stderr.contains("created before the restart"), "{}", resumed.stderr);
            assert!(c.lists.load(Ordering::SeqCst) >= 1);
        }
    }
}

#[test]
fn detach_then_collect_and_ctrl_c_leaves_batches_running() {
    let n = 12;
    let (reference, _online) = reference(n, "");
    let server = batch_server::start(Behaviour { processing: Duration::from_millis(1500), ..batch_behaviour() });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "");
    // --detach: exit 0 once the batch is submitted; what depends on the stage waits.
    let out = run(&p, "out", &["--detach"]).ok();
    assert!(out.stderr.contains("run the same command again to collect"), "{}", out.stderr);
    assert!(out.stdout.contains("waiting"), "{}", out.stdout);
    let dir = p.path().join("out");
    assert_eq!(support::manifest(&dir)["status"], "detached");
    assert_eq!(support::statuses(&dir)["answers"], "waiting");
    assert!(!dir.join("answers.parquet").exists());
    let status = p.synth(&["batch", "status", "out"]).ok();
    assert!(status.stdout.contains("batch_0001") || status.stdout.contains("batch_0"), "{}", status.stdout);
    assert!(status.stdout.contains("not yet collected"), "{}", status.stdout);
    let json = p.synth(&["batch", "status", "out", "--json", "--refresh"]).ok();
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(v["batches"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["orphans"].as_array().unwrap().len(), 0, "{v}");
    // The next run collects it (and the re-asks), creating nothing twice.
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &dir);
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 2);
    assert_answered_once(&server, requests_of(n));

    // Ctrl-C while polling: exit 130, the batch keeps running, the next run collects it.
    let server = batch_server::start(Behaviour { processing: Duration::from_millis(1500), ..batch_behaviour() });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "");
    let mut child = spawn(&p, "out", &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.counters.retrieves.load(Ordering::SeqCst) < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    let log = p.read("out.log");
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("keep running at the provider") && log.contains("run the same command again"), "{log}");
    assert_eq!(server.counters.cancels.load(Ordering::SeqCst), 0, "Ctrl-C cancelled a batch");
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 2);
    assert_answered_once(&server, requests_of(n));
}

/// `synth batch cancel`: the batch is cancelled at the provider and the journal says so;
/// the next run collects what the cancelled batch answered (paid: never asked again) and
/// asks the rest in a new batch.
#[test]
fn batch_cancel_cancels_at_the_provider_and_a_later_run_pays_nothing_twice() {
    let n = 20;
    let (reference, _online) = reference(n, "");
    let server = batch_server::start(Behaviour {
        fate: Arc::new(|i| if i == 0 { Fate::Hold } else { Fate::Complete }),
        ..batch_behaviour()
    });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true"), "");
    run(&p, "out", &["--detach"]).ok();
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 1);
    let cancel = p.synth_env(&["batch", "cancel", "out"], &[("SYNTH_TEST_KEY", KEY)]).ok();
    assert_eq!(server.counters.cancels.load(Ordering::SeqCst), 1, "{}", cancel.stdout);
    assert!(cancel.stdout.contains("1 batch(es) cancelled"), "{}", cancel.stdout);
    assert!(cancel.stdout.contains("cancelled") || cancel.stdout.contains("cancelling"), "{}", cancel.stdout);
    let log = p.read("out/_synth/batches.log");
    let last_status = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|r| r["status"].is_string())
        .unwrap_or_else(|| panic!("no status record in the journal:\n{log}"));
    assert!(last_status["status"].as_str().unwrap().starts_with("cancel"), "{last_status}");
    assert!(!log.contains(KEY), "the key leaked into the journal");
    let status = p.synth(&["batch", "status", "out"]).ok();
    assert!(status.stdout.contains("cancel"), "{}", status.stdout);
    // The next run: the first half of the 40 first answers was answered before the
    // cancel and is collected; the other 20 lines go in a new batch; then the re-asks.
    let resumed = run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, requests_of(n));
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 3, "{}", resumed.stderr);
    let sizes = server.counters.batch_sizes.lock().unwrap().clone();
    assert_eq!(&sizes[..2], &[40, 20], "{sizes:?}");
    let m = support::manifest(&p.path().join("out"));
    let r = &m["stages"]["answers"]["report"]["metrics"];
    assert_eq!(r["batch.resubmitted"].as_f64(), Some(20.0), "{r}");
    // Nothing is left to cancel.
    let again = p.synth_env(&["batch", "cancel", "out"], &[("SYNTH_TEST_KEY", KEY)]).ok();
    assert!(again.stdout.contains("0 batch(es) cancelled"), "{}", again.stdout);
    assert_eq!(server.counters.cancels.load(Ordering::SeqCst), 1);
}

#[test]
fn waves_stay_under_the_enqueued_token_limit() {
    let n = 40;
    let (reference, _online) = reference(n, "");
    // Each prompt is ~16 tokens: 80 first answers are ~1,300 tokens; the limit takes ~25.
    let limit = 400;
    let server = batch_server::start(Behaviour { enqueued_limit: Some(limit), ..batch_behaviour() });
    let extra = format!("batch = true\nbatch_enqueued_tokens = {limit}");
    let p = project(n, &openai_provider(&server.base_url(), &extra), "");
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, requests_of(n));
    let c = &server.counters;
    assert!(c.enqueued_max.load(Ordering::SeqCst) <= limit, "{}", c.enqueued_max.load(Ordering::SeqCst));
    let sizes = c.batch_sizes.lock().unwrap().clone();
    assert!(sizes.len() >= 4, "several waves: {sizes:?}");
    // Without the client-side limit the server refuses batches past its limit; they are
    // submitted again once the ones ahead end, and still answered once.
    let server = batch_server::start(Behaviour { enqueued_limit: Some(limit), ..batch_behaviour() });
    let p = project(n, &openai_provider(&server.base_url(), "batch = true\nbatch_max_requests = 20"), "");
    let out = run(&p, "out", &[]).ok();
    assert!(out.stderr.contains("token_limit_exceeded"), "{}", out.stderr);
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, requests_of(n));
}

#[test]
fn batch_price_in_the_manifest_and_stats_and_max_cost_usd_stops_before_the_cap() {
    let n = 30;
    // $1 per token either way, so every figure is a token count.
    let price = "price_input_per_mtok = 1000000\nprice_output_per_mtok = 1000000";
    let online =
        openai_server::start(openai_server::Behaviour { responder: Arc::new(responder), ..Default::default() });
    let reference = project(n, &openai_provider(&online.base_url(), price), "max_tokens = 32");
    run(&reference, "out", &[]).ok();
    let online_cost = support::manifest(&reference.path().join("out"))["totals"]["cost_usd"].as_f64().unwrap();
    assert!(online_cost > 100.0, "{online_cost}");

    let server = batch_server::start(batch_behaviour());
    let p = project(n, &openai_provider(&server.base_url(), &format!("batch = true\n{price}")), "max_tokens = 32");
    run(&p, "out", &[]).ok();
    let m = support::manifest(&p.path().join("out"));
    let cost = m["totals"]["cost_usd"].as_f64().unwrap();
    assert!((cost - online_cost / 2.0).abs() < 1e-6 * online_cost, "batch {cost} vs online {online_cost}");
    let r = &m["stages"]["answers"]["report"]["metrics"];
    assert!((r["batch.online_cost_usd"].as_f64().unwrap() - online_cost).abs() < 1e-6 * online_cost, "{r}");
    let stats = p.synth(&["stats", "out"]).ok();
    assert!(stats.stdout.contains("batch: stage \"answers\"") && stats.stdout.contains("(x0.5)"), "{}", stats.stdout);

    // A cap: a part of 10 lines may cost up to 10 x (~74 prompt bytes + 8 + 32) x 0.5 =
    // ~$570 (its answers cost ~$180); $800 lets one run at a time, and after two have
    // run a third could pass it, so nothing more is submitted.
    let server = batch_server::start(batch_behaviour());
    let provider = openai_provider(&server.base_url(), &format!("batch = true\nbatch_max_requests = 10\n{price}"));
    let p = project(n, &provider, "max_tokens = 32\nmax_cost_usd = 800");
    let out = run(&p, "out", &[]).code(2);
    assert!(out.stderr.contains("max_cost_usd of stage \"answers\" ($800.0000) would be passed"), "{}", out.stderr);
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 2, "{}", out.stderr);
    let paid: f64 = cache_costs(&p.path().join("out"));
    assert!(paid <= 800.0 && paid > 250.0, "{paid}");
    // Raised, the run goes on and pays nothing twice.
    let p2 = p.read("p.toml").replace("max_cost_usd = 800", "max_cost_usd = 100000");
    p.write("p.toml", p2);
    run(&p, "out", &[]).ok();
    assert_answered_once(&server, requests_of(n));

    // Online, the run's cap ([pipeline] max_cost_usd) stops sending too.
    let online =
        openai_server::start(openai_server::Behaviour { responder: Arc::new(responder), ..Default::default() });
    let p =
        project(n, &openai_provider(&online.base_url(), &format!("{price}\nmax_concurrency = 2")), "max_tokens = 32");
    let toml = p.read("p.toml").replace("output_dir = \"out\"", "output_dir = \"out\"\nmax_cost_usd = 500");
    p.write("p.toml", toml);
    let out = run(&p, "out", &[]).code(2);
    assert!(out.stderr.contains("max_cost_usd of the run ($500.0000) would be passed"), "{}", out.stderr);
    let paid = cache_costs(&p.path().join("out"));
    assert!(paid <= 500.0, "{paid}");
    assert!((online.counters.ok.load(Ordering::SeqCst) as usize) < requests_of(n));
}

/// What the responses in an output directory's cache cost.
fn cache_costs(out: &std::path::Path) -> f64 {
    let conn = rusqlite::Connection::open(out.join("_synth/cache.sqlite")).unwrap();
    conn.query_row("SELECT COALESCE(SUM(cost_usd), 0) FROM responses", [], |r| r.get(0)).unwrap()
}

fn anthropic_provider(url: &str, extra: &str) -> String {
    format!(
        "kind = \"anthropic\"\nbase_url = \"{url}\"\nmodel = \"claude-test\"\napi_key_env = \"SYNTH_TEST_KEY\"\nmax_retries = 3\nbackoff_initial_ms = 10\nbatch_poll_seconds = 0.05\n{extra}"
    )
}

#[test]
fn anthropic_message_batches_equal_the_messages_api_and_survive_a_lost_create() {
    let n = 20;
    let server = batch_server::start(Behaviour { create_delay: Duration::from_millis(1500), ..batch_behaviour() });
    let reference = project(n, &anthropic_provider(&server.anthropic_url(), ""), "");
    run(&reference, "out", &[]).ok();
    assert_eq!(server.counters.online.load(Ordering::SeqCst) as usize, requests_of(n));
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 0);
    let p = project(n, &anthropic_provider(&server.anthropic_url(), "batch = true"), "");
    // Killed while the create's answer is on its way: the batch exists, its id is not
    // journaled; the next run finds it (no metadata here: by its request count and time).
    let mut child = spawn(&p, "out", &[]);
    let c = server.counters.clone();
    kill_when(&p, "out", &mut child, "after the create", || c.creates.load(Ordering::SeqCst) >= 1);
    let resumed = run(&p, "out", &[]).ok();
    assert!(resumed.stderr.contains("created before the restart"), "{}", resumed.stderr);
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_eq!(c.creates.load(Ordering::SeqCst), 2, "{}", resumed.stderr);
    assert_answered_once(&server, requests_of(n));
    assert_eq!(c.online.load(Ordering::SeqCst) as usize, requests_of(n), "nothing more went online");
}

/// A stand-in for `vllm run-batch -i IN -o OUT --model M`: OpenAI batch lines in, result
/// lines out, the answers `responder` gives (same text and usage).
const FAKE_VLLM: &str = r#"
import json, sys
inp, out = sys.argv[1], sys.argv[2]
with open(inp) as f, open(out, "w") as o:
    for line in f:
        req = json.loads(line)
        body = req["body"]
        msgs = body["messages"]
        users = [m for m in msgs if m["role"] == "user"]
        last = users[-1]["content"]
        if len(users) == 1 and last.startswith("Record ") and last.split(":")[0].endswith("3"):
            text = "x"
        else:
            text = "answer to: " + last[:60]
        pt = sum(len(m["content"].encode()) // 4 + 1 for m in msgs)
        ct = len(text.encode()) // 4 + 1
        answer = {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}}
        o.write(json.dumps({"id": "vllm-" + req["custom_id"][:8], "custom_id": req["custom_id"],
                            "response": {"status_code": 200, "request_id": "r", "body": answer}, "error": None}) + "\n")
"#;

#[test]
fn vllm_run_batch_files_answered_by_a_command_or_by_hand() {
    let n = 12;
    let (reference, _online) = reference(n, "");
    // The command runs each batch file.
    let extra = "batch = true\nbatch_api = \"vllm\"\nbatch_command = [\"python3\", \"fake_vllm.py\", \"{input}\", \"{output}\", \"{model}\"]";
    let p = project(n, &openai_provider("http://127.0.0.1:9/v1", extra), "");
    p.write("fake_vllm.py", FAKE_VLLM);
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    let m = support::manifest(&p.path().join("out"));
    assert_eq!(m["stages"]["answers"]["report"]["info"]["batch_api"], "vllm");

    // Without a command synth writes the file, says what to run and stops; the next run
    // reads the output.
    let p = project(n, &openai_provider("http://127.0.0.1:9/v1", "batch = true\nbatch_api = \"vllm\""), "");
    p.write("fake_vllm.py", FAKE_VLLM);
    for round in 0..2 {
        let out = run(&p, "out", &[]).ok();
        let command = out
            .stderr
            .lines()
            .find(|l| l.trim_start().starts_with("vllm run-batch -i "))
            .unwrap_or_else(|| panic!("round {round}: no command to run:\n{}", out.stderr));
        let args: Vec<&str> = command.split_whitespace().collect();
        assert_eq!((args[2], args[4], args[6], args[7]), ("-i", "-o", "--model", "test-model"), "{command}");
        let status = std::process::Command::new("python3")
            .args(["fake_vllm.py", args[3], args[5]])
            .current_dir(p.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
}

#[test]
fn loglik_in_batch_mode_equals_online() {
    let records: String =
        (0..8).map(|i| format!("{{\"context\": \"Question {i}: which letter?\\nAnswer:\"}}\n")).collect();
    let pipeline = |provider: String| {
        let p = Project::new();
        p.write("q.jsonl", &records);
        p.write(
            "p.toml",
            format!(
                "[pipeline]\nname = \"ll\"\noutput_dir = \"out\"\n\n[providers.api]\n{provider}\n\n[stages.q]\nkind = \"source\"\npath = \"q.jsonl\"\n\n[stages.ll]\nkind = \"loglik\"\ninputs = [\"q\"]\nprovider = \"api\"\ncontext = \"context\"\nchoices = [\"A\", \"B\", \"C\"]\n"
            ),
        );
        p
    };
    let online = openai_server::start(openai_server::Behaviour::default());
    let reference = pipeline(openai_provider(&online.base_url(), ""));
    run(&reference, "out", &[]).ok();
    let server = batch_server::start(batch_behaviour());
    let p = pipeline(openai_provider(&server.base_url(), "batch = true"));
    run(&p, "out", &[]).ok();
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, 24);
    assert_eq!(server.counters.creates.load(Ordering::SeqCst), 1, "every choice in one pass");
}

/// A structured stage's requests carry their schema in a batch line as online (the same
/// body), and the batch outputs equal the online outputs.
#[test]
fn batch_lines_carry_the_schema() {
    use std::sync::atomic::AtomicUsize;
    let with_schema = Arc::new(AtomicUsize::new(0));
    let seen = with_schema.clone();
    let structured = Arc::new(move |body: &serde_json::Value| {
        let rf = &body["response_format"];
        if rf["type"] == "json_schema" && rf["json_schema"]["schema"]["required"][0] == "text" {
            seen.fetch_add(1, Ordering::SeqCst);
            serde_json::json!({"text": responder(body)}).to_string()
        } else {
            responder(body)
        }
    });
    let schema = r#"{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}"#;
    let n = 20;
    let online = openai_server::start(openai_server::Behaviour { responder: structured.clone(), ..Default::default() });
    let reference =
        project(n, &openai_provider(&online.base_url(), "structured_output = \"openai\""), "schema = \"s.json\"");
    reference.write("s.json", schema);
    run(&reference, "out", &[]).ok();
    let online_structured = with_schema.load(Ordering::SeqCst);
    assert_eq!(online_structured, requests_of(n), "every online request was structured");
    let server =
        batch_server::start(Behaviour { responder: structured, api_key: Some(KEY.into()), ..Default::default() });
    let p = project(
        n,
        &openai_provider(&server.base_url(), "batch = true\nstructured_output = \"openai\""),
        "schema = \"s.json\"",
    );
    p.write("s.json", schema);
    run(&p, "out", &[]).ok();
    assert_eq!(
        with_schema.load(Ordering::SeqCst) - online_structured,
        requests_of(n),
        "every batch line was structured"
    );
    assert_same_outputs(&reference.path().join("out"), &p.path().join("out"));
    assert_answered_once(&server, requests_of(n));
}
