//! `POST /v1/embeddings` (OpenAI's shape): each input's final hidden states after the
//! output norm, pooled (`--pooling`: mean, cls or last) and scaled to unit length, as
//! llama-server answers for any model (`hearth_model::embed`). An input runs in passes of
//! its own in a free KV cache slot, between generation steps; inputs go one after another.

use crate::error::ApiError;
use crate::http::{answer, authorize, read_body, App};
use crate::sequence::{Event, Job};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hearth_model::sampler::SamplerConfig;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::unbounded_channel;

/// Most inputs per request (OpenAI's limit is 2048; each input here is its own pass).
pub const MAX_INPUTS: usize = 256;

/// An input: text (tokenized with the model's tokenizer, BOS as the model wants, control
/// tokens not parsed) or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// A checked `/v1/embeddings` body.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRequest {
    /// `input`: one or more.
    pub inputs: Vec<Input>,
    /// `model`, when given.
    pub model: Option<String>,
    /// `encoding_format: "base64"`: each vector as base64 of its little-endian f32 bytes
    /// (what the official Python client asks for by default).
    pub base64: bool,
    /// `dimensions`, when given (must be the model's width: vectors are not shortened).
    pub dimensions: Option<u64>,
}

/// Parse a body; a wrong field is a 400 naming it.
pub fn parse(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let m: Map<String, Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ApiError::bad_body("the request body must be a JSON object")),
        Err(e) => return Err(ApiError::bad_body(format!("the request body is not valid JSON: {e}"))),
    };
    let bad = |why: String| ApiError::invalid("input", why);
    let ids = |a: &[Value]| -> Option<Vec<u32>> { a.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok())).collect() };
    let inputs = match m.get("input") {
        None | Some(Value::Null) => return Err(bad("`input` is required: a string, a list of strings or token ids".into())),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("`input` is an empty list".into())),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            vec![Input::Tokens(ids(a).ok_or_else(|| bad("token ids must be integers in 0..2^32".into()))?)]
        }
        Some(Value::Array(a)) if !(a.iter().all(Value::is_string) || a.iter().all(Value::is_array)) => {
            return Err(bad("`input` must be a list of strings or a list of token-id lists, not a mix".into()))
        }
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(t) => {
                    ids(t).map(Input::Tokens).ok_or_else(|| bad(format!("`input[{i}]`: token ids must be integers in 0..2^32")))
                }
                other => Err(bad(format!("`input[{i}]` must be a string or a list of token ids, got {other}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(bad(format!("`input` must be a string or a list, got {v}"))),
    };
    if inputs.len() > MAX_INPUTS {
        return Err(bad(format!("at most {MAX_INPUTS} inputs per request, got {}", inputs.len())));
    }
    let string = |k: &str| match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(ApiError::invalid(k, format!("`{k}` must be a string, got {v}"))),
    };
    let base64 = match string("encoding_format")?.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => return Err(ApiError::invalid("encoding_format", format!("`encoding_format` must be `float` or `base64`, got `{f}`"))),
    };
    let dimensions = match m.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(v.as_u64().ok_or_else(|| ApiError::invalid("dimensions", format!("`dimensions` must be a positive integer, got {v}")))?)
        }
    };
    Ok(EmbeddingRequest { inputs, model: string("model")?, base64, dimensions })
}

/// `POST /v1/embeddings`.
pub async fn embeddings(State(app): State<Arc<App>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        authorize(&app, &headers)?;
        let req = parse(&read_body(&app, body)?)?;
        if let Some(m) = req.model.as_deref().filter(|m| app.strict_model && !m.is_empty() && !app.serves(m)) {
            return Err(ApiError::unknown_model(m, &app.names()));
        }
        let n_embd = app.model.config.n_embd;
        if let Some(d) = req.dimensions.filter(|&d| d != n_embd as u64) {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model's embeddings have {n_embd} dimensions, not {d} (they are not shortened)"),
            ));
        }
        let (n_ctx, n_vocab) = (app.scheduler.n_ctx(), app.model.config.n_vocab);
        let mut prompts = Vec::with_capacity(req.inputs.len());
        for (i, input) in req.inputs.iter().enumerate() {
            let ids = match input {
                Input::Text(t) => app.model.tokenizer.encode(t, true, false),
                Input::Tokens(ids) => ids.clone(),
            };
            let param = || if req.inputs.len() == 1 { "input".to_string() } else { format!("input[{i}]") };
            if ids.is_empty() {
                return Err(ApiError::invalid(&param(), "the input is empty (no tokens)"));
            }
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(ApiError::invalid(&param(), format!("token id {bad} is outside the vocabulary (n_vocab {n_vocab})")));
            }
            if ids.len() > n_ctx {
                let mut e = ApiError::context_length(ids.len(), n_ctx);
                e.message = format!(
                    "this input is {} tokens; an embedding's input may take all {n_ctx} positions of a slot (--ctx-size), no more",
                    ids.len()
                );
                e.param = Some(param());
                return Err(e);
            }
            prompts.push(ids);
        }
        // The body is written as text, vector by vector: a `serde_json::Value` tree of
        // 256 × n_embd numbers would take ~30 bytes per float beside the budget's plan.
        let mut body = String::from(r#"{"object":"list","data":["#);
        let mut tokens = 0;
        for (index, prompt) in prompts.into_iter().enumerate() {
            let (vector, n) = embed_one(&app, prompt).await?;
            tokens += n;
            let embedding = if req.base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                format!("\"{}\"", base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                serde_json::to_string(&vector).map_err(|e| ApiError::internal(format!("writing the embedding: {e}")))?
            };
            let sep = if index > 0 { "," } else { "" };
            body.push_str(&format!(r#"{sep}{{"object":"embedding","index":{index},"embedding":{embedding}}}"#));
        }
        let model = serde_json::to_string(app.answer_name(req.model.as_deref())).unwrap_or_else(|_| "\"\"".into());
        body.push_str(&format!(r#"],"model":{model},"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#));
        Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
    }
    .await;
    answer(&app, "/v1/embeddings", r)
}

/// One input through the scheduler: (unit vector, tokens).
async fn embed_one(app: &App, prompt: Vec<u32>) -> Result<(Vec<f32>, usize), ApiError> {
    let (tx, mut rx) = unbounded_channel();
    app.scheduler.submit(Job {
        prompt,
        max_tokens: 0,
        sampler: SamplerConfig::default(),
        stop: Vec::new(),
        logprobs: None,
        ignore_eos: false,
        events: tx,
        arrived: Instant::now(),
        embed: Some(app.pooling),
        constraint: None,
    })?;
    match rx.recv().await {
        Some(Event::Embedding { vector, prompt_tokens }) => Ok((vector, prompt_tokens)),
        Some(Event::Unavailable(m)) => Err(ApiError::device_failed(m)),
        Some(Event::Failed(m)) => Err(ApiError::internal(m)),
        Some(_) => Err(ApiError::internal("the scheduler answered an embedding with something else")),
        None => Err(ApiError::unavailable()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_in_every_form_and_bad_fields_named() {
        let p = |s: &str| parse(s.as_bytes());
        assert_eq!(p(r#"{"input":"hi"}"#).unwrap().inputs, vec![Input::Text("hi".into())]);
        assert_eq!(p(r#"{"input":["a","b"]}"#).unwrap().inputs.len(), 2);
        assert_eq!(p(r#"{"input":[1,2,3]}"#).unwrap().inputs, vec![Input::Tokens(vec![1, 2, 3])]);
        assert_eq!(p(r#"{"input":[[1],[2,3]],"encoding_format":"base64"}"#).unwrap().inputs.len(), 2);
        assert!(p(r#"{"input":"x","encoding_format":"base64"}"#).unwrap().base64);
        for (body, param) in [
            (r#"{}"#, "input"),
            (r#"{"input":[]}"#, "input"),
            (r#"{"input":[-1]}"#, "input"),
            (r#"{"input":[{"a":1}]}"#, "input"),
            (r#"{"input":[[1],"a"]}"#, "input"),
            (r#"{"input":["a",1]}"#, "input"),
            (r#"{"input":7}"#, "input"),
            (r#"{"input":"x","encoding_format":"hex"}"#, "encoding_format"),
            (r#"{"input":"x","dimensions":"big"}"#, "dimensions"),
            (r#"{"input":"x","model":3}"#, "model"),
        ] {
            let e = p(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        let many = format!(r#"{{"input":[{}]}}"#, vec!["\"a\""; MAX_INPUTS + 1].join(","));
        assert!(p(&many).is_err());
        assert!(p("[1]").is_err() && p("not json").is_err());
    }
}
