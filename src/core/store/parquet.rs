//! Parquet in and out: the deterministic zstd writer every stage output goes through
//! (temporary file, unique-id check, fingerprint in the footer), and readers that
//! stream batches from a blocking thread into async code through a bounded channel.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::data::arrow::array::RecordBatch;
use crate::data::arrow::datatypes::SchemaRef;
use anyhow::{Context, Result, bail};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use tokio::sync::mpsc;

use super::atomic::{PendingFile, create_tmp, finish_file};
use super::idcheck::{IdCheck, id_hash};
use crate::data;

/// Footer key holding the stage fingerprint.
pub const FINGERPRINT_KEY: &str = "synth.fingerprint";
pub const STAGE_KEY: &str = "synth.stage";

/// Rows per row group: large enough for good compression, small enough to stream.
const ROW_GROUP_ROWS: usize = 64 * 1024;

/// Rows per call into the Parquet writer. The writer cuts pages (and falls back from
/// dictionary encoding) only between the calls it is given, so a file's bytes would
/// depend on how a stage happened to batch its rows; every output is therefore fed in
/// calls of exactly this many rows (the last one shorter), aligned to the file's start,
/// which makes the bytes a function of the rows alone: a merge of sharded parts writes
/// the same file as one process (`dag::shard`). It divides [`ROW_GROUP_ROWS`], so row
/// groups hold whole calls.
pub const WRITE_CHUNK_ROWS: usize = 8192;

/// Writer properties shared by every output so identical data gives identical bytes.
pub fn writer_properties(meta: Vec<(String, String)>) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("valid level")))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_created_by(format!("synth {}", env!("CARGO_PKG_VERSION")))
        .set_key_value_metadata(Some(meta.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect()))
        .build()
}

/// A Parquet file being written to a temporary path.
pub struct ParquetOut {
    writer: ArrowWriter<File>,
    pending: PendingFile,
    rows: u64,
    ids: Option<IdCheck>,
    /// Rows received but not yet written (fewer than [`WRITE_CHUNK_ROWS`]).
    held: Vec<RecordBatch>,
    held_rows: usize,
}

impl ParquetOut {
    /// Create `dest` (via a temporary file). `check_ids` enforces unique record ids
    /// (in bounded memory, spilling next to the file).
    pub fn create(dest: &Path, schema: SchemaRef, meta: Vec<(String, String)>, check_ids: bool) -> Result<ParquetOut> {
        let (file, pending) = create_tmp(dest)?;
        let writer = ArrowWriter::try_new(file, schema, Some(writer_properties(meta)))
            .with_context(|| format!("starting Parquet file {}", pending.tmp.display()))?;
        let ids = check_ids.then(|| IdCheck::new(dest.parent().unwrap_or(Path::new("."))));
        Ok(ParquetOut { writer, pending, rows: 0, ids, held: Vec::new(), held_rows: 0 })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if let Some(ids) = &mut self.ids {
            for id in data::ids(batch).iter().flatten() {
                ids.push(id)?;
            }
        }
        self.rows += batch.num_rows() as u64;
        // Whole chunks go to the writer as they fill; the rest waits for more rows.
        let mut at = 0;
        let n = batch.num_rows();
        while at < n {
            let take = (WRITE_CHUNK_ROWS - self.held_rows).min(n - at);
            if self.held_rows == 0 && take == WRITE_CHUNK_ROWS {
                self.write_chunk(&batch.slice(at, take))?;
            } else {
                self.held.push(batch.slice(at, take));
                self.held_rows += take;
                if self.held_rows == WRITE_CHUNK_ROWS {
                    self.flush_held()?;
                }
            }
            at += take;
        }
        Ok(())
    }

    fn flush_held(&mut self) -> Result<()> {
        if self.held_rows == 0 {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.held_rows = 0;
        let chunk = if held.len() == 1 {
            held.into_iter().next().expect("one")
        } else {
            crate::data::arrow::compute::concat_batches(&held[0].schema(), &held)
                .with_context(|| format!("writing {}", self.pending.tmp.display()))?
        };
        self.write_chunk(&chunk)
    }

    fn write_chunk(&mut self, chunk: &RecordBatch) -> Result<()> {
        self.writer.write(chunk).with_context(|| format!("writing {}", self.pending.tmp.display()))
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Finish the file (footer, fsync). It stays temporary until committed.
    pub fn finish(mut self) -> Result<(PendingFile, u64)> {
        self.flush_held()?;
        let file = self.writer.into_inner().with_context(|| format!("finishing {}", self.pending.tmp.display()))?;
        finish_file(file, &self.pending)?;
        if let Some(ids) = self.ids
            && let Some(hash) = ids.finish()?
        {
            let id = find_id_with_hash(&self.pending.tmp, hash).unwrap_or_else(|| format!("with hash {hash:016x}"));
            bail!("duplicate record id \"{id}\" (record ids must be unique within a stage output)");
        }
        Ok((self.pending, self.rows))
    }
}

/// Recover the id behind a duplicated hash by scanning the written file.
fn find_id_with_hash(path: &Path, hash: u64) -> Option<String> {
    for batch in open_reader(path, 8192).ok()? {
        let batch = batch.ok()?;
        if let Some(id) = data::ids(&batch).iter().flatten().find(|id| id_hash(id) == hash) {
            return Some(id.to_string());
        }
    }
    None
}

/// Schema, row count and footer key-value metadata of a Parquet file.
pub struct Footer {
    pub schema: SchemaRef,
    pub num_rows: u64,
    pub meta: HashMap<String, String>,
}

pub fn read_footer(path: &Path) -> Result<Footer> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
    let md = builder.metadata().file_metadata();
    let meta = md
        .key_value_metadata()
        .map(|kvs| kvs.iter().filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?))).collect())
        .unwrap_or_default();
    Ok(Footer { schema: builder.schema().clone(), num_rows: md.num_rows() as u64, meta })
}

/// The Arrow schema a file was written with, exactly (the one its writer embedded).
/// Reading a file merges its footer's key-value pairs into the schema's metadata, so a
/// schema read back differs from the writer's where the writer's came from its input
/// (which carried the input's fingerprint): a merge of sharded parts writes with this
/// one to give the same bytes as one process.
pub fn writer_schema(path: &Path) -> Result<SchemaRef> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
    let md = builder.metadata().file_metadata();
    let embedded: Vec<KeyValue> = md
        .key_value_metadata()
        .map(|kvs| kvs.iter().filter(|kv| kv.key == parquet::arrow::ARROW_SCHEMA_META_KEY).cloned().collect())
        .unwrap_or_default();
    let schema = parquet::arrow::parquet_to_arrow_schema(md.schema_descr(), Some(&embedded))
        .with_context(|| format!("{}: reading its Arrow schema", path.display()))?;
    Ok(Arc::new(schema))
}

/// A blocking batch reader over a Parquet file.
pub fn open_reader(path: &Path, batch_size: usize) -> Result<ParquetRecordBatchReader> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{}: not a readable Parquet file", path.display()))?
        .with_batch_size(batch_size)
        .build()
        .with_context(|| format!("reading {}", path.display()))
}

/// Stream batches of a Parquet file from a blocking thread (at most two in flight).
pub fn stream_batches(path: PathBuf, batch_size: usize) -> mpsc::Receiver<Result<RecordBatch>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let reader = match open_reader(&path, batch_size) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        for batch in reader {
            let item = batch.with_context(|| format!("reading {}", path.display()));
            let stop = item.is_err();
            if tx.blocking_send(item).is_err() || stop {
                return;
            }
        }
    });
    rx
}

/// Read a whole Parquet file into memory (for small inputs: the right side of a join...).
pub fn read_all(path: &Path) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let reader = open_reader(path, 8192)?;
    let schema = crate::data::arrow::array::RecordBatchReader::schema(&reader);
    let batches = reader.collect::<Result<Vec<_>, _>>().with_context(|| format!("reading {}", path.display()))?;
    Ok((schema, batches))
}

/// Read only the named top-level columns of a Parquet file (the others are not decoded),
/// in one batch per row group; a name the file lacks is an error naming it.
pub fn read_columns(path: &Path, names: &[&str]) -> Result<Vec<RecordBatch>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{}: not a readable Parquet file", path.display()))?;
    let schema = builder.schema().clone();
    let mut roots = Vec::new();
    for n in names {
        roots.push(schema.index_of(n).map_err(|_| anyhow::anyhow!("{} has no column \"{n}\"", path.display()))?);
    }
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(ROW_GROUP_ROWS)
        .build()
        .with_context(|| format!("reading {}", path.display()))?;
    reader.collect::<Result<Vec<_>, _>>().with_context(|| format!("reading {}", path.display()))
}

/// Convenience: an owned schema ref from a footer for schema-only uses.
pub fn schema_of(path: &Path) -> Result<SchemaRef> {
    Ok(read_footer(path)?.schema)
}

pub fn arc_schema(schema: crate::data::arrow::datatypes::Schema) -> SchemaRef {
    Arc::new(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::arrow::array::{ArrayRef, Int64Array, ListArray, StringArray};
    use crate::data::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    /// 150k rows: past the writer's 20,000-row page limit and a 64k row group, with a
    /// nested column, so page cuts would show any dependence on the callers' batching.
    fn rows(from: usize, to: usize, schema: &SchemaRef) -> RecordBatch {
        let ids = StringArray::from_iter_values((from..to).map(|i| format!("r{i}")));
        let n = Int64Array::from_iter_values((from..to).map(|i| (i * 7919 % 1000) as i64));
        let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(
            (from..to).map(|i| Some((0..(i % 4) as i64).map(Some).collect::<Vec<_>>())),
        );
        let cols: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(n), Arc::new(lists)];
        RecordBatch::try_new(schema.clone(), cols).unwrap()
    }

    #[test]
    fn bytes_depend_on_the_rows_not_on_the_batching() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
            Field::new("l", DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))), true),
        ]));
        let dir = tempfile::tempdir().unwrap();
        let total = 150_000;
        let mut files = Vec::new();
        for (k, sizes) in [vec![256], vec![8192], vec![1000, 7, 30_000], vec![total]].into_iter().enumerate() {
            let dest = dir.path().join(format!("f{k}.parquet"));
            let mut out = ParquetOut::create(&dest, schema.clone(), vec![("k".into(), "v".into())], true).unwrap();
            let (mut at, mut i) = (0, 0);
            while at < total {
                let n = sizes[i % sizes.len()].min(total - at);
                out.write(&rows(at, at + n, &schema)).unwrap();
                at += n;
                i += 1;
            }
            let (pending, written) = out.finish().unwrap();
            assert_eq!(written, total as u64);
            pending.commit().unwrap();
            files.push(std::fs::read(&dest).unwrap());
        }
        for (k, f) in files.iter().enumerate().skip(1) {
            assert!(f == &files[0], "batching {k} gave other bytes");
        }
        let back = read_all(&dir.path().join("f0.parquet")).unwrap().1;
        assert_eq!(back.iter().map(|b| b.num_rows()).sum::<usize>(), total);
    }
}
