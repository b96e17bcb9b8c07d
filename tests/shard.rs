//! Sharded runs (`--shards N`): outputs byte-identical to one process for any N, on a
//! local directory, a `file://` store, an S3 server (moto on 127.0.0.1) and Azure Blob
//! Storage (Azurite on 127.0.0.1); the exact
//! retrieval's corpus split among shards merges to the unsharded winners, and reference
//! metrics split by row merge to the one-process rows and summary; a sharded
//! state is up to date for an unsharded run and the other way round; a shard re-run
//! after completion does nothing; `synth status` names the missing shards and the
//! retry set; a shard whose configuration differs from the plan stops; leases keep
//! a second copy of a shard out; rate limits are divided across shards; a 429 storm
//! on one shard loses nothing; `synth emit` writes Kubernetes Jobs that a schema
//! validator accepts and a Slurm script bash can parse.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use support::openai_server::{self, Behaviour};
use support::{Project, assert_same_outputs, parquet_rows, people_jsonl, statuses};

/// source → map (re-keyed, some records fail) → llm (2 samples) → filter, one wave;
/// → embed (hashing with IDF: fits on its whole input, so a wave of its own) →
/// sample → export, run once.
const PIPELINE: &str = r#"
[pipeline]
name = "shards"
seed = 11
output_dir = "out"

[providers.local]
kind = "offline"
model = "offline"
seed = 3

[embedders.hash]
kind = "hashing"
dim = 32

[stages.people]
kind = "source"
path = "people.jsonl"

[stages.greeted]
kind = "map"
inputs = ["people"]
id = "g-{{ name }}"
max_failure_ratio = 0.2
[stages.greeted.derive]
greeting = "Dear {{ name }} of {{ city }}"
tenth = { expr = "100 // (age % 10)", type = "int64" }

[stages.answers]
kind = "llm"
inputs = ["greeted"]
provider = "local"
prompt = "prompt.j2"
n = 2
keep_columns = ["city", "age", "tenth"]

[stages.adults]
kind = "filter"
inputs = ["answers"]
where = "age >= 18"

[stages.vectors]
kind = "embed"
inputs = ["adults"]
embedder = "hash"
template = "{{ city }} {{ text }}"

[stages.picked]
kind = "sample"
inputs = ["vectors"]
fraction = 0.5

[stages.export]
kind = "jsonl"
inputs = ["picked"]
"#;

fn project(records: usize) -> Project {
    let p = Project::new();
    p.write("p.toml", PIPELINE);
    p.write("people.jsonl", people_jsonl(records));
    p.write("prompt.j2", "Write one line for {{ name }} ({{ age }}) of {{ city }}.\n");
    p
}

fn reference(p: &Project) -> PathBuf {
    p.synth(&["run", "p.toml", "--out", "reference", "-q"]).ok();
    p.path().join("reference")
}

#[test]
fn sharded_runs_write_the_bytes_of_one_process_for_any_shard_count() {
    let p = project(700);
    let reference = reference(&p);
    assert!(!support::failures(&reference, "greeted").is_empty(), "the map should fail some records");
    for n in ["1", "3", "7"] {
        let out = format!("out-{n}");
        let run = p.synth(&["run", "p.toml", "--out", &out, "--shards", n, "--executor", "local"]).ok();
        let dir = p.path().join(&out);
        assert_same_outputs(&reference, &dir);
        // Every stage ran here, once.
        let s = statuses(&dir);
        assert!(s.values().all(|v| v == "ran"), "{n} shards: {s:?}\n{}", run.stderr);
        // The waves are where the design puts them.
        let status = p.synth(&["status", &out]).ok().stdout;
        for line in [
            format!("wave 1 ({n} shards, limits divided by {n}): greeted, answers, adults"),
            format!("wave 2 ({n} shards, limits divided by {n}): vectors"),
            format!("{n} of {n} shards done, merged"),
        ] {
            assert!(status.contains(&line), "{line}:\n{status}");
        }
        // The sharded state is an unsharded run's: nothing to do for one process ...
        let again = p.synth(&["run", "p.toml", "--out", &out]).ok();
        assert!(again.stdout.contains("everything is up to date"), "{}", again.stdout);
        // ... nor for the sharded run (every shard's wave is planned empty).
        let again = p.synth(&["run", "p.toml", "--out", &out, "--shards", n]).ok();
        assert!(again.stdout.contains("everything is up to date"), "{}{}", again.stdout, again.stderr);
    }
}

/// Queries and a corpus full of duplicates (ties everywhere), embedded, then the exact
/// search: its corpus is split among the shards and the merge keeps the unsharded
/// winners (ties to the lower corpus position; a part may have no eligible minimum).
const RETRIEVAL: &str = r#"
[pipeline]
name = "split-retrieval"
seed = 5
output_dir = "out"

[embedders.hash]
kind = "hashing"
dim = 16

[stages.queries]
kind = "source"
path = "queries.jsonl"

[stages.corpus]
kind = "source"
path = "corpus.jsonl"

[stages.qv]
kind = "embed"
inputs = ["queries"]
embedder = "hash"
template = "{{ text }}"

[stages.cv]
kind = "embed"
inputs = ["corpus"]
embedder = "hash"
template = "{{ text }}"

[stages.found]
kind = "retrieve"
inputs = ["qv", "cv"]
least_where = "answerable"

[stages.export]
kind = "jsonl"
inputs = ["found"]
"#;

#[test]
fn exact_retrieval_splits_the_corpus_and_merges_to_the_unsharded_winners() {
    let p = Project::new();
    p.write("r.toml", RETRIEVAL);
    let words = ["tea", "river", "stone", "lamp", "violin", "salt", "copper", "moss", "kite", "ember"];
    let text = |i: usize| format!("{} {} {}", words[i % 10], words[(i / 10) % 10], words[(i * 7 / 3) % 10]);
    let mut corpus = String::new();
    for i in 0..900 {
        // 30 distinct texts: every vector appears 30 times, in every part.
        corpus.push_str(
            &serde_json::json!({"id": format!("c{i:04}"), "text": text(i % 30), "answerable": i % 97 == 5}).to_string(),
        );
        corpus.push('\n');
    }
    let mut queries = String::new();
    for i in 0..120 {
        queries.push_str(&serde_json::json!({"id": format!("q{i:03}"), "text": text(i * 13 + 1)}).to_string());
        queries.push('\n');
    }
    p.write("corpus.jsonl", corpus);
    p.write("queries.jsonl", queries);
    p.synth(&["run", "r.toml", "--out", "reference", "-q"]).ok();
    let reference = p.path().join("reference");
    // The reference is the rule: the lowest corpus position among the records of the
    // best score (every text, so every score, is shared by 30 records).
    let rows = parquet_rows(&reference.join("found.parquet"));
    assert_eq!(rows.len(), 120);
    let position = |id: &serde_json::Value| id.as_str().unwrap()[1..].parse::<usize>().unwrap();
    for r in &rows {
        let most = position(&r["most_id"]);
        assert!(most < 30, "{}: the first copy of its best text wins, not {most}", r["id"]);
        let least = position(&r["least_id"]);
        assert_eq!(least % 97, 5, "{}: the minimum must be answerable", r["id"]);
    }
    for n in ["2", "3", "7"] {
        let out = format!("out-{n}");
        p.synth(&["run", "r.toml", "--out", &out, "--shards", n, "--executor", "local", "-q"]).ok();
        assert_same_outputs(&reference, &p.path().join(&out));
        let status = p.synth(&["status", &out]).ok().stdout;
        let line = format!("wave 2 ({n} shards, limits divided by {n}): found");
        assert!(status.contains(&line), "{line}:\n{status}");
        // Each shard searched its part of the corpus only.
        let plan = support::wave_dir(&p.path().join(&out), 2);
        let mut rows_of_parts = 0;
        for i in 0..n.parse::<usize>().unwrap() {
            let part = plan.join(format!("s{i:05}/_synth/entry/cv.parquet"));
            let k = parquet_rows(&part).len();
            assert!(k < 900, "shard {i} holds {k} corpus records");
            rows_of_parts += k;
        }
        assert_eq!(rows_of_parts, 900, "the parts cover the corpus once");
    }
}

/// Reference metrics per row, split among shards: the merge restores the input order
/// and the summary (mean, std, n, invalid per group) is the one of one process.
const METRICS: &str = r#"
[pipeline]
name = "split-metrics"
seed = 5
output_dir = "out"

[stages.answers]
kind = "source"
path = "answers.jsonl"

[stages.scores]
kind = "metrics"
inputs = ["answers"]
metrics = ["bleu", "rouge"]
group_by = "task"

[stages.report]
kind = "report"
inputs = ["scores"]
"#;

#[test]
fn reference_metrics_split_their_rows_and_the_merge_summarizes_every_row() {
    let p = Project::new();
    p.write("m.toml", METRICS);
    let words = ["the", "old", "lighthouse", "keeper", "sang", "softly", "to", "gulls", "at", "dawn", "and", "dusk"];
    let mut rows = String::new();
    for i in 0..700usize {
        let pick = |k: usize, n: usize| {
            (0..n).map(|j| words[(i * 7 + k * 5 + j * (k + 1)) % 12]).collect::<Vec<_>>().join(" ")
        };
        // Every 9th response is empty: BLEU is undefined there (left out of the summary).
        let response = if i % 9 == 4 { String::new() } else { pick(1, 3 + i % 6) };
        let task = ["answer", "refusal", "multi-turn"][i % 3];
        rows.push_str(&serde_json::json!({"id": format!("a{i:04}"), "task": task, "response": response, "reference": pick(2, 4 + i % 5)}).to_string());
        rows.push('\n');
    }
    p.write("answers.jsonl", rows);
    p.synth(&["run", "m.toml", "--out", "reference", "-q"]).ok();
    let reference = p.path().join("reference");
    let summary = parquet_rows(&reference.join("scores.summary.parquet"));
    assert!(
        summary.iter().any(|r| r["metric"] == "bleu" && r["invalid"].as_u64().unwrap_or(0) > 0),
        "some BLEU values are undefined and counted: {summary:?}"
    );
    for n in ["2", "5"] {
        let out = format!("out-{n}");
        p.synth(&["run", "m.toml", "--out", &out, "--shards", n, "--executor", "local", "-q"]).ok();
        assert_same_outputs(&reference, &p.path().join(&out));
        let status = p.synth(&["status", &out]).ok().stdout;
        let line = format!("wave 1 ({n} shards, limits divided by {n}): scores");
        assert!(status.contains(&line), "{line}:\n{status}");
    }
}

/// Sources split among shards: two JSONL files read as one (no id column: ordinal ids;
/// blank lines, CRLF, bad JSON, a non-object, invalid UTF-8; a column null in the first
/// records and text later, another int then float: a part's own types differ from the
/// whole source's), declared types, and two Parquet files of small row groups (some ids
/// missing); then an LLM stage per note.
const SOURCES: &str = r#"
[pipeline]
name = "split-sources"
seed = 9
output_dir = "out"

[providers.local]
kind = "offline"
model = "offline"
seed = 2

[stages.notes]
kind = "source"
path = ["notes-a.jsonl", "notes-b.jsonl"]
shard = true
max_failure_ratio = 0.5

[stages.typed]
kind = "source"
path = "typed.jsonl"
columns = ["id", "n"]
types = { id = "utf8", n = "int64" }
shard = true
max_failure_ratio = 0.5

[stages.rows]
kind = "source"
path = "rows-*.parquet"
id_column = "key"
shard = true
max_failure_ratio = 0.5

[stages.replies]
kind = "llm"
inputs = ["notes"]
provider = "local"
prompt = "reply.j2"
output_prefix = "reply_"
"#;

fn write_split_sources(p: &Project) {
    use std::sync::Arc;
    use synth::data::arrow::array::{Int64Array, RecordBatch, StringArray};
    use synth::data::arrow::datatypes::{DataType, Field, Schema};
    let mut a: Vec<u8> = Vec::new();
    for i in 0..600usize {
        let line = match i {
            _ if i % 97 == 13 => String::new(),
            _ if i % 89 == 7 => "{\"text\": \"broken\",".into(),
            _ if i % 151 == 40 => "[1, 2, 3]".into(),
            _ => {
                // `extra` is null in the first 400 records, text after; `score` an
                // integer, a float from record 300 on; `tags` a list.
                let extra = if i < 400 { serde_json::Value::Null } else { format!("x{i}").into() };
                let score: serde_json::Value = if i < 300 { (i as i64).into() } else { (i as f64 + 0.5).into() };
                serde_json::json!({"text": format!("note {i}"), "extra": extra, "score": score, "tags": [i % 3, i % 5]})
                    .to_string()
            }
        };
        a.extend_from_slice(line.as_bytes());
        a.extend_from_slice(if i % 10 == 3 { b"\r\n" } else { b"\n" });
        if i == 250 {
            a.extend_from_slice(b"{\"text\": \"bad \xff byte\"}\n");
        }
    }
    p.write("notes-a.jsonl", &a);
    let mut b = String::new();
    for i in 0..300usize {
        b.push_str(&serde_json::json!({"text": format!("second {i}"), "score": i, "late": i % 7}).to_string());
        b.push('\n');
        if i % 50 == 0 {
            b.push_str("   \n");
        }
    }
    p.write("notes-b.jsonl", b);
    let mut typed = String::new();
    for i in 0..400usize {
        let n: serde_json::Value = if i % 41 == 9 { "not a number".into() } else { (i as i64).into() };
        typed.push_str(&serde_json::json!({"id": format!("t{i:03}"), "n": n, "other": i}).to_string());
        typed.push('\n');
    }
    p.write("typed.jsonl", typed);
    p.write("reply.j2", "Reply to: {{ text }}\n");
    let schema =
        Arc::new(Schema::new(vec![Field::new("key", DataType::Utf8, true), Field::new("v", DataType::Int64, true)]));
    for (f, range) in [(0, 0..230i64), (1, 230..500)] {
        let keys: Vec<Option<String>> = range.clone().map(|i| (i % 37 != 5).then(|| format!("k{i:04}"))).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(keys)),
                Arc::new(Int64Array::from(range.map(|i| i * 3).collect::<Vec<_>>())),
            ],
        )
        .unwrap();
        let props =
            parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(40)).build();
        let file = std::fs::File::create(p.path().join(format!("rows-{f}.parquet"))).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

#[test]
fn sources_split_among_shards_give_the_ids_lines_and_failures_of_one_process() {
    let p = Project::new();
    p.write("s.toml", SOURCES);
    write_split_sources(&p);
    p.synth(&["run", "s.toml", "--out", "reference", "-q"]).ok();
    let reference = p.path().join("reference");
    // The reference is one process: ordinal ids across both files, line numbers of the
    // file, types over every record.
    let notes = parquet_rows(&reference.join("notes.parquet"));
    let by_id = |id: &str| notes.iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("no {id}"));
    assert_eq!(by_id("notes-0")["text"], "note 0");
    assert_eq!(by_id("notes-0")["score"], 0.0, "score is a float column: {:?}", by_id("notes-0"));
    assert_eq!(by_id("notes-598")["text"], "second 4", "ordinals run on into the second file");
    let failures = support::failures(&reference, "notes");
    let message = |id: &str| {
        failures.iter().find(|f| f["id"] == id).map(|f| f["message"].as_str().unwrap().to_string()).unwrap_or_default()
    };
    assert!(message("notes-7").contains("notes-a.jsonl:8:"), "{failures:?}");
    assert!(message("notes-39").contains("notes-a.jsonl:41: expected a JSON object"), "{failures:?}");
    assert!(failures.iter().any(|f| f["message"].as_str().unwrap().contains("invalid UTF-8")), "{failures:?}");
    assert_eq!(support::failures(&reference, "typed").len(), 10);
    assert_eq!(support::failures(&reference, "rows").len(), 14);
    for n in ["1", "3", "7"] {
        let out = format!("out-{n}");
        p.synth(&["run", "s.toml", "--out", &out, "--shards", n, "--executor", "local", "-q"]).ok();
        let dir = p.path().join(&out);
        assert_same_outputs(&reference, &dir);
        let status = p.synth(&["status", &out]).ok().stdout;
        let line = format!("wave 1 ({n} shards, limits divided by {n}): notes, typed, rows");
        assert!(status.contains(&line), "{line}:\n{status}");
        // Each shard read its part only; the parts cover every record once.
        let wave = support::wave_dir(&dir, 1);
        let shards: usize = n.parse().unwrap();
        let mut rows = 0;
        for i in 0..shards {
            let k = parquet_rows(&wave.join(format!("s{i:05}/rows.parquet"))).len();
            assert!(shards == 1 || k < 486, "shard {i} read {k} Parquet rows");
            rows += k;
        }
        assert_eq!(rows, 486, "the parts cover the Parquet rows once");
        if shards > 1 {
            let state: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("_synth/state/notes.json")).unwrap()).unwrap();
            let again = state["report"]["info"]["parts_decoded_again"].as_str().unwrap_or("0");
            assert!(again.parse::<usize>().unwrap() >= 1, "the first part's types differ: {state}");
        }
    }
    // Ids must be unique across parts: a duplicate at both ends of a file stops the
    // sharded run as it stops one process.
    let mut dup = String::from("{\"id\": \"same\", \"text\": \"first\"}\n");
    for i in 0..200 {
        dup.push_str(&format!("{{\"id\": \"d{i}\", \"text\": \"t\"}}\n"));
    }
    dup.push_str("{\"id\": \"same\", \"text\": \"last\"}\n");
    p.write("typed.jsonl", &dup);
    p.write("s.toml", SOURCES.replace("columns = [\"id\", \"n\"]\ntypes = { id = \"utf8\", n = \"int64\" }\n", ""));
    let one = p.synth(&["run", "s.toml", "--out", "dup-1", "-q"]);
    let many = p.synth(&["run", "s.toml", "--out", "dup-3", "--shards", "3", "--executor", "local", "-q"]);
    assert!(one.stderr.contains("duplicate record id \"same\""), "{}", one.stderr);
    assert!(many.stderr.contains("duplicate record id \"same\""), "{}", many.stderr);
    assert_ne!(one.code, 0);
    assert_ne!(many.code, 0);
}

#[test]
fn an_unsharded_state_is_up_to_date_for_a_sharded_run() {
    let p = project(200);
    let reference = reference(&p);
    let run = p.synth(&["run", "p.toml", "--out", "reference", "--shards", "4"]).ok();
    assert!(run.stdout.contains("everything is up to date"), "{}{}", run.stdout, run.stderr);
    assert!(
        !reference.join("_synth/waves/w1-n4.json").exists() || {
            let plan: serde_json::Value =
                serde_json::from_slice(&std::fs::read(reference.join("_synth/waves/w1-n4.json")).unwrap()).unwrap();
            plan["stages"].as_array().unwrap().is_empty()
        }
    );
}

#[test]
fn steps_and_shards_run_one_by_one_and_status_names_the_retry_set() {
    let p = project(300);
    let reference = reference(&p);
    let run = |args: &[&str]| {
        let mut all = vec!["run", "p.toml", "--out", "out", "--shards", "3"];
        all.extend_from_slice(args);
        p.synth(&all)
    };
    // A shard before its wave is planned: not ready (75), with what to do.
    let early = run(&["--wave", "1", "--shard", "0"]).code(75);
    assert!(early.stderr.contains("run step 0 first"), "{}", early.stderr);
    run(&["--step", "0"]).ok();
    run(&["--wave", "1", "--shard", "0"]).ok();
    run(&["--wave", "1", "--shard", "2"]).ok();
    // The shard index can come from the scheduler's environment.
    let status = p.synth(&["status", "out"]).ok();
    assert!(status.stdout.contains("2 of 3 shards done, not merged"), "{}", status.stdout);
    assert!(status.stdout.contains("missing shards: 1"), "{}", status.stdout);
    assert!(status.stdout.contains("Kubernetes indices 1; Slurm --array=1"), "{}", status.stdout);
    let json = p.synth(&["status", "out", "--json"]).ok();
    let json: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(json["waves"][0]["missing"], serde_json::json!([1]));
    // The step refuses to merge an incomplete wave.
    let step = run(&["--step", "1"]).code(75);
    assert!(step.stderr.contains("missing: 1") && step.stderr.contains("retry set: 1"), "{}", step.stderr);
    p.synth_env(&["run", "p.toml", "--out", "out", "--shards", "3", "--wave", "1"], &[("JOB_COMPLETION_INDEX", "1")])
        .ok();
    // A shard run again after its marker does nothing.
    let again = run(&["--wave", "1", "--shard", "1"]).ok();
    assert!(again.stderr.contains("already done"), "{}", again.stderr);
    run(&["--step", "1"]).ok();
    for i in ["0", "1", "2"] {
        p.synth_env(&["run", "p.toml", "--out", "out", "--shards", "3", "--wave", "2"], &[("SLURM_ARRAY_TASK_ID", i)])
            .ok();
    }
    run(&["--step", "2"]).ok();
    assert_same_outputs(&reference, &p.path().join("out"));
}

/// Shard logs keep every attempt: a second run's shards append below the first run's
/// lines, each attempt under its own header (a killed run's log is its evidence).
#[test]
fn shard_logs_keep_every_attempt() {
    let p = project(60);
    let run = || p.synth(&["run", "p.toml", "--out", "out", "--shards", "2", "--executor", "local", "-q"]).ok();
    run();
    let first = p.read("out/_synth/logs/w1-s00001.log");
    p.write("prompt.j2", "Write two lines for {{ name }} of {{ city }}.\n");
    run();
    for i in 0..2 {
        let log = p.read(&format!("out/_synth/logs/w1-s{i:05}.log"));
        let headers = log.lines().filter(|l| l.starts_with("==== synth shard ")).count();
        assert_eq!(headers, 2, "shard {i}:\n{log}");
    }
    assert!(p.read("out/_synth/logs/w1-s00001.log").starts_with(&first));
}

#[test]
fn a_shard_with_another_configuration_than_its_plan_stops() {
    let p = project(100);
    p.synth(&["run", "p.toml", "--out", "out", "--shards", "2", "--step", "0"]).ok();
    let run = p
        .synth(&[
            "run",
            "p.toml",
            "--out",
            "out",
            "--shards",
            "2",
            "--wave",
            "1",
            "--shard",
            "0",
            "--set",
            "stages.answers.n=3",
        ])
        .code(2);
    assert!(run.stderr.contains("in the plan") && run.stderr.contains("answers"), "{}", run.stderr);
    let status = p.synth(&["status", "out"]).ok();
    assert!(status.stdout.contains("0 of 2 shards done"), "{}", status.stdout);
}

/// `--dry-run` with `--shards` shows where each stage runs; an `llm` stage in batch mode
/// runs once, in a step (a provider batch is the provider's parallelism already), and
/// the stages after it move with it.
#[test]
fn a_dry_run_shows_the_waves_and_batch_mode_runs_once() {
    let p = project(50);
    let plan = p.synth(&["run", "p.toml", "--out", "out", "--shards", "3", "--dry-run"]).ok().stdout;
    let at = |plan: &str, stage: &str| -> String {
        let line = plan.lines().find(|l| l.split_whitespace().next() == Some(stage)).unwrap_or_default();
        line.split_once(stage).map(|(_, r)| r.trim().to_string()).unwrap_or_default()
    };
    assert_eq!(at(&plan, "people"), "step 0", "{plan}");
    assert_eq!(at(&plan, "answers"), "wave 1 (3 shards)", "{plan}");
    assert_eq!(at(&plan, "vectors"), "wave 2 (3 shards)", "{plan}");
    assert_eq!(at(&plan, "picked"), "step 2", "{plan}");
    assert!(!p.path().join("out").exists(), "a dry run writes nothing");
    let batch = p
        .synth(&["run", "p.toml", "--out", "out", "--shards", "3", "--dry-run", "--set", "stages.answers.batch=true"])
        .ok()
        .stdout;
    assert!(at(&batch, "answers").starts_with("step "), "{batch}");
}

/// Start a test server of `.tools/` (installed by `.ci/setup-sharding`, run first when it
/// is missing) on a free port of 127.0.0.1 and wait until it listens; `None`, with the
/// reason printed, when it cannot be installed.
fn start_tool(tool: &str, what: &str, args: impl Fn(u16) -> Vec<String>) -> Option<(std::process::Child, u16)> {
    let server = support::repo().join(".tools").join(tool);
    if !server.exists() {
        let setup = std::process::Command::new(support::repo().join(".ci/setup-sharding")).status();
        if !server.exists() {
            eprintln!(
                "SKIPPED: {what} is not installed and .ci/setup-sharding could not install it ({setup:?}); the same tests ran on file://"
            );
            return None;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(&server)
        .args(args(port))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", server.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{what} did not listen on port {port} within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Some((child, port))
}

/// The project's S3-compatible test server: moto on 127.0.0.1 (installed by
/// `.ci/setup-sharding`), stopped when dropped.
pub struct Moto {
    child: std::process::Child,
    pub endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Start moto, or say why not (and return `None`).
    pub fn start() -> Option<Moto> {
        let (child, port) = start_tool("moto_server", "the S3 test server (PyPI moto[server])", |port| {
            vec!["-H".into(), "127.0.0.1".into(), "-p".into(), port.to_string()]
        })?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let moto = Moto { child, endpoint };
        // A bucket (moto's REST API: PUT /bucket).
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "PUT",
                &format!("{}/synth-test", moto.endpoint),
            ])
            .output();
        match out {
            Ok(o) if String::from_utf8_lossy(&o.stdout) == "200" => Some(moto),
            other => panic!("creating the test bucket on moto failed: {other:?}"),
        }
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

/// The project's Azure Blob Storage test server: Azurite on 127.0.0.1 (npm `azurite`,
/// installed by `.ci/setup-sharding`) with a container `synth-test`, stopped when dropped.
/// Reached as an ordinary account with an explicit endpoint (the emulator's well-known
/// development account and key, public), so no process-wide environment is needed.
pub struct Azurite {
    child: std::process::Child,
    pub endpoint: String,
    _data: tempfile::TempDir,
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Azurite {
    /// Start Azurite, or say why not (and return `None`).
    pub fn start() -> Option<Azurite> {
        let data = tempfile::tempdir().unwrap();
        let location = data.path().to_str().unwrap().to_string();
        let (child, port) = start_tool("azurite_blob", "the Azure test server (npm azurite)", |port| {
            ["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--skipApiVersionCheck", "--silent"]
                .into_iter()
                .map(String::from)
                .chain(["--location".to_string(), location.clone()])
                .collect()
        })?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let azurite = Azurite { child, endpoint, _data: data };
        let script = support::repo().join("tests/support/azurite_container.py");
        let made = std::process::Command::new("python3").arg(script).args([&azurite.endpoint, "synth-test"]).status();
        assert!(made.as_ref().is_ok_and(|s| s.success()), "creating the test container on azurite failed: {made:?}");
        Some(azurite)
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1".into()),
            (
                "AZURE_STORAGE_ACCOUNT_KEY",
                "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==".into(),
            ),
            ("AZURE_STORAGE_ENDPOINT", format!("{}/devstoreaccount1", self.endpoint)),
            ("AZURE_ALLOW_HTTP", "true".into()),
        ]
    }
}

fn open_store(url: &str, mirror: &Path, env: &[(&'static str, String)]) -> synth::store::object::StateStore {
    let options = env.iter().map(|(k, v)| (k.to_string(), v.clone()));
    synth::store::object::StateStore::open_with(url, mirror, options).unwrap()
}

/// Every data file of a state (not `_synth/`, not the manifest), downloaded.
fn stored_files(url: &str, env: &[(&'static str, String)]) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = open_store(url, &dir.join("mirror"), env);
        for (rel, _) in store.list("").await.unwrap() {
            if rel.starts_with("_synth") || rel == "manifest.json" {
                continue;
            }
            let local = store.fetch(&rel).await.unwrap();
            let dest = dir.join("files").join(&rel);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::copy(local, dest).unwrap();
        }
    });
    dir.join("files")
}

fn with_env<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn state_run(p: &Project, url: &str, env: &[(&'static str, String)], extra: &[&str]) -> support::Run {
    let mut args = vec!["run", "p.toml", "--state", url, "--work", "work"];
    args.extend_from_slice(extra);
    p.synth_env(&args, &with_env(env))
}

#[test]
fn object_store_state_on_file_on_an_s3_server_and_on_azure_blob_storage() {
    let p = project(300);
    let reference = reference(&p);
    let state = p.path().join("state");
    let file_url = format!("file://{}", state.display());
    let mut stores: Vec<(String, Vec<(&'static str, String)>)> = vec![(file_url.clone(), Vec::new())];
    let moto = Moto::start();
    if let Some(m) = &moto {
        stores.push(("s3://synth-test/runs/shards".into(), m.env()));
    }
    let azurite = Azurite::start();
    if let Some(a) = &azurite {
        stores.push(("az://synth-test/runs/shards".into(), a.env()));
    }
    for (url, env) in &stores {
        let _ = std::fs::remove_dir_all(p.path().join("work"));
        let run = state_run(&p, url, env, &["--shards", "3", "--executor", "local"]).ok();
        assert!(run.stdout.contains(&format!("outputs in {url}")), "{}", run.stdout);
        let files = if url.starts_with("file://") { state.clone() } else { stored_files(url, env) };
        assert_same_outputs(&reference, &files);
        // A fresh machine (no work directory) finds it up to date from the store alone.
        let _ = std::fs::remove_dir_all(p.path().join("work"));
        let again = state_run(&p, url, env, &[]).ok();
        assert!(again.stdout.contains("everything is up to date"), "{url}: {}{}", again.stdout, again.stderr);
        let status = p.synth_env(&["status", "--state", url], &with_env(env)).ok();
        assert!(status.stdout.contains("3 of 3 shards done, merged"), "{url}: {}", status.stdout);
        // An unsharded run on the store: same bytes.
        let unsharded = format!("{url}-one");
        let _ = std::fs::remove_dir_all(p.path().join("work"));
        state_run(&p, &unsharded, env, &[]).ok();
        let files = if url.starts_with("file://") {
            PathBuf::from(unsharded.trim_start_matches("file://"))
        } else {
            stored_files(&unsharded, env)
        };
        assert_same_outputs(&reference, &files);
    }
}

/// Leases on an S3 server and on Azure Blob Storage: create-only, then a conditional takeover of an expired
/// lease; a second holder is refused while the first renews; a holder whose lease was
/// taken learns it at its next renewal. On a local file system: OS locks.
#[test]
fn leases_keep_a_second_holder_out() {
    use synth::store::lease::{Lease, LeaseError};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ttl = std::time::Duration::from_secs(3);
    // A file:// store: OS locks.
    rt.block_on(async {
        let url = format!("file://{}", dir.path().join("state").display());
        let store = open_store(&url, &dir.path().join("m1"), &[]);
        let first = Lease::acquire(&store, "lease.json", ttl, "test").await.unwrap();
        match Lease::acquire(&store, "lease.json", ttl, "test").await {
            Err(LeaseError::Held(m)) => assert!(m.contains("another process"), "{m}"),
            _ => panic!("a second holder got a held OS lock"),
        }
        drop(first);
        Lease::acquire(&store, "lease.json", ttl, "test").await.unwrap();
    });
    // Conditional writes on S3 (moto) and on Azure Blob Storage (Azurite).
    let (moto, azurite) = (Moto::start(), Azurite::start());
    let mut servers: Vec<(&str, Vec<(&'static str, String)>)> = Vec::new();
    if let Some(m) = &moto {
        servers.push(("s3://synth-test/leases", m.env()));
    }
    if let Some(a) = &azurite {
        servers.push(("az://synth-test/leases", a.env()));
    }
    for (k, (url, env)) in servers.iter().enumerate() {
        lease_protocol(&rt, url, &dir.path().join(format!("m{k}")), env, ttl);
    }
}

fn lease_protocol(
    rt: &tokio::runtime::Runtime,
    url: &str,
    mirror: &Path,
    env: &[(&'static str, String)],
    ttl: std::time::Duration,
) {
    use synth::store::lease::{Lease, LeaseError};
    rt.block_on(async {
        let store = open_store(url, mirror, env);
        let first = Lease::acquire(&store, "a.json", ttl, "shard 0").await.unwrap();
        // Renewed while held: still refused after the first lifetime.
        tokio::time::sleep(ttl + std::time::Duration::from_secs(1)).await;
        match Lease::acquire(&store, "a.json", ttl, "shard 0").await {
            Err(LeaseError::Held(m)) => assert!(m.contains("is being run by"), "{m}"),
            _ => panic!("{url}: a second holder took a renewed lease"),
        }
        // Released: free at once.
        first.release().await.unwrap();
        let second = Lease::acquire(&store, "a.json", ttl, "shard 0").await.unwrap();
        // Taken over behind its back (a lease written by a holder on another host that
        // expired long ago is overwritten; here another writer replaces it): the
        // holder learns it at its next renewal.
        let stale = serde_json::json!({"holder": "other/1/x", "host": "other", "pid": 1, "expires_ms": 0, "what": "x"});
        let bytes = serde_json::to_vec(&stale).unwrap();
        let (_, v) = store.read_versioned("a.json").await.unwrap().unwrap();
        match store.update("a.json", &bytes, &v).await.unwrap() {
            synth::store::object::Conditional::Done(_) => {}
            synth::store::object::Conditional::Lost => {
                panic!("{url}: the conditional update against the version read failed")
            }
        }
        // A write conditional on an old version fails (If-Match).
        assert!(matches!(store.update("a.json", &bytes, &v).await.unwrap(), synth::store::object::Conditional::Lost));
        // Create-only on an existing object fails (If-None-Match).
        assert!(matches!(store.create("a.json", b"{}").await.unwrap(), synth::store::object::Conditional::Lost));
        tokio::time::timeout(std::time::Duration::from_secs(10), second.lost().cancelled())
            .await
            .expect("the holder never learned its lease was taken");
        // The expired lease is taken over by the next one.
        Lease::acquire(&store, "a.json", ttl, "shard 0").await.unwrap();
    });
}

/// Rate limits are divided across shards running at once (the server advertises
/// its limit; each shard paces at its share), and a 429 storm on the records of one
/// shard loses none.
#[test]
fn limits_are_divided_and_a_429_storm_on_one_shard_loses_nothing() {
    use synth::dag::waves::shard_of;
    const KEY: &str = "sk-shard-test-0123456789";
    // The records of shard 0 of 3.
    let storm: Vec<usize> = (0..120).filter(|i| shard_of(&format!("r{i}"), 3) == 0).collect();
    assert!(!storm.is_empty());
    let server = openai_server::start(Behaviour {
        api_key: Some(KEY.into()),
        rpm: Some(6000),
        advertise_limits: true,
        // Every request of shard 0's records is refused until 60 refusals were sent.
        storm: Some(("STORM".into(), 60)),
        ..Default::default()
    });
    let p = Project::new();
    let mut lines = String::new();
    for i in 0..120 {
        let tag = if storm.contains(&i) { "STORM" } else { "calm" };
        lines.push_str(&format!("{{\"id\": \"r{i}\", \"tag\": \"{tag}\"}}\n"));
    }
    p.write("r.jsonl", lines);
    p.write("prompt.j2", "Record {{ id }} {{ tag }}: one line.\n");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
name = "storm"
output_dir = "out"

[providers.api]
kind = "openai"
base_url = "{url}"
model = "m"
api_key_env = "SYNTH_TEST_KEY"
max_retries = 40
backoff_initial_ms = 5
backoff_max_seconds = 0.05

[stages.records]
kind = "source"
path = "r.jsonl"

[stages.answers]
kind = "llm"
inputs = ["records"]
provider = "api"
prompt = "prompt.j2"
"#,
            url = server.base_url()
        ),
    );
    let env = [("SYNTH_TEST_KEY", KEY)];
    let run = p.synth_env(&["run", "p.toml", "--shards", "3", "--executor", "local"], &env).ok();
    let answers = parquet_rows(&p.path().join("out/answers.parquet"));
    assert_eq!(answers.len(), 120, "{}", run.stderr);
    assert!(support::failures(&p.path().join("out"), "answers").is_empty());
    assert!(server.counters.storm_429.load(Ordering::SeqCst) >= 60, "the storm happened");
    assert_eq!(server.counters.repeated_after_ok.load(Ordering::SeqCst), 0, "a request was repeated after its success");
    // Each shard paced at a third of the advertised 6000/min (98.5% of it).
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.path().join("out/_synth/waves/w1-n3.json")).unwrap()).unwrap();
    assert_eq!(plan["rate_split"], 3);
    let dir = plan["dir"].as_str().unwrap();
    for i in 0..3 {
        let state: serde_json::Value = serde_json::from_slice(
            &std::fs::read(p.path().join(format!("out/{dir}/s{i:05}/_synth/state/answers.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(state["report"]["info"]["requests_per_minute"], "1970", "shard {i}: {}", state["report"]["info"]);
    }
}

#[test]
fn emitted_kubernetes_jobs_validate_and_the_slurm_script_parses() {
    let p = project(10);
    let k8s = p
        .synth(&[
            "emit",
            "k8s",
            "p.toml",
            "--shards",
            "7",
            "--parallel",
            "3",
            "--state",
            "s3://bucket/run",
            "--image",
            "ghcr.io/example/synth:1",
            "--secret",
            "synth-keys",
            "--run-id",
            "r1",
        ])
        .ok();
    let yaml = k8s.stdout;
    // Two waves: steps 0-2, Indexed Jobs for waves 1 and 2.
    assert_eq!(yaml.matches("kind: \"Job\"").count(), 5, "{yaml}");
    assert_eq!(yaml.matches("completionMode: \"Indexed\"").count(), 2, "{yaml}");
    for needle in [
        "completions: 7",
        "parallelism: 3",
        "backoffLimitPerIndex: 3",
        "restartPolicy: \"Never\"",
        "secretRef:",
        "name: \"synth-keys\"",
        "\"--wave\"",
        "\"--step\"",
        "\"--run-id\"",
    ] {
        assert!(yaml.contains(needle), "{needle} missing:\n{yaml}");
    }
    p.write("jobs.yaml", &yaml);
    let validator = support::repo().join(".tools/kubernetes-validate");
    if !validator.exists() {
        let _ = std::process::Command::new(support::repo().join(".ci/setup-sharding")).status();
    }
    if validator.exists() {
        let out = std::process::Command::new(&validator)
            .args(["--strict", "-k", "1.33.0", "jobs.yaml"])
            .current_dir(p.path())
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "kubernetes-validate rejected the manifest:\n{text}\n{yaml}");
    } else {
        eprintln!("SKIPPED: kubernetes-validate (PyPI) is not installed and .ci/setup-sharding could not install it");
    }
    let slurm = p
        .synth(&["emit", "slurm", "p.toml", "--shards", "7", "--parallel", "3", "--out-dir", "/shared/out"])
        .ok()
        .stdout;
    assert!(slurm.contains("--array=0-6%3"), "{slurm}");
    assert_eq!(slurm.matches("sbatch --parsable").count(), 5, "{slurm}");
    p.write("submit.sh", &slurm);
    let out = std::process::Command::new("bash").args(["-n", "submit.sh"]).current_dir(p.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
