//! Measures of one text that the record checks read: letters and words (a CJK
//! ideograph counts as a word), debris (serialized data, template leftovers, stray
//! brackets where words should be), repetition (the Gopher rules: duplicate lines,
//! the most frequent n-gram's share, characters in repeated n-grams), word n-gram
//! overlap with a source (echo), and the script and language a text is written in.

use std::hash::{BuildHasher, Hasher};

use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

/// Whether `c` is a CJK ideograph or kana (written without spaces between words).
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30ff | 0x3400..=0x4dbf | 0x4e00..=0x9fff | 0xf900..=0xfaff | 0x20000..=0x2ebef)
}

/// Letters (Unicode alphabetic characters) in `text`.
pub fn letters(text: &str) -> usize {
    text.chars().filter(|c| c.is_alphabetic()).count()
}

/// Word units: whitespace-separated tokens holding a letter or digit, where every CJK
/// ideograph counts as a word of its own (Chinese and Japanese have no spaces).
pub fn word_units(text: &str) -> usize {
    let mut n = 0;
    for token in text.split_whitespace() {
        let cjk = token.chars().filter(|c| is_cjk(*c)).count();
        let rest = token.chars().any(|c| !is_cjk(c) && c.is_alphanumeric());
        n += cjk + usize::from(rest);
    }
    n
}

/// Lower-cased words for n-grams: letters and digits kept, punctuation dropped at the
/// edges of a token; each CJK ideograph is a word of its own.
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in text.split_whitespace() {
        let mut word = String::new();
        for c in token.chars() {
            if is_cjk(c) {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                out.push(c.to_string());
            } else if c.is_alphanumeric() || (c == '\'' && !word.is_empty()) {
                word.extend(c.to_lowercase());
            }
        }
        let trimmed = word.trim_end_matches('\'');
        if !trimmed.is_empty() {
            out.push(trimmed.to_string());
        }
    }
    out
}

/// The words of [`words`] as 64-bit hashes with their lengths in characters, without
/// allocating a string per word (what the repetition and echo measures compare; equal
/// words have equal hashes, and the tokenization is the same as [`words`]').
pub fn word_keys(text: &str) -> (Vec<u64>, Vec<usize>) {
    let (mut hashes, mut lens) = (Vec::new(), Vec::new());
    for token in text.split_whitespace() {
        let mut h = FxBuildHasher.build_hasher();
        let (mut len, mut quotes) = (0usize, 0usize);
        for c in token.chars() {
            if is_cjk(c) {
                if len > 0 {
                    // words() keeps a word's apostrophes when a CJK character ends it.
                    for _ in 0..std::mem::take(&mut quotes) {
                        h.write_u32('\'' as u32);
                        len += 1;
                    }
                    hashes.push(h.finish());
                    lens.push(len);
                    h = FxBuildHasher.build_hasher();
                    len = 0;
                }
                quotes = 0;
                let mut one = FxBuildHasher.build_hasher();
                one.write_u32(c as u32);
                hashes.push(one.finish());
                lens.push(1);
            } else if c == '\'' && len > 0 {
                // Kept only when a letter follows (words() trims them at the end).
                quotes += 1;
            } else if c.is_ascii_alphanumeric() {
                for _ in 0..std::mem::take(&mut quotes) {
                    h.write_u32('\'' as u32);
                    len += 1;
                }
                h.write_u32(c.to_ascii_lowercase() as u32);
                len += 1;
            } else if c.is_alphanumeric() {
                for _ in 0..std::mem::take(&mut quotes) {
                    h.write_u32('\'' as u32);
                    len += 1;
                }
                for l in c.to_lowercase() {
                    h.write_u32(l as u32);
                    len += 1;
                }
            }
        }
        if len > 0 {
            hashes.push(h.finish());
            lens.push(len);
        }
    }
    (hashes, lens)
}

/// Why a value is debris rather than text, or `None` when it reads as text: blank,
/// fewer than `min_letters` letters (`"]["`, `"{{"`), serialized data (a Python or JSON
/// list or object: `"[{'name': ..."`, `"['{']"`), template leftovers (`{{ ... }}`,
/// `{% ... %}`), or square and curly brackets outnumbering a tenth of its letters.
pub fn debris(text: &str, min_letters: usize) -> Option<String> {
    let t = text.trim();
    if t.is_empty() {
        return Some("is empty".into());
    }
    let n_letters = letters(t);
    if n_letters < min_letters {
        return Some(format!("has {n_letters} letter(s) ({}): it is debris, not text", quoted(t)));
    }
    if serialized(t) {
        return Some(format!("is serialized data ({}), not text", quoted(t)));
    }
    if t.contains("{{") || t.contains("}}") || t.contains("{%") || t.contains("%}") {
        return Some(format!("holds template debris ({})", quoted(t)));
    }
    let brackets = t.chars().filter(|c| matches!(c, '[' | ']' | '{' | '}')).count();
    if brackets >= 2 && brackets * 10 > n_letters {
        return Some(format!("has {brackets} brackets for {n_letters} letters ({}): debris, not text", quoted(t)));
    }
    None
}

/// A Python `repr` or JSON text of a list or object: opens with `[` or `{` followed by
/// a quote, a bracket or a closing bracket, or parses as a JSON array or object.
fn serialized(t: &str) -> bool {
    let mut chars = t.chars();
    let Some(first) = chars.next() else { return false };
    if !matches!(first, '[' | '{') {
        return false;
    }
    let next = chars.find(|c| !c.is_whitespace());
    if matches!(next, Some('\'' | '"' | '[' | '{' | ']' | '}')) {
        return true;
    }
    matches!(
        serde_json::from_str::<serde_json::Value>(t),
        Ok(serde_json::Value::Array(_) | serde_json::Value::Object(_))
    )
}

/// A short excerpt of `text` in quotes, for messages.
pub fn quoted(text: &str) -> String {
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= 40 {
        format!("{flat:?}")
    } else {
        format!("{:?}", format!("{}…", flat.chars().take(39).collect::<String>()))
    }
}

/// The Gopher repetition measures of one text (Rae et al. 2021, as datatrove's
/// `GopherRepetitionFilter` computes them): lines that repeat an earlier line (share of
/// lines), the most frequent word n-gram's characters (n = 2..4) and the characters
/// covered by repeated word n-grams (n = 5..10), each as a share of the text's word
/// characters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Repetition {
    pub duplicate_line_fraction: f64,
    /// For n = 2, 3, 4: the share of word characters in the most frequent n-gram's
    /// occurrences (0 when no n-gram occurs twice).
    pub top_ngram: [f64; 3],
    /// For n = 5..=10: the share of word characters inside repeated n-grams.
    pub duplicate_ngram: [f64; 6],
}

/// The repetition measures of `text` ([`Repetition`]).
pub fn repetition(text: &str) -> Repetition {
    let mut r = Repetition::default();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.len() > 1 {
        let mut seen = FxHashSet::default();
        let dup = lines.iter().filter(|l| !seen.insert(**l)).count();
        r.duplicate_line_fraction = dup as f64 / lines.len() as f64;
    }
    let (words, chars) = word_keys(text);
    let total: usize = chars.iter().sum();
    if total == 0 {
        return r;
    }
    for (k, n) in (2..=4).enumerate() {
        if words.len() < n {
            break;
        }
        let mut counts: FxHashMap<&[u64], (usize, usize)> = FxHashMap::default();
        for (i, g) in words.windows(n).enumerate() {
            counts.entry(g).or_insert((0, i)).0 += 1;
        }
        // The most frequent n-gram; ties go to the longest (then the first) for determinism.
        let best = counts
            .values()
            .filter(|(c, _)| *c > 1)
            .map(|&(c, first)| (c, chars[first..first + n].iter().sum::<usize>(), first))
            .max_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)));
        if let Some((count, len, _)) = best {
            r.top_ngram[k] = (count * len) as f64 / total as f64;
        }
    }
    for (k, n) in (5..=10).enumerate() {
        if words.len() < n {
            break;
        }
        // Characters of words covered by a second (or later) occurrence of an n-gram,
        // each word counted once.
        let mut seen: FxHashSet<&[u64]> = FxHashSet::default();
        let mut covered = vec![false; words.len()];
        let mut i = 0;
        while i + n <= words.len() {
            let g = &words[i..i + n];
            if !seen.insert(g) {
                for c in covered.iter_mut().skip(i).take(n) {
                    *c = true;
                }
                i += n;
            } else {
                i += 1;
            }
        }
        let dup: usize = covered.iter().zip(&chars).filter(|(c, _)| **c).map(|(_, n)| n).sum();
        r.duplicate_ngram[k] = dup as f64 / total as f64;
    }
    r
}

/// A set of hashed n-grams (the hashes are in-process only, never stored).
pub type NgramSet = FxHashSet<u64>;

/// The word n-grams of `text`, hashed.
pub fn ngram_set(text: &str, n: usize) -> NgramSet {
    let (words, _) = word_keys(text);
    if words.len() < n {
        return NgramSet::default();
    }
    words.windows(n).map(hash_words).collect()
}

/// Calls `f` with the hash of each word n-gram of `text`, in order (nothing when the text
/// has fewer than `n` words), without collecting them.
pub fn for_each_ngram(text: &str, n: usize, mut f: impl FnMut(u64)) {
    let (words, _) = word_keys(text);
    if words.len() >= n {
        for g in words.windows(n) {
            f(hash_words(g));
        }
    }
}

/// One n-gram's 64-bit hash (FxHash over its words' hashes).
fn hash_words(words: &[u64]) -> u64 {
    FxBuildHasher.hash_one(words)
}

/// The share of `text`'s word n-grams found in `source` (`None` when the text has
/// fewer than `n` words).
pub fn overlap(text: &str, source: &NgramSet, n: usize) -> Option<f64> {
    let (words, _) = word_keys(text);
    if words.len() < n {
        return None;
    }
    let grams: Vec<u64> = words.windows(n).map(hash_words).collect();
    let found = grams.iter().filter(|g| source.contains(g)).count();
    Some(found as f64 / grams.len() as f64)
}

/// The longest run of `text`'s words whose n-grams are all in `source` (what was copied),
/// as the words read (lower-cased).
pub fn first_shared(text: &str, source: &NgramSet, n: usize) -> Option<String> {
    let (keys, _) = word_keys(text);
    let words = words(text);
    debug_assert_eq!(keys.len(), words.len());
    if keys.len() < n || keys.len() != words.len() {
        return None;
    }
    let hits: Vec<bool> = keys.windows(n).map(|g| source.contains(&hash_words(g))).collect();
    let (mut best, mut start) = (None::<(usize, usize)>, None::<usize>);
    for (i, hit) in hits.iter().chain(std::iter::once(&false)).enumerate() {
        match (hit, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if best.is_none_or(|(bs, be)| i - s > be - bs) {
                    best = Some((s, i));
                }
                start = None;
            }
            _ => {}
        }
    }
    best.map(|(s, e)| words[s..e - 1 + n].join(" "))
}

/// Distinct-n over a list of texts (Li et al. 2016): distinct word n-grams / all word n-grams.
pub fn distinct_n<'a>(texts: impl IntoIterator<Item = &'a str>, n: usize) -> Option<f64> {
    let mut all = 0usize;
    let mut distinct = NgramSet::default();
    for t in texts {
        let (w, _) = word_keys(t);
        if w.len() < n {
            continue;
        }
        for g in w.windows(n) {
            all += 1;
            distinct.insert(hash_words(g));
        }
    }
    (all > 0).then(|| distinct.len() as f64 / all as f64)
}

/// The share of `text`'s letters that are in `script`, and the other script with the
/// most letters. Each whitespace token's script is found by whatlang.
pub fn script_share(text: &str, script: whatlang::Script) -> (f64, Option<whatlang::Script>) {
    let mut by_script: FxHashMap<whatlang::Script, usize> = FxHashMap::default();
    let mut all = 0usize;
    for token in text.split_whitespace() {
        let n = letters(token);
        if n == 0 {
            continue;
        }
        // An ASCII token's letters are Latin (what whatlang says of it, without its scan of
        // every script's ranges): most tokens of most texts.
        if token.is_ascii() {
            *by_script.entry(whatlang::Script::Latin).or_default() += n;
            all += n;
            continue;
        }
        if let Some(s) = whatlang::detect_script(token) {
            *by_script.entry(s).or_default() += n;
            all += n;
        }
    }
    let main = by_script
        .iter()
        .filter(|(s, _)| **s != script)
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.name().cmp(a.0.name())))
        .map(|(s, _)| *s);
    let share = if all == 0 { 1.0 } else { by_script.get(&script).copied().unwrap_or(0) as f64 / all as f64 };
    (share, main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_tokens_are_latin_as_whatlang_says() {
        for token in ["Hello,", "(smiles)", "x2", "don't", "e.g.", "A", "[1]says", "ZZZ-top!"] {
            assert_eq!(whatlang::detect_script(token), Some(whatlang::Script::Latin), "{token}");
        }
        let (share, main) = script_share("Hello there, 你好 世界 friend.", whatlang::Script::Latin);
        assert!((share - 16.0 / 20.0).abs() < 1e-9, "{share}");
        assert_eq!(main, Some(whatlang::Script::Mandarin));
    }

    #[test]
    fn debris_is_found_and_text_passes() {
        for bad in [
            "][",
            "][{",
            "['{']",
            "['{{']",
            "{{",
            "{",
            "  ",
            "[{'name': 'unique and vivid traits'}]",
            "[]",
            "{\"a\": 1}",
            "Hello {{ name }}",
            "[[x]] {y} [z]",
        ] {
            assert!(debris(bad, 2).is_some(), "{bad:?} passed");
        }
        for good in [
            "Thorin speaks in a hearty, enthusiastic manner.",
            "(She smiles) Of course!",
            "[1] says the passage is about tea.",
            "李白，唐代诗人",
            "Al",
        ] {
            assert_eq!(debris(good, 2), None, "{good:?}");
        }
    }

    #[test]
    fn word_keys_tokenize_as_words() {
        for t in [
            "Don't stop -- it's the END'' of the 'line' a'-b x'中文y'' Ünïcode ÉCOLE école 42nd",
            "  ",
            "''' ok",
            "中文 字",
        ] {
            let w = words(t);
            let (k, lens) = word_keys(t);
            assert_eq!(w.len(), k.len(), "{t}");
            for i in 0..w.len() {
                assert_eq!(lens[i], w[i].chars().count(), "{t}: {}", w[i]);
                for j in 0..w.len() {
                    assert_eq!(w[i] == w[j], k[i] == k[j], "{t}: {} / {}", w[i], w[j]);
                }
            }
        }
    }

    #[test]
    fn words_count_cjk_characters() {
        assert_eq!(word_units("Hello, world!"), 2);
        assert_eq!(word_units("你好 world"), 3);
        assert_eq!(word_units("-- ** --"), 0);
        assert_eq!(words("Don't STOP, it's fine."), ["don't", "stop", "it's", "fine"]);
    }

    #[test]
    fn repetition_measures() {
        let r = repetition("I love tea. I love tea. I love tea. I love tea. I love tea. I love tea.");
        assert!(r.duplicate_ngram[0] > 0.5, "{r:?}");
        assert!(r.top_ngram[0] > 0.3, "{r:?}");
        let r = repetition("a line\na line\nanother line");
        assert!((r.duplicate_line_fraction - 1.0 / 3.0).abs() < 1e-9);
        let fine = repetition("The quick brown fox jumps over the lazy dog while the cat sleeps on a warm mat.");
        assert!(fine.duplicate_ngram.iter().all(|v| *v == 0.0), "{fine:?}");
        assert!(fine.top_ngram.iter().all(|v| *v == 0.0), "{fine:?}");
    }

    #[test]
    fn overlap_and_distinct() {
        let src = ngram_set("you are a master of data synthesis and your task is to write", 4);
        assert_eq!(overlap("you are a master of data synthesis", &src, 4), Some(1.0));
        assert_eq!(overlap("the tea is hot and the day is long", &src, 4), Some(0.0));
        assert_eq!(overlap("too short", &src, 4), None);
        assert_eq!(
            first_shared("well, you are a master of data synthesis today", &src, 4).as_deref(),
            Some("you are a master of data synthesis")
        );
        let d = distinct_n(["a b c", "a b d"], 2).unwrap();
        assert!((d - 3.0 / 4.0).abs() < 1e-9);
    }

    #[test]
    fn scripts() {
        let (share, other) = script_share("This is English text", whatlang::Script::Latin);
        assert_eq!(share, 1.0);
        assert_eq!(other, None);
        let (share, main) = script_share("这是中文文本 text", whatlang::Script::Latin);
        assert!(share < 0.5, "{share}");
        assert_eq!(main, Some(whatlang::Script::Mandarin));
    }
}
