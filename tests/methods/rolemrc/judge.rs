//! RoleMRC LLM-as-judge (`pipelines/rolemrc-judge.toml`) against the project's loopback
//! OpenAI-compatible server with scripted judge answers: well-formed ("Score: 1"), bare
//! ("0"), garbage and empty. Checks the queries (official task → dimension mapping,
//! prompt rendering, one user message, temperature 0.7, max_tokens 4), the official score
//! extraction, bad-response counts, accuracy per dimension and the priority compat switch.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use support::openai_server::{self, Behaviour};
use support::{Project, parquet_rows, repo};

/// The scripted answer of the judge per dimension, recognised by the prompt's wording.
fn scripted(prompt: &str) -> (&'static str, &'static str) {
    if prompt.contains("**knowledge range**") {
        ("knowledge_range", "Score: 1")
    } else if prompt.contains("**character's speech style**") {
        ("style_compliance", "0")
    } else if prompt.contains("**nested** system level requirement") {
        ("nested_instruction", "It follows it")
    } else if prompt.contains("**multi-turn instruction**") {
        ("multi_turn_instruction", "")
    } else if prompt.contains("**priority of instructions**") {
        ("instruction_priority", " 1\n")
    } else {
        panic!("not a judge prompt: {prompt}")
    }
}

/// Expected queries per dimension: the answered demo file through tasks.json.
fn expected_counts(priority_twice: bool) -> BTreeMap<String, u64> {
    let tasks: BTreeMap<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(repo().join("pipelines/prompts/rolemrc/judge/tasks.json")).unwrap(),
    )
    .unwrap();
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(repo().join("pipelines/data/rolemrc-demo/answered_test.jsonl")).unwrap().lines()
    {
        let row: Value = serde_json::from_str(line).unwrap();
        for q in tasks[row["task"].as_str().unwrap()].as_array().unwrap() {
            let d = q["dimension"].as_str().unwrap().to_string();
            *counts.entry(d.clone()).or_default() += if priority_twice && d == "instruction_priority" { 2 } else { 1 };
        }
    }
    counts
}

fn run_judge(p: &Project, out: &str, extra: &[&str]) -> (PathBuf, Vec<Value>) {
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = bodies.clone();
    let server = openai_server::start(Behaviour {
        api_key: Some("sk-judge-test-0000".into()),
        responder: Arc::new(move |body: &Value| {
            seen.lock().unwrap().push(body.clone());
            scripted(body["messages"][0]["content"].as_str().unwrap()).1.to_string()
        }),
        ..Default::default()
    });
    let dir = p.path().join(out);
    let pipeline = repo().join("pipelines/rolemrc-judge.toml");
    let url = server.base_url();
    let mut args = vec!["run", pipeline.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--set"];
    let base = format!("providers.judge.base_url=\"{url}\"");
    args.push(&base);
    args.extend_from_slice(extra);
    p.synth_env(&args, &[("OPENAI_API_KEY", "sk-judge-test-0000")]).ok();
    let bodies = bodies.lock().unwrap().clone();
    (dir, bodies)
}

#[test]
fn judge_scores_as_the_official_code() {
    let p = Project::new();
    let (dir, bodies) = run_judge(&p, "j", &[]);
    let expected = expected_counts(false);
    let total: u64 = expected.values().sum();
    assert_eq!(bodies.len() as u64, total, "one request per query");
    for b in &bodies {
        let messages = b["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0]["role"], "user");
        let prompt = messages[0]["content"].as_str().unwrap();
        assert!(prompt.starts_with("\n# An LLM is playing a specific character"), "{prompt}");
        assert!(prompt.ends_with("Score:\n"), "{prompt:?}");
        assert!(prompt.contains("System Instruction: \"") && prompt.contains("\nUser Query: \""), "{prompt}");
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(b["max_tokens"], 4);
    }
    // Nested prompts carry the rule, extracted as the official code does.
    let nested: Vec<&str> = bodies
        .iter()
        .map(|b| b["messages"][0]["content"].as_str().unwrap())
        .filter(|p| p.contains("**nested**"))
        .collect();
    assert!(!nested.is_empty());
    for n in nested {
        assert!(!n.contains("(** Play this role") && !n.contains("You are a helpful AI assistant**"), "{n}");
    }

    let summary = parquet_rows(&dir.join("scores.summary.parquet"));
    let by_dim: BTreeMap<String, &serde_json::Map<String, Value>> =
        summary.iter().map(|r| (r["metric"].as_str().unwrap().to_string(), r)).collect();
    // The summary protocol: one table "judge", headings from dimensions.json, in its order.
    let order: Vec<&str> = summary.iter().map(|r| r["metric"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        ["knowledge_range", "style_compliance", "nested_instruction", "multi_turn_instruction", "instruction_priority"]
    );
    assert!(summary.iter().all(|r| r["table"] == "judge" && r["group"] == "overall"));
    assert_eq!(by_dim["multi_turn_instruction"]["heading"], "Multi-turn Instruction");
    let want = [
        ("knowledge_range", 1.0, false),
        ("style_compliance", 0.0, false),
        ("nested_instruction", 0.0, true),
        ("multi_turn_instruction", 0.0, true),
        ("instruction_priority", 1.0, false),
    ];
    for (d, acc, all_bad) in want {
        let r = by_dim[d];
        assert_eq!(r["n"], expected[d], "{d}");
        assert_eq!(r["value"], acc, "{d}");
        assert_eq!(r["invalid"], if all_bad { expected[d] } else { 0 }, "{d}");
    }
    let scores = parquet_rows(&dir.join("scores.parquet"));
    assert_eq!(scores.len() as u64, total);

    // The report: Table 9 layout, the radar chart, the numbers as Parquet.
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| answers | 1.0000 | 0.0000 | 0.0000 | 0.0000 | 1.0000 |"), "{md}");
    let svg = std::fs::read_to_string(dir.join("judge.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("fill-opacity") && svg.contains("Knowledge Range"));
    let table = parquet_rows(&dir.join("report.parquet"));
    assert_eq!(table.len(), 5);
}

#[test]
fn priority_twice_reproduces_the_official_double_count() {
    let p = Project::new();
    let (dir, _) = run_judge(&p, "j2", &["--set", "stages.queries.priority_twice=true"]);
    let expected = expected_counts(true);
    let summary = parquet_rows(&dir.join("scores.summary.parquet"));
    let pr = summary.iter().find(|r| r["metric"] == "instruction_priority").unwrap();
    assert_eq!(pr["n"], expected["instruction_priority"]);
    assert!(expected["instruction_priority"] > 0);
}
