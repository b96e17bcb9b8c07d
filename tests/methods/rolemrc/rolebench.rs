//! RoleBench cross-evaluation (RoleMRC Table 4, `pipelines/rolebench-eval.toml`): the
//! demo files in RoleBench's layout through the offline candidate, the system prompt
//! from the role's description, the reference, ROUGE as `evaluate_rouge` computes it
//! (live against rouge_score when SYNTH_EVAL_PYTHON is set), the Table 4 report layout;
//! the same files from a (fake) hub; bad lines and files named.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use support::{Project, parquet_rows, repo};

fn demo() -> std::path::PathBuf {
    repo().join("pipelines/data/rolebench-demo")
}

fn pipeline() -> String {
    repo().join("pipelines/rolebench-eval.toml").to_string_lossy().to_string()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The summary rows of a metrics stage: metric → (n, mean, std).
fn summary(dir: &Path, stage: &str) -> BTreeMap<String, (u64, f64, f64)> {
    parquet_rows(&dir.join(format!("{stage}.summary.parquet")))
        .into_iter()
        .filter(|r| r["group"] == "overall")
        .map(|r| {
            let m = r["metric"].as_str().unwrap().to_string();
            (m, (r["n"].as_u64().unwrap(), r["value"].as_f64().unwrap(), r["std"].as_f64().unwrap()))
        })
        .collect()
}

#[test]
fn rolebench_cross_evaluation_in_the_table_4_layout() {
    let p = Project::new();
    let out = p.path().join("rb");
    p.synth(&["run", &pipeline(), "--offline", "--out", out.to_str().unwrap()]).ok();

    // The rows: every test line of both sets, the official message layout.
    let rows = parquet_rows(&out.join("rolebench.parquet"));
    let desc: BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(demo().join("profiles-eng/desc.json")).unwrap()).unwrap();
    let mut per_set: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *per_set.entry(r["split"].as_str().unwrap()).or_default() += 1;
        let (file, line) = (r["file"].as_str().unwrap(), r["line"].as_u64().unwrap() as usize);
        let src = jsonl(&demo().join(file));
        let orig = &src[line - 1];
        let role = orig["role"].as_str().unwrap();
        assert_eq!(r["reference"], orig["generated"][0], "the reference is generated[0]");
        let system = format!(
            "You are {role}, your description is: {}. Now please answer some questions to accurately show your personality traits!",
            desc[role]
        );
        let q = r["question"].as_array().unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[0]["role"], "System");
        assert!(q[0]["content"].as_str().unwrap().starts_with(&system), "{}", q[0]["content"]);
        assert!(q[0]["content"].as_str().unwrap().ends_with("when speaking."), "trimmed: {}", q[0]["content"]);
        assert_eq!(q[1], serde_json::json!({"role": "User", "content": orig["question"]}));
    }
    assert_eq!(per_set, BTreeMap::from([("RoleBenchInstEng", 16), ("RoleBenchRoleEng", 12)]));

    // ROUGE only, per set, as evaluate_rouge: score(response, reference), mean and population std.
    let inst = summary(&out, "inst_rouge");
    let role = summary(&out, "role_rouge");
    let names: Vec<&str> = inst.keys().map(String::as_str).collect();
    assert_eq!(names, ["InstEng rouge1", "InstEng rouge2", "InstEng rougeL", "InstEng rougeLsum"]);
    assert!(inst.values().all(|(n, _, _)| *n == 16) && role.values().all(|(n, _, _)| *n == 12));
    assert!(inst["InstEng rouge1"].1 > 0.0, "{inst:?}");
    if let Ok(python) = std::env::var("SYNTH_EVAL_PYTHON") {
        for (set, stage, prefix, want) in
            [("inst", "inst_rouge", "InstEng ", &inst), ("role", "role_rouge", "RoleEng ", &role)]
        {
            let pairs = p.path().join(format!("{set}.jsonl"));
            let text: String = parquet_rows(&out.join(format!("{set}.parquet")))
                .iter()
                .map(|r| serde_json::json!({"response": r["response"], "reference": r["reference"]}).to_string() + "\n")
                .collect();
            std::fs::write(&pairs, text).unwrap();
            let script = repo().join("tests/fixtures/rolemrc/rolebench_rouge.py");
            let o = std::process::Command::new(&python).arg(&script).arg(&pairs).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let official: Value = serde_json::from_slice(&o.stdout).unwrap();
            for m in ["rouge1", "rouge2", "rougeL", "rougeLsum"] {
                let (_, mean, std) = want[&format!("{prefix}{m}")];
                let (om, os) = (official[m]["mean"].as_f64().unwrap(), official[m]["std_dev"].as_f64().unwrap());
                assert!(
                    (mean - om).abs() < 1e-12 && (std - os).abs() < 1e-12,
                    "{stage} {m}: {mean} {std} vs {om} {os}"
                );
            }
        }
    } else {
        eprintln!("SKIPPED the live rouge_score comparison: SYNTH_EVAL_PYTHON is not set (.ci/test sets it)");
    }

    // The report: one table, a row per model, both sets side by side (Table 4).
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains(
            "| Model | InstEng ROUGE-1 | InstEng ROUGE-2 | InstEng ROUGE-L | InstEng ROUGE-Lsum | RoleEng ROUGE-1 | RoleEng ROUGE-2 | RoleEng ROUGE-L | RoleEng ROUGE-Lsum |"
        ),
        "{report}"
    );
    let row = report.lines().find(|l| l.starts_with("| candidate |")).unwrap();
    assert!(row.contains(&format!("{:.4}", inst["InstEng rouge1"].1)), "{row}");
    assert!(row.contains(&format!("{:.4}", role["RoleEng rougeLsum"].1)), "{row}");
    assert!(report.contains("| candidate | role_specific |"), "breakdown by subset: {report}");
    // Same config, same bytes.
    let again = p.path().join("rb2");
    p.synth(&["run", &pipeline(), "--offline", "--out", again.to_str().unwrap()]).ok();
    support::assert_same_outputs(&out, &again);
}

#[test]
fn rolebench_from_a_hub_repository_and_bad_lines() {
    // The demo files served by a fake hub in RoleBench's layout.
    let mut files = BTreeMap::new();
    let mut stack = vec![demo()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "jsonl" || x == "json") {
                let rel = path.strip_prefix(demo()).unwrap().to_string_lossy().replace('\\', "/");
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let hub = std::sync::Arc::new(crate::hub::Hub {
        files: BTreeMap::from([("ZenMoore/RoleBench".to_string(), files)]),
        ..Default::default()
    });
    let (url, _stop) = crate::hub::serve(hub.clone());
    let p = Project::new();
    // A local copy with a bad line, a role without description and a line without answers.
    let local = p.path().join("local");
    for set in ["instruction-generalization", "role-generalization"] {
        for sub in ["general", "role_specific"] {
            let rel = format!("rolebench-eng/{set}/{sub}/test.jsonl");
            let mut text = std::fs::read_to_string(demo().join(&rel)).unwrap();
            if set == "role-generalization" && sub == "general" {
                text.push_str("{not json\n");
                text.push_str("{\"role\": \"Nobody\", \"question\": \"Hi?\", \"generated\": [\"Hello.\"]}\n");
                text.push_str("{\"role\": \"Gorrin Stonehand\", \"question\": \"Hi?\", \"generated\": []}\n");
            }
            std::fs::create_dir_all(local.join(&rel).parent().unwrap()).unwrap();
            std::fs::write(local.join(&rel), text).unwrap();
        }
    }
    std::fs::create_dir_all(local.join("profiles-eng")).unwrap();
    std::fs::copy(demo().join("profiles-eng/desc.json"), local.join("profiles-eng/desc.json")).unwrap();
    let template = repo().join("pipelines/prompts/rolemrc/rolebench/system.j2");
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
output_dir = "out"

[stages.from_hub]
kind = "rolemrc_rolebench"
hf = {{ repo = "ZenMoore/RoleBench", endpoint = "{url}", cache_dir = "hf-cache" }}
system_template = "{template}"

[stages.local]
kind = "rolemrc_rolebench"
path = "local"
system_template = "{template}"
max_failure_ratio = 0.2
"#,
            template = template.display()
        ),
    );
    p.synth(&["run", "p.toml"]).ok();
    let (a, b) =
        (parquet_rows(&p.path().join("out/from_hub.parquet")), parquet_rows(&p.path().join("out/local.parquet")));
    assert_eq!(a.len(), 28);
    assert_eq!(a, b, "the hub and the local copy give the same rows");
    let state: Value =
        serde_json::from_slice(&std::fs::read(p.path().join("out/_synth/state/from_hub.json")).unwrap()).unwrap();
    assert_eq!(state["parts"]["extra"]["hf.commit"], "0123456789abcdef0123456789abcdef01234567", "{state}");
    let downloads = hub.downloads.lock().unwrap().clone();
    assert_eq!(downloads.len(), 5, "desc.json and the four test files: {downloads:?}");
    assert!(!downloads.iter().any(|d| d.ends_with("train.jsonl")));

    // Bad lines go to the failures with file:line; the others are kept.
    let failures = support::failures(&p.path().join("out"), "local");
    let msgs: Vec<String> = failures
        .iter()
        .map(|f| format!("{}: {}", f["kind"].as_str().unwrap(), f["message"].as_str().unwrap()))
        .collect();
    let file = "rolebench-eng/role-generalization/general/test.jsonl";
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    for want in [
        format!("parse: {file}:9: not JSON"),
        format!("bad_record: {file}:10: role \"Nobody\" has no description in profiles-eng/desc.json"),
        format!("bad_record: {file}:11: field \"generated\": 0 answer(s)"),
    ] {
        assert!(msgs.iter().any(|m| m.starts_with(&want)), "{want} not in {msgs:?}");
    }

    // A missing file stops the stage naming it.
    std::fs::remove_file(local.join("rolebench-eng/role-generalization/role_specific/test.jsonl")).unwrap();
    let run = p.synth(&["run", "p.toml", "--only", "local"]).code(2);
    assert!(run.stderr.contains("role-generalization/role_specific/test.jsonl is missing"), "{}", run.stderr);
}
