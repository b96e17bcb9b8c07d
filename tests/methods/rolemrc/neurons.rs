//! RoleMRC's neuron-level analysis (§7, Appendix H) with the real reference script
//! (`pipelines/analysis/neurons.py`, PyTorch + transformers) on the CPU: tiny randomly
//! initialised Llamas (nothing downloaded) probed on the offline test split, and the whole
//! chain of `pipelines/rolemrc-train-eval.toml` — the reference TRL trainer (SFT then DPO),
//! the analysis of both checkpoints, generation, metrics, judge, report. They need the
//! interpreter `pipelines/tools/setup_torch.sh` installs (`.tools/torchpy`, which `.ci/setup`
//! runs) and say why they skip without it.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{Project, parquet_rows, repo, torch_python};

fn offline_test_split(p: &Project) -> PathBuf {
    let out = p.path().join("rolemrc-offline");
    let file = repo().join("pipelines/rolemrc.toml");
    p.synth(&["run", file.to_str().unwrap(), "--offline", "--out", out.to_str().unwrap()]).ok();
    out
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_string_lossy().to_string(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn the_reference_script_maps_tiny_random_llamas_per_dimension() {
    let Some(python) = torch_python() else { return };
    let p = Project::new();
    let data = offline_test_split(&p);
    let root = repo();
    p.write(
        "p.toml",
        format!(
            r#"[pipeline]
root = "{root}"
output_dir = "{out}"

[stages.test]
kind = "source"
path = "{test}"

[stages.neurons]
kind = "neurons"
inputs = ["test"]
models = {{ sft = "tiny-random-llama:1", dpo = "tiny-random-llama:2" }}
compare = [["sft", "dpo"]]
groups = "pipelines/prompts/rolemrc/neurons/groups.json"
dtype = "float32"
device = "cpu"
threads = 1
verify_hooks = true
command = ["{python}", "pipelines/analysis/neurons.py", "--config", "{{{{ config }}}}"]

[stages.report]
kind = "report"
inputs = ["neurons"]
charts = []
"#,
            root = root.display(),
            out = p.path().join("out").display(),
            test = data.join("test.parquet").display(),
            python = python.display(),
        ),
    );
    p.synth(&["run", "p.toml"]).ok();
    let out = p.path().join("out");

    // Every map: per row exactly k = int(64 · 0.2) = 12 neurons kept (visualize.py's
    // keep_top_percentage), so a layer's counts add up to 12 × its rows, none above its rows.
    let maps = parquet_rows(&out.join("neurons.parquet"));
    let groups: std::collections::BTreeSet<&str> = maps.iter().map(|m| m["group"].as_str().unwrap()).collect();
    assert_eq!(
        groups.into_iter().collect::<Vec<_>>(),
        ["INSTRUCTION_PRIORITY", "KNOWLEDGE_RANGE", "MULTI_TURN_INSTRUCTION", "NESTED_INSTRUCTION", "STYLE_COMPLIANCE"]
    );
    assert_eq!(maps.len(), 2 * 5 * 4, "2 models × 5 dimensions × 4 layers");
    for m in &maps {
        let counts: Vec<i64> = m["counts"].as_array().unwrap().iter().map(|c| c.as_i64().unwrap()).collect();
        let samples = m["samples"].as_i64().unwrap();
        assert_eq!(counts.len(), 64);
        assert_eq!(counts.iter().sum::<i64>(), 12 * samples, "{}", m["id"]);
        assert!(counts.iter().all(|c| (0..=samples).contains(c)), "{}", m["id"]);
    }
    // The test rows in their tasks' dimensions (groups.json), a row in each of its dimensions.
    let know = maps.iter().find(|m| m["id"] == "sft/KNOWLEDGE_RANGE/0").unwrap();
    assert!(know["samples"].as_i64().unwrap() > 0);

    // The hooks read what the residual stream adds up to (checked by the script).
    let m = support::manifest(&out);
    let metrics = &m["stages"]["neurons"]["report"]["metrics"];
    assert_eq!(metrics["sft.verify.residual_max_abs_error"].as_f64(), Some(0.0), "{metrics}");
    assert_eq!((metrics["dpo.layers"].as_f64(), metrics["dpo.d_model"].as_f64()), (Some(4.0), Some(64.0)));

    // Figures: each model's maps and the discrepancy, PNG and SVG.
    let figs = files(&out.join("neurons/figures"));
    assert_eq!(figs.len(), (5 * 2 + 5) * 2, "{:?}", figs.keys().collect::<Vec<_>>());
    let png = &figs["sft-vs-dpo/KNOWLEDGE_RANGE_layer_active_heatmap.png"];
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let svg = String::from_utf8(figs["dpo/STYLE_COMPLIANCE_layer_active_heatmap.svg"].clone()).unwrap();
    assert!(svg.contains("<svg") && svg.contains("Role Style"), "titled as visualize.py");

    // The report section, in the paper's dimension order.
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("| Model | Knowledge Boundary | Role Style | Multi-turn Instructions | Nested Instructions | Prioritized Instructions |"),
        "{report}"
    );
    assert!(report.contains("| dpo vs sft | layer 3 |"), "{report}");

    // Same config, same bytes: the maps, the discrepancies and the figures.
    let before = (files(&out.join("neurons/figures")), std::fs::read(out.join("neurons.discrepancy.parquet")).unwrap());
    p.synth(&["run", "p.toml", "--from", "neurons"]).ok();
    assert!(files(&out.join("neurons/figures")) == before.0, "figures are deterministic");
    assert_eq!(std::fs::read(out.join("neurons.discrepancy.parquet")).unwrap(), before.1);
}

#[test]
fn train_then_analyse_then_evaluate_on_the_cpu() {
    let Some(python) = torch_python() else { return };
    let trl = std::process::Command::new(&python).args(["-c", "import trl, datasets"]).output();
    if !trl.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED: {} cannot import trl/datasets (pipelines/tools/setup_torch.sh installs them)",
            python.display()
        );
        return;
    }
    let p = Project::new();
    let data = offline_test_split(&p);
    let out = p.path().join("train-eval");
    let file = repo().join("pipelines/rolemrc-train-eval.toml");
    let set = |stage: &str| format!("stages.{stage}.path=\"{}\"", data.join(format!("{stage}.parquet")).display());
    let (sft, dpo, test) = (set("sft"), set("dpo"), set("test"));
    let args = |extra: &[&'static str]| {
        let mut a = vec![file.to_str().unwrap(), "--profile", "offline,smoke,cpu", "--out", out.to_str().unwrap()];
        for s in [&sft, &dpo, &test] {
            a.extend(["--set", s.as_str()]);
        }
        a.extend(["--set", "stages.neurons.figures=[\"svg\"]"]);
        a.extend_from_slice(extra);
        a
    };
    let run = p.synth(&[&["run"][..], &args(&[])].concat()).ok();
    // The reference trainer ran SFT then DPO and reported both checkpoints.
    let m = support::manifest(&out);
    let train = &m["stages"]["train"]["report"];
    assert_eq!(train["info"]["checkpoint.sft"], "train/sft", "{train}");
    assert_eq!(train["info"]["checkpoint.dpo"], "train/dpo", "{train}");
    assert_eq!(train["metrics"]["dpo.global_step"].as_f64(), Some(5.0), "{train}");
    // The analysis probed both checkpoints; the report compares them beside Tables 3 and 9.
    let neurons = &m["stages"]["neurons"]["report"];
    assert_eq!(neurons["info"]["model.sft"], "train/sft", "{neurons}");
    assert_eq!(neurons["info"]["model.dpo"], "train/dpo", "{neurons}");
    assert_eq!(neurons["metrics"]["dpo.verify.residual_max_abs_error"].as_f64(), Some(0.0), "{neurons}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for section in ["Table 3 layout", "| dpo vs sft |", "Knowledge Boundary"] {
        assert!(report.contains(section), "{section} missing:\n{report}");
    }
    let disc = parquet_rows(&out.join("neurons.discrepancy.parquet"));
    assert!(!disc.is_empty() && disc.iter().all(|d| d["base"] == "sft" && d["tuned"] == "dpo"));
    assert!(run.stderr.contains("dpo step 5/5"), "the trainer's progress is followed");
    let _: Value = serde_json::from_str(&std::fs::read_to_string(out.join("neurons/config.json")).unwrap()).unwrap();
    // A forced re-run resumes: the trainer finds both phases finished with the same data and
    // settings (`<out>/train/<phase>.done.json`) and trains nothing again.
    let weights = || std::fs::read(out.join("train/dpo/model.safetensors")).unwrap();
    let before = weights();
    let again = p.synth(&[&["run"][..], &args(&["--force", "--until", "train"])].concat()).ok();
    for phase in ["sft", "dpo"] {
        let said = format!("{phase}: finished earlier with the same data and settings");
        assert!(again.stderr.contains(&said), "{said}: {}", again.stderr);
    }
    assert_eq!(weights(), before);
}
