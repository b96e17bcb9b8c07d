//! Parsers for the RoleMRC answer formats: the standardized role profile of
//! Appendix D / Figure 13 (seven sections, speech examples with topic, narration
//! and content), the `**User**:` / `**Name**:` dialogues of Figure 14, and the
//! stylized answers of Figure 15 (an optional narration in parentheses).
//!
//! The dialogue and stylized parsers can take their variant per record: with
//! `first_column` / `narration_column` set, the named input column (a string
//! `"role"`/`"user"`/`"any"`, or a boolean for narration) overrides the static
//! `first` / `narration` option for that record; a null or missing value falls
//! back to the static option, any other value is a parse error naming the column.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, Fields};

use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::Row;
use synth_core::store::failures::FailureKind;
use synth_llm::parse::{Parser, ParserKind, Rejection, json_text};

pub static KINDS: &[&ParserKind] = &[&PROFILE, &DIALOGUE, &STYLIZED];

fn options<T: for<'de> Deserialize<'de> + Default>(v: &Value) -> Result<T, String> {
    if v.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(v.clone()).map_err(|e| format!("bad parser options: {e}"))
}

fn list_of(fields: Vec<Field>) -> DataType {
    DataType::List(std::sync::Arc::new(Field::new("item", DataType::Struct(Fields::from(fields)), true)))
}

fn named_items() -> DataType {
    list_of(vec![Field::new("name", DataType::Utf8, true), Field::new("description", DataType::Utf8, true)])
}

// ------------------------------------------------------------------ profile

/// The seven sections, with the words that identify their headings.
pub const SECTIONS: [(&str, &[&str]); 7] = [
    ("Role Name and Brief Description", &["role name", "brief description"]),
    ("Specific Abilities and Skills", &["abilities", "skills"]),
    ("Speech Style", &["speech style", "speaking style"]),
    ("Personality Characteristics", &["personality"]),
    ("Past Experience and Background", &["experience", "background"]),
    ("Ability and Knowledge Boundaries", &["boundar"]),
    ("Speech Examples", &["speech example", "example"]),
];

pub static PROFILE: ParserKind = ParserKind {
    name: "profile",
    about: "a standardized role profile (Appendix D): seven sections, at least one speech example",
    options: &[OptionSpec::default("min_speech_examples", POSITIVE, "1", "fewer speech examples are rejected")],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            #[serde(default)]
            min_speech_examples: Option<usize>,
        }
        let o: O = options(v)?;
        Ok(Box::new(ProfileParser { min_examples: o.min_speech_examples.unwrap_or(1) }))
    },
};

struct ProfileParser {
    min_examples: usize,
}

/// A parsed role profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub role_name: String,
    pub identification: String,
    pub description: String,
    pub skills: Vec<(String, String)>,
    pub speech_style: String,
    pub personality: Vec<(String, String)>,
    pub experience: Vec<String>,
    pub boundaries: String,
    /// (topic, narration, content)
    pub speech_examples: Vec<(String, String, String)>,
}

/// The section a heading line opens: `#... Title`, `**Title**` (also `**Title**:`), with an
/// optional number; a bare numbered line (`1. Role Name and Brief Description`) only when it
/// is exactly a section title, since list items are numbered too.
fn heading_of(line: &str) -> Option<usize> {
    let t = line.trim();
    let bold = t.trim_end_matches(':');
    let marked = t.starts_with('#') || (bold.starts_with("**") && bold.ends_with("**") && bold.len() > 4);
    let text = t.trim_matches(|c| c == '#' || c == '*' || c == ' ' || c == ':').to_lowercase();
    let text = text.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == ')' || c == ' ');
    if marked {
        SECTIONS.iter().position(|(_, keys)| keys.iter().any(|k| text.contains(k)))
    } else if t.starts_with(|c: char| c.is_ascii_digit()) {
        SECTIONS.iter().position(|(title, _)| title.eq_ignore_ascii_case(text))
    } else {
        None
    }
}

/// A markdown horizontal rule (`---`, `***`, `___`).
fn is_rule(t: &str) -> bool {
    t.len() >= 3 && ['-', '*', '_'].iter().any(|&c| t.chars().all(|x| x == c))
}

/// `Label: text`, `**Label:** text` or `**Label**: text` → `text`.
fn strip_label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let t = line.trim().trim_start_matches(['-', '*', ' ']);
    let rest = t.get(label.len()..).filter(|_| t[..label.len()].eq_ignore_ascii_case(label))?;
    let rest = rest.trim_start_matches('*').trim_start().strip_prefix(':')?;
    Some(rest.trim_start_matches('*').trim())
}

/// Strip a list marker (`1.`, `2)`, `-`, `*`) from a line.
fn strip_marker(line: &str) -> &str {
    let t = line.trim();
    let no_num = t.trim_start_matches(|c: char| c.is_ascii_digit());
    if no_num.len() < t.len() && (no_num.starts_with(". ") || no_num.starts_with(") ")) {
        return no_num[2..].trim();
    }
    t.strip_prefix("- ").or_else(|| t.strip_prefix("* ")).or_else(|| t.strip_prefix("• ")).unwrap_or(t).trim()
}

fn items(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| strip_marker(l).to_string()).filter(|l| !l.is_empty()).collect()
}

fn name_desc(item: &str) -> (String, String) {
    match item.split_once(':') {
        Some((n, d)) if n.chars().count() <= 80 => {
            (n.trim().trim_matches('*').trim().to_string(), d.trim_start_matches('*').trim().to_string())
        }
        _ => (item.trim().to_string(), String::new()),
    }
}

/// `(narration) content` or `"(narration) content"` → (narration, content).
pub fn split_narration(text: &str) -> (String, String) {
    let t = text.trim().trim_matches(|c| c == '"' || c == '“' || c == '”').trim();
    if t.starts_with('(')
        && let Some(end) = t.find(')')
    {
        let narration = t[1..end].trim().to_string();
        let content = t[end + 1..].trim().trim_matches(|c| c == '"' || c == '“' || c == '”').trim().to_string();
        return (narration, content);
    }
    (String::new(), t.to_string())
}

/// The `Topic:` of a speech example → (topic, rest).
fn example_topic(item: &str) -> Option<(&str, &str)> {
    let (t, rest) = item.split_once(':')?;
    let topic = t.trim().trim_matches('*').trim();
    let ok = t.chars().count() <= 80 && !t.contains('(') && !t.starts_with(['"', '“']) && !topic.is_empty();
    ok.then(|| (topic, rest.trim_start_matches('*')))
}

/// Speech examples as (topic, narration, content). An example starts with a list marker,
/// a `Topic:` or a narration/quote; a line right after it (no blank line between) continues
/// it; any other line is chatter and ignored (as are unnumbered lines once the examples
/// are numbered, e.g. a trailing `Note: ...`).
fn speech_examples(lines: &[&str]) -> Vec<(String, String, String)> {
    let mut raw: Vec<String> = Vec::new();
    let mut numbered = false;
    let mut after_blank = true;
    for line in lines {
        let t = line.trim();
        if t.is_empty() {
            after_blank = true;
            continue;
        }
        let item = strip_marker(t);
        let marked = item.len() < t.len();
        let starts = marked || example_topic(item).is_some() || item.starts_with(['(', '"', '“']);
        if starts && (marked || !numbered) {
            numbered |= marked && raw.is_empty();
            raw.push(item.to_string());
        } else if let (false, Some(last)) = (after_blank, raw.last_mut()) {
            last.push(' ');
            last.push_str(item);
        }
        after_blank = false;
    }
    raw.iter()
        .filter_map(|item| {
            let (topic, rest) = example_topic(item).unwrap_or(("", item));
            let (narration, content) = split_narration(rest);
            (!content.is_empty()).then(|| (topic.to_string(), narration, content))
        })
        .collect()
}

/// Parse a profile, saying which part is missing when it is not usable. Lines before the
/// first heading are ignored, and so are lines after a closing code fence or a horizontal
/// rule until the next heading (chatter around the profile, markdown decoration).
pub fn parse_profile(text: &str, min_examples: usize) -> Result<Profile, String> {
    let mut sections: [Option<Vec<&str>>; 7] = Default::default();
    let mut current: Option<usize> = None;
    let mut in_fence = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") || is_rule(t) {
            let closing = t.starts_with("```") && in_fence;
            in_fence ^= t.starts_with("```");
            if closing || is_rule(t) {
                current = None;
            }
            continue;
        }
        if let Some(idx) = heading_of(line) {
            // "Speech Examples" also matches the generic "example": only take it when unseen.
            if sections[idx].is_none() {
                sections[idx] = Some(Vec::new());
                current = Some(idx);
                continue;
            }
        }
        // Blank lines are kept: they separate speech examples from chatter.
        if let Some(idx) = current {
            sections[idx].as_mut().expect("open section").push(line);
        }
    }
    let missing: Vec<&str> = SECTIONS
        .iter()
        .zip(&sections)
        .filter(|(_, s)| s.as_ref().is_none_or(|l| l.iter().all(|x| x.trim().is_empty())))
        .map(|((n, _), _)| *n)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the profile is missing or has an empty section: {} (use the headings ####{} ...)",
            missing.join(", "),
            SECTIONS[0].0
        ));
    }
    let speech = sections[6].clone().expect("checked");
    let s: Vec<Vec<&str>> = sections
        .into_iter()
        .map(|s| s.expect("checked").into_iter().filter(|l| !l.trim().is_empty()).collect())
        .collect();
    let identification = match strip_label(s[0][0], "Identification") {
        Some(rest) => rest.to_string(),
        None => s[0][0].trim().trim_matches('*').trim().to_string(),
    };
    let role_name = identification
        .split([',', '(', '–', '—'])
        .next()
        .unwrap_or("")
        .split(" the ")
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if role_name.is_empty() {
        return Err(
            "the first section must start with the role's name (e.g. \"Thorin Ironfoot, the Creative Dwarf\")".into()
        );
    }
    let description = s[0][1..].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    let description = strip_label(&description, "Description").unwrap_or(&description).to_string();
    if description.is_empty() {
        return Err("the first section needs a description after the name line".into());
    }
    let speech_examples = speech_examples(&speech);
    if speech_examples.len() < min_examples {
        return Err(format!(
            "the profile needs at least {min_examples} speech example(s), each \"Topic: \\\"(narration) words\\\"\""
        ));
    }
    Ok(Profile {
        role_name,
        identification,
        description,
        skills: items(&s[1]).iter().map(|i| name_desc(i)).collect(),
        speech_style: s[2].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "),
        personality: items(&s[3]).iter().map(|i| name_desc(i)).collect(),
        experience: items(&s[4]),
        boundaries: s[5].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "),
        speech_examples,
    })
}

impl Profile {
    /// The canonical text of the profile, with or without the narration of speech examples.
    pub fn render(&self, narration: bool) -> String {
        let mut out = String::new();
        let numbered = |out: &mut String, list: &[(String, String)]| {
            for (i, (n, d)) in list.iter().enumerate() {
                if d.is_empty() {
                    out.push_str(&format!("{}. {n}\n", i + 1));
                } else {
                    out.push_str(&format!("{}. {n}: {d}\n", i + 1));
                }
            }
        };
        out.push_str(&format!("####{}\n{}\n{}\n", SECTIONS[0].0, self.identification, self.description));
        out.push_str(&format!("####{}\n", SECTIONS[1].0));
        numbered(&mut out, &self.skills);
        out.push_str(&format!("####{}\n{}\n", SECTIONS[2].0, self.speech_style));
        out.push_str(&format!("####{}\n", SECTIONS[3].0));
        numbered(&mut out, &self.personality);
        out.push_str(&format!("####{}\n", SECTIONS[4].0));
        for (i, e) in self.experience.iter().enumerate() {
            out.push_str(&format!("{}. {e}\n", i + 1));
        }
        out.push_str(&format!("####{}\n{}\n", SECTIONS[5].0, self.boundaries));
        out.push_str(&format!("####{}\n", SECTIONS[6].0));
        for (i, (topic, narr, content)) in self.speech_examples.iter().enumerate() {
            let speech = if narration && !narr.is_empty() { format!("({narr}) {content}") } else { content.clone() };
            let topic = if topic.is_empty() { String::new() } else { format!("{topic}: ") };
            out.push_str(&format!("{}. {topic}\"{speech}\"\n", i + 1));
        }
        out.trim_end().to_string()
    }

    pub fn to_row(&self) -> Row {
        let pairs = |l: &[(String, String)]| -> Value {
            Value::Array(l.iter().map(|(n, d)| json!({"name": n, "description": d})).collect())
        };
        let mut r = Row::new();
        r.insert("role_name".into(), json!(self.role_name));
        r.insert("identification".into(), json!(self.identification));
        r.insert("description".into(), json!(self.description));
        r.insert("skills".into(), pairs(&self.skills));
        r.insert("speech_style".into(), json!(self.speech_style));
        r.insert("personality".into(), pairs(&self.personality));
        r.insert("experience".into(), json!(self.experience));
        r.insert("boundaries".into(), json!(self.boundaries));
        r.insert(
            "speech_examples".into(),
            Value::Array(
                self.speech_examples
                    .iter()
                    .map(|(t, n, c)| json!({"topic": t, "narration": n, "content": c}))
                    .collect(),
            ),
        );
        r.insert("profile_text".into(), json!(self.render(true)));
        r.insert("profile_text_no_narration".into(), json!(self.render(false)));
        r
    }
}

impl Parser for ProfileParser {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new("role_name", DataType::Utf8, false),
            Field::new("identification", DataType::Utf8, false),
            Field::new("description", DataType::Utf8, false),
            Field::new("skills", named_items(), false),
            Field::new("speech_style", DataType::Utf8, false),
            Field::new("personality", named_items(), false),
            Field::new(
                "experience",
                DataType::List(std::sync::Arc::new(Field::new("item", DataType::Utf8, true))),
                false,
            ),
            Field::new("boundaries", DataType::Utf8, false),
            Field::new(
                "speech_examples",
                list_of(vec![
                    Field::new("topic", DataType::Utf8, true),
                    Field::new("narration", DataType::Utf8, true),
                    Field::new("content", DataType::Utf8, true),
                ]),
                false,
            ),
            Field::new("profile_text", DataType::Utf8, false),
            Field::new("profile_text_no_narration", DataType::Utf8, false),
        ]
    }
    fn parse(&self, text: &str, _: &Row) -> Result<Row, String> {
        Ok(parse_profile(text, self.min_examples)?.to_row())
    }
    fn expect(&self) -> String {
        // The offline stand-in's revision after the shape name (v2: a persona without an
        // article is kept whole, no two skills or far topics alike).
        "profile:v2".into()
    }
    fn checked_fields(&self) -> Vec<String> {
        // The two texts are rendered from the sections: checked through them.
        let derived = ["profile_text", "profile_text_no_narration"];
        self.fields().iter().map(|f| f.name().clone()).filter(|n| !derived.contains(&n.as_str())).collect()
    }
    fn json_keys(&self) -> Vec<String> {
        PROFILE_KEYS.iter().map(|k| k.to_string()).collect()
    }
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&profile_text(answer)?, record)
    }
}

/// The keys of a structured profile, one per part of the seven sections (named after the
/// sections: a small model sees each key before it writes the value).
const PROFILE_KEYS: [&str; 8] = [
    "role_name",
    "brief_description",
    "specific_abilities_and_skills",
    "speech_style",
    "personality_characteristics",
    "past_experience_and_background",
    "ability_and_knowledge_boundaries",
    "speech_examples",
];

/// A text on one line: line breaks and runs of whitespace as one space (a field of the
/// text protocol is one line; a break inside it would open another item).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn json_list<'a>(answer: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>, String> {
    match answer.get(key) {
        Some(Value::Array(items)) => Ok(items),
        Some(v) => Err(format!("\"{key}\" must be a list, found {v}")),
        None => Err(format!("the JSON object has no \"{key}\"")),
    }
}

fn json_item<'a>(item: &'a Value, key: &str, list: &str) -> Result<&'a Map<String, Value>, String> {
    item.as_object().ok_or_else(|| format!("each item of \"{list}\" must be an object with \"{key}\", found {item}"))
}

/// A structured profile as the text of the seven sections (Appendix D's layout, as
/// [`Profile::render`] writes it), which [`parse_profile`] then reads: a JSON answer gives
/// the columns a text answer with the same content gives, with the same checks.
pub fn profile_text(answer: &Map<String, Value>) -> Result<String, String> {
    let line = |key: &str| json_text(answer, key).map(|t| one_line(&t));
    let mut out = String::new();
    let numbered = |out: &mut String, key: &str| -> Result<(), String> {
        for (i, item) in json_list(answer, key)?.iter().enumerate() {
            let text = match item {
                Value::String(s) => one_line(s),
                other => {
                    let obj = json_item(other, "name", key)?;
                    let name = one_line(&json_text(obj, "name")?);
                    let desc = one_line(&json_text(obj, "description")?);
                    if desc.is_empty() { name } else { format!("{name}: {desc}") }
                }
            };
            out.push_str(&format!("{}. {text}\n", i + 1));
        }
        Ok(())
    };
    let [name, desc, skills, style, personality, experience, boundaries, examples] = PROFILE_KEYS;
    out.push_str(&format!("####{}\n{}\n{}\n", SECTIONS[0].0, line(name)?, line(desc)?));
    out.push_str(&format!("####{}\n", SECTIONS[1].0));
    numbered(&mut out, skills)?;
    out.push_str(&format!("####{}\n{}\n", SECTIONS[2].0, line(style)?));
    out.push_str(&format!("####{}\n", SECTIONS[3].0));
    numbered(&mut out, personality)?;
    out.push_str(&format!("####{}\n", SECTIONS[4].0));
    numbered(&mut out, experience)?;
    out.push_str(&format!("####{}\n{}\n", SECTIONS[5].0, line(boundaries)?));
    out.push_str(&format!("####{}\n", SECTIONS[6].0));
    for (i, item) in json_list(answer, examples)?.iter().enumerate() {
        let obj = json_item(item, "speech", examples)?;
        let topic = one_line(&json_text(obj, "topic")?);
        let narration = one_line(&json_text(obj, "narration")?);
        let content = one_line(&json_text(obj, "speech")?);
        let speech = if narration.is_empty() { content } else { format!("({narration}) {content}") };
        let topic = if topic.is_empty() { String::new() } else { format!("{topic}: ") };
        out.push_str(&format!("{}. {topic}\"{speech}\"\n", i + 1));
    }
    Ok(out.trim_end().to_string())
}

// ----------------------------------------------------------------- dialogue

pub static DIALOGUE: ParserKind = ParserKind {
    name: "dialogue",
    about: "a `**User**:` / `**Role Name**:` dialogue: alternating speakers, turn count in range",
    options: &[
        OptionSpec::default("role_column", Ty::Str, "\"role_name\"", "input column holding the role's name"),
        OptionSpec::default("min_turns", POSITIVE, "10", "fewest lines (turns) accepted"),
        OptionSpec::default("max_turns", POSITIVE, "15", "most lines (turns) accepted"),
        OptionSpec::default("first", Ty::Enum(&["any", "role", "user"]), "\"any\"", "who must speak first"),
        OptionSpec::default(
            "narration",
            Ty::Enum(&["keep", "strip", "reject"]),
            "\"keep\"",
            "what to do with narration in parentheses at the start of the role's turns",
        ),
        OptionSpec::optional(
            "first_column",
            Ty::Str,
            "input column whose value (\"role\", \"user\" or \"any\") overrides `first` for that record; \
             null falls back to `first`",
        ),
        OptionSpec::optional(
            "narration_column",
            Ty::Str,
            "boolean input column overriding `narration` for that record: true = \"keep\", false = \"strip\"; \
             null falls back to `narration`",
        ),
    ],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            role_column: Option<String>,
            min_turns: Option<usize>,
            max_turns: Option<usize>,
            first: Option<String>,
            narration: Option<String>,
            first_column: Option<String>,
            narration_column: Option<String>,
        }
        let o: O = options(v)?;
        Ok(Box::new(DialogueParser {
            role_column: o.role_column.unwrap_or_else(|| "role_name".into()),
            min: o.min_turns.unwrap_or(10),
            max: o.max_turns.unwrap_or(15),
            first: o.first.unwrap_or_else(|| "any".into()),
            narration: o.narration.unwrap_or_else(|| "keep".into()),
            first_column: o.first_column,
            narration_column: o.narration_column,
        }))
    },
};

struct DialogueParser {
    role_column: String,
    min: usize,
    max: usize,
    first: String,
    narration: String,
    first_column: Option<String>,
    narration_column: Option<String>,
}

/// The value of `column` in `record`, or `None` when no column is configured or the
/// value is missing or null (the caller then uses its static option).
fn column_value<'a>(record: &'a Row, column: Option<&str>) -> Option<(&'a str, &'a Value)> {
    let column = column?;
    let (name, v) = record.get_key_value(column)?;
    (!v.is_null()).then_some((name.as_str(), v))
}

/// A boolean column choosing between two variants (`when_true`, `when_false`), or
/// `fallback` when the column is unset or null.
fn bool_variant<'a>(
    record: &Row,
    column: Option<&str>,
    when_true: &'a str,
    when_false: &'a str,
    fallback: &'a str,
) -> Result<&'a str, String> {
    match column_value(record, column) {
        None => Ok(fallback),
        Some((_, Value::Bool(b))) => Ok(if *b { when_true } else { when_false }),
        Some((name, v)) => Err(format!("narration column \"{name}\" must be true or false, found {v}")),
    }
}

/// One turn: `User` or `Assistant` (the role), and what was said.
pub fn turns_type() -> DataType {
    list_of(vec![Field::new("role", DataType::Utf8, false), Field::new("content", DataType::Utf8, false)])
}

/// `**Speaker**: text` (also `Speaker: text`) → (speaker, text).
fn speaker_line(line: &str) -> Option<(String, String)> {
    let t = line.trim();
    if let Some(rest) = t.strip_prefix("**") {
        let end = rest.find("**")?;
        let speaker = rest[..end].trim().trim_end_matches(':').trim();
        let after = rest[end + 2..].trim_start();
        let after = after.strip_prefix(':').unwrap_or(after);
        return Some((speaker.to_string(), after.trim().to_string()));
    }
    None
}

fn same_name(a: &str, b: &str) -> bool {
    let a = a.trim().to_lowercase();
    let b = b.trim().to_lowercase();
    a == b || b.split_whitespace().next() == Some(a.as_str()) || a.split_whitespace().next() == Some(b.as_str())
}

/// Parse a dialogue between `role` and the user.
pub fn parse_dialogue(
    text: &str,
    role: &str,
    min: usize,
    max: usize,
    first: &str,
    narration: &str,
) -> Result<Vec<(String, String)>, String> {
    let mut turns: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("```") {
            continue;
        }
        match speaker_line(t) {
            Some((speaker, content)) => {
                let who = if speaker.eq_ignore_ascii_case("user") {
                    "User"
                } else if same_name(&speaker, role) {
                    "Assistant"
                } else {
                    return Err(format!("line {}: speaker \"{speaker}\" is neither User nor {role}", i + 1));
                };
                if turns.last().is_some_and(|(w, _)| w == who) {
                    return Err(format!(
                        "line {}: {} speaks twice in a row; turns must alternate",
                        i + 1,
                        if who == "User" { "User" } else { role }
                    ));
                }
                turns.push((who.to_string(), content));
            }
            None => match turns.last_mut() {
                // A wrapped line continues the previous turn.
                Some((_, content)) => {
                    content.push('\n');
                    content.push_str(t);
                }
                None => return Err(format!("line {}: expected \"**User**: ...\" or \"**{role}**: ...\"", i + 1)),
            },
        }
    }
    if turns.iter().any(|(_, c)| c.trim().is_empty()) {
        return Err("a turn is empty".into());
    }
    if turns.len() < min || turns.len() > max {
        return Err(format!("the dialogue has {} turns; it must have {min} to {max}", turns.len()));
    }
    match (first, turns.first().map(|(w, _)| w.as_str())) {
        ("role", Some("User")) => return Err(format!("the dialogue must start with {role}")),
        ("user", Some("Assistant")) => return Err("the dialogue must start with the user".into()),
        _ => {}
    }
    for (who, content) in &mut turns {
        if who == "Assistant" && content.trim_start().starts_with('(') {
            match narration {
                "strip" => {
                    *content = split_narration(content).1;
                    if content.is_empty() {
                        return Err(format!("a turn of {role} is only narration; it would be empty without it"));
                    }
                }
                "reject" => return Err("narration in parentheses is not allowed in this dialogue".into()),
                _ => {}
            }
        }
    }
    Ok(turns)
}

impl Parser for DialogueParser {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new("turns", turns_type(), false),
            Field::new("n_turns", DataType::Int64, false),
            Field::new("first_speaker", DataType::Utf8, false),
        ]
    }
    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let role = record.get(&self.role_column).and_then(Value::as_str).ok_or_else(|| {
            format!("the record has no role name in column \"{}\" (set parser_options.role_column)", self.role_column)
        })?;
        let first = match column_value(record, self.first_column.as_deref()) {
            None => self.first.as_str(),
            Some((_, Value::String(s))) if matches!(s.as_str(), "role" | "user" | "any") => s.as_str(),
            Some((name, v)) => {
                return Err(format!(
                    "first-speaker column \"{name}\" must be \"role\", \"user\" or \"any\", found {v}"
                ));
            }
        };
        let narration = bool_variant(record, self.narration_column.as_deref(), "keep", "strip", &self.narration)?;
        let turns = parse_dialogue(text, role, self.min, self.max, first, narration)?;
        let first = if turns[0].0 == "User" { "user" } else { "role" };
        let mut r = Row::new();
        r.insert("turns".into(), Value::Array(turns.iter().map(|(w, c)| json!({"role": w, "content": c})).collect()));
        r.insert("n_turns".into(), json!(turns.len()));
        r.insert("first_speaker".into(), json!(first));
        Ok(r)
    }
    fn expect(&self) -> String {
        // v2: the stand-in never repeats a turn (nor a way of citing a passage).
        "dialogue:v2".into()
    }
    fn checked_fields(&self) -> Vec<String> {
        // What was said (a selector: the speakers are not text to check).
        vec!["turns[].content".into()]
    }
    fn json_keys(&self) -> Vec<String> {
        vec!["turns".into()]
    }
    /// `{"turns": [{"speaker", "content"}]}`: the `**Speaker**: content` lines of the text
    /// protocol. A speaker `user` is the user; `role` (or `assistant`) is the role, named
    /// from the record; any other speaker is taken as written (and must be the role's name).
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        let role = record.get(&self.role_column).and_then(Value::as_str).unwrap_or_default();
        let mut text = String::new();
        for item in json_list(answer, "turns")? {
            let turn = json_item(item, "speaker", "turns")?;
            let speaker = one_line(&json_text(turn, "speaker")?);
            let speaker = match speaker.to_lowercase().as_str() {
                "user" => "User".to_string(),
                "role" | "assistant" if !role.is_empty() => role.to_string(),
                _ => speaker,
            };
            let content = json_text(turn, "content")?;
            text.push_str(&format!("**{speaker}**: {}\n", content.trim()));
        }
        self.parse(&text, record)
    }
}

// ---------------------------------------------------------------- stylized

pub static STYLIZED: ParserKind = ParserKind {
    name: "stylized",
    about: "one stylized answer, optionally opening with a narration in parentheses",
    options: &[
        OptionSpec::default(
            "narration",
            Ty::Enum(&["optional", "required", "strip"]),
            "\"optional\"",
            "required: reject answers without a leading narration; strip: remove it",
        ),
        OptionSpec::optional(
            "narration_column",
            Ty::Str,
            "boolean input column overriding `narration` for that record: true = \"optional\", false = \"strip\"; \
             null falls back to `narration`",
        ),
        OptionSpec::optional(
            "differ_from",
            Ty::Str,
            "input column with the answer being edited (the pair's rejected side): an answer equal to it after \
             whitespace normalization is re-asked, and after max_attempts fails as degenerate_pair",
        ),
        OptionSpec::optional(
            "max_similarity",
            Ty::Float(0.0, 1.0),
            "with differ_from: also re-ask an answer whose word-level similarity to it is at least this (1 − word \
             edit distance / longer length)",
        ),
    ],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            narration: Option<String>,
            narration_column: Option<String>,
            differ_from: Option<String>,
            max_similarity: Option<f64>,
        }
        let o: O = options(v)?;
        if o.max_similarity.is_some() && o.differ_from.is_none() {
            return Err("max_similarity needs differ_from (the column it compares with)".into());
        }
        Ok(Box::new(StylizedParser {
            narration: o.narration.unwrap_or_else(|| "optional".into()),
            narration_column: o.narration_column,
            differ_from: o.differ_from,
            max_similarity: o.max_similarity,
        }))
    },
};

struct StylizedParser {
    narration: String,
    narration_column: Option<String>,
    differ_from: Option<String>,
    max_similarity: Option<f64>,
}

/// Clean a stylized answer: drop fences, a leading label, surrounding quotes.
pub fn clean_answer(text: &str) -> String {
    let mut t = text.trim();
    if let Some(rest) = t.strip_prefix("```") {
        let rest = rest.trim_start_matches('`');
        // A language tag on the fence line (```text) is not part of the answer.
        let rest = match rest.split_once('\n') {
            Some((tag, body)) if tag.trim().chars().all(|c| c.is_ascii_alphanumeric() || "-_+".contains(c)) => body,
            _ => rest,
        };
        t = rest.trim_end().trim_end_matches('`').trim();
    }
    for label in ["<Edited Answer>", "Edited Answer:", "Edited answer:"] {
        if let Some(rest) = t.strip_prefix(label) {
            t = rest.trim();
        }
    }
    t.to_string()
}

impl Parser for StylizedParser {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new("reply", DataType::Utf8, false),
            Field::new("narration", DataType::Utf8, true),
            Field::new("content", DataType::Utf8, false),
        ]
    }
    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let mode = bool_variant(record, self.narration_column.as_deref(), "optional", "strip", &self.narration)?;
        let reply = clean_answer(text);
        if reply.is_empty() {
            return Err("the answer is empty".into());
        }
        let (narration, content) = split_narration(&reply);
        if content.is_empty() {
            return Err("the answer has a narration but no words".into());
        }
        if mode == "required" && narration.is_empty() {
            return Err("the answer must start with a narration in parentheses, e.g. (She smiles) ...".into());
        }
        let (reply, narration) =
            if mode == "strip" { (content.clone(), String::new()) } else { (reply.clone(), narration) };
        let mut r = Row::new();
        r.insert("reply".into(), json!(reply));
        r.insert("narration".into(), if narration.is_empty() { Value::Null } else { json!(narration) });
        r.insert("content".into(), json!(content));
        Ok(r)
    }
    fn checked_fields(&self) -> Vec<String> {
        // `reply` is the narration and the content together.
        vec!["narration".into(), "content".into()]
    }
    fn expect(&self) -> String {
        // The offline stand-in's revision after the shape name: cached offline answers of
        // an older stand-in (which could repeat the answer it edits) are not reused.
        // v3: a ruled rewrite never pads or lists by repeating a sentence, and two roles
        // never answer alike.
        "stylized:v3".into()
    }
    fn json_keys(&self) -> Vec<String> {
        vec!["narration".into(), "answer".into()]
    }
    /// `{"narration": "...", "answer": "..."}`: the text `(narration) answer` (an empty
    /// narration: the answer alone).
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        let narration = one_line(&json_text(answer, "narration")?);
        let words = json_text(answer, "answer")?;
        let text = if narration.is_empty() { words.to_string() } else { format!("({narration}) {words}") };
        self.parse(&text, record)
    }
    fn check(&self, fields: Row, record: &Row) -> Result<Row, Rejection> {
        let Some(column) = &self.differ_from else { return Ok(fields) };
        let edited = match record.get(column) {
            Some(Value::String(s)) if !s.trim().is_empty() => s,
            // Nothing to compare with (e.g. a request that is not one side of a pair).
            Some(Value::Null) | None | Some(Value::String(_)) => return Ok(fields),
            Some(v) => return Err(Rejection::invalid(format!("column \"{column}\" must be text, found {v}"))),
        };
        let reply = fields.get("reply").and_then(Value::as_str).unwrap_or_default();
        match crate::pairs::degenerate(reply, edited, self.max_similarity) {
            None => Ok(fields),
            Some(why) => Err(Rejection {
                kind: FailureKind::DegeneratePair,
                reason: format!(
                    "the edited answer must not repeat the given answer, but {why}; edit it as the requirements say"
                ),
            }),
        }
    }
}
