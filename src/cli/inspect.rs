//! `synth inspect`: look into a Parquet output without Python — schema and file
//! metadata, or the first rows as a table or JSON lines, optionally filtered.

use std::path::Path;

use anyhow::{Context, Result};
use synth_core::data::arrow::array::{Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::DataType;

use super::args::InspectArgs;
use super::common::{EXIT_OK, EXIT_RUNTIME};
use synth_core::data;
use synth_core::store::parquet::{open_reader, read_footer};

pub fn run(args: &InspectArgs) -> i32 {
    match inspect(args) {
        Ok(text) => {
            print!("{text}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}

pub fn inspect(args: &InspectArgs) -> Result<String> {
    if args.schema {
        return schema_text(&args.file);
    }
    let filter = match &args.filter {
        Some(f) => Some(f.split_once('=').context("--where expects COL=VALUE")?),
        None => None,
    };
    let footer = read_footer(&args.file)?;
    if let Some((col, _)) = filter
        && footer.schema.field_with_name(col).is_err()
    {
        anyhow::bail!("{}: no column \"{col}\" (columns: {})", args.file.display(), data::column_list(&footer.schema));
    }
    let mut picked: Vec<RecordBatch> = Vec::new();
    let mut n = 0;
    let mut matched = 0u64;
    for batch in open_reader(&args.file, 8192)? {
        let batch = batch.with_context(|| format!("reading {}", args.file.display()))?;
        let batch = match filter {
            Some((col, value)) => {
                let idx = batch.schema().index_of(col)?;
                let text = synth_core::data::arrow::compute::cast(batch.column(idx), &DataType::Utf8)?;
                let text = text.as_any().downcast_ref::<StringArray>().expect("utf8");
                let mask: synth_core::data::arrow::array::BooleanArray =
                    (0..text.len()).map(|i| Some(text.is_valid(i) && text.value(i) == value)).collect();
                synth_core::data::arrow::compute::filter_record_batch(&batch, &mask)?
            }
            None => batch,
        };
        matched += batch.num_rows() as u64;
        if n < args.rows {
            let take = (args.rows - n).min(batch.num_rows());
            picked.push(batch.slice(0, take));
            n += take;
        }
        if n >= args.rows && filter.is_none() {
            break;
        }
    }
    let mut out = String::new();
    if args.json {
        for b in &picked {
            for i in 0..b.num_rows() {
                out.push_str(&serde_json::to_string(&data::row_json(b, i))?);
                out.push('\n');
            }
        }
        return Ok(out);
    }
    let truncated: Vec<RecordBatch> = picked.iter().map(|b| truncate(b, args.width)).collect::<Result<_>>()?;
    out.push_str(&synth_core::data::arrow::util::pretty::pretty_format_batches(&truncated)?.to_string());
    out.push('\n');
    let total = if filter.is_some() {
        format!("{matched} matching of {}", footer.num_rows)
    } else {
        footer.num_rows.to_string()
    };
    out.push_str(&format!("{n} of {total} rows shown\n"));
    Ok(out)
}

/// Render every cell as text cut to `width` characters.
fn truncate(batch: &RecordBatch, width: usize) -> Result<RecordBatch> {
    let mut fields = Vec::new();
    let mut cols: Vec<std::sync::Arc<dyn Array>> = Vec::new();
    for (f, col) in batch.schema().fields().iter().zip(batch.columns()) {
        let values: StringArray = (0..col.len())
            .map(|i| {
                let v = data::value_at(col.as_ref(), i);
                let s = match v {
                    serde_json::Value::Null => return None,
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                let s = s.replace('\n', "\\n");
                Some(if width > 0 && s.chars().count() > width {
                    format!("{}…", s.chars().take(width).collect::<String>())
                } else {
                    s
                })
            })
            .collect();
        fields.push(synth_core::data::arrow::datatypes::Field::new(f.name(), DataType::Utf8, true));
        cols.push(std::sync::Arc::new(values));
    }
    Ok(RecordBatch::try_new(std::sync::Arc::new(synth_core::data::arrow::datatypes::Schema::new(fields)), cols)?)
}

fn schema_text(path: &Path) -> Result<String> {
    let footer = read_footer(path)?;
    let mut out = format!("{}: {} rows\n", path.display(), footer.num_rows);
    for f in footer.schema.fields() {
        out.push_str(&format!(
            "  {}: {}{}\n",
            f.name(),
            data::type_display(f.data_type()),
            if f.is_nullable() { "" } else { " (not null)" }
        ));
    }
    let mut meta: Vec<(&String, &String)> = footer.meta.iter().filter(|(k, _)| k.as_str() != "ARROW:schema").collect();
    meta.sort();
    for (k, v) in meta {
        out.push_str(&format!("  [{k}] {v}\n"));
    }
    Ok(out)
}
