//! Stage fingerprints: hash(kind + version, options that affect output, seed when
//! the kind is random, effective `--limit` for sources, input fingerprints in order,
//! content hashes of the files the stage reads, extra resolved facts such as a hub
//! commit). A stage whose fingerprint matches its committed outputs is up to date.

use std::collections::BTreeMap;

use crate::pipeline::StageDecl;
use synth_core::config::options::fingerprint_view;
use synth_core::store::state::FingerprintParts;
use synth_engine::stages::{COMMON_OPTIONS, Role};

/// Canonical JSON (object keys sorted) for hashing.
fn canonical(v: &serde_json::Value) -> String {
    fn sort(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let sorted: BTreeMap<&String, serde_json::Value> = m.iter().map(|(k, v)| (k, sort(v))).collect();
                serde_json::Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

fn hash_str(s: &str) -> String {
    blake3::hash(s.as_bytes()).to_hex()[..32].to_string()
}

/// The parts of a stage's fingerprint that do not depend on other stages or files.
pub fn config_part(decl: &StageDecl, seed: u64, limit: Option<u64>) -> String {
    let own: serde_json::Value = match &decl.options {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .filter(|(k, _)| !COMMON_OPTIONS.iter().any(|c| c.name == k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    };
    let mut doc = serde_json::json!({
        "kind": decl.kind.name,
        "version": decl.kind.version,
        "options": fingerprint_view(decl.kind.options, &own),
        "inputs": decl.inputs,
    });
    if decl.kind.uses_seed {
        doc["seed"] = seed.into();
    }
    if decl.kind.role == Role::Source
        && let Some(l) = limit
    {
        doc["limit"] = l.into();
    }
    hash_str(&canonical(&doc))
}

/// Combine the parts into the fingerprint.
pub fn combine(parts: &FingerprintParts) -> String {
    let doc = serde_json::to_value(parts).expect("serializable");
    hash_str(&canonical(&doc))
}

/// Why a stage must run, comparing with the parts recorded at its last commit.
pub fn explain(old: Option<&FingerprintParts>, new: &FingerprintParts) -> String {
    let Some(old) = old else {
        return "not built yet".into();
    };
    if old.kind != new.kind {
        return "stage kind changed".into();
    }
    if old.config != new.config {
        return "configuration changed".into();
    }
    for (name, fp) in &new.inputs {
        if old.inputs.get(name) != Some(fp) {
            return format!("input \"{name}\" changed");
        }
    }
    if old.inputs.len() != new.inputs.len() {
        return "inputs changed".into();
    }
    for (file, h) in &new.files {
        if old.files.get(file) != Some(h) {
            return format!("file {file} changed");
        }
    }
    if old.files.len() != new.files.len() {
        return "set of input files changed".into();
    }
    if old.extra != new.extra {
        let changed: Vec<&String> = new.extra.keys().filter(|k| old.extra.get(*k) != new.extra.get(*k)).collect();
        return format!("{} changed", changed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
    }
    "outputs missing or modified".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_sorts_keys() {
        let a = serde_json::json!({"b": 1, "a": {"d": 2, "c": [3, {"z": 1, "y": 2}]}});
        assert_eq!(canonical(&a), r#"{"a":{"c":[3,{"y":2,"z":1}],"d":2},"b":1}"#);
    }

    #[test]
    fn explain_names_the_change() {
        let mut old = FingerprintParts { kind: "map@1".into(), config: "x".into(), ..Default::default() };
        old.inputs.insert("a".into(), "1".into());
        let mut new = old.clone();
        new.inputs.insert("a".into(), "2".into());
        assert_eq!(explain(Some(&old), &new), "input \"a\" changed");
        assert_eq!(explain(None, &new), "not built yet");
    }
}
