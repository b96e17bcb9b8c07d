//! The offline stand-in's answers for CharacterBench (not data): a role-play reply in the
//! official `{"response": ...}` form (bare JSON, fenced, a Python dict literal, or now
//! and then plain text, so every branch of `characterbench_response` runs), in the
//! prompt's language; and a judge score on the dimension's scale (read from the judge
//! prompt's rubric: the largest "N分" / "N point(s)"), mostly a bare number, sometimes a
//! number followed by a reason line, rarely an answer that is not a number (so the
//! official 3.0 fallback is exercised and counted).

use std::sync::LazyLock;

use rand::RngExt;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use regex::Regex;

use super::parsers::{DIALOGUE_SHAPE, JUDGE_SHAPE, RESPONSE_SHAPE};
use synth_llm::offline::{OfflineShape, ShapeInput};

pub static SHAPES: &[&OfflineShape] = &[&RESPONSE, &JUDGE, &DIALOGUE];

pub static RESPONSE: OfflineShape = OfflineShape { name: RESPONSE_SHAPE, generate: response };
pub static JUDGE: OfflineShape = OfflineShape { name: JUDGE_SHAPE, generate: judge };
pub static DIALOGUE: OfflineShape = OfflineShape { name: DIALOGUE_SHAPE, generate: dialogue };

const ZH_ASK: &[&str] =
    &["最近在忙什么呀？", "你平时喜欢做什么？", "还记得你上次说的事吗？", "今天心情怎么样？", "能讲讲你以前的经历吗？"];
const EN_ASK: &[&str] = &[
    "What have you been up to?",
    "What do you like to do?",
    "Remember what you told me last time?",
    "How are you feeling today?",
    "Can you tell me about your past?",
];

/// A context dialogue: 8 or 10 alternating turns, user first, the character last; no
/// line said twice (each speaker's lines are drawn without replacement), as the stage's
/// repetition check asks of a real model.
fn dialogue(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let zh = input.prompt.contains("请根据下面的角色设定");
    let (ask, reply) = if zh { (ZH_ASK, ZH) } else { (EN_ASK, EN) };
    let turns = if rng.random_range(0..2u32) == 0 { 8 } else { 10 };
    let mut order = |n: usize| {
        let mut o: Vec<usize> = (0..n).collect();
        o.shuffle(rng);
        o
    };
    let (asks, replies) = (order(ask.len()), order(reply.len()));
    let list: Vec<serde_json::Value> = (0..turns)
        .map(|i| {
            let (speaker, line) =
                if i % 2 == 0 { ("user", ask[asks[i / 2]]) } else { ("character", reply[replies[i / 2]]) };
            serde_json::json!({"speaker": speaker, "utterance": line})
        })
        .collect();
    serde_json::json!({ "dialogue": list }).to_string()
}

const ZH: &[&str] = &[
    "（笑）这个嘛，你猜猜看。",
    "我记得很清楚，就是那天的事。",
    "（皱眉）别这么说，我会生气的。",
    "好啊，我们一起去吧！",
    "（叹气）唉，说来话长。",
];
const EN: &[&str] = &[
    "(smiles) Guess for yourself.",
    "I remember that day well.",
    "(frowns) Don't say that.",
    "Sure, let's go together!",
    "(sighs) It's a long story.",
];

fn response(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let zh = input.prompt.contains("现在需要你来扮演");
    let pool = if zh { ZH } else { EN };
    let reply = pool[rng.random_range(0..pool.len())];
    let json = serde_json::json!({ "response": reply }).to_string();
    match rng.random_range(0..20u32) {
        0..=11 => json,
        12..=16 => format!("```json\n{json}\n```"),
        17..=18 => format!("{{'response': '{reply}'}}"),
        _ => reply.to_string(),
    }
}

static ZH_POINTS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(\d)\s*分").expect("regex"));
static EN_POINTS: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)(\d)\s*points?\b").expect("regex"));

/// The largest score a judge prompt's rubric names (4 when it names none).
pub fn scale_max(prompt: &str) -> u32 {
    ZH_POINTS
        .captures_iter(prompt)
        .chain(EN_POINTS.captures_iter(prompt))
        .filter_map(|c| c[1].parse::<u32>().ok())
        .filter(|n| (1..=9).contains(n))
        .max()
        .unwrap_or(4)
}

fn judge(input: &ShapeInput<'_>, rng: &mut ChaCha8Rng) -> String {
    let max = scale_max(input.prompt).max(2);
    let score = rng.random_range(1..=max);
    match rng.random_range(0..40u32) {
        0..=33 => score.to_string(),
        34..=38 => format!("{score}\nThe reply fits the rubric's level {score}."),
        _ => format!("评分：{score}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn judge_scores_stay_on_the_scale() {
        let zh = "(1) 1分：...\n(2) 2分：...\n(3) 3分：...";
        let en = "1 point: ...\n5 points: ...";
        assert_eq!(scale_max(zh), 3);
        assert_eq!(scale_max(en), 5);
        let (mut fallback, mut lines) = (0, 0);
        for seed in 0..400u64 {
            let a = judge(&ShapeInput { prompt: zh, args: "", score_one: 0.5 }, &mut ChaCha8Rng::seed_from_u64(seed));
            match synth_llm::parse::python_float(a.split('\n').next().unwrap()) {
                Some(v) => assert!((1.0..=3.0).contains(&v), "{a}"),
                None => fallback += 1,
            }
            lines += usize::from(a.contains('\n'));
        }
        assert!(fallback > 0 && fallback < 40, "{fallback}");
        assert!(lines > 0);
    }

    #[test]
    fn replies_parse() {
        let parser = (super::super::parsers::RESPONSE.build)(&serde_json::Value::Null).unwrap();
        let mut plain = 0;
        for seed in 0..200u64 {
            let a = response(
                &ShapeInput { prompt: "现在需要你来扮演角色", args: "", score_one: 0.5 },
                &mut ChaCha8Rng::seed_from_u64(seed),
            );
            let r = parser.parse(&a, &Default::default()).unwrap();
            assert!(ZH.contains(&r["reply"].as_str().unwrap()), "{a}");
            plain += usize::from(r["reply_fallback"] == true);
        }
        assert!(plain > 0 && plain < 30, "{plain}");
    }
}
