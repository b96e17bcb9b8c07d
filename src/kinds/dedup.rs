//! `dedup`: remove near-duplicate records by MinHash + LSH (`quality::minhash`): the
//! texts the `fields` select, joined, are shingled into word n-grams; a record whose
//! estimated Jaccard similarity to an earlier kept record reaches `threshold` goes to
//! the failure table (kind `duplicate`, naming the record it repeats). Comparisons can
//! be limited to records with the same value of `by`. Two passes over the input
//! (signatures, then the kept records), so memory holds a signature per record, not
//! the texts; the decision is made in input order, so the same records are kept for any
//! thread or shard count.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::{Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::BooleanArray;
use synth_core::data::arrow::datatypes::SchemaRef;

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, RATIO, Ty};
use synth_core::data;
use synth_core::store::failures::{Failure, FailureKind};
use synth_core::store::parquet::open_reader;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};
use synth_quality::minhash::{self, Params};
use synth_quality::select::Selector;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "fields",
        Ty::StrList,
        "[\"*\"]",
        "field selectors of the texts compared (`col`, `col[].key`, `col[key=value].key`; `*`: every column but the id), joined",
    ),
    OptionSpec::default(
        "threshold",
        RATIO,
        "0.8",
        "estimated Jaccard similarity at or above which a record is a near-duplicate",
    ),
    OptionSpec::default("shingle", Ty::Int(1, 32), "5", "words per shingle"),
    OptionSpec::default("bands", POSITIVE, "14", "LSH bands (datatrove's default)"),
    OptionSpec::default("rows", POSITIVE, "8", "hashes per band (datatrove's default); the signature has bands × rows"),
    OptionSpec::optional(
        "by",
        Ty::StrList,
        "compare only records with the same values of these columns (e.g. a task type)",
    ),
    OptionSpec::optional(
        "distinct",
        Ty::StrList,
        "records with the same values of these columns are never each other's near-duplicates (one request asked twice by design, e.g. a plan that reuses a profile)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "dedup",
    about: "remove near-duplicate records (MinHash + LSH over word shingles); the first of each group of near-duplicates is kept",
    options: OPTIONS,
    example: "fields = [\"in0\"]",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    fields: Vec<String>,
    threshold: f64,
    shingle: usize,
    bands: usize,
    rows: usize,
    #[serde(default)]
    by: Vec<String>,
    #[serde(default)]
    distinct: Vec<String>,
}

struct Dedup {
    fields: Vec<Selector>,
    params: Params,
    by: Vec<String>,
    distinct: Vec<String>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let mut fields = Vec::new();
    for f in &o.fields {
        match Selector::parse(f) {
            Ok(s) => fields.push(s),
            Err(e) => ctx.error(diags, "fields", e),
        }
    }
    if fields.len() != o.fields.len() {
        return None;
    }
    let params =
        Params { shingle: o.shingle, bands: o.bands, rows: o.rows, threshold: o.threshold, ..Params::default() };
    Some(Box::new(Dedup { fields, params, by: o.by, distinct: o.distinct }))
}

impl Dedup {
    fn text(&self, row: &synth_core::data::Row) -> String {
        self.fields.iter().flat_map(|s| s.find(row)).map(|f| f.text.into_owned()).collect::<Vec<_>>().join("\n")
    }
}

/// The values of `columns` in `r`, as one key.
fn key_of(r: &synth_core::data::Row, columns: &[String]) -> String {
    let key: Vec<String> = columns
        .iter()
        .map(|c| match r.get(c) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        })
        .collect();
    key.join("\u{1f}")
}

#[async_trait]
impl Stage for Dedup {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let columns: Vec<&str> = self
            .fields
            .iter()
            .filter_map(Selector::column)
            .chain(self.by.iter().chain(&self.distinct).map(String::as_str))
            .collect();
        ctx.require_columns("fields", 0, columns);
        ctx.input_schema(0)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let path = ctx.inputs[0].path.clone();
        let total = ctx.inputs[0].num_rows;
        ctx.progress.set_total(total);
        // Pass 1: a signature per record (texts are dropped batch by batch).
        let this = Arc::new(Dedup {
            fields: self.fields.clone(),
            params: self.params,
            by: self.by.clone(),
            distinct: self.distinct.clone(),
        });
        let (cancel, progress) = (ctx.cancel.clone(), ctx.progress.clone());
        let job = this.clone();
        let (ids, signatures, groups, same) = tokio::task::spawn_blocking(move || -> Result<_> {
            use rayon::prelude::*;
            let signer = minhash::Signer::new(&job.params);
            let (mut ids, mut sigs, mut groups, mut same) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for batch in open_reader(&path, 4096)? {
                if cancel.is_cancelled() {
                    bail!(synth_engine::stages::Cancelled);
                }
                let batch = batch?;
                let rows: Vec<synth_core::data::Row> =
                    (0..batch.num_rows()).map(|i| data::row_json(&batch, i)).collect();
                let texts: Vec<String> = rows.iter().map(|r| job.text(r)).collect();
                sigs.extend(texts.par_iter().map(|t| signer.sign(t)).collect::<Vec<_>>());
                for r in &rows {
                    ids.push(r.get(data::ID).and_then(|v| v.as_str()).unwrap_or_default().to_string());
                    if !job.by.is_empty() {
                        groups.push(key_of(r, &job.by));
                    }
                    if !job.distinct.is_empty() {
                        same.push(key_of(r, &job.distinct));
                    }
                }
                progress.inc(batch.num_rows() as u64);
            }
            Ok((ids, sigs, groups, same))
        })
        .await??;
        let decisions = minhash::decide(
            signatures,
            (!groups.is_empty()).then_some(groups.as_slice()),
            (!same.is_empty()).then_some(same.as_slice()),
            &self.params,
        );
        let removed: Vec<usize> = decisions.iter().enumerate().filter(|(_, d)| d.is_some()).map(|(i, _)| i).collect();
        let drop: HashSet<String> = removed.iter().map(|&i| ids[i].clone()).collect();
        for &i in &removed {
            let (k, sim) = decisions[i].expect("removed");
            let mut f = Failure::new(
                &ids[i],
                FailureKind::Duplicate,
                format!(
                    "near-duplicate of \"{}\" (estimated Jaccard similarity {sim:.2} >= {})",
                    ids[k], self.params.threshold
                ),
                None,
            );
            f.check = Some("near_duplicate".into());
            ctx.failures.push(f);
        }
        let m = &mut ctx.report.metrics;
        m.insert("dedup.checked".into(), ids.len() as f64);
        m.insert("dedup.removed".into(), removed.len() as f64);
        m.insert("dedup.threshold".into(), self.params.threshold);
        // Pass 2: the kept records, in input order.
        let schema = ctx.inputs[0].schema.clone();
        let drop = Arc::new(drop);
        synth_engine::stages::exec::map_batches(
            ctx,
            0,
            schema,
            synth_engine::stages::exec::Ids::Kept,
            move |batch, _| {
                let mask: BooleanArray =
                    data::ids(batch).iter().map(|id| Some(!drop.contains(id.unwrap_or("")))).collect();
                Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
            },
        )
        .await
    }
}
