//! Scheduled regeneration against a fake Hub on 127.0.0.1 (`support::fake_hub`): locks
//! pin upstream commits and file hashes; a new upstream revision rebuilds exactly the
//! stages that depend on it and nothing else, an unchanged one does no work; snapshots
//! count rows added / removed / changed by id; a push is one commit (LFS for Parquet)
//! plus a tag and fails cleanly when the branch moved; overlapping regenerations exit
//! 75; a failing run leaves `latest` and the Hub untouched; hooks get a summary without
//! secrets; served models are locked; `max_cost_usd` stops a run; schedule recipes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::fake_hub::{self, FakeHub};
use crate::support::openai_server::{self, Behaviour};
use crate::support::{Project, Run, parquet_rows, statuses};

const TOKEN: &str = "hf_fake_write_token_0123456789";

fn people(rows: &[(&str, &str, i64)]) -> Vec<u8> {
    rows.iter()
        .map(|(id, name, age)| format!("{{\"id\": \"{id}\", \"name\": \"{name}\", \"age\": {age}}}\n"))
        .collect::<String>()
        .into_bytes()
}

const V1: &[(&str, &str, i64)] =
    &[("p1", "ann", 30), ("p2", "bob", 40), ("p3", "cid", 50), ("p4", "dan", 60), ("p5", "eve", 70)];
/// p2 changed, p3 removed, p6 added.
const V2: &[(&str, &str, i64)] =
    &[("p1", "ann", 30), ("p2", "bobby", 40), ("p4", "dan", 60), ("p5", "eve", 70), ("p6", "fay", 80)];

fn pipeline(url: &str, extra: &str) -> String {
    format!(
        r#"
[pipeline]
output_dir = "out"

[stages.people]
kind = "source"
hf = {{ repo = "org/people", files = ["people.jsonl"], endpoint = "{url}", cache_dir = "hf-cache" }}

[stages.greeted]
kind = "map"
inputs = ["people"]
derive = {{ greeting = "hello {{{{ name }}}}" }}

[stages.people_jsonl]
kind = "jsonl"
inputs = ["greeted"]
path = "people.jsonl"

[stages.people_flat]
kind = "parquet"
inputs = ["greeted"]
path = "people_flat.parquet"
include_id = false

[stages.cities]
kind = "source"
path = "cities.jsonl"

[stages.cities_jsonl]
kind = "jsonl"
inputs = ["cities"]
path = "cities.jsonl"
include_id = false

[regenerate]
exports = ["greeted", "people_jsonl", "people_flat", "cities_jsonl"]
hub = {{ repo = "org/release", endpoint = "{url}" }}
on_success = "cat > hook-success.json"
on_failure = "cat > hook-failure.json"
on_unchanged = "cat > hook-unchanged.json"
{extra}
"#
    )
}

struct World {
    hub: Arc<FakeHub>,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    p: Project,
}

fn world_with(hub: Arc<FakeHub>, extra: &str) -> World {
    hub.push("org/people", &[("people.jsonl", &people(V1)), ("README.md", b"# people")]);
    hub.push("org/release", &[(".gitattributes", b"*.parquet filter=lfs diff=lfs merge=lfs -text\n")]);
    let (url, stop) = fake_hub::serve(hub.clone());
    let p = Project::new();
    p.write("p.toml", pipeline(&url, extra));
    p.write("cities.jsonl", "{\"city\": \"rome\"}\n{\"city\": \"oslo\"}\n{\"city\": \"lima\"}\n");
    World { hub, url, _stop: stop, p }
}

fn world() -> World {
    world_with(FakeHub::new(TOKEN), "")
}

impl World {
    fn regen(&self, args: &[&str]) -> Run {
        let mut all = vec!["regenerate", "p.toml"];
        all.extend_from_slice(args);
        self.p.synth_env(&all, &[("HF_TOKEN", TOKEN)])
    }

    fn out(&self) -> std::path::PathBuf {
        self.p.path().join("out")
    }

    fn latest(&self) -> String {
        std::fs::read_link(self.out().join("snapshots/latest")).unwrap().to_string_lossy().to_string()
    }

    fn hook(&self, name: &str) -> serde_json::Value {
        let text = self.p.read(&format!("hook-{name}.json"));
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("hook-{name}.json: {e}: {text}"))
    }
}

fn snapshot_manifest(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn a_new_upstream_revision_rebuilds_exactly_the_dependent_stages_and_the_diff_counts_rows() {
    let w = world();
    let first = w.regen(&["--snapshot"]).ok();
    assert!(first.stdout.contains("regenerated"), "{}", first.stdout);
    assert!(statuses(&w.out()).values().all(|s| s == "ran"), "{:?}", statuses(&w.out()));
    let snap1 = w.latest();
    assert!(w.out().join("snapshots").join(&snap1).join("people.jsonl").exists());
    let success = w.hook("success");
    assert_eq!(success["status"], "regenerated");
    assert_eq!(success["diff"]["people.jsonl"]["added"], 5);

    // Unchanged upstream: nothing runs, nothing is downloaded, no snapshot.
    let downloads = w.hub.downloads.lock().unwrap().len();
    let run_started = crate::support::manifest(&w.out())["started_at"].clone();
    let unchanged = w.regen(&["--if-changed", "--snapshot"]).ok();
    assert_eq!(crate::support::manifest(&w.out())["started_at"], run_started, "no run happened");
    assert!(unchanged.stdout.contains("unchanged"), "{}", unchanged.stdout);
    assert_eq!(w.hub.downloads.lock().unwrap().len(), downloads, "an unchanged upstream is not downloaded again");
    assert_eq!(w.hook("unchanged")["status"], "unchanged");
    assert_eq!(w.latest(), snap1);
    let listed = w.p.synth(&["snapshot", "list", "out"]).ok();
    assert_eq!(listed.stdout.lines().count(), 1, "{}", listed.stdout);

    // A new revision upstream: exactly the stages reading it run again.
    let old = w.hub.head("org/people");
    let new = w.hub.push("org/people", &[("people.jsonl", &people(V2)), ("README.md", b"# people")]);
    let second = w.regen(&["--if-changed", "--snapshot"]).ok();
    assert!(
        second.stdout.contains(&format!("people: org/people@main {} → {}", &old[..8], &new[..8])),
        "{}",
        second.stdout
    );
    let st = statuses(&w.out());
    for s in ["people", "greeted", "people_jsonl", "people_flat"] {
        assert_eq!(st[s], "ran", "{s}: {st:?}");
    }
    for s in ["cities", "cities_jsonl"] {
        assert_eq!(st[s], "up_to_date", "{s}: {st:?}");
    }
    let snap2 = w.latest();
    assert_ne!(snap1, snap2);
    let m = snapshot_manifest(&w.out().join("snapshots").join(&snap2));
    let d = &m["snapshot"]["changelog"]["diff"];
    // A Parquet export without an id column is keyed by its input's ids, like a JSONL one.
    for export in ["people.jsonl", "greeted.parquet", "people_flat.parquet"] {
        assert_eq!(
            (
                &d[export]["rows"],
                &d[export]["added"],
                &d[export]["removed"],
                &d[export]["changed"],
                &d[export]["unchanged"]
            ),
            (&5.into(), &1.into(), &1.into(), &1.into(), &3.into()),
            "{export}: {d}"
        );
    }
    // A JSONL export without ids is keyed by the rows it was written from.
    assert_eq!(d["cities.jsonl"]["unchanged"], 3, "{d}");
    // The lock in the snapshot pins the new commit; the card carries the changelog.
    let lock = std::fs::read_to_string(w.out().join("snapshots").join(&snap2).join("synth.lock")).unwrap();
    assert!(lock.contains(&new) && !lock.contains(&old), "{lock}");
    let card = std::fs::read_to_string(w.out().join("snapshots").join(&snap2).join("README.md")).unwrap();
    assert!(card.contains("## Changelog") && card.contains("| people.jsonl | 5 | 1 | 1 | 1 |"), "{card}");
    assert!(card.contains(&snap1), "the older release stays in the changelog: {card}");

    let diff = w.p.synth(&["snapshot", "diff", "out", "--ids", "5"]).ok();
    assert!(
        diff.stdout.contains("people.jsonl: 5 rows, +1 added, -1 removed, 1 changed, 3 unchanged"),
        "{}",
        diff.stdout
    );
    assert!(diff.stdout.contains("added: p6") && diff.stdout.contains("removed: p3"), "{}", diff.stdout);
    assert!(diff.stdout.contains("changed: p2"), "{}", diff.stdout);
    // The older snapshot is immutable: still the first revision's rows.
    let rows = std::fs::read_to_string(w.out().join("snapshots").join(&snap1).join("people.jsonl")).unwrap();
    assert!(rows.contains("\"cid\"") && !rows.contains("bobby"), "{rows}");

    // Retention keeps the newest (and latest).
    let gc = w.p.synth(&["snapshot", "gc", "p.toml", "--keep", "1"]).ok();
    assert!(gc.stdout.contains(&snap1), "{}", gc.stdout);
    assert!(!w.out().join("snapshots").join(&snap1).exists());
    assert!(w.out().join("snapshots").join(&snap2).exists());
}

#[test]
fn a_push_is_one_commit_with_the_expected_files_then_a_tag() {
    let w = world();
    let parent = w.hub.head("org/release");
    let run = w.regen(&["--push"]).ok();
    assert!(run.stdout.contains("published org/release@main"), "{}", run.stdout);
    let repo = w.hub.repo("org/release");
    assert_eq!(repo.api_commits.len(), 1, "one commit per snapshot");
    let sha = &repo.api_commits[0];
    let commit = &repo.commits[sha];
    assert_eq!(commit.parent.as_deref(), Some(parent.as_str()));
    let files: Vec<&str> = commit.files.keys().map(String::as_str).collect();
    assert_eq!(
        files,
        vec![
            ".gitattributes",
            "README.md",
            "cities.jsonl",
            "greeted.parquet",
            "manifest.json",
            "people.jsonl",
            "people_flat.parquet",
            "synth.lock"
        ]
    );
    assert!(commit.lfs.contains("greeted.parquet"), "Parquet goes through LFS: {:?}", commit.lfs);
    let snap = w.latest();
    assert_eq!(repo.tags.get(&snap), Some(sha), "tagged with the snapshot id");
    // The files are the snapshot's, byte for byte.
    let dir = w.out().join("snapshots").join(&snap);
    for f in ["README.md", "people.jsonl", "greeted.parquet", "synth.lock"] {
        assert_eq!(commit.files[f], std::fs::read(dir.join(f)).unwrap(), "{f}");
    }
    // The commit is recorded in the snapshot's manifest and the output directory's.
    assert_eq!(snapshot_manifest(&dir)["release"]["commit"], sha.as_str());
    assert_eq!(crate::support::manifest(&w.out())["release"]["commit"], sha.as_str());
    assert_eq!(w.hook("success")["hub"]["commit"], sha.as_str());
    // The token is nowhere: outputs, snapshot, hook summary.
    for entry in walk(w.p.path()) {
        if let Ok(text) = std::fs::read(&entry) {
            assert!(!String::from_utf8_lossy(&text).contains(TOKEN), "token in {}", entry.display());
        }
    }

    // Next release: one more commit on top, the next tag.
    w.hub.push("org/people", &[("people.jsonl", &people(V2))]);
    w.regen(&["--if-changed", "--push"]).ok();
    let repo = w.hub.repo("org/release");
    assert_eq!(repo.api_commits.len(), 2);
    assert_eq!(repo.commits[&repo.api_commits[1]].parent.as_deref(), Some(sha.as_str()));
    assert_eq!(repo.tags.len(), 2);
    // Nothing new: no commit.
    w.regen(&["--if-changed", "--push"]).ok();
    assert_eq!(w.hub.repo("org/release").api_commits.len(), 2);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_symlink() {
                continue;
            }
            if p.is_dir() { stack.push(p) } else { out.push(p) }
        }
    }
    out
}

#[test]
fn large_files_go_up_in_parts() {
    let w = world_with(FakeHub::with_multipart(TOKEN, 700), "");
    w.regen(&["--push"]).ok();
    let repo = w.hub.repo("org/release");
    let commit = &repo.commits[&repo.api_commits[0]];
    assert!(commit.lfs.contains("people.jsonl"), "{:?}", commit.lfs);
    assert!(commit.files["manifest.json"].len() > 700, "the manifest is large enough to be split");
    // The manifest went up in parts and arrived whole (the local copy has since gained "release").
    let pushed: serde_json::Value = serde_json::from_slice(&commit.files["manifest.json"]).unwrap();
    let mut local = snapshot_manifest(&w.out().join("snapshots").join(w.latest()));
    assert_eq!(local.as_object_mut().unwrap().remove("release").unwrap()["commit"], repo.api_commits[0].as_str());
    assert_eq!(pushed, local);
}

#[test]
fn a_push_fails_cleanly_when_the_branch_moved() {
    let w = world();
    w.regen(&["--push"]).ok();
    let snap1 = w.latest();
    w.hub.push("org/people", &[("people.jsonl", &people(V2))]);
    // Someone else pushes to the release repository while we work.
    *w.hub.before_next_commit.lock().unwrap() = Some(Box::new(|state: &mut fake_hub::HubState| {
        let mut files = state.repos["org/release"].commits[&state.repos["org/release"].branches["main"]].files.clone();
        files.insert("NOTES.md".into(), b"hand-written".to_vec());
        state.commit("org/release", "main", files, "someone else");
    }));
    let run = w.regen(&["--if-changed", "--push"]).code(2);
    assert!(run.stderr.contains("someone else pushed") && run.stderr.contains("412"), "{}", run.stderr);
    assert!(run.stderr.contains("nothing was published"), "{}", run.stderr);
    let repo = w.hub.repo("org/release");
    assert_eq!(repo.api_commits.len(), 1, "our second commit did not land");
    assert_eq!(repo.commits[&repo.branches["main"]].summary, "someone else");
    assert_eq!(repo.tags.len(), 1, "no tag for a release that was not published");
    assert_eq!(w.latest(), snap1, "latest moves only after the release is published");
    let failure = w.hook("failure");
    assert_eq!(failure["status"], "failed");
    assert!(failure["error"].as_str().unwrap().contains("someone else pushed"), "{failure}");

    // The next regeneration publishes on top of the new head.
    w.regen(&["--if-changed", "--push"]).ok();
    let repo = w.hub.repo("org/release");
    assert_eq!(repo.api_commits.len(), 2);
    let ours = &repo.commits[&repo.api_commits[1]];
    assert!(ours.summary.contains("release"), "{}", ours.summary);
    assert!(ours.files.contains_key("NOTES.md"), "the other push is kept");
    assert_ne!(w.latest(), snap1);
}

#[test]
fn a_failing_run_leaves_latest_and_the_hub_untouched() {
    let w = world();
    w.regen(&["--push"]).ok();
    let snap1 = w.latest();
    let commits = w.hub.repo("org/release").commits.len();
    // A broken upstream revision: most lines are not JSON (over max_failure_ratio).
    w.hub.push(
        "org/people",
        &[("people.jsonl", b"{\"id\": \"p1\", \"name\": \"ann\", \"age\": 1}\nnot json\nnor this\n")],
    );
    let run = w.p.synth_env(
        &["regenerate", "p.toml", "--if-changed", "--push"],
        &[("HF_TOKEN", TOKEN), ("OPENAI_API_KEY", "sk-secret-key-000111222333")],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("stage \"people\""), "{}", run.stderr);
    assert_eq!(w.latest(), snap1);
    assert_eq!(w.hub.repo("org/release").commits.len(), commits, "the Hub is untouched");
    assert_eq!(std::fs::read_dir(w.out().join("snapshots")).unwrap().count(), 2, "snapshot + latest only");
    let failure = w.p.read("hook-failure.json");
    assert!(failure.contains("\"status\":\"failed\""), "{failure}");
    assert!(!failure.contains(TOKEN) && !failure.contains("sk-secret-key"), "{failure}");
}

#[test]
fn overlapping_regenerations_one_runs_one_exits_with_the_lock_message() {
    let w = world();
    w.hub.close_gate();
    let mut first = w.p.spawn_env(&["regenerate", "p.toml", "--snapshot"], &[("HF_TOKEN", TOKEN)]);
    let started = Instant::now();
    while w.hub.info_requests.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the first regeneration never reached the hub");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first one holds the lock while it waits for the hub.
    let second = w.regen(&["--snapshot"]);
    assert_eq!(second.code, 75, "{}", second.stderr);
    assert!(second.stderr.contains("another synth regenerate of p is running"), "{}", second.stderr);
    assert!(second.stderr.contains(&format!("pid {}", first.id())), "{}", second.stderr);
    assert!(!w.p.path().join("hook-failure.json").exists(), "a skipped run calls no hook");
    w.hub.open_gate();
    let status = first.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(first.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(w.out().join("snapshots/latest").exists());
    // A plain run of the same output directory while a run holds it: 75 as well.
    let lock = std::fs::File::open(w.out().join("_synth/lock")).unwrap();
    lock.lock().unwrap();
    let busy = w.p.synth(&["run", "p.toml"]);
    assert_eq!(busy.code, 75, "{}", busy.stderr);
    assert!(busy.stderr.contains("another synth run is using"), "{}", busy.stderr);
}

#[test]
fn a_lock_pins_upstream_commits_and_file_contents() {
    let w = world();
    let v1 = w.hub.head("org/people");
    w.p.synth(&["lock", "p.toml"]).ok();
    let lock = w.p.read("synth.lock");
    assert!(lock.contains(&v1) && lock.contains("cities.jsonl"), "{lock}");
    let v2 = w.hub.push("org/people", &[("people.jsonl", &people(V2))]);

    // --locked reads the locked commit, not what main points to now.
    w.p.synth(&["run", "p.toml", "--locked"]).ok();
    let names: Vec<String> =
        parquet_rows(&w.out().join("people.parquet")).iter().map(|r| r["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, vec!["ann", "bob", "cid", "dan", "eve"]);

    // Without --update the lock keeps what it has and says what moved.
    let kept = w.p.synth(&["lock", "p.toml"]).ok();
    assert!(kept.stdout.contains("not taken") && kept.stdout.contains(&v2[..8]), "{}", kept.stdout);
    assert!(w.p.read("synth.lock").contains(&v1));
    w.p.synth(&["lock", "p.toml", "--update"]).ok();
    assert!(w.p.read("synth.lock").contains(&v2));
    w.p.synth(&["run", "p.toml", "--locked"]).ok();
    assert_eq!(parquet_rows(&w.out().join("people.parquet")).len(), 5);
    assert_eq!(parquet_rows(&w.out().join("people.parquet"))[1]["name"], "bobby");

    // A regeneration can build the locked versions too (no bump): its snapshot pins them.
    w.hub.push("org/people", &[("people.jsonl", &people(V1))]);
    w.regen(&["--locked", "--snapshot"]).ok();
    let snap_lock = std::fs::read_to_string(w.out().join("snapshots/latest/synth.lock")).unwrap();
    assert!(snap_lock.contains(&v2), "{snap_lock}");
    assert_eq!(parquet_rows(&w.out().join("people.parquet"))[1]["name"], "bobby");

    // A local file that changed since it was locked stops a --locked run.
    w.p.write("cities.jsonl", "{\"city\": \"bern\"}\n");
    let run = w.p.synth(&["run", "p.toml", "--locked"]).code(2);
    assert!(run.stderr.contains("cities.jsonl changed since it was locked"), "{}", run.stderr);
    // --locked with no lock entry is a configuration error.
    let other = w.p.synth(&["run", "p.toml", "--locked", "--lockfile", "none.lock"]).code(78);
    assert!(other.stderr.contains("synth lock"), "{}", other.stderr);
}

/// A pipeline that asks `base_url`'s model every question of `q.jsonl` (`provider` adds
/// provider options; `tail` is appended).
fn llm_pipeline(base_url: &str, model: &str, provider: &str, tail: &str) -> String {
    format!(
        r#"
[pipeline]
output_dir = "out"

[providers.gpt]
kind = "openai"
base_url = "{base_url}"
model = "{model}"
api_key_env = "TEST_KEY"
{provider}

[stages.q]
kind = "source"
path = "q.jsonl"

[stages.a]
kind = "llm"
inputs = ["q"]
provider = "gpt"
messages = "messages"

[stages.out]
kind = "jsonl"
inputs = ["a"]
{tail}
"#
    )
}

#[test]
fn served_models_are_locked_and_a_new_one_is_refused_under_locked() {
    let served = Arc::new(std::sync::Mutex::new(Some(("gpt-x-2024-08-06".to_string(), "fp_aaa".to_string()))));
    let server = openai_server::start(Behaviour { served_as: served.clone(), ..Default::default() });
    let p = Project::new();
    p.write("p.toml", llm_pipeline(&server.base_url(), "gpt-x", "", ""));
    p.write("q.jsonl", "{\"id\": \"1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    let env = [("TEST_KEY", "k-0123456789")];
    p.synth_env(&["run", "p.toml"], &env).ok();
    p.synth_env(&["lock", "p.toml"], &env).ok();
    let lock = p.read("synth.lock");
    assert!(lock.contains("gpt-x-2024-08-06") && lock.contains("fp_aaa"), "{lock}");
    // The alias now serves another snapshot: a --locked run that asks again refuses it.
    *served.lock().unwrap() = Some(("gpt-x-2024-11-20".into(), "fp_bbb".into()));
    p.write("q.jsonl", "{\"id\": \"1\", \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}\n");
    p.synth_env(&["lock", "p.toml", "--update"], &env).ok(); // takes the new file hash, keeps served models
    let run = p.synth_env(&["run", "p.toml", "--locked"], &env).code(2);
    assert!(
        run.stderr.contains("served gpt-x-2024-11-20") && run.stderr.contains("gpt-x-2024-08-06"),
        "{}",
        run.stderr
    );
    let updated = p.synth_env(&["lock", "p.toml", "--update"], &env).ok();
    assert!(updated.stdout.contains("gpt-x-2024-11-20"), "{}", updated.stdout);
}

/// The regeneration's cost cap is the run's one (`[pipeline] max_cost_usd`, services/cost.rs);
/// `--max-cost-usd` overrides it. A run the cap stopped is failed: no snapshot, no `latest`.
#[test]
fn max_cost_usd_stops_the_run_and_nothing_is_snapshotted() {
    use std::sync::atomic::Ordering::SeqCst;
    let server = openai_server::start(Behaviour { latency: Duration::from_millis(20), ..Default::default() });
    let p = Project::new();
    let rows: String = (0..200)
        .map(|i| {
            format!(
                "{{\"id\": \"{i}\", \"messages\": [{{\"role\": \"user\", \"content\": \"question {i} {}\"}}]}}\n",
                "x".repeat(400)
            )
        })
        .collect();
    p.write("q.jsonl", rows);
    // $0.01 a token: each request reserves about $4.3 (its prompt's bytes plus max_tokens) and costs about $1.2.
    let pricing = "price_input_per_mtok = 10000.0\nprice_output_per_mtok = 10000.0\nmax_tokens = 10\nmax_concurrency = 2\ninitial_concurrency = 2";
    let tail = "[regenerate]\non_failure = \"cat > hook-failure.json\"";
    let text = llm_pipeline(&server.base_url(), "m", pricing, tail);
    p.write("p.toml", text.replace("output_dir = \"out\"", "output_dir = \"out\"\nmax_cost_usd = 20.0"));
    let env = [("TEST_KEY", "k-0123456789")];
    let run = p.synth_env(&["regenerate", "p.toml", "--snapshot"], &env);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("max_cost_usd of the run ($20.0000) would be passed"), "{}", run.stderr);
    assert!(!p.path().join("out/snapshots/latest").exists());
    let sent = server.counters.total.load(SeqCst);
    assert!((1..200).contains(&sent), "the run stopped early: {sent} requests");
    let failure: serde_json::Value = serde_json::from_str(p.read("hook-failure.json").trim()).unwrap();
    assert_eq!(failure["status"], "failed", "{failure}");
    // What the stopped stage paid is in the summary (the manifest has no report of it).
    let cost = failure["cost_usd"].as_f64().unwrap();
    assert!(cost > 0.0 && cost <= 20.0, "{failure}");
    assert!(failure["requests"].as_u64().unwrap() >= 1 && failure["tokens_in"].as_u64().unwrap() > 0, "{failure}");

    // --max-cost-usd overrides the pipeline's cap for one regeneration: a bigger one lets it
    // finish, and what the first attempt paid is not paid again.
    let run = p.synth_env(&["regenerate", "p.toml", "--snapshot", "--max-cost-usd", "1000"], &env);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(server.counters.total.load(SeqCst), 200, "each question asked once over both attempts");
    assert!(p.path().join("out/snapshots/latest").exists());

    // [regenerate] max_cost_usd would be a second cap: refused, pointing to [pipeline].
    p.write("bad.toml", llm_pipeline(&server.base_url(), "m", pricing, "[regenerate]\nmax_cost_usd = 5.0"));
    let bad = p.synth_env(&["regenerate", "bad.toml"], &env).code(78);
    assert!(
        bad.stderr.contains("max_cost_usd belongs in [pipeline]") && bad.stderr.contains("bad.toml"),
        "{}",
        bad.stderr
    );
}

/// A batch stage left waiting (a `vllm run-batch` file for the user to run) is a partial
/// run: no snapshot, no `latest`, the failure hook, and the next regeneration goes on.
#[test]
fn a_run_waiting_for_batches_is_not_released() {
    let p = Project::new();
    p.write("q.jsonl", "{\"id\": \"1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    let tail = "[regenerate]\non_failure = \"cat > hook-failure.json\"";
    p.write("p.toml", llm_pipeline("http://127.0.0.1:9/v1", "m", "batch = true\nbatch_api = \"vllm\"", tail));
    let run = p.synth_env(&["regenerate", "p.toml", "--snapshot"], &[("TEST_KEY", "k-0123456789")]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("stages a wait for provider batches"), "{}", run.stderr);
    assert!(!p.path().join("out/snapshots/latest").exists());
    assert!(p.read("hook-failure.json").contains("\"status\":\"failed\""));
}

#[test]
fn schedule_recipes_name_the_schedule_and_the_secrets() {
    let w = world();
    let systemd =
        w.p.synth(&["emit", "schedule", "systemd", "p.toml", "--every", "weekly", "--at", "04:30", "--push"]).ok();
    for needle in [
        "OnCalendar=Mon *-*-* 4:30:00 UTC",
        "Persistent=true",
        "Type=oneshot",
        "regenerate p.toml --if-changed --snapshot --push",
        "HF_TOKEN=...",
        "EnvironmentFile=/etc/synth/p.env",
    ] {
        assert!(systemd.stdout.contains(needle), "{needle}:\n{}", systemd.stdout);
    }
    let cron = w.p.synth(&["emit", "schedule", "cron", "p.toml", "--every", "6h"]).ok();
    assert!(
        cron.stdout.contains("0 */6 * * * cd ") && cron.stdout.contains("flock -n /var/lock/synth-p.lock"),
        "{}",
        cron.stdout
    );
    let k8s = w.p.synth(&["emit", "schedule", "k8s", "p.toml", "--every", "0 3 * * 1", "--image", "reg/synth:1"]).ok();
    for needle in
        ["kind: CronJob", "concurrencyPolicy: Forbid", "schedule: \"0 3 * * 1\"", "image: \"reg/synth:1\"", "secretRef"]
    {
        assert!(k8s.stdout.contains(needle), "{needle}:\n{}", k8s.stdout);
    }
    // Valid YAML with the fields a CronJob needs (checked with PyYAML when present).
    let check = "import sys, yaml; d = yaml.safe_load(sys.stdin); s = d['spec']; \
                 assert d['kind'] == 'CronJob' and s['concurrencyPolicy'] == 'Forbid'; \
                 c = s['jobTemplate']['spec']['template']['spec']['containers'][0]; \
                 assert c['command'][:3] == ['synth', 'regenerate', 'p.toml'], c['command']; print('ok')";
    match std::process::Command::new("python3")
        .args(["-c", check])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(k8s.stdout.as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No module named 'yaml'") {
                eprintln!("SKIPPED the YAML parse: PyYAML is not installed");
            } else {
                assert!(out.status.success(), "{err}\n{}", k8s.stdout);
            }
        }
        Err(e) => eprintln!("SKIPPED the YAML parse: no python3 ({e})"),
    }
    let bad = w.p.synth(&["emit", "schedule", "cron", "p.toml", "--every", "7m"]).code(78);
    assert!(bad.stderr.contains("divide 60"), "{}", bad.stderr);
    let bad = w.p.synth(&["emit", "schedule", "systemd", "p.toml", "--every", "0 3 1 * 1"]).code(78);
    assert!(bad.stderr.contains("systemd"), "{}", bad.stderr);
}

#[test]
fn regenerate_config_errors_name_the_stage() {
    let w = world_with(FakeHub::new(TOKEN), "");
    w.p.write("bad.toml", pipeline(&w.url, "").replace("exports = [\"greeted\"", "exports = [\"greeter\""));
    let run = w.p.synth(&["regenerate", "bad.toml"]).code(78);
    assert!(
        run.stderr.contains("no stage \"greeter\"") && run.stderr.contains("did you mean \"greeted\""),
        "{}",
        run.stderr
    );
    let run = w.p.synth(&["regenerate", "p.toml", "--push", "not a repo"]).code(78);
    assert!(run.stderr.contains("not a Hub repository id"), "{}", run.stderr);
    // Publishing without a token fails before any work.
    let run = w.p.synth(&["regenerate", "p.toml", "--push"]).code(2);
    assert!(run.stderr.contains("HF_TOKEN"), "{}", run.stderr);
    assert!(!w.out().join("people.parquet").exists());
}

/// A file server on 127.0.0.1 with ETags: counts full answers (200) and 304s.
struct Files {
    body: std::sync::Mutex<Vec<u8>>,
    full: std::sync::atomic::AtomicUsize,
    not_modified: std::sync::atomic::AtomicUsize,
}

fn serve_files(files: Arc<Files>) -> (String, tokio::sync::oneshot::Sender<()>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    let handler = move |headers: HeaderMap| {
        let files = files.clone();
        async move {
            let body = files.body.lock().unwrap().clone();
            let etag = format!("\"{}\"", &blake3::hash(&body).to_hex()[..12]);
            if headers.get("if-none-match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
                files.not_modified.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return (StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response();
            }
            files.full.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (StatusCode::OK, [("etag", etag)], body).into_response()
        }
    };
    crate::support::serve_router(axum::Router::new().route("/data/people.jsonl", axum::routing::get(handler)))
}

#[test]
fn url_sources_are_pinned_by_content_and_fetched_conditionally() {
    use std::sync::atomic::Ordering::SeqCst;
    let files = Arc::new(Files {
        body: std::sync::Mutex::new(people(V1)),
        full: Default::default(),
        not_modified: Default::default(),
    });
    let (url, _stop) = serve_files(files.clone());
    let p = Project::new();
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
output_dir = "out"

[stages.people]
kind = "source"
url = "{url}/data/people.jsonl"

[stages.people_jsonl]
kind = "jsonl"
inputs = ["people"]
"#
        ),
    );
    p.synth(&["lock", "p.toml"]).ok();
    let lock = p.read("synth.lock");
    let v1_hash = blake3::hash(&people(V1)).to_hex().to_string();
    let v1_etag = &v1_hash[..12];
    assert!(lock.contains(&v1_hash) && lock.contains(v1_etag), "the lock pins content and ETag: {lock}");
    p.synth(&["run", "p.toml"]).ok();
    assert_eq!(files.full.load(SeqCst), 1, "downloaded once (lock and run share the cache)");
    // Unchanged: a 304, nothing downloaded, nothing rebuilt.
    p.synth(&["run", "p.toml"]).ok();
    assert_eq!(files.full.load(SeqCst), 1);
    assert!(files.not_modified.load(SeqCst) >= 1);
    assert!(statuses(&p.path().join("out")).values().all(|s| s == "up_to_date"));
    // A scheduled regeneration of an unchanged URL: a conditional request, "unchanged", no run.
    p.synth(&["regenerate", "p.toml", "--snapshot"]).ok();
    let snap1 = std::fs::read_link(p.path().join("out/snapshots/latest")).unwrap();
    let asked = files.not_modified.load(SeqCst);
    let r = p.synth(&["regenerate", "p.toml", "--if-changed", "--snapshot"]).ok();
    assert!(r.stdout.contains("unchanged"), "{}", r.stdout);
    assert_eq!(files.full.load(SeqCst), 1, "nothing downloaded again");
    assert!(files.not_modified.load(SeqCst) > asked, "the URL was asked whether it moved");

    // The server moves on; --locked still reads the pinned content (from the cache).
    *files.body.lock().unwrap() = people(V2);
    p.synth(&["run", "p.toml", "--locked", "--force"]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/people.parquet"))[1]["name"], "bob");
    // Without the lock the new content is read and the source rebuilds.
    let r = p.synth(&["regenerate", "p.toml", "--if-changed", "--snapshot"]).ok();
    assert!(r.stdout.contains("regenerated"), "{}", r.stdout);
    assert_eq!(parquet_rows(&p.path().join("out/people.parquet"))[1]["name"], "bobby");
    // The new snapshot pins the new content; its diff counts the moved rows.
    let snap2 = std::fs::read_link(p.path().join("out/snapshots/latest")).unwrap();
    assert_ne!(snap1, snap2);
    let snap_lock = std::fs::read_to_string(p.path().join("out/snapshots/latest/synth.lock")).unwrap();
    assert!(snap_lock.contains(blake3::hash(&people(V2)).to_hex().as_str()), "{snap_lock}");
    let diff = p.synth(&["snapshot", "diff", "out"]).ok();
    assert!(diff.stdout.contains("+1 added, -1 removed, 1 changed, 3 unchanged"), "{}", diff.stdout);
    // The pinned content is gone from the cache and from the server: --locked says so.
    std::fs::remove_dir_all(p.path().join("out/_synth/downloads")).unwrap();
    let run = p.synth(&["run", "p.toml", "--locked"]).code(2);
    assert!(run.stderr.contains("now serves other content"), "{}", run.stderr);
}
