//! Record-level failures: collected while a stage runs (from any task) and written
//! to `<stage>.failures.parquet` with the record id, an error kind, a message and
//! the offending record as JSON, so nothing is silently dropped.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::atomic::PendingFile;
use super::parquet::ParquetOut;

#[derive(Debug, Clone)]
pub struct Failure {
    pub id: String,
    /// Short machine-readable kind: `parse`, `schema`, `template`, `llm`, `validation`...
    pub kind: String,
    pub message: String,
    /// The input record (JSON) or raw line, when there is one.
    pub record: Option<String>,
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

    pub fn record(&self, id: impl Into<String>, kind: &str, message: impl Into<String>, record: Option<String>) {
        self.push(Failure { id: id.into(), kind: kind.to_string(), message: message.into(), record });
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("failure log poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    ]))
}

/// Write failures (sorted by id for determinism) to a pending Parquet file.
pub fn write_failures(dest: &Path, mut failures: Vec<Failure>, meta: Vec<(String, String)>) -> Result<PendingFile> {
    failures.sort_by(|a, b| a.id.cmp(&b.id).then_with(|| a.kind.cmp(&b.kind)).then_with(|| a.message.cmp(&b.message)));
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
            ],
        )?;
        out.write(&batch)?;
    }
    Ok(out.finish()?.0)
}
