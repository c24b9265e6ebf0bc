//! Python's `json.dumps` and `repr` over template values.
//!
//! HF transformers registers its own `tojson` filter (`json.dumps` with
//! `ensure_ascii=False` by default) rather than Jinja's, and templates paste
//! its output into prompts, so byte-level details matter: `", "` / `": "`
//! separators without indent, `","` with indent, no HTML escaping, floats in
//! Python's shortest-repr form, map keys in insertion order. minijinja's
//! built-in `tojson` differs in all of these, hence this module.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Options of Python's `json.dumps` that templates pass to `tojson`.
pub(crate) struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Pretty-print with this indent string; `None` means one line.
    pub indent: Option<String>,
    /// Item separator and key separator.
    pub separators: (String, String),
    /// Sort map keys.
    pub sort_keys: bool,
}

impl JsonOptions {
    /// Python's defaults for the given indent (separators depend on it).
    pub fn new(ensure_ascii: bool, indent: Option<String>) -> Self {
        let item = if indent.is_some() { "," } else { ", " };
        JsonOptions {
            ensure_ascii,
            indent,
            separators: (item.to_string(), ": ".to_string()),
            sort_keys: false,
        }
    }
}

/// Nesting deeper than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;

/// Serializes `value` like `json.dumps(value, **opts)`.
pub(crate) fn dumps(value: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, opts, 0)?;
    Ok(out)
}

fn newline_indent(out: &mut String, opts: &JsonOptions, depth: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    opts: &JsonOptions,
    depth: usize,
) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Bytes => {
            let s = String::from_utf8_lossy(value.as_bytes().unwrap_or_default()).into_owned();
            write_json_str(out, &s, opts.ensure_ascii)
        }
        ValueKind::Map => {
            let mut pairs = map_pairs(value)?;
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline_indent(out, opts, depth + 1);
                write_json_str(out, &json_key(k), opts.ensure_ascii);
                out.push_str(&opts.separators.1);
                write_json(out, v, opts, depth + 1)?;
            }
            newline_indent(out, opts, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline_indent(out, opts, depth + 1);
                write_json(out, v, opts, depth + 1)?;
            }
            newline_indent(out, opts, depth);
            out.push(']');
        }
        ValueKind::Plain | ValueKind::Invalid | _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: object of kind {} is not JSON serializable",
                    value.kind()
                ),
            ))
        }
    }
    Ok(())
}

/// Key/value pairs of a map value in iteration (insertion) order.
fn map_pairs(value: &Value) -> Result<Vec<(Value, Value)>, Error> {
    if let Some(obj) = value.as_object() {
        if let Some(iter) = obj.try_iter_pairs() {
            return Ok(iter.collect());
        }
    }
    let mut pairs = Vec::new();
    for key in value.try_iter()? {
        let v = value.get_item(&key)?;
        pairs.push((key, v));
    }
    Ok(pairs)
}

/// Python converts non-string keys: `True` → "true", `None` → "null", numbers as repr.
fn json_key(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, false);
            s
        }
        _ => key.to_string(),
    }
}

/// Writes a number as Python does: integers in decimal, floats in shortest
/// repr (`1.0`, `1e-05`, `1e+16`). `json` selects `NaN`/`Infinity` over
/// Python's `nan`/`inf`.
fn write_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&py_float_repr(f, json));
}

/// Python's `repr(float)`: shortest round-trip digits, scientific notation
/// when the decimal exponent is below -4 or at least 16.
pub(crate) fn py_float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 {
            format!("-{s}")
        } else {
            s.to_string()
        };
    }
    let sci = format!("{f:e}"); // e.g. "-1.5e-7", "1e20", "0e0"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Writes `s` as a JSON string literal with Python's escaping rules.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // ensure_ascii escapes everything outside ' '..='~' (so DEL too).
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)`: what `{{ value }}` prints in HF's Jinja for
/// none, booleans, lists and dicts (`None`, `True`, `['a', 1]`).
pub(crate) fn py_str(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_string()),
        _ => {
            let mut out = String::new();
            write_repr(&mut out, value, 0)?;
            Ok(out)
        }
    }
}

fn write_repr(out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply to print",
        ));
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false),
        ValueKind::String => write_py_str_literal(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, v) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &v, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, (k, v)) in map_pairs(value)?.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, k, depth + 1)?;
                out.push_str(": ");
                write_repr(out, v, depth + 1)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn write_py_str_literal(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        assert_eq!(py_float_repr(1.0, true), "1.0");
        assert_eq!(py_float_repr(0.5, true), "0.5");
        assert_eq!(py_float_repr(1e-5, true), "1e-05");
        assert_eq!(py_float_repr(0.0001, true), "0.0001");
        assert_eq!(py_float_repr(1e16, true), "1e+16");
        assert_eq!(py_float_repr(1e15, true), "1000000000000000.0");
        assert_eq!(py_float_repr(-2.5e-7, true), "-2.5e-07");
        assert_eq!(py_float_repr(f64::INFINITY, true), "Infinity");
        assert_eq!(py_float_repr(f64::NAN, false), "nan");
    }

    #[test]
    fn dumps_matches_python_defaults() {
        let v =
            Value::from_serialize(serde_json::json!({"b": [1, 2.5, null], "a": "é\"<", "c": {}}));
        let compact = dumps(&v, &JsonOptions::new(false, None)).unwrap();
        assert_eq!(compact, r#"{"b": [1, 2.5, null], "a": "é\"<", "c": {}}"#);
        let ascii = dumps(&v, &JsonOptions::new(true, None)).unwrap();
        assert_eq!(ascii, r#"{"b": [1, 2.5, null], "a": "\u00e9\"<", "c": {}}"#);
        let pretty = dumps(&v, &JsonOptions::new(false, Some("  ".into()))).unwrap();
        assert_eq!(
            pretty,
            "{\n  \"b\": [\n    1,\n    2.5,\n    null\n  ],\n  \"a\": \"é\\\"<\",\n  \"c\": {}\n}"
        );
    }

    #[test]
    fn astral_chars_escape_as_surrogate_pairs() {
        let v = Value::from("😀");
        assert_eq!(
            dumps(&v, &JsonOptions::new(true, None)).unwrap(),
            r#""\ud83d\ude00""#
        );
    }

    #[test]
    fn repr_matches_python() {
        let v = Value::from_serialize(serde_json::json!(["a", 1, true, null, {"k": "it's"}]));
        assert_eq!(
            py_str(&v).unwrap(),
            r#"['a', 1, True, None, {'k': "it's"}]"#
        );
    }
}
