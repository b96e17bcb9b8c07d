//! `pipelines/roleeval.toml --offline`: the demo release with its key fills the paper's
//! tables with numbers recomputed here from the per-question rows; re-runs are
//! byte-identical; the reconstructed choices are in the manifest; the real release
//! gives 6,000 questions, 12,000 prompts and the spec's reference hashes.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{failures, repo, run, shared_release};
use crate::support::{Project, assert_same_outputs, manifest, parquet_rows};

const CODES: [&str; 5] = ["CE", "AC", "MT", "GA", "FI"];

#[test]
fn demo_release_fills_the_paper_tables_with_recomputable_numbers() {
    let p = Project::new();
    let (out, r) = run(&p, "a", &["--profile", "demo"]);
    r.ok();
    assert_eq!(parquet_rows(&out.join("test.parquet")).len(), 60);
    assert_eq!(parquet_rows(&out.join("dev.parquet")).len(), 50);
    let prompts = parquet_rows(&out.join("prompts.parquet"));
    assert_eq!(prompts.len(), 120, "60 questions x {{0, 5}} shots");
    for r in &prompts {
        let prompt = r["prompt"].as_str().unwrap();
        assert_eq!(r["prompt_sha256"].as_str().unwrap(), synth::methods::roleeval::sha256::hex(prompt.as_bytes()));
        let k = r["shots"].as_i64().unwrap();
        assert_eq!(prompt.matches("\n答案：").count() as i64, k + 1, "{}", r["id"]);
        assert!(prompt.ends_with("\n答案："));
        let msgs = r["messages"].as_array().unwrap();
        assert_eq!(
            (msgs.len(), msgs[0]["role"].as_str(), msgs[0]["content"].as_str()),
            (1, Some("user"), Some(prompt))
        );
    }
    // The demo's quirks survive: a leading space, quotes and a comma, duplicate options.
    let by_id: BTreeMap<&str, &serde_json::Map<String, Value>> =
        prompts.iter().map(|r| (r["id"].as_str().unwrap(), r)).collect();
    assert!(by_id["global/celebrities/1/0shot"]["prompt"].as_str().unwrap().contains("\nB.  "));
    assert!(by_id["global/fiction/2/0shot"]["prompt"].as_str().unwrap().contains("\nB. \"冒险家号\"\nC. 甲,乙\n"));
    assert_eq!(by_id["chinese/games/3/5shot"]["duplicate_options"], true);

    // Recompute every cell from the per-question rows and compare with the report.
    let report = parquet_rows(&out.join("report.parquet"));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## RoleEval (zh), five-shot: accuracy (%), Table 3 layout"));
    assert!(md.contains("## RoleEval (zh), zero-shot: accuracy (%), Table 5 layout"));
    assert!(
        md.contains("| Model | Global CE | Global AC | Global MT | Global GA | Global FI | Global Avg | Chinese CE |")
    );
    assert!(md.contains("Tables 7-8 layout"));
    for label in ["chat", "open"] {
        let rows = parquet_rows(&out.join(format!("{label}_scores.parquet")));
        assert_eq!(rows.len(), 120);
        let mut cells: BTreeMap<(i64, String, String), (u64, u64)> = BTreeMap::new();
        for r in &rows {
            let gold = r["gold"].as_str().expect("the demo key covers every question");
            let correct = r["pred"].as_str() == Some(gold);
            assert_eq!(r["correct"], correct);
            let c = cells
                .entry((
                    r["shots"].as_i64().unwrap(),
                    r["subset"].as_str().unwrap().into(),
                    r["code"].as_str().unwrap().into(),
                ))
                .or_default();
            c.0 += 1;
            c.1 += u64::from(correct);
        }
        let value = |table: &str, metric: &str| {
            report
                .iter()
                .find(|r| r["label"] == label && r["table"] == table && r["metric"] == metric)
                .unwrap_or_else(|| panic!("{label} {table} {metric} missing"))["value"]
                .as_f64()
                .unwrap()
        };
        for shots in [0i64, 5] {
            let table = format!("zh_{shots}shot");
            for subset in ["global", "chinese"] {
                let mut sum = 0.0;
                let mut cells_md = Vec::new();
                for code in CODES {
                    let (n, c) = cells[&(shots, subset.to_string(), code.to_string())];
                    assert_eq!(n, if subset == "global" { 8 } else { 4 });
                    let want = (c as f64 / n as f64) * 100.0;
                    assert_eq!(value(&table, &format!("{subset}_{code}")), want);
                    sum += want;
                    cells_md.push(format!("{want:.2}"));
                }
                let avg = value(&table, &format!("{subset}_avg"));
                assert!((avg - sum / 5.0).abs() < 1e-9);
                cells_md.push(format!("{avg:.2}"));
                assert!(md.contains(&cells_md.join(" | ")), "{label} {table} {subset}: {cells_md:?} not in the report");
            }
        }
    }
    // The open path answers every question; the chat path's unparsable answers are counted.
    let unanswered = |label: &str| {
        report.iter().find(|r| r["label"] == label && r["metric"] == "0shot_unanswered").unwrap()["value"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(unanswered("open"), 0.0);
    let chat = parquet_rows(&out.join("chat_scores.parquet"));
    let nulls = chat.iter().filter(|r| r["shots"] == 0 && r["pred"].is_null()).count();
    assert_eq!(unanswered("chat"), (nulls as f64 / 60.0) * 100.0);
    assert!(nulls > 0, "the offline chat model sometimes answers without a letter");
    let rules = parquet_rows(&out.join("chat.parquet"));
    assert!(rules.iter().any(|r| r["extract_rule"].as_str().is_some_and(|s| s.starts_with("cmmlu:"))));
    assert!(rules.iter().any(|r| r["extract_rule"] == "ceval:first_char"));

    // Submission: per setting, per file, per id.
    let sub: Value = serde_json::from_slice(&std::fs::read(out.join("chat_scores.submission.json")).unwrap()).unwrap();
    assert_eq!(sub.as_object().unwrap().keys().collect::<Vec<_>>(), ["5shot", "0shot"]);
    assert_eq!(sub["5shot"].as_object().unwrap().len(), 10);
    assert_eq!(sub["0shot"]["chinese/fiction"].as_object().unwrap().len(), 4);

    // The reconstructed choices are recorded in the manifest.
    let m = manifest(&out).to_string();
    for needle in [
        "\"target_delimiter\":\"\"",
        "\"chat_style\":\"single_message\"",
        "\"strip_question\":false",
        "\"fewshot_order\":\"file\"",
        "\"random_fallback\":false",
    ] {
        assert!(m.contains(needle), "manifest lacks {needle}");
    }

    // Byte-identical outputs in a second directory.
    let (again, r) = run(&p, "b", &["--profile", "demo"]);
    r.ok();
    assert_same_outputs(&out, &again);
}

#[test]
fn the_demo_generator_writes_the_committed_files() {
    if std::process::Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not on this machine");
        return;
    }
    let demo = repo().join("pipelines/data/roleeval-demo");
    let tmp = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("python3")
        .arg(demo.join("make_demo.py"))
        .arg(tmp.path())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let written = crate::support::output_files(tmp.path());
    assert_eq!(written.len(), 21, "20 CSVs and the key");
    for (rel, bytes) in written {
        assert_eq!(std::fs::read(demo.join(&rel)).unwrap(), bytes, "{rel} differs from make_demo.py's output");
    }
}

#[test]
fn the_real_release_offline() {
    let Some(_) = shared_release() else { return };
    let p = Project::new();
    let (out, r) = run(&p, "real", &[]);
    r.ok();
    assert_eq!(parquet_rows(&out.join("test.parquet")).len(), 6000);
    assert_eq!(parquet_rows(&out.join("dev.parquet")).len(), 50);
    for stage in ["test", "dev", "prompts", "chat_zero", "chat_five", "open"] {
        assert!(failures(&out, stage).is_empty(), "{stage} has failures");
    }
    let prompts = parquet_rows(&out.join("prompts.parquet"));
    assert_eq!(prompts.len(), 12000);
    let sha: BTreeMap<&str, &str> =
        prompts.iter().map(|r| (r["id"].as_str().unwrap(), r["prompt_sha256"].as_str().unwrap())).collect();
    assert_eq!(sha["global/celebrities/48/0shot"], "97647daee5bf6a1554acb1c48a5a988c3991bf7cdde2196f6961dbeff3f71d77");
    assert_eq!(sha["global/celebrities/48/5shot"], "df694dd0f1b79086709f6e9a9e48b5271a531e42f3f9755123aeb505a28cf44c");
    assert_eq!(sha["chinese/fiction/0/0shot"], "fb6e1a550ea0a959aaff5ebdc2ae4bce3bdc2f4c9c7b03281a0a1888e4733963");
    assert_eq!(sha["chinese/fiction/0/5shot"], "d87479fbb98eb3a2db85139269ed967dd1a533e49566510e88d52880d994f6b4");
    let dups = prompts.iter().filter(|r| r["shots"] == 0 && r["duplicate_options"] == true).count();
    assert_eq!(dups, 15, "the spec counts 15 test rows with duplicate options");
    // No key: no accuracy table, the unanswered rate and a full submission file.
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!md.contains("Table 3 layout"));
    assert!(md.contains("answers without a usable letter"));
    // The ambiguous questions are kept, and flagged in the report: 15 of 6,000 = 0.25%.
    assert!(md.contains("questions whose options repeat a text"), "{md}");
    assert!(md.contains("| chat | 0.25 | 0.25 |"), "{md}");
    let sub: Value = serde_json::from_slice(&std::fs::read(out.join("open_scores.submission.json")).unwrap()).unwrap();
    let n: usize = sub["5shot"].as_object().unwrap().values().map(|f| f.as_object().unwrap().len()).sum();
    assert_eq!(n, 6000);

    // The self-check: the dev exemplars scored against their own answers.
    let (selfcheck, r) = run(&p, "self", &["--profile", "selfcheck"]);
    r.ok();
    let rows = parquet_rows(&selfcheck.join("open_scores.parquet"));
    assert_eq!(rows.len(), 50);
    assert!(rows.iter().all(|r| r["gold"].is_string() && r["correct"].is_boolean()));
    let md = std::fs::read_to_string(selfcheck.join("report.md")).unwrap();
    assert!(md.contains("zero-shot: accuracy (%), Table 5 layout"));
}

#[test]
fn the_reconstructed_switches_change_what_they_say() {
    let p = Project::new();
    let (out, r) = run(
        &p,
        "switched",
        &[
            "--profile",
            "demo",
            "--set",
            "stages.prompts.chat_style=\"ceval_messages\"",
            "--set",
            "stages.chat_zero.parser_options={cascade=[\"ceval\", \"cmmlu\"], random_fallback=true}",
        ],
    );
    r.ok();
    let prompts = parquet_rows(&out.join("prompts.parquet"));
    for row in &prompts {
        let msgs = row["messages"].as_array().unwrap();
        let k = row["shots"].as_u64().unwrap() as usize;
        assert_eq!(msgs.len(), 2 + 2 * k, "system, k exemplar turns, the question");
        assert_eq!(msgs[0]["role"], "system");
        assert!(msgs[0]["content"].as_str().unwrap().starts_with("你是一个中文人工智能助手，以下是关于"));
        assert!(msgs.last().unwrap()["content"].as_str().unwrap().ends_with("\n答案："));
    }
    // With the random fallback every zero-shot answer has a letter, some from the seeded guess.
    let zero = parquet_rows(&out.join("chat_zero.parquet"));
    assert!(zero.iter().all(|r| r["pred"].is_string()));
    assert!(zero.iter().any(|r| r["extract_rule"] == "cmmlu:random"));
    let five = parquet_rows(&out.join("chat_five.parquet"));
    assert!(five.iter().any(|r| r["pred"].is_null()), "the five-shot stage keeps the default (no guess)");
}

#[test]
fn the_release_can_come_from_a_hub_repository() {
    // The demo release served by a fake hub in the upstream layout: the same records as
    // from the local directory, the commit in the fingerprint, nothing downloaded twice.
    let demo = repo().join("pipelines/data/roleeval-demo");
    let mut files = BTreeMap::new();
    let mut stack = vec![demo.join("zh")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(&demo).unwrap().to_string_lossy().replace('\\', "/");
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let hub = std::sync::Arc::new(crate::hub::Hub {
        files: BTreeMap::from([("org/roleeval".to_string(), files)]),
        ..Default::default()
    });
    let (url, _stop) = crate::hub::serve(hub.clone());
    let p = Project::new();
    let format = repo().join("pipelines/prompts/roleeval/zh.json");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
output_dir = "out"

[stages.from_hub]
kind = "roleeval_release"
hf = {{ repo = "org/roleeval", endpoint = "{url}", cache_dir = "hf-cache" }}
split = "test"
format = "{format}"

[stages.local]
kind = "roleeval_release"
path = "{demo}"
split = "test"
format = "{format}"
"#,
            format = format.display(),
            demo = demo.display()
        ),
    );
    p.synth(&["run", "p.toml"]).ok();
    let (a, b) =
        (parquet_rows(&p.path().join("out/from_hub.parquet")), parquet_rows(&p.path().join("out/local.parquet")));
    assert!(!a.is_empty());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for col in ["id", "question", "A", "B", "C", "D"] {
            assert_eq!(x[col], y[col], "{col}");
        }
    }
    let state: Value =
        serde_json::from_slice(&std::fs::read(p.path().join("out/_synth/state/from_hub.json")).unwrap()).unwrap();
    assert_eq!(state["parts"]["extra"]["hf.commit"], "0123456789abcdef0123456789abcdef01234567", "{state}");
    let n = hub.downloads.lock().unwrap().len();
    p.synth(&["run", "p.toml"]).ok();
    assert_eq!(hub.downloads.lock().unwrap().len(), n, "a second run downloads nothing");
}

#[test]
fn lm_eval_exemplar_order_is_cpythons_random_1234() {
    // lm-eval's sampler: Random(1234).sample(dev, 5) per question, in file order, per file.
    // CPython gives [3, 0, 4, 2, 1] then [0, 4, 1, 3, 2] for the first two draws.
    let p = Project::new();
    let (out, r) = run(
        &p,
        "lmeval",
        &["--profile", "demo", "--set", "stages.prompts.fewshot_order=\"lm_eval_random_1234\"", "--until", "prompts"],
    );
    r.ok();
    let dev = parquet_rows(&out.join("dev.parquet"));
    let prompts = parquet_rows(&out.join("prompts.parquet"));
    let mut checked = 0;
    for (subset, category) in [("global", "games"), ("chinese", "fiction")] {
        let stems: Vec<&str> = dev
            .iter()
            .filter(|d| d["subset"] == subset && d["category"] == category)
            .map(|d| d["question"].as_str().unwrap())
            .collect();
        assert_eq!(stems.len(), 5);
        let five: Vec<&str> = prompts
            .iter()
            .filter(|q| q["subset"] == subset && q["category"] == category && q["shots"] == 5)
            .map(|q| q["prompt"].as_str().unwrap())
            .collect();
        for (prompt, order) in five.iter().zip([[3, 0, 4, 2, 1], [0, 4, 1, 3, 2]]) {
            let at: Vec<usize> =
                order.iter().map(|&j| prompt.find(stems[j]).expect("exemplar in the prompt")).collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{subset}/{category}: order {order:?} at {at:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 4);
}
