//! `rolemrc_assemble`: put the RoleMRC samples together from the plan (first
//! input) and the LLM stages that answered its requests (the other inputs, matched
//! by request id): the conversation in the official message layout (`System`,
//! `User`, `Assistant`), the DPO prompt / chosen / rejected, and for the test split
//! the question and reference.
//!
//! A sample whose request failed upstream goes to this stage's failures with the
//! request id and the upstream reason (`degenerate_pair` when the stylized answer kept
//! repeating the answer it edits, else `incomplete`); so does a pair whose chosen equals
//! its rejected (whitespace-normalized, or above `max_similarity`), which is never
//! exported. Each sample group (`group` of the plan) keeps its first `n` complete
//! instances in plan order, `n` being its counted (non-spare) instances: spares take the
//! place of failed ones, and spares left over are kept with split `spare`, so the
//! configured counts are met whenever enough spares succeeded. A sample a person dropped
//! in the run's review file (`review.jsonl`) goes to the failures with kind `review` and
//! the reviewer's note, and a spare takes its place; the drop decisions are part of the
//! stage's fingerprint, so a changed review re-runs this stage and what follows only.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::array::{Array, AsArray, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_core::store::parquet::read_all;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, RunCtx, Stage};
use synth_kinds::review::{dropped_message, review_prepared};
use synth_quality::review::Verdict;

const OPTIONS: &[OptionSpec] = &[OptionSpec::optional(
    "max_similarity",
    Ty::Float(0.0, 1.0),
    "also drop a pair whose chosen and rejected have at least this word-level similarity (equal after whitespace normalization is always dropped)",
)];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_assemble",
    // 2: degenerate pairs dropped, spares replace failed instances (columns `group`,
    // `spare`, `degenerate_reasks`; split `spare`), upstream failure reasons carried.
    version: 2,
    about: "RoleMRC: build conversations, DPO pairs and test rows from the plan and the LLM stages' answers",
    arity: Arity::AtLeast(2),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    max_similarity: Option<f64>,
}

struct Assemble {
    max_similarity: Option<f64>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    Some(Box::new(Assemble { max_similarity: o.max_similarity }))
}

fn messages_type() -> DataType {
    crate::parsers::turns_type()
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
        // The plan's sample group, whether the sample was planned as a spare, and how many
        // answers of its requests were re-asked because they repeated the answer they edit.
        s("group"),
        Field::new("spare", DataType::Boolean, false),
        Field::new("degenerate_reasks", DataType::Int64, false),
    ])
}

/// What an LLM stage produced for one request.
#[derive(Clone)]
struct Answer {
    reply: Option<String>,
    turns: Option<Vec<(String, String)>>,
    model: String,
    /// Answers rejected as repeating what they edit before this one was accepted.
    degenerate_reasks: i64,
}

/// Why an instance was not assembled.
struct Dropped {
    kind: FailureKind,
    message: String,
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
            ["instance", "part", "category", "task", "system", "user", "user2", "rejected", "group", "spare"],
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

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        Ok(Some(review_prepared(ctx.review)))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Answers by request id.
        let mut answers: HashMap<String, Answer> = HashMap::new();
        // Why a request has no answer: its LLM stage's failure (stage, kind, message).
        let mut upstream: HashMap<String, (String, FailureKind, String)> = HashMap::new();
        // Failures of every stage upstream (a request can fail in its model stage, before
        // a dedup stage that this stage reads), in pipeline order: the last one stands.
        for name in &ctx.ancestors {
            let path = synth_engine::stages::failures_path(&ctx.out_dir, name);
            if ctx.inputs.iter().any(|i| &i.name == name) || !path.exists() {
                continue;
            }
            for f in synth_core::store::failures::read_failures(&path)?.0 {
                upstream.insert(f.id, (name.clone(), f.kind, f.message));
            }
        }
        for input in &ctx.inputs[1..] {
            for f in input.failures()? {
                upstream.insert(f.id, (input.name.clone(), f.kind, f.message));
            }
            let (_, batches) = read_all(&input.path)?;
            for b in &batches {
                let ids = data::ids(b);
                let reply = b.column_by_name("reply").and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned());
                let model = b.column_by_name("model").and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned());
                let turns = b.column_by_name("turns").cloned();
                let rejections = b.column_by_name("rejections").cloned();
                for i in 0..b.num_rows() {
                    let turns = turns.as_ref().filter(|t| t.is_valid(i)).map(|t| {
                        let list = t.as_list::<i32>().value(i);
                        let st = list.as_struct();
                        let role = st.column_by_name("role").expect("role").as_string::<i32>();
                        let content = st.column_by_name("content").expect("content").as_string::<i32>();
                        (0..st.len()).map(|k| (role.value(k).to_string(), content.value(k).to_string())).collect()
                    });
                    let degenerate_reasks = rejections.as_ref().filter(|r| r.is_valid(i)).map_or(0, |r| {
                        let list = r.as_list::<i32>().value(i);
                        let kinds = list.as_string::<i32>();
                        (0..kinds.len()).filter(|&k| kinds.value(k) == FailureKind::DegeneratePair.as_str()).count()
                            as i64
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
                            degenerate_reasks,
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
        ctx.progress.set_total(requests.len() as u64);
        // Every instance in plan order: its group, whether it is a spare, and its sample
        // (or why it was dropped).
        let mut assembled: Vec<(String, bool, std::result::Result<Row, Dropped>)> = Vec::new();
        // Samples dropped, by failure kind (the report's `dropped.<kind>`).
        let mut dropped: BTreeMap<&str, u64> = BTreeMap::new();
        let mut start = 0;
        while start < requests.len() {
            let instance = requests[start]["instance"].as_str().unwrap_or_default().to_string();
            let mut end = start + 1;
            while end < requests.len() && requests[end]["instance"].as_str() == Some(instance.as_str()) {
                end += 1;
            }
            let head = &requests[start];
            let group = head.get("group").and_then(Value::as_str).unwrap_or_default().to_string();
            let spare = head.get("spare").and_then(Value::as_bool).unwrap_or(false);
            // A sample a person dropped in the review file is dropped like a failed one
            // (a spare of its group takes its place).
            let reviewed = ctx.review.get(&instance).filter(|d| d.decision == Verdict::Drop);
            let result = match reviewed {
                Some(d) => Err(Dropped { kind: FailureKind::Review, message: dropped_message(d) }),
                None => assemble(&requests[start..end], &answers, &upstream, self.max_similarity),
            };
            if let Err(d) = &result {
                ctx.fail(&instance, d.kind, d.message.clone(), Some(Value::Object(head.clone()).to_string()));
                *dropped.entry(d.kind.as_str()).or_insert(0u64) += 1;
            }
            assembled.push((group, spare, result));
            ctx.progress.inc((end - start) as u64);
            start = end;
        }

        // Per group: the first `need` complete instances (need = its counted instances)
        // keep their split; complete spares beyond them are kept apart as split `spare`.
        let mut need: BTreeMap<&str, usize> = BTreeMap::new();
        for (group, spare, _) in &assembled {
            let n = need.entry(group.as_str()).or_default();
            *n += usize::from(!*spare);
        }
        let mut need: BTreeMap<String, usize> = need.into_iter().map(|(g, n)| (g.to_string(), n)).collect();
        let (mut used_spares, mut unused_spares) = (0u64, 0u64);
        let mut rows: Vec<Row> = Vec::new();
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let instances = assembled.len() as u64;
        for (group, spare, result) in assembled {
            let Ok(mut row) = result else { continue };
            let left = need.get_mut(&group).expect("every group counted");
            if *left > 0 {
                *left -= 1;
                used_spares += u64::from(spare);
            } else {
                row.insert("split".into(), json!("spare"));
                unused_spares += 1;
            }
            rows.push(row);
            if rows.len() >= 2048 {
                out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("sample {i}: {e}"))?)?;
                rows.clear();
            }
        }
        if !rows.is_empty() {
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("sample {i}: {e}"))?)?;
        }
        let short: Vec<(String, usize)> = need.into_iter().filter(|(_, n)| *n > 0).collect();
        if !short.is_empty() {
            let list: Vec<String> = short.iter().map(|(g, n)| format!("{g} ({n})")).collect();
            tracing::warn!(
                stage = %ctx.name,
                "{} group(s) have fewer samples than planned (more failures than spares): {}; raise the plan's spares",
                short.len(),
                list.join(", ")
            );
            ctx.report.info.insert("short_groups".into(), list.join(", "));
        }
        for (kind, n) in dropped {
            ctx.report.metrics.insert(format!("dropped.{kind}"), n as f64);
        }
        ctx.report.info.insert("spares_used".into(), used_spares.to_string());
        ctx.report.info.insert("spares_unused".into(), unused_spares.to_string());
        ctx.report.rows_in = instances;
        ctx.set_output(out)
    }
}

/// One sample from its requests (all with the same instance) and their answers; a
/// missing answer names its upstream failure, a degenerate pair is refused.
fn assemble(
    parts: &[Row],
    answers: &HashMap<String, Answer>,
    upstream: &HashMap<String, (String, FailureKind, String)>,
    max_similarity: Option<f64>,
) -> std::result::Result<Row, Dropped> {
    let head = &parts[0];
    let s = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let incomplete = |message: String| Dropped { kind: FailureKind::Incomplete, message };
    let mut got: HashMap<String, &Answer> = HashMap::new();
    for p in parts {
        let id = s(p, data::ID);
        let Some(a) = answers.get(&id) else {
            return Err(match upstream.get(&id) {
                Some((stage, FailureKind::DegeneratePair, m)) => {
                    Dropped { kind: FailureKind::DegeneratePair, message: format!("request {id} ({stage}): {m}") }
                }
                // A request a check, near-duplicate removal or review dropped: its sample is
                // dropped for that reason.
                Some((stage, kind @ (FailureKind::Check | FailureKind::Duplicate | FailureKind::Review), m)) => {
                    Dropped { kind: *kind, message: format!("request {id} ({stage}): {m}") }
                }
                Some((stage, kind, m)) => incomplete(format!("request {id} has no answer ({stage}: {kind}: {m})")),
                None => incomplete(format!("request {id} has no answer (see its LLM stage's failures)")),
            });
        };
        got.insert(s(p, "part"), a);
    }
    let reply = |part: &str| -> std::result::Result<String, Dropped> {
        got.get(part).and_then(|a| a.reply.clone()).ok_or_else(|| incomplete(format!("part \"{part}\" has no reply")))
    };
    let category = s(head, "category");
    let system = s(head, "system");
    let user = s(head, "user");
    let mut conv = vec![msg("System", &system)];
    let (mut chosen, mut rejected) = (None, None);
    match category.as_str() {
        "free_chat" | "onscene_chat" => {
            let turns = got
                .get("dialogue")
                .and_then(|a| a.turns.clone())
                .ok_or_else(|| incomplete("the dialogue has no turns".into()))?;
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
    if let (Some(c), Some(r)) = (&chosen, &rejected)
        && let Some(why) = crate::pairs::degenerate(c, r, max_similarity)
    {
        return Err(Dropped {
            kind: FailureKind::DegeneratePair,
            message: format!("the pair's chosen answer would teach nothing: {why}"),
        });
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
    row.insert("group".into(), json!(s(head, "group")));
    row.insert("spare".into(), head.get("spare").cloned().unwrap_or(json!(false)));
    row.insert("degenerate_reasks".into(), json!(got.values().map(|a| a.degenerate_reasks).sum::<i64>()));
    Ok(row)
}
