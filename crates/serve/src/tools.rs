//! Tool calls (`tools`, `tool_choice`) in one format, Hermes / Qwen's:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Oslo"}}
//! </tool_call>
//! ```
//!
//! It is the format of the Qwen 2.5 / 3, QwQ, Hermes 2 Pro / 3 and Granite 4 templates
//! ([`hermes_template`]), which describe the tools themselves; any other template
//! (SmolLM2's ChatML, Llama 3's, Mistral's) gets the tools and this format described in
//! a system message of ours, so the output is always this format.
//! Other formats (Llama 3's bare JSON, Mistral's `[TOOL_CALLS]`) are not recognised.
//!
//! The grammar makes the calls valid by construction: `required` and a named function
//! force one call whose `arguments` follow the function's `parameters` schema; `auto`
//! lets the model either answer in text (which may not start with `<tool_call>`) or call
//! tools, each call constrained the same way.

use crate::error::ApiError;
use llguidance::api::TopLevelGrammar;
use serde_json::{json, Map, Value};

/// The tag that opens a call.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes a call.
pub const CLOSE: &str = "</tool_call>";

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// `function.name`.
    pub name: String,
    /// `function.parameters`: a JSON schema of the arguments (an empty object when absent).
    pub parameters: Value,
    /// The tool as the request sent it (for the chat template).
    pub raw: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are not shown to the model and the answer is text.
    None,
    /// Text or calls, as the model prefers.
    Auto,
    /// At least one call (one call: see the module docs).
    Required,
    /// A call of this function.
    Function(String),
}

/// A parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON object as text (as OpenAI sends them).
    pub arguments: String,
}

/// `tools` and `tool_choice` of a chat request (`None`: no tools given).
pub fn parse(m: &Map<String, Value>) -> Result<Option<(Vec<Tool>, ToolChoice)>, ApiError> {
    let list = match m.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => return Err(ApiError::invalid("tools", format!("`tools` must be a list, got {v}"))),
    };
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(&at, format!("`{at}.type` must be \"function\" (the only kind of tool)")));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(&at, format!("`{at}.function` must be an object with a `name`")));
        };
        let Some(name) = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
            return Err(ApiError::invalid(&at, format!("`{at}.function.name` must be a non-empty string")));
        };
        // OpenAI's rule (letters, digits, `_`, `-`; at most 64), with `.` and `:` that
        // namespaced tools use: nothing that could close the call's JSON or markup.
        if name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)) {
            return Err(ApiError::invalid(
                &at,
                format!("`{at}.function.name` {name:?} must be at most 64 letters, digits, `_`, `-`, `.` or `:`"),
            ));
        }
        let parameters = match f.get("parameters") {
            // No parameters: the call's arguments are an empty object (OpenAI's reading).
            None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(v) => return Err(ApiError::invalid(&at, format!("`{at}.function.parameters` must be a JSON schema object, got {v}"))),
        };
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(ApiError::invalid(&at, format!("two tools are named `{name}`")));
        }
        tools.push(Tool { name: name.to_string(), parameters, raw: t });
    }
    let choice = match m.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be none, auto, required or a function, got `{s}`"),
                ))
            }
        }),
        Some(v @ Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if o.get("type").and_then(Value::as_str) == Some("function") => Some(ToolChoice::Function(name.to_string())),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"),
                ))
            }
        },
        Some(v) => return Err(ApiError::invalid("tool_choice", format!("`tool_choice` must be a string or an object, got {v}"))),
    };
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None | ToolChoice::Auto) => Ok(None),
            Some(_) => Err(ApiError::invalid("tool_choice", "`tool_choice` requires `tools`")),
        };
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Function(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(ApiError::invalid("tool_choice", format!("`tool_choice` names `{name}`, which is not in `tools`")));
        }
    }
    Ok(Some((tools, choice)))
}

/// The JSON schema of one call of any of `tools`: `{"name": <const>, "arguments": <its
/// parameters>}`, name first (llguidance keeps the schema's property order), compact
/// separators so the model cannot wander off in whitespace.
fn call_schema(tools: &[&Tool]) -> Value {
    let one = |t: &Tool| {
        json!({"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
               "required": ["name", "arguments"], "additionalProperties": false})
    };
    let mut s = match tools {
        [t] => one(t),
        _ => json!({"anyOf": tools.iter().map(|t| one(t)).collect::<Vec<_>>()}),
    };
    s["x-guidance"] = compact();
    s
}

/// llguidance's JSON options for generated JSON: fixed separators, no free whitespace
/// (a small model given free whitespace may emit newlines until `max_tokens`).
pub fn compact() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// The grammar for `choice` (`None`: unconstrained, for `tool_choice: none`).
pub fn grammar(tools: &[Tool], choice: &ToolChoice) -> Option<TopLevelGrammar> {
    let callable: Vec<&Tool> = match choice {
        ToolChoice::None => return None,
        ToolChoice::Function(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    let call = format!("call: {} %json {} {}", lark_str(&format!("{OPEN}\n")), call_schema(&callable), lark_str(&format!("\n{CLOSE}")));
    let lark = match choice {
        // Text that does not open a call, or calls (separated by a newline).
        ToolChoice::Auto => {
            format!("start: TEXT | calls\ncalls: call (\"\\n\" call)*\nTEXT: /(.|\\n)*/ & ~/[ \\t\\r\\n]*<tool_call>(.|\\n)*/\n{call}\n")
        }
        _ => format!("start: call\n{call}\n"),
    };
    Some(TopLevelGrammar::from_lark(lark))
}

/// A Lark string literal.
fn lark_str(s: &str) -> String {
    // JSON string syntax is valid Lark string syntax.
    Value::String(s.to_string()).to_string()
}

/// The system text describing `tools` for a template that does not (Qwen 2.5's wording).
pub fn system_text(tools: &[Tool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.raw.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// What generated text turns out to be, piece by piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text for `content`.
    Text(String),
    /// A complete call.
    Call(Call),
}

/// Reads a choice's text as it is generated: text that opens with `<tool_call>` (after
/// whitespace) is calls, each one released when its `</tool_call>` arrives; any other
/// text is content, released as soon as it cannot be the start of a call. Calls are
/// recognised only at the start of the output, as the `auto` grammar produces them
/// (text, or calls separated by whitespace); a call that does not parse, or text after
/// the calls, is content. Whole responses use it too, so streamed and whole answers agree.
#[derive(Debug, Default)]
pub struct CallStream {
    buf: String,
    mode: Mode,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum Mode {
    /// Nothing yet, or only a prefix of `<tool_call>`.
    #[default]
    Undecided,
    Text,
    Calls,
}

impl CallStream {
    /// Feed generated text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Text => {
                    if !self.buf.is_empty() {
                        out.push(Piece::Text(std::mem::take(&mut self.buf)));
                    }
                    return out;
                }
                Mode::Undecided => {
                    let t = self.buf.trim_start();
                    if t.starts_with(OPEN) {
                        self.mode = Mode::Calls;
                    } else if t.is_empty() || OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.mode = Mode::Text;
                    }
                }
                Mode::Calls => {
                    let t = self.buf.trim_start();
                    let Some(after) = t.strip_prefix(OPEN) else {
                        // Not a call where one should start: the rest is content (once it
                        // cannot be the start of another call).
                        if !t.is_empty() && !OPEN.starts_with(t) {
                            self.mode = Mode::Text;
                            continue;
                        }
                        return out;
                    };
                    let Some(end) = after.find(CLOSE) else { return out };
                    match call_of(after[..end].trim()) {
                        Some(c) => {
                            out.push(Piece::Call(c));
                            self.buf = after[end + CLOSE.len()..].to_string();
                        }
                        None => self.mode = Mode::Text,
                    }
                }
            }
        }
    }

    /// The end of the text: what is held back is content, except in calls (or a call's
    /// opening tag cut short, `<tool`: nothing). There a call
    /// cut short (by `max_tokens` or a stop string; the grammar ends none early) is
    /// returned as OpenAI returns one cut by `length`: its tool's name, once whole, with
    /// the arguments as far as they came (not valid JSON: `finish_reason` says `length`).
    /// Its markup is never content, and whitespace after calls is dropped.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let mode = std::mem::replace(&mut self.mode, Mode::Text);
        match mode {
            Mode::Calls => cut_call(rest.trim_start()).map(Piece::Call).into_iter().collect(),
            // Whitespace, or a call's opening tag cut short (`<tool`): markup, not text.
            Mode::Undecided => Vec::new(),
            Mode::Text if !rest.is_empty() => vec![Piece::Text(rest)],
            Mode::Text => Vec::new(),
        }
    }
}

/// The call in `text`, an unfinished `<tool_call>` as the grammar writes it
/// (`{"name": "N", "arguments": ARGS`): whole when only the closing tag is missing, else
/// the name with the arguments so far; `None` before the name is whole.
fn cut_call(text: &str) -> Option<Call> {
    let body = text.strip_prefix(OPEN)?.trim_start();
    // Cut within the closing tag: the call itself is whole.
    let whole = body.trim_end();
    let whole = (1..=CLOSE.len()).find_map(|n| whole.strip_suffix(&CLOSE[..n])).unwrap_or(whole);
    if let Some(c) = call_of(whole.trim_end()) {
        return Some(c);
    }
    let after = body.strip_prefix("{\"name\": ")?;
    // The name is a JSON string: the prefix that parses as one, up to its closing quote.
    let end = after.char_indices().skip(1).find(|&(i, c)| c == '"' && !after[..i].ends_with('\\')).map(|(i, _)| i + 1)?;
    let name: String = serde_json::from_str(&after[..end]).ok()?;
    let arguments = after[end..].strip_prefix(", \"arguments\": ").unwrap_or("").to_string();
    Some(Call { name, arguments })
}

/// A whole text's content (`None` when it is only calls) and calls.
pub fn parse_calls(text: &str) -> (Option<String>, Vec<Call>) {
    let mut s = CallStream::default();
    let (mut content, mut calls) = (None::<String>, Vec::new());
    for p in s.push(text).into_iter().chain(s.finish()) {
        match p {
            Piece::Text(t) => content.get_or_insert_with(String::new).push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    (content, calls)
}

/// `{"name": ..., "arguments": {...}}` as a call.
fn call_of(json_text: &str) -> Option<Call> {
    let v: Value = serde_json::from_str(json_text).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok_and(|a| a.is_object()) => s.clone(),
        None | Some(Value::Null) => "{}".to_string(),
        _ => return None,
    };
    Some(Call { name, arguments })
}

/// A call's id: `call_` and 24 hex digits, unique within the server's life.
pub fn call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("call_{:016x}{:08x}", now.as_nanos() as u64, NEXT.fetch_add(1, Ordering::Relaxed) as u32)
}

/// An assistant message's `tool_calls` as templates read them: `arguments` parsed into
/// an object (Qwen's and Hermes' templates print `arguments | tojson`), else kept.
pub fn calls_for_template(calls: &Value) -> Value {
    let mut calls = calls.clone();
    if let Some(list) = calls.as_array_mut() {
        for c in list {
            let parsed = c.pointer("/function/arguments").and_then(Value::as_str).and_then(|s| serde_json::from_str::<Value>(s).ok());
            if let (Some(p), Some(f)) = (parsed, c.get_mut("function")) {
                f["arguments"] = p;
            }
        }
    }
    calls
}

/// Whether the template describes tools itself in this module's format: it reads `tools`,
/// prints `<tool_call>` and spells the call as JSON with `name` and `arguments` (Qwen 2.5
/// and 3, QwQ, Hermes 2 Pro / 3, Granite 4, ...). Templates that put other markup inside
/// `<tool_call>` (GLM 4.6's `<arg_key>`, Qwen3-Coder's `<function=...>`) are not.
pub fn hermes_template(template: &hearth_chat::ChatTemplate) -> bool {
    let src = template.source();
    let json_call = ["\"name\": <function-name>", "\\\"name\\\": <function-name>", "{\"name\": ", "\"arguments\": "];
    template.reads_tools() && src.contains(OPEN) && json_call.iter().any(|p| src.contains(p))
}

/// The conversation as the chat template gets it: the messages, their extra fields and
/// the template variables. A template that reads `tools` and prints `<tool_call>` gets
/// `tools` and the assistants' `tool_calls` (arguments parsed) as it expects; any other
/// template gets the tools described in the system message, earlier calls as
/// `<tool_call>` text in the assistant's content, and tool results as user turns in
/// `<tool_response>` tags (Qwen's convention), so that it sees the format it is held to.
/// `tool_choice: none` shows no tools.
pub fn conversation(
    template: &hearth_chat::ChatTemplate,
    messages: Vec<hearth_chat::Message>,
    mut fields: Vec<Map<String, Value>>,
    tools: Option<&(Vec<Tool>, ToolChoice)>,
) -> Conversation {
    let mut extra = Map::new();
    let tools = tools.filter(|(_, c)| *c != ToolChoice::None).map(|(t, _)| t);
    let native = hermes_template(template);
    if native {
        for f in &mut fields {
            if let Some(c) = f.get("tool_calls") {
                let parsed = calls_for_template(c);
                f.insert("tool_calls".into(), parsed);
            }
        }
        if let Some(t) = tools {
            extra.insert("tools".into(), Value::Array(t.iter().map(|t| t.raw.clone()).collect()));
        }
        return Conversation { messages, fields, extra };
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut out_fields = Vec::with_capacity(messages.len() + 1);
    for (mut m, mut f) in messages.into_iter().zip(fields) {
        if let Some(Value::Array(calls)) = f.remove("tool_calls") {
            for c in &calls {
                let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
                let args =
                    calls_for_template(&Value::Array(vec![c.clone()]))[0].pointer("/function/arguments").cloned().unwrap_or(json!({}));
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content.push_str(&call_text(name, &args));
            }
        }
        if m.role == "tool" {
            m.role = "user".into();
            m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
        }
        out.push(m);
        out_fields.push(f);
    }
    if let Some(t) = tools {
        match out.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{}", first.content, system_text(t)),
            _ => {
                out.insert(0, hearth_chat::Message::new("system", system_text(t)));
                out_fields.insert(0, Map::new());
            }
        }
    }
    Conversation { messages: out, fields: out_fields, extra }
}

/// What [`conversation`] gives the chat template.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The messages.
    pub messages: Vec<hearth_chat::Message>,
    /// Their extra fields (`tool_calls`, `tool_call_id`, `name`).
    pub fields: Vec<Map<String, Value>>,
    /// Template variables (`tools`).
    pub extra: Map<String, Value>,
}

/// A call as text in this format (assistant turns with `tool_calls`, for templates that
/// do not print them).
pub fn call_text(name: &str, arguments: &Value) -> String {
    // (serde_json keeps insertion order here: llguidance turns on `preserve_order`)
    format!("{OPEN}\n{}\n{CLOSE}", json!({"name": name, "arguments": arguments}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Call {
        Call { name: name.into(), arguments: args.into() }
    }

    #[test]
    fn parses_calls_out_of_text() {
        let one = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        assert_eq!(parse_calls(one), (None, vec![call("f", r#"{"x":1}"#)]));
        // Several, with whitespace around and between; arguments as a JSON string.
        let two = format!("\n {one}\n  <tool_call>{{\"name\":\"g\",\"arguments\":\"{{\\\"y\\\": 2}}\"}}</tool_call>\n");
        assert_eq!(parse_calls(&two), (None, vec![call("f", r#"{"x":1}"#), call("g", r#"{"y": 2}"#)]));
        // No arguments: an empty object.
        assert_eq!(parse_calls(r#"<tool_call>{"name": "now"}</tool_call>"#).1, vec![call("now", "{}")]);
        // Text after the calls is content.
        assert_eq!(parse_calls(&format!("{one} done")), (Some(" done".into()), vec![call("f", r#"{"x":1}"#)]));
        // Not calls: plain text, text before a call, an unclosed tag, broken JSON, no
        // name, arguments not an object.
        for text in [
            "Hello there",
            "Let me check. <tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": 3}</tool_call>",
        ] {
            assert_eq!(parse_calls(text), (Some(text.to_string()), vec![]), "{text:?}");
        }
        assert_eq!(parse_calls(""), (None, vec![]));
        // An opening tag cut short is markup, not text.
        assert_eq!(parse_calls(" <tool"), (None, vec![]));
    }

    /// A call cut short (`max_tokens`) is a call, never its markup as content: whole when
    /// only the closing tag is missing, else the name and the arguments so far, and
    /// nothing before the name is whole. Calls before it are kept.
    #[test]
    fn a_cut_call_is_a_call_not_content() {
        let open = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
        assert_eq!(parse_calls(open), (None, vec![call("get_weather", r#"{"city": "Par"#)]));
        let whole = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_";
        assert_eq!(parse_calls(whole), (None, vec![call("f", r#"{"x":1}"#)]));
        assert_eq!(parse_calls(&whole[..whole.len() - 8]), (None, vec![call("f", r#"{"x":1}"#)]));
        assert_eq!(parse_calls("<tool_call>\n{\"name\": \"f\""), (None, vec![call("f", "")]));
        assert_eq!(parse_calls("<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": {"), (None, vec![call("a\"b", "{")]));
        for before_the_name in ["<tool_call>", "<tool_call>\n{\"na", "<tool_call>\n{\"name\": \"get_wea"] {
            assert_eq!(parse_calls(before_the_name), (None, vec![]), "{before_the_name:?}");
        }
        let two = format!("{}\n</tool_call>\n{open}", &whole[..whole.len() - 8]);
        assert_eq!(parse_calls(&two).1, vec![call("f", r#"{"x":1}"#), call("get_weather", r#"{"city": "Par"#)]);
    }

    /// Streamed in pieces of any size, the text gives the same calls and content, and
    /// content is released as soon as it cannot open a call.
    #[test]
    fn streamed_pieces_assemble_to_the_whole() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"é\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let whole = parse_calls(text);
        for size in 1..8 {
            let mut s = CallStream::default();
            let mut calls = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(size) {
                for p in s.push(&chunk.iter().collect::<String>()) {
                    match p {
                        Piece::Call(c) => calls.push(c),
                        Piece::Text(t) => panic!("text {t:?}"),
                    }
                }
            }
            assert!(s.finish().is_empty());
            assert_eq!((None, calls), whole, "chunks of {size}");
        }
        let mut s = CallStream::default();
        assert_eq!(s.push(" <to"), vec![]);
        assert_eq!(s.push("day"), vec![Piece::Text(" <today".into())]);
        assert_eq!(s.push(" is"), vec![Piece::Text(" is".into())]);
    }

    #[test]
    fn parses_tools_and_tool_choice() {
        let m = |s: &str| serde_json::from_str::<Map<String, Value>>(s).unwrap();
        let f = r#"{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}"#;
        let (tools, choice) = parse(&m(&format!(r#"{{"tools":[{f}]}}"#))).unwrap().unwrap();
        assert_eq!((tools.len(), choice), (1, ToolChoice::Auto));
        let named = format!(r#"{{"tools":[{f}],"tool_choice":{{"type":"function","function":{{"name":"f"}}}}}}"#);
        assert_eq!(parse(&m(&named)).unwrap().unwrap().1, ToolChoice::Function("f".into()));
        assert!(parse(&m("{}")).unwrap().is_none());
        assert!(parse(&m(r#"{"tool_choice":"auto"}"#)).unwrap().is_none());
        let param = |s: &str| parse(&m(s)).unwrap_err().param.unwrap();
        assert_eq!(param(r#"{"tool_choice":"required"}"#), "tool_choice");
        assert_eq!(param(&format!(r#"{{"tools":[{f}],"tool_choice":"sometimes"}}"#)), "tool_choice");
        assert_eq!(param(&format!(r#"{{"tools":[{f}],"tool_choice":{{"type":"function","function":{{"name":"g"}}}}}}"#)), "tool_choice");
        assert_eq!(param(r#"{"tools":[{"type":"function","function":{}}]}"#), "tools[0]");
        assert_eq!(param(r#"{"tools":[{"type":"retrieval"}]}"#), "tools[0]");
        assert_eq!(param(r#"{"tools":{}}"#), "tools");
        assert_eq!(param(&format!(r#"{{"tools":[{f},{f}]}}"#)), "tools[1]");
        assert_eq!(param(r#"{"tools":[{"type":"function","function":{"name":"a\"b</tool_call>"}}]}"#), "tools[0]");
        assert_eq!(param(&format!(r#"{{"tools":[{{"type":"function","function":{{"name":"{}"}}}}]}}"#, "x".repeat(65))), "tools[0]");
        // Namespaced names pass; no parameters means an empty arguments object.
        let (t, _) = parse(&m(r#"{"tools":[{"type":"function","function":{"name":"fs.read_file:v2"}}]}"#)).unwrap().unwrap();
        assert_eq!(t[0].parameters["additionalProperties"], false);
    }

    /// Over the reference templates: those recognised as this format render the tools
    /// and an earlier call in it; every template renders a tool conversation as
    /// `conversation` shapes it (or fails as the template itself demands).
    #[test]
    fn reference_templates_render_tool_conversations() {
        let dir = match std::env::var_os("HEARTH_REFERENCE_DIR") {
            Some(d) => std::path::PathBuf::from(d),
            None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"),
        }
        .join("chat-templates");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("note: {} not found, skipped", dir.display());
            return;
        };
        let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let tools =
            (vec![Tool { name: "get_weather".into(), parameters: tool["function"]["parameters"].clone(), raw: tool }], ToolChoice::Auto);
        let msgs = vec![
            hearth_chat::Message::new("user", "Weather in Oslo?"),
            hearth_chat::Message::new("assistant", ""),
            hearth_chat::Message::new("tool", "{\"temp\": 4}"),
        ];
        let mut call_fields = Map::new();
        call_fields.insert(
            "tool_calls".into(),
            json!([{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]),
        );
        let mut tool_fields = Map::new();
        tool_fields.insert("tool_call_id".into(), json!("call_1"));
        let fields = vec![Map::new(), call_fields, tool_fields];
        let (mut native, mut rendered) = (Vec::new(), 0);
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(src) = std::fs::read_to_string(e.path()) else { continue };
            let Ok(t) = hearth_chat::ChatTemplate::new(&src, "<s>", "</s>") else { continue };
            let c = conversation(&t, msgs.clone(), fields.clone(), Some(&tools));
            let Ok(r) = t.render_marked_with(&c.messages, &c.fields, true, &c.extra) else { continue };
            rendered += 1;
            assert!(r.text.contains("get_weather"), "{name}: the tools are not in the prompt:\n{}", r.text);
            if hermes_template(&t) {
                native.push(name.clone());
                assert!(r.text.contains(OPEN) && r.text.contains("Oslo"), "{name}: the earlier call is missing:\n{}", r.text);
            } else {
                assert!(r.text.contains(&call_text("get_weather", &json!({"city": "Oslo"}))), "{name}:\n{}", r.text);
            }
        }
        assert!(rendered >= 40, "only {rendered} templates rendered");
        for want in ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"] {
            assert!(native.iter().any(|n| n == want), "{want} not recognised: {native:?}");
        }
        for not in ["GLM-4.6.jinja", "Qwen3-Coder.jinja"] {
            assert!(!native.iter().any(|n| n == not), "{not} recognised but puts other markup in <tool_call>");
        }
        eprintln!("{} of {rendered} rendered templates use the format natively: {native:?}", native.len());
    }

    #[test]
    fn template_calls_get_parsed_arguments() {
        let calls = json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]);
        assert_eq!(calls_for_template(&calls)[0]["function"]["arguments"], json!({"a": 1}));
        assert_eq!(call_text("f", &json!({"a": 1})), "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"a\":1}}\n</tool_call>");
    }
}
