//! The official judge's agreement with human scores from the predictions shipped in the
//! release (`official_agreement` of pipelines/characterbench.toml, no LLM): the spec's
//! Pearson values (§3.3) for all 7 files and both languages, to its 4 decimals, and every
//! statistic and p-value against scipy.stats (tests/fixtures/characterbench/
//! reference_agreement.py).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{repo, shared_release};
use crate::support::{Project, parquet_rows};

fn run_agreement(p: &Project, profile: &[&str]) -> Vec<Map<String, Value>> {
    let pipeline = repo().join("pipelines/characterbench.toml");
    let out = p.path().join("out");
    let mut args = vec![
        "run",
        pipeline.to_str().unwrap(),
        "--offline",
        "--until",
        "official_agreement",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(profile);
    p.synth(&args).ok();
    parquet_rows(&out.join("official_agreement.parquet"))
}

/// The spec's table (§3.3): Pearson of each shipped field with gold, first 150 records.
const SPEC: &[(&str, [f64; 8])] = &[
    // pred_zh_sc, pred_en_sc, pred_zh, pred_en, pred_zh_ref_free_sc, pred_en_ref_free_sc, pred_zh_ref_free, pred_en_ref_free
    ("MC", [0.8259, 0.8095, 0.8091, 0.7917, 0.4025, 0.2796, 0.4236, 0.2471]),
    ("ACb", [0.8089, 0.7687, 0.8194, 0.7764, 0.7568, 0.7104, 0.7588, 0.6970]),
    ("ACh", [0.5239, 0.5365, 0.5046, 0.5466, 0.5227, 0.5689, 0.4797, 0.5293]),
    ("BCh", [0.6123, 0.5743, 0.5424, 0.4760, 0.0426, 0.2700, 0.0425, 0.2284]),
    ("ER", [0.6738, 0.6973, 0.6281, 0.6124, 0.4906, 0.4429, 0.4622, 0.4242]),
    ("EG", [0.6633, 0.5835, 0.5664, 0.5845, 0.6051, 0.5671, 0.5840, 0.5835]),
    ("HL", [0.4604, 0.5584, 0.4490, 0.4941, 0.5115, 0.4965, 0.4775, 0.4683]),
    ("avg", [0.6526, 0.6469, 0.6170, 0.6117, 0.4760, 0.4765, 0.4612, 0.4539]),
];

#[test]
fn shipped_predictions_reproduce_the_spec_pearson_values() {
    if shared_release().is_none() {
        return;
    }
    let p = Project::new();
    let rows = run_agreement(&p, &[]);
    let get = |x: &str, lang: &str, group: &str, method: &str| -> f64 {
        rows.iter()
            .find(|r| r["x"] == x && r["split"] == lang && r["group"] == group && r["method"] == method)
            .unwrap_or_else(|| panic!("{x} {lang} {group} {method}"))["statistic"]
            .as_f64()
            .unwrap()
    };
    let columns = [
        ("pred_sc", "zh"),
        ("pred_sc", "en"),
        ("pred", "zh"),
        ("pred", "en"),
        ("pred_ref_free_sc", "zh"),
        ("pred_ref_free_sc", "en"),
        ("pred_ref_free", "zh"),
        ("pred_ref_free", "en"),
    ];
    for (group, want) in SPEC {
        for ((x, lang), w) in columns.iter().zip(want) {
            let got = get(x, lang, group, "pearson");
            assert_eq!(format!("{got:.4}"), format!("{w:.4}"), "{x} {lang} {group}: {got}");
        }
    }
    // n per cell: 150 records, none invalid.
    let mc = rows.iter().find(|r| r["x"] == "pred_sc" && r["split"] == "zh" && r["group"] == "MC").unwrap();
    assert_eq!((mc["n"].as_u64(), mc["invalid"].as_u64()), (Some(150), Some(0)));
}

#[test]
fn shipped_agreement_equals_scipy_stats() {
    if shared_release().is_none() {
        return;
    }
    let p = Project::new();
    let rows = run_agreement(&p, &[]);
    let abbr: BTreeMap<String, String> =
        super::bench().dimensions.iter().map(|d| (d.id.clone(), d.abbr.clone())).collect();
    let table = std::fs::read_to_string(repo().join("tests/fixtures/characterbench/agreement.expected.tsv")).unwrap();
    let mut checked = 0;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        let (dim, lang, x, method) = (f[0], f[1], f[2], f[3]);
        let (n, stat, p_value): (u64, f64, f64) = (f[4].parse().unwrap(), f[5].parse().unwrap(), f[6].parse().unwrap());
        let row = rows
            .iter()
            .find(|r| r["x"] == x && r["split"] == lang && r["group"] == abbr[dim].as_str() && r["method"] == method)
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(row["n"].as_u64(), Some(n));
        let got_stat = row["statistic"].as_f64().unwrap();
        let got_p = row["p_value"].as_f64().unwrap();
        assert!((got_stat - stat).abs() < 1e-12, "{line}: statistic {got_stat}");
        assert!((got_p - p_value).abs() <= 1e-15 + 1e-9 * p_value.abs(), "{line}: p {got_p}");
        checked += 1;
    }
    assert_eq!(checked, 7 * 2 * 4 * 3);
}

#[test]
fn demo_agreement_covers_all_thirteen_dimensions() {
    let p = Project::new();
    let rows = run_agreement(&p, &["--profile", "demo"]);
    let groups: Vec<&str> = rows
        .iter()
        .filter(|r| r["x"] == "pred_sc" && r["split"] == "zh" && r["method"] == "pearson")
        .map(|r| r["group"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["avg", "MC", "FA", "BCk", "ACb", "ACh", "BCb", "BCh", "ES", "ER", "MS", "MR", "HL", "EG"]);
    let summary = std::fs::read_to_string(p.path().join("out/manifest.json")).unwrap();
    assert!(summary.contains("pipelines/data/characterbench-demo"), "the release read is recorded");
}
