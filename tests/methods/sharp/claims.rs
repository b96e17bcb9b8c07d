//! `sharp_claims` on the fixtures: filter, dedupe, counterfactual share, seeded sample,
//! gzip, bad lines with `file:line`, and the spec's expected counts on the official files.

use std::io::Write;

use super::{repo, run_claims, shared_conceptnet};
use crate::support::{Project, parquet_rows};

fn claims(out: &std::path::Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    parquet_rows(&out.join("claims.parquet"))
}

#[test]
fn sharp_claims_filter_dedupe_and_counterfactuals() {
    let p = Project::new();
    let edges = repo().join("tests/fixtures/sharp/edges.csv");
    let (out, r) = run_claims(&p, &edges, "counterfactual_share = 0.0");
    r.ok();
    let rows = claims(&out);
    assert_eq!(rows.len(), 12, "13 English whitelisted lines with surface text, one duplicate");
    assert_eq!(rows[0]["claim"], "a cat is a type of animal");
    assert_eq!(rows[0]["source"], "edges.csv:1");
    assert!(rows.iter().all(|r| r["label"] == "factual" && r["cf_rule"].is_null()));

    let (out, r) = run_claims(&p, &edges, "counterfactual_share = 0.5");
    r.ok();
    let rows = claims(&out);
    let cf: Vec<_> = rows.iter().filter(|r| r["label"] == "counterfactual").collect();
    assert!(!cf.is_empty() && cf.len() < rows.len(), "about half: {}", cf.len());
    for r in &cf {
        assert_ne!(r["claim"], r["factual_claim"]);
        assert!(r["cf_rule"].is_string());
    }
    // Deterministic, and a seeded sample of the same claims whatever the run.
    let q = Project::new();
    let (again, _) = run_claims(&q, &edges, "counterfactual_share = 0.5");
    assert_eq!(claims(&again), rows);
    let (s1, r) = run_claims(&p, &edges, "sample = 5");
    r.ok();
    let s1 = claims(&s1);
    assert_eq!(s1.len(), 5);
    assert!(s1.iter().all(|r| rows.iter().any(|x| x["id"] == r["id"])));
}

#[test]
fn sharp_claims_reads_gzip_and_reports_bad_lines() {
    let p = Project::new();
    let bytes = std::fs::read(repo().join("tests/fixtures/sharp/bad.csv")).unwrap();
    let gz = p.path().join("bad.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::default());
    enc.write_all(&bytes).unwrap();
    enc.finish().unwrap();
    let (out, r) = run_claims(&p, &gz, "counterfactual_share = 0.0\nno_surface = \"fail\"");
    r.ok();
    assert_eq!(claims(&out).len(), 4, "5 good lines, one a duplicate");
    let f = parquet_rows(&out.join("claims.failures.parquet"));
    let msgs: Vec<&str> = f.iter().map(|r| r["message"].as_str().unwrap()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(msgs[0].starts_with("bad.csv.gz:4: expected 5 tab-separated columns"), "{}", msgs[0]);
    assert!(msgs[1].starts_with("bad.csv.gz:5: column 5 is not valid JSON"), "{}", msgs[1]);
}

#[test]
fn sharp_claims_on_the_official_fixtures() {
    let Some(dir) = shared_conceptnet() else { return };
    let p = Project::new();
    let (out, r) = run_claims(&p, &dir.join("assertions.csv"), "counterfactual_share = 0.0");
    r.ok();
    let got: Vec<String> = claims(&out).iter().map(|r| r["claim"].as_str().unwrap().to_string()).collect();
    let mut want = vec![
        "Something you find on a test is hard questions",
        "You are likely to find wheat in a field",
        "Education in the United States is certainly a thing",
        "assay is a type of test",
        "You can use a balalaika to make music",
        "a balalaika is used for making music",
    ];
    let mut sorted = got.clone();
    sorted.sort();
    want.sort();
    assert_eq!(sorted, want, "the spec's 6 claims");
    let (out, r) = run_claims(&p, &dir.join("assertions.csv"), "counterfactual_share = 0.0\nlang = \"zh\"");
    r.ok();
    assert_eq!(claims(&out).len(), 2, "zh: HasSubevent, UsedFor");
    let (out, r) = run_claims(&p, &dir.join("conceptnet4_flat_0_edges.csv"), "counterfactual_share = 0.0");
    r.ok();
    assert_eq!(claims(&out).len(), 5, "12 rows, 7 URIs, 5 English claims");
}
