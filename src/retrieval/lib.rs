//! Inner-product search for the most and the least similar corpus vector of every
//! query, without materialising the score matrix: exact (`gemm`, the default: a blocked
//! GEMM folded into running maxima and minima, equal to a float64 reference on every
//! CPU) or approximate (`hnsw`, usearch). What both share: the result type,
//! seeded test vectors and normalisation.
//!
//! (An older one-pass kernel, `method = "fused"`, lived here until issue 35: with
//! AVX-512 it was within 3% of `gemm`, without it ~5% of peak; BENCHMARKS.md, "Exact
//! retrieval".)

pub mod gemm;
pub mod hnsw;

/// The most and least similar corpus vector of one query (`u32::MAX` when none is eligible).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extremes {
    pub max_idx: u32,
    pub max: f32,
    pub min_idx: u32,
    pub min: f32,
}

/// Seeded random unit vectors (for tests and benchmarks).
pub fn random_unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut v: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    for row in v.chunks_exact_mut(dim) {
        l2_normalize(row);
    }
    v
}

/// Scale a vector to unit length (inner product = cosine); a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (*x as f64 / norm) as f32;
        }
    }
}
