//! Structured answers (`schema` on an `llm` stage) against a loopback server that checks
//! the request body: OpenAI's strict `json_schema`, the vLLM and llama.cpp forms and
//! Anthropic's forced tool are sent as each provider documents; a JSON answer gives the
//! columns a text answer with the same content gives; a server that refuses the form
//! falls back to the text protocol with one warning per stage (recorded in the manifest);
//! schema and prompt are in the cache key; a bad schema file is a plan-time error naming
//! it; an answer that violates the schema is re-asked with the validator's message, then
//! fails with the model's raw answers kept.

use crate::support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use support::{Project, failures, manifest, parquet_rows};

/// What the test server answers a chat body: the answer's text, or an error (status, message).
type Answer = Arc<dyn Fn(&Value) -> Result<String, (u16, String)> + Send + Sync>;

#[derive(Clone)]
struct Shared {
    bodies: Arc<Mutex<Vec<Value>>>,
    answer: Answer,
}

/// A loopback server of `/v1/chat/completions` (OpenAI layout) and `/v1/messages`
/// (Anthropic layout: a structured answer is a `tool_use` block), recording every body.
struct Server {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Server {
    fn start(answer: Answer) -> Server {
        let shared = Shared { bodies: Arc::default(), answer };
        let bodies = shared.bodies.clone();
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/messages", post(messages))
            .with_state(shared);
        let (url, stop) = support::serve_router(app);
        Server { url, bodies, _stop: stop }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }
}

fn error(status: u16, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}});
    (StatusCode::from_u16(status).unwrap(), [("content-type", "application/json")], body.to_string()).into_response()
}

async fn chat(State(s): State<Shared>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    s.bodies.lock().unwrap().push(body.clone());
    match (s.answer)(&body) {
        Ok(text) => {
            let answer = json!({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
            (StatusCode::OK, [("content-type", "application/json")], answer.to_string()).into_response()
        }
        Err((status, message)) => error(status, &message),
    }
}

async fn messages(State(s): State<Shared>, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    s.bodies.lock().unwrap().push(body.clone());
    match (s.answer)(&body) {
        Ok(text) => {
            let content = match body.get("tool_choice") {
                Some(choice) => json!([{"type": "tool_use", "id": "toolu_1", "name": choice["name"],
                    "input": serde_json::from_str::<Value>(&text).unwrap()}]),
                None => json!([{"type": "text", "text": text}]),
            };
            let answer = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": content, "stop_reason": if body.get("tool_choice").is_some() { "tool_use" } else { "end_turn" },
                "usage": {"input_tokens": 10, "output_tokens": 5}});
            (StatusCode::OK, [("content-type", "application/json")], answer.to_string()).into_response()
        }
        Err((status, message)) => error(status, &message),
    }
}

/// Whether a request asks for a structured answer (any provider's form).
fn structured(body: &Value) -> bool {
    body.get("response_format").is_some() || body.get("tool_choice").is_some()
}

/// The user message of a request (its persona line picks the profile below).
fn last_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A profile's content for persona `i`: as JSON (the schema's layout) and as the text of
/// the seven sections (Appendix D), the same content in each.
fn profile(i: usize) -> (Value, String) {
    let name = format!("Mira Vell {i}, the Lamplighter");
    let obj = json!({
        "role_name": name,
        "brief_description": format!("Mira keeps the {i} lamps of the harbour lit, and knows every sailor by name."),
        "specific_abilities_and_skills": [{"name": "Night Sight", "description": "sees ships before the watch does"},
                   {"name": "Knots", "description": "ties forty kinds"}],
        "speech_style": "Short sentences, sea words, a dry joke at the end.",
        "personality_characteristics": [{"name": "Steady", "description": "never hurries"}, {"name": "Wry", "description": "finds the joke in a squall"}],
        "past_experience_and_background": [format!("Lit her first lamp at {}.", 10 + i), "Lost a brother to a storm."],
        "ability_and_knowledge_boundaries": "Knows the harbour, not the open sea or its politics.",
        "speech_examples": [
            {"topic": "Storms", "narration": "squints at the horizon", "speech": "Wind's turning. Bring the boats in."},
            {"topic": "Greeting", "narration": "", "speech": "Evening. Lamp's lit, you're safe."}
        ]
    });
    let text = format!(
        "####Role Name and Brief Description\n{name}\n{desc}\n####Specific Abilities and Skills\n1. Night Sight: sees ships before the watch does\n2. Knots: ties forty kinds\n####Speech Style\nShort sentences, sea words, a dry joke at the end.\n####Personality Characteristics\n1. Steady: never hurries\n2. Wry: finds the joke in a squall\n####Past Experience and Background\n1. Lit her first lamp at {age}.\n2. Lost a brother to a storm.\n####Ability and Knowledge Boundaries\nKnows the harbour, not the open sea or its politics.\n####Speech Examples\n1. Storms: \"(squints at the horizon) Wind's turning. Bring the boats in.\"\n2. Greeting: \"Evening. Lamp's lit, you're safe.\"",
        desc = obj["brief_description"].as_str().unwrap(),
        age = 10 + i,
    );
    (obj, text)
}

fn persona_of(body: &Value) -> usize {
    let u = last_user(body);
    let at = u.find("persona number ").expect("persona line");
    u[at + 15..].split_whitespace().next().unwrap().trim_end_matches('.').parse().unwrap()
}

/// Answers profiles: JSON when the request is structured, the section text otherwise.
fn profile_answer() -> Answer {
    Arc::new(|body: &Value| {
        let (obj, text) = profile(persona_of(body));
        Ok(if structured(body) { obj.to_string() } else { text })
    })
}

const KEY: &str = "sk-structured-SECRET-42";

/// A pipeline of `n` personas → profiles (`llm`, parser `profile`, the shipped schema) →
/// jsonl, against `url` with provider `provider` (a TOML table body) and stage lines `stage`.
fn project(n: usize, provider: &str, stage: &str) -> Project {
    let p = Project::new();
    let personas: String = (0..n).map(|i| format!("{{\"persona\": \"persona number {i}.\"}}\n")).collect();
    p.write("personas.jsonl", personas);
    p.write("prompt.j2", "Standardize {{ persona }} into the seven sections.\n");
    let schema =
        std::fs::read_to_string(support::repo().join("pipelines/prompts/rolemrc/profile.schema.json")).unwrap();
    p.write("profile.schema.json", schema);
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "structured-test"
output_dir = "out"

[providers.p]
{provider}

[stages.personas]
kind = "source"
path = "personas.jsonl"

[stages.profiles]
kind = "llm"
inputs = ["personas"]
provider = "p"
prompt = "prompt.j2"
parser = "profile"
schema = "profile.schema.json"
max_attempts = 3
{stage}

[stages.export]
kind = "jsonl"
inputs = ["profiles"]
"#
        ),
    );
    p
}

/// Retries short enough for a test.
const RETRIES: &str = "max_retries = 2\nbackoff_initial_ms = 5\nbackoff_max_seconds = 0.05\ntimeout_seconds = 10";

fn openai_provider(url: &str, form: &str) -> String {
    format!(
        "kind = \"openai\"\nbase_url = \"{url}/v1\"\nmodel = \"small\"\napi_key_env = \"SYNTH_TEST_KEY\"\nstructured_output = \"{form}\"\n{RETRIES}"
    )
}

fn run(p: &Project, args: &[&str]) -> support::Run {
    let mut all = vec!["run", "p.toml"];
    all.extend_from_slice(args);
    p.synth_env(&all, &[("SYNTH_TEST_KEY", KEY), ("ANTHROPIC_TEST_KEY", KEY)])
}

/// The parser's columns of a stage output, by id (what a text and a JSON answer must share).
fn profile_columns(p: &Project) -> Vec<(String, Value)> {
    let cols = [
        "role_name",
        "identification",
        "description",
        "skills",
        "speech_style",
        "personality",
        "experience",
        "boundaries",
        "speech_examples",
        "profile_text",
        "profile_text_no_narration",
    ];
    parquet_rows(&p.path().join("out/profiles.parquet"))
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), json!(cols.iter().map(|c| r[*c].clone()).collect::<Vec<_>>())))
        .collect()
}

#[test]
fn each_form_is_sent_as_its_server_documents_and_gives_the_text_protocols_columns() {
    let server = Server::start(profile_answer());
    // The text protocol: the same content as section text.
    let text = project(4, &openai_provider(&server.url, "openai"), "structured = \"off\"");
    run(&text, &[]).ok();
    assert!(server.bodies().iter().all(|b| !structured(b)), "structured = off sends no response_format");
    let expected = profile_columns(&text);
    assert_eq!(expected.len(), 4);
    let schema: Value = serde_json::from_str(&text.read("profile.schema.json")).unwrap();

    for form in ["openai", "vllm", "llama_cpp"] {
        let before = server.count();
        let p = project(4, &openai_provider(&server.url, form), "");
        run(&p, &[]).ok();
        let bodies = server.bodies()[before..].to_vec();
        assert_eq!(bodies.len(), 4, "{form}: one request per persona");
        for b in &bodies {
            let rf = &b["response_format"];
            match form {
                "openai" => {
                    assert_eq!(rf["type"], "json_schema");
                    assert_eq!(rf["json_schema"]["name"], "profile");
                    assert_eq!(rf["json_schema"]["strict"], true, "the shipped schema meets strict mode");
                    // Strict mode gets the schema without the assertions it lacks (minLength...);
                    // the answer is validated against the whole schema after parsing.
                    assert_eq!(rf["json_schema"]["schema"], synth::llm::schema::strict_view(&schema));
                    assert_ne!(rf["json_schema"]["schema"], schema, "the shipped schema bounds its texts' lengths");
                }
                "vllm" => {
                    assert_eq!(rf["type"], "json_schema");
                    assert_eq!(rf["json_schema"]["name"], "profile");
                    assert!(rf["json_schema"].get("strict").is_none());
                    assert_eq!(rf["json_schema"]["schema"], schema);
                }
                _ => assert_eq!(rf, &json!({"type": "json_object", "schema": schema})),
            }
        }
        assert_eq!(profile_columns(&p), expected, "{form}: JSON and text answers give the same columns");
        let m = manifest(&p.path().join("out"));
        let report = &m["stages"]["profiles"]["report"];
        assert_eq!(report["info"]["structured"], form, "{report}");
        assert_eq!(report["metrics"]["answers.first_attempt"], 4.0, "{report}");
    }

    // Anthropic: a forced tool whose input_schema is the schema; its input is the answer.
    let before = server.count();
    let p = project(
        4,
        &format!(
            "kind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude-x\"\napi_key_env = \"ANTHROPIC_TEST_KEY\"\n{RETRIES}",
            server.url
        ),
        "",
    );
    run(&p, &[]).ok();
    let bodies = server.bodies()[before..].to_vec();
    assert_eq!(bodies.len(), 4);
    for b in &bodies {
        assert_eq!(b["tools"][0]["name"], "profile");
        assert_eq!(b["tools"][0]["input_schema"], schema);
        assert_eq!(b["tool_choice"], json!({"type": "tool", "name": "profile"}));
        assert!(b.get("response_format").is_none());
    }
    assert_eq!(profile_columns(&p), expected, "anthropic: the tool's input gives the same columns");
}

#[test]
fn a_server_that_refuses_the_form_falls_back_to_text_once_per_stage() {
    // OpenAI's answer for a model without structured outputs.
    let refuse: Answer = Arc::new(|body: &Value| {
        if body.get("response_format").is_some() {
            return Err((
                400,
                "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.".into(),
            ));
        }
        Ok(profile(persona_of(body)).1)
    });
    let server = Server::start(refuse);
    let p = project(6, &openai_provider(&server.url, "openai"), "");
    // A second stage on the same provider: it starts in text (the provider has no form left).
    p.write(
        "p.toml",
        p.read("p.toml")
            + "\n[stages.again]\nkind = \"llm\"\ninputs = [\"personas\"]\nprovider = \"p\"\nprompt = \"prompt.j2\"\nparser = \"profile\"\nschema = \"profile.schema.json\"\n",
    );
    let r = run(&p, &[]).ok();
    let rows = parquet_rows(&p.path().join("out/profiles.parquet"));
    assert_eq!(rows.len(), 6, "every record answered in the text protocol");
    let warnings: Vec<&str> = r.stderr.lines().filter(|l| l.contains("text protocol")).collect();
    assert_eq!(
        warnings.iter().filter(|l| l.contains("\"profiles\"")).count(),
        1,
        "one warning for the stage:\n{}",
        r.stderr
    );
    assert_eq!(
        warnings.iter().filter(|l| l.contains("\"again\"")).count(),
        1,
        "one for the other stage:\n{}",
        r.stderr
    );
    let m = manifest(&p.path().join("out"));
    // The two stages run side by side: whichever had the form refused says why; the other
    // (started before or after that) falls back too.
    let mut reasons = Vec::new();
    for stage in ["profiles", "again"] {
        let info = &m["stages"][stage]["report"]["info"];
        assert_eq!(info["structured"], "text", "{stage}: {info}");
        reasons.push(info["structured_fallback"].as_str().unwrap().to_string());
    }
    assert!(reasons.iter().any(|r| r.contains("response_format")), "{reasons:?}");
    let refused = server.bodies().iter().filter(|b| structured(b)).count();
    assert!((1..=6).contains(&refused), "refused requests are not retried: {refused}");

    // llama-cpp-python answers `json_schema` with a 500 and takes `json_object` + schema:
    // "auto" moves on to that form instead of the text protocol.
    let llama: Answer = Arc::new(|body: &Value| match body["response_format"]["type"].as_str() {
        Some("json_schema") => {
            Err((500, "1 validation error: response_format.type: Input should be 'text' or 'json_object'".into()))
        }
        Some("json_object") => Ok(profile(persona_of(body)).0.to_string()),
        _ => Ok("no sections at all".into()),
    });
    let server = Server::start(llama);
    let p = project(5, &openai_provider(&server.url, "auto"), "");
    let r = run(&p, &[]).ok();
    assert!(!r.stderr.contains("text protocol"), "{}", r.stderr);
    let info = &manifest(&p.path().join("out"))["stages"]["profiles"]["report"]["info"];
    assert_eq!(info["structured"], "llama_cpp, openai", "{info}");
    assert_eq!(parquet_rows(&p.path().join("out/profiles.parquet")).len(), 5);
    let schema_500s = server.bodies().iter().filter(|b| b["response_format"]["type"] == "json_schema").count();
    assert!((1..=5).contains(&schema_500s), "a refusal is not retried: {schema_500s}");

    // structured = "require": a refusal fails the records instead of falling back.
    let server = Server::start(Arc::new(|_: &Value| Err((400, "response_format is not supported".into()))));
    let p = project(2, &openai_provider(&server.url, "openai"), "structured = \"require\"\nmax_failure_ratio = 1.0");
    run(&p, &[]).ok();
    let failed = failures(&p.path().join("out"), "profiles");
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|f| f["message"].as_str().unwrap().contains("response_format")));
}

#[test]
fn schema_and_prompt_are_in_the_cache_key() {
    let server = Server::start(profile_answer());
    let p = project(3, &openai_provider(&server.url, "openai"), "");
    run(&p, &[]).ok();
    assert_eq!(server.count(), 3);
    run(&p, &[]).ok();
    assert_eq!(server.count(), 3, "nothing changed: nothing asked");
    // Another form of the same schema asks for the same answer: cached.
    p.write("p.toml", p.read("p.toml").replace("structured_output = \"openai\"", "structured_output = \"vllm\""));
    run(&p, &[]).ok();
    assert_eq!(server.count(), 3, "the form is not part of the key");
    // A changed schema re-asks every record.
    p.write(
        "profile.schema.json",
        p.read("profile.schema.json").replace("Speech Style\"", "Speech Style (how the role talks)\""),
    );
    run(&p, &[]).ok();
    assert_eq!(server.count(), 6, "a changed schema re-asks");
    // A changed prompt too.
    p.write("prompt.j2", "Rewrite {{ persona }} as a profile of seven sections.\n");
    run(&p, &[]).ok();
    assert_eq!(server.count(), 9, "a changed prompt re-asks");
    run(&p, &[]).ok();
    assert_eq!(server.count(), 9);
    // The text protocol of the same prompt is another request.
    p.write("p.toml", p.read("p.toml").replace("max_attempts = 3", "max_attempts = 3\nstructured = \"off\""));
    run(&p, &[]).ok();
    assert_eq!(server.count(), 12);
}

#[test]
fn bad_schemas_are_plan_time_errors_naming_the_file() {
    let p = project(1, "kind = \"offline\"", "");
    p.write("profile.schema.json", "{\"type\": \"object\", \"properties\": {");
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("profile.schema.json") && r.stderr.contains("not valid JSON"), "{}", r.stderr);
    assert!(r.stderr.contains("p.toml:"), "the option's place in the pipeline: {}", r.stderr);
    p.write("profile.schema.json", "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"strnig\"}}}");
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("profile.schema.json") && r.stderr.contains("not a valid JSON Schema"), "{}", r.stderr);
    p.write("profile.schema.json", "{\"type\": \"object\", \"properties\": {\"role_name\": {\"type\": \"string\"}}, \"required\": [\"role_name\"]}");
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("\"speech_examples\"") && r.stderr.contains("parser \"profile\""), "{}", r.stderr);
    p.write("profile.schema.json", "{\"type\": \"object\"}");
    p.write("p.toml", p.read("p.toml").replace("parser = \"profile\"", "parser = \"roleeval_mcq\""));
    let r = p.synth(&["validate", "p.toml"]).code(78);
    assert!(r.stderr.contains("\"answer\""), "{}", r.stderr);
}

#[test]
fn an_answer_that_breaks_the_schema_is_reasked_then_fails_with_its_raw_answers() {
    // Persona 0: JSON without speech examples every time; persona 1: fixed on the re-ask.
    let answer: Answer = Arc::new(|body: &Value| {
        let i = persona_of(&json!({"messages": [body["messages"][0]]}));
        let asked = body["messages"].as_array().unwrap().len();
        let mut obj = profile(i).0;
        if i == 0 || asked == 1 {
            obj.as_object_mut().unwrap().remove("speech_examples");
        }
        Ok(obj.to_string())
    });
    let server = Server::start(answer);
    let p = project(2, &openai_provider(&server.url, "openai"), "max_failure_ratio = 1.0");
    run(&p, &[]).ok();
    let rows = parquet_rows(&p.path().join("out/profiles.parquet"));
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0]["id"].as_str(), rows[0]["attempts"].as_i64()), (Some("personas-1"), Some(2)));
    // The re-ask carries the validator's message, with where the problem is.
    let reask = server.bodies().into_iter().find(|b| b["messages"].as_array().unwrap().len() == 3).expect("a re-ask");
    let said = reask["messages"][2]["content"].as_str().unwrap();
    assert!(said.contains("does not follow the JSON Schema") && said.contains("speech_examples"), "{said}");
    let failed = failures(&p.path().join("out"), "profiles");
    assert_eq!(failed.len(), 1);
    let f = &failed[0];
    assert_eq!(f["id"], "personas-0");
    assert_eq!(f["kind"], "validation");
    let raw: Value = serde_json::from_str(f["raw"].as_str().unwrap()).unwrap();
    assert!(raw.get("role_name").is_some() && raw.get("speech_examples").is_none(), "the model's last answer: {raw}");
    let attempts = f["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "every attempt's reason: {attempts:?}");
    assert!(attempts.iter().all(|a| a.as_str().unwrap().contains("speech_examples")));
    let m = manifest(&p.path().join("out"));
    let metrics = &m["stages"]["profiles"]["report"]["metrics"];
    assert_eq!((metrics["answers.after_reask"].as_f64(), metrics["answers.failed"].as_f64()), (Some(1.0), Some(1.0)));
    // The key is in no failure row.
    assert!(
        !std::fs::read(p.path().join("out/profiles.failures.parquet"))
            .unwrap()
            .windows(KEY.len())
            .any(|w| w == KEY.as_bytes())
    );
}

#[test]
fn shipped_schemas_are_valid_meet_strict_mode_and_match_their_parsers() {
    let mut found = 0;
    let mut stack = vec![support::repo().join("pipelines/prompts")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(".schema.json") {
                found += 1;
                let file = synth::llm::schema::SchemaFile::load(&path, &path.display().to_string()).unwrap();
                // `*.local.schema.json`: for grammar-constrained decoders, strict mode not required.
                // The others meet it as strict mode gets them (without minLength and the like).
                if !path.to_string_lossy().ends_with(".local.schema.json") {
                    let sent = synth::llm::schema::strict_view(&file.request.schema);
                    assert_eq!(synth::llm::schema::strict_problem(&sent), None, "{}", path.display());
                }
            }
        }
    }
    assert!(found >= 15, "the shipped schemas: {found}");
    // Every shipped pipeline that names a schema validates (its parser reads the schema's keys).
    for entry in std::fs::read_dir(support::repo().join("pipelines")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if path.extension().is_some_and(|e| e == "toml") && text.contains("schema = ") {
            let p = Project::new();
            let mut profiles = vec!["offline"];
            if text.contains("[profiles.local]") {
                profiles.push("local");
            }
            for profile in profiles {
                let r = p.synth(&["validate", path.to_str().unwrap(), "--profile", profile]);
                let shared = support::repo().join("../shared/data");
                if r.code != 0 && !shared.is_dir() && r.stderr.contains("/shared/data/") {
                    eprintln!(
                        "SKIPPED: {} --profile {profile} reads {} (absent on this machine)",
                        path.display(),
                        shared.display()
                    );
                    continue;
                }
                // A pipeline that reads another pipeline's outputs (rolemrc-train-eval reads
                // outputs/rolemrc-*/): validated where those exist; its schemas are shared
                // with pipelines that validate on their own.
                let errors: Vec<&str> = r.stderr.lines().filter(|l| l.contains(": stage \"")).collect();
                if r.code != 0
                    && !errors.is_empty()
                    && errors.iter().all(|l| l.contains("no file matches") && l.contains("/outputs/"))
                {
                    eprintln!("SKIPPED: {} --profile {profile} reads another pipeline's outputs", path.display());
                    continue;
                }
                assert_eq!(r.code, 0, "{} --profile {profile}: {}", path.display(), r.stderr);
            }
        }
    }
}
