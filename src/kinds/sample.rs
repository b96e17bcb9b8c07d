//! `sample`: a seeded random sample — N records, a fraction, or N per stratum of a
//! column (proportional allocation when N and `stratify_by` are both given).
//! Selection is bottom-k on a key derived from (seed, stage, record id), so the
//! same config picks the same records whatever the input order; output keeps input order.

use std::collections::{BTreeMap, BinaryHeap, HashSet};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, BooleanArray, RecordBatch};
use synth_core::data::arrow::datatypes::{DataType, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, RATIO, Ty};
use synth_core::data;
use synth_core::store::parquet::open_reader;
use synth_engine::stages::exec::BATCH_ROWS;
use synth_engine::stages::{BuildCtx, Cancelled, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("n", POSITIVE, "number of records to keep"),
    OptionSpec::optional("fraction", RATIO, "share of records to keep (each kept independently)"),
    OptionSpec::optional("stratify_by", Ty::Str, "column whose values define strata"),
    OptionSpec::optional("n_per_stratum", POSITIVE, "records to keep from each stratum (needs stratify_by)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "sample",
    about: "seeded random sample: n records, a fraction, or per stratum of a column",
    options: OPTIONS,
    uses_seed: true,
    example: "n = 2",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Debug, Clone, Deserialize)]
struct Options {
    n: Option<u64>,
    fraction: Option<f64>,
    stratify_by: Option<String>,
    n_per_stratum: Option<u64>,
}

struct Sample {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let given =
        [opts.n.is_some(), opts.fraction.is_some(), opts.n_per_stratum.is_some()].iter().filter(|b| **b).count();
    if given != 1 {
        ctx.error(diags, "", "give exactly one of \"n\", \"fraction\" or \"n_per_stratum\"");
    }
    if opts.n_per_stratum.is_some() && opts.stratify_by.is_none() {
        ctx.error(diags, "n_per_stratum", "\"n_per_stratum\" needs \"stratify_by\"");
    }
    Some(Box::new(Sample { opts }))
}

#[async_trait]
impl Stage for Sample {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if let Some(col) = &self.opts.stratify_by {
            ctx.require_columns("stratify_by", 0, [col.as_str()]);
        }
        ctx.input_schema(0)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input = ctx.inputs[0].clone();
        let opts = self.opts.clone();
        let (seed, name) = (ctx.seed, ctx.name.clone());
        let cancel = ctx.cancel.clone();
        let key = move |id: &str| synth_core::rng::record_key(seed, &name, id, "sample");

        if let Some(fraction) = opts.fraction {
            return synth_engine::stages::exec::map_batches(
                ctx,
                0,
                input.schema.clone(),
                synth_engine::stages::exec::Ids::Kept,
                move |batch, _| {
                    let mask: BooleanArray = data::ids(batch)
                        .iter()
                        .map(|id| Some(synth_core::rng::unit(key(id.unwrap_or_default())) < fraction))
                        .collect();
                    Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
                },
            )
            .await;
        }

        // Choose the row indices to keep, then copy them in input order.
        let path = input.path.clone();
        let chosen: HashSet<u64> = tokio::task::spawn_blocking(move || -> Result<HashSet<u64>> {
            let strata = opts.stratify_by.clone();
            let visit = |f: &mut dyn FnMut(u64, &str, String)| -> Result<()> {
                let mut row = 0u64;
                for batch in open_reader(&path, BATCH_ROWS)? {
                    if cancel.is_cancelled() {
                        bail!(Cancelled);
                    }
                    let batch = batch?;
                    let ids = data::ids(&batch);
                    let strata_col = match &strata {
                        Some(col) => Some(stratum_strings(&batch, col)?),
                        None => None,
                    };
                    for i in 0..batch.num_rows() {
                        let s = strata_col.as_ref().map(|c| c[i].clone()).unwrap_or_default();
                        f(row, ids.value(i), s);
                        row += 1;
                    }
                }
                Ok(())
            };
            let quotas: Option<BTreeMap<String, u64>> = match (opts.n, opts.n_per_stratum, &opts.stratify_by) {
                (Some(n), None, Some(_)) => {
                    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
                    visit(&mut |_, _, s| *counts.entry(s).or_default() += 1)?;
                    Some(allocate(n, &counts))
                }
                _ => None,
            };
            // One bottom-k heap per stratum (a single one without strata).
            let mut heaps: BTreeMap<String, BinaryHeap<(u64, u64)>> = BTreeMap::new();
            visit(&mut |row, id, s| {
                let k = match (&quotas, opts.n_per_stratum, opts.n) {
                    (Some(q), _, _) => q.get(&s).copied().unwrap_or(0),
                    (None, Some(k), _) => k,
                    (None, None, Some(n)) => n,
                    _ => 0,
                };
                if k == 0 {
                    return;
                }
                let heap = heaps.entry(s).or_default();
                let item = (key(id), row);
                if (heap.len() as u64) < k {
                    heap.push(item);
                } else if heap.peek().is_some_and(|top| item < *top) {
                    heap.pop();
                    heap.push(item);
                }
            })?;
            Ok(heaps.into_values().flat_map(|h| h.into_iter().map(|(_, row)| row)).collect())
        })
        .await
        .context("sample worker panicked")??;

        let mut row = 0u64;
        synth_engine::stages::exec::map_batches(
            ctx,
            0,
            input.schema.clone(),
            synth_engine::stages::exec::Ids::Kept,
            move |batch: &RecordBatch, _| {
                let mask: BooleanArray =
                    (0..batch.num_rows() as u64).map(|i| Some(chosen.contains(&(row + i)))).collect();
                row += batch.num_rows() as u64;
                Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
            },
        )
        .await
    }
}

/// Stratum value of every row as text (null as "").
fn stratum_strings(batch: &RecordBatch, col: &str) -> Result<Vec<String>> {
    let idx = batch
        .schema()
        .index_of(col)
        .map_err(|_| anyhow::anyhow!("no column \"{col}\" (columns: {})", data::column_list(&batch.schema())))?;
    let arr = synth_core::data::arrow::compute::cast(batch.column(idx), &DataType::Utf8)
        .with_context(|| format!("column \"{col}\" cannot be used for strata"))?;
    let arr = arr.as_any().downcast_ref::<synth_core::data::arrow::array::StringArray>().expect("utf8");
    Ok((0..arr.len()).map(|i| if arr.is_null(i) { String::new() } else { arr.value(i).to_string() }).collect())
}

/// Split `n` over strata in proportion to their sizes (largest remainder; ties by name).
fn allocate(n: u64, counts: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let total: u64 = counts.values().sum();
    if total == 0 {
        return BTreeMap::new();
    }
    let n = n.min(total);
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let mut rema: Vec<(u128, &String)> = Vec::new();
    let mut given = 0;
    for (s, c) in counts {
        let exact = n as u128 * *c as u128;
        let q = (exact / total as u128) as u64;
        out.insert(s.clone(), q);
        given += q;
        rema.push((exact % total as u128, s));
    }
    rema.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    for (_, s) in rema.into_iter().take((n - given) as usize) {
        *out.get_mut(s).expect("present") += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_proportional_and_exact() {
        let counts: BTreeMap<String, u64> =
            [("a".to_string(), 50), ("b".to_string(), 30), ("c".to_string(), 20)].into();
        let q = allocate(10, &counts);
        assert_eq!(q.values().sum::<u64>(), 10);
        assert_eq!(q["a"], 5);
        assert_eq!(q["b"], 3);
        assert_eq!(q["c"], 2);
        let q = allocate(7, &counts);
        assert_eq!(q.values().sum::<u64>(), 7);
        assert_eq!(allocate(1000, &counts).values().sum::<u64>(), 100);
    }
}
