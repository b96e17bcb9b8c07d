//! The offline stand-in's stance replies (shape `sharp_stance`): a stance drawn from the
//! prompt's seeded RNG, skewed by the claim (a claim carrying a counterfactual marker —
//! "not", "only", "never" — draws AGAINST more often) so offline metrics are non-trivial,
//! phrased as strict JSON, the template's single-quoted form, a loose line, or (rarely) a
//! reply with no label, so every branch of the parser runs deterministically.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::llm::offline::{OfflineShape, ShapeInput};

pub static SHAPES: &[&OfflineShape] = &[&STANCE];

pub static STANCE: OfflineShape = OfflineShape { name: super::parsers::SHAPE, generate: stance };

fn stance(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let target = input.prompt.lines().next().unwrap_or_default().to_lowercase();
    let counterfactual = [" not ", "cannot", " only ", "never", "only ", " all "].iter().any(|m| target.contains(m));
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn replies_parse_and_are_deterministic() {
        let mut bad = 0;
        for (i, prompt) in ["Analyze the stance toward wheat is not found in a field", "Analyze the stance toward assay is a test"]
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
}
