//! `hearth serve` end to end: the official `openai` Python client (when `HEARTH_PYTHON`
//! names an interpreter that has it), raw HTTP for errors and malformed bodies,
//! isolation of concurrent sequences, backpressure and client disconnects.

mod common;

use common::server::{Server, KEY};
use common::wait_exit;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// An OpenAI error body with this status, type and param.
fn assert_error(got: (u16, Value), status: u16, kind: &str, param: Option<&str>) {
    assert_eq!(got.0, status, "{}", got.1);
    let e = &got.1["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.1);
    assert_eq!(e["type"], kind, "{}", got.1);
    assert_eq!(e["param"].as_str(), param, "{}", got.1);
    assert!(e.get("code").is_some(), "{}", got.1);
}

#[test]
fn openai_python_client() {
    let Some(python) = std::env::var_os("HEARTH_PYTHON").filter(|p| !p.is_empty()) else {
        if std::env::var("HEARTH_REQUIRE_OPENAI").is_ok_and(|v| v == "1") {
            panic!("HEARTH_REQUIRE_OPENAI=1 but HEARTH_PYTHON (a Python with the openai package) is not set");
        }
        eprintln!("note: skipping the openai-client test: set HEARTH_PYTHON to a Python that has the openai package (.ci/run does)");
        return;
    };
    let server = Server::start(&["--parallel", "4"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai/test_openai.py");
    let out = Command::new(python)
        .arg(script)
        .env("HEARTH_BASE_URL", format!("http://{}/v1", server.addr))
        .env("HEARTH_API_KEY", KEY)
        .output()
        .expect("running HEARTH_PYTHON");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" passed, 0 failed"), "{text}");
}

#[test]
fn errors_are_openai_json_and_the_server_stays_up() {
    let s = Server::start(&["--parallel", "2", "--ctx-size", "64", "--strict-model", "--alias", "smol", "--alias", "gpt-4o-mini", "--alias", "smol", "--alias", "gpt-4o-mini",
        "--cors-origin", "https://chat.example.org/"]);
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let raw = |body: &str| {
        let (st, text) = s.request("POST", chat, Some(KEY), body);
        (st, serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    };
    assert_error(raw("{not json"), 400, "invalid_request_error", None);
    assert_error(raw(""), 400, "invalid_request_error", None);
    assert_error(raw("[1,2]"), 400, "invalid_request_error", None);
    assert_error(raw("\"\u{0}\""), 400, "invalid_request_error", None);
    assert_error(s.post(chat, &json!({})), 400, "invalid_request_error", Some("messages"));
    assert_error(s.post(chat, &json!({"messages": "hi"})), 400, "invalid_request_error", Some("messages"));
    assert_error(s.post(chat, &json!({"messages": [{"role": "user"}], "n": 17})), 400, "invalid_request_error", Some("n"));
    assert_error(s.post(chat, &json!({"messages": msgs, "temperature": "hot"})), 400, "invalid_request_error", Some("temperature"));
    assert_error(s.post(chat, &json!({"messages": msgs, "stop": {"a": 1}})), 400, "invalid_request_error", Some("stop"));
    assert_error(s.post(chat, &json!({"messages": msgs, "max_tokens": -5})), 400, "invalid_request_error", Some("max_tokens"));
    assert_error(s.post(chat, &json!({"messages": msgs, "model": "nope"})), 404, "invalid_request_error", Some("model"));
    let models: Value = serde_json::from_str(&s.get("/v1/models")).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["smol", "gpt-4o-mini"]);
    // Each served name is answered with itself; the id for none.
    for (asked, answered) in [("gpt-4o-mini", "gpt-4o-mini"), ("smol", "smol"), ("", "smol")] {
        let (st, ok) = s.post(chat, &json!({"messages": msgs, "model": asked, "max_tokens": 1}));
        assert_eq!((st, ok["model"].as_str()), (200, Some(answered)), "{ok}");
    }
    let (st, ok) = s.post("/v1/embeddings", &json!({"input": "hi", "model": "gpt-4o-mini"}));
    assert_eq!((st, ok["model"].as_str()), (200, Some("gpt-4o-mini")), "{ok}");
    let long = s.post("/v1/completions", &json!({"prompt": "word ".repeat(100)}));
    assert_eq!(long.1["error"]["code"], "context_length_exceeded", "{}", long.1);
    assert_error(long, 400, "invalid_request_error", Some("prompt"));
    assert_error(s.post("/v1/completions", &json!({"prompt": [99999999]})), 400, "invalid_request_error", Some("prompt"));
    let (st, text) = s.request("POST", chat, Some("wrong"), &json!({"messages": msgs}).to_string());
    assert_error((st, serde_json::from_str(&text).unwrap()), 401, "authentication_error", None);
    let (st, text) = s.request("GET", "/v1/models", None, "");
    assert_error((st, serde_json::from_str(&text).unwrap()), 401, "authentication_error", None);
    // the auth scheme is case-insensitive
    assert_eq!(s.request_auth("GET", "/v1/models", &format!("Authorization: bearer {KEY}\r\n"), "").0, 200);
    let (st, text) = s.request("GET", "/v1/nothing", Some(KEY), "");
    assert_error((st, serde_json::from_str(&text).unwrap()), 404, "invalid_request_error", None);
    // A wrong method is a JSON 405 saying which one the path takes.
    let (st, text) = s.request("GET", chat, Some(KEY), "");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert_error((st, v.clone()), 405, "invalid_request_error", None);
    assert!(v["error"]["message"].as_str().unwrap().contains("takes POST"), "{v}");
    // A schema that compiles but matches nothing is the client's 400, briefly said.
    let empty = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#"}}});
    let (st, v) = s.post(chat, &json!({"messages": msgs, "max_tokens": 4, "response_format": empty}));
    assert!(!v["error"]["message"].as_str().unwrap_or("").contains("<state>"), "{v}");
    assert_error((st, v), 400, "invalid_request_error", Some("response_format"));
    assert_error(s.post(chat, &json!({"messages": msgs, "logit_bias": {"99999999": 5}})), 400, "invalid_request_error", Some("logit_bias"));

    // The paths without /v1 are served too (llama.cpp's server takes both).
    let (st, ok) = s.post("/chat/completions", &json!({"messages": msgs, "max_tokens": 1}));
    assert_eq!(st, 200, "{ok}");
    // logit_bias: the greedy first token, banned (-100), gives way to another; +100 on a
    // token makes it the first one.
    let first = |bias: Value| {
        let (st, r) = s.post("/v1/completions", &json!({"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logit_bias": bias}));
        assert_eq!(st, 200, "{r}");
        r["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let greedy = first(json!({}));
    let ids = common::ok(common::hearth(&["tokenize", "-m", common::model().to_str().unwrap(), "--text", &greedy, "--json"]));
    let id = ids["ids"].as_array().or(ids.as_array()).and_then(|a| a.first()).and_then(Value::as_u64).unwrap_or_else(|| panic!("{ids}"));
    assert_ne!(first(json!({id.to_string(): -100})), greedy);
    let forced = first(json!({"42": 100}));
    assert_eq!(forced, first(json!({"42": 100, id.to_string(): 0})));
    assert_ne!(forced, greedy);

    // CORS: a page on this machine may call the API (preflight answered, origin echoed);
    // another origin gets no allow header.
    let preflight = |origin: &str| {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        write!(c, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                   Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n").unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).unwrap();
        raw.to_ascii_lowercase()
    };
    let local = preflight("http://localhost:5173");
    assert!(local.starts_with("http/1.1 200") && local.contains("access-control-allow-origin: http://localhost:5173"), "{local}");
    assert!(local.contains("access-control-allow-headers: authorization, content-type"), "{local}");
    let named = preflight("https://chat.example.org");
    assert!(named.contains("access-control-allow-origin: https://chat.example.org"), "{named}");
    for other in ["https://evil.example", "http://localhost:3000@evil.example", "http://localhost.evil.example", "http://localhost:abc"] {
        let r = preflight(other);
        assert!(!r.contains("access-control-allow-origin"), "{other}: {r}");
    }
    assert!(preflight("http://[::1]:8080").contains("access-control-allow-origin: http://[::1]:8080"));
    // A form-style POST (text/plain: no preflight) from another origin is refused before
    // it runs; control: the same from this machine's page, or with no Origin, runs.
    let simple_post = |origin: Option<&str>| {
        let body = json!({"prompt": "Hello", "max_tokens": 1}).to_string();
        let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
        let mut c = TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\n{origin}Authorization: Bearer {KEY}\r\nContent-Type: text/plain\r\n\
                   Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).unwrap();
        raw
    };
    let evil = simple_post(Some("https://evil.example"));
    assert!(
        evil.starts_with("HTTP/1.1 403") && evil.contains("\"origin_not_allowed\"") && evil.contains("--cors-origin https://evil.example"),
        "{evil}"
    );
    for ok in [simple_post(Some("http://localhost:5173")), simple_post(Some("https://chat.example.org")), simple_post(None)] {
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    }

    // Still serving, and counting.
    let (st, ok) = s.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}));
    assert_eq!(st, 200, "{ok}");
    assert_eq!(ok["usage"]["completion_tokens"], 3);
    let (st, health) = s.request("GET", "/health", None, "");
    assert_eq!(st, 200, "{health}");
    let metrics = s.request("GET", "/metrics", None, "").1;
    for want in [
        "hearth_requests_total{endpoint=\"/v1/chat/completions\",code=\"400\"}",
        "hearth_ttft_seconds_count 12",
        "hearth_queue_depth 0",
        "hearth_rss_file_bytes ",
    ] {
        assert!(metrics.contains(want), "{want} missing from\n{metrics}");
    }
}

/// Greedy completion of `prompt`: (text, tokens, log-probabilities).
fn greedy(s: &Server, prompt: &str) -> (String, Value, Value) {
    // Any model name is served without --strict-model (clients send fixed ones).
    let (st, r) = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 0, "model": "gpt-3.5-turbo"}));
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    (c["text"].as_str().unwrap().to_string(), c["logprobs"]["tokens"].clone(), c["logprobs"]["token_logprobs"].clone())
}

#[test]
fn concurrent_greedy_requests_match_each_alone() {
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "def add(a, b):",
        "The three primary colors are",
        "1, 2, 3, 4, 5,",
        "My favourite food is",
        "In 1492, Columbus",
        "Water boils at",
    ];
    let s = Server::start(&["--parallel", "8"]);
    let alone: Vec<_> = prompts.iter().map(|p| greedy(&s, p)).collect();
    let together: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(|| greedy(&s, p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "prompt {i} ({:?}) differs when batched with the others", prompts[i]);
    }
    // They did share batches.
    let m = s.get("/metrics");
    let over_one: u64 = {
        let b = |le: &str| -> u64 {
            m.lines()
                .find_map(|l| l.strip_prefix(&format!("hearth_batch_sequences_bucket{{le=\"{le}\"}} ")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        b("+Inf") - b("1")
    };
    assert!(over_one > 0, "no step ran more than one sequence:\n{m}");
}

/// A multi-turn chat: each later turn finds the conversation so far in a slot's prompt
/// cache (cached tokens ≥ 90% of the previous turn's prompt) and gets the same replies as
/// a server without the cache (the control: there, nothing is cached).
#[test]
fn prompt_cache_serves_later_chat_turns_with_the_same_tokens() {
    let questions = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?", "Name a river in each."];
    let converse = |s: &Server| {
        let mut messages = vec![json!({"role": "system", "content": "You are a helpful geography tutor."})];
        let mut turns = Vec::new();
        for q in questions {
            messages.push(json!({"role": "user", "content": q}));
            // Another request in between, on another slot, must not disturb the cache.
            let (st, _) = s.post("/v1/completions", &json!({"prompt": "Unrelated text", "max_tokens": 2, "temperature": 0}));
            assert_eq!(st, 200);
            let (st, r) = s.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 24, "temperature": 0}));
            assert_eq!(st, 200, "{r}");
            let reply = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
            let u = &r["usage"];
            turns.push((reply.clone(), u["prompt_tokens"].as_u64().unwrap(), u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()));
            messages.push(json!({"role": "assistant", "content": reply}));
        }
        turns
    };
    let cached = converse(&Server::start(&["--parallel", "2"]));
    let uncached = converse(&Server::start(&["--parallel", "2", "--no-prompt-cache"]));
    for (i, (c, u)) in cached.iter().zip(&uncached).enumerate() {
        assert_eq!((&c.0, c.1), (&u.0, u.1), "turn {i}: reply or prompt differs with the cache");
        assert_eq!(u.2, 0, "turn {i}: cached tokens without the cache");
        if i > 0 {
            let prev = cached[i - 1].1;
            assert!(c.2 * 10 >= prev * 9, "turn {i}: {} cached of the previous prompt's {prev}", c.2);
            assert!(c.2 < c.1);
        }
    }
}

/// A seeded request at temperature 0.8 gives the same tokens every time, alone and in a
/// batch with others; another seed gives others (the control). `n` > 1 choices, whole
/// and streamed.
#[test]
fn seeded_sampling_is_reproducible_alone_and_batched() {
    let s = Server::start(&["--parallel", "4"]);
    let sample = |prompt: &str, seed: u64| {
        let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": seed, "logprobs": 0});
        let (st, r) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{r}");
        r["choices"][0]["logprobs"]["tokens"].clone()
    };
    let alone = sample("Once upon a time", 7);
    assert_eq!(sample("Once upon a time", 7), alone);
    let together: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = [("Once upon a time", 7), ("The sea", 1), ("Once upon a time", 7), ("def f(x):", 2)]
            .into_iter()
            .map(|(p, seed)| sc.spawn(move || sample(p, seed)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!((&together[0], &together[2]), (&alone, &alone));
    let others: Vec<_> = (8..12).map(|seed| sample("Once upon a time", seed)).collect();
    assert!(others.iter().any(|o| *o != alone), "four other seeds all gave seed 7's tokens");

    // n = 3: choice i samples with seed 7 + i, so choice 0 is the n = 1 request's and
    // choice 1 is seed 8's; the prompt is counted once, the generated tokens of all.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8, "seed": 7, "logprobs": 0, "n": 3});
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(choices[0]["logprobs"]["tokens"], alone);
    assert_eq!(choices[1]["logprobs"]["tokens"], others[0]);
    let generated: u64 = choices.iter().map(|c| c["logprobs"]["tokens"].as_array().unwrap().len() as u64).sum();
    assert_eq!(r["usage"]["completion_tokens"].as_u64(), Some(generated), "{}", r["usage"]);
    assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(4), "{}", r["usage"]);
    // `text_offset` counts characters from the prompt's start (OpenAI's): the first
    // token's is the prompt's length, each next one moves by a token.
    let offsets: Vec<Vec<u64>> = choices
        .iter()
        .map(|c| c["logprobs"]["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect())
        .collect();
    for (c, o) in choices.iter().zip(&offsets) {
        let tokens: Vec<&str> = c["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert_eq!(o[0], "Once upon a time".len() as u64, "{o:?}");
        assert!(o.windows(2).zip(&tokens).all(|(w, t)| w[1] - w[0] == t.chars().count() as u64), "{o:?} {tokens:?}");
    }
    // Streamed, the chunks of each index assemble to the same texts and offsets.
    let texts: Vec<String> = choices.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8, "seed": 7, "n": 3, "stream": true, "logprobs": 0});
    let (st, sse) = s.request("POST", "/v1/completions", Some(KEY), &body.to_string());
    assert_eq!(st, 200, "{sse}");
    let mut streamed = vec![String::new(); 3];
    let mut streamed_offsets = vec![Vec::new(); 3];
    let mut finished = 0;
    for line in sse.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let v: Value = serde_json::from_str(line).unwrap();
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            streamed[i] += c["text"].as_str().unwrap();
            finished += usize::from(!c["finish_reason"].is_null());
            if let Some(o) = c["logprobs"]["text_offset"].as_array() {
                streamed_offsets[i].extend(o.iter().map(|o| o.as_u64().unwrap()));
            }
        }
    }
    assert_eq!((streamed, finished, streamed_offsets), (texts, 3, offsets));
}

/// Gemma 3 270M served with continuous batching: prompts longer than the ring of its
/// sliding-window layers (`-b 64`: 512 + 63 positions) give the same greedy tokens
/// batched together as alone, and as `hearth generate` on one sequence. With an f32
/// cache: with f16 the attention path follows how many of a sequence's tokens share a
/// pass (llama.cpp's f32 tiles from 64 on), which batching changes, and greedy tokens
/// drift after a few (measured: the 9th of prompt 1).
#[test]
fn gemma3_batched_requests_through_window_rings_match_each_alone() {
    let reference = std::env::var("HEARTH_REFERENCE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"));
    let text = std::fs::read_to_string(reference.join("smollm2/ppl_gpl3.txt")).unwrap();
    let prompts: Vec<String> =
        ["In short, the license says", "The three primary colors are", "Summary:", "def main():"].iter().map(|e| format!("{}\n\n{e}", &text[..2600])).collect();
    let m = common::gemma3();
    let s = Server::start_model(&m, &["--parallel", "4", "--ctx-size", "1024", "-b", "64", "--cache-type", "f32"]);
    let alone: Vec<_> = prompts.iter().map(|p| greedy(&s, p)).collect();
    let together: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(|| greedy(&s, p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.0, t.0, "prompt {i} differs when batched with the others");
    }
    let g = common::ok(common::hearth(&["generate", "-m", m.to_str().unwrap(), "-p", &prompts[0], "-n", "16", "--temperature", "0",
        "-c", "1024", "-b", "64", "--cache-type", "f32", "-t", "2", "--json"]));
    let n_prompt = g["prompt_tokens"].as_array().unwrap().len();
    assert!(n_prompt > 575, "the prompt ({n_prompt} tokens) must outgrow the ring");
    assert_eq!(g["text"].as_str().unwrap(), alone[0].0, "serve vs generate");
}

#[test]
fn a_full_queue_answers_429() {
    let s = Server::start(&["--parallel", "1", "--queue-size", "1"]);
    let body = json!({"prompt": "Tell me a long story", "max_tokens": 300, "temperature": 0, "ignore_eos": true});
    let codes: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6).map(|_| sc.spawn(|| s.post("/v1/completions", &body))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // One in the slot, one waiting: the first takes seconds, so the other four are refused.
    let ok = codes.iter().filter(|c| c.0 == 200).count();
    let full: Vec<_> = codes.iter().filter(|c| c.0 == 429).collect();
    assert!(ok == 2 && full.len() == 4, "{codes:?}");
    assert_eq!(full[0].1["error"]["code"], "queue_full", "{:?}", full[0]);
}

/// The queue limit counts requests waiting for a slot, not those a free slot takes: a
/// burst of as many requests as slots is served whole even with a queue of one (it was
/// refused in part when the burst came faster than the scheduler took jobs off the queue).
#[test]
fn a_burst_as_large_as_the_slots_is_never_refused() {
    let s = Server::start(&["--parallel", "4", "--queue-size", "1"]);
    let body = json!({"prompt": "Tell me a story", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    for _ in 0..3 {
        let codes: Vec<(u16, Value)> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..5).map(|_| sc.spawn(|| s.post("/v1/completions", &body))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(codes.iter().all(|c| c.0 == 200), "{codes:?}");
    }
    // `n` is bounded by what the server takes at once: 4 slots + 1 waiting.
    let (code, v) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2, "n": 5}));
    assert_eq!(code, 200, "{v}");
    let (code, v) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2, "n": 6}));
    assert_eq!((code, v["error"]["param"].as_str()), (400, Some("n")), "{v}");
}

/// A streamed greedy completion of `max_tokens` tokens (EOS ignored), its status line
/// read: the connection, with the stream going on.
fn long_stream(s: &Server, max_tokens: usize) -> TcpStream {
    let body = json!({"prompt": "Count to one thousand:", "max_tokens": max_tokens, "temperature": 0, "stream": true, "ignore_eos": true})
        .to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = c.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    c
}

/// Send `sig` (`-TERM`, `-INT`) to `pid`.
fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
}

#[test]
fn a_second_signal_stops_the_server_mid_generation() {
    // A long generation held `hearth serve` after Ctrl-C until it ended, with further
    // signals ignored (new-user pass: 47 s for a 2044-token stream).
    let mut s = Server::start(&["--parallel", "1", "--ctx-size", "4096"]);
    let mut c = long_stream(&s, 3000);
    let mut buf = [0u8; 4096];
    let pid = s.child.id();
    signal(pid, "-TERM");
    // The first signal drains: no new connections, the stream goes on.
    let t0 = Instant::now();
    while TcpStream::connect(&s.addr).is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(10), "still accepting connections after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(c.read(&mut buf).unwrap() > 0, "the stream in flight stopped at the first signal");
    assert!(s.child.try_wait().unwrap().is_none(), "control: the first signal lets the request in flight finish");
    let log = s.log.lock().unwrap().clone();
    assert!(log.contains("the 1 generating and 0 queued finish first (Ctrl-C or SIGTERM again to stop now)"), "{log}");
    // The second stops the server long before 3000 tokens.
    signal(pid, "-INT");
    let status = wait_exit(&mut s.child, "a second signal");
    assert!(status.success(), "{status:?}");
    // The client sees its stream end, unfinished.
    let mut rest = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"));
    std::thread::sleep(Duration::from_millis(200));
    let log = s.log.lock().unwrap().clone();
    assert!(log.contains("stopping now, cutting off the requests in flight"), "{log}");
}

#[test]
fn an_idle_server_stops_at_the_first_signal() {
    let mut s = Server::start(&[]);
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(st, 200, "{r}");
    // A client that sent half a request (new-user pass: it held the stop for good).
    let mut half = TcpStream::connect(&s.addr).unwrap();
    write!(half, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"prompt\"").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    signal(s.child.id(), "-INT");
    wait_exit(&mut s.child, "Ctrl-C on an idle server");
}

#[test]
fn the_first_signal_lets_a_stream_finish_then_stops() {
    let mut s = Server::start(&["--parallel", "1"]);
    let mut c = long_stream(&s, 200);
    // Beside it, a client that sent half a request and waits.
    let mut half = TcpStream::connect(&s.addr).unwrap();
    write!(half, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{").unwrap();
    signal(s.child.id(), "-TERM");
    let mut rest = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    c.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("data: [DONE]") && rest.contains("\"finish_reason\":\"length\""), "{rest}");
    wait_exit(&mut s.child, "its last stream ended");
}

/// The server's raw answer to `request` (a request's head, then whatever `send` writes),
/// read as it comes: to the blank line after the head when `head_only`, else until the
/// server closes; what came within 60 s. Reading beside the writes keeps an answer the
/// server sends before closing with the rest unread: the reset that follows could drop
/// an answer read only after the writes.
fn raw_answer(s: &Server, request: &str, send: impl FnOnce(&mut TcpStream), head_only: bool) -> String {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let mut reader = c.try_clone().unwrap();
    reader.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let answer = std::thread::spawn(move || {
        let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
        while !(head_only && got.windows(4).any(|w| w == b"\r\n\r\n")) {
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    });
    c.write_all(request.as_bytes()).unwrap();
    send(&mut c);
    answer.join().unwrap()
}

#[test]
fn a_body_over_the_limit_is_refused_before_it_is_sent() {
    let s = Server::start(&[]);
    let head = |len: usize| {
        format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n")
    };
    // A declared 100 MB gets its 413 at once, not `100 Continue` (curl's cue to send it).
    let got = raw_answer(&s, &head(100_000_000), |_| {}, true);
    assert!(got.starts_with("HTTP/1.1 413"), "{got:?}");
    // Control: a body under the limit is asked for.
    let got = raw_answer(&s, &head(1000), |_| {}, true);
    assert!(got.starts_with("HTTP/1.1 100 Continue"), "{got:?}");
    // The same head to an unknown path is a 404, to a GET-only path a 405 (new-user
    // pass: both were 413).
    for (path, status) in [("/v1/nope", "404"), ("/v1/models", "405")] {
        let got = raw_answer(&s, &head(100_000_000).replace("/v1/completions", path), |_| {}, true);
        assert!(got.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {got:?}");
    }
    // A body over the limit that declares no length (chunked) is refused as it is read.
    let chunked = format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    let answer = raw_answer(
        &s,
        &chunked,
        |c| {
            let chunk = vec![b' '; 1 << 20];
            for _ in 0..17 {
                if write!(c, "{:x}\r\n", chunk.len()).and_then(|_| c.write_all(&chunk)).and_then(|_| c.write_all(b"\r\n")).is_err() {
                    return; // the server answered and closed
                }
            }
            let _ = c.write_all(b"0\r\n\r\n");
        },
        false,
    );
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("request_too_large") && answer.contains("limit of 16 MiB"), "{answer}");
    // A body that is malformed, not large, is a 400 that says so (new-user pass: it was
    // labelled request_too_large).
    let answer = raw_answer(&s, &format!("{chunked}zzzz\r\n"), |_| {}, false);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("\"invalid_body\"") && answer.contains("could not be read"), "{answer}");
    // The server goes on.
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(st, 200, "{r}");
}

/// A client that stops sending mid-request holds its connection for `--timeout`, not for
/// good: a stalled body is answered 408 (JSON), stalled headers close the connection; a
/// body sent in pauses shorter than the timeout is served.
#[test]
fn a_stalled_request_times_out() {
    let s = Server::start(&["--timeout", "1"]);
    let head = |len: usize| {
        format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n")
    };
    let t0 = Instant::now();
    let answer = raw_answer(&s, &format!("{}{{\"prompt\":", head(100)), |_| {}, false);
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("stopped arriving") && answer.contains("nothing came for 1 s (the server's --timeout)"), "{answer}");
    let answer = raw_answer(&s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", |_| {}, false);
    assert_eq!(answer, "", "stalled headers");
    // Both within seconds of the 1 s timeout (raw_answer gives up after 60 s).
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // Control: the same body in three parts 0.4 s apart.
    let body = r#"{"prompt":"Hi","max_tokens":1}"#;
    let answer = raw_answer(
        &s,
        &head(body.len()),
        |c| {
            for part in [&body[..10], &body[10..20], &body[20..]] {
                std::thread::sleep(Duration::from_millis(400));
                c.write_all(part.as_bytes()).unwrap();
            }
        },
        true,
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn a_taken_port_is_named_before_the_model_loads() {
    let s = Server::start(&[]);
    let port = s.addr.rsplit_once(':').unwrap().1;
    // No model at all: the port is what is reported, so it was checked first.
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["serve", "--port", port, "-m", "/nonexistent/model.gguf"])
        .env_remove("HEARTH_MODEL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("cannot listen on 127.0.0.1:{port}")) && err.contains("another server is on that port"), "{err}");
    assert!(!err.contains("nonexistent"), "{err}");
    // An empty model name is refused at once too.
    let out = Command::new(env!("CARGO_BIN_EXE_hearth")).args(["serve", "--alias", "", "-m", "/nonexistent/model.gguf"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("a model name must be non-empty"), "{err}");
    // Control: on a free port the same command reaches the model and fails on it.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["serve", "--port", &free, "-m", "/nonexistent/model.gguf"])
        .env_remove("HEARTH_MODEL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nonexistent") && !err.contains("cannot listen"), "{err}");
}

#[test]
fn a_client_that_disconnects_frees_its_slot() {
    let s = Server::start(&["--parallel", "1"]);
    drop(long_stream(&s, 1500));
    // The slot is freed long before 1500 tokens; the next request gets it.
    let t0 = Instant::now();
    loop {
        let m = s.get("/metrics");
        if m.contains("hearth_cancelled_total 1") && m.contains("hearth_active_sequences 0") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the sequence was not cancelled:\n{m}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(st, 200, "{r}");

    // A non-streaming client that gives up waiting is cancelled too.
    let body = json!({"prompt": "Count to one thousand:", "max_tokens": 1500, "ignore_eos": true}).to_string();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(c);
    let t0 = Instant::now();
    loop {
        let m = s.get("/metrics");
        if m.contains("hearth_cancelled_total 2") && m.contains("hearth_active_sequences 0") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the non-streaming sequence was not cancelled:\n{m}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Resident set size of `pid` in bytes (`VmRSS`).
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).unwrap_or(0)
        * 1024
}

/// One round of `n` requests from `clients` threads: random prompt and output lengths,
/// every 10th a malformed body, every 7th a streaming client that hangs up after the
/// first chunk. Returns the statuses of the well-formed, completed requests.
fn soak_round(s: &Server, n: usize, clients: usize, seed: u64) -> Vec<u16> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..clients {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let mut x = (seed + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut rnd = |m: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % m
                };
                let prompt = "lorem ipsum dolor ".repeat(1 + rnd(20) as usize);
                let max_tokens = 1 + rnd(24);
                if i % 10 == 3 {
                    let bad = ["{\"prompt\": ", "{\"prompt\": 5}", "\u{1}\u{2}", "{\"prompt\":\"x\",\"max_tokens\":\"many\"}"][i % 4];
                    let (st, _) = s.request("POST", "/v1/completions", Some(KEY), bad);
                    assert_eq!(st, 400, "malformed body {bad:?}");
                } else if i % 7 == 5 {
                    let body = json!({"prompt": prompt, "max_tokens": 200, "stream": true, "ignore_eos": true}).to_string();
                    let mut c = TcpStream::connect(&s.addr).unwrap();
                    write!(
                        c,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .unwrap();
                    let mut buf = [0u8; 512];
                    let _ = c.read(&mut buf);
                } else {
                    let stream = rnd(2) == 0;
                    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "stream": stream, "temperature": 0.7, "seed": i});
                    let (st, text) = s.request("POST", "/v1/completions", Some(KEY), &body.to_string());
                    assert!(st == 200 && (!stream || text.contains("data: [DONE]")), "request {i}: {st} {text}");
                    out.lock().unwrap().push(st);
                }
            });
        }
    });
    out.into_inner().unwrap()
}

#[test]
fn soak_200_requests_from_32_clients_with_disconnects_and_garbage() {
    let s = Server::start(&["--parallel", "8", "--queue-size", "64", "--ctx-size", "512"]);
    // Warm up every slot once, then measure.
    soak_round(&s, 16, 8, 1);
    let before = rss(s.child.id());
    let ok = soak_round(&s, 200, 32, 1000);
    assert!(ok.len() >= 140, "{} well-formed requests completed", ok.len());
    // Cancelled sequences are gone and the server answers.
    let t0 = Instant::now();
    while !s.get("/metrics").contains("hearth_active_sequences 0") {
        assert!(t0.elapsed() < Duration::from_secs(60), "sequences still active after the soak");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(st, 200);
    let after = rss(s.child.id());
    eprintln!("RSS before {:.1} MiB, after {:.1} MiB", before as f64 / 1048576.0, after as f64 / 1048576.0);
    assert!(after < before + (32 << 20), "RSS grew from {before} to {after} bytes over the soak");
}

#[test]
fn worker_groups_route_requests_and_agree_with_one_engine() {
    let prompts = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"];
    let one = Server::start(&["--parallel", "4"]);
    let alone: Vec<_> = prompts.iter().map(|p| greedy(&one, p)).collect();
    drop(one);
    let s = Server::start(&["--groups", "2", "--parallel", "2"]);
    let health: Value = serde_json::from_str(&s.request("GET", "/health", None, "").1).unwrap();
    assert_eq!((health["engines"].as_u64(), health["slots"].as_u64()), (Some(2), Some(4)), "{health}");
    let together: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(|| greedy(&s, p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together, "two engines must give one engine's greedy tokens");
}

/// `/health` as JSON.
fn health(s: &Server) -> Value {
    serde_json::from_str(&s.request("GET", "/health", None, "").1).unwrap()
}

/// The server across devices (two loopback workers: tensor parallel with the exact gather
/// schedule, and a pipelined ring) and under a memory budget below the file's size gives
/// single-node greedy completions, token for token and log-probability for
/// log-probability. Workers take the server's f32 attention threshold: without it their
/// heads take the f16 path and the logits differ (`tensor_split.rs` checks the split alone).
#[test]
fn serve_across_devices_and_under_a_budget_matches_one_machine() {
    let prompts = ["The capital of France is", "def add(a, b):", "Water boils at"];
    let one = Server::start(&["-c", "256"]);
    let alone: Vec<_> = prompts.iter().map(|p| greedy(&one, p)).collect();
    assert!(health(&one).get("cluster").is_none());
    drop(one);
    let model = common::model();
    let (w1, w2) = (common::Worker::start(&model, &[]), common::Worker::start(&model, &[]));
    let workers = common::addrs(&[&w1, &w2]);
    let runs: [(&str, Vec<&str>); 3] = [
        ("tensor parallel (gather)", vec!["-c", "256", "--workers", &workers, "--tp-schedule", "gather"]),
        ("pipelined ring", vec!["-c", "256", "--workers", &workers, "--parallel", "ring", "--layer-window", "10,10,10"]),
        // SmolLM2's file is 98 MB: the window streams its layers.
        ("--mem-budget 80MiB", vec!["-c", "256", "--parallel", "2", "--mem-budget", "80MiB"]),
    ];
    for (what, args) in runs {
        let s = Server::start(&args);
        let got: Vec<_> = prompts.iter().map(|p| greedy(&s, p)).collect();
        assert_eq!(got, alone, "{what}: completions differ from one machine's");
        let h = health(&s);
        if args.contains(&"--workers") {
            assert_eq!(h["cluster"]["nodes_up"], 3, "{what}: {h}");
            assert_eq!(h["slots"], 1, "{what}: a context across devices holds one sequence: {h}");
        }
    }
}

/// A worker killed while a request is generating: that request gets a 503 naming the
/// worker within 5 s, the server re-plans over the devices left, and the next request
/// gets the same greedy tokens as before (the gather schedule is exact on any split);
/// `/health` and `/metrics` show the node down.
#[test]
fn a_worker_dying_mid_request_is_a_503_naming_it_and_serving_goes_on() {
    let model = common::model();
    let (w1, mut w2) = (common::Worker::start(&model, &[]), common::Worker::start(&model, &[]));
    // (--rejoin 0: the dead stay out, as the counts below expect.)
    let s = Server::start(&["-c", "1024", "--workers", &common::addrs(&[&w1, &w2]), "--tp-schedule", "gather", "--rejoin", "0"]);
    let before = greedy(&s, "The capital of France is");
    let victim = w2.addr.clone();
    let (status, body, after_kill) = std::thread::scope(|sc| {
        let long = sc.spawn(|| {
            let r = s.post("/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": true}));
            (r, Instant::now())
        });
        // Kill once it has generated tokens (a request that has sent nothing would start
        // over instead of failing).
        let t0 = Instant::now();
        let generated = || -> u64 {
            s.get("/metrics").lines().find_map(|l| l.strip_prefix("hearth_completion_tokens_total ")).unwrap().trim().parse().unwrap()
        };
        let base = generated();
        while generated() < base + 5 {
            assert!(t0.elapsed() < Duration::from_secs(60), "the request never generated");
            std::thread::sleep(Duration::from_millis(20));
        }
        w2.child.kill().unwrap();
        let killed = Instant::now();
        let ((status, body), answered) = long.join().unwrap();
        (status, body, answered.saturating_duration_since(killed))
    });
    assert_error((status, body.clone()), 503, "server_error", None);
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&victim), "the 503 does not name {victim}: {msg}");
    assert_eq!(body["error"]["code"], "worker_failed");
    assert!(after_kill < Duration::from_secs(5), "the 503 came {after_kill:?} after the kill");
    assert_eq!(greedy(&s, "The capital of France is"), before, "after re-planning, the completion changed");
    let h = health(&s);
    assert_eq!(h["cluster"]["nodes_up"], 2, "{h}");
    assert_eq!(h["cluster"]["replans"], 1, "{h}");
    let down = h["cluster"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == victim.as_str()).cloned();
    assert_eq!(down.as_ref().map(|n| n["up"].clone()), Some(json!(false)), "{h}");
    assert_eq!(down.map(|n| n["state"].clone()), Some(json!("down")), "{h}");
    let m = s.get("/metrics");
    assert!(m.contains("hearth_cluster_nodes{state=\"down\"} 1") && m.contains("hearth_cluster_replans_total 1"), "{m}");
    // The last worker dies while the server is idle: the next request, which had sent
    // nothing when the pass failed, starts over on this machine alone and succeeds.
    let mut w1 = w1;
    w1.child.kill().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(greedy(&s, "The capital of France is"), before, "after the idle worker's death");
    let h = health(&s);
    assert_eq!((h["cluster"]["layout"].as_str(), h["cluster"]["nodes_up"].as_u64()), (Some("single"), Some(1)), "{h}");
}

/// `--rejoin`: a worker that failed and answers again (restarted at its address) is
/// taken back into the group while the server is idle: `/health` shows it up, the
/// rejoin counted, and the completions are the same tokens as before it failed. Control
/// (checked by hand): with `--rejoin 0` it stays down and the wait for it runs out.
#[test]
fn a_failed_worker_that_answers_again_rejoins_the_group() {
    let model = common::model();
    let (w1, mut w2) = (common::Worker::start(&model, &[]), common::Worker::start(&model, &[]));
    let s = Server::start(&["-c", "1024", "--workers", &common::addrs(&[&w1, &w2]), "--tp-schedule", "gather", "--rejoin", "1"]);
    let before = greedy(&s, "The capital of France is");
    let victim = w2.addr.clone();
    // Dies while the server is idle: the next request starts over without it.
    w2.child.kill().unwrap();
    let _ = w2.child.wait();
    assert_eq!(greedy(&s, "The capital of France is"), before, "without the dead worker");
    let state = |h: &Value| h["cluster"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == victim.as_str()).map(|n| n["state"].clone());
    let h = health(&s);
    assert_eq!((h["cluster"]["nodes_up"].as_u64(), state(&h)), (Some(2), Some(json!("down"))), "{h}");
    // Back at the same address: within a few looks (1 s apart) it is in the group again.
    let back = common::Worker::spawn(&["--listen", &victim, "-m", model.to_str().unwrap()], std::process::Stdio::null());
    let t0 = Instant::now();
    let h = loop {
        let h = health(&s);
        if h["cluster"]["rejoins"] == 1 {
            break h;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the worker was not taken in again: {h}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((h["cluster"]["nodes_up"].as_u64(), state(&h), h["cluster"]["replans"].as_u64()), (Some(3), Some(json!("up")), Some(2)), "{h}");
    assert!(s.get("/metrics").contains("hearth_cluster_rejoins_total 1"));
    assert_eq!(greedy(&s, "The capital of France is"), before, "after the rejoin");
    drop(back);
    // Without workers, --rejoin is refused as the other cluster flags are.
    let o = common::hearth(&["serve", "--rejoin", "5", "--port", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--rejoin only applies to a run across devices"), "{err}");
}

/// A ring device another coordinator takes over while the server is idle: the next request
/// starts over on the devices left and gets the ring's greedy tokens (the server answered it
/// 500, "node 1 lost the coordinator", relayed by node 2 and blaming the server itself), and
/// the device is down for good (taking it back would take it from the other coordinator).
#[test]
fn a_ring_device_taken_over_by_another_coordinator_is_left_out_and_the_next_request_runs() {
    let model = common::model();
    let (w1, w2) = (common::Worker::start(&model, &[]), common::Worker::start(&model, &[]));
    let s = Server::start(&["-c", "1024", "--workers", &common::addrs(&[&w1, &w2]), "--parallel", "ring", "--layer-window", "10,10,10"]);
    let before = greedy(&s, "The capital of France is");
    common::ok(common::generate_json("Hi", &["--workers", &w1.addr, "--parallel", "ring", "--layer-window", "15,15"]));
    assert_eq!(greedy(&s, "The capital of France is"), before, "after the takeover");
    let h = health(&s);
    let state = h["cluster"]["nodes"].as_array().unwrap().iter().find(|n| n["addr"] == w1.addr.as_str()).map(|n| n["state"].clone());
    assert_eq!(state, Some(json!("down")), "{h}");
}

/// `/v1/embeddings`: each input's vector is the model's final normed hidden states
/// (`Context::eval_hidden`, checked against llama.cpp's `result_norm` in the model crate)
/// pooled and scaled to unit length, bit for bit as computed in process; base64 carries
/// the same floats; `--pooling last` gives the last token's (control: not the mean);
/// a generation running beside it changes nothing; bad inputs are 400s naming the field.
#[test]
fn embeddings_are_pooled_normed_hidden_states() {
    use hearth_model::embed::{normalize, Pooling};
    let texts = ["The capital of France is", "hello world", "def add(a, b): return a + b"];
    let model = std::sync::Arc::new(hearth_model::Model::load(common::model()).unwrap());
    let expect = |text: &str, pooling: Pooling| {
        let mut ctx = hearth_model::Context::new(model.clone(), 256, 256, 2).unwrap();
        ctx.set_f32_attention_from(1); // as the server runs
        let ids = model.tokenizer.encode(text, true, false);
        let mut v = pooling.pool(&ctx.eval_hidden(0, &ids).unwrap(), model.config.n_embd);
        normalize(&mut v);
        (v, ids.len())
    };
    let floats = |v: &Value| -> Vec<f32> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect() };
    let s = Server::start(&["-c", "256"]);
    let (st, r) = s.post("/v1/embeddings", &json!({"input": texts, "model": "text-embedding-3-small"}));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "list");
    let mut tokens = 0;
    for (i, t) in texts.iter().enumerate() {
        let d = &r["data"][i];
        assert_eq!((d["object"].as_str(), d["index"].as_u64()), (Some("embedding"), Some(i as u64)));
        let (want, n) = expect(t, Pooling::Mean);
        assert_eq!(floats(&d["embedding"]), want, "input {i}");
        tokens += n;
    }
    assert_eq!(r["usage"]["prompt_tokens"], tokens);
    // base64: little-endian f32 bytes.
    let (_, b) = s.post("/v1/embeddings", &json!({"input": texts[0], "encoding_format": "base64"}));
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let decoded: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(decoded, expect(texts[0], Pooling::Mean).0);
    // Beside a running generation: the same vector.
    std::thread::scope(|sc| {
        let gen = sc.spawn(|| s.post("/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 64, "ignore_eos": true})));
        std::thread::sleep(Duration::from_millis(100));
        let (_, again) = s.post("/v1/embeddings", &json!({"input": texts[1]}));
        assert_eq!(floats(&again["data"][0]["embedding"]), expect(texts[1], Pooling::Mean).0);
        assert_eq!(gen.join().unwrap().0, 200);
    });
    for (body, param) in [
        (json!({"input": ""}), "input"),
        (json!({"input": [99999999]}), "input"),
        (json!({"input": "x", "dimensions": 7}), "dimensions"),
        (json!({"input": "x", "encoding_format": "hex"}), "encoding_format"),
    ] {
        assert_error(s.post("/v1/embeddings", &body), 400, "invalid_request_error", Some(param));
    }
    let long = "word ".repeat(400);
    assert_error(s.post("/v1/embeddings", &json!({"input": long})), 400, "invalid_request_error", Some("input"));
    drop(s);
    let last = Server::start(&["-c", "256", "--pooling", "last"]);
    let (_, r) = last.post("/v1/embeddings", &json!({"input": texts[0]}));
    let got = floats(&r["data"][0]["embedding"]);
    assert_eq!(got, expect(texts[0], Pooling::Last).0);
    assert_ne!(got, expect(texts[0], Pooling::Mean).0, "control: last and mean pooling differ");
}

/// `n` choices evaluate their shared prompt once: the later choices wait for the first's
/// prompt and copy its K/V (`Context::copy_slot`), so the server's cached-token counter
/// grows by (n − 1) × (prompt − 1); the choices are the same as on a server that
/// evaluates the prompt for each (`--no-prompt-cache`, the control: nothing cached).
#[test]
fn n_choices_share_one_prompt_evaluation() {
    let prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle. ".repeat(4);
    let body = json!({"prompt": prompt, "n": 4, "max_tokens": 12, "temperature": 0.9, "seed": 7});
    let cached_total = |s: &Server| -> u64 {
        s.get("/metrics").lines().find_map(|l| l.strip_prefix("hearth_prompt_cached_tokens_total ")).unwrap().trim().parse().unwrap()
    };
    let run = |args: &[&str]| {
        let s = Server::start(args);
        let (st, r) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{r}");
        let texts: Vec<String> = (0..4).map(|i| r["choices"][i]["text"].as_str().unwrap().to_string()).collect();
        (texts, r["usage"]["prompt_tokens"].as_u64().unwrap(), cached_total(&s))
    };
    let (shared, n_prompt, cached) = run(&["--parallel", "4"]);
    let (alone, _, none) = run(&["--parallel", "4", "--no-prompt-cache"]);
    assert_eq!(shared, alone, "copying the prompt's K/V changed the choices");
    assert_eq!(cached, 3 * (n_prompt - 1), "the later choices did not copy the first one's prompt");
    assert_eq!(none, 0);
    assert!(shared.iter().any(|t| t != &shared[0]), "the choices should differ (seed + i): {shared:?}");
}
