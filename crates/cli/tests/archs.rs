//! Every mode for the other architectures, end to end through the `hearth` binary:
//! tensor parallelism (gather schedule, 2 and 3 loopback workers), the pipelined ring and
//! a `--mem-budget` window reproduce one machine's greedy tokens on Gemma 3 270M (real
//! weights: one KV head, so the second and third nodes compute FFN rows only) and on
//! synthetic qwen3, qwen2 and phi3 files (`hearth synth --arch`; no budget run: they are
//! smaller than the runtime).

mod common;

use common::{addrs, gemma3, hearth, model, ok, tokens, Worker};
use std::path::{Path, PathBuf};

const PROMPT: &str = "The three primary colors are red, blue and";

/// A synthetic file of `arch` (Q8_0, 4 layers, 4 heads / 2 KV heads, head_dim 32).
fn synth(arch: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("archs-{arch}.gguf"));
    let tok = if arch == "phi3" {
        std::env::var("HEARTH_REFERENCE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"))
            .join("vocab/ggml-vocab-phi-3.gguf")
    } else {
        model()
    };
    let o = hearth(&["synth", "--arch", arch, "--n-embd", "128", "--n-layer", "4", "--n-head", "4", "--n-head-kv", "2", "--head-dim", "32",
        "--n-ff", "256", "--type", "q8_0", "--tokenizer-from", tok.to_str().unwrap(), "--out", out.to_str().unwrap(), "--seed", "5", "-t", "2"]);
    assert!(o.status.success(), "{arch}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// `hearth generate --json` of 16 greedy tokens of `m` with `extra` flags.
fn generate(m: &Path, extra: &[&str]) -> serde_json::Value {
    let args = ["-m", m.to_str().unwrap(), "-p", PROMPT, "-n", "16", "--temperature", "0", "--ignore-eos", "-t", "1", "-c", "256", "--json"];
    ok(common::generate_cmd(&[&args[..], extra].concat()))
}

/// Tensor parallel (gather) with 2 and 3 nodes, the ring over 3 devices and a memory
/// budget below the file size: each gives one machine's tokens; the sum schedule over 3
/// nodes runs its two allreduces per block.
fn every_mode_matches(m: &Path, n_layer: usize, budget: Option<&str>) {
    let single = tokens(&generate(m, &[]));
    assert_eq!(single.len(), 16);
    // Speculative decoding (issue #22): n-gram guesses and the file as its own draft model,
    // the KV cache rolled back over refused guesses (Gemma 3: through its window rings).
    for spec in [&["--draft", "ngram"][..], &["--draft-model", m.to_str().unwrap(), "--draft-max", "3"]] {
        let v = generate(m, spec);
        assert_eq!(tokens(&v), single, "{}: {spec:?}", m.display());
        assert!(v["speculative"]["drafted"].as_u64().is_some(), "{}", v["speculative"]);
    }
    let ws: Vec<Worker> = (0..2).map(|_| Worker::start(m, &[])).collect();
    for workers in [addrs(&[&ws[0]]), addrs(&[&ws[0], &ws[1]])] {
        let v = generate(m, &["--workers", &workers, "--tp-schedule", "gather"]);
        assert_eq!(tokens(&v), single, "{}: tensor parallel over {workers}", m.display());
    }
    // The sum schedule: two allreduces per block, partial sums in another order than one
    // node's, so only the first token (a clear margin here) is held to equal.
    let v = generate(m, &["--workers", &addrs(&[&ws[0], &ws[1]]), "--tp-schedule", "sum"]);
    assert_eq!(tokens(&v).len(), 16);
    assert_eq!(tokens(&v)[0], single[0], "{}: sum schedule", m.display());
    assert_eq!(v["tensor_parallel"]["allreduces"], 2 * n_layer as u64 * v["tensor_parallel"]["passes"].as_u64().unwrap());
    let third = n_layer / 3;
    let windows = format!("{third},{third},{}", n_layer - 2 * third);
    let v = generate(m, &["--workers", &addrs(&[&ws[0], &ws[1]]), "--parallel", "ring", "--layer-window", &windows]);
    assert_eq!(tokens(&v), single, "{}: ring {windows}", m.display());
    if let Some(budget) = budget {
        let v = generate(m, &["--mem-budget", budget]);
        assert_eq!(tokens(&v), single, "{}: --mem-budget {budget}", m.display());
    }
}

#[test]
fn gemma3_runs_in_every_mode() {
    // 200 MiB: below the 241 MiB of weights, so layers and the tied head stream.
    every_mode_matches(&gemma3(), 18, Some("200MiB"));
    // A worker without the file receives its shard (Gemma 3's extra norms included).
    let m = gemma3();
    let sha = common::model_sha(&m);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("archs-shard-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let w = Worker::spawn(&["--listen", "127.0.0.1:0", "--model-sha256", &sha, "--shard-cache", cache.to_str().unwrap()], std::process::Stdio::null());
    let v = generate(&m, &["--workers", &w.addr, "--tp-schedule", "gather"]);
    assert_eq!(tokens(&v), tokens(&generate(&m, &[])), "a shard-file worker");
}

#[test]
fn synthetic_architectures_run_in_every_mode() {
    for arch in ["qwen3", "qwen2", "phi3"] {
        // (Too small for a budget below the file: the runtime alone is larger.)
        every_mode_matches(&synth(arch), 4, None);
    }
}

/// Gemma 3 270M has no chat template in its file: `--chat` renders Gemma's turn format
/// (the built-in default) to exactly the prompt llama.cpp's `gemma` template gives.
#[test]
fn gemma3_chat_uses_the_gemma_turn_format() {
    let m = gemma3();
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/data/gemma3-270m.json")).unwrap(),
    )
    .unwrap();
    let chat = d["prompts"].as_array().unwrap().iter().find(|p| p["name"] == "chat").unwrap();
    let v = ok(hearth(&["generate", "-m", m.to_str().unwrap(), "--chat", "-p", "What is 2+2?", "-n", "2", "--temperature", "0", "--json"]));
    assert_eq!(v["prompt_tokens"], chat["prompt_ids"]);
}

/// `quantize` and `inspect` on Gemma 3: the Q4_K_M file requantized to Q8_0 (every matrix
/// from its dequantized values) still runs and starts with the original's greedy tokens;
/// inspect names the architecture and the window.
#[test]
fn gemma3_quantizes_and_inspects() {
    let m = gemma3();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gemma3-q8_0.gguf");
    let q = hearth(&["quantize", "--allow-requantize", "--type", "q8_0", m.to_str().unwrap(), out.to_str().unwrap()]);
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let (a, b) = (tokens(&generate(&m, &[])), tokens(&generate(&out, &[])));
    assert_eq!(a[..4], b[..4], "Q4_K_M {a:?} vs its Q8_0 requantization {b:?}");
    let i = hearth(&["inspect", out.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&i.stdout);
    assert!(i.status.success() && text.contains("\"gemma3\"") && text.contains("gemma3.attention.sliding_window"), "{text}");
}
