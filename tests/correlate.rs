//! `correlate` and `eval::correlation`: Pearson, Spearman and Kendall τ-b with p-values
//! equal to scipy.stats (stored reference cases, `tests/fixtures/correlate/`, re-run live
//! with `SYNTH_SCIPY_PYTHON`), the stage's groups, splits, averages, invalid rows and NaN
//! (never 0) for undefined coefficients; `aggregate` over judge samples.

use std::path::PathBuf;

use serde_json::Value;
use synth::eval::correlation::{self, Method};

use crate::support::{Project, parquet_rows, repo};

fn cases_file() -> PathBuf {
    repo().join("tests/fixtures/correlate/cases.json")
}

fn close(got: f64, want: Option<f64>, abs: f64, rel: f64) -> bool {
    match want {
        None => got.is_nan(),
        Some(w) => !got.is_nan() && (got - w).abs() <= abs + rel * w.abs(),
    }
}

#[test]
fn correlation_equals_scipy_stats_on_the_reference_cases() {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(cases_file()).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 16);
    let mut worst = (0.0f64, 0.0f64);
    for c in cases {
        let nums = |k: &str| c[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect::<Vec<f64>>();
        let (x, y) = (nums("x"), nums("y"));
        for m in [Method::Pearson, Method::Spearman, Method::Kendall] {
            let want = &c["expected"][m.name()];
            let (ws, wp) = (want[0].as_f64(), want[1].as_f64());
            let got = correlation::correlate(m, &x, &y);
            assert_eq!(got.n, x.len());
            assert!(
                close(got.statistic, ws, 1e-12, 0.0),
                "{} {}: statistic {} vs scipy {ws:?}",
                c["name"],
                m.name(),
                got.statistic
            );
            assert!(
                close(got.p_value, wp, 1e-15, 1e-9),
                "{} {}: p {} vs scipy {wp:?}",
                c["name"],
                m.name(),
                got.p_value
            );
            if let (Some(ws), Some(wp)) = (ws, wp) {
                worst.0 = worst.0.max((got.statistic - ws).abs());
                if wp > 0.0 {
                    worst.1 = worst.1.max(((got.p_value - wp) / wp).abs());
                }
            }
        }
    }
    eprintln!("max |statistic - scipy| = {:.2e}, max relative |p - scipy| = {:.2e}", worst.0, worst.1);
}

/// With `SYNTH_SCIPY_PYTHON` (benches/scipy_setup.sh prints one), the reference script runs
/// again and must reproduce the stored cases exactly.
#[test]
fn the_stored_scipy_cases_are_what_scipy_computes() {
    let Ok(python) = std::env::var("SYNTH_SCIPY_PYTHON") else {
        eprintln!("SKIPPED live scipy re-run: SYNTH_SCIPY_PYTHON is not set (benches/scipy_setup.sh installs scipy)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(python)
        .arg(repo().join("tests/fixtures/correlate/reference_scipy.py"))
        .args(["--out", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let live: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("cases.json")).unwrap()).unwrap();
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(cases_file()).unwrap()).unwrap();
    assert_eq!(live, stored);
}

#[test]
fn correlate_stage_groups_splits_averages_and_never_reports_zero_for_undefined() {
    let p = Project::new();
    let mut rows = String::new();
    // Group a: y = x (r = 1); group b: y = -x (r = -1); group c: constant x (undefined);
    // a row with a null and one with text that is not a number are invalid.
    for split in ["zh", "en"] {
        for i in 0..6 {
            let i = i as f64;
            rows.push_str(&format!(
                "{{\"id\":\"{split}a{i}\",\"g\":\"a\",\"lang\":\"{split}\",\"judge\":{i},\"human\":{i}}}\n"
            ));
            rows.push_str(&format!(
                "{{\"id\":\"{split}b{i}\",\"g\":\"b\",\"lang\":\"{split}\",\"judge\":{i},\"human\":{}}}\n",
                -i
            ));
            rows.push_str(&format!(
                "{{\"id\":\"{split}c{i}\",\"g\":\"c\",\"lang\":\"{split}\",\"judge\":1,\"human\":{i}}}\n"
            ));
        }
        rows.push_str(&format!(
            "{{\"id\":\"{split}n\",\"g\":\"a\",\"lang\":\"{split}\",\"judge\":null,\"human\":1}}\n"
        ));
    }
    p.write("pairs.jsonl", rows);
    p.write(
        "p.toml",
        "[pipeline]\nname = \"c\"\nseed = 1\n\n[stages.pairs]\nkind = \"source\"\npath = \"pairs.jsonl\"\n\n\
         [stages.agree]\nkind = \"correlate\"\ninputs = [\"pairs\"]\nx = [\"judge\"]\nlabels = { judge = \"J\" }\ny = \"human\"\n\
         group_by = \"g\"\ngroup_headings = { a = \"A\" }\nsplit_by = \"lang\"\npooled = true\nbootstrap = 200\nscale = 100.0\n\n\
         [stages.report]\nkind = \"report\"\ninputs = [\"agree\"]\ncharts = []\n",
    );
    p.synth(&["run", "p.toml", "--out", "out"]).ok();
    let out = p.path().join("out");
    let rows = parquet_rows(&out.join("agree.parquet"));
    let find = |split: &str, group: &str, method: &str| {
        rows.iter()
            .find(|r| r["split"] == split && r["group"] == group && r["method"] == method)
            .unwrap_or_else(|| panic!("{split}/{group}/{method}"))
            .clone()
    };
    for split in ["zh", "en"] {
        for m in ["pearson", "spearman", "kendall"] {
            let a = find(split, "a", m);
            assert!((a["statistic"].as_f64().unwrap() - 1.0).abs() < 1e-12);
            assert_eq!(
                (a["n"].as_u64(), a["invalid"].as_u64()),
                (Some(6), Some(1)),
                "the null row is counted, not used"
            );
            assert!((find(split, "b", m)["statistic"].as_f64().unwrap() + 1.0).abs() < 1e-12);
            let c = find(split, "c", m);
            assert!(
                c["statistic"].is_null() || c["statistic"].as_f64().unwrap().is_nan(),
                "constant input: NaN, never 0: {c:?}"
            );
            let avg = find(split, "avg", m);
            assert!(
                avg["statistic"].as_f64().unwrap().abs() < 1e-12,
                "the mean of 1 and -1; the undefined group is left out"
            );
            assert_eq!((avg["n"].as_u64(), avg["invalid"].as_u64()), (Some(2), Some(1)));
            assert!(find(split, "all", m)["statistic"].as_f64().is_some());
        }
        let a = find(split, "a", "pearson");
        assert!(a["p_value"].as_f64().unwrap() < 1e-6);
        let (lo, hi) = (a["ci_low"].as_f64().unwrap(), a["ci_high"].as_f64().unwrap());
        assert!(lo <= 1.0 && hi >= lo, "bootstrap CI {lo} {hi}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| Model | AVG | A | b | c | All |"), "{report}");
    assert!(
        report.contains("| J | 0.00 | 100.00 | -100.00 |")
            || report.contains("| J | 0.0000 | 100.0000 | -100.0000 | NaN |"),
        "{report}"
    );
    // Deterministic (the bootstrap is seeded).
    p.synth(&["run", "p.toml", "--out", "again"]).ok();
    assert_eq!(parquet_rows(&p.path().join("again/agree.parquet")), rows);
}
