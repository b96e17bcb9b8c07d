//! `retrieve`: for every record of the first input (queries), find the most and the
//! least similar record of the second input (corpus) by inner product of their
//! vector columns, and carry the matched corpus columns over with their scores.
//!
//! `method = "exact"` (the default) searches through a blocked GEMM with the CPU's
//! fastest kernel, chosen at run time, into cache-sized score tiles folded into running
//! maxima and minima (`synth_retrieval::gemm`); results equal a float64 reference on
//! every CPU. `method = "hnsw"` builds a
//! usearch index and measures its recall against the exact kernel on a sample of
//! queries, reported in the manifest (farthest-point search is where HNSW is weak).
//! Boolean corpus columns can restrict which records may be a maximum (`most_where`)
//! or a minimum (`least_where`), e.g. "the least relevant triplet must be answerable".
//!
//! In a sharded run, `exact` splits the corpus among the shards
//! ([`Partitioning::SplitInput`]): each shard searches its part for every query and
//! writes its winners with their global corpus positions and f64 scores; the merge
//! ([`Stage::combine`]) keeps, per query, the larger maximum and the smaller minimum,
//! ties to the lower corpus position: exactly the unsharded result (within a part the
//! order of the corpus is kept, so the part's own tie rule agrees). `hnsw` searches
//! the whole corpus once. (`fused`, an older one-pass kernel, was removed: no faster
//! with AVX-512, ~5% of peak without; BENCHMARKS.md, "Exact retrieval".)

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::{self, ID};
use synth_core::store::parquet::stream_batches;
use synth_engine::stages::{
    Arity, BuildCtx, Cancelled, Input, KindInfo, PartitionCtx, Partitioning, PlanCtx, PrepareCtx, Prepared, RunCtx,
    Stage,
};
use synth_retrieval::{Extremes, hnsw};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("query_column", Ty::Str, "\"embedding\"", "vector column of the first input (queries)"),
    OptionSpec::default("corpus_column", Ty::Str, "\"embedding\"", "vector column of the second input (corpus)"),
    OptionSpec::default(
        "method",
        Ty::Enum(&["exact", "hnsw"]),
        "\"exact\"",
        "exact: a blocked GEMM with the CPU's fastest kernel chosen at run time, folded into max and min (results equal a float64 reference on every CPU); hnsw: usearch index, recall measured on a sample",
    )
    .retired(&[(
        "fused",
        "use \"exact\" (as fast with AVX-512, ~20x faster without it, and equal to a float64 reference; BENCHMARKS.md, \"Exact retrieval\")",
    )]),
    OptionSpec::optional("carry", Ty::StrList, "corpus columns to copy for each match (default: all but vectors)"),
    OptionSpec::default("most_prefix", Ty::Str, "\"most_\"", "prefix of the most similar match's columns"),
    OptionSpec::default("least_prefix", Ty::Str, "\"least_\"", "prefix of the least similar match's columns"),
    OptionSpec::optional(
        "most_where",
        Ty::Str,
        "boolean corpus column: only rows where it is true may be the most similar",
    ),
    OptionSpec::optional(
        "least_where",
        Ty::Str,
        "boolean corpus column: only rows where it is true may be the least similar",
    ),
    OptionSpec::default("keep_vector", Ty::Bool, "false", "keep the query vector column in the output"),
    OptionSpec::default("connectivity", POSITIVE, "32", "hnsw: graph degree (M)"),
    OptionSpec::default("expansion_add", POSITIVE, "128", "hnsw: ef at construction"),
    OptionSpec::default("expansion_search", POSITIVE, "64", "hnsw: ef at search"),
    OptionSpec::default("recall_sample", Ty::Int(0, i64::MAX), "200", "hnsw: queries checked against exact"),
    OptionSpec::optional(
        "threads",
        POSITIVE,
        "worker threads (default: every core); for hnsw the effective count is part of the fingerprint",
    )
    .runtime_only(),
];

pub static KIND: KindInfo = KindInfo {
    name: "retrieve",
    // 2: `exact` is the GEMM search (scores are the float64 value rounded once).
    version: 2,
    about: "most and least similar corpus record per query by inner product (exact through a blocked GEMM, or HNSW)",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    query_column: String,
    corpus_column: String,
    method: String,
    carry: Option<Vec<String>>,
    most_prefix: String,
    least_prefix: String,
    most_where: Option<String>,
    least_where: Option<String>,
    keep_vector: bool,
    connectivity: usize,
    expansion_add: usize,
    expansion_search: usize,
    recall_sample: usize,
    threads: Option<usize>,
}

struct Retrieve {
    opts: Options,
}

/// The columns a shard's partial result adds after the output's own: per query, the
/// global corpus position and the f64 score of the part's most and least similar
/// record (null when the part has no eligible one).
const PARTIAL: [(&str, DataType); 4] = [
    ("_synth_most_pos", DataType::UInt64),
    ("_synth_most_score64", DataType::Float64),
    ("_synth_least_pos", DataType::UInt64),
    ("_synth_least_score64", DataType::Float64),
];

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    if opts.most_prefix == opts.least_prefix {
        ctx.error(diags, "least_prefix", "most_prefix and least_prefix must differ");
        return None;
    }
    Some(Box::new(Retrieve { opts }))
}

fn vector_dim(schema: &synth_core::data::arrow::datatypes::Schema, column: &str) -> std::result::Result<usize, String> {
    match schema.field_with_name(column).map(|f| f.data_type().clone()) {
        Ok(DataType::FixedSizeList(item, n)) if item.data_type() == &DataType::Float32 => Ok(n as usize),
        Ok(other) => {
            Err(format!("column \"{column}\" is {}, not a vector (FixedSizeList<f32>)", data::type_display(&other)))
        }
        Err(_) => Err(format!("no column \"{column}\" (columns: {})", data::column_list(schema))),
    }
}

impl Retrieve {
    /// Step 1: stream the corpus in, row-major (exact, and HNSW with its exact recall
    /// check), with each record's eligibility (`most_where`, `least_where`) and id.
    async fn read_corpus(
        &self,
        ctx: &RunCtx,
        corpus_in: &Input,
        dim: usize,
    ) -> Result<(synth_retrieval::gemm::RowCorpus, Vec<String>)> {
        let mut row_corpus = synth_retrieval::gemm::RowCorpus::with_capacity(dim, corpus_in.num_rows as usize);
        let mut corpus_ids: Vec<String> = Vec::with_capacity(corpus_in.num_rows as usize);
        let mut rx = stream_batches(corpus_in.path.clone(), 8192);
        while let Some(batch) = rx.recv().await {
            if ctx.cancel.is_cancelled() {
                bail!(Cancelled);
            }
            let batch = batch?;
            let (values, offsets) = vectors(&batch, &self.opts.corpus_column, dim)?;
            let flag = |col: &Option<String>| -> Result<Option<BooleanArray>> {
                match col {
                    None => Ok(None),
                    Some(c) => Ok(Some(
                        batch
                            .column_by_name(c)
                            .and_then(|a| a.as_any().downcast_ref::<BooleanArray>())
                            .with_context(|| format!("corpus column \"{c}\" is not bool"))?
                            .clone(),
                    )),
                }
            };
            let (mx, mn) = (flag(&self.opts.most_where)?, flag(&self.opts.least_where)?);
            let ids = data::ids(&batch);
            for i in 0..batch.num_rows() {
                let v = &values[offsets[i]..offsets[i] + dim];
                let ok = |f: &Option<BooleanArray>| f.as_ref().is_none_or(|a| a.is_valid(i) && a.value(i));
                let (a, b) = (ok(&mx), ok(&mn));
                row_corpus.push(v, a, b);
                corpus_ids.push(ids.value(i).to_string());
            }
            ctx.progress.inc(batch.num_rows() as u64);
        }
        Ok((row_corpus, corpus_ids))
    }

    /// Step 2: the queries (small: one vector per profile), their batches and their vectors.
    fn read_queries(&self, queries_in: &Input, dim: usize) -> Result<(Vec<RecordBatch>, Vec<f32>)> {
        let (_, qbatches) = synth_core::store::parquet::read_all(&queries_in.path)?;
        let mut qvec: Vec<f32> = Vec::with_capacity(queries_in.num_rows as usize * dim);
        for b in &qbatches {
            let (values, offsets) = vectors(b, &self.opts.query_column, dim)?;
            for i in 0..b.num_rows() {
                qvec.extend_from_slice(&values[offsets[i]..offsets[i] + dim]);
            }
        }
        Ok((qbatches, qvec))
    }

    /// Step 4: the matched corpus rows' carried columns, in a second streaming pass.
    async fn fetch_matches(&self, corpus_in: &Input, extremes: &[Extremes]) -> Result<Matches> {
        let carried = self.carried(&corpus_in.schema);
        let mut wanted: Vec<u32> =
            extremes.iter().flat_map(|e| [e.max_idx, e.min_idx]).filter(|i| *i != u32::MAX).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut picked: Vec<Vec<ArrayRef>> = vec![Vec::new(); carried.len()];
        let mut rx = stream_batches(corpus_in.path.clone(), 8192);
        let (mut base, mut w) = (0u32, 0usize);
        while let Some(batch) = rx.recv().await {
            let batch = batch?;
            let end = base + batch.num_rows() as u32;
            let mut take = Vec::new();
            while w < wanted.len() && wanted[w] < end {
                take.push(wanted[w] - base);
                w += 1;
            }
            if !take.is_empty() {
                let idx = UInt32Array::from(take);
                for (k, f) in carried.iter().enumerate() {
                    let col = batch.column_by_name(f.name()).context("carried column")?;
                    picked[k].push(synth_core::data::arrow::compute::take(col, &idx, None)?);
                }
            }
            base = end;
        }
        let picked: Vec<ArrayRef> = picked
            .into_iter()
            .zip(&carried)
            .map(|(parts, f)| {
                if parts.is_empty() {
                    Ok(synth_core::data::arrow::array::new_empty_array(f.data_type()))
                } else {
                    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                    Ok(synth_core::data::arrow::compute::concat(&refs)?)
                }
            })
            .collect::<Result<_>>()?;
        Ok(Matches { wanted, picked })
    }

    /// Step 5: the query rows with both matches (a shard's part: and its winners' global
    /// positions and f64 scores).
    fn write_rows(
        &self,
        ctx: &mut RunCtx,
        queries_in: &Input,
        corpus_in: &Input,
        qbatches: &[RecordBatch],
        found: &Found,
    ) -> Result<()> {
        let Found { extremes, scores64, corpus_ids, matches, partial } = found;
        let position = |idx: u32| -> Option<u32> {
            (idx != u32::MAX).then(|| matches.wanted.binary_search(&idx).expect("wanted holds every match") as u32)
        };
        let mut fields = self.output_fields(&queries_in.schema, &corpus_in.schema);
        if partial.is_some() {
            fields.extend(PARTIAL.iter().map(|(name, ty)| Field::new(*name, ty.clone(), true)));
        }
        let schema = data::schema_with_id(fields);
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut q0 = 0usize;
        for b in qbatches {
            let n = b.num_rows();
            let ex = &extremes[q0..q0 + n];
            let mut cols: Vec<ArrayRef> = vec![b.column(0).clone()];
            for (f, c) in b.schema().fields().iter().zip(b.columns()).skip(1) {
                if self.opts.keep_vector || f.name() != &self.opts.query_column {
                    cols.push(c.clone());
                }
            }
            for most in [true, false] {
                let pos: UInt32Array = ex.iter().map(|e| position(if most { e.max_idx } else { e.min_idx })).collect();
                let ids: StringArray = ex
                    .iter()
                    .map(|e| {
                        let i = if most { e.max_idx } else { e.min_idx };
                        (i != u32::MAX).then(|| corpus_ids[i as usize].as_str())
                    })
                    .collect();
                let scores: Float32Array = ex
                    .iter()
                    .map(|e| {
                        let (i, s) = if most { (e.max_idx, e.max) } else { (e.min_idx, e.min) };
                        (i != u32::MAX).then_some(s)
                    })
                    .collect();
                cols.push(Arc::new(ids));
                cols.push(Arc::new(scores));
                for p in &matches.picked {
                    cols.push(synth_core::data::arrow::compute::take(p, &pos, None)?);
                }
            }
            if let Some(global) = partial {
                let s64 = &scores64[q0..q0 + n];
                let picks: [fn(&Extremes) -> u32; 2] = [|e| e.max_idx, |e| e.min_idx];
                for (k, idx) in picks.iter().enumerate() {
                    let positions: UInt64Array =
                        ex.iter().map(|e| (idx(e) != u32::MAX).then(|| global[idx(e) as usize])).collect();
                    let scores: Float64Array =
                        ex.iter().zip(s64).map(|(e, s)| (idx(e) != u32::MAX).then_some(s[k])).collect();
                    cols.push(Arc::new(positions));
                    cols.push(Arc::new(scores));
                }
            }
            out.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
            for e in ex {
                if e.max_idx == u32::MAX || e.min_idx == u32::MAX {
                    tracing::warn!(stage = %ctx.name, "a query found no eligible corpus record (empty corpus or masks)");
                    break;
                }
            }
            q0 += n;
            ctx.progress.inc(n as u64);
        }
        ctx.set_output(out)
    }

    /// Corpus columns copied per match, with their fields.
    fn carried(&self, corpus: &synth_core::data::arrow::datatypes::Schema) -> Vec<Field> {
        match &self.opts.carry {
            Some(cols) => cols.iter().filter_map(|c| corpus.field_with_name(c).ok().cloned()).collect(),
            None => corpus
                .fields()
                .iter()
                .filter(|f| f.name() != ID && !matches!(f.data_type(), DataType::FixedSizeList(..)))
                .map(|f| f.as_ref().clone())
                .collect(),
        }
    }

    fn output_fields(
        &self,
        query: &synth_core::data::arrow::datatypes::Schema,
        corpus: &synth_core::data::arrow::datatypes::Schema,
    ) -> Vec<Field> {
        let mut fields: Vec<Field> = query
            .fields()
            .iter()
            .skip(1)
            .filter(|f| self.opts.keep_vector || f.name() != &self.opts.query_column)
            .map(|f| f.as_ref().clone())
            .collect();
        let carried = self.carried(corpus);
        for prefix in [&self.opts.most_prefix, &self.opts.least_prefix] {
            fields.push(Field::new(format!("{prefix}id"), DataType::Utf8, true));
            fields.push(Field::new(format!("{prefix}score"), DataType::Float32, true));
            for f in &carried {
                fields.push(Field::new(format!("{prefix}{}", f.name()), f.data_type().clone(), true));
            }
        }
        fields
    }
}

#[async_trait]
impl Stage for Retrieve {
    /// An HNSW graph depends on how many threads inserted into it (usearch inserts
    /// concurrently), so for `method = "hnsw"` the effective thread count is part of the
    /// fingerprint; exact results do not depend on it.
    async fn prepare(&self, _ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let mut p = Prepared::default();
        if self.opts.method == "hnsw" {
            let threads =
                self.opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            p.fingerprint.insert("hnsw_threads".into(), threads.to_string());
        }
        Ok(Some(p))
    }

    /// The exact search splits the corpus (input 1) among shards; the merge is exact.
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        if self.opts.method == "exact" { Partitioning::SplitInput { split: 1 } } else { Partitioning::Whole }
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let (query, corpus) = (ctx.input_schema(0)?, ctx.input_schema(1)?);
        let qdim = vector_dim(&query, &self.opts.query_column);
        let cdim = vector_dim(&corpus, &self.opts.corpus_column);
        if let Err(e) = &qdim {
            ctx.error("query_column", format!("first input: {e}"));
        }
        if let Err(e) = &cdim {
            ctx.error("corpus_column", format!("second input: {e}"));
        }
        if let (Ok(q), Ok(c)) = (qdim, cdim)
            && q != c
        {
            ctx.error("corpus_column", format!("query vectors have {q} dimensions, corpus vectors {c}"));
        }
        for (option, col) in [("most_where", &self.opts.most_where), ("least_where", &self.opts.least_where)] {
            if let Some(col) = col {
                match corpus.field_with_name(col).map(|f| f.data_type().clone()) {
                    Ok(DataType::Boolean) => {}
                    Ok(other) => {
                        ctx.error(option, format!("column \"{col}\" is {}, not bool", data::type_display(&other)))
                    }
                    Err(_) => ctx.error(
                        option,
                        format!("the second input has no column \"{col}\" (columns: {})", data::column_list(&corpus)),
                    ),
                }
            }
        }
        if let Some(cols) = &self.opts.carry {
            ctx.require_columns("carry", 1, cols.iter().map(String::as_str));
        }
        let fields = self.output_fields(&query, &corpus);
        let mut seen = std::collections::BTreeSet::new();
        for f in &fields {
            if !seen.insert(f.name().clone()) || f.name() == ID {
                ctx.error(
                    "most_prefix",
                    format!("output column \"{}\" would appear twice; change the prefixes", f.name()),
                );
                return None;
            }
        }
        Some(data::schema_with_id(fields))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let threads =
            self.opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        let (queries_in, corpus_in) = (ctx.inputs[0].clone(), ctx.inputs[1].clone());
        let dim = vector_dim(&corpus_in.schema, &self.opts.corpus_column).map_err(anyhow::Error::msg)?;
        ctx.progress.set_total(corpus_in.num_rows + queries_in.num_rows);
        let (row_corpus, corpus_ids) = self.read_corpus(ctx, &corpus_in, dim).await?;
        let (qbatches, qvec) = self.read_queries(&queries_in, dim)?;
        // A shard's part also keeps the f64 scores of its winners for the exact merge.
        let partial = ctx.part_positions.take();
        if let Some(pos) = &partial
            && pos.len() != row_corpus.len
        {
            bail!("the shard's part of the corpus has {} records but {} positions", row_corpus.len, pos.len());
        }
        let started = std::time::Instant::now();
        let (opts, want64) = (self.opts.clone(), partial.is_some());
        let (extremes, info, scores64) =
            tokio::task::spawn_blocking(move || search(&opts, &qvec, &row_corpus, dim, threads, want64)).await??;
        ctx.report.info.insert("method".into(), self.opts.method.clone());
        ctx.report.info.insert("search_seconds".into(), format!("{:.3}", started.elapsed().as_secs_f64()));
        ctx.report.info.extend(info);
        let matches = self.fetch_matches(&corpus_in, &extremes).await?;
        let found = Found { extremes, scores64, corpus_ids, matches, partial };
        ctx.report.rows_in = queries_in.num_rows;
        self.write_rows(ctx, &queries_in, &corpus_in, &qbatches, &found)
    }

    /// The shards' partial results, row by row (every part holds every query, in
    /// order): the most similar record is the part winner with the largest f64 score,
    /// the least similar the one with the smallest, ties to the lower corpus position.
    async fn combine(&self, ctx: &mut RunCtx, outputs: &[synth_engine::stages::PartOutput]) -> Result<()> {
        for part in outputs {
            part.keep_failures(ctx)?;
        }
        let parts: Vec<&std::path::Path> = outputs.iter().map(|p| p.data.as_path()).collect();
        let parts = parts.as_slice();
        let first = parts.first().context("no partial results to combine")?;
        let written = synth_core::store::parquet::writer_schema(first)?;
        let n = written.fields().len();
        let find = |name: &str| {
            written.index_of(name).map_err(|_| anyhow::anyhow!("{}: no column \"{name}\"", first.display()))
        };
        let extras = find(PARTIAL[0].0)?;
        let (most_at, least_at) =
            (find(&format!("{}id", self.opts.most_prefix))?, find(&format!("{}id", self.opts.least_prefix))?);
        if extras + PARTIAL.len() != n || !(most_at < least_at && least_at < extras) {
            bail!("{}: not a partial result of this stage (columns: {})", first.display(), data::column_list(&written));
        }
        let schema: SchemaRef = Arc::new(Schema::new(written.fields()[..extras].to_vec()));
        let mut readers = Vec::with_capacity(parts.len());
        for p in parts {
            if synth_core::store::parquet::writer_schema(p)?.fields() != written.fields() {
                bail!("{}: its columns differ from {}'s", p.display(), first.display());
            }
            readers.push(synth_core::store::parquet::open_reader(p, synth_core::store::parquet::WRITE_CHUNK_ROWS)?);
        }
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut rows_in = 0u64;
        loop {
            let mut batches = Vec::with_capacity(readers.len());
            for (r, p) in readers.iter_mut().zip(parts) {
                batches.push(r.next().transpose().with_context(|| format!("reading {}", p.display()))?);
            }
            if batches.iter().all(Option::is_none) {
                break;
            }
            let batches: Vec<RecordBatch> = batches
                .into_iter()
                .zip(parts)
                .map(|(b, p)| b.with_context(|| format!("{}: fewer rows than the other parts", p.display())))
                .collect::<Result<_>>()?;
            let rows = batches[0].num_rows();
            if batches.iter().any(|b| b.num_rows() != rows || b.column(0) != batches[0].column(0)) {
                bail!("the partial results do not hold the same queries in the same order");
            }
            let col = |b: &RecordBatch, k: usize| -> Result<(UInt64Array, Float64Array)> {
                let pos = b.column(extras + 2 * k).as_any().downcast_ref::<UInt64Array>().cloned();
                let score = b.column(extras + 2 * k + 1).as_any().downcast_ref::<Float64Array>().cloned();
                pos.zip(score).context("a partial result's position or score column has another type")
            };
            // Per kind (most, least) and row: the part that wins.
            let mut winners: [Vec<(usize, usize)>; 2] = [Vec::with_capacity(rows), Vec::with_capacity(rows)];
            let cols: Vec<[(UInt64Array, Float64Array); 2]> =
                batches.iter().map(|b| Ok([col(b, 0)?, col(b, 1)?])).collect::<Result<_>>()?;
            for row in 0..rows {
                for (k, w) in winners.iter_mut().enumerate() {
                    let mut best: Option<(usize, u64, f64)> = None;
                    for (part, c) in cols.iter().enumerate() {
                        let (pos, score) = &c[k];
                        if pos.is_null(row) {
                            continue;
                        }
                        let (p, s) = (pos.value(row), score.value(row));
                        let better = match best {
                            None => true,
                            Some((_, bp, bs)) => {
                                let ord = if k == 0 { s.total_cmp(&bs) } else { bs.total_cmp(&s) };
                                ord.is_gt() || (ord.is_eq() && p < bp)
                            }
                        };
                        if better {
                            best = Some((part, p, s));
                        }
                    }
                    w.push((best.map_or(0, |b| b.0), row));
                }
            }
            let mut columns: Vec<ArrayRef> = Vec::with_capacity(extras);
            for c in 0..extras {
                let group = if c >= least_at {
                    Some(1)
                } else if c >= most_at {
                    Some(0)
                } else {
                    None
                };
                columns.push(match group {
                    None => batches[0].column(c).clone(),
                    Some(k) => {
                        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
                        synth_core::data::arrow::compute::interleave(&arrays, &winners[k])?
                    }
                });
            }
            out.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            rows_in += rows as u64;
        }
        ctx.report.rows_in = rows_in;
        ctx.set_output(out)
    }
}

/// The matched corpus rows ([`Retrieve::fetch_matches`]): the sorted corpus positions of
/// every match, and each carried column's values at those positions.
struct Matches {
    wanted: Vec<u32>,
    picked: Vec<ArrayRef>,
}

/// What the search found, for the output ([`Retrieve::write_rows`]).
struct Found {
    extremes: Vec<Extremes>,
    /// A shard's part: the f64 scores of each query's winners.
    scores64: Vec<[f64; 2]>,
    corpus_ids: Vec<String>,
    matches: Matches,
    /// A shard's part: the global corpus position of each of its records.
    partial: Option<Vec<u64>>,
}

/// What [`search`] gives: each query's extremes, what the report says, the winners' f64 scores.
type Searched = (Vec<Extremes>, BTreeMap<String, String>, Vec<[f64; 2]>);

/// Step 3, off the async runtime: each query's most and least similar eligible record,
/// exact (a blocked GEMM; with `want64`, the f64 scores of the winners too) or HNSW (with
/// its recall against the exact kernel on a sample); what the report says of it.
fn search(
    opts: &Options,
    qvec: &[f32],
    row_corpus: &synth_retrieval::gemm::RowCorpus,
    dim: usize,
    threads: usize,
    want64: bool,
) -> Result<Searched> {
    let mut info = BTreeMap::new();
    if opts.method != "hnsw" {
        info.insert("kernel".into(), synth_retrieval::gemm::kernel_name().to_string());
        let found = synth_retrieval::gemm::exact_max_min(qvec, row_corpus, threads);
        let scores64 = if want64 {
            let score = |q: usize, i: u32| {
                if i == u32::MAX { f64::NAN } else { row_corpus.score64(&qvec[q * dim..(q + 1) * dim], i as usize) }
            };
            found.iter().enumerate().map(|(q, e)| [score(q, e.max_idx), score(q, e.min_idx)]).collect()
        } else {
            Vec::new()
        };
        return Ok((found, info, scores64));
    }
    let params = hnsw::HnswParams {
        connectivity: opts.connectivity,
        expansion_add: opts.expansion_add,
        expansion_search: opts.expansion_search,
    };
    let (max_ok, min_ok) = row_corpus.eligibility();
    let index = hnsw::Hnsw::build(row_corpus.rows(), dim, max_ok, min_ok, params, threads)?;
    let approx = index.max_min(qvec, threads)?;
    let sample = opts.recall_sample.min(approx.len());
    if sample > 0 {
        // An evenly spread sample of queries, checked against the exact kernel.
        let step = approx.len() as f64 / sample as f64;
        let picks: Vec<usize> = (0..sample).map(|k| (k as f64 * step) as usize).collect();
        let q: Vec<f32> = picks.iter().flat_map(|&i| qvec[i * dim..(i + 1) * dim].iter().copied()).collect();
        let exact = synth_retrieval::gemm::exact_max_min(&q, row_corpus, threads);
        let got: Vec<Extremes> = picks.iter().map(|&i| approx[i]).collect();
        let (rmax, rmin) = hnsw::recall(&got, &exact);
        info.insert("recall_sample".into(), sample.to_string());
        info.insert("recall_max".into(), format!("{rmax:.4}"));
        info.insert("recall_min".into(), format!("{rmin:.4}"));
        tracing::info!(recall_max = rmax, recall_min = rmin, sample, "hnsw recall against exact");
    }
    Ok((approx, info, Vec::new()))
}

/// The flat values of a vector column and each row's start offset into them.
fn vectors<'a>(batch: &'a RecordBatch, column: &str, dim: usize) -> Result<(&'a [f32], Vec<usize>)> {
    let list = batch
        .column_by_name(column)
        .and_then(|a| a.as_any().downcast_ref::<FixedSizeListArray>())
        .with_context(|| format!("column \"{column}\" is not a vector column"))?;
    if list.value_length() as usize != dim {
        bail!("column \"{column}\" has {} dimensions, expected {dim}", list.value_length());
    }
    if list.null_count() > 0 {
        bail!("column \"{column}\" has null vectors");
    }
    let values = list
        .values()
        .as_any()
        .downcast_ref::<Float32Array>()
        .with_context(|| format!("column \"{column}\" does not hold f32 values"))?;
    let offsets = (0..list.len()).map(|i| list.value_offset_at(i)).collect();
    Ok((values.values(), offsets))
}
