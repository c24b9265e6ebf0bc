//! Chat templates: turning a conversation into the prompt text a model was
//! trained on.
//!
//! Models ship a Jinja2 template in their GGUF metadata
//! (`tokenizer.chat_template`). [`ChatTemplate`] compiles one with minijinja
//! inside an environment rebuilt after HF transformers' (whitespace flags,
//! `tojson`, `raise_exception`, `strftime_now`, Python `str`/`dict` methods,
//! Python-style printing), so prompts match what transformers and llama.cpp
//! produce for the same conversation. [`Message`] is one turn;
//! [`Capabilities`] says what the template handles natively; [`ChatError`]
//! names what went wrong.
//!
//! ```
//! use hearth_chat::{ChatTemplate, Message};
//!
//! let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}\
//!               {% if add_generation_prompt %}<|assistant|>{% endif %}";
//! let template = ChatTemplate::new(source, "<s>", "</s>").unwrap();
//! let prompt = template
//!     .render(&[Message::new("user", "What is 2+2?")], true)
//!     .unwrap();
//! assert_eq!(prompt, "<|user|>What is 2+2?\n<|assistant|>");
//! ```
//!
//! Like llama.cpp (minja), compiling probes the template with small
//! conversations; a template that rejects system messages (Gemma 2) gets the
//! system text folded into the next user turn, and one that only renders
//! list-of-parts content gets its strings wrapped. Callers always send the
//! same shape.
//!
//! Limits: template values are immutable, as in transformers' sandbox, so
//! `list.append` / `list.pop` (Kimi K2's tool-call bookkeeping) fail with a
//! render error on those paths; `{% generation %}` blocks render their body
//! (transformers' assistant-mask tracking is not needed for inference).

#![deny(missing_docs)]

mod env;
mod error;
mod preprocess;
mod pyjson;

use std::time::SystemTime;

use minijinja::{context, Environment, Value};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value as Json};

pub use error::ChatError;

pub use env::{MAX_FUEL, MAX_OUTPUT};

/// A render's output buffer that refuses to grow past [`MAX_OUTPUT`] bytes.
struct CappedOutput(Vec<u8>);

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!("the rendered prompt exceeds {MAX_OUTPUT} bytes")));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Name the template is registered under inside its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, ... (passed to the template as is).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

/// A rendered conversation ([`ChatTemplate::render_marked`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The template's output.
    pub text: String,
    /// Byte ranges of `text` that are message contents (in the order the template
    /// printed them), or `None` when the template did not copy them verbatim.
    pub contents: Option<Vec<std::ops::Range<usize>>>,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What a template handles natively, found by rendering probe conversations
/// when it is compiled (as llama.cpp's minja does). Where a template lacks
/// something, [`ChatTemplate::render`] rewrites the conversation instead
/// (a "polyfill"), so callers can always send the same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// System messages render (Gemma 2's template rejects them). When false,
    /// system text is prepended to the next user message, joined by `\n`.
    pub supports_system_role: bool,
    /// Message content must be a list of `{"type": "text", "text": ...}`
    /// parts; plain strings render nothing. When true, strings are wrapped.
    pub requires_typed_content: bool,
}

/// A compiled chat template, ready to render conversations.
///
/// Compiling once and rendering many times is cheap; the struct is
/// `Send + Sync` so a server can share one.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    now: Option<SystemTime>,
    caps: Capabilities,
    /// The template reads `datetime` / `functions` without setting them:
    /// Firefunction v2's convention, filled in as llama.cpp does.
    reads_datetime: bool,
    reads_functions: bool,
    /// The template reads `tools` (it describes tools to the model itself).
    reads_tools: bool,
    /// The template's source (after preprocessing), for callers that pick a tool-call
    /// format from what the template prints.
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` (Jinja2). `bos_token` / `eos_token` are the model's
    /// special-token texts, which templates print themselves.
    ///
    /// Fails with [`ChatError::Syntax`] (naming the line) if the source does
    /// not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        Self::build(source, bos_token, eos_token, None)
    }

    /// Like [`ChatTemplate::new`], but `strftime_now` reports `now` instead of
    /// the real clock, so templates that print today's date render
    /// reproducibly (tests, golden comparisons).
    pub fn with_fixed_time(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        now: SystemTime,
    ) -> Result<Self, ChatError> {
        Self::build(source, bos_token, eos_token, Some(now))
    }

    fn build(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        now: Option<SystemTime>,
    ) -> Result<Self, ChatError> {
        let mut env = env::build(now);
        let source = preprocess::rewrite_generation_tags(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| ChatError::from_engine(e, true))?;
        let undeclared = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::from_engine(e, true))?
            .undeclared_variables(false);
        let mut template = ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            now,
            caps: Capabilities {
                supports_system_role: true,
                requires_typed_content: false,
            },
            reads_datetime: undeclared.contains("datetime"),
            reads_functions: undeclared.contains("functions"),
            reads_tools: undeclared.contains("tools"),
            source,
        };
        template.caps = template.probe();
        Ok(template)
    }

    /// Renders probe conversations to find what the template supports.
    fn probe(&self) -> Capabilities {
        const USER_NEEDLE: &str = "<User Needle>";
        const SYSTEM_NEEDLE: &str = "<System Needle>";
        let try_render = |messages: Json| {
            self.render_raw(messages, false, &Map::new())
                .unwrap_or_default()
        };
        let typed = |text: &str| json!([{"type": "text", "text": text}]);

        let requires_typed_content = !try_render(json!([{"role": "user", "content": USER_NEEDLE}]))
            .contains(USER_NEEDLE)
            && try_render(json!([{"role": "user", "content": typed(USER_NEEDLE)}]))
                .contains(USER_NEEDLE);
        let content = |text: &str| {
            if requires_typed_content {
                typed(text)
            } else {
                json!(text)
            }
        };
        let supports_system_role = try_render(json!([
            {"role": "system", "content": content(SYSTEM_NEEDLE)},
            {"role": "user", "content": content(USER_NEEDLE)},
        ]))
        .contains(SYSTEM_NEEDLE);
        Capabilities {
            supports_system_role,
            requires_typed_content,
        }
    }

    /// What the template handles natively (see [`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// Whether the template reads the `tools` variable (so it describes tools to the
    /// model itself when they are passed in the extra context).
    pub fn reads_tools(&self) -> bool {
        self.reads_tools
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the output ends with
    /// the header that opens the assistant's reply.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_context(messages, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render`], plus where the messages' contents landed in the text,
    /// so that a tokenizer can keep control-token text a user typed from becoming a
    /// control token (a forged turn): only the template's own markup may.
    ///
    /// The conversation is rendered twice, once as it is and once with each non-empty
    /// content replaced by a marker; where putting the contents back in place of the
    /// markers gives the first text, the markers' positions are the contents' byte
    /// ranges. A template that changes a content (trims it, cuts a thinking block)
    /// gives [`Rendered::contents`] `None`.
    pub fn render_marked(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Rendered, ChatError> {
        self.render_marked_with(messages, &[], add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render_marked`] with more fields per message (`fields[i]` is
    /// merged into message `i`: `tool_calls`, `tool_call_id`, `name`; missing entries
    /// add nothing) and extra template variables (`tools`), as in
    /// [`ChatTemplate::render_with_context`].
    pub fn render_marked_with(
        &self,
        messages: &[Message],
        fields: &[Map<String, Json>],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<Rendered, ChatError> {
        let render = |msgs: &[Message]| {
            self.render_raw(self.polyfill(msgs, fields), add_generation_prompt, extra)
        };
        let text = render(messages)?;
        // Private-use code points: no template or tokenizer gives them a meaning.
        let marker = |i: usize| format!("\u{F8FF}hearth:{i}\u{F8FF}");
        let marked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message {
                role: m.role.clone(),
                content: if m.content.is_empty() { String::new() } else { marker(i) },
            })
            .collect();
        let with_markers = render(&marked)?;
        let mut rebuilt = String::with_capacity(text.len());
        let mut ranges = Vec::new();
        let mut rest = with_markers.as_str();
        while let Some(start) = rest.find('\u{F8FF}') {
            rebuilt.push_str(&rest[..start]);
            let after = &rest[start + '\u{F8FF}'.len_utf8()..];
            let index = after
                .strip_prefix("hearth:")
                .and_then(|a| a.split_once('\u{F8FF}'))
                .and_then(|(n, tail)| Some((n.parse::<usize>().ok()?, tail)));
            let Some((i, tail)) = index.filter(|&(i, _)| i < messages.len()) else {
                return Ok(Rendered { text, contents: None });
            };
            let content = &messages[i].content;
            ranges.push(rebuilt.len()..rebuilt.len() + content.len());
            rebuilt.push_str(content);
            rest = tail;
        }
        rebuilt.push_str(rest);
        let contents = (rebuilt == text).then_some(ranges);
        Ok(Rendered { text, contents })
    }

    /// Like [`ChatTemplate::render`], with extra template variables, e.g.
    /// `tools` (a JSON array, or `null`), `enable_thinking`, `documents`.
    ///
    /// `messages`, `add_generation_prompt`, `bos_token` and `eos_token` are
    /// always set by this method and take precedence over same-named extras.
    /// Variables a template reads but nobody set are undefined, which
    /// templates test with `is defined`.
    pub fn render_with_context(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, ChatError> {
        self.render_raw(self.polyfill(messages, &[]), add_generation_prompt, extra)
    }

    /// Rewrites the conversation into a shape the template supports; `fields[i]` is
    /// merged into message `i` where it is kept as a message of its own.
    fn polyfill(&self, messages: &[Message], fields: &[Map<String, Json>]) -> Json {
        let caps = self.caps;
        let mut out = Vec::with_capacity(messages.len());
        let mut push = |role: &str, content: String, more: Option<&Map<String, Json>>| {
            let content = if caps.requires_typed_content {
                json!([{"type": "text", "text": content}])
            } else {
                Json::String(content)
            };
            let mut m = Map::new();
            m.insert("role".into(), Json::String(role.to_string()));
            m.insert("content".into(), content);
            for (k, v) in more.into_iter().flatten() {
                m.entry(k.clone()).or_insert_with(|| v.clone());
            }
            out.push(Json::Object(m));
        };
        // System text waiting for the next user turn (minja's rules: system
        // turns join with "\n"; a user turn gets "system\nuser"; any other
        // turn first flushes it as a user turn of its own).
        let mut pending_system = String::new();
        for (i, m) in messages.iter().enumerate() {
            let more = fields.get(i);
            if caps.supports_system_role {
                push(&m.role, m.content.clone(), more);
                continue;
            }
            match m.role.as_str() {
                "system" => {
                    if !pending_system.is_empty() {
                        pending_system.push('\n');
                    }
                    pending_system.push_str(&m.content);
                }
                "user" if !pending_system.is_empty() => {
                    let mut content = std::mem::take(&mut pending_system);
                    if !m.content.is_empty() {
                        content.push('\n');
                        content.push_str(&m.content);
                    }
                    push("user", content, more);
                }
                role => {
                    if !pending_system.is_empty() {
                        push("user", std::mem::take(&mut pending_system), None);
                    }
                    push(role, m.content.clone(), more);
                }
            }
        }
        if !pending_system.is_empty() {
            push("user", pending_system, None);
        }
        Json::Array(out)
    }

    /// Renders already-shaped messages (no polyfills).
    fn render_raw(
        &self,
        messages: Json,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::from_engine(e, false))?;
        let base = context! {
            messages => Value::from_serialize(&messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let conventions = self.conventional_context(extra)?;
        // Earlier contexts win; later ones only fill names still undefined.
        let ctx = context! { ..base, ..Value::from_serialize(extra), ..conventions };
        let mut out = CappedOutput(Vec::new());
        tmpl.render_captured_to(ctx, &mut out)
            .map_err(|e| ChatError::from_engine(e, false))?;
        // The formatter writes whole `str`s, so the bytes are UTF-8.
        String::from_utf8(out.0).map_err(|e| ChatError::Render { line: None, message: e.to_string() })
    }

    /// Variables llama.cpp supplies for templates that expect the caller to
    /// pass them (Firefunction v2: `datetime`, `functions`).
    fn conventional_context(&self, extra: &Map<String, Json>) -> Result<Value, ChatError> {
        let mut vars = Map::new();
        if self.reads_datetime {
            let now = env::strftime_now("%b %d %Y %H:%M:%S GMT", self.now)
                .map_err(|e| ChatError::from_engine(e, false))?;
            vars.insert("datetime".into(), Json::String(now));
        }
        if self.reads_functions {
            let functions = match extra.get("tools") {
                Some(tools @ Json::Array(list)) if !list.is_empty() => pyjson::dumps(
                    &Value::from_serialize(tools),
                    &pyjson::JsonOptions::new(false, Some("  ".into())),
                )
                .map_err(|e| ChatError::from_engine(e, false))?,
                _ => String::new(),
            };
            vars.insert("functions".into(), Json::String(functions));
        }
        Ok(Value::from_serialize(vars))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, msgs: &[Message]) -> Result<String, ChatError> {
        ChatTemplate::new(source, "<s>", "</s>")?.render(msgs, true)
    }

    #[test]
    fn syntax_error_names_line() {
        let err = ChatTemplate::new("ok\n{% if %}", "", "").unwrap_err();
        match err {
            ChatError::Syntax { line, .. } => assert_eq!(line, 2),
            other => panic!("expected syntax error, got {other:?}"),
        }
    }

    #[test]
    fn raise_exception_carries_message() {
        let err = render("{{ raise_exception('Roles must alternate') }}", &[]).unwrap_err();
        match &err {
            ChatError::Raised(msg) => assert_eq!(msg, "Roles must alternate"),
            other => panic!("expected Raised, got {other:?}"),
        }
        assert!(err.to_string().contains("Roles must alternate"));
    }

    #[test]
    fn hf_whitespace_and_loop_controls() {
        let src = "{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n{{ m.content }}\n{% endfor %}";
        let out = render(src, &[Message::new("user", "a"), Message::new("user", "b")]).unwrap();
        assert_eq!(out, "a\n");
    }

    #[test]
    fn python_methods_and_printing() {
        let src = "{{ ' Hi '.strip().upper() }}|{{ 'a b'.split() }}|{{ none }}|{{ true }}|{{ {'k': 1}.items()|list }}|{{ 'x'.startswith('x') }}|{{ 'a,b,c'.rsplit(',', 1) }}";
        assert_eq!(
            render(src, &[]).unwrap(),
            "HI|['a', 'b']|None|True|[['k', 1]]|True|['a,b', 'c']"
        );
    }

    #[test]
    fn tojson_like_hf() {
        let src = "{{ messages[0] | tojson }}|{{ {'a': [1, 2]} | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=True) }}";
        let out = render(src, &[Message::new("user", "héllo <b>")]).unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"héllo <b>\"}|{\n  \"a\": [\n    1,\n    2\n  ]\n}|\"\\u00e9\""
        );
    }

    #[test]
    fn namespace_and_extra_context() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{% if tools %}T{% endif %}{% if enable_thinking is defined %}E{% endif %}{{ bos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("tools".into(), serde_json::Value::Null);
        let out = t
            .render_with_context(&[Message::new("user", "x")], false, &extra)
            .unwrap();
        assert_eq!(out, "1<s>");
    }

    #[test]
    fn strftime_now_uses_fixed_time() {
        let t = ChatTemplate::with_fixed_time(
            "{{ strftime_now('%Y') }}",
            "",
            "",
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86400 * 400),
        )
        .unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "1971");
        let bad = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        assert!(matches!(
            bad.render(&[], false),
            Err(ChatError::Render { .. })
        ));
    }

    #[test]
    fn standard_variables_win_over_extras() {
        let t = ChatTemplate::new(
            "{{ bos_token }}|{{ datetime }}|{{ functions }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("bos_token".into(), json!("X"));
        extra.insert("datetime".into(), json!("D"));
        extra.insert("tools".into(), json!([{"name": "f"}]));
        let out = t.render_with_context(&[], false, &extra).unwrap();
        assert_eq!(out, "<s>|D|[\n  {\n    \"name\": \"f\"\n  }\n]");
    }

    #[test]
    fn jinja2_semantics_for_undefined_and_none() {
        let src = "{{ missing | length }}|{{ missing is iterable }}|{{ none is iterable }}|{{ 'ab' is iterable }}|{{ 1 is iterable }}";
        assert_eq!(render(src, &[]).unwrap(), "0|True|False|True|False");
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration -%}{% endfor %}";
        assert_eq!(
            render(src, &[Message::new("assistant", "hi")]).unwrap(),
            "[hi]"
        );
    }

    #[test]
    fn typed_content_is_polyfilled() {
        // Renders only list-of-parts content, like MiniMax-Text-01.
        let src = "{% for m in messages %}{% if m.content is not string %}{% for p in m.content %}{{ m.role }}:{{ p.text }};{% endfor %}{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let caps = t.capabilities();
        assert!(
            caps.requires_typed_content && caps.supports_system_role,
            "{caps:?}"
        );
        let out = t
            .render(
                &[Message::new("system", "s"), Message::new("user", "u")],
                true,
            )
            .unwrap();
        assert_eq!(out, "system:s;user:u;");
    }

    #[test]
    fn system_polyfill_joins_like_minja() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert!(!t.capabilities().supports_system_role);
        let msgs = [
            Message::new("system", "a"),
            Message::new("system", "b"),
            Message::new("user", "q"),
            Message::new("system", "c"),
            Message::new("assistant", "r"),
            Message::new("system", "d"),
        ];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "[user:a\nb\nq][user:c][assistant:r][user:d]"
        );
    }

    #[test]
    fn template_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ChatTemplate>();
    }
}
