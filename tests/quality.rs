//! Every record vouched for: crafted records fail the check made for them (`check` stage,
//! `tests/fixtures/quality/`); an `llm` stage re-asks with a check's reason, then drops the
//! record to the failures with the check's name, and a changed check re-runs the stage from
//! the cache without paying again; `dedup` keeps the same records for any thread count; a
//! person's review drops a sample from the splits and a spare takes its place with the
//! stages above reported up to date; a bad review line stops the run with file:line and
//! loses nothing.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::support::{self, Project, failures, manifest, parquet_rows, statuses};

fn fixture(name: &str) -> std::path::PathBuf {
    support::repo().join("tests/fixtures/quality").join(name)
}

#[test]
fn crafted_records_fail_the_check_made_for_them() {
    let p = Project::new();
    for f in ["crafted.toml", "crafted.jsonl"] {
        p.write(f, std::fs::read(fixture(f)).unwrap());
    }
    p.synth(&["run", "crafted.toml"]).ok();
    let out = p.path().join("outputs/crafted");
    let records = parquet_rows(&out.join("records.parquet"));
    let kept: Vec<String> =
        parquet_rows(&out.join("checked.parquet")).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    let failed = failures(&out, "checked");
    assert!(records.len() >= 12, "{}", records.len());
    for r in &records {
        let id = r["id"].as_str().unwrap();
        let expect = r["expect"].as_str().unwrap();
        let failure = failed.iter().find(|f| f["id"] == id);
        if expect.is_empty() {
            assert!(kept.iter().any(|k| k == id), "{id} should pass: {failure:?}");
            continue;
        }
        let f = failure.unwrap_or_else(|| panic!("{id} should fail `{expect}`"));
        assert_eq!(f["kind"], "check", "{id}: {f:?}");
        assert_eq!(f["check"], expect, "{id}: {}", f["message"]);
        assert!(f["message"].as_str().unwrap().contains(&format!("check \"{expect}\"")), "{f:?}");
        // The record is in the failure table as it was: nothing lost.
        let record: Value = serde_json::from_str(f["record"].as_str().unwrap()).unwrap();
        assert_eq!(record["id"], id);
    }
    let m = manifest(&out);
    let q = &m["quality"]["stages"]["checked"]["checks"];
    assert_eq!(q["debris"]["dropped"], 4, "{q}");
    assert_eq!(q["language"]["dropped"], 2, "{q}");
    // `when`: the chat rules apply to the three records with turns only.
    assert_eq!(q["chat"]["checked"], 3, "{q}");
    assert_eq!(m["stages"]["checked"]["report"]["rows_failed"], failed.len());
}

#[test]
fn bad_check_options_are_config_errors_with_their_place() {
    let p = Project::new();
    p.write("in.jsonl", "{\"text\": \"hello there\"}\n");
    p.write(
        "p.toml",
        "[stages.in]\nkind = \"source\"\npath = \"in.jsonl\"\n\n[stages.c]\nkind = \"check\"\ninputs = [\"in\"]\n\n[stages.c.checks]\ndebris = { min_leters = 3 }\necho = {}\nlenght = {}\n",
    );
    let r = p.synth(&["validate", "p.toml"]).code(78);
    for want in ["p.toml:11:", "did you mean \"min_letters\"", "needs option \"of\"", "unknown check kind \"lenght\""] {
        assert!(r.stderr.contains(want), "{want} missing:\n{}", r.stderr);
    }
}

/// A loopback OpenAI-compatible server answering each chat body with `answer(body)`, recording bodies.
struct Scripted {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

type Answer = Arc<dyn Fn(&Value) -> String + Send + Sync>;
/// How long the server waits before answering a request (milliseconds).
type Delay = Arc<dyn Fn(&Value) -> u64 + Send + Sync>;

/// The server's state: the bodies it was sent, how it answers, how long it waits.
type Script = (Arc<Mutex<Vec<Value>>>, Answer, Delay);

async fn chat(State((bodies, answer, delay)): State<Script>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    bodies.lock().unwrap().push(body.clone());
    tokio::time::sleep(std::time::Duration::from_millis(delay(&body))).await;
    let text = answer(&body);
    let answer = json!({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
    (StatusCode::OK, [("content-type", "application/json")], answer.to_string()).into_response()
}

impl Scripted {
    fn start(answer: Answer) -> Scripted {
        Scripted::start_delayed(answer, Arc::new(|_: &Value| 0))
    }

    fn start_delayed(answer: Answer, delay: Delay) -> Scripted {
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let app = Router::new().route("/v1/chat/completions", post(chat)).with_state((bodies.clone(), answer, delay));
        let (url, stop) = support::serve_router(app);
        Scripted { url: format!("{url}/v1"), bodies, _stop: stop }
    }

    fn count(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }
}

fn last_user(body: &Value) -> String {
    body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "user").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_failed_check_reasks_with_its_reason_then_drops_and_a_changed_check_pays_nothing_again() {
    // `fixed`: debris first, words once re-asked; `broken`: debris every time; `fine`: words.
    let server = Scripted::start(Arc::new(|body: &Value| {
        let user = last_user(body);
        let reasked = user.contains("could not be used");
        let first = body["messages"][0]["content"].as_str().unwrap().to_string();
        if first.contains("broken") {
            "{{".into()
        } else if first.contains("fixed") && !reasked {
            "][".into()
        } else {
            format!("A proper answer in words about {}.", first.split_whitespace().last().unwrap_or("it"))
        }
    }));
    let p = Project::new();
    p.write(
        "in.jsonl",
        "{\"id\": \"a\", \"topic\": \"fixed\"}\n{\"id\": \"b\", \"topic\": \"broken\"}\n{\"id\": \"c\", \"topic\": \"fine\"}\n",
    );
    p.write("prompt.j2", "Say something about {{ topic }}");
    let pipeline = |extra: &str| {
        format!(
            "[pipeline]\nname = \"p\"\nmax_failure_ratio = 1.0\n\n[providers.m]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\napi_key_env = \"NO_KEY_NEEDED\"\n\n[stages.in]\nkind = \"source\"\npath = \"in.jsonl\"\n\n[stages.ask]\nkind = \"llm\"\ninputs = [\"in\"]\nprovider = \"m\"\nprompt = \"prompt.j2\"\nmax_attempts = 2\n\n[stages.ask.checks]\ndebris = {{ {extra} }}\n",
            server.url
        )
    };
    p.write("p.toml", pipeline(""));
    p.synth_env(&["run", "p.toml"], &[("NO_KEY_NEEDED", "k")]).ok();
    let out = p.path().join("outputs/p");
    let rows = parquet_rows(&out.join("ask.parquet"));
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(rows[0]["attempts"], 2);
    // The re-ask carried the check's reason.
    let bodies = server.bodies.lock().unwrap().clone();
    let reask = bodies.iter().map(last_user).find(|u| u.contains("could not be used")).expect("a re-ask");
    assert!(reask.contains("check \"debris\"") && reask.contains("\"][\""), "{reask}");
    let f = failures(&out, "ask");
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0]["id"].as_str(), f[0]["kind"].as_str(), f[0]["check"].as_str()),
        (Some("b"), Some("check"), Some("debris"))
    );
    assert_eq!(f[0]["raw"], "{{");
    assert_eq!(f[0]["attempts"].as_array().unwrap().len(), 2, "{f:?}");
    let m = manifest(&out);
    let c = &m["quality"]["stages"]["ask"]["checks"]["debris"];
    assert_eq!(
        (c["checked"].as_u64(), c["failed"].as_u64(), c["reasked"].as_u64(), c["dropped"].as_u64()),
        (Some(5), Some(3), Some(2), Some(1)),
        "{c}"
    );
    let paid = server.count();
    assert_eq!(paid, 5);

    // A changed check is a changed stage: it runs again, from the cache (nothing paid again).
    p.write("p.toml", pipeline("placeholders = [\"lorem ipsum\"]"));
    let r = p.synth_env(&["run", "p.toml", "--dry-run"], &[("NO_KEY_NEEDED", "k")]).ok();
    assert!(r.stdout.contains("configuration changed"), "{}", r.stdout);
    p.synth_env(&["run", "p.toml"], &[("NO_KEY_NEEDED", "k")]).ok();
    assert_eq!(server.count(), paid, "answers in the cache were asked again");
    let st = statuses(&out);
    assert_eq!((st["in"].as_str(), st["ask"].as_str()), ("up_to_date", "ran"));
    let m = manifest(&out);
    assert_eq!(m["stages"]["ask"]["report"]["cache_hits"], 5);

    // `action = "drop"`: the record goes at its first failure, without a re-ask.
    p.write("p.toml", pipeline("action = \"drop\""));
    p.synth_env(&["run", "p.toml"], &[("NO_KEY_NEEDED", "k")]).ok();
    let ids: Vec<String> =
        parquet_rows(&out.join("ask.parquet")).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, ["c"]);
    assert_eq!(server.count(), paid, "the first answers were all in the cache");
}

#[test]
fn a_reask_sends_every_rejected_answer_or_with_reask_history_last_only_the_last() {
    // Debris every time: "{{" to the first ask, "][" to every re-ask.
    let server = Scripted::start(Arc::new(|body: &Value| {
        if body["messages"].as_array().unwrap().len() == 1 { "{{".into() } else { "][".into() }
    }));
    let p = Project::new();
    p.write("in.jsonl", "{\"id\": \"a\", \"topic\": \"rain\"}\n");
    p.write("prompt.j2", "Say something about {{ topic }}");
    let run = |history: &str| {
        let option = if history.is_empty() { String::new() } else { format!("reask_history = \"{history}\"\n") };
        p.write(
            "p.toml",
            format!(
                "[pipeline]\nname = \"p\"\nmax_failure_ratio = 1.0\n\n[providers.m]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\napi_key_env = \"NO_KEY_NEEDED\"\n\n[stages.in]\nkind = \"source\"\npath = \"in.jsonl\"\n\n[stages.ask]\nkind = \"llm\"\ninputs = [\"in\"]\nprovider = \"m\"\nprompt = \"prompt.j2\"\nmax_attempts = 3\n{option}\n[stages.ask.checks]\ndebris = {{}}\n",
                server.url
            ),
        );
        let before = server.count();
        p.synth_env(&["run", "p.toml"], &[("NO_KEY_NEEDED", "k")]).ok();
        let bodies = server.bodies.lock().unwrap().clone();
        let asked = bodies.len() - before;
        let third = bodies.last().unwrap()["messages"].as_array().unwrap().clone();
        let roles: Vec<&str> = third.iter().map(|m| m["role"].as_str().unwrap()).collect();
        let assistant: Vec<&str> =
            third.iter().filter(|m| m["role"] == "assistant").map(|m| m["content"].as_str().unwrap()).collect();
        (asked, roles.join(" "), assistant.join(" | "))
    };
    // The default: every rejected answer and its reason.
    let (asked, roles, answers) = run("");
    assert_eq!(asked, 3);
    assert_eq!(roles, "user assistant user assistant user");
    assert_eq!(answers, "{{ | ][");
    // `last`: the first message, the last rejected answer and its reason. The first two asks
    // are the same requests as before (answered from the cache); the third is new.
    let (asked, roles, answers) = run("last");
    assert_eq!(asked, 1);
    assert_eq!(roles, "user assistant user");
    assert_eq!(answers, "][");
    assert_eq!(failures(&p.path().join("outputs/p"), "ask").len(), 1);
}

#[test]
fn candidates_are_drawn_at_once_and_the_lowest_passing_one_is_taken_whatever_order_they_end_in() {
    // The server answers by the request's seed (each candidate its own: seed + k) and by
    // whether it is a re-ask: `first` is a first ask, `again` a re-ask.
    let script = |first: [&'static str; 3], again: [&'static str; 3]| -> Answer {
        Arc::new(move |body: &Value| {
            let k = (body["seed"].as_i64().unwrap() - 7) as usize;
            let reask = body["messages"].as_array().unwrap().len() > 1;
            (if reask { again[k] } else { first[k] }).to_string()
        })
    };
    // Later candidates answer first: the order they end in must not matter.
    let delay: Delay = Arc::new(|body: &Value| 80 * (9 - body["seed"].as_i64().unwrap()) as u64);
    let good = "The rain falls softly on the quiet town tonight";
    let other = "Thunder rolls over the hills while the farmers wait";
    let p = Project::new();
    p.write("prompt.j2", "Say something about {{ topic }}");
    // (Each run its own topic: the cache would otherwise answer the second run's first asks.)
    let run = |server: &Scripted, out: &str| {
        p.write("in.jsonl", format!("{{\"id\": \"a\", \"topic\": \"{out}\"}}\n"));
        p.write(
            "p.toml",
            format!(
                "[pipeline]\nname = \"p\"\nmax_failure_ratio = 1.0\n\n[providers.m]\nkind = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\napi_key_env = \"NO_KEY_NEEDED\"\nseed = 7\n\n[stages.in]\nkind = \"source\"\npath = \"in.jsonl\"\n\n[stages.ask]\nkind = \"llm\"\ninputs = [\"in\"]\nprovider = \"m\"\nprompt = \"prompt.j2\"\nmax_attempts = 2\ncandidates = 3\n\n[stages.ask.checks]\ndebris = {{}}\n",
                server.url
            ),
        );
        p.synth_env(&["run", "p.toml", "--out", out], &[("NO_KEY_NEEDED", "k")]).ok();
        let dir = p.path().join(out);
        let rows = parquet_rows(&dir.join("ask.parquet"));
        (rows, manifest(&dir))
    };
    // Candidates 1 and 2 both pass: the lower one is taken, though 2 ended first.
    let server = Scripted::start_delayed(script(["{{", other, good], ["][", "][", "]["]), delay.clone());
    let (rows, m) = run(&server, "one");
    assert_eq!(server.count(), 3, "three candidates, one round");
    assert_eq!((rows[0]["raw"].as_str(), rows[0]["attempts"].as_i64()), (Some(other), Some(1)), "{rows:?}");
    let a = &m["quality"]["stages"]["ask"]["answers"];
    assert_eq!((a["first_attempt"].as_u64(), a["discarded_candidates"].as_u64()), (Some(1), Some(2)), "{a}");
    assert_eq!(m["quality"]["stages"]["ask"]["checks"]["debris"]["reasked"], 0);
    // None passes: candidate 0's answer is re-asked with its reason, three draws again;
    // candidate 1 of the re-ask passes.
    let server = Scripted::start_delayed(script(["{{", "][", "{{"], ["][", good, "]["]), delay);
    let (rows, m) = run(&server, "two");
    assert_eq!(server.count(), 6);
    assert_eq!((rows[0]["raw"].as_str(), rows[0]["attempts"].as_i64()), (Some(good), Some(2)), "{rows:?}");
    let bodies = server.bodies.lock().unwrap().clone();
    for b in bodies.iter().filter(|b| b["messages"].as_array().unwrap().len() > 1) {
        assert_eq!(b["messages"][1]["content"], "{{", "the re-ask carries candidate 0's answer: {b}");
    }
    let a = &m["quality"]["stages"]["ask"]["answers"];
    // Discarded: candidates 1 and 2 of the first round, 0 of the second (failed), 2 (not read).
    assert_eq!((a["after_reask"].as_u64(), a["discarded_candidates"].as_u64()), (Some(1), Some(4)), "{a}");
    let c = &m["quality"]["stages"]["ask"]["checks"]["debris"];
    assert_eq!(
        (c["failed"].as_u64(), c["reasked"].as_u64(), c["dropped"].as_u64()),
        (Some(4), Some(1), Some(0)),
        "{c}"
    );
}

#[test]
fn near_duplicates_keep_the_first_record_for_any_thread_count() {
    let p = Project::new();
    let base = "the role walks through the old market and talks about the price of bread, the weather and the harvest";
    let mut lines = String::new();
    for i in 0..300 {
        let text = match i % 3 {
            0 => format!("{base} number {i} of a long series of distinct things to say about town {i}"),
            1 => format!("{base} number {} of a long series of distinct things to say about town {}", i - 1, i - 1),
            _ => format!("entirely different words for record {i}: rockets, fuel, orbits and the moons of planet {i}"),
        };
        lines.push_str(
            &json!({"id": format!("r{i:03}"), "text": text, "kind": if i < 150 { "x" } else { "y" }}).to_string(),
        );
        lines.push('\n');
    }
    p.write("in.jsonl", lines);
    p.write(
        "p.toml",
        "[pipeline]\nname = \"d\"\nmax_failure_ratio = 1.0\n\n[stages.in]\nkind = \"source\"\npath = \"in.jsonl\"\n\n[stages.unique]\nkind = \"dedup\"\ninputs = [\"in\"]\nfields = [\"text\"]\nthreshold = 0.8\nby = [\"kind\"]\n",
    );
    p.synth_env(&["run", "p.toml", "--out", "one"], &[("RAYON_NUM_THREADS", "1")]).ok();
    p.synth_env(&["run", "p.toml", "--out", "four"], &[("RAYON_NUM_THREADS", "4")]).ok();
    support::assert_same_outputs(&p.path().join("one"), &p.path().join("four"));
    let out = p.path().join("one");
    let kept = parquet_rows(&out.join("unique.parquet"));
    assert_eq!(kept.len(), 200);
    let f = failures(&out, "unique");
    assert_eq!(f.len(), 100);
    // Each copy names the earlier record it repeats.
    for x in &f {
        let i: usize = x["id"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(i % 3, 1);
        assert!(x["message"].as_str().unwrap().contains(&format!("\"r{:03}\"", i - 1)), "{x:?}");
        assert_eq!((x["kind"].as_str(), x["check"].as_str()), (Some("duplicate"), Some("near_duplicate")));
    }
    assert_eq!(manifest(&out)["quality"]["totals"]["near_duplicates_removed"], 100);
}

/// The offline RoleMRC run in `dir` (`--out`).
fn rolemrc_offline(p: &Project, dir: &str) -> support::Run {
    let file = support::repo().join("pipelines/rolemrc.toml").display().to_string();
    p.synth(&["run", file.as_str(), "--offline", "--out", dir])
}

#[test]
fn a_review_drops_a_sample_a_spare_takes_its_place_and_a_bad_line_stops_the_run() {
    let p = Project::new();
    rolemrc_offline(&p, "out").ok();
    let out = p.path().join("out");
    let sft = parquet_rows(&out.join("sft.parquet"));
    let jsonl_before = std::fs::read_to_string(out.join("sft.jsonl")).unwrap();
    let victim = sft.iter().find(|r| r["category"] == "answer").unwrap();
    let id = victim["id"].as_str().unwrap().to_string();
    let conversation = serde_json::to_string(&victim["conversations"]).unwrap();
    assert!(jsonl_before.contains(&conversation));
    let dir = out.display().to_string();
    let r = p
        .synth(&["review", &dir, "--drop", &id, "--note", "generic reply", "--reviewer", "ana", "--stage", "sft"])
        .ok();
    assert!(r.stdout.contains("dropped 1 record"), "{}", r.stdout);
    // A review of a record that is not in the stage is refused, and nothing is written.
    p.synth(&["review", &dir, "--drop", "no-such-sample", "--stage", "sft"]).code(78);
    let r = p
        .synth(&[
            "run",
            support::repo().join("pipelines/rolemrc.toml").to_str().unwrap(),
            "--offline",
            "--out",
            &dir,
            "--dry-run",
        ])
        .ok();
    assert!(r.stdout.contains("samples"), "{}", r.stdout);
    rolemrc_offline(&p, &dir).ok();
    let st = statuses(&out);
    for above in ["profiles_llm", "profiles_unique", "plan", "free_chats", "stylized", "stylized_unique", "rewritten"] {
        assert_eq!(st[above], "up_to_date", "{above}: {st:?}");
    }
    assert_eq!(st["samples"], "ran");
    let sft_after = parquet_rows(&out.join("sft.parquet"));
    assert_eq!(sft_after.len(), sft.len(), "a spare takes the dropped sample's place");
    assert!(sft_after.iter().all(|r| r["id"] != id.as_str()));
    let jsonl = std::fs::read_to_string(out.join("sft.jsonl")).unwrap();
    assert!(!jsonl.contains(&conversation), "the dropped sample left sft.jsonl");
    let f = failures(&out, "samples");
    let dropped = f.iter().find(|x| x["id"] == id.as_str()).expect("in the samples' failures");
    assert_eq!(dropped["kind"], "review");
    assert!(
        dropped["message"].as_str().unwrap().contains("by ana")
            && dropped["message"].as_str().unwrap().contains("generic reply")
    );
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("1 record was dropped in human review"), "{card}");
    assert!(card.contains("`review` 1"), "{card}");
    assert_eq!(manifest(&out)["quality"]["totals"]["dropped_in_review"], 1);

    // A bad line: exit 78 naming the file and line; nothing made is lost or changed.
    let review = out.join("review.jsonl");
    let mut text = std::fs::read_to_string(&review).unwrap();
    text.push_str("{\"id\": \"x\", \"decision\": \"maybe\"}\n");
    std::fs::write(&review, text).unwrap();
    let before = support::output_files(&out);
    let r = rolemrc_offline(&p, &dir).code(78);
    assert!(r.stderr.contains("review.jsonl:2:") && r.stderr.contains("\"keep\" or \"drop\""), "{}", r.stderr);
    let after = support::output_files(&out);
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    let changed: Vec<&String> = after.iter().filter(|(k, v)| before[*k] != **v).map(|(k, _)| k).collect();
    assert!(changed.is_empty(), "changed by a run that stopped: {changed:?}");
    p.synth(&["review", &dir]).code(78);
}
