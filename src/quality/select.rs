//! Field selectors: which texts of a record a check reads. `name` is a column (all
//! the text inside it, however nested), `name[]` each item of a list, `name[].key` a
//! key of each item, `name[key=value].key2` a key of the items whose `key` is `value`
//! (case-insensitive): `turns[role=Assistant].content` is what the role said; `*` is
//! every column but the record id.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// One step of a selector.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    /// Each item of a list, optionally only those whose `key` is `value`.
    Items(Option<(String, String)>),
}

/// A parsed selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    text: String,
    steps: Vec<Step>,
}

/// A text a selector found, with where it is (`skills[2].name`): borrowed from the record,
/// or owned when it was inside a column of JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct Found<'a> {
    pub at: String,
    pub text: Cow<'a, str>,
}

impl Selector {
    /// Parse `turns[role=Assistant].content`; an error says what is wrong.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let bad = |why: &str| Err(format!("field selector \"{text}\": {why}"));
        let mut steps = Vec::new();
        let mut rest = text.trim();
        if rest.is_empty() {
            return bad("empty");
        }
        if rest == "*" {
            return Ok(Selector::all());
        }
        while !rest.is_empty() {
            let rest_after_dot = if steps.is_empty() {
                rest
            } else if let Some(r) = rest.strip_prefix('.') {
                r
            } else if rest.starts_with('[') {
                rest
            } else {
                return bad("expected `.` or `[` between parts");
            };
            rest = rest_after_dot;
            if let Some(r) = rest.strip_prefix('[') {
                let Some(end) = r.find(']') else { return bad("`[` without `]`") };
                let inside = r[..end].trim();
                let filter = if inside.is_empty() {
                    None
                } else {
                    match inside.split_once('=') {
                        Some((k, v)) if !k.trim().is_empty() => Some((k.trim().to_string(), v.trim().to_string())),
                        _ => return bad("a list filter is `[key=value]`"),
                    }
                };
                steps.push(Step::Items(filter));
                rest = &r[end + 1..];
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                let key = rest[..end].trim();
                if key.is_empty() {
                    return bad("an empty name");
                }
                if key.contains([']', '=', '*']) {
                    return bad("a name holds `]`, `=` or `*`");
                }
                steps.push(Step::Key(key.to_string()));
                rest = &rest[end..];
            }
        }
        Ok(Selector { text: text.trim().to_string(), steps })
    }

    /// Every column but the record id.
    pub fn all() -> Selector {
        Selector { text: "*".into(), steps: Vec::new() }
    }

    /// The column the selector starts at.
    pub fn column(&self) -> Option<&str> {
        match self.steps.first() {
            Some(Step::Key(k)) => Some(k),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The texts this selector finds in `row` (strings only; numbers and booleans are not
    /// text), in document order.
    pub fn find<'a>(&self, row: &'a Map<String, Value>) -> Vec<Found<'a>> {
        let mut out = Vec::new();
        if self.steps.is_empty() {
            for (k, v) in row.iter().filter(|(k, _)| k.as_str() != synth_core::data::ID) {
                leaves(v, k.clone(), &mut out);
            }
            return out;
        }
        let Some(Step::Key(first)) = self.steps.first() else { return out };
        if let Some(v) = row.get(first) {
            walk(v, &self.steps[1..], first.clone(), &mut out);
        }
        out
    }
}

fn walk<'a>(v: &'a Value, steps: &[Step], at: String, out: &mut Vec<Found<'a>>) {
    // A column holding JSON text (a list or object stored as a string) is walked into.
    if let (Value::String(s), Some(_)) = (v, steps.first())
        && let Ok(parsed @ (Value::Array(_) | Value::Object(_))) = serde_json::from_str::<Value>(s)
    {
        let mut found = Vec::new();
        walk(&parsed, steps, at, &mut found);
        // The texts live in the parsed copy: keep them by value.
        out.extend(found.into_iter().map(|f| Found { at: f.at, text: Cow::Owned(f.text.into_owned()) }));
        return;
    }
    match steps.first() {
        None => leaves(v, at, out),
        Some(Step::Key(k)) => {
            if let Some(next) = v.as_object().and_then(|o| o.get(k)) {
                walk(next, &steps[1..], format!("{at}.{k}"), out);
            }
        }
        Some(Step::Items(filter)) => {
            let Some(items) = v.as_array() else { return };
            for (i, item) in items.iter().enumerate() {
                if let Some((key, want)) = filter {
                    let got = item.get(key).and_then(Value::as_str).unwrap_or_default();
                    if !got.eq_ignore_ascii_case(want) {
                        continue;
                    }
                }
                walk(item, &steps[1..], format!("{at}[{i}]"), out);
            }
        }
    }
}

/// Every string under `v`.
fn leaves<'a>(v: &'a Value, at: String, out: &mut Vec<Found<'a>>) {
    match v {
        Value::String(s) => out.push(Found { at, text: Cow::Borrowed(s) }),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                leaves(item, format!("{at}[{i}]"), out);
            }
        }
        Value::Object(m) => {
            for (k, item) in m {
                leaves(item, format!("{at}.{k}"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn selectors_find_texts() {
        let r = row(json!({
            "turns": [{"role": "User", "content": "hi"}, {"role": "Assistant", "content": "hello"}],
            "skills": [{"name": "a", "description": "b"}],
            "n": 3,
        }));
        let s = Selector::parse("turns[role=assistant].content").unwrap();
        assert_eq!(s.find(&r), vec![Found { at: "turns[1].content".into(), text: "hello".into() }]);
        let all = Selector::parse("skills").unwrap().find(&r);
        assert_eq!(all.iter().map(|f| f.at.as_str()).collect::<Vec<_>>(), ["skills[0].name", "skills[0].description"]);
        assert_eq!(Selector::parse("turns[].content").unwrap().find(&r).len(), 2);
        assert!(Selector::parse("n").unwrap().find(&r).is_empty());
        assert!(Selector::parse("missing").unwrap().find(&r).is_empty());
        assert_eq!(Selector::parse("*").unwrap().find(&r).len(), 6);
        // A column of JSON text is walked into.
        let j = row(json!({"context": "[{\"speaker\": \"user\", \"utterance\": \"hi\"}]"}));
        let f = Selector::parse("context[].utterance").unwrap().find(&j);
        assert_eq!(f, vec![Found { at: "context[0].utterance".into(), text: "hi".into() }]);
        assert_eq!(Selector::parse("context").unwrap().find(&j).len(), 1);
        for bad in ["", "a[", "a[=x]", "a..b", "a]b"] {
            assert!(Selector::parse(bad).is_err(), "{bad:?}");
        }
    }
}
