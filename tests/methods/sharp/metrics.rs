//! `sharp_metrics`, `sharp_transfer` and `sharp_vote` on hand-computed vectors: the spec's
//! toy vector (§3.6) read from JSONL (model level, per-role rows, a record without a stance
//! counted as unparsed, the detector's reliability), the pooled model level, the toy vector
//! with backbone stances (Table 5 in both modes, the backbone-vs-aligned table), and votes.

use std::path::{Path, PathBuf};

use super::repo;
use crate::support::{Project, parquet_rows};

type Rows = Vec<serde_json::Map<String, serde_json::Value>>;

/// `source` of a fixture, then one stage of the given kind with options; run into `out`.
fn run_on(p: &Project, fixture: &str, kind: &str, options: &str) -> PathBuf {
    let toml = format!(
        "[pipeline]\nname = \"toy\"\n\n[stages.input]\nkind = \"source\"\npath = {:?}\n\n[stages.stage]\nkind = \"{kind}\"\ninputs = [\"input\"]\n{options}\n",
        repo().join("tests/fixtures/sharp").join(fixture).to_string_lossy()
    );
    p.write("p.toml", toml);
    let out = p.path().join("out");
    p.synth(&["run", "p.toml", "--out", out.to_str().unwrap()]).ok();
    out
}

fn summary(out: &Path) -> Rows {
    parquet_rows(&out.join("stage.summary.parquet"))
}

fn value(rows: &Rows, table: &str, group: &str, metric: &str) -> f64 {
    rows.iter()
        .find(|r| r["table"] == table && r["group"] == group && r["metric"] == metric)
        .unwrap_or_else(|| panic!("no {table}/{group}/{metric} in {rows:?}"))["value"]
        .as_f64()
        .unwrap()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() < 1e-9, "{what}: {got} vs {want}");
}

#[test]
fn sharp_metrics_reproduce_the_toy_vector() {
    let p = Project::new();
    let out = run_on(&p, "toy_stances.jsonl", "sharp_metrics", "label = \"toy\"\ngold_column = \"gold\"");
    let rows = parquet_rows(&out.join("stage.parquet"));
    let ron = rows.iter().find(|r| r["role"] == "Ron").unwrap();
    assert_eq!((ron["sr"].as_f64(), ron["crf"].as_f64(), ron["unparsed"].as_u64()), (Some(0.5), Some(0.0), Some(1)));
    let malfoy = rows.iter().find(|r| r["role"] == "Malfoy").unwrap();
    assert_eq!((malfoy["ar"].as_f64(), malfoy["crf"].as_f64()), (Some(1.0), Some(1.0)));
    let s = summary(&out);
    for (metric, want) in [("sr", 25.0), ("ar", 75.0), ("er", 37.5), ("csvt", 12.5), ("crf", 50.0)] {
        close(value(&s, "sharp", "overall", metric), want, metric);
        let row = s.iter().find(|r| r["table"] == "sharp" && r["group"] == "overall" && r["metric"] == metric).unwrap();
        assert_eq!(
            (row["label"].as_str(), row["invalid"].as_u64()),
            (Some("toy"), Some(1)),
            "the record without a stance is counted"
        );
    }
    close(value(&s, "sharp", "overall", "unparsed"), 100.0 / 9.0, "1 of 9 answers unparsed");
    close(value(&s, "sharp", "Harry Potter / Malfoy", "crf"), 100.0, "per role");
    close(value(&s, "sharp_detector", "overall", "accuracy"), 75.0, "accuracy");
    close(value(&s, "sharp_detector", "overall", "macro_f1"), (4.0 / 6.0 + 0.75 + 1.0) / 3.0 * 100.0, "macro-F1");

    // Pooled counts: SR = 1 / 4 counterfactual answers, AR = 3 / 4, ER = 3 / 8, Csvt = 1 / 8,
    // CRF = (+1·1 − 1·0) / 4 + (−1·1 + 1·2) / 4.
    let q = Project::new();
    let out = run_on(&q, "toy_stances.jsonl", "sharp_metrics", "label = \"toy\"\nmodel_level = \"pooled\"");
    let s = summary(&out);
    for (metric, want) in [("sr", 25.0), ("ar", 75.0), ("er", 37.5), ("csvt", 12.5), ("crf", 50.0)] {
        close(value(&s, "sharp", "overall", metric), want, metric);
    }
}

#[test]
fn sharp_metrics_and_transfer_with_backbone_stances() {
    let p = Project::new();
    let out = run_on(&p, "toy_pairs.jsonl", "sharp_metrics", "label = \"rpa\"\nbackbone_column = \"stance_backbone\"");
    let s = summary(&out);
    // Backbone: Ron SR 0 AR 0; Malfoy SR 1 AR 1 ER 1 → model 50 / 50 / 50, Csvt 0.
    for (metric, want) in
        [("sr", 50.0), ("ar", 50.0), ("er", 50.0), ("csvt", 0.0), ("d_ar", 25.0), ("d_sr", -25.0), ("d_er", -12.5)]
    {
        close(value(&s, "sharp_backbone", "overall", metric), want, metric);
    }
    assert!(s.iter().any(|r| r["label"] == "backbone → rpa (en)"));
    let rows = parquet_rows(&out.join("stage.parquet"));
    assert_eq!(rows.iter().filter(|r| r["stances"] == "backbone").count(), 2);

    let q = Project::new();
    let out = run_on(&q, "toy_pairs.jsonl", "sharp_transfer", "backbone_column = \"stance_backbone\"");
    let s = summary(&out);
    let snow = "sharp_transfer_snowballing";
    close(value(&s, snow, "Favor", "against"), 100.0, "Favor→Against: low 2/2 − high 0/2");
    close(value(&s, snow, "Favor", "neutral"), -50.0, "Favor→Neutral: low 0 − high 1/2");
    close(value(&s, snow, "Against", "favor"), 50.0, "Against→Favor: high 1/2 − low 0");
    close(value(&s, snow, "Against", "neutral"), 0.0, "Against→Neutral");
    assert!(!s.iter().any(|r| r["table"] == snow && r["group"] == "Neutral"), "no backbone NEUTRAL: no row");
    close(value(&s, snow, "overall", "neutral"), -25.0, "the column's mean");
    let fact = "sharp_transfer_factual";
    close(value(&s, fact, "Factual", "against"), 100.0, "F→Against");
    close(value(&s, fact, "Factual", "neutral"), -50.0, "F→Neutral");
    close(value(&s, fact, "Counter-Factual", "favor"), 50.0, "CF→Favor");
    close(value(&s, fact, "Counter-Factual", "neutral"), 0.0, "CF→Neutral");
    assert!(s.iter().all(|r| r["label"] == "en"));
    // The columns come in the paper's order.
    let headings: Vec<&str> =
        s.iter().filter(|r| r["table"] == snow).map(|r| r["heading"].as_str().unwrap()).take(3).collect();
    assert_eq!(headings, ["Favor", "Against", "Neutral"]);
    // Excluding the only low-affection role leaves no difference to report.
    let r = Project::new();
    let out = run_on(&r, "toy_pairs.jsonl", "sharp_transfer", "exclude_scripts = [\"Harry Potter\"]");
    assert!(summary(&out).is_empty());
}

#[test]
fn sharp_vote_takes_the_majority() {
    let p = Project::new();
    let out = run_on(&p, "toy_samples.jsonl", "sharp_vote", "tie = \"neutral\"");
    let rows = parquet_rows(&out.join("stage.parquet"));
    let got: Vec<(&str, Option<&str>, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap(),
                r["stance"].as_str(),
                r["votes"].as_str().unwrap(),
                r["samples"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", Some("FAVOR"), "FAVOR:2 AGAINST:1", 3),
            ("b", Some("NEUTRAL"), "FAVOR:1 AGAINST:1 NEUTRAL:1", 3),
            ("c", Some("AGAINST"), "AGAINST:1", 1),
            ("d", None, "", 0),
        ]
    );
    assert!((rows[0]["agreement"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert!(!rows[0].contains_key("sample"));
    let q = Project::new();
    let out = run_on(&q, "toy_samples.jsonl", "sharp_vote", "tie = \"first\"");
    assert_eq!(parquet_rows(&out.join("stage.parquet"))[1]["stance"], "FAVOR", "the earliest tied sample");
}
