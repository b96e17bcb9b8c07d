//! The offline stand-in's answers to RoleEval's questions (shape `roleeval_mcq`): a
//! letter drawn from the prompt's seeded RNG, phrased in one of the ways chat models
//! answer (a bare letter, `答案：B`, a sentence, a refusal), so an offline run
//! exercises every branch of the extraction cascade deterministically.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use synth_llm::offline::{OfflineShape, ShapeInput};

pub static SHAPES: &[&OfflineShape] = &[&MCQ, &QUESTION];

pub static MCQ: OfflineShape = OfflineShape { name: super::parsers::SHAPE, generate: answer };

/// A drafted question (`roleeval_question`): a JSON object whose stem and options are built
/// from the prompt's words, with a seeded answer letter (the given one when the prompt holds
/// a question to rewrite, `"answer": "B"`).
pub static QUESTION: OfflineShape = OfflineShape { name: super::parsers::QUESTION_SHAPE, generate: question };

fn question(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let words = synth_llm::offline::content_words(input.prompt);
    let mut options: Vec<String> = Vec::new();
    while options.len() < 4 {
        let w = if words.is_empty() {
            format!("选项{}", options.len() + 1)
        } else {
            format!("{}{}", synth_llm::offline::pick_word(rng, &words), options.len() + 1)
        };
        options.push(w);
    }
    // Two of the prompt's phrases: stems of one character's slots differ as a model's would.
    let topic = if words.is_empty() {
        "这个角色".to_string()
    } else {
        let a = synth_llm::offline::pick_word(rng, &words);
        let b = synth_llm::offline::pick_word(rng, &words);
        if a == b { a } else { format!("{a}与{b}") }
    };
    // A rewrite of a question given as JSON in the prompt (a translation) keeps its letter.
    let given = input.prompt.split("\"answer\":").nth(1).and_then(|rest| {
        let letter = rest.trim_start().strip_prefix('"')?.chars().next()?;
        "ABCD".contains(letter).then(|| letter.to_string())
    });
    let drawn = ["A", "B", "C", "D"][rng.random_range(0..4usize)];
    let answer = given.as_deref().unwrap_or(drawn);
    serde_json::json!({
        "question": format!("关于{topic}，以下哪一项是正确的？"),
        "A": options[0], "B": options[1], "C": options[2], "D": options[3],
        "answer": answer,
    })
    .to_string()
}

fn answer(_input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let letter = ["A", "B", "C", "D"][rng.random_range(0..4usize)];
    match rng.random_range(0..10u32) {
        0..=3 => letter.to_string(),
        4..=5 => format!("答案：{letter}"),
        6 => format!("根据我的知识，正确答案是 {letter}。"),
        7 => format!("我认为应该选{letter}"),
        8 => format!("{letter}. 这是正确的选项"),
        _ => "我不确定。".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn answers_parse_and_are_deterministic() {
        let input = ShapeInput { prompt: "q", args: "", score_one: 0.5 };
        let parser = (super::super::parsers::MCQ.build)(&serde_json::Value::Null).unwrap();
        let mut nulls = 0;
        for seed in 0..200u64 {
            let a = answer(&input, &mut ChaCha8Rng::seed_from_u64(seed));
            assert_eq!(a, answer(&input, &mut ChaCha8Rng::seed_from_u64(seed)));
            let got = parser.parse(&a, &synth_core::data::Row::new()).unwrap();
            nulls += usize::from(got["pred"].is_null());
        }
        assert!(nulls > 0 && nulls < 50, "some refusals, mostly letters: {nulls}");
    }
}
