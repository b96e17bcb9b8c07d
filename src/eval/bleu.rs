//! Sentence BLEU as HF `evaluate`'s "bleu" metric computes it for one prediction and one
//! reference: sacrebleu's `13a` tokenizer, then tensorflow/nmt's `compute_bleu` with
//! `max_order = 4` and no smoothing.
//!
//! Without smoothing a pair with no matching 4-gram (or fewer than four tokens) scores 0,
//! as the official code does. Where nmt divides by zero (the response or the reference has
//! no token) `evaluate` raises: [`sentence_bleu`] says so with `None`; [`bleu`] gives 0,
//! what the value would be (every precision is then 0). The official `evaluation.py` turns
//! that exception into NaN and leaves the pair out of the BLEU mean and std; the summaries
//! here do the same (see `eval::score`).

// FNV: counting maps keyed by short token ids and strings (SipHash was ~7% of the string
// metrics' CPU); the scores never depend on iteration order.
use fnv::FnvHashMap as HashMap;

use super::LocalRegex;

/// `max_order` of `compute_bleu`.
const MAX_ORDER: usize = 4;

/// Tokenize period and comma unless preceded by a digit.
static PERIOD_COMMA_AFTER_NON_DIGIT: LocalRegex = LocalRegex::new(r"([^0-9])([.,])");
/// Tokenize period and comma unless followed by a digit.
static PERIOD_COMMA_BEFORE_NON_DIGIT: LocalRegex = LocalRegex::new(r"([.,])([^0-9])");
/// Tokenize dash when preceded by a digit.
static DASH_AFTER_DIGIT: LocalRegex = LocalRegex::new(r"([0-9])(-)");

/// BLEU of `response` against the single reference `reference`, in [0, 1]; 0 where
/// `evaluate` raises (see [`sentence_bleu`]).
pub fn bleu(response: &str, reference: &str) -> f64 {
    sentence_bleu(response, reference).unwrap_or(0.0)
}

/// BLEU of `response` against `reference`, or `None` where `evaluate`'s BLEU raises
/// `ZeroDivisionError` (the response or the reference has no token).
pub fn sentence_bleu(response: &str, reference: &str) -> Option<f64> {
    let translation = tokenize_13a(response);
    let reference = tokenize_13a(reference);
    compute_bleu(&reference, &translation)
}

/// sacrebleu's `Tokenizer13a` as evaluate's copy returns it (a list of tokens). It does not
/// lowercase.
pub fn tokenize_13a(line: &str) -> Vec<String> {
    // Language-independent part.
    let mut line = line.replace("<skipped>", "").replace("-\n", "").replace('\n', " ");
    if line.contains('&') {
        line = line.replace("&quot;", "\"").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
    }
    // TokenizerRegexp on f" {line} ". First rule: `([\{-\~\[-\` -\&\(-\+\:-\@\/])` → ` \1 `,
    // i.e. every ASCII symbol but `'`, `-`, `.` and `,` (and the space) stands alone.
    let mut spaced = String::with_capacity(line.len() * 2 + 2);
    spaced.push(' ');
    for c in line.chars() {
        if is_13a_symbol(c) {
            spaced.push(' ');
            spaced.push(c);
            spaced.push(' ');
        } else {
            spaced.push(c);
        }
    }
    spaced.push(' ');
    let s = PERIOD_COMMA_AFTER_NON_DIGIT.replace_all(&spaced, "${1} ${2} ");
    let s = PERIOD_COMMA_BEFORE_NON_DIGIT.replace_all(&s, " ${1} ${2}");
    let s = DASH_AFTER_DIGIT.replace_all(&s, "${1} ${2} ");
    s.split(is_python_space).filter(|t| !t.is_empty()).map(str::to_string).collect()
}

/// The class `[\{-\~\[-\` -\&\(-\+\:-\@\/]` of the first 13a rule.
fn is_13a_symbol(c: char) -> bool {
    matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/')
}

/// Python's `str.isspace`, which `str.split()` splits on (it differs from Rust's
/// `char::is_whitespace` by U+001C..U+001F).
fn is_python_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0B}'
            | '\u{0C}'
            | '\r'
            | '\u{1C}'..='\u{1F}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// n-gram counts of orders 1 to `MAX_ORDER` (`_get_ngrams`).
fn ngram_counts(segment: &[String]) -> HashMap<&[String], usize> {
    let mut counts = HashMap::default();
    for order in 1..=MAX_ORDER {
        for ngram in segment.windows(order) {
            *counts.entry(ngram).or_insert(0) += 1;
        }
    }
    counts
}

/// tensorflow/nmt `compute_bleu` for a corpus of one translation with one reference,
/// `max_order = 4`, `smooth = False`.
/// `None` where nmt divides by zero.
fn compute_bleu(reference: &[String], translation: &[String]) -> Option<f64> {
    let reference_length = reference.len();
    let translation_length = translation.len();

    let ref_counts = ngram_counts(reference);
    let mut matches_by_order = [0usize; MAX_ORDER];
    for (ngram, &count) in &ngram_counts(translation) {
        if let Some(&r) = ref_counts.get(ngram) {
            matches_by_order[ngram.len() - 1] += count.min(r);
        }
    }
    let mut precisions = [0.0f64; MAX_ORDER];
    for (i, p) in precisions.iter_mut().enumerate() {
        let possible = translation_length.saturating_sub(i);
        if possible > 0 {
            *p = matches_by_order[i] as f64 / possible as f64;
        }
    }

    let geo_mean = if precisions.iter().all(|&p| p > 0.0) {
        let mut p_log_sum = 0.0f64;
        for p in precisions {
            p_log_sum += (1.0 / MAX_ORDER as f64) * p.ln();
        }
        p_log_sum.exp()
    } else {
        0.0
    };

    if reference_length == 0 || translation_length == 0 {
        // nmt raises ZeroDivisionError here (the geometric mean is 0 anyway).
        return None;
    }
    let ratio = translation_length as f64 / reference_length as f64;
    let bp = if ratio > 1.0 { 1.0 } else { (1.0 - 1.0 / ratio).exp() };
    Some(geo_mean * bp)
}

#[cfg(test)]
mod tests {
    use super::{bleu, sentence_bleu, tokenize_13a};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn tokenizer_13a() {
        let toks = tokenize_13a("Hello, world! It's 3.14 &amp; 1,000 -- well-known (yes). 5-6 &quot;x&quot;");
        let want = [
            "Hello",
            ",",
            "world",
            "!",
            "It's",
            "3.14",
            "&",
            "1,000",
            "--",
            "well-known",
            "(",
            "yes",
            ")",
            ".",
            "5",
            "-",
            "6",
            "\"",
            "x",
            "\"",
        ];
        assert_eq!(toks, want);
        assert_eq!(tokenize_13a("a-\nb\nc<skipped>"), ["ab", "c"]);
        assert!(tokenize_13a("\u{0C}").is_empty());
        assert_eq!(tokenize_13a("a\u{1F}b\u{A0}c"), ["a", "b", "c"]);
    }

    #[test]
    fn identical_is_one() {
        assert!(close(bleu("the cat sat on the mat", "the cat sat on the mat"), 1.0));
        assert!(close(bleu("hello there general kenobi", "hello there general kenobi"), 1.0));
    }

    #[test]
    fn no_matching_four_gram_is_zero() {
        // Without smoothing any zero precision makes the sentence score 0.
        assert_eq!(bleu("the cat is on the mat", "the cat sat on the mat"), 0.0);
        // Fewer than four tokens: no 4-gram at all.
        assert_eq!(bleu("hello there", "hello there"), 0.0);
        assert_eq!(bleu("", "hello there"), 0.0);
        assert_eq!(bleu("hello there", ""), 0.0);
        assert_eq!(bleu("", ""), 0.0);
        // evaluate raises where a side has no token (13a: whitespace only is no token).
        assert_eq!(sentence_bleu("", "hello there"), None);
        assert_eq!(sentence_bleu(" \n", "hello there"), None);
        assert_eq!(sentence_bleu("hello there", ""), None);
        assert_eq!(sentence_bleu("hello there", "hello there"), Some(0.0));
        assert_eq!(sentence_bleu("!", "?"), Some(0.0));
    }

    #[test]
    fn hand_computed() {
        // p = 4/5, 3/4, 2/3, 1/2; equal lengths so bp = exp(0) = 1.
        let want = (0.8f64 * 0.75 * (2.0 / 3.0) * 0.5).powf(0.25);
        assert!((bleu("a b c d e", "a b c d f") - want).abs() < 1e-12);
        // Clipped counts and brevity penalty: translation of 4 tokens, reference of 6.
        let want = (1.0f64 - 6.0 / 4.0).exp();
        assert!((bleu("a b c d", "a b c d e f") - want).abs() < 1e-12);
        // Longer translation: bp = 1, p = 4/6, 3/5, 2/4, 1/3.
        let want = ((4.0f64 / 6.0) * 0.6 * 0.5 * (1.0 / 3.0)).powf(0.25);
        assert!((bleu("a b c d x y", "a b c d") - want).abs() < 1e-12);
    }
}
