//! `embed`: embed one text per record — a column, or a template over columns —
//! with a named embedder, storing the vector as a `FixedSizeList<f32>` column.
//! Vectors are cached by (embedder identity, text hash), so re-runs and resumed
//! runs compute only new texts. Embedders that learn corpus statistics (hashing
//! with IDF) first see every text of the input.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::{self, Row};
use synth_core::store::cache::Use;
use synth_core::store::failures::FailureKind;
use synth_core::store::parquet::stream_batches;
use synth_core::template::Templates;
use synth_embed::Embedder;
use synth_engine::stages::{
    BuildCtx, Cancelled, KindInfo, PartitionCtx, Partitioning, PlanCtx, PrepareCtx, Prepared, RunCtx, Sharding, Stage,
};
use synth_llm::CallCtx;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("embedder", Ty::Str, "name of an [embedders.NAME] table"),
    OptionSpec::optional("column", Ty::Str, "text column to embed"),
    OptionSpec::optional("template", Ty::Str, "template over columns giving the text to embed (instead of column)"),
    OptionSpec::default("output", Ty::Str, "\"embedding\"", "name of the vector column"),
    OptionSpec::optional("batch_size", POSITIVE, "texts per embedder call (default: the embedder's)").runtime_only(),
];

pub static KIND: KindInfo = KindInfo {
    name: "embed",
    about: "embed a text column (or template) with an embedder into a FixedSizeList<f32> column",
    options: OPTIONS,
    example: "embedder = \"e\"\ncolumn = \"text\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    embedder: String,
    column: Option<String>,
    template: Option<String>,
    output: String,
    batch_size: Option<usize>,
}

struct Embed {
    opts: Options,
    templates: Arc<Templates>,
    vars: Vec<String>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut templates = Templates::new();
    let vars = match (&opts.column, &opts.template) {
        (Some(c), None) => vec![c.clone()],
        (None, Some(t)) => match templates.add("text", t) {
            Ok(v) => v.into_iter().collect(),
            Err(e) => {
                ctx.error(diags, "template", format!("bad template: {e}"));
                return None;
            }
        },
        _ => {
            ctx.error(diags, "", "give exactly one of \"column\" and \"template\"");
            return None;
        }
    };
    Some(Box::new(Embed { opts, templates: Arc::new(templates), vars }))
}

pub fn vector_type(dim: usize) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), dim as i32)
}

/// The dimension an embedder declaration promises (for planning).
fn declared_dim(decl: &synth_core::config::decl::Decl) -> Option<usize> {
    decl.options.get("dim").and_then(|v| v.as_u64()).map(|d| d as usize).or_else(|| {
        let model = decl.options.get("model").and_then(|v| v.as_str())?;
        synth_embed::fastembed::named_dim(model)
    })
}

/// The text of one row: its `column`, or the `text` template rendered over it.
fn text_of(column: &Option<String>, templates: &Templates, row: &Row) -> std::result::Result<String, String> {
    match column {
        Some(c) => match row.get(c) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Null) | None => Ok(String::new()),
            Some(other) => Ok(other.to_string()),
        },
        None => templates.render("text", row),
    }
}

/// Per row of a batch, in order: its text, or why it has none with the row as JSON.
type Texts = Vec<std::result::Result<String, (String, Option<String>)>>;

impl Embed {
    /// The texts of a batch, rendered on every core (off the async runtime).
    async fn texts(&self, batch: &RecordBatch) -> Result<Texts> {
        use rayon::prelude::*;
        let (batch, column, templates) = (batch.clone(), self.opts.column.clone(), self.templates.clone());
        tokio::task::spawn_blocking(move || {
            (0..batch.num_rows())
                .into_par_iter()
                .map(|i| {
                    let row = data::row_json(&batch, i);
                    text_of(&column, &templates, &row).map_err(|e| (e, serde_json::to_string(&row).ok()))
                })
                .collect()
        })
        .await
        .context("text worker panicked")
    }
}

/// Every vector has the embedder's dimension.
fn check_dims(vectors: &[Vec<f32>], dim: usize, name: &str) -> Result<()> {
    match vectors.iter().find(|v| v.len() != dim) {
        Some(v) => Err(anyhow!("embedder \"{name}\" returned a {}-dimensional vector, expected {dim}", v.len())),
        None => Ok(()),
    }
}

impl Embed {
    /// The vectors of `texts` through the cache: hits from it, the rest embedded in
    /// batches and stored before they count as done.
    #[allow(clippy::too_many_arguments)]
    async fn cached_vectors(
        &self,
        texts: &[String],
        embedder: &dyn Embedder,
        cache: &synth_core::store::cache::Cache,
        usage: &Use,
        call: &CallCtx,
        batch_size: usize,
        dim: usize,
        ctx: &RunCtx,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let id = embedder.id();
        let hashes: Vec<String> = texts.iter().map(|t| blake3::hash(t.as_bytes()).to_hex().to_string()).collect();
        let mut vectors = cache.get_vectors(&id, &hashes, usage)?;
        let missing: Vec<usize> = (0..vectors.len()).filter(|i| vectors[*i].is_none()).collect();
        ctx.progress.cache_hits.fetch_add((vectors.len() - missing.len()) as u64, std::sync::atomic::Ordering::Relaxed);
        for chunk in missing.chunks(batch_size) {
            let chunk_texts: Vec<String> = chunk.iter().map(|i| texts[*i].clone()).collect();
            let computed = embedder
                .embed(&chunk_texts, call)
                .await
                .with_context(|| format!("embedder \"{}\"", self.opts.embedder))?;
            if computed.len() != chunk.len() {
                bail!(
                    "embedder \"{}\" returned {} vectors for {} texts",
                    self.opts.embedder,
                    computed.len(),
                    chunk.len()
                );
            }
            check_dims(&computed, dim, &self.opts.embedder)?;
            let mut store = Vec::with_capacity(chunk.len());
            for (i, v) in chunk.iter().zip(computed) {
                store.push((hashes[*i].clone(), v.clone()));
                vectors[*i] = Some(v);
            }
            cache.put_vectors(&id, store, usage).await?;
        }
        Ok(vectors)
    }
}

#[async_trait]
impl Stage for Embed {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let Some(decl) = ctx.embedders.get(&self.opts.embedder).cloned() else {
            let hint =
                synth_core::config::diag::did_you_mean(&self.opts.embedder, ctx.embedders.keys().map(String::as_str))
                    .unwrap_or_default();
            ctx.error("embedder", format!("no embedder \"{}\" in [embedders]{hint}", self.opts.embedder));
            return None;
        };
        match &self.opts.column {
            Some(c) => ctx.require_columns("column", 0, [c.as_str()]),
            None => ctx.check_variables("template", "template", self.vars.iter().map(String::as_str), &[data::ID]),
        }
        let input = ctx.input_schema(0)?;
        if input.field_with_name(&self.opts.output).is_ok() {
            ctx.error("output", format!("the input already has a column \"{}\"", self.opts.output));
            return None;
        }
        let dim = declared_dim(&decl)?;
        Some(data::schema_with_id(input.fields().iter().skip(1).map(|f| f.as_ref().clone()).chain([Field::new(
            &self.opts.output,
            vector_type(dim),
            false,
        )])))
    }

    fn partitioning(&self, ctx: &PartitionCtx<'_>) -> Partitioning {
        // An embedder fitted on the corpus (hashing with IDF) sees the whole input first.
        let fits = ctx.embedders.get(&self.opts.embedder).is_some_and(synth_embed::fits_corpus);
        Partitioning::ByRecord(Sharding { heavy: true, fits_whole_input: fits })
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let decl = ctx.services.embedder_decl(&self.opts.embedder)?;
        let mut p = Prepared::default();
        p.fingerprint.insert("embedder".into(), synth_embed::identity(decl)?.to_string());
        Ok(Some(p))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let mut embedder: Arc<dyn Embedder> = ctx
            .services
            .embedder(&self.opts.embedder)
            .with_context(|| format!("embedder \"{}\"", self.opts.embedder))?;
        let input = ctx.inputs[0].clone();
        // Fit corpus statistics first when the embedder needs them (on the whole input,
        // also when this run is one shard of it).
        if let Some(mut fitter) = embedder.fitter() {
            let whole = ctx.whole_input.as_ref().unwrap_or(&input);
            let mut rx = stream_batches(whole.path.clone(), 4096);
            while let Some(batch) = rx.recv().await {
                let batch = batch?;
                for text in self.texts(&batch).await? {
                    fitter.observe(&text.unwrap_or_default());
                }
                if ctx.cancel.is_cancelled() {
                    bail!(Cancelled);
                }
            }
            embedder = fitter.finish();
        }
        let dim = embedder.dim();
        let id = embedder.id();
        ctx.report.info.insert("embedder".into(), id.clone());
        let out_field = Field::new(&self.opts.output, vector_type(dim), false);
        let schema = data::schema_with_id(
            input.schema.fields().iter().skip(1).map(|f| f.as_ref().clone()).chain([out_field.clone()]),
        );
        let writer = synth_engine::stages::exec::WriterTask::spawn(ctx.create_output_keeping_ids(schema.clone())?);
        let cache = ctx.services.cache()?;
        let usage = Use { stage: ctx.name.clone(), fingerprint: ctx.fingerprint.clone() };
        let call = CallCtx::new(&ctx.name, &ctx.fingerprint, ctx.progress.clone());
        let batch_size = self.opts.batch_size.unwrap_or_else(|| embedder.batch_size()).max(1);
        ctx.progress.set_total(input.num_rows);
        let mut rx = stream_batches(input.path.clone(), batch_size.max(256));
        let mut rows_in = 0u64;
        while let Some(batch) = rx.recv().await {
            if ctx.cancel.is_cancelled() {
                bail!(Cancelled);
            }
            let batch = batch?;
            let mut keep = vec![true; batch.num_rows()];
            let mut texts = Vec::with_capacity(batch.num_rows());
            for (i, (text, keep_row)) in self.texts(&batch).await?.into_iter().zip(keep.iter_mut()).enumerate() {
                match text {
                    Ok(t) => texts.push(t),
                    Err((e, record)) => {
                        ctx.fail(data::ids(&batch).value(i), FailureKind::Template, e, record);
                        *keep_row = false;
                    }
                }
            }
            if let Some(lineage) = &ctx.lineage {
                lineage.push_kept(rows_in, &keep);
            }
            let kept = synth_core::data::arrow::compute::filter_record_batch(
                &batch,
                &synth_core::data::arrow::array::BooleanArray::from(keep),
            )?;
            let vectors: Vec<Option<Vec<f32>>> = if embedder.cacheable() {
                self.cached_vectors(&texts, &*embedder, &cache, &usage, &call, batch_size, dim, ctx).await?
            } else {
                // Computing is cheaper than the cache: every core, off the async runtime.
                let e = embedder.clone();
                let computed = tokio::task::spawn_blocking(move || e.embed_blocking(&texts))
                    .await
                    .context("embedder worker panicked")?;
                let Some(computed) = computed else {
                    bail!("embedder \"{}\" cannot embed without its cache", self.opts.embedder);
                };
                check_dims(&computed, dim, &self.opts.embedder)?;
                computed.into_iter().map(Some).collect()
            };
            let flat: Vec<f32> = vectors.into_iter().flat_map(|v| v.expect("filled")).collect();
            let values = Arc::new(Float32Array::from(flat));
            let list = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                dim as i32,
                values,
                None,
            )?;
            let mut cols: Vec<ArrayRef> = kept.columns().to_vec();
            cols.push(Arc::new(list));
            writer.write(RecordBatch::try_new(schema.clone(), cols)?).await?;
            rows_in += batch.num_rows() as u64;
            ctx.progress.inc(batch.num_rows() as u64);
        }
        let out = writer.finish().await?;
        ctx.report.rows_in = rows_in;
        ctx.set_output(out)
    }
}
