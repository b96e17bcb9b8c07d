//! `characterbench_response`: a role-play model's answer to the official prompt, which
//! asks for `{"response": "..."}`. Read as JSON (in a code fence or bare, the outermost
//! braces), then as a Python literal (`{'response': '...'}`, what the official
//! `eval()` also accepts), then, unless `plain_text = false`, the whole answer as the
//! reply with `<column>_fallback = true` (recorded, so the share of unstructured answers
//! is visible). `parity_cleanup` applies the official `process.py` rewrite first (remove
//! "```" and "json", `，`→`,`, `。`→`.` in the whole answer, P7): it changes the Chinese
//! reply the judge sees, so it is off by default. Columns: `<column>` (the reply text),
//! `<column>_object` (the parsed object as JSON, for `parity_dict_repr`),
//! `<column>_fallback`.

use serde::Deserialize;
use serde_json::{Map, Value};
use synth_core::data::arrow::datatypes::{DataType, Field};

use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::Row;
use synth_core::data::python::py_str;
use synth_llm::parse::{Parser, ParserKind, extract_json_object};

pub static KINDS: &[&ParserKind] = &[&RESPONSE, &DIALOGUE];

/// The offline shapes of the method's answers (`super::offline`).
pub const RESPONSE_SHAPE: &str = "characterbench_response";
pub const JUDGE_SHAPE: &str = "characterbench_judge";
pub const DIALOGUE_SHAPE: &str = "characterbench_dialogue";

pub static RESPONSE: ParserKind = ParserKind {
    name: "characterbench_response",
    about: "a role-play reply {\"response\": ...} (JSON, fenced or bare, or a Python dict literal; plain text as a recorded fallback): columns <column>, <column>_object, <column>_fallback",
    options: &[
        OptionSpec::default("column", Ty::Str, "\"reply\"", "output column of the reply text"),
        OptionSpec::default("key", Ty::Str, "\"response\"", "the key holding the reply"),
        OptionSpec::default(
            "plain_text",
            Ty::Bool,
            "true",
            "an answer with no object is the reply itself (flagged), instead of re-asked",
        ),
        OptionSpec::default(
            "parity_cleanup",
            Ty::Bool,
            "false",
            "apply process.py's rewrite first (remove ``` and json, ，→, 。→.; alters the reply, P7)",
        ),
    ],
    build: |v| {
        #[derive(Deserialize)]
        struct O {
            column: Option<String>,
            key: Option<String>,
            plain_text: Option<bool>,
            parity_cleanup: Option<bool>,
        }
        let o: O = serde_json::from_value(if v.is_null() { Value::Object(Map::new()) } else { v.clone() })
            .map_err(|e| format!("bad parser options: {e}"))?;
        Ok(Box::new(ResponseParser {
            column: o.column.unwrap_or_else(|| "reply".into()),
            key: o.key.unwrap_or_else(|| "response".into()),
            plain_text: o.plain_text.unwrap_or(true),
            parity_cleanup: o.parity_cleanup.unwrap_or(false),
        }))
    },
};

struct ResponseParser {
    column: String,
    key: String,
    plain_text: bool,
    parity_cleanup: bool,
}

/// The official `process.py` rewrite of a model's whole answer before `eval()`.
pub fn official_cleanup(text: &str) -> String {
    text.replace("```", "").replace("json", "").replace('，', ",").replace('。', ".").trim().to_string()
}

/// The reply object in an answer: JSON first, then a Python dict literal.
pub fn reply_object(text: &str) -> Option<Map<String, Value>> {
    if let Ok(m) = extract_json_object(text) {
        return Some(m);
    }
    let t = text.trim();
    let t = t.strip_prefix("```").map(|r| r.strip_prefix("json").unwrap_or(r)).unwrap_or(t);
    let start = t.find('{')?;
    let end = t.rfind('}')?;
    if end <= start {
        return None;
    }
    match python_literal(&t[start..=end])? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// A Python literal (dict, list, str, number, True/False/None) as JSON, or `None`.
pub fn python_literal(text: &str) -> Option<Value> {
    let chars: Vec<char> = text.chars().collect();
    let mut p = Lit { s: &chars, i: 0 };
    let v = p.value()?;
    p.ws();
    (p.i == chars.len()).then_some(v)
}

struct Lit<'a> {
    s: &'a [char],
    i: usize,
}

impl Lit<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn value(&mut self) -> Option<Value> {
        self.ws();
        match *self.s.get(self.i)? {
            '{' => {
                self.i += 1;
                let mut m = Map::new();
                if self.eat('}') {
                    return Some(Value::Object(m));
                }
                loop {
                    let k = match self.value()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    if !self.eat(':') {
                        return None;
                    }
                    let v = self.value()?;
                    m.insert(k, v);
                    if self.eat(',') {
                        if self.eat('}') {
                            return Some(Value::Object(m));
                        }
                        continue;
                    }
                    return self.eat('}').then_some(Value::Object(m));
                }
            }
            '[' => {
                self.i += 1;
                let mut items = Vec::new();
                if self.eat(']') {
                    return Some(Value::Array(items));
                }
                loop {
                    items.push(self.value()?);
                    if self.eat(',') {
                        if self.eat(']') {
                            return Some(Value::Array(items));
                        }
                        continue;
                    }
                    return self.eat(']').then_some(Value::Array(items));
                }
            }
            q @ ('\'' | '"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    let c = *self.s.get(self.i)?;
                    self.i += 1;
                    match c {
                        c if c == q => return Some(Value::String(out)),
                        '\\' => {
                            let e = *self.s.get(self.i)?;
                            self.i += 1;
                            match e {
                                'n' => out.push('\n'),
                                't' => out.push('\t'),
                                'r' => out.push('\r'),
                                '\\' | '\'' | '"' => out.push(e),
                                'u' => {
                                    let hex: String = self.s.get(self.i..self.i + 4)?.iter().collect();
                                    self.i += 4;
                                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                                }
                                other => {
                                    out.push('\\');
                                    out.push(other);
                                }
                            }
                        }
                        c => out.push(c),
                    }
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && !matches!(self.s[self.i], ',' | '}' | ']' | ':') {
                    self.i += 1;
                }
                let word: String = self.s[start..self.i].iter().collect::<String>().trim().to_string();
                match word.as_str() {
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    "None" => Some(Value::Null),
                    w => w.parse::<i64>().map(Value::from).ok().or_else(|| w.parse::<f64>().ok().map(Value::from)),
                }
            }
        }
    }
}

impl Parser for ResponseParser {
    fn fields(&self) -> Vec<Field> {
        vec![
            Field::new(&self.column, DataType::Utf8, false),
            Field::new(format!("{}_object", self.column), DataType::Utf8, false),
            Field::new(format!("{}_fallback", self.column), DataType::Boolean, false),
        ]
    }

    fn parse(&self, text: &str, _record: &Row) -> Result<Row, String> {
        let cleaned;
        let text = if self.parity_cleanup {
            cleaned = official_cleanup(text);
            cleaned.as_str()
        } else {
            text
        };
        let (reply, object, fallback) = match reply_object(text) {
            Some(obj) => match obj.get(&self.key) {
                Some(v) => (py_str(v).trim().to_string(), Value::Object(obj.clone()), false),
                None if self.plain_text => return Err(format!("the JSON object has no \"{}\" key", self.key)),
                None => return Err(format!("the JSON object has no \"{}\" key", self.key)),
            },
            None if self.plain_text && !text.trim().is_empty() => {
                let t = text.trim().to_string();
                let mut m = Map::new();
                m.insert(self.key.clone(), Value::String(t.clone()));
                (t, Value::Object(m), true)
            }
            None => return Err(format!("answer with a JSON object such as {{\"{}\": \"...\"}}", self.key)),
        };
        if reply.is_empty() {
            return Err(format!("the \"{}\" is empty", self.key));
        }
        Ok(Row::from_iter([
            (self.column.clone(), Value::String(reply)),
            (format!("{}_object", self.column), Value::String(object.to_string())),
            (format!("{}_fallback", self.column), Value::Bool(fallback)),
        ]))
    }

    fn expect(&self) -> String {
        RESPONSE_SHAPE.into()
    }

    fn json_keys(&self) -> Vec<String> {
        vec![self.key.clone()]
    }

    /// The official prompt's own object (`{"response": "..."}`), read as its text is.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&Value::Object(answer.clone()).to_string(), record)
    }
}

pub static DIALOGUE: ParserKind = ParserKind {
    name: "characterbench_dialogue",
    about: "a generated dialogue context (construction): JSON {\"dialogue\": [{speaker, utterance}]} or speaker：utterance lines; at least min_turns, user first, alternating, the character last; column `context` (JSON list of {speaker, utterance})",
    options: &[
        OptionSpec::default(
            "min_turns",
            synth_core::config::options::POSITIVE,
            "8",
            "fewest turns (the paper's scripts have n >= 5 exchanges)",
        ),
        OptionSpec::default(
            "name_column",
            Ty::Str,
            "\"character_name\"",
            "the record's column with the character's name",
        ),
        OptionSpec::default(
            "lang_column",
            Ty::Str,
            "\"lang\"",
            "the record's column with the language (the user's label: 用户 / User)",
        ),
    ],
    build: |v| {
        #[derive(Deserialize)]
        struct O {
            min_turns: Option<usize>,
            name_column: Option<String>,
            lang_column: Option<String>,
        }
        let o: O = serde_json::from_value(if v.is_null() { Value::Object(Map::new()) } else { v.clone() })
            .map_err(|e| format!("bad parser options: {e}"))?;
        Ok(Box::new(DialogueParser {
            min_turns: o.min_turns.unwrap_or(8),
            name_column: o.name_column.unwrap_or_else(|| "character_name".into()),
            lang_column: o.lang_column.unwrap_or_else(|| "lang".into()),
        }))
    },
};

struct DialogueParser {
    min_turns: usize,
    name_column: String,
    lang_column: String,
}

impl Parser for DialogueParser {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new("context", DataType::Utf8, false)]
    }

    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let name = record.get(&self.name_column).and_then(Value::as_str).unwrap_or_default();
        let user = if record.get(&self.lang_column).and_then(Value::as_str) == Some("zh") { "用户" } else { "User" };
        let turns = super::build::parse_dialogue(text, name, user, self.min_turns)?;
        let list: Vec<Value> =
            turns.iter().map(|t| serde_json::json!({"speaker": t.speaker, "utterance": t.utterance})).collect();
        Ok(Row::from_iter([("context".to_string(), Value::String(Value::Array(list).to_string()))]))
    }

    fn expect(&self) -> String {
        DIALOGUE_SHAPE.into()
    }

    fn json_keys(&self) -> Vec<String> {
        vec!["dialogue".into()]
    }

    /// `{"dialogue": [{speaker, utterance}]}`: one of the layouts a text answer may take.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&Value::Object(answer.clone()).to_string(), record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(opts: Value, text: &str) -> Result<Row, String> {
        (RESPONSE.build)(&opts).unwrap().parse(text, &Row::new())
    }

    #[test]
    fn replies() {
        let r = parse(Value::Null, "```json\n{\"response\": \"（笑）好啊，一起去！\"}\n```").unwrap();
        assert_eq!(r["reply"], "（笑）好啊，一起去！");
        assert_eq!(r["reply_fallback"], false);
        let r = parse(Value::Null, "{'response': '我不去。'}").unwrap();
        assert_eq!(r["reply"], "我不去。");
        assert_eq!(r["reply_object"], "{\"response\":\"我不去。\"}");
        let r = parse(Value::Null, "Sure! Here it is: {\"response\": \"Fine, \\\"ok\\\".\"}").unwrap();
        assert_eq!(r["reply"], "Fine, \"ok\".");
        let r = parse(Value::Null, "我只是随口一说。").unwrap();
        assert_eq!((r["reply"].as_str().unwrap(), r["reply_fallback"].as_bool().unwrap()), ("我只是随口一说。", true));
        assert!(parse(serde_json::json!({"plain_text": false}), "no object").is_err());
        assert!(parse(Value::Null, "{\"reply\": \"x\"}").unwrap_err().contains("no \"response\""));
        assert!(parse(Value::Null, "   ").is_err());
        // The official rewrite changes the reply's punctuation (P7).
        let r =
            parse(serde_json::json!({"parity_cleanup": true}), "```json\n{\"response\": \"好，走吧。\"}\n```").unwrap();
        assert_eq!(r["reply"], "好,走吧.");
        assert_eq!(
            python_literal("{'a': [1, 2.5, True, None], \"b\": 'x\\'y'}").unwrap(),
            serde_json::json!({"a": [1, 2.5, true, null], "b": "x'y"})
        );
    }
}
