//! Python's text rendering of JSON values, for byte-exact reproductions of official
//! Python scripts: `str()` / `repr()` of what `json.load` returns (str, int, float, bool,
//! None, list, dict) and `str.format` with named fields (`{name}`, `{{` / `}}`).
//!
//! `repr` of a string picks its quote and escapes as CPython does; "printable" follows
//! CPython's rule (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than the
//! space are escaped) with the category tables of the `unicode_categories` crate, which
//! may predate the Unicode version of a given Python for newly assigned characters.

use serde_json::{Map, Value};
use unicode_categories::UnicodeCategories;

/// `str(value)` of a value as `json.load` gives it.
pub fn py_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

/// `repr(value)` of a value as `json.load` gives it.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(value, &mut out);
    out
}

fn write_repr(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) if !n.is_f64() => out.push_str(&i.to_string()),
            (_, Some(u), _) if !n.is_f64() => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => out.push_str(&str_repr(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&str_repr(k));
                out.push_str(": ");
                write_repr(v, out);
            }
            out.push('}');
        }
    }
}

/// `repr(float)`: the shortest digits that round-trip, fixed notation for exponents in
/// -4..16 (with `.0` when integral), else `d.ddde+XX`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-5".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..point as usize], &digits[point as usize..])
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        format!("{sign}{first}{frac}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// Whether CPython's `str.isprintable()` holds for `c` (what `repr` leaves unescaped).
pub fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_ascii() {
        return !c.is_ascii_control();
    }
    let assigned = c.is_letter()
        || c.is_mark()
        || c.is_number()
        || c.is_punctuation()
        || c.is_symbol()
        || c.is_separator()
        || c.is_other();
    assigned
        && !(c.is_other_control()
            || c.is_other_format()
            || c.is_other_private_use()
            || c.is_separator_space()
            || c.is_separator_line()
            || c.is_separator_paragraph())
}

/// `repr(str)`: single quotes unless the text has a single quote and no double quote.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
    out
}

/// The field names a `str.format` template uses, in order of first use.
pub fn format_fields(template: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    walk(template, &mut |piece| {
        if let Piece::Field(name) = piece
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
        Ok(())
    })?;
    Ok(names)
}

/// `template.format(**fields)` with named fields only (`{name}`; `{{` and `}}` are
/// literal braces). A field the template names and `fields` lacks is an error (Python's
/// `KeyError`), as are conversions, format specs, indexing and unbalanced braces; fields
/// the template does not use are ignored, as in Python. Values are rendered with `str()`.
pub fn format(template: &str, fields: &Map<String, Value>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() * 2);
    walk(template, &mut |piece| {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Field(name) => match fields.get(name) {
                Some(Value::String(s)) => out.push_str(s),
                Some(v) => out.push_str(&py_str(v)),
                None => return Err(format!("the template uses {{{name}}}, which has no value (KeyError: '{name}')")),
            },
        }
        Ok(())
    })?;
    Ok(out)
}

enum Piece<'a> {
    Text(&'a str),
    Field(&'a str),
}

fn walk<'a>(template: &'a str, f: &mut dyn FnMut(Piece<'a>) -> Result<(), String>) -> Result<(), String> {
    let bytes = template.as_bytes();
    let (mut i, mut start) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                f(Piece::Text(&template[start..=i]))?;
                i += 2;
                start = i;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                f(Piece::Text(&template[start..=i]))?;
                i += 2;
                start = i;
            }
            b'{' => {
                f(Piece::Text(&template[start..i]))?;
                let end = template[i + 1..]
                    .find('}')
                    .map(|e| i + 1 + e)
                    .ok_or_else(|| format!("byte {i}: a '{{' without its '}}' (use '{{{{' for a literal brace)"))?;
                let name = &template[i + 1..end];
                let ok = !name.is_empty()
                    && name.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && !name.starts_with(|c: char| c.is_ascii_digit());
                if !ok {
                    return Err(format!(
                        "byte {i}: field {{{name}}} is not a plain name (conversions, format specs, indexing and positional fields are not supported)"
                    ));
                }
                f(Piece::Field(name))?;
                i = end + 1;
                start = i;
            }
            b'}' => return Err(format!("byte {i}: a single '}}' (use '}}}}' for a literal brace)")),
            _ => i += 1,
        }
    }
    f(Piece::Text(&template[start..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reprs_are_cpythons() {
        assert_eq!(py_repr(&json!("it's")), "\"it's\"");
        assert_eq!(py_repr(&json!("a'b\"c")), "'a\\'b\"c'");
        assert_eq!(py_repr(&json!("line\nnext\t\\")), "'line\\nnext\\t\\\\'");
        assert_eq!(py_repr(&json!("中文，　全角空格")), "'中文，\\u3000全角空格'");
        assert_eq!(py_repr(&json!("\u{7f}\u{0}\u{200b}")), "'\\x7f\\x00\\u200b'");
        assert_eq!(
            py_repr(&json!({"a": [1, 2.5, null, true], "b": {"c": "d"}})),
            "{'a': [1, 2.5, None, True], 'b': {'c': 'd'}}"
        );
        assert_eq!(py_str(&json!("plain")), "plain");
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (0.00012, "0.00012"),
            (-3.25e-7, "-3.25e-07"),
            (1e100, "1e+100"),
        ] {
            assert_eq!(float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn format_is_str_format() {
        let fields = json!({"a": "x", "n": 3, "d": {"k": "v"}}).as_object().unwrap().clone();
        assert_eq!(format("{a}-{n}-{d} {{\"r\": 1}}", &fields).unwrap(), "x-3-{'k': 'v'} {\"r\": 1}");
        assert!(format("{missing}", &fields).unwrap_err().contains("KeyError"));
        assert!(format("a } b", &fields).is_err());
        assert!(format("{a!r}", &fields).is_err());
        assert!(format("{a", &fields).is_err());
        assert_eq!(format_fields("{b}{a}{b}{{c}}").unwrap(), vec!["b", "a"]);
    }
}
