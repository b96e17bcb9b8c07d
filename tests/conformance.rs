//! Conformance of every registered stage kind (vector's `test_generate_config`): its
//! [`KindInfo::example`] — the simplest form of its options — must pass `synth
//! validate`'s checks, so no kind can be registered that rejects its own example.
//! The example runs in a pipeline rooted at the repository with inputs whose columns
//! are unknown at plan time (a hub source: no network at validation), an offline
//! provider `p` and a hashing embedder `e`. An example that starts with `inputs = [...]`
//! names its own inputs and may add their stage tables after its keys (`report` reads
//! only stages that write a summary).

use synth::pipeline::{LoadOptions, load};
use synth::stages::{Arity, KindInfo};

fn pipeline_for(kind: &KindInfo) -> String {
    let n = match kind.arity {
        Arity::None => 0,
        Arity::Exactly(n) | Arity::AtLeast(n) => n,
    };
    let inputs: Vec<String> = (0..n).map(|i| format!("\"in{i}\"")).collect();
    let mut text = String::from(
        "[pipeline]\nname = \"conformance\"\nroot = \"REPO\"\n\n[providers.p]\nkind = \"offline\"\n\n[embedders.e]\nkind = \"hashing\"\n\n",
    );
    for i in 0..n {
        text.push_str(&format!("[stages.in{i}]\nkind = \"source\"\nhf = {{ repo = \"conformance/in{i}\" }}\n\n"));
    }
    text.push_str(&format!("[stages.x]\nkind = \"{}\"\n", kind.name));
    // An example may name its own inputs and add the stages they are (after its keys).
    if n > 0 && !kind.example.starts_with("inputs") {
        text.push_str(&format!("inputs = [{}]\n", inputs.join(", ")));
    }
    text.push_str(kind.example);
    text.push('\n');
    text
}

#[test]
fn every_registered_kind_validates_its_example() {
    let repo = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let registry = synth::registry::builtin();
    assert!(registry.kinds.len() >= 23, "{} kinds", registry.kinds.len());
    for kind in &registry.kinds {
        let path = dir.path().join(format!("{}.toml", kind.name));
        std::fs::write(&path, pipeline_for(kind).replace("REPO", repo)).unwrap();
        let (pipeline, diags) = load(&path, &LoadOptions::default());
        if pipeline.is_none() || diags.has_errors() {
            failures.push(format!("{}:\n{diags}", kind.name));
        }
    }
    assert!(failures.is_empty(), "kinds whose example does not validate:\n{}", failures.join("\n"));
}

#[test]
fn a_kind_whose_example_is_wrong_is_caught() {
    // The check can fail: a kind with a required option and an empty example does not validate.
    let repo = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    let filter = synth::registry::builtin().kind("filter").unwrap();
    let broken = KindInfo { example: "", ..*filter };
    let path = dir.path().join("broken.toml");
    std::fs::write(&path, pipeline_for(&broken).replace("REPO", repo)).unwrap();
    let (_, diags) = load(&path, &LoadOptions::default());
    assert!(diags.has_errors(), "an empty filter validated");
    assert!(diags.to_string().contains("where"), "{}", diags.to_string());
}

#[test]
fn registry_names_are_unique_and_grouped_by_method() {
    let r = synth::registry::builtin();
    assert_eq!(r.duplicates(), Vec::<String>::new());
    for m in &r.methods {
        for k in m.kinds {
            assert_eq!(r.method_of(k.name).map(|x| x.name), Some(m.name), "{}", k.name);
        }
    }
    for k in synth::kinds::KINDS {
        assert!(r.method_of(k.name).is_none(), "engine kind {} claimed by a method", k.name);
    }
}
