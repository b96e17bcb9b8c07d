//! Templates and expressions (minijinja): prompt templates rendered per record,
//! filter predicates and derived columns. Variables are a record's columns.
//! Undefined variables are errors, not empty strings, so a typo cannot silently
//! produce an empty prompt.

use std::collections::BTreeSet;

use minijinja::{Environment, UndefinedBehavior, Value};

use crate::data::Row;

/// Names minijinja provides itself; not expected from inputs.
const GLOBALS: &[&str] =
    &["range", "dict", "namespace", "debug", "loop", "self", "super", "varargs", "kwargs", "caller"];

pub fn is_global(name: &str) -> bool {
    GLOBALS.contains(&name)
}

/// A set of named templates sharing one environment.
pub struct Templates {
    env: Environment<'static>,
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

impl Templates {
    pub fn new() -> Templates {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        let syntax = env
            .syntax()
            .to_builder()
            .keep_trailing_newline(true)
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("valid syntax config");
        env.set_syntax(syntax);
        env.add_filter("words", |s: String| s.split_whitespace().count());
        Templates { env }
    }

    /// Add a template; returns the variables it reads from the context.
    pub fn add(&mut self, name: &str, source: &str) -> Result<BTreeSet<String>, String> {
        self.env.add_template_owned(name.to_string(), source.to_string()).map_err(|e| describe(&e))?;
        let tmpl = self.env.get_template(name).map_err(|e| describe(&e))?;
        Ok(tmpl.undeclared_variables(false).into_iter().collect())
    }

    /// Add an expression as a template that renders its value as JSON.
    pub fn add_expression(&mut self, name: &str, expr: &str) -> Result<BTreeSet<String>, String> {
        // Compile once on its own first, for an error message that points into the expression.
        self.env.compile_expression(expr).map_err(|e| describe(&e))?;
        self.add(name, &format!("{{{{ ({expr}) | tojson }}}}"))
    }

    pub fn render(&self, name: &str, row: &Row) -> Result<String, String> {
        let tmpl = self.env.get_template(name).map_err(|e| describe(&e))?;
        tmpl.render(Value::from(minijinja::value::Serde(row))).map_err(|e| describe(&e))
    }

    pub fn render_value(&self, name: &str, ctx: Value) -> Result<String, String> {
        let tmpl = self.env.get_template(name).map_err(|e| describe(&e))?;
        tmpl.render(ctx).map_err(|e| describe(&e))
    }

    /// Evaluate an expression added with [`Templates::add_expression`].
    pub fn eval(&self, name: &str, row: &Row) -> Result<serde_json::Value, String> {
        let text = self.render(name, row)?;
        serde_json::from_str(&text).map_err(|e| format!("expression result is not JSON: {e}"))
    }
}

/// One-line description of a minijinja error, with its detail.
pub fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    if let Some(detail) = e.detail()
        && !msg.contains(detail)
    {
        msg.push_str(": ");
        msg.push_str(detail);
    }
    msg
}

/// Truthiness as Python/Jinja define it, for filter predicates.
pub fn truthy(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => false,
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_report_variables_and_fail_on_undefined() {
        let mut t = Templates::new();
        let vars = t.add("p", "Hello {{ name }}, {% for x in items %}{{ x }}{% endfor %}").unwrap();
        assert_eq!(vars.into_iter().collect::<Vec<_>>(), vec!["items".to_string(), "name".to_string()]);
        let row = json!({"name": "Ann", "items": [1, 2]}).as_object().unwrap().clone();
        assert_eq!(t.render("p", &row).unwrap(), "Hello Ann, 12");
        let row = json!({"name": "Ann"}).as_object().unwrap().clone();
        assert!(t.render("p", &row).is_err());
    }

    #[test]
    fn expressions_are_typed() {
        let mut t = Templates::new();
        t.add_expression("e", "text | words > 2").unwrap();
        t.add_expression("n", "text | length").unwrap();
        let row = json!({"text": "a b c"}).as_object().unwrap().clone();
        assert_eq!(t.eval("e", &row).unwrap(), json!(true));
        assert_eq!(t.eval("n", &row).unwrap(), json!(5));
        assert!(t.add_expression("bad", "text >").is_err());
    }
}
