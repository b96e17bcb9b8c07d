//! `pipelines/roleeval-build.toml --offline`: 17 + 3 slots per character, drafted and
//! imported questions, the quality check recomputed here from the per-question rows
//! (failing characters listed with their accuracies), and the exported release read
//! back by the evaluation's own reader.

use std::collections::BTreeMap;

use super::repo;
use crate::support::{Project, parquet_rows};
use synth::methods::roleeval::format::Format;
use synth::methods::roleeval::release::read_text;

fn run_build(p: &Project, out: &str, args: &[&str]) -> std::path::PathBuf {
    let dir = p.path().join(out);
    let pipeline = repo().join("pipelines/roleeval-build.toml");
    let mut all = vec!["run", pipeline.to_str().unwrap(), "--offline", "--out", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    p.synth(&all).ok();
    dir
}

#[test]
fn the_quality_check_keeps_exactly_the_characters_within_the_bounds() {
    let p = Project::new();
    let out = run_build(&p, "out", &[]);
    let slots = parquet_rows(&out.join("slots.parquet"));
    assert_eq!(slots.len(), 5 * 20);
    let c01: Vec<_> = slots.iter().filter(|r| r["char_id"] == "c01").collect();
    assert_eq!(c01.iter().filter(|r| r["kind"] == "reasoning").count(), 3);
    assert_eq!(c01.iter().filter(|r| r["format"] == "negation").count(), 2);
    assert_eq!(c01.iter().filter(|r| r["format"] == "non_occurrence").count(), 1);

    // The questions of passing characters are the output; those of failing characters
    // are in the failure table (kind `check`), with the predictions and the verdict.
    let kept = parquet_rows(&out.join("qc.parquet"));
    let failed = crate::support::failures(&out, "qc");
    assert!(failed.iter().all(|f| f["kind"] == "check" && f["check"] == "roleeval_qc"), "{failed:?}");
    let mut qc = kept.clone();
    qc.extend(failed.iter().map(|f| serde_json::from_str(f["record"].as_str().unwrap()).unwrap()));
    let questions = parquet_rows(&out.join("questions.parquet"));
    assert_eq!(qc.len(), questions.len(), "every question is kept or failed");
    assert!(questions.len() >= 95 && questions.len() <= 102, "100 drafted + 2 imported, near-duplicates removed");
    // Recompute x, y and the verdict per character.
    let mut per: BTreeMap<String, (u32, u32, u32)> = BTreeMap::new();
    for r in &qc {
        let e = per.entry(r["char_id"].as_str().unwrap().to_string()).or_default();
        e.0 += 1;
        e.1 += u32::from(r["strong_pred"] == r["answer"]);
        e.2 += u32::from(r["weak_pred"] == r["answer"]);
    }
    let revise = std::fs::read_to_string(out.join("qc.revise.csv")).unwrap();
    let mut passing = Vec::new();
    for (c, (n, s, w)) in &per {
        let (x, y) = (*s as f64 / *n as f64, *w as f64 / *n as f64);
        let pass = (0.3 - 1e-9..=0.9 + 1e-9).contains(&x) && y <= 0.8 + 1e-9 && x - y >= 0.15 - 1e-9;
        let rows: Vec<_> = qc.iter().filter(|r| r["char_id"] == c.as_str()).collect();
        assert!(rows.iter().all(|r| r["qc_pass"] == pass && r["qc_strong"].as_f64() == Some(x)), "{c}");
        let line = revise.lines().find(|l| l.starts_with(&format!("{c},")));
        assert_eq!(line.is_some(), !pass, "{c} is listed for revision iff it fails");
        if let Some(l) = line {
            assert!(l.contains(&format!(",{n},{x:.2},{y:.2},")), "{l}");
        }
        if pass {
            passing.push(c.clone());
        }
    }
    assert!(revise.lines().count() > 1, "offline models answer at random: some characters fail");
    let passed = parquet_rows(&out.join("passed.parquet"));
    assert!(passed.iter().all(|r| passing.contains(&r["char_id"].as_str().unwrap().to_string())));
    assert_eq!(passed.len(), qc.iter().filter(|r| r["qc_pass"] == true).count());
    assert_eq!(kept.len(), passed.len(), "only passing characters' questions are output");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| 林远 |"));
}

#[test]
fn the_exported_release_reads_back() {
    let p = Project::new();
    let out = run_build(&p, "out", &["--set", "stages.qc.min_gap=-1.0", "--set", "stages.qc.strong_min=0.0"]);
    let format = Format::read(&repo().join("pipelines/prompts/roleeval/zh.json")).unwrap();
    let release = out.join("release");
    let (mut test_questions, mut dev_questions) = (0, 0);
    let mut files = Vec::new();
    for entry in walk(&release.join("zh")) {
        let rel = entry.strip_prefix(&release).unwrap().to_string_lossy().to_string();
        let parts: Vec<&str> = rel.split('/').collect();
        let (subset, split, file) = (parts[1], parts[2], parts[3]);
        let stem = file.strip_suffix(&format!("_{split}.csv")).unwrap();
        let text = std::fs::read_to_string(&entry).unwrap();
        let (items, problems) = read_text(&text, &rel, subset, stem, &format, split).unwrap();
        assert!(problems.is_empty(), "{rel}: {problems:?}");
        assert!(items.iter().enumerate().all(|(i, it)| it.qid == i.to_string()), "{rel}: ids from 0");
        if split == "test" {
            test_questions += items.len();
        } else {
            dev_questions += items.len();
        }
        files.push(rel);
    }
    files.sort();
    assert_eq!(
        files,
        [
            "zh/chinese/dev/fiction_dev.csv",
            "zh/chinese/test/anime_and_comics_test.csv",
            "zh/chinese/test/fiction_test.csv",
            "zh/global/test/games_test.csv",
            "zh/global/test/movies_and_tv_series_test.csv",
        ]
    );
    // 4 test characters x 20 + 2 imported, less the near-duplicates `questions` removed;
    // every question that passed is exported, to dev or test.
    let questions = parquet_rows(&out.join("questions.parquet"));
    assert_eq!(test_questions + dev_questions, questions.len());
    assert!(
        (78..=82).contains(&test_questions) && (18..=20).contains(&dev_questions),
        "{test_questions} {dev_questions}"
    );
    let games = std::fs::read_to_string(release.join("zh/global/test/games_test.csv")).unwrap();
    assert!(games.contains("韩雪的妹妹是谁？,韩霜,韩露,苏晴,江离\n"), "imported questions are exported");
    let key = std::fs::read_to_string(release.join("key.csv")).unwrap();
    assert_eq!(key.lines().count(), 1 + test_questions);
    // 3 reasoning slots per test character, less those removed as near-duplicates.
    let reasoning = key.lines().filter(|l| l.ends_with(",reasoning")).count();
    let removed = crate::support::failures(&out, "questions").len();
    assert!(reasoning <= 4 * 3 && reasoning + removed >= 4 * 3, "{reasoning} reasoning, {removed} removed");
    assert!(
        std::fs::read_to_string(release.join("README.md"))
            .unwrap()
            .contains(&format!("| chinese | dev | fiction | {dev_questions} |"))
    );

    // The optional translation: the same files under en/, read back with the English format
    // file, and the same key (every translation kept its answer letter).
    let en = out.join("release_en");
    let en_format = Format::read(&repo().join("pipelines/prompts/roleeval/en.json")).unwrap();
    for rel in &files {
        let rel_en = rel.replacen("zh/", "en/", 1);
        let parts: Vec<&str> = rel_en.split('/').collect();
        let (subset, split) = (parts[1], parts[2]);
        let stem = parts[3].strip_suffix(&format!("_{split}.csv")).unwrap();
        let text = std::fs::read_to_string(en.join(&rel_en)).unwrap();
        let (items, problems) = read_text(&text, &rel_en, subset, stem, &en_format, split).unwrap();
        let zh_text = std::fs::read_to_string(release.join(rel)).unwrap();
        assert!(problems.is_empty() && items.len() == zh_text.lines().count() - 1, "{rel_en}");
    }
    assert_eq!(std::fs::read_to_string(en.join("key.csv")).unwrap(), key);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
