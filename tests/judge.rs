//! The engine's judge kinds on a made-up judge folder (`tests/fixtures/judge/`): queries
//! from `tasks.json` with the row's columns and the query's own variables, `repeat`, a row
//! whose task has no entry in the failures table, scores by `int` and `regex` extraction,
//! the summary protocol with the headings of `dimensions.json`, and `report` rendering it.

use std::path::Path;

use crate::support;
use support::{Project, parquet_rows};

const ROWS: &str = r#"{"id": "a", "task": "chat", "question": "Where is Paris?", "answer": "In France."}
{"id": "b", "task": "summary", "question": "Sum up the day.", "answer": "Busy."}
{"id": "c", "task": "poetry", "question": "A haiku?", "answer": "No."}
"#;

fn pipeline(p: &Project) -> std::path::PathBuf {
    p.write("rows.jsonl", ROWS);
    let repo = env!("CARGO_MANIFEST_DIR");
    let out = p.path().join("out");
    let rows = p.path().join("rows.jsonl");
    p.write(
        "judge.toml",
        format!(
            r#"[pipeline]
name = "judge"
root = "{repo}"
output_dir = "{out}"

[providers.judge]
kind = "offline"
score_one = 1.0

[stages.rows]
kind = "source"
path = "{rows}"

[stages.queries]
kind = "judge_plan"
inputs = ["rows"]
prompts_dir = "tests/fixtures/judge"
repeat = {{ fluency = 2 }}
max_failure_ratio = 0.5

[stages.judged]
kind = "llm"
inputs = ["queries"]
provider = "judge"
prompt = "tests/fixtures/judge/query.j2"
parser = "text"
parser_options = {{ min_chars = 0, shape = "score" }}
max_attempts = 1
keep_columns = ["dimension"]

[stages.scores]
kind = "judge_score"
inputs = ["queries", "judged"]
dimensions = "tests/fixtures/judge/dimensions.json"
score_prefix = "Score:"
label = "m"

[stages.report]
kind = "report"
inputs = ["scores"]
"#,
            out = out.display(),
            rows = rows.display()
        ),
    )
}

#[test]
fn a_judge_is_a_folder_of_data() {
    let p = Project::new();
    let file = pipeline(&p);
    p.synth(&["run", file.to_str().unwrap()]).ok();
    let out = p.path().join("out");

    let queries = parquet_rows(&out.join("queries.parquet"));
    let ids: Vec<&str> = queries.iter().map(|q| q["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a#fluency", "a#fluency#2", "a#faithfulness", "b#faithfulness"]);
    let faithful = queries.iter().find(|q| q["id"] == "a#faithfulness").unwrap()["prompt"].as_str().unwrap();
    assert!(faithful.contains("(strict: yes)") && faithful.contains("Question: Where is Paris?"), "{faithful}");
    assert!(faithful.contains("Answer: In France."), "{faithful}");
    let failures = parquet_rows(&out.join("queries.failures.parquet"));
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0]["id"].as_str(), failures[0]["kind"].as_str()), (Some("c"), Some("judge_plan")));
    assert!(failures[0]["message"].as_str().unwrap().contains("\"poetry\""), "{:?}", failures[0]);

    // score_one = 1: every answer is "Score: 1".
    let summary = parquet_rows(&out.join("scores.summary.parquet"));
    let got: Vec<(&str, &str, u64, f64)> = summary
        .iter()
        .map(|r| {
            (
                r["metric"].as_str().unwrap(),
                r["heading"].as_str().unwrap(),
                r["n"].as_u64().unwrap(),
                r["value"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [("fluency", "Fluency", 2, 1.0), ("faithfulness", "Faithfulness", 2, 1.0)]);
    assert!(summary.iter().all(|r| r["label"] == "m" && r["table"] == "judge" && r["invalid"] == 0));

    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## LLM-as-judge (accuracy per dimension)"), "{md}");
    assert!(md.contains("| Model | Fluency | Faithfulness |") && md.contains("| m | 1.0000 | 1.0000 |"), "{md}");
    assert!(std::fs::read_to_string(out.join("judge.svg")).unwrap().contains(">Faithfulness<"));
}

#[test]
fn judge_score_extracts_by_pattern() {
    let p = Project::new();
    let file = pipeline(&p);
    let f = file.to_str().unwrap();
    // A pattern that reads the digit after "Score:" scores like `int`.
    p.synth(&[
        "run",
        f,
        "--set",
        "stages.scores.extract=\"regex\"",
        "--set",
        r#"stages.scores.pattern="Score:\\s*(\\d)""#,
    ])
    .ok();
    let summary = parquet_rows(&p.path().join("out/scores.summary.parquet"));
    assert!(summary.iter().all(|r| r["value"] == 1.0 && r["invalid"] == 0), "{summary:?}");
    // One that never matches: every answer is a bad judge response, scored 0.
    p.synth(&[
        "run",
        f,
        "--set",
        "stages.scores.extract=\"regex\"",
        "--set",
        "stages.scores.pattern=\"Rating (\\\\d)\"",
    ])
    .ok();
    let summary = parquet_rows(&p.path().join("out/scores.summary.parquet"));
    assert!(summary.iter().all(|r| r["value"] == 0.0 && r["invalid"] == r["n"]), "{summary:?}");
}

#[test]
fn a_bad_judge_folder_is_named() {
    let p = Project::new();
    let file = pipeline(&p);
    let dir = p.path().join("badjudge");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["dimensions.json", "fluency.j2", "faithfulness.j2"] {
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/judge").join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tasks.json"), r#"{"chat": [{"dimension": "tone"}]}"#).unwrap();
    let r = p
        .synth(&[
            "validate",
            file.to_str().unwrap(),
            "--set",
            &format!("stages.queries.prompts_dir=\"{}\"", dir.display()),
        ])
        .code(78);
    assert!(r.stderr.contains("tasks.json") && r.stderr.contains("unknown dimension \"tone\""), "{}", r.stderr);
    assert!(r.stderr.contains("dimensions.json lists: fluency, faithfulness"), "{}", r.stderr);
    // judge_score without extract = regex's pattern.
    let r = p.synth(&["validate", file.to_str().unwrap(), "--set", "stages.scores.extract=\"regex\""]).code(78);
    assert!(r.stderr.contains("needs a pattern"), "{}", r.stderr);
}

#[test]
fn report_reads_only_evaluation_stages() {
    let p = Project::new();
    let file = pipeline(&p);
    let r = p
        .synth(&["validate", file.to_str().unwrap(), "--set", "stages.report.inputs=[\"scores\", \"queries\"]"])
        .code(78);
    assert!(r.stderr.contains("input \"queries\" (judge_plan) writes no summary"), "{}", r.stderr);
}

#[test]
fn sharded_judge_queries_and_answers_are_the_bytes_of_one_process() {
    let p = Project::new();
    let file = pipeline(&p);
    let file = file.to_str().unwrap();
    p.synth(&["run", file, "--out", "one", "-q"]).ok();
    p.synth(&["run", file, "--out", "two", "--shards", "2", "--executor", "local", "-q"]).ok();
    support::assert_same_outputs(&p.path().join("one"), &p.path().join("two"));
    // The queries are planned in the wave of the LLM stage that answers them; scoring
    // (majority votes, the summary) runs once, after the merge.
    let status = p.synth(&["status", "two"]).ok().stdout;
    assert!(status.contains("wave 1 (2 shards, limits divided by 2): queries, judged"), "{status}");
}
