//! `roleeval_mcq`: read a chat model's answer to a multiple-choice question with the
//! extraction cascade of [`super::extract`] (C-Eval's rules, then CMMLU's). Never
//! rejects an answer (an answer with no letter is a wrong answer, not a re-ask): its
//! columns are `pred` (the letter, or null) and `extract_rule` (the rule that fired,
//! or null).

use serde::Deserialize;
use serde_json::{Map, Value};
use synth_core::data::arrow::datatypes::{DataType, Field};

use super::extract::{self, List};
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_llm::parse::{Parser, ParserKind};

pub static KINDS: &[&ParserKind] = &[&MCQ, &QUESTION];

/// The offline shape of the parser (`super::offline::MCQ`).
pub const SHAPE: &str = "roleeval_mcq";
/// The offline shape of `roleeval_question` (`super::offline::QUESTION`).
pub const QUESTION_SHAPE: &str = "roleeval_question";

const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// `roleeval_question`: a drafted four-option question as a JSON object
/// `{"question", "A", "B", "C", "D", "answer"}` (a ```json fence allowed); an empty stem
/// or option, an answer that is not a letter, or two equal options is a reason to ask again,
/// and so is, when the input record has an `answer` (a translation), a different letter.
pub static QUESTION: ParserKind = ParserKind {
    name: "roleeval_question",
    about: "a drafted four-option question: JSON {question, A, B, C, D, answer}; checked (no empty or equal options, answer a letter)",
    options: &[],
    build: |_| Ok(Box::new(QuestionParser)),
};

struct QuestionParser;

impl Parser for QuestionParser {
    fn fields(&self) -> Vec<Field> {
        ["question", "A", "B", "C", "D", "answer"].iter().map(|n| Field::new(*n, DataType::Utf8, false)).collect()
    }

    fn parse(&self, text: &str, record: &Row) -> Result<Row, String> {
        let obj = synth_llm::parse::extract_json_object(text)?;
        let get = |k: &str| -> Result<String, String> {
            match obj.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(Value::Number(n)) => Ok(n.to_string()),
                Some(other) => Err(format!("\"{k}\" must be text, got {other}")),
                None => Err(format!("the object has no \"{k}\" (it needs question, A, B, C, D, answer)")),
            }
        };
        let question = get("question")?;
        let options: Vec<String> = LETTERS.iter().map(|l| get(l)).collect::<Result<_, _>>()?;
        let answer = get("answer")?.trim().to_string();
        if let Some(problem) = super::build::check_question(&question, &options, &answer, &LETTERS) {
            return Err(problem);
        }
        // A rewrite of an existing question (a translation) keeps its answer letter.
        if let Some(Value::String(was)) = record.get("answer")
            && LETTERS.contains(&was.as_str())
            && *was != answer
        {
            return Err(format!("the answer must stay \"{was}\" (the options keep their order), got \"{answer}\""));
        }
        let mut row = Row::new();
        row.insert("question".into(), Value::String(question));
        for (l, o) in LETTERS.iter().zip(options) {
            row.insert(l.to_string(), Value::String(o));
        }
        row.insert("answer".into(), Value::String(answer));
        Ok(row)
    }

    fn expect(&self) -> String {
        QUESTION_SHAPE.into()
    }

    fn json_keys(&self) -> Vec<String> {
        ["question", "A", "B", "C", "D", "answer"].iter().map(|k| k.to_string()).collect()
    }

    /// The text protocol's own JSON object, read and checked as its text is.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&Value::Object(answer.clone()).to_string(), record)
    }
}

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
            let key = record
                .get(&self.key_column)
                .and_then(Value::as_str)
                .or_else(|| record.get(data::ID).and_then(Value::as_str));
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

    fn json_keys(&self) -> Vec<String> {
        vec!["answer".into()]
    }

    /// `{"answer": "B"}`: the answer's text, read by the same extraction cascade.
    fn parse_json(&self, answer: &Map<String, Value>, record: &Row) -> Result<Row, String> {
        self.parse(&synth_llm::parse::json_text(answer, "answer")?, record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_question_keeps_its_answer_letter() {
        let p = (QUESTION.build)(&Value::Null).unwrap();
        let reply = r#"{"question": "Who?", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "C"}"#;
        assert_eq!(p.parse(reply, &Row::new()).unwrap()["answer"], "C", "a new question: any letter");
        let source = Row::from_iter([("answer".to_string(), Value::String("B".into()))]);
        let err = p.parse(reply, &source).unwrap_err();
        assert!(err.contains("must stay \"B\""), "{err}");
        let kept = reply.replace("\"C\"}", "\"B\"}");
        assert_eq!(p.parse(&kept, &source).unwrap()["answer"], "B");
    }

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

    #[test]
    fn drafted_questions_parse_or_say_why_not() {
        let p = (QUESTION.build)(&Value::Null).unwrap();
        let ok = p
            .parse("```json\n{\"question\": \"林远出生在哪里？\", \"A\": \"北海\", \"B\": \"南城\", \"C\": 1985, \"D\": \"东港\", \"answer\": \"B\"}\n```", &Row::new())
            .unwrap();
        assert_eq!((ok["C"].as_str(), ok["answer"].as_str()), (Some("1985"), Some("B")));
        let bad = |t: &str| p.parse(t, &Row::new()).unwrap_err();
        assert!(
            bad("{\"question\": \"q\", \"A\": \"a\", \"B\": \"b\", \"C\": \"c\", \"answer\": \"A\"}")
                .contains("no \"D\"")
        );
        assert!(
            bad("{\"question\": \"q\", \"A\": \"a\", \"B\": \"b\", \"C\": \"c\", \"D\": \"d\", \"answer\": \"E\"}")
                .contains("not one of")
        );
    }
}
