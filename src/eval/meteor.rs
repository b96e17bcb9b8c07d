//! METEOR as reference evaluation scripts compute it: HF `evaluate`'s "meteor" metric, which for
//! one reference string is NLTK's
//! `single_meteor_score(word_tokenize(reference), word_tokenize(response), alpha=0.9,
//! beta=3, gamma=0.5)` (= `meteor_score([reference_tokens], response_tokens)` with NLTK's
//! defaults: `str.lower`, `PorterStemmer()`, WordNet 3.0). Ported from NLTK 3.10.4.
//!
//! * Tokenization is NLTK's `word_tokenize`: Punkt sentence splitting, then
//!   `NLTKWordTokenizer` (the improved Treebank tokenizer) on each sentence. Punkt's English
//!   model (nltk_data `punkt_tab/english`) is data that NLTK downloads; [`meteor`] uses the
//!   untrained tokenizer (`PunktSentenceTokenizer()`, empty [`PunktParams`]), and
//!   [`meteor_with_punkt`] takes parameters loaded from a `punkt_tab` directory. They differ
//!   only around abbreviations, initials and ordinal numbers the model knows ("Mr.", "e.g.").
//! * Matching is NLTK's `_enum_align_words`: exact matches (after `str.lower`), then Porter
//!   stems of the words left, then WordNet synonyms of the words left - which, as in NLTK,
//!   are the stems (`_enum_stem_match` hands its stemmed leftovers on), so the synonyms of
//!   "happi" are looked up and compared with reference stems. Each stage walks the
//!   hypothesis from its last word and takes the last reference word still free.
//! * Score: P = m/|hyp|, R = m/|ref|, Fmean = PR/(αP + (1-α)R), penalty = γ(chunks/m)^β,
//!   METEOR = (1 - penalty)·Fmean; 0 when there is no match or either side has no token
//!   (NLTK catches the ZeroDivisionError and returns 0.0).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::LazyLock;

use super::LocalRegex;

use super::porter;
use super::wordnet::WordNet;

/// NLTK's defaults, as evaluate passes them.
pub const ALPHA: f64 = 0.9;
pub const BETA: f64 = 3.0;
pub const GAMMA: f64 = 0.5;

/// METEOR of `response` against `reference` (see the module documentation), sentences split
/// by the untrained Punkt tokenizer.
pub fn meteor(response: &str, reference: &str, wn: &WordNet) -> f64 {
    meteor_with_punkt(response, reference, wn, &EMPTY_PUNKT)
}

/// [`meteor`] with sentences split by Punkt with `punkt` (e.g. NLTK's English model loaded
/// by [`PunktParams::load`]).
pub fn meteor_with_punkt(response: &str, reference: &str, wn: &WordNet, punkt: &PunktParams) -> f64 {
    let reference = word_tokenize_with(reference, punkt);
    let hypothesis = word_tokenize_with(response, punkt);
    single_meteor_score(&reference, &hypothesis, wn)
}

/// NLTK's `single_meteor_score(reference, hypothesis)` on pre-tokenized text, defaults.
pub fn single_meteor_score<S: AsRef<str>>(reference: &[S], hypothesis: &[S], wn: &WordNet) -> f64 {
    let hyp: Vec<(usize, String)> = hypothesis.iter().map(|w| py_lower(w.as_ref())).enumerate().collect();
    let refs: Vec<(usize, String)> = reference.iter().map(|w| py_lower(w.as_ref())).enumerate().collect();
    let translation_length = hyp.len();
    let reference_length = refs.len();
    let matches = align_words(hyp, refs, wn);
    let m = matches.len();
    if m == 0 || translation_length == 0 || reference_length == 0 {
        return 0.0;
    }
    let precision = m as f64 / translation_length as f64;
    let recall = m as f64 / reference_length as f64;
    let fmean = (precision * recall) / (ALPHA * precision + (1.0 - ALPHA) * recall);
    let chunk_count = count_chunks(&matches) as f64;
    let frag_frac = chunk_count / m as f64;
    let penalty = GAMMA * frag_frac.powf(BETA);
    (1.0 - penalty) * fmean
}

/// Python's `str.lower`: full Unicode lowercase mapping (`İ` → `i̇`, final sigma).
fn py_lower(s: &str) -> String {
    s.to_lowercase()
}

type Enum = Vec<(usize, String)>;

/// NLTK's `_enum_align_words`: (hypothesis index, reference index) pairs sorted by
/// hypothesis index.
fn align_words(hyp: Enum, refs: Enum, wn: &WordNet) -> Vec<(usize, usize)> {
    let (mut matches, hyp, refs) = match_enums(hyp, refs);
    let stem = |list: Enum| -> Enum { list.into_iter().map(|(i, w)| (i, porter::stem(&w))).collect() };
    let (stem_matches, hyp, refs) = match_enums(stem(hyp), stem(refs));
    let (wn_matches, _, _) = wordnet_match(hyp, refs, wn);
    matches.extend(stem_matches);
    matches.extend(wn_matches);
    matches.sort_by_key(|&(h, _)| h);
    matches
}

/// Positions (in `refs`) of each word, in order.
fn ref_positions(refs: &Enum) -> fnv::FnvHashMap<&str, Vec<usize>> {
    let mut positions: fnv::FnvHashMap<&str, Vec<usize>> = Default::default();
    for (j, (_, word)) in refs.iter().enumerate() {
        positions.entry(word.as_str()).or_default().push(j);
    }
    positions
}

/// The words of `list` whose positions are not in `taken`, in order.
fn unmatched(list: Enum, taken: &fnv::FnvHashSet<usize>) -> Enum {
    list.into_iter().enumerate().filter(|(k, _)| !taken.contains(k)).map(|(_, pair)| pair).collect()
}

/// NLTK's `_match_enums`: from the last hypothesis word backwards, each takes the last free
/// reference word equal to it.
fn match_enums(hyp: Enum, refs: Enum) -> (Vec<(usize, usize)>, Enum, Enum) {
    let mut word_match = Vec::new();
    let mut matched_hyp = fnv::FnvHashSet::default();
    let mut matched_ref = fnv::FnvHashSet::default();
    {
        let mut positions = ref_positions(&refs);
        for (i, (hi, word)) in hyp.iter().enumerate().rev() {
            if let Some(j) = positions.get_mut(word.as_str()).and_then(|p| p.pop()) {
                matched_hyp.insert(i);
                matched_ref.insert(j);
                word_match.push((*hi, refs[j].0));
            }
        }
    }
    (word_match, unmatched(hyp, &matched_hyp), unmatched(refs, &matched_ref))
}

/// NLTK's `_enum_wordnetsyn_match`: from the last hypothesis word backwards, its synonyms
/// (lemma names without `_` of `wordnet.synsets(word)`, and the word itself) take the last
/// free reference word among them.
fn wordnet_match(hyp: Enum, refs: Enum, wn: &WordNet) -> (Vec<(usize, usize)>, Enum, Enum) {
    let mut word_match = Vec::new();
    let mut matched_hyp = fnv::FnvHashSet::default();
    let mut matched_ref = fnv::FnvHashSet::default();
    {
        let mut positions = ref_positions(&refs);
        for (i, (hi, word)) in hyp.iter().enumerate().rev() {
            if matched_ref.len() == refs.len() {
                break; // no reference word left to match: NLTK's remaining lookups find nothing
            }
            let mut syns = wn.synonyms(word);
            syns.insert(word.clone());
            let mut best: Option<(usize, &str)> = None;
            for syn in &syns {
                if let Some(&j) = positions.get(syn.as_str()).and_then(|p| p.last())
                    && best.is_none_or(|(b, _)| j > b)
                {
                    best = Some((j, syn.as_str()));
                }
            }
            if let Some((j, syn)) = best {
                if let Some(p) = positions.get_mut(syn) {
                    p.pop();
                }
                matched_hyp.insert(i);
                matched_ref.insert(j);
                word_match.push((*hi, refs[j].0));
            }
        }
    }
    (word_match, unmatched(hyp, &matched_hyp), unmatched(refs, &matched_ref))
}

/// NLTK's `_count_chunks`: runs of matches adjacent in both hypothesis and reference.
fn count_chunks(matches: &[(usize, usize)]) -> usize {
    let mut chunks = 1;
    for w in matches.windows(2) {
        if !(w[1].0 == w[0].0 + 1 && w[1].1 == w[0].1 + 1) {
            chunks += 1;
        }
    }
    chunks
}

// ------------------------------------------------------------------------------------------
// Python string helpers

/// Python's `str.isspace()` for one character (what `str.split()` / `str.strip()` use):
/// Unicode White_Space plus the ASCII separators U+001C..U+001F.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `\s` of the `regex` module NLTK compiles its patterns with: Unicode White_Space (as the
/// `regex` crate's `\s`).
fn re_space(c: char) -> bool {
    c.is_whitespace()
}

/// `\w` of the `regex` module (and of the `regex` crate): Alphabetic, marks, decimal digits,
/// connector punctuation, join controls.
fn re_word(c: char) -> bool {
    static WORD: LocalRegex = LocalRegex::new(r"^\w$");
    let mut buf = [0u8; 4];
    WORD.is_match(c.encode_utf8(&mut buf))
}

/// `\d` (Unicode decimal digit).
fn re_digit(c: char) -> bool {
    static DIGIT: LocalRegex = LocalRegex::new(r"^\d$");
    let mut buf = [0u8; 4];
    DIGIT.is_match(c.encode_utf8(&mut buf))
}

/// Python's `str.split()`.
fn py_split(s: &str) -> Vec<String> {
    s.split(py_isspace).filter(|t| !t.is_empty()).map(str::to_string).collect()
}

// ------------------------------------------------------------------------------------------
// word_tokenize

/// NLTK's `word_tokenize(text)` with sentences split by the untrained Punkt tokenizer.
pub fn word_tokenize(text: &str) -> Vec<String> {
    word_tokenize_with(text, &EMPTY_PUNKT)
}

/// NLTK's `word_tokenize(text)`: [`sent_tokenize`] with `punkt`, then [`treebank_tokenize`]
/// on each sentence.
pub fn word_tokenize_with(text: &str, punkt: &PunktParams) -> Vec<String> {
    sent_tokenize(text, punkt).into_iter().flat_map(treebank_tokenize).collect()
}

struct Rule {
    re: LocalRegex,
    rep: &'static str,
}

fn rules(list: &[(&'static str, &'static str)]) -> Vec<Rule> {
    list.iter().map(|&(re, rep)| Rule { re: LocalRegex::new(re), rep }).collect()
}

fn apply(rules: &[Rule], mut text: String) -> String {
    for rule in rules {
        if let std::borrow::Cow::Owned(s) = rule.re.replace_all(&text, rule.rep) {
            text = s;
        }
    }
    text
}

static STARTING_QUOTES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    rules(&[(r"([«“‘„]|`+)", " ${1} "), (r#"^""#, "``"), (r"(``)", " ${1} "), (r#"([ (\[{<])("|'')"#, "${1} `` ")])
});

static PUNCTUATION_MID: LazyLock<Vec<Rule>> =
    LazyLock::new(|| rules(&[(r"\.{2,}", " ${0} "), (r"[;@#$%&]", " ${0} "), (r"[\x{2012}-\x{2015}]", " ${0} ")]));

static PUNCTUATION_END: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    rules(&[
        (r"[?!]", " ${0} "),
        (r"([^'])' ", "${1} ' "),
        (r"[*]", " ${0} "),
        (r"[\]\[(){}<>]", " ${0} "),
        (r"--", " -- "),
    ])
});

static COLON_COMMA: LocalRegex = LocalRegex::new(r"([:,])([^\d])");

static ENDING_QUOTES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    rules(&[
        (r"([»”’])", " ${1} "),
        (r"''", " '' "),
        (r#"""#, " '' "),
        (r"\s+", " "),
        (r"([^' ])('[sS]|'[mM]|'[dD]|') ", "${1} ${2} "),
        (r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) ", "${1} ${2} "),
    ])
});

/// NLTK's `CONTRACTIONS2` and `CONTRACTIONS3`, in order: `(?i)\b(can)(not)\b` ...,
/// `(?i)\b(wan)(na)(?=\s)`, `(?i) ('t)(is)\b`, `(?i) ('t)(was)\b`, each replaced by
/// ` \1 \2 `. (first part, second part, preceded by a space rather than `\b`, followed by
/// whitespace rather than `\b`)
const CONTRACTIONS: [(&str, &str, bool, bool); 10] = [
    ("can", "not", false, false),
    ("d", "'ye", false, false),
    ("gim", "me", false, false),
    ("gon", "na", false, false),
    ("got", "ta", false, false),
    ("lem", "me", false, false),
    ("more", "'n", false, false),
    ("wan", "na", false, true),
    ("'t", "is", true, false),
    ("'t", "was", true, false),
];

/// `\w` of Python's `re` module, which (unlike the rest of the tokenizer) compiles the
/// contraction patterns: `str.isalnum()` or `_`.
fn py_re_word(c: char) -> bool {
    static WORD: LocalRegex = LocalRegex::new(r"^[\p{L}\p{N}_]$");
    let mut buf = [0u8; 4];
    WORD.is_match(c.encode_utf8(&mut buf))
}

/// `(?i)` equality of `c` with the ASCII pattern character `a` in Python's `re`: `İ` and `ı`
/// match `i`, `ſ` matches `s`.
fn py_re_fold_eq(c: char, a: char) -> bool {
    c.to_ascii_lowercase() == a || (a == 'i' && matches!(c, '\u{130}' | '\u{131}')) || (a == 's' && c == 'ſ')
}

/// Applies the contraction patterns with `re` semantics (`\b`, `\s` and case folding as
/// Python's `re` has them).
fn split_contractions(text: String) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for (first, second, after_space, before_space) in CONTRACTIONS {
        let pat: Vec<char> = first.chars().chain(second.chars()).collect();
        let split = first.chars().count();
        let mut out: Vec<char> = Vec::with_capacity(chars.len() + 8);
        let mut i = 0;
        while i < chars.len() {
            let start = if after_space { i + 1 } else { i };
            let end = start + pat.len();
            let found = end <= chars.len()
                && if after_space {
                    chars[i] == ' '
                } else {
                    // `\b` before a word character: no word character precedes
                    i == 0 || !py_re_word(chars[i - 1])
                }
                && chars[start..end].iter().zip(&pat).all(|(&c, &a)| py_re_fold_eq(c, a))
                && if before_space {
                    chars.get(end).is_some_and(|&c| py_isspace(c))
                } else {
                    // `\b` after the pattern's last character
                    py_re_word(pat[pat.len() - 1]) != chars.get(end).is_some_and(|&c| py_re_word(c))
                };
            if found {
                out.push(' ');
                out.extend(&chars[start..start + split]);
                out.push(' ');
                out.extend(&chars[start + split..end]);
                out.push(' ');
                i = end;
            } else {
                out.push(chars[i]);
                i += 1;
            }
        }
        chars = out;
    }
    chars.into_iter().collect()
}

/// NLTK's `NLTKWordTokenizer().tokenize(sentence)` (NLTK 3.10.4), without
/// `convert_parentheses`.
pub fn treebank_tokenize(sentence: &str) -> Vec<String> {
    let mut text = apply(&STARTING_QUOTES, sentence.to_string());
    text = opening_apostrophe(&text);
    // PUNCTUATION
    // `([^\.])(\.)([\]\)}>"\'»”’ ]*+)\s*$` -> `\1 \2 \3 `
    if let Some(t) = final_period(&text, |c| "])}>\"'»”’ ".contains(c), true) {
        text = t;
    }
    text = COLON_COMMA.replace_all(&text, " ${1} ${2}").into_owned();
    text = colon_comma_at_end(&text);
    text = apply(&PUNCTUATION_MID, text);
    // `([^\.])(\.)([\]\)}>"\']*)\s*$` -> `\1 \2\3 ` (the final period)
    if let Some(t) = final_period(&text, |c| "])}>\"'".contains(c), false) {
        text = t;
    }
    text = apply(&PUNCTUATION_END, text);
    text = format!(" {text} ");
    text = apply(&ENDING_QUOTES, text);
    text = split_contractions(text);
    py_split(&text)
}

/// `(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)` -> `\1 `: an apostrophe opening a
/// word (not a contraction) is split from it.
fn opening_apostrophe(text: &str) -> String {
    if !text.contains('\'') {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        out.push(c);
        if c != '\'' {
            continue;
        }
        let prev_word = i > 0 && re_word(chars[i - 1]);
        let next_word = chars.get(i + 1).is_some_and(|&n| re_word(n));
        if prev_word || !next_word {
            continue;
        }
        let contraction = ["re", "ve", "ll", "m", "t", "s", "d", "n"].iter().any(|alt| {
            let n = alt.chars().count();
            let matches = alt.chars().enumerate().all(|(k, a)| chars.get(i + 1 + k).is_some_and(|&c| fold_eq(c, a)));
            matches && !chars.get(i + 1 + n).is_some_and(|&c| re_word(c))
        });
        if !contraction {
            out.push(' ');
        }
    }
    out
}

/// Case-insensitive comparison of `c` with the ASCII letter `a`, as a `(?i)` regex does it
/// (simple case folding: `ſ` folds to `s`).
fn fold_eq(c: char, a: char) -> bool {
    c.to_ascii_lowercase() == a || (a == 's' && c == 'ſ')
}

/// The two final-period rules: `([^\.])(\.)([CLASS]*)\s*$`. The only period that can match is
/// the last one of the text, when only CLASS characters and then whitespace follow it, and a
/// character other than a period precedes it. The match runs to the end of the text; the
/// replacement is `\1 \2 \3 ` (`spaced`) or `\1 \2\3 `.
fn final_period(text: &str, class: impl Fn(char) -> bool, spaced: bool) -> Option<String> {
    let p = text.rfind('.')?;
    let before = &text[..p];
    let after = &text[p + 1..];
    let run_len = after.char_indices().find(|&(_, c)| !class(c)).map_or(after.len(), |(i, _)| i);
    if !after[run_len..].chars().all(re_space) {
        return None;
    }
    if before.chars().next_back()? == '.' {
        return None;
    }
    let run = &after[..run_len];
    Some(if spaced { format!("{before} . {run} ") } else { format!("{before} .{run} ") })
}

/// `([:,])$` -> ` \1 `, with Python's `$` (end of text, or before a final newline).
fn colon_comma_at_end(text: &str) -> String {
    let (body, nl) = match text.strip_suffix('\n') {
        Some(b) if b.ends_with([':', ',']) => (b, "\n"),
        _ => (text, ""),
    };
    match body.chars().next_back() {
        Some(c @ (':' | ',')) => format!("{} {c} {nl}", &body[..body.len() - 1]),
        _ => text.to_string(),
    }
}

// ------------------------------------------------------------------------------------------
// Punkt

const ORTHO_BEG_UC: u32 = 1 << 1;
const ORTHO_MID_UC: u32 = 1 << 2;
const ORTHO_UNK_UC: u32 = 1 << 3;
const ORTHO_BEG_LC: u32 = 1 << 4;
const ORTHO_MID_LC: u32 = 1 << 5;
const ORTHO_UNK_LC: u32 = 1 << 6;
const ORTHO_UC: u32 = ORTHO_BEG_UC + ORTHO_MID_UC + ORTHO_UNK_UC;
const ORTHO_LC: u32 = ORTHO_BEG_LC + ORTHO_MID_LC + ORTHO_UNK_LC;

/// Punkt's trained parameters (NLTK's `PunktParameters`); empty = untrained.
#[derive(Clone, Debug, Default)]
pub struct PunktParams {
    /// Abbreviations, lowercased, without their final period ("mr", "e.g").
    pub abbrev_types: HashSet<String>,
    /// Word-type pairs across which a period is no sentence break.
    pub collocations: HashSet<(String, String)>,
    /// Word types that often start a sentence.
    pub sent_starters: HashSet<String>,
    /// Word type → `ORTHO_*` flags (in which positions and case it was seen).
    pub ortho_context: HashMap<String, u32>,
}

static EMPTY_PUNKT: LazyLock<PunktParams> = LazyLock::new(PunktParams::default);

impl PunktParams {
    /// Loads a `punkt_tab` language directory as NLTK's `load_punkt_params` does
    /// (`collocations.tab`, `sent_starters.txt`, `abbrev_types.txt`, `ortho_context.tab`),
    /// e.g. `~/nltk_data/tokenizers/punkt_tab/english` after `nltk.download("punkt_tab")`.
    pub fn load(dir: impl AsRef<Path>) -> io::Result<PunktParams> {
        let dir = dir.as_ref();
        let read = |name: &str| -> io::Result<String> {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| io::Error::new(e.kind(), format!("Punkt model {}: {e}", dir.join(name).display())))
        };
        let bad = |name: &str, line: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("Punkt model {}: bad line {line:?}", dir.join(name).display()),
            )
        };
        let mut params = PunktParams::default();
        for line in read("collocations.tab")?.lines() {
            let (a, b) = line.split_once('\t').ok_or_else(|| bad("collocations.tab", line))?;
            params.collocations.insert((a.to_string(), b.to_string()));
        }
        params.sent_starters = read("sent_starters.txt")?.lines().map(str::to_string).collect();
        params.abbrev_types = read("abbrev_types.txt")?.lines().map(str::to_string).collect();
        for line in read("ortho_context.tab")?.lines() {
            let (typ, flags) = line.split_once('\t').ok_or_else(|| bad("ortho_context.tab", line))?;
            let flags = flags.trim().parse::<u32>().map_err(|_| bad("ortho_context.tab", line))?;
            params.ortho_context.insert(typ.to_string(), flags);
        }
        Ok(params)
    }

    fn ortho(&self, typ: &str) -> u32 {
        self.ortho_context.get(typ).copied().unwrap_or(0)
    }
}

/// Punkt's `_re_non_word_chars`: punctuation that ends a word (the period excluded).
fn punkt_non_word(c: char) -> bool {
    ")\";}]*:@'({[‘’“”«»?!".contains(c)
}

/// Punkt's `_re_word_start`: characters that may start a word.
fn punkt_word_start(c: char) -> bool {
    !"(\"`{[:;&#*@)}]-,".contains(c)
}

/// Punkt's `_re_multi_char_punct` at byte `p`: `\-{2,}|\.{2,}|(?:\.\s){2,}\.`; the end.
fn multi_char_at(s: &str, p: usize) -> Option<usize> {
    let rest = &s[p..];
    if rest.starts_with("--") {
        return Some(p + rest.len() - rest.trim_start_matches('-').len());
    }
    if rest.starts_with("..") {
        return Some(p + rest.len() - rest.trim_start_matches('.').len());
    }
    // (?:\.\s){2,}\. : `ends[k]` = end of k pairs
    let mut ends = vec![p];
    let mut chars = rest.chars();
    while let (Some('.'), Some(c)) = (chars.next(), chars.next()) {
        if !re_space(c) {
            break;
        }
        let last = ends[ends.len() - 1];
        ends.push(last + 1 + c.len_utf8());
    }
    let k = ends.len() - 1;
    // greedy: the most pairs that a period follows; fewer pairs always end on a period
    if k >= 2 && s[ends[k]..].starts_with('.') {
        return Some(ends[k] + 1);
    }
    if k >= 3 {
        return Some(ends[k - 1] + 1);
    }
    None
}

/// Punkt's `PunktLanguageVars.word_tokenize(line)`: `_word_tokenize_fmt` findall.
fn punkt_words(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < line.len() {
        let c = line[pos..].chars().next().unwrap();
        if let Some(end) = multi_char_at(line, pos) {
            out.push(&line[pos..end]);
            pos = end;
            continue;
        }
        if re_space(c) {
            pos += c.len_utf8();
            continue;
        }
        if !punkt_word_start(c) {
            out.push(&line[pos..pos + c.len_utf8()]);
            pos += c.len_utf8();
            continue;
        }
        // (?=WordStart)\S+? until (?=\s|$|NonWord|MultiChar|,(?=$|\s|NonWord|MultiChar))
        let mut q = pos + c.len_utf8();
        while let Some(n) = line[q..].chars().next() {
            if re_space(n) || punkt_non_word(n) || multi_char_at(line, q).is_some() {
                break;
            }
            if n == ',' {
                let r = q + 1;
                let after = line[r..].chars().next();
                if after.is_none_or(|a| re_space(a) || punkt_non_word(a)) || multi_char_at(line, r).is_some() {
                    break;
                }
            }
            q += n.len_utf8();
        }
        out.push(&line[pos..q]);
        pos = q;
    }
    out
}

/// A Punkt token with its annotations.
struct PunktToken<'a> {
    tok: &'a str,
    typ: String,
    period_final: bool,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

static RE_NUMERIC: LocalRegex = LocalRegex::new(r"^-?[.,]?\d[\d,.\-]*\.?$");

impl<'a> PunktToken<'a> {
    fn new(tok: &'a str) -> PunktToken<'a> {
        let lower = py_lower(tok);
        let typ = if RE_NUMERIC.is_match(&lower) { "##number##".to_string() } else { lower };
        PunktToken { tok, typ, period_final: tok.ends_with('.'), sentbreak: false, abbr: false, ellipsis: false }
    }

    fn type_no_period(&self) -> &str {
        if self.typ.chars().count() > 1 && self.typ.ends_with('.') {
            &self.typ[..self.typ.len() - 1]
        } else {
            &self.typ
        }
    }

    fn type_no_sentperiod(&self) -> &str {
        if self.sentbreak { self.type_no_period() } else { &self.typ }
    }

    fn first_upper(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_uppercase)
    }

    fn first_lower(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_lowercase)
    }

    /// `\.\.+$`
    fn is_ellipsis(&self) -> bool {
        self.tok.len() >= 2 && self.tok.bytes().all(|b| b == b'.')
    }

    /// `[^\W\d]\.$`
    fn is_initial(&self) -> bool {
        let mut chars = self.tok.chars();
        matches!((chars.next(), chars.next(), chars.next()), (Some(c), Some('.'), None) if re_word(c) && !re_digit(c))
    }
}

/// Punkt's `_tokenize_words` + `_annotate_tokens` (first and second pass).
fn punkt_annotated<'a>(text: &'a str, params: &PunktParams) -> Vec<PunktToken<'a>> {
    let mut tokens: Vec<PunktToken<'a>> = Vec::new();
    for line in text.split('\n') {
        if line.trim_matches(py_isspace).is_empty() {
            continue;
        }
        tokens.extend(punkt_words(line).into_iter().map(PunktToken::new));
    }
    for t in &mut tokens {
        first_pass(t, params);
    }
    for i in 0..tokens.len().saturating_sub(1) {
        let (head, tail) = tokens.split_at_mut(i + 1);
        second_pass(&mut head[i], &tail[0], params);
    }
    tokens
}

fn first_pass(t: &mut PunktToken<'_>, params: &PunktParams) {
    let tok = t.tok;
    if tok == "." || tok == "?" || tok == "!" {
        t.sentbreak = true;
    } else if t.is_ellipsis() {
        t.ellipsis = true;
    } else if t.period_final && !tok.ends_with("..") {
        let body = py_lower(&tok[..tok.len() - 1]);
        let last = body.rsplit('-').next().unwrap_or("");
        if params.abbrev_types.contains(&body) || params.abbrev_types.contains(last) {
            t.abbr = true;
        } else {
            t.sentbreak = true;
        }
    }
}

#[derive(PartialEq)]
enum Ortho {
    True,
    False,
    Unknown,
}

fn ortho_heuristic(t: &PunktToken<'_>, params: &PunktParams) -> Ortho {
    if [";", ":", ",", ".", "!", "?"].contains(&t.tok) {
        return Ortho::False;
    }
    let ctx = params.ortho(t.type_no_sentperiod());
    if t.first_upper() && ctx & ORTHO_LC != 0 && ctx & ORTHO_MID_UC == 0 {
        return Ortho::True;
    }
    if t.first_lower() && (ctx & ORTHO_UC != 0 || ctx & ORTHO_BEG_LC == 0) {
        return Ortho::False;
    }
    Ortho::Unknown
}

fn second_pass(t1: &mut PunktToken<'_>, t2: &PunktToken<'_>, params: &PunktParams) {
    if !t1.period_final {
        return;
    }
    let typ = t1.type_no_period().to_string();
    let next_typ = t2.type_no_sentperiod();
    let is_initial = t1.is_initial();
    if params.collocations.contains(&(typ.clone(), next_typ.to_string())) {
        t1.sentbreak = false;
        t1.abbr = true;
        return;
    }
    if (t1.abbr || t1.ellipsis) && !is_initial {
        if ortho_heuristic(t2, params) == Ortho::True {
            t1.sentbreak = true;
            return;
        }
        if t2.first_upper() && params.sent_starters.contains(next_typ) {
            t1.sentbreak = true;
            return;
        }
    }
    if is_initial || typ == "##number##" {
        let starter = ortho_heuristic(t2, params);
        if starter == Ortho::False {
            t1.sentbreak = false;
            t1.abbr = true;
            return;
        }
        if starter == Ortho::Unknown && is_initial && t2.first_upper() && params.ortho(next_typ) & ORTHO_LC == 0 {
            t1.sentbreak = false;
            t1.abbr = true;
        }
    }
}

/// Punkt's `text_contains_sentbreak`: a token other than the last one ends a sentence.
fn text_contains_sentbreak(text: &str, params: &PunktParams) -> bool {
    let tokens = punkt_annotated(text, params);
    tokens.iter().rev().skip(1).any(|t| t.sentbreak)
}

/// A match of Punkt's `period_context_re`: a sentence-ending character followed by other
/// punctuation or by whitespace and a token.
struct PeriodContext<'a> {
    start: usize,
    end: usize,
    after_tok: &'a str,
    next_tok_start: Option<usize>,
}

fn period_contexts(text: &str) -> Vec<PeriodContext<'_>> {
    let mut out = Vec::new();
    for (i, c) in text.char_indices() {
        if !matches!(c, '.' | '?' | '!') {
            continue;
        }
        let end = i + 1;
        let Some(n) = text[end..].chars().next() else { continue };
        if punkt_non_word(n) {
            out.push(PeriodContext { start: i, end, after_tok: &text[end..end + n.len_utf8()], next_tok_start: None });
        } else if re_space(n) {
            let ws_end = text[end..].find(|c: char| !re_space(c)).map(|k| end + k);
            let Some(tok_start) = ws_end else { continue };
            let tok_end = text[tok_start..].find(re_space).map_or(text.len(), |k| tok_start + k);
            out.push(PeriodContext { start: i, end, after_tok: &text[end..tok_end], next_tok_start: Some(tok_start) });
        }
    }
    out
}

/// Punkt's `_match_potential_end_contexts`: each candidate with the text Punkt decides on
/// (the word before it, the character, what follows).
fn potential_end_contexts<'a>(text: &'a str) -> Vec<(PeriodContext<'a>, String)> {
    let mut out = Vec::new();
    let mut previous_slice = (0usize, 0usize);
    let mut previous: Option<PeriodContext<'a>> = None;
    let context = |slice: (usize, usize), m: &PeriodContext<'_>| {
        format!("{}{}{}", &text[slice.0..slice.1], &text[m.start..m.end], m.after_tok)
    };
    for m in period_contexts(text) {
        let before = &text[previous_slice.1..m.start];
        // last index of a `string.whitespace` character, 0 when none
        let last_ws = before.rfind([' ', '\t', '\n', '\r', '\x0b', '\x0c']).unwrap_or(0);
        let word_start = if last_ws != 0 { last_ws + previous_slice.1 + 1 } else { previous_slice.0 };
        let prev_word_slice = (word_start, m.start);
        if let Some(pm) = previous.take()
            && previous_slice.1 <= prev_word_slice.0
        {
            let ctx = context(previous_slice, &pm);
            out.push((pm, ctx));
        }
        previous = Some(m);
        previous_slice = prev_word_slice;
    }
    if let Some(pm) = previous {
        let ctx = context(previous_slice, &pm);
        out.push((pm, ctx));
    }
    out
}

/// Punkt's `_realign_boundaries` pattern, matched at the start of `s`:
/// `["\')\]}‘’“”«»]+?(?:\s+|(?=--)|$)` (MULTILINE). The closing characters' length and the
/// match's end.
fn boundary_realignment(s: &str) -> Option<(usize, usize)> {
    let mut q = 0;
    for c in s.chars() {
        if !"\"')]}‘’“”«»".contains(c) {
            return None;
        }
        q += c.len_utf8();
        let rest = &s[q..];
        match rest.chars().next() {
            Some(n) if re_space(n) => {
                let ws = rest.find(|c: char| !re_space(c)).unwrap_or(rest.len());
                return Some((q, q + ws));
            }
            None => return Some((q, q)),
            Some(_) if rest.starts_with("--") => return Some((q, q)),
            Some(_) => {}
        }
    }
    None
}

/// NLTK's `PunktSentenceTokenizer.span_tokenize(text)` with `params`: byte spans of the
/// sentences.
pub fn sent_spans(text: &str, params: &PunktParams) -> Vec<(usize, usize)> {
    // _slices_from_text
    let mut slices = Vec::new();
    let mut last_break = 0;
    for (m, context) in potential_end_contexts(text) {
        if text_contains_sentbreak(&context, params) {
            slices.push((last_break, m.end));
            last_break = m.next_tok_start.unwrap_or(m.end);
        }
    }
    slices.push((last_break, text.trim_end_matches(py_isspace).len()));
    // _realign_boundaries
    let slice_text = |(a, b): (usize, usize)| if a < b { &text[a..b] } else { "" };
    let mut out = Vec::new();
    let mut realign = 0;
    for k in 0..slices.len() {
        let s1 = (slices[k].0 + realign, slices[k].1);
        let Some(&s2) = slices.get(k + 1) else {
            if !slice_text(s1).is_empty() {
                out.push(s1);
            }
            continue;
        };
        if let Some((closers, end)) = boundary_realignment(slice_text(s2)) {
            out.push((s1.0, s2.0 + closers));
            realign = end;
        } else {
            realign = 0;
            if !slice_text(s1).is_empty() {
                out.push(s1);
            }
        }
    }
    out
}

/// NLTK's `sent_tokenize(text)` with Punkt parameters `params`.
pub fn sent_tokenize<'a>(text: &'a str, params: &PunktParams) -> Vec<&'a str> {
    sent_spans(text, params).into_iter().map(|(a, b)| if a < b { &text[a..b] } else { "" }).collect()
}
