//! `hearth quantize` end to end on SmolLM2-135M: Q4_1 → F16 → Q8_0 / Q4_K_M, each file
//! loaded, generated from and scored; metadata and tensor types checked; bad requests
//! refused with a one-line error and nothing left behind.

mod common;
use common::*;

use hearth_gguf::{GgufFile, Value};
use hearth_quant::GgmlType;
use std::path::{Path, PathBuf};
use std::process::Output;

fn reference_dir() -> PathBuf {
    std::env::var("HEARTH_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"))
        .join("smollm2")
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh, empty directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quantize").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn quantize(input: &Path, out: &Path, ty: &str, extra: &[&str]) -> String {
    let mut args = vec!["quantize", s(input), s(out), "--type", ty, "-t", "2"];
    args.extend_from_slice(extra);
    let o = hearth(&args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    err
}

/// Greedy completion token ids for the standard prompt.
fn greedy(m: &Path, n: usize) -> Vec<u64> {
    greedy_with(m, n, &[])
}

/// [`greedy`] with more `generate` arguments (e.g. `--workers`).
fn greedy_with(m: &Path, n: usize, extra: &[&str]) -> Vec<u64> {
    let n = n.to_string();
    let mut args = vec!["generate", "-m", s(m), "-p", "The capital of France is", "--temperature", "0", "-n", &n, "--json", "-t", "2"];
    args.extend_from_slice(extra);
    let out = ok(hearth(&args));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["completion_tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

fn perplexity(m: &Path, text: &Path) -> f64 {
    let out = ok(hearth(&["perplexity", "-m", s(m), "-f", s(text), "-c", "128", "--json", "-t", "2"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["ppl"].as_f64().unwrap()
}

/// The first ~4,000 characters of the llama.cpp perplexity text (7 chunks of 128 tokens).
fn excerpt(d: &Path) -> PathBuf {
    let text = std::fs::read_to_string(reference_dir().join("ppl_gpl3.txt")).unwrap();
    let cut = text[..4000].rfind(char::is_whitespace).unwrap();
    let p = d.join("ppl_excerpt.txt");
    std::fs::write(&p, &text[..cut]).unwrap();
    p
}

fn types(f: &GgufFile) -> std::collections::HashMap<String, GgmlType> {
    f.tensors().iter().map(|t| (t.name.clone(), t.ty)).collect()
}

#[test]
fn f16_then_q8_0_and_q4_k_load_generate_and_score() {
    let d = dir("chain");
    let (f16, q8, q4k) = (d.join("f16.gguf"), d.join("q8_0.gguf"), d.join("q4_k.gguf"));
    let summary = quantize(&model(), &f16, "f16", &["--allow-requantize"]);
    assert!(summary.contains("MiB") && summary.contains("f16") && summary.contains(" s"), "{summary}");
    quantize(&f16, &q8, "q8_0", &[]);
    quantize(&f16, &q4k, "q4_k", &[]);
    // Nothing but the three outputs: no temporary files left.
    let mut names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["f16.gguf", "q4_k.gguf", "q8_0.gguf"]);

    // Metadata copied, file type updated, norms F32, matrices as the recipe says.
    let src = GgufFile::open(model()).unwrap();
    for (path, ftype) in [(&f16, 1u32), (&q8, 7), (&q4k, 15)] {
        let f = GgufFile::open(path).unwrap();
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get("general.file_type"), Some(&Value::U32(ftype)), "{}", path.display());
        assert_eq!(f.alignment(), src.alignment());
        for key in ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.rope.freq_base"] {
            assert_eq!(f.get(key), src.get(key), "{key} in {}", path.display());
        }
        assert_eq!(f.tensors().len(), src.tensors().len());
        for t in f.tensors().iter().filter(|t| t.dims.len() == 1) {
            assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
        }
    }
    let ty16 = types(&GgufFile::open(&f16).unwrap());
    assert!(ty16.iter().all(|(n, t)| *t == if n.contains("norm") { GgmlType::F32 } else { GgmlType::F16 }));
    let ty8 = types(&GgufFile::open(&q8).unwrap());
    assert!(ty8.iter().all(|(n, t)| *t == if n.contains("norm") { GgmlType::F32 } else { GgmlType::Q8_0 }));
    // Q4_K_M on 576-wide rows: llama.cpp's fallbacks (Q4_K → Q5_0, Q6_K → Q8_0); ffn_down
    // (1536 wide) keeps K-quants; the tied embedding is the output head (Q8_0 on 576).
    let ty4 = types(&GgufFile::open(&q4k).unwrap());
    assert_eq!(ty4["token_embd.weight"], GgmlType::Q8_0);
    assert_eq!(ty4["blk.0.attn_q.weight"], GgmlType::Q5_0);
    assert_eq!(ty4["blk.0.ffn_down.weight"], GgmlType::Q6_K); // use_more_bits(0, 30)
    assert_eq!(ty4["blk.4.ffn_down.weight"], GgmlType::Q4_K);
    assert_eq!(ty4["blk.0.attn_v.weight"], GgmlType::Q8_0);

    // F16 of the Q4_1 model generates what the Q4_1 model does; the others generate.
    let want = greedy(&model(), 8);
    assert_eq!(want[0], 7042); // " Paris"
    assert_eq!(greedy(&f16, 8)[..4], want[..4]);
    assert_eq!(greedy(&q8, 4)[0], 7042);
    assert_eq!(greedy(&q4k, 4).len(), 4);

    // Perplexity on a 6-chunk excerpt. The issue's criteria (Q8_0 within 1% of F16,
    // Q4_K_M within 10%) hold on the whole text (the ignored test below); on 6 chunks
    // even llama.cpp's own Q8_0 and F16 files differ by 3.3% (21.7157 vs 22.4659 in
    // smollm2_reference.json), so Q8_0 gets 4% here.
    let text = excerpt(&d);
    let (p16, p8, p4) = (perplexity(&f16, &text), perplexity(&q8, &text), perplexity(&q4k, &text));
    eprintln!("perplexity on the excerpt: f16 {p16:.4}, q8_0 {p8:.4}, q4_k {p4:.4}");
    assert!(p16 > 5.0 && p16 < 60.0, "{p16}");
    assert!((p8 / p16 - 1.0).abs() < 0.04, "q8_0 {p8} vs f16 {p16}");
    assert!((p4 / p16 - 1.0).abs() < 0.10, "q4_k {p4} vs f16 {p16}");
}

/// The issue's acceptance criteria on the whole llama.cpp perplexity text (59 chunks of
/// 128; about a minute per model at opt-level 2 on two cores, hence ignored by default).
#[test]
#[ignore]
fn full_text_perplexity_meets_the_issue_criteria() {
    let d = dir("full");
    let (f16, q8, q4k) = (d.join("f16.gguf"), d.join("q8_0.gguf"), d.join("q4_k.gguf"));
    quantize(&model(), &f16, "f16", &["--allow-requantize"]);
    quantize(&f16, &q8, "q8_0", &[]);
    quantize(&f16, &q4k, "q4_k", &[]);
    let text = reference_dir().join("ppl_gpl3.txt");
    let (p16, p8, p4) = (perplexity(&f16, &text), perplexity(&q8, &text), perplexity(&q4k, &text));
    eprintln!("perplexity on ppl_gpl3.txt: f16 {p16:.4}, q8_0 {p8:.4}, q4_k {p4:.4}");
    assert!((p8 / p16 - 1.0).abs() < 0.01, "q8_0 {p8} vs f16 {p16}");
    assert!((p4 / p16 - 1.0).abs() < 0.10, "q4_k {p4} vs f16 {p16}");
}

#[test]
fn bad_requests_fail_cleanly_and_leave_nothing() {
    let d = dir("errors");
    let m = model();
    let out = d.join("out.gguf");
    let o = hearth(&["quantize", s(&m), s(&out), "--type", "iq4_xs", "--allow-requantize"]);
    assert_clean_error(&o, "supported: f32, f16, bf16, q4_0");
    let o = hearth(&["quantize", s(&m), s(&out), "--type", "q9_9"]);
    assert_clean_error(&o, "unknown type");
    let o = hearth(&["quantize", s(&m), s(&out), "--type", "q8_0", "--output-type", "iq2_xxs", "--allow-requantize"]);
    assert_clean_error(&o, "--output-type iq2_xxs");
    // Requantizing needs --allow-requantize.
    let o = hearth(&["quantize", s(&m), s(&out), "--type", "q8_0"]);
    assert_clean_error(&o, "--allow-requantize");
    // Unwritable paths: a missing directory, a directory, the input itself.
    let missing = d.join("no/such/dir/out.gguf");
    let o = hearth(&["quantize", s(&m), s(&missing), "--type", "q8_0", "--allow-requantize"]);
    assert_clean_error(&o, "cannot write");
    let o = hearth(&["quantize", s(&m), s(&d), "--type", "q8_0", "--allow-requantize"]);
    assert_clean_error(&o, "is a directory");
    let o = hearth(&["quantize", s(&m), s(&m), "--type", "q8_0", "--allow-requantize"]);
    assert_clean_error(&o, "is the input file");
    // An existing non-file (here a FIFO; /dev/null in real life) is never renamed over.
    let fifo = d.join("fifo");
    if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|st| st.success()) {
        let o = hearth(&["quantize", s(&m), s(&fifo), "--type", "q8_0", "--allow-requantize"]);
        assert_clean_error(&o, "not a regular file");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        std::fs::remove_file(&fifo).unwrap();
    }
    // A missing input.
    let o = hearth(&["quantize", s(&d.join("nope.gguf")), s(&out), "--type", "q8_0"]);
    assert_clean_error(&o, "nope.gguf");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "files left behind in {}", d.display());
}

/// Q4_0 → Q4_0X8 (hearth's 8-row interleaved layout) and back: the bytes only move (the
/// way back is byte-identical to the start, no --allow-requantize), every matrix but the
/// tied embedding is grouped, and the model computes the same numbers from either file
/// (greedy tokens, and perplexity to the bit). Control: the grouped file's bytes differ.
/// Tensor parallelism cuts the grouped matrices in whole groups: the gather schedule gives
/// one machine's tokens, with a worker that has the file and with one that gets its shard
/// file (it was refused), and the sum schedule the Q4_0 file's; an embedding table is
/// never grouped.
#[test]
fn q4_0x8_moves_bytes_only_and_computes_the_same() {
    let d = dir("q4_0x8");
    let q4 = d.join("q4_0.gguf");
    quantize(&model(), &q4, "q4_0", &["--allow-requantize", "--pure"]);
    let x8 = d.join("x8.gguf");
    let err = quantize(&q4, &x8, "q4_0x8", &["--pure"]);
    assert!(err.contains("210 q4_0x8") && err.contains("1 kept in their row type: an embedding table"), "{err}");
    let f = GgufFile::open(&x8).unwrap();
    let ty = types(&f);
    assert_eq!(ty["token_embd.weight"], GgmlType::Q4_0);
    assert_eq!(ty["blk.0.attn_q.weight"], GgmlType::Q4_0X8);
    assert_eq!(ty["blk.29.ffn_down.weight"], GgmlType::Q4_0X8);
    let back = d.join("back.gguf");
    quantize(&x8, &back, "q4_0", &["--pure"]);
    let (a, b, c) = (std::fs::read(&q4).unwrap(), std::fs::read(&x8).unwrap(), std::fs::read(&back).unwrap());
    assert!(a == c, "Q4_0 -> Q4_0X8 -> Q4_0 changed bytes");
    assert!(a.len() == b.len() && a != b, "the grouped file should hold the same bytes, moved");
    assert_eq!(greedy(&x8, 16), greedy(&q4, 16));
    let text = excerpt(&d);
    assert_eq!(perplexity(&x8, &text).to_bits(), perplexity(&q4, &text).to_bits());
    let v = ok(hearth(&["bench", "-m", s(&x8), "-p", "0", "-n", "2", "-r", "1", "--json"]));
    assert!(v.contains("Q4_0X8"), "{v}");

    let o = hearth(&["quantize", s(&q4), s(&d.join("e.gguf")), "--type", "q4_0", "--token-embedding-type", "q4_0x8"]);
    assert_clean_error(&o, "--token-embedding-type q4_0x8: the embedding table's rows are looked up one by one");
    // A file whose embedding table is grouped (no hearth command writes one) is refused
    // at load, naming it.
    let specs: Vec<hearth_gguf::TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| {
            let ty = if t.name == "token_embd.weight" { GgmlType::Q4_0X8 } else { t.ty };
            hearth_gguf::TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ty }
        })
        .collect();
    let bytes = hearth_gguf::write_gguf(Vec::new(), f.metadata(), &specs, |i, w| w.write_all(f.tensor_data(&f.tensors()[i]))).unwrap();
    let hostile = d.join("grouped-embedding.gguf");
    std::fs::write(&hostile, bytes).unwrap();
    let o = hearth(&["generate", "-m", s(&hostile), "-p", "Hi", "-n", "2"]);
    assert_clean_error(&o, "token_embd.weight has type q4_0x8, which stores rows in groups of 8: the embedding table");
    // quantize refuses it as input before writing anything, naming the tensor.
    let o = hearth(&["quantize", s(&hostile), s(&d.join("h.gguf")), "--type", "q4_0"]);
    assert_clean_error(&o, "input: tensor token_embd.weight has type q4_0x8");
    let single = greedy(&x8, 16);
    let (w, cache) = (Worker::start(&x8, &[]), d.join("shards"));
    let no_file = Worker::spawn(&["--listen", "127.0.0.1:0", "--model-sha256", &model_sha(&x8), "--shard-cache", s(&cache)], std::process::Stdio::null());
    for workers in [w.addr.clone(), no_file.addr.clone(), addrs(&[&w, &no_file])] {
        assert_eq!(greedy_with(&x8, 16, &["--workers", &workers, "--tp-schedule", "gather"]), single, "{workers}");
    }
    // The shard file holds the worker's cut still grouped.
    let shard = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "gguf")).unwrap();
    assert_eq!(types(&GgufFile::open(&shard).unwrap())["blk.0.ffn_down.weight"], GgmlType::Q4_0X8);
    // The sum schedule cuts O and down by columns, inside each group's blocks: the tokens
    // of the same split of the Q4_0 file (the same bytes).
    let w4 = Worker::start(&q4, &[]);
    assert_eq!(greedy_with(&x8, 16, &["--workers", &w.addr, "--tp-schedule", "sum"]), greedy_with(&q4, 16, &["--workers", &w4.addr, "--tp-schedule", "sum"]));
}

/// Gemma 3's Q4_K_M file (llama.cpp's) → Q4_KX8 and back: Q4_K_M's recipe chooses the
/// file's own types, so its 27 Q4_K matrices are grouped by moving bytes and the rest kept;
/// the way back is the original file byte for byte, and the model computes the same
/// numbers from either (greedy tokens, and perplexity to the bit). Control: the grouped
/// file's bytes differ. Tensor parallelism cuts it in whole groups (gather schedule: one
/// machine's tokens), and `plan --workers` plans it.
#[test]
fn q4_kx8_on_gemma3_moves_bytes_only_and_computes_the_same() {
    let d = dir("q4_kx8");
    let x8 = d.join("x8.gguf");
    let err = quantize(&gemma3(), &x8, "q4_kx8", &[]);
    assert!(err.contains("27 q4_Kx8") && err.contains("9 q6_K"), "{err}");
    let ty = types(&GgufFile::open(&x8).unwrap());
    assert_eq!(ty["blk.0.attn_output.weight"], GgmlType::Q4_KX8);
    assert_eq!(ty["blk.0.ffn_down.weight"], GgmlType::Q6_K);
    assert_eq!(ty["blk.5.ffn_down.weight"], GgmlType::Q4_KX8);
    let back = d.join("back.gguf");
    quantize(&x8, &back, "q4_k", &[]);
    let (a, b, c) = (std::fs::read(gemma3()).unwrap(), std::fs::read(&x8).unwrap(), std::fs::read(&back).unwrap());
    assert!(a == c, "Q4_K_M -> Q4_KX8 -> Q4_K_M changed bytes");
    assert!(a.len() == b.len() && a != b, "the grouped file should hold the same bytes, moved");
    assert_eq!(greedy(&x8, 16), greedy(&gemma3(), 16));
    let text = excerpt(&d);
    assert_eq!(perplexity(&x8, &text).to_bits(), perplexity(&gemma3(), &text).to_bits());
    let v = ok(hearth(&["bench", "-m", s(&x8), "-p", "0", "-n", "2", "-r", "1", "--json"]));
    assert!(v.contains("Q4_KX8"), "{v}");
    let w = Worker::start(&x8, &[]);
    assert_eq!(greedy_with(&x8, 16, &["--workers", &w.addr, "--tp-schedule", "gather"]), greedy(&x8, 16));
    let plan = ok(hearth(&["plan", "-m", s(&x8), "--workers", &w.addr, "--json"]));
    assert!(plan.contains("\"parallel\":\"tensor\"") && plan.contains("\"nodes\""), "{plan}");
}

/// A fused tensor whose parts are not whole groups of 8 (phi3's gate+up halves of 260
/// rows, 520 in all) stays in its row type, so the file loads. Control: its total rows are
/// whole groups, which the rule before this test grouped (a file hearth then refused).
#[test]
fn grouped_types_keep_fused_parts_that_are_not_whole_groups() {
    let d = dir("grouped_fused");
    let (f16, x8) = (d.join("f16.gguf"), d.join("x8.gguf"));
    let o = hearth(&["synth", "--arch", "phi3", "--shape", "tiny", "--n-ff", "260", "--type", "f16", "--out", s(&f16)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    quantize(&f16, &x8, "q4_0x8", &[]);
    let ty = types(&GgufFile::open(&x8).unwrap());
    assert_eq!(ty["blk.0.ffn_up.weight"], GgmlType::Q4_0, "520 rows, two parts of 260");
    assert_eq!(ty["blk.0.attn_qkv.weight"], GgmlType::Q4_0X8);
    assert_eq!(greedy(&x8, 4).len(), 4);
}

/// A mixture of experts written as Q4_0X8 or Q4_KX8 (`synth`; routers and experts
/// grouped) comes back to its row type whole (routers too: bytes moved), with the same
/// greedy tokens.
#[test]
fn grouped_experts_and_routers_come_back_to_their_row_type() {
    for (grouped, row) in [(GgmlType::Q4_0X8, GgmlType::Q4_0), (GgmlType::Q4_KX8, GgmlType::Q4_K)] {
        let d = dir(&format!("{grouped}_moe"));
        let x8 = d.join("x8.gguf");
        let o = hearth(&["synth", "--arch", "qwen3moe", "--shape", "tiny", "--type", grouped.name(), "--out", s(&x8)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let f = GgufFile::open(&x8).unwrap();
        assert_eq!(types(&f)["blk.0.ffn_gate_exps.weight"], grouped);
        assert_eq!(types(&f)["blk.0.ffn_gate_inp.weight"], grouped);
        let back = d.join("back.gguf");
        quantize(&x8, &back, row.name(), &["--pure"]);
        let back_types = types(&GgufFile::open(&back).unwrap());
        assert!(back_types.values().all(|t| t.group_rows() == 1), "{back_types:?}");
        assert_eq!(back_types["blk.0.ffn_gate_exps.weight"], row);
        assert_eq!(greedy(&x8, 8), greedy(&back, 8));
    }
}

/// Tensor parallelism over a fused grouped tensor whose heads are not whole groups: phi3
/// with head_dim 36 and 16 heads over 2 KV heads has `attn_qkv` in Q4_0X8 (parts of 576,
/// 72 and 72 rows), and one KV head's 36 rows of K are not a group of 8 (its 288 columns
/// of `attn_output` are whole blocks). The planner gives KV heads in twos there, so the
/// gather schedule runs and gives one machine's tokens (equal weights were refused,
/// new-user pass, session 46: control); a split of one head is refused naming the part.
#[test]
fn tensor_parallelism_cuts_a_fused_grouped_tensor_on_whole_groups() {
    let d = dir("grouped_tp_fused");
    let (f16, x8) = (d.join("f16.gguf"), d.join("x8.gguf"));
    let o = hearth(&["synth", "--arch", "phi3", "--shape", "tiny", "--head-dim", "36", "--n-head", "16", "--n-head-kv", "2", "--type", "f16", "--out", s(&f16)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    quantize(&f16, &x8, "q4_0x8", &[]);
    assert_eq!(types(&GgufFile::open(&x8).unwrap())["blk.0.attn_qkv.weight"], GgmlType::Q4_0X8);
    let w = Worker::start(&x8, &[]);
    assert_eq!(greedy_with(&x8, 8, &["--workers", &w.addr, "--tp-schedule", "gather"]), greedy(&x8, 8));
    let m = hearth_model::Model::load(&x8).unwrap();
    let split = hearth_model::TensorSplit { kv_heads: 0..1, ..hearth_model::TensorSplit::whole(&m.config) };
    let e = split.validate(&m.config, &m.weights).unwrap_err().to_string();
    assert!(e.contains("cannot cut blk.0.attn_qkv.weight (type q4_0x8, rows stored in groups of 8) at rows 0..36 of its attn_k part"), "{e}");
}
