//! Compile and render an arbitrary chat template over an arbitrary conversation.
//! Templates ride inside GGUF files, so a hostile one must end with an error, in
//! bounded time (minijinja fuel, `hearth_chat::MAX_FUEL`) and memory (the output cap,
//! `hearth_chat::MAX_OUTPUT`; libFuzzer's `-rss_limit_mb` catches the rest).
//!
//! Input: the template source, then optionally a NUL byte, a flags byte and messages
//! separated by NUL bytes, each starting with its role. A real template file with no
//! NUL is a valid input on its own (rendered over a default conversation), so the
//! reference templates are the seed corpus as they are.
#![no_main]
use hearth_chat::{ChatTemplate, Message};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map};
use std::time::{Duration, UNIX_EPOCH};

const ROLES: &[&str] = &["system", "user", "assistant", "tool", "developer", ""];

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0);
    let Ok(source) = std::str::from_utf8(parts.next().unwrap_or_default()) else { return };
    let flags = parts.next().and_then(|p| p.first().copied()).unwrap_or(1);
    let mut messages: Vec<Message> = parts
        .filter_map(|p| {
            let (&role, text) = p.split_first()?;
            Some(Message::new(ROLES[role as usize % ROLES.len()], String::from_utf8_lossy(text)))
        })
        .collect();
    if messages.is_empty() {
        messages = vec![
            Message::new("system", "You are terse."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello."),
            Message::new("user", "2+2?"),
        ];
    }
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let Ok(t) = ChatTemplate::with_fixed_time(source, "<s>", "</s>", now) else { return };
    let mut extra = Map::new();
    if flags & 2 != 0 {
        extra.insert(
            "tools".into(),
            json!([{"type": "function", "function": {"name": "get_time", "description": "now",
                "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]),
        );
    }
    if flags & 4 != 0 {
        extra.insert("enable_thinking".into(), json!(flags & 8 != 0));
    }
    if let Ok(out) = t.render_with_context(&messages, flags & 1 != 0, &extra) {
        assert!(out.len() <= hearth_chat::MAX_OUTPUT);
    }
});
