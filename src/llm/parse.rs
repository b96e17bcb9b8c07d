//! Output parsers: turn an LLM answer into typed fields, or say precisely why it
//! cannot be used (the LLM stage appends that reason and asks again). Each parser
//! declares its output columns so schemas are known before anything runs, and
//! tells the offline provider which shape to produce.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use synth_core::data::arrow::datatypes::{DataType, Field};

use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;

/// Parses one answer.
pub trait Parser: Send + Sync {
    /// Columns this parser adds.
    fn fields(&self) -> Vec<Field>;
    /// Parse an answer; `record` is the input record (for context such as a role name).
    fn parse(&self, text: &str, record: &Row) -> Result<Row, String>;
    /// What the offline provider should produce (`profile`, `dialogue`, `json:a,b`...).
    fn expect(&self) -> String;
    /// Parse and check an answer against its record: what the `llm` stage calls. The
    /// default is [`Parser::parse`], a rejection of kind `validation`; a parser whose
    /// checks have their own failure kind (e.g. an edit that repeats its input,
    /// `degenerate_pair`) overrides it. The stage re-asks with the reason either way and
    /// records the last rejection's kind when no attempt is accepted.
    fn accept(&self, text: &str, record: &Row) -> Result<Row, Rejection> {
        self.check(self.parse(text, record).map_err(Rejection::invalid)?, record)
    }
    /// Checks of parsed fields against their record that have their own failure kind
    /// (shared by text and structured answers); the default accepts.
    fn check(&self, fields: Row, _record: &Row) -> Result<Row, Rejection> {
        Ok(fields)
    }
    /// What a stage's content checks read when a check names no `fields` (field
    /// selectors, `quality::select`): by default every column this parser adds; a parser
    /// leaves out what it derives from the others (a text rendered from the parsed
    /// sections) or what is not text (a turn's speaker).
    fn checked_fields(&self) -> Vec<String> {
        self.fields().iter().map(|f| f.name().clone()).collect()
    }
    /// The top-level keys of a structured (JSON) answer this parser reads; empty when it
    /// reads text only. A stage's `schema` must declare and require them.
    fn json_keys(&self) -> Vec<String> {
        Vec::new()
    }
    /// Read a structured answer (a JSON object already valid against the stage's schema):
    /// exactly the columns [`Parser::parse`] gives for the text answer with the same content,
    /// with the same checks.
    fn parse_json(&self, _answer: &Map<String, Value>, _record: &Row) -> Result<Row, String> {
        Err("this parser reads text answers only".into())
    }
    /// [`Parser::parse_json`] and [`Parser::check`]: what the `llm` stage calls for a
    /// structured answer.
    fn accept_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, Rejection> {
        self.check(self.parse_json(answer, record).map_err(Rejection::invalid)?, record)
    }
}

/// The string under `key` of a structured answer (a number or boolean as its JSON text).
pub fn json_text<'a>(answer: &'a Map<String, Value>, key: &str) -> Result<std::borrow::Cow<'a, str>, String> {
    match answer.get(key) {
        Some(Value::String(s)) => Ok(std::borrow::Cow::Borrowed(s)),
        Some(Value::Null) | None => Err(format!("the JSON object has no \"{key}\"")),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(std::borrow::Cow::Owned(v.to_string())),
        Some(v) => Err(format!("\"{key}\" must be text, found {v}")),
    }
}

/// Why an answer was not accepted: the reason (sent back to the model when it is asked
/// again) and the failure kind recorded when every attempt was rejected.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub kind: FailureKind,
    pub reason: String,
}

impl Rejection {
    /// The answer does not parse or breaks the parser's format rules.
    pub fn invalid(reason: String) -> Rejection {
        Rejection { kind: FailureKind::Validation, reason }
    }
}

/// A parser kind: name, options, constructor.
pub struct ParserKind {
    pub name: &'static str,
    pub about: &'static str,
    pub options: &'static [OptionSpec],
    pub build: fn(&Value) -> Result<Box<dyn Parser>, String>,
}

impl std::fmt::Debug for ParserKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ParserKind({})", self.name)
    }
}

/// The engine's parsers; a method registers its own ([`crate::methods`], found
/// through the registry).
pub static GENERIC: &[&ParserKind] = &[&TEXT, &JSON, &SCORE, &NUMBER];

/// The parser called `name` among `kinds`.
pub fn find(kinds: &[&'static ParserKind], name: &str) -> Option<&'static ParserKind> {
    kinds.iter().copied().find(|k| k.name == name)
}

/// Parser options with their declared defaults filled in.
pub fn with_defaults(specs: &[OptionSpec], given: &Value) -> Value {
    let mut obj = given.as_object().cloned().unwrap_or_default();
    for s in specs {
        if !obj.contains_key(s.name)
            && let Some(d) = s.default_json()
        {
            obj.insert(s.name.to_string(), d);
        }
    }
    Value::Object(obj)
}

fn options<T: for<'de> Deserialize<'de> + Default>(v: &Value) -> Result<T, String> {
    if v.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(v.clone()).map_err(|e| format!("bad parser options: {e}"))
}

// --- text

pub static TEXT: ParserKind = ParserKind {
    name: "text",
    about: "the answer as text (trimmed unless trim = false), in column `text` (or `column`)",
    options: &[
        OptionSpec::default("min_chars", synth_core::config::options::UINT, "1", "shorter answers are rejected"),
        OptionSpec::default("column", Ty::Str, "\"text\"", "name of the output column"),
        OptionSpec::default("trim", Ty::Bool, "true", "trim surrounding whitespace"),
        OptionSpec::default(
            "shape",
            Ty::Str,
            "\"text\"",
            "the answer shape the offline provider imitates (e.g. \"score\" for judge prompts); the text is kept as it is",
        ),
        OptionSpec::optional(
            "json_key",
            Ty::Str,
            "a structured answer (`schema`): the key holding the text (default: `column`); a number is kept as its JSON text",
        ),
    ],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            #[serde(default)]
            json_key: Option<String>,
            #[serde(default)]
            min_chars: Option<usize>,
            #[serde(default)]
            shape: Option<String>,
            #[serde(default)]
            column: Option<String>,
            #[serde(default)]
            trim: Option<bool>,
        }
        let o: O = options(v)?;
        let column = o.column.unwrap_or_else(|| "text".into());
        Ok(Box::new(TextParser {
            min_chars: o.min_chars.unwrap_or(1),
            shape: o.shape.unwrap_or_else(|| "text".into()),
            json_key: o.json_key.unwrap_or_else(|| column.clone()),
            column,
            trim: o.trim.unwrap_or(true),
        }))
    },
};

struct TextParser {
    min_chars: usize,
    shape: String,
    column: String,
    json_key: String,
    trim: bool,
}

impl Parser for TextParser {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new(&self.column, DataType::Utf8, false)]
    }
    fn parse(&self, text: &str, _: &Row) -> Result<Row, String> {
        let t = if self.trim { text.trim() } else { text };
        if t.trim().chars().count() < self.min_chars {
            return Err(format!("the answer is shorter than {} characters", self.min_chars));
        }
        Ok(Row::from_iter([(self.column.clone(), Value::String(t.to_string()))]))
    }
    fn expect(&self) -> String {
        self.shape.clone()
    }
    fn json_keys(&self) -> Vec<String> {
        vec![self.json_key.clone()]
    }
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&json_text(answer, &self.json_key)?, record)
    }
}

// --- json

pub static JSON: ParserKind = ParserKind {
    name: "json",
    about: "a JSON object (fences allowed); `fields` names the keys and their types",
    options: &[OptionSpec::required(
        "fields",
        Ty::Map(&Ty::Enum(data::TYPE_NAMES)),
        "key = type, for every key to extract",
    )],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            fields: BTreeMap<String, String>,
        }
        let o: O = options(v)?;
        if o.fields.is_empty() {
            return Err("the json parser needs `fields`".into());
        }
        let fields = o
            .fields
            .into_iter()
            .map(|(k, t)| {
                data::parse_type_name(&t).map(|dt| (k.clone(), dt, t == "json")).ok_or(format!("unknown type {t}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(JsonParser { fields }))
    },
};

struct JsonParser {
    fields: Vec<(String, DataType, bool)>,
}

/// The JSON object inside an answer (a ```json fence or the outermost braces).
pub fn extract_json_object(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    let t = text.trim();
    let inner = if let Some(start) = t.find("```") {
        let rest = &t[start + 3..];
        let rest = rest.strip_prefix("json").unwrap_or(rest);
        rest.split("```").next().unwrap_or(rest)
    } else {
        t
    };
    let (s, e) = (inner.find('{'), inner.rfind('}'));
    let body = match (s, e) {
        (Some(s), Some(e)) if e > s => &inner[s..=e],
        _ => return Err("the answer contains no JSON object".into()),
    };
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("the answer is JSON but not an object".into()),
        Err(e) => Err(format!("the answer is not valid JSON: {e}")),
    }
}

impl Parser for JsonParser {
    fn fields(&self) -> Vec<Field> {
        self.fields.iter().map(|(n, t, _)| Field::new(n, t.clone(), true)).collect()
    }
    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        self.parse_json(&extract_json_object(text)?, record)
    }
    fn json_keys(&self) -> Vec<String> {
        self.fields.iter().map(|(n, _, _)| n.clone()).collect()
    }
    fn parse_json(&self, obj: &Map<String, Value>, _: &Row) -> Result<Row, String> {
        let mut out = Row::new();
        for (name, ty, as_json) in &self.fields {
            let v = obj.get(name).ok_or_else(|| format!("the JSON object has no key \"{name}\""))?;
            let v = match (ty, as_json) {
                (_, true) => Value::String(v.to_string()),
                (DataType::Utf8, false) => match v {
                    Value::String(s) => Value::String(s.clone()),
                    other => Value::String(other.to_string()),
                },
                (DataType::Int64 | DataType::Int32, _) => {
                    v.as_i64().map(Value::from).ok_or_else(|| format!("\"{name}\" must be an integer, found {v}"))?
                }
                (DataType::Float64 | DataType::Float32, _) => {
                    v.as_f64().map(Value::from).ok_or_else(|| format!("\"{name}\" must be a number, found {v}"))?
                }
                (DataType::Boolean, _) => v
                    .as_bool()
                    .map(Value::from)
                    .ok_or_else(|| format!("\"{name}\" must be true or false, found {v}"))?,
                _ => v.clone(),
            };
            out.insert(name.clone(), v);
        }
        Ok(out)
    }
    fn expect(&self) -> String {
        format!("json:{}", self.fields.iter().map(|(n, _, _)| n.as_str()).collect::<Vec<_>>().join(","))
    }
}

// --- score

pub static SCORE: ParserKind = ParserKind {
    name: "score",
    about: "a judge score such as `Score: 1` (the \"Score:\" prefix is optional), column `score`",
    options: &[OptionSpec::default("values", Ty::List(&synth_core::config::options::INT), "[0, 1]", "accepted scores")],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            #[serde(default)]
            values: Option<Vec<i64>>,
        }
        let o: O = options(v)?;
        Ok(Box::new(ScoreParser { values: o.values.unwrap_or_else(|| vec![0, 1]) }))
    },
};

struct ScoreParser {
    values: Vec<i64>,
}

/// The integer after an optional `Score:` prefix (a judge's `Score: 1`).
pub fn parse_score(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = t.strip_prefix("Score:").or_else(|| t.strip_prefix("score:")).unwrap_or(t).trim();
    t.parse::<i64>().ok()
}

impl Parser for ScoreParser {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new("score", DataType::Int64, false)]
    }
    fn parse(&self, text: &str, _: &Row) -> Result<Row, String> {
        match parse_score(text) {
            Some(s) if self.values.contains(&s) => Ok(Row::from_iter([("score".to_string(), Value::from(s))])),
            Some(s) => Err(format!("score {s} is not one of {:?}", self.values)),
            None => Err("answer with the score only, e.g. \"Score: 1\"".into()),
        }
    }
    fn expect(&self) -> String {
        "score".into()
    }
    fn json_keys(&self) -> Vec<String> {
        vec!["score".into()]
    }
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&json_text(answer, "score")?, record)
    }
}

// --- number

pub static NUMBER: ParserKind = ParserKind {
    name: "number",
    about: "a numeric score (float): the first line read as Python's float() (`mode = \"first_line\"`, a fine-tuned judge's bare number), a JSON object's key then regexes (`\"json\"`), or the first match of regexes (`\"search\"`); `fallback` scores an unreadable answer instead of re-asking and flags it in `<column>_fallback`; `min`/`max` (or per-row `min_column`/`max_column`) clamp",
    options: &[
        OptionSpec::default(
            "mode",
            Ty::Enum(&["first_line", "json", "search"]),
            "\"first_line\"",
            "where the number is read",
        ),
        OptionSpec::default(
            "column",
            Ty::Str,
            "\"score\"",
            "output column (a Float64; `<column>_fallback` flags fallbacks)",
        ),
        OptionSpec::default("key", Ty::Str, "\"score\"", "mode = json: the key holding the number"),
        OptionSpec::default(
            "patterns",
            Ty::StrList,
            "[\"\\\"score\\\"\\\\s*:\\\\s*\\\"?(-?\\\\d+(?:\\\\.\\\\d+)?)\"]",
            "mode = json (after the key) or search: regexes tried in order; the first capture group (or the match) is the number",
        ),
        OptionSpec::optional(
            "echo_column",
            Ty::Str,
            "mode = first_line: a column with the prompt; \"Human: <prompt>\\nAssistant: \" is removed from the answer first (an echoing server)",
        ),
        OptionSpec::optional(
            "fallback",
            synth_core::config::options::NUMBER,
            "score of an unreadable answer (else it is re-asked, then fails)",
        ),
        OptionSpec::optional("min", synth_core::config::options::NUMBER, "clamp below"),
        OptionSpec::optional("max", synth_core::config::options::NUMBER, "clamp above"),
        OptionSpec::optional("min_column", Ty::Str, "clamp below at this column's value of the record"),
        OptionSpec::optional("max_column", Ty::Str, "clamp above at this column's value of the record"),
        OptionSpec::default("shape", Ty::Str, "\"number\"", "the answer shape the offline provider imitates"),
    ],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
            #[serde(default)]
            mode: Option<String>,
            #[serde(default)]
            column: Option<String>,
            #[serde(default)]
            key: Option<String>,
            #[serde(default)]
            patterns: Option<Vec<String>>,
            #[serde(default)]
            echo_column: Option<String>,
            #[serde(default)]
            fallback: Option<f64>,
            #[serde(default)]
            min: Option<f64>,
            #[serde(default)]
            max: Option<f64>,
            #[serde(default)]
            min_column: Option<String>,
            #[serde(default)]
            max_column: Option<String>,
            #[serde(default)]
            shape: Option<String>,
        }
        let o: O = options(v)?;
        let mode = match o.mode.as_deref().unwrap_or("first_line") {
            "first_line" => NumberMode::FirstLine,
            "json" => NumberMode::Json,
            "search" => NumberMode::Search,
            other => return Err(format!("unknown mode \"{other}\" (first_line, json, search)")),
        };
        let patterns = o
            .patterns
            .unwrap_or_else(|| vec![DEFAULT_SCORE_PATTERN.to_string()])
            .iter()
            .map(|p| regex::Regex::new(p).map_err(|e| format!("bad pattern {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if mode == NumberMode::Search && patterns.is_empty() {
            return Err("mode = \"search\" needs at least one pattern".into());
        }
        Ok(Box::new(NumberParser {
            mode,
            column: o.column.unwrap_or_else(|| "score".into()),
            key: o.key.unwrap_or_else(|| "score".into()),
            patterns,
            echo_column: o.echo_column,
            fallback: o.fallback,
            min: o.min,
            max: o.max,
            min_column: o.min_column,
            max_column: o.max_column,
            shape: o.shape.unwrap_or_else(|| "number".into()),
        }))
    },
};

/// The default regex of the `number` parser: a JSON-ish `"score": 3` anywhere.
pub const DEFAULT_SCORE_PATTERN: &str = r#""score"\s*:\s*"?(-?\d+(?:\.\d+)?)"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumberMode {
    FirstLine,
    Json,
    Search,
}

struct NumberParser {
    mode: NumberMode,
    column: String,
    key: String,
    patterns: Vec<regex::Regex>,
    echo_column: Option<String>,
    fallback: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    min_column: Option<String>,
    max_column: Option<String>,
    shape: String,
}

/// Python's `float(text)`: surrounding whitespace (Unicode), a sign, digits with single
/// underscores between them, a decimal point, an exponent, `inf` / `infinity` / `nan` in
/// any case; full-width digits (U+FF10..U+FF19) read as digits, as Python reads every
/// Unicode decimal digit. `None` where Python raises `ValueError`.
pub fn python_float(text: &str) -> Option<f64> {
    let t = text.trim_matches(|c: char| c.is_whitespace());
    if t.is_empty() {
        return None;
    }
    let mut s = String::with_capacity(t.len());
    let mut prev_digit = false;
    let chars: Vec<char> = t.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let c = match c {
            '\u{ff10}'..='\u{ff19}' => char::from(b'0' + (c as u32 - 0xff10) as u8),
            c => c,
        };
        if c == '_' {
            // PEP 515: only between two digits.
            let next_digit =
                chars.get(i + 1).is_some_and(|n| n.is_ascii_digit() || ('\u{ff10}'..='\u{ff19}').contains(n));
            if !(prev_digit && next_digit) {
                return None;
            }
            continue;
        }
        prev_digit = c.is_ascii_digit();
        s.push(c);
    }
    let body = s.strip_prefix(['+', '-']).unwrap_or(&s);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return s.parse::<f64>().ok();
    }
    // Rust accepts forms Python does not ("infinity" handled above); Python's grammar:
    // digits [. digits] | . digits, then an optional exponent.
    let valid = {
        let (mantissa, exp) = match lower.split_once('e') {
            Some((m, e)) => (m, Some(e)),
            None => (lower.as_str(), None),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits = |d: &str| d.chars().all(|c| c.is_ascii_digit());
        let mantissa_ok = digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty());
        let exp_ok = exp.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && digits(e)
        });
        mantissa_ok && exp_ok
    };
    if !valid {
        return None;
    }
    s.parse::<f64>().ok()
}

impl NumberParser {
    /// The number in an answer, or why there is none.
    fn read(&self, text: &str, record: &Row) -> Result<f64, String> {
        match self.mode {
            NumberMode::FirstLine => {
                let mut t = text.to_string();
                if let Some(col) = &self.echo_column
                    && let Some(prompt) = record.get(col).and_then(Value::as_str)
                {
                    t = t.replace(&format!("Human: {prompt}\nAssistant: "), "");
                }
                let line = t.split('\n').next().unwrap_or_default();
                python_float(line).ok_or_else(|| {
                    if t.contains('\n') {
                        format!("the first line is not a number: {:?}", truncate(line, 60))
                    } else {
                        format!("the answer is not a number: {:?}", truncate(&t, 60))
                    }
                })
            }
            NumberMode::Json => {
                if let Ok(obj) = extract_json_object(text)
                    && let Some(v) = obj.get(&self.key)
                {
                    let n = match v {
                        Value::Number(n) => n.as_f64(),
                        Value::String(s) => python_float(s),
                        _ => None,
                    };
                    if let Some(n) = n {
                        return Ok(n);
                    }
                }
                self.search(text).ok_or_else(|| {
                    format!("no number under \"{}\" in a JSON object, e.g. {{\"{}\": 3}}", self.key, self.key)
                })
            }
            NumberMode::Search => self.search(text).ok_or_else(|| "the answer contains no score".to_string()),
        }
    }

    fn search(&self, text: &str) -> Option<f64> {
        self.patterns.iter().find_map(|re| {
            let caps = re.captures(text)?;
            python_float(caps.get(1).or_else(|| caps.get(0))?.as_str())
        })
    }

    fn bound(&self, fixed: Option<f64>, column: &Option<String>, record: &Row) -> Option<f64> {
        column.as_ref().and_then(|c| record.get(c)).and_then(Value::as_f64).or(fixed)
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

impl Parser for NumberParser {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new(&self.column, DataType::Float64, false),
            Field::new(format!("{}_fallback", self.column), DataType::Boolean, false),
        ]
    }
    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        self.finish(self.read(text, record), record)
    }
    fn json_keys(&self) -> Vec<String> {
        vec![self.key.clone()]
    }
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        let read = match answer.get(&self.key) {
            Some(Value::Number(n)) => n.as_f64().ok_or_else(|| format!("\"{}\" is not a number: {n}", self.key)),
            Some(Value::String(s)) => {
                python_float(s).ok_or_else(|| format!("\"{}\" is not a number: {:?}", self.key, truncate(s, 60)))
            }
            Some(v) => Err(format!("\"{}\" must be a number, found {v}", self.key)),
            None => Err(format!("the JSON object has no \"{}\"", self.key)),
        };
        self.finish(read, record)
    }
    fn expect(&self) -> String {
        self.shape.clone()
    }
}

impl NumberParser {
    /// The columns of a number read (or not) from an answer: fallback, clamping.
    fn finish(&self, read: Result<f64, String>, record: &Row) -> Result<Row, String> {
        let (value, fallback) = match (read, self.fallback) {
            (Ok(v), _) if v.is_finite() => (v, false),
            (Ok(v), None) => return Err(format!("the score must be a finite number, found {v}")),
            (Ok(_), Some(f)) | (Err(_), Some(f)) => (f, true),
            (Err(e), None) => return Err(e),
        };
        let mut v = value;
        if !fallback {
            if let Some(lo) = self.bound(self.min, &self.min_column, record) {
                v = v.max(lo);
            }
            if let Some(hi) = self.bound(self.max, &self.max_column, record) {
                v = v.min(hi);
            }
        }
        Ok(Row::from_iter([
            (self.column.clone(), Value::from(v)),
            (format!("{}_fallback", self.column), Value::Bool(fallback)),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(name: &str, options: &Value) -> Result<Box<dyn Parser>, String> {
        (find(GENERIC, name).expect("engine parser").build)(options)
    }

    #[test]
    fn generic_parsers() {
        let row = Row::new();
        let p = build("json", &serde_json::json!({"fields": {"a": "utf8", "n": "int64"}})).unwrap();
        let out = p.parse("Sure!\n```json\n{\"a\": \"x\", \"n\": 3}\n```", &row).unwrap();
        assert_eq!(out["a"], "x");
        assert_eq!(out["n"], 3);
        assert!(p.parse("{\"a\": 1}", &row).unwrap_err().contains("no key \"n\""));
        let s = build("score", &Value::Null).unwrap();
        assert_eq!(s.parse("Score: 1", &row).unwrap()["score"], 1);
        assert_eq!(s.parse(" 0 ", &row).unwrap()["score"], 0);
        assert!(s.parse("Score: maybe", &row).is_err());
        assert!(s.parse("Score: 7", &row).is_err());
        assert!(build("text", &Value::Null).unwrap().parse("   ", &row).is_err());
    }

    #[test]
    fn structured_answers_give_the_text_columns() {
        let row = Row::new();
        let obj = |v: Value| v.as_object().unwrap().clone();
        let j = build("json", &serde_json::json!({"fields": {"a": "utf8", "n": "int64"}})).unwrap();
        assert_eq!(j.json_keys(), ["a", "n"]);
        let text = j.parse("{\"a\": \"x\", \"n\": 3}", &row).unwrap();
        assert_eq!(j.parse_json(&obj(serde_json::json!({"a": "x", "n": 3})), &row).unwrap(), text);
        let s = build("score", &Value::Null).unwrap();
        assert_eq!(s.parse_json(&obj(serde_json::json!({"score": 1})), &row).unwrap(), s.parse("1", &row).unwrap());
        assert!(s.parse_json(&obj(serde_json::json!({"score": 4})), &row).is_err());
        let t = build("text", &serde_json::json!({"column": "reply", "json_key": "answer"})).unwrap();
        assert_eq!(t.json_keys(), ["answer"]);
        assert_eq!(
            t.parse_json(&obj(serde_json::json!({"answer": " hi "})), &row).unwrap(),
            t.parse(" hi ", &row).unwrap()
        );
        let n = build("number", &serde_json::json!({"max": 5.0})).unwrap();
        assert_eq!(n.parse_json(&obj(serde_json::json!({"score": 9})), &row).unwrap(), n.parse("9", &row).unwrap());
        assert_eq!(n.parse_json(&obj(serde_json::json!({"score": "2.5"})), &row).unwrap()["score"], 2.5);
        assert!(n.parse_json(&obj(serde_json::json!({"score": "high"})), &row).is_err());
    }

    #[test]
    fn number_parser_reads_like_python() {
        for (t, v) in [
            (" 2 ", Some(2.0)),
            ("3.5", Some(3.5)),
            ("1_0", Some(10.0)),
            ("+4", Some(4.0)),
            ("1e1", Some(10.0)),
            (".5", Some(0.5)),
            ("5.", Some(5.0)),
            ("３", Some(3.0)),
            ("\u{3000}2\t", Some(2.0)),
            ("nan", None),
            ("inf", None),
            ("评分：2", None),
            ("1__0", None),
            ("_1", None),
            ("", None),
            ("0x10", None),
            ("1.2.3", None),
            ("e5", None),
        ] {
            let got = python_float(t).filter(|v| v.is_finite());
            assert_eq!(got, v, "{t:?}");
        }
        assert!(python_float("NaN").unwrap().is_nan());
        assert_eq!(python_float("-Infinity"), Some(f64::NEG_INFINITY));
        let row = Row::new();
        let p = build("number", &serde_json::json!({"fallback": 3.0})).unwrap();
        let read = |p: &dyn Parser, t: &str| {
            let r = p.parse(t, &row).unwrap();
            (r["score"].as_f64().unwrap(), r["score_fallback"].as_bool().unwrap())
        };
        assert_eq!(read(p.as_ref(), "2"), (2.0, false));
        assert_eq!(read(p.as_ref(), "3\n理由：……"), (3.0, false));
        assert_eq!(read(p.as_ref(), "评分：2"), (3.0, true));
        assert_eq!(read(p.as_ref(), "好\n2"), (3.0, true));
        let strict = build("number", &Value::Null).unwrap();
        assert!(strict.parse("评分：2", &row).unwrap_err().contains("not a number"));
        assert!(strict.parse("x\n2", &row).unwrap_err().contains("first line"));
        let echo = build("number", &serde_json::json!({"echo_column": "prompt"})).unwrap();
        let rec = Row::from_iter([("prompt".to_string(), Value::from("Q?"))]);
        assert_eq!(echo.parse("Human: Q?\nAssistant: 4", &rec).unwrap()["score"], 4.0);
        let json =
            build("number", &serde_json::json!({"mode": "json", "max_column": "scale_max", "min": 1.0})).unwrap();
        let rec = Row::from_iter([("scale_max".to_string(), Value::from(4))]);
        assert_eq!(json.parse("```json\n{\"explanation\": \"...\", \"score\": 3}\n```", &rec).unwrap()["score"], 3.0);
        assert_eq!(json.parse("{\"score\": 9}", &rec).unwrap()["score"], 4.0);
        assert_eq!(json.parse("broken {\"score\": 2, \"explanation\": \"unterminated", &rec).unwrap()["score"], 2.0);
        assert!(json.parse("no score here", &rec).is_err());
        let search =
            build("number", &serde_json::json!({"mode": "search", "patterns": ["评分：(\\d+(\\.\\d{1,3})?)"]}))
                .unwrap();
        assert_eq!(search.parse("评分：2.5\n...", &row).unwrap()["score"], 2.5);
    }
}
