//! The Jinja environment HF transformers renders chat templates in,
//! rebuilt on minijinja.
//!
//! transformers compiles templates in an `ImmutableSandboxedEnvironment`
//! with `trim_blocks=True`, `lstrip_blocks=True`, the `loopcontrols`
//! extension, a `tojson` filter over `json.dumps(ensure_ascii=False)` and the
//! globals `raise_exception` and `strftime_now`; template authors also lean on
//! Python's `str`/`dict` methods, which Jinja exposes. llama.cpp's engines
//! mirror that environment, so matching it makes both agree with us.
//!
//! Printing follows Python's `str()` (`None`, `True`, `['a']`), not
//! minijinja's (`none`, `true`, `["a"]`), for the same reason.

use std::time::SystemTime;

use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, Local};
use minijinja::value::{from_args, Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State, UndefinedBehavior};

use crate::error::RaisedException;
use crate::pyjson::{self, JsonOptions};

/// Instructions one render may execute. Templates come inside GGUF files, i.e. from
/// strangers: without a cap `{% for i in range(99999) %}{% for j in range(99999) %}`
/// (minijinja caps one range at 100,000 items, not their nesting) or a macro that
/// calls itself in a loop renders for hours. The reference templates render a
/// 1,000-message conversation within the cap (tests/templates.rs), and a runaway
/// template stops after about a second.
pub const MAX_FUEL: u64 = 20_000_000;

/// Most bytes one render may produce: far beyond any context window's worth of text,
/// and small enough that a template printing `"x" * 99999999` in a loop fails instead
/// of filling memory.
pub const MAX_OUTPUT: usize = 64 << 20;

/// Builds the environment; `now` fixes `strftime_now`'s clock (None = real time).
pub(crate) fn build(now: Option<SystemTime>) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(MAX_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(py_formatter);
    env.set_unknown_method_callback(unknown_method);

    env.add_filter("tojson", tojson);
    env.add_filter("from_json", from_json);
    env.add_filter("string", string);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_test("iterable", is_iterable);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", move |fmt: &str| strftime_now(fmt, now));
    env
}

/// `{{ value }}` prints like Python's `str(value)`.
fn py_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map => {
            let s = pyjson::py_str(value)?;
            out.write_str(&s)
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// `value is iterable` as in Jinja2: `None`, booleans and numbers are not
/// (minijinja iterates `none` as empty), undefined is (Jinja's `Undefined`
/// iterates as empty).
fn is_iterable(value: &Value) -> bool {
    match value.kind() {
        ValueKind::Undefined => true,
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        _ => value.try_iter().is_ok(),
    }
}

/// `value|length`; Jinja2's `Undefined` has length 0 (minijinja errors).
fn length(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    minijinja::filters::length(value).map(Value::from)
}

/// `value|string` is Python's `str(value)`.
fn string(value: &Value) -> Result<Value, Error> {
    match value.kind() {
        // Keep strings (and their safe marking) as they are.
        ValueKind::String => Ok(value.clone()),
        ValueKind::Undefined => Ok(Value::from("")),
        _ => pyjson::py_str(value).map(Value::from),
    }
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, args: &[Value]) -> Result<Value, Error> {
    let (ensure_ascii, indent, separators, sort_keys, kwargs): (
        Option<bool>,
        Option<Value>,
        Option<Value>,
        Option<bool>,
        Kwargs,
    ) = from_args(args)?;
    let ensure_ascii = kwargs
        .get::<Option<bool>>("ensure_ascii")?
        .or(ensure_ascii)
        .unwrap_or(false);
    let indent = kwargs.get::<Option<Value>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<Value>>("separators")?.or(separators);
    let sort_keys = kwargs
        .get::<Option<bool>>("sort_keys")?
        .or(sort_keys)
        .unwrap_or(false);
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        // Python: an int indent means that many spaces; a string is used as is.
        Some(v) if v.is_integer() => {
            let n = v.as_i64().unwrap_or(0).clamp(0, 64) as usize;
            Some(" ".repeat(n))
        }
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: indent must be an integer or string, got {}",
                    v.kind()
                ),
            ))
        }
    };
    let mut opts = JsonOptions::new(ensure_ascii, indent);
    opts.sort_keys = sort_keys;
    if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                opts.separators = (
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                );
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        }
    }
    pyjson::dumps(value, &opts).map(Value::from)
}

/// `text|from_json`: parses JSON text into a value (llama.cpp extension used
/// by DeepSeek templates for string-typed tool arguments).
fn from_json(text: &str) -> Result<Value, Error> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(Value::from_serialize)
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("from_json: invalid JSON: {e}"),
            )
        })
}

/// `raise_exception(msg)`: the template rejects its input.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

/// `strftime_now(fmt)`: the local time formatted like Python's `strftime`.
pub(crate) fn strftime_now(fmt: &str, now: Option<SystemTime>) -> Result<String, Error> {
    let items: Vec<Item<'_>> = StrftimeItems::new(fmt).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format string {fmt:?}"),
        ));
    }
    let time: DateTime<Local> = match now {
        Some(t) => t.into(),
        None => Local::now(),
    };
    let mut out = String::new();
    use std::fmt::Write;
    write!(out, "{}", time.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {fmt:?}"),
        )
    })?;
    Ok(out)
}

/// Python methods on values: minijinja-contrib's set plus a few it lacks.
fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    match minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args) {
        Err(e) if e.kind() == ErrorKind::UnknownMethod => {}
        other => return other,
    }
    match (value.kind(), method) {
        (ValueKind::String, "removeprefix") => {
            let (s, (prefix,)): (&str, (&str,)) =
                (value.as_str().unwrap_or_default(), from_args(args)?);
            Ok(Value::from(s.strip_prefix(prefix).unwrap_or(s)))
        }
        (ValueKind::String, "removesuffix") => {
            let (s, (suffix,)): (&str, (&str,)) =
                (value.as_str().unwrap_or_default(), from_args(args)?);
            Ok(Value::from(s.strip_suffix(suffix).unwrap_or(s)))
        }
        (ValueKind::String, "rsplit") => {
            let s = value.as_str().unwrap_or_default();
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            Ok(Value::from(py_rsplit(s, sep, maxsplit.unwrap_or(-1))))
        }
        (ValueKind::Seq, "index") => {
            let (needle,): (&Value,) = from_args(args)?;
            match value.try_iter()?.position(|v| &v == needle) {
                Some(i) => Ok(Value::from(i)),
                None => Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("list.index({needle}): value is not in list"),
                )),
            }
        }
        // HF's ImmutableSandboxedEnvironment refuses these too; say so plainly.
        (
            ValueKind::Seq | ValueKind::Map,
            "append" | "pop" | "extend" | "insert" | "remove" | "clear" | "update" | "setdefault",
        ) => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "{}.{method}(): values are immutable in chat templates (as in HF's sandbox)",
                value.kind()
            ),
        )),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

/// Python's `str.rsplit(sep, maxsplit)`.
fn py_rsplit(s: &str, sep: Option<&str>, maxsplit: i64) -> Vec<String> {
    let limit = if maxsplit < 0 {
        usize::MAX
    } else {
        maxsplit as usize
    };
    match sep {
        Some(sep) if !sep.is_empty() => {
            let mut parts: Vec<String> = if limit == usize::MAX {
                s.rsplit(sep).map(str::to_string).collect()
            } else {
                s.rsplitn(limit.saturating_add(1), sep)
                    .map(str::to_string)
                    .collect()
            };
            parts.reverse();
            parts
        }
        // No separator: split on whitespace runs, dropping empty pieces.
        _ => {
            let mut parts = Vec::new();
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if parts.len() == limit {
                    parts.push(rest.to_string());
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(pos) => {
                        let ws_len = rest[pos..].chars().next().map_or(1, char::len_utf8);
                        parts.push(rest[pos + ws_len..].to_string());
                        rest = rest[..pos].trim_end();
                    }
                    None => {
                        parts.push(rest.to_string());
                        break;
                    }
                }
            }
            parts.reverse();
            parts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::py_rsplit;

    #[test]
    fn rsplit_matches_python() {
        assert_eq!(py_rsplit("a,b,c", Some(","), 1), vec!["a,b", "c"]);
        assert_eq!(py_rsplit("a,b,c", Some(","), -1), vec!["a", "b", "c"]);
        assert_eq!(py_rsplit("  a  b c ", None, 1), vec!["  a  b", "c"]);
        assert_eq!(py_rsplit("  a  b c ", None, -1), vec!["a", "b", "c"]);
    }
}
