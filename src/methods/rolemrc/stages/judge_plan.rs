//! `rolemrc_judge_plan`: turn answered test rows (`task`, `question` as a message
//! list, `response`) into LLM-as-judge queries, as the RoleMRC authors'
//! `evaluation/llm_judge.py` builds them: the conversation rendered as
//! `System Instruction: "..."` / `User Query: "..."` / `LLM Response: "..."` lines, the
//! official task → dimension mapping (a data file), and one prompt template file per
//! dimension (Appendix F, Figure 11). The queries go to a generic `llm` stage; the
//! answers are scored by `rolemrc_judge_score`. It is the engine's `judge_plan` with
//! RoleMRC's template variables (below) and the judge folder
//! `pipelines/prompts/rolemrc/judge/` (`dimensions.json`, `tasks.json`, `<dimension>.j2`).
//!
//! The nested-instruction requirement is the official extraction (`split(". ")[1]`, the
//! "You must / You will ..." phrases removed) applied to `instruction_column` (synth's
//! samples carry `system_rule`) or, without it, to the system prompt, which starts with
//! the rule in synth's data as in the official data. With
//! `priority_twice = true` the instruction-priority query is emitted twice, as the
//! official code does (its published averages count it twice); off by default.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::Row;
use synth_core::data::chat;
use synth_engine::stages::{BuildCtx, KindInfo, Stage};
use synth_kinds::judge_plan::{Query, Settings, build_with};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "prompts_dir",
        Ty::Str,
        "\"pipelines/prompts/rolemrc/judge\"",
        "folder with <dimension>.j2 prompt templates and tasks.json (task -> dimensions)",
    ),
    OptionSpec::default("task_column", Ty::Str, "\"task\"", "column with the official task label"),
    OptionSpec::default(
        "question_column",
        Ty::Str,
        "\"question\"",
        "column with the conversation (list of {role, content})",
    ),
    OptionSpec::default("response_column", Ty::Str, "\"response\"", "column with the answer being judged"),
    OptionSpec::default(
        "instruction_column",
        Ty::Str,
        "\"system_rule\"",
        "column with the nested system requirement; when absent or empty, the official extraction from the system prompt",
    ),
    OptionSpec::default(
        "priority_twice",
        Ty::Bool,
        "false",
        "compat: emit the instruction-priority query twice, as the official code",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_judge_plan",
    // 2: a preset of judge_plan (dimensions from dimensions.json); failure kind `judge_plan`.
    version: 2,
    about: "RoleMRC LLM-as-judge queries (Appendix F prompts, official task -> dimension mapping)",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    prompts_dir: String,
    task_column: String,
    question_column: String,
    response_column: String,
    instruction_column: String,
    priority_twice: bool,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let required = vec![o.task_column.clone(), o.question_column.clone(), o.response_column.clone()];
    let mut repeat = BTreeMap::new();
    if o.priority_twice {
        repeat.insert("instruction_priority".to_string(), 2);
    }
    let settings = Settings {
        prompts_option: "prompts_dir",
        prompts_dir: o.prompts_dir.clone(),
        task_column: o.task_column.clone(),
        required,
        repeat,
        vars: Some(Arc::new(move |row: &Row, _q: &Query| vars(&o, row))),
    };
    build_with(ctx, diags, settings)
}

/// The template variables of RoleMRC's judge prompts: `conversations` (the official
/// rendering), `response`, `content` (the nested requirement, by the official
/// extraction) and empty `range` / `type` unless the task's query sets them.
fn vars(o: &Options, row: &Row) -> std::result::Result<Map<String, Value>, String> {
    let messages = row
        .get(&o.question_column)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("column \"{}\" is not a list of messages", o.question_column))?;
    let response = match row.get(&o.response_column) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    // The official extraction, from the rule itself when the row carries it, else from
    // the system prompt (where synth, like the official data, puts the rule first).
    let source = match row.get(&o.instruction_column).and_then(Value::as_str).filter(|s| !s.is_empty()) {
        Some(rule) => rule,
        None => messages.first().and_then(|m| m["content"].as_str()).unwrap_or_default(),
    };
    let ctx = json!({
        "conversations": render_conversation(messages), "response": response, "range": "", "type": "",
        "content": official_instruction(source),
    });
    Ok(ctx.as_object().cloned().unwrap_or_default())
}

/// The conversation as the official judge renders it.
pub fn render_conversation(messages: &[Value]) -> String {
    let mut out = String::new();
    for m in messages {
        let content = m["content"].as_str().unwrap_or_default();
        let label = match chat::Role::parse(m["role"].as_str().unwrap_or_default()) {
            Some(chat::Role::System) => "System Instruction",
            Some(chat::Role::User) => "User Query",
            Some(chat::Role::Assistant) => "LLM Response",
            None => continue,
        };
        out.push_str(&format!("{label}: \"{content}\"\n"));
    }
    out
}

/// The official extraction of the nested requirement from the system prompt.
pub fn official_instruction(system: &str) -> String {
    let mut content = system.split(". ").nth(1).unwrap_or_default().to_string();
    for phrase in [
        "You love to",
        "You will",
        "You must",
        "You prefer to",
        "You would like to",
        "You are used to",
        "You should",
        "You are in the habit of",
    ] {
        content = content.replace(phrase, "");
    }
    if content.ends_with('.') {
        content.pop();
    }
    content
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_and_instruction_as_the_official_code() {
        let msgs = vec![
            json!({"role": "System", "content": "You are Evan. You must answer in exactly three bullet points. Be kind."}),
            json!({"role": "User", "content": "Hi?"}),
            json!({"role": "Assistant", "content": "Hello."}),
        ];
        assert_eq!(
            render_conversation(&msgs),
            "System Instruction: \"You are Evan. You must answer in exactly three bullet points. Be kind.\"\nUser Query: \"Hi?\"\nLLM Response: \"Hello.\"\n"
        );
        assert_eq!(
            official_instruction(msgs[0]["content"].as_str().unwrap()),
            " answer in exactly three bullet points"
        );
        assert_eq!(official_instruction("No second sentence"), "");
    }
}
