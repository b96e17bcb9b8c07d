//! RoleMRC: the offline synthesis end to end, its parsers against fixtures, degenerate
//! preference pairs, the judge, the RoleBench cross-evaluation,
//! the neuron-level analysis, sharded runs.

mod e2e;
mod judge;
mod neurons;
mod pairs;
mod parsers;
mod rolebench;
mod shard;

use serde_json::Value;
use synth::llm::offline::Offline;
use synth::llm::{ChatRequest, GenParams, Message, Role};

/// The RoleMRC demo model behind the project's loopback OpenAI server, part 1: the
/// request's messages, and the answer shape its prompt asks for, told by the opening
/// words of its first message (`None`: not one of RoleMRC's synthesis prompts).
pub(crate) fn demo_request(body: &Value) -> (Vec<Message>, Option<&'static str>) {
    let messages: Vec<Message> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| Message::new(Role::parse(m["role"].as_str().unwrap()).unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let first = &messages[0].content;
    let expect = if first.starts_with("You are a prompt optimizer") {
        Some("profile")
    } else if first.contains("synthesize a 10 to 15 turns") {
        Some("dialogue")
    } else if first.starts_with("You are a master of answer editing") {
        Some("stylized")
    } else {
        None
    };
    (messages, expect)
}

/// Part 2: the offline generator's answer in that shape (seed 11, as the offline profile).
pub(crate) fn demo_answer(messages: Vec<Message>, expect: &str) -> String {
    let req =
        ChatRequest { messages, params: GenParams::default(), sample: 0, expect: expect.into(), structured: None };
    Offline { seed: 11, score_one: 0.5, shapes: synth::registry::builtin().shapes.clone() }
        .generate(&req, &GenParams::default())
}
