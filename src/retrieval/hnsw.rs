//! Approximate search with an HNSW index (usearch, inner-product metric, f32
//! storage). The most similar vector is a top-1 search; the least similar is a
//! top-1 search for the negated query — a farthest-point search, where HNSW is
//! weak, so callers measure recall against the exact kernel before trusting it.

use anyhow::{Result, anyhow};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::Extremes;

#[derive(Debug, Clone, Copy)]
pub struct HnswParams {
    pub connectivity: usize,
    pub expansion_add: usize,
    pub expansion_search: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams { connectivity: 32, expansion_add: 128, expansion_search: 64 }
    }
}

pub struct Hnsw {
    index: Index,
    dim: usize,
    max_ok: Vec<bool>,
    min_ok: Vec<bool>,
}

impl Hnsw {
    /// Build from row-major vectors, on `threads` threads.
    pub fn build(
        rows: &[f32],
        dim: usize,
        max_ok: Vec<bool>,
        min_ok: Vec<bool>,
        p: HnswParams,
        threads: usize,
    ) -> Result<Hnsw> {
        let n = rows.len() / dim;
        let options = IndexOptions {
            dimensions: dim,
            metric: MetricKind::IP,
            quantization: ScalarKind::F32,
            connectivity: p.connectivity,
            expansion_add: p.expansion_add,
            expansion_search: p.expansion_search,
            multi: false,
        };
        let index = Index::new(&options).map_err(|e| anyhow!("creating the HNSW index: {e}"))?;
        index.reserve_capacity_and_threads(n, threads.max(1)).map_err(|e| anyhow!("reserving the HNSW index: {e}"))?;
        let threads = threads.max(1);
        let chunk = n.div_ceil(threads);
        let errors = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..threads {
                let (index, errors) = (&index, &errors);
                s.spawn(move || {
                    for i in t * chunk..((t + 1) * chunk).min(n) {
                        if let Err(e) = index.add(i as u64, &rows[i * dim..(i + 1) * dim]) {
                            errors.lock().expect("errors").push(e.to_string());
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = errors.into_inner().expect("errors").into_iter().next() {
            return Err(anyhow!("adding to the HNSW index: {e}"));
        }
        Ok(Hnsw { index, dim, max_ok, min_ok })
    }

    /// Approximate extremes of each query.
    pub fn max_min(&self, queries: &[f32], threads: usize) -> Result<Vec<Extremes>> {
        let nq = queries.len() / self.dim;
        let mut out =
            vec![Extremes { max_idx: u32::MAX, max: f32::NEG_INFINITY, min_idx: u32::MAX, min: f32::INFINITY }; nq];
        let threads = threads.max(1);
        let chunk = nq.div_ceil(threads).max(1);
        let failed = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for (t, part) in out.chunks_mut(chunk).enumerate() {
                let failed = &failed;
                s.spawn(move || {
                    for (j, e) in part.iter_mut().enumerate() {
                        let q = &queries[(t * chunk + j) * self.dim..(t * chunk + j + 1) * self.dim];
                        let neg: Vec<f32> = q.iter().map(|x| -x).collect();
                        let best = self.index.filtered_search(q, 1, |k| self.max_ok[k as usize]);
                        let worst = self.index.filtered_search(&neg, 1, |k| self.min_ok[k as usize]);
                        match (best, worst) {
                            (Ok(b), Ok(w)) => {
                                if let (Some(k), Some(d)) = (b.keys.first(), b.distances.first()) {
                                    e.max_idx = *k as u32;
                                    e.max = 1.0 - d;
                                }
                                if let (Some(k), Some(d)) = (w.keys.first(), w.distances.first()) {
                                    // distance = 1 - (-q)·x  ⇒  q·x = d - 1
                                    e.min_idx = *k as u32;
                                    e.min = d - 1.0;
                                }
                            }
                            (Err(err), _) | (_, Err(err)) => {
                                *failed.lock().expect("failed") = Some(err.to_string());
                                return;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("failed") {
            return Err(anyhow!("HNSW search: {e}"));
        }
        Ok(out)
    }
}

/// Share of queries whose approximate extreme is the exact one: (max, min).
pub fn recall(approx: &[Extremes], exact: &[Extremes]) -> (f64, f64) {
    let n = approx.len().max(1) as f64;
    let max = approx.iter().zip(exact).filter(|(a, e)| a.max_idx == e.max_idx).count() as f64 / n;
    let min = approx.iter().zip(exact).filter(|(a, e)| a.min_idx == e.min_idx).count() as f64 / n;
    (max, min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{RowCorpus, exact_max_min};
    use crate::random_unit_vectors;

    #[test]
    fn hnsw_finds_extremes_on_small_data() {
        let dim = 16;
        let c = random_unit_vectors(300, dim, 5);
        let q = random_unit_vectors(20, dim, 6);
        let h = Hnsw::build(
            &c,
            dim,
            vec![true; 300],
            vec![true; 300],
            HnswParams { expansion_search: 300, ..Default::default() },
            2,
        )
        .unwrap();
        let approx = h.max_min(&q, 2).unwrap();
        let exact = exact_max_min(&q, &RowCorpus::from_rows(&c, dim), 1);
        let (rmax, rmin) = recall(&approx, &exact);
        assert!(rmax >= 0.9 && rmin >= 0.9, "recall {rmax} {rmin}");
        for (a, e) in approx.iter().zip(&exact) {
            if a.max_idx == e.max_idx {
                assert!((a.max - e.max).abs() < 1e-4);
            }
        }
    }
}
