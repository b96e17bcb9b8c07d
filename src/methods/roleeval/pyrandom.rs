//! CPython's `random.Random(seed).sample` (MT19937 seeded by `init_by_array`, from the
//! `rand_mt` crate; `getrandbits`, `_randbelow` and `sample` as in CPython's
//! `Lib/random.py`): lm-eval's default few-shot sampler draws each question's exemplars
//! with `Random(1234).sample(docs, k)`, so `fewshot_order = "lm_eval_random_1234"`
//! reproduces its exemplar order.

use rand_mt::Mt;

/// A `random.Random(seed)` for a non-negative integer seed below 2^32.
pub struct PyRandom {
    mt: Mt,
}

impl PyRandom {
    pub fn new(seed: u32) -> PyRandom {
        // CPython seeds with the absolute value's 32-bit words, least significant first.
        PyRandom { mt: Mt::new_with_key([seed]) }
    }

    /// `getrandbits(k)` for 1 <= k <= 32.
    fn getrandbits(&mut self, k: u32) -> u32 {
        debug_assert!((1..=32).contains(&k));
        self.mt.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)`: rejection sampling on `n.bit_length()` bits.
    fn randbelow(&mut self, n: usize) -> usize {
        let bits = usize::BITS - n.leading_zeros();
        loop {
            let r = self.getrandbits(bits) as usize;
            if r < n {
                return r;
            }
        }
    }

    /// `sample(range(n), k)`: indices in CPython's order (the pool algorithm for small
    /// populations, the set algorithm for large ones, as CPython chooses).
    pub fn sample(&mut self, n: usize, k: usize) -> Vec<usize> {
        assert!(k <= n, "sample larger than population");
        let mut setsize = 21usize;
        if k > 5 {
            // 4 ** ceil(log(k * 3, 4))
            setsize += 4usize.pow(((k * 3) as f64).log(4.0).ceil() as u32);
        }
        let mut out = Vec::with_capacity(k);
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow(n - i);
                out.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            let mut selected = std::collections::HashSet::new();
            for _ in 0..k {
                let mut j = self.randbelow(n);
                while !selected.insert(j) {
                    j = self.randbelow(n);
                }
                out.push(j);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::PyRandom;

    /// Expected values from CPython 3.11:
    /// `r = random.Random(1234); [r.sample(range(5), 5) for _ in range(4)]` etc.
    #[test]
    fn matches_cpython() {
        let mut r = PyRandom::new(1234);
        assert_eq!(r.getrandbits(32), 4150886329);
        assert_eq!(r.getrandbits(32), 3342196574);
        let mut r = PyRandom::new(1234);
        let got: Vec<Vec<usize>> = (0..4).map(|_| r.sample(5, 5)).collect();
        assert_eq!(got, [[3, 0, 4, 2, 1], [0, 4, 1, 3, 2], [0, 4, 1, 2, 3], [1, 0, 3, 2, 4]]);
        let mut r = PyRandom::new(1234);
        let got: Vec<Vec<usize>> = (0..3).map(|_| r.sample(40, 3)).collect();
        assert_eq!(got, [[28, 7, 0], [5, 37, 2], [5, 6, 22]]);
    }
}
