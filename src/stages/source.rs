//! `source`: read records from local JSONL / JSON / CSV / TSV / Parquet files or a
//! Hugging Face Hub dataset. Gives every record a stable id (an id column, or
//! `<stage>-<ordinal>`). A malformed line or row becomes a failure naming
//! `file:line:col`; a file that cannot be read at all, or a Parquet file with the
//! wrong schema, stops the stage with a message naming the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Deserialize;
use serde_json::Value;

use super::{Arity, BuildCtx, Cancelled, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};
use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty, UINT, expand_glob};
use crate::data::{self, ID, Row};
use crate::hub::HubSpec;
use crate::store::failures::FailureKind;
use crate::store::parquet::ParquetOut;

/// The options of an `hf = { ... }` table (also used by method kinds that read from the hub).
pub const HF_OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("repo", Ty::Str, "repository id, e.g. \"proj-persona/PersonaHub\""),
    OptionSpec::default("revision", Ty::Str, "\"main\"", "branch, tag or commit"),
    OptionSpec::optional("files", Ty::StrList, "files or globs in the repo (default: by config and split)"),
    OptionSpec::optional("config", Ty::Str, "dataset config (subset), e.g. \"v2.1\""),
    OptionSpec::optional("split", Ty::Str, "split, e.g. \"train\""),
    OptionSpec::default("repo_type", Ty::Enum(&["dataset", "model", "space"]), "\"dataset\"", "repository type"),
    OptionSpec::optional("endpoint", Ty::Str, "hub URL (default: HF_ENDPOINT or huggingface.co)").runtime_only(),
    OptionSpec::optional("cache_dir", Ty::Str, "download cache (default: HF_HOME's hub cache)").runtime_only(),
    OptionSpec::default("token_env", Ty::Str, "\"HF_TOKEN\"", "environment variable holding the hub token")
        .runtime_only(),
];

const FORMATS: &[&str] = &["auto", "jsonl", "json", "csv", "tsv", "parquet"];

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("path", Ty::Files, "local file(s): a path or glob, or a list of them"),
    OptionSpec::optional("hf", Ty::Struct(HF_OPTIONS), "a Hugging Face Hub dataset instead of local files"),
    OptionSpec::optional(
        "url",
        Ty::StrList,
        "http(s) URL(s) of files instead of local files (cached in the output directory; re-read with a conditional request)",
    ),
    OptionSpec::default("format", Ty::Enum(FORMATS), "\"auto\"", "file format (auto: by extension)"),
    OptionSpec::optional("id_column", Ty::Str, "column holding the record id (default: \"id\" if present)"),
    OptionSpec::optional(
        "columns",
        Ty::List(&Ty::Str),
        "columns to keep, in order; for headerless CSV/TSV the names of the columns",
    ),
    OptionSpec::optional("types", Ty::Map(&Ty::Enum(data::TYPE_NAMES)), "column types to enforce"),
    OptionSpec::default("header", Ty::Bool, "true", "CSV/TSV: first row holds column names"),
    OptionSpec::optional("delimiter", Ty::Str, "CSV/TSV: field delimiter (one character)"),
    OptionSpec::default("infer_types", Ty::Bool, "true", "CSV/TSV: infer integer/float/boolean columns"),
    OptionSpec::optional("limit", UINT, "read at most this many records"),
    OptionSpec::default("allow_empty", Ty::Bool, "false", "accept a source with no records"),
];

pub static KIND: KindInfo = KindInfo {
    name: "source",
    version: 1,
    about: "read records from local files (JSONL, JSON, CSV, TSV, Parquet) or a Hugging Face Hub dataset",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    uses_seed: false,
    summary: false,
    example: "path = \"pipelines/data/personas.jsonl\"",
    build,
};

#[derive(Debug, Clone, Deserialize)]
struct Options {
    path: Option<Vec<String>>,
    hf: Option<HubSpec>,
    url: Option<Vec<String>>,
    format: String,
    id_column: Option<String>,
    columns: Option<Vec<String>>,
    types: Option<BTreeMap<String, String>>,
    header: bool,
    delimiter: Option<String>,
    infer_types: bool,
    limit: Option<u64>,
    allow_empty: bool,
}

struct Source {
    name: String,
    opts: Options,
    types: BTreeMap<String, DataType>,
    delimiter: Option<u8>,
    root: PathBuf,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    match [opts.path.is_some(), opts.hf.is_some(), opts.url.is_some()].iter().filter(|x| **x).count() {
        0 => ctx.error(diags, "", "a source needs \"path\" (local files), \"hf\" (a hub dataset) or \"url\""),
        1 => {}
        _ => ctx.error(diags, if opts.hf.is_some() { "hf" } else { "url" }, "give one of \"path\", \"hf\" and \"url\""),
    }
    for url in opts.url.iter().flatten() {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            ctx.error(diags, "url", format!("\"{url}\" is not an http(s) URL"));
        }
    }
    let delimiter = match &opts.delimiter {
        Some(d) if d.len() == 1 => Some(d.as_bytes()[0]),
        Some(d) if d == "\\t" => Some(b'\t'),
        Some(_) => {
            ctx.error(diags, "delimiter", "delimiter must be a single one-byte character");
            None
        }
        None => None,
    };
    if !opts.header && opts.columns.is_none() && matches!(opts.format.as_str(), "csv" | "tsv") {
        ctx.error(diags, "header", "header = false needs \"columns\" to name the columns");
    }
    let types = opts
        .types
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), data::parse_type_name(v).expect("checked by schema")))
        .collect();
    Some(Box::new(Source { name: ctx.name.to_string(), opts, types, delimiter, root: ctx.root.to_path_buf() }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Jsonl,
    JsonArray,
    Csv,
    Tsv,
    Parquet,
}

impl Source {
    fn format_of(&self, path: &Path) -> Result<Format> {
        let by_name = |f: &str| match f {
            "jsonl" => Some(Format::Jsonl),
            "json" => Some(Format::JsonArray),
            "csv" => Some(Format::Csv),
            "tsv" => Some(Format::Tsv),
            "parquet" => Some(Format::Parquet),
            _ => None,
        };
        if let Some(f) = by_name(&self.opts.format) {
            return Ok(f);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        let ext = name.rsplit('.').next().unwrap_or_default();
        match ext {
            "jsonl" | "ndjson" => Ok(Format::Jsonl),
            "json" => Ok(if starts_with_bracket(path) { Format::JsonArray } else { Format::Jsonl }),
            "csv" => Ok(Format::Csv),
            "tsv" | "tab" => Ok(Format::Tsv),
            "parquet" | "pq" => Ok(Format::Parquet),
            _ => bail!("{}: cannot tell the format from the extension; set format = \"...\"", path.display()),
        }
    }

    fn local_files(&self) -> Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for pattern in self.opts.path.iter().flatten() {
            let found = expand_glob(&self.root, pattern).map_err(|e| anyhow!(e))?;
            if found.is_empty() {
                bail!("no file matches \"{}\"", self.root.join(pattern).display());
            }
            files.extend(found);
        }
        Ok(files)
    }

    fn limit(&self, run_limit: Option<u64>) -> Option<u64> {
        match (self.opts.limit, run_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Apply `columns` (selection and order) and `types` to a file schema.
    fn shape_schema(&self, file: &Path, schema: &Schema) -> Result<Schema> {
        let mut fields: Vec<Field> = match &self.opts.columns {
            Some(cols) => cols
                .iter()
                .map(|c| {
                    schema.field_with_name(c).cloned().map_err(|_| {
                        anyhow!("{}: no column \"{c}\" (columns: {})", file.display(), data::column_list(schema))
                    })
                })
                .collect::<Result<_>>()?,
            None => schema.fields().iter().map(|f| f.as_ref().clone()).collect(),
        };
        for f in &mut fields {
            if let Some(t) = self.types.get(f.name()) {
                if !data::readable_as(f.data_type(), t) {
                    bail!(
                        "{}: column \"{}\" holds {} values, but \"types\" declares {}",
                        file.display(),
                        f.name(),
                        data::type_display(f.data_type()),
                        data::type_display(t)
                    );
                }
                *f = Field::new(f.name(), t.clone(), true);
            } else {
                *f = f.clone().with_nullable(true);
            }
        }
        for name in self.types.keys() {
            if !fields.iter().any(|f| f.name() == name) {
                bail!(
                    "{}: no column \"{name}\" (named in \"types\"; columns: {})",
                    file.display(),
                    data::column_list(schema)
                );
            }
        }
        Ok(Schema::new(fields))
    }

    /// The column used for ids, if any.
    fn id_source<'a>(&'a self, schema: &'a Schema) -> Option<&'a str> {
        match &self.opts.id_column {
            Some(c) => Some(c.as_str()),
            None => schema.field_with_name(ID).ok().map(|_| ID),
        }
    }

    fn csv_delimiter(&self, format: Format) -> u8 {
        self.delimiter.unwrap_or(if format == Format::Tsv { b'\t' } else { b',' })
    }
}

fn starts_with_bracket(path: &Path) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 256];
    let n = File::open(path).and_then(|mut f| f.read(&mut buf)).unwrap_or(0);
    buf[..n].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}

#[async_trait]
impl Stage for Source {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if self.opts.hf.is_some() || self.opts.url.is_some() {
            // Columns of a hub dataset or a URL are only known once downloaded, unless declared.
            let cols = self.opts.columns.as_ref()?;
            let fields = cols.iter().map(|c| Field::new(c, self.types.get(c).cloned().unwrap_or(DataType::Utf8), true));
            return Some(data::schema_with_id(fields));
        }
        let files = match self.local_files() {
            Ok(f) => f,
            Err(_) => return None, // reported by the option checker
        };
        let first = files.first()?.clone();
        let files_len = files.len();
        ctx.files.extend(files);
        match self.peek_schema(&first) {
            Ok(schema) if schema.fields().is_empty() && !self.opts.allow_empty && files_len == 1 => {
                // Downstream stages would only say that a column is missing.
                ctx.error(
                    "path",
                    format!("{}: no records (set allow_empty = true to accept an empty source)", first.display()),
                );
                None
            }
            Ok(schema) => Some(data::schema_with_id(schema.fields().iter().map(|f| f.as_ref().clone()))),
            Err(e) => {
                ctx.error("path", format!("{e:#}"));
                None
            }
        }
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        if let Some(urls) = &self.opts.url {
            let mut prepared = Prepared::default();
            for (i, url) in urls.iter().enumerate() {
                let Some((fetched, upstream)) = ctx.fetch_url(url).await? else { return Ok(None) };
                prepared.fingerprint.insert(format!("url.{i}"), format!("{url} {}", fetched.blake3));
                prepared.files.push(fetched.path);
                prepared.upstream.push(upstream);
            }
            return Ok(Some(prepared));
        }
        match &self.opts.hf {
            None => Ok(Some(Prepared { files: self.local_files()?, hash_files: true, ..Default::default() })),
            Some(hf) => {
                let Some((resolved, upstream)) = ctx.resolve_hub(hf, ctx.root).await? else { return Ok(None) };
                let mut fingerprint = BTreeMap::new();
                fingerprint.insert("hf.repo".into(), hf.repo.clone());
                fingerprint.insert("hf.commit".into(), resolved.commit.clone());
                fingerprint.insert(
                    "hf.files".into(),
                    resolved.files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(","),
                );
                Ok(Some(Prepared {
                    fingerprint,
                    files: resolved.files.into_iter().map(|(_, p)| p).collect(),
                    hash_files: false,
                    upstream: vec![upstream],
                }))
            }
        }
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let files = ctx.prepared.files.clone();
        if files.is_empty() {
            bail!("no input files");
        }
        let formats: Vec<Format> = files.iter().map(|f| self.format_of(f)).collect::<Result<_>>()?;
        if formats.iter().any(|f| *f != formats[0]) {
            bail!(
                "all files of a source must have the same format ({} and {} differ)",
                files[0].display(),
                files[formats.iter().position(|f| *f != formats[0]).expect("exists")].display()
            );
        }
        let src = Source {
            name: self.name.clone(),
            opts: self.opts.clone(),
            types: self.types.clone(),
            delimiter: self.delimiter,
            root: self.root.clone(),
        };
        let limit = self.limit(ctx.limit);
        let format = formats[0];
        let meta = ctx.footer_meta();
        let out_path = ctx.output_path();
        let cancel = ctx.cancel.clone();
        let progress = ctx.progress.clone();
        let failures = ctx.failures.clone();
        let name = ctx.name.clone();
        let (out, rows_in) = tokio::task::spawn_blocking(move || -> Result<(ParquetOut, u64)> {
            let mut w =
                Emitter { name, out_path, meta, out: None, ordinal: 0, written: 0, limit, cancel, progress, failures };
            match format {
                Format::Parquet => src.read_parquet(&files, &mut w)?,
                Format::Jsonl | Format::JsonArray => src.read_json(&files, format, &mut w)?,
                Format::Csv | Format::Tsv => src.read_csv(&files, format, &mut w)?,
            }
            let rows_in = w.ordinal;
            let out = w.finish()?;
            Ok((out, rows_in))
        })
        .await
        .context("source reader panicked")??;
        ctx.report.rows_in = rows_in;
        if out.rows() == 0 && ctx.failures.is_empty() && !self.opts.allow_empty {
            bail!(
                "no records in {} (set allow_empty = true to accept an empty source)",
                ctx.prepared.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        ctx.set_output(out)
    }
}

/// Adds ids, applies the limit and writes batches; counts records.
struct Emitter {
    name: String,
    out_path: PathBuf,
    meta: Vec<(String, String)>,
    out: Option<ParquetOut>,
    /// Records seen so far (good and bad), across files.
    ordinal: u64,
    written: u64,
    limit: Option<u64>,
    cancel: tokio_util::sync::CancellationToken,
    progress: Arc<crate::progress::StageProgress>,
    failures: crate::store::failures::FailureLog,
}

impl Emitter {
    fn done(&self) -> bool {
        self.limit.is_some_and(|l| self.written >= l)
    }

    fn check_cancel(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            bail!(Cancelled);
        }
        Ok(())
    }

    /// The id a record at this ordinal gets when the data has no id column.
    fn ordinal_id(&self, ordinal: u64) -> String {
        format!("{}-{ordinal}", self.name)
    }

    fn fail(&mut self, message: String, record: Option<String>) {
        let id = self.ordinal_id(self.ordinal);
        self.failures.record(id, FailureKind::Parse, message, record);
        self.progress.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ordinal += 1;
    }

    /// Write a batch of data columns whose records have the given ordinals.
    fn emit(&mut self, batch: RecordBatch, ordinals: &[u64], id_col: Option<&str>, file: &Path) -> Result<()> {
        let mut batch = batch;
        let mut ordinals = ordinals.to_vec();
        if let Some(limit) = self.limit {
            let room = limit.saturating_sub(self.written) as usize;
            if batch.num_rows() > room {
                batch = batch.slice(0, room);
                ordinals.truncate(room);
            }
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let ids: ArrayRef = match id_col {
            Some(col) => {
                let idx = batch.schema().index_of(col).map_err(|_| {
                    anyhow!(
                        "{}: no id column \"{col}\" (columns: {})",
                        file.display(),
                        data::column_list(&batch.schema())
                    )
                })?;
                let arr = batch.column(idx);
                let strings = arrow::compute::cast(arr, &DataType::Utf8)
                    .with_context(|| format!("{}: id column \"{col}\" cannot be read as text", file.display()))?;
                let strings = strings.as_any().downcast_ref::<StringArray>().expect("utf8").clone();
                // Records without an id fail; keep the others.
                if strings.null_count() > 0 {
                    let keep: arrow::array::BooleanArray =
                        (0..strings.len()).map(|i| Some(strings.is_valid(i))).collect();
                    for (i, ord) in ordinals.iter().enumerate() {
                        if strings.is_null(i) {
                            let id = self.ordinal_id(*ord);
                            self.failures.record(
                                id,
                                FailureKind::Parse,
                                format!("{}: record has no value in id column \"{col}\"", file.display()),
                                None,
                            );
                        }
                    }
                    let filtered = arrow::compute::filter_record_batch(&batch, &keep)?;
                    let ids = arrow::compute::filter(&strings, &keep)?;
                    return self.write_with_ids(filtered, ids);
                }
                Arc::new(strings)
            }
            None => Arc::new(StringArray::from_iter_values(ordinals.iter().map(|o| self.ordinal_id(*o)))),
        };
        self.write_with_ids(batch, ids)
    }

    fn write_with_ids(&mut self, batch: RecordBatch, ids: ArrayRef) -> Result<()> {
        let batch = data::with_ids(&batch, ids)?;
        if self.out.is_none() {
            self.out = Some(ParquetOut::create(&self.out_path, batch.schema(), self.meta.clone(), true)?);
        }
        let out = self.out.as_mut().expect("created");
        out.write(&batch)?;
        self.written += batch.num_rows() as u64;
        Ok(())
    }

    fn finish(self) -> Result<ParquetOut> {
        match self.out {
            Some(out) => Ok(out),
            None => {
                let schema = data::schema_with_id([]);
                ParquetOut::create(&self.out_path, schema, self.meta, true)
            }
        }
    }
}

impl Source {
    /// Schema of the first file, cheaply (footer, or the first records).
    fn peek_schema(&self, file: &Path) -> Result<Schema> {
        let format = self.format_of(file)?;
        let raw = match format {
            Format::Parquet => {
                let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
                let b = ParquetRecordBatchReaderBuilder::try_new(f)
                    .with_context(|| format!("{}: not a readable Parquet file", file.display()))?;
                b.schema().as_ref().clone()
            }
            Format::Jsonl | Format::JsonArray => {
                let mut values = Vec::new();
                for_each_json_record(file, format, &mut |_, _, rec| {
                    if let Ok(Value::Object(m)) = rec {
                        values.push(Value::Object(m));
                    }
                    Ok(values.len() < 1000)
                })?;
                infer_json(file, &values)?
            }
            Format::Csv | Format::Tsv => self.infer_csv(&[file.to_path_buf()], format, Some(1000))?,
        };
        self.shape_schema(file, &raw)
    }

    fn read_parquet(&self, files: &[PathBuf], w: &mut Emitter) -> Result<()> {
        let mut reference: Option<(PathBuf, Schema)> = None;
        let total: u64 =
            files.iter().filter_map(|f| crate::store::parquet::read_footer(f).ok().map(|m| m.num_rows)).sum();
        w.progress.set_total(w.limit.map_or(total, |l| l.min(total)));
        for file in files {
            let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(f)
                .with_context(|| format!("{}: not a readable Parquet file", file.display()))?;
            let file_schema = builder.schema().clone();
            let shaped = self.shape_schema(file, &file_schema)?;
            match &reference {
                None => reference = Some((file.clone(), shaped.clone())),
                Some((ref_file, ref_schema)) => {
                    for f in ref_schema.fields() {
                        match shaped.field_with_name(f.name()) {
                            Ok(g) if g.data_type() == f.data_type() => {}
                            Ok(g) => bail!(
                                "{}: column \"{}\" is {} but {} has {}",
                                file.display(),
                                f.name(),
                                data::type_display(g.data_type()),
                                ref_file.display(),
                                data::type_display(f.data_type())
                            ),
                            Err(_) => bail!(
                                "{}: no column \"{}\" (present in {}; this file has: {})",
                                file.display(),
                                f.name(),
                                ref_file.display(),
                                data::column_list(&file_schema)
                            ),
                        }
                    }
                }
            }
            let indices: Vec<usize> =
                shaped.fields().iter().map(|f| file_schema.index_of(f.name()).expect("checked")).collect();
            let mask = ProjectionMask::roots(builder.parquet_schema(), indices.clone());
            let reader = builder
                .with_projection(mask)
                .with_batch_size(super::exec::BATCH_ROWS)
                .build()
                .with_context(|| format!("reading {}", file.display()))?;
            let id_col = self.id_source(&shaped).map(str::to_string);
            for batch in reader {
                w.check_cancel()?;
                if w.done() {
                    return Ok(());
                }
                let batch = batch.with_context(|| format!("{}: corrupt Parquet data", file.display()))?;
                // Projection keeps file order; reorder and cast to the shaped schema.
                let mut cols = Vec::with_capacity(shaped.fields().len());
                for field in shaped.fields() {
                    let col = batch.column(batch.schema().index_of(field.name()).expect("projected"));
                    let col = if col.data_type() == field.data_type() {
                        col.clone()
                    } else {
                        data::strict_cast(col, field.data_type()).with_context(|| {
                            format!(
                                "{}: column \"{}\" ({}) cannot be read as {}",
                                file.display(),
                                field.name(),
                                data::type_display(col.data_type()),
                                data::type_display(field.data_type())
                            )
                        })?
                    };
                    cols.push(col);
                }
                let shaped_batch = RecordBatch::try_new(Arc::new(shaped.clone()), cols)?;
                let n = shaped_batch.num_rows() as u64;
                let ordinals: Vec<u64> = (w.ordinal..w.ordinal + n).collect();
                w.ordinal += n;
                w.emit(shaped_batch, &ordinals, id_col.as_deref(), file)?;
                w.progress.inc(n);
            }
        }
        Ok(())
    }

    fn read_json(&self, files: &[PathBuf], format: Format, w: &mut Emitter) -> Result<()> {
        // Pass 1: infer one schema over every record of every file (a column that is
        // null in the first thousand lines must not be typed wrongly).
        let mut values: Vec<Value> = Vec::new();
        let mut schema: Option<Schema> = None;
        let declared = self.opts.columns.as_ref().is_some_and(|c| c.iter().all(|c| self.types.contains_key(c)));
        if declared {
            let cols = self.opts.columns.as_ref().expect("declared");
            schema =
                Some(Schema::new(cols.iter().map(|c| Field::new(c, self.types[c].clone(), true)).collect::<Vec<_>>()));
        } else {
            let mut inferred: Option<Schema> = None;
            for file in files {
                for_each_json_record(file, format, &mut |_, _, rec| {
                    if let Ok(v @ Value::Object(_)) = rec {
                        values.push(v);
                        if values.len() >= 4096 {
                            merge_inferred(&mut inferred, infer_json(file, &values)?)?;
                            values.clear();
                        }
                    }
                    Ok(!w.cancel.is_cancelled())
                })?;
                w.check_cancel()?;
                if !values.is_empty() {
                    merge_inferred(&mut inferred, infer_json(file, &values)?)?;
                    values.clear();
                }
            }
            if let Some(raw) = inferred {
                schema = Some(self.shape_schema(&files[0], &raw)?);
            }
        }
        let Some(schema) = schema else {
            return self.only_failures_json(files, format, w);
        };
        let schema = Arc::new(schema);
        let id_col = self.id_source(&schema).map(str::to_string);

        // Pass 2: decode in chunks; bad lines become failures.
        for file in files {
            let mut rows: Vec<Row> = Vec::new();
            let mut ords: Vec<u64> = Vec::new();
            let mut lines: Vec<usize> = Vec::new();
            let mut stop = false;
            for_each_json_record(file, format, &mut |line, raw, rec| {
                if w.done() || w.cancel.is_cancelled() {
                    stop = true;
                    return Ok(false);
                }
                match rec {
                    Ok(Value::Object(map)) => {
                        rows.push(map);
                        ords.push(w.ordinal);
                        lines.push(line);
                        w.ordinal += 1;
                    }
                    Ok(other) => w.fail(
                        format!("{}:{line}: expected a JSON object, found {}", file.display(), json_kind(&other)),
                        Some(raw.to_string()),
                    ),
                    Err(msg) => w.fail(format!("{}:{line}:{msg}", file.display()), Some(raw.to_string())),
                }
                w.progress.inc(1);
                if rows.len() >= 2048 {
                    self.flush_json(
                        &schema,
                        std::mem::take(&mut rows),
                        std::mem::take(&mut ords),
                        std::mem::take(&mut lines),
                        id_col.as_deref(),
                        file,
                        w,
                    )?;
                }
                Ok(true)
            })?;
            self.flush_json(&schema, rows, ords, lines, id_col.as_deref(), file, w)?;
            w.check_cancel()?;
            if stop {
                break;
            }
        }
        Ok(())
    }

    /// No record parsed at all: still visit every line so each failure is recorded.
    fn only_failures_json(&self, files: &[PathBuf], format: Format, w: &mut Emitter) -> Result<()> {
        for file in files {
            for_each_json_record(file, format, &mut |line, raw, rec| {
                match rec {
                    Ok(other) => w.fail(
                        format!("{}:{line}: expected a JSON object, found {}", file.display(), json_kind(&other)),
                        Some(raw.to_string()),
                    ),
                    Err(msg) => w.fail(format!("{}:{line}:{msg}", file.display()), Some(raw.to_string())),
                }
                Ok(true)
            })?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn flush_json(
        &self,
        schema: &SchemaRef,
        mut rows: Vec<Row>,
        mut ords: Vec<u64>,
        mut lines: Vec<usize>,
        id_col: Option<&str>,
        file: &Path,
        w: &mut Emitter,
    ) -> Result<()> {
        // Keep only the schema's columns (JSON may carry extra keys when `columns` is set).
        for row in &mut rows {
            row.retain(|k, _| schema.field_with_name(k).is_ok());
        }
        loop {
            if rows.is_empty() {
                return Ok(());
            }
            match data::rows_to_batch(schema, &rows) {
                Ok(batch) => return w.emit(batch, &ords, id_col, file),
                Err((i, e)) => {
                    let id = w.ordinal_id(ords[i]);
                    let record = serde_json::to_string(&rows[i]).ok();
                    w.failures.record(id, FailureKind::Schema, format!("{}:{}: {e}", file.display(), lines[i]), record);
                    w.progress.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    rows.remove(i);
                    ords.remove(i);
                    lines.remove(i);
                }
            }
        }
    }

    fn csv_reader(&self, file: &Path, format: Format) -> Result<csv::Reader<File>> {
        let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
        Ok(csv::ReaderBuilder::new()
            .delimiter(self.csv_delimiter(format))
            .has_headers(false)
            .flexible(true)
            .quoting(format == Format::Csv)
            .from_reader(f))
    }

    /// Column names and inferred types of CSV/TSV files.
    fn infer_csv(&self, files: &[PathBuf], format: Format, max_rows: Option<usize>) -> Result<Schema> {
        let mut names: Option<Vec<String>> = if self.opts.header { None } else { self.opts.columns.clone() };
        let mut kinds: Vec<CsvKind> = Vec::new();
        let mut seen = 0usize;
        for file in files {
            let mut reader = self.csv_reader(file, format)?;
            let mut record = csv::ByteRecord::new();
            let mut first = true;
            loop {
                match reader.read_byte_record(&mut record) {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(_) => continue, // reported in pass 2
                }
                if first && self.opts.header {
                    first = false;
                    let header: Vec<String> =
                        record.iter().map(|f| String::from_utf8_lossy(f).trim().to_string()).collect();
                    match &names {
                        None => names = Some(header),
                        Some(n) if *n != header => bail!(
                            "{}: header differs from the first file's ({} vs {})",
                            file.display(),
                            header.join(","),
                            n.join(",")
                        ),
                        _ => {}
                    }
                    continue;
                }
                first = false;
                if kinds.len() < record.len() {
                    kinds.resize(record.len(), CsvKind::Unknown);
                }
                for (k, field) in kinds.iter_mut().zip(record.iter()) {
                    if self.opts.infer_types {
                        k.observe(field);
                    } else {
                        *k = CsvKind::Text;
                    }
                }
                seen += 1;
                if max_rows.is_some_and(|m| seen >= m) {
                    break;
                }
            }
        }
        let names = names.unwrap_or_default();
        if names.is_empty() {
            bail!("{}: no header row", files[0].display());
        }
        let fields: Vec<Field> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Field::new(n, kinds.get(i).copied().unwrap_or(CsvKind::Text).data_type(), true))
            .collect();
        if !self.opts.header {
            // `columns` named the columns; do not treat it as a selection too.
            return Ok(Schema::new(fields));
        }
        Ok(Schema::new(fields))
    }

    fn read_csv(&self, files: &[PathBuf], format: Format, w: &mut Emitter) -> Result<()> {
        let raw = self.infer_csv(files, format, None)?;
        let names: Vec<String> = raw.fields().iter().map(|f| f.name().clone()).collect();
        let shaped = if self.opts.header {
            self.shape_schema(&files[0], &raw)?
        } else {
            // Headerless: `columns` are the names; apply types only.
            let fields: Vec<Field> = raw
                .fields()
                .iter()
                .map(|f| {
                    Field::new(
                        f.name(),
                        self.types.get(f.name()).cloned().unwrap_or_else(|| f.data_type().clone()),
                        true,
                    )
                })
                .collect();
            Schema::new(fields)
        };
        let schema = Arc::new(shaped);
        let id_col = self.id_source(&schema).map(str::to_string);
        for file in files {
            let mut reader = self.csv_reader(file, format)?;
            let mut record = csv::ByteRecord::new();
            let mut rows: Vec<Row> = Vec::new();
            let mut ords: Vec<u64> = Vec::new();
            let mut lines: Vec<usize> = Vec::new();
            let mut first = true;
            loop {
                w.check_cancel()?;
                if w.done() {
                    break;
                }
                let more = match reader.read_byte_record(&mut record) {
                    Ok(more) => more,
                    Err(e) => {
                        let line = e.position().map(|p| p.line()).unwrap_or(0);
                        w.fail(format!("{}:{line}: {e}", file.display()), None);
                        continue;
                    }
                };
                if !more {
                    break;
                }
                let line = record.position().map(|p| p.line() as usize).unwrap_or(0);
                if first && self.opts.header {
                    first = false;
                    continue;
                }
                first = false;
                let raw_line =
                    record.iter().map(|f| String::from_utf8_lossy(f).to_string()).collect::<Vec<_>>().join("\t");
                if record.len() != names.len() {
                    w.fail(
                        format!("{}:{line}: expected {} fields, found {}", file.display(), names.len(), record.len()),
                        Some(raw_line),
                    );
                    w.progress.inc(1);
                    continue;
                }
                let mut row = Row::new();
                let mut bad = None;
                for (i, (name, field)) in names.iter().zip(record.iter()).enumerate() {
                    let Ok(text) = std::str::from_utf8(field) else {
                        let valid = std::str::from_utf8(field).unwrap_err().valid_up_to();
                        bad = Some(format!(
                            "{}:{line}: field \"{name}\" (column {}) is not valid UTF-8 (at byte {valid})",
                            file.display(),
                            i + 1
                        ));
                        break;
                    };
                    let Ok(target) = schema.field_with_name(name) else {
                        continue;
                    };
                    match csv_value(text, target.data_type()) {
                        Ok(v) => {
                            row.insert(name.clone(), v);
                        }
                        Err(msg) => {
                            bad = Some(format!("{}:{line}: field \"{name}\": {msg}", file.display()));
                            break;
                        }
                    }
                }
                w.progress.inc(1);
                match bad {
                    Some(msg) => w.fail(msg, Some(raw_line)),
                    None => {
                        rows.push(row);
                        ords.push(w.ordinal);
                        lines.push(line);
                        w.ordinal += 1;
                    }
                }
                if rows.len() >= 4096 {
                    self.flush_json(
                        &schema,
                        std::mem::take(&mut rows),
                        std::mem::take(&mut ords),
                        std::mem::take(&mut lines),
                        id_col.as_deref(),
                        file,
                        w,
                    )?;
                }
            }
            self.flush_json(&schema, rows, ords, lines, id_col.as_deref(), file, w)?;
        }
        Ok(())
    }
}

fn merge_inferred(acc: &mut Option<Schema>, next: Schema) -> Result<()> {
    *acc = Some(match acc.take() {
        None => next,
        Some(prev) => Schema::new(merge_fields(prev.fields(), next.fields())),
    });
    Ok(())
}

/// Union of two field lists (first-seen order) with types widened where they differ.
fn merge_fields(a: &arrow::datatypes::Fields, b: &arrow::datatypes::Fields) -> Vec<Field> {
    let mut out: Vec<Field> = a.iter().map(|f| f.as_ref().clone()).collect();
    for fb in b.iter() {
        match out.iter_mut().find(|f| f.name() == fb.name()) {
            Some(fa) => *fa = Field::new(fa.name(), merge_type(fa.data_type(), fb.data_type()), true),
            None => out.push(fb.as_ref().clone().with_nullable(true)),
        }
    }
    out
}

/// The narrowest type both values fit; text when nothing else does.
fn merge_type(a: &DataType, b: &DataType) -> DataType {
    match (a, b) {
        _ if a == b => a.clone(),
        (DataType::Null, x) | (x, DataType::Null) => x.clone(),
        (DataType::Int64, DataType::Float64) | (DataType::Float64, DataType::Int64) => DataType::Float64,
        (DataType::List(fa), DataType::List(fb)) => {
            DataType::List(Arc::new(Field::new(fa.name(), merge_type(fa.data_type(), fb.data_type()), true)))
        }
        (DataType::Struct(fa), DataType::Struct(fb)) => DataType::Struct(merge_fields(fa, fb).into()),
        _ => DataType::Utf8,
    }
}

fn infer_json(file: &Path, values: &[Value]) -> Result<Schema> {
    arrow::json::reader::infer_json_schema_from_iterator(values.iter().map(Ok))
        .with_context(|| format!("{}: cannot infer a schema", file.display()))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Visit each record of a JSONL file (or each element of a JSON array file) with its
/// line number, raw text and parse result (`Err` holds `col: message`). The callback
/// returns whether to go on.
/// Callback of [`for_each_json_record`]: line number, raw text, parsed value or error.
type RecordVisitor<'a> = dyn FnMut(usize, &str, std::result::Result<Value, String>) -> Result<bool> + 'a;

fn for_each_json_record(file: &Path, format: Format, f: &mut RecordVisitor<'_>) -> Result<()> {
    if format == Format::JsonArray {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow!("{}:{}:{}: {e}", file.display(), e.line(), e.column()))?;
        let Value::Array(items) = value else { bail!("{}: expected a JSON array of records", file.display()) };
        for (i, item) in items.into_iter().enumerate() {
            let raw = item.to_string();
            if !f(i + 1, &raw, Ok(item))? {
                break;
            }
        }
        return Ok(());
    }
    let reader =
        BufReader::with_capacity(1 << 20, File::open(file).with_context(|| format!("opening {}", file.display()))?);
    for (idx, line) in reader.split(b'\n').enumerate() {
        let line = line.with_context(|| format!("reading {}", file.display()))?;
        let line_no = idx + 1;
        let trimmed = line.strip_suffix(b"\r").unwrap_or(&line);
        if trimmed.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let go_on = match std::str::from_utf8(trimmed) {
            Err(e) => {
                let raw = String::from_utf8_lossy(trimmed).to_string();
                f(
                    line_no,
                    &raw,
                    Err(format!("{}: invalid UTF-8 (byte {} of the line)", e.valid_up_to() + 1, e.valid_up_to() + 1)),
                )?
            }
            Ok(text) => match serde_json::from_str::<Value>(text) {
                Ok(v) => f(line_no, text, Ok(v))?,
                Err(e) => f(line_no, text, Err(format!("{}: invalid JSON: {e}", e.column())))?,
            },
        };
        if !go_on {
            break;
        }
    }
    Ok(())
}

/// Inferred kind of a CSV column: the narrowest type every non-empty value fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CsvKind {
    Unknown,
    Int,
    Float,
    Bool,
    Text,
}

impl CsvKind {
    fn observe(&mut self, field: &[u8]) {
        if field.is_empty() || *self == CsvKind::Text {
            return;
        }
        let Ok(s) = std::str::from_utf8(field) else {
            *self = CsvKind::Text;
            return;
        };
        let s = s.trim();
        let is_int = s.parse::<i64>().is_ok();
        let is_float = is_int || (s.parse::<f64>().is_ok() && s.chars().any(|c| c.is_ascii_digit()));
        let is_bool = matches!(s, "true" | "false" | "True" | "False");
        *self = match (*self, is_int, is_float, is_bool) {
            (CsvKind::Unknown, true, _, _) => CsvKind::Int,
            (CsvKind::Unknown, false, true, _) => CsvKind::Float,
            (CsvKind::Unknown, _, _, true) => CsvKind::Bool,
            (CsvKind::Int, true, _, _) => CsvKind::Int,
            (CsvKind::Int | CsvKind::Float, _, true, _) => CsvKind::Float,
            (CsvKind::Bool, _, _, true) => CsvKind::Bool,
            _ => CsvKind::Text,
        };
    }

    fn data_type(self) -> DataType {
        match self {
            CsvKind::Int => DataType::Int64,
            CsvKind::Float => DataType::Float64,
            CsvKind::Bool => DataType::Boolean,
            CsvKind::Unknown | CsvKind::Text => DataType::Utf8,
        }
    }
}

fn csv_value(text: &str, ty: &DataType) -> std::result::Result<Value, String> {
    if text.is_empty() && !matches!(ty, DataType::Utf8) {
        return Ok(Value::Null);
    }
    let t = text.trim();
    Ok(match ty {
        DataType::Int64 | DataType::Int32 => {
            Value::from(t.parse::<i64>().map_err(|_| format!("\"{text}\" is not an integer"))?)
        }
        DataType::Float64 | DataType::Float32 => {
            let x = t.parse::<f64>().map_err(|_| format!("\"{text}\" is not a number"))?;
            serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null)
        }
        DataType::Boolean => match t {
            "true" | "True" | "1" => Value::Bool(true),
            "false" | "False" | "0" => Value::Bool(false),
            _ => return Err(format!("\"{text}\" is not a boolean")),
        },
        _ => Value::String(text.to_string()),
    })
}
