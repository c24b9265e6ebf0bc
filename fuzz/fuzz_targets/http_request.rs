//! The OpenAI request bodies `hearth serve` parses (`/v1/chat/completions`,
//! `/v1/completions`: JSON, sampling fields, `stream`/`stream_options`, `stop`,
//! `logprobs`, prompts as text or token ids), then what a parsed request drives without
//! a model: the stop-string matcher over streamed text.
//!
//! Also `/v1/embeddings` bodies (inputs as text or token ids, `encoding_format`,
//! `dimensions`).
//!
//! Input: byte 0 picks the endpoint and how the text is streamed, the rest is the body.
#![no_main]
use hearth_serve::request::{chat, completion, Prompt, MAX_STOP};
use hearth_serve::stop::StopText;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [mode, body @ ..] = data else { return };
    if mode & 0x80 != 0 {
        match hearth_serve::embeddings::parse(body) {
            Ok(r) => assert!(!r.inputs.is_empty() && r.inputs.len() <= hearth_serve::embeddings::MAX_INPUTS),
            Err(e) => assert!(e.status.is_client_error(), "a bad body must be a 4xx, got {}", e.status),
        }
        return;
    }
    let (params, text) = if mode & 1 == 0 {
        match chat(body) {
            Ok(r) => {
                let text: String = r.messages.iter().map(|m| m.content.as_str()).collect();
                (r.params, text)
            }
            Err(e) => {
                assert!(e.status.is_client_error(), "a bad body must be a 4xx, got {}", e.status);
                return;
            }
        }
    } else {
        match completion(body) {
            Ok(r) => match r.prompt {
                Prompt::Text(t) => (r.params, t),
                Prompt::Tokens(ids) => (r.params, ids.iter().map(|i| char::from_u32(*i).unwrap_or('?')).collect()),
            },
            Err(e) => {
                assert!(e.status.is_client_error(), "a bad body must be a 4xx, got {}", e.status);
                return;
            }
        }
    };
    assert!(params.stop.len() <= MAX_STOP);
    // Stream the request's own text through its stop strings, in pieces of 1..=8 chars
    // as detokenized tokens arrive: released text + held text must be the input up to
    // the first match.
    let step = 1 + (mode >> 1) as usize % 8;
    let mut stop = StopText::new(params.stop.clone());
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut stopped = false;
    for piece in chars.chunks(step) {
        let piece: String = piece.iter().collect();
        let (released, hit) = stop.push(&piece);
        out.push_str(&released);
        if hit {
            stopped = true;
            break;
        }
    }
    if !stopped {
        out.push_str(&stop.finish());
        assert_eq!(out, text, "without a stop match every character is released");
    } else {
        assert!(text.starts_with(&out), "released text is a prefix of the input");
    }
});
