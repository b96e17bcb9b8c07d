//! `rolemrc_assemble`: put the RoleMRC samples together from the plan (first
//! input) and the LLM stages that answered its requests (the other inputs, matched
//! by request id): the conversation in the official message layout (`System`,
//! `User`, `Assistant`), the DPO prompt / chosen / rejected, and for the test split
//! the question and reference. A sample whose request failed upstream goes to this
//! stage's failures with the request id; every other sample is kept.

use std::collections::HashMap;

use anyhow::{Result, anyhow};
use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::diag::Diagnostics;
use crate::config::options::OptionSpec;
use crate::data::{self, Row};
use crate::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};
use crate::store::failures::FailureKind;
use crate::store::parquet::read_all;

const OPTIONS: &[OptionSpec] = &[];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_assemble",
    version: 1,
    about: "RoleMRC: build conversations, DPO pairs and test rows from the plan and the LLM stages' answers",
    role: Role::Transform,
    arity: Arity::AtLeast(2),
    options: OPTIONS,
    uses_seed: false,
    summary: false,
    example: "",
    build,
};

#[derive(Deserialize)]
struct Options {}

struct Assemble;

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let _: Options = ctx.parse(diags)?;
    Some(Box::new(Assemble))
}

fn messages_type() -> DataType {
    crate::methods::rolemrc::parsers::turns_type()
}

/// Output schema of the assembled samples.
pub fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let o = |n: &str| Field::new(n, DataType::Utf8, true);
    data::schema_with_id([
        s("split"),
        s("category"),
        Field::new("type", DataType::Int64, false),
        s("task"),
        Field::new("narration", DataType::Boolean, false),
        s("first"),
        s("profile_id"),
        s("role_name"),
        s("triplet_id"),
        s("seed_id"),
        s("seed2_id"),
        s("rule_id"),
        // The system rule of nested / prioritized samples (the judge's nested requirement).
        o("system_rule"),
        // Null for pair-only rows (mix-in preference data, see `chat_format`).
        Field::new("conversations", messages_type(), true),
        Field::new("prompt", messages_type(), true),
        o("chosen"),
        o("rejected"),
        Field::new("question", messages_type(), true),
        o("reference"),
        Field::new("assistant_turns", DataType::Int64, false),
        Field::new("reply_words", DataType::Float64, false),
        s("models"),
    ])
}

/// What an LLM stage produced for one request.
#[derive(Clone)]
struct Answer {
    reply: Option<String>,
    turns: Option<Vec<(String, String)>>,
    model: String,
}

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

#[async_trait]
impl Stage for Assemble {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns(
            "inputs",
            0,
            ["instance", "part", "category", "task", "system", "user", "user2", "rejected"],
        );
        for i in 1..ctx.inputs.len() {
            if let Some(s) = ctx.input_schema(i)
                && s.field_with_name("reply").is_err()
                && s.field_with_name("turns").is_err()
            {
                let name = ctx.inputs[i].name.clone();
                ctx.error("inputs", format!("input \"{name}\" has neither a \"reply\" nor a \"turns\" column"));
            }
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Answers by request id.
        let mut answers: HashMap<String, Answer> = HashMap::new();
        for input in &ctx.inputs[1..] {
            let (_, batches) = read_all(&input.path)?;
            for b in &batches {
                let ids = data::ids(b);
                let reply = b.column_by_name("reply").and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned());
                let model = b.column_by_name("model").and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned());
                let turns = b.column_by_name("turns").cloned();
                for i in 0..b.num_rows() {
                    let turns = turns.as_ref().filter(|t| t.is_valid(i)).map(|t| {
                        let list = t.as_list::<i32>().value(i);
                        let st = list.as_struct();
                        let role = st.column_by_name("role").expect("role").as_string::<i32>();
                        let content = st.column_by_name("content").expect("content").as_string::<i32>();
                        (0..st.len()).map(|k| (role.value(k).to_string(), content.value(k).to_string())).collect()
                    });
                    answers.insert(
                        ids.value(i).to_string(),
                        Answer {
                            reply: reply.as_ref().filter(|r| r.is_valid(i)).map(|r| r.value(i).to_string()),
                            turns,
                            model: model
                                .as_ref()
                                .filter(|m| m.is_valid(i))
                                .map(|m| m.value(i).to_string())
                                .unwrap_or_default(),
                        },
                    );
                }
            }
        }

        let plan = ctx.inputs[0].clone();
        let (_, batches) = read_all(&plan.path)?;
        let mut requests: Vec<Row> = Vec::new();
        for b in &batches {
            for i in 0..b.num_rows() {
                requests.push(data::row_json(b, i));
            }
        }
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        ctx.progress.set_total(requests.len() as u64);
        let mut rows: Vec<Row> = Vec::new();
        let mut start = 0;
        let mut instances = 0u64;
        while start < requests.len() {
            let instance = requests[start]["instance"].as_str().unwrap_or_default().to_string();
            let mut end = start + 1;
            while end < requests.len() && requests[end]["instance"].as_str() == Some(instance.as_str()) {
                end += 1;
            }
            instances += 1;
            match assemble(&requests[start..end], &answers) {
                Ok(row) => rows.push(row),
                Err(e) => ctx.fail(&instance, FailureKind::Incomplete, e, None),
            }
            ctx.progress.inc((end - start) as u64);
            start = end;
            if rows.len() >= 2048 {
                out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("sample {i}: {e}"))?)?;
                rows.clear();
            }
        }
        if !rows.is_empty() {
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("sample {i}: {e}"))?)?;
        }
        ctx.report.rows_in = instances;
        ctx.set_output(out)
    }
}

/// One sample from its requests (all with the same instance) and their answers.
fn assemble(parts: &[Row], answers: &HashMap<String, Answer>) -> std::result::Result<Row, String> {
    let head = &parts[0];
    let s = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut got: HashMap<String, &Answer> = HashMap::new();
    for p in parts {
        let id = s(p, data::ID);
        let a = answers.get(&id).ok_or_else(|| format!("request {id} has no answer (see its LLM stage's failures)"))?;
        got.insert(s(p, "part"), a);
    }
    let reply = |part: &str| -> std::result::Result<String, String> {
        got.get(part).and_then(|a| a.reply.clone()).ok_or_else(|| format!("part \"{part}\" has no reply"))
    };
    let category = s(head, "category");
    let system = s(head, "system");
    let user = s(head, "user");
    let mut conv = vec![msg("System", &system)];
    let (mut chosen, mut rejected) = (None, None);
    match category.as_str() {
        "free_chat" | "onscene_chat" => {
            let turns = got.get("dialogue").and_then(|a| a.turns.clone()).ok_or("the dialogue has no turns")?;
            for (role, content) in turns {
                conv.push(msg(if role == "User" { "User" } else { "Assistant" }, &content));
            }
        }
        "multi_turn" => {
            let (r1, r2) = (reply("reply")?, reply("reply2")?);
            conv.push(msg("User", &user));
            conv.push(msg("Assistant", &r1));
            conv.push(msg("User", &s(head, "user2")));
            conv.push(msg("Assistant", &r2));
            chosen = Some(r2);
            rejected = Some(s(head, "rejected"));
        }
        "nested" => {
            let (base, r) = (reply("base")?, reply("reply")?);
            conv.push(msg("User", &user));
            conv.push(msg("Assistant", &r));
            chosen = Some(r);
            // The reply before it was rewritten to obey the system rule.
            rejected = Some(base);
        }
        _ => {
            let r = reply("reply")?;
            conv.push(msg("User", &user));
            conv.push(msg("Assistant", &r));
            chosen = Some(r);
            rejected = Some(s(head, "rejected"));
        }
    }
    let assistant: Vec<&str> =
        conv.iter().filter(|m| m["role"] == "Assistant").filter_map(|m| m["content"].as_str()).collect();
    let n_assistant = assistant.len();
    let reply_words = if n_assistant == 0 {
        0.0
    } else {
        assistant.iter().map(|t| words(t)).sum::<usize>() as f64 / n_assistant as f64
    };
    let prompt = chosen.as_ref().map(|_| Value::Array(conv[..conv.len() - 1].to_vec()));
    let test = s(head, "split") == "test";
    let mut models: Vec<String> = got.values().map(|a| a.model.clone()).filter(|m| !m.is_empty()).collect();
    models.sort();
    models.dedup();
    let mut row = Row::new();
    row.insert(data::ID.into(), json!(s(head, "instance")));
    for k in [
        "split",
        "category",
        "type",
        "task",
        "narration",
        "first",
        "profile_id",
        "role_name",
        "triplet_id",
        "seed_id",
        "seed2_id",
        "rule_id",
        "system_rule",
    ] {
        row.insert(k.into(), head.get(k).cloned().unwrap_or(Value::Null));
    }
    row.insert("conversations".into(), Value::Array(conv));
    row.insert("question".into(), if test { prompt.clone().unwrap_or(Value::Null) } else { Value::Null });
    row.insert("reference".into(), if test { json!(chosen) } else { Value::Null });
    row.insert("prompt".into(), prompt.unwrap_or(Value::Null));
    row.insert("chosen".into(), json!(chosen));
    row.insert("rejected".into(), json!(rejected));
    row.insert("assistant_turns".into(), json!(n_assistant));
    row.insert("reply_words".into(), json!(reply_words));
    row.insert("models".into(), json!(models.join(",")));
    Ok(row)
}
