//! Shared helpers for the reference-data tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `HEARTH_REFERENCE_DIR`, or the shared reference checkout next to the workspace.
pub fn reference_dir() -> PathBuf {
    std::env::var_os("HEARTH_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference"))
}

/// The SmolLM2 model, if present.
pub fn smollm2_model() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

/// The vocab families of llama.cpp's tokenizer test suite.
pub const VOCABS: &[&str] = &["llama-spm", "phi-3", "llama-bpe", "gpt-2", "qwen2", "starcoder", "deepseek-coder"];

/// A vocab test case: the strings of `<name>.inp` and the ids of `<name>.out`.
pub struct Suite {
    pub tok: hearth_tokenizer::Tokenizer,
    pub cases: Vec<(String, Vec<u32>)>,
}

/// Load `ggml-vocab-<name>.gguf` with its `.inp`/`.out` (llama.cpp's test-tokenizer-0
/// format: strings separated by `\n__ggml_vocab_test__\n`, one line of ids per string).
pub fn load_suite(name: &str) -> Suite {
    let dir = reference_dir().join("vocab");
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    let f = hearth_gguf::GgufFile::open(&gguf).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let tok = hearth_tokenizer::Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut strings = Vec::new();
    let mut rest = inp.as_str();
    while let Some(p) = rest.find(sep) {
        strings.push(rest[..p].to_string());
        rest = &rest[p + sep.len()..];
    }
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(strings.len(), ids.len(), "{name}: .inp and .out disagree on the number of cases");
    Suite { tok, cases: strings.into_iter().zip(ids).collect() }
}
