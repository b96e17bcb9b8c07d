//! `sharp_stance`: the stance detector's reply (spec §2 `sh_stance_parse`) read
//! tolerantly: JSON, then the Python-literal form the Appendix-A template itself shows
//! (single quotes), then a `Stance: LABEL` pattern, then a reply naming exactly one
//! label. Columns `stance` (FAVOR / AGAINST / NEUTRAL) and `reason` (null when none). A
//! reply with no label, or naming several, is rejected with the reason (the `llm` stage
//! asks again or records the failure: never silently dropped).

use std::sync::LazyLock;

use arrow::datatypes::{DataType, Field};
use regex::Regex;
use serde_json::Value;

use super::metrics::Stance;
use crate::data::Row;
use crate::llm::parse::{Parser, ParserKind};

pub static KINDS: &[&ParserKind] = &[&STANCE];

/// The offline shape of the parser (`super::offline::STANCE`).
pub const SHAPE: &str = "sharp_stance";

pub static STANCE: ParserKind = ParserKind {
    name: "sharp_stance",
    about: "a stance reply (FAVOR / AGAINST / NEUTRAL + reason; JSON, single-quoted or loose): columns stance, reason",
    options: &[],
    build: |_| Ok(Box::new(StanceParser)),
};

struct StanceParser;

static KEYED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)['"]?stance['"]?\s*[:：]\s*['"]?\[?\s*(FAVOU?R|AGAINST|NEUTRAL)\b"#).expect("regex")
});
static REASON: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"(?is)['"]?reason['"]?\s*[:：]\s*['"]?(.*?)['"]?\s*[,}]?\s*$"#).expect("regex"));
static BARE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b(FAVOU?R|AGAINST|NEUTRAL)\b").expect("regex"));

/// `(stance, reason)` from a reply, or why not.
pub fn parse_stance(text: &str) -> Result<(Stance, Option<String>), String> {
    // 1. JSON (a fence or the outermost braces), keys in any case.
    if let Ok(obj) = crate::llm::parse::extract_json_object(text) {
        let get = |k: &str| obj.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v);
        if let Some(v) = get("stance") {
            let label = v.as_str().map(|s| s.trim_matches(|c| c == '[' || c == ']' || c == ' ')).unwrap_or_default();
            let stance = Stance::parse(label).ok_or_else(|| format!("\"Stance\" is not FAVOR, AGAINST or NEUTRAL: {v}"))?;
            let reason = get("reason").and_then(Value::as_str).map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
            return Ok((stance, reason));
        }
    }
    // 2./3. The single-quoted form and loose `Stance: LABEL` lines.
    if let Some(c) = KEYED.captures(text) {
        let stance = Stance::parse(&c[1]).expect("the regex matches labels only");
        let reason = REASON
            .captures(text)
            .map(|r| r[1].trim().trim_end_matches(['\'', '"', '}', ',']).trim().to_string())
            .filter(|s| !s.is_empty());
        return Ok((stance, reason));
    }
    // 4. A reply that names exactly one label.
    let mut labels: Vec<Stance> = BARE.captures_iter(text).filter_map(|c| Stance::parse(&c[1])).collect();
    labels.sort_unstable();
    labels.dedup();
    match labels.as_slice() {
        [one] => Ok((*one, None)),
        [] => Err("the reply names no stance (FAVOR, AGAINST or NEUTRAL)".into()),
        _ => Err(format!(
            "the reply names several stances ({}) and no \"Stance\" field",
            labels.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
        )),
    }
}

impl Parser for StanceParser {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new("stance", DataType::Utf8, false), Field::new("reason", DataType::Utf8, true)]
    }

    fn parse(&self, text: &str, _record: &Row) -> Result<Row, String> {
        let (stance, reason) = parse_stance(text)?;
        Ok(Row::from_iter([
            ("stance".to_string(), Value::String(stance.name().into())),
            ("reason".to_string(), reason.map(Value::String).unwrap_or(Value::Null)),
        ]))
    }

    fn expect(&self) -> String {
        SHAPE.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_tolerantly() {
        let ok = |t: &str| parse_stance(t).unwrap();
        assert_eq!(ok(r#"{"Stance": "FAVOR", "Reason": "agrees"}"#), (Stance::Favor, Some("agrees".into())));
        assert_eq!(ok("```json\n{\"stance\": \"[against]\"}\n```"), (Stance::Against, None));
        assert_eq!(
            ok("{\n 'Stance': 'NEUTRAL',\n 'Reason': 'He changes the subject.'\n}"),
            (Stance::Neutral, Some("He changes the subject.".into()))
        );
        assert_eq!(ok("Stance: Favour\nReason: yes"), (Stance::Favor, Some("yes".into())));
        assert_eq!(ok("The stance is clearly AGAINST."), (Stance::Against, None));
    }

    #[test]
    fn replies_without_one_label_are_rejected() {
        assert!(parse_stance("I cannot tell.").unwrap_err().contains("names no stance"));
        assert!(parse_stance("FAVOR, AGAINST, NEUTRAL").unwrap_err().contains("several"));
        assert!(parse_stance(r#"{"Stance": "maybe"}"#).unwrap_err().contains("not FAVOR"));
        let p = (STANCE.build)(&Value::Null).unwrap();
        let row = p.parse("'Stance': 'AGAINST'", &Row::new()).unwrap();
        assert_eq!((row["stance"].as_str(), row["reason"].is_null()), (Some("AGAINST"), true));
    }
}
