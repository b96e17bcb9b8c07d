//! An owned TOML value tree where every key and value remembers where it came from
//! (file and byte range, or the command-line argument that set it), so that every
//! config error can name `path:line:col`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::de::{DeTable, DeValue};

/// A configuration file held in memory, with a line index for position lookups.
#[derive(Debug)]
pub struct SourceFile {
    /// The path as the user gave it (used in messages).
    pub display: String,
    /// The path used to open the file.
    pub path: PathBuf,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    pub fn new(path: &Path, text: String) -> Arc<SourceFile> {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Arc::new(SourceFile { display: path.display().to_string(), path: path.to_path_buf(), text, line_starts })
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line_idx = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let line_start = self.line_starts[line_idx];
        let col = self.text[line_start..offset].chars().count() + 1;
        (line_idx + 1, col)
    }
}

/// Where a configuration value came from.
#[derive(Debug, Clone)]
pub enum Origin {
    File(Arc<SourceFile>),
    /// A `--set KEY=VALUE` argument (the whole argument text).
    Arg(Arc<str>),
    /// Filled in by synth (defaults).
    Builtin,
}

/// A location: origin plus byte range inside it.
#[derive(Debug, Clone)]
pub struct Span {
    pub origin: Origin,
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn builtin() -> Span {
        Span { origin: Origin::Builtin, start: 0, end: 0 }
    }

    pub fn file(file: &Arc<SourceFile>, range: std::ops::Range<usize>) -> Span {
        Span { origin: Origin::File(file.clone()), start: range.start, end: range.end }
    }
}

impl fmt::Display for Span {
    /// `path:line:col`, or `--set a.b=c` for command-line values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Origin::File(file) => {
                let (line, col) = file.line_col(self.start);
                write!(f, "{}:{}:{}", file.display, line, col)
            }
            Origin::Arg(arg) => write!(f, "--set {arg}"),
            Origin::Builtin => write!(f, "<default>"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    pub span: Span,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Datetime(String),
    Array(Vec<Node>),
    Table(Table),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::Bool(_) => "boolean",
            Value::Datetime(_) => "datetime",
            Value::Array(_) => "array",
            Value::Table(_) => "table",
        }
    }
}

/// One `key = value` entry of a table.
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    pub key_span: Span,
    pub node: Node,
}

/// A table that keeps its entries in source order.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub entries: Vec<Entry>,
}

impl Table {
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.key == key)
    }

    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let idx = self.entries.iter().position(|e| e.key == key)?;
        Some(self.entries.remove(idx))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.key.as_str())
    }

    /// Deep merge: tables merge key by key, anything else in `overlay` replaces.
    pub fn merge(&mut self, overlay: Table) {
        for entry in overlay.entries {
            match self.get_mut(&entry.key) {
                Some(existing) => match (&mut existing.node.value, entry.node.value) {
                    (Value::Table(base), Value::Table(over)) => base.merge(over),
                    (_, value) => {
                        existing.node = Node { span: entry.node.span, value };
                        existing.key_span = entry.key_span;
                    }
                },
                None => self.entries.push(entry),
            }
        }
    }

    /// Set a value at a dotted path, creating intermediate tables. Fails when an
    /// intermediate key holds something that is not a table.
    pub fn set_path(&mut self, path: &[String], node: Node, key_span: &Span) -> Result<(), String> {
        let (first, rest) = path.split_first().ok_or_else(|| "empty key".to_string())?;
        if rest.is_empty() {
            match self.get_mut(first) {
                Some(entry) => entry.node = node,
                None => self.entries.push(Entry { key: first.clone(), key_span: key_span.clone(), node }),
            }
            return Ok(());
        }
        if self.get(first).is_none() {
            self.entries.push(Entry {
                key: first.clone(),
                key_span: key_span.clone(),
                node: Node { span: key_span.clone(), value: Value::Table(Table::default()) },
            });
        }
        let entry = self.get_mut(first).expect("inserted above");
        match &mut entry.node.value {
            Value::Table(t) => t.set_path(rest, node, key_span),
            other => Err(format!("`{first}` is a {}, not a table", other.type_name())),
        }
    }
}

impl Node {
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_table(&self) -> Option<&Table> {
        match &self.value {
            Value::Table(t) => Some(t),
            _ => None,
        }
    }

    /// Plain JSON view of the value (spans dropped).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Str(s) => J::String(s.clone()),
            Value::Int(i) => J::from(*i),
            Value::Float(x) => serde_json::Number::from_f64(*x).map(J::Number).unwrap_or(J::Null),
            Value::Bool(b) => J::Bool(*b),
            Value::Datetime(d) => J::String(d.clone()),
            Value::Array(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Table(t) => J::Object(t.entries.iter().map(|e| (e.key.clone(), e.node.to_json())).collect()),
        }
    }
}

/// Convert the toml crate's spanned tree into ours.
pub fn from_de_table(file: &Arc<SourceFile>, table: &DeTable<'_>) -> Table {
    Table {
        entries: table
            .iter()
            .map(|(k, v)| Entry {
                key: k.get_ref().to_string(),
                key_span: Span::file(file, k.span()),
                node: from_de_value(file, v.get_ref(), v.span()),
            })
            .collect(),
    }
}

fn from_de_value(file: &Arc<SourceFile>, value: &DeValue<'_>, span: std::ops::Range<usize>) -> Node {
    let value = match value {
        DeValue::String(s) => Value::Str(s.to_string()),
        DeValue::Integer(i) => {
            Value::Int(i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).unwrap_or(i64::MAX))
        }
        DeValue::Float(x) => Value::Float(parse_toml_float(x.as_str())),
        DeValue::Boolean(b) => Value::Bool(*b),
        DeValue::Datetime(d) => Value::Datetime(d.to_string()),
        DeValue::Array(items) => {
            Value::Array(items.iter().map(|item| from_de_value(file, item.get_ref(), item.span())).collect())
        }
        DeValue::Table(t) => Value::Table(from_de_table(file, t)),
    };
    Node { span: Span::file(file, span), value }
}

fn parse_toml_float(text: &str) -> f64 {
    let cleaned = text.replace('_', "");
    match cleaned.as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        "nan" | "+nan" | "-nan" => f64::NAN,
        other => other.parse().unwrap_or(f64::NAN),
    }
}

/// Parse the value half of `--set key=value`: a TOML value if it parses as one,
/// otherwise the raw text as a string (so `--set a.model=gpt-4o` needs no quotes).
pub fn parse_arg_value(arg: &Arc<str>, text: &str) -> Node {
    let span = Span { origin: Origin::Arg(arg.clone()), start: 0, end: 0 };
    let file = SourceFile::new(Path::new("--set"), text.to_string());
    match DeValue::parse(text) {
        Ok(v) => {
            let mut node = from_de_value(&file, v.get_ref(), v.span());
            respan(&mut node, &span);
            node
        }
        Err(_) => Node { span, value: Value::Str(text.to_string()) },
    }
}

/// Parse a TOML value literal (used for option defaults).
pub fn parse_literal(text: &str) -> Result<Node, String> {
    let file = SourceFile::new(Path::new("<default>"), text.to_string());
    let v = DeValue::parse(text).map_err(|e| e.to_string())?;
    Ok(from_de_value(&file, v.get_ref(), v.span()))
}

fn respan(node: &mut Node, span: &Span) {
    node.span = span.clone();
    match &mut node.value {
        Value::Array(items) => items.iter_mut().for_each(|n| respan(n, span)),
        Value::Table(t) => t.entries.iter_mut().for_each(|e| {
            e.key_span = span.clone();
            respan(&mut e.node, span)
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_chars() {
        let file = SourceFile::new(Path::new("p.toml"), "a = 1\nbé = \"x\"\n".to_string());
        assert_eq!(file.line_col(0), (1, 1));
        assert_eq!(file.line_col(6), (2, 1));
        // 'é' is two bytes: offset of '=' is 6 + 3 + 1
        assert_eq!(file.line_col(10), (2, 4));
    }

    #[test]
    fn arg_values_parse_as_toml_or_string() {
        let arg: Arc<str> = Arc::from("x=1");
        assert!(matches!(parse_arg_value(&arg, "100").value, Value::Int(100)));
        assert!(matches!(parse_arg_value(&arg, "true").value, Value::Bool(true)));
        assert!(matches!(parse_arg_value(&arg, "gpt-4o").value, Value::Str(ref s) if s == "gpt-4o"));
        assert!(matches!(parse_arg_value(&arg, "[1, 2]").value, Value::Array(ref a) if a.len() == 2));
    }

    #[test]
    fn merge_is_deep() {
        let file = SourceFile::new(Path::new("p.toml"), String::new());
        let parse = |s: &str| {
            let t = DeTable::parse(s).unwrap();
            from_de_table(&file, t.get_ref())
        };
        let mut base = parse("[a]\nx = 1\ny = 2\n");
        base.merge(parse("[a]\ny = 3\nz = 4\n"));
        let json = Node { span: Span::builtin(), value: Value::Table(base) }.to_json();
        assert_eq!(json, serde_json::json!({"a": {"x": 1, "y": 3, "z": 4}}));
    }
}
