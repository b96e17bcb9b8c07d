//! `sharp_metrics` on the spec's toy vector (§3.6) read from JSONL: the model-level numbers,
//! the per-role rows, a record without a stance counted as invalid, and the detector's
//! reliability against gold labels.

use super::repo;
use crate::support::{Project, parquet_rows};

#[test]
fn sharp_metrics_reproduce_the_toy_vector() {
    let p = Project::new();
    let toml = format!(
        "[pipeline]\nname = \"toy\"\n\n[stages.stances]\nkind = \"source\"\npath = {:?}\n\n[stages.metrics]\nkind = \"sharp_metrics\"\ninputs = [\"stances\"]\nlabel = \"toy\"\ngold_column = \"gold\"\n",
        repo().join("tests/fixtures/sharp/toy_stances.jsonl").to_string_lossy()
    );
    p.write("p.toml", toml);
    let out = p.path().join("out");
    p.synth(&["run", "p.toml", "--out", out.to_str().unwrap()]).ok();
    let rows = parquet_rows(&out.join("metrics.parquet"));
    let ron = rows.iter().find(|r| r["role"] == "Ron").unwrap();
    assert_eq!((ron["sr"].as_f64(), ron["crf"].as_f64(), ron["invalid"].as_u64()), (Some(0.5), Some(0.0), Some(1)));
    let malfoy = rows.iter().find(|r| r["role"] == "Malfoy").unwrap();
    assert_eq!((malfoy["ar"].as_f64(), malfoy["crf"].as_f64()), (Some(1.0), Some(1.0)));
    let summary = parquet_rows(&out.join("metrics.summary.parquet"));
    let get = |table: &str, metric: &str| {
        let r =
            summary.iter().find(|r| r["table"] == table && r["group"] == "overall" && r["metric"] == metric).unwrap();
        (r["value"].as_f64().unwrap(), r["invalid"].as_u64().unwrap())
    };
    for (metric, want) in [("sr", 25.0), ("ar", 75.0), ("er", 37.5), ("csvt", 12.5), ("crf", 50.0)] {
        let (v, invalid) = get("sharp", metric);
        assert!((v - want).abs() < 1e-9, "{metric}: {v} vs {want}");
        assert_eq!(invalid, 1, "the record without a stance is counted");
    }
    assert!((get("sharp_detector", "accuracy").0 - 75.0).abs() < 1e-9);
    let f1 = (4.0 / 6.0 + 0.75 + 1.0) / 3.0 * 100.0;
    assert!((get("sharp_detector", "macro_f1").0 - f1).abs() < 1e-9);
}
