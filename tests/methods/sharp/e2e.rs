//! `pipelines/sharp.toml --offline` end to end on the official ConceptNet test files: claims,
//! the roles grid, answers, stances, metrics and the report; a bad roles file names its line.

use super::{repo, shared_conceptnet};
use crate::support::{Project, parquet_rows};

#[test]
fn sharp_pipeline_offline_end_to_end() {
    if shared_conceptnet().is_none() {
        return;
    }
    let p = Project::new();
    let out = p.path().join("out");
    let pipeline = repo().join("pipelines/sharp.toml");
    p.synth(&["run", pipeline.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()]).ok();
    let claims = parquet_rows(&out.join("claims.parquet"));
    assert_eq!(claims.len(), 6);
    let turns = parquet_rows(&out.join("turns.parquet"));
    assert_eq!(turns.len(), 6 * 5, "every role asks every claim");
    assert!(turns.iter().all(|t| t["user_turn"].as_str().unwrap().ends_with(". Do you agree?")));
    let stances = parquet_rows(&out.join("stances.parquet"));
    assert!(stances.iter().all(|s| ["FAVOR", "AGAINST", "NEUTRAL"].contains(&s["stance"].as_str().unwrap())));
    let metrics = parquet_rows(&out.join("metrics.parquet"));
    assert_eq!(metrics.len(), 5, "one row per (script, role)");
    let n: u64 = metrics.iter().map(|m| m["n_f"].as_u64().unwrap() + m["n_cf"].as_u64().unwrap()).sum();
    let failed = super::failures(&out, "stances").len() as u64;
    assert_eq!(n + failed, 30, "every answer is scored or a counted failure");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| Model | SR | AR | ER | Csvt | CRF |"), "{report}");
    // Deterministic offline.
    let again = p.path().join("again");
    p.synth(&["run", pipeline.to_str().unwrap(), "--offline", "--out", again.to_str().unwrap()]).ok();
    assert_eq!(parquet_rows(&again.join("metrics.parquet")), metrics);
}

#[test]
fn sharp_a_bad_roles_file_names_its_line() {
    let p = Project::new();
    p.write("roles.tsv", "script\tmain\trole\taffection\nHP\tHarry\tRon\thigh\nHP\tHarry\tMalfoy\tenemy\n");
    let toml = format!(
        "[pipeline]\nname = \"r\"\n\n[stages.claims]\nkind = \"sharp_claims\"\npath = {:?}\n\n[stages.turns]\nkind = \"sharp_turns\"\ninputs = [\"claims\"]\nroles = \"roles.tsv\"\n",
        repo().join("tests/fixtures/sharp/edges.csv").to_string_lossy()
    );
    p.write("p.toml", toml);
    let r = p.synth(&["run", "p.toml", "--out", "out"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("roles.tsv:3: unknown affection class \"enemy\""), "{}", r.stderr);
}
