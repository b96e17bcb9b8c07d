//! Inner-product search for the most and the least similar corpus vector of every
//! query, in one pass over the corpus and without materialising the score matrix.
//!
//! The corpus is packed once, as it is loaded, into strips of 32 vectors laid out
//! `[strip][dim][32]`. Each thread takes blocks of queries; for every strip it
//! computes 12-query × 32-vector tiles in registers (AVX-512: 24 accumulators,
//! broadcast FMAs from memory) and folds each tile into per-lane running maxima and
//! minima with their indices. A portable kernel (autovectorised; AVX2+FMA when the
//! CPU has it) covers other machines, slowly (~5% of peak). This is `method = "fused"`;
//! the default exact search is `gemm.rs`, fast on every CPU and equal to a float64
//! reference. Ties go to the lower corpus index, so results do not depend on the
//! number of threads.

pub mod gemm;
pub mod hnsw;

use std::sync::atomic::{AtomicUsize, Ordering};

/// Corpus vectors per strip (two AVX-512 registers of f32).
pub const STRIP: usize = 32;
/// Queries per register tile.
const MR: usize = 12;
/// Queries per block a thread works through before moving on.
const QUERY_BLOCK: usize = MR * 40;

/// The corpus, packed for the kernel, with optional per-vector eligibility masks.
pub struct PackedCorpus {
    pub dim: usize,
    pub len: usize,
    /// `[strip][dim][STRIP]`, zero-padded.
    data: Vec<f32>,
    /// Bit j of word s: vector s*32+j may be a maximum / a minimum.
    max_ok: Vec<u32>,
    min_ok: Vec<u32>,
}

impl PackedCorpus {
    pub fn with_capacity(dim: usize, len: usize) -> PackedCorpus {
        let strips = len.div_ceil(STRIP);
        PackedCorpus {
            dim,
            len: 0,
            data: Vec::with_capacity(strips * dim * STRIP),
            max_ok: Vec::new(),
            min_ok: Vec::new(),
        }
    }

    /// Append one vector with its eligibility for the maximum and the minimum.
    pub fn push(&mut self, v: &[f32], may_be_max: bool, may_be_min: bool) {
        assert_eq!(v.len(), self.dim, "vector of the wrong dimension");
        let i = self.len;
        let (s, lane) = (i / STRIP, i % STRIP);
        if lane == 0 {
            self.data.resize((s + 1) * self.dim * STRIP, 0.0);
            self.max_ok.push(0);
            self.min_ok.push(0);
        }
        let base = s * self.dim * STRIP;
        for (k, x) in v.iter().enumerate() {
            self.data[base + k * STRIP + lane] = *x;
        }
        if may_be_max {
            self.max_ok[s] |= 1 << lane;
        }
        if may_be_min {
            self.min_ok[s] |= 1 << lane;
        }
        self.len += 1;
    }

    pub fn from_rows(rows: &[f32], dim: usize) -> PackedCorpus {
        let n = rows.len() / dim;
        let mut c = PackedCorpus::with_capacity(dim, n);
        for r in rows.chunks_exact(dim) {
            c.push(r, true, true);
        }
        c
    }

    fn strips(&self) -> usize {
        self.max_ok.len()
    }

    fn strip(&self, s: usize) -> &[f32] {
        &self.data[s * self.dim * STRIP..(s + 1) * self.dim * STRIP]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// The most and least similar corpus vector of one query (`u32::MAX` when none is eligible).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extremes {
    pub max_idx: u32,
    pub max: f32,
    pub min_idx: u32,
    pub min: f32,
}

/// Running best values and indices of one query, per lane (16 lanes).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Running {
    max_v: [f32; 16],
    max_i: [u32; 16],
    min_v: [f32; 16],
    min_i: [u32; 16],
}

impl Default for Running {
    fn default() -> Self {
        Running {
            max_v: [f32::NEG_INFINITY; 16],
            max_i: [u32::MAX; 16],
            min_v: [f32::INFINITY; 16],
            min_i: [u32::MAX; 16],
        }
    }
}

impl Running {
    fn finish(&self) -> Extremes {
        let mut e = Extremes { max_idx: u32::MAX, max: f32::NEG_INFINITY, min_idx: u32::MAX, min: f32::INFINITY };
        for l in 0..16 {
            let (v, i) = (self.max_v[l], self.max_i[l]);
            if i != u32::MAX && (v > e.max || (v == e.max && i < e.max_idx)) {
                e.max = v;
                e.max_idx = i;
            }
            let (v, i) = (self.min_v[l], self.min_i[l]);
            if i != u32::MAX && (v < e.min || (v == e.min && i < e.min_idx)) {
                e.min = v;
                e.min_idx = i;
            }
        }
        e
    }
}

/// Which kernel runs on this CPU.
pub fn kernel_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return "avx2";
        }
    }
    "portable"
}

/// Exact maximum and minimum inner product of every query (`queries` row-major,
/// `dim` floats each) over `corpus`, using `threads` threads.
pub fn exact_max_min(queries: &[f32], corpus: &PackedCorpus, threads: usize) -> Vec<Extremes> {
    let dim = corpus.dim;
    assert_eq!(queries.len() % dim, 0);
    let nq = queries.len() / dim;
    let mut out =
        vec![Extremes { max_idx: u32::MAX, max: f32::NEG_INFINITY, min_idx: u32::MAX, min: f32::INFINITY }; nq];
    if nq == 0 || corpus.len == 0 {
        return out;
    }
    let next = AtomicUsize::new(0);
    // Small query sets still use every thread.
    let threads = threads.max(1);
    let query_block = QUERY_BLOCK.min(nq.div_ceil(threads).div_ceil(MR) * MR).max(MR);
    let blocks = nq.div_ceil(query_block);
    let chunks: Vec<&mut [Extremes]> = out.chunks_mut(query_block).collect();
    let slots: Vec<std::sync::Mutex<Option<&mut [Extremes]>>> =
        chunks.into_iter().map(|c| std::sync::Mutex::new(Some(c))).collect();
    let kernel = kernel_name();
    std::thread::scope(|scope| {
        for _ in 0..threads.min(blocks) {
            scope.spawn(|| {
                let mut block = vec![0f32; query_block * dim];
                let mut running = vec![Running::default(); query_block];
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= blocks {
                        break;
                    }
                    let q0 = b * query_block;
                    let n = (nq - q0).min(query_block);
                    let padded = pack_block(queries, q0, n, dim, &mut block);
                    running[..padded].fill(Running::default());
                    run_block(kernel, &block[..padded * dim], &mut running[..padded], corpus);
                    let mut slot = slots[b].lock().expect("slot");
                    let dst = slot.as_mut().expect("each block once");
                    for (d, r) in dst.iter_mut().zip(&running[..n]) {
                        *d = r.finish();
                    }
                }
            });
        }
    });
    out
}

/// Copy queries `q0..q0+n` into `block`, padded to whole tiles with the last query
/// and interleaved per tile as `[tile][dim][MR]`, so the kernel's broadcasts read
/// one contiguous stream. Returns the padded count.
fn pack_block(queries: &[f32], q0: usize, n: usize, dim: usize, block: &mut [f32]) -> usize {
    let padded = n.div_ceil(MR) * MR;
    for r in 0..padded {
        let src = q0 + r.min(n - 1);
        let (tile, lane) = (r / MR, r % MR);
        let dst = &mut block[tile * MR * dim..(tile + 1) * MR * dim];
        for (k, x) in queries[src * dim..(src + 1) * dim].iter().enumerate() {
            dst[k * MR + lane] = *x;
        }
    }
    padded
}

fn run_block(kernel: &str, block: &[f32], running: &mut [Running], corpus: &PackedCorpus) {
    #[cfg(target_arch = "x86_64")]
    {
        if kernel == "avx512" {
            // SAFETY: the CPU supports AVX-512F (checked by `kernel_name`).
            unsafe { avx512::run_block(block, running, corpus) };
            return;
        }
        if kernel == "avx2" {
            // SAFETY: the CPU supports AVX2 and FMA (checked by `kernel_name`).
            unsafe { portable_avx2(block, running, corpus) };
            return;
        }
    }
    let _ = kernel;
    portable(block, running, corpus);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn portable_avx2(block: &[f32], running: &mut [Running], corpus: &PackedCorpus) {
    portable(block, running, corpus)
}

/// Plain Rust kernel: 4 queries × 32 vectors per tile; the compiler vectorises it.
#[inline(always)]
fn portable(block: &[f32], running: &mut [Running], corpus: &PackedCorpus) {
    let dim = corpus.dim;
    let nq = running.len();
    for s in 0..corpus.strips() {
        let strip = corpus.strip(s);
        let (max_ok, min_ok) = (corpus.max_ok[s], corpus.min_ok[s]);
        let base = (s * STRIP) as u32;
        let mut q = 0;
        while q < nq {
            // `q` advances by 4 inside a 12-query tile laid out [dim][MR].
            let rows = (nq - q).min(4);
            let (tile, off) = (q / MR, q % MR);
            let tile_data = &block[tile * MR * dim..(tile + 1) * MR * dim];
            let mut acc = [[0f32; STRIP]; 4];
            for k in 0..dim {
                let b = &strip[k * STRIP..(k + 1) * STRIP];
                for (r, row) in acc.iter_mut().enumerate().take(rows) {
                    let a = tile_data[k * MR + off + r];
                    for j in 0..STRIP {
                        row[j] += a * b[j];
                    }
                }
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                fold(&mut running[q + r], row, base, max_ok, min_ok);
            }
            q += rows;
        }
    }
}

#[inline(always)]
fn fold(run: &mut Running, scores: &[f32; STRIP], base: u32, max_ok: u32, min_ok: u32) {
    for (j, &v) in scores.iter().enumerate() {
        let (l, i) = (j % 16, base + j as u32);
        if max_ok >> j & 1 == 1 && v > run.max_v[l] {
            run.max_v[l] = v;
            run.max_i[l] = i;
        }
        if min_ok >> j & 1 == 1 && v < run.min_v[l] {
            run.min_v[l] = v;
            run.min_i[l] = i;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    // The whole kernel is intrinsics on pointers derived from checked slices; the
    // only precondition is the CPU feature, which the caller checks.
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;

    use super::{MR, PackedCorpus, Running, STRIP};

    /// Every 12×32 tile of `block` × `corpus`, folded into `running`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `running.len()` must be a multiple of 12 and
    /// `block` must hold `running.len() * corpus.dim` floats.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn run_block(block: &[f32], running: &mut [Running], corpus: &PackedCorpus) {
        let dim = corpus.dim;
        let nq = running.len();
        assert_eq!(nq % MR, 0);
        assert!(block.len() >= nq * dim);
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for s in 0..corpus.strips() {
            let strip = corpus.strip(s).as_ptr();
            let (max_ok, min_ok) = (corpus.max_ok[s], corpus.min_ok[s]);
            let base = (s * STRIP) as i32;
            let idx_lo = _mm512_add_epi32(lanes, _mm512_set1_epi32(base));
            let idx_hi = _mm512_add_epi32(lanes, _mm512_set1_epi32(base + 16));
            let (max_lo, max_hi) = ((max_ok & 0xffff) as __mmask16, (max_ok >> 16) as __mmask16);
            let (min_lo, min_hi) = ((min_ok & 0xffff) as __mmask16, (min_ok >> 16) as __mmask16);
            let mut q = 0;
            while q < nq {
                let a = block.as_ptr().add(q * dim); // tile laid out [dim][MR]
                let mut acc = [_mm512_setzero_ps(); 2 * MR];
                for k in 0..dim {
                    let b0 = _mm512_loadu_ps(strip.add(k * STRIP));
                    let b1 = _mm512_loadu_ps(strip.add(k * STRIP + 16));
                    // Fully unrolled: 24 independent FMA chains.
                    macro_rules! row {
                        ($r:expr) => {{
                            let x = _mm512_set1_ps(*a.add(k * MR + $r));
                            acc[2 * $r] = _mm512_fmadd_ps(x, b0, acc[2 * $r]);
                            acc[2 * $r + 1] = _mm512_fmadd_ps(x, b1, acc[2 * $r + 1]);
                        }};
                    }
                    row!(0);
                    row!(1);
                    row!(2);
                    row!(3);
                    row!(4);
                    row!(5);
                    row!(6);
                    row!(7);
                    row!(8);
                    row!(9);
                    row!(10);
                    row!(11);
                }
                for r in 0..MR {
                    let run = &mut running[q + r];
                    let mut max_v = _mm512_load_ps(run.max_v.as_ptr());
                    let mut max_i = _mm512_load_si512(run.max_i.as_ptr() as *const __m512i);
                    let mut min_v = _mm512_load_ps(run.min_v.as_ptr());
                    let mut min_i = _mm512_load_si512(run.min_i.as_ptr() as *const __m512i);
                    for (h, idx, mx, mn) in [(0, idx_lo, max_lo, min_lo), (1, idx_hi, max_hi, min_hi)] {
                        let v = acc[2 * r + h];
                        let gt = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(mx, v, max_v);
                        max_v = _mm512_mask_blend_ps(gt, max_v, v);
                        max_i = _mm512_mask_blend_epi32(gt, max_i, idx);
                        let lt = _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(mn, v, min_v);
                        min_v = _mm512_mask_blend_ps(lt, min_v, v);
                        min_i = _mm512_mask_blend_epi32(lt, min_i, idx);
                    }
                    _mm512_store_ps(run.max_v.as_mut_ptr(), max_v);
                    _mm512_store_si512(run.max_i.as_mut_ptr() as *mut __m512i, max_i);
                    _mm512_store_ps(run.min_v.as_mut_ptr(), min_v);
                    _mm512_store_si512(run.min_i.as_mut_ptr() as *mut __m512i, min_i);
                }
                q += MR;
            }
        }
    }
}

/// Brute-force reference (one query), for tests and recall measurements.
pub fn brute_force(query: &[f32], rows: &[f32], dim: usize) -> Extremes {
    let mut e = Extremes { max_idx: u32::MAX, max: f32::NEG_INFINITY, min_idx: u32::MAX, min: f32::INFINITY };
    for (i, r) in rows.chunks_exact(dim).enumerate() {
        let s: f32 = query.iter().zip(r).map(|(a, b)| a * b).sum();
        if s > e.max {
            e.max = s;
            e.max_idx = i as u32;
        }
        if s < e.min {
            e.min = s;
            e.min_idx = i as u32;
        }
    }
    e
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_agree_with_brute_force() {
        for (nq, nc, dim) in [(1, 1, 3), (13, 70, 17), (25, 200, 384), (50, 33, 64)] {
            let q = random_unit_vectors(nq, dim, 1);
            let c = random_unit_vectors(nc, dim, 2);
            let packed = PackedCorpus::from_rows(&c, dim);
            let fast = exact_max_min(&q, &packed, 2);
            let mut block = vec![0.0; nq.div_ceil(MR) * MR * dim];
            let padded = pack_block(&q, 0, nq, dim, &mut block);
            let mut running = vec![Running::default(); padded];
            portable(&block, &mut running, &packed);
            for i in 0..nq {
                let want = brute_force(&q[i * dim..(i + 1) * dim], &c, dim);
                let port = running[i].finish();
                for got in [fast[i], port] {
                    assert_eq!(got.max_idx, want.max_idx, "query {i} of {nq}x{nc}x{dim}");
                    assert_eq!(got.min_idx, want.min_idx, "query {i} of {nq}x{nc}x{dim}");
                    assert!((got.max - want.max).abs() < 1e-4 && (got.min - want.min).abs() < 1e-4);
                }
            }
        }
    }

    #[test]
    fn eligibility_masks_and_thread_independence() {
        let dim = 8;
        let q = random_unit_vectors(30, dim, 3);
        let c = random_unit_vectors(100, dim, 4);
        let mut packed = PackedCorpus::with_capacity(dim, 100);
        for (i, r) in c.chunks_exact(dim).enumerate() {
            packed.push(r, i % 2 == 0, i % 3 == 0);
        }
        let a = exact_max_min(&q, &packed, 1);
        let b = exact_max_min(&q, &packed, 3);
        assert_eq!(a, b);
        for e in &a {
            assert_eq!(e.max_idx % 2, 0);
            assert_eq!(e.min_idx % 3, 0);
        }
    }
}
