//! Engine behaviour through the `synth` binary: incremental skip and invalidation,
//! selection flags, determinism, record failures and the failure ratio, the
//! manifest, and the inspect / stats / graph / list commands.

use crate::support;

use support::{Project, assert_same_outputs, manifest, parquet_rows, people_jsonl, statuses};

const PIPELINE: &str = r#"
[pipeline]
name = "people"
seed = 5
output_dir = "out"

[stages.people]
kind = "source"
path = "people.jsonl"

[stages.cities]
kind = "source"
path = "cities.csv"
id_column = "city"

[stages.adults]
kind = "filter"
inputs = ["people"]
where = "age >= 18"

[stages.sample]
kind = "sample"
inputs = ["adults"]
n = 40
stratify_by = "city"

[stages.located]
kind = "join"
inputs = ["sample", "cities"]
on = "city"

[stages.shaped]
kind = "map"
inputs = ["located"]
derive = { line = "{{ name }} ({{ age }}) lives in {{ city }}, {{ country }}" }

[stages.export]
kind = "jsonl"
inputs = ["shaped"]

[stages.city_table]
kind = "parquet"
inputs = ["cities"]

[profiles.small]
stages.sample.n = 5
"#;

fn project() -> Project {
    let p = Project::new();
    p.write("pipeline.toml", PIPELINE);
    p.write("people.jsonl", people_jsonl(500));
    p.write("cities.csv", "city,country\nrome,italy\noslo,norway\nlima,peru\n");
    p
}

#[test]
fn rerun_of_unchanged_pipeline_does_no_work() {
    let p = project();
    let first = p.synth(&["run", "pipeline.toml"]).ok();
    assert!(first.stdout.contains("ran"), "{}", first.stdout);
    let out = p.path().join("out");
    let before = support::output_files(&out);
    let mtimes: Vec<_> = before.keys().map(|f| std::fs::metadata(out.join(f)).unwrap().modified().unwrap()).collect();

    let second = p.synth(&["run", "pipeline.toml"]).ok();
    assert!(second.stdout.contains("everything is up to date (8 stages)"), "{}", second.stdout);
    assert!(statuses(&out).values().all(|s| s == "up_to_date"), "{:?}", statuses(&out));
    let after_mtimes: Vec<_> =
        before.keys().map(|f| std::fs::metadata(out.join(f)).unwrap().modified().unwrap()).collect();
    assert_eq!(mtimes, after_mtimes, "an up-to-date run rewrote outputs");
    assert_eq!(manifest(&out)["status"], "ok");
}

#[test]
fn changing_one_stage_reruns_it_and_its_descendants_only() {
    let p = project();
    p.synth(&["run", "pipeline.toml"]).ok();
    let out = p.path().join("out");

    p.synth(&["run", "pipeline.toml", "--set", "stages.sample.n=30"]).ok();
    let s = statuses(&out);
    for stage in ["people", "cities", "adults", "city_table"] {
        assert_eq!(s[stage], "up_to_date", "{stage}: {s:?}");
    }
    for stage in ["sample", "located", "shaped", "export"] {
        assert_eq!(s[stage], "ran", "{stage}: {s:?}");
    }
    assert_eq!(parquet_rows(&out.join("sample.parquet")).len(), 30);

    // A changed input file reruns its source and everything downstream of it.
    p.write("cities.csv", "city,country\nrome,italy\noslo,norway\nlima,peru (pe)\n");
    p.synth(&["run", "pipeline.toml", "--set", "stages.sample.n=30"]).ok();
    let s = statuses(&out);
    for stage in ["people", "adults", "sample"] {
        assert_eq!(s[stage], "up_to_date", "{stage}: {s:?}");
    }
    for stage in ["cities", "located", "shaped", "export", "city_table"] {
        assert_eq!(s[stage], "ran", "{stage}: {s:?}");
    }
}

#[test]
fn a_deleted_or_modified_output_is_rebuilt() {
    let p = project();
    p.synth(&["run", "pipeline.toml"]).ok();
    let out = p.path().join("out");
    std::fs::remove_file(out.join("adults.parquet")).unwrap();
    std::fs::write(out.join("export.jsonl"), "tampered\n").unwrap();
    p.synth(&["run", "pipeline.toml"]).ok();
    let s = statuses(&out);
    assert_eq!(s["adults"], "ran");
    assert_eq!(s["export"], "ran");
    assert_eq!(s["people"], "up_to_date");
    // Rebuilt with the same fingerprint: downstream stays up to date.
    assert_eq!(s["sample"], "up_to_date");
    assert!(!p.read("out/export.jsonl").contains("tampered"));
}

#[test]
fn force_from_and_only() {
    let p = project();
    p.synth(&["run", "pipeline.toml"]).ok();
    let out = p.path().join("out");

    p.synth(&["run", "pipeline.toml", "--force"]).ok();
    assert!(statuses(&out).values().all(|s| s == "ran"));

    p.synth(&["run", "pipeline.toml", "--from", "sample"]).ok();
    let s = statuses(&out);
    assert_eq!(s["adults"], "up_to_date");
    assert_eq!(s["sample"], "ran");
    assert_eq!(s["export"], "ran");
    assert_eq!(s["city_table"], "up_to_date");

    p.synth(&["run", "pipeline.toml", "--only", "shaped", "--force"]).ok();
    let s = statuses(&out);
    assert_eq!(s["shaped"], "ran");
    assert_eq!(s["export"], "skipped");
    assert_eq!(s["located"], "up_to_date");

    // --only with a stale input refuses and says how to proceed.
    let run = p.synth(&["run", "pipeline.toml", "--only", "shaped", "--set", "stages.adults.where=age >= 21"]).code(2);
    assert!(
        run.stderr
            .contains("depends on \"adults\", which is not up to date (configuration changed); run without --only"),
        "{}",
        run.stderr
    );

    let run = p.synth(&["run", "pipeline.toml", "--only", "shapd"]).code(78);
    assert!(run.stderr.contains("--only shapd: no such stage (did you mean \"shaped\"?)"), "{}", run.stderr);
}

#[test]
fn dry_run_reports_and_runs_nothing() {
    let p = project();
    let run = p.synth(&["run", "pipeline.toml", "--dry-run"]).ok();
    assert!(run.stdout.contains("people") && run.stdout.contains("would run (not built yet)"), "{}", run.stdout);
    assert!(run.stdout.contains("8 stage(s) would run"), "{}", run.stdout);
    assert!(!p.path().join("out/people.parquet").exists());

    p.synth(&["run", "pipeline.toml"]).ok();
    let run = p.synth(&["run", "pipeline.toml", "--dry-run"]).ok();
    assert!(run.stdout.contains("nothing would run"), "{}", run.stdout);
    let run = p.synth(&["run", "pipeline.toml", "--dry-run", "--set", "stages.shaped.derive.line={{ name }}"]).ok();
    assert!(
        run.stdout.contains("shaped") && run.stdout.contains("would run (configuration changed)"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("would run (input \"shaped\" changed)"), "{}", run.stdout);
    assert!(run.stdout.contains("2 stage(s) would run"), "{}", run.stdout);
}

#[test]
fn same_config_gives_byte_identical_outputs() {
    let p = project();
    p.synth(&["run", "pipeline.toml", "--out", "a"]).ok();
    p.synth(&["run", "pipeline.toml", "--out", "b"]).ok();
    assert_same_outputs(&p.path().join("a"), &p.path().join("b"));
    // A different seed picks a different sample.
    p.synth(&["run", "pipeline.toml", "--out", "c", "--set", "pipeline.seed=6"]).ok();
    let a = std::fs::read(p.path().join("a/sample.parquet")).unwrap();
    let c = std::fs::read(p.path().join("c/sample.parquet")).unwrap();
    assert_ne!(a, c);
    // The seed does not touch stages that do not use randomness.
    assert_eq!(
        std::fs::read(p.path().join("a/adults.parquet")).unwrap(),
        std::fs::read(p.path().join("c/adults.parquet")).unwrap()
    );
}

#[test]
fn sample_is_stratified_and_ordered() {
    let p = project();
    p.synth(&["run", "pipeline.toml"]).ok();
    let rows = parquet_rows(&p.path().join("out/sample.parquet"));
    assert_eq!(rows.len(), 40);
    let count = |c: &str| rows.iter().filter(|r| r["city"] == c).count();
    // 500 people, 3 cities equally: adults are split evenly too, so 40 -> 14/13/13.
    let mut counts = vec![count("rome"), count("oslo"), count("lima")];
    counts.sort();
    assert_eq!(counts, vec![13, 13, 14]);
    // Output keeps input order.
    let ids: Vec<u64> =
        rows.iter().map(|r| r["id"].as_str().unwrap().trim_start_matches("people-").parse().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn profiles_limit_and_sets() {
    let p = project();
    p.synth(&["run", "pipeline.toml", "--profile", "small"]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/sample.parquet")).len(), 5);
    assert_eq!(manifest(&p.path().join("out"))["profile"], "small");

    p.synth(&["run", "pipeline.toml", "--limit", "20", "--out", "lim"]).ok();
    assert_eq!(parquet_rows(&p.path().join("lim/people.parquet")).len(), 20);
    assert_eq!(parquet_rows(&p.path().join("lim/cities.parquet")).len(), 3);

    // A `--set` on a misspelt stage says so (not "missing kind" of a stage nobody meant).
    let bad = p.synth(&["run", "pipeline.toml", "--set", "stages.sampel.n=4"]).code(78);
    assert!(
        bad.stderr.contains(
            "--set stages.sampel.n=4: stage \"sampel\": no stage \"sampel\" in the pipeline (did you mean \"sample\"?); a stage that --set adds needs its \"kind\""
        ),
        "{}",
        bad.stderr
    );
    let bad = p.synth(&["run", "pipeline.toml", "--set", "providers.nobody.model=\"m\""]).code(78);
    assert!(bad.stderr.contains("provider \"nobody\": no provider \"nobody\" in the pipeline;"), "{}", bad.stderr);
}

#[test]
fn record_failures_are_kept_and_the_ratio_is_enforced() {
    let p = project();
    let mut data = people_jsonl(100);
    data.push_str("{\"name\": \"broken\", \"age\": \n");
    data.push_str("[1, 2]\n");
    p.write("people.jsonl", &data);
    p.synth(&["run", "pipeline.toml"]).ok();
    let failures = parquet_rows(&p.path().join("out/people.failures.parquet"));
    assert_eq!(failures.len(), 2);
    let messages: Vec<&str> = failures.iter().map(|f| f["message"].as_str().unwrap()).collect();
    assert!(messages.iter().any(|m| m.contains("people.jsonl:101:") && m.contains("invalid JSON")), "{messages:?}");
    assert!(
        messages.iter().any(|m| m.contains("people.jsonl:102: expected a JSON object, found an array")),
        "{messages:?}"
    );
    assert_eq!(failures[0]["kind"], "parse");
    let m = manifest(&p.path().join("out"));
    assert_eq!(m["stages"]["people"]["report"]["rows_failed"], 2);
    assert_eq!(m["stages"]["people"]["report"]["rows_out"], 100);

    // Fix the file: the failure table goes away with the next build.
    p.write("people.jsonl", people_jsonl(100));
    p.synth(&["run", "pipeline.toml"]).ok();
    assert!(!p.path().join("out/people.failures.parquet").exists());

    // Too many failures: the run stops, names the stage and keeps completed work.
    let mut data = people_jsonl(10);
    for _ in 0..3 {
        data.push_str("not json\n");
    }
    p.write("people.jsonl", &data);
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(
        run.stderr.contains("stage \"people\": 3 of 13 records failed (23.1% > max_failure_ratio 5.0%)"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("people.failures.parquet"), "{}", run.stderr);
    assert_eq!(parquet_rows(&p.path().join("out/people.failures.parquet")).len(), 3);
    let m = manifest(&p.path().join("out"));
    assert_eq!(m["status"], "failed");
    assert_eq!(m["stages"]["people"]["status"], "failed");
    // The other source completed and is kept.
    assert_eq!(statuses(&p.path().join("out"))["cities"], "up_to_date");
    // Raising the threshold for that stage lets the run go on.
    p.synth(&["run", "pipeline.toml", "--set", "stages.people.max_failure_ratio=0.5"]).ok();
}

#[test]
fn manifest_records_the_run() {
    let p = project();
    p.synth(&["run", "pipeline.toml", "--set", "stages.shaped.description=api_key sk-abcdefghijklmnopqrstu"]).ok();
    let m = manifest(&p.path().join("out"));
    assert_eq!(m["synth_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(m["pipeline"]["name"], "people");
    assert_eq!(m["pipeline"]["hash"].as_str().unwrap().len(), 64);
    assert_eq!(m["seed"], 5);
    assert_eq!(m["config"]["stages"]["sample"]["n"], 40);
    assert_eq!(m["config"]["stages"]["shaped"]["description"], "api_key ***", "secret-looking value not redacted");
    let sample = &m["stages"]["sample"];
    assert_eq!(sample["kind"], "sample");
    assert_eq!(sample["fingerprint"].as_str().unwrap().len(), 32);
    assert!(sample["report"]["rows_in"].as_u64().unwrap() > 0);
    assert_eq!(sample["report"]["rows_out"], 40);
    assert!(sample["report"]["wall_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(sample["outputs"][0]["path"], "sample.parquet");
    assert_eq!(m["totals"]["stages_ran"], 8);
    assert!(!std::fs::read_to_string(p.path().join("out/manifest.json")).unwrap().contains("sk-abcdefghijklmnopqrstu"));
}

#[test]
fn inspect_stats_graph_and_list() {
    let p = project();
    p.synth(&["run", "pipeline.toml"]).ok();
    let run = p.synth(&["inspect", "out/shaped.parquet", "--schema"]).ok();
    assert!(run.stdout.contains("id: string (not null)"), "{}", run.stdout);
    assert!(run.stdout.contains("line: string"), "{}", run.stdout);
    assert!(run.stdout.contains("[synth.fingerprint]"), "{}", run.stdout);
    let run = p.synth(&["inspect", "out/shaped.parquet", "--rows", "3"]).ok();
    assert!(run.stdout.contains("3 of 40 rows shown"), "{}", run.stdout);
    let run = p.synth(&["inspect", "out/shaped.parquet", "--where", "city=oslo", "--json", "--rows", "100"]).ok();
    let lines: Vec<serde_json::Value> = run.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!lines.is_empty() && lines.iter().all(|r| r["city"] == "oslo"));
    let run = p.synth(&["inspect", "out/shaped.parquet", "--where", "town=oslo"]).code(2);
    assert!(run.stderr.contains("no column \"town\""), "{}", run.stderr);
    p.synth(&["inspect", "people.jsonl"]).code(2);

    let run = p.synth(&["stats", "out"]).ok();
    assert!(run.stdout.contains("pipeline \"people\""), "{}", run.stdout);
    assert!(run.stdout.lines().any(|l| l.starts_with("sample") && l.contains(" 40 ")), "{}", run.stdout);
    let run = p.synth(&["stats", "out", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["stages"]["sample"]["report"]["rows_out"], 40);
    p.synth(&["stats", "nowhere"]).code(2);

    let run = p.synth(&["graph", "pipeline.toml", "--format", "dot"]).ok();
    assert!(run.stdout.contains("\"sample\" -> \"located\";"), "{}", run.stdout);
    assert!(run.stdout.contains("\"cities\" -> \"located\";"), "{}", run.stdout);
    let run = p.synth(&["graph", "pipeline.toml", "--format", "mermaid"]).ok();
    assert!(run.stdout.starts_with("flowchart LR"), "{}", run.stdout);
    assert_eq!(run.stdout.matches("-->").count(), 7, "{}", run.stdout);
    let run = p.synth(&["graph", "pipeline.toml"]).ok();
    assert!(run.stdout.contains("located     [join] <- sample, cities"), "{}", run.stdout);

    let run = p.synth(&["list"]).ok();
    for kind in ["source", "sample", "filter", "map", "concat", "join", "parquet", "jsonl"] {
        assert!(run.stdout.contains(&format!("\n  {kind} (")), "{kind} missing from list");
    }
    assert!(run.stdout.contains("max_failure_ratio"), "{}", run.stdout);
    assert!(run.stdout.contains("how (one of \"inner\", \"left\"; default \"inner\")"), "{}", run.stdout);
}

#[test]
fn every_kind_runs_on_the_all_kinds_fixture() {
    let p = Project::new();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config");
    p.write("ok/all_kinds.toml", std::fs::read(fixtures.join("ok/all_kinds.toml")).unwrap());
    p.write("data/people.jsonl", std::fs::read(fixtures.join("data/people.jsonl")).unwrap());
    p.write("data/cities.csv", std::fs::read(fixtures.join("data/cities.csv")).unwrap());
    p.synth(&["run", "ok/all_kinds.toml"]).ok();
    let out = p.path().join("out/all-kinds");
    let both = parquet_rows(&out.join("exports/both.parquet"));
    assert_eq!(both.len(), 5 + 3);
    assert!(both.iter().any(|r| r["id"] == "cities/rome" && r["origin"] == "cities"));
    let lines = std::fs::read_to_string(out.join("lines.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["line", "cc"]);
    assert!(first["line"].as_str().unwrap().contains(" lives in "));
    // The "tagged" profile renames the tag column.
    p.synth(&["run", "ok/all_kinds.toml", "--profile", "tagged"]).ok();
    let both = parquet_rows(&out.join("exports/both.parquet"));
    assert!(both.iter().all(|r| r.contains_key("from") && !r.contains_key("origin")));
}

#[test]
fn bench_engine_prints_one_json_line() {
    let p = Project::new();
    let run = p.synth(&["bench", "engine", "--records", "20000", "--dir", "b"]).ok();
    let v: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("one JSON line");
    assert_eq!(v["records"], 20000);
    for key in ["noop_map_records_per_s", "source_records_per_s", "peak_rss_mib", "up_to_date_rerun_seconds"] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    assert_eq!(parquet_rows(&p.path().join("b/out/noop.parquet")).len(), 20000);
}
