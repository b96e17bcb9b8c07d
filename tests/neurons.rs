//! The `neurons` stage: the analysis-script protocol with a stand-in script (Python 3
//! stdlib, no torch) put where the default command expects the reference script
//! (`pipelines/analysis/neurons.py`), so the default command line is exercised too:
//! probe data and configuration, progress and outputs followed, activation maps,
//! Appendix H discrepancies and a summary the report shows; failures named.

use crate::support;

use std::path::Path;

use serde_json::Value;
use support::{Project, manifest, parquet_rows};

fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/neurons").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Probe rows: a conversation (`question`) and a task; a train stage's checkpoint table.
fn project(neurons: &str) -> Project {
    let p = Project::new();
    let mut probe = String::new();
    for i in 0..6 {
        let task = ["answer", "refuse", "nested"][i % 3];
        probe.push_str(&format!(
            "{{\"id\": \"q{i}\", \"task\": \"{task}\", \"question\": [{{\"role\": \"System\", \"content\": \"You are Ada.\"}}, {{\"role\": \"User\", \"content\": \"Question {i}?\"}}]}}\n"
        ));
    }
    probe.push_str(
        "{\"id\": \"q6\", \"task\": \"unknown\", \"question\": [{\"role\": \"User\", \"content\": \"?\"}]}\n",
    );
    probe.push_str("{\"id\": \"q7\", \"task\": \"answer\", \"question\": []}\n");
    p.write("data/test.jsonl", probe);
    p.write(
        "data/checkpoints.jsonl",
        "{\"id\": \"sft\", \"phase\": \"sft\", \"path\": \"train/sft\"}\n{\"id\": \"dpo\", \"phase\": \"dpo\", \"path\": \"train/dpo\"}\n",
    );
    p.write(
        "groups.json",
        r#"{"source": "a test", "titles": {"KNOW": "Knowledge", "STYLE": "Style"}, "map": {"answer": ["KNOW", "STYLE"], "refuse": ["KNOW"], "nested": ["STYLE"]}}"#,
    );
    p.write("pipelines/analysis/neurons.py", fixture("stand_in.py"));
    p.write(
        "pipeline.toml",
        format!(
            r#"[pipeline]
name = "neurons-test"
output_dir = "out"

[stages.test]
kind = "source"
path = "data/test.jsonl"

[stages.train]
kind = "source"
path = "data/checkpoints.jsonl"

[stages.neurons]
kind = "neurons"
inputs = ["test", "train"]
groups = "groups.json"
max_failure_ratio = 0.5
{neurons}

[stages.report]
kind = "report"
inputs = ["neurons"]
charts = []
"#
        ),
    );
    p
}

#[test]
fn neurons_runs_the_script_and_records_maps_discrepancies_and_a_report() {
    let p = project(
        r#"models = { sft = "checkpoint:sft", dpo = "checkpoint:dpo" }
compare = [["sft", "dpo"]]"#,
    );
    let run = p.synth(&["run", "pipeline.toml"]).ok();
    let out = p.path().join("out");

    // The probe data and the configuration the script got.
    let probe: Vec<Value> =
        p.read("out/neurons/probe.jsonl").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(probe.len(), 6);
    assert_eq!(probe[0]["groups"], serde_json::json!(["KNOW", "STYLE"]));
    assert_eq!(
        probe[0]["messages"][0],
        serde_json::json!({"role": "System", "content": "You are Ada."}),
        "roles as written"
    );
    let cfg: Value = serde_json::from_str(&p.read("out/neurons/config.json")).unwrap();
    let sft = cfg["models"]["sft"].as_str().unwrap();
    assert!(Path::new(sft).is_absolute() && sft.ends_with("out/train/sft"), "checkpoint:sft resolved: {sft}");
    assert_eq!((cfg["hook"].as_str(), cfg["top_percent"].as_f64()), (Some("attn_out"), Some(20.0)));
    assert_eq!(cfg["titles"]["KNOW"], "Knowledge");
    assert!(run.stderr.contains("stand-in: models"), "the script's lines are logged: {}", run.stderr);

    // Rows the stage could not use are failures, with the reason.
    let failures = support::failures(&out, "neurons");
    let msgs: Vec<&str> = failures.iter().map(|f| f["message"].as_str().unwrap()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("task \"unknown\" has no group in groups.json")), "{msgs:?}");
    assert!(msgs.iter().any(|m| m.contains("column \"question\" is empty")), "{msgs:?}");

    // The maps: model × group × layer, counts per neuron.
    let maps = parquet_rows(&out.join("neurons.parquet"));
    assert_eq!(maps.len(), 2 * 2 * 3);
    let know = maps.iter().find(|m| m["id"] == "sft/KNOW/0").unwrap();
    assert_eq!((know["samples"].as_i64(), know["title"].as_str()), (Some(4), Some("Knowledge")));
    assert_eq!(know["counts"].as_array().unwrap().len(), 8);

    // Appendix H's D_ℓ per pair, group and layer, from the maps.
    let disc = parquet_rows(&out.join("neurons.discrepancy.parquet"));
    assert_eq!(disc.len(), 2 * 3);
    for d in &disc {
        let key = |m: &str| format!("{m}/{}/{}", d["group"].as_str().unwrap(), d["layer"]);
        let base = maps.iter().find(|m| m["id"] == key("sft")).unwrap();
        let tuned = maps.iter().find(|m| m["id"] == key("dpo")).unwrap();
        let (b, t) = (base["counts"].as_array().unwrap(), tuned["counts"].as_array().unwrap());
        let n = base["samples"].as_f64().unwrap();
        let want: f64 =
            b.iter().zip(t).map(|(x, y)| (y.as_f64().unwrap() / n - x.as_f64().unwrap() / n).abs()).sum::<f64>() / 8.0;
        assert!((d["mean_abs_delta"].as_f64().unwrap() - want).abs() < 1e-12, "{d:?}");
        let delta: Vec<f64> = d["delta"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let expect: Vec<f64> =
            b.iter().zip(t).map(|(x, y)| (y.as_f64().unwrap() - x.as_f64().unwrap()) / 8.0).collect();
        assert_eq!(delta, expect, "visualize.py: (tuned − base) / d_model");
    }

    // The report section: D per dimension, overall and per layer.
    let report = p.read("out/report.md");
    assert!(report.contains("| Model | Knowledge | Style |"), "{report}");
    assert!(report.contains("| dpo vs sft | layer 2 |"), "{report}");

    // Progress, outputs and metrics in the manifest.
    let m = manifest(&out);
    let info = &m["stages"]["neurons"]["report"]["info"];
    assert_eq!(info["figures"], "4", "{info}");
    assert_eq!(info["figures_dir"], "neurons/figures");
    assert_eq!(info["model.sft"], "train/sft");
    assert_eq!(info["groups.source"], "a test");
    assert_eq!(m["stages"]["neurons"]["report"]["metrics"]["dpo.d_model"], 8.0);

    // Up to date: a second run launches nothing; a changed option re-runs.
    let again = p.synth(&["run", "pipeline.toml"]).ok();
    assert!(!again.stderr.contains("stand-in: models"), "{}", again.stderr);
    let changed = p.synth(&["run", "pipeline.toml", "--set", "stages.neurons.top_percent=10.0"]).ok();
    assert!(changed.stderr.contains("top 10.0"), "{}", changed.stderr);
}

#[test]
fn neurons_failures_name_the_script_and_the_problem() {
    // A script that fails: the stage fails with its last lines.
    let p = project(
        r#"models = { sft = "checkpoint:sft", dpo = "checkpoint:dpo" }
compare = [["sft", "dpo"]]
env = { STAND_IN = "fail" }"#,
    );
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("analysis script failed (exit code 3)"), "{}", run.stderr);
    assert!(run.stderr.contains("something broke"), "{}", run.stderr);

    // Exit 0 but no maps: an error, not an empty output.
    let p = project(
        r#"models = { sft = "checkpoint:sft", dpo = "checkpoint:dpo" }
compare = [["sft", "dpo"]]
env = { STAND_IN = "no_maps" }"#,
    );
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("reported no activation maps"), "{}", run.stderr);

    // Maps of ragged width: refused, naming the line.
    let p = project(
        r#"models = { sft = "checkpoint:sft", dpo = "checkpoint:dpo" }
compare = [["sft", "dpo"]]
env = { STAND_IN = "ragged" }"#,
    );
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(run.stderr.contains("maps.jsonl:12: 7 neurons where the model's other maps have 8"), "{}", run.stderr);

    // A phase the train stage does not have; a comparison of unknown labels; a checkpoint
    // model without a train input.
    let p = project(
        r#"models = { sft = "checkpoint:sft", rl = "checkpoint:ppo" }
compare = [["sft", "rl"]]"#,
    );
    let run = p.synth(&["run", "pipeline.toml"]).code(2);
    assert!(
        run.stderr.contains("model \"rl\": no checkpoint of phase \"ppo\" in the second input (phases: dpo, sft)"),
        "{}",
        run.stderr
    );
    let p = project(
        r#"models = { sft = "checkpoint:sft" }
compare = [["sft", "dpo"]]"#,
    );
    let run = p.synth(&["validate", "pipeline.toml"]).code(78);
    assert!(run.stderr.contains("\"dpo\" is not a model label (models: sft)"), "{}", run.stderr);
}
