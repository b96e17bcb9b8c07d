//! `sharp_claims` on the fixtures: filter, dedupe, an exact counterfactual share, seeded and
//! relation-stratified samples, gzip, bad lines with `file:line`, the same output for any
//! thread count, Chinese claims in Simplified script, ConceptNet antonyms, and the spec's
//! expected counts on the official files.

use std::collections::BTreeMap;
use std::io::Write;

use super::{repo, run_claims, shared_conceptnet};
use crate::support::{Project, parquet_rows};

type Rows = Vec<serde_json::Map<String, serde_json::Value>>;

fn claims(out: &std::path::Path) -> Rows {
    parquet_rows(&out.join("claims.parquet"))
}

fn per_relation(rows: &Rows) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r["rel"].as_str().unwrap().to_string()).or_default() += 1;
    }
    m
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
    assert_eq!(rows[0]["render"], "surface");
    assert_eq!(rows[0]["license"], "cc:by-sa/4.0");
    assert!(rows.iter().all(|r| r["label"] == "factual" && r["cf_rule"].is_null()));

    let (out, r) = run_claims(&p, &edges, "counterfactual_share = 0.5");
    r.ok();
    let rows = claims(&out);
    let cf: Vec<_> = rows.iter().filter(|r| r["label"] == "counterfactual").collect();
    assert_eq!(cf.len(), 6, "exactly round(0.5 × 12)");
    for r in &cf {
        assert_ne!(r["claim"], r["factual_claim"]);
        assert!(r["cf_rule"].is_string() && r["cf_detail"].is_string(), "{r:?}");
    }
    let (exact, r) = run_claims(&p, &edges, "counterfactuals = 4");
    r.ok();
    assert_eq!(claims(&exact).iter().filter(|r| r["label"] == "counterfactual").count(), 4);
    // Deterministic, and a seeded sample of the same claims whatever the run.
    let q = Project::new();
    let (again, _) = run_claims(&q, &edges, "counterfactual_share = 0.5");
    assert_eq!(claims(&again), rows);
    let (s1, r) = run_claims(&p, &edges, "sample = 5");
    r.ok();
    let s1 = claims(&s1);
    assert_eq!(s1.len(), 5);
    assert!(s1.iter().all(|r| rows.iter().any(|x| x["id"] == r["id"])));
    // Rules that never fit leave every claim factual (no counterfactual is invented).
    let (none, r) = run_claims(&p, &edges, "counterfactual_rules = [\"antonym\"]\nantonym_sources = [\"conceptnet\"]");
    r.ok();
    assert!(claims(&none).iter().all(|r| r["label"] == "factual"));
    // The LLM fallback marks such claims for the rewrite step instead.
    let (llm, r) = run_claims(
        &p,
        &edges,
        "counterfactual_rules = [\"antonym\"]\nantonym_sources = [\"conceptnet\"]\nllm_fallback = true",
    );
    r.ok();
    let llm = claims(&llm);
    let marked: Vec<_> = llm.iter().filter(|r| r["cf_rule"] == "llm").collect();
    assert_eq!(marked.len(), 6);
    assert!(marked.iter().all(|r| r["claim"] == r["factual_claim"] && r["label"] == "counterfactual"));
}

#[test]
fn sharp_claims_samples_are_stratified_by_relation() {
    let p = Project::new();
    let edges = repo().join("tests/fixtures/sharp/edges.csv");
    let (all, r) = run_claims(&p, &edges, "counterfactual_share = 0.0");
    r.ok();
    let sizes = per_relation(&claims(&all));
    assert_eq!(sizes["IsA"], 2);
    assert_eq!(sizes.len(), 9, "{sizes:?}");
    // Equal: every relation once before any twice.
    let (eq, r) = run_claims(&p, &edges, "counterfactual_share = 0.0\nsample = 9\nstratify = \"equal\"");
    r.ok();
    assert!(per_relation(&claims(&eq)).values().all(|n| *n == 1));
    // Proportional: 10 of 12 → the two-edge relations keep at least one each, nothing else
    // above its size; the sample is always the stratum's smallest keys (a subset of a larger one).
    let (prop, r) = run_claims(&p, &edges, "counterfactual_share = 0.0\nsample = 10");
    r.ok();
    let prop = claims(&prop);
    let got = per_relation(&prop);
    assert_eq!(got.values().sum::<usize>(), 10);
    assert!(got.iter().all(|(k, n)| *n >= 1 && *n <= sizes[k]), "{got:?}");
    let (big, _) = run_claims(&p, &edges, "counterfactual_share = 0.0\nsample = 11");
    let big = claims(&big);
    assert!(prop.iter().all(|r| big.iter().any(|x| x["id"] == r["id"])));
}

#[test]
fn sharp_claims_reads_gzip_and_reports_bad_lines() {
    let p = Project::new();
    let bytes = std::fs::read(repo().join("tests/fixtures/sharp/bad.csv")).unwrap();
    let gz = p.path().join("bad.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::default());
    enc.write_all(&bytes).unwrap();
    enc.write_all(b"/a/z\t/r/IsA\t/c/en/z\t/c/en/y\t{\"weight\": 1.0}\n").unwrap();
    enc.write_all(b"/a/u\t/r/IsA\t/c/en/u\t/c/en/v\t{\"surfaceText\": \"[[u]] is \xff\", \"weight\": 1}\n").unwrap();
    enc.finish().unwrap();
    let (out, r) = run_claims(&p, &gz, "counterfactual_share = 0.0\nno_surface = \"fail\"");
    r.ok();
    assert_eq!(claims(&out).len(), 4, "5 good lines, one a duplicate");
    let f = parquet_rows(&out.join("claims.failures.parquet"));
    let msgs: Vec<&str> = f.iter().map(|r| r["message"].as_str().unwrap()).collect();
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    assert!(msgs[0].starts_with("bad.csv.gz:4: expected 5 tab-separated columns"), "{}", msgs[0]);
    assert!(msgs[1].starts_with("bad.csv.gz:5: column 5 is not valid JSON"), "{}", msgs[1]);
    assert!(msgs[2].starts_with("bad.csv.gz:8: /a/z has no surface text"), "{}", msgs[2]);
    assert!(msgs[3].starts_with("bad.csv.gz:9: not UTF-8"), "{}", msgs[3]);
    assert!(f[1]["record"].as_str().unwrap().contains("{not json}"), "the line is kept");
}

/// A synthetic dump of several 4 MiB blocks with bad lines here and there.
fn big_dump(p: &Project) -> std::path::PathBuf {
    let mut s = String::new();
    for i in 0..40_000u32 {
        match i % 997 {
            0 => s.push_str("/a/bad\t/r/IsA\tshort\n"),
            1 => s.push_str(&format!("/a/j{i}\t/r/RelatedTo\t/c/en/a\t/c/en/b\t{{broken\n")),
            _ => {
                let rel = ["IsA", "UsedFor", "AtLocation", "RelatedTo", "CapableOf"][(i % 5) as usize];
                let lang = if i % 7 == 0 { "fr" } else { "en" };
                s.push_str(&format!(
                    "/a/[/r/{rel}/,/c/{lang}/t{i}/,/c/en/u{}/]\t/r/{rel}\t/c/{lang}/t{i}\t/c/en/u{}\t{{\"dataset\": \"/d/x\", \"license\": \"cc:by/4.0\", \"sources\": [{{\"contributor\": \"/s/c/{i}\"}}], \"surfaceText\": \"[[thing {i}]] is a type of [[group {}]] that people know about\", \"weight\": {}}}\n",
                    i % 91,
                    i % 91,
                    i % 91,
                    1 + i % 3
                ));
            }
        }
    }
    p.write("big.csv", s)
}

#[test]
fn sharp_claims_output_does_not_depend_on_threads() {
    let p = Project::new();
    let dump = big_dump(&p);
    assert!(std::fs::metadata(&dump).unwrap().len() > 2 * (4 << 20), "several blocks");
    let (one, r) = run_claims(&p, &dump, "sample = 300\nthreads = 1");
    r.ok();
    let one_rows = claims(&one);
    let one_fail = parquet_rows(&one.join("claims.failures.parquet"));
    let q = Project::new();
    let dump = big_dump(&q);
    let (three, r) = run_claims(&q, &dump, "sample = 300\nthreads = 3");
    r.ok();
    assert_eq!(claims(&three), one_rows, "the same claims in the same order");
    assert_eq!(parquet_rows(&three.join("claims.failures.parquet")), one_fail);
    assert_eq!(one_rows.len(), 300);
    // 40 bad lines of each kind, named by line; the broken JSON of a dropped line is caught too.
    assert_eq!(one_fail.len(), 2 * 41);
    let at = |id: &str| one_fail.iter().find(|f| f["id"] == id).unwrap()["message"].as_str().unwrap().to_string();
    assert!(at("big.csv:1").starts_with("big.csv:1: expected 5 tab-separated columns"));
    assert!(at("big.csv:2").starts_with("big.csv:2: column 5 is not valid JSON"), "{}", at("big.csv:2"));
    // check_json = "kept" skips the JSON of lines the filter drops.
    let (kept, r) = run_claims(&q, &dump, "sample = 300\ncheck_json = \"kept\"");
    r.ok();
    assert_eq!(parquet_rows(&kept.join("claims.failures.parquet")).len(), 41);
    assert_eq!(claims(&kept), one_rows);
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
    let (out, r) = run_claims(&p, &dir.join("conceptnet4_flat_0_edges.csv"), "counterfactual_share = 0.0");
    r.ok();
    assert_eq!(claims(&out).len(), 5, "12 rows, 7 URIs, 5 English claims");

    // Chinese: the 2 claims, converted to Simplified script; `none` keeps the Traditional.
    let (out, r) = run_claims(&p, &dir.join("assertions.csv"), "counterfactual_share = 0.0\nlang = \"zh\"");
    r.ok();
    let mut zh: Vec<String> = claims(&out).iter().map(|r| r["claim"].as_str().unwrap().to_string()).collect();
    zh.sort();
    assert_eq!(zh, ["经理来访可能代表检查。", "走到饮水机的时候可能会用到检查。"]);
    let (out, _) =
        run_claims(&p, &dir.join("assertions.csv"), "counterfactual_share = 0.0\nlang = \"zh\"\nzh_convert = \"none\"");
    assert!(claims(&out).iter().any(|r| r["claim"] == "經理來訪可能代表檢查。"));
    // Chinese counterfactuals by the Chinese rules.
    let (out, r) = run_claims(
        &p,
        &dir.join("assertions.csv"),
        "counterfactual_share = 1.0\nlang = \"zh\"\ncounterfactual_rules = [\"negation\"]",
    );
    r.ok();
    let mut cf: Vec<String> = claims(&out).iter().map(|r| r["claim"].as_str().unwrap().to_string()).collect();
    cf.sort();
    assert_eq!(cf, ["经理来访不可能代表检查。", "走到饮水机的时候不会用到检查。"]);

    // The dump's own /r/Antonym edges (test ↔ breeze, recess) make "assay is a type of test" false.
    let (out, r) = run_claims(
        &p,
        &dir.join("assertions.csv"),
        "counterfactual_share = 1.0\ncounterfactual_rules = [\"antonym\"]\nantonym_sources = [\"conceptnet\"]",
    );
    r.ok();
    let rows = claims(&out);
    let assay = rows.iter().find(|r| r["factual_claim"] == "assay is a type of test").unwrap();
    let claim = assay["claim"].as_str().unwrap();
    assert!(["assay is a type of breeze", "assay is a type of recess"].contains(&claim), "{claim}");
    assert!(assay["cf_detail"].as_str().unwrap().starts_with("conceptnet /r/Antonym"));
    let cf: Vec<_> = rows.iter().filter(|r| r["label"] == "counterfactual").collect();
    assert!(cf.iter().all(|r| r["cf_detail"].as_str().unwrap().starts_with("conceptnet /r/Antonym")), "{cf:?}");
}
