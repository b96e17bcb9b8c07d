//! The `hashing` embedder: the offline default. Features are lower-cased word
//! n-grams (words and bigrams by default), hashed (FNV-1a, stable across builds and
//! platforms) into `dim` buckets with a hash-derived sign; each feature weighs
//! `1 + ln(tf)`, each bucket is scaled by its inverse document frequency over the
//! embedding stage's own input, and the vector is L2-normalised. An empty text
//! gives the zero vector.

use fnv::FnvHashMap;
use std::hash::Hasher;
use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use serde::Deserialize;

use super::embedder::{Embedder, Fitter};
use synth_llm::CallCtx;
use synth_retrieval::l2_normalize;

#[derive(Debug, Clone, Deserialize)]
struct Options {
    dim: usize,
    ngrams: usize,
    idf: bool,
}

#[derive(Debug, Clone)]
pub struct Hashing {
    dim: usize,
    ngrams: usize,
    use_idf: bool,
    /// Per-bucket IDF, once fitted.
    idf: Option<Arc<Vec<f32>>>,
    idf_id: String,
}

impl Hashing {
    pub fn from_options(v: &serde_json::Value) -> Result<Hashing> {
        let o: Options = serde_json::from_value(v.clone())?;
        Ok(Hashing { dim: o.dim, ngrams: o.ngrams.clamp(1, 3), use_idf: o.idf, idf: None, idf_id: String::new() })
    }

    pub fn new(dim: usize, ngrams: usize) -> Hashing {
        Hashing { dim, ngrams, use_idf: false, idf: None, idf_id: String::new() }
    }

    fn tokens(text: &str) -> Vec<String> {
        text.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(|t| t.to_lowercase()).collect()
    }

    /// (bucket, sign, count) of every feature of a text. A map with a fixed hasher: its
    /// iteration order is the order `vector` sums colliding features in, so it must not
    /// change between runs (std's randomly seeded `HashMap` made vectors differ in the
    /// last bits from run to run when three or more features shared a bucket).
    fn features(&self, text: &str) -> FnvHashMap<u64, u32> {
        let tokens = Self::tokens(text);
        let mut counts: FnvHashMap<u64, u32> = FnvHashMap::default();
        for n in 1..=self.ngrams {
            for w in tokens.windows(n) {
                let mut h = fnv::FnvHasher::default();
                h.write(&[n as u8]);
                for t in w {
                    h.write(t.as_bytes());
                    h.write(&[0x1f]);
                }
                *counts.entry(h.finish()).or_default() += 1;
            }
        }
        counts
    }

    pub fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        for (h, count) in self.features(text) {
            let bucket = (h % self.dim as u64) as usize;
            let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
            v[bucket] += sign * (1.0 + (count as f32).ln());
        }
        if let Some(idf) = &self.idf {
            for (x, w) in v.iter_mut().zip(idf.iter()) {
                *x *= *w;
            }
        }
        l2_normalize(&mut v);
        v
    }
}

struct IdfFitter {
    base: Hashing,
    df: Vec<u64>,
    docs: u64,
}

impl Fitter for IdfFitter {
    fn observe(&mut self, text: &str) {
        self.docs += 1;
        let mut seen = vec![false; self.base.dim];
        for h in self.base.features(text).keys() {
            seen[(h % self.base.dim as u64) as usize] = true;
        }
        for (df, s) in self.df.iter_mut().zip(seen) {
            *df += s as u64;
        }
    }

    fn finish(self: Box<Self>) -> Arc<dyn Embedder> {
        Arc::new(self.fitted())
    }
}

impl IdfFitter {
    fn fitted(self) -> Hashing {
        let n = self.docs as f64;
        let idf: Vec<f32> = self.df.iter().map(|df| (((1.0 + n) / (1.0 + *df as f64)).ln() + 1.0) as f32).collect();
        let mut h = blake3::Hasher::new();
        h.update(&self.docs.to_le_bytes());
        for df in &self.df {
            h.update(&df.to_le_bytes());
        }
        let mut fitted = self.base;
        fitted.idf = Some(Arc::new(idf));
        fitted.idf_id = h.finalize().to_hex()[..16].to_string();
        fitted
    }
}

#[async_trait]
impl Embedder for Hashing {
    fn id(&self) -> String {
        let idf = if self.use_idf { format!(":idf={}", self.idf_id) } else { String::new() };
        format!("hashing:v1:dim={}:ngrams={}{idf}", self.dim, self.ngrams)
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn batch_size(&self) -> usize {
        1024
    }
    fn fitter(&self) -> Option<Box<dyn Fitter>> {
        (self.use_idf && self.idf.is_none())
            .then(|| Box::new(IdfFitter { base: self.clone(), df: vec![0; self.dim], docs: 0 }) as Box<dyn Fitter>)
    }
    fn cacheable(&self) -> bool {
        false
    }
    fn embed_blocking(&self, texts: &[String]) -> Option<Vec<Vec<f32>>> {
        use rayon::prelude::*;
        Some(texts.par_iter().map(|t| self.vector(t)).collect())
    }
    async fn embed(&self, texts: &[String], _ctx: &CallCtx) -> Result<Vec<Vec<f32>>> {
        Ok(texts.iter().map(|t| self.vector(t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn vectors_do_not_depend_on_the_run() {
        // Many features per bucket (dim 4): summation order matters, so it must be fixed.
        let h = Hashing::new(4, 3);
        let text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho";
        let first = h.vector(text);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for _ in 0..50 {
            assert_eq!(bits(&h.vector(text)), bits(&first));
        }
        // Across threads too (each thread's maps are fresh).
        let others: Vec<Vec<f32>> = std::thread::scope(|s| {
            (0..4)
                .map(|_| s.spawn(|| h.vector(text)))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect()
        });
        assert!(others.iter().all(|v| bits(v) == bits(&first)));
    }

    #[test]
    fn normalised_and_similar_texts_are_closer() {
        let h = Hashing::new(256, 2);
        let a = h.vector("How do I convert Fahrenheit to Celsius?");
        let b = h.vector("convert fahrenheit to celsius quickly");
        let c = h.vector("Best foods to increase blood platelets");
        assert!((dot(&a, &a) - 1.0).abs() < 1e-5);
        assert!(dot(&a, &b) > dot(&a, &c) + 0.2, "{} vs {}", dot(&a, &b), dot(&a, &c));
        assert_eq!(h.vector(""), vec![0.0; 256]);
        assert_eq!(a, h.vector("How do I convert Fahrenheit to Celsius?"));
    }

    #[test]
    fn idf_downweights_common_words() {
        let base = Hashing { use_idf: true, ..Hashing::new(512, 1) };
        let mut f = IdfFitter { base: base.clone(), df: vec![0; 512], docs: 0 };
        for i in 0..50 {
            f.observe(&format!("common item{i}"));
        }
        let fitted = f.fitted();
        assert!(fitted.id().contains(":idf="));
        let bucket = |w: &str| (*base.features(w).keys().next().unwrap() % 512) as usize;
        let v = fitted.vector("common rare");
        assert!(v[bucket("common")].abs() < v[bucket("rare")].abs(), "common words must weigh less");
        let plain = base.vector("common rare");
        assert!((plain[bucket("common")].abs() - plain[bucket("rare")].abs()).abs() < 1e-6);
    }
}
