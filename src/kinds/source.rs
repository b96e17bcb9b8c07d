//! `source`: read records from local JSONL / JSON / CSV / TSV / Parquet files or a
//! Hugging Face Hub dataset. Gives every record a stable id (an id column, or
//! `<stage>-<ordinal>`). A malformed line or row becomes a failure naming
//! `file:line:col`; a file that cannot be read at all, or a Parquet file with the
//! wrong schema, stops the stage with a message naming the file.
//!
//! In a sharded run a large source of local JSONL or Parquet files is split among the
//! shards ([`Partitioning::OwnParts`]): part `i` of `n` reads the bytes (JSONL: cut at
//! line starts) or rows (Parquet) between the `i`-th and `i+1`-th `n`-quantile, finds
//! its first line number and record ordinal by counting the lines before it (a byte
//! scan, no parsing), and writes its records with its own inferred column types. The
//! merge step joins the parts' types into the whole source's (the join is associative:
//! a column's type is the narrowest all its values fit), keeps each part whose types
//! are the whole source's, and decodes the others again from their byte range: the
//! output, ids, line numbers and failures are those of one process.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty, UINT, expand_glob};
use synth_core::data::{self, ID, Row};
use synth_core::hub::HubSpec;
use synth_core::store::failures::FailureKind;
use synth_core::store::parquet::ParquetOut;
use synth_engine::stages::{
    Arity, BuildCtx, Cancelled, KindInfo, PartOutput, PartitionCtx, Partitioning, PlanCtx, PrepareCtx, Prepared, Role,
    RunCtx, Stage,
};

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
    OptionSpec::optional("path", Ty::Files, "local file(s): a path or glob, or a list of them").instead_of(&["hf", "url"]),
    OptionSpec::optional("hf", Ty::Struct(HF_OPTIONS), "a Hugging Face Hub dataset instead of local files")
        .instead_of(&["path", "url"]),
    OptionSpec::optional(
        "url",
        Ty::StrList,
        "http(s) URL(s) of files instead of local files (cached in the output directory; re-read with a conditional request)",
    )
    .instead_of(&["path", "hf"]),
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

/// In a sharded run, local JSONL or Parquet files of at least this many bytes in all
/// are split among the shards (`shard = true` splits smaller ones, `false` none):
/// below it a wave's round trip costs more than the reading saves.
pub const SPLIT_MIN_BYTES: u64 = 64 << 20;

/// Footer key of a part's inferred column types (JSONL parts of a sharded run).
const PART_TYPES_KEY: &str = "synth.source.part_types";

pub static KIND: KindInfo = KindInfo {
    name: "source",
    version: 2,
    about: "read records from local files (JSONL, JSON, CSV, TSV, Parquet) or a Hugging Face Hub dataset",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    example: "path = \"pipelines/data/personas.jsonl\"",
    build,
    ..KindInfo::DEFAULT
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

    /// Why this source cannot be split among shards (`None`: it can). A hub dataset's or
    /// a URL's format is known only once downloaded: split on request (`shard = true`),
    /// and a format that does not split is then read by part 0 alone.
    fn split_blocker(&self) -> Option<String> {
        if self.opts.limit.is_some() {
            return Some("a source with `limit` is read once (the limit counts records from the start)".into());
        }
        // A hub dataset or URL: nothing to say before the download.
        self.opts.path.as_ref()?;
        let files = self.local_files().ok()?;
        let formats: Vec<Format> = files.iter().filter_map(|f| self.format_of(f).ok()).collect();
        let splittable = |f: &Format| matches!(f, Format::Jsonl | Format::Parquet);
        if formats.len() != files.len() || formats.is_empty() || !formats.iter().all(|f| *f == formats[0]) {
            return Some("its files' formats are unknown or differ".into());
        }
        if !splittable(&formats[0]) {
            return Some(
                "only JSONL and Parquet files are split among shards (a JSON array, CSV or TSV file is read once)"
                    .into(),
            );
        }
        None
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

    fn partitioning(&self, ctx: &PartitionCtx<'_>) -> Partitioning {
        if ctx.shard == Some(false) || self.split_blocker().is_some() {
            return Partitioning::Whole;
        }
        if self.opts.path.is_none() {
            // Its size is unknown before the download.
            return if ctx.shard == Some(true) { Partitioning::OwnParts } else { Partitioning::Whole };
        }
        let bytes: u64 = self
            .local_files()
            .map(|files| files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        if ctx.shard == Some(true) || bytes >= SPLIT_MIN_BYTES { Partitioning::OwnParts } else { Partitioning::Whole }
    }

    fn why_whole(&self) -> Option<String> {
        self.split_blocker()
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
        let src = self.clone_for_worker();
        let limit = self.limit(ctx.limit);
        let format = formats[0];
        let meta = ctx.footer_meta();
        let out_path = ctx.output_path();
        let cancel = ctx.cancel.clone();
        let progress = ctx.progress.clone();
        let failures = ctx.failures.clone();
        let name = ctx.name.clone();
        let part = ctx.part;
        let (out, rows_in) = tokio::task::spawn_blocking(move || -> Result<(ParquetOut, u64)> {
            let mut w =
                Emitter { name, out_path, meta, out: None, ordinal: 0, written: 0, limit, cancel, progress, failures };
            // With a limit (it counts from the start), or files that do not split (a hub
            // dataset's CSV), part 0 reads everything and the other parts nothing.
            let splits = limit.is_none() && matches!(format, Format::Jsonl | Format::Parquet);
            let first_ordinal = match part {
                Some((i, _)) if !splits && i > 0 => return Ok((w.finish()?, 0)),
                Some((i, n)) if splits => match format {
                    Format::Parquet => src.read_parquet(&files, Some((i, n)), &mut w)?,
                    _ => src.read_jsonl_part(&files, i, n, &mut w)?,
                },
                _ => {
                    match format {
                        Format::Parquet => {
                            src.read_parquet(&files, None, &mut w)?;
                        }
                        Format::Jsonl | Format::JsonArray => src.read_json(&files, format, &mut w)?,
                        Format::Csv | Format::Tsv => src.read_csv(&files, format, &mut w)?,
                    }
                    0
                }
            };
            let rows_in = w.ordinal - first_ordinal;
            let out = w.finish()?;
            Ok((out, rows_in))
        })
        .await
        .context("source reader panicked")??;
        ctx.report.rows_in = rows_in;
        if part.is_some() {
            // A part may be empty; the merge step checks the whole source.
            return ctx.set_output(out);
        }
        self.check_not_empty(ctx, &out)?;
        ctx.set_output(out)
    }

    async fn combine(&self, ctx: &mut RunCtx, parts: &[PartOutput]) -> Result<()> {
        let files = ctx.prepared.files.clone();
        let format = self.format_of(files.first().context("no input files")?)?;
        // Which parts were written with other column types than the whole source's
        // (JSONL with inferred types): those are decoded again.
        let mut redo = vec![None; parts.len()];
        if format == Format::Jsonl && self.declared_schema().is_none() && self.limit(ctx.limit).is_none() {
            let mut own: Vec<Option<Schema>> = Vec::with_capacity(parts.len());
            for part in parts {
                let footer = synth_core::store::parquet::read_footer(&part.data)?;
                own.push(match footer.meta.get(PART_TYPES_KEY) {
                    Some(text) => Some(schema_from_json(text).with_context(|| {
                        format!("{}: unreadable {PART_TYPES_KEY} (not a part of this stage?)", part.data.display())
                    })?),
                    None => None,
                });
            }
            let mut whole: Option<Schema> = None;
            for s in own.iter().flatten() {
                merge_inferred(&mut whole, s.clone())?;
            }
            if let Some(whole) = whole {
                let shaped = self.shape_schema(&files[0], &whole)?;
                for (k, s) in own.iter().enumerate() {
                    if let Some(s) = s
                        && self.shape_schema(&files[0], s).ok().as_ref() != Some(&shaped)
                    {
                        redo[k] = Some(shaped.clone());
                    }
                }
            }
        }
        for (part, redo) in parts.iter().zip(&redo) {
            if redo.is_none() {
                part.keep_failures(ctx)?;
            }
        }
        let src = self.clone_for_worker();
        let n = parts.len();
        let datas: Vec<PathBuf> = parts.iter().map(|p| p.data.clone()).collect();
        let mut w = Emitter {
            name: ctx.name.clone(),
            out_path: ctx.output_path(),
            meta: ctx.footer_meta(),
            out: None,
            ordinal: 0,
            written: 0,
            limit: None,
            cancel: ctx.cancel.clone(),
            progress: ctx.progress.clone(),
            failures: ctx.failures.clone(),
        };
        let redone = redo.iter().filter(|r| r.is_some()).count();
        let out = tokio::task::spawn_blocking(move || -> Result<ParquetOut> {
            for (k, (data, redo)) in datas.iter().zip(redo).enumerate() {
                w.check_cancel()?;
                match redo {
                    Some(schema) => {
                        let (stretches, first) = jsonl_part(&files, k, n)?;
                        w.ordinal = first;
                        src.decode_json(&stretches, Format::Jsonl, Arc::new(schema), &mut w)?;
                    }
                    None => {
                        for batch in
                            synth_core::store::parquet::open_reader(data, synth_engine::stages::exec::BATCH_ROWS)?
                        {
                            let batch = batch.with_context(|| format!("reading {}", data.display()))?;
                            if batch.num_rows() > 0 {
                                w.write_batch(&batch)?;
                            }
                        }
                    }
                }
            }
            w.finish()
        })
        .await
        .context("source merge panicked")??;
        if redone > 0 {
            ctx.report.info.insert("parts_decoded_again".into(), redone.to_string());
        }
        self.check_not_empty(ctx, &out)?;
        ctx.set_output(out)
    }
}

impl Source {
    fn clone_for_worker(&self) -> Source {
        Source {
            name: self.name.clone(),
            opts: self.opts.clone(),
            types: self.types.clone(),
            delimiter: self.delimiter,
            root: self.root.clone(),
        }
    }

    fn check_not_empty(&self, ctx: &RunCtx, out: &ParquetOut) -> Result<()> {
        if out.rows() == 0 && ctx.failures.is_empty() && !self.opts.allow_empty {
            bail!(
                "no records in {} (set allow_empty = true to accept an empty source)",
                ctx.prepared.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(())
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
    progress: Arc<synth_core::progress::StageProgress>,
    failures: synth_core::store::failures::FailureLog,
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
                let strings = synth_core::data::arrow::compute::cast(arr, &DataType::Utf8)
                    .with_context(|| format!("{}: id column \"{col}\" cannot be read as text", file.display()))?;
                let strings = strings.as_any().downcast_ref::<StringArray>().expect("utf8").clone();
                // Records without an id fail; keep the others.
                if strings.null_count() > 0 {
                    let keep: synth_core::data::arrow::array::BooleanArray =
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
                    let filtered = synth_core::data::arrow::compute::filter_record_batch(&batch, &keep)?;
                    let ids = synth_core::data::arrow::compute::filter(&strings, &keep)?;
                    return self.write_with_ids(filtered, ids);
                }
                Arc::new(strings)
            }
            None => Arc::new(StringArray::from_iter_values(ordinals.iter().map(|o| self.ordinal_id(*o)))),
        };
        self.write_with_ids(batch, ids)
    }

    fn write_with_ids(&mut self, batch: RecordBatch, ids: ArrayRef) -> Result<()> {
        self.write_batch(&data::with_ids(&batch, ids)?)
    }

    /// Write a batch that already carries its ids (a part's rows, in the merge step).
    fn write_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.out.is_none() {
            self.out = Some(ParquetOut::create(&self.out_path, batch.schema(), self.meta.clone(), true)?);
        }
        let out = self.out.as_mut().expect("created");
        out.write(batch)?;
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
                let mut inferred = Inferred::default();
                let mut seen = 0;
                for_each_json_record(file, format, &mut |_, _, rec| {
                    if let Ok(Value::Object(m)) = rec {
                        inferred.add(&m);
                        seen += 1;
                    }
                    Ok(seen < 1000)
                })?;
                Schema::new(inferred.fields)
            }
            Format::Csv | Format::Tsv => self.infer_csv(&[file.to_path_buf()], format, Some(1000))?,
        };
        self.shape_schema(file, &raw)
    }

    /// Read Parquet files, all of them or (`part = Some((i, n))`, a sharded run) the rows
    /// between the `i`-th and `i+1`-th `n`-quantile of their rows. Returns the ordinal of
    /// the first record read.
    fn read_parquet(&self, files: &[PathBuf], part: Option<(usize, usize)>, w: &mut Emitter) -> Result<u64> {
        // Every file's columns are checked against the first's before any is read (a
        // part reads only some of them, and must stop where one process stops).
        let mut reference: Option<(PathBuf, Schema)> = None;
        let mut shapes = Vec::with_capacity(files.len());
        let mut counts = Vec::with_capacity(files.len());
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
            counts.push(builder.metadata().file_metadata().num_rows().max(0) as u64);
            shapes.push((file_schema, shaped));
        }
        let total: u64 = counts.iter().sum();
        let (lo, hi) = match part {
            None => (0, total),
            Some((i, n)) => {
                let at = |k: usize| (total as u128 * k as u128 / n.max(1) as u128) as u64;
                (at(i), at(i + 1))
            }
        };
        w.progress.set_total(w.limit.map_or(hi - lo, |l| l.min(hi - lo)));
        let mut base = 0u64;
        for ((file, (file_schema, shaped)), count) in files.iter().zip(shapes).zip(counts) {
            let (from, to) = (lo.max(base), hi.min(base + count));
            base += count;
            if from >= to && part.is_some() {
                continue;
            }
            let (from, to) = (from - (base - count), to.max(from) - (base - count));
            let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(f)
                .with_context(|| format!("{}: not a readable Parquet file", file.display()))?;
            // The row groups that hold rows `from..to`, and the rows to skip in the first.
            let mut groups = Vec::new();
            let mut skip = 0u64;
            let mut at = 0u64;
            for (g, rg) in builder.metadata().row_groups().iter().enumerate() {
                let n = rg.num_rows().max(0) as u64;
                if at + n > from && at < to {
                    if groups.is_empty() {
                        skip = from - at;
                    }
                    groups.push(g);
                }
                at += n;
            }
            let indices: Vec<usize> =
                shaped.fields().iter().map(|f| file_schema.index_of(f.name()).expect("checked")).collect();
            let mask = ProjectionMask::roots(builder.parquet_schema(), indices.clone());
            let mut builder = builder.with_projection(mask).with_batch_size(synth_engine::stages::exec::BATCH_ROWS);
            if part.is_some() {
                builder = builder.with_row_groups(groups).with_offset(skip as usize).with_limit((to - from) as usize);
            }
            let reader = builder.build().with_context(|| format!("reading {}", file.display()))?;
            w.ordinal = base - count + from;
            let id_col = self.id_source(&shaped).map(str::to_string);
            for batch in reader {
                w.check_cancel()?;
                if w.done() {
                    return Ok(lo);
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
        Ok(lo)
    }

    /// The schema `columns` and `types` declare in full (then nothing is inferred).
    fn declared_schema(&self) -> Option<Schema> {
        let cols = self.opts.columns.as_ref()?;
        if !cols.iter().all(|c| self.types.contains_key(c)) {
            return None;
        }
        Some(Schema::new(cols.iter().map(|c| Field::new(c, self.types[c].clone(), true)).collect::<Vec<_>>()))
    }

    fn read_json(&self, files: &[PathBuf], format: Format, w: &mut Emitter) -> Result<()> {
        let stretches: Vec<Stretch> = files.iter().map(|f| Stretch::whole(f)).collect();
        // Pass 1: infer one schema over every record of every file (a column that is
        // null in the first thousand lines must not be typed wrongly).
        let schema = match self.declared_schema() {
            Some(s) => Some(s),
            None => match infer_stretches(&stretches, format, &w.cancel)? {
                Some(raw) => Some(self.shape_schema(&files[0], &raw)?),
                None => None,
            },
        };
        w.check_cancel()?;
        match schema {
            Some(schema) => self.decode_json(&stretches, format, Arc::new(schema), w),
            None => self.only_failures_json(&stretches, format, w),
        }
    }

    /// Part `part` of `parts` of a JSONL source in a sharded run: its byte range only,
    /// decoded with the column types of its own records (recorded in the footer for the
    /// merge step, which decodes the part again if the whole source's types differ).
    /// Returns the ordinal of the part's first record.
    fn read_jsonl_part(&self, files: &[PathBuf], part: usize, parts: usize, w: &mut Emitter) -> Result<u64> {
        let (stretches, first) = jsonl_part(files, part, parts)?;
        w.ordinal = first;
        if let Some(schema) = self.declared_schema() {
            self.decode_json(&stretches, Format::Jsonl, Arc::new(schema), w)?;
            return Ok(first);
        }
        let Some(raw) = infer_stretches(&stretches, Format::Jsonl, &w.cancel)? else {
            self.only_failures_json(&stretches, Format::Jsonl, w)?;
            return Ok(first);
        };
        w.check_cancel()?;
        w.meta.push((PART_TYPES_KEY.to_string(), schema_to_json(&raw)));
        // Columns the whole source has but this part lacks cannot be shaped here: the
        // merge step decodes such a part with the whole source's schema.
        if let Ok(shaped) = self.shape_schema(&files[0], &raw) {
            self.decode_json(&stretches, Format::Jsonl, Arc::new(shaped), w)?;
        }
        Ok(first)
    }

    /// Pass 2: decode in chunks; bad lines become failures.
    fn decode_json(&self, stretches: &[Stretch], format: Format, schema: SchemaRef, w: &mut Emitter) -> Result<()> {
        let id_col = self.id_source(&schema).map(str::to_string);
        for stretch in stretches {
            let file = stretch.file.as_path();
            let mut rows: Vec<Row> = Vec::new();
            let mut ords: Vec<u64> = Vec::new();
            let mut lines: Vec<usize> = Vec::new();
            let mut stop = false;
            stretch.visit(format, &mut |line, raw, rec| {
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
                        format!(
                            "{}:{line}: expected a JSON object, found {}",
                            file.display(),
                            synth_core::data::json_type(&other)
                        ),
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
    fn only_failures_json(&self, stretches: &[Stretch], format: Format, w: &mut Emitter) -> Result<()> {
        for stretch in stretches {
            let file = stretch.file.as_path();
            stretch.visit(format, &mut |line, raw, rec| {
                match rec {
                    Ok(other) => w.fail(
                        format!(
                            "{}:{line}: expected a JSON object, found {}",
                            file.display(),
                            synth_core::data::json_type(&other)
                        ),
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
fn merge_fields(
    a: &synth_core::data::arrow::datatypes::Fields,
    b: &synth_core::data::arrow::datatypes::Fields,
) -> Vec<Field> {
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

/// The column types of a set of JSON records: per column the narrowest type all its
/// values fit ([`value_type`], joined by [`merge_type`]); columns in first-seen order.
/// The join is associative, so the types of a whole source are the join of its parts'.
#[derive(Default)]
struct Inferred {
    fields: Vec<Field>,
    index: std::collections::HashMap<String, usize>,
}

impl Inferred {
    fn add(&mut self, record: &serde_json::Map<String, Value>) {
        for (k, v) in record {
            let t = value_type(v);
            match self.index.get(k) {
                Some(&i) => {
                    let f = &mut self.fields[i];
                    if f.data_type() != &t {
                        *f = Field::new(k, merge_type(f.data_type(), &t), true);
                    }
                }
                None => {
                    self.index.insert(k.clone(), self.fields.len());
                    self.fields.push(Field::new(k, t, true));
                }
            }
        }
    }

    fn schema(self, any: bool) -> Option<Schema> {
        any.then(|| Schema::new(self.fields))
    }
}

/// The type of one JSON value (objects as structs, arrays as lists of their
/// elements' joined type).
fn value_type(v: &Value) -> DataType {
    match v {
        Value::Null => DataType::Null,
        Value::Bool(_) => DataType::Boolean,
        Value::Number(n) if n.is_i64() => DataType::Int64,
        Value::Number(_) => DataType::Float64,
        Value::String(_) => DataType::Utf8,
        Value::Array(items) => {
            let item = items.iter().fold(DataType::Null, |acc, x| merge_type(&acc, &value_type(x)));
            DataType::List(Arc::new(Field::new_list_field(item, true)))
        }
        Value::Object(map) => {
            let mut inner = Inferred::default();
            inner.add(map);
            DataType::Struct(inner.fields.into())
        }
    }
}

/// Infer the column types of the records of `stretches` (`None`: no record is a JSON object).
fn infer_stretches(
    stretches: &[Stretch],
    format: Format,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<Option<Schema>> {
    let mut inferred = Inferred::default();
    let mut any = false;
    for stretch in stretches {
        stretch.visit(format, &mut |_, _, rec| {
            if let Ok(Value::Object(map)) = rec {
                inferred.add(&map);
                any = true;
            }
            Ok(!cancel.is_cancelled())
        })?;
        if cancel.is_cancelled() {
            bail!(Cancelled);
        }
    }
    Ok(inferred.schema(any))
}

/// A part's inferred column types as text (footer metadata): the closed set of types
/// inference yields.
fn schema_to_json(schema: &Schema) -> String {
    fn ty(t: &DataType) -> Value {
        match t {
            DataType::List(f) => serde_json::json!({ "list": ty(f.data_type()) }),
            DataType::Struct(fs) => serde_json::json!({ "struct": fields(fs) }),
            other => Value::String(data::type_display(other).to_string()),
        }
    }
    fn fields(fs: &synth_core::data::arrow::datatypes::Fields) -> Value {
        Value::Array(fs.iter().map(|f| serde_json::json!([f.name(), ty(f.data_type())])).collect())
    }
    fields(schema.fields()).to_string()
}

fn schema_from_json(text: &str) -> Result<Schema> {
    fn ty(v: &Value) -> Result<DataType> {
        Ok(match v {
            Value::String(s) => match s.as_str() {
                "null" => DataType::Null,
                other => data::parse_type_name(other).ok_or_else(|| anyhow!("unknown type \"{other}\""))?,
            },
            Value::Object(m) if m.contains_key("list") => {
                DataType::List(Arc::new(Field::new_list_field(ty(&m["list"])?, true)))
            }
            Value::Object(m) if m.contains_key("struct") => DataType::Struct(fields(&m["struct"])?.into()),
            other => bail!("not a type: {other}"),
        })
    }
    fn fields(v: &Value) -> Result<Vec<Field>> {
        let Value::Array(items) = v else { bail!("not a field list") };
        items
            .iter()
            .map(|item| match item.as_array().map(|a| a.as_slice()) {
                Some([Value::String(name), t]) => Ok(Field::new(name, ty(t)?, true)),
                _ => bail!("not a field: {item}"),
            })
            .collect()
    }
    Ok(Schema::new(fields(&serde_json::from_str(text)?)?))
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
    Stretch::whole(file).visit(format, f)
}

/// What one pass reads of one file: all of it, or (a part of a JSONL source) the byte
/// range `start..end`, which starts at a line start; its first line is `first_line`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stretch {
    file: PathBuf,
    range: Option<(u64, u64)>,
    first_line: usize,
}

impl Stretch {
    fn whole(file: &Path) -> Stretch {
        Stretch { file: file.to_path_buf(), range: None, first_line: 1 }
    }

    /// Visit each record with its line number, raw text and parse result.
    fn visit(&self, format: Format, f: &mut RecordVisitor<'_>) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let file = self.file.as_path();
        if format == Format::JsonArray {
            return for_each_json_record(file, format, f);
        }
        let mut handle = File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let reader: Box<dyn BufRead> = match self.range {
            None => Box::new(BufReader::with_capacity(1 << 20, handle)),
            Some((start, end)) => {
                handle.seek(SeekFrom::Start(start)).with_context(|| format!("reading {}", file.display()))?;
                Box::new(BufReader::with_capacity(1 << 20, handle.take(end.saturating_sub(start))))
            }
        };
        for (idx, line) in reader.split(b'\n').enumerate() {
            let line = line.with_context(|| format!("reading {}", file.display()))?;
            let line_no = self.first_line + idx;
            let trimmed = line.strip_suffix(b"\r").unwrap_or(&line);
            if is_blank(trimmed) {
                continue;
            }
            let go_on = match std::str::from_utf8(trimmed) {
                Err(e) => {
                    let raw = String::from_utf8_lossy(trimmed).to_string();
                    f(
                        line_no,
                        &raw,
                        Err(format!(
                            "{}: invalid UTF-8 (byte {} of the line)",
                            e.valid_up_to() + 1,
                            e.valid_up_to() + 1
                        )),
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
}

/// A line that holds no record (only ASCII white space).
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| b.is_ascii_whitespace())
}

/// Part `part` of `parts` of JSONL files, as stretches, and the ordinal of its first
/// record. The files' bytes, taken as one sequence, are cut at the `parts`-quantiles,
/// each cut moved forward to the next line start; the part's first line number and
/// ordinal come from counting the lines and records before it (a byte scan).
fn jsonl_part(files: &[PathBuf], part: usize, parts: usize) -> Result<(Vec<Stretch>, u64)> {
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| f.metadata().map(|m| m.len()).with_context(|| format!("reading {}", f.display())))
        .collect::<Result<_>>()?;
    let total: u64 = sizes.iter().sum();
    // Cut k as (file, offset at a line start); (files.len(), 0) is the end.
    let cut = |k: usize| -> Result<(usize, u64)> {
        let global = (total as u128 * k as u128 / parts.max(1) as u128) as u64;
        let mut base = 0u64;
        for (f, &size) in sizes.iter().enumerate() {
            if global < base + size {
                let at = line_start_from(&files[f], global - base)?;
                return Ok(if at >= size { (f + 1, 0) } else { (f, at) });
            }
            base += size;
        }
        Ok((files.len(), 0))
    };
    let (from, to) = (cut(part)?, cut(part + 1)?);
    let mut first = 0u64;
    for file in &files[..from.0] {
        first += count_lines(file, u64::MAX)?.1;
    }
    let mut stretches = Vec::new();
    if from.0 < files.len() {
        let (newlines, records) = count_lines(&files[from.0], from.1)?;
        first += records;
        for f in from.0..to.0.min(files.len() - 1) + 1 {
            let start = if f == from.0 { from.1 } else { 0 };
            let end = if f == to.0 { to.1 } else { sizes[f] };
            if (f, start) >= to || start >= end {
                continue;
            }
            let first_line = if f == from.0 { newlines as usize + 1 } else { 1 };
            stretches.push(Stretch { file: files[f].clone(), range: Some((start, end)), first_line });
        }
    }
    Ok((stretches, first))
}

/// The first line start at or after `offset` (the file's size if none).
fn line_start_from(file: &Path, offset: u64) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    if offset == 0 {
        return Ok(0);
    }
    let mut f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    f.seek(SeekFrom::Start(offset - 1)).with_context(|| format!("reading {}", file.display()))?;
    let mut at = offset - 1;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", file.display()))?;
        if n == 0 {
            return Ok(at);
        }
        if let Some(i) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(at + i as u64 + 1);
        }
        at += n as u64;
    }
}

/// Newlines and records (non-blank lines) in the first `end` bytes of a file, which end
/// at a line start (or the file's end).
fn count_lines(file: &Path, end: u64) -> Result<(u64, u64)> {
    use std::io::Read;
    let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut reader = f.take(end);
    let mut buf = vec![0u8; 1 << 20];
    let (mut newlines, mut records, mut content) = (0u64, 0u64, false);
    loop {
        let n = reader.read(&mut buf).with_context(|| format!("reading {}", file.display()))?;
        if n == 0 {
            break;
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let (segment, ended) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            content |= !is_blank(segment);
            match ended {
                Some(i) => {
                    newlines += 1;
                    records += content as u64;
                    content = false;
                    rest = &rest[i..];
                }
                None => rest = &[],
            }
        }
    }
    Ok((newlines, records + content as u64))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fold(records: &[Value]) -> Option<Schema> {
        let mut inferred = Inferred::default();
        for r in records {
            inferred.add(r.as_object().unwrap());
        }
        inferred.schema(!records.is_empty())
    }

    #[test]
    fn inferred_types_are_the_same_for_any_split_of_the_records() {
        let records = vec![
            json!({"a": null, "b": 1, "c": [1, 2]}),
            json!({"a": "x", "b": 2.5, "d": {"p": 1}}),
            json!({"b": 3, "c": [], "d": {"q": "z", "p": 2.0}}),
            json!({"a": true, "c": [1.5], "e": [[1], null]}),
            json!({"d": null, "e": [[2.5]], "f": 7}),
        ];
        let whole = fold(&records).unwrap();
        assert_eq!(whole.field_with_name("b").unwrap().data_type(), &DataType::Float64);
        assert_eq!(whole.field_with_name("a").unwrap().data_type(), &DataType::Utf8);
        for cut1 in 0..=records.len() {
            for cut2 in cut1..=records.len() {
                let mut joined = None;
                for part in [&records[..cut1], &records[cut1..cut2], &records[cut2..]] {
                    if let Some(s) = fold(part) {
                        merge_inferred(&mut joined, s).unwrap();
                    }
                }
                assert_eq!(joined.as_ref(), Some(&whole), "cut at {cut1} and {cut2}");
            }
        }
        let text = schema_to_json(&whole);
        assert_eq!(schema_from_json(&text).unwrap(), whole, "{text}");
    }

    #[test]
    fn parts_cut_at_line_starts_and_cover_every_record_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        let mut all = Vec::new();
        for (f, lines) in [(0, 37usize), (1, 0), (2, 5), (3, 120)] {
            let mut text = String::new();
            for i in 0..lines {
                match (i * 7 + f) % 11 {
                    3 => text.push_str("  \r\n"),
                    5 => text.push_str(&format!("{{\"k\": \"{}\"}}\r\n", "y".repeat(i * 13 % 200))),
                    _ => text.push_str(&format!("{{\"f\": {f}, \"i\": {i}}}\n")),
                }
            }
            if f == 2 {
                text.push_str("{\"last\": \"no newline\"}");
            }
            let path = dir.path().join(format!("f{f}.jsonl"));
            std::fs::write(&path, &text).unwrap();
            Stretch::whole(&path)
                .visit(Format::Jsonl, &mut |line, raw, _| {
                    all.push((f, line, raw.to_string()));
                    Ok(true)
                })
                .unwrap();
            files.push(path);
        }
        for parts in 1..9 {
            let mut seen = Vec::new();
            for part in 0..parts {
                let (stretches, first) = jsonl_part(&files, part, parts).unwrap();
                assert_eq!(first as usize, seen.len(), "{parts} parts: part {part} starts at the next record");
                for s in &stretches {
                    let f = files.iter().position(|x| *x == s.file).unwrap();
                    s.visit(Format::Jsonl, &mut |line, raw, _| {
                        seen.push((f, line, raw.to_string()));
                        Ok(true)
                    })
                    .unwrap();
                }
            }
            assert_eq!(seen, all, "{parts} parts");
        }
    }
}
