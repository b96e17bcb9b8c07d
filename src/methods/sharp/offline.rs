//! The offline stand-in's answers for SHARP's parsers (placeholders of the right shape,
//! deterministic for a prompt and seed):
//! - `sharp_stance`: a stance drawn from the prompt's seeded RNG, skewed by the claim (a
//!   claim carrying a counterfactual marker — "not", "only", "never", 不, 只 — draws AGAINST
//!   more often) so offline metrics are non-trivial, phrased as strict JSON, the template's
//!   single-quoted form, a loose line, or (rarely) a reply with no label, so every branch of
//!   the parser runs;
//! - `sharp_claim`: the prompt's `Claim:` line echoed (a paraphrase or rewrite that keeps the
//!   words), sometimes wrapped in a label and quotes; for a translation into the other
//!   script a marked placeholder (no translation happens offline);
//! - `sharp_relations`: three to five invented people with relations drawn from a small set.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use super::text::is_cjk;
use synth_llm::offline::{OfflineShape, ShapeInput};

pub static SHAPES: &[&OfflineShape] = &[&STANCE, &CLAIM, &RELATIONS];

pub static STANCE: OfflineShape = OfflineShape { name: super::parsers::SHAPE, generate: stance };
pub static CLAIM: OfflineShape = OfflineShape { name: super::parsers::CLAIM_SHAPE, generate: claim };
pub static RELATIONS: OfflineShape = OfflineShape { name: super::parsers::RELATIONS_SHAPE, generate: relations };

fn stance(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let target = input.prompt.lines().next().unwrap_or_default().to_lowercase();
    let counterfactual = [" not ", "cannot", " only ", "never", "only ", " all ", "不", "只", "没有", "总是"]
        .iter()
        .any(|m| target.contains(m));
    let draw = rng.random_range(0..100u32);
    let label = match (counterfactual, draw) {
        (true, 0..=54) | (false, 0..=14) => "AGAINST",
        (true, 55..=74) | (false, 15..=34) => "NEUTRAL",
        _ => "FAVOR",
    };
    let reason = "The character's reply shows this attitude.";
    match rng.random_range(0..20u32) {
        0..=9 => serde_json::json!({"Stance": label, "Reason": reason}).to_string(),
        10..=15 => format!("{{\n 'Stance': '{label}',\n 'Reason': '{reason}'\n}}"),
        16..=18 => format!("Stance: {label}\nReason: {reason}"),
        _ => "I am not sure what to answer.".into(),
    }
}

fn claim(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let text = input
        .prompt
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Claim:").or_else(|| l.trim().strip_prefix("Claim：")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .unwrap_or("Offline placeholder claim");
    let cjk = text.chars().any(|c| is_cjk(c) && c.is_alphabetic());
    let out = match input.args {
        // A stand-in translation in Chinese characters only (the stage's language check
        // reads it as a real translation would be read): eight characters drawn by the
        // claim's hash, so each claim has its own.
        "zh" if !cjk => {
            const HAN: &[char] =
                &['山', '水', '风', '云', '花', '鸟', '书', '茶', '火', '石', '林', '雨', '光', '海', '路', '门'];
            let hash = blake3::hash(text.as_bytes());
            let chars: String = hash.as_bytes()[..8].iter().map(|b| HAN[(*b as usize) % HAN.len()]).collect();
            format!("离线译文：{chars}")
        }
        "en" if cjk => format!("offline translation {}", &blake3::hash(text.as_bytes()).to_hex()[..8]),
        _ => text.to_string(),
    };
    match rng.random_range(0..4u32) {
        0 => format!("Claim: \"{out}\""),
        _ => out,
    }
}

fn relations(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    const NAMES: &[&str] =
        &["Avery", "Blake", "Casey", "Devon", "Emery", "Finley", "Harper", "Jordan", "Morgan", "Quinn"];
    const RELATIONS: &[(&str, i64)] =
        &[("friend", 7), ("sister", 8), ("mentor", 6), ("colleague", 0), ("rival", -5), ("enemy", -8)];
    let _ = input;
    let n = rng.random_range(3..=5usize);
    let start = rng.random_range(0..NAMES.len());
    let items: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let (relation, affection) = RELATIONS[rng.random_range(0..RELATIONS.len())];
            serde_json::json!({"role": NAMES[(start + i) % NAMES.len()], "relation": relation, "affection": affection})
        })
        .collect();
    serde_json::json!({ "relations": items }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn replies_parse_and_are_deterministic() {
        let mut bad = 0;
        for (i, prompt) in
            ["Analyze the stance toward wheat is not found in a field", "Analyze the stance toward assay is a test"]
                .iter()
                .enumerate()
        {
            let input = ShapeInput { prompt, args: "", score_one: 0.5 };
            let mut against = 0;
            for seed in 0..200u64 {
                let a = stance(&input, &mut ChaCha8Rng::seed_from_u64(seed));
                assert_eq!(a, stance(&input, &mut ChaCha8Rng::seed_from_u64(seed)));
                match super::super::parsers::parse_stance(&a) {
                    Ok((s, _)) => against += usize::from(s == super::super::metrics::Stance::Against),
                    Err(_) => bad += 1,
                }
            }
            assert!(if i == 0 { against > 80 } else { against < 60 }, "{prompt}: {against}");
        }
        assert!(bad > 0 && bad < 60, "a few unparseable replies: {bad}");
    }

    #[test]
    fn claims_and_relations_parse() {
        use super::super::parsers::{parse_claim, parse_relations};
        for seed in 0..20u64 {
            let rng = || ChaCha8Rng::seed_from_u64(seed);
            let same = ShapeInput { prompt: "Rewrite it.\nClaim: fire is cold", args: "en", score_one: 0.5 };
            assert_eq!(parse_claim(&claim(&same, &mut rng()), "en", 400).unwrap(), "fire is cold");
            let to_zh = ShapeInput { prompt: "Translate.\nClaim: fire is cold", args: "zh", score_one: 0.5 };
            assert!(parse_claim(&claim(&to_zh, &mut rng()), "zh", 400).is_ok());
            let to_en = ShapeInput { prompt: "Translate.\nClaim: 火是冷的", args: "en", score_one: 0.5 };
            assert!(parse_claim(&claim(&to_en, &mut rng()), "en", 400).is_ok());
            let r = relations(&same, &mut rng());
            assert!((3..=5).contains(&parse_relations(&r, Some("Harry"), 20).unwrap().len()), "{r}");
        }
    }
}
