//! Exact inner-product search through a blocked GEMM: `method = "exact"`, the default,
//! close to the same-shape GEMM peak on every CPU measured (BENCHMARKS.md, "Exact
//! retrieval").
//!
//! Scores come from the `gemm` crate, which picks its micro-kernel at run time
//! (AVX-512, AVX2+FMA or SSE on x86-64, NEON on aarch64), into a score tile of
//! [`QUERY_BLOCK`] queries × [`CORPUS_TILE`] vectors (2 MiB, cache-resident), folded into
//! per-query running maxima and minima before the next tile overwrites it: the score
//! matrix is never materialised. Threads take corpus tiles, so the corpus streams from
//! memory once and a small query set still uses every core.
//!
//! Exactness: an f32 inner product of length d is within `d·ε/2·|q|·|c|` of the true
//! value, whatever the summation order. The fold keeps every eligible vector whose f32
//! score lies within twice that of the running best (a band that is almost always one
//! vector wide), and the winner is chosen among them by inner products recomputed in
//! f64, ties to the lower corpus index. So results (indices, and scores as the f64 value
//! rounded to f32) equal a float64 reference on every CPU and for any thread count.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Extremes, random_unit_vectors};

/// The shape of one GEMM: `query_block` queries (its rows; the corpus tile is packed
/// once for this many) × `corpus_tile` corpus vectors (its columns). Their product of f32
/// scores is folded while it is in cache. `synth bench retrieve --query-block/--corpus-tile`
/// measures others (BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    pub query_block: usize,
    pub corpus_tile: usize,
}

impl Default for Tiles {
    fn default() -> Tiles {
        Tiles { query_block: QUERY_BLOCK, corpus_tile: CORPUS_TILE }
    }
}

/// Default queries per GEMM.
pub const QUERY_BLOCK: usize = 1024;
/// Default corpus vectors per score tile: 1024 × 512 f32 scores = 2 MiB.
pub const CORPUS_TILE: usize = 512;

/// The corpus, row-major, with per-vector eligibility for the maximum and the minimum.
pub struct RowCorpus {
    pub dim: usize,
    pub len: usize,
    /// `[len][dim]`.
    data: Vec<f32>,
    /// Bit `i % 64` of word `i / 64`: vector i may be a maximum / a minimum.
    max_ok: Vec<u64>,
    min_ok: Vec<u64>,
    /// The largest Euclidean norm of a vector (for the error bound).
    max_norm: f64,
}

impl RowCorpus {
    pub fn with_capacity(dim: usize, len: usize) -> RowCorpus {
        RowCorpus {
            dim,
            len: 0,
            data: Vec::with_capacity(len * dim),
            max_ok: Vec::with_capacity(len.div_ceil(64)),
            min_ok: Vec::with_capacity(len.div_ceil(64)),
            max_norm: 0.0,
        }
    }

    /// Append one vector with its eligibility for the maximum and the minimum.
    pub fn push(&mut self, v: &[f32], may_be_max: bool, may_be_min: bool) {
        assert_eq!(v.len(), self.dim, "vector of the wrong dimension");
        let i = self.len;
        if i.is_multiple_of(64) {
            self.max_ok.push(0);
            self.min_ok.push(0);
        }
        self.data.extend_from_slice(v);
        self.max_ok[i / 64] |= u64::from(may_be_max) << (i % 64);
        self.min_ok[i / 64] |= u64::from(may_be_min) << (i % 64);
        let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
        if norm > self.max_norm {
            self.max_norm = norm;
        }
        self.len += 1;
    }

    pub fn from_rows(rows: &[f32], dim: usize) -> RowCorpus {
        let n = rows.len() / dim;
        let mut c = RowCorpus::with_capacity(dim, n);
        for r in rows.chunks_exact(dim) {
            c.push(r, true, true);
        }
        c
    }

    /// The inner product of `query` with vector `i` as the search decides it: exact
    /// products, f64 sums (the value every reported score is rounded from).
    pub fn score64(&self, query: &[f32], i: usize) -> f64 {
        dot64(query, self.row(i))
    }

    /// All vectors, row-major (`len` × `dim`).
    pub fn rows(&self) -> &[f32] {
        &self.data
    }

    /// Per vector: whether it may be the maximum, and the minimum.
    pub fn eligibility(&self) -> (Vec<bool>, Vec<bool>) {
        ((0..self.len).map(|i| self.may_be_max(i)).collect(), (0..self.len).map(|i| self.may_be_min(i)).collect())
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    fn may_be_max(&self, i: usize) -> bool {
        self.max_ok[i / 64] >> (i % 64) & 1 == 1
    }

    fn may_be_min(&self, i: usize) -> bool {
        self.min_ok[i / 64] >> (i % 64) & 1 == 1
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4 + (self.max_ok.len() + self.min_ok.len()) * 8
    }
}

const NONE: Extremes = Extremes { max_idx: u32::MAX, max: f32::NEG_INFINITY, min_idx: u32::MAX, min: f32::INFINITY };

/// What the fold keeps of one query: the best f32 scores and the candidates within the
/// error band of each.
#[derive(Clone, Default)]
struct Running {
    max_v: f32,
    min_v: f32,
    /// (corpus index, f32 score), in index order.
    max_c: Vec<(u32, f32)>,
    min_c: Vec<(u32, f32)>,
}

impl Running {
    fn reset(&mut self) {
        self.max_v = f32::NEG_INFINITY;
        self.min_v = f32::INFINITY;
        self.max_c.clear();
        self.min_c.clear();
    }

    /// Fold one row of a score tile (`row[j]` is the score of corpus vector `j0 + j`).
    #[inline]
    fn fold(&mut self, row: &[f32], j0: usize, band: f32, corpus: &RowCorpus) {
        let (above, below) = beyond(row, self.max_v - band, self.min_v + band);
        if above {
            for (j, &v) in row.iter().enumerate() {
                if v >= self.max_v - band && corpus.may_be_max(j0 + j) {
                    if v > self.max_v {
                        self.max_v = v;
                        self.max_c.retain(|(_, s)| *s >= v - band);
                    }
                    self.max_c.push(((j0 + j) as u32, v));
                }
            }
        }
        if below {
            for (j, &v) in row.iter().enumerate() {
                if v <= self.min_v + band && corpus.may_be_min(j0 + j) {
                    if v < self.min_v {
                        self.min_v = v;
                        self.min_c.retain(|(_, s)| *s <= v + band);
                    }
                    self.min_c.push(((j0 + j) as u32, v));
                }
            }
        }
    }

    /// The winners among the candidates, by inner products in f64 (ties: lower index).
    fn finish(&self, query: &[f32], corpus: &RowCorpus) -> Extremes {
        let mut e = NONE;
        let (mut best_max, mut best_min) = (f64::NEG_INFINITY, f64::INFINITY);
        for &(i, _) in &self.max_c {
            let s = dot64(query, corpus.row(i as usize));
            if e.max_idx == u32::MAX || s > best_max || (s == best_max && i < e.max_idx) {
                (best_max, e.max_idx) = (s, i);
            }
        }
        for &(i, _) in &self.min_c {
            let s = dot64(query, corpus.row(i as usize));
            if e.min_idx == u32::MAX || s < best_min || (s == best_min && i < e.min_idx) {
                (best_min, e.min_idx) = (s, i);
            }
        }
        if e.max_idx != u32::MAX {
            e.max = best_max as f32;
        }
        if e.min_idx != u32::MAX {
            e.min = best_min as f32;
        }
        e
    }
}

/// The inner product in f64 (exact products of f32 inputs, f64 sums).
fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
}

/// Whether the row's largest value is `>= hi`, and whether its smallest is `<= lo`, NaNs
/// left out (the largest of no value is -inf, the smallest +inf): the fold's fast path,
/// almost always neither, for the widest vectors the CPU has. (A row with no value and
/// `hi` = -inf counts as above; the fold then finds no candidate in it.)
#[inline]
fn beyond(row: &[f32], hi: f32, lo: f32) -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "avx512") && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { beyond_avx512(row, hi, lo) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { beyond_avx2(row, hi, lo) };
        }
    }
    beyond_generic(row, hi, lo)
}

// The row's maximum and minimum, then two comparisons: `max(v, acc)` in that operand
// order keeps `acc` where `v` is NaN (x86's MAXPS/MINPS return the second operand when
// either is NaN), so a NaN score counts as neither, as `v >= hi` and `v <= lo` say.
// Explicit vectors: left to the auto-vectoriser, the 16-lane flag loop this replaced
// compiled to gathers and stack spills and took 11% of the search (BENCHMARKS.md).

/// One x86 version of [`beyond`]: two running maxima and two running minima of `$lanes`
/// floats over the row, then the tail (under two vectors) one value at a time.
macro_rules! beyond_x86 {
    ($name:ident, $feature:literal, $lanes:literal, $set1:ident, $load:ident, $store:ident, $max:ident, $min:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(row: &[f32], hi: f32, lo: f32) -> (bool, bool) {
            use std::arch::x86_64::*;
            const L: usize = $lanes;
            let (n, p) = (row.len(), row.as_ptr());
            let (mut mx0, mut mx1) = ($set1(f32::NEG_INFINITY), $set1(f32::NEG_INFINITY));
            let (mut mn0, mut mn1) = ($set1(f32::INFINITY), $set1(f32::INFINITY));
            let mut i = 0;
            while i + 2 * L <= n {
                // SAFETY: both loads read L floats, from p + i and p + i + L; i + 2L <= n.
                let (a, b) = unsafe { ($load(p.add(i)), $load(p.add(i + L))) };
                (mx0, mx1) = ($max(a, mx0), $max(b, mx1));
                (mn0, mn1) = ($min(a, mn0), $min(b, mn1));
                i += 2 * L;
            }
            let (mut mx, mut mn) = ([0f32; L], [0f32; L]);
            // SAFETY: each store writes L floats into an L-float array.
            unsafe {
                $store(mx.as_mut_ptr(), $max(mx0, mx1));
                $store(mn.as_mut_ptr(), $min(mn0, mn1));
            }
            let (above, below) = beyond_generic(&row[i..], hi, lo);
            (above || mx.iter().any(|v| *v >= hi), below || mn.iter().any(|v| *v <= lo))
        }
    };
}

beyond_x86!(
    beyond_avx512,
    "avx512f",
    16,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_max_ps,
    _mm512_min_ps
);
beyond_x86!(beyond_avx2, "avx2", 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_max_ps, _mm256_min_ps);

/// The same, one value at a time with eight running maxima and minima (NEON and other
/// CPUs, and the tails of the vector versions).
#[inline(always)]
fn beyond_generic(row: &[f32], hi: f32, lo: f32) -> (bool, bool) {
    const L: usize = 8;
    let (mut mx, mut mn) = ([f32::NEG_INFINITY; L], [f32::INFINITY; L]);
    let chunks = row.chunks_exact(L);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..L {
            // Selects, not f32::max: a NaN score keeps the running value.
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            mn[l] = if c[l] < mn[l] { c[l] } else { mn[l] };
        }
    }
    let above = mx.iter().chain(rest).any(|v| *v >= hi);
    let below = mn.iter().chain(rest).any(|v| *v <= lo);
    (above, below)
}

/// The GEMM micro-kernel family this CPU runs (the `gemm` crate's run-time choice).
pub fn kernel_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if cfg!(feature = "avx512") && has!("avx512f") {
            return "gemm-avx512";
        }
        if has!("avx2") && has!("fma") {
            return "gemm-avx2";
        }
        return "gemm-sse";
    }
    #[cfg(target_arch = "aarch64")]
    {
        return "gemm-neon";
    }
    #[allow(unreachable_code)]
    "gemm-scalar"
}

/// `dst` (`m` × `n`, row-major) = `lhs` (`m` × `dim`, row-major) × the `n` corpus-layout
/// rows of `rhs` (`n` × `dim`, row-major) transposed. One thread.
fn scores(m: usize, n: usize, dim: usize, lhs: &[f32], rhs: &[f32], dst: &mut [f32]) {
    assert!(lhs.len() >= m * dim && rhs.len() >= n * dim && dst.len() >= m * n);
    // SAFETY: the three matrices lie within the slices (checked above) with the strides
    // given: dst (col stride 1, row stride n), lhs (1, dim), rhs as k × n (col stride
    // dim, row stride 1); dst does not alias the inputs (a `&mut` borrow).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            dim,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            dim as isize,
            rhs.as_ptr(),
            dim as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            ::gemm::Parallelism::None,
        );
    }
}

/// Exact maximum and minimum inner product of every query (`queries` row-major,
/// `dim` floats each) over `corpus`, using `threads` threads.
///
/// Threads take corpus tiles (so the corpus is read from memory once, and a small query
/// set still uses every core); within a tile, the queries go through in blocks of
/// [`QUERY_BLOCK`] while the tile stays in cache. Each thread keeps its own candidates
/// per query; the union is decided in f64, so the split does not change the result.
pub fn exact_max_min(queries: &[f32], corpus: &RowCorpus, threads: usize) -> Vec<Extremes> {
    exact_max_min_tiled(queries, corpus, threads, Tiles::default())
}

/// [`exact_max_min`] with a given GEMM shape (the result does not depend on it).
pub fn exact_max_min_tiled(queries: &[f32], corpus: &RowCorpus, threads: usize, tiles: Tiles) -> Vec<Extremes> {
    let Tiles { query_block, corpus_tile } = tiles;
    assert!(query_block > 0 && corpus_tile > 0, "empty tile");
    let dim = corpus.dim;
    assert_eq!(queries.len() % dim.max(1), 0);
    let nq = queries.len().checked_div(dim).unwrap_or(0);
    if nq == 0 || corpus.len == 0 {
        return vec![NONE; nq];
    }
    // The error band of each query: twice the bound on an f32 inner product.
    let bands: Vec<f32> = queries
        .chunks_exact(dim)
        .map(|q| {
            let norm = q.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
            ((dim as f64 + 2.0) * f64::from(f32::EPSILON) * norm * corpus.max_norm) as f32
        })
        .collect();
    let tiles = corpus.len.div_ceil(corpus_tile);
    let next = AtomicUsize::new(0);
    let per_thread: Vec<Vec<Running>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.max(1).min(tiles))
            .map(|_| {
                scope.spawn(|| {
                    let mut tile = vec![0f32; query_block * corpus_tile];
                    let mut running = vec![Running::default(); nq];
                    running.iter_mut().for_each(Running::reset);
                    loop {
                        let t = next.fetch_add(1, Ordering::Relaxed);
                        if t >= tiles {
                            break;
                        }
                        let j0 = t * corpus_tile;
                        let n = (corpus.len - j0).min(corpus_tile);
                        let rhs = &corpus.data[j0 * dim..(j0 + n) * dim];
                        for q0 in (0..nq).step_by(query_block) {
                            let m = (nq - q0).min(query_block);
                            scores(m, n, dim, &queries[q0 * dim..(q0 + m) * dim], rhs, &mut tile);
                            for r in 0..m {
                                running[q0 + r].fold(&tile[r * n..(r + 1) * n], j0, bands[q0 + r], corpus);
                            }
                        }
                    }
                    running
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("search thread")).collect()
    });
    (0..nq)
        .map(|q| {
            let mut all = Running::default();
            for r in &per_thread {
                all.max_c.extend_from_slice(&r[q].max_c);
                all.min_c.extend_from_slice(&r[q].min_c);
            }
            all.finish(&queries[q * dim..(q + 1) * dim], corpus)
        })
        .collect()
}

/// GFLOP/s of a plain GEMM of the shape the search uses (`query_block` ×
/// `corpus_tile` × `dim`, one per thread, no fold), through the same call, for about
/// `seconds`: the peak the search is measured against.
pub fn sgemm_peak(dim: usize, threads: usize, seconds: f64, tiles: Tiles) -> f64 {
    let Tiles { query_block, corpus_tile } = tiles;
    let lhs = random_unit_vectors(query_block, dim, 1);
    let rhs = random_unit_vectors(corpus_tile, dim, 2);
    let threads = threads.max(1);
    let start = std::time::Instant::now();
    let calls: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut tile = vec![0f32; query_block * corpus_tile];
                    let mut n = 0usize;
                    while n < 3 || start.elapsed().as_secs_f64() < seconds {
                        scores(query_block, corpus_tile, dim, &lhs, &rhs, &mut tile);
                        n += 1;
                    }
                    std::hint::black_box(&tile);
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("gemm thread")).sum()
    });
    let flop = 2.0 * (query_block * corpus_tile * dim) as f64 * calls as f64;
    flop / start.elapsed().as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float64 reference: exact products, f64 sums, ties to the lower index.
    fn reference(
        q: &[f32],
        rows: &[f32],
        dim: usize,
        max_ok: &dyn Fn(usize) -> bool,
        min_ok: &dyn Fn(usize) -> bool,
    ) -> Extremes {
        let mut e = NONE;
        let (mut hi, mut lo) = (f64::NEG_INFINITY, f64::INFINITY);
        for (i, r) in rows.chunks_exact(dim).enumerate() {
            let s = dot64(q, r);
            if max_ok(i) && (e.max_idx == u32::MAX || s > hi) {
                (hi, e.max_idx, e.max) = (s, i as u32, s as f32);
            }
            if min_ok(i) && (e.min_idx == u32::MAX || s < lo) {
                (lo, e.min_idx, e.min) = (s, i as u32, s as f32);
            }
        }
        e
    }

    #[test]
    fn equal_to_a_float64_reference() {
        for (nq, nc, dim) in [(1, 1, 3), (13, 70, 17), (25, 2100, 384), (300, 1500, 64), (5, 33, 1)] {
            let q = random_unit_vectors(nq, dim, 1);
            let c = random_unit_vectors(nc, dim, 2);
            let got = exact_max_min(&q, &RowCorpus::from_rows(&c, dim), 2);
            for i in 0..nq {
                let want = reference(&q[i * dim..(i + 1) * dim], &c, dim, &|_| true, &|_| true);
                assert_eq!(got[i], want, "query {i} of {nq}x{nc}x{dim}");
            }
        }
    }

    #[test]
    fn duplicates_and_masks_match_the_reference_for_any_thread_count() {
        // Every corpus vector appears three times (ties everywhere), some queries are
        // corpus vectors themselves, and the masks exclude different rows from each side.
        let dim = 48;
        let base = random_unit_vectors(700, dim, 9);
        let mut rows = Vec::new();
        for copy in 0..3 {
            for (i, r) in base.chunks_exact(dim).enumerate() {
                if (i + copy) % 2 == 0 {
                    rows.extend_from_slice(r);
                }
                rows.extend_from_slice(r);
            }
        }
        let n = rows.len() / dim;
        let max_ok = |i: usize| i % 5 != 1;
        let min_ok = |i: usize| !i.is_multiple_of(3);
        let mut corpus = RowCorpus::with_capacity(dim, n);
        for (i, r) in rows.chunks_exact(dim).enumerate() {
            corpus.push(r, max_ok(i), min_ok(i));
        }
        let mut q = random_unit_vectors(600, dim, 10);
        q[..40 * dim].copy_from_slice(&rows[100 * dim..140 * dim]);
        let one = exact_max_min(&q, &corpus, 1);
        for threads in [2, 3, 8] {
            assert_eq!(exact_max_min(&q, &corpus, threads), one, "{threads} threads");
        }
        for (query_block, corpus_tile) in [(1, 1), (7, 33), (64, 4096)] {
            let tiles = Tiles { query_block, corpus_tile };
            assert_eq!(exact_max_min_tiled(&q, &corpus, 2, tiles), one, "{tiles:?}");
        }
        for (i, got) in one.iter().enumerate() {
            let want = reference(&q[i * dim..(i + 1) * dim], &rows, dim, &max_ok, &min_ok);
            assert_eq!(*got, want, "query {i}");
            assert!(max_ok(got.max_idx as usize) && min_ok(got.min_idx as usize));
        }
    }

    #[test]
    fn nothing_eligible_is_none() {
        let dim = 4;
        let c = random_unit_vectors(10, dim, 3);
        let mut corpus = RowCorpus::with_capacity(dim, 10);
        for r in c.chunks_exact(dim) {
            corpus.push(r, false, true);
        }
        let got = exact_max_min(&random_unit_vectors(2, dim, 4), &corpus, 2);
        assert!(got.iter().all(|e| e.max_idx == u32::MAX && e.max == f32::NEG_INFINITY && e.min_idx != u32::MAX));
    }

    #[test]
    fn peak_is_measured() {
        assert!(sgemm_peak(16, 1, 0.0, Tiles::default()) > 0.0);
    }

    /// The fold's fast path, on every ISA this CPU has, against its definition: rows of
    /// every length up to 80 (the vector loops' tails), thresholds equal to a value
    /// (`>=`, not `>`), infinite thresholds, and NaN scores, which count as neither.
    #[test]
    fn beyond_is_any_at_or_past_the_thresholds() {
        let values = random_unit_vectors(1, 4096, 7);
        let mut checked = 0;
        for n in 0..=80usize {
            let mut row: Vec<f32> = values[n * 40..n * 40 + n].to_vec();
            if n % 3 == 1 {
                row[n / 2] = f32::NAN;
            }
            if n % 5 == 2 {
                row[n - 1] = f32::NAN;
            }
            let finite: Vec<f32> = row.iter().copied().filter(|v| !v.is_nan()).collect();
            let mut ts: Vec<f32> = finite.clone();
            ts.extend([f32::NEG_INFINITY, f32::INFINITY, 0.0, 1.0, -1.0]);
            for &hi in &ts {
                for &lo in ts.iter().step_by(3) {
                    let (mx, mn) =
                        finite.iter().fold((f32::NEG_INFINITY, f32::INFINITY), |(a, b), v| (a.max(*v), b.min(*v)));
                    let want = (mx >= hi, mn <= lo);
                    assert_eq!(beyond(&row, hi, lo), want, "n {n}, hi {hi}, lo {lo}");
                    assert_eq!(beyond_generic(&row, hi, lo), want, "generic: n {n}, hi {hi}, lo {lo}");
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2 (checked just above).
                        assert_eq!(unsafe { beyond_avx2(&row, hi, lo) }, want, "avx2: n {n}, hi {hi}, lo {lo}");
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }
}
