//! Output parsers: turn an LLM answer into typed fields, or say precisely why it
//! cannot be used (the LLM stage appends that reason and asks again). Each parser
//! declares its output columns so schemas are known before anything runs, and
//! tells the offline provider which shape to produce.

use std::collections::BTreeMap;

use arrow::datatypes::{DataType, Field};
use serde::Deserialize;
use serde_json::Value;

use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::store::failures::FailureKind;

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
        self.parse(text, record).map_err(Rejection::invalid)
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
pub static GENERIC: &[&ParserKind] = &[&TEXT, &JSON, &SCORE];

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
        OptionSpec::default("min_chars", crate::config::options::UINT, "1", "shorter answers are rejected"),
        OptionSpec::default("column", Ty::Str, "\"text\"", "name of the output column"),
        OptionSpec::default("trim", Ty::Bool, "true", "trim surrounding whitespace"),
        OptionSpec::default(
            "shape",
            Ty::Str,
            "\"text\"",
            "the answer shape the offline provider imitates (e.g. \"score\" for judge prompts); the text is kept as it is",
        ),
    ],
    build: |v| {
        #[derive(Deserialize, Default)]
        struct O {
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
        Ok(Box::new(TextParser {
            min_chars: o.min_chars.unwrap_or(1),
            shape: o.shape.unwrap_or_else(|| "text".into()),
            column: o.column.unwrap_or_else(|| "text".into()),
            trim: o.trim.unwrap_or(true),
        }))
    },
};

struct TextParser {
    min_chars: usize,
    shape: String,
    column: String,
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
    fn parse(&self, text: &str, _: &Row) -> Result<Row, String> {
        let obj = extract_json_object(text)?;
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
    options: &[OptionSpec::default("values", Ty::List(&crate::config::options::INT), "[0, 1]", "accepted scores")],
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
}
