//! The official prompts, rendered byte for byte: the role-play prompt (`process.py`:
//! `Role_Play_PROMPT_{ZH,EN}.format(character_profile, user_profile, dialogue)` with the
//! session as `role: content` lines) and the per-dimension judge prompt
//! (`process_wo_context_{zh,en}_all.py`: `base_eval_prompt.format(...)` with the
//! character's reply as `<name>：<response>`). Templates are data
//! (`pipelines/prompts/characterbench/`), rendered with Python's `str.format` semantics.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::bench::{Bench, Dimension};
use synth_core::data::python;

/// The role-play prompt of a normalized session.
pub fn roleplay(
    bench: &Bench,
    lang: &str,
    character_profile: &str,
    user_profile: &str,
    messages: &[(String, String)],
) -> Result<String, String> {
    let language = bench.languages.get(lang).ok_or_else(|| format!("unknown language \"{lang}\""))?;
    let dialogue = messages.iter().map(|(r, c)| format!("{r}: {c}")).collect::<Vec<_>>().join("\n");
    let mut fields = Map::new();
    fields.insert("character_profile".into(), Value::from(character_profile));
    fields.insert("user_profile".into(), Value::from(user_profile));
    fields.insert("dialogue".into(), Value::from(dialogue));
    python::format(bench.template(&language.roleplay), &fields)
}

/// What the judge prompt of one item is built from.
pub struct JudgeInput<'a> {
    pub profile: &'a str,
    pub dialogue: &'a str,
    pub user_query: &'a str,
    pub speaker: &'a str,
    /// The character's reply as it goes into `<name>：<reply>`.
    pub response: &'a str,
    pub target_slot: Option<&'a str>,
    pub target: Option<&'a str>,
}

/// The judge prompt of a dimension in a language; `template` overrides the dimension's
/// (e.g. an approximate-baseline variant).
pub fn judge(bench: &Bench, dim: &Dimension, lang: &str, input: &JudgeInput<'_>) -> Result<String, String> {
    let rel = dim.judge.get(lang).ok_or_else(|| format!("{} has no judge template for \"{lang}\"", dim.id))?;
    judge_with(bench.template(rel), input)
}

/// The judge prompt of a release item with `response` as the character's reply.
pub fn judge_item(bench: &Bench, item: &super::release::Item, response: &str) -> Result<String, String> {
    let dim = bench.dimension(&item.dimension).ok_or_else(|| format!("unknown dimension \"{}\"", item.dimension))?;
    judge(
        bench,
        dim,
        &item.lang,
        &JudgeInput {
            profile: &item.judge_profile,
            dialogue: &item.judge_dialogue,
            user_query: &item.user_query,
            speaker: &item.speaker,
            response,
            target_slot: item.target_slot.as_deref(),
            target: item.target.as_deref(),
        },
    )
}

/// A judge prompt from a given template text.
pub fn judge_with(template: &str, input: &JudgeInput<'_>) -> Result<String, String> {
    let mut fields = Map::new();
    fields.insert("character_profile".into(), Value::from(input.profile));
    fields.insert("dialogue".into(), Value::from(input.dialogue));
    fields.insert("user_query".into(), Value::from(input.user_query));
    fields.insert("character_response".into(), Value::from(format!("{}：{}", input.speaker, input.response)));
    if let (Some(slot), Some(target)) = (input.target_slot, input.target) {
        fields.insert(slot.into(), Value::from(target));
    }
    python::format(template, &fields)
}

/// Hex SHA-256 of a prompt's UTF-8 bytes (the spec's reference renderings are SHA-256).
pub fn sha256(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
