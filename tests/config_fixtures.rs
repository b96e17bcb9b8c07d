//! Config fixtures: every `tests/fixtures/config/ok/*.toml` validates cleanly;
//! every `err/*.toml` fails with exactly the diagnostics in its `.expected` file.
//! A first line `# args: ...` adds command-line arguments. Set UPDATE_EXPECT=1 to
//! rewrite the expectations after an intended change (then review the diff).

use crate::support;

use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

fn cases(sub: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures().join(sub))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {sub}");
    files
}

fn validate(case: &Path) -> support::Run {
    let text = std::fs::read_to_string(case).unwrap();
    let rel = case.strip_prefix(fixtures()).unwrap().to_string_lossy().to_string();
    let mut args = vec!["validate".to_string(), rel];
    if let Some(extra) = text.lines().next().and_then(|l| l.strip_prefix("# args:")) {
        args.extend(extra.split_whitespace().map(str::to_string));
    }
    let out = std::process::Command::new(support::synth_bin()).args(&args).current_dir(fixtures()).output().unwrap();
    support::Run::from(out)
}

#[test]
fn ok_fixtures_validate() {
    for case in cases("ok") {
        let run = validate(&case);
        assert_eq!(run.code, 0, "{}: expected valid\n{}", case.display(), run.stderr);
        assert!(run.stderr.is_empty(), "{}: unexpected diagnostics\n{}", case.display(), run.stderr);
        assert!(run.stdout.contains("valid"), "{}", run.stdout);
    }
}

#[test]
fn err_fixtures_report_expected_diagnostics() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut failures = Vec::new();
    for case in cases("err") {
        let run = validate(&case);
        let expected_path = case.with_extension("expected");
        if update {
            std::fs::write(&expected_path, &run.stderr).unwrap();
            continue;
        }
        if run.code != 78 {
            failures.push(format!("{}: exit {} (expected 78)\n{}", case.display(), run.code, run.stderr));
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("missing {} (run with UPDATE_EXPECT=1)", expected_path.display()));
        if run.stderr != expected {
            failures.push(format!(
                "{}: diagnostics differ\n--- expected\n{expected}--- actual\n{}",
                case.display(),
                run.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
