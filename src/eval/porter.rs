//! NLTK's `PorterStemmer()` in its default `NLTK_EXTENSIONS` mode, ported rule for rule
//! (NLTK 3.10): used by ROUGE (as `rouge_score` stems tokens) and METEOR.
//!
//! The port works on Unicode scalar values, as Python indexes `str`, so any word gives the
//! same stem NLTK gives: `stem` lowercases it first (`to_lowercase=True`), looks it up in
//! the table of irregular forms, leaves words of at most two characters alone, then runs
//! steps 1a, 1b, 1c, 2, 3, 4, 5a and 5b.

/// NLTK's table of irregular forms (`self.pool`): form → stem.
const IRREGULAR: &[(&str, &str)] = &[
    ("sky", "sky"),
    ("skies", "sky"),
    ("dying", "die"),
    ("lying", "lie"),
    ("tying", "tie"),
    ("news", "news"),
    ("innings", "inning"),
    ("inning", "inning"),
    ("outings", "outing"),
    ("outing", "outing"),
    ("cannings", "canning"),
    ("canning", "canning"),
    ("howe", "howe"),
    ("proceed", "proceed"),
    ("exceed", "exceed"),
    ("succeed", "succeed"),
];

/// Stems one word exactly as NLTK's `PorterStemmer().stem(word)` does.
pub fn stem(word: &str) -> String {
    let lower = word.to_lowercase();
    if let Some((_, s)) = IRREGULAR.iter().find(|(form, _)| *form == lower) {
        return (*s).to_string();
    }
    // NLTK tests the length of the word as given, before lowercasing.
    if word.chars().count() <= 2 {
        return lower;
    }
    let mut w: Vec<char> = lower.chars().collect();
    w = step1a(w);
    w = step1b(w);
    w = step1c(w);
    w = step2(w);
    w = step3(w);
    w = step4(w);
    w = step5a(w);
    w = step5b(w);
    w.into_iter().collect()
}

fn is_vowel(c: char) -> bool {
    matches!(c, 'a' | 'e' | 'i' | 'o' | 'u')
}

/// `_is_consonant`: a 'y' is a consonant iff the letter before it is not one (or it starts
/// the word).
fn is_consonant(w: &[char], i: usize) -> bool {
    let c = w[i];
    if is_vowel(c) {
        return false;
    }
    if c == 'y' {
        let mut negate = false;
        let mut j = i;
        while j > 0 && w[j] == 'y' {
            negate = !negate;
            j -= 1;
        }
        // Consonant iff "not a vowel" XOR an odd run of y.
        return is_vowel(w[j]) == negate;
    }
    true
}

/// `_consonant_flags`: `is_consonant` for every position in one pass.
fn consonant_flags(w: &[char]) -> Vec<bool> {
    let mut flags: Vec<bool> = Vec::with_capacity(w.len());
    for (i, &c) in w.iter().enumerate() {
        let f = if is_vowel(c) {
            false
        } else if c == 'y' {
            i == 0 || !flags[i - 1]
        } else {
            true
        };
        flags.push(f);
    }
    flags
}

/// `_measure`: the number of "vc" pairs in the consonant/vowel sequence.
fn measure(w: &[char]) -> usize {
    let flags = consonant_flags(w);
    flags.windows(2).filter(|p| !p[0] && p[1]).count()
}

fn has_positive_measure(w: &[char]) -> bool {
    measure(w) > 0
}

fn measure_gt_1(w: &[char]) -> bool {
    measure(w) > 1
}

fn contains_vowel(w: &[char]) -> bool {
    consonant_flags(w).iter().any(|&c| !c)
}

/// Condition `*d`: ends with a double consonant.
fn ends_double_consonant(w: &[char]) -> bool {
    let n = w.len();
    n >= 2 && w[n - 1] == w[n - 2] && is_consonant(w, n - 1)
}

/// Condition `*o`, with NLTK's extension for two-letter stems.
fn ends_cvc(w: &[char]) -> bool {
    let n = w.len();
    (n >= 3
        && is_consonant(w, n - 3)
        && !is_consonant(w, n - 2)
        && is_consonant(w, n - 1)
        && !matches!(w[n - 1], 'w' | 'x' | 'y'))
        || (n == 2 && !is_consonant(w, 0) && is_consonant(w, 1))
}

fn ends_with(w: &[char], suffix: &str) -> bool {
    let n = suffix.chars().count();
    n <= w.len() && w[w.len() - n..].iter().copied().eq(suffix.chars())
}

/// `w` without its last `suffix` characters, plus `replacement`.
fn replace_suffix(w: &[char], suffix: &str, replacement: &str) -> Vec<char> {
    let n = suffix.chars().count();
    let mut out: Vec<char> = w[..w.len() - n].to_vec();
    out.extend(replacement.chars());
    out
}

/// One suffix rule: suffix, replacement, condition on the stem (`None`: unconditional).
type Rule = (&'static str, &'static str, Option<fn(&[char]) -> bool>);

/// `_apply_rule_list` (without the `*d` pseudo-suffix, which only step 1b uses and which
/// `step1b` handles itself): the first rule whose suffix matches decides.
fn apply_rule_list(w: Vec<char>, rules: &[Rule]) -> Vec<char> {
    for &(suffix, replacement, condition) in rules {
        if ends_with(&w, suffix) {
            let stem = replace_suffix(&w, suffix, "");
            if condition.is_none_or(|c| c(&stem)) {
                let mut out = stem;
                out.extend(replacement.chars());
                return out;
            }
            return w;
        }
    }
    w
}

fn step1a(w: Vec<char>) -> Vec<char> {
    if ends_with(&w, "ies") && w.len() == 4 {
        return replace_suffix(&w, "ies", "ie");
    }
    apply_rule_list(w, &[("sses", "ss", None), ("ies", "i", None), ("ss", "ss", None), ("s", "", None)])
}

fn step1b(w: Vec<char>) -> Vec<char> {
    if ends_with(&w, "ied") {
        return if w.len() == 4 { replace_suffix(&w, "ied", "ie") } else { replace_suffix(&w, "ied", "i") };
    }
    if ends_with(&w, "eed") {
        let stem = replace_suffix(&w, "eed", "");
        if measure(&stem) > 0 {
            let mut out = stem;
            out.extend(['e', 'e']);
            return out;
        }
        return w;
    }
    let mut intermediate = None;
    for suffix in ["ed", "ing"] {
        if ends_with(&w, suffix) {
            let s = replace_suffix(&w, suffix, "");
            if contains_vowel(&s) {
                intermediate = Some(s);
                break;
            }
        }
    }
    let Some(s) = intermediate else {
        return w;
    };
    // The rule list of NLTK's step 1b, in order.
    for (suffix, replacement) in [("at", "ate"), ("bl", "ble"), ("iz", "ize")] {
        if ends_with(&s, suffix) {
            return replace_suffix(&s, suffix, replacement);
        }
    }
    if ends_double_consonant(&s) {
        let last = s[s.len() - 1];
        if !matches!(last, 'l' | 's' | 'z') {
            let mut out = s[..s.len() - 2].to_vec();
            out.push(last);
            return out;
        }
        return s;
    }
    if measure(&s) == 1 && ends_cvc(&s) {
        let mut out = s;
        out.push('e');
        return out;
    }
    s
}

fn step1c(w: Vec<char>) -> Vec<char> {
    fn nltk_condition(stem: &[char]) -> bool {
        stem.len() > 1 && is_consonant(stem, stem.len() - 1)
    }
    apply_rule_list(w, &[("y", "i", Some(nltk_condition))])
}

fn step2(w: Vec<char>) -> Vec<char> {
    if ends_with(&w, "alli") && has_positive_measure(&replace_suffix(&w, "alli", "")) {
        return step2(replace_suffix(&w, "alli", "al"));
    }
    // `logi` → `log` tests the measure of the word without its last three letters, that
    // is the stem plus its 'l'.
    fn logi_condition(stem: &[char]) -> bool {
        let mut with_l = stem.to_vec();
        with_l.push('l');
        has_positive_measure(&with_l)
    }
    let p: Option<fn(&[char]) -> bool> = Some(has_positive_measure);
    let rules: [Rule; 22] = [
        ("ational", "ate", p),
        ("tional", "tion", p),
        ("enci", "ence", p),
        ("anci", "ance", p),
        ("izer", "ize", p),
        ("bli", "ble", p),
        ("alli", "al", p),
        ("entli", "ent", p),
        ("eli", "e", p),
        ("ousli", "ous", p),
        ("ization", "ize", p),
        ("ation", "ate", p),
        ("ator", "ate", p),
        ("alism", "al", p),
        ("iveness", "ive", p),
        ("fulness", "ful", p),
        ("ousness", "ous", p),
        ("aliti", "al", p),
        ("iviti", "ive", p),
        ("biliti", "ble", p),
        ("fulli", "ful", p),
        ("logi", "log", Some(logi_condition)),
    ];
    apply_rule_list(w, &rules)
}

fn step3(w: Vec<char>) -> Vec<char> {
    let p: Option<fn(&[char]) -> bool> = Some(has_positive_measure);
    apply_rule_list(
        w,
        &[
            ("icate", "ic", p),
            ("ative", "", p),
            ("alize", "al", p),
            ("iciti", "ic", p),
            ("ical", "ic", p),
            ("ful", "", p),
            ("ness", "", p),
        ],
    )
}

fn step4(w: Vec<char>) -> Vec<char> {
    fn ion_condition(stem: &[char]) -> bool {
        measure(stem) > 1 && matches!(stem.last(), Some('s' | 't'))
    }
    let g: Option<fn(&[char]) -> bool> = Some(measure_gt_1);
    apply_rule_list(
        w,
        &[
            ("al", "", g),
            ("ance", "", g),
            ("ence", "", g),
            ("er", "", g),
            ("ic", "", g),
            ("able", "", g),
            ("ible", "", g),
            ("ant", "", g),
            ("ement", "", g),
            ("ment", "", g),
            ("ent", "", g),
            ("ion", "", Some(ion_condition)),
            ("ou", "", g),
            ("ism", "", g),
            ("ate", "", g),
            ("iti", "", g),
            ("ous", "", g),
            ("ive", "", g),
            ("ize", "", g),
        ],
    )
}

fn step5a(w: Vec<char>) -> Vec<char> {
    if ends_with(&w, "e") {
        let stem = replace_suffix(&w, "e", "");
        let m = measure(&stem);
        if m > 1 || (m == 1 && !ends_cvc(&stem)) {
            return stem;
        }
    }
    w
}

fn step5b(w: Vec<char>) -> Vec<char> {
    // ("ll", "l", measure(word[:-1]) > 1): word[:-1] is the stem plus one 'l'.
    fn condition(stem: &[char]) -> bool {
        let mut with_l = stem.to_vec();
        with_l.push('l');
        measure(&with_l) > 1
    }
    apply_rule_list(w, &[("ll", "l", Some(condition))])
}

#[cfg(test)]
mod tests {
    use super::stem;

    #[test]
    fn paper_examples() {
        let cases = [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "tie"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("hopping", "hop"),
            ("falling", "fall"),
            ("filing", "file"),
            ("happy", "happi"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("generalization", "gener"),
            ("running", "run"),
            ("flies", "fli"),
            ("dies", "die"),
            ("died", "die"),
            ("spied", "spi"),
            ("enjoy", "enjoy"),
            ("controll", "control"),
            ("skies", "sky"),
            ("dying", "die"),
            ("Running", "run"),
            ("is", "is"),
            ("ab", "ab"),
            ("archaeology", "archaeolog"),
            ("geology", "geolog"),
            ("oed", "o"),
            ("yyyy", "yyyi"),
        ];
        for (word, want) in cases {
            assert_eq!(stem(word), want, "stem({word:?})");
        }
    }

    #[test]
    fn unicode_words_do_not_panic() {
        assert_eq!(stem("café"), "café");
        assert_eq!(stem("İİ"), "i\u{307}i\u{307}");
        assert_eq!(stem("ÉTÉS"), "été");
        assert_eq!(stem(""), "");
    }
}
