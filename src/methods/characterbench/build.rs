//! Construction of CharacterBench-style data (paper §3; the construction prompts are
//! unpublished, so every prompt and rule here is a reconstruction, [R]): the per-dimension
//! plan (`pipelines/prompts/characterbench/build/plan.json`: where a dimension's target comes
//! from — the profile, the dialogue context, a hand-written behaviour description (BCh), an
//! immoral setting (MR) or nothing (dense dimensions) — and what the target and the user's
//! query must be), the hand-written lists of `rules/characterbench/` (read with `file:line`
//! errors), the dialogue-context parser's rules, and the release-layout record a finished
//! script becomes (the target placed at its dimension's path, so the release reader reads
//! it back exactly as it reads the official files).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::bench::Dimension;

/// One dimension's construction rule.
#[derive(Debug, Clone, Deserialize)]
pub struct DimPlan {
    /// `profile`, `context`, `style` (a behaviour description), `setting` (an immoral setting) or `none`.
    pub target_from: String,
    /// What the target is, per language (empty when none is extracted).
    pub target: BTreeMap<String, String>,
    /// What the user's query must do, per language.
    pub query: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct BuildPlan {
    pub dimensions: BTreeMap<String, DimPlan>,
    pub morality_categories: BTreeMap<String, Vec<String>>,
}

pub const TARGET_FROM: &[&str] = &["profile", "context", "style", "setting", "none"];

impl BuildPlan {
    pub fn read(path: &Path) -> Result<BuildPlan, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let plan: BuildPlan = serde_json::from_str(&text)
            .map_err(|e| format!("{}: line {} column {}: {e}", path.display(), e.line(), e.column()))?;
        for (d, p) in &plan.dimensions {
            if !TARGET_FROM.contains(&p.target_from.as_str()) {
                return Err(format!(
                    "{}: dimension \"{d}\": target_from \"{}\" (one of {})",
                    path.display(),
                    p.target_from,
                    TARGET_FROM.join(", ")
                ));
            }
        }
        Ok(plan)
    }
}

/// A tab-separated list with a header naming its columns; rows as column → value.
/// A row with a different field count is an error naming `file:line`.
pub fn read_tsv(path: &Path) -> Result<Vec<BTreeMap<String, String>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().ok_or_else(|| format!("{}: empty (a header line is needed)", path.display()))?;
    let cols: Vec<&str> = header.split('\t').collect();
    let mut out = Vec::new();
    for (i, line) in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != cols.len() {
            return Err(format!(
                "{}:{}: {} fields, the header has {} ({})",
                path.display(),
                i + 1,
                fields.len(),
                cols.len(),
                cols.join(", ")
            ));
        }
        out.push(cols.iter().map(|c| c.to_string()).zip(fields.iter().map(|f| f.to_string())).collect());
    }
    Ok(out)
}

/// The column `lang` of a list, every row non-empty (`file:line` otherwise).
pub fn column(path: &Path, rows: &[BTreeMap<String, String>], lang: &str) -> Result<Vec<String>, String> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| match r.get(lang) {
            Some(v) if !v.trim().is_empty() => Ok(v.clone()),
            Some(_) => Err(format!("{}: row {}: empty {lang} text", path.display(), i + 1)),
            None => Err(format!("{}: no column \"{lang}\"", path.display())),
        })
        .collect()
}

/// A dialogue turn of a script: `user` or `character`.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub speaker: String,
    pub utterance: String,
}

/// A generated dialogue context: JSON `{"dialogue": [{speaker, utterance}, ...]}` (or the
/// list alone), or `<user label>：...` / `<name>：...` lines. It must have at least
/// `min_turns` turns, start with the user, alternate, and end with the character (the
/// query is the next, user's, turn).
pub fn parse_dialogue(text: &str, name: &str, user: &str, min_turns: usize) -> Result<Vec<Turn>, String> {
    let from_json = |v: &Value| -> Option<Vec<Turn>> {
        let list = v.get("dialogue").unwrap_or(v).as_array()?;
        list.iter()
            .map(|t| {
                let sp = t.get("speaker")?.as_str()?.trim().to_lowercase();
                let speaker = match sp.as_str() {
                    "user" | "用户" => "user",
                    "character" | "assistant" | "角色" => "character",
                    s if s == name.to_lowercase() => "character",
                    _ => return None,
                };
                Some(Turn { speaker: speaker.into(), utterance: t.get("utterance")?.as_str()?.trim().to_string() })
            })
            .collect()
    };
    let json_turns =
        synth_llm::parse::extract_json_object(text).ok().and_then(|m| from_json(&Value::Object(m))).or_else(|| {
            let t = text.trim();
            let (s, e) = (t.find('[')?, t.rfind(']')?);
            serde_json::from_str::<Value>(&t[s..=e]).ok().and_then(|v| from_json(&v))
        });
    let turns = match json_turns {
        Some(t) => t,
        None => {
            let mut turns = Vec::new();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let (who, what) = line
                    .split_once('：')
                    .or_else(|| line.split_once(':'))
                    .ok_or_else(|| format!("a line is not \"speaker: utterance\": {line:?}"))?;
                let who = who.trim();
                let speaker = if who == user || who.eq_ignore_ascii_case("user") {
                    "user"
                } else if who == name || who.eq_ignore_ascii_case("character") {
                    "character"
                } else {
                    return Err(format!("unknown speaker {who:?} (expected {user:?} or {name:?})"));
                };
                turns.push(Turn { speaker: speaker.into(), utterance: what.trim().to_string() });
            }
            turns
        }
    };
    if turns.len() < min_turns {
        return Err(format!("the dialogue has {} turns; write at least {min_turns}", turns.len()));
    }
    for (i, t) in turns.iter().enumerate() {
        let want = if i % 2 == 0 { "user" } else { "character" };
        if t.speaker != want {
            return Err(format!("turn {} is the {}'s; the user speaks first and the two alternate", i + 1, t.speaker));
        }
        if t.utterance.is_empty() {
            return Err(format!("turn {} is empty", i + 1));
        }
    }
    if turns.len() % 2 == 1 {
        return Err("the character must speak last (the test query is the user's next turn)".into());
    }
    Ok(turns)
}

/// The context as the prompts show it: `<user>：...` / `<name>：...` lines.
pub fn transcript(turns: &[Turn], name: &str, user: &str) -> String {
    turns.iter().map(|t| format!("{}：{}\n", if t.speaker == "user" { user } else { name }, t.utterance)).collect()
}

/// What a finished script holds.
pub struct Script<'a> {
    pub id: i64,
    pub lang: &'a str,
    pub character_name: &'a str,
    pub character_profile: &'a str,
    pub user_name: Option<&'a str>,
    pub user_profile: Option<&'a str>,
    pub greeting: Option<&'a str>,
    pub context: &'a [Turn],
    pub query: &'a str,
    pub target: Option<&'a str>,
    pub generator: &'a str,
}

fn set_path(root: &mut Map<String, Value>, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().expect("a path");
    let mut cur = root;
    for p in parts {
        cur = cur.entry(p.to_string()).or_insert_with(|| json!({})).as_object_mut().expect("objects along the path");
    }
    cur.insert(last.to_string(), value);
}

/// A script as a record of the release layout (no response yet; human scores null). The
/// text sits at the top level; with `lang = en` the same text is also the record's
/// `translation_en` (what the release reader's English view reads).
pub fn record(dim: &Dimension, s: &Script<'_>) -> Value {
    let mut dialogue: Vec<Value> = s
        .context
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"turn": i / 2 + 1, "speaker": t.speaker, "utterance": t.utterance}))
        .collect();
    dialogue.push(json!({"turn": s.context.len() / 2 + 1, "speaker": "user", "utterance": s.query}));
    let mut text = Map::new();
    text.insert("character_name".into(), json!(s.character_name));
    text.insert("character_profile".into(), json!(s.character_profile));
    text.insert("user_name".into(), json!(s.user_name.unwrap_or(if s.lang == "zh" { "用户" } else { "User" })));
    if let Some(p) = s.user_profile {
        text.insert("user_profile".into(), json!(p));
    }
    text.insert("greeting".into(), json!(s.greeting.unwrap_or_default()));
    text.insert("dialogue".into(), Value::Array(dialogue));
    text.insert("messages".into(), json!({"model": s.generator, "speaker": "user", "response": s.query}));
    text.insert("response_messages".into(), json!({}));
    if let (Some(t), Some(target)) = (&dim.target, s.target) {
        let value = if t.render == "lines" { json!([target]) } else { json!(target) };
        set_path(&mut text, &t.path, value);
    }
    let mut rec = Map::new();
    rec.insert("id".into(), json!(s.id));
    for (k, v) in &text {
        rec.insert(k.clone(), v.clone());
    }
    rec.insert("data_source".into(), json!("synth characterbench-build"));
    rec.insert("annotation_score".into(), Value::Null);
    rec.insert("gold".into(), Value::Null);
    if s.lang == "en" {
        rec.insert("translation_en".into(), Value::Object(text));
    }
    Value::Object(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialogues() {
        let json = "```json\n{\"dialogue\": [{\"speaker\": \"user\", \"utterance\": \"hi\"}, {\"speaker\": \"character\", \"utterance\": \"hello\"}]}\n```";
        let t = parse_dialogue(json, "Ann", "User", 2).unwrap();
        assert_eq!(t[1], Turn { speaker: "character".into(), utterance: "hello".into() });
        assert!(parse_dialogue(json, "Ann", "User", 4).unwrap_err().contains("at least 4"));
        let lines = "用户：你好\n小雨：你好呀\n用户：在忙吗\n小雨：刚忙完";
        assert_eq!(parse_dialogue(lines, "小雨", "用户", 4).unwrap().len(), 4);
        assert!(
            parse_dialogue("用户：你好\n小雨：嗯\n用户：好", "小雨", "用户", 2).unwrap_err().contains("speak last")
        );
        assert!(parse_dialogue("小雨：嗯\n用户：好", "小雨", "用户", 2).unwrap_err().contains("speaks first"));
        assert!(parse_dialogue("路人：嗯\n用户：好", "小雨", "用户", 2).unwrap_err().contains("unknown speaker"));
        assert_eq!(transcript(&t, "Ann", "User"), "User：hi\nAnn：hello\n");
    }
}
