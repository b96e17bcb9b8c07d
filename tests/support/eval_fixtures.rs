//! The evaluation parity fixtures (`tests/fixtures/eval/`): paths, JSONL reading with
//! file:line errors, and the (response, reference) pairs.

use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval")
}

/// Every non-empty line of a JSONL file as JSON (panics naming file and line).
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1)))
        .collect()
}

pub struct Pair {
    pub id: String,
    pub response: String,
    pub reference: String,
}

/// The pairs of a pairs file (`{"id", "response", "reference"}` per line).
pub fn pairs_from(path: &Path) -> Vec<Pair> {
    read_jsonl(path)
        .into_iter()
        .map(|v| Pair {
            id: v["id"].as_str().expect("id").to_string(),
            response: v["response"].as_str().expect("response").to_string(),
            reference: v["reference"].as_str().expect("reference").to_string(),
        })
        .collect()
}

/// The shared fixture `pairs.jsonl`.
pub fn pairs() -> Vec<Pair> {
    pairs_from(&fixtures().join("pairs.jsonl"))
}

/// Whether WordNet 3.0 is at `/usr/share/wordnet` (Debian's wordnet-base), saying why the
/// METEOR checks are skipped when it is not.
pub fn wordnet_installed() -> bool {
    let ok = Path::new("/usr/share/wordnet/data.noun").exists();
    if !ok {
        eprintln!(
            "skipping METEOR checks: /usr/share/wordnet is absent (run .ci/setup as root to install wordnet-base)"
        );
    }
    ok
}
