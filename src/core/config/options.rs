//! Declarative option schemas and the checker that validates a spanned TOML table
//! against one: unknown keys (with did-you-mean), missing required options, wrong
//! types, out-of-range numbers, missing files. Every problem is reported, and the
//! result is plain JSON with defaults filled in, ready for a stage's serde struct.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::diag::{Diagnostics, did_you_mean};
use super::node::{Node, Span, Table, Value};

/// The type of an option value.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    Str,
    /// Integer within an inclusive range.
    Int(i64, i64),
    /// Number (integer or float) within an inclusive range.
    Float(f64, f64),
    Bool,
    /// One of the listed strings.
    Enum(&'static [&'static str]),
    /// A local file that must exist, relative to the pipeline root.
    File,
    /// One path or glob, or a list of them; each must match at least one file.
    Files,
    /// A path that will be written (not checked).
    OutPath,
    /// A string or a list of strings (normalized to a list).
    StrList,
    List(&'static Ty),
    /// A table with free keys, each value of the given type.
    Map(&'static Ty),
    /// A nested table with its own schema.
    Struct(&'static [OptionSpec]),
    /// Any value, passed through as JSON.
    Any,
}

impl Ty {
    pub fn describe(&self) -> String {
        match self {
            Ty::Str => "string".into(),
            Ty::Int(lo, hi) => match (*lo, *hi) {
                (i64::MIN, i64::MAX) => "integer".into(),
                (lo, i64::MAX) => format!("integer >= {lo}"),
                (lo, hi) => format!("integer in {lo}..={hi}"),
            },
            Ty::Float(lo, hi) => {
                if lo.is_infinite() && hi.is_infinite() {
                    "number".into()
                } else if hi.is_infinite() {
                    format!("number >= {lo}")
                } else {
                    format!("number in {lo}..={hi}")
                }
            }
            Ty::Bool => "boolean".into(),
            Ty::Enum(values) => {
                format!("one of {}", values.iter().map(|v| format!("\"{v}\"")).collect::<Vec<_>>().join(", "))
            }
            Ty::File => "path of an existing file".into(),
            Ty::Files => "path or glob (or a list of them)".into(),
            Ty::OutPath => "output path".into(),
            Ty::StrList => "string or list of strings".into(),
            Ty::List(Ty::Str) => "list of strings".into(),
            Ty::List(inner) => format!("list of {}", inner.describe()),
            Ty::Map(inner) => format!("table of {}", inner.describe()),
            Ty::Struct(_) => "table".into(),
            Ty::Any => "any value".into(),
        }
    }
}

/// Whether an option must be given, may be left out, or has a default.
#[derive(Debug, Clone, Copy)]
pub enum Need {
    Required,
    Optional,
    /// Default as a TOML literal (`"0.05"`, `"\"inner\""`, `"[]"`).
    Default(&'static str),
}

#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub name: &'static str,
    pub ty: Ty,
    pub need: Need,
    pub doc: &'static str,
    /// False for options that cannot change the output (concurrency, progress...):
    /// they are left out of the stage fingerprint.
    pub affects_output: bool,
    /// Options this one stands in for (`path` instead of `hf` or `url`): a profile that
    /// sets it drops them from the base's table it merges over.
    pub instead_of: &'static [&'static str],
    /// Values this option took once and no longer does, each with what to use instead
    /// (said in place of the plain "must be one of" error).
    pub retired: &'static [(&'static str, &'static str)],
}

impl OptionSpec {
    pub const fn required(name: &'static str, ty: Ty, doc: &'static str) -> OptionSpec {
        OptionSpec { name, ty, need: Need::Required, doc, affects_output: true, instead_of: &[], retired: &[] }
    }
    pub const fn optional(name: &'static str, ty: Ty, doc: &'static str) -> OptionSpec {
        OptionSpec { name, ty, need: Need::Optional, doc, affects_output: true, instead_of: &[], retired: &[] }
    }
    pub const fn default(name: &'static str, ty: Ty, default: &'static str, doc: &'static str) -> OptionSpec {
        OptionSpec { name, ty, need: Need::Default(default), doc, affects_output: true, instead_of: &[], retired: &[] }
    }
    /// Mark an option as not affecting the output (left out of fingerprints).
    pub const fn runtime_only(mut self) -> OptionSpec {
        self.affects_output = false;
        self
    }
    /// Mark the options this one replaces when a profile sets it (one of several ways
    /// to say the same thing, e.g. where the records come from).
    pub const fn instead_of(mut self, others: &'static [&'static str]) -> OptionSpec {
        self.instead_of = others;
        self
    }

    /// Mark values the option no longer takes, with what to use instead.
    pub const fn retired(mut self, values: &'static [(&'static str, &'static str)]) -> OptionSpec {
        self.retired = values;
        self
    }

    pub fn default_json(&self) -> Option<serde_json::Value> {
        match self.need {
            Need::Default(lit) => Some(
                super::node::parse_literal(lit)
                    .unwrap_or_else(|e| panic!("bad default literal for option {}: {lit}: {e}", self.name))
                    .to_json(),
            ),
            _ => None,
        }
    }
}

pub const INT: Ty = Ty::Int(i64::MIN, i64::MAX);
pub const UINT: Ty = Ty::Int(0, i64::MAX);
pub const POSITIVE: Ty = Ty::Int(1, i64::MAX);
pub const NUMBER: Ty = Ty::Float(f64::NEG_INFINITY, f64::INFINITY);
pub const RATIO: Ty = Ty::Float(0.0, 1.0);

/// Spans of checked options by dotted path (`"rename.old"`), for later diagnostics.
#[derive(Debug, Clone, Default)]
pub struct OptionSpans {
    pub table: Option<Span>,
    pub by_path: BTreeMap<String, Span>,
}

impl OptionSpans {
    /// The span of an option, falling back to its table.
    pub fn get(&self, path: &str) -> Span {
        self.by_path.get(path).cloned().or_else(|| self.table.clone()).unwrap_or_else(Span::builtin)
    }
}

/// What the checker needs to know besides the table.
pub struct CheckCtx<'a> {
    /// Directory that relative file paths are resolved against.
    pub root: &'a Path,
    /// Diagnostic subject (`stage "x"`).
    pub subject: Option<&'a str>,
    /// Keys handled elsewhere (e.g. `kind`, `inputs`), not reported as unknown.
    pub extra_keys: &'a [&'a str],
}

/// Check `table` against `specs`; return the options as a JSON object with defaults filled.
pub fn check_table(
    table: &Table,
    table_span: &Span,
    specs: &[OptionSpec],
    ctx: &CheckCtx<'_>,
    prefix: &str,
    spans: &mut OptionSpans,
    diags: &mut Diagnostics,
) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for entry in &table.entries {
        if ctx.extra_keys.contains(&entry.key.as_str()) && prefix.is_empty() {
            continue;
        }
        let path = join_path(prefix, &entry.key);
        spans.by_path.insert(path.clone(), entry.node.span.clone());
        match specs.iter().find(|s| s.name == entry.key) {
            Some(spec) => {
                let retired = match &entry.node.value {
                    Value::Str(s) => spec.retired.iter().find(|(v, _)| v == s),
                    _ => None,
                };
                if let Some((v, instead)) = retired {
                    diags.error(
                        &entry.node.span,
                        ctx.subject,
                        format!("option \"{path}\": \"{v}\" was removed; {instead}"),
                    );
                } else if let Some(value) = check_value(&entry.node, &spec.ty, ctx, &path, spans, diags) {
                    out.insert(entry.key.clone(), value);
                }
            }
            None => {
                let names = specs.iter().map(|s| s.name).chain(ctx.extra_keys.iter().copied());
                let hint = did_you_mean(&entry.key, names).unwrap_or_default();
                diags.error(&entry.key_span, ctx.subject, format!("unknown option \"{path}\"{hint}"));
            }
        }
    }
    for spec in specs {
        if table.get(spec.name).is_some() {
            continue;
        }
        match spec.need {
            Need::Required => diags.error(
                table_span,
                ctx.subject,
                format!("missing required option \"{}\" ({})", join_path(prefix, spec.name), spec.ty.describe()),
            ),
            Need::Default(_) => {
                out.insert(spec.name.to_string(), spec.default_json().expect("default"));
            }
            Need::Optional => {}
        }
    }
    out
}

fn join_path(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }
}

/// "a string", "an integer", "one of ..." (already reads as a phrase).
fn with_article(desc: &str) -> String {
    if desc.starts_with("one of") {
        desc.to_string()
    } else if desc.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {desc}")
    } else {
        format!("a {desc}")
    }
}

fn type_error(node: &Node, ty: &Ty, ctx: &CheckCtx<'_>, path: &str, diags: &mut Diagnostics) {
    diags.error(
        &node.span,
        ctx.subject,
        format!("option \"{path}\" must be {}, found {}", with_article(&ty.describe()), node.value.type_name()),
    );
}

fn check_value(
    node: &Node,
    ty: &Ty,
    ctx: &CheckCtx<'_>,
    path: &str,
    spans: &mut OptionSpans,
    diags: &mut Diagnostics,
) -> Option<serde_json::Value> {
    use serde_json::Value as J;
    match (ty, &node.value) {
        (Ty::Str | Ty::OutPath, Value::Str(s)) => Some(J::String(s.clone())),
        (Ty::Int(lo, hi), Value::Int(i)) => {
            if i < lo || i > hi {
                diags.error(
                    &node.span,
                    ctx.subject,
                    format!("option \"{path}\" must be {}, found {i}", with_article(&ty.describe())),
                );
                None
            } else {
                Some(J::from(*i))
            }
        }
        (Ty::Float(lo, hi), Value::Int(_) | Value::Float(_)) => {
            let x = match node.value {
                Value::Int(i) => i as f64,
                Value::Float(f) => f,
                _ => unreachable!(),
            };
            if !(x >= *lo && x <= *hi) {
                diags.error(
                    &node.span,
                    ctx.subject,
                    format!("option \"{path}\" must be {}, found {x}", with_article(&ty.describe())),
                );
                None
            } else {
                Some(node.to_json())
            }
        }
        (Ty::Bool, Value::Bool(b)) => Some(J::Bool(*b)),
        (Ty::Enum(values), Value::Str(s)) => {
            if values.contains(&s.as_str()) {
                Some(J::String(s.clone()))
            } else {
                let hint = did_you_mean(s, values.iter().copied()).unwrap_or_default();
                diags.error(
                    &node.span,
                    ctx.subject,
                    format!("option \"{path}\" must be {}, found \"{s}\"{hint}", ty.describe()),
                );
                None
            }
        }
        (Ty::File, Value::Str(s)) => {
            let full = ctx.root.join(s);
            if !full.is_file() {
                let why = if full.exists() { "is not a file" } else { "does not exist" };
                diags.error(
                    &node.span,
                    ctx.subject,
                    format!("option \"{path}\": file \"{}\" {why}", super::normalize(&full).display()),
                );
            }
            Some(J::String(s.clone()))
        }
        (Ty::Files, Value::Str(_) | Value::Array(_)) => {
            let items = string_items(node, ty, ctx, path, diags)?;
            for item in &items {
                match expand_glob(ctx.root, item) {
                    Ok(files) if files.is_empty() => diags.error(
                        &node.span,
                        ctx.subject,
                        format!(
                            "option \"{path}\": no file matches \"{}\"",
                            super::normalize(&ctx.root.join(item)).display()
                        ),
                    ),
                    Ok(_) => {}
                    Err(e) => diags.error(&node.span, ctx.subject, format!("option \"{path}\": {e}")),
                }
            }
            Some(J::Array(items.into_iter().map(J::String).collect()))
        }
        (Ty::StrList, Value::Str(_) | Value::Array(_)) => {
            let items = string_items(node, ty, ctx, path, diags)?;
            Some(J::Array(items.into_iter().map(J::String).collect()))
        }
        (Ty::List(inner), Value::Array(items)) => {
            let mut out = Vec::new();
            let mut ok = true;
            for (i, item) in items.iter().enumerate() {
                match check_value(item, inner, ctx, &format!("{path}[{i}]"), spans, diags) {
                    Some(v) => out.push(v),
                    None => ok = false,
                }
            }
            ok.then_some(J::Array(out))
        }
        (Ty::Map(inner), Value::Table(t)) => {
            let mut out = serde_json::Map::new();
            let mut ok = true;
            for entry in &t.entries {
                let sub = join_path(path, &entry.key);
                spans.by_path.insert(sub.clone(), entry.node.span.clone());
                match check_value(&entry.node, inner, ctx, &sub, spans, diags) {
                    Some(v) => {
                        out.insert(entry.key.clone(), v);
                    }
                    None => ok = false,
                }
            }
            ok.then_some(J::Object(out))
        }
        (Ty::Struct(specs), Value::Table(t)) => {
            let inner_ctx = CheckCtx { root: ctx.root, subject: ctx.subject, extra_keys: &[] };
            let before = diags.n_errors();
            let out = check_table(t, &node.span, specs, &inner_ctx, path, spans, diags);
            (diags.n_errors() == before).then_some(J::Object(out))
        }
        (Ty::Any, _) => Some(node.to_json()),
        _ => {
            type_error(node, ty, ctx, path, diags);
            None
        }
    }
}

fn string_items(node: &Node, ty: &Ty, ctx: &CheckCtx<'_>, path: &str, diags: &mut Diagnostics) -> Option<Vec<String>> {
    match &node.value {
        Value::Str(s) => Some(vec![s.clone()]),
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                match &item.value {
                    Value::Str(s) => out.push(s.clone()),
                    _ => {
                        type_error(item, ty, ctx, path, diags);
                        return None;
                    }
                }
            }
            Some(out)
        }
        _ => {
            type_error(node, ty, ctx, path, diags);
            None
        }
    }
}

/// Expand a path or glob relative to `root` into existing files, sorted.
pub fn expand_glob(root: &Path, pattern: &str) -> Result<Vec<std::path::PathBuf>, String> {
    let full = super::normalize(&root.join(pattern));
    let is_glob = pattern.contains(['*', '?', '[', '{']);
    if !is_glob {
        return Ok(if full.is_file() { vec![full] } else { vec![] });
    }
    // Walk from the longest literal prefix directory.
    let full_str = full.to_string_lossy().to_string();
    let literal_end = full_str.find(['*', '?', '[', '{']).unwrap_or(full_str.len());
    let base = Path::new(&full_str[..literal_end]);
    let base_dir = if full_str[..literal_end].ends_with('/') {
        base.to_path_buf()
    } else {
        base.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let matcher = globset::GlobBuilder::new(&full_str)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("bad glob \"{pattern}\": {e}"))?
        .compile_matcher();
    let mut out = Vec::new();
    // A glob in the working directory itself (a relative root, `*.jsonl`): list "."
    // and match its entries without the "./" that listing puts before them.
    let here = base_dir.as_os_str().is_empty();
    let mut stack = vec![if here { PathBuf::from(".") } else { base_dir }];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read.flatten() {
            let p = entry.path();
            let p = if here { p.strip_prefix(".").map(Path::to_path_buf).unwrap_or(p) } else { p };
            if p.is_dir() {
                stack.push(p);
            } else if matcher.is_match(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Render an option list for `synth list`.
pub fn describe_specs(specs: &[OptionSpec], indent: &str, out: &mut String) {
    use std::fmt::Write;
    for spec in specs {
        let need = match spec.need {
            Need::Required => "required".to_string(),
            Need::Optional => "optional".to_string(),
            Need::Default(d) => format!("default {d}"),
        };
        let _ = writeln!(out, "{indent}{} ({}; {}): {}", spec.name, spec.ty.describe(), need, spec.doc);
        if let Ty::Struct(inner) = spec.ty {
            describe_specs(inner, &format!("{indent}    "), out);
        }
    }
}

/// Keep only the options that affect output (for fingerprints).
pub fn fingerprint_view(specs: &[OptionSpec], options: &serde_json::Value) -> serde_json::Value {
    match options {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.iter()
                .filter(|(k, _)| specs.iter().find(|s| s.name == k.as_str()).is_none_or(|s| s.affects_output))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::node::{SourceFile, from_de_table};

    const SPECS: &[OptionSpec] = &[
        OptionSpec::required("n", POSITIVE, "how many"),
        OptionSpec::default("how", Ty::Enum(&["inner", "left"]), "\"inner\"", "join type"),
        OptionSpec::optional("rename", Ty::Map(&Ty::Str), "renames"),
    ];

    fn check(src: &str) -> (serde_json::Value, String) {
        let file = SourceFile::new(Path::new("t.toml"), src.to_string());
        let table = toml::de::DeTable::parse(src).unwrap();
        let table = from_de_table(&file, table.get_ref());
        let mut diags = Diagnostics::default();
        let mut spans = OptionSpans::default();
        let ctx = CheckCtx { root: Path::new("."), subject: Some("stage \"s\""), extra_keys: &["kind"] };
        let out = check_table(&table, &Span::file(&file, 0..0), SPECS, &ctx, "", &mut spans, &mut diags);
        (serde_json::Value::Object(out), diags.to_string())
    }

    #[test]
    fn fills_defaults_and_reports_all_problems() {
        let (json, diags) = check("kind = \"x\"\nn = 3\n");
        assert_eq!(json, serde_json::json!({"n": 3, "how": "inner"}));
        assert_eq!(diags, "");

        let (_, diags) = check("hwo = \"left\"\nrename = { a = 1 }\n");
        let lines: Vec<&str> = diags.lines().collect();
        assert_eq!(lines.len(), 3, "{diags}");
        assert!(
            lines[0].starts_with("t.toml:1:1: stage \"s\": unknown option \"hwo\" (did you mean \"how\"?)"),
            "{diags}"
        );
        assert!(lines[1].contains("option \"rename.a\" must be a string, found integer"), "{diags}");
        assert!(lines[2].contains("missing required option \"n\""), "{diags}");
    }

    #[test]
    fn range_and_enum_errors() {
        let (_, diags) = check("n = 0\nhow = \"lef\"\n");
        assert!(diags.contains("t.toml:1:5: stage \"s\": option \"n\" must be an integer >= 1, found 0"), "{diags}");
        assert!(
            diags.contains("must be one of \"inner\", \"left\", found \"lef\" (did you mean \"left\"?)"),
            "{diags}"
        );
    }
}
