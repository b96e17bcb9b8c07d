//! ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F-measures as Google's `rouge_score` computes
//! them with `RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)`
//! called either way round. [`RougeTarget::Response`] is `score(response, reference)`, as
//! some official evaluation scripts call it: the response is rouge_score's *target* and the
//! reference its *prediction*. The
//! F-measures of ROUGE-1/2/L do not depend on that order; ROUGE-Lsum's does when a text
//! has several lines (its union LCS walks the target's lines), so
//! [`RougeTarget::Reference`] gives rouge_score's documented order
//! (`score(target=reference, prediction=response)`) for comparison with other work.
//!
//! Tokens: the text lowercased (Python `str.lower`), every run of characters outside
//! `[a-z0-9]` a separator, tokens longer than three characters Porter-stemmed (NLTK's
//! default mode). ROUGE-Lsum splits both texts on `'\n'` only, drops empty lines (a line of
//! blanks stays, with no token) and scores the summary-level union LCS with the clipping of
//! ROUGE-1.5.5.

// FNV: counting maps keyed by short token ids and strings (SipHash was ~7% of the string
// metrics' CPU); the scores never depend on iteration order.
use fnv::FnvHashMap as HashMap;

use super::porter;

/// The four F-measures, each in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rouge {
    pub rouge1: f64,
    pub rouge2: f64,
    pub rouge_l: f64,
    pub rouge_lsum: f64,
}

/// Which text is rouge_score's `target` (only ROUGE-Lsum depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RougeTarget {
    /// `score(response, reference)`, as some official evaluation scripts call it.
    #[default]
    Response,
    /// `score(target=reference, prediction=response)`, rouge_score's documented order.
    Reference,
}

impl RougeTarget {
    /// From its configuration name: `response` or `reference`.
    pub fn parse(name: &str) -> Option<RougeTarget> {
        match name {
            "response" => Some(RougeTarget::Response),
            "reference" => Some(RougeTarget::Reference),
            _ => None,
        }
    }
}

/// ROUGE of `response` and `reference` as the official evaluation computes it (the
/// response is rouge_score's target).
pub fn rouge(response: &str, reference: &str) -> Rouge {
    rouge_with(response, reference, RougeTarget::Response)
}

/// ROUGE of `response` and `reference` with the chosen text as rouge_score's target.
pub fn rouge_with(response: &str, reference: &str, order: RougeTarget) -> Rouge {
    let (target_text, prediction_text) = match order {
        RougeTarget::Response => (response, reference),
        RougeTarget::Reference => (reference, response),
    };
    let mut vocab = Vocab::default();
    let target = vocab.tokenize(target_text);
    let prediction = vocab.tokenize(prediction_text);
    let target_sents: Vec<Vec<u32>> = sentences(target_text).map(|s| vocab.tokenize(s)).collect();
    let prediction_sents: Vec<Vec<u32>> = sentences(prediction_text).map(|s| vocab.tokenize(s)).collect();
    Rouge {
        rouge1: score_ngrams(&target, &prediction, 1),
        rouge2: score_ngrams(&target, &prediction, 2),
        rouge_l: score_lcs(&target, &prediction),
        rouge_lsum: summary_level_lcs(&target_sents, &prediction_sents),
    }
}

/// rouge_score's default tokenizer with `use_stemmer=True`.
pub fn tokenize(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    lower
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|t| !t.is_empty())
        .map(|t| if t.len() > 3 { porter::stem(t) } else { t.to_string() })
        // The final check of `tokenize`: only non-empty `[a-z0-9]+` tokens survive.
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        .collect()
}

/// `text.split("\n")` without the empty strings.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n').filter(|s| !s.is_empty())
}

/// Interns tokens so that the LCS tables compare integers.
#[derive(Default)]
struct Vocab {
    ids: HashMap<String, u32>,
}

impl Vocab {
    fn tokenize(&mut self, text: &str) -> Vec<u32> {
        tokenize(text)
            .into_iter()
            .map(|t| {
                let next = self.ids.len() as u32;
                *self.ids.entry(t).or_insert(next)
            })
            .collect()
    }
}

/// `scoring.fmeasure`.
fn fmeasure(precision: f64, recall: f64) -> f64 {
    if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 }
}

/// `_score_ngrams` over `_create_ngrams(tokens, n)`.
fn score_ngrams(target: &[u32], prediction: &[u32], n: usize) -> f64 {
    fn counts(tokens: &[u32], n: usize) -> HashMap<&[u32], usize> {
        let mut c = HashMap::default();
        for g in tokens.windows(n) {
            *c.entry(g).or_insert(0) += 1;
        }
        c
    }
    let target_ngrams = counts(target, n);
    let prediction_ngrams = counts(prediction, n);
    let intersection: usize =
        target_ngrams.iter().map(|(g, &c)| c.min(prediction_ngrams.get(g).copied().unwrap_or(0))).sum();
    let target_count = target.len().saturating_sub(n - 1);
    let prediction_count = prediction.len().saturating_sub(n - 1);
    let precision = intersection as f64 / prediction_count.max(1) as f64;
    let recall = intersection as f64 / target_count.max(1) as f64;
    fmeasure(precision, recall)
}

/// `_lcs_table(ref, can)`: `(rows + 1) x (cols + 1)`, row-major.
fn lcs_table(r: &[u32], c: &[u32]) -> Vec<u32> {
    let cols = c.len() + 1;
    let mut t = vec![0u32; (r.len() + 1) * cols];
    for i in 1..=r.len() {
        for j in 1..=c.len() {
            t[i * cols + j] = if r[i - 1] == c[j - 1] {
                t[(i - 1) * cols + j - 1] + 1
            } else {
                t[(i - 1) * cols + j].max(t[i * cols + j - 1])
            };
        }
    }
    t
}

/// `_score_lcs`.
fn score_lcs(target: &[u32], prediction: &[u32]) -> f64 {
    if target.is_empty() || prediction.is_empty() {
        return 0.0;
    }
    let t = lcs_table(target, prediction);
    let lcs = t[t.len() - 1] as f64;
    let precision = lcs / prediction.len() as f64;
    let recall = lcs / target.len() as f64;
    fmeasure(precision, recall)
}

/// `lcs_ind`: the indices into `r` of the LCS that `_backtrack_norec` reads out.
fn lcs_indices(r: &[u32], c: &[u32], out: &mut Vec<usize>) {
    let t = lcs_table(r, c);
    let cols = c.len() + 1;
    let (mut i, mut j) = (r.len(), c.len());
    while i > 0 && j > 0 {
        if r[i - 1] == c[j - 1] {
            out.push(i - 1);
            i -= 1;
            j -= 1;
        } else if t[i * cols + j - 1] > t[(i - 1) * cols + j] {
            j -= 1;
        } else {
            i -= 1;
        }
    }
}

/// `_summary_level_lcs(ref_sent, can_sent)`.
fn summary_level_lcs(ref_sents: &[Vec<u32>], can_sents: &[Vec<u32>]) -> f64 {
    if ref_sents.is_empty() || can_sents.is_empty() {
        return 0.0;
    }
    let m: usize = ref_sents.iter().map(Vec::len).sum();
    let n: usize = can_sents.iter().map(Vec::len).sum();
    if m == 0 || n == 0 {
        return 0.0;
    }
    let mut cnt_r: HashMap<u32, usize> = HashMap::default();
    let mut cnt_c: HashMap<u32, usize> = HashMap::default();
    for &t in ref_sents.iter().flatten() {
        *cnt_r.entry(t).or_insert(0) += 1;
    }
    for &t in can_sents.iter().flatten() {
        *cnt_c.entry(t).or_insert(0) += 1;
    }
    let mut hits = 0usize;
    let mut union: Vec<usize> = Vec::new();
    for r in ref_sents {
        // `_union_lcs`: the sorted union of the LCS indices against every candidate line.
        union.clear();
        for c in can_sents {
            lcs_indices(r, c, &mut union);
        }
        union.sort_unstable();
        union.dedup();
        for &i in &union {
            let t = r[i];
            let (Some(cc), Some(cr)) = (cnt_c.get(&t).copied(), cnt_r.get(&t).copied()) else {
                continue;
            };
            if cc > 0 && cr > 0 {
                hits += 1;
                cnt_c.insert(t, cc - 1);
                cnt_r.insert(t, cr - 1);
            }
        }
    }
    let recall = hits as f64 / m as f64;
    let precision = hits as f64 / n as f64;
    fmeasure(precision, recall)
}

#[cfg(test)]
mod tests {
    use super::{RougeTarget, rouge, rouge_with, tokenize};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn tokenizer() {
        assert_eq!(tokenize("The quick-brown FOXES, running!"), ["the", "quick", "brown", "fox", "run"]);
        assert_eq!(tokenize("café naïve 3.14"), ["caf", "na", "ve", "3", "14"]);
        assert_eq!(tokenize("İstanbul"), ["i", "stanbul"]);
        assert!(tokenize("!!! ...").is_empty());
    }

    #[test]
    fn identical_and_empty() {
        let r = rouge("the cat sat on the mat", "the cat sat on the mat");
        assert!(close(r.rouge1, 1.0) && close(r.rouge2, 1.0) && close(r.rouge_l, 1.0) && close(r.rouge_lsum, 1.0));
        let r = rouge("", "the cat");
        assert_eq!((r.rouge1, r.rouge2, r.rouge_l, r.rouge_lsum), (0.0, 0.0, 0.0, 0.0));
        let r = rouge("", "");
        assert_eq!((r.rouge1, r.rouge2, r.rouge_l, r.rouge_lsum), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn hand_computed() {
        // rouge_score's docstring example: target "The quick brown fox jumps over the lazy
        // dog", prediction "The quick brown dog jumps on the log.".
        let r = rouge("The quick brown dog jumps on the log.", "The quick brown fox jumps over the lazy dog");
        // Unigrams: the x2, quick, brown, dog, jump = 6 of 8 (prediction) and 9 (target).
        let (p, rc) = (6.0 / 8.0, 6.0 / 9.0);
        assert!(close(r.rouge1, 2.0 * p * rc / (p + rc)));
        // Bigrams: "the quick", "quick brown" = 2 of 7 and 8.
        let (p, rc) = (2.0 / 7.0, 2.0 / 8.0);
        assert!(close(r.rouge2, 2.0 * p * rc / (p + rc)));
        // LCS: the quick brown jump the = 5.
        let (p, rc) = (5.0 / 8.0, 5.0 / 9.0);
        assert!(close(r.rouge_l, 2.0 * p * rc / (p + rc)));
        // One line each: Lsum equals L.
        assert!(close(r.rouge_lsum, r.rouge_l));
    }

    #[test]
    fn lsum_unions_lines() {
        // Reference line "a b c d" against candidate lines "a b" and "c d": the union LCS
        // covers all four tokens, where plain LCS over the joined text does too; swapping
        // the candidate lines keeps Lsum at 1 while L drops.
        let r = rouge("cccc dddd\naaaa bbbb", "aaaa bbbb cccc dddd");
        assert!(close(r.rouge_lsum, 1.0));
        assert!(close(r.rouge_l, 0.5));
    }

    #[test]
    fn lsum_depends_on_which_text_is_the_target() {
        // rouge_score 0.1.2: score("aaaa bbbb\ncccc aaaa\nbbbb", "bbbb aaaa cccc\naaaa")
        // (the official call, response first) gives 8/9; the documented order gives 2/3.
        let (response, reference) = ("aaaa bbbb\ncccc aaaa\nbbbb", "bbbb aaaa cccc\naaaa");
        assert!(close(rouge(response, reference).rouge_lsum, 8.0 / 9.0));
        assert!(close(rouge_with(response, reference, RougeTarget::Reference).rouge_lsum, 2.0 / 3.0));
        // The other three do not depend on it.
        let (a, b) = (rouge(response, reference), rouge_with(response, reference, RougeTarget::Reference));
        assert!(close(a.rouge1, b.rouge1) && close(a.rouge2, b.rouge2) && close(a.rouge_l, b.rouge_l));
    }
}
