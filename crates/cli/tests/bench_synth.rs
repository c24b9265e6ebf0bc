//! `hearth synth` and `hearth bench` end to end: synthetic files of every quantizable type
//! load and generate; bench and --membw print llama-bench's fields; synth refuses a file
//! that cannot fit on disk.

mod common;
use common::*;

use std::path::{Path, PathBuf};


fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench_synth");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn synth_every_type_loads_and_generates() {
    let m = model();
    for (ty, ftype) in [("f32", 0), ("f16", 1), ("bf16", 32), ("q4_0", 2), ("q4_1", 3), ("q8_0", 7)] {
        let out = tmp(&format!("tiny-{ty}.gguf"));
        let o = hearth(&["synth", "--n-embd", "64", "--n-ff", "128", "--type", ty, "--output-type", "q8_0",
            "--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap(), "--seed", "3", "-t", "2"]);
        assert!(o.status.success(), "{ty}: {}", String::from_utf8_lossy(&o.stderr));
        let info = ok(hearth(&["inspect", out.to_str().unwrap(), "--json"]));
        let md = &info["metadata"];
        assert_eq!(md["general.architecture"], "llama");
        assert_eq!(md["general.file_type"], ftype, "{ty}");
        assert_eq!(md["llama.embedding_length"], 64);
        assert_eq!(md["llama.block_count"], 2);
        assert_eq!(md["tokenizer.ggml.tokens"]["len"], 49152);
        let names: Vec<&str> = info["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names.len(), 2 + 2 * 9 + 1);
        assert_eq!(names[0], "token_embd.weight");
        assert_eq!(names[1..10], ["blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
            "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]);
        assert_eq!(names[names.len() - 2..], ["output_norm.weight", "output.weight"]);
        assert_eq!(std::fs::metadata(&out).unwrap().len(), ok(hearth(&["synth", "--n-embd", "64", "--n-ff", "128", "--type", ty,
            "--output-type", "q8_0", "--tokenizer-from", m.to_str().unwrap(), "--out", "unused", "--dry-run"]))["file_bytes"]);
        let g = ok(hearth(&["generate", "-m", out.to_str().unwrap(), "-p", "Hello", "-n", "4", "--ignore-eos",
            "--temperature", "0", "--json", "-t", "1"]));
        assert_eq!(g["completion_tokens"].as_array().unwrap().len(), 4, "{ty}");
    }
}

#[test]
fn synth_is_reproducible() {
    let m = model();
    let run = |name: &str, t: &str| {
        let out = tmp(name);
        let o = hearth(&["synth", "--n-embd", "64", "--n-ff", "128", "--n-layer", "1", "--tokenizer-from", m.to_str().unwrap(),
            "--out", out.to_str().unwrap(), "--seed", "9", "-t", t]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    assert!(run("rep-a.gguf", "1") == run("rep-b.gguf", "2"), "the file depends on the thread count");
}

#[test]
fn synth_refuses_what_does_not_fit_and_bad_types() {
    let m = model();
    let out = tmp("huge.gguf");
    let args = ["synth", "--shape", "70b", "--type", "f32", "--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let need = ok(hearth(&[&args[..], &["--dry-run"]].concat()))["file_bytes"].as_u64().unwrap();
    assert!(need > 270_000_000_000, "{need}");
    let dir = std::ffi::CString::new(out.parent().unwrap().to_str().unwrap()).unwrap();
    // SAFETY: valid C string, plain-data out parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(dir.as_ptr(), &mut st) }, 0);
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    if free > need {
        eprintln!("skipping: {free} bytes free is more than a 70B F32 file");
        return;
    }
    let o = hearth(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.starts_with("error: not enough disk space") && err.contains(&format!("{need} bytes")), "{err}");
    assert!(!out.exists());

    let o = hearth(&["synth", "--type", "i32", "--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot quantize"), "{err}");
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let m = model();
    let v = ok(hearth(&["bench", "-m", m.to_str().unwrap(), "-p", "16", "-n", "4", "-r", "2", "-t", "1", "--json", "--membw-mib", "64"]));
    let tests = v.as_array().unwrap();
    assert_eq!(tests.len(), 2);
    for (t, (p, n)) in tests.iter().zip([(16, 0), (0, 4)]) {
        assert_eq!(t["model_filename"], "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(t["model_type"], "llama 135M Q4_1");
        assert_eq!(t["model_n_params"], 134515008);
        assert!(t["model_size"].as_u64().unwrap() > 90 << 20);
        assert_eq!((t["n_prompt"].as_u64().unwrap(), t["n_gen"].as_u64().unwrap()), (p, n));
        assert_eq!(t["n_threads"], 1);
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0 && t["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(t["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(t["samples_ns"].as_array().unwrap().len(), 2);
        assert!(t["membw_gbps"].as_f64().unwrap() > 0.0);
    }
    assert!(tests[0]["gbps"].is_null());
    let gbps = tests[1]["gbps"].as_f64().unwrap();
    let pct = tests[1]["roofline_pct"].as_f64().unwrap();
    assert!(gbps > 0.0 && pct > 0.0, "{gbps} {pct}");
    // The mapped file's resident bytes and its share in 2 MiB pages (from /proc/self/smaps).
    if cfg!(target_os = "linux") {
        let w = &tests[1]["weight_pages"];
        let (rss, huge) = (w["resident_bytes"].as_u64().unwrap(), w["huge_page_bytes"].as_u64().unwrap());
        assert!(rss > 50 << 20 && huge <= rss, "{w}");
    }
}

/// The human report says how much of the weights were mapped in 2 MiB pages.
#[test]
fn bench_reports_the_weights_share_in_2mib_pages() {
    let m = model();
    let o = hearth(&["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "2", "-r", "1", "-t", "1", "--membw-mib", "64"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    if cfg!(target_os = "linux") {
        assert!(err.contains("weights in 2 MiB pages: ") && err.contains(" MiB of the file resident in this process"), "{err}");
    }
}

#[test]
fn membw_is_positive() {
    let v = ok(hearth(&["bench", "--membw", "-t", "1", "--membw-mib", "64", "--json"]));
    assert!(v[0]["membw_gbps"].as_f64().unwrap() > 0.1, "{v}");
    assert_eq!(v[0]["n_threads"], 1);
}
