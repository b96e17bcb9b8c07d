//! Parity of `synth::eval::{bleu, rouge}` with the Python reference implementations (HF
//! `evaluate` BLEU over sacrebleu's 13a tokenizer, Google's `rouge_score`) on
//! `tests/fixtures/eval/pairs.jsonl`: against the stored `bleu_rouge.expected.jsonl`, and,
//! when `SYNTH_EVAL_PYTHON` names a Python with sacrebleu, rouge-score and nltk, against a
//! fresh run of `reference_bleu_rouge.py` (and NLTK's Porter stemmer on the fixture's
//! words).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use support::eval_fixtures::{Pair, fixtures, pairs, read_jsonl};
use synth::eval::{bleu, porter, rouge};

use crate::support;

const TOLERANCE: f64 = 1e-6;
const METRICS: [&str; 5] = ["bleu", "rouge1", "rouge2", "rougeL", "rougeLsum"];

fn ours(p: &Pair) -> [f64; 5] {
    let r = rouge::rouge(&p.response, &p.reference);
    [bleu::bleu(&p.response, &p.reference), r.rouge1, r.rouge2, r.rouge_l, r.rouge_lsum]
}

/// Compares every pair with `expected`; returns the largest absolute difference per metric.
fn compare(pairs: &[Pair], expected_path: &Path) -> [f64; 5] {
    let expected = read_jsonl(expected_path);
    assert_eq!(pairs.len(), expected.len(), "{}: one line per pair", expected_path.display());
    let mut max_diff = [0.0f64; 5];
    let mut inside = [0usize; 5];
    let mut failures = Vec::new();
    for (p, e) in pairs.iter().zip(&expected) {
        assert_eq!(e["id"].as_str(), Some(p.id.as_str()), "{}: ids in fixture order", expected_path.display());
        let got = ours(p);
        // Where evaluate raises (the official code's NaN, left out of its mean), and
        // ROUGE-Lsum in rouge_score's documented order.
        let undefined = e["bleu_undefined"].as_bool().expect("bleu_undefined");
        if undefined != bleu::sentence_bleu(&p.response, &p.reference).is_none() {
            failures.push(format!("{}: bleu_undefined python {undefined}", p.id));
        }
        let want = e["rougeLsum_target_reference"].as_f64().expect("rougeLsum_target_reference");
        let other = rouge::rouge_with(&p.response, &p.reference, rouge::RougeTarget::Reference).rouge_lsum;
        if (other - want).abs() > TOLERANCE {
            failures.push(format!("{} rougeLsum (target = reference): ours {other:.12} python {want:.12}", p.id));
        }
        for (k, name) in METRICS.iter().enumerate() {
            let want = e[*name].as_f64().unwrap_or_else(|| panic!("{}: {name} of {}", expected_path.display(), p.id));
            let d = (got[k] - want).abs();
            inside[k] += usize::from(want > 0.0 && want < 1.0);
            max_diff[k] = max_diff[k].max(d);
            if d > TOLERANCE {
                failures.push(format!("{} {name}: ours {:.12} python {:.12}", p.id, got[k], want));
            }
        }
    }
    for ((name, d), inside) in METRICS.iter().zip(max_diff).zip(inside) {
        eprintln!(
            "{}: {name}: max |ours - python| {d:e} over {} pairs ({inside} scores inside (0, 1))",
            expected_path.display(),
            pairs.len()
        );
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    max_diff
}

/// NLTK's stems of `words`, as `word\tstem` lines from `reference_bleu_rouge.py --stems`.
fn python_stems(python: &str, script: &Path, dir: &Path, words: &BTreeSet<String>) -> String {
    let list = dir.join("words.txt");
    std::fs::write(&list, words.iter().map(|w| format!("{w}\n")).collect::<String>()).expect("write words");
    let output = Command::new(python)
        .env("PYTHONIOENCODING", "utf-8")
        .arg(script)
        .arg("--stems")
        .arg(&list)
        .output()
        .expect("run the stemmer");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8 stems")
}

#[test]
fn fixture_covers_the_cases() {
    let pairs = pairs();
    assert!(pairs.len() >= 220, "{} pairs", pairs.len());
    let ids: BTreeSet<&str> = pairs.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), pairs.len(), "unique ids");
    assert!(pairs.iter().any(|p| p.response.is_empty() && p.reference.is_empty()));
    assert!(pairs.iter().any(|p| p.response.is_empty() && !p.reference.is_empty()));
    assert!(pairs.iter().any(|p| !p.response.is_empty() && p.reference.is_empty()));
    assert!(pairs.iter().any(|p| p.reference.split_whitespace().count() >= 300));
    assert!(pairs.iter().any(|p| p.response.contains('\n')));
    // ROUGE-Lsum depends on which text is the target for some pairs (multi-line texts).
    let order_matters = pairs
        .iter()
        .filter(|p| {
            let a = rouge::rouge(&p.response, &p.reference).rouge_lsum;
            (a - rouge::rouge_with(&p.response, &p.reference, rouge::RougeTarget::Reference).rouge_lsum).abs() > 1e-9
        })
        .count();
    assert!(order_matters >= 3, "{order_matters} pairs where the ROUGE-Lsum order matters");
    assert!(pairs.iter().any(|p| p.response.contains("&amp;")));
    // Scores are spread over (0, 1), not only 0 and 1.
    let mid = pairs.iter().filter(|p| ours(p).iter().all(|&s| s > 0.0 && s < 1.0)).count();
    assert!(mid >= 100, "{mid} pairs with every score strictly inside (0, 1)");
}

#[test]
fn matches_stored_expectations() {
    compare(&pairs(), &fixtures().join("bleu_rouge.expected.jsonl"));
}

/// With `SYNTH_EVAL_PYTHON` set: re-runs the reference script and compares again, and checks
/// the stemmer against NLTK on every word of the fixture (and a few forms of each).
#[test]
fn matches_live_python_when_available() {
    let Ok(python) = std::env::var("SYNTH_EVAL_PYTHON") else {
        eprintln!("SYNTH_EVAL_PYTHON not set: live comparison skipped");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = fixtures().join("reference_bleu_rouge.py");
    let out = dir.path().join("expected.jsonl");
    let status = Command::new(&python)
        .arg(&script)
        .arg("--pairs")
        .arg(fixtures().join("pairs.jsonl"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run the reference script");
    assert!(status.success(), "{python} {}: {status}", script.display());
    compare(&pairs(), &out);

    let mut words = BTreeSet::new();
    for p in pairs() {
        for w in p.response.split_whitespace().chain(p.reference.split_whitespace()) {
            let w = w.trim_matches(|c: char| c.is_ascii_punctuation());
            if w.is_empty() || w.contains('\t') {
                continue;
            }
            for form in [w.to_string(), format!("{w}s"), format!("{w}ing"), format!("{w}ed"), format!("{w}ly")] {
                words.insert(form);
            }
        }
    }
    let text = python_stems(&python, &script, dir.path(), &words);
    let mut bad = Vec::new();
    let mut n = 0;
    for line in text.lines() {
        let Some((word, want)) = line.split_once('\t') else { continue };
        n += 1;
        let got = porter::stem(word);
        if got != want {
            bad.push(format!("{word:?}: ours {got:?} nltk {want:?}"));
        }
    }
    assert_eq!(n, words.len(), "one stem per word");
    assert!(bad.is_empty(), "{} stems differ:\n{}", bad.len(), bad.join("\n"));
}

/// With `SYNTH_EVAL_PYTHON` set: random texts full of the tokenizers' corner cases (entities,
/// digits around `.,-`, Python-only whitespace, case mappings to ASCII, newlines) and random
/// words for the stemmer, scored by the reference script. `SYNTH_EVAL_FUZZ` sets the number
/// of pairs (default 500).
#[test]
fn matches_live_python_on_random_text() {
    let Ok(python) = std::env::var("SYNTH_EVAL_PYTHON") else {
        eprintln!("SYNTH_EVAL_PYTHON not set: random comparison skipped");
        return;
    };
    let n: usize = std::env::var("SYNTH_EVAL_FUZZ").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let mut rng = SplitMix(0x5eed_b1e0);
    let pairs: Vec<Pair> = (0..n)
        .map(|i| {
            let reference = random_text(&mut rng);
            let response = if rng.below(4) == 0 { random_text(&mut rng) } else { mutate(&mut rng, &reference) };
            Pair { id: format!("fuzz-{i:05}"), response, reference }
        })
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let pairs_path = dir.path().join("pairs.jsonl");
    let lines: String = pairs
        .iter()
        .map(|p| serde_json::json!({"id": p.id, "response": p.response, "reference": p.reference}).to_string() + "\n")
        .collect();
    std::fs::write(&pairs_path, lines).expect("write pairs");
    let script = fixtures().join("reference_bleu_rouge.py");
    let out = dir.path().join("expected.jsonl");
    let status = Command::new(&python)
        .arg(&script)
        .arg("--pairs")
        .arg(&pairs_path)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run the reference script");
    assert!(status.success(), "{python} {}: {status}", script.display());
    compare(&pairs, &out);

    // Random words built from the suffixes the rules test.
    const SUFFIXES: &[&str] = &[
        "", "s", "ss", "sses", "ies", "ied", "eed", "ed", "ing", "at", "bl", "iz", "y", "ational", "tional", "enci",
        "anci", "izer", "bli", "alli", "entli", "eli", "ousli", "ization", "ation", "ator", "alism", "iveness",
        "fulness", "ousness", "aliti", "iviti", "biliti", "fulli", "logi", "icate", "ative", "alize", "iciti", "ical",
        "ful", "ness", "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "sion", "tion",
        "ou", "ism", "ate", "iti", "ous", "ive", "ize", "e", "ll", "lled", "lling", "yy",
    ];
    let mut words = BTreeSet::new();
    while words.len() < 20_000 {
        let len = rng.below(7);
        let mut w: String = (0..len).map(|_| pick(&mut rng, "bcdfghlmnprstvwxyzaeiouyyllss")).collect();
        w.push_str(SUFFIXES[rng.below(SUFFIXES.len())]);
        if rng.below(3) == 0 {
            w.push_str(SUFFIXES[rng.below(SUFFIXES.len())]);
        }
        if rng.below(20) == 0 {
            w = w.to_uppercase();
        }
        if !w.is_empty() {
            words.insert(w);
        }
    }
    let text = python_stems(&python, &script, dir.path(), &words);
    let bad: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(w, want)| porter::stem(w) != *want)
        .map(|(w, want)| format!("{w:?}: ours {:?} nltk {want:?}", porter::stem(w)))
        .collect();
    assert_eq!(text.lines().count(), words.len(), "one stem per word");
    assert!(bad.is_empty(), "{} stems differ:\n{}", bad.len(), bad.join("\n"));
}

/// splitmix64: a fixed, dependency-free random sequence.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn pick(rng: &mut SplitMix, chars: &str) -> char {
    let v: Vec<char> = chars.chars().collect();
    v[rng.below(v.len())]
}

const PIECES: &[&str] = &[
    "the",
    "The",
    "a",
    "cat",
    "cats",
    "sat",
    "on",
    "mat",
    "running",
    "runs",
    "generalization",
    "relational",
    "happily",
    "skies",
    "dying",
    "news",
    "agreed",
    "feed",
    "hopping",
    "controlled",
    "I",
    "you",
    "knight",
    "dragon",
    "castle",
    "said",
    "It's",
    "don't",
    "well-known",
    "3.14",
    "1,000",
    "2-3",
    "-5",
    "5.",
    ".5",
    "5,",
    ",5",
    "10-",
    "&amp;",
    "&quot;",
    "&lt;",
    "&gt;",
    "&amp;quot;",
    "&",
    "<skipped>",
    "-\n",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "(smiles)",
    "*nods*",
    "[pause]",
    "...",
    "!",
    "?",
    ",",
    ".",
    ";",
    ":",
    "'",
    "\"",
    "-",
    "--",
    "/",
    "\\",
    "@",
    "#",
    "$",
    "%",
    "^",
    "_",
    "`",
    "~",
    "{",
    "}",
    "|",
    "+",
    "=",
    "<",
    ">",
    "café",
    "naïve",
    "İstanbul",
    "\u{212A}elvin",
    "Straße",
    "ﬁne",
    "ΟΔΟΣ",
    "你好",
    "世界",
    "😀",
    "🎉",
    "\u{a0}",
    "\u{1c}",
    "\u{1f}",
    "\u{0c}",
    "\u{0b}",
    "\u{85}",
    "\u{2028}",
    "\u{3000}",
    "\u{200b}",
    "e\u{301}",
    "\t",
    "yyyy",
    "oed",
    "y",
    "Y",
    "ies",
    "ied",
    "sses",
];

fn random_text(rng: &mut SplitMix) -> String {
    let n = if rng.below(10) == 0 { 200 + rng.below(200) } else { rng.below(40) };
    let mut s = String::new();
    for _ in 0..n {
        s.push_str(PIECES[rng.below(PIECES.len())]);
        match rng.below(6) {
            0 => {}
            1 => s.push('\n'),
            _ => s.push(' '),
        }
    }
    s
}

/// `text` with random pieces dropped, replaced, inserted or re-cased.
fn mutate(rng: &mut SplitMix, text: &str) -> String {
    let mut out = String::new();
    for piece in text.split_inclusive(' ') {
        match rng.below(10) {
            0 => {}
            1 => out.push_str(PIECES[rng.below(PIECES.len())]),
            2 => {
                out.push_str(piece);
                out.push_str(PIECES[rng.below(PIECES.len())]);
                out.push(' ');
            }
            3 => out.push_str(&piece.to_uppercase()),
            _ => out.push_str(piece),
        }
    }
    out
}
