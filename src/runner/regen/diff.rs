//! What changed between two releases, by stable record id: a row index per data export
//! (each row's id and a hash of its content, kept in the snapshot), the diff of two
//! indexes (rows added, removed, changed), and the changelog those diffs make in the card.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use synth_core::data::arrow::array::{Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema};

use synth_core::data;
use synth_core::store::parquet::{ParquetOut, open_reader, read_all};

/// Each row of an export: its id and a 128-bit hash of its content, sorted by id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowIndex {
    pub rows: Vec<(String, String)>,
}

fn hash_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..32].to_string()
}

impl RowIndex {
    fn sorted(mut rows: Vec<(String, String)>) -> RowIndex {
        rows.sort();
        RowIndex { rows }
    }

    /// A Parquet table: each row hashed without its id; ids from its `id` column, or else,
    /// when it has one row per row of `input` (the table it was written from, in order),
    /// that row's id. `None` when neither gives ids.
    pub fn of_parquet(path: &Path, input: Option<&Path>) -> Result<Option<RowIndex>> {
        let reader = open_reader(path, 8192)?;
        let mut ids = Vec::new();
        let mut hashes = Vec::new();
        for batch in reader {
            let batch = batch.with_context(|| format!("reading {}", path.display()))?;
            for i in 0..batch.num_rows() {
                let mut row = data::row_json(&batch, i);
                ids.push(row.remove(data::ID).map(|id| match id {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                }));
                hashes.push(hash_hex(serde_json::to_string(&row)?.as_bytes()));
            }
        }
        Self::keyed(ids, hashes, input)
    }

    /// Rows with their own ids, or keyed by position with the input table's ids.
    fn keyed(ids: Vec<Option<String>>, hashes: Vec<String>, input: Option<&Path>) -> Result<Option<RowIndex>> {
        if ids.iter().all(Option::is_some) {
            return Ok(Some(Self::sorted(ids.into_iter().flatten().zip(hashes).collect())));
        }
        let Some(input) = input.filter(|p| p.exists()) else { return Ok(None) };
        let input_ids = parquet_ids(input)?;
        if input_ids.len() != hashes.len() {
            return Ok(None);
        }
        Ok(Some(Self::sorted(input_ids.into_iter().zip(hashes).collect())))
    }

    /// A JSON Lines export: ids from each line's `"id"`, or else, when the file has one
    /// line per row of `input` (the table it was written from, in order), that row's id.
    /// Each line is hashed as written. `None` when neither gives ids.
    pub fn of_jsonl(path: &Path, input: Option<&Path>) -> Result<Option<RowIndex>> {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut ids = Vec::new();
        let mut hashes = Vec::new();
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.with_context(|| format!("{}:{}", path.display(), n + 1))?;
            if line.trim().is_empty() {
                continue;
            }
            let mut v: serde_json::Value =
                serde_json::from_str(&line).with_context(|| format!("{}:{}: not JSON", path.display(), n + 1))?;
            let id = v.as_object_mut().and_then(|o| o.remove(data::ID)).map(|id| match id {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            });
            ids.push(id);
            hashes.push(hash_hex(v.to_string().as_bytes()));
        }
        Self::keyed(ids, hashes, input)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new(data::ID, DataType::Utf8, false),
            Field::new("hash", DataType::Utf8, false),
        ]));
        let mut out = ParquetOut::create(path, schema.clone(), Vec::new(), false)?;
        for chunk in self.rows.chunks(65_536) {
            let ids = StringArray::from_iter_values(chunk.iter().map(|(i, _)| i.as_str()));
            let hashes = StringArray::from_iter_values(chunk.iter().map(|(_, h)| h.as_str()));
            out.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(hashes)])?)?;
        }
        let (pending, _) = out.finish()?;
        pending.commit()?;
        Ok(())
    }

    pub fn read(path: &Path) -> Result<RowIndex> {
        let (_, batches) = read_all(path)?;
        let mut rows = Vec::new();
        for b in &batches {
            let col = |name: &str| -> Result<StringArray> {
                let c = b.column_by_name(name).with_context(|| format!("{}: no column {name}", path.display()))?;
                Ok(c.as_any().downcast_ref::<StringArray>().context("not text")?.clone())
            };
            let (ids, hashes) = (col(data::ID)?, col("hash")?);
            for i in 0..b.num_rows() {
                rows.push((ids.value(i).to_string(), hashes.value(i).to_string()));
            }
        }
        Ok(Self::sorted(rows))
    }
}

fn parquet_ids(path: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for batch in open_reader(path, 8192)? {
        let batch = batch?;
        let ids = data::ids(&batch);
        out.extend((0..ids.len()).map(|i| ids.value(i).to_string()));
    }
    Ok(out)
}

/// Rows of one export compared with the previous release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffCounts {
    /// Rows in the new release.
    pub rows: u64,
    pub added: u64,
    pub removed: u64,
    pub changed: u64,
    pub unchanged: u64,
}

/// The ids behind a diff (for `synth snapshot diff --ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffIds {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// Compare two indexes (a merge of two sorted lists).
pub fn diff(old: &RowIndex, new: &RowIndex) -> (DiffCounts, DiffIds) {
    let mut counts = DiffCounts { rows: new.rows.len() as u64, ..Default::default() };
    let mut ids = DiffIds::default();
    let (mut i, mut j) = (0, 0);
    let (a, b) = (&old.rows, &new.rows);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                if x.1 == y.1 {
                    counts.unchanged += 1;
                } else {
                    counts.changed += 1;
                    ids.changed.push(y.0.clone());
                }
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                counts.removed += 1;
                ids.removed.push(x.0.clone());
                i += 1;
            }
            (Some(x), None) => {
                counts.removed += 1;
                ids.removed.push(x.0.clone());
                i += 1;
            }
            (_, Some(y)) => {
                counts.added += 1;
                ids.added.push(y.0.clone());
                j += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
    (counts, ids)
}

/// One release in the card's changelog.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangelogEntry {
    pub snapshot: String,
    pub created_at: String,
    /// The snapshot it is compared with (none for the first).
    #[serde(default)]
    pub previous: Option<String>,
    /// What moved upstream (hub commits, files, served models, stages).
    #[serde(default)]
    pub changes: Vec<String>,
    /// Per export file: rows added / removed / changed.
    #[serde(default)]
    pub diff: BTreeMap<String, DiffCounts>,
    /// Exports without a row index (no ids): only their presence is tracked.
    #[serde(default)]
    pub unindexed: Vec<String>,
}

/// The changelog section appended to a card: newest first, at most `max` entries.
pub fn changelog_markdown(entries: &[ChangelogEntry], max: usize) -> String {
    let mut s =
        String::from("\n\n## Changelog\n\nRows are compared by their stable record id with the previous release.\n");
    for e in entries.iter().take(max) {
        s.push_str(&format!("\n### {} ({})\n\n", e.snapshot, e.created_at));
        match &e.previous {
            None => s.push_str("First release.\n"),
            Some(prev) => s.push_str(&format!("Compared with {prev}.\n")),
        }
        if !e.changes.is_empty() {
            s.push_str("\nWhat moved:\n\n");
            for c in &e.changes {
                s.push_str(&format!("- {c}\n"));
            }
        }
        if !e.diff.is_empty() {
            s.push_str("\n| export | rows | added | removed | changed |\n| --- | ---: | ---: | ---: | ---: |\n");
            for (name, d) in &e.diff {
                s.push_str(&format!("| {name} | {} | {} | {} | {} |\n", d.rows, d.added, d.removed, d.changed));
            }
        }
    }
    if entries.len() > max {
        s.push_str(&format!("\n({} older releases are listed in the snapshots' manifests.)\n", entries.len() - max));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(rows: &[(&str, &str)]) -> RowIndex {
        RowIndex::sorted(rows.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn diff_counts_rows_by_id() {
        let old = idx(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]);
        let new = idx(&[("b", "2"), ("c", "9"), ("d", "4"), ("e", "5"), ("f", "6")]);
        let (c, ids) = diff(&old, &new);
        assert_eq!(c, DiffCounts { rows: 5, added: 2, removed: 1, changed: 1, unchanged: 2 });
        assert_eq!(ids.added, vec!["e", "f"]);
        assert_eq!(ids.removed, vec!["a"]);
        assert_eq!(ids.changed, vec!["c"]);
        assert_eq!(diff(&new, &new).0.unchanged, 5);
        assert_eq!(diff(&RowIndex::default(), &new).0.added, 5);
    }

    #[test]
    fn jsonl_ids_come_from_lines_or_the_input_table() {
        let dir = tempfile::tempdir().unwrap();
        let with_ids = dir.path().join("a.jsonl");
        std::fs::write(&with_ids, "{\"id\": \"x\", \"v\": 1}\n{\"id\": \"y\", \"v\": 2}\n").unwrap();
        let i = RowIndex::of_jsonl(&with_ids, None).unwrap().unwrap();
        assert_eq!(i.rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), vec!["x", "y"]);
        // Without ids and without an input table there is nothing to key rows by.
        let no_ids = dir.path().join("b.jsonl");
        std::fs::write(&no_ids, "{\"v\": 1}\n{\"v\": 2}\n").unwrap();
        assert!(RowIndex::of_jsonl(&no_ids, None).unwrap().is_none());
        // The same content under another id is a change of both rows, not of none.
        let swapped = dir.path().join("c.jsonl");
        std::fs::write(&swapped, "{\"id\": \"x\", \"v\": 2}\n{\"id\": \"y\", \"v\": 1}\n").unwrap();
        let j = RowIndex::of_jsonl(&swapped, None).unwrap().unwrap();
        assert_eq!(diff(&i, &j).0.changed, 2);
        let path = dir.path().join("i.parquet");
        i.write(&path).unwrap();
        assert_eq!(RowIndex::read(&path).unwrap(), i);
    }

    #[test]
    fn changelog_lists_newest_first_with_counts() {
        let e = ChangelogEntry {
            snapshot: "2026-01-02-abcd".into(),
            created_at: "2026-01-02T03:00:00Z".into(),
            previous: Some("2026-01-01-0123".into()),
            changes: vec!["src: org/data@main 01234567 → abcdef01".into()],
            diff: BTreeMap::from([(
                "sft.jsonl".to_string(),
                DiffCounts { rows: 10, added: 1, removed: 2, changed: 3, unchanged: 6 },
            )]),
            unindexed: vec![],
        };
        let md = changelog_markdown(&[e], 10);
        assert!(md.contains("## Changelog"), "{md}");
        assert!(md.contains("### 2026-01-02-abcd"), "{md}");
        assert!(md.contains("- src: org/data@main 01234567 → abcdef01"), "{md}");
        assert!(md.contains("| sft.jsonl | 10 | 1 | 2 | 3 |"), "{md}");
    }
}
