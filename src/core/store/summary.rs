//! The summary protocol: the one contract between evaluation stages and `report`.
//! An evaluation stage writes `<stage>.summary.parquet` beside its output, rows of
//! [`SummaryRow`] (model label × table × group × metric, with the headings to show);
//! `report` renders any summary without knowing which stage or method wrote it.
//!
//! Columns (in this order): `label`, `table`, `title`, `group`, `metric`, `heading`,
//! `n` (u64), `value` (f64), `std` (f64, null when not defined), `invalid` (u64:
//! records that could not be scored and count as 0 or were left out, e.g. a bad judge
//! answer). Rows of a table keep the writer's order: `report` shows metrics in the
//! order they first appear. `group` is [`OVERALL`] for the whole input; other values
//! are a breakdown (a `group_by` column's values).

use std::path::Path;
use std::sync::Arc;

use crate::data::arrow::array::{Array, AsArray, Float64Array, RecordBatch, StringArray, UInt64Array};
use crate::data::arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef, UInt64Type};
use anyhow::{Context, Result, anyhow, bail};

/// The group of a row that covers the whole input.
pub const OVERALL: &str = "overall";

/// One number of a summary.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// What was evaluated (a model or candidate).
    pub label: String,
    /// Which table of the report it belongs to (e.g. `metrics`, `judge`).
    pub table: String,
    /// The table's heading in the report.
    pub title: String,
    /// [`OVERALL`] or a breakdown value.
    pub group: String,
    pub metric: String,
    /// The metric's column heading in the report.
    pub heading: String,
    pub n: u64,
    pub value: f64,
    pub std: Option<f64>,
    pub invalid: u64,
}

/// File name of a stage's summary, beside its output.
pub fn file_name(stage: &str) -> String {
    format!("{stage}.summary.parquet")
}

pub fn schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        s("label"),
        s("table"),
        s("title"),
        s("group"),
        s("metric"),
        s("heading"),
        Field::new("n", DataType::UInt64, false),
        Field::new("value", DataType::Float64, false),
        Field::new("std", DataType::Float64, true),
        Field::new("invalid", DataType::UInt64, false),
    ]))
}

/// The rows as one Arrow batch of [`schema`].
pub fn to_batch(rows: &[SummaryRow]) -> Result<RecordBatch> {
    let text =
        |f: fn(&SummaryRow) -> &str| Arc::new(StringArray::from_iter_values(rows.iter().map(f))) as Arc<dyn Array>;
    Ok(RecordBatch::try_new(
        schema(),
        vec![
            text(|r| &r.label),
            text(|r| &r.table),
            text(|r| &r.title),
            text(|r| &r.group),
            text(|r| &r.metric),
            text(|r| &r.heading),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.n))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.value))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.std))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.invalid))),
        ],
    )?)
}

/// Read a summary file; a file that is not a summary is named with what it lacks.
pub fn read(path: &Path) -> Result<Vec<SummaryRow>> {
    let (file_schema, batches) =
        super::parquet::read_all(path).with_context(|| format!("reading {}", path.display()))?;
    for f in schema().fields() {
        match file_schema.field_with_name(f.name()) {
            Ok(g) if g.data_type() == f.data_type() => {}
            Ok(g) => {
                bail!("{}: column \"{}\" is {}, expected {}", path.display(), f.name(), g.data_type(), f.data_type())
            }
            Err(_) => bail!(
                "{} is not a summary: no column \"{}\" (a summary has: {})",
                path.display(),
                f.name(),
                schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    let mut out = Vec::new();
    for b in &batches {
        let col = |n: &str| b.column_by_name(n).ok_or_else(|| anyhow!("no column {n}"));
        let s = |n: &str| -> Result<StringArray> { Ok(col(n)?.as_string::<i32>().clone()) };
        let (label, table, title, group, metric, heading) =
            (s("label")?, s("table")?, s("title")?, s("group")?, s("metric")?, s("heading")?);
        let n = col("n")?.as_primitive::<UInt64Type>().clone();
        let value = col("value")?.as_primitive::<Float64Type>().clone();
        let std = col("std")?.as_primitive::<Float64Type>().clone();
        let invalid = col("invalid")?.as_primitive::<UInt64Type>().clone();
        for i in 0..b.num_rows() {
            out.push(SummaryRow {
                label: label.value(i).to_string(),
                table: table.value(i).to_string(),
                title: title.value(i).to_string(),
                group: group.value(i).to_string(),
                metric: metric.value(i).to_string(),
                heading: heading.value(i).to_string(),
                n: n.value(i),
                value: value.value(i),
                std: std.is_valid(i).then(|| std.value(i)),
                invalid: invalid.value(i),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let rows = vec![
            SummaryRow {
                label: "m".into(),
                table: "judge".into(),
                title: "LLM-as-judge".into(),
                group: OVERALL.into(),
                metric: "style".into(),
                heading: "Style".into(),
                n: 3,
                value: 2.0 / 3.0,
                std: None,
                invalid: 1,
            },
            SummaryRow { std: Some(0.5), group: "task a".into(), ..rows_one() },
        ];
        fn rows_one() -> SummaryRow {
            SummaryRow {
                label: "m".into(),
                table: "metrics".into(),
                title: "t".into(),
                group: OVERALL.into(),
                metric: "bleu".into(),
                heading: "BLEU".into(),
                n: 2,
                value: 0.25,
                std: None,
                invalid: 0,
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.summary.parquet");
        let batch = to_batch(&rows).unwrap();
        let mut w = super::super::parquet::ParquetOut::create(&path, batch.schema(), vec![], false).unwrap();
        w.write(&batch).unwrap();
        let (pending, _) = w.finish().unwrap();
        pending.commit().unwrap();
        assert_eq!(read(&path).unwrap(), rows);
    }
}
