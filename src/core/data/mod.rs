//! Records in memory: Arrow record batches whose first column is the string record
//! id (`id`), plus conversions between Arrow rows and JSON objects for stages that
//! work record by record (templates, LLM calls, JSONL).

use std::sync::Arc;

pub mod arrow;
pub mod chat;
pub mod python;

use crate::data::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use crate::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use crate::data::arrow::error::ArrowError;
use serde_json::{Map, Value};

/// Name of the record id column, always first, always non-null Utf8.
pub const ID: &str = "id";

/// A JSON object row.
pub type Row = Map<String, Value>;

/// What a JSON value is, as an error message says it: "a string", "an array", "null".
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub fn id_field() -> Field {
    Field::new(ID, DataType::Utf8, false)
}

/// The id column of a batch produced by synth (first column, Utf8).
pub fn ids(batch: &RecordBatch) -> &StringArray {
    batch.column(0).as_string::<i32>()
}

/// A schema with `id` first followed by `fields`.
pub fn schema_with_id(fields: impl IntoIterator<Item = Field>) -> SchemaRef {
    let mut all = vec![id_field()];
    all.extend(fields.into_iter().filter(|f| f.name() != ID));
    Arc::new(Schema::new(all))
}

/// Parse a type name used in configs (`"utf8"`, `"int64"`, `"float64"`, `"bool"`, `"json"`).
/// `json` is stored as a Utf8 column holding JSON text.
pub fn parse_type_name(name: &str) -> Option<DataType> {
    Some(match name {
        "utf8" | "string" | "str" | "json" => DataType::Utf8,
        "int64" | "int" | "integer" => DataType::Int64,
        "int32" => DataType::Int32,
        "float64" | "float" | "double" => DataType::Float64,
        "float32" => DataType::Float32,
        "bool" | "boolean" => DataType::Boolean,
        "list<utf8>" | "list<string>" => DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
        _ => return None,
    })
}

pub const TYPE_NAMES: &[&str] =
    &["utf8", "string", "json", "int64", "int32", "float64", "float32", "bool", "list<utf8>"];

/// Whether values of type `from` can be read as the declared type `to` without changing
/// what they mean: text parses into numbers and booleans (each value checked), integers
/// widen and become floats, float32 widens; but numbers or booleans never turn into text
/// (a column of integers declared as text is a wrong file, not a cast).
pub fn readable_as(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let text = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let int = |t: &DataType| matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64);
    if from == to || *from == Null {
        return true;
    }
    match to {
        t if text(t) => text(from),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => text(from) || int(from),
        Float32 | Float64 => text(from) || int(from) || matches!(from, Float16 | Float32 | Float64),
        Boolean => text(from),
        List(item) | LargeList(item) => match from {
            List(f) | LargeList(f) => readable_as(f.data_type(), item.data_type()),
            _ => false,
        },
        _ => false,
    }
}

/// Cast that fails on a value the target type cannot hold (Arrow's default turns
/// such values into nulls silently), and on a type that cannot be the declared one
/// ([`readable_as`]).
pub fn strict_cast(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    if !readable_as(array.data_type(), to) {
        return Err(ArrowError::CastError(format!(
            "{} values are not {}",
            type_display(array.data_type()),
            type_display(to)
        )));
    }
    let options = crate::data::arrow::compute::CastOptions { safe: false, ..Default::default() };
    crate::data::arrow::compute::cast_with_options(array, to, &options)
}

/// Column names of a schema, for messages.
pub fn column_list(schema: &Schema) -> String {
    schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
}

/// JSON value of one cell.
pub fn value_at(array: &dyn Array, row: usize) -> Value {
    use crate::data::arrow::datatypes::*;
    if array.is_null(row) {
        return Value::Null;
    }
    macro_rules! prim {
        ($t:ty) => {
            Value::from(array.as_primitive::<$t>().value(row))
        };
    }
    match array.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float32 => float(array.as_primitive::<Float32Type>().value(row) as f64),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(row).to_string()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(row).to_string()),
        DataType::Utf8View => Value::String(array.as_string_view().value(row).to_string()),
        DataType::List(_) => list(array.as_list::<i32>().value(row).as_ref()),
        DataType::LargeList(_) => list(array.as_list::<i64>().value(row).as_ref()),
        DataType::FixedSizeList(_, _) => list(array.as_fixed_size_list().value(row).as_ref()),
        DataType::Struct(fields) => {
            let s = array.as_struct();
            Value::Object(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, col)| (f.name().clone(), value_at(col.as_ref(), row)))
                    .collect(),
            )
        }
        DataType::Dictionary(_, _) => {
            let plain = crate::data::arrow::compute::cast(&array.slice(row, 1), &DataType::Utf8);
            match plain {
                Ok(a) => value_at(a.as_ref(), 0),
                Err(_) => Value::Null,
            }
        }
        _ => {
            let options = crate::data::arrow::util::display::FormatOptions::default();
            match crate::data::arrow::util::display::ArrayFormatter::try_new(array, &options) {
                Ok(f) => Value::String(f.value(row).to_string()),
                Err(_) => Value::Null,
            }
        }
    }
}

fn float(x: f64) -> Value {
    serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
}

fn list(values: &dyn Array) -> Value {
    Value::Array((0..values.len()).map(|i| value_at(values, i)).collect())
}

/// One row as a JSON object, all columns (including `id`).
pub fn row_json(batch: &RecordBatch, row: usize) -> Row {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, col)| (f.name().clone(), value_at(col.as_ref(), row)))
        .collect()
}

/// Build a batch from JSON rows with the given schema. On a row that does not fit
/// the schema, returns the index of the first bad row and the reason.
pub fn rows_to_batch<R: serde::Serialize>(schema: &SchemaRef, rows: &[R]) -> Result<RecordBatch, (usize, ArrowError)> {
    let build = |rows: &[R]| -> Result<RecordBatch, ArrowError> {
        let mut decoder = crate::data::arrow::json::ReaderBuilder::new(schema.clone())
            .with_coerce_primitive(true)
            .with_batch_size(rows.len().max(1))
            .build_decoder()?;
        decoder.serialize(rows)?;
        Ok(decoder.flush()?.unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
    };
    match build(rows) {
        Ok(b) => Ok(b),
        Err(e) => {
            for (i, row) in rows.iter().enumerate() {
                if let Err(e) = build(std::slice::from_ref(row)) {
                    return Err((i, e));
                }
            }
            Err((0, e))
        }
    }
}

/// Replace (or insert) the id column of a batch, keeping it first.
pub fn with_ids(batch: &RecordBatch, ids: ArrayRef) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    let mut fields = vec![Arc::new(id_field())];
    let mut cols = vec![ids];
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        if f.name() != ID {
            fields.push(f.clone());
            cols.push(c.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields).with_metadata(schema.metadata().clone())), cols)
}

/// Human name of an Arrow type for messages.
pub fn type_display(dt: &DataType) -> String {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::List(f) | DataType::LargeList(f) => {
            format!("list<{}>", type_display(f.data_type()))
        }
        DataType::FixedSizeList(f, n) => format!("{}[{n}]", type_display(f.data_type())),
        DataType::Struct(fields) => format!(
            "struct<{}>",
            fields
                .iter()
                .map(|f| format!("{}: {}", f.name(), type_display(f.data_type())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string().to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trip_nested() {
        let schema = schema_with_id([
            Field::new("n", DataType::Int64, true),
            Field::new(
                "turns",
                DataType::List(Arc::new(Field::new(
                    "item",
                    DataType::Struct(
                        vec![Field::new("role", DataType::Utf8, true), Field::new("content", DataType::Utf8, true)]
                            .into(),
                    ),
                    true,
                ))),
                true,
            ),
        ]);
        let rows: Vec<Row> = vec![
            json!({"id": "a", "n": 1, "turns": [{"role": "User", "content": "hi"}]}).as_object().unwrap().clone(),
            json!({"id": "b", "n": null, "turns": []}).as_object().unwrap().clone(),
        ];
        let batch = rows_to_batch(&schema, &rows).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(row_json(&batch, 0), rows[0]);
        assert_eq!(row_json(&batch, 1), rows[1]);
    }

    #[test]
    fn bad_row_is_located() {
        let schema = schema_with_id([Field::new("n", DataType::Int64, true)]);
        let rows: Vec<Row> = vec![
            json!({"id": "a", "n": 1}).as_object().unwrap().clone(),
            json!({"id": "b", "n": {"x": 1}}).as_object().unwrap().clone(),
        ];
        let err = rows_to_batch(&schema, &rows).unwrap_err();
        assert_eq!(err.0, 1);
    }
}
