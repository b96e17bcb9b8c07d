//! `synth view` over real outputs, through a real socket: every endpoint on the offline
//! outputs of each method, paths that leave the directory, secrets, a corrupt file, a
//! directory that is not a run, and a stage's progress changing while a run goes on.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{self, Project};

/// A running `synth view`; killed when dropped.
struct Viewer {
    child: Child,
    addr: String,
}

impl Viewer {
    fn start(target: &Path, env: &[(&str, &str)]) -> Viewer {
        let mut cmd = Command::new(support::synth_bin());
        cmd.args(["view", target.to_str().unwrap(), "--port", "0"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Viewer::start_command(cmd)
    }

    /// A `synth view …` command started: its URL read from its first line.
    fn start_command(mut cmd: Command) -> Viewer {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .trim()
            .trim_end_matches('/')
            .to_string();
        Viewer { child, addr }
    }

    /// GET a path as written (no client-side normalization of `..`): status and body.
    fn get(&self, path: &str) -> (u16, String) {
        self.get_as(path, &self.addr)
    }

    /// GET with the Host header a browser would send for `host`.
    fn get_as(&self, path: &str, host: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_string()
        };
        (status, body)
    }

    fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn offline_run(pipeline: &str, out: &Path) {
    let p = support::repo().join("pipelines").join(pipeline);
    let o = Command::new(support::synth_bin())
        .args(["run", p.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap(), "-q"])
        .current_dir(support::repo())
        .output()
        .unwrap();
    assert!(o.status.success(), "{pipeline}: {}", String::from_utf8_lossy(&o.stderr));
}

/// The Parquet outputs and failure tables the run page lists.
fn parquet_files(run: &Value) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for s in run["stages"].as_array().unwrap() {
        for o in s["outputs"].as_array().into_iter().flatten() {
            let path = o["path"].as_str().unwrap();
            if path.ends_with(".parquet") {
                out.push((path.to_string(), o["rows"].as_u64().unwrap()));
            }
        }
        if let Some(path) = s["failures"]["path"].as_str() {
            out.push((path.to_string(), s["failures"]["rows"].as_u64().unwrap()));
        }
    }
    out
}

/// Every endpoint on one method's offline outputs: the run, each table (a page, the last
/// page, sorted both ways, filtered), failures, reports, files, lookups, snapshots.
fn check_every_endpoint(pipeline: &str) -> (tempfile::TempDir, Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    offline_run(pipeline, &out);
    let v = Viewer::start(&out, &[]);
    let (status, page) = v.get("/");
    assert_eq!(status, 200);
    assert!(page.contains("<title>synth view</title>") && page.contains("/api/events"), "the page");
    let run = v.json("/api/run");
    assert_eq!(run["status"], "ok", "{pipeline}: {}", run["status"]);
    let stages = run["stages"].as_array().unwrap();
    assert!(stages.len() >= 3, "{pipeline}: {} stages", stages.len());
    let files = parquet_files(&run);
    assert!(!files.is_empty(), "{pipeline}: no Parquet outputs listed");
    for (file, rows) in &files {
        let t = v.json(&format!("/api/table?file={}&limit=7", enc(file)));
        assert_eq!(t["rows"].as_u64().unwrap(), *rows, "{file}: rows of the footer vs the state");
        assert_eq!(t["data"].as_array().unwrap().len() as u64, (*rows).min(7), "{file}");
        assert!(!t["columns"].as_array().unwrap().is_empty());
        if *rows > 2 {
            // The last page holds the rest.
            let last = v.json(&format!("/api/table?file={}&offset={}&limit=50", enc(file), rows - 2));
            assert_eq!(last["data"].as_array().unwrap().len(), 2, "{file}: the last page");
            assert_eq!(last["positions"], serde_json::json!([rows - 2, rows - 1]));
            // Sorted by the first column both ways: each the other reversed (ties by position aside).
            let col = t["columns"][0]["name"].as_str().unwrap();
            let up = v.json(&format!("/api/table?file={}&sort={}&limit=500", enc(file), enc(col)));
            let down = v.json(&format!("/api/table?file={}&sort={}&desc=true&limit=500", enc(file), enc(col)));
            let key = |t: &Value, i: usize| t["data"][i][col].to_string();
            let n = up["data"].as_array().unwrap().len();
            if n == *rows as usize {
                assert_eq!(key(&up, 0), key(&down, n - 1), "{file} sorted by {col}");
                assert_eq!(key(&up, n - 1), key(&down, 0), "{file} sorted by {col}");
            }
            // A filter by a value of the first row finds that row.
            if let Some(text) = t["data"][0][col].as_str().filter(|s| s.len() >= 3) {
                let probe: String = text.chars().take(24).collect::<String>().to_uppercase();
                let f = v.json(&format!("/api/table?file={}&q={}&limit=500", enc(file), enc(&probe)));
                assert!(f["matched"].as_u64().unwrap() >= 1, "{file}: filter {probe:?}");
                assert!(
                    f["positions"].as_array().unwrap().contains(&Value::from(0)),
                    "{file}: filter {probe:?} misses row 0"
                );
            }
        }
    }
    for s in stages {
        let name = s["name"].as_str().unwrap();
        let f = v.json(&format!("/api/failures?stage={}", enc(name)));
        let listed = s["failures"]["rows"].as_u64().unwrap_or(0);
        assert_eq!(f["rows"].as_u64().unwrap(), listed, "{name}: failures");
        let grouped: u64 = f["groups"].as_array().unwrap().iter().map(|g| g["count"].as_u64().unwrap()).sum();
        assert_eq!(grouped, listed, "{name}: every failure in one group");
    }
    let reports = v.json("/api/reports");
    for f in reports["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        let (status, text) = v.get(&format!("/api/file/{path}"));
        assert_eq!(status, 200, "{path}");
        // The figures a Markdown report draws beside it: served as sandboxed SVG images.
        for figure in text.lines().filter_map(|l| l.trim().strip_prefix("![")?.split_once("](")?.1.strip_suffix(')')) {
            if !figure.ends_with(".svg") {
                continue;
            }
            let dir = Path::new(path).parent().unwrap().to_str().unwrap();
            let at = if dir.is_empty() { figure.to_string() } else { format!("{dir}/{figure}") };
            let mut s = TcpStream::connect(&v.addr).unwrap();
            write!(s, "GET /api/file/{at} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", v.addr).unwrap();
            let mut raw = String::new();
            s.read_to_string(&mut raw).unwrap();
            let head = raw.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
            assert!(
                head.starts_with("http/1.1 200") && head.contains("image/svg+xml"),
                "{pipeline}: figure {at}: {head}"
            );
            assert!(head.contains("sandbox") && raw.contains("<svg"), "{pipeline}: figure {at} not a sandboxed SVG");
        }
    }
    let snaps = v.json("/api/snapshots");
    assert!(snaps["snapshots"].is_array());
    (dir, run)
}

#[test]
fn every_endpoint_answers_on_rolemrc_offline_outputs_with_chats_pairs_and_provenance() {
    let (dir, run) = check_every_endpoint("rolemrc.toml");
    let out = dir.path().join("out");
    let v = Viewer::start(&out, &[]);
    // The dataset card is the first report.
    let reports = v.json("/api/reports");
    assert_eq!(reports["files"][0]["path"], "README.md", "{reports}");
    let (_, card) = v.get("/api/file/README.md");
    assert!(card.contains("RoleMRC") || card.contains("rolemrc"), "{card}");
    // A DPO pair: a prompt as a chat, chosen and rejected texts.
    let dpo = v.json("/api/table?file=dpo.parquet&limit=1");
    let pair = &dpo["data"][0];
    assert!(
        pair["prompt"].as_array().is_some_and(|m| m.iter().all(|m| m["role"].is_string() && m["content"].is_string()))
    );
    assert!(pair["chosen"].is_string() && pair["rejected"].is_string());
    // Its profile is one click away: the lookup finds the profile row by id.
    let profile = pair["profile_id"].as_str().unwrap();
    let found = v.json(&format!("/api/lookup?id={}", enc(profile)));
    let stages: Vec<&str> = found["found"].as_array().unwrap().iter().map(|f| f["stage"].as_str().unwrap()).collect();
    assert!(stages.iter().any(|s| s.starts_with("profiles")), "{profile} found in {stages:?}");
    assert!(run["stages"].as_array().unwrap().iter().any(|s| s["name"] == "sft"));
}

#[test]
fn every_endpoint_answers_on_roleeval_characterbench_and_sharp_offline_outputs() {
    for pipeline in ["roleeval.toml", "characterbench.toml", "sharp.toml"] {
        check_every_endpoint(pipeline);
    }
}

/// A run of a pipeline reading N people (and `more` stages) into `out/`.
fn people_run(n: usize, more: &str, env: &[(&str, &str)]) -> Project {
    let p = Project::new();
    p.write("people.jsonl", support::people_jsonl(n));
    p.write(
        "p.toml",
        format!(
            "[pipeline]\nname = \"v\"\noutput_dir = \"out\"\n[stages.people]\nkind = \"source\"\npath = \"people.jsonl\"\n{more}"
        ),
    );
    p.synth_env(&["run", "p.toml", "-q"], env).ok();
    p
}

#[test]
fn paths_outside_the_directory_are_not_served() {
    let p = people_run(5, "", &[]);
    let out = p.path().join("out");
    p.write("outside.md", "NOT FOR THE PAGE");
    p.write("outside.parquet", "NOT FOR THE PAGE");
    std::os::unix::fs::symlink(p.path().join("outside.md"), out.join("link.md")).unwrap();
    std::os::unix::fs::symlink(p.path().join("outside.parquet"), out.join("link.parquet")).unwrap();
    std::fs::write(out.join("notes.md"), "inside").unwrap();
    let v = Viewer::start(&out, &[]);
    assert_eq!(v.get("/api/file/notes.md"), (200, "inside".to_string()));
    for path in [
        "/api/file/../outside.md",
        "/api/file/..%2Foutside.md",
        "/api/file/%2E%2E/outside.md",
        "/api/file//etc/passwd",
        "/api/file/%2Fetc%2Fpasswd",
        "/api/file/link.md",
        "/api/file/_synth/journal.log",
        "/api/table?file=..%2Foutside.parquet",
        "/api/table?file=%2Fetc%2Fpasswd",
        "/api/table?file=link.parquet",
        "/../outside.md",
        "/nothing-here",
    ] {
        let (status, body) = v.get(path);
        assert_eq!(status, 404, "{path}: {body}");
        assert!(!body.contains("NOT FOR THE PAGE") && !body.contains("root:"), "{path}: {body}");
    }
}

/// A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) sends its own
/// name as Host: refused, for the page and for the data; a state file being written is not
/// listed as a stage.
#[test]
fn a_foreign_host_is_refused_and_a_file_being_written_is_no_stage() {
    let p = people_run(5, "", &[]);
    let out = p.path().join("out");
    let state = out.join("_synth/state");
    std::fs::copy(state.join("people.json"), state.join(".synth-tmp-99-0a0b0c0d-people.json")).unwrap();
    let v = Viewer::start(&out, &[]);
    let port = v.addr.rsplit(':').next().unwrap().to_string();
    for path in ["/", "/api/run", "/api/table?file=people.parquet", "/api/file/manifest.json"] {
        let (status, body) = v.get_as(path, &format!("rebound.example:{port}"));
        assert_eq!(status, 403, "{path}: {body}");
        assert!(!body.contains("people"), "{path}: {body}");
        assert_eq!(v.get_as(path, &format!("localhost:{port}")).0, 200, "{path}");
    }
    assert_eq!(v.get_as("/api/run", "127.0.0.1:1").0, 403, "another port");
    let run = v.json("/api/run");
    let names: Vec<&str> = run["stages"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["people"], "{run}");
}

/// The scrubbing of a bearer token stops at the token: the JSONL records after it are shown.
#[test]
fn a_bearer_token_is_hidden_and_the_records_after_it_are_not() {
    let p = people_run(3, "", &[]);
    let out = p.path().join("out");
    std::fs::write(
        out.join("calls.jsonl"),
        "{\"id\": \"a\", \"header\": \"Bearer abc123token\"}\n{\"id\": \"b\", \"text\": \"second record\"}\n",
    )
    .unwrap();
    let v = Viewer::start(&out, &[]);
    let (status, body) = v.get("/api/file/calls.jsonl");
    assert_eq!(status, 200);
    assert!(!body.contains("abc123token"), "{body}");
    assert!(body.contains("Bearer ***") && body.contains("second record") && body.contains("\"id\": \"b\""), "{body}");
}

#[test]
fn no_secret_from_the_environment_or_the_files_reaches_the_page() {
    const KEY: &str = "sk-view-secret-0123456789abcdef";
    let p = people_run(5, "", &[("OPENAI_API_KEY", KEY)]);
    let out = p.path().join("out");
    // A report that quotes the key (a user's note, a tool's log).
    std::fs::write(out.join("notes.md"), format!("key used: {KEY}\nand bare: view-only-token-abcdefgh\n")).unwrap();
    let v = Viewer::start(&out, &[("OPENAI_API_KEY", KEY), ("MY_SERVICE_TOKEN", "view-only-token-abcdefgh")]);
    for path in ["/api/run", "/api/reports", "/api/file/notes.md", "/api/table?file=people.parquet"] {
        let (status, body) = v.get(path);
        assert_eq!(status, 200, "{path}");
        assert!(!body.contains(KEY) && !body.contains("view-only-token-abcdefgh"), "{path} shows a secret: {body}");
    }
    let (_, notes) = v.get("/api/file/notes.md");
    assert!(notes.contains("***"), "{notes}");
}

#[test]
fn a_corrupt_or_unfinished_parquet_fails_its_own_view_only() {
    let p = people_run(20, "[stages.again]\nkind = \"source\"\npath = \"people.jsonl\"\n", &[]);
    let out = p.path().join("out");
    // Half a file: the footer is missing, as while a writer is still at it.
    let whole = std::fs::read(out.join("again.parquet")).unwrap();
    std::fs::write(out.join("again.parquet"), &whole[..whole.len() / 2]).unwrap();
    let v = Viewer::start(&out, &[]);
    let (status, body) = v.get("/api/table?file=again.parquet");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("again.parquet") && body.contains("Parquet"), "{body}");
    assert_eq!(v.json("/api/table?file=people.parquet")["rows"], 20);
    assert_eq!(v.get("/api/run").0, 200);
}

/// A filter over a table of several scan pieces: the first answer holds what was found so
/// far (a prefix of the matches, in order) or all of it; asked again, the count becomes final
/// and every match is there, in order, on every page, sorted or not.
#[test]
fn a_filter_over_a_big_table_answers_early_then_in_full() {
    let n = 200_000u64;
    let p = people_run(n as usize, "", &[]);
    let v = Viewer::start(&p.path().join("out"), &[]);
    let expected: Vec<u64> = (0..n).filter(|i| format!("p{i}").contains("p1234")).collect();
    assert_eq!(expected.len(), 111);
    let positions =
        |t: &Value| -> Vec<u64> { t["positions"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect() };
    let url = |offset: usize| format!("/api/table?file=people.parquet&q=P1234&limit=50&offset={offset}");
    let first = v.json(&url(0));
    let shown = positions(&first);
    assert_eq!(shown[..], expected[..shown.len()], "what is shown first is where the matches start");
    assert!(first["matched"].as_u64().unwrap() <= 111);
    if first["complete"] == true {
        assert_eq!(first["matched"], 111);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let whole = loop {
        let t = v.json(&url(0));
        if t["complete"] == true {
            break t;
        }
        assert!(t["scanned"].as_u64().unwrap() < n);
        assert!(Instant::now() < deadline, "the search never completed: {t}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(whole["matched"], 111);
    assert_eq!(whole["scanned"], n);
    assert_eq!(positions(&whole), expected[..50]);
    assert_eq!(positions(&v.json(&url(100))), expected[100..]);
    let names: Vec<&str> = whole["data"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert!(names.iter().all(|n| n.contains("p1234")), "{names:?}");
    let sorted = v.json("/api/table?file=people.parquet&q=p1234&sort=name&desc=true&limit=200");
    assert_eq!(sorted["matched"], 111);
    let mut got = positions(&sorted);
    got.sort_unstable();
    assert_eq!(got, expected);
}

#[test]
fn a_directory_that_is_not_a_run_is_refused_with_a_message() {
    let p = Project::new();
    p.write("x/a.txt", "a");
    let o = p.synth(&["view", "x", "--port", "0"]).code(78);
    assert!(o.stderr.contains("not a synth output directory"), "{}", o.stderr);
    // A directory no run has written yet is watched, not refused (a run about to start).
    let v = Viewer::start(&p.path().join("nowhere/out"), &[]);
    let run = v.json("/api/run");
    assert_eq!(run["waiting"], true, "{run}");
    assert_eq!(run["stages"], serde_json::json!([]), "{run}");
}

/// While a run goes on, the page's state shows its running stage and its count moving,
/// and the event stream sends the change without being asked.
#[test]
fn the_page_follows_a_running_stage() {
    use crate::support::openai_server::{self, Behaviour};
    let server = openai_server::start(Behaviour { latency: Duration::from_millis(60), ..Default::default() });
    let p = Project::new();
    p.write(
        "people.jsonl",
        (0..100).map(|i| format!("{{\"id\": \"r{i}\", \"name\": \"p{i}\"}}\n")).collect::<String>(),
    );
    p.write("prompt.j2", "Say hello to {{ name }}.\n");
    p.write(
        "p.toml",
        format!(
            "[pipeline]\nname = \"live\"\noutput_dir = \"out\"\n\
             [providers.api]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"SYNTH_TEST_KEY\"\n\
             max_concurrency = 1\ninitial_concurrency = 1\n\
             [stages.people]\nkind = \"source\"\npath = \"people.jsonl\"\n\
             [stages.hello]\nkind = \"llm\"\ninputs = [\"people\"]\nprovider = \"api\"\nprompt = \"prompt.j2\"\n",
            server.base_url()
        ),
    );
    let mut child = p.spawn_env(&["run", "p.toml", "-q"], &[("SYNTH_TEST_KEY", "k-0123456789")]);
    let out = p.path().join("out");
    // The viewer starts once the directory is a run's (its first stage committed).
    let wait = Instant::now();
    while !out.join("_synth/state/people.json").exists() && wait.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = Viewer::start(&out, &[]);
    let mut events = TcpStream::connect(&v.addr).unwrap();
    events.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(events, "GET /api/events HTTP/1.1\r\nHost: {}\r\n\r\n", v.addr).unwrap();
    let started = Instant::now();
    let mut seen: Vec<u64> = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        let run = v.json("/api/run");
        if let Some(s) =
            run["stages"].as_array().unwrap().iter().find(|s| s["name"] == "hello" && s["status"] == "running")
        {
            assert_eq!(run["status"], "running");
            let done = s["live"]["done"].as_u64().unwrap();
            if seen.last() != Some(&done) {
                seen.push(done);
            }
            if seen.len() >= 3 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(seen.len() >= 3, "the running stage's count did not move on the page: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // The event stream carried more than its first state.
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && String::from_utf8_lossy(&got).matches("event: run").count() < 2 {
        match events.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("text/event-stream"), "{text}");
    assert!(text.matches("event: run").count() >= 2, "one event only: {text}");
    assert!(child.wait().unwrap().success());
    let run = v.json("/api/run");
    assert_eq!(run["status"], "ok");
    let hello = run["stages"].as_array().unwrap().iter().find(|s| s["name"] == "hello").unwrap().clone();
    assert_eq!(hello["report"]["rows_out"], 100, "{hello}");
}

/// Headless Chromium (Debian's `chromium`, installed by `.ci/setup-browser`).
/// Whether the browser tests can run: Chromium and chromedriver are installed. A non-root
/// user without them (`.ci/setup-browser` installs Debian's packages as root) skips them
/// with a printed reason; as root their absence is an error (CI installs them).
fn browser_or_skip() -> bool {
    let found = |names: &[&str]| {
        names.iter().any(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
    };
    if found(&["chromium", "chromium-browser", "google-chrome"])
        && found(&["chromedriver", "/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver"])
    {
        return true;
    }
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    assert!(
        !root,
        "no Chromium / chromedriver: .ci/setup-browser installs Debian's chromium and chromium-driver (the README's test command runs it)"
    );
    eprintln!(
        "SKIPPED: no Chromium / chromedriver and not root to install them (apt-get install chromium chromium-driver, or run .ci/setup-browser as root)"
    );
    false
}

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return c.to_string();
        }
    }
    panic!("no Chromium: .ci/setup-browser installs Debian's chromium package (the README's test command runs it)");
}

/// Load `url` in headless Chromium until its requests are done: the DOM as it is then,
/// and a screenshot of the window.
fn browse(browser: &str, url: &str, screenshot: &Path) -> String {
    let run = |extra: &[&str]| {
        let o = Command::new("timeout")
            .arg("90")
            .arg(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"])
            .args(["--virtual-time-budget=10000", "--window-size=1360,900"])
            .args(extra)
            .arg(url)
            .current_dir(screenshot.parent().unwrap())
            .output()
            .unwrap();
        assert!(o.status.success(), "{browser} {url}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let dom = run(&["--dump-dom"]);
    run(&[&format!("--screenshot={}", screenshot.display())]);
    let png = std::fs::read(screenshot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{}: not a screenshot", screenshot.display());
    dom
}

/// Text as the DOM serializes it.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\u{a0}', "&nbsp;")
}

/// The page in a real browser: the run, a DPO pair (prompt as a chat, chosen beside
/// rejected) and a failure (its reason group, message and the model's answer), the text
/// on screen checked and each page's screenshot saved (`target/view-screenshots/`; with
/// SYNTH_SCREENSHOTS_TO_DOCS=1 also `docs/images/`, the README's pictures).
#[test]
fn the_page_in_a_real_browser_shows_a_dpo_pair_and_a_failure() {
    if !browser_or_skip() {
        return;
    }
    let browser = chromium();
    let shots = support::repo().join("target/view-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    offline_run("rolemrc.toml", &out);
    let v = Viewer::start(&out, &[]);
    let base = format!("http://{}/?live=0", v.addr);

    let dom = browse(&browser, &format!("{base}#run"), &shots.join("view-run.png"));
    assert!(dom.contains("id=\"stage-sft\"") && dom.contains("rolemrc"), "the run page: {dom}");
    // The drawn graph: a box per stage, an arrow per input of a stage.
    let run = v.json("/api/run");
    let stages = run["stages"].as_array().unwrap();
    let links: usize = stages.iter().map(|s| s["inputs"].as_array().map_or(0, |i| i.len())).sum();
    assert!(dom.contains("id=\"graph\""), "no stage graph: {dom}");
    assert_eq!(dom.matches("class=\"node").count(), stages.len(), "a box per stage");
    assert_eq!(dom.matches("class=\"edge\"").count(), links, "an arrow per input");
    assert!(dom.contains("data-stage=\"sft\"") && dom.contains("data-from=\"profiles\""), "{dom}");

    let pair = v.json("/api/table?file=dpo.parquet&limit=1")["data"][0].clone();
    let dom = browse(&browser, &format!("{base}#data?file=dpo.parquet&row=0"), &shots.join("view-dpo.png"));
    assert!(dom.contains("id=\"dpo-pair\""), "no DPO pair on screen: {dom}");
    for side in ["chosen", "rejected"] {
        let text: String = pair[side].as_str().unwrap().chars().take(40).collect();
        assert!(dom.contains(&html_text(&text)), "{side} text {text:?} not on screen");
    }
    let first_prompt: String = pair["prompt"][0]["content"].as_str().unwrap().chars().take(40).collect();
    assert!(dom.contains(&html_text(&first_prompt)), "the prompt's first message not on screen");

    // The card's tables as tables, each numeric column charted by row.
    let dom = browse(&browser, &format!("{base}#reports?file=README.md"), &shots.join("view-report.png"));
    assert!(dom.contains("class=\"md-table\"") && dom.contains("<th>Category</th>"), "the card's table: {dom}");
    assert!(
        dom.matches("class=\"table-chart\"").count() >= 4,
        "a chart per numeric column (S, P, #Turns, #Words): {dom}"
    );

    // A run with failures: records the server refuses.
    let (p, failed) = refused_run(12);
    assert_eq!(failed.len(), 3, "{failed:?}");
    let w = Viewer::start(&p.path().join("out"), &[]);
    let dom =
        browse(&browser, &format!("http://{}/?live=0#failures?stage=answers", w.addr), &shots.join("view-failure.png"));
    assert!(dom.contains("id=\"groups\"") && dom.contains("class=\"detail failure\""), "no failure on screen: {dom}");
    assert!(dom.contains(">3</span>"), "the group's count (3) not on screen");
    for (id, message) in &failed {
        assert!(dom.contains(&format!("<b>{id}</b>")), "failure {id} not on screen");
        let m: String = message.chars().take(30).collect();
        assert!(dom.contains(&html_text(&m)), "message {m:?} not on screen");
    }
    if std::env::var_os("SYNTH_SCREENSHOTS_TO_DOCS").is_some() {
        let docs = support::repo().join("docs/images");
        std::fs::create_dir_all(&docs).unwrap();
        for f in ["view-run.png", "view-dpo.png", "view-failure.png"] {
            std::fs::copy(shots.join(f), docs.join(f)).unwrap();
        }
    }
    for f in ["view-run.png", "view-dpo.png", "view-failure.png"] {
        assert!(support::repo().join("docs/images").join(f).is_file(), "docs/images/{f}: the README's screenshot");
    }
}

/// A WebDriver session of chromedriver (Debian's `chromium-driver`, installed by
/// `.ci/setup-browser`) driving headless Chromium, spoken to over plain HTTP; the driver
/// is killed when dropped.
struct Driver {
    child: Child,
    addr: String,
    session: String,
}

impl Driver {
    fn start() -> Driver {
        let bin = ["chromedriver", "/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver"]
            .into_iter()
            .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("no chromedriver: .ci/setup-browser installs Debian's chromium-driver (the README's test command runs it)");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(bin)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Driver { child, addr: format!("127.0.0.1:{port}"), session: String::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&d.addr).is_err() || d.call("GET", "/status", None)["value"]["ready"] != true {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1360,900"]}}}});
        let made = d.call("POST", "/session", Some(caps));
        d.session = made["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {made}")).to_string();
        d
    }

    /// One WebDriver command: its JSON answer.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        // Read the answer by its Content-Length (chromedriver keeps the connection open).
        let mut raw = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = s.read(&mut buf).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok()).flatten()
                });
                let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
                let whole = match length {
                    Some(l) => body.len() >= l,
                    None => chunked && body.ends_with("0\r\n\r\n"),
                };
                if whole || n == 0 {
                    let body = if chunked { dechunk(body) } else { body.to_string() };
                    return serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
                }
            }
            assert!(n > 0, "{method} {path}: the connection closed: {text}");
        }
    }

    fn on(&self, command: &str) -> String {
        format!("/session/{}{command}", self.session)
    }

    fn open(&self, url: &str) {
        self.call("POST", &self.on("/url"), Some(serde_json::json!({ "url": url })));
    }

    /// The element an XPath finds, waiting for the page to render it.
    fn find(&self, xpath: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r =
                self.call("POST", &self.on("/element"), Some(serde_json::json!({"using": "xpath", "value": xpath})));
            // The W3C WebDriver element reference key.
            if let Some(id) = r["value"]["element-6066-11e4-a52e-4f735466cecf"].as_str() {
                return id.to_string();
            }
            assert!(Instant::now() < deadline, "nothing on screen matches {xpath}: {}", self.source());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Act on the element an XPath finds; found again when the page re-rendered it in between
    /// (the run page redraws on every event of a live run).
    fn on_element(&self, xpath: &str, method: &str, action: &str, body: Option<Value>) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let id = self.find(xpath);
            let r = self.call(method, &self.on(&format!("/element/{id}{action}")), body.clone());
            if r["value"]["error"] != "stale element reference" {
                assert!(r["value"]["error"].is_null(), "{action} on {xpath}: {r}");
                return r;
            }
            assert!(Instant::now() < deadline, "{xpath} kept going stale");
        }
    }

    fn click(&self, xpath: &str) {
        self.on_element(xpath, "POST", "/click", Some(serde_json::json!({})));
    }

    fn text(&self, xpath: &str) -> String {
        self.on_element(xpath, "GET", "/text", None)["value"].as_str().unwrap().to_string()
    }

    fn source(&self) -> String {
        self.call("GET", &self.on("/source"), None)["value"].as_str().unwrap_or_default().to_string()
    }

    /// Type `keys` as a person does (key down, key up, one after another) into the page.
    fn keys(&self, keys: &str) {
        let actions: Vec<Value> = keys
            .chars()
            .flat_map(|c| {
                [
                    serde_json::json!({"type": "keyDown", "value": c.to_string()}),
                    serde_json::json!({"type": "keyUp", "value": c.to_string()}),
                ]
            })
            .collect();
        let r = self.call(
            "POST",
            &self.on("/actions"),
            Some(serde_json::json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})),
        );
        assert!(r["value"]["error"].is_null(), "keys {keys:?}: {r}");
    }

    /// Run a script in the page: what it returns.
    fn execute(&self, script: &str) -> Value {
        let r = self.call("POST", &self.on("/execute/sync"), Some(serde_json::json!({"script": script, "args": []})));
        assert!(r["value"]["error"].is_null() || !r["value"].is_object(), "{script}: {r}");
        r["value"].clone()
    }

    fn resize(&self, width: u32, height: u32) {
        self.call("POST", &self.on("/window/rect"), Some(serde_json::json!({"width": width, "height": height})));
    }

    fn screenshot(&self, to: &Path) {
        use base64::Engine as _;
        let png = self.call("GET", &self.on("/screenshot"), None)["value"].as_str().unwrap().to_string();
        let png = base64::engine::general_purpose::STANDARD.decode(png).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{}: not a PNG", to.display());
        std::fs::write(to, png).unwrap();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call("DELETE", &self.on(""), None)));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A browser test's start: RoleMRC's offline outputs in a fresh project, a viewer over them
/// (with `env`), a WebDriver session and the screenshots' folder; `None` when the test skips
/// (no browser and not root).
struct Browsed {
    _project: Project,
    out: std::path::PathBuf,
    shots: std::path::PathBuf,
    v: Viewer,
    d: Driver,
}

fn browse_rolemrc(env: &[(&str, &str)]) -> Option<Browsed> {
    if !browser_or_skip() {
        return None;
    }
    let shots = support::repo().join("target/view-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let project = Project::new();
    let out = project.path().join("out");
    offline_run("rolemrc.toml", &out);
    let v = Viewer::start(&out, env);
    let d = Driver::start();
    Some(Browsed { _project: project, out, shots, v, d })
}

/// The page used as a person uses it, by clicks in a real browser: from the run page of
/// RoleMRC's outputs, the DPO output's link, then its first row: the pair on screen; from
/// the run page of a run with failures, its failed count: the failures on screen.
#[test]
fn clicking_through_the_page_reaches_a_dpo_pair_and_a_failure() {
    // The project is bound: its fields left to `..` would be dropped (its folder deleted) here.
    let Some(Browsed { shots, v, d, _project, .. }) = browse_rolemrc(&[]) else { return };
    d.open(&format!("http://{}/", v.addr));
    d.click("//tr[@id='stage-dpo']//a[normalize-space()='dpo.parquet']");
    d.click("(//table[@id='rows']//tr[contains(@class,'pick')])[1]");
    let pair = v.json("/api/table?file=dpo.parquet&limit=1")["data"][0].clone();
    let shown = d.text("//div[@id='dpo-pair']");
    for side in ["chosen", "rejected"] {
        let text: String = pair[side].as_str().unwrap().split_whitespace().take(6).collect::<Vec<_>>().join(" ");
        assert!(
            shown.split_whitespace().collect::<Vec<_>>().join(" ").contains(&text),
            "{side} {text:?} not in {shown:?}"
        );
    }
    d.screenshot(&shots.join("view-clicked-dpo.png"));
    // Back to the run, its graph: a click on a stage's box marks its row.
    d.click("//nav//a[normalize-space()='Run']");
    d.click("//*[local-name()='g' and @data-stage='sft']");
    d.find("//tr[@id='stage-sft' and contains(@class,'hl')]");

    // A run with failures: the failed count leads to them.
    let (f, failed) = refused_run(8);
    assert_eq!(failed.len(), 2, "{failed:?}");
    let w = Viewer::start(&f.path().join("out"), &[]);
    d.open(&format!("http://{}/", w.addr));
    // The stage with failures is not drawn as all well.
    d.find("//*[local-name()='g' and @data-stage='answers' and contains(@class,'has-failures') and @data-stroke!='#2e7d32']");
    d.click("//tr[@id='stage-answers']/td[7]/a");
    d.find("//div[@id='groups']");
    for (id, message) in &failed {
        let shown = d.text(&format!("//div[contains(@class,'failure')][.//b[normalize-space()='{id}']]"));
        let m: String = message.split_whitespace().take(5).collect::<Vec<_>>().join(" ");
        assert!(
            shown.split_whitespace().collect::<Vec<_>>().join(" ").contains(&m),
            "failure {id}: {m:?} not in {shown:?}"
        );
    }
    d.screenshot(&shots.join("view-clicked-failure.png"));
    // The desk on the failures list: the first failure is the current one; `x` drops it.
    d.find("//div[contains(@class,'failure') and contains(@class,'current')]");
    d.keys("x");
    d.find("//div[contains(@class,'failure')]//span[contains(@class,'verdict-drop')]");
    let line: Value =
        serde_json::from_str(std::fs::read_to_string(f.path().join("out/review.jsonl")).unwrap().trim()).unwrap();
    assert_eq!(line["decision"], "drop", "{line}");
    assert_eq!(line["stage"], "answers.failures", "{line}");
    assert!(failed.iter().any(|(id, _)| line["id"] == id.as_str()), "{line}");
}

/// A run of `n` records through a loopback server that refuses every fourth (`r0`, `r4`, …):
/// the project (its outputs in `out/`) and (id, message) of each failure of `answers`.
fn refused_run(n: usize) -> (Project, Vec<(String, String)>) {
    use crate::support::openai_server::{self, Behaviour};
    let server = openai_server::start(Behaviour { reject_marker: Some("REFUSE".into()), ..Default::default() });
    let p = Project::new();
    p.write(
        "r.jsonl",
        (0..n)
            .map(|i| {
                format!("{{\"id\": \"r{i}\", \"ask\": \"{}\"}}\n", if i % 4 == 0 { "REFUSE this" } else { "fine" })
            })
            .collect::<String>(),
    );
    p.write("prompt.j2", "Echo {{ ask }}.\n");
    p.write(
        "p.toml",
        format!(
            "[pipeline]\nname = \"fails\"\noutput_dir = \"out\"\n\
             [providers.api]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"SYNTH_TEST_KEY\"\n\
             [stages.r]\nkind = \"source\"\npath = \"r.jsonl\"\n\
             [stages.answers]\nkind = \"llm\"\ninputs = [\"r\"]\nprovider = \"api\"\nprompt = \"prompt.j2\"\nmax_failure_ratio = 0.5\n\
             [stages.export]\nkind = \"jsonl\"\ninputs = [\"answers\"]\n",
            server.base_url()
        ),
    );
    let r = p.synth_env(&["run", "p.toml", "-q"], &[("SYNTH_TEST_KEY", "k-0123456789")]);
    let failed = v_failures(&p.path().join("out"));
    assert_eq!(failed.len(), n.div_ceil(4), "{failed:?}: exit {}: {}", r.code, r.stderr);
    (p, failed)
}

/// (id, message) of each failure of the `answers` stage.
fn v_failures(out: &Path) -> Vec<(String, String)> {
    support::failures(out, "answers")
        .into_iter()
        .map(|f| (f["id"].as_str().unwrap().to_string(), f["message"].as_str().unwrap().to_string()))
        .collect()
}

/// Two releases of `synth regenerate`: both listed, the later one marked latest, and the
/// rows added, removed and changed between them.
#[test]
fn snapshots_are_listed_and_diffed() {
    let p = Project::new();
    let rows = |list: &[(&str, &str)]| -> String {
        list.iter().map(|(id, name)| format!("{{\"id\": \"{id}\", \"name\": \"{name}\"}}\n")).collect()
    };
    p.write("people.jsonl", rows(&[("a", "ann"), ("b", "bob"), ("c", "cy")]));
    p.write(
        "p.toml",
        "[pipeline]\nname = \"snaps\"\noutput_dir = \"out\"\n[stages.people]\nkind = \"source\"\npath = \"people.jsonl\"\n\
         [stages.people_jsonl]\nkind = \"jsonl\"\ninputs = [\"people\"]\n",
    );
    p.synth(&["regenerate", "p.toml", "--snapshot"]).ok();
    p.write("people.jsonl", rows(&[("a", "ann"), ("b", "bobby"), ("d", "dee")]));
    p.synth(&["regenerate", "p.toml", "--snapshot"]).ok();
    let v = Viewer::start(&p.path().join("out"), &[]);
    assert!(v.addr.starts_with("127.0.0.1:"), "binds loopback by default: {}", v.addr);
    let s = v.json("/api/snapshots");
    let list = s["snapshots"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{s}");
    let (first, second) = (list[0]["id"].as_str().unwrap(), list[1]["id"].as_str().unwrap());
    assert_eq!(s["latest"], second, "{s}");
    let d = v.json(&format!("/api/snapshots/diff?old={}&new={}&ids=10", enc(first), enc(second)));
    let e = &d["exports"][0];
    assert_eq!(
        (e["added"].as_u64(), e["removed"].as_u64(), e["changed"].as_u64(), e["unchanged"].as_u64()),
        (Some(1), Some(1), Some(1), Some(1)),
        "{d}"
    );
    assert_eq!(e["added_ids"], serde_json::json!(["d"]), "{d}");
    assert_eq!(v.get("/api/snapshots/diff?new=no-such-snapshot").0, 404);
}

/// The conversations of a JSONL export (RoleMRC's `sft.jsonl` holds only them), in order.
fn jsonl_conversations(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["conversations"].to_string())
        .collect()
}

/// id → conversation of each row of a stage's Parquet output.
fn conversations_by_id(path: &Path) -> std::collections::BTreeMap<String, String> {
    support::parquet_rows(path)
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r["conversations"].to_string()))
        .collect()
}

/// The reviewer's desk in a real browser, by keyboard: in `sft.parquet` the first row
/// dropped, the second dropped, the third kept (`x`, `x`, `a`); the page says "reviewed 3";
/// the review file holds the three; a run started afterwards applies them: the two are gone
/// from `sft.jsonl` and spares took their places.
#[test]
fn the_reviewers_desk_drops_two_keeps_one_by_keyboard_and_the_next_run_applies_it() {
    let Some(Browsed { out, shots, v, d, _project }) = browse_rolemrc(&[("SYNTH_REVIEWER", "ana")]) else { return };
    let before = jsonl_conversations(&out.join("sft.jsonl"));
    let conversation = conversations_by_id(&out.join("sft.parquet"));
    // The first sample of each group's train split (one spare per group in the demo plan: two
    // drops in one group would leave one place empty).
    let first: Vec<String> = v.json("/api/table?file=sft.parquet&q=train-00000&limit=3")["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    d.open(&format!("http://{}/#data?file=sft.parquet&q=train-00000&row=first", v.addr));
    for (i, key) in ["x", "x", "a"].into_iter().enumerate() {
        // Each key once the row it is meant for is on screen.
        d.find(&format!("//div[@id='detail']/h3[contains(., '· {}')]", first[i]));
        if i == 0 {
            d.click("//input[@id='note']");
            d.keys("generic reply");
            d.execute("document.activeElement.blur(); return true");
        }
        d.keys(key);
    }
    d.find(&format!("//div[@id='detail']/h3[not(contains(., '· {}'))]", first[2]));
    d.find("//b[@id='reviewed-count' and normalize-space()='3']");
    assert!(d.text("//span[@id='reviewed']").contains("2 dropped"), "{}", d.text("//span[@id='reviewed']"));
    d.screenshot(&shots.join("view-review.png"));
    if std::env::var_os("SYNTH_SCREENSHOTS_TO_DOCS").is_some() {
        std::fs::copy(shots.join("view-review.png"), support::repo().join("docs/images/view-review.png")).unwrap();
    }
    let review = std::fs::read_to_string(out.join("review.jsonl")).unwrap();
    let lines: Vec<Value> = review.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let said: Vec<(&str, &str)> =
        lines.iter().map(|l| (l["id"].as_str().unwrap(), l["decision"].as_str().unwrap())).collect();
    assert_eq!(said, [(first[0].as_str(), "drop"), (first[1].as_str(), "drop"), (first[2].as_str(), "keep")]);
    assert_eq!(lines[0]["note"], "generic reply", "{review}");
    assert!(lines.iter().all(|l| l["reviewer"] == "ana" && l["stage"] == "sft"), "{review}");

    // The next run applies the review: the two dropped are gone, spares took their places.
    offline_run("rolemrc.toml", &out);
    let after = jsonl_conversations(&out.join("sft.jsonl"));
    let ids = conversations_by_id(&out.join("sft.parquet"));
    assert!(!ids.contains_key(&first[0]) && !ids.contains_key(&first[1]) && ids.contains_key(&first[2]));
    assert!(
        !after.contains(&conversation[&first[0]]) && !after.contains(&conversation[&first[1]]),
        "a dropped sample is still in sft.jsonl"
    );
    assert!(after.contains(&conversation[&first[2]]), "the kept sample left sft.jsonl");
    assert_eq!(after.len(), before.len(), "spares took the dropped samples' places");
    let failed = support::failures(&out, "samples");
    let mut reviewed: Vec<&str> =
        failed.iter().filter(|f| f["kind"] == "review").map(|f| f["id"].as_str().unwrap()).collect();
    reviewed.sort_unstable();
    let mut dropped = [first[0].as_str(), first[1].as_str()];
    dropped.sort_unstable();
    assert_eq!(reviewed, dropped, "the two dropped, in the samples' failures with kind review");
    // The card counts them as the run applied them.
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("2 records were dropped in human review"), "{card}");
    // The page still counts the three reviewed (two of them no longer in the table).
    d.open(&format!("http://{}/#data?file=sft.parquet", v.addr));
    d.find("//b[@id='reviewed-count' and normalize-space()='3']");
}

/// What a person met on the data pages, in a real browser: a provenance link shows the
/// record it names; the table leads with the conversation, previewed, matches marked; the
/// row view hides empty fields; a facet's bar filters; a page past the end says so; a JSON
/// Lines report is a table; chart labels tell rows apart; the run page and its graph fit
/// 1,360 and 800 px without sideways scrolling.
#[test]
fn provenance_facets_and_the_narrow_page_in_a_real_browser() {
    // The project is bound: its fields left to `..` would be dropped (its folder deleted) here.
    let Some(Browsed { shots, v, d, _project, .. }) = browse_rolemrc(&[]) else { return };
    let base = format!("http://{}/", v.addr);

    // Provenance: the DPO pair's profile, looked up.
    let pair = v.json("/api/table?file=dpo.parquet&limit=1")["data"][0].clone();
    let profile = pair["profile_id"].as_str().unwrap();
    d.open(&format!("{base}#data?file=dpo.parquet&row=0"));
    d.click(&format!("//a[@data-id='{profile}']"));
    // The lookup answers after the click: wait for its result before reading the panel
    // (read at once, it may still say "looking up …", as it did once in CI).
    d.find("//div[@id='provenance']//div[contains(@class,'found')]/a[starts-with(normalize-space(), 'profiles')]");
    let found = d.text("//div[@id='provenance']");
    assert!(found.contains(&format!("provenance: {profile}")), "{found}");
    assert!(
        found.matches(&format!("\"id\": \"{profile}\"")).count() >= 2,
        "the record, in each stage that has it: {found}"
    );
    assert!(!d.text("//div[@id='provenance']").contains("[object"), "{}", d.text("//div[@id='provenance']"));

    // The SFT table leads with its conversation, previewed (not raw JSON); a filter's
    // matches are marked; the row view lists no empty field.
    let word = {
        let sft = v.json("/api/table?file=sft.parquet&limit=1")["data"][0].clone();
        let texts: Vec<String> = sft["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        let last = texts.last().unwrap().clone();
        last.split(|c: char| !c.is_alphabetic())
            .find(|w| w.len() >= 6)
            .unwrap_or_else(|| panic!("a word in {last:?}"))
            .to_string()
    };
    d.open(&format!("{base}#data?file=sft.parquet&q={}", enc(&word)));
    d.find("//table[@id='rows']//mark");
    assert_eq!(d.text("(//table[@id='rows']//th)[3]"), "conversations");
    d.find("(//table[@id='rows']//tr[contains(@class,'pick')])[1]/td[3]//div[contains(@class,'preview')]");
    d.click("(//table[@id='rows']//tr[contains(@class,'pick')])[1]");
    d.find("//div[@id='detail']//mark");
    let empty = d.execute(
        "return [...document.querySelectorAll('#fields tr td:nth-child(2)')].filter(td => !td.textContent.trim()).length",
    );
    assert_eq!(empty, 0, "the row view lists empty fields");

    // A facet of a short column: its values counted; a click filters the table by one.
    let facet = v.json("/api/facets?file=samples.parquet&column=group");
    assert_eq!(facet["kind"], "values", "{facet}");
    let (value, count) = (facet["values"][0]["value"].as_str().unwrap(), facet["values"][0]["count"].as_u64().unwrap());
    d.open(&format!("{base}#data?file=samples.parquet&fc=group"));
    d.click(&format!("//div[@id='facets']//div[contains(@class,'facet')][@title='{value}']"));
    d.find("//span[@id='facet-chip']");
    let info = d.text("//span[@id='pageinfo']");
    assert!(info.contains(&format!("{count} of ")), "{info} (the facet counted {count})");

    // A page past the end says so.
    d.open(&format!("{base}#data?file=sft.parquet&offset=49950"));
    assert!(d.text("//div[@id='past-end']").contains("past the last page"));

    // A JSON Lines report is a table of its records.
    d.open(&format!("{base}#reports?file=test.jsonl"));
    d.find("//div[@id='report']//table//th[normalize-space()='task']");
    // Chart labels in one chart are all different.
    d.open(&format!("{base}#reports?file=README.md"));
    d.find("//*[contains(@class,'chart-label')]");
    let repeated = d.execute(
        "return [...document.querySelectorAll('.table-chart svg')].filter(s => { const l = [...s.querySelectorAll('.chart-label')].map(t => t.firstChild.textContent); return new Set(l).size < l.length; }).length",
    );
    assert_eq!(repeated, 0, "a chart with two rows labelled alike");

    // The run page fits: no sideways scrolling, the graph inside the window, at 1,360 and 800 px.
    for width in [1360, 800] {
        d.resize(width, 900);
        d.open(&format!("{base}#run"));
        d.find("//*[@id='graph']");
        d.find("//tr[@id='stage-sft']");
        let fit = d.execute(
            "const g = document.getElementById('graph').getBoundingClientRect(); return [document.documentElement.scrollWidth, window.innerWidth, Math.ceil(g.right)]",
        );
        let (page, window, graph) = (fit[0].as_u64().unwrap(), fit[1].as_u64().unwrap(), fit[2].as_u64().unwrap());
        assert!(page <= window, "{width} px: the page is {page} px wide in a {window} px window");
        assert!(graph <= window, "{width} px: the graph ends at {graph} px in a {window} px window");
        d.screenshot(&shots.join(format!("view-run-{width}.png")));
    }
}

/// A viewer started before its run directory exists: the page waits, then shows the
/// stages as a run writes them (the event stream, no reload).
#[test]
fn a_view_started_before_its_run_shows_the_stages_appear() {
    if !browser_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("later/out");
    let v = Viewer::start(&out, &[]);
    let d = Driver::start();
    d.open(&format!("http://{}/", v.addr));
    d.find("//p[@id='waiting']");
    offline_run("rolemrc.toml", &out);
    d.find("//tr[@id='stage-sft']");
    d.find("//*[local-name()='g' and @data-stage='dpo']");
    assert_eq!(v.json("/api/run")["waiting"], false);
}

/// A decision is taken only from the viewer's own page: its token, its origin, JSON, and
/// a record of the table it names; nothing else is written.
#[test]
fn a_decision_needs_the_pages_token_and_origin_and_a_record_of_the_table() {
    let p = Project::new();
    p.write("r.jsonl", "{\"id\": \"a\", \"t\": \"one\"}\n{\"id\": \"b\", \"t\": \"two\"}\n");
    p.write(
        "p.toml",
        "[pipeline]\nname = \"d\"\noutput_dir = \"out\"\n[stages.r]\nkind = \"source\"\npath = \"r.jsonl\"\n",
    );
    p.synth(&["run", "p.toml", "-q"]).ok();
    let out = p.path().join("out");
    let v = Viewer::start(&out, &[]);
    let (_, page) = v.get("/");
    let token = page.split("const TOKEN = \"").nth(1).unwrap().split('"').next().unwrap().to_string();
    assert_eq!(token.len(), 32, "a per-start token in the page");
    let post = |headers: &[(&str, &str)], body: &str| -> (u16, String) {
        let mut s = TcpStream::connect(&v.addr).unwrap();
        let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        write!(
            s,
            "POST /api/review HTTP/1.1\r\nHost: {}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            v.addr,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string())
    };
    let origin = format!("http://{}", v.addr);
    let json = ("Content-Type", "application/json");
    let good = r#"{"file": "r.parquet", "id": "a", "decision": "drop", "note": "too short"}"#;
    assert_eq!(post(&[json, ("Origin", &origin)], good).0, 403, "no token");
    assert_eq!(post(&[json, ("Origin", &origin), ("X-Synth-Desk", "0123")], good).0, 403, "a wrong token");
    assert_eq!(
        post(&[json, ("Origin", "http://evil.example"), ("X-Synth-Desk", &token)], good).0,
        403,
        "another origin"
    );
    assert_eq!(post(&[json, ("X-Synth-Desk", &token)], good).0, 403, "no origin");
    let plain = ("Content-Type", "text/plain");
    assert_eq!(post(&[plain, ("Origin", &origin), ("X-Synth-Desk", &token)], good).0, 415, "not JSON");
    let missing = r#"{"file": "r.parquet", "id": "zz", "decision": "drop"}"#;
    assert_eq!(post(&[json, ("Origin", &origin), ("X-Synth-Desk", &token)], missing).0, 404, "no such record");
    let outside = r#"{"file": "../r.parquet", "id": "a", "decision": "drop"}"#;
    assert_eq!(post(&[json, ("Origin", &origin), ("X-Synth-Desk", &token)], outside).0, 404);
    assert!(!out.join("review.jsonl").exists(), "a refused decision wrote nothing");
    let (status, body) = post(&[json, ("Origin", &origin), ("X-Synth-Desk", &token)], good);
    assert_eq!(status, 200, "{body}");
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((state["reviewed"].as_u64(), state["rows"].as_u64()), (Some(1), Some(2)), "{state}");
    let line: Value = serde_json::from_str(std::fs::read_to_string(out.join("review.jsonl")).unwrap().trim()).unwrap();
    assert_eq!(
        (line["id"].as_str(), line["decision"].as_str(), line["note"].as_str()),
        (Some("a"), Some("drop"), Some("too short"))
    );
    // The table shows the decision beside its row.
    let t = v.json("/api/table?file=r.parquet");
    assert_eq!(t["review"][0]["decision"], "drop", "{t}");
    assert!(t["review"][1].is_null(), "{t}");
}

/// Facets (value counts for a short column, a histogram of lengths for a long one), a facet
/// filter together with a text filter, the export of the rows selected, and two runs compared.
#[test]
fn facets_export_and_two_runs_compared() {
    let p = Project::new();
    let rows = |changed: bool| -> String {
        (0..40)
            .filter(|i| !(changed && *i == 0))
            .map(|i| {
                let kind = ["short", "long", "odd"][i % 3];
                let text = if changed && i == 1 { "changed".to_string() } else { "word ".repeat(1 + i * 3) };
                let turns: Vec<String> =
                    (0..=i % 3).map(|t| format!("{{\"role\": \"user\", \"content\": \"turn {t}\"}}")).collect();
                format!(
                    "{{\"id\": \"r{i}\", \"kind\": \"{kind}\", \"text\": \"{}\", \"turns\": [{}]}}\n",
                    text.trim(),
                    turns.join(", ")
                )
            })
            .chain(changed.then(|| {
                "{\"id\": \"new\", \"kind\": \"short\", \"text\": \"fresh\", \"turns\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n"
                    .to_string()
            }))
            .collect()
    };
    p.write("r.jsonl", rows(false));
    p.write(
        "p.toml",
        "[pipeline]\nname = \"f\"\noutput_dir = \"out\"\n[stages.r]\nkind = \"source\"\npath = \"r.jsonl\"\n",
    );
    p.synth(&["run", "p.toml", "-q"]).ok();
    let v = Viewer::start(&p.path().join("out"), &[]);
    let kinds = v.json("/api/facets?file=r.parquet&column=kind");
    assert_eq!(kinds["kind"], "values", "{kinds}");
    let counts: Vec<(String, u64)> = kinds["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["value"].as_str().unwrap().to_string(), x["count"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(String, u64)> =
        [("short", 14), ("long", 13), ("odd", 13)].map(|(k, n)| (k.to_string(), n)).to_vec();
    assert_eq!(counts, expected, "the most frequent first, ties by value");
    let texts = v.json("/api/facets?file=r.parquet&column=text");
    assert_eq!(texts["kind"], "lengths", "{texts}");
    let bars = texts["bins"].as_array().unwrap();
    assert_eq!(bars.iter().map(|b| b["count"].as_u64().unwrap()).sum::<u64>(), 40, "{texts}");
    // The first bar as a filter selects its count of rows.
    let b = &bars[0];
    let filter = serde_json::json!({"column": "text", "min": b["min"], "max": b["max"], "open": b["open"]}).to_string();
    let t = v.json(&format!("/api/table?file=r.parquet&limit=500&facet={}", enc(&filter)));
    assert_eq!(t["matched"], b["count"], "{t}");
    // A list of messages: a histogram of its lengths in items (1, 2 or 3 turns), read
    // through one field of the messages; the bar of one-turn chats selects them.
    let turns = v.json("/api/facets?file=r.parquet&column=turns");
    assert_eq!((turns["kind"].as_str(), turns["unit"].as_str()), (Some("lengths"), Some("items")), "{turns}");
    let counts: Vec<u64> = turns["bins"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).collect();
    assert_eq!(counts, [14, 13, 13], "{turns}");
    let one = serde_json::json!({"column": "turns", "min": 1, "max": 1}).to_string();
    assert_eq!(v.json(&format!("/api/table?file=r.parquet&facet={}", enc(&one)))["matched"], 14);
    // With a text filter too: the rows both keep; the export holds exactly them.
    let short = serde_json::json!({"column": "kind", "eq": "short"}).to_string();
    let both = v.json(&format!("/api/table?file=r.parquet&limit=500&q=word&facet={}", enc(&short)));
    assert_eq!(both["matched"], 14, "{both}");
    let (status, jsonl) = v.get(&format!("/api/export?file=r.parquet&q=word&facet={}", enc(&short)));
    assert_eq!(status, 200);
    let exported: Vec<Value> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(exported.len(), 14);
    assert!(exported.iter().all(|r| r["kind"] == "short"), "{jsonl}");
    assert_eq!(v.get("/api/facets?file=r.parquet&column=nope").0, 400);
    drop(v);

    // Two runs compared: a copy of the first run, then the data changed and run again.
    let before = p.path().join("before");
    let cp = Command::new("cp").arg("-r").arg(p.path().join("out")).arg(&before).status().unwrap();
    assert!(cp.success());
    p.write("r.jsonl", rows(true));
    p.synth(&["run", "p.toml", "-q"]).ok();
    let v = Viewer::start(&p.path().join("out"), &[]);
    assert_eq!(v.get("/api/compare").0, 404, "no --compare given");
    drop(v);
    let mut cmd = Command::new(support::synth_bin());
    let out = p.path().join("out");
    cmd.args(["view", out.to_str().unwrap(), "--port", "0", "--compare", before.to_str().unwrap()]);
    let v = Viewer::start_command(cmd);
    let c = v.json("/api/compare?ids=5");
    let r = c["stages"].as_array().unwrap().iter().find(|s| s["name"] == "r").unwrap().clone();
    assert_eq!((r["other"]["rows_out"].as_u64(), r["this"]["rows_out"].as_u64()), (Some(40), Some(40)), "{c}");
    let table = c["tables"].as_array().unwrap().iter().find(|t| t["file"] == "r.parquet").unwrap().clone();
    assert_eq!(
        (table["added"].as_u64(), table["removed"].as_u64(), table["changed"].as_u64(), table["unchanged"].as_u64()),
        (Some(1), Some(1), Some(1), Some(38)),
        "{table}"
    );
    assert_eq!(table["added_ids"], serde_json::json!(["new"]));
    assert_eq!(table["removed_ids"], serde_json::json!(["r0"]));
    assert_eq!(table["changed_ids"], serde_json::json!(["r1"]));
}
