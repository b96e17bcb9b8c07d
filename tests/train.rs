//! The `train` stage: the trainer protocol with a stand-in trainer (Python 3 stdlib,
//! no GPU) put where the default command expects the reference trainer
//! (`pipelines/trainers/trl_train.py`), so the default command line is exercised too.

use crate::support;

use std::path::Path;

use support::{Project, manifest, parquet_rows};

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/train").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A project with SFT/DPO sources (RoleMRC layout), the stand-in trainer, and `train`.
fn project(extra: &str) -> Project {
    let p = Project::new();
    p.write("data/sft.jsonl", fixture("sft.jsonl"));
    p.write("data/dpo.jsonl", fixture("dpo.jsonl"));
    p.write("pipelines/trainers/trl_train.py", fixture("stand_in_trainer.py"));
    p.write(
        "pipeline.toml",
        format!(
            r#"[pipeline]
name = "train-test"
output_dir = "out"

[stages.sft]
kind = "source"
path = "data/sft.jsonl"

[stages.dpo]
kind = "source"
path = "data/dpo.jsonl"

[stages.train]
kind = "train"
inputs = ["sft", "dpo"]
base_model = "tiny/base"
hyperparameters = {{ batch_size = 1, grad_acc = 1, max_steps = 2 }}
{extra}
"#
        ),
    );
    p
}

fn launches(p: &Project) -> usize {
    p.read("out/train/launches.txt").lines().count()
}

fn jsonl(p: &Project, rel: &str) -> Vec<serde_json::Value> {
    p.read(rel).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn train_writes_trl_data_runs_the_trainer_and_records_checkpoints() {
    let p = project("");
    let run = p.synth(&["run", "pipeline.toml"]).ok();

    // The data in TRL's conversational layouts.
    let sft = jsonl(&p, "out/train/train_data/sft.jsonl");
    assert_eq!(sft.len(), 3);
    assert_eq!(
        sft[0],
        serde_json::json!({"messages": [
            {"role": "system", "content": "You are Ada, a lighthouse keeper."},
            {"role": "user", "content": "What do you do at night?"},
            {"role": "assistant", "content": "I keep the lamp burning, of course."},
        ]})
    );
    let dpo = jsonl(&p, "out/train/train_data/dpo.jsonl");
    assert_eq!(dpo.len(), 2);
    assert_eq!(
        dpo[0],
        serde_json::json!({
            "prompt": [
                {"role": "system", "content": "You are Ada, a lighthouse keeper."},
                {"role": "user", "content": "Can you fix my car?"},
            ],
            "chosen": [{"role": "assistant", "content": "I only know lamps and tides, friend."}],
            "rejected": [{"role": "assistant", "content": "Sure, replace the alternator."}],
        })
    );

    // Progress and the trainer's own lines reached the log.
    assert!(run.stderr.contains("sft step 2/2 loss"), "{}", run.stderr);
    assert!(run.stderr.contains("dpo step 1/2"), "{}", run.stderr);
    assert!(run.stderr.contains("stand-in trainer: base model tiny/base, 3 SFT rows, 2 DPO rows"), "{}", run.stderr);
    assert!(run.stderr.contains("100%") && !run.stderr.contains("50%"), "progress redraws collapse: {}", run.stderr);
    assert!(p.path().join("out/train/sft/config.json").is_file());
    assert!(p.path().join("out/train/dpo/config.json").is_file());

    // Checkpoints and metrics in the manifest...
    let m = manifest(&p.path().join("out"));
    let report = &m["stages"]["train"]["report"];
    assert_eq!(m["stages"]["train"]["status"], "ran");
    assert_eq!(report["info"]["checkpoint.sft"], "train/sft", "{report}");
    assert_eq!(report["info"]["checkpoint.dpo"], "train/dpo", "{report}");
    assert_eq!(report["info"]["base_model"], "tiny/base");
    assert_eq!(report["info"]["dpo.scheduler"], "cosine");
    assert_eq!(report["metrics"]["sft.steps"], 2.0);
    // Table 8 defaults reach the trainer through the default command.
    assert_eq!(report["metrics"]["sft.learning_rate"], 1e-5);
    assert_eq!(report["metrics"]["dpo.learning_rate"], 2e-5);
    assert_eq!(report["metrics"]["dpo.beta"], 0.1);
    assert_eq!(report["metrics"]["train_data.sft_rows"], 3.0);
    assert_eq!(report["rows_in"], 5);
    assert_eq!(report["rows_out"], 2);

    // ... and in the output table.
    let rows = parquet_rows(&p.path().join("out/train.parquet"));
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["phase"], "sft");
    assert_eq!(rows[0]["path"], "train/sft");
    assert_eq!(rows[0]["step"], 2);
    assert_eq!(rows[1]["phase"], "dpo");
    assert_eq!(rows[1]["path"], "train/dpo");
    let metrics: serde_json::Value = serde_json::from_str(rows[1]["metrics"].as_str().unwrap()).unwrap();
    assert_eq!(metrics["beta"], 0.1);
    assert_eq!(metrics["steps"], 2);
    assert_eq!(launches(&p), 1);

    // Nothing changed: up to date, the trainer is not launched again.
    p.synth(&["run", "pipeline.toml"]).ok();
    assert_eq!(support::statuses(&p.path().join("out"))["train"], "up_to_date");
    assert_eq!(launches(&p), 1);

    // A changed hyperparameter re-runs it, and so does a changed trainer script.
    p.synth(&["run", "pipeline.toml", "--set", "stages.train.hyperparameters.beta=0.2"]).ok();
    assert_eq!(launches(&p), 2);
    assert_eq!(manifest(&p.path().join("out"))["stages"]["train"]["report"]["metrics"]["dpo.beta"], 0.2);
    p.synth(&["run", "pipeline.toml", "--set", "stages.train.hyperparameters.beta=0.2"]).ok();
    assert_eq!(launches(&p), 2);
    let script = p.read("pipelines/trainers/trl_train.py");
    p.write("pipelines/trainers/trl_train.py", format!("{script}\n# changed\n"));
    p.synth(&["run", "pipeline.toml", "--set", "stages.train.hyperparameters.beta=0.2"]).ok();
    assert_eq!(launches(&p), 3);
}

/// The arguments the default command gave the stand-in are accepted by the real reference
/// trainer, which checks the data synth wrote in TRL's layouts (`--check`: no torch).
#[test]
fn the_reference_trainer_accepts_the_default_command_and_its_data() {
    let p = project("");
    p.synth(&["run", "pipeline.toml"]).ok();
    let argv: Vec<String> = serde_json::from_str(p.read("out/train/launches.txt").lines().next().unwrap()).unwrap();
    assert!(argv.iter().any(|a| a == "--warmup-ratio"), "{argv:?}");
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/trainers/trl_train.py");
    let check = |args: &[String]| {
        std::process::Command::new("python3")
            .arg(&real)
            .args(args)
            .arg("--check")
            .current_dir(p.path())
            .output()
            .expect("python3 runs")
    };
    let out = check(&argv);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("check: 3 SFT conversations, 2 DPO pairs; would train sft+dpo from tiny/base"), "{stdout}");

    // A DPO pair whose chosen side is not an assistant message is named by file and line.
    let dpo = argv[argv.iter().position(|a| a == "--dpo").unwrap() + 1].clone();
    let mut text = std::fs::read_to_string(&dpo).unwrap();
    text.push_str("{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": [{\"role\": \"user\", \"content\": \"x\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"y\"}]}\n");
    let bad = p.path().join("bad-dpo.jsonl");
    std::fs::write(&bad, text).unwrap();
    let mut args = argv.clone();
    let at = args.iter().position(|a| a == "--dpo").unwrap() + 1;
    args[at] = bad.display().to_string();
    let out = check(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad-dpo.jsonl:3: chosen: the last message is not the assistant's"), "{stderr}");
}

#[test]
fn a_failing_trainer_fails_the_run_with_its_last_lines() {
    let p = project("env = { STAND_IN_FAIL = \"1\" }");
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("trainer failed (exit code 3)"), "{}", run.stderr);
    assert!(run.stderr.contains("RuntimeError: CUDA out of memory (stand-in failure)"), "{}", run.stderr);
    let m = manifest(&p.path().join("out"));
    assert_eq!(m["stages"]["train"]["status"], "failed");
    assert!(m["stages"]["train"]["error"].as_str().unwrap().contains("CUDA out of memory"), "{m}");
    assert!(!p.path().join("out/train.parquet").exists());
}

/// A trainer that prints a secret from its environment: the value never reaches synth's
/// log, the error or the manifest.
#[test]
fn secrets_the_trainer_prints_are_scrubbed() {
    let secret = "wandb-0123456789abcdef";
    let p = project(&format!(
        "env = {{ STAND_IN_FAIL = \"1\", STAND_IN_LEAK = \"WANDB_API_KEY\", WANDB_API_KEY = \"{secret}\" }}"
    ));
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("leaking ***"), "{}", run.stderr);
    assert!(!run.stderr.contains(secret) && !run.stdout.contains(secret), "{}", run.stderr);
    let m = std::fs::read_to_string(p.path().join("out/manifest.json")).unwrap();
    assert!(m.contains("leaking ***") && !m.contains(secret), "{m}");
}

#[test]
fn a_trainer_that_reports_no_checkpoint_fails() {
    let p = project(r#"command = ["python3", "-c", "print('trained, honest')"]"#);
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("reported no checkpoint"), "{}", run.stderr);
}

#[test]
fn command_templates_are_checked() {
    let p = project(r#"command = ["python3", "x.py", "{{ sft_rl }}"]"#);
    let run = p.synth(&["validate", "pipeline.toml"]).code(78);
    assert!(run.stderr.contains("unknown variable \"sft_rl\""), "{}", run.stderr);
    assert!(run.stderr.contains("did you mean \"sft_lr\""), "{}", run.stderr);
}
