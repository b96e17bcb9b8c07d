//! RoleMRC as a sharded run: the offline pipeline with the local executor and 1, 3 or
//! 7 shards writes the bytes of the unsharded run; and against the project's loopback
//! OpenAI-compatible server (`--profile demo`), shard processes killed with SIGKILL
//! ten times at random moments, then the same command again, end with identical
//! outputs and without a request repeated after it was answered and journaled.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::openai_server::{self, Behaviour};
use support::{Project, assert_same_outputs, repo, statuses};

fn pipeline() -> String {
    repo().join("pipelines/rolemrc.toml").to_string_lossy().to_string()
}

#[test]
fn offline_rolemrc_with_1_3_7_shards_writes_the_unsharded_bytes() {
    let p = Project::new();
    let reference = p.path().join("reference");
    p.synth(&["run", &pipeline(), "--offline", "--out", reference.to_str().unwrap(), "-q"]).ok();
    for n in ["1", "3", "7"] {
        let out = p.path().join(format!("shards-{n}"));
        p.synth(&[
            "run",
            &pipeline(),
            "--offline",
            "--out",
            out.to_str().unwrap(),
            "--shards",
            n,
            "--executor",
            "local",
            "-q",
        ])
        .ok();
        assert_same_outputs(&reference, &out);
        assert_eq!(
            support::output_files(&out).len(),
            32,
            "every output of the pipeline (with the near-duplicate stages and a failures table)"
        );
        assert!(statuses(&out).values().all(|s| s == "ran"));
    }
}

/// The demo model: the offline generator behind an HTTP server (as the e2e test).
fn responder(body: &Value) -> String {
    let (messages, expect) = super::demo_request(body);
    super::demo_answer(messages, expect.unwrap_or("stylized"))
}

const KEY: &str = "sk-shard-kill-5e1f0c2b9a";
const IDENTITY: &str = "providers.gpt4o.cache_identity=\"openai:demo-model\"";
/// The server plays a model without structured outputs, and the provider says so: no
/// refused first asks, which a restarted process would send again (unpaid, but counted here).
const TEXT: &str = "providers.gpt4o.structured_output=\"none\"";

fn server(latency_ms: u64) -> openai_server::Server {
    openai_server::start(Behaviour {
        api_key: Some(KEY.into()),
        models: vec!["demo-model".into()],
        latency: Duration::from_millis(latency_ms),
        responder: std::sync::Arc::new(responder),
        // It plays the model in the text protocol: a server without structured outputs.
        refuse_structured: true,
        ..Default::default()
    })
}

fn env(server: &openai_server::Server) -> Vec<(&'static str, String)> {
    vec![("OPENAI_BASE_URL", server.base_url()), ("OPENAI_API_KEY", KEY.into()), ("SYNTH_MODEL", "demo-model".into())]
}

/// Processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        // A zombie has ended already: killing it does nothing.
        if state != "Z" && fields.next().and_then(|x| x.parse::<u32>().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// The last user message of every answer the shards hold (their caches and the
/// responses their journals kept): what counts as answered.
fn answered(out: &Path) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    let last_user = |request: &str| -> Option<String> {
        let v: Value = serde_json::from_str(request).ok()?;
        v["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?["content"].as_str().map(str::to_string)
    };
    let mut stack = vec![out.join("_synth")];
    while let Some(d) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else { continue };
        for e in read.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "cache.sqlite") {
                let Ok(conn) = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                else {
                    continue;
                };
                let Ok(mut stmt) = conn.prepare("SELECT request FROM responses") else { continue };
                let rows: Vec<String> =
                    stmt.query_map([], |r| r.get::<_, String>(0)).unwrap().filter_map(|r| r.ok()).collect();
                set.extend(rows.iter().filter_map(|r| last_user(r)));
            } else if path.file_name().is_some_and(|n| n == "journal.log") {
                for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                    if let Some(json) = line.strip_prefix("R\t")
                        && let Ok(v) = serde_json::from_str::<Value>(json)
                        && let Some(u) = v["request"].as_str().and_then(last_user)
                    {
                        set.insert(u);
                    }
                }
            }
        }
    }
    set
}

/// Forget what the server received (its counts start again at zero).
fn reset(server: &openai_server::Server) {
    let c = &server.counters;
    c.log.lock().unwrap().clear();
    c.by_body.lock().unwrap().clear();
    c.ok_by_body.lock().unwrap().clear();
    c.repeated_after_ok.store(0, Ordering::SeqCst);
    c.ok.store(0, Ordering::SeqCst);
}

/// Requests the server received per last user message.
fn sent(server: &openai_server::Server) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (_, msg) in server.counters.log.lock().unwrap().iter() {
        *out.entry(msg.clone()).or_default() += 1;
    }
    out
}

#[test]
fn ten_sigkills_of_shard_processes_then_reruns_give_the_same_bytes_and_pay_nothing_twice() {
    let p = Project::new();
    // The reference, against a server of its own (same answers, separate counts).
    let first = server(0);
    let reference = p.path().join("reference");
    let e = env(&first);
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The same model behind another URL: `cache_identity` stands for the URL in keys and
    // fingerprints, so both runs have the same fingerprints (and footers, card).
    p.synth_env(
        &[
            "run",
            &pipeline(),
            "--profile",
            "demo",
            "--set",
            IDENTITY,
            "--set",
            TEXT,
            "--out",
            reference.to_str().unwrap(),
            "-q",
        ],
        &e,
    )
    .ok();
    drop(first);

    let server = server(15);
    let out = p.path().join("sharded");
    let e = env(&server);
    let command = |log: &str| {
        let mut cmd = std::process::Command::new(support::synth_bin());
        cmd.args([
            "run",
            &pipeline(),
            "--profile",
            "demo",
            "--set",
            IDENTITY,
            "--set",
            TEXT,
            "--out",
            out.to_str().unwrap(),
        ])
        .args(["--shards", "3", "--executor", "local"])
        .current_dir(p.path())
        .env("CI", "1")
        .env_remove("SYNTH_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(p.path().join(log)).unwrap());
        for (k, v) in &e {
            cmd.env(k, v);
        }
        cmd
    };
    // A seeded choice of moments (reproducible, different shards and points).
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut kills = 0;
    let mut runs = 0;
    let deadline = Instant::now() + Duration::from_secs(400);
    let mut completed_at_kills: Vec<(BTreeSet<String>, BTreeMap<String, usize>)> = Vec::new();
    while kills < 10 {
        assert!(Instant::now() < deadline, "10 kills did not happen in time ({kills} so far, {runs} runs)");
        runs += 1;
        let mut coordinator = command(&format!("run-{runs}.log")).spawn().unwrap();
        // Wait for shard processes, then kill one of them after a random delay.
        let mut killed = false;
        while coordinator.try_wait().unwrap().is_none() {
            let shards = children(coordinator.id());
            if !shards.is_empty() {
                std::thread::sleep(Duration::from_millis(next() % 400));
                let shards = children(coordinator.id());
                if let Some(&victim) = shards.get((next() % shards.len().max(1) as u64) as usize) {
                    // SAFETY: a process of this test's own tree.
                    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
                    killed = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = coordinator.wait().unwrap();
        if killed && !status.success() {
            kills += 1;
            let log = p.read(&format!("run-{runs}.log"));
            assert!(log.contains("killed by signal 9") || log.contains("did not finish"), "{log}");
            completed_at_kills.push((answered(&out), sent(&server)));
        } else if status.success() {
            // The run completed before a kill landed (or the victim was ending anyway):
            // start over on a fresh state, with fresh counts and no kills (a fresh state
            // asks everything again: not a request repeated after its success).
            std::fs::remove_dir_all(&out).unwrap();
            reset(&server);
            completed_at_kills.clear();
            kills = 0;
        } else {
            panic!("run {runs} failed without a kill:\n{}", p.read(&format!("run-{runs}.log")));
        }
    }
    // Then the same command until it completes.
    let finish = command("final.log").status().unwrap();
    assert!(finish.success(), "{}", p.read("final.log"));
    assert_same_outputs(&reference, &out);
    // Nothing answered and journaled before a kill was sent again afterwards.
    let after = sent(&server);
    for (k, (done, before)) in completed_at_kills.iter().enumerate() {
        for msg in done {
            assert_eq!(
                after.get(msg),
                before.get(msg),
                "kill {k}: a request answered before the kill was sent again: {}",
                msg.chars().take(80).collect::<String>()
            );
        }
    }
    // Sent twice at most: what was on the wire at a kill (and never answered to us).
    let twice: usize = after.values().filter(|n| **n > 1).count();
    assert!(twice <= 10 * 64, "{twice} requests were sent more than once");
    let repeated = server.counters.repeated_after_ok.load(Ordering::SeqCst);
    eprintln!(
        "{kills} kills over {runs} runs; {} requests served; {repeated} repeated after a 200 (answers in transit at a kill); {twice} sent more than once",
        server.counters.ok.load(Ordering::SeqCst)
    );
}
