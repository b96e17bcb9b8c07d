//! SHARP's answer parsers.
//!
//! - `sharp_stance`: the stance detector's reply (spec §2 `sh_stance_parse`) read
//!   tolerantly: JSON, then the Python-literal form the Appendix-A template itself shows
//!   (single quotes), then a `Stance: LABEL` pattern, then a reply naming exactly one label.
//!   Columns `stance` (FAVOR / AGAINST / NEUTRAL) and `reason` (null when none). A reply
//!   with no label, or naming several, is rejected with the reason (the `llm` stage asks
//!   again, then records the failure), or with `unparsed = "keep"` kept with a null stance
//!   and the reason in `parse_error` (for self-consistency: such a sample does not vote);
//!   either way it is counted, never silently dropped.
//! - `sharp_claim`: one claim sentence written by a model (an LLM paraphrase, a rewrite of a
//!   rule-made counterfactual, a translation): wrappers, labels and quotes removed; empty,
//!   multi-line, refusing, over-long or wrong-language answers rejected with the reason.
//! - `sharp_relations`: the people in a character profile and their relation to it (roles
//!   for `sharp_roles` from the RoleMRC meta-pool): a JSON list of `{role, relation,
//!   affection}` (affection optional, HPD's −10..10 scale).

use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, Fields};

use super::metrics::Stance;
use super::text::is_cjk;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::Row;
use synth_llm::parse::{Parser, ParserKind, json_text};

pub static KINDS: &[&ParserKind] = &[&STANCE, &CLAIM, &RELATIONS];

/// The offline shapes of the parsers (`super::offline`).
pub const SHAPE: &str = "sharp_stance";
pub const CLAIM_SHAPE: &str = "sharp_claim";
pub const RELATIONS_SHAPE: &str = "sharp_relations";

pub static STANCE: ParserKind = ParserKind {
    name: "sharp_stance",
    about: "a stance reply (FAVOR / AGAINST / NEUTRAL + reason; JSON, single-quoted or loose): columns stance, reason",
    options: &[OptionSpec::default(
        "unparsed",
        Ty::Enum(&["reask", "keep"]),
        "\"reask\"",
        "a reply with no single label: ask again (then a failure row), or keep it with a null stance and the reason in parse_error",
    )],
    build: |v| {
        let keep = v.get("unparsed").and_then(Value::as_str) == Some("keep");
        Ok(Box::new(StanceParser { keep }))
    },
};

struct StanceParser {
    keep: bool,
}

static KEYED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)['"]?stance['"]?\s*[:：]\s*['"]?\[?\s*(FAVOU?R|AGAINST|NEUTRAL)\b"#).expect("regex")
});
static REASON: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"(?is)['"]?reason['"]?\s*[:：]\s*['"]?(.*?)['"]?\s*[,}]?\s*$"#).expect("regex"));
static BARE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b(FAVOU?R|AGAINST|NEUTRAL)\b").expect("regex"));

/// `(stance, reason)` from a reply, or why not.
pub fn parse_stance(text: &str) -> Result<(Stance, Option<String>), String> {
    // 1. JSON (a fence or the outermost braces), keys in any case.
    if let Ok(obj) = synth_llm::parse::extract_json_object(text) {
        let get = |k: &str| obj.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v);
        if let Some(v) = get("stance") {
            let label = v.as_str().map(|s| s.trim_matches(|c| c == '[' || c == ']' || c == ' ')).unwrap_or_default();
            let stance =
                Stance::parse(label).ok_or_else(|| format!("\"Stance\" is not FAVOR, AGAINST or NEUTRAL: {v}"))?;
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
        let mut f = vec![Field::new("stance", DataType::Utf8, self.keep), Field::new("reason", DataType::Utf8, true)];
        if self.keep {
            f.push(Field::new("parse_error", DataType::Utf8, true));
        }
        f
    }

    fn parse(&self, text: &str, _record: &Row) -> Result<Row, String> {
        let (stance, reason, error) = match parse_stance(text) {
            Ok((s, r)) => (json!(s.name()), r.map(Value::String).unwrap_or(Value::Null), Value::Null),
            Err(why) if self.keep => (Value::Null, Value::Null, Value::String(why)),
            Err(why) => return Err(why),
        };
        let mut row = Row::from_iter([("stance".to_string(), stance), ("reason".to_string(), reason)]);
        if self.keep {
            row.insert("parse_error".into(), error);
        }
        Ok(row)
    }

    fn expect(&self) -> String {
        SHAPE.into()
    }

    fn json_keys(&self) -> Vec<String> {
        vec!["Stance".into(), "Reason".into()]
    }

    /// `{"Stance", "Reason"}`: the template's own JSON layout, read as its text is.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&Value::Object(answer.clone()).to_string(), record)
    }
}

// --- sharp_claim

pub static CLAIM: ParserKind = ParserKind {
    name: "sharp_claim",
    about: "one claim sentence written by a model (paraphrase, counterfactual rewrite, translation): labels and quotes removed, checked",
    options: &[
        OptionSpec::default("column", Ty::Str, "\"claim\"", "output column"),
        OptionSpec::default("lang", Ty::Enum(&["en", "zh", "any"]), "\"any\"", "the language the claim must be in"),
        OptionSpec::default("max_chars", Ty::Int(1, 100_000), "400", "longer answers are rejected"),
    ],
    build: |v| {
        #[derive(Deserialize)]
        struct O {
            column: String,
            lang: String,
            max_chars: usize,
        }
        let o: O = serde_json::from_value(v.clone()).map_err(|e| format!("bad parser options: {e}"))?;
        Ok(Box::new(ClaimParser { column: o.column, lang: o.lang, max_chars: o.max_chars }))
    },
};

struct ClaimParser {
    column: String,
    lang: String,
    max_chars: usize,
}

static LABEL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^\s*(?:(?:the\s+)?(?:rewritten|counterfactual|paraphrased|translated|new|final)\s+)?(?:claim|statement|sentence|translation|paraphrase|rewrite|answer|output)\s*[:：]\s*|^\s*(?:陈述|声明|句子|译文|翻译|改写|答案)\s*[:：]\s*")
        .expect("regex")
});
static REFUSAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:i'?m sorry|sorry,|i cannot|i can't|i can not|as an ai|i am unable|i'm unable)|^(?:抱歉|对不起|我无法|我不能)")
        .expect("regex")
});

/// One claim from a model's answer, or why not.
pub fn parse_claim(text: &str, lang: &str, max_chars: usize) -> Result<String, String> {
    let mut t = text.trim();
    if let Some(inner) = t.strip_prefix("```") {
        t = inner.split_once('\n').map_or(inner, |(_, rest)| rest).trim_end().trim_end_matches("```").trim();
    }
    let lines: Vec<&str> = t.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let [line] = lines.as_slice() else {
        return Err(if lines.is_empty() {
            "the answer is empty".into()
        } else {
            format!("answer with the claim alone, on one line (got {} lines)", lines.len())
        });
    };
    let mut claim = LABEL.replace(line, "").trim().to_string();
    for (open, close) in [('"', '"'), ('\'', '\''), ('“', '”'), ('「', '」'), ('‘', '’'), ('《', '》')] {
        if claim.len() > 1 && claim.starts_with(open) && claim.ends_with(close) {
            claim = claim[open.len_utf8()..claim.len() - close.len_utf8()].trim().to_string();
        }
    }
    if claim.is_empty() {
        return Err("the answer holds no claim".into());
    }
    if REFUSAL.is_match(&claim) {
        return Err(format!("the answer is a refusal, not a claim: \"{claim}\""));
    }
    if claim.chars().count() > max_chars {
        return Err(format!("the claim is longer than {max_chars} characters"));
    }
    let cjk = claim.chars().any(|c| is_cjk(c) && c.is_alphabetic());
    match lang {
        "zh" if !cjk => return Err("the claim must be written in Chinese".into()),
        "en" if cjk || !claim.chars().any(|c| c.is_ascii_alphabetic()) => {
            return Err("the claim must be written in English".into());
        }
        _ => {}
    }
    Ok(claim)
}

impl Parser for ClaimParser {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new(&self.column, DataType::Utf8, false)]
    }

    fn parse(&self, text: &str, _record: &Row) -> Result<Row, String> {
        let claim = parse_claim(text, &self.lang, self.max_chars)?;
        Ok(Row::from_iter([(self.column.clone(), Value::String(claim))]))
    }

    fn expect(&self) -> String {
        format!("{CLAIM_SHAPE}:{}", if self.lang == "any" { "" } else { &self.lang })
    }

    fn json_keys(&self) -> Vec<String> {
        vec!["claim".into()]
    }

    /// `{"claim": "..."}`: the claim sentence, cleaned and checked as a text answer is.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&json_text(answer, "claim")?, record)
    }
}

// --- sharp_relations

pub static RELATIONS: ParserKind = ParserKind {
    name: "sharp_relations",
    about: "the people in a character profile and their relations to it: JSON list of {role, relation, affection (-10..10, optional)}; column relations",
    options: &[
        OptionSpec::default("max_roles", Ty::Int(1, 1000), "20", "more roles are rejected"),
        OptionSpec::default(
            "main_column",
            Ty::Str,
            "\"role_name\"",
            "the record's column naming the character (not a role of itself)",
        ),
    ],
    build: |v| {
        #[derive(Deserialize)]
        struct O {
            max_roles: usize,
            main_column: String,
        }
        let o: O = serde_json::from_value(v.clone()).map_err(|e| format!("bad parser options: {e}"))?;
        Ok(Box::new(RelationsParser { max_roles: o.max_roles, main_column: o.main_column }))
    },
};

struct RelationsParser {
    max_roles: usize,
    main_column: String,
}

/// The fields of one relation of the `relations` list.
pub fn relation_fields() -> Fields {
    Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("relation", DataType::Utf8, false),
        Field::new("affection", DataType::Float64, true),
    ])
}

/// The relations of an answer, or why not.
pub fn parse_relations(text: &str, main: Option<&str>, max_roles: usize) -> Result<Vec<Value>, String> {
    let list_first = match (text.find('['), text.find('{')) {
        (Some(a), Some(o)) => a < o,
        (Some(_), None) => true,
        _ => false,
    };
    let value = if list_first {
        let (Some(a), Some(b)) = (text.find('['), text.rfind(']')) else {
            return Err("no JSON list of relations in the answer".into());
        };
        serde_json::from_str(&text[a..=b]).map_err(|e| format!("the list of relations is not valid JSON: {e}"))?
    } else {
        let obj = synth_llm::parse::extract_json_object(text)
            .map_err(|_| "no JSON list of relations in the answer".to_string())?;
        obj.get("relations").cloned().ok_or("the JSON object has no \"relations\" list")?
    };
    let Value::Array(items) = value else { return Err("\"relations\" is not a list".into()) };
    if items.is_empty() {
        return Err("the list of relations is empty".into());
    }
    if items.len() > max_roles {
        return Err(format!("{} relations, more than {max_roles}", items.len()));
    }
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty());
        let (Some(role), Some(relation)) = (text("role"), text("relation")) else {
            return Err(format!("relation {}: needs a non-empty \"role\" and \"relation\"", i + 1));
        };
        if main.is_some_and(|m| m.eq_ignore_ascii_case(role)) {
            return Err(format!("relation {}: \"{role}\" is the character itself", i + 1));
        }
        if out.iter().any(|r| r["role"].as_str().is_some_and(|x| x.eq_ignore_ascii_case(role))) {
            return Err(format!("relation {}: \"{role}\" is listed twice", i + 1));
        }
        let affection = match item.get("affection") {
            None | Some(Value::Null) => Value::Null,
            Some(v) => match v.as_f64() {
                Some(x) if (-10.0..=10.0).contains(&x) => json!(x),
                _ => return Err(format!("relation {}: \"affection\" must be a number from -10 to 10, got {v}", i + 1)),
            },
        };
        out.push(json!({ "role": role, "relation": relation, "affection": affection }));
    }
    Ok(out)
}

impl Parser for RelationsParser {
    fn fields(&self) -> Vec<Field> {
        let item = Field::new("item", DataType::Struct(relation_fields()), true);
        vec![Field::new("relations", DataType::List(Arc::new(item)), false)]
    }

    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let main = record.get(&self.main_column).and_then(Value::as_str);
        let relations = parse_relations(text, main, self.max_roles)?;
        Ok(Row::from_iter([("relations".to_string(), Value::Array(relations))]))
    }

    fn expect(&self) -> String {
        RELATIONS_SHAPE.into()
    }

    fn json_keys(&self) -> Vec<String> {
        vec!["relations".into()]
    }

    /// `{"relations": [...]}`: one of the layouts a text answer may take.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&Value::Object(answer.clone()).to_string(), record)
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
    fn replies_without_one_label_are_rejected_or_kept() {
        assert!(parse_stance("I cannot tell.").unwrap_err().contains("names no stance"));
        assert!(parse_stance("FAVOR, AGAINST, NEUTRAL").unwrap_err().contains("several"));
        assert!(parse_stance(r#"{"Stance": "maybe"}"#).unwrap_err().contains("not FAVOR"));
        let p = (STANCE.build)(&json!({"unparsed": "reask"})).unwrap();
        let row = p.parse("'Stance': 'AGAINST'", &Row::new()).unwrap();
        assert_eq!((row["stance"].as_str(), row["reason"].is_null()), (Some("AGAINST"), true));
        assert!(p.parse("no idea", &Row::new()).is_err());
        let keep = (STANCE.build)(&json!({"unparsed": "keep"})).unwrap();
        let row = keep.parse("no idea", &Row::new()).unwrap();
        assert!(row["stance"].is_null());
        assert!(row["parse_error"].as_str().unwrap().contains("names no stance"));
        assert_eq!(keep.fields().len(), 3);
    }

    #[test]
    fn claims_are_cleaned_and_checked() {
        let ok = |t: &str, lang: &str| parse_claim(t, lang, 400).unwrap();
        assert_eq!(ok("Claim: \"A knife is used for cutting.\"", "en"), "A knife is used for cutting.");
        assert_eq!(ok("```\nRewritten claim: Fire is cold.\n```", "en"), "Fire is cold.");
        assert_eq!(ok("译文：「刀是用来切东西的。」", "zh"), "刀是用来切东西的。");
        assert_eq!(ok("  wheat grows in fields ", "any"), "wheat grows in fields");
        let err = |t: &str, lang: &str| parse_claim(t, lang, 20).unwrap_err();
        assert!(err("", "en").contains("empty"));
        assert!(err("One.\nTwo.", "en").contains("2 lines"));
        assert!(err("I'm sorry, I can't do that.", "en").contains("refusal"));
        assert!(err("刀是用来切东西的。", "en").contains("English"));
        assert!(err("A knife cuts.", "zh").contains("Chinese"));
        assert!(err("This claim is far too long to keep.", "en").contains("longer than 20"));
        assert!(err("Claim: \"\"", "en").contains("no claim"));
    }

    #[test]
    fn relations_are_read_and_checked() {
        let rel = parse_relations(
            r#"{"relations": [{"role": "Ron", "relation": "best friend", "affection": 8}, {"role": "Draco", "relation": "rival"}]}"#,
            Some("Harry"),
            20,
        )
        .unwrap();
        assert_eq!(rel[0], json!({"role": "Ron", "relation": "best friend", "affection": 8.0}));
        assert!(rel[1]["affection"].is_null());
        let list = parse_relations("Here: [{\"role\": \"A\", \"relation\": \"friend\"}]", None, 20).unwrap();
        assert_eq!(list.len(), 1);
        let err = |t: &str| parse_relations(t, Some("Harry"), 2).unwrap_err();
        assert!(err("none").contains("no JSON list"));
        assert!(err("[]").contains("empty"));
        assert!(err(r#"[{"role": "Harry", "relation": "self"}]"#).contains("the character itself"));
        assert!(err(r#"[{"role": "A", "relation": "x"}, {"role": "a", "relation": "y"}]"#).contains("twice"));
        assert!(err(r#"[{"role": "A", "relation": "x", "affection": 11}]"#).contains("-10 to 10"));
        assert!(err(r#"[{"role": "A"}]"#).contains("non-empty"));
        assert!(
            err(r#"[{"role": "A", "relation": "x"}, {"role": "B", "relation": "x"}, {"role": "C", "relation": "x"}]"#)
                .contains("more than 2")
        );
    }
}
