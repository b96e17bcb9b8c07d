//! JSON Schemas of structured answers: a schema file read and checked at plan time (valid
//! JSON, a valid JSON Schema, an object that declares and requires the keys its parser
//! reads), the request-side [`AnswerSchema`] a provider sends, and the validation of an
//! answer with messages a model can act on when it is asked again.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

/// What a structured request carries to the provider (and into its cache key): the
/// schema's name (as providers require it: `[A-Za-z0-9_-]{1,64}`) and the schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnswerSchema {
    pub name: String,
    pub schema: Value,
}

/// How a provider enforces a schema (its structured-output mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// OpenAI: `response_format: {type: "json_schema", json_schema: {name, schema, strict}}`,
    /// `strict: true` when the schema meets strict mode's rules ([`strict_problem`]).
    OpenAi,
    /// vLLM (0.6 and later): the same `response_format` with `name` and `schema` and no
    /// `strict` (vLLM always constrains; `guided_json` was removed in 0.12, and
    /// `structured_outputs` is refused before 0.10).
    Vllm,
    /// llama.cpp servers (`llama-server`, `llama-cpp-python`):
    /// `response_format: {type: "json_object", schema}` (llama-cpp-python knows no other form).
    LlamaCpp,
    /// Anthropic: a forced tool whose `input_schema` is the schema; its `tool_use` input is the answer.
    AnthropicTool,
    /// An in-process model: decoding constrained by a grammar compiled from the schema.
    Grammar,
}

impl Form {
    pub fn name(self) -> &'static str {
        match self {
            Form::OpenAi => "openai",
            Form::Vllm => "vllm",
            Form::LlamaCpp => "llama_cpp",
            Form::AnthropicTool => "anthropic_tool",
            Form::Grammar => "grammar",
        }
    }

    /// The request parameters an error message names when a server refuses this form.
    pub fn parameters(self) -> &'static [&'static str] {
        match self {
            Form::OpenAi | Form::Vllm | Form::LlamaCpp => &["response_format", "json_schema"],
            Form::AnthropicTool => &["tool_choice", "tools", "input_schema"],
            Form::Grammar => &[],
        }
    }

    /// Whether an error message is a server refusing this form (it names one of its parameters).
    pub fn refused_by(self, message: &str) -> bool {
        let m = message.to_ascii_lowercase();
        self.parameters().iter().any(|p| m.contains(p))
    }

    /// The `response_format` of an OpenAI-compatible request in this form.
    pub fn response_format(self, schema: &AnswerSchema) -> Option<Value> {
        match self {
            Form::OpenAi => {
                // Strict mode refuses some assertions (minLength, maxLength...): they are
                // left out of what is sent and checked on the answer (`SchemaFile::read`).
                let sent = strict_view(&schema.schema);
                let strict = strict_problem(&sent).is_none();
                Some(serde_json::json!({
                    "type": "json_schema",
                    "json_schema": {"name": schema.name, "schema": sent, "strict": strict},
                }))
            }
            Form::Vllm => Some(serde_json::json!({
                "type": "json_schema",
                "json_schema": {"name": schema.name, "schema": schema.schema},
            })),
            Form::LlamaCpp => Some(serde_json::json!({"type": "json_object", "schema": schema.schema})),
            Form::AnthropicTool | Form::Grammar => None,
        }
    }
}

/// A structured request: the form the provider enforces the schema in (not part of the
/// cache key: every form asks for the same answer) and the schema.
#[derive(Debug, Clone)]
pub struct Structured {
    pub form: Form,
    pub schema: Arc<AnswerSchema>,
}

impl Serialize for Structured {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.schema.as_ref().serialize(s)
    }
}

/// Where a provider is in its list of structured-output forms: a server that refuses one
/// (an error naming its parameter) moves every stage on to the next; past the last, the
/// provider has no structured mode left and stages use the text protocol.
#[derive(Debug)]
pub struct Negotiation {
    forms: Vec<Form>,
    current: std::sync::atomic::AtomicUsize,
}

impl Negotiation {
    pub fn new(forms: Vec<Form>) -> Negotiation {
        Negotiation { forms, current: std::sync::atomic::AtomicUsize::new(0) }
    }

    /// The form to send now (`None`: none left, or none configured).
    pub fn current(&self) -> Option<Form> {
        self.forms.get(self.current.load(std::sync::atomic::Ordering::Acquire)).copied()
    }

    /// `form` was refused: move past it (once, whoever notices first); the form to use now.
    pub fn refused(&self, form: Form) -> Option<Form> {
        if let Some(i) = self.forms.iter().position(|f| *f == form) {
            let _ = self.current.compare_exchange(
                i,
                i + 1,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            );
        }
        self.current()
    }

    /// Every form configured, in the order they are tried.
    pub fn forms(&self) -> &[Form] {
        &self.forms
    }
}

/// Why a schema does not meet OpenAI's strict mode (every object closed with
/// `"additionalProperties": false` and requiring all its properties; no keyword strict mode
/// lacks), or `None` when it does. Such a schema is still sent, with `strict: false`, and
/// every answer is validated here anyway.
pub fn strict_problem(schema: &Value) -> Option<String> {
    const UNSUPPORTED: [&str; 14] = [
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "patternProperties",
        "unevaluatedProperties",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "uniqueItems",
    ];
    fn walk(v: &Value, at: &str) -> Option<String> {
        let obj = match v {
            Value::Object(o) => o,
            Value::Array(items) => {
                return items.iter().enumerate().find_map(|(i, x)| walk(x, &format!("{at}/{i}")));
            }
            _ => return None,
        };
        if let Some(k) = UNSUPPORTED.iter().find(|k| obj.contains_key(**k)) {
            return Some(format!("{at}: \"{k}\" is not supported in strict mode"));
        }
        let is_object = obj.get("type").and_then(Value::as_str) == Some("object") || obj.contains_key("properties");
        if is_object {
            if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
                return Some(format!("{at}: an object needs \"additionalProperties\": false"));
            }
            let required: Vec<&str> =
                obj.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            if let Some(props) = obj.get("properties").and_then(Value::as_object)
                && let Some(k) = props.keys().find(|k| !required.contains(&k.as_str()))
            {
                return Some(format!("{at}: property \"{k}\" is not in \"required\""));
            }
        }
        obj.iter().find_map(|(k, x)| {
            // Values of these keywords are data, not schemas.
            if matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "required" | "description" | "title") {
                None
            } else if let ("properties" | "$defs" | "definitions", Value::Object(named)) = (k.as_str(), x) {
                // Names (which may be spelled like keywords) of schemas.
                named.iter().find_map(|(n, s)| walk(s, &format!("{at}/{k}/{n}")))
            } else {
                walk(x, &format!("{at}/{k}"))
            }
        })
    }
    walk(schema, "")
}

/// Keywords that only assert something of a value (they never change its shape), which
/// OpenAI's strict mode refuses: left out of the schema sent in that mode, and checked
/// after parsing like every keyword.
const ASSERTIONS_STRICT_LACKS: [&str; 5] = ["minLength", "maxLength", "minProperties", "maxProperties", "uniqueItems"];

/// The schema as sent in OpenAI's strict mode: `schema` without the assertions strict mode
/// lacks ([`ASSERTIONS_STRICT_LACKS`]); everything else (shape, `pattern`, `enum`, item
/// counts) as it is.
pub fn strict_view(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| !ASSERTIONS_STRICT_LACKS.contains(&k.as_str()))
                .map(|(k, v)| {
                    // Values of these keywords are data, not schemas.
                    let data = matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "required");
                    // These map names (which may be spelled like keywords) to schemas.
                    let named = matches!(k.as_str(), "properties" | "$defs" | "definitions" | "patternProperties");
                    let v = match (data, named, v) {
                        (true, _, v) => v.clone(),
                        (_, true, Value::Object(m)) => {
                            Value::Object(m.iter().map(|(n, x)| (n.clone(), strict_view(x))).collect())
                        }
                        (_, _, v) => strict_view(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strict_view).collect()),
        other => other.clone(),
    }
}

/// A checked schema file: what requests carry, plus its validator.
pub struct SchemaFile {
    /// The file as the pipeline names it (for messages).
    pub shown: String,
    pub request: Arc<AnswerSchema>,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for SchemaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SchemaFile({})", self.shown)
    }
}

/// The provider-facing name of a schema file: its stem without `.schema`, characters
/// outside `[A-Za-z0-9_-]` as `_`, at most 64 characters.
pub fn schema_name(path: &Path) -> String {
    let stem = path.file_name().and_then(|n| n.to_str()).unwrap_or("answer");
    let stem = stem.strip_suffix(".json").unwrap_or(stem);
    let stem = stem.strip_suffix(".schema").unwrap_or(stem);
    let mut name: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .take(64)
        .collect();
    if name.is_empty() {
        name = "answer".into();
    }
    name
}

impl SchemaFile {
    /// Read and check a schema file (`shown` is how the pipeline names it).
    pub fn load(path: &Path, shown: &str) -> Result<SchemaFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read schema {shown}: {e}"))?;
        let schema: Value = serde_json::from_str(&text)
            .map_err(|e| format!("schema {shown}: not valid JSON (line {}, column {}): {e}", e.line(), e.column()))?;
        SchemaFile::from_value(schema_name(path), schema, shown)
    }

    /// Check a schema given as a value.
    pub fn from_value(name: String, schema: Value, shown: &str) -> Result<SchemaFile, String> {
        if !schema.is_object() {
            return Err(format!(
                "schema {shown}: a JSON Schema must be an object, found {}",
                synth_core::data::json_type(&schema)
            ));
        }
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| format!("schema {shown}: not a valid JSON Schema: {e} (at {})", pointer(e.schema_path())))?;
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(format!(
                "schema {shown}: the answer must be a JSON object (\"type\": \"object\" at the top: providers' structured outputs require it)"
            ));
        }
        Ok(SchemaFile { shown: shown.to_string(), request: Arc::new(AnswerSchema { name, schema }), validator })
    }

    /// Check that the schema declares and requires every top-level key a parser reads.
    pub fn check_keys(&self, parser: &str, keys: &[String]) -> Result<(), String> {
        let schema = &self.request.schema;
        let props = schema.get("properties").and_then(Value::as_object);
        let required: Vec<&str> =
            schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let missing: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| !props.is_some_and(|p| p.contains_key(*k)) || !required.contains(k))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "schema {}: parser \"{parser}\" reads the key(s) {} of the answer; declare them under \"properties\" and list them in \"required\"",
                self.shown,
                missing.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ")
            ))
        }
    }

    /// The answer as a JSON object valid against the schema, or why not (a message for the
    /// model: the first few violations with where they are).
    pub fn read(&self, text: &str) -> Result<Map<String, Value>, String> {
        let value = json_answer(text)?;
        self.validate(&value)?;
        match value {
            Value::Object(m) => Ok(m),
            other => Err(format!("the answer must be a JSON object, found {}", synth_core::data::json_type(&other))),
        }
    }

    /// Validate a value against the schema.
    pub fn validate(&self, value: &Value) -> Result<(), String> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(value)
            .take(MAX_REPORTED + 1)
            .map(|e| format!("at {}: {}", pointer(e.instance_path()), shorten(&explain(&e), 200)))
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let more = if errors.len() > MAX_REPORTED { " (and more)" } else { "" };
        let shown: Vec<&str> = errors.iter().take(MAX_REPORTED).map(String::as_str).collect();
        Err(format!("the answer does not follow the JSON Schema: {}{more}", shown.join("; ")))
    }
}

/// Violations named in one message.
const MAX_REPORTED: usize = 3;

/// A violation in words a model can act on: a text the schema's `pattern` refuses is not
/// text (the answer schemas' patterns ask for words without bracket debris), a length
/// says which bound; anything else as the validator says it.
fn explain(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::ValidationErrorKind as K;
    let value = shorten(&e.instance().to_string(), 60);
    match e.kind() {
        K::Pattern { pattern } => {
            format!("{value} is not usable text: write words, without square or curly brackets (pattern {pattern})")
        }
        K::MinLength { limit } => format!("{value} is too short: write at least {limit} characters"),
        K::MaxLength { limit } => format!("{value} is too long: write at most {limit} characters"),
        _ => e.to_string(),
    }
}

/// A location as a JSON pointer, `/` for the root.
fn pointer(loc: &impl std::fmt::Display) -> String {
    let s = loc.to_string();
    if s.is_empty() { "/".into() } else { s }
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// The JSON value of a structured answer: the whole text (a provider that enforced the
/// schema sends nothing else), else inside a ```json fence (a server that only asked for it).
pub fn json_answer(text: &str) -> Result<Value, String> {
    let t = text.trim();
    match serde_json::from_str::<Value>(t) {
        Ok(v) => Ok(v),
        Err(first) => {
            if let Some(start) = t.find("```") {
                let rest = &t[start + 3..];
                let rest = rest.strip_prefix("json").unwrap_or(rest);
                let inner = rest.split("```").next().unwrap_or(rest);
                if let Ok(v) = serde_json::from_str::<Value>(inner.trim()) {
                    return Ok(v);
                }
            }
            let hint = if first.is_eof() { " (it ends before the JSON does: was max_tokens reached?)" } else { "" };
            Err(format!("the answer is not valid JSON: {first}{hint}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(schema: Value) -> Result<SchemaFile, String> {
        SchemaFile::from_value("t".into(), schema, "t.schema.json")
    }

    #[test]
    fn strict_mode_rules_and_forms() {
        let closed = json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object",
            "properties": {"b": {"type": "string", "enum": ["x"]}}, "required": ["b"], "additionalProperties": false}}},
            "required": ["a"], "additionalProperties": false});
        assert_eq!(strict_problem(&closed), None);
        let open = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}},
            "required": ["b"]}}, "required": ["a"], "additionalProperties": false});
        assert!(strict_problem(&open).unwrap().contains("/properties/a"));
        let optional =
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false});
        assert!(strict_problem(&optional).unwrap().contains("\"a\""));
        let long = json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}, "required": ["a"],
            "additionalProperties": false});
        assert!(strict_problem(&long).unwrap().contains("minLength"));
        let s = AnswerSchema { name: "n".into(), schema: closed.clone() };
        assert_eq!(Form::OpenAi.response_format(&s).unwrap()["json_schema"]["strict"], true);
        assert!(Form::Vllm.response_format(&s).unwrap()["json_schema"].get("strict").is_none());
        assert_eq!(Form::LlamaCpp.response_format(&s).unwrap(), json!({"type": "json_object", "schema": closed}));
        assert!(Form::OpenAi.refused_by("HTTP 400: Invalid schema for response_format 'n'"));
        assert!(!Form::OpenAi.refused_by("HTTP 400: context length exceeded"));
        let n = Negotiation::new(vec![Form::OpenAi, Form::LlamaCpp]);
        assert_eq!(n.refused(Form::OpenAi), Some(Form::LlamaCpp));
        // A late refusal of a form already left behind changes nothing.
        assert_eq!(n.refused(Form::OpenAi), Some(Form::LlamaCpp));
        assert_eq!(n.refused(Form::LlamaCpp), None);
    }

    #[test]
    fn strict_mode_gets_the_shape_and_the_answer_is_checked_for_the_rest() {
        let text = json!({"type": "string", "minLength": 5, "maxLength": 9, "pattern": "^[^\\[\\]{}]*[A-Za-z]"});
        let schema = json!({"type": "object", "properties": {"minLength": text.clone(), "a": text},
            "required": ["minLength", "a"], "additionalProperties": false});
        let s = AnswerSchema { name: "n".into(), schema: schema.clone() };
        let sent = Form::OpenAi.response_format(&s).unwrap();
        assert_eq!(sent["json_schema"]["strict"], true);
        let props = &sent["json_schema"]["schema"]["properties"];
        // A property named like a keyword stays; the assertions strict mode lacks go.
        assert!(props.get("minLength").is_some());
        assert!(props["a"].get("minLength").is_none() && props["a"].get("maxLength").is_none());
        assert_eq!(props["a"]["pattern"], "^[^\\[\\]{}]*[A-Za-z]");
        // Other forms send the whole schema; the answer is validated against all of it.
        assert_eq!(Form::Vllm.response_format(&s).unwrap()["json_schema"]["schema"], schema);
        let f = file(schema).unwrap();
        let e = f.read("{\"minLength\": \"][{\", \"a\": \"abc\"}").unwrap_err();
        assert!(e.contains("is not usable text") && e.contains("too short: write at least 5"), "{e}");
    }

    #[test]
    fn names_follow_provider_rules() {
        assert_eq!(schema_name(Path::new("a/profile.schema.json")), "profile");
        assert_eq!(schema_name(Path::new("judge score.json")), "judge_score");
        assert_eq!(schema_name(Path::new(&"x".repeat(80))).len(), 64);
    }

    #[test]
    fn bad_schemas_are_refused_with_the_file() {
        let e = file(json!({"type": "object", "properties": {"a": {"type": "strnig"}}})).unwrap_err();
        assert!(e.contains("t.schema.json") && e.contains("not a valid JSON Schema"), "{e}");
        let e = file(json!({"type": "array"})).unwrap_err();
        assert!(e.contains("JSON object"), "{e}");
        let e = file(json!([1])).unwrap_err();
        assert!(e.contains("must be an object"), "{e}");
    }

    #[test]
    fn answers_are_validated_with_paths() {
        let s = file(json!({
            "type": "object",
            "properties": {"score": {"type": "integer", "enum": [0, 1]}, "why": {"type": "string"}},
            "required": ["score", "why"],
            "additionalProperties": false
        }))
        .unwrap();
        assert_eq!(s.read("{\"score\": 1, \"why\": \"ok\"}").unwrap()["score"], 1);
        let e = s.read("{\"score\": 3}").unwrap_err();
        assert!(e.contains("at /score") && e.contains("why"), "{e}");
        let e = s.read("{\"score\": 1, \"why\": \"x\", \"extra\": 2}").unwrap_err();
        assert!(e.contains("extra"), "{e}");
        assert!(s.read("{\"score\": 1, ").unwrap_err().contains("max_tokens"));
        assert_eq!(s.read("Sure:\n```json\n{\"score\": 0, \"why\": \"w\"}\n```").unwrap()["score"], 0);
        assert!(s.check_keys("score", &["score".into()]).is_ok());
        let e = s.check_keys("json", &["score".into(), "reason".into()]).unwrap_err();
        assert!(e.contains("\"reason\"") && !e.contains("\"score\""), "{e}");
    }
}
