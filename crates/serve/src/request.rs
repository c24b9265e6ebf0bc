//! Request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by field:
//! a wrong type or value is a 400 naming the field, never a panic. Unknown fields are
//! ignored, as OpenAI clients send many optional ones.

use crate::error::ApiError;
use crate::tools::{Tool, ToolChoice};
use hearth_chat::Message;
use hearth_model::sampler::SamplerConfig;
use serde_json::{Map, Value};

/// Most stop strings per request.
pub const MAX_STOP: usize = 16;
/// Most alternatives per position with `logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most choices per request (`n`).
pub const MAX_N: usize = 16;

/// Fields both endpoints take.
#[derive(Debug, Clone)]
pub struct Params {
    /// `model`, when given.
    pub model: Option<String>,
    /// `max_tokens` (or `max_completion_tokens`); `None`: until the context is full.
    pub max_tokens: Option<usize>,
    /// temperature, top_p, top_k, min_p, repeat_penalty, presence_penalty,
    /// frequency_penalty, seed.
    pub sampler: SamplerConfig,
    /// `stop`.
    pub stop: Vec<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage counts.
    pub include_usage: bool,
    /// `Some(k)`: log-probabilities with `k` alternatives per token.
    pub logprobs: Option<usize>,
    /// `ignore_eos` (llama.cpp's extension): go on past end-of-generation tokens.
    pub ignore_eos: bool,
    /// `n`: choices to generate for the prompt (choice `i` samples with `seed + i`).
    pub n: usize,
    /// `response_format`: `None` for text.
    pub format: Option<Format>,
}

/// A structured `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// `json_object`: any JSON object.
    JsonObject,
    /// `json_schema`: JSON following `json_schema.schema`.
    JsonSchema(Value),
}

/// A chat completion request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation, for the model's chat template.
    pub messages: Vec<Message>,
    /// More fields of each message for the template: `tool_calls` (assistant),
    /// `tool_call_id` and `name` (tool).
    pub fields: Vec<Map<String, Value>>,
    /// `tools` and `tool_choice`, when tools are given.
    pub tools: Option<(Vec<Tool>, ToolChoice)>,
    /// The rest.
    pub params: Params,
}

/// A completion's prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with the model's tokenizer (BOS added as the model wants).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// A (legacy) completion request.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// `prompt`.
    pub prompt: Prompt,
    /// The rest.
    pub params: Params,
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_body("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_body(format!("the request body is not valid JSON: {e}"))),
    }
}

/// Typed access to optional fields (`null` counts as absent).
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn number(&self, k: &str) -> Result<Option<f64>, ApiError> {
        self.get(k).map(|v| v.as_f64().ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a number, got {v}")))).transpose()
    }

    /// A number in `lo..=hi`.
    fn f32_in(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        match self.number(k)? {
            Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(k, format!("`{k}` must be between {lo} and {hi}, got {x}"))),
            x => Ok(x.map(|x| x as f32)),
        }
    }

    /// A whole number in `lo..=hi`.
    fn int_in(&self, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(k) else { return Ok(None) };
        match v.as_i64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            // (a u64 beyond i64 is out of range too, and shown as sent)
            _ if v.is_i64() || v.is_u64() => Err(ApiError::invalid(k, format!("`{k}` must be between {lo} and {hi}, got {v}"))),
            _ => Err(ApiError::invalid(k, format!("`{k}` must be an integer, got {v}"))),
        }
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        self.get(k).map(|v| v.as_bool().ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be true or false, got {v}")))).transpose()
    }

    fn string(&self, k: &str) -> Result<Option<&str>, ApiError> {
        self.get(k).map(|v| v.as_str().ok_or_else(|| ApiError::invalid(k, format!("`{k}` must be a string, got {v}")))).transpose()
    }
}

/// The fields both endpoints share; `chat` picks the chat form of `logprobs`.
fn params(m: &Map<String, Value>, chat: bool) -> Result<Params, ApiError> {
    let f = Fields(m);
    let n = f.int_in("n", 1, MAX_N as i64)?.unwrap_or(1) as usize;
    if let Some(b) = f.int_in("best_of", i64::MIN, i64::MAX)? {
        if b != 1 {
            return Err(ApiError::invalid("best_of", format!("only best_of = 1 is supported, got {b}")));
        }
    }
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    // Fields hearth does not implement are refused rather than silently ignored.
    for (k, why) in [
        ("suffix", "`suffix` (insertion) is not supported"),
        ("functions", "`functions` is not supported: use `tools`"),
        ("function_call", "`function_call` is not supported: use `tools` and `tool_choice`"),
    ] {
        if f.get(k).is_some_and(|v| v != "") {
            return Err(ApiError::invalid(k, why));
        }
    }
    let format = response_format(f.get("response_format"))?;
    let max = f.int_in("max_completion_tokens", 1, i64::MAX)?.or(f.int_in("max_tokens", 1, i64::MAX)?);
    let d = SamplerConfig::default();
    let seed = match f.get("seed") {
        // -1 is llama.cpp's "random seed", as is no seed at all.
        None => d.seed,
        Some(v) if v.as_i64() == Some(-1) => d.seed,
        Some(v) => v
            .as_i64()
            .map(|s| s as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::invalid("seed", format!("`seed` must be an integer, got {v}")))?,
    };
    // (top_p 0 keeps only the most likely token, as in llama.cpp.)
    let top_p = f.f32_in("top_p", 0.0, 1.0)?.unwrap_or(d.top_p);
    let repeat_penalty = f.f32_in("repeat_penalty", 0.0, 10.0)?.unwrap_or(d.repeat_penalty);
    if repeat_penalty <= 0.0 {
        return Err(ApiError::invalid("repeat_penalty", "`repeat_penalty` must be greater than 0 (1 = off)"));
    }
    let sampler = SamplerConfig {
        temperature: f.f32_in("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        top_p,
        top_k: f.int_in("top_k", 0, i64::from(u32::MAX))?.map_or(d.top_k, |k| k as usize),
        min_p: f.f32_in("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty,
        presence_penalty: f.f32_in("presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.f32_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        seed,
        logit_bias: logit_bias(f.get("logit_bias"))?,
        ..d
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= MAX_STOP => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| ApiError::invalid("stop", format!("`stop` entries must be strings, got {v}")))
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::invalid("stop", format!("at most {MAX_STOP} stop strings"))),
        Some(v) => return Err(ApiError::invalid("stop", format!("`stop` must be a string or a list of strings, got {v}"))),
    };
    let logprobs = if chat {
        match (f.bool("logprobs")?, f.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?) {
            (Some(true), top) => Some(top.unwrap_or(0) as usize),
            (_, Some(t)) if t > 0 => return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
            _ => None,
        }
    } else {
        f.int_in("logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|k| k as usize)
    };
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(v) => return Err(ApiError::invalid("stream_options", format!("`stream_options` must be an object, got {v}"))),
    };
    Ok(Params {
        model: f.string("model")?.map(str::to_string),
        max_tokens: max.map(|m| m as usize),
        sampler,
        stop,
        stream: f.bool("stream")?.unwrap_or(false),
        include_usage,
        logprobs,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        n,
        format,
    })
}

/// Most entries in `logit_bias` (OpenAI's limit is 300).
pub const MAX_LOGIT_BIAS: usize = 1024;

/// `logit_bias`: `{"token id": bias}` with biases in −100..=100 added to the logits;
/// −100 bans the token (OpenAI: "should result in a ban"). Whether the ids are in the
/// vocabulary is checked against the model ([`check_logit_bias`]).
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| Err(ApiError::invalid("logit_bias", why));
    let Some(v) = v else { return Ok(Vec::new()) };
    let Value::Object(o) = v else { return bad(format!("`logit_bias` must be an object mapping token ids to biases, got {v}")) };
    if o.len() > MAX_LOGIT_BIAS {
        return bad(format!("at most {MAX_LOGIT_BIAS} entries in `logit_bias`, got {}", o.len()));
    }
    let mut out = Vec::with_capacity(o.len());
    for (k, b) in o {
        let Ok(id) = k.parse::<u32>() else { return bad(format!("`logit_bias` keys must be token ids, got {k:?}")) };
        match b.as_f64() {
            Some(-100.0) => out.push((id, f32::NEG_INFINITY)),
            Some(b) if (-100.0..=100.0).contains(&b) => out.push((id, b as f32)),
            _ => return bad(format!("`logit_bias` values must be numbers between -100 and 100, got {b} for token {k}")),
        }
    }
    Ok(out)
}

/// A 400 when `logit_bias` names a token outside a vocabulary of `n_vocab`.
pub fn check_logit_bias(p: &Params, n_vocab: usize) -> Result<(), ApiError> {
    match p.sampler.logit_bias.iter().find(|(id, _)| *id as usize >= n_vocab) {
        Some((id, _)) => Err(ApiError::invalid("logit_bias", format!("token id {id} is outside the vocabulary (n_vocab {n_vocab})"))),
        None => Ok(()),
    }
}

/// `response_format`: `text`, `json_object`, or `json_schema` with a `schema` object
/// (whether llguidance supports the schema is checked when it is compiled).
fn response_format(v: Option<&Value>) -> Result<Option<Format>, ApiError> {
    let bad = |why: String| Err(ApiError::invalid("response_format", why));
    let Some(v) = v else { return Ok(None) };
    let Value::Object(o) = v else { return bad(format!("`response_format` must be an object with a `type`, got {v}")) };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => match o.get("json_schema").and_then(|j| j.get("schema")) {
            Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(Format::JsonSchema(s.clone()))),
            Some(s) => bad(format!("`response_format.json_schema.schema` must be a JSON schema object, got {s}")),
            None => bad("`response_format` of type `json_schema` needs `json_schema: {\"name\": ..., \"schema\": {...}}`".into()),
        },
        Some(t) => bad(format!("`response_format` type `{t}` is not supported (text, json_object, json_schema)")),
        None => bad(format!("`response_format` must be an object with a `type`, got {v}")),
    }
}

/// An assistant message's `tool_calls`, checked: a list of
/// `{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}`.
fn tool_calls(at: &str, v: &Value) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::invalid(
            &format!("{at}.tool_calls"),
            format!(
                "`{at}.tool_calls` must be a list of {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": \"...\"}}}}"
            ),
        )
    };
    let list = v.as_array().ok_or_else(bad)?;
    for c in list {
        let f = c.get("function").ok_or_else(bad)?;
        if f.get("name").and_then(Value::as_str).is_none() || f.get("arguments").is_some_and(|a| !a.is_string() && !a.is_object()) {
            return Err(bad());
        }
    }
    Ok(v.clone())
}

/// Parse a `/v1/chat/completions` body.
pub fn chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let m = object(body)?;
    let params = params(&m, true)?;
    let list = match m.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        None | Some(Value::Null) => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(v) => return Err(ApiError::invalid("messages", format!("`messages` must be a list, got {v}"))),
    };
    let mut messages = Vec::with_capacity(list.len());
    let mut fields = Vec::with_capacity(list.len());
    for (i, msg) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(o) = msg else {
            return Err(ApiError::invalid(&at, format!("`{at}` must be an object with `role` and `content`")));
        };
        let role = match o.get("role").and_then(Value::as_str) {
            Some("developer") => "system",
            Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
            Some(r) => {
                return Err(ApiError::invalid(
                    &format!("{at}.role"),
                    format!("unknown role `{r}` (system, developer, user, assistant, tool)"),
                ))
            }
            None => return Err(ApiError::invalid(&format!("{at}.role"), format!("`{at}.role` must be a string"))),
        };
        let content = match o.get("content") {
            // (An assistant turn may be only tool calls.)
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => return Err(ApiError::invalid(&format!("{at}.content"), format!("`{at}.content` is required"))),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{at}.content"),
                                "content parts must be {\"type\": \"text\", \"text\": ...}: only text is supported",
                            ))
                        }
                    }
                }
                text
            }
            Some(v) => {
                return Err(ApiError::invalid(&format!("{at}.content"), format!("content must be a string or a list of parts, got {v}")))
            }
        };
        let mut more = Map::new();
        if let Some(calls) = o.get("tool_calls").filter(|v| !v.is_null()) {
            if role != "assistant" {
                return Err(ApiError::invalid(&format!("{at}.tool_calls"), "only assistant messages have `tool_calls`"));
            }
            more.insert("tool_calls".into(), tool_calls(&at, calls)?);
        }
        for k in ["tool_call_id", "name"] {
            match o.get(k) {
                None | Some(Value::Null) => {}
                Some(v @ Value::String(_)) => {
                    more.insert(k.into(), v.clone());
                }
                Some(v) => return Err(ApiError::invalid(&format!("{at}.{k}"), format!("`{at}.{k}` must be a string, got {v}"))),
            }
        }
        messages.push(Message { role: role.to_string(), content });
        fields.push(more);
    }
    let tools = crate::tools::parse(&m)?;
    if tools.as_ref().is_some_and(|(_, c)| *c != ToolChoice::None) && params.format.is_some() {
        return Err(ApiError::invalid("response_format", "`response_format` with `tools` is not supported: use one or the other"));
    }
    Ok(ChatRequest { messages, fields, tools, params })
}

/// Parse a `/v1/completions` body.
pub fn completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let m = object(body)?;
    let params = params(&m, false)?;
    let bad = |why: &str| ApiError::invalid("prompt", why.to_string());
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad("token ids must be non-negative integers")))
            .collect()
    };
    let prompt = match m.get("prompt") {
        None | Some(Value::Null) => return Err(bad("`prompt` is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(t)] => Prompt::Tokens(ids(t)?),
            a if !a.is_empty() && a.iter().all(Value::is_number) => Prompt::Tokens(ids(a)?),
            [] => return Err(bad("`prompt` must not be empty")),
            _ => return Err(bad("one prompt per request: a string, a list of token ids, or a list holding one of them")),
        },
        Some(v) => return Err(bad(&format!("`prompt` must be a string or a list of token ids, got {v}"))),
    };
    Ok(CompletionRequest { prompt, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<impl std::fmt::Debug, ApiError>) -> (u16, Option<String>) {
        let e = r.unwrap_err();
        (e.status.as_u16(), e.param)
    }

    #[test]
    fn parses_the_openai_fields() {
        let r = chat(
            br#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
               "max_tokens":5,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,"seed":-1,"stop":["a","b"],"stream":true,
               "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"n":1,"user":"x"}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 2);
        assert_eq!(r.messages[1].content, "hi");
        let p = &r.params;
        assert_eq!((p.max_tokens, p.sampler.temperature, p.sampler.top_k, p.stream, p.include_usage), (Some(5), 0.0, 3, true, true));
        assert_eq!((p.stop.len(), p.logprobs), (2, Some(2)));
        // Seed -1 is a random one, as no seed is; other seeds are kept.
        let seed = |s: &str| {
            chat(format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"seed":{s}}}"#).as_bytes()).unwrap().params.sampler.seed
        };
        assert_ne!(seed("-1"), seed("-1"));
        assert_eq!((seed("7"), seed("-2")), (7, (-2i64) as u64));
        let bias = chat(br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"29":-100,"5":2.5},"top_p":0}"#).unwrap().params;
        let mut b = bias.sampler.logit_bias.clone();
        b.sort_by_key(|e| e.0);
        assert_eq!((b, bias.sampler.top_p), (vec![(5, 2.5), (29, f32::NEG_INFINITY)], 0.0));
        assert!(check_logit_bias(&bias, 30).is_ok());
        assert_eq!(err(check_logit_bias(&bias, 29).map(|_| ())), (400, Some("logit_bias".into())));
        // An assistant turn may be tool calls alone.
        assert!(chat(br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null}]}"#).is_ok());
        let c = completion(br#"{"prompt":[1,2,3],"stop":"x","logprobs":1}"#).unwrap();
        assert_eq!((c.prompt, c.params.stop, c.params.logprobs), (Prompt::Tokens(vec![1, 2, 3]), vec!["x".to_string()], Some(1)));
        assert_eq!(completion(br#"{"prompt":["hi"]}"#).unwrap().prompt, Prompt::Text("hi".into()));
    }

    #[test]
    fn rejects_bad_fields_with_400_naming_them() {
        let p = |s: &str| Some(s.to_string());
        assert_eq!(err(chat(b"{")), (400, None));
        assert_eq!(err(chat(b"[]")), (400, None));
        assert_eq!(err(chat(br#"{"messages":[]}"#)), (400, p("messages")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"king","content":"x"}]}"#)), (400, p("messages[0].role")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"n":17}"#)), (400, p("n")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"n":0}"#)), (400, p("n")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#)), (400, p("temperature")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#)), (400, p("temperature")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#)), (400, p("max_tokens")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#)), (400, p("max_tokens")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#)), (400, p("stop")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"top_p":-0.1}"#)), (400, p("top_p")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user"}]}"#)), (400, p("messages[0].content")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":"bad"}"#)), (400, p("logit_bias")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"a":1}}"#)), (400, p("logit_bias")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":101}}"#)), (400, p("logit_bias")));
        assert_eq!(err(chat(br#"{"messages":[{"role":"user","content":"x"}],"functions":[]}"#)), (400, p("functions")));
        assert_eq!(err(completion(br#"{"prompt":"a","suffix":"b"}"#)), (400, p("suffix")));
        assert_eq!(err(completion(br#"{"prompt":[-1]}"#)), (400, p("prompt")));
        assert_eq!(err(completion(br#"{"prompt":["a","b"]}"#)), (400, p("prompt")));
        assert_eq!(err(completion(br#"{"prompt":"a","logprobs":99}"#)), (400, p("logprobs")));
        assert_eq!(err(completion(br#"{}"#)), (400, p("prompt")));
        // A response_format that is not understood is refused by name, never ignored.
        let u = r#""messages":[{"role":"user","content":"x"}]"#;
        for rf in [
            r#"{"type":"json_schema","json_schema":{}}"#,
            r#""json""#,
            r#"{}"#,
            r#"{"type":"xml"}"#,
            r#"{"type":"json_schema","json_schema":{"schema":3}}"#,
        ] {
            let body = format!(r#"{{{u},"response_format":{rf}}}"#);
            assert_eq!(err(chat(body.as_bytes())), (400, p("response_format")), "{rf}");
        }
        assert!(chat(format!(r#"{{{u},"response_format":{{"type":"text"}}}}"#).as_bytes()).is_ok());
        let json = |rf: &str| chat(format!(r#"{{{u},"response_format":{rf}}}"#).as_bytes()).unwrap().params.format;
        assert_eq!(json(r#"{"type":"json_object"}"#), Some(Format::JsonObject));
        assert_eq!(
            json(r#"{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string"}}}"#),
            Some(Format::JsonSchema(serde_json::json!({"type":"string"})))
        );
        let tool = r#""tools":[{"type":"function","function":{"name":"f"}}]"#;
        let both = format!(r#"{{{u},{tool},"tool_choice":"required","response_format":{{"type":"json_object"}}}}"#);
        assert_eq!(err(chat(both.as_bytes())), (400, p("response_format")));
        let bad_calls = r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{}}]}]}"#;
        assert_eq!(err(chat(bad_calls.as_bytes())), (400, p("messages[0].tool_calls")));
        let calls = r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
            "function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"42"}]}"#;
        let r = chat(calls.as_bytes()).unwrap();
        assert_eq!(
            (r.fields[0]["tool_calls"][0]["function"]["name"].as_str(), r.fields[1]["tool_call_id"].as_str()),
            (Some("f"), Some("c"))
        );
        assert_eq!(err(chat(format!(r#"{{{u},"presence_penalty":2.5}}"#).as_bytes())), (400, p("presence_penalty")));
        assert_eq!(err(chat(format!(r#"{{{u},"frequency_penalty":"x"}}"#).as_bytes())), (400, p("frequency_penalty")));
    }

    #[test]
    fn presence_and_frequency_penalties_reach_the_sampler() {
        let r = chat(br#"{"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5,"frequency_penalty":-1.25}"#).unwrap();
        assert_eq!((r.params.sampler.presence_penalty, r.params.sampler.frequency_penalty), (0.5, -1.25));
        let c = completion(br#"{"prompt":"a"}"#).unwrap();
        assert_eq!((c.params.sampler.presence_penalty, c.params.sampler.frequency_penalty), (0.0, 0.0));
    }
}
