//! A synthetic ConceptNet assertions dump in the official 5-column layout (assertion URI,
//! relation, start, end, JSON), gzip, for the `sharp_claims` benchmark (BENCHMARKS.md,
//! `benches/sharp_claims.sh`). Deterministic for a seed. Shaped after the 5.7 dump
//! (34,074,917 lines, ~300 bytes a line): ~10% English–English edges (RelatedTo, Synonym,
//! FormOf, ... and the 17 commonsense relations, half of those with an OMCS surface text),
//! ~25% ExternalURL, the rest other languages and cross-language edges; a few repeated
//! assertions. Written in blocks compressed on every core as concatenated gzip members
//! (what `MultiGzDecoder`, Python's gzip and pandas read as one stream).
//!
//!   cargo bench --bench conceptnet_dump -- --lines 34074917 --out /tmp/cn/assertions.csv.gz

use std::io::Write;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const LANGS: &[&str] = &["fr", "ja", "de", "es", "it", "ru", "zh", "pt", "nl", "fi", "la", "sv", "pl", "ms", "ar"];
const WHITELIST: &[(&str, &str)] = &[
    ("IsA", "[[{s}]] is a type of [[{e}]]"),
    ("UsedFor", "[[{s}]] is used for [[{e}]]"),
    ("AtLocation", "You are likely to find [[{s}]] in [[{e}]]"),
    ("CapableOf", "[[{s}]] can [[{e}]]"),
    ("HasProperty", "[[{s}]] is [[{e}]]"),
    ("PartOf", "[[{s}]] is part of [[{e}]]"),
    ("HasA", "[[{s}]] has [[{e}]]"),
    ("Causes", "Sometimes [[{s}]] causes [[{e}]]"),
    ("Desires", "[[{s}]] wants [[{e}]]"),
    ("MadeOf", "[[{s}]] is made of [[{e}]]"),
    ("HasSubevent", "Something that might happen while [[{s}]] is [[{e}]]"),
    ("HasPrerequisite", "If you want to [[{s}]] then you should [[{e}]]"),
    ("ReceivesAction", "[[{s}]] can be [[{e}]]"),
    ("CreatedBy", "[[{s}]] is created by [[{e}]]"),
    ("MotivatedByGoal", "You would [[{s}]] because you want to [[{e}]]"),
    ("CausesDesire", "[[{s}]] would make you want to [[{e}]]"),
    ("LocatedNear", "[[{s}]] is typically near [[{e}]]"),
];
const OTHER: &[&str] =
    &["RelatedTo", "Synonym", "FormOf", "DerivedFrom", "EtymologicallyRelatedTo", "HasContext", "Antonym", "SimilarTo"];
const SYLLABLES: &[&str] =
    &["ba", "ko", "ri", "ten", "ma", "lu", "sol", "ver", "qui", "dan", "pe", "ro", "ly", "nix", "ta", "gor"];

fn word(rng: &mut ChaCha8Rng) -> String {
    let n = rng.random_range(1..=3);
    (0..n).map(|_| SYLLABLES[rng.random_range(0..SYLLABLES.len())]).collect()
}

fn term(rng: &mut ChaCha8Rng) -> String {
    if rng.random_range(0..4) == 0 { format!("{}_{}", word(rng), word(rng)) } else { word(rng) }
}

fn weight(rng: &mut ChaCha8Rng) -> &'static str {
    match rng.random_range(0..20) {
        0 => "0.5",
        1..=3 => "2.0",
        4 => "2.828",
        5 => "3.464",
        _ => "1.0",
    }
}

/// One line (with its newline).
fn line(rng: &mut ChaCha8Rng, out: &mut String) {
    use std::fmt::Write as _;
    let kind = rng.random_range(0..100);
    let (s, e) = (term(rng), term(rng));
    let w = weight(rng);
    if kind < 10 {
        // English–English.
        if rng.random_range(0..100) < 45 {
            let (rel, surface) = WHITELIST[rng.random_range(0..WHITELIST.len())];
            let (ss, es) = (s.replace('_', " "), e.replace('_', " "));
            let info = if rng.random_range(0..2) == 0 {
                let text = surface.replace("{s}", &ss).replace("{e}", &es);
                format!(
                    "{{\"dataset\": \"/d/conceptnet/4/en\", \"license\": \"cc:by/4.0\", \"sources\": [{{\"activity\": \"/s/activity/omcs/omcs1_possibly_free_text\", \"contributor\": \"/s/contributor/omcs/u{}\"}}], \"surfaceEnd\": \"{es}\", \"surfaceStart\": \"{ss}\", \"surfaceText\": \"{text}\", \"weight\": {w}}}",
                    rng.random_range(0..100_000)
                )
            } else {
                format!(
                    "{{\"dataset\": \"/d/verbosity\", \"license\": \"cc:by/4.0\", \"sources\": [{{\"contributor\": \"/s/resource/verbosity\"}}], \"weight\": {w}}}"
                )
            };
            let _ = writeln!(out, "/a/[/r/{rel}/,/c/en/{s}/,/c/en/{e}/]\t/r/{rel}\t/c/en/{s}\t/c/en/{e}\t{info}");
        } else {
            let rel = OTHER[rng.random_range(0..OTHER.len())];
            let _ = writeln!(
                out,
                "/a/[/r/{rel}/,/c/en/{s}/n/,/c/en/{e}/]\t/r/{rel}\t/c/en/{s}/n\t/c/en/{e}\t{{\"dataset\": \"/d/wiktionary/en\", \"license\": \"cc:by-sa/4.0\", \"sources\": [{{\"contributor\": \"/s/resource/wiktionary/en\", \"process\": \"/s/process/wikiparsec/2\"}}], \"weight\": {w}}}"
            );
        }
    } else if kind < 35 {
        let lang = if rng.random_range(0..3) == 0 { "en" } else { LANGS[rng.random_range(0..LANGS.len())] };
        let _ = writeln!(
            out,
            "/a/[/r/ExternalURL/,/c/{lang}/{s}/,http://{lang}.dbpedia.org/resource/{e}/]\t/r/ExternalURL\t/c/{lang}/{s}\thttp://{lang}.dbpedia.org/resource/{e}\t{{\"dataset\": \"/d/dbpedia/en\", \"license\": \"cc:by-sa/4.0\", \"sources\": [{{\"contributor\": \"/s/resource/dbpedia/2015/en\"}}], \"weight\": 0.5}}"
        );
    } else {
        let la = LANGS[rng.random_range(0..LANGS.len())];
        let lb = if rng.random_range(0..3) == 0 { "en" } else { la };
        let rel = if rng.random_range(0..5) == 0 {
            WHITELIST[rng.random_range(0..WHITELIST.len())].0
        } else {
            OTHER[rng.random_range(0..OTHER.len())]
        };
        let _ = writeln!(
            out,
            "/a/[/r/{rel}/,/c/{la}/{s}/,/c/{lb}/{e}/]\t/r/{rel}\t/c/{la}/{s}\t/c/{lb}/{e}\t{{\"dataset\": \"/d/wiktionary/{la}\", \"license\": \"cc:by-sa/4.0\", \"sources\": [{{\"contributor\": \"/s/resource/wiktionary/{la}\", \"process\": \"/s/process/wikiparsec/2\"}}], \"weight\": {w}}}"
        );
    }
}

fn main() {
    let mut lines: u64 = 34_074_917;
    let mut out = String::from("assertions.csv.gz");
    let mut seed: u64 = 57;
    let mut level: u32 = 6;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--lines" => lines = args.next().and_then(|v| v.parse().ok()).expect("--lines N"),
            "--out" => out = args.next().expect("--out PATH"),
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).expect("--seed N"),
            "--level" => level = args.next().and_then(|v| v.parse().ok()).expect("--level 0-9"),
            "--bench" => {}
            other => panic!("unknown argument {other} (--lines N --out PATH --seed N --level L)"),
        }
    }
    const BLOCK: u64 = 200_000;
    let blocks = lines.div_ceil(BLOCK);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).max(1);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&out).expect("create the output"));
    let started = std::time::Instant::now();
    let mut bytes = 0u64;
    let mut next = 0u64;
    while next < blocks {
        let batch: Vec<u64> = (next..blocks.min(next + threads as u64)).collect();
        let compressed: Vec<(Vec<u8>, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&b| {
                    s.spawn(move || {
                        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                        let n = BLOCK.min(lines - b * BLOCK);
                        let mut text = String::with_capacity(n as usize * 320);
                        for i in 0..n {
                            // A few assertions repeat (another contributor of the same edge).
                            if i % 5000 == 4999 && !text.is_empty() {
                                let start = text[..text.len() - 1].rfind('\n').map_or(0, |p| p + 1);
                                let last = text[start..].to_string();
                                text.push_str(&last);
                                continue;
                            }
                            line(&mut rng, &mut text);
                        }
                        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                        enc.write_all(text.as_bytes()).expect("compress");
                        (enc.finish().expect("compress"), text.len() as u64)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a generator thread")).collect()
        });
        for (gz, raw) in compressed {
            file.write_all(&gz).expect("write");
            bytes += raw;
        }
        next += batch.len() as u64;
    }
    file.flush().expect("flush");
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "{{\"lines\": {lines}, \"bytes\": {bytes}, \"gzip_bytes\": {size}, \"seconds\": {:.1}, \"path\": {out:?}}}",
        started.elapsed().as_secs_f64()
    );
}
