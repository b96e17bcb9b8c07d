//! `rolemrc_judge_plan`: turn answered test rows (`task`, `question` as a message
//! list, `response`) into LLM-as-judge queries, as the RoleMRC authors'
//! `evaluation/llm_judge.py` builds them: the conversation rendered as
//! `System Instruction: "..."` / `User Query: "..."` / `LLM Response: "..."` lines, the
//! official task → dimension mapping (a data file), and one prompt template file per
//! dimension (Appendix F, Figure 11). The queries go to a generic `llm` stage; the
//! answers are scored by `rolemrc_judge_score`.
//!
//! The nested-instruction requirement is the official extraction (`split(". ")[1]`, the
//! "You must / You will ..." phrases removed) applied to `instruction_column` (synth's
//! samples carry `system_rule`) or, without it, to the system prompt, which starts with
//! the rule in synth's data as in the official data. With
//! `priority_twice = true` the instruction-priority query is emitted twice, as the
//! official code does (its published averages count it twice); off by default.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};
use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::template::Templates;

/// The judge dimensions, in report order (Table 9).
pub const DIMENSIONS: &[&str] =
    &["knowledge_range", "style_compliance", "nested_instruction", "multi_turn_instruction", "instruction_priority"];

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
    version: 1,
    about: "RoleMRC LLM-as-judge queries (Appendix F prompts, official task -> dimension mapping)",
    role: Role::Transform,
    arity: Arity::Exactly(1),
    options: OPTIONS,
    uses_seed: false,
    build,
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

/// One judge query of a task: the dimension and the template variables it sets.
#[derive(Deserialize, Clone, Debug)]
struct Query {
    dimension: String,
    #[serde(default)]
    range: String,
    #[serde(default, rename = "type")]
    kind: String,
}

struct JudgePlan {
    opts: Options,
    tasks: Arc<BTreeMap<String, Vec<Query>>>,
    templates: Arc<Templates>,
    files: Vec<PathBuf>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let dir = ctx.root.join(&opts.prompts_dir);
    let tasks_path = dir.join("tasks.json");
    let tasks: BTreeMap<String, Vec<Query>> = match std::fs::read_to_string(&tasks_path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<BTreeMap<String, Value>>(&t).map_err(|e| e.to_string()))
        .and_then(|m| {
            m.into_iter()
                .filter(|(k, _)| !k.starts_with('_'))
                .map(|(k, v)| {
                    serde_json::from_value(v).map(|q| (k.clone(), q)).map_err(|e| format!("task \"{k}\": {e}"))
                })
                .collect()
        }) {
        Ok(t) => t,
        Err(e) => {
            ctx.error(diags, "prompts_dir", format!("{}: {e}", tasks_path.display()));
            return None;
        }
    };
    let mut templates = Templates::new();
    let mut files = vec![tasks_path.clone()];
    for q in tasks.values().flatten() {
        if !DIMENSIONS.contains(&q.dimension.as_str()) {
            ctx.error(
                diags,
                "prompts_dir",
                format!(
                    "{}: unknown dimension \"{}\" (dimensions: {})",
                    tasks_path.display(),
                    q.dimension,
                    DIMENSIONS.join(", ")
                ),
            );
            return None;
        }
    }
    for d in DIMENSIONS {
        let path = dir.join(format!("{d}.j2"));
        match std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| templates.add(d, &t)) {
            Ok(_) => files.push(path),
            Err(e) => {
                ctx.error(diags, "prompts_dir", format!("{}: {e}", path.display()));
                return None;
            }
        }
    }
    Some(Box::new(JudgePlan { opts, tasks: Arc::new(tasks), templates: Arc::new(templates), files }))
}

/// The conversation as the official judge renders it.
pub fn render_conversation(messages: &[Value]) -> String {
    let mut out = String::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or_default().to_lowercase();
        let content = m["content"].as_str().unwrap_or_default();
        let label = match role.as_str() {
            "system" => "System Instruction",
            "user" => "User Query",
            "assistant" => "LLM Response",
            _ => continue,
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

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    data::schema_with_id([s("source_id"), s("task"), s("dimension"), s("prompt")])
}

impl JudgePlan {
    fn queries(&self, row: &Row) -> std::result::Result<Vec<Row>, String> {
        let o = &self.opts;
        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default();
        let task = row.get(&o.task_column).and_then(Value::as_str).ok_or("no task")?;
        let queries = self.tasks.get(task).ok_or_else(|| format!("no judge dimension for task \"{task}\""))?;
        let messages = row
            .get(&o.question_column)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("column \"{}\" is not a list of messages", o.question_column))?;
        let response = match row.get(&o.response_column) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let conversations = render_conversation(messages);
        let mut out = Vec::new();
        for q in queries {
            // The official extraction, from the rule itself when the row carries it, else
            // from the system prompt (where synth, like the official data, puts the rule first).
            let source = match row.get(&o.instruction_column).and_then(Value::as_str).filter(|s| !s.is_empty()) {
                Some(rule) => rule,
                None => messages.first().and_then(|m| m["content"].as_str()).unwrap_or_default(),
            };
            let content = official_instruction(source);
            let ctx = json!({
                "conversations": conversations, "response": response, "range": q.range, "type": q.kind, "content": content,
            });
            let prompt = self.templates.render(&q.dimension, ctx.as_object().expect("object"))?;
            let copies = if o.priority_twice && q.dimension == "instruction_priority" { 2 } else { 1 };
            for c in 0..copies {
                let mut r = Row::new();
                let suffix = if c == 0 { String::new() } else { format!("#{}", c + 1) };
                r.insert(data::ID.into(), json!(format!("{id}#{}{suffix}", q.dimension)));
                r.insert("source_id".into(), json!(id));
                r.insert("task".into(), json!(task));
                r.insert("dimension".into(), json!(q.dimension));
                r.insert("prompt".into(), json!(prompt));
                out.push(r);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Stage for JudgePlan {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let o = &self.opts;
        ctx.require_columns(
            "inputs",
            0,
            [o.task_column.as_str(), o.question_column.as_str(), o.response_column.as_str()],
        );
        ctx.files.extend(self.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let input = ctx.inputs[0].clone();
        let (_, batches) = crate::store::parquet::read_all(&input.path)?;
        let mut rows = Vec::new();
        let mut n = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                match self.queries(&row) {
                    Ok(q) => rows.extend(q),
                    Err(e) => {
                        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        ctx.fail(&id, "judge plan", e, serde_json::to_string(&row).ok());
                    }
                }
            }
        }
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("query {i}: {e}"))?)?;
        ctx.report.rows_in = n;
        ctx.set_output(out)
    }
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
