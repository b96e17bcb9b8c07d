//! No degenerate preference pairs: a model that hands back the answer it was asked to
//! edit is re-asked; one that keeps doing so loses the sample (`degenerate_pair`), a
//! spare of the same group takes its place, the configured counts still hold and the
//! card says what happened. Played by the loopback OpenAI server on the demo profile;
//! the offline run has no such pair at all.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use support::openai_server::{self, Behaviour};
use support::{Project, parquet_rows, repo};

fn pipeline() -> String {
    repo().join("pipelines/rolemrc.toml").to_string_lossy().to_string()
}

fn norm(t: &str) -> String {
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn jsonl(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The text between a `<Label>` line's code fence and its closing fence.
fn block(prompt: &str, label: &str) -> Option<String> {
    let rest = &prompt[prompt.find(label)? + label.len()..];
    let rest = &rest[rest.find("```")? + 3..];
    Some(rest[..rest.find("```")?].trim().to_string())
}

/// Every pair of the DPO export is a real preference: chosen ≠ rejected after
/// whitespace normalization.
fn assert_no_degenerate_pair(dpo: &[Value]) {
    for r in dpo {
        let (c, j) = (r["chosen"].as_str().unwrap(), r["rejected"].as_str().unwrap());
        assert_ne!(norm(c), norm(j), "degenerate pair exported: {r}");
    }
}

/// Counts of the demo / offline profiles (pipelines/rolemrc.toml).
const SFT: usize = 360;
const DPO: usize = 280;
const TEST: usize = 64;

#[test]
fn the_offline_run_has_no_degenerate_pair_and_keeps_its_counts() {
    let p = Project::new();
    let out = p.path().join("off");
    p.synth(&["run", &pipeline(), "--offline", "--out", out.to_str().unwrap()]).ok();
    let dpo = jsonl(&out.join("dpo.jsonl"));
    assert_eq!(dpo.len(), DPO);
    assert_no_degenerate_pair(&dpo);
    assert_eq!(jsonl(&out.join("sft.jsonl")).len(), SFT);
    assert_eq!(jsonl(&out.join("test.jsonl")).len(), TEST);
    // Unused spares are kept apart, never exported.
    let samples = parquet_rows(&out.join("samples.parquet"));
    let spare: Vec<_> = samples.iter().filter(|s| s["split"] == "spare").collect();
    assert!(!spare.is_empty() && spare.iter().all(|s| s["spare"] == true), "every group plans a spare");
    assert!(samples.iter().filter(|s| s["split"] != "spare").all(|s| s["spare"] == false), "no spare was needed");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        card.contains("re-asked because the edited answer repeated the answer it edits: 0 sample(s), 0 re-ask(s)"),
        "{card}"
    );
    assert!(card.contains("dropped: 0 as degenerate pairs; 0 in all"), "{card}");
    assert!(card.contains("every sample group has its planned count"), "{card}");
}

#[test]
fn a_model_that_repeats_the_answer_is_reasked_then_replaced_by_a_spare() {
    const KEY: &str = "sk-pairs-test-2b7d";
    // By a hash of the whole conversation's first message: ~3% of edit requests always get
    // the answer back (whitespace changed), ~10% only on the first ask; the rest get the
    // offline stand-in's stylized answer.
    let responder = |body: &Value| -> String {
        let (messages, expect) = super::demo_request(body);
        let expect = expect.expect("unexpected prompt");
        if expect == "stylized" {
            let first = &messages[0].content;
            let bucket = blake3::hash(first.as_bytes()).as_bytes()[0] as usize * 100 / 256;
            let edited = block(first, "<Naive Answer>").or_else(|| block(first, "<Role’s Answer>")).unwrap();
            if bucket < 3 || (bucket < 13 && messages.len() == 1) {
                return format!("  {}\n", edited.replace(' ', "  "));
            }
        }
        super::demo_answer(messages, expect)
    };
    let server = openai_server::start(Behaviour {
        api_key: Some(KEY.into()),
        models: vec!["copycat".into()],
        responder: Arc::new(responder),
        // It plays the model in the text protocol: a server without structured outputs.
        refuse_structured: true,
        ..Default::default()
    });
    let p = Project::new();
    let out = p.path().join("demo");
    let url = server.base_url();
    let env = [("OPENAI_BASE_URL", url.as_str()), ("OPENAI_API_KEY", KEY), ("SYNTH_MODEL", "copycat")];
    let file = pipeline();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", file.as_str(), "--profile", "demo", "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        p.synth_env(&args, &env).ok()
    };
    // Spares also make up for near-duplicates (a spare may draw a planned sample's passage:
    // stylized_unique drops the later one), so a group plans a few more than it loses.
    run(&["--set", "stages.plan.spares={ ratio = 1.0, min = 3 }"]);

    // Exports: no degenerate pair, the configured counts.
    let dpo = jsonl(&out.join("dpo.jsonl"));
    assert_no_degenerate_pair(&dpo);
    assert_eq!(dpo.len(), DPO, "spares made up for the dropped pairs");
    assert_eq!(jsonl(&out.join("sft.jsonl")).len(), SFT);
    assert_eq!(jsonl(&out.join("test.jsonl")).len(), TEST);

    // The stylize stages re-asked, and recorded why.
    let stylized = parquet_rows(&out.join("stylized.parquet"));
    let reasked =
        stylized.iter().filter(|r| r["rejections"].as_array().unwrap().iter().any(|k| k == "degenerate_pair")).count();
    assert!(reasked > 10, "re-asked and then accepted: {reasked}");
    let manifest = support::manifest(&out);
    let rejected = manifest["stages"]["stylized"]["report"]["metrics"]["rejected.degenerate_pair"].as_f64().unwrap();
    assert!(rejected as usize > reasked, "every rejected answer is counted: {rejected}");

    // Requests that never stopped repeating: failures of their stage, then of the sample.
    let upstream = support::failures(&out, "stylized");
    assert!(
        !upstream.is_empty() && upstream.iter().all(|f| f["kind"] == "degenerate_pair"),
        "{:?}",
        upstream.iter().map(|f| (&f["id"], &f["kind"], &f["check"])).collect::<Vec<_>>()
    );
    // A sample is dropped as a degenerate pair, or as a near-duplicate of an earlier reply
    // (stylized_unique: a spare may draw a planned sample's passage and question).
    let dropped = support::failures(&out, "samples");
    assert!(dropped.iter().all(|f| f["kind"] == "degenerate_pair" || f["kind"] == "duplicate"), "{dropped:?}");
    let degenerate: Vec<_> = dropped.iter().filter(|f| f["kind"] == "degenerate_pair").collect();
    assert!(degenerate.len() >= upstream.len() / 2, "each failed request drops its sample: {dropped:?}");
    let msg = degenerate[0]["message"].as_str().unwrap();
    assert!(msg.contains("(stylized)") && msg.contains("must not repeat the given answer"), "{msg}");

    // Spares took the places of the counted samples that were dropped, within their groups.
    let samples = parquet_rows(&out.join("samples.parquet"));
    let used = samples.iter().filter(|s| s["spare"] == true && s["split"] != "spare").count();
    let counted_dropped = dropped
        .iter()
        .filter(|f| serde_json::from_str::<Value>(f["record"].as_str().unwrap()).unwrap()["spare"] == false)
        .count();
    assert!(counted_dropped > 0);
    assert_eq!(used, counted_dropped, "one spare per dropped counted sample");
    let mut per_group: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for s in samples.iter().filter(|s| s["split"] != "spare") {
        let e = per_group.entry(s["group"].as_str().unwrap().to_string()).or_default();
        e.0 += 1;
        e.1 += usize::from(s["spare"] == true);
    }
    assert!(per_group.values().any(|(_, spares)| *spares > 0));
    for (group, (n, _)) in &per_group {
        assert!(*n > 0, "{group}");
    }

    // The card tells.
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    let line = card.lines().find(|l| l.starts_with("- re-asked because")).unwrap();
    assert!(!line.contains(": 0 sample(s)"), "{line}");
    let line = card.lines().find(|l| l.starts_with("- dropped: ")).unwrap();
    assert!(line.starts_with(&format!("- dropped: {} as degenerate pairs", degenerate.len())), "{line}");
    assert!(card.contains("every sample group has its planned count"), "{card}");

    // Without spares the same failures leave groups short, and the card says which.
    let served = server.counters.ok.load(std::sync::atomic::Ordering::Relaxed);
    run(&["--set", "stages.plan.spares={ ratio = 0.0, min = 0 }"]);
    assert_eq!(server.counters.ok.load(std::sync::atomic::Ordering::Relaxed), served, "all from the cache");
    let dpo = jsonl(&out.join("dpo.jsonl"));
    assert_no_degenerate_pair(&dpo);
    assert!(dpo.len() < DPO, "{}", dpo.len());
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("groups short of their planned count"), "{card}");
    let manifest = support::manifest(&out);
    assert!(manifest["stages"]["samples"]["report"]["info"]["short_groups"].as_str().is_some_and(|s| !s.is_empty()));
}
