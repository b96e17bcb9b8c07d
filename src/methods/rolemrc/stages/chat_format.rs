//! `chat_format`: convert an existing chat dataset into the RoleMRC sample layout
//! (the schema `rolemrc_assemble` writes), so mix-in sources (RoleMRC-mix: RoleBench,
//! RLHFlow, UltraFeedback) are concatenated with the synthesized samples and flow into
//! the same SFT / DPO exports and dataset card.
//!
//! Three input shapes, chosen by the options that are set:
//! - `messages`: a column holding a conversation, a list of `{role, content}` (OpenAI /
//!   TRL style) or `{from, value}` (ShareGPT style) → a single-label row;
//! - `user` + `assistant` (and optionally `system`): columns of one exchange → a
//!   single-label row;
//! - `chosen` + `rejected` (and optionally `prompt`): preference data, each a string or a
//!   conversation whose last assistant message is the reply → a pair-label row (also a
//!   single-label row when `single_label = true`).
//!
//! Roles are normalized to the official `System` / `User` / `Assistant`. A record that
//! does not fit (unknown role, no user turn, not ending with the assistant, empty reply)
//! goes to the failures table with its id and the reason.

use anyhow::anyhow;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::SchemaRef;

use super::assemble::output_schema;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::chat;
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::exec::{Ids, map_batches};
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Sharding, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("category", Ty::Str, "category of the rows (e.g. \"RoleBench\"); also their task label"),
    OptionSpec::optional("messages", Ty::Str, "column with a conversation: list of {role, content} or {from, value}"),
    OptionSpec::optional("system", Ty::Str, "column with a system prompt (with `user`/`assistant`)"),
    OptionSpec::optional("user", Ty::Str, "column with the user turn"),
    OptionSpec::optional("assistant", Ty::Str, "column with the assistant reply"),
    OptionSpec::optional("prompt", Ty::Str, "preference data: column with the prompt (string or conversation)"),
    OptionSpec::optional(
        "chosen",
        Ty::Str,
        "preference data: column with the preferred reply (string or conversation)",
    ),
    OptionSpec::optional("rejected", Ty::Str, "preference data: column with the dispreferred reply"),
    OptionSpec::default("single_label", Ty::Bool, "false", "preference rows are also single-label (SFT) rows"),
    OptionSpec::default("split", Ty::Str, "\"train\"", "value of the split column"),
    OptionSpec::default("origin", Ty::Str, "\"\"", "value of the models column (where the data came from)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "chat_format",
    // 2: the sample layout gained `group`, `spare` and `degenerate_reasks` (rolemrc_assemble 2).
    version: 2,
    about: "convert chat / preference datasets into the RoleMRC sample layout (mix-in sources)",
    options: OPTIONS,
    example: "category = \"mix\"\nmessages = \"messages\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize, Clone)]
struct Options {
    category: String,
    messages: Option<String>,
    system: Option<String>,
    user: Option<String>,
    assistant: Option<String>,
    prompt: Option<String>,
    chosen: Option<String>,
    rejected: Option<String>,
    single_label: bool,
    split: String,
    origin: String,
}

struct ChatFormat {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let pair = opts.chosen.is_some() || opts.rejected.is_some();
    let exchange = opts.user.is_some() || opts.assistant.is_some();
    let shapes = [opts.messages.is_some(), exchange, pair].iter().filter(|&&b| b).count();
    if shapes != 1 {
        ctx.error(diags, "messages", "set exactly one of: `messages`, `user` + `assistant`, `chosen` + `rejected`");
        return None;
    }
    if exchange && (opts.user.is_none() || opts.assistant.is_none()) {
        ctx.error(diags, if opts.user.is_none() { "user" } else { "assistant" }, "`user` and `assistant` go together");
        return None;
    }
    if pair && (opts.chosen.is_none() || opts.rejected.is_none()) {
        ctx.error(
            diags,
            if opts.chosen.is_none() { "chosen" } else { "rejected" },
            "`chosen` and `rejected` go together",
        );
        return None;
    }
    Some(Box::new(ChatFormat { opts }))
}

/// The official role name of a source role.
fn role_of(role: &str) -> Option<&'static str> {
    chat::Role::parse_loose(role).map(chat::Role::official)
}

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// A conversation value → official messages.
fn messages(v: &Value, column: &str) -> Result<Vec<Value>, String> {
    let list = v.as_array().ok_or_else(|| format!("column \"{column}\" is not a list of messages"))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").or_else(|| m.get("from")).and_then(Value::as_str);
            let content = m.get("content").or_else(|| m.get("value")).and_then(Value::as_str);
            match (role, content) {
                (Some(r), Some(c)) => role_of(r)
                    .map(|r| msg(r, c))
                    .ok_or_else(|| format!("{column}[{i}]: unknown role \"{r}\" (system, user/human, assistant/gpt)")),
                _ => Err(format!("{column}[{i}]: a message needs role/content (or from/value) strings")),
            }
        })
        .collect()
}

fn text<'a>(row: &'a Row, column: &str) -> Result<&'a str, String> {
    match row.get(column) {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Null) | None => Err(format!("column \"{column}\" is empty")),
        Some(other) => Err(format!("column \"{column}\" is not a string: {other}")),
    }
}

/// The reply of a `chosen` / `rejected` value: a string, or a conversation's last
/// message, which must be the assistant's. Also returns the conversation before it.
fn reply(row: &Row, column: &str) -> Result<(String, Option<Vec<Value>>), String> {
    match row.get(column) {
        Some(Value::String(s)) => Ok((s.clone(), None)),
        Some(v @ Value::Array(_)) => {
            let mut conv = messages(v, column)?;
            match conv.pop() {
                Some(last) if last["role"] == "Assistant" => {
                    Ok((last["content"].as_str().unwrap_or_default().to_string(), Some(conv)))
                }
                _ => Err(format!("column \"{column}\" does not end with an assistant message")),
            }
        }
        _ => Err(format!("column \"{column}\" is neither a string nor a conversation")),
    }
}

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

/// Check a conversation is usable as training data.
fn check(conv: &[Value]) -> Result<(), String> {
    if !conv.iter().any(|m| m["role"] == "User") {
        return Err("the conversation has no user turn".into());
    }
    match conv.last() {
        Some(m) if m["role"] == "Assistant" && m["content"].as_str().is_some_and(|c| !c.trim().is_empty()) => Ok(()),
        Some(m) if m["role"] == "Assistant" => Err("the last assistant reply is empty".into()),
        _ => Err("the conversation does not end with an assistant reply".into()),
    }
}

impl Options {
    /// One source record → one sample row.
    fn convert(&self, row: &Row) -> Result<Row, String> {
        let (mut conversations, mut prompt, mut chosen, mut rejected) = (None, None, None, None);
        if let Some(col) = &self.messages {
            let conv = messages(row.get(col).unwrap_or(&Value::Null), col)?;
            check(&conv)?;
            conversations = Some(conv);
        } else if let (Some(u), Some(a)) = (&self.user, &self.assistant) {
            let mut conv = Vec::new();
            if let Some(s) = &self.system {
                conv.push(msg("System", text(row, s)?));
            }
            conv.push(msg("User", text(row, u)?));
            conv.push(msg("Assistant", text(row, a)?));
            check(&conv)?;
            conversations = Some(conv);
        } else if let (Some(c), Some(r)) = (&self.chosen, &self.rejected) {
            let (good, before) = reply(row, c)?;
            let (bad, _) = reply(row, r)?;
            let p = match &self.prompt {
                Some(p) => match row.get(p) {
                    Some(Value::String(s)) => vec![msg("User", s)],
                    Some(v @ Value::Array(_)) => messages(v, p)?,
                    _ => return Err(format!("column \"{p}\" is neither a string nor a conversation")),
                },
                None => before.ok_or("without `prompt`, `chosen` must be a conversation that holds the prompt")?,
            };
            let mut conv = p.clone();
            conv.push(msg("Assistant", &good));
            check(&conv)?;
            if bad.trim().is_empty() {
                return Err(format!("column \"{r}\" has an empty reply"));
            }
            if self.single_label {
                conversations = Some(conv.clone());
            }
            prompt = Some(p);
            chosen = Some(good);
            rejected = Some(bad);
        }
        let scored = conversations.clone().unwrap_or_else(|| {
            let mut c = prompt.clone().unwrap_or_default();
            c.push(msg("Assistant", chosen.as_deref().unwrap_or_default()));
            c
        });
        let replies: Vec<&str> =
            scored.iter().filter(|m| m["role"] == "Assistant").filter_map(|m| m["content"].as_str()).collect();
        let first = scored.iter().find(|m| m["role"] != "System").map(|m| m["role"].clone());
        let mut out = Row::new();
        out.insert(data::ID.into(), row.get(data::ID).cloned().unwrap_or(Value::Null));
        out.insert("split".into(), json!(self.split));
        out.insert("category".into(), json!(self.category));
        out.insert("type".into(), json!(0));
        out.insert("task".into(), json!(self.category));
        out.insert("narration".into(), json!(false));
        out.insert("first".into(), json!(if first == Some(json!("Assistant")) { "role" } else { "user" }));
        for k in ["profile_id", "role_name", "triplet_id", "seed_id", "seed2_id", "rule_id"] {
            out.insert(k.into(), json!(""));
        }
        out.insert("system_rule".into(), Value::Null);
        out.insert("conversations".into(), conversations.map(Value::Array).unwrap_or(Value::Null));
        out.insert("prompt".into(), prompt.map(Value::Array).unwrap_or(Value::Null));
        out.insert("chosen".into(), json!(chosen));
        out.insert("rejected".into(), json!(rejected));
        out.insert("question".into(), Value::Null);
        out.insert("reference".into(), Value::Null);
        out.insert("assistant_turns".into(), json!(replies.len()));
        let avg = replies.iter().map(|r| words(r)).sum::<usize>() as f64 / replies.len().max(1) as f64;
        out.insert("reply_words".into(), json!(avg));
        out.insert("models".into(), json!(self.origin));
        // A mix-in source is one sample group of its own; nothing is a spare or was re-asked.
        out.insert("group".into(), json!(format!("{}/{}", self.category, self.split)));
        out.insert("spare".into(), json!(false));
        out.insert("degenerate_reasks".into(), json!(0));
        Ok(out)
    }

    fn columns(&self) -> Vec<&str> {
        [&self.messages, &self.system, &self.user, &self.assistant, &self.prompt, &self.chosen, &self.rejected]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

#[async_trait]
impl Stage for ChatFormat {
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Sharding::LIGHT
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, self.opts.columns());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> anyhow::Result<()> {
        let schema = output_schema();
        let opts = self.opts.clone();
        let out_schema = schema.clone();
        map_batches(ctx, 0, schema, Ids::Kept, move |batch, failures| {
            let ids = data::ids(batch);
            let mut rows = Vec::with_capacity(batch.num_rows());
            for i in 0..batch.num_rows() {
                let row = data::row_json(batch, i);
                match opts.convert(&row) {
                    Ok(r) => rows.push(r),
                    Err(e) => {
                        failures.record(ids.value(i), FailureKind::BadRecord, e, serde_json::to_string(&row).ok())
                    }
                }
            }
            data::rows_to_batch(&out_schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: Value) -> Options {
        let mut base = json!({"category": "X", "single_label": false, "split": "train", "origin": ""});
        base.as_object_mut().unwrap().extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    fn row(v: Value) -> Row {
        let mut r = v.as_object().unwrap().clone();
        r.insert(data::ID.into(), json!("r1"));
        r
    }

    #[test]
    fn sharegpt_and_openai_messages_become_official_roles() {
        let o = opts(json!({"messages": "m"}));
        let r = o
            .convert(&row(json!({"m": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]})))
            .unwrap();
        assert_eq!(
            r["conversations"],
            json!([{"role": "User", "content": "hi"}, {"role": "Assistant", "content": "hello there"}])
        );
        assert_eq!(r["reply_words"], json!(2.0));
        assert_eq!(r["chosen"], Value::Null);
        let err = o.convert(&row(json!({"m": [{"role": "user", "content": "hi"}]}))).unwrap_err();
        assert!(err.contains("does not end with an assistant"), "{err}");
        let err = o.convert(&row(json!({"m": [{"role": "tool", "content": "x"}]}))).unwrap_err();
        assert!(err.contains("m[0]: unknown role \"tool\""), "{err}");
    }

    #[test]
    fn preference_rows_split_prompt_and_replies() {
        let o = opts(json!({"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}));
        let r = o
            .convert(&row(json!({
                "prompt": "2+2?",
                "chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}],
            })))
            .unwrap();
        assert_eq!(r["prompt"], json!([{"role": "User", "content": "2+2?"}]));
        assert_eq!((r["chosen"].as_str(), r["rejected"].as_str()), (Some("4"), Some("5")));
        assert_eq!(r["conversations"], Value::Null, "pair-only unless single_label");
        let o = opts(json!({"chosen": "chosen", "rejected": "rejected"}));
        let err = o.convert(&row(json!({"chosen": "4", "rejected": "5"}))).unwrap_err();
        assert!(err.contains("without `prompt`"), "{err}");
    }

    #[test]
    fn one_exchange_with_a_system_prompt() {
        let o = opts(json!({"system": "s", "user": "u", "assistant": "a"}));
        let r = o.convert(&row(json!({"s": "You are Hamlet.", "u": "Who are you?", "a": "A prince."}))).unwrap();
        assert_eq!(r["conversations"][0], json!({"role": "System", "content": "You are Hamlet."}));
        assert_eq!(r["assistant_turns"], json!(1));
        let err = o.convert(&row(json!({"s": "x", "u": null, "a": "y"}))).unwrap_err();
        assert_eq!(err, "column \"u\" is empty");
    }
}
