//! `pipelines/sharp.toml --offline` end to end on the official ConceptNet test files, and its
//! profiles: the snowballing mode with self-consistency, Chinese, translations, LLM rewrites
//! with the human check, roles from dialogue logs and from RoleMRC profiles; bad role inputs.

use std::path::{Path, PathBuf};

use super::{repo, shared_conceptnet};
use crate::support::{Project, manifest, parquet_rows};

type Rows = Vec<serde_json::Map<String, serde_json::Value>>;

/// Runs the repository's SHARP pipeline offline with the given profile and extra arguments.
fn run(p: &Project, dir: &str, profile: Option<&str>, extra: &[&str]) -> PathBuf {
    let out = p.path().join(dir);
    let pipeline = repo().join("pipelines/sharp.toml");
    let mut args = vec!["run", pipeline.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()];
    if let Some(profile) = profile {
        args.extend(["--profile", profile]);
    }
    args.extend(extra);
    p.synth(&args).ok();
    out
}

fn rows(out: &Path, stage: &str) -> Rows {
    parquet_rows(&out.join(format!("{stage}.parquet")))
}

fn summary(out: &Path, stage: &str, table: &str, group: &str, metric: &str) -> Option<f64> {
    rows(out, &format!("{stage}.summary"))
        .iter()
        .find(|r| r["table"] == table && r["group"] == group && r["metric"] == metric)
        .and_then(|r| r["value"].as_f64())
}

#[test]
fn sharp_pipeline_offline_end_to_end() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let out = run(&p, "out", None, &[]);
    assert_eq!(rows(&out, "claims").len(), 6);
    let turns = rows(&out, "turns");
    assert_eq!(turns.len(), 6 * 5, "every role asks every claim");
    assert!(turns.iter().all(|t| t["user_turn"].as_str().unwrap().ends_with(". Do you agree?") && t["lang"] == "en"));
    let stances = rows(&out, "stances");
    assert!(stances.iter().all(|s| ["FAVOR", "AGAINST", "NEUTRAL"].contains(&s["stance"].as_str().unwrap())));
    let metrics = rows(&out, "metrics");
    assert_eq!(metrics.len(), 5, "one row per (script, role)");
    let n: u64 = metrics.iter().map(|m| m["n_f"].as_u64().unwrap() + m["n_cf"].as_u64().unwrap()).sum();
    let unparsed: u64 = metrics.iter().map(|m| m["unparsed"].as_u64().unwrap()).sum();
    let failed = super::failures(&out, "stances").len() as u64;
    assert_eq!(n + failed, 30, "every answer is scored or a counted failure");
    assert_eq!(unparsed, failed, "the failures are counted per cell through the answers input");
    let share = summary(&out, "metrics", "sharp", "overall", "unparsed").unwrap();
    assert!((share - 100.0 * failed as f64 / 30.0).abs() < 1e-9, "{share}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| Model | SR | AR | ER | Csvt | CRF | Unparsed |"), "{report}");
    assert!(report.contains("| rpa (en) |"), "{report}");
    assert!(report.contains("factual mode (Table 5 layout"), "{report}");
    assert!(out.join("sharp.svg").exists());
    // The model level is the mean over scripts of the mean over roles (one script here).
    let sr_mean = metrics.iter().filter_map(|m| m["sr"].as_f64()).sum::<f64>() / 5.0;
    assert!((summary(&out, "metrics", "sharp", "overall", "sr").unwrap() - 100.0 * sr_mean).abs() < 1e-9);
    // Provenance: the paper version and the reconstructed choices, in the manifest and the card.
    let m = manifest(&out);
    for stage in ["claims", "turns", "metrics", "transfer"] {
        assert_eq!(m["stages"][stage]["report"]["info"]["paper_version"], "arxiv-2411.07965v1", "{stage}");
    }
    assert!(
        m["stages"]["metrics"]["report"]["info"]["reconstructed"]
            .as_str()
            .unwrap()
            .contains("\"model_level\":\"macro\"")
    );
    let card = std::fs::read_to_string(out.join("card.md")).unwrap();
    assert!(card.contains("## Reconstructed choices in force"), "{card}");
    assert!(card.contains("`counterfactual_share` = `0.5`"), "{card}");
    assert!(card.contains("| not reviewed | 6 |"), "{card}");
    assert!(card.contains("| Harry Potter | Harry | Malfoy | low |"), "{card}");
    let sheet = std::fs::read_to_string(out.join("verify.review.tsv")).unwrap();
    assert_eq!(sheet.lines().count(), 7, "a header and the 6 claims");
    // Deterministic offline; pooled changes only the model level.
    let again = run(&p, "again", None, &[]);
    assert_eq!(rows(&again, "metrics"), metrics);
    assert_eq!(std::fs::read(again.join("report.md")).unwrap(), report.as_bytes());
    let pooled = run(&p, "pooled", Some("pooled"), &[]);
    assert_eq!(rows(&pooled, "metrics"), metrics, "the cells do not change");
    let (s, f) =
        metrics.iter().fold((0, 0), |(s, f), m| (s + m["n_syc"].as_u64().unwrap(), f + m["n_cf"].as_u64().unwrap()));
    let sr = summary(&pooled, "metrics", "sharp", "overall", "sr").unwrap();
    assert!((sr - 100.0 * s as f64 / f as f64).abs() < 1e-9, "pooled SR {sr}");
}

#[test]
fn sharp_pipeline_snowballing_with_self_consistency() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let out = run(&p, "out", Some("snowball-consistency"), &[]);
    let samples = rows(&out, "stance_samples");
    assert_eq!(samples.len(), 90, "3 samples per answer");
    let voted = rows(&out, "stances");
    assert_eq!(voted.len(), 30);
    for v in &voted {
        let votes = v["votes"].as_str().unwrap();
        let total: u64 = votes
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(|s| s.split(':').nth(1).unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, v["samples"].as_u64().unwrap());
        assert!(!v["id"].as_str().unwrap().ends_with("/0"), "the base id");
    }
    let paired = rows(&out, "paired");
    assert_eq!(paired.len(), 30);
    assert!(paired.iter().any(|r| r["stance_backbone"] != r["stance"]), "the backbone differs somewhere");
    let transfer = rows(&out, "transfer");
    assert_eq!(transfer.iter().filter(|r| r["mode"] == "snowballing").count(), 6);
    assert_eq!(transfer.iter().filter(|r| r["mode"] == "factual").count(), 4);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| Model | Csvt. | Error. | Syco. | Advs. | Advs. (Δ) | Syco. (Δ) | Error. (Δ) | Unparsed |"),
        "{report}"
    );
    assert!(report.contains("| backbone → rpa (en) |"), "{report}");
    assert!(report.contains("| Model | Group | Favor | Against | Neutral |"), "{report}");
    // Δ = aligned − backbone.
    let aligned = summary(&out, "metrics", "sharp", "overall", "ar").unwrap();
    let backbone = summary(&out, "metrics", "sharp_backbone", "overall", "ar").unwrap();
    let delta = summary(&out, "metrics", "sharp_backbone", "overall", "d_ar").unwrap();
    assert!((delta - (aligned - backbone)).abs() < 1e-9);
}

#[test]
fn sharp_pipeline_in_chinese_and_translated() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let zh = run(&p, "zh", Some("zh"), &[]);
    let claims = rows(&zh, "claims");
    assert_eq!(claims.len(), 2);
    assert!(claims.iter().all(|c| !c["claim"].as_str().unwrap().contains('檢')), "Simplified");
    let turns = rows(&zh, "turns");
    assert_eq!(turns.len(), 2 * 5);
    let turn = turns.iter().find(|t| t["role"] == "罗恩").unwrap()["user_turn"].as_str().unwrap().to_string();
    assert!(turn.starts_with("罗恩：我认为") && turn.ends_with("，你赞同吗？"), "{turn}");
    let report = std::fs::read_to_string(zh.join("report.md")).unwrap();
    assert!(report.contains("| rpa (zh) |"), "{report}");

    let tr = run(&p, "translate", Some("translate"), &[]);
    let claims = rows(&tr, "verify");
    assert!(
        claims.iter().all(|c| c["claim_zh"].as_str().unwrap().starts_with("离线译文：")),
        "offline placeholder translations"
    );
    let turns = rows(&tr, "turns");
    assert!(turns.iter().all(|t| t["lang"] == "zh" && t["user_turn"].as_str().unwrap().contains("我认为离线译文：")));
    let sheet = std::fs::read_to_string(tr.join("verify.review.tsv")).unwrap();
    assert!(sheet.starts_with("id\tverdict\tclaim\tclaim_zh\t"), "{sheet}");

    let src = run(&p, "zh-source", Some("zh-source"), &[]);
    let turns = rows(&src, "turns");
    assert!(turns.iter().all(|t| t["user_turn"].as_str().unwrap().contains(": I think offline translation ")));
}

#[test]
fn sharp_rewrite_then_the_human_check() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let out = run(&p, "out", Some("rewrite"), &[]);
    let claims = rows(&out, "verify");
    assert_eq!(claims.len(), 6);
    assert!(claims.iter().all(|c| c["claim_draft"].is_string() && c["verified"].is_null()));
    let ids: Vec<String> = claims.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect();
    let verdicts = format!(
        "id\tverdict\tclaim\tnote\n{}\tok\t\t\n{}\treject\t\ttrue after all\n{}\tfix\tA fixed claim.\t\n{}\tmaybe\t\t\n/a/none\tok\t\t\n",
        ids[0], ids[1], ids[2], ids[3]
    );
    let file = p.write("verdicts.tsv", verdicts);
    let set = format!("stages.verify.verdicts={:?}", file.to_string_lossy());
    let checked = run(&p, "out", Some("rewrite"), &["--set", &set, "--set", "stages.verify.max_failure_ratio=1.0"]);
    let kept = rows(&checked, "verify");
    assert_eq!(kept.len(), 4, "one rejected, one bad verdict line (a failure row)");
    let by_id = |id: &str| kept.iter().find(|c| c["id"] == id).cloned();
    assert_eq!(by_id(&ids[0]).unwrap()["verified"], true);
    assert!(by_id(&ids[1]).is_none());
    assert_eq!(by_id(&ids[2]).unwrap()["claim"], "A fixed claim.");
    assert!(by_id(&ids[3]).is_none());
    assert!(by_id(&ids[4]).unwrap()["verified"].is_null());
    let f = super::failures(&checked, "verify");
    let msgs: Vec<&str> = f.iter().map(|r| r["message"].as_str().unwrap()).collect();
    assert!(msgs.iter().any(|m| m.contains("verdicts.tsv:5: unknown verdict \"maybe\"")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("verdicts.tsv:6: \"/a/none\" is not a claim")), "{msgs:?}");
    let card = std::fs::read_to_string(checked.join("card.md")).unwrap();
    assert!(card.contains("| verified | 2 |") && card.contains("| not reviewed | 2 |"), "{card}");
    let turns = rows(&checked, "turns");
    assert!(turns.iter().any(|t| t["claim"] == "A fixed claim."));
}

#[test]
fn sharp_roles_from_dialogues_and_rolemrc_profiles() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let out = run(&p, "out", Some("dialogues"), &[]);
    let roles = rows(&out, "roles");
    let get = |name: &str| roles.iter().find(|r| r["role"] == name).unwrap().clone();
    assert!(roles.iter().all(|r| r["main"] == "Harry"), "Harry has the highest degree centrality");
    assert_eq!(get("Hermione")["n_interactions"], 5);
    assert_eq!(get("Hermione")["rank"], 1);
    assert_eq!(get("Malfoy")["affection"], "low");
    assert_eq!(get("Snape")["affection"], "neutral", "teacher is a neutral class");
    let turns = rows(&out, "turns");
    assert!(turns.iter().all(|t| t["n_interactions"].is_u64()), "carried into the turns");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("(Figure 3 layout): Pearson's r by group"), "{report}");
    assert!(report.contains("| rpa (en) | Frequency | 1.00 |"), "{report}");

    // RoleMRC meta-pool profiles: the offline meta-pool first.
    let meta = p.path().join("rolemrc");
    let rolemrc = repo().join("pipelines/rolemrc.toml");
    p.synth(&["run", rolemrc.to_str().unwrap(), "--offline", "--until", "profiles", "--out", meta.to_str().unwrap()])
        .ok();
    let set = format!("stages.profiles.path={:?}", meta.join("profiles.parquet").to_string_lossy());
    let out = run(&p, "rm", Some("rolemrc"), &["--set", &set]);
    let roles = rows(&out, "roles");
    let relations = rows(&out, "relations");
    assert_eq!(relations.len(), 3);
    let listed: usize = relations.iter().map(|r| r["relations"].as_array().unwrap().len()).sum();
    assert_eq!(roles.len(), listed, "every listed person is a role");
    assert!(roles.iter().all(|r| relations.iter().any(|x| x["id"] == r["script"] && x["role_name"] == r["main"])));
    assert!(roles.iter().all(|r| r["profile_text"].as_str().is_some_and(|t| !t.is_empty())));
    let turns = rows(&out, "turns");
    assert!(turns.iter().all(|t| t["profile_text"].is_string()));
}

#[test]
fn sharp_a_bad_roles_file_names_its_line() {
    let p = Project::new();
    p.write("roles.tsv", "script\tmain\trole\taffection\nHP\tHarry\tRon\thigh\nHP\tHarry\tMalfoy\tenemy\n");
    let toml = format!(
        "[pipeline]\nname = \"r\"\n\n[stages.claims]\nkind = \"sharp_claims\"\npath = {:?}\nrules = {:?}\n\n[stages.turns]\nkind = \"sharp_turns\"\ninputs = [\"claims\"]\nroles = \"roles.tsv\"\n",
        repo().join("tests/fixtures/sharp/edges.csv").to_string_lossy(),
        repo().join("rules/sharp").to_string_lossy()
    );
    p.write("p.toml", toml);
    let r = p.synth(&["run", "p.toml", "--out", "out"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("roles.tsv:3: unknown affection class \"enemy\""), "{}", r.stderr);
}

#[test]
fn sharp_roles_from_a_table_with_bad_rows() {
    let p = Project::new();
    p.write(
        "table.tsv",
        "script\tmain\trole\taffection\taffection_score\trelation\nHP\tHarry\tRon\t\t\tbest friend\nHP\tHarry\tMalfoy\t\t-6\t\nHP\tHarry\tSnape\t\t\tpotions master\nHP\tHarry\tDobby\tadoring\t\t\nHP\tHarry\tRon\thigh\t\t\nHP\tHarry\tLuna\tneutral\t\t\n",
    );
    let toml = format!(
        "[pipeline]\nname = \"r\"\n\n[stages.table]\nkind = \"source\"\npath = \"table.tsv\"\ninfer_types = false\n\n[stages.roles]\nkind = \"sharp_roles\"\ninputs = [\"table\"]\naffection_rules = {:?}\nmax_failure_ratio = 1.0\n",
        repo().join("rules/sharp/affection.tsv").to_string_lossy()
    );
    p.write("p.toml", &toml);
    p.synth(&["run", "p.toml", "--out", "out"]).ok();
    let out = p.path().join("out");
    let roles = rows(&out, "roles");
    let got: Vec<(&str, &str)> =
        roles.iter().map(|r| (r["role"].as_str().unwrap(), r["affection"].as_str().unwrap())).collect();
    assert_eq!(got, [("Ron", "high"), ("Malfoy", "low"), ("Luna", "neutral")]);
    let f = super::failures(&out, "roles");
    let msgs: Vec<&str> = f.iter().map(|r| r["message"].as_str().unwrap()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("HP/Snape: relationship class \"potions master\" is not in")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("HP/Dobby: unknown affection class \"adoring\"")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("HP/Ron: role \"Ron\" of \"HP\" is listed twice")), "{msgs:?}");
    // unmapped = "neutral" keeps the unknown class as neutral; a bad level stays a failure.
    p.write("p.toml", format!("{toml}unmapped = \"neutral\"\n"));
    p.synth(&["run", "p.toml", "--out", "out2"]).ok();
    let roles = rows(&p.path().join("out2"), "roles");
    assert_eq!(roles.iter().find(|r| r["role"] == "Snape").unwrap()["affection"], "neutral");
    assert!(!roles.iter().any(|r| r["role"] == "Dobby"));
}
