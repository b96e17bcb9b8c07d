//! The starter (`pipelines/starter.toml`, walked in `docs/starter.md`): its offline run writes
//! both sinks with the checks and the near-duplicate removal counted in the manifest; its local
//! run on the real SmolLM2 model finishes with the checks at work (skipped, saying why, without
//! the model); and every backend section of the page (OpenAI, vLLM, llama.cpp's server,
//! Ollama, Anthropic), its TOML table and its commands taken from the page's fenced blocks,
//! runs against a loopback server of that API, as does the page's "a few records first".

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};
use support::{Project, failures, manifest, parquet_rows};

/// The characters of the starter's records, and the distinct ones (c05 repeats c02).
const RECORDS: usize = 11;
const DISTINCT: usize = 10;

fn repo_file(rel: &str) -> PathBuf {
    support::repo().join(rel)
}

/// `synth run pipelines/starter.toml EXTRA... --out DIR` into a fresh directory: the
/// directory and the arguments.
fn starter_run(extra: &[&str]) -> (tempfile::TempDir, Vec<String>) {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec!["run".to_string(), repo_file("pipelines/starter.toml").display().to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend(["--out".to_string(), out.path().display().to_string()]);
    (out, args)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The starter's file as TOML.
fn starter() -> toml::Table {
    read("pipelines/starter.toml").parse().expect("pipelines/starter.toml is TOML")
}

/// The names of the starter's checks on stage `cards`, as the file declares them.
fn check_names() -> BTreeSet<String> {
    starter()["stages"]["cards"]["checks"].as_table().expect("stages.cards.checks").keys().cloned().collect()
}

/// Lines of a JSONL file as objects.
fn jsonl(path: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap().as_object().unwrap().clone())
        .collect()
}

fn ids(rows: &[Map<String, Value>]) -> Vec<String> {
    rows.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

fn number(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)).unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `synth ARGS` in `dir` with only `env` of the provider variables set (the caller's own
/// keys and base URLs are removed).
fn synth_in(dir: &Path, args: &[String], env: &[(String, String)]) -> support::Run {
    let mut cmd = Command::new(support::synth_bin());
    cmd.args(args).current_dir(dir).env("CI", "1").env_remove("SYNTH_LOG");
    for var in ["OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "SYNTH_MODEL"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env_remove(k).env(k, v);
    }
    support::Run::from(cmd.output().expect("run synth"))
}

// --- offline

#[test]
fn the_offline_run_writes_both_sinks_and_counts_its_checks() {
    let (out, args) = starter_run(&["--offline"]);
    let started = std::time::Instant::now();
    synth_in(out.path(), &args, &[]).ok();
    let seconds = started.elapsed().as_secs_f64();
    assert!(seconds < 30.0, "the offline run took {seconds:.1} s (the page says about a second)");
    let dir = out.path();

    let m = manifest(dir);
    let report = |stage: &str| m["stages"][stage]["report"].clone();
    assert_eq!(number(&report("characters")["rows_out"]), RECORDS as u64, "every record is read");
    assert_eq!(number(&report("cards")["rows_out"]), RECORDS as u64, "every record gets a card offline");
    assert_eq!(number(&report("cards")["requests"]), DISTINCT as u64, "the repeated record is asked once");
    assert_eq!(number(&report("cards_unique")["rows_out"]), DISTINCT as u64, "the duplicate is removed");

    // The checks the file declares, each run on every answer; the stand-in passes them.
    let checks = m["quality"]["stages"]["cards"]["checks"].as_object().expect("quality.stages.cards.checks");
    assert_eq!(checks.keys().cloned().collect::<BTreeSet<_>>(), check_names(), "the manifest counts each check");
    for (name, c) in checks {
        assert_eq!(number(&c["checked"]), RECORDS as u64, "check {name} ran on every answer: {c}");
        assert_eq!(number(&c["failed"]), 0, "check {name}: the offline stand-in passes: {c}");
    }
    let totals = &m["quality"]["totals"];
    assert_eq!(number(&totals["answers_checked"]), RECORDS as u64, "{totals}");
    assert_eq!(number(&totals["near_duplicates_removed"]), 1, "{totals}");
    assert_eq!(number(&m["quality"]["stages"]["cards_unique"]["near_duplicates"]["removed"]), 1);

    let dups = failures(dir, "cards_unique");
    assert_eq!(dups.len(), 1, "{dups:?}");
    assert_eq!((dups[0]["id"].as_str(), dups[0]["kind"].as_str()), (Some("c05"), Some("duplicate")));
    assert!(dups[0]["message"].as_str().unwrap().contains("\"c02\""), "it names the card it repeats: {dups:?}");
    assert!(failures(dir, "cards").is_empty(), "no card fails offline");

    // Both sinks: the same ten cards in the same order, the JSONL with the declared columns.
    let lines = jsonl(&dir.join("cards.jsonl"));
    let table = parquet_rows(&dir.join("cards.parquet"));
    assert_eq!(lines.len(), DISTINCT);
    assert_eq!(ids(&lines), ids(&table), "the two sinks hold the same records");
    assert!(!ids(&lines).contains(&"c05".to_string()));
    let columns: Vec<String> = starter()["stages"]["cards_jsonl"]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let mut expected = vec!["id".to_string()];
    expected.extend(columns);
    for line in &lines {
        assert_eq!(line.keys().cloned().collect::<Vec<_>>(), expected, "{line:?}");
        assert_eq!(line["model"], "offline");
        let greeting = line["greeting"].as_str().unwrap();
        assert!(greeting.split_whitespace().count() >= 4, "{line:?}");
    }
    for key in ["raw", "attempts", "tokens_out", "greeting", "backstory"] {
        assert!(table[0].contains_key(key), "the Parquet sink has every column, {key} too: {:?}", table[0].keys());
    }
}

// --- local

#[test]
fn the_local_run_on_the_real_model_finishes_with_the_checks_at_work() {
    let model = repo_file(".tools/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.is_file() {
        eprintln!("SKIPPED: {} is absent (.ci/setup-model installs it)", model.display());
        return;
    }
    let _one = crate::local::one_at_a_time();
    // One thread: other tests share the cores, and llama.cpp's threads spin while they
    // wait (docs/providers.md); the answers are the same bytes for any thread count.
    let (out, args) = starter_run(&["--profile", "local", "--set", "providers.writer.threads=1"]);
    let started = std::time::Instant::now();
    let run = synth_in(out.path(), &args, &[]).ok();
    eprintln!("starter --profile local: {:.1} s\n{}", started.elapsed().as_secs_f64(), run.stdout);
    let dir = out.path();
    let m = manifest(dir);
    let report = |stage: &str| m["stages"][stage]["report"].clone();
    let limit = starter()["profiles"]["local"]["stages"]["characters"]["limit"].as_integer().expect("a limit") as u64;
    assert_eq!(number(&report("cards")["rows_in"]), limit, "the local profile reads {limit} records");
    let (kept, dropped) = (number(&report("cards")["rows_out"]), number(&report("cards")["rows_failed"]));
    assert_eq!(kept + dropped, limit, "every record is kept or dropped");
    assert_eq!(report("cards")["info"]["provider_kind"], "local");
    assert_eq!(report("cards")["info"]["structured"], "grammar", "the schema constrains the decoding");

    // Every check ran on every answer, and the 135M model's answers broke some (its greetings
    // run past the 20 words the prompt allows).
    let checks = m["quality"]["stages"]["cards"]["checks"].as_object().expect("quality.stages.cards.checks");
    assert_eq!(checks.keys().cloned().collect::<BTreeSet<_>>(), check_names());
    let checked: BTreeSet<u64> = checks.values().map(|c| number(&c["checked"])).collect();
    assert_eq!(checked.len(), 1, "all checks run on every answer: {checks:?}");
    assert!(*checked.first().unwrap() >= limit, "each record's answers are checked: {checks:?}");
    let failed: u64 = checks.values().map(|c| number(&c["failed"])).sum();
    assert!(failed > 0, "the real model's answers fail a check now and then: {checks:?}");
    for (name, c) in checks {
        assert!(number(&c["reasked"]) + number(&c["dropped"]) <= number(&c["failed"]), "{name}: {c}");
    }

    // Dropped cards are in the failure table with the reason, the check that dropped them
    // (or the schema's complaint) and the last answer.
    let dropped_rows = failures(dir, "cards");
    assert_eq!(dropped_rows.len() as u64, dropped, "{dropped_rows:?}");
    for row in &dropped_rows {
        assert!(row["message"].as_str().is_some_and(|m| !m.is_empty()), "{row:?}");
        assert!(row["raw"].as_str().is_some_and(|r| !r.is_empty()), "the last answer is kept: {row:?}");
        if row["kind"] == "check" {
            let check = row["check"].as_str().unwrap();
            assert!(check_names().contains(check), "{row:?}");
            assert!(number(&checks[check]["dropped"]) > 0, "{check} dropped a card: {checks:?}");
        } else {
            assert_eq!(row["kind"], "validation", "a card fails a check or the schema: {row:?}");
        }
    }
    let by_checks: u64 = checks.values().map(|c| number(&c["dropped"])).sum();
    let dropped_by_check = dropped_rows.iter().filter(|r| r["kind"] == "check").count() as u64;
    assert!(by_checks >= dropped_by_check, "{checks:?} {dropped_rows:?}");

    // c02 and c05 ask the same request: both are dropped, or the second is a duplicate.
    let cards = parquet_rows(&dir.join("cards.parquet"));
    let lines = jsonl(&dir.join("cards.jsonl"));
    assert_eq!(ids(&lines), ids(&cards), "the two sinks hold the same records");
    assert_eq!(lines.len() as u64, number(&report("cards_unique")["rows_out"]));
    let dropped_ids = ids(&dropped_rows);
    assert_eq!(dropped_ids.contains(&"c02".into()), dropped_ids.contains(&"c05".into()), "{dropped_ids:?}");
    if !dropped_ids.contains(&"c02".into()) {
        assert_eq!(number(&m["quality"]["totals"]["near_duplicates_removed"]), 1);
        assert!(!ids(&lines).contains(&"c05".into()));
    }
    for line in &lines {
        assert_eq!(line["model"], "SmolLM2-135M-Instruct.Q4_1.gguf", "{line:?}");
        let words = line["greeting"].as_str().unwrap().split_whitespace().count();
        assert!((4..=20).contains(&words), "a kept greeting passed its length check: {line:?}");
    }
}

// --- the page's backends, against loopback servers

/// The fenced blocks of each `### ` section under the `## ` heading `part` of the page:
/// section title → (language, text) in order.
fn page_sections(part: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let page = read("docs/starter.md");
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let (mut inside, mut title, mut block): (bool, String, Option<(String, String)>) = (false, String::new(), None);
    for line in page.lines() {
        if let Some((lang, text)) = block.as_mut() {
            if line == "```" {
                if inside {
                    sections.entry(title.clone()).or_default().push((lang.clone(), text.clone()));
                }
                block = None;
            } else {
                text.push_str(line);
                text.push('\n');
            }
        } else if let Some(lang) = line.strip_prefix("```") {
            block = Some((lang.to_string(), String::new()));
        } else if let Some(h) = line.strip_prefix("## ") {
            inside = h == part;
            title = h.to_string();
        } else if let Some(h) = line.strip_prefix("### ") {
            title = h.to_string();
        }
    }
    assert!(block.is_none(), "docs/starter.md: a fenced block is not closed");
    assert!(!sections.is_empty(), "docs/starter.md has no section \"## {part}\" with code blocks");
    sections
}

/// The one block of `lang` in a section.
fn block<'a>(section: &'a [(String, String)], lang: &str, title: &str) -> &'a str {
    let found: Vec<&(String, String)> = section.iter().filter(|(l, _)| l == lang).collect();
    assert_eq!(found.len(), 1, "section \"{title}\" of docs/starter.md: one ```{lang} block");
    &found[0].1
}

/// Words of a shell line (quotes, backslashes and comments as sh reads them; no expansions):
/// the `shlex` crate's POSIX splitting.
fn shell_words(line: &str) -> Vec<String> {
    shlex::split(line).unwrap_or_else(|| panic!("not a shell line (an open quote): {line}"))
}

/// What a shell block does: the variables it exports and each `synth` command's arguments.
/// Any other line is an error (the page's blocks are run as they are).
fn commands(sh: &str, title: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let (mut exports, mut runs) = (Vec::new(), Vec::new());
    for line in sh.replace("\\\n", " ").lines() {
        let words = shell_words(line);
        match words.first().map(String::as_str) {
            None => {}
            Some("export") => {
                assert_eq!(words.len(), 2, "section \"{title}\": {line}");
                let (name, value) = words[1].split_once('=').unwrap_or_else(|| panic!("section \"{title}\": {line}"));
                assert!(!value.is_empty(), "section \"{title}\": {line}");
                exports.push(name.to_string());
            }
            Some("synth") => runs.push(words[1..].to_vec()),
            Some(_) => panic!("section \"{title}\" of docs/starter.md: a line the test cannot run: {line}"),
        }
    }
    (exports, runs)
}

/// `url` with its scheme, host and port replaced by `server`'s (its path kept).
fn to_loopback(url: &str, server: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_else(|| panic!("not a URL: {url}"));
    let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("");
    format!("{server}{path}")
}

/// The starter's file with its `[providers.writer]` table (up to the blank line after it)
/// replaced by `table`; and the table the file has.
fn with_provider(table: &str) -> (String, String) {
    let file = read("pipelines/starter.toml");
    let start = file.find("[providers.writer]\n").expect("pipelines/starter.toml has [providers.writer]");
    let end = start + file[start..].find("\n\n").expect("a blank line after [providers.writer]") + 1;
    (format!("{}{}{}", &file[..start], table, &file[end..]), file[start..end].to_string())
}

/// A temporary copy of the starter (the file with `toml`, its records and its prompts).
fn starter_copy(toml: &str) -> Project {
    let p = Project::new();
    p.write("pipelines/starter.toml", toml);
    for folder in ["pipelines/data/starter", "pipelines/prompts/starter"] {
        for entry in std::fs::read_dir(repo_file(folder)).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            p.write(&format!("{folder}/{name}"), std::fs::read(entry.path()).unwrap());
        }
    }
    p
}

/// One request the loopback server answered.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: Option<String>,
    x_api_key: Option<String>,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A loopback server of OpenAI's chat completions and Anthropic's messages: each answer is
/// a character card made from the prompt (different words for each character), as JSON
/// text or as the input of the forced tool.
struct Loopback {
    url: String,
    log: Log,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Loopback {
    fn start() -> Loopback {
        let log: Log = Arc::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .with_state(log.clone());
        let (url, stop) = support::serve_router(app);
        Loopback { url, log, _stop: stop }
    }

    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

fn user_message(body: &Value) -> String {
    let last = body["messages"].as_array().and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
    match last.map(|m| &m["content"]) {
        Some(Value::String(s)) => s.clone(),
        // Anthropic's content blocks.
        Some(Value::Array(blocks)) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// The card the server answers a prompt with: the character's first name and words drawn by
/// the prompt's hash, within the starter's checks (4..20 words, 12..60 words, English).
fn card_for(prompt: &str) -> Value {
    const WORDS: [&str; 32] = [
        "river", "lamp", "bread", "stone", "garden", "winter", "letter", "harbour", "market", "candle", "bridge",
        "window", "orchard", "ladder", "kettle", "meadow", "lantern", "pocket", "shelter", "journey", "village",
        "ribbon", "feather", "basket", "thunder", "pepper", "silver", "cabbage", "compass", "violin", "blanket",
        "chimney",
    ];
    let first = prompt
        .split_once("card for ")
        .and_then(|(_, rest)| rest.split([' ', ',']).next())
        .filter(|n| !n.is_empty())
        .unwrap_or("Friend");
    let hash = blake3::hash(prompt.as_bytes());
    let w: Vec<&str> = hash.as_bytes().iter().map(|b| WORDS[*b as usize % WORDS.len()]).collect();
    json!({
        "greeting": format!("Come in, I am {first}. Mind the {} and the {} by the door.", w[0], w[1]),
        "backstory": format!(
            "{first} grew up near the {} and the {}, then worked for years with a {} and a {} before settling here with the {}.",
            w[2], w[3], w[4], w[5], w[6]
        ),
    })
}

async fn answer(State(log): State<Log>, uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    log.lock().unwrap().push(Seen {
        path: uri.path().to_string(),
        authorization: header("authorization"),
        x_api_key: header("x-api-key"),
        body: body.clone(),
    });
    let card = card_for(&user_message(&body));
    let answer = if uri.path() == "/v1/messages" {
        let content = match body.get("tool_choice") {
            Some(choice) => json!([{"type": "tool_use", "id": "toolu_1", "name": choice["name"], "input": card}]),
            None => json!([{"type": "text", "text": card.to_string()}]),
        };
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": content,
               "stop_reason": if body.get("tool_choice").is_some() { "tool_use" } else { "end_turn" },
               "usage": {"input_tokens": 120, "output_tokens": 40}})
    } else {
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "message": {"role": "assistant", "content": card.to_string()}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}})
    };
    (StatusCode::OK, [("content-type", "application/json")], answer.to_string()).into_response()
}

/// How a provider table sends the stage's schema.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// OpenAI's `json_schema`, strict (the form `auto` tries first).
    Strict,
    /// `json_schema` without `strict`.
    Vllm,
    /// `{type: json_object, schema}`.
    LlamaCpp,
    /// Anthropic's forced tool.
    Tool,
}

fn form_of(table: &toml::Table) -> Form {
    match (table["kind"].as_str(), table.get("structured_output").and_then(|v| v.as_str())) {
        (Some("anthropic"), _) => Form::Tool,
        (Some("openai"), None | Some("auto" | "openai")) => Form::Strict,
        (Some("openai"), Some("vllm")) => Form::Vllm,
        (Some("openai"), Some("llama_cpp")) => Form::LlamaCpp,
        other => panic!("a provider table this test does not know: {other:?}"),
    }
}

/// The schema a request carried, checked to be in `form`.
fn schema_sent(seen: &Seen, form: Form) -> Value {
    let rf = &seen.body["response_format"];
    match form {
        Form::Strict | Form::Vllm => {
            assert_eq!(rf["type"], "json_schema", "{form:?}: {rf}");
            assert_eq!(rf["json_schema"]["name"], "card", "{rf}");
            if form == Form::Strict {
                assert_eq!(rf["json_schema"]["strict"], json!(true), "strict mode: {rf}");
            } else {
                assert!(rf["json_schema"].get("strict").is_none(), "vLLM's form has no strict: {rf}");
            }
            rf["json_schema"]["schema"].clone()
        }
        Form::LlamaCpp => {
            assert_eq!(rf["type"], "json_object", "llama.cpp's form: {rf}");
            rf["schema"].clone()
        }
        Form::Tool => {
            assert!(seen.body.get("response_format").is_none(), "{}", seen.body);
            assert_eq!(seen.body["tool_choice"]["type"], "tool", "a forced tool: {}", seen.body);
            let tools = seen.body["tools"].as_array().expect("tools");
            assert_eq!(tools.len(), 1, "{tools:?}");
            assert_eq!(tools[0]["name"], seen.body["tool_choice"]["name"]);
            tools[0]["input_schema"].clone()
        }
    }
}

/// Run one backend section of the page (its TOML table in a copy of the starter, its
/// commands with dummy keys) against a loopback server, and check what the server saw.
fn run_backend(title: &str, section: &[(String, String)]) {
    let table_text = block(section, "toml", title);
    let (exports, runs) = commands(block(section, "sh", title), title);
    assert_eq!(runs.len(), 1, "section \"{title}\": one synth command");
    let args = &runs[0];
    assert_eq!(&args[..2], ["run", "pipelines/starter.toml"], "section \"{title}\": it runs the starter");

    let table: toml::Table = table_text.parse().unwrap_or_else(|e| panic!("section \"{title}\": {e}"));
    let writer = table["providers"]["writer"].as_table().expect("the block is [providers.writer]").clone();
    let model = writer["model"].as_str().expect("a model").to_string();
    let base_url = writer["base_url"].as_str().expect("a base_url").to_string();
    let form = form_of(&writer);
    let default_key = if form == Form::Tool { "ANTHROPIC_API_KEY" } else { "OPENAI_API_KEY" };
    let key_env = writer.get("api_key_env").and_then(|v| v.as_str()).unwrap_or(default_key).to_string();

    let server = Loopback::start();
    let rewritten = table_text.replace(&base_url, &to_loopback(&base_url, &server.url));
    assert_ne!(rewritten, table_text, "section \"{title}\": the base URL is rewritten");
    let (toml, _) = with_provider(&rewritten);
    let p = starter_copy(&toml);

    // Each exported variable gets a dummy value; a decoy OpenAI key sits in the environment
    // where the page exports none (it must not reach another server).
    let mut env: Vec<(String, String)> =
        exports.iter().map(|name| (name.clone(), format!("dummy-{}-0123456789", name.to_lowercase()))).collect();
    if !exports.iter().any(|e| e == "OPENAI_API_KEY") {
        env.push(("OPENAI_API_KEY".into(), "decoy-openai-key-0123456789".into()));
    }
    synth_in(p.path(), args, &env).ok();

    let seen = server.seen();
    let path = if form == Form::Tool { "/v1/messages" } else { "/v1/chat/completions" };
    assert_eq!(seen.len(), DISTINCT, "section \"{title}\": one request per distinct record");
    let prompts: BTreeSet<String> = seen.iter().map(|s| user_message(&s.body)).collect();
    assert_eq!(prompts.len(), DISTINCT, "section \"{title}\": ten different prompts");
    for s in &seen {
        assert_eq!(s.path, path, "section \"{title}\"");
        assert_eq!(s.body["model"], model.as_str(), "section \"{title}\": the model named on the page");
        let schema = schema_sent(s, form);
        assert_eq!(schema["required"], json!(["greeting", "backstory"]), "section \"{title}\": {schema}");
        let key = if form == Form::Tool {
            s.x_api_key.clone()
        } else {
            s.authorization.as_ref().and_then(|a| a.strip_prefix("Bearer ")).map(str::to_string)
        };
        let key = key.filter(|k| !k.is_empty());
        match env.iter().find(|(name, _)| *name == key_env && exports.contains(name)) {
            Some((_, value)) => assert_eq!(key.as_deref(), Some(value.as_str()), "section \"{title}\": the key"),
            None => assert_eq!(key, None, "section \"{title}\": no key is sent ({key_env} unset)"),
        }
        if form == Form::Tool {
            assert!(s.authorization.is_none(), "section \"{title}\": Anthropic's key is x-api-key");
        }
    }

    let lines = jsonl(&p.path().join("outputs/starter/cards.jsonl"));
    assert_eq!(lines.len(), DISTINCT, "section \"{title}\": ten cards written");
    assert!(lines.iter().all(|l| l["model"] == model.as_str()), "section \"{title}\": {lines:?}");
    assert_eq!(parquet_rows(&p.path().join("outputs/starter/cards.parquet")).len(), DISTINCT);
    let m = manifest(&p.path().join("outputs/starter"));
    assert_eq!(number(&m["quality"]["totals"]["near_duplicates_removed"]), 1, "section \"{title}\"");
}

#[test]
fn every_backend_of_the_page_runs_as_written_against_a_loopback_server() {
    let sections = page_sections("The same file pointed at another model");
    let titles: Vec<&str> = sections.keys().map(String::as_str).collect();
    for wanted in ["OpenAI", "vLLM", "llama.cpp's server", "Ollama", "Anthropic"] {
        assert!(titles.contains(&wanted), "docs/starter.md has no section \"### {wanted}\": {titles:?}");
    }
    // The OpenAI table is the file's own; the local servers sit at their usual addresses.
    let (_, shipped) = with_provider("");
    assert_eq!(block(&sections["OpenAI"], "toml", "OpenAI"), shipped, "the page shows the file's table");
    for (title, url) in [
        ("vLLM", "http://localhost:8000/v1"),
        ("llama.cpp's server", "http://localhost:8080/v1"),
        ("Ollama", "http://localhost:11434/v1"),
    ] {
        assert!(block(&sections[title], "toml", title).contains(&format!("base_url = \"{url}\"")), "{title}");
    }
    for (title, section) in &sections {
        run_backend(title, section);
    }
}

#[test]
fn a_few_records_first_then_all_of_them_pay_only_for_the_new_ones() {
    let sections = page_sections("A few records first");
    let (exports, runs) = commands(block(&sections["A few records first"], "sh", "A few records first"), "preview");
    assert!(exports.is_empty());
    assert_eq!(runs.len(), 4, "{runs:?}");
    let has = |run: &Vec<String>, flag: &str| run.iter().any(|a| a == flag);
    assert!(has(&runs[0], "--dry-run") && has(&runs[1], "--dry-run") && has(&runs[2], "--limit"), "{runs:?}");
    let limit: usize = runs[2][runs[2].iter().position(|a| a == "--limit").unwrap() + 1].parse().unwrap();

    // The file as shipped (the OpenAI table), its base URL on the loopback server.
    let server = Loopback::start();
    let (_, shipped) = with_provider("");
    let (toml, _) = with_provider(&shipped.replace("https://api.openai.com", &server.url));
    let p = starter_copy(&toml);
    let env = [("OPENAI_API_KEY".to_string(), "dummy-openai-key-0123456789".to_string())];
    let cards = || jsonl(&p.path().join("outputs/starter/cards.jsonl"));

    // The estimate: the model stage's row, priced (gpt-4o-mini), nothing sent.
    let dry = synth_in(p.path(), &runs[0], &env).ok();
    let row = dry
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("estimate"))
        .find(|l| l.starts_with("cards "))
        .unwrap_or_else(|| panic!("{}", dry.stdout));
    assert!(row.contains("gpt-4o-mini") && row.contains("0.0"), "{row}");
    synth_in(p.path(), &runs[1], &env).ok();
    assert_eq!(server.seen().len(), 0, "a dry run sends nothing");
    synth_in(p.path(), &runs[2], &env).ok();
    assert_eq!(server.seen().len(), limit, "the trial asks {limit} records");
    assert_eq!(cards().len(), limit);
    synth_in(p.path(), &runs[3], &env).ok();
    assert_eq!(server.seen().len(), DISTINCT, "the full run asks only the records not asked yet");
    let asked: BTreeSet<String> = server.seen().iter().map(|s| user_message(&s.body)).collect();
    assert_eq!(asked.len(), DISTINCT, "no prompt is asked twice");
    assert_eq!(cards().len(), DISTINCT);
}

#[test]
fn shell_lines_are_read_as_sh_reads_them() {
    assert_eq!(
        shell_words("synth run a.toml --set 'x=\"a b\"'  # note"),
        ["synth", "run", "a.toml", "--set", "x=\"a b\""]
    );
    assert_eq!(shell_words("export K=\"v w\""), ["export", "K=v w"]);
    assert_eq!(to_loopback("https://api.anthropic.com", "http://127.0.0.1:9"), "http://127.0.0.1:9");
    assert_eq!(to_loopback("http://localhost:8000/v1", "http://127.0.0.1:9"), "http://127.0.0.1:9/v1");
    let (exports, runs) = commands("export A=1\n\nsynth run p.toml \\\n  --limit 2\n", "t");
    assert_eq!(
        (exports, runs),
        (
            vec!["A".to_string()],
            vec![vec!["run", "p.toml", "--limit", "2"].into_iter().map(String::from).collect::<Vec<_>>()]
        )
    );
}
