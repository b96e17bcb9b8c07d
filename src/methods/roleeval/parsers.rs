//! `roleeval_mcq`: read a chat model's answer to a multiple-choice question with the
//! extraction cascade of [`super::extract`] (C-Eval's rules, then CMMLU's). Never
//! rejects an answer (an answer with no letter is a wrong answer, not a re-ask): its
//! columns are `pred` (the letter, or null) and `extract_rule` (the rule that fired,
//! or null).

use arrow::datatypes::{DataType, Field};
use serde::Deserialize;
use serde_json::Value;

use super::extract::{self, List};
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::llm::parse::{Parser, ParserKind};

pub static KINDS: &[&ParserKind] = &[&MCQ];

/// The offline shape of the parser (`super::offline::MCQ`).
pub const SHAPE: &str = "roleeval_mcq";

pub static MCQ: ParserKind = ParserKind {
    name: "roleeval_mcq",
    about: "a multiple-choice letter by C-Eval's then CMMLU's extraction rules (columns pred, extract_rule; null when none matched)",
    options: &[
        OptionSpec::default(
            "cascade",
            Ty::StrList,
            "[\"ceval\", \"cmmlu\"]",
            "rule lists in order: ceval (rules/roleeval/ceval.txt), cmmlu (rules/roleeval/cmmlu.tsv)",
        ),
        OptionSpec::default(
            "random_fallback",
            Ty::Bool,
            "false",
            "when nothing matched, guess as CMMLU does, seeded by the record's key (parity only; the paper does not say)",
        ),
        OptionSpec::default("key_column", Ty::Str, "\"qkey\"", "column that seeds the random fallback"),
    ],
    build: |v| {
        #[derive(Deserialize)]
        struct O {
            cascade: Option<Vec<String>>,
            random_fallback: Option<bool>,
            key_column: Option<String>,
        }
        let o: O = serde_json::from_value(if v.is_null() { serde_json::json!({}) } else { v.clone() })
            .map_err(|e| format!("bad parser options: {e}"))?;
        let names = o.cascade.unwrap_or_else(|| vec!["ceval".into(), "cmmlu".into()]);
        let lists = names
            .iter()
            .map(|n| List::parse(n).ok_or_else(|| format!("unknown rule list \"{n}\" (rule lists: ceval, cmmlu)")))
            .collect::<Result<Vec<_>, _>>()?;
        extract::check_rules()?;
        Ok(Box::new(Mcq {
            lists,
            random_fallback: o.random_fallback.unwrap_or(false),
            key_column: o.key_column.unwrap_or_else(|| "qkey".into()),
        }))
    },
};

struct Mcq {
    lists: Vec<List>,
    random_fallback: bool,
    key_column: String,
}

/// The random fallback's draw for a key (0..4).
pub fn fallback_seed(key: &str) -> u64 {
    let h = blake3::hash(format!("roleeval_mcq/random_fallback/{key}").as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

impl Parser for Mcq {
    fn fields(&self) -> Vec<Field> {
        vec![Field::new("pred", DataType::Utf8, true), Field::new("extract_rule", DataType::Utf8, true)]
    }

    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let seed = self.random_fallback.then(|| {
            let key = record.get(&self.key_column).and_then(Value::as_str).or_else(|| {
                record.get(data::ID).and_then(Value::as_str)
            });
            fallback_seed(key.unwrap_or_default())
        });
        let (pred, rule) = match extract::extract(text, &self.lists, seed) {
            Some((letter, rule)) => (Value::String(letter.to_string()), Value::String(rule)),
            None => (Value::Null, Value::Null),
        };
        Ok(Row::from_iter([("pred".to_string(), pred), ("extract_rule".to_string(), rule)]))
    }

    fn expect(&self) -> String {
        SHAPE.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_columns_and_fallback() {
        let p = (MCQ.build)(&Value::Null).unwrap();
        let row = Row::from_iter([("qkey".to_string(), Value::String("global/games/1".into()))]);
        let got = p.parse("我认为应该选B", &row).unwrap();
        assert_eq!(got["pred"], "B");
        assert_eq!(got["extract_rule"], "cmmlu:故?选择?：? ?([ABCD])");
        let none = p.parse("我不确定。", &row).unwrap();
        assert!(none["pred"].is_null() && none["extract_rule"].is_null());
        let r = (MCQ.build)(&serde_json::json!({"random_fallback": true})).unwrap();
        let a = r.parse("我不确定。", &row).unwrap();
        assert_eq!(a["extract_rule"], "cmmlu:random");
        assert_eq!(a, r.parse("我不确定。", &row).unwrap(), "seeded by the key");
        assert!((MCQ.build)(&serde_json::json!({"cascade": ["mmlu"]})).is_err());
    }
}
