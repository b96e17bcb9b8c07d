//! The benchmark's arithmetic (`all_eval.py`, Tables 4–5): a dimension's score is the
//! mean judge score over its file divided by the scale maximum, times 5 (a division by
//! the maximum, not a min–max rescale: a 1–4 scale cannot go below 1.25); AVG is the
//! mean of the dimension files' scores; an aspect is the unweighted mean of its
//! dimensions. The divisor is the fixed scale of the dimension table, never the largest
//! human score found in a (partial) file (P12).

use std::collections::BTreeMap;

use super::bench::Bench;

/// `mean / scale_max * 5`.
pub fn score5(mean: f64, scale_max: f64) -> f64 {
    mean / scale_max * 5.0
}

/// The mean of the values present (`None` when there is none).
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Each aspect's mean over its dimensions that have a score, in the definition's order
/// (`None` for an aspect with no scored dimension), with how many dimensions it has and how many were scored.
pub fn aspects(bench: &Bench, by_dimension: &BTreeMap<String, f64>) -> Vec<(String, Option<f64>, usize, usize)> {
    bench
        .aspects
        .iter()
        .map(|a| {
            let dims: Vec<&str> = bench.dimensions.iter().filter(|d| d.aspect == a.id).map(|d| d.id.as_str()).collect();
            let got: Vec<f64> = dims.iter().filter_map(|d| by_dimension.get(*d).copied()).collect();
            (a.id.clone(), mean(&got), dims.len(), got.len())
        })
        .collect()
}
