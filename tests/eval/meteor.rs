//! Parity of `synth::eval::meteor` (and its WordNet reader) with NLTK 3.10.4's METEOR as HF
//! `evaluate` calls it, on `tests/fixtures/eval/pairs.jsonl`: scores and both sides' tokens
//! against the stored `meteor.expected.jsonl`, Punkt with hand-made parameters against the
//! stored tokenizer cases, and, when `SYNTH_EVAL_PYTHON` names a Python with nltk, against a
//! fresh run of `reference_meteor.py` (on `$SYNTH_METEOR_PAIRS` instead of the fixture when
//! that names another pairs file, whose texts are then also Punkt cases).
//!
//! `SYNTH_PUNKT_DIR` (a `punkt_tab` language directory such as nltk_data's
//! `tokenizers/punkt_tab/english`) makes the live comparison split sentences with that
//! trained model on both sides.
//!
//! METEOR needs WordNet 3.0 (Debian's `wordnet-base`, read from `/usr/share/wordnet` or
//! `$SYNTH_WORDNET_DIR`); without it the WordNet-dependent tests print why and pass.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use support::eval_fixtures::{Pair, fixtures, pairs, pairs_from, read_jsonl};
use synth::eval::meteor::{self, PunktParams};
use synth::eval::wordnet::WordNet;

use crate::support;

const TOLERANCE: f64 = 1e-6;

fn wordnet_dir() -> PathBuf {
    std::env::var_os("SYNTH_WORDNET_DIR").map_or_else(|| PathBuf::from("/usr/share/wordnet"), PathBuf::from)
}

/// WordNet, or `None` (after saying why) when it is not installed.
fn wordnet() -> Option<WordNet> {
    let t = Instant::now();
    match WordNet::load(wordnet_dir()) {
        Ok(wn) => {
            eprintln!("WordNet loaded from {} in {:?}", wn.dir().display(), t.elapsed());
            Some(wn)
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().expect("token list").iter().map(|t| t.as_str().expect("token").to_string()).collect()
}

/// `$SYNTH_METEOR_PAIRS` (a JSONL file of `{"id", "response", "reference"}`, for checking
/// more text against live NLTK) or the fixture.
fn live_pairs_path() -> PathBuf {
    std::env::var_os("SYNTH_METEOR_PAIRS").map_or_else(|| fixtures().join("pairs.jsonl"), PathBuf::from)
}

/// Compares every pair's tokens and score with `expected`; returns the largest absolute
/// score difference.
fn compare(pairs: &[Pair], expected_path: &Path, wn: &WordNet, punkt: &PunktParams) -> f64 {
    let expected: Vec<Value> = read_jsonl(expected_path).into_iter().filter(|v| v.get("meteor").is_some()).collect();
    assert_eq!(pairs.len(), expected.len(), "{}: one line per pair", expected_path.display());
    let mut max_diff = 0.0f64;
    let mut inside = 0usize;
    let mut failures = Vec::new();
    let t = Instant::now();
    for (p, e) in pairs.iter().zip(&expected) {
        assert_eq!(e["id"].as_str(), Some(p.id.as_str()), "{}: ids in fixture order", expected_path.display());
        for (side, text) in [("response", &p.response), ("reference", &p.reference)] {
            let want = strings(&e[format!("{side}_tokens")]);
            let got = meteor::word_tokenize_with(text, punkt);
            if got != want {
                failures.push(format!("{} {side} tokens:\n  ours   {got:?}\n  python {want:?}", p.id));
            }
        }
        let want = e["meteor"].as_f64().unwrap_or_else(|| panic!("{}: meteor of {}", expected_path.display(), p.id));
        let got = meteor::meteor_with_punkt(&p.response, &p.reference, wn, punkt);
        let d = (got - want).abs();
        inside += usize::from(want > 0.0 && want < 1.0);
        max_diff = max_diff.max(d);
        if d > TOLERANCE {
            failures.push(format!("{} meteor: ours {got:.12} python {want:.12}", p.id));
        }
    }
    eprintln!(
        "{}: meteor: max |ours - python| {max_diff:e} over {} pairs ({inside} scores inside (0, 1)), scored in {:?}",
        expected_path.display(),
        pairs.len(),
        t.elapsed()
    );
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    max_diff
}

/// The hand-made Punkt parameters and the tokenizer cases of an expected file.
fn punkt_cases(expected_path: &Path) -> (PunktParams, Vec<(String, String, Vec<String>)>) {
    let mut params = None;
    let mut cases = Vec::new();
    for v in read_jsonl(expected_path) {
        let id = v["id"].as_str().unwrap_or_default();
        if id == "punkt-params" {
            let p = &v["params"];
            let set = |k: &str| strings(&p[k]).into_iter().collect();
            params = Some(PunktParams {
                abbrev_types: set("abbrev_types"),
                sent_starters: set("sent_starters"),
                collocations: p["collocations"]
                    .as_array()
                    .expect("collocations")
                    .iter()
                    .map(|c| {
                        let c = strings(c);
                        (c[0].clone(), c[1].clone())
                    })
                    .collect(),
                ortho_context: p["ortho_context"]
                    .as_object()
                    .expect("ortho_context")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().expect("flags") as u32))
                    .collect(),
            });
        } else if id.starts_with("punkt-") {
            cases.push((id.to_string(), v["text"].as_str().expect("text").to_string(), strings(&v["tokens"])));
        }
    }
    (params.expect("a punkt-params line"), cases)
}

fn compare_punkt(expected_path: &Path) {
    let (params, cases) = punkt_cases(expected_path);
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for (id, text, want) in &cases {
        let got = meteor::word_tokenize_with(text, &params);
        if &got != want {
            failures.push(format!("{id} {text:?}:\n  ours   {got:?}\n  python {want:?}"));
        }
    }
    eprintln!("{}: {} Punkt cases with hand-made parameters", expected_path.display(), cases.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn meteor_matches_nltk() {
    let Some(wn) = wordnet() else { return };
    compare(&pairs(), &fixtures().join("meteor.expected.jsonl"), &wn, &PunktParams::default());
}

#[test]
fn punkt_with_parameters_matches_nltk() {
    compare_punkt(&fixtures().join("meteor.expected.jsonl"));
}

#[test]
fn punkt_params_load_nltk_format() {
    // the hand-made parameters written as NLTK's save_punkt_params writes a punkt_tab
    // language directory (tab-separated, no newline after the last line)
    let (params, cases) = punkt_cases(&fixtures().join("meteor.expected.jsonl"));
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, lines: Vec<String>| std::fs::write(dir.path().join(name), lines.join("\n")).unwrap();
    write("abbrev_types.txt", params.abbrev_types.iter().cloned().collect());
    write("sent_starters.txt", params.sent_starters.iter().cloned().collect());
    write("collocations.tab", params.collocations.iter().map(|(a, b)| format!("{a}\t{b}")).collect());
    write("ortho_context.tab", params.ortho_context.iter().map(|(t, f)| format!("{t}\t{f}")).collect());
    let loaded = PunktParams::load(dir.path()).unwrap();
    assert_eq!(loaded.abbrev_types, params.abbrev_types);
    assert_eq!(loaded.sent_starters, params.sent_starters);
    assert_eq!(loaded.collocations, params.collocations);
    assert_eq!(loaded.ortho_context, params.ortho_context);
    for (id, text, want) in &cases {
        assert_eq!(&meteor::word_tokenize_with(text, &loaded), want, "{id}");
    }
    std::fs::remove_file(dir.path().join("ortho_context.tab")).unwrap();
    let err = PunktParams::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("ortho_context.tab"), "{err}");
}

#[test]
fn meteor_matches_live_nltk() {
    let Some(python) = std::env::var_os("SYNTH_EVAL_PYTHON") else {
        eprintln!("skipping: SYNTH_EVAL_PYTHON is not set");
        return;
    };
    let Some(wn) = wordnet() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("meteor.expected.jsonl");
    let mut cmd = Command::new(&python);
    cmd.arg(fixtures().join("reference_meteor.py"))
        .arg("--pairs")
        .arg(live_pairs_path())
        .arg("--out")
        .arg(&out)
        .arg("--wordnet")
        .arg(wordnet_dir())
        .current_dir(dir.path());
    if std::env::var_os("SYNTH_METEOR_PAIRS").is_some() {
        // their texts also go through Punkt with the hand-made parameters
        cmd.arg("--punkt-pairs").arg(live_pairs_path());
    }
    // a trained Punkt model (e.g. nltk_data's punkt_tab/english) on both sides
    let punkt = match std::env::var_os("SYNTH_PUNKT_DIR") {
        Some(dir) => {
            cmd.arg("--punkt-dir").arg(&dir);
            PunktParams::load(&dir).expect("load SYNTH_PUNKT_DIR")
        }
        None => PunktParams::default(),
    };
    let status = cmd.status().expect("run SYNTH_EVAL_PYTHON");
    assert!(status.success(), "reference_meteor.py failed");
    compare(&pairs_from(&live_pairs_path()), &out, &wn, &punkt);
    compare_punkt(&out);
}

#[test]
fn nltk_docstring_examples() {
    let Some(wn) = wordnet() else { return };
    let hyp = "It is a guide to action which ensures that the military always obeys the commands of the party";
    let reference = "It is a guide to action that ensures that the military will forever heed Party commands";
    assert_eq!(format!("{:.4}", meteor::meteor(hyp, reference, &wn)), "0.6944");
    assert_eq!(meteor::single_meteor_score(&["this", "is", "a", "cat"], &["non", "matching", "hypothesis"], &wn), 0.0);
    // no token on either side: NLTK's ZeroDivisionError is a score of 0
    assert_eq!(meteor::meteor("", "a cat", &wn), 0.0);
    assert_eq!(meteor::meteor("a cat", " \n", &wn), 0.0);
    assert_eq!(meteor::meteor("", "", &wn), 0.0);
}

#[test]
fn wordnet_lookups() {
    let Some(wn) = wordnet() else { return };
    use synth::eval::wordnet::Pos;
    // NLTK: wn.morphy('dogs') == 'dog', 'churches' -> 'church', 'aardwolves' -> 'aardwolf',
    // 'abaci' -> 'abacus' (exception list), morphy('book', ADJ) is None
    assert_eq!(wn.morphy("dogs", Pos::Noun), ["dog"]);
    assert_eq!(wn.morphy("churches", Pos::Noun), ["church"]);
    assert_eq!(wn.morphy("aardwolves", Pos::Noun), ["aardwolf"]);
    assert_eq!(wn.morphy("abaci", Pos::Noun), ["abacus"]);
    assert!(wn.morphy("book", Pos::Adj).is_empty());
    // wn.synsets('dogs'): dog.n.01 frump.n.01 dog.n.03 cad.n.01 frank.n.02 pawl.n.01
    // andiron.n.01 chase.v.01
    assert_eq!(wn.synsets("dogs").len(), 8);
    // sorted(set(lemma names without "_" of wn.synsets("dogs")))
    let syns: Vec<String> = wn.synonyms("dogs").into_iter().collect();
    let want = "andiron blackguard bounder cad chase click detent dog dog-iron firedog frank frankfurter frump heel \
                hotdog hound pawl tag tail track trail weenie wiener wienerwurst";
    assert_eq!(syns, want.split_whitespace().collect::<Vec<_>>());
    // adjective markers are stripped: "galore(ip)"
    let syns: Vec<String> = wn.synonyms("abounding").into_iter().collect();
    assert_eq!(syns, ["abound", "abounding", "bristle", "burst", "galore"]);
}

#[test]
fn missing_wordnet_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = WordNet::load(dir.path()).err().expect("an error").to_string();
    assert!(
        err.starts_with(&format!(
            "WordNet not found at {} (data.noun missing): install Debian's wordnet-base",
            dir.path().display()
        )),
        "{err}"
    );
    std::fs::write(dir.path().join("data.noun"), "").unwrap();
    let err = WordNet::load(dir.path()).err().expect("an error").to_string();
    assert!(err.contains("(data.verb missing)"), "{err}");
}

#[test]
fn tokenizer_examples() {
    // NLTK's NLTKWordTokenizer docstring
    let s = "Good muffins cost $3.88\nin New York.  Please buy me\ntwo of them.\nThanks.";
    assert_eq!(
        meteor::treebank_tokenize(s),
        [
            "Good", "muffins", "cost", "$", "3.88", "in", "New", "York.", "Please", "buy", "me", "two", "of", "them.",
            "Thanks", "."
        ]
    );
    assert_eq!(
        meteor::treebank_tokenize("They'll save and invest more."),
        ["They", "'ll", "save", "and", "invest", "more", "."]
    );
    assert_eq!(meteor::treebank_tokenize("I cannot 'quote' this"), ["I", "can", "not", "'", "quote", "'", "this"]);
    let p = PunktParams::default();
    assert_eq!(meteor::sent_tokenize("Hello world. How are you? Fine.", &p), ["Hello world.", "How are you?", "Fine."]);
    assert_eq!(meteor::word_tokenize("Hello world. How are you?"), ["Hello", "world", ".", "How", "are", "you", "?"]);
    assert!(meteor::word_tokenize("  \n ").is_empty());
    assert_eq!(meteor::word_tokenize("Wait . . . what"), ["Wait", ".", ".", ".", "what"]);
}
