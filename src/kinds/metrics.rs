//! `metrics`: reference-based scores of every (response, reference) row — BLEU,
//! ROUGE-1/2/L/Lsum, METEOR and BERTScore F1, equal to the Python implementations
//! (see `eval`) — and their mean and population std per group (e.g. task) and
//! overall, written beside the output as `<stage>.summary.parquet` (the summary
//! protocol, `store::summary`: table `metrics`).
//!
//! In a sharded run the string metrics split the rows among the shards
//! ([`Partitioning::SplitInput`]): each shard scores its records and keeps their input
//! positions and raw scores (NaN where a metric is undefined); the merge
//! ([`Stage::combine`]) restores the input order and computes the summary from every
//! row, as one process does. With BERTScore the stage runs once: bert_score's batches of
//! pairs pad each other, so a row's score depends on its neighbours.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use rayon::prelude::*;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::parquet::open_reader;
use synth_core::store::summary::{self, SummaryRow};
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Stage};
use synth_eval::bertscore::BertScoreConfig;
use synth_eval::rouge::RougeTarget;
use synth_eval::score::{DEFAULT_WORDNET, Scorer, heading, per_sample, summarize};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("response", Ty::Str, "\"response\"", "column with the model's answer"),
    OptionSpec::default("reference", Ty::Str, "\"reference\"", "column with the reference answer"),
    OptionSpec::optional("group_by", Ty::Str, "column whose values group the summary (e.g. \"task\")"),
    OptionSpec::default(
        "metrics",
        Ty::StrList,
        "[\"bleu\", \"rouge\", \"meteor\"]",
        "bleu, rouge, meteor, bertscore (bertscore needs bertscore_model)",
    ),
    OptionSpec::default(
        "wordnet_dir",
        Ty::Str,
        "\"/usr/share/wordnet\"",
        "WordNet 3.0 dict files (Debian wordnet-base), for METEOR",
    ),
    OptionSpec::optional(
        "punkt_dir",
        Ty::Str,
        "NLTK punkt_tab/english directory for METEOR's sentence splitting (default: untrained Punkt)",
    ),
    OptionSpec::optional(
        "bertscore_model",
        Ty::Str,
        "directory with the BERTScore encoder: model.onnx + tokenizer.json (e.g. all-MiniLM-L6-v2)",
    ),
    OptionSpec::optional(
        "bertscore_output",
        Ty::Str,
        "ONNX output with the token hidden states (default: last_hidden_state, else the first)",
    ),
    OptionSpec::optional(
        "bertscore_max_length",
        Ty::Int(2, 1_000_000),
        "BERTScore truncation in tokens (default: the tokenizer's model_max_length, else 512)",
    ),
    OptionSpec::optional(
        "bertscore_sessions",
        Ty::Int(1, 64),
        "BERTScore encoder sessions side by side, each a copy of the weights (default: 2 with 2+ cores)",
    ),
    OptionSpec::default(
        "bertscore_pair_batch",
        Ty::Int(1, 1_000_000),
        "64",
        "pairs per BERTScore matching batch, as bert_score's batch_size (its zero padding enters the max); 1 scores each pair alone, as the official evaluation.py calls it",
    ),
    OptionSpec::optional("ort_dylib", Ty::Str, "ONNX Runtime library for BERTScore (default: $ORT_DYLIB_PATH)"),
    OptionSpec::default(
        "rouge_target",
        Ty::Enum(&["response", "reference"]),
        "\"reference\"",
        "rouge_score's target: the reference (rouge_score's documented order) or the response (score(response, reference), as some official evaluation scripts call it); only ROUGE-Lsum of multi-line texts differs",
    ),
    OptionSpec::optional(
        "label",
        Ty::Str,
        "name of what is scored (a model), in the summary; default: the input's name",
    ),
    OptionSpec::default("table", Ty::Str, "\"metrics\"", "report table of the summary rows"),
    OptionSpec::optional(
        "metric_prefix",
        Ty::Str,
        "prefix of the summary's metric names and headings, e.g. \"InstEng \": two test sets scored by two stages side by side in one report table",
    ),
    OptionSpec::default(
        "title",
        Ty::Str,
        "\"Reference-based metrics (means over the test set)\"",
        "heading of that table in the report",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "metrics",
    // 2: ROUGE in the official order (response as target); undefined BLEU left out of the summary.
    // 3: the summary protocol (store/summary.rs: label, table, title, group, metric, heading, n, value,
    //    std, invalid); rouge_target defaults to "reference" (a method's pipelines pin their order).
    version: 3,
    about: "BLEU, ROUGE, METEOR, BERTScore per row against a reference, with mean/std per group and overall",
    options: OPTIONS,
    summary: true,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    response: String,
    reference: String,
    group_by: Option<String>,
    metrics: Vec<String>,
    wordnet_dir: String,
    punkt_dir: Option<String>,
    bertscore_model: Option<String>,
    bertscore_output: Option<String>,
    bertscore_sessions: Option<usize>,
    bertscore_max_length: Option<usize>,
    bertscore_pair_batch: usize,
    ort_dylib: Option<String>,
    label: Option<String>,
    table: String,
    metric_prefix: Option<String>,
    title: String,
    rouge_target: String,
}

struct Metrics {
    opts: Options,
    columns: Vec<&'static str>,
    /// The input's name: the summary's default label.
    input: String,
}

/// A shard's partial result: the output's columns, then each row's input position and
/// its raw scores (NaN kept: the summary leaves undefined values out).
const PART_POSITION: &str = "_synth_pos";
const PART_RAW: &str = "_synth_raw_";

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut columns = Vec::new();
    for m in &opts.metrics {
        match m.as_str() {
            "bleu" => columns.push("bleu"),
            "rouge" => columns.extend(["rouge1", "rouge2", "rougeL", "rougeLsum"]),
            "meteor" => columns.push("meteor"),
            "bertscore" => {
                if opts.bertscore_model.is_none() {
                    ctx.error(diags, "metrics", synth_eval::score::BERTSCORE_NEEDS_MODEL);
                    return None;
                }
                columns.push("bertscore_f1")
            }
            other => {
                let hint = synth_core::config::diag::did_you_mean(other, synth_eval::score::METRICS.iter().copied())
                    .unwrap_or_default();
                ctx.error(diags, "metrics", format!("unknown metric \"{other}\"{hint}"));
                return None;
            }
        }
    }
    let input = ctx.options.get("inputs").and_then(|v| v.get(0)).and_then(|v| v.as_str()).unwrap_or_default();
    Some(Box::new(Metrics { opts, columns, input: input.to_string() }))
}

impl Metrics {
    fn wordnet_dir(&self, root: &std::path::Path) -> PathBuf {
        let p = PathBuf::from(if self.opts.wordnet_dir.is_empty() { DEFAULT_WORDNET } else { &self.opts.wordnet_dir });
        if p.is_absolute() { p } else { root.join(p) }
    }

    fn bertscore(&self, root: &std::path::Path) -> Option<BertScoreConfig> {
        if !self.opts.metrics.iter().any(|m| m == "bertscore") {
            return None;
        }
        let mut cfg = BertScoreConfig::new(root.join(self.opts.bertscore_model.as_deref()?));
        cfg.output = self.opts.bertscore_output.clone();
        cfg.sessions = self.opts.bertscore_sessions;
        cfg.max_length = self.opts.bertscore_max_length;
        cfg.pair_batch = self.opts.bertscore_pair_batch;
        cfg.ort_dylib = synth_core::onnx::find_onnxruntime(self.opts.ort_dylib.as_deref(), root);
        Some(cfg)
    }

    fn output_schema(&self) -> SchemaRef {
        let mut fields = Vec::new();
        if let Some(g) = &self.opts.group_by {
            fields.push(Field::new(g, DataType::Utf8, true));
        }
        fields.extend(self.columns.iter().map(|c| Field::new(*c, DataType::Float64, false)));
        data::schema_with_id(fields)
    }

    /// The output's schema with a shard's extra columns.
    fn partial_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self.output_schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(PART_POSITION, DataType::UInt64, false));
        fields.extend(self.columns.iter().map(|c| Field::new(format!("{PART_RAW}{c}"), DataType::Float64, false)));
        Arc::new(synth_core::data::arrow::datatypes::Schema::new(fields))
    }

    /// The summary (mean and population std per group and overall) of every row's raw
    /// scores, in input order, as `<stage>.summary.parquet`.
    fn write_summary(&self, ctx: &mut RunCtx, groups: &[String], scores: &[Vec<f64>]) -> Result<()> {
        let label = self.opts.label.clone().unwrap_or_else(|| self.input.clone());
        let summary = summarize(&self.columns, groups, scores);
        let prefix = self.opts.metric_prefix.as_deref().unwrap_or_default();
        // Rows per group, so `invalid` counts the rows a metric left out (an undefined BLEU).
        let mut rows_in: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for g in groups {
            *rows_in.entry(g.as_str()).or_default() += 1;
        }
        rows_in.insert(synth_core::store::summary::OVERALL, scores.len() as u64);
        let rows: Vec<SummaryRow> = summary
            .iter()
            .map(|s| SummaryRow {
                label: label.clone(),
                table: self.opts.table.clone(),
                title: self.opts.title.clone(),
                group: s.group.clone(),
                metric: format!("{prefix}{}", s.metric),
                heading: format!("{prefix}{}", heading(&s.metric)),
                n: s.n,
                value: s.mean,
                std: (s.n > 0).then_some(s.std),
                invalid: rows_in.get(s.group.as_str()).copied().unwrap_or(s.n).saturating_sub(s.n),
            })
            .collect();
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&rows)?)?;
        Ok(())
    }
}

fn text_column(batch: &RecordBatch, name: &str) -> Result<StringArray> {
    let col = batch.column_by_name(name).ok_or_else(|| anyhow!("no column \"{name}\""))?;
    let col = synth_core::data::arrow::compute::cast(col, &DataType::Utf8)?;
    Ok(col.as_any().downcast_ref::<StringArray>().expect("cast to Utf8").clone())
}

/// Every (response, reference) of the input, in order; a missing value is "".
fn read_pairs(path: &std::path::Path, response: &str, reference: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for batch in open_reader(path, 2048)? {
        let batch = batch.with_context(|| format!("reading {}", path.display()))?;
        let (resp, refs) = (text_column(&batch, response)?, text_column(&batch, reference)?);
        let value = |a: &StringArray, i: usize| if a.is_valid(i) { a.value(i).to_string() } else { String::new() };
        out.extend((0..batch.num_rows()).map(|i| (value(&resp, i), value(&refs, i))));
    }
    Ok(out)
}

#[async_trait]
impl Stage for Metrics {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let mut cols = vec![self.opts.response.as_str(), self.opts.reference.as_str()];
        if let Some(g) = &self.opts.group_by {
            cols.push(g);
        }
        ctx.require_columns("inputs", 0, cols);
        if self.opts.metrics.iter().any(|m| m == "meteor") {
            let dir = self.wordnet_dir(ctx.root);
            let files: Vec<PathBuf> = ["noun", "verb", "adj", "adv"]
                .iter()
                .flat_map(|p| [dir.join(format!("data.{p}")), dir.join(format!("index.{p}"))])
                .collect();
            match files.iter().find(|f| !f.exists()) {
                Some(missing) => ctx.error(
                    "wordnet_dir",
                    format!(
                        "WordNet 3.0 is needed for METEOR but {} is missing: install Debian's wordnet-base (apt-get install wordnet-base) or set wordnet_dir",
                        missing.display()
                    ),
                ),
                None => ctx.files.extend(files),
            }
            if let Some(dir) = &self.opts.punkt_dir {
                let dir = ctx.root.join(dir);
                match std::fs::read_dir(&dir) {
                    Ok(entries) => ctx.files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file())),
                    Err(e) => ctx.error("punkt_dir", format!("{}: {e}", dir.display())),
                }
            }
        }
        if let Some(cfg) = self.bertscore(ctx.root) {
            // The encoder's files are content-hashed into the fingerprint: another model
            // (or tokenizer) re-scores.
            let files = ["model.onnx", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"];
            for (i, f) in files.iter().enumerate() {
                let p = cfg.model_dir.join(f);
                if p.is_file() {
                    ctx.files.push(p);
                } else if i < 2 {
                    ctx.error(
                        "bertscore_model",
                        format!(
                            "{} is missing: the BERTScore encoder needs model.onnx and tokenizer.json",
                            p.display()
                        ),
                    );
                }
            }
        }
        Some(self.output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let bert = self.bertscore(&ctx.root);
        let target = RougeTarget::parse(&self.opts.rouge_target).unwrap_or_default();
        let mut scorer =
            Scorer::new(&self.opts.metrics, &self.wordnet_dir(&ctx.root), bert.as_ref())?.with_rouge_target(target);
        if let Some(dir) = &self.opts.punkt_dir {
            scorer = scorer.with_punkt(&ctx.root.join(dir))?;
        }
        let scorer = Arc::new(scorer);
        let positions = ctx.part_positions.take();
        let partial = positions.is_some();
        let schema = if positions.is_some() { self.partial_schema() } else { self.output_schema() };
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let input = ctx.inputs[0].clone();
        let opts = self.opts.clone();
        let columns = self.columns.clone();
        let progress = ctx.progress.clone();
        let cancel = ctx.cancel.clone();
        progress.set_total(input.num_rows);
        // Scores are computed on a blocking thread; the groups and scores kept for the
        // summary are a few numbers per row.
        let (out, groups, scores) = tokio::task::spawn_blocking(move || -> Result<_> {
            // String metrics first, batch by batch: they run while the BERTScore encoder
            // loads. Every row's scores are kept (a few numbers each) for the summary anyway.
            let mut groups: Vec<String> = Vec::new();
            let mut scores: Vec<Vec<f64>> = Vec::new();
            for batch in open_reader(&input.path, 2048)? {
                if cancel.is_cancelled() {
                    anyhow::bail!(synth_engine::stages::Cancelled);
                }
                let batch = batch.with_context(|| format!("reading {}", input.path.display()))?;
                let text = |name: &str| text_column(&batch, name);
                let (resp, refs) = (text(&opts.response)?, text(&opts.reference)?);
                let group = opts.group_by.as_deref().map(text).transpose()?;
                // Rows are independent: scored on all cores.
                let batch_scores: Vec<Vec<f64>> = (0..batch.num_rows())
                    .into_par_iter()
                    .map(|i| {
                        // A missing response scores as an empty one (as the official code's "").
                        let r = if resp.is_valid(i) { resp.value(i) } else { "" };
                        let f = if refs.is_valid(i) { refs.value(i) } else { "" };
                        scorer.score(r, f)
                    })
                    .collect();
                scores.extend(batch_scores);
                groups.extend((0..batch.num_rows()).map(|i| {
                    group.as_ref().filter(|g| g.is_valid(i)).map(|g| g.value(i).to_string()).unwrap_or_default()
                }));
            }
            // BERTScore scores the whole input at once (bert_score's batches of 64 pairs
            // decide its padding).
            if scorer.has_bertscore() {
                let pairs = read_pairs(&input.path, &opts.response, &opts.reference)?;
                if cancel.is_cancelled() {
                    anyhow::bail!(synth_engine::stages::Cancelled);
                }
                let refs: Vec<(&str, &str)> = pairs.iter().map(|(r, f)| (r.as_str(), f.as_str())).collect();
                if let Some(bert) = scorer.bertscore_f1(&refs)? {
                    anyhow::ensure!(
                        bert.len() == scores.len(),
                        "BERTScore scored {} of {} rows",
                        bert.len(),
                        scores.len()
                    );
                    scores.iter_mut().zip(bert).for_each(|(s, b)| s.push(b));
                }
            }
            // The output: ids (and groups) from the input, scores in input order.
            let mut first = 0;
            for batch in open_reader(&input.path, 2048)? {
                let batch = batch.with_context(|| format!("reading {}", input.path.display()))?;
                let n = batch.num_rows();
                let mut arrays: Vec<ArrayRef> = vec![Arc::new(data::ids(&batch).clone())];
                if let Some(g) = opts.group_by.as_deref() {
                    arrays.push(Arc::new(text_column(&batch, g)?.clone()));
                }
                let rows = &scores[first..first + n];
                for k in 0..columns.len() {
                    arrays.push(Arc::new(Float64Array::from_iter_values(rows.iter().map(|s| per_sample(s[k])))));
                }
                if let Some(positions) = &positions {
                    let at = positions.get(first..first + n).context("fewer positions than rows in the part")?;
                    arrays.push(Arc::new(UInt64Array::from(at.to_vec())));
                    for k in 0..columns.len() {
                        arrays.push(Arc::new(Float64Array::from_iter_values(rows.iter().map(|s| s[k]))));
                    }
                }
                out.write(&RecordBatch::try_new(schema.clone(), arrays)?)?;
                progress.inc(n as u64);
                first += n;
            }
            Ok((out, groups, scores))
        })
        .await
        .context("metrics worker panicked")??;
        ctx.report.rows_in = scores.len() as u64;
        if !partial {
            // A shard's part has no summary of its own: the merge writes the whole one.
            self.write_summary(ctx, &groups, &scores)?;
        }
        ctx.set_output(out)
    }

    /// BLEU, ROUGE and METEOR score each row on its own: the rows can be split. With
    /// BERTScore, a batch's pairs pad each other: the stage runs once.
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        if self.columns.contains(&"bertscore_f1") { Partitioning::Whole } else { Partitioning::SplitInput { split: 0 } }
    }

    /// The shards' parts back in input order (a k-way merge by position: a row belongs
    /// to one part), and the summary over every row.
    async fn combine(&self, ctx: &mut RunCtx, outputs: &[synth_engine::stages::PartOutput]) -> Result<()> {
        for part in outputs {
            part.keep_failures(ctx)?;
        }
        let parts: Vec<&std::path::Path> = outputs.iter().map(|p| p.data.as_path()).collect();
        let schema = self.output_schema();
        let width = schema.fields().len();
        let mut batches: Vec<RecordBatch> = Vec::new();
        // (position, batch, row) of every row of every part.
        let mut order: Vec<(u64, usize, usize)> = Vec::new();
        for part in parts {
            for batch in open_reader(part, synth_core::store::parquet::WRITE_CHUNK_ROWS)? {
                let batch = batch.with_context(|| format!("reading {}", part.display()))?;
                let pos = batch
                    .column_by_name(PART_POSITION)
                    .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                    .with_context(|| format!("{}: not a partial result of this stage", part.display()))?;
                if batch.num_columns() != width + 1 + self.columns.len() {
                    bail!("{}: not a partial result of this stage (columns differ)", part.display());
                }
                let b = batches.len();
                order.extend(pos.values().iter().enumerate().map(|(r, &p)| (p, b, r)));
                batches.push(batch);
            }
        }
        order.sort_unstable();
        if order.windows(2).any(|w| w[0].0 == w[1].0) {
            bail!("two parts hold the same input row");
        }
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut groups: Vec<String> = Vec::with_capacity(order.len());
        let mut scores: Vec<Vec<f64>> = Vec::with_capacity(order.len());
        for chunk in order.chunks(synth_core::store::parquet::WRITE_CHUNK_ROWS) {
            let picks: Vec<(usize, usize)> = chunk.iter().map(|&(_, b, r)| (b, r)).collect();
            let column = |c: usize| -> Result<ArrayRef> {
                let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
                Ok(synth_core::data::arrow::compute::interleave(&arrays, &picks)?)
            };
            let columns: Vec<ArrayRef> = (0..width).map(column).collect::<Result<_>>()?;
            if self.opts.group_by.is_some() {
                let g = columns[1].as_any().downcast_ref::<StringArray>().context("the group column is not text")?;
                groups.extend((0..g.len()).map(|i| if g.is_valid(i) { g.value(i).to_string() } else { String::new() }));
            } else {
                groups.extend(std::iter::repeat_n(String::new(), chunk.len()));
            }
            let raw: Vec<Float64Array> = (0..self.columns.len())
                .map(|k| {
                    column(width + 1 + k)?
                        .as_any()
                        .downcast_ref::<Float64Array>()
                        .cloned()
                        .context("a raw score column is not float64")
                })
                .collect::<Result<_>>()?;
            scores.extend((0..chunk.len()).map(|i| raw.iter().map(|a| a.value(i)).collect::<Vec<f64>>()));
            out.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        }
        ctx.report.rows_in = scores.len() as u64;
        self.write_summary(ctx, &groups, &scores)?;
        ctx.set_output(out)
    }
}
