//! Reading the release: a dimension file (`<dimension>_test.json`, a JSON array of
//! records) becomes one [`Item`] per record and language, normalized as the official
//! code does (thu-coai/CharacterBench @ f4ec56a4):
//! - the role-play session (`process.py` `norm_session_zh` / `_en`): speaker → role
//!   (`user` / `character`, then the user's and the character's names; en also `User` /
//!   `Character`, names `lstrip`ped, a speaker contained in the character's name, and
//!   "assistant after a user turn"), the last turn must be the user's, a greeting goes
//!   first (the dialogue must then start with the user; en's `N/A` is no greeting), and
//!   an empty user turn goes before a leading character turn; `user_profile` defaults to
//!   `无` in both languages;
//! - the judge's view (`construct_prompts/process_wo_context_{zh,en}_all.py`): the
//!   profile as Python's `str()`, the context labelled by turn parity (not by speaker,
//!   P5) with full-width colons, the last turn as the user's query, the dimension's
//!   target (reference) from its record path.
//!
//! A record that breaks a rule is a [`Problem`] naming the file, the record id and the
//! field; its other language is still read. A file that is not a JSON array of objects
//! is an error naming the file (and the line and column of a syntax error).

use std::path::Path;

use serde_json::{Map, Value};

use super::bench::{Bench, Dimension};
use synth_core::data::python::py_str;

/// The judge-prediction fields shipped with each record, per language
/// (`pred_<lang><suffix>`), exposed as `pred<suffix>` for the row's language.
pub const PRED_SUFFIXES: &[&str] =
    &["", "_f", "_sc", "_sc_f", "_ref_free", "_ref_free_f", "_ref_free_sc", "_ref_free_sc_f"];

/// One record in one language.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// `<dimension>/<record id>/<lang>`.
    pub key: String,
    /// `<dimension>/<record id>`.
    pub record_key: String,
    pub dimension: String,
    pub lang: String,
    pub record_id: String,
    /// Position in the file (0-based).
    pub index: usize,
    pub character_name: String,
    /// `str(character_profile)` (a dict profile is its Python repr, as the official code renders it).
    pub character_profile: String,
    pub user_name: String,
    /// `str(session.get("user_profile", "无"))`.
    pub user_profile: String,
    pub greeting: Option<String>,
    /// The normalized session: (role, content), role `user` / `assistant`.
    pub messages: Vec<(String, String)>,
    /// The judge's `character_profile` slot (BCh: profile + character style).
    pub judge_profile: String,
    /// The judge's `dialogue` slot (empty for the dimensions that blank it, P3).
    pub judge_dialogue: String,
    /// `<user>：<last utterance>`.
    pub user_query: String,
    /// The name the judge transcript gives the character.
    pub speaker: String,
    pub target_slot: Option<String>,
    pub target: Option<String>,
    /// The shipped response (`response_messages.response`), judged in human-agreement mode.
    pub response: Option<String>,
    pub response_model: Option<String>,
    /// The human score (`gold`, else `annotation_score`); none in unannotated data.
    pub gold: Option<f64>,
    /// `pred_<lang><suffix>` for each of [`PRED_SUFFIXES`].
    pub preds: Vec<Option<f64>>,
    pub data_source: Option<String>,
}

/// A record (in one language) that cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The item key (or `<dimension>/#<index>` when the record has no usable id).
    pub id: String,
    /// The field at fault, as a path in the record (`translation_en.dialogue[3].speaker`).
    pub field: String,
    pub message: String,
    /// The record as JSON text.
    pub record: Option<String>,
}

/// A value at a dotted path (`messages.output.answer`) of an object.
pub fn at<'a>(obj: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let (first, rest) = path.split_once('.').unwrap_or((path, ""));
    let v = obj.get(first)?;
    if rest.is_empty() { Some(v) } else { rest.split('.').try_fold(v, |cur, key| cur.as_object()?.get(key)) }
}

fn number(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// The dimension of a release file name (`memory_consistency_test.json` → `memory_consistency`).
pub fn dimension_of(path: &Path, suffix: &str) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".json")?.strip_suffix(suffix).map(str::to_string)
}

/// Every record of one dimension file in the languages `langs`.
pub fn read_file(
    path: &Path,
    dim: &Dimension,
    bench: &Bench,
    langs: &[String],
) -> Result<(Vec<Item>, Vec<Problem>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}:{}:{}: not valid JSON: {e}", path.display(), e.line(), e.column()))?;
    let Value::Array(records) = value else {
        return Err(format!("{}: expected a JSON array of records (the release layout)", path.display()));
    };
    let file = path.display().to_string();
    let (mut items, mut problems) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    for (index, rec) in records.iter().enumerate() {
        let record_text = || serde_json::to_string(rec).ok();
        let Some(obj) = rec.as_object() else {
            problems.push(Problem {
                id: format!("{}/#{index}", dim.id),
                field: String::new(),
                message: format!("{file}: record #{index}: not a JSON object"),
                record: record_text(),
            });
            continue;
        };
        let record_id = match obj.get("id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(v @ Value::Number(_)) => py_str(v),
            _ => {
                problems.push(Problem {
                    id: format!("{}/#{index}", dim.id),
                    field: "id".into(),
                    message: format!("{file}: record #{index}: field \"id\": missing (a number or text)"),
                    record: record_text(),
                });
                continue;
            }
        };
        if !seen.insert(record_id.clone()) {
            problems.push(Problem {
                id: format!("{}/{record_id}#{index}", dim.id),
                field: "id".into(),
                message: format!(
                    "{file}: record {record_id} (#{index}): field \"id\": the id is used by an earlier record"
                ),
                record: record_text(),
            });
            continue;
        }
        for lang in langs {
            match item(obj, dim, bench, lang, &record_id, index) {
                Ok(i) => items.push(i),
                Err((field, why)) => problems.push(Problem {
                    id: format!("{}/{record_id}/{lang}", dim.id),
                    message: format!("{file}: record {record_id} (#{index}, {lang}): field \"{field}\": {why}"),
                    field,
                    record: record_text(),
                }),
            }
        }
    }
    Ok((items, problems))
}

/// The field at fault and why.
pub type Bad = (String, String);

/// One record in one language, or the field at fault and why.
pub fn item(
    rec: &Map<String, Value>,
    dim: &Dimension,
    bench: &Bench,
    lang: &str,
    record_id: &str,
    index: usize,
) -> Result<Item, Bad> {
    let language = &bench.languages[lang];
    let (src, prefix): (&Map<String, Value>, String) = match &language.record {
        None => (rec, String::new()),
        Some(key) => match rec.get(key) {
            Some(Value::Object(o)) => (o, format!("{key}.")),
            Some(_) => return Err((key.clone(), "not an object".into())),
            None => return Err((key.clone(), format!("missing: the {lang} copy of the record"))),
        },
    };
    let field = |f: &str| format!("{prefix}{f}");
    let text = |f: &str| -> Result<String, Bad> {
        match src.get(f) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err((field(f), "not text".into())),
            None => Err((field(f), "missing".into())),
        }
    };

    // The judge's view (process_wo_context_*): the character's name falls back to the record's.
    let speaker = match src.get("character_name").or_else(|| rec.get("character_name")) {
        Some(v) => py_str(v),
        None => return Err((field("character_name"), "missing".into())),
    };
    let profile_value =
        src.get("character_profile").ok_or_else(|| (field("character_profile"), "missing".to_string()))?;
    let character_profile = py_str(profile_value);
    let turns = match src.get("dialogue") {
        Some(Value::Array(t)) if !t.is_empty() => t,
        Some(Value::Array(_)) => return Err((field("dialogue"), "empty".into())),
        Some(_) => return Err((field("dialogue"), "not a list of turns".into())),
        None => return Err((field("dialogue"), "missing".into())),
    };
    let mut utterances = Vec::with_capacity(turns.len());
    let mut speakers = Vec::with_capacity(turns.len());
    for (i, t) in turns.iter().enumerate() {
        let f = |k: &str| field(&format!("dialogue[{i}].{k}"));
        let Some(t) = t.as_object() else { return Err((field(&format!("dialogue[{i}]")), "not an object".into())) };
        match t.get("utterance") {
            Some(Value::String(s)) => utterances.push(s.clone()),
            Some(_) => return Err((f("utterance"), "not text".into())),
            None => return Err((f("utterance"), "missing".into())),
        }
        match t.get("speaker") {
            Some(Value::String(s)) => speakers.push(s.clone()),
            Some(_) => return Err((f("speaker"), "not text".into())),
            None => return Err((f("speaker"), "missing".into())),
        }
    }
    let user = &language.user;
    let mut judge_dialogue = String::new();
    for (i, u) in utterances[..utterances.len() - 1].iter().enumerate() {
        let who = if i % 2 == 0 { user.as_str() } else { speaker.as_str() };
        judge_dialogue.push_str(&format!("{who}：{u}\n"));
    }
    let user_query = format!("{user}：{}", utterances[utterances.len() - 1]);
    let (mut target_slot, mut target) = (None, None);
    let mut judge_profile = character_profile.clone();
    if let Some(t) = &dim.target {
        let value = at(src, &t.path)
            .or_else(|| if t.zh_fallback && !prefix.is_empty() { at(rec, &t.path) } else { None })
            .ok_or_else(|| (field(&t.path), format!("missing: the {} reference of {}", t.slot[lang], dim.id)))?;
        let rendered = match t.render.as_str() {
            "lines" => {
                let Value::Array(items) = value else { return Err((field(&t.path), "not a list".into())) };
                items.iter().map(|s| format!("{speaker}：{}\n", py_str(s))).collect::<String>()
            }
            _ => py_str(value),
        };
        if t.append_to_profile {
            // `character_profile + behavior`: a str concatenation in the official code.
            if !value.is_string() {
                return Err((field(&t.path), "not text (it is appended to the profile)".into()));
            }
            judge_profile.push_str(&rendered);
        }
        target_slot = Some(t.slot[lang].clone());
        target = Some(rendered);
    }
    let judge_dialogue = if dim.blank_dialogue { String::new() } else { judge_dialogue };

    // The role-play session (process.py norm_session_*).
    let character_name = text("character_name")?;
    let en_rules = !prefix.is_empty();
    let user_name = src.get("user_name");
    let mut messages: Vec<(String, String)> = Vec::with_capacity(turns.len() + 2);
    for (i, (sp, u)) in speakers.iter().zip(&utterances).enumerate() {
        let sp_norm = if en_rules { sp.trim_start() } else { sp.as_str() };
        let name_of = |v: Option<&Value>, f: &str| -> Result<String, Bad> {
            match v {
                Some(Value::String(s)) => Ok(if en_rules { s.trim_start().to_string() } else { s.clone() }),
                Some(_) => Err((field(f), "not text".into())),
                None => {
                    Err((field(f), "missing (needed to place a speaker that is neither user nor character)".into()))
                }
            }
        };
        let role = if sp_norm == "user" || (en_rules && sp_norm == "User") {
            "user"
        } else if sp_norm == "character" || (en_rules && sp_norm == "Character") {
            "assistant"
        } else if sp_norm == name_of(user_name, "user_name")? {
            "user"
        } else {
            let cname = name_of(src.get("character_name"), "character_name")?;
            // en: the name, a speaker contained in it, or "assistant after a user turn".
            let after_user = en_rules && messages.last().is_some_and(|m| m.0 == "user");
            if sp_norm == cname || (en_rules && cname.contains(sp_norm)) || after_user {
                "assistant"
            } else {
                return Err((
                    field(&format!("dialogue[{i}].speaker")),
                    format!(
                        "unknown speaker {sp:?}: neither \"user\" / \"character\" nor the user's name {:?} or the character's name {:?}",
                        user_name.map(py_str).unwrap_or_default(),
                        cname
                    ),
                ));
            }
        };
        messages.push((role.to_string(), u.clone()));
    }
    if messages.last().is_some_and(|m| m.0 != "user") {
        return Err((
            field(&format!("dialogue[{}].speaker", messages.len() - 1)),
            format!(
                "the last turn is the character's ({:?}); the query answered must be the user's",
                speakers[speakers.len() - 1]
            ),
        ));
    }
    let greeting = match src.get("greeting") {
        None | Some(Value::Null) => None,
        Some(Value::String(g)) if language.greeting_none.contains(g) || g.is_empty() => None,
        Some(Value::String(g)) => Some(g.clone()),
        Some(_) => return Err((field("greeting"), "not text".into())),
    };
    if let Some(g) = &greeting {
        if messages[0].0 != "user" {
            return Err((
                field("dialogue[0].speaker"),
                "the dialogue starts with the character although a greeting is set (the greeting is the character's first turn)".into(),
            ));
        }
        messages.insert(0, ("assistant".into(), g.clone()));
    }
    if messages[0].0 == "assistant" {
        messages.insert(0, ("user".into(), String::new()));
    }
    let user_profile = src.get("user_profile").map(py_str).unwrap_or_else(|| "无".to_string());

    let gold_value = rec.get("gold").or_else(|| rec.get("annotation_score"));
    let gold = match gold_value {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => {
            Some(s.trim().parse::<f64>().map_err(|_| ("gold".to_string(), format!("not a number: {s:?}")))?)
        }
        Some(_) => return Err(("gold".into(), "not a number".into())),
    };
    if let Some(g) = gold
        && (g < dim.scale.0 as f64 || g > dim.scale.1 as f64)
    {
        return Err(("gold".into(), format!("{g} is outside {}'s scale {}..={}", dim.id, dim.scale.0, dim.scale.1)));
    }
    let preds = PRED_SUFFIXES.iter().map(|s| number(rec.get(&format!("pred_{lang}{s}")))).collect();
    let response_messages = src.get("response_messages");
    let response = response_messages.and_then(|r| r.get("response")).map(py_str);
    let response_model = rec.get("response_messages").and_then(|r| r.get("model")).filter(|m| !m.is_null()).map(py_str);

    Ok(Item {
        key: format!("{}/{record_id}/{lang}", dim.id),
        record_key: format!("{}/{record_id}", dim.id),
        dimension: dim.id.clone(),
        lang: lang.to_string(),
        record_id: record_id.to_string(),
        index,
        character_name,
        character_profile,
        user_name: user_name.map(py_str).unwrap_or_default(),
        user_profile,
        greeting,
        messages,
        judge_profile,
        judge_dialogue,
        user_query,
        speaker,
        target_slot,
        target,
        response,
        response_model,
        gold,
        preds,
        data_source: rec.get("data_source").filter(|v| !v.is_null()).map(py_str),
    })
}
