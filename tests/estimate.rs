//! `synth run --dry-run`'s estimate: per stage the requests, tokens, cost and time of the
//! model calls, from a simulated run that sends nothing (or a `--sample` of each stage's
//! calls); checked on RoleMRC's pipeline against a priced model, and on the real small model
//! against what the run then used.

use crate::local::{one_at_a_time, pipeline};
use crate::support::{self, Project};

/// The estimate's row of `stage`: requests, cached, tokens in, tokens out (`≤` dropped),
/// the cost cell.
fn row(stdout: &str, stage: &str) -> (u64, u64, u64, u64, String) {
    let cells = regex::Regex::new(r"\s{2,}").unwrap();
    let line = stdout
        .lines()
        .skip_while(|l| !l.starts_with("estimate"))
        .find(|l| l.split_whitespace().next() == Some(stage))
        .unwrap_or_else(|| panic!("no estimate row for {stage}:\n{stdout}"));
    let c: Vec<&str> = cells.split(line.trim()).collect();
    let n = |s: &str| s.trim_start_matches("≤ ").replace(',', "").parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    (n(c[2]), n(c[3]), n(c[4]), n(c[5]), c[6].to_string())
}

/// RoleMRC against a priced model (the demo profile's OpenAI-compatible provider, gpt-4o-mini),
/// no key and a base URL nothing listens on: every model stage gets a row with tokens and a
/// cost, the plan is printed as before, and nothing is written where the run would write.
#[test]
fn a_dry_run_of_rolemrc_prints_tokens_and_cost_per_stage_and_sends_nothing() {
    let p = Project::new();
    let pipeline = support::repo().join("pipelines/rolemrc.toml");
    let out = p.path().join("out");
    let r = p.synth_env(
        &["run", pipeline.to_str().unwrap(), "--profile", "demo", "--dry-run", "--out", out.to_str().unwrap()],
        &[("SYNTH_MODEL", "gpt-4o-mini"), ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("would run"), "the plan: {}", r.stdout);
    for stage in ["profiles_llm", "free_chats", "onscene_chats", "stylized", "rewritten"] {
        let (requests, cached, tin, tout, cost) = row(&r.stdout, stage);
        // Cached here: a request identical to an earlier one (the run asks it once).
        assert!(requests > 0 && cached < requests / 4, "{stage}: {requests} {cached}");
        assert!(tin > 0 && tout > 0, "{stage}: {tin} {tout}");
        let usd: f64 = cost.trim_start_matches("≤ ").parse().unwrap_or_else(|_| panic!("{stage}: {cost}"));
        // gpt-4o-mini's list price: $0.15 / $0.60 per million tokens.
        let expected = (tin as f64 * 0.15 + tout as f64 * 0.60) / 1e6;
        assert!((usd - expected).abs() <= 0.006, "{stage}: {usd} vs {expected}");
    }
    // 60 profiles are asked for (the demo profile's `personas.n`).
    assert_eq!(row(&r.stdout, "profiles_llm").0, 60, "{}", r.stdout);
    assert!(r.stdout.lines().any(|l| l.starts_with("total")), "{}", r.stdout);
    assert!(r.stdout.contains("max_tokens"), "says answers are counted at max_tokens: {}", r.stdout);
    assert!(!out.exists(), "a dry run writes nothing where the run would write");
    // The simulated stages do not log as if they ran.
    assert!(!r.stderr.contains("\" done: "), "{}", r.stderr);
    assert!(!r.stderr.contains(") starts: "), "{}", r.stderr);
}

/// On the real small model: the estimate with a sample of 3 calls is within 25% of the
/// tokens a fresh run of the same config then used, and the run that follows the sample in
/// the same directory does not pay for the sampled calls again.
#[test]
fn the_estimate_with_a_sample_is_within_a_quarter_of_what_the_run_used() {
    let _one = one_at_a_time();
    let topics = [
        "bread",
        "rain",
        "a kite",
        "the sea",
        "owls",
        "tea",
        "a violin",
        "winter",
        "bees",
        "a lighthouse",
        "maps",
        "a clock",
    ];
    let config = "temperature = 0.8\nseed = 5\nmax_tokens = 40";
    let sampled = pipeline(config, &topics);
    // Without a sample the answers are counted at max_tokens, and said to be.
    let r = sampled.synth(&["run", "p.toml", "--dry-run"]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(row(&r.stdout, "answers").3, 12 * 40, "{}", r.stdout);
    assert!(r.stdout.contains("≤ 480"), "{}", r.stdout);
    let r = sampled.synth(&["run", "p.toml", "--dry-run", "--sample", "3"]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let (requests, cached, est_in, est_out, cost) = row(&r.stdout, "answers");
    assert_eq!((requests, cached), (12, 0), "{}", r.stdout);
    assert_eq!(cost, "0.00", "a model in this process costs nothing");
    assert!(!r.stdout.contains("≤"), "a sample measured the answers: {}", r.stdout);
    // The run after it: the 3 sampled answers come from the cache.
    sampled.synth(&["run", "p.toml"]).ok();
    let m = support::manifest(&sampled.path().join("out"));
    assert_eq!(m["stages"]["answers"]["report"]["cache_hits"], 3, "{m}");
    // A fresh run of the same config: what the estimate is held against.
    let fresh = pipeline(config, &topics);
    fresh.synth(&["run", "p.toml"]).ok();
    let m = support::manifest(&fresh.path().join("out"));
    let report = &m["stages"]["answers"]["report"];
    let (tin, tout) = (report["tokens_in"].as_u64().unwrap(), report["tokens_out"].as_u64().unwrap());
    assert_eq!(report["requests"], 12, "{report}");
    for (what, est, actual) in [("tokens in", est_in, tin), ("tokens out", est_out, tout)] {
        let off = (est as f64 - actual as f64).abs() / actual as f64;
        assert!(off <= 0.25, "{what}: estimated {est}, used {actual} ({:.0}% off)", off * 100.0);
    }
}
