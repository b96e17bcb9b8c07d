//! Human review as data: `review.jsonl` in a run's output directory, one JSON object a
//! line, appended to and never rewritten — `{"id", "decision": "keep"|"drop", "note",
//! "reviewer", "time", "stage"}` — the last line for an id is its decision. The next run
//! reads it as an input: stages that apply it drop the records a person dropped (the
//! decisions that drop are part of their fingerprints). A line that cannot be read is an
//! error naming the file and the line; the file is never changed by reading it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The review file's name in an output directory.
pub const FILE: &str = "review.jsonl";

/// Keep or drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Keep,
    Drop,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Keep => "keep",
            Verdict::Drop => "drop",
        }
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub id: String,
    pub decision: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviewer: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// The table the reviewer saw the record in (information; the id decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

/// A line of the review file that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}: {message}", path.display())]
pub struct BadLine {
    pub path: PathBuf,
    pub line: usize,
    pub message: String,
}

/// The decisions of a review file: the last one per id, with the line it is on.
#[derive(Debug, Clone, Default)]
pub struct Review {
    pub path: PathBuf,
    decisions: BTreeMap<String, (Decision, usize)>,
    /// Lines read (decisions, including those a later line overrides).
    pub lines: usize,
}

impl Review {
    /// Read `path` (a missing file is an empty review). Every line is checked; the first
    /// bad one is the error.
    pub fn load(path: &Path) -> Result<Review, BadLine> {
        let mut review = Review { path: path.to_path_buf(), ..Default::default() };
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(review),
            Err(e) => return Err(BadLine { path: path.into(), line: 0, message: format!("cannot read it: {e}") }),
        };
        for (i, raw) in text.split(|b| *b == b'\n').enumerate() {
            let line = i + 1;
            let bad = |message: String| BadLine { path: path.into(), line, message };
            let s = std::str::from_utf8(raw).map_err(|_| bad("not UTF-8".into()))?;
            if s.trim().is_empty() {
                continue;
            }
            let d = parse_line(s).map_err(bad)?;
            review.lines += 1;
            review.decisions.insert(d.id.clone(), (d, line));
        }
        Ok(review)
    }

    /// The decision for `id`, if any.
    pub fn get(&self, id: &str) -> Option<&Decision> {
        self.decisions.get(id).map(|(d, _)| d)
    }

    /// Every current decision, by id.
    pub fn decisions(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.values().map(|(d, _)| d)
    }

    /// Ids whose current decision is to drop.
    pub fn dropped(&self) -> impl Iterator<Item = &Decision> {
        self.decisions().filter(|d| d.decision == Verdict::Drop)
    }

    pub fn is_empty(&self) -> bool {
        self.decisions.is_empty()
    }

    /// A digest of the drop decisions among `ids` (all of them with `None`): what a
    /// stage that applies the review adds to its fingerprint. Notes, reviewers, times and
    /// keep decisions change no output, so they are not in it.
    pub fn drops_digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        for d in self.dropped() {
            h.update(d.id.as_bytes());
            h.update(&[0]);
        }
        h.finalize().to_hex()[..32].to_string()
    }

    /// Counts of the current decisions: (kept, dropped).
    pub fn counts(&self) -> (usize, usize) {
        let dropped = self.dropped().count();
        (self.decisions.len() - dropped, dropped)
    }
}

/// One line as a decision, or what is wrong with it.
pub fn parse_line(s: &str) -> Result<Decision, String> {
    let value: serde_json::Value = serde_json::from_str(s).map_err(|e| format!("not a JSON object: {e}"))?;
    if !value.is_object() {
        return Err(format!("not a JSON object: {}", crate::text::quoted(s)));
    }
    let d: Decision = serde_json::from_value(value).map_err(|e| {
        let e = e.to_string();
        if e.contains("unknown variant") {
            format!("\"decision\" must be \"keep\" or \"drop\" ({e})")
        } else {
            format!("{e} (a line is {{\"id\", \"decision\": \"keep\"|\"drop\", \"note\", \"reviewer\", \"time\", \"stage\"}})")
        }
    })?;
    if d.id.trim().is_empty() {
        return Err("\"id\" is empty".into());
    }
    if let Some(t) = &d.time
        && humantime::parse_rfc3339_weak(t).is_err()
    {
        return Err(format!("\"time\" is not an RFC 3339 time: {t:?}"));
    }
    Ok(d)
}

/// Append decisions to the review file (created when missing): one line each, written
/// with one `write` in append mode and synced, so a reader sees whole lines.
pub fn append(path: &Path, decisions: &[Decision]) -> std::io::Result<()> {
    let mut buf = String::new();
    for d in decisions {
        buf.push_str(&serde_json::to_string(d).expect("serializable"));
        buf.push('\n');
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    // A file a person edited may not end with a line break.
    if f.metadata()?.len() > 0 {
        let text = std::fs::read(path)?;
        if text.last() != Some(&b'\n') {
            buf.insert(0, '\n');
        }
    }
    f.write_all(buf.as_bytes())?;
    f.sync_all()
}

/// The current time in RFC 3339 (seconds, UTC).
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_per_id_decides_and_bad_lines_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert!(Review::load(&path).unwrap().is_empty());
        let d = |id: &str, v: Verdict| Decision {
            id: id.into(),
            decision: v,
            note: Some("generic".into()),
            reviewer: Some("ana".into()),
            time: Some(now()),
            stage: None,
        };
        append(&path, &[d("a", Verdict::Drop), d("b", Verdict::Drop)]).unwrap();
        append(&path, &[d("a", Verdict::Keep)]).unwrap();
        let r = Review::load(&path).unwrap();
        assert_eq!(r.counts(), (1, 1));
        assert_eq!(r.get("a").unwrap().decision, Verdict::Keep);
        assert_eq!(r.dropped().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["b"]);
        let digest = r.drops_digest();
        // A note or a keep changes no digest.
        append(&path, &[d("c", Verdict::Keep)]).unwrap();
        assert_eq!(Review::load(&path).unwrap().drops_digest(), digest);
        for (line, msg) in [
            ("{\"id\": \"x\", \"decision\": \"maybe\"}", "\"keep\" or \"drop\""),
            ("not json", "not a JSON object"),
            ("[1]", "not a JSON object"),
            ("{\"id\": \"x\"}", "missing field `decision`"),
            ("{\"id\": \"\", \"decision\": \"drop\"}", "\"id\" is empty"),
            ("{\"id\": \"x\", \"decision\": \"drop\", \"tim\": \"x\"}", "unknown field `tim`"),
            ("{\"id\": \"x\", \"decision\": \"drop\", \"time\": \"yesterday\"}", "RFC 3339"),
        ] {
            std::fs::write(&path, format!("{}\n\n{line}\n", serde_json::to_string(&d("a", Verdict::Drop)).unwrap()))
                .unwrap();
            let e = Review::load(&path).unwrap_err();
            assert_eq!(e.line, 3, "{line}");
            assert!(e.to_string().contains(msg), "{e} ({line})");
            assert!(e.to_string().starts_with(&format!("{}:3: ", path.display())), "{e}");
        }
        // A hand-edited file without a final line break gets one before the next line.
        std::fs::write(&path, "{\"id\": \"a\", \"decision\": \"drop\"}").unwrap();
        append(&path, &[d("b", Verdict::Drop)]).unwrap();
        assert_eq!(Review::load(&path).unwrap().counts(), (0, 2));
    }
}
