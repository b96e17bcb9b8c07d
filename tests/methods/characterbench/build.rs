//! `pipelines/characterbench-build.toml --offline`: characters (the demo file, or RoleMRC's
//! meta-pool) → contexts → per-dimension targets and queries → scripts → replies of two
//! models → judge scores → `release/<dimension>_test.json` in the release's layout, which
//! `characterbench_release` reads back with no failure; human scores imported from a CSV;
//! a bad hand-written list names its line.

use serde_json::Value;

use super::{bench, failures, repo};
use crate::support::{Project, parquet_rows};

fn build(p: &Project, out: &str, extra: &[&str]) -> crate::support::Run {
    let pipeline = repo().join("pipelines/characterbench-build.toml");
    let out = p.path().join(out);
    let mut args = vec!["run", pipeline.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    p.synth(&args)
}

fn read_back(p: &Project, release: &std::path::Path, langs: &str) -> Vec<serde_json::Map<String, Value>> {
    let toml = format!(
        "[pipeline]\nname = \"read\"\nroot = {:?}\n\n[stages.release]\nkind = \"characterbench_release\"\npath = {:?}\nlangs = {langs}\n",
        repo().to_string_lossy(),
        release.to_string_lossy()
    );
    p.write("read.toml", toml);
    let out = p.path().join("read-out");
    p.synth(&["run", "read.toml", "--out", out.to_str().unwrap()]).ok();
    assert!(failures(&out, "release").is_empty(), "{:?}", failures(&out, "release"));
    parquet_rows(&out.join("release.parquet"))
}

#[test]
fn build_offline_writes_a_release_the_reader_reads_back() {
    let p = Project::new();
    build(&p, "out", &[]).ok();
    let out = p.path().join("out");
    let release = out.join("release");
    let bench = bench();
    let settings = std::fs::read_to_string(repo().join("rules/characterbench/immoral_settings.tsv")).unwrap();
    let mut total = 0;
    for d in &bench.dimensions {
        let records: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(release.join(format!("{}_test.json", d.id))).unwrap())
                .unwrap();
        assert!(!records.is_empty(), "{}", d.id);
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r["id"], i as i64 + 1);
            assert!(r["annotation_score"].is_null() && r["gold"].is_null(), "human fields left for import");
            assert!(r["pred_zh_sc"].as_f64().is_some() && r["pred_zh"].as_f64().is_some());
            let dialogue = r["dialogue"].as_array().unwrap();
            assert!(dialogue.len() >= 9, "a context of at least 8 turns and the query");
            assert_eq!(dialogue.last().unwrap()["speaker"], "user");
            assert_eq!(dialogue.last().unwrap()["utterance"], r["messages"]["response"]);
            assert!(r["response_messages"]["response"].as_str().is_some_and(|s| !s.is_empty()));
            if let Some(t) = &d.target {
                let mut v = &r.clone();
                for k in t.path.split('.') {
                    v = &v[k];
                }
                assert!(!v.is_null(), "{}: the target at {}", d.id, t.path);
            }
            let profile = r["character_profile"].as_str().unwrap();
            if d.id == "behavior_consistency_human" {
                assert!(profile.ends_with(r["response_messages"]["character_style"].as_str().unwrap()));
            }
            if d.id == "morality_robustness" {
                assert!(
                    settings.lines().skip(1).any(|l| profile.ends_with(l.split('\t').nth(1).unwrap())),
                    "{profile}"
                );
            }
        }
        total += records.len();
    }
    // Two responding models per kept script.
    let kept = parquet_rows(&out.join("scripts.parquet")).len();
    assert_eq!(total, kept * 2);
    let card = std::fs::read_to_string(release.join("README.md")).unwrap();
    assert!(card.contains("| Memory Consistency (MC) |") && card.contains("left for annotation"), "{card}");
    // The release reader takes the files as they are (Chinese scripts).
    let rows = read_back(&p, &release, "[\"zh\"]");
    assert_eq!(rows.len(), total);

    // Human scores imported for an earlier export's ids.
    p.write("human.csv", "dimension,id,score\nengagement,1,4\nengagement,2,2\nmemory_consistency,1,3\n");
    build(
        &p,
        "out",
        &["--set", &format!("stages.export.annotations={:?}", p.path().join("human.csv").to_string_lossy())],
    )
    .ok();
    let eg: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(release.join("engagement_test.json")).unwrap()).unwrap();
    assert_eq!((eg[0]["gold"].as_i64(), eg[1]["annotation_score"].as_i64()), (Some(4), Some(2)));
    assert!(eg[2]["gold"].is_null());
}

#[test]
fn build_from_the_rolemrc_meta_pool_in_english() {
    let p = Project::new();
    let rolemrc = p.path().join("rolemrc");
    p.synth(&[
        "run",
        repo().join("pipelines/rolemrc.toml").to_str().unwrap(),
        "--offline",
        "--until",
        "profiles",
        "--out",
        rolemrc.to_str().unwrap(),
    ])
    .ok();
    let profiles = rolemrc.join("profiles.parquet");
    build(
        &p,
        "out",
        &["--profile", "rolemrc-offline", "--set", &format!("stages.characters.path={:?}", profiles.to_string_lossy())],
    )
    .ok();
    let out = p.path().join("out");
    let plan = parquet_rows(&out.join("plan.parquet"));
    assert_eq!(plan.len(), 13 * 4, "4 characters per dimension from the meta-pool");
    let names: std::collections::BTreeSet<&str> = plan.iter().map(|r| r["character_name"].as_str().unwrap()).collect();
    let pool: std::collections::BTreeSet<String> =
        parquet_rows(&profiles).iter().map(|r| r["role_name"].as_str().unwrap().to_string()).collect();
    assert!(names.iter().all(|n| pool.contains(*n)), "characters come from the meta-pool");
    // English scripts: the text is also the records' translation_en, so both views read.
    let rows = read_back(&p, &out.join("release"), "[\"zh\", \"en\"]");
    assert!(rows.iter().any(|r| r["lang"] == "en"));
    assert!(rows.iter().all(|r| r["user_query"].as_str().unwrap().starts_with(if r["lang"] == "en" {
        "User："
    } else {
        "用户："
    })));
}

#[test]
fn a_bad_behaviour_list_names_its_line() {
    let p = Project::new();
    p.write("behaviors.tsv", "zh\ten\n说话很慢。\t Speaks slowly.\n只有一列\n");
    let r = build(
        &p,
        "out",
        &["--set", &format!("stages.plan.behaviors={:?}", p.path().join("behaviors.tsv").to_string_lossy())],
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("behaviors.tsv:3: 1 fields, the header has 2"), "{}", r.stderr);
}
