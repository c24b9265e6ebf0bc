//! Speculative decoding end to end (`generate --draft ngram | --draft-model`): the same
//! greedy tokens as without, on one machine, under `--mem-budget`, across tensor-parallel
//! workers and on the ring; acceptance statistics in `--json`; bad flags are clear errors.

mod common;

use common::{addrs, assert_clean_error, gemma3, model, ok, tokens, Worker};

/// A copy task: its continuation repeats the prompt, so n-gram drafts are often right.
const PROMPT: &str = "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape.\n\
                      Copy: apple, banana, cherry, date, elderberry, fig, grape.\nList: red, orange, yellow, green, \
                      blue, indigo, violet.\nCopy:";

fn generate(extra: &[&str]) -> std::process::Output {
    common::generate_json(PROMPT, &[&["-c", "256"], extra].concat())
}

/// The run's `speculative` object: (drafted, accepted).
fn spec(v: &serde_json::Value) -> (u64, u64) {
    let s = &v["speculative"];
    (s["drafted"].as_u64().unwrap_or(0), s["accepted"].as_u64().unwrap_or(0))
}

#[test]
fn speculative_tokens_equal_plain_decoding_on_every_schedule() {
    let m = model();
    let plain = ok(generate(&[]));
    let want = tokens(&plain);
    assert_eq!(want.len(), 20);
    assert!(plain["speculative"].is_null());

    let v = ok(generate(&["--draft", "ngram"]));
    assert_eq!(tokens(&v), want, "n-gram");
    let (drafted, accepted) = spec(&v);
    assert!(accepted > 0 && accepted <= drafted, "{}", v["speculative"]);
    // The same file as draft model: every guess is right. The prompt's pass gives token 1,
    // then passes of 4 guesses give 5 tokens each and the last 3 guesses the last 4 tokens.
    let v = ok(generate(&["--draft-model", m.to_str().unwrap(), "--draft-max", "4"]));
    assert_eq!(tokens(&v), want, "draft model");
    let (drafted, accepted) = spec(&v);
    assert!(drafted == 15 && accepted == drafted, "{}", v["speculative"]);
    assert_eq!(v["speculative"]["passes"], 4, "{}", v["speculative"]);

    // Under a budget smaller than the weights: each streamed layer serves a whole pass.
    let budget = ["--mem-budget", "64MiB"];
    let streamed = ok(generate(&budget));
    assert_eq!(tokens(&streamed), want);
    let v = ok(generate(&[&budget[..], &["--draft", "ngram"]].concat()));
    assert_eq!(tokens(&v), want, "n-gram under --mem-budget");
    let read = |v: &serde_json::Value| v["window"]["decode_io"]["bytes_read"].as_u64().unwrap();
    assert!(read(&v) < read(&streamed), "fewer passes read fewer bytes: {} vs {}", read(&v), read(&streamed));

    // Tensor parallel (the exact gather schedule) and the ring: the workers forget the
    // refused guesses when the next pass starts at an earlier position.
    let w = Worker::start(&m, &[]);
    for layout in [
        &["--workers", &addrs(&[&w]), "--tp-schedule", "gather"][..],
        &["--workers", &addrs(&[&w]), "--parallel", "ring", "--layer-window", "15,15"],
    ] {
        let out = generate(&[layout, &["--draft", "ngram"]].concat());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let v = ok(out);
        assert_eq!(tokens(&v), want, "{layout:?}: {err}");
        assert!(spec(&v).1 > 0, "{layout:?}: {}", v["speculative"]);
    }
}

#[test]
fn bad_speculation_flags_are_clear_errors() {
    assert_clean_error(&generate(&["--draft-max", "4"]), "add --draft ngram or --draft-model");
    assert_clean_error(&generate(&["--draft", "ngram", "--draft-min", "8", "--draft-max", "4"]), "--draft-min 8 exceeds --draft-max 4");
    assert_clean_error(&generate(&["--draft-model", "/nonexistent.gguf"]), "draft model");
    // Gemma 3's vocabulary is not SmolLM2's.
    assert_clean_error(&generate(&["--draft-model", gemma3().to_str().unwrap()]), "must share the model's vocabulary");
}

/// A draft model trained on fewer positions than the context: a warning says its guesses
/// past them will rarely be accepted; the tokens are still the model's own.
#[test]
fn a_draft_model_with_a_shorter_trained_context_is_named() {
    let m = model();
    let draft = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("spec-draft-ctx128.gguf");
    let o = common::hearth(&["synth", "--arch", "llama", "--n-embd", "64", "--n-layer", "2", "--n-head", "2", "--n-head-kv", "1",
        "--n-ff", "128", "--type", "q8_0", "--context-length", "128", "--tokenizer-from", m.to_str().unwrap(), "--out",
        draft.to_str().unwrap(), "--seed", "3"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = tokens(&ok(generate(&[])));
    let out = generate(&["--draft-model", draft.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(tokens(&ok(out)), want);
    assert!(err.contains("trained on 128 positions, fewer than the context size 256"), "{err}");
    // Control: a context within its training, no warning.
    let out = common::generate_json(PROMPT, &["-c", "128", "--draft-model", draft.to_str().unwrap()]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("trained on"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `serve --draft ngram` and `--draft-model`: every request of a batch of 8 (greedy, seeded
/// sampling, streamed) gets the tokens it gets from a server without speculation, and
/// /metrics counts the guesses; across devices too.
#[test]
fn serve_with_drafts_answers_as_without_in_a_batch() {
    use common::server::Server;
    use serde_json::json;
    let bodies: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let (temperature, seed) = if i % 2 == 0 { (0.0, 0) } else { (0.9, i as u64) };
            json!({"prompt": PROMPT, "max_tokens": 24 + i, "temperature": temperature, "seed": seed, "logprobs": 1})
        })
        .collect();
    let answers = |s: &Server| {
        std::thread::scope(|sc| {
            let hs: Vec<_> = bodies.iter().map(|b| sc.spawn(move || s.post("/v1/completions", b))).collect();
            hs.into_iter()
                .map(|h| {
                    let (st, r) = h.join().unwrap();
                    assert_eq!(st, 200, "{r}");
                    let c = &r["choices"][0];
                    (c["text"].as_str().unwrap().to_string(), c["logprobs"]["token_logprobs"].clone())
                })
                .collect::<Vec<_>>()
        })
    };
    let plain = answers(&Server::start(&["--parallel", "4"]));
    let s = Server::start(&["--parallel", "4", "--draft", "ngram", "--draft-max", "8"]);
    let spec = answers(&s);
    for (i, (p, g)) in plain.iter().zip(&spec).enumerate() {
        assert_eq!(p, g, "request {i}: text or log-probabilities differ with speculation");
    }
    let metric = |name: &str| -> u64 {
        s.get("/metrics").lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().trim().parse().unwrap()
    };
    let (drafted, accepted) = (metric("hearth_speculative_drafted_tokens_total"), metric("hearth_speculative_accepted_tokens_total"));
    assert!(accepted > 0 && accepted <= drafted, "{accepted} of {drafted}");
    // Streamed: the same text as whole.
    let body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": true});
    let text: String =
        s.stream("/v1/completions", &body).iter().filter_map(|e| e["choices"][0]["text"].as_str().map(String::from)).collect();
    assert_eq!(text, plain[0].0);
    // A draft model (the same file: its greedy guesses are right whenever the request is
    // greedy), drafting for all slots in one batch: the same answers.
    let m = model();
    let d = Server::start(&["--parallel", "4", "--draft-model", m.to_str().unwrap(), "--draft-max", "4"]);
    for (i, (p, g)) in plain.iter().zip(&answers(&d)).enumerate() {
        assert_eq!(p, g, "request {i}: text or log-probabilities differ with a draft model");
    }
    let metric = |name: &str| -> u64 {
        d.get("/metrics").lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().trim().parse().unwrap()
    };
    let (drafted, accepted) = (metric("hearth_speculative_drafted_tokens_total"), metric("hearth_speculative_accepted_tokens_total"));
    assert!(accepted * 2 > drafted && accepted <= drafted, "{accepted} of {drafted}");
    let gemma = gemma3();
    assert_clean_error(
        &common::hearth(&["serve", "--port", "0", "-m", m.to_str().unwrap(), "--draft-model", gemma.to_str().unwrap()]),
        "must share the model's vocabulary",
    );
    // Across devices (the ring: one slot, its worker forgetting refused guesses): the same.
    let w = Worker::start(&model(), &[]);
    let ring = Server::start(&["--workers", &addrs(&[&w]), "--parallel", "ring", "--layer-window", "15,15", "--draft", "ngram"]);
    let (st, r) = ring.post("/v1/completions", &bodies[0]);
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    assert_eq!((c["text"].as_str().unwrap().to_string(), c["logprobs"]["token_logprobs"].clone()), plain[0]);
}

/// `bench --draft ngram --prompt-file F`: the decode test continues the file's text with
/// speculation and reports the guesses; without the file it is a clear error.
#[test]
fn bench_reports_speculation_on_a_prompt_file() {
    let m = model();
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("spec-bench-prompt.txt");
    std::fs::write(&file, PROMPT).unwrap();
    let base = ["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "16", "-r", "1", "-t", "1", "--membw-mib", "16", "--json"];
    let v = ok(common::hearth(&[&base[..], &["--draft", "ngram", "--prompt-file", file.to_str().unwrap()]].concat()));
    let s = &v[0]["speculative"];
    assert!(s["drafted"].as_u64().unwrap() > 0 && s["passes"].as_u64().unwrap() > 0, "{s}");
    assert!(v[0]["roofline_pct"].is_null(), "a speculative pass reads the weights once for several tokens");
    assert!(ok(common::hearth(&base))[0]["speculative"].is_null());
    assert_clean_error(&common::hearth(&[&base[..], &["--draft", "ngram"]].concat()), "give --prompt-file");
    assert_clean_error(&common::hearth(&[&base[..], &["--prompt-file", file.to_str().unwrap()]].concat()), "add --draft ngram");
}
