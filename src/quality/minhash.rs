//! Near-duplicate detection by MinHash + LSH (Broder 1997; the banding of Leskovec,
//! Rajaraman and Ullman, "Mining of Massive Datasets" ch. 3), on the `gaoya` crate:
//! word n-gram shingles, a signature of `bands × rows` 32-bit min-hashes (seeded, so
//! the same text always gets the same signature), and a banded index. The decision is
//! made in input order: a text is a duplicate of the first earlier kept text whose
//! estimated Jaccard similarity reaches the threshold (the lowest position among ties),
//! so the kept records depend only on the input order, never on threads or shards.

use gaoya::minhash::{MinHashIndex, MinHasher, MinHasher32};
use rayon::prelude::*;

use super::text;

/// How texts are compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Words per shingle (texts shorter than this are one shingle).
    pub shingle: usize,
    /// LSH bands and rows per band (the signature has `bands × rows` hashes).
    pub bands: usize,
    pub rows: usize,
    /// Estimated Jaccard similarity at or above which a text is a near-duplicate.
    pub threshold: f64,
    /// Seed of the hash functions.
    pub seed: u64,
}

impl Default for Params {
    /// datatrove's defaults: 5-word shingles, 14 bands × 8 rows; threshold 0.8.
    fn default() -> Self {
        Params { shingle: 5, bands: 14, rows: 8, threshold: 0.8, seed: 1 }
    }
}

/// A signature per text.
pub struct Signer {
    hasher: MinHasher32<fnv::FnvBuildHasher>,
    shingle: usize,
}

impl Signer {
    pub fn new(p: &Params) -> Signer {
        Signer {
            hasher: MinHasher32::new_with_hasher_and_seed(p.bands * p.rows, Default::default(), p.seed),
            shingle: p.shingle.max(1),
        }
    }

    /// The signature of one text (lower-cased words; punctuation ignored).
    pub fn sign(&self, text: &str) -> Vec<u32> {
        let words = text::words(text);
        if words.len() <= self.shingle {
            return self.hasher.create_signature(std::iter::once(words.join(" ")));
        }
        self.hasher.create_signature(words.windows(self.shingle).map(|w| w.join(" ")))
    }
}

/// Where each text went: `None` kept, `Some((k, similarity))` a near-duplicate of text `k`
/// (an earlier, kept one).
pub type Decisions = Vec<Option<(usize, f64)>>;

/// Decide which texts are near-duplicates of earlier ones. `groups` (same length as
/// `texts`, optional) limits comparisons to texts of the same group. Signatures are
/// computed in parallel; decisions are made in input order.
pub fn dedup(texts: &[&str], groups: Option<&[String]>, p: &Params) -> Decisions {
    let signer = Signer::new(p);
    decide(texts.par_iter().map(|t| signer.sign(t)).collect(), groups, None, p)
}

/// [`dedup`] on signatures already made (by a [`Signer`] of the same `p`). `same` (same
/// length, optional): texts with the same value are never near-duplicates of each other
/// (one request asked twice by design, e.g. a plan that reuses a profile).
pub fn decide(signatures: Vec<Vec<u32>>, groups: Option<&[String]>, same: Option<&[String]>, p: &Params) -> Decisions {
    let mut indexes: std::collections::HashMap<&str, MinHashIndex<u32, u32>> = Default::default();
    let mut out = Vec::with_capacity(signatures.len());
    for (i, sig) in signatures.into_iter().enumerate() {
        let group = groups.map(|g| g[i].as_str()).unwrap_or("");
        let index = indexes.entry(group).or_insert_with(|| MinHashIndex::new(p.bands, p.rows, p.threshold));
        let best = index
            .query_owned_return_similarity(&sig)
            .into_iter()
            .filter(|(k, s)| *s >= p.threshold && same.is_none_or(|same| same[*k as usize] != same[i]))
            .min_by_key(|(k, _)| *k)
            .map(|(k, s)| (k as usize, s));
        if best.is_none() {
            index.insert(i as u32, sig);
        }
        out.push(best);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_duplicates_go_to_the_first_kept_text() {
        let base = "the role walks through the old market and talks about the price of bread, the weather and the harvest that came late this year";
        let texts = [
            base,
            "something else entirely: a short talk about rockets, fuel and the orbits of moons around distant planets in the cold",
            &format!("{base}!"),
            &base.replace("late", "early"),
            base,
        ];
        let texts: Vec<&str> = texts.iter().map(|s| s.as_ref()).collect();
        let d = dedup(&texts, None, &Params::default());
        assert_eq!(d[0], None);
        assert_eq!(d[1], None);
        assert_eq!(d[2].map(|x| x.0), Some(0));
        assert_eq!(d[4].map(|x| x.0), Some(0));
        assert!(d[4].unwrap().1 >= 0.999);
        // Groups never compare across.
        let groups: Vec<String> = ["a", "a", "b", "a", "b"].iter().map(|s| s.to_string()).collect();
        let g = dedup(&texts, Some(&groups), &Params::default());
        assert_eq!(g[2], None);
        assert_eq!(g[4].map(|x| x.0), Some(2));
        // The same decisions on every call (no process-random state in them).
        assert_eq!(dedup(&texts, None, &Params::default()), d);
        // Records with the same `same` value are never each other's duplicates.
        let signer = Signer::new(&Params::default());
        let sigs: Vec<Vec<u32>> = texts.iter().map(|t| signer.sign(t)).collect();
        let same: Vec<String> = ["p1", "p2", "p1", "p3", "p4"].iter().map(|s| s.to_string()).collect();
        let s = decide(sigs, None, Some(&same), &Params::default());
        assert_eq!(s[2], None);
        assert_eq!(s[3], None, "one word in five changed: not a near-duplicate at 0.8");
        assert_eq!(s[4].map(|x| x.0), Some(0));
    }

    #[test]
    fn signatures_are_fixed() {
        let s = Signer::new(&Params::default());
        assert_eq!(
            s.sign("Hello there, how are you today my friend?"),
            s.sign("hello THERE how are you today my friend")
        );
        assert_eq!(s.sign("a b c").len(), 112);
    }
}
