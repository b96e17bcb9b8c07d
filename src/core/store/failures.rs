//! Record-level failures: collected while a stage runs (from any task) and written
//! to `<stage>.failures.parquet` with the record id, an error kind, a message and
//! the offending record as JSON, so nothing is silently dropped.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::data::arrow::array::{RecordBatch, StringArray};
use crate::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use anyhow::Result;

use super::atomic::PendingFile;
use super::parquet::ParquetOut;

/// The `kind` column of every `*.failures.parquet`: why a record failed. The strings
/// ([`FailureKind::as_str`]) are a user-visible contract, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// A source line or value that cannot be read (not JSON, not UTF-8, a bad CSV row).
    Parse,
    /// A record that does not fit the columns (a value of the wrong type, a missing column).
    Schema,
    /// A template or prompt that does not render for this record.
    Template,
    /// A filter or map expression that fails on this record.
    Expression,
    /// A record an LLM stage cannot use as input (e.g. not a message list).
    Input,
    /// The provider call failed (after the retries of the rate layer).
    Llm,
    /// Every answer failed its parser (after `max_attempts`).
    Validation,
    /// A record that misses a part another stage should have produced.
    Incomplete,
    /// A record a sink cannot write in its layout.
    Export,
    /// A record that cannot be converted (wrong shape for the kind).
    BadRecord,
    /// A row for which a judge query cannot be planned (no task entry, prompt does not render).
    JudgePlan,
    /// A preference pair whose chosen and rejected texts are the same (after whitespace
    /// normalization, or above a configured similarity): it would teach nothing.
    DegeneratePair,
    /// A record that failed a content check (`check` names it) after its re-asks.
    Check,
    /// A near-duplicate of an earlier record (a `dedup` stage).
    Duplicate,
    /// A record a person dropped (the review file).
    Review,
}

impl FailureKind {
    pub const ALL: &[FailureKind] = &[
        FailureKind::Parse,
        FailureKind::Schema,
        FailureKind::Template,
        FailureKind::Expression,
        FailureKind::Input,
        FailureKind::Llm,
        FailureKind::Validation,
        FailureKind::Incomplete,
        FailureKind::Export,
        FailureKind::BadRecord,
        FailureKind::JudgePlan,
        FailureKind::DegeneratePair,
        FailureKind::Check,
        FailureKind::Duplicate,
        FailureKind::Review,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Parse => "parse",
            FailureKind::Schema => "schema",
            FailureKind::Template => "template",
            FailureKind::Expression => "expression",
            FailureKind::Input => "input",
            FailureKind::Llm => "llm",
            FailureKind::Validation => "validation",
            FailureKind::Incomplete => "incomplete",
            FailureKind::Export => "export",
            FailureKind::BadRecord => "bad_record",
            FailureKind::JudgePlan => "judge_plan",
            FailureKind::DegeneratePair => "degenerate_pair",
            FailureKind::Check => "check",
            FailureKind::Duplicate => "duplicate",
            FailureKind::Review => "review",
        }
    }
}

impl FailureKind {
    /// The kind spelled `name` ([`FailureKind::as_str`]), if it is one.
    pub fn parse(name: &str) -> Option<FailureKind> {
        FailureKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub id: String,
    pub kind: FailureKind,
    pub message: String,
    /// The input record (JSON) or raw line, when there is one.
    pub record: Option<String>,
    /// A model stage's last answer, as the model wrote it (`raw` column).
    pub raw: Option<String>,
    /// A model stage's reason for each answer it did not accept, in order (`attempts`).
    pub attempts: Vec<String>,
    /// The content check (or `dedup` / review stage) that dropped the record (`check`).
    pub check: Option<String>,
}

impl Failure {
    /// A failure without a model's answers.
    pub fn new(
        id: impl Into<String>,
        kind: FailureKind,
        message: impl Into<String>,
        record: Option<String>,
    ) -> Failure {
        Failure { id: id.into(), kind, message: message.into(), record, raw: None, attempts: Vec::new(), check: None }
    }
}

/// `text` on one line (newlines and tabs as spaces), cut to `max` characters with "…".
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Thread-safe failure collector shared by a stage's tasks.
#[derive(Clone, Default)]
pub struct FailureLog {
    inner: Arc<Mutex<Vec<Failure>>>,
}

impl FailureLog {
    pub fn push(&self, failure: Failure) {
        self.inner.lock().expect("failure log poisoned").push(failure);
    }

    pub fn record(&self, id: impl Into<String>, kind: FailureKind, message: impl Into<String>, record: Option<String>) {
        self.push(Failure::new(id, kind, message, record));
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("failure log poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids of the failures recorded after the first `n`.
    pub fn ids_since(&self, n: usize) -> std::collections::HashSet<String> {
        self.inner.lock().expect("failure log poisoned").iter().skip(n).map(|f| f.id.clone()).collect()
    }

    pub fn first(&self) -> Option<Failure> {
        self.inner.lock().expect("failure log poisoned").first().cloned()
    }

    pub fn take(&self) -> Vec<Failure> {
        std::mem::take(&mut *self.inner.lock().expect("failure log poisoned"))
    }
}

pub fn failures_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("message", DataType::Utf8, false),
        Field::new("record", DataType::Utf8, true),
        Field::new("raw", DataType::Utf8, true),
        Field::new("attempts", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
        Field::new("check", DataType::Utf8, true),
    ]))
}

/// Read a failure table written by [`write_failures`] (a cached stage's, a shard's part to
/// be merged): its rows and its footer metadata (which carries the fingerprint of the run
/// that wrote it).
pub fn read_failures(path: &Path) -> Result<(Vec<Failure>, std::collections::HashMap<String, String>)> {
    use crate::data::arrow::array::{Array, AsArray};
    let meta = super::parquet::read_footer(path)?.meta;
    let (_, batches) = super::parquet::read_all(path)?;
    let mut out = Vec::new();
    for b in &batches {
        let col = |n: &str| {
            b.column_by_name(n)
                .map(|c| c.as_string::<i32>().clone())
                .ok_or_else(|| anyhow::anyhow!("{}: not a failure table (no column \"{n}\")", path.display()))
        };
        let (id, kind, message, record) = (col("id")?, col("kind")?, col("message")?, col("record")?);
        // Tables written before the model's answers were kept have no `raw` / `attempts`.
        let raw = b.column_by_name("raw").map(|c| c.as_string::<i32>().clone());
        let attempts = b.column_by_name("attempts").and_then(|c| c.as_list_opt::<i32>().cloned());
        // Tables written before content checks have no `check`.
        let check = b.column_by_name("check").map(|c| c.as_string::<i32>().clone());
        for i in 0..b.num_rows() {
            let k = FailureKind::parse(kind.value(i))
                .ok_or_else(|| anyhow::anyhow!("{}: unknown failure kind \"{}\"", path.display(), kind.value(i)))?;
            out.push(Failure {
                id: id.value(i).to_string(),
                kind: k,
                message: message.value(i).to_string(),
                record: record.is_valid(i).then(|| record.value(i).to_string()),
                raw: raw.as_ref().filter(|r| r.is_valid(i)).map(|r| r.value(i).to_string()),
                attempts: match &attempts {
                    Some(list) if list.is_valid(i) => {
                        let items = list.value(i);
                        let items = items.as_string::<i32>();
                        (0..items.len()).map(|j| items.value(j).to_string()).collect()
                    }
                    _ => Vec::new(),
                },
                check: check.as_ref().filter(|c| c.is_valid(i)).map(|c| c.value(i).to_string()),
            });
        }
    }
    Ok((out, meta))
}

/// Write failures (sorted by id for determinism) to a pending Parquet file.
pub fn write_failures(dest: &Path, mut failures: Vec<Failure>, meta: Vec<(String, String)>) -> Result<PendingFile> {
    failures.sort_by(|a, b| {
        a.id.cmp(&b.id).then_with(|| a.kind.as_str().cmp(b.kind.as_str())).then_with(|| a.message.cmp(&b.message))
    });
    let schema = failures_schema();
    let mut out = ParquetOut::create(dest, schema.clone(), meta, false)?;
    for chunk in failures.chunks(8192) {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(chunk.iter().map(|f| f.id.as_str()))),
                Arc::new(StringArray::from_iter_values(chunk.iter().map(|f| f.kind.as_str()))),
                Arc::new(StringArray::from_iter_values(chunk.iter().map(|f| f.message.as_str()))),
                Arc::new(StringArray::from_iter(chunk.iter().map(|f| f.record.as_deref()))),
                Arc::new(StringArray::from_iter(chunk.iter().map(|f| f.raw.as_deref()))),
                Arc::new(attempts_array(chunk)),
                Arc::new(StringArray::from_iter(chunk.iter().map(|f| f.check.as_deref()))),
            ],
        )?;
        out.write(&batch)?;
    }
    Ok(out.finish()?.0)
}

/// The `attempts` column: null for a failure without a model's answers.
fn attempts_array(chunk: &[Failure]) -> crate::data::arrow::array::ListArray {
    let mut b = crate::data::arrow::array::ListBuilder::new(crate::data::arrow::array::StringBuilder::new())
        .with_field(Arc::new(Field::new("item", DataType::Utf8, true)));
    for f in chunk {
        if f.attempts.is_empty() && f.raw.is_none() {
            b.append_null();
        } else {
            for a in &f.attempts {
                b.values().append_value(a);
            }
            b.append(true);
        }
    }
    b.finish()
}
