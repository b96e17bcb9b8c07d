//! Bad input: rows of the release that cannot be used go to the failure table naming
//! `file:line` and the rest is evaluated; a file without a column, and an answer key
//! with a letter outside A–D, stop the run with a message naming `file:line`.

use super::{failures, run};
use crate::support::{Project, parquet_rows};

const FIX: &str = "tests/fixtures/roleeval";

/// `--set` arguments that point the pipeline at a fixture release (global games only).
fn release(dir: &str) -> Vec<String> {
    let mut args = Vec::new();
    for stage in ["test", "dev"] {
        args.push("--set".into());
        args.push(format!("stages.{stage}.path=\"{FIX}/{dir}\""));
        args.push("--set".into());
        args.push(format!("stages.{stage}.subsets=[\"global\"]"));
        args.push("--set".into());
        args.push(format!("stages.{stage}.categories=[\"games\"]"));
        args.push("--set".into());
        args.push(format!("stages.{stage}.max_failure_ratio=1.0"));
    }
    args
}

fn with_key(mut args: Vec<String>, key: &str) -> Vec<String> {
    for stage in ["chat_scores", "open_scores"] {
        args.push("--set".into());
        args.push(format!("stages.{stage}.key=\"{FIX}/{key}\""));
    }
    args
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn bad_rows_go_to_the_failure_table_with_file_and_line() {
    let p = Project::new();
    let args = with_key(release("bad_release"), "key.csv");
    let (out, r) = run(&p, "out", &strs(&args));
    r.ok();
    let test = parquet_rows(&out.join("test.parquet"));
    let ids: Vec<&str> = test.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["global/games/0", "global/games/2"]);
    let f = failures(&out, "test");
    let mut msgs: Vec<(&str, &str)> =
        f.iter().map(|r| (r["id"].as_str().unwrap(), r["message"].as_str().unwrap())).collect();
    msgs.sort_by_key(|(_, m)| m.to_string());
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0].0, "global/games/1");
    assert!(msgs[0].1.ends_with("zh/global/test/games_test.csv:3: empty option B"), "{}", msgs[0].1);
    assert_eq!(msgs[1].0, "global/games/0");
    assert!(
        msgs[1].1.contains("zh/global/test/games_test.csv:4: duplicate key \"global/games/0\" (first at "),
        "{}",
        msgs[1].1
    );
    assert!(msgs[1].1.ends_with("games_test.csv:2)"), "{}", msgs[1].1);
    assert!(f.iter().all(|r| r["kind"] == "parse" && r["record"].is_string()));
    let dev = failures(&out, "dev");
    assert_eq!(dev.len(), 1);
    assert!(dev[0]["message"].as_str().unwrap().ends_with("games_dev.csv:3: answer \"E\" is not one of A/B/C/D"));
    // The good rows are evaluated: 2 questions x 2 settings, scored against the fixture key.
    assert_eq!(parquet_rows(&out.join("dev.parquet")).len(), 5);
    let scores = parquet_rows(&out.join("open_scores.parquet"));
    assert_eq!(scores.len(), 4);
    assert!(scores.iter().all(|r| r["correct"].is_boolean()));
    let report = parquet_rows(&out.join("report.parquet"));
    let reasoning = report.iter().find(|r| r["label"] == "open" && r["metric"] == "global_5shot_reasoning").unwrap();
    assert_eq!(reasoning["n"], 1);
}

#[test]
fn a_missing_column_stops_the_run_naming_the_file() {
    let p = Project::new();
    let args = release("missing_column");
    let (_, r) = run(&p, "out", &strs(&args));
    let r = r.code(2);
    assert!(r.stderr.contains("missing_column/zh/global/test/games_test.csv:1: no column \"D\""), "{}", r.stderr);
}

#[test]
fn a_bad_answer_key_stops_the_run_naming_the_line() {
    let p = Project::new();
    let args = with_key(release("bad_release"), "bad_key.csv");
    let (_, r) = run(&p, "out", &strs(&args));
    let r = r.code(2);
    assert!(r.stderr.contains("bad_key.csv:3: answer \"F\" of global/games/2 is not one of A/B/C/D"), "{}", r.stderr);
}
