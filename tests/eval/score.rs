//! `synth score` and the `metrics` stage on the parity fixture: per-sample scores equal
//! the stored Python reference values (tests/fixtures/eval/*.expected.jsonl), the summary
//! is the mean and population std, groups work, and bad input names file, line and field.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::eval_fixtures::wordnet_installed;
use support::{Project, Run, parquet_rows};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval").join(name)
}

/// `synth score --input INPUT --metrics METRICS --out OUT EXTRA...` in `p`.
fn synth_score(p: &Project, input: &Path, metrics: &str, out: &Path, extra: &[&str]) -> Run {
    let mut args =
        vec!["score", "--input", input.to_str().unwrap(), "--metrics", metrics, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    p.synth(&args)
}

fn expected(name: &str) -> BTreeMap<String, serde_json::Map<String, Value>> {
    std::fs::read_to_string(fixture(name))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap();
            (v["id"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

#[test]
fn score_matches_the_reference_values() {
    let p = Project::new();
    let with_meteor = wordnet_installed();
    let metrics = if with_meteor { "bleu,rouge,meteor" } else { "bleu,rouge" };
    let out = p.path().join("scores.parquet");
    let input = fixture("pairs.jsonl");
    // The fixture holds the official evaluation.py's values: ROUGE in its order.
    let r = synth_score(&p, &input, metrics, &out, &["--rouge-target", "response"]).ok();
    let summary: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let rows = parquet_rows(&out);
    let br = expected("bleu_rouge.expected.jsonl");
    let me = expected("meteor.expected.jsonl");
    assert_eq!(rows.len(), br.len());
    let mut sums: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for row in &rows {
        let id = row["id"].as_str().unwrap();
        let mut want = br[id].clone();
        if with_meteor {
            want.insert("meteor".into(), me[id]["meteor"].clone());
        }
        for m in ["bleu", "rouge1", "rouge2", "rougeL", "rougeLsum", "meteor"] {
            let Some(w) = want.get(m).and_then(Value::as_f64) else { continue };
            let got = row[m].as_f64().unwrap();
            assert!((got - w).abs() < 1e-6, "{id} {m}: synth {got} python {w}");
            // The official summary leaves out a BLEU that evaluate could not compute.
            if m == "bleu" && want["bleu_undefined"] == true {
                continue;
            }
            sums.entry(m).or_default().push(w);
        }
    }
    assert_eq!(sums["bleu"].len(), rows.len() - 9, "the 9 pairs with an empty side have no BLEU in the summary");
    for (m, v) in sums {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt();
        let s = &summary["summary"]["overall"][m];
        assert_eq!(s["n"].as_u64(), Some(v.len() as u64), "{m} n");
        assert!((s["mean"].as_f64().unwrap() - mean).abs() < 1e-9, "{m} mean");
        assert!((s["std"].as_f64().unwrap() - std).abs() < 1e-9, "{m} std (population)");
    }
}

#[test]
fn score_reports_bad_input_with_file_line_and_field() {
    let p = Project::new();
    p.write(
        "pairs.jsonl",
        "{\"response\": \"a b c d e\", \"reference\": \"a b c d e\"}\n{\"id\": \"x7\", \"answer\": \"a\", \"reference\": \"b\"}\n\
         not json\n\n{\"response\": 3, \"reference\": \"b\"}\n",
    );
    let out = p.path().join("o.jsonl");
    let failures = p.path().join("o.failures.parquet");
    let input = p.path().join("pairs.jsonl");
    // By default the good rows are scored and every bad one is kept with its reason.
    let r = synth_score(&p, &input, "bleu", &out, &[]).ok();
    assert!(r.stderr.contains("3 row(s)") && r.stderr.contains("pairs.jsonl:2: no field \"response\""), "{}", r.stderr);
    let summary: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!((summary["rows"].as_u64(), summary["failed"].as_u64()), (Some(1), Some(3)), "{summary}");
    assert_eq!(summary["summary"]["overall"]["bleu"]["mean"].as_f64(), Some(1.0));
    let scored = std::fs::read_to_string(&out).unwrap();
    assert_eq!(scored.lines().count(), 1, "{scored}");
    let bad = parquet_rows(&failures);
    let got: Vec<(&str, &str)> = bad.iter().map(|f| (f["id"].as_str().unwrap(), f["kind"].as_str().unwrap())).collect();
    assert_eq!(got, vec![("line-3", "parse"), ("row-5", "schema"), ("x7", "schema")]);
    assert!(bad[1]["message"].as_str().unwrap().ends_with("pairs.jsonl:5: field \"response\" is not a string: 3"));
    assert_eq!(bad[0]["record"].as_str(), Some("not json"));
    // --strict stops at the first one and writes nothing.
    std::fs::remove_file(&out).unwrap();
    let r = synth_score(&p, &input, "bleu", &out, &["--strict"]).code(2);
    assert!(r.stderr.contains("pairs.jsonl:2: no field \"response\""), "{}", r.stderr);
    assert!(!out.exists(), "nothing written with --strict");
    // A clean input removes the earlier failures file.
    p.write("pairs.jsonl", "{\"response\": \"a\", \"reference\": \"b\"}\n");
    synth_score(&p, &input, "bleu", &out, &[]).ok();
    assert!(!failures.exists(), "stale failures file removed");
    // Only bad rows: an error that points at the failures.
    p.write("pairs.jsonl", "[1]\n");
    let r = synth_score(&p, &input, "bleu", &out, &[]).code(2);
    assert!(r.stderr.contains("none of its 1 rows could be scored"), "{}", r.stderr);
    let r = synth_score(&p, &input, "blue", &out, &[]).code(2);
    assert!(r.stderr.contains("unknown metric \"blue\""), "{}", r.stderr);
}

/// `--rouge-target reference` scores ROUGE-Lsum in rouge_score's documented order (the
/// default is the official evaluation's `score(response, reference)`).
#[test]
fn rouge_target_option_switches_the_lsum_order() {
    let p = Project::new();
    let input = fixture("pairs.jsonl");
    let br = expected("bleu_rouge.expected.jsonl");
    for (target, key) in [("response", "rougeLsum"), ("reference", "rougeLsum_target_reference")] {
        let out = p.path().join(format!("{target}.parquet"));
        synth_score(&p, &input, "rouge", &out, &["--rouge-target", target]).ok();
        let rows = parquet_rows(&out);
        let mut differs = 0;
        for row in &rows {
            let want = &br[row["id"].as_str().unwrap()];
            let got = row["rougeLsum"].as_f64().unwrap();
            assert!((got - want[key].as_f64().unwrap()).abs() < 1e-9, "{target}: {row:?}");
            differs += usize::from(
                (want["rougeLsum"].as_f64().unwrap() - want["rougeLsum_target_reference"].as_f64().unwrap()).abs()
                    > 1e-9,
            );
        }
        assert!(differs >= 3, "the fixture has pairs where the order matters");
    }
}

/// A Parquet input without the asked-for column is an error naming the file and columns.
#[test]
fn score_names_a_missing_parquet_column() {
    let p = Project::new();
    p.write("pairs.jsonl", "{\"response\": \"a b\", \"reference\": \"a b\"}\n");
    let scores = p.path().join("s.parquet");
    let input = p.path().join("pairs.jsonl");
    synth_score(&p, &input, "bleu", &scores, &[]).ok();
    // The scores file has no "response" column: scoring it must say so.
    let r = synth_score(&p, &scores, "bleu", &p.path().join("t.jsonl"), &[]).code(2);
    assert!(r.stderr.contains("s.parquet: no column \"response\" (columns: id"), "{}", r.stderr);
}

/// The metrics stage inside the offline evaluation pipeline: per-task and overall
/// summaries, and the report's Table 3 row.
#[test]
fn metrics_stage_groups_by_task() {
    if !wordnet_installed() {
        return;
    }
    let p = Project::new();
    let dir = p.path().join("eval");
    let pipeline = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/rolemrc-eval.toml");
    p.synth(&["run", pipeline.to_str().unwrap(), "--offline", "--out", dir.to_str().unwrap()]).ok();
    let per_row = parquet_rows(&dir.join("metrics.parquet"));
    assert_eq!(per_row.len(), 64);
    let summary = parquet_rows(&dir.join("metrics.summary.parquet"));
    let groups: std::collections::BTreeSet<&str> = summary.iter().map(|r| r["group"].as_str().unwrap()).collect();
    assert!(groups.contains("overall") && groups.len() > 10, "{groups:?}");
    let overall_bleu = summary.iter().find(|r| r["group"] == "overall" && r["metric"] == "bleu").unwrap();
    let mean = per_row.iter().map(|r| r["bleu"].as_f64().unwrap()).sum::<f64>() / 64.0;
    assert!((overall_bleu["value"].as_f64().unwrap() - mean).abs() < 1e-12);
    assert_eq!(overall_bleu["table"], "metrics");
    assert_eq!(overall_bleu["heading"], "BLEU");
    assert_eq!(overall_bleu["label"], "candidate");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("| Model | BLEU | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum | METEOR |"), "{md}");
    assert!(md.contains("| candidate | ") && md.contains("Table 9"), "{md}");
    // The per-task breakdown of the grouped metrics, one row per task.
    let by_group = md.split("### ").nth(1).expect("a breakdown table").split("\n## ").next().unwrap();
    assert!(by_group.starts_with("Reference-based metrics (Table 3 layout; means over the test set) by group"), "{md}");
    assert_eq!(by_group.matches("| candidate | ").count(), groups.len() - 1, "{md}");
}

/// Several candidates in one pipeline (`pipelines/rolemrc-compare.toml`): one report row per
/// model in both tables, one radar series each, the numbers in Parquet under each label; two
/// inputs giving the same number for one label are an error, not a silent overwrite.
#[test]
fn one_report_compares_several_models() {
    let p = Project::new();
    let dir = p.path().join("cmp");
    let pipeline = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/rolemrc-compare.toml");
    let mut args = vec!["run", pipeline.to_str().unwrap(), "--offline", "--out", dir.to_str().unwrap()];
    // BLEU and ROUGE only: no WordNet needed.
    args.extend(["--set", "stages.metrics_a.metrics=[\"bleu\", \"rouge\"]"]);
    args.extend(["--set", "stages.metrics_b.metrics=[\"bleu\", \"rouge\"]"]);
    p.synth(&args).ok();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    // Blocks of the report (headings, tables): each label has a row in the Table 3 table,
    // rows in the per-task breakdown and a row in the Table 9 table.
    for label in ["model A", "model B"] {
        let row = format!("| {label} | ");
        let per_block: Vec<usize> = md.split("\n\n").map(|b| b.matches(&row).count()).filter(|n| *n > 0).collect();
        // The Table 3 row, the breakdown (one row per task), the Table 9 row.
        assert_eq!(per_block.len(), 3, "{label}: {md}");
        assert_eq!((per_block[0], per_block[2]), (1, 1), "a Table 3 and a Table 9 row for {label}: {md}");
    }
    let svg = std::fs::read_to_string(dir.join("judge.svg")).unwrap();
    assert!(svg.contains(">model A<") && svg.contains(">model B<"), "{svg}");
    let table = parquet_rows(&dir.join("report.parquet"));
    let value = |label: &str, metric: &str| {
        table
            .iter()
            .find(|r| r["label"] == label && r["metric"] == metric && r["group"] == "overall")
            .map(|r| r["value"].as_f64().unwrap())
    };
    // Each label's numbers are its own chain's: the per-row means of its metrics stage.
    for (label, stage) in [("model A", "metrics_a"), ("model B", "metrics_b")] {
        let rows = parquet_rows(&dir.join(format!("{stage}.parquet")));
        let mean = rows.iter().map(|r| r["rouge1"].as_f64().unwrap()).sum::<f64>() / rows.len() as f64;
        let got = value(label, "rouge1").unwrap();
        assert!((got - mean).abs() < 1e-12, "{label}: report {got}, {stage} {mean}");
    }
    assert!(value("model A", "knowledge_range").is_some() && value("model B", "knowledge_range").is_some());

    args.extend(["--set", "stages.metrics_b.label=\"model A\""]);
    let r = p.synth(&args).code(2);
    assert!(
        r.stderr.contains("inputs \"metrics_a\" and \"metrics_b\" both report") && r.stderr.contains("\"model A\""),
        "{}",
        r.stderr
    );
}

/// `generate` as the official evaluation calls the model: the test conversation sent as
/// it is (roles lowercased), temperature 0, 256 tokens, the answer kept untrimmed.
#[test]
fn generate_sends_the_conversation_with_official_settings() {
    use std::sync::{Arc, Mutex};
    use support::openai_server::{self, Behaviour};
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = bodies.clone();
    let server = openai_server::start(Behaviour {
        responder: Arc::new(move |b: &Value| {
            seen.lock().unwrap().push(b.clone());
            if b["messages"][0]["content"].as_str().unwrap_or_default().contains("Score:") {
                "Score: 1".into()
            } else {
                "  (smiles) An answer.\n".into()
            }
        }),
        ..Default::default()
    });
    let p = Project::new();
    let dir = p.path().join("gen");
    let pipeline = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/rolemrc-eval.toml");
    let url = server.base_url();
    let sets = [
        format!("providers.candidate.base_url=\"{url}\""),
        "providers.candidate.model=\"cand\"".to_string(),
        format!("providers.judge.base_url=\"{url}\""),
        "stages.metrics.metrics=[\"bleu\", \"rouge\"]".to_string(),
    ];
    let mut args = vec!["run", pipeline.to_str().unwrap(), "--out", dir.to_str().unwrap()];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    p.synth_env(&args, &[("CANDIDATE_API_KEY", "k-cand-1234567"), ("OPENAI_API_KEY", "k-judge-1234567")]).ok();
    let test: Vec<Value> = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/data/rolemrc-demo/answered_test.jsonl"),
    )
    .unwrap()
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let bodies = bodies.lock().unwrap().clone();
    let cand: Vec<&Value> = bodies.iter().filter(|b| b["model"] == "cand").collect();
    assert_eq!(cand.len(), test.len());
    for b in &cand {
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["max_tokens"], 256);
        let roles: Vec<&str> = b["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles[0], "system");
        assert!(test.iter().any(|t| t["question"].as_array().unwrap().len() == roles.len()
            && t["question"][0]["content"] == b["messages"][0]["content"]));
    }
    let answered = parquet_rows(&dir.join("answered.parquet"));
    assert!(answered.iter().all(|r| r["response"] == "  (smiles) An answer.\n"), "kept as written");
}

/// `--punkt-dir` loads a punkt_tab model for METEOR's sentence splitting: an abbreviation
/// it knows keeps "Dr." one token (as NLTK's English model would); a missing file is named.
#[test]
fn punkt_model_changes_meteor_tokenization_only_where_it_should() {
    if !wordnet_installed() {
        return;
    }
    let p = Project::new();
    p.write(
        "pairs.jsonl",
        "{\"id\": \"a\", \"response\": \"I met Dr. Brown there.\", \"reference\": \"I met Dr Brown there.\"}\n",
    );
    for (f, text) in
        [("collocations.tab", ""), ("sent_starters.txt", ""), ("abbrev_types.txt", "dr\n"), ("ortho_context.tab", "")]
    {
        p.write(&format!("punkt/{f}"), text);
    }
    let input = p.path().join("pairs.jsonl");
    let score = |extra: &[&str]| -> f64 {
        let r = synth_score(&p, &input, "meteor", &p.path().join("s.jsonl"), extra).ok();
        let v: Value = serde_json::from_str(r.stdout.trim()).unwrap();
        v["summary"]["overall"]["meteor"]["mean"].as_f64().unwrap()
    };
    let punkt = p.path().join("punkt");
    let untrained = score(&[]);
    let trained = score(&["--punkt-dir", punkt.to_str().unwrap()]);
    assert!(untrained > 0.0 && trained > 0.0);
    assert_ne!(untrained, trained, "\"Dr.\" is split differently with the abbreviation known");
    std::fs::remove_file(punkt.join("ortho_context.tab")).unwrap();
    let r =
        synth_score(&p, &input, "meteor", &p.path().join("s.jsonl"), &["--punkt-dir", punkt.to_str().unwrap()]).code(2);
    assert!(r.stderr.contains("ortho_context.tab"), "{}", r.stderr);
}
