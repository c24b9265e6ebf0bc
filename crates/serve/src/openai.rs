//! Response bodies in OpenAI's formats: `chat.completion`, `chat.completion.chunk`,
//! `text_completion` (whole and streamed), with usage counts and log-probabilities.

use crate::sequence::{Finish, TokenLogprob};
use crate::tools::Call;
use serde_json::{json, Value};

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What identifies one response across its chunks.
#[derive(Debug, Clone)]
pub struct Head {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's id.
    pub model: String,
    /// The endpoint.
    pub kind: Kind,
    /// Completions: the prompt's length in characters, where the first generated
    /// token's `text_offset` is (OpenAI counts offsets in the prompt and completion).
    pub prompt_chars: usize,
}

impl Head {
    /// A fresh id for `kind`.
    pub fn new(kind: Kind, model: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
        Self {
            id: format!("{prefix}-{:x}{n:04x}", now.as_micros()),
            created: now.as_secs(),
            model: model.to_string(),
            kind,
            prompt_chars: 0,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }
}

/// A request's token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: usize,
    /// Of them, those the prompt cache held (not evaluated again).
    pub cached: usize,
    /// Generated tokens.
    pub completion: usize,
}

/// `{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
/// {"cached_tokens"}}`, as OpenAI reports prompt caching.
pub fn usage(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.prompt + u.completion,
           "prompt_tokens_details": {"cached_tokens": u.cached}})
}

/// The `logprobs` object of a choice, or `null` when none were asked for; `at`:
/// (completions) the first token's `text_offset`, in characters.
pub fn logprobs(kind: Kind, lps: Option<&[TokenLogprob]>, at: usize) -> Value {
    let Some(lps) = lps else { return Value::Null };
    match kind {
        Kind::Chat => {
            let entry = |t: &str, b: &[u8], lp: f32| json!({"token": t, "logprob": lp, "bytes": b});
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let mut e = entry(&l.token, &l.bytes, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|(t, b, lp)| entry(t, b, *lp)).collect();
                    e
                })
                .collect();
            json!({"content": content})
        }
        Kind::Completion => {
            let mut offset = at;
            let mut offsets = Vec::with_capacity(lps.len());
            for l in lps {
                offsets.push(offset);
                offset += l.token.chars().count();
            }
            let top: Vec<Value> =
                lps.iter().map(|l| Value::Object(l.top.iter().map(|(t, _, lp)| (t.clone(), json!(lp))).collect())).collect();
            json!({
                "tokens": lps.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// One choice of a whole response: its text, why it ended, its log-probabilities.
pub struct Choice<'a> {
    /// The generated text.
    pub text: &'a str,
    /// Why it ended.
    pub finish: Finish,
    /// Log-probabilities, when asked for.
    pub lps: Option<&'a [TokenLogprob]>,
    /// Tool calls parsed from the text (chat), with their ids; `text` is then what is
    /// left (`content: null` when empty).
    pub calls: &'a [(String, Call)],
}

/// `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
fn tool_calls(calls: &[(String, Call)]) -> Value {
    calls.iter().map(|(id, c)| json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect()
}

/// A whole (non-streamed) response with `choices` (index = position).
pub fn response(h: &Head, choices: &[Choice<'_>], u: Usage) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match h.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": c.text});
                if !c.calls.is_empty() {
                    if c.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = tool_calls(c.calls);
                }
                json!({"index": i, "message": message, "logprobs": logprobs(h.kind, c.lps, h.prompt_chars), "finish_reason": c.finish.as_str()})
            }
            Kind::Completion => json!({
                "index": i,
                "text": c.text,
                "logprobs": logprobs(h.kind, c.lps, h.prompt_chars),
                "finish_reason": c.finish.as_str(),
            }),
        })
        .collect();
    json!({
        "id": h.id, "object": h.object(false), "created": h.created, "model": h.model,
        "choices": choices, "usage": usage(u), "system_fingerprint": null,
    })
}

/// One streamed chunk: `text` (chat: the delta's content; `role`: the first chunk's
/// role), a token's log-probability (and, for completions, its `text_offset`), and the
/// finish reason on the last one.
pub fn chunk(h: &Head, index: usize, role: bool, text: Option<&str>, lp: Option<(&TokenLogprob, usize)>, finish: Option<Finish>) -> Value {
    let at = lp.map_or(0, |l| l.1);
    let lps = lp.map(|l| std::slice::from_ref(l.0));
    let choice = match h.kind {
        Kind::Chat => {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                delta.insert("content".into(), json!(t));
            }
            json!({"index": index, "delta": delta, "logprobs": logprobs(h.kind, lps, at), "finish_reason": finish.map(Finish::as_str)})
        }
        Kind::Completion => {
            json!({"index": index, "text": text.unwrap_or(""), "logprobs": logprobs(h.kind, lps, at), "finish_reason": finish.map(Finish::as_str)})
        }
    };
    json!({"id": h.id, "object": h.object(true), "created": h.created, "model": h.model, "choices": [choice], "system_fingerprint": null})
}

/// A streamed tool call of choice `index`, as two chunks (OpenAI's shape): the first
/// names the call (`id`, `type`, `function.name`, empty `arguments`), the second carries
/// the arguments; `k` is the call's index among the choice's calls.
pub fn tool_call_chunks(h: &Head, index: usize, k: usize, id: &str, call: &Call) -> [Value; 2] {
    let wrap = |tc: Value| {
        let choice = json!({"index": index, "delta": {"tool_calls": [tc]}, "logprobs": null, "finish_reason": null});
        json!({"id": h.id, "object": h.object(true), "created": h.created, "model": h.model, "choices": [choice], "system_fingerprint": null})
    };
    [
        wrap(json!({"index": k, "id": id, "type": "function", "function": {"name": call.name, "arguments": ""}})),
        wrap(json!({"index": k, "function": {"arguments": call.arguments}})),
    ]
}

/// The usage chunk streamed last with `stream_options.include_usage` (no choices).
pub fn usage_chunk(h: &Head, u: Usage) -> Value {
    json!({"id": h.id, "object": h.object(true), "created": h.created, "model": h.model, "choices": [], "usage": usage(u)})
}
