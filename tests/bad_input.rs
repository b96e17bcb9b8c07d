//! Bad input: each case gets one clear message naming what and where, nothing
//! partial is left looking complete, and completed work is kept.

use crate::support;

use std::sync::Arc;

use support::{Project, parquet_rows, people_jsonl};
use synth::data::arrow::array::{Int64Array, RecordBatch, StringArray};
use synth::data::arrow::datatypes::{DataType, Field, Schema};

fn source_pipeline(path: &str, extra: &str) -> String {
    format!(
        r#"
[pipeline]
output_dir = "out"

[stages.src]
kind = "source"
path = "{path}"
{extra}

[stages.out]
kind = "jsonl"
inputs = ["src"]
"#
    )
}

/// Every .parquet in the output directory is a complete, readable file.
fn assert_no_partial_files(dir: &std::path::Path) {
    for (name, _) in support::output_files(dir) {
        assert!(!name.contains(".synth-tmp-"), "temporary file left behind: {name}");
        if name.ends_with(".parquet") {
            synth::store::parquet::read_footer(&dir.join(&name))
                .unwrap_or_else(|e| panic!("{name} is not complete: {e:#}"));
        }
    }
}

#[test]
fn non_utf8_bytes_in_a_jsonl_line_fail_that_line_only() {
    let p = Project::new();
    let mut data = people_jsonl(60).into_bytes();
    data.extend_from_slice(b"{\"name\": \"caf\xe9\", \"age\": 3, \"city\": \"rome\"}\n");
    data.extend_from_slice(people_jsonl(3).as_bytes());
    p.write("people.jsonl", data);
    p.write("p.toml", source_pipeline("people.jsonl", ""));
    let run = p.synth(&["run", "p.toml"]).ok();
    // The run goes on, and says so at the end: count, first reason, where they all are.
    let warning = run.stderr.lines().find(|l| l.starts_with("warning: stage \"src\"")).unwrap_or_else(|| {
        panic!("no warning about the failed record:\n{}", run.stderr);
    });
    assert!(warning.contains("1 record(s) failed (first: src-60: parse: "), "{warning}");
    assert!(warning.contains("people.jsonl:61:") && warning.ends_with("out/src.failures.parquet"), "{warning}");
    let failures = parquet_rows(&p.path().join("out/src.failures.parquet"));
    assert_eq!(failures.len(), 1);
    let msg = failures[0]["message"].as_str().unwrap();
    assert!(msg.contains("people.jsonl:61:") && msg.contains("invalid UTF-8"), "{msg}");
    assert_eq!(failures[0]["id"], "src-60");
    assert_eq!(parquet_rows(&p.path().join("out/src.parquet")).len(), 63);
}

#[test]
fn empty_source_is_an_error_unless_allowed() {
    let p = Project::new();
    p.write("empty.jsonl", "\n\n");
    p.write("p.toml", source_pipeline("empty.jsonl", ""));
    // Found when planning, naming the file (downstream stages would only miss a column).
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(run.stderr.contains("stage \"src\": empty.jsonl: no records (set allow_empty = true"), "{}", run.stderr);
    assert!(!p.path().join("out/src.parquet").exists());
    p.write("p.toml", source_pipeline("empty.jsonl", "allow_empty = true"));
    p.synth(&["run", "p.toml"]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/src.parquet")).len(), 0);
}

fn write_parquet(path: &std::path::Path, schema: Arc<Schema>, batch: RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn parquet_files_with_the_wrong_schema_are_rejected_by_name() {
    let p = Project::new();
    let good =
        Arc::new(Schema::new(vec![Field::new("q", DataType::Utf8, true), Field::new("n", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(
        good.clone(),
        vec![Arc::new(StringArray::from(vec!["a", "b"])), Arc::new(Int64Array::from(vec![1, 2]))],
    )
    .unwrap();
    std::fs::create_dir_all(p.path().join("data")).unwrap();
    write_parquet(&p.path().join("data/part-0.parquet"), good.clone(), batch.clone());
    let other =
        Arc::new(Schema::new(vec![Field::new("q", DataType::Utf8, true), Field::new("m", DataType::Int64, true)]));
    let batch2 = RecordBatch::try_new(
        other.clone(),
        vec![Arc::new(StringArray::from(vec!["c"])), Arc::new(Int64Array::from(vec![3]))],
    )
    .unwrap();
    write_parquet(&p.path().join("data/part-1.parquet"), other, batch2);

    p.write("p.toml", source_pipeline("data/part-*.parquet", ""));
    let run = p.synth(&["run", "p.toml"]).code(2);
    assert!(run.stderr.contains("data/part-1.parquet: no column \"n\" (present in"), "{}", run.stderr);
    assert!(run.stderr.contains("this file has: q, m"), "{}", run.stderr);
    assert!(!p.path().join("out/src.parquet").exists());
    assert_no_partial_files(&p.path().join("out"));

    // Declared columns that a file lacks: found from the footer before anything runs.
    p.write("p.toml", source_pipeline("data/part-0.parquet", "columns = [\"q\", \"z\"]"));
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(
        run.stderr.contains("p.toml:7:8: stage \"src\": data/part-0.parquet: no column \"z\" (columns: q, n)"),
        "{}",
        run.stderr
    );

    // Numbers where text is declared: an error naming file, column and both types, when
    // planning; never a silent cast to text.
    p.write("p.toml", source_pipeline("data/part-0.parquet", "types = { n = \"string\" }"));
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(
        run.stderr.contains("data/part-0.parquet: column \"n\" holds int64 values, but \"types\" declares string"),
        "{}",
        run.stderr
    );
    p.write("ints.jsonl", "{\"persona\": 5}\n{\"persona\": 6}\n");
    p.write("p.toml", source_pipeline("ints.jsonl", "types = { persona = \"string\" }"));
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(run.stderr.contains("ints.jsonl: column \"persona\" holds int64 values"), "{}", run.stderr);

    // A column that cannot take the declared type.
    p.write("p.toml", source_pipeline("data/part-0.parquet", "types = { q = \"int64\" }"));
    let run = p.synth(&["run", "p.toml"]).code(2);
    assert!(
        run.stderr.contains("data/part-0.parquet: column \"q\" (string) cannot be read as int64"),
        "{}",
        run.stderr
    );

    // Not a Parquet file at all: found when planning.
    p.write("data/bogus.parquet", "this is not parquet");
    p.write("p.toml", source_pipeline("data/bogus.parquet", ""));
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(run.stderr.contains("data/bogus.parquet: not a readable Parquet file"), "{}", run.stderr);
}

#[test]
fn csv_rows_that_cannot_be_parsed_name_their_line() {
    let p = Project::new();
    let mut csv = String::from("name,age\n");
    for i in 0..50 {
        csv.push_str(&format!("p{i},{i}\n"));
    }
    csv.push_str("short\n");
    csv.push_str("x,1,extra\n");
    p.write("people.csv", csv);
    p.write("p.toml", source_pipeline("people.csv", "max_failure_ratio = 0.1"));
    p.synth(&["run", "p.toml"]).ok();
    let failures = parquet_rows(&p.path().join("out/src.failures.parquet"));
    let msgs: Vec<&str> = failures.iter().map(|f| f["message"].as_str().unwrap()).collect();
    assert!(msgs.contains(&"people.csv:52: expected 2 fields, found 1"), "{msgs:?}");
    assert!(msgs.contains(&"people.csv:53: expected 2 fields, found 3"), "{msgs:?}");
    let rows = parquet_rows(&p.path().join("out/src.parquet"));
    assert_eq!(rows.len(), 50);
    assert_eq!(rows[7]["age"], 7, "age should be inferred as an integer");

    // TSV without a header, columns named in the config (the MS MARCO collection layout).
    p.write("c.tsv", "0\tThe first \"quoted\" passage.\n1\tSecond passage\n");
    p.write(
        "t.toml",
        source_pipeline("c.tsv", "header = false\ncolumns = [\"pid\", \"passage\"]\nid_column = \"pid\""),
    );
    p.synth(&["run", "t.toml"]).ok();
    let rows = parquet_rows(&p.path().join("out/src.parquet"));
    assert_eq!(rows[0]["id"], "0");
    assert_eq!(rows[0]["passage"], "The first \"quoted\" passage.");
}

#[test]
fn an_output_directory_that_cannot_be_written_is_reported() {
    let p = Project::new();
    p.write("people.jsonl", people_jsonl(5));
    p.write("p.toml", source_pipeline("people.jsonl", ""));
    p.write("blocker", "a file, not a directory");
    let run = p.synth(&["run", "p.toml", "--out", "blocker/out"]).code(2);
    assert!(run.stderr.contains("cannot create output directory blocker/out"), "{}", run.stderr);
}

/// A source pipeline whose output directory's lock this test holds (as another run would).
fn project_with_its_output_locked() -> (Project, std::fs::File) {
    let p = Project::new();
    p.write("people.jsonl", people_jsonl(5));
    p.write("p.toml", source_pipeline("people.jsonl", ""));
    std::fs::create_dir_all(p.path().join("out/_synth")).unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p.path().join("out/_synth/lock"))
        .unwrap();
    lock.lock().unwrap();
    (p, lock)
}

#[test]
fn two_runs_cannot_share_an_output_directory() {
    let (p, lock) = project_with_its_output_locked();
    let run = p.synth(&["run", "p.toml"]).code(75);
    assert!(run.stderr.contains("another synth run is using out"), "{}", run.stderr);
    drop(lock);
    p.synth(&["run", "p.toml"]).ok();
}

/// A lock released a moment after the run starts (a run that has just ended, or a child
/// process between fork and exec holding a copy of its descriptor) is waited for.
#[test]
fn a_lock_released_a_moment_later_is_waited_for() {
    let (p, lock) = project_with_its_output_locked();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(lock);
    });
    let run = p.synth(&["run", "p.toml"]);
    holder.join().unwrap();
    run.ok();
}

/// Run a shell script inside a private mount namespace where `out` is a small tmpfs.
/// Returns None (and says why) when this machine cannot create namespaces.
fn on_tiny_disk(p: &Project, size: &str, script: &str) -> Option<support::Run> {
    let probe = std::process::Command::new("unshare").args(["-rm", "true"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("SKIPPED disk-full case: `unshare -rm` is not permitted on this machine");
        return None;
    }
    std::fs::create_dir_all(p.path().join("out")).unwrap();
    let script = format!(
        "set -u; mount -t tmpfs -o size={size} tmpfs out || exit 99; SYNTH={}; {script}",
        support::synth_bin().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .current_dir(p.path())
        .env("CI", "1")
        .output()
        .unwrap();
    Some(support::Run::from(out))
}

#[test]
fn disk_full_fails_cleanly_and_keeps_completed_stages() {
    let p = Project::new();
    p.write("small.jsonl", people_jsonl(10));
    // Pseudo-random words compress badly, so this output cannot fit in the tmpfs.
    let mut big = String::new();
    let mut x: u64 = 42;
    for i in 0..40_000 {
        let mut word = String::new();
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.push((b'a' + (x % 26) as u8) as char);
        }
        big.push_str(&format!("{{\"n\": {i}, \"text\": \"{word}\"}}\n"));
    }
    p.write("big.jsonl", big);
    let small_branch = r#"
[pipeline]
name = "disk"
output_dir = "out"

[stages.small]
kind = "source"
path = "small.jsonl"

[stages.small_out]
kind = "jsonl"
inputs = ["small"]
"#;
    p.write("small.toml", small_branch);
    p.write(
        "p.toml",
        format!("{small_branch}\n[stages.big]\nkind = \"source\"\npath = \"big.jsonl\"\n\n[stages.big_out]\nkind = \"jsonl\"\ninputs = [\"big\"]\n"),
    );
    let script = "$SYNTH run small.toml -q >/dev/null || exit 98; \
                  $SYNTH run p.toml -q; echo \"exit=$?\"; \
                  echo '--- files'; find out -type f; echo '--- manifest'; cat out/manifest.json";
    let Some(run) = on_tiny_disk(&p, "400k", script) else { return };
    let (head, manifest) = run.stdout.split_once("--- manifest").expect(&run.stderr);
    assert!(head.contains("exit=2"), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    // The stage, the output by its final name (not the temporary file), and what to do.
    assert!(
        run.stderr.contains("stage \"big\": the disk is full: no space left while writing out/big.parquet; free space"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(".synth-tmp-"), "{}", run.stderr);
    assert!(run.stderr.contains("completed stages are kept in out"), "{}", run.stderr);
    assert!(!head.contains(".synth-tmp-"), "temporary files left on the full disk:\n{head}");
    assert!(!head.contains("out/big.parquet"), "a partial output was left under its final name:\n{head}");
    let m: serde_json::Value = serde_json::from_str(manifest.trim()).expect("manifest after disk full");
    assert_eq!(m["status"], "failed");
    assert_eq!(m["stages"]["small"]["status"], "up_to_date");
    assert_eq!(m["stages"]["small_out"]["status"], "up_to_date");
    assert_eq!(m["stages"]["big"]["status"], "failed");
    assert!(head.contains("out/small.parquet") && head.contains("out/small_out.jsonl"), "{head}");
}

#[test]
fn a_source_deleted_after_planning_is_reported_with_its_path() {
    // The checker runs first, so a missing file is a config error (exit 78) naming it.
    let p = Project::new();
    p.write("p.toml", source_pipeline("gone.jsonl", ""));
    let run = p.synth(&["run", "p.toml"]).code(78);
    assert!(
        run.stderr.contains("p.toml:7:8: stage \"src\": option \"path\": no file matches \"gone.jsonl\""),
        "{}",
        run.stderr
    );
    assert!(!p.path().join("out/manifest.json").exists(), "a config error must not start a run");
}

#[test]
fn a_non_utf8_pipeline_file_is_a_config_error() {
    let p = Project::new();
    p.write("p.toml", b"[stages.a]\nkind = \"sou\xffrce\"\n");
    let run = p.synth(&["validate", "p.toml"]).code(78);
    assert!(run.stderr.contains("p.toml:2:12: pipeline file is not valid UTF-8"), "{}", run.stderr);
}

#[test]
fn duplicate_ids_from_an_id_column_are_an_error_naming_the_id() {
    let p = Project::new();
    p.write("d.jsonl", "{\"id\": \"a\", \"x\": 1}\n{\"id\": \"b\", \"x\": 2}\n{\"id\": \"a\", \"x\": 3}\n");
    p.write("p.toml", source_pipeline("d.jsonl", ""));
    let run = p.synth(&["run", "p.toml"]).code(2);
    assert!(run.stderr.contains("stage \"src\": duplicate record id \"a\""), "{}", run.stderr);
    assert!(!p.path().join("out/src.parquet").exists());
    assert_no_partial_files(&p.path().join("out"));
}

/// A profile that redefines a stage keeps the base's options it does not set: RoleMRC's
/// `types = { persona = "string" }` refuses a Parquet file of integer personas under
/// `--offline`, `--profile demo` and `--profile local` as it does without a profile.
#[test]
fn a_profile_redefining_a_stage_keeps_the_base_types() {
    let p = Project::new();
    let schema = Arc::new(Schema::new(vec![Field::new("persona", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).unwrap();
    write_parquet(&p.path().join("ints.parquet"), schema, batch);
    let file = support::repo().join("pipelines/rolemrc.toml").display().to_string();
    let path = format!("stages.personas_raw.path=\"{}\"", p.path().join("ints.parquet").display());
    for profile in [&["--offline"][..], &["--profile", "demo"], &["--profile", "local"], &[]] {
        let out = p.path().join("out").display().to_string();
        let mut args = vec!["run", file.as_str(), "--out", &out, "--until", "personas_raw", "--set", &path];
        args.extend_from_slice(profile);
        let run = p.synth(&args).code(78);
        assert!(
            run.stderr.contains("ints.parquet: column \"persona\" holds int64 values, but \"types\" declares string"),
            "{profile:?}: {}",
            run.stderr
        );
    }
    // `synth validate --profile` shows the resolved stage tables: the base's types are there.
    let shown = p.synth(&["validate", &file, "--offline"]).ok().stdout;
    let line = shown.lines().find(|l| l.starts_with("stages.personas_raw = ")).unwrap_or_else(|| panic!("{shown}"));
    assert!(line.contains("types = { persona = \"string\" }") && line.contains("rolemrc-demo"), "{line}");
}

/// `synth list --markdown | head -1`: the reader leaves after one line; synth ends as Unix
/// tools do (SIGPIPE), with nothing on stderr, not a panic from `println!`.
#[test]
fn a_reader_that_leaves_early_ends_a_printing_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let mut child = Command::new(support::synth_bin())
        .args(["list", "--markdown"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The reader is dropped: the pipe is closed with most of the page unread.
    assert!(!first.is_empty());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?} {stderr}", out.status);
}
