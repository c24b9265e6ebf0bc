//! llama.cpp's tokenizer test suite (`models/ggml-vocab-*.gguf` + `.inp`/`.out`), tokenized
//! with add_special = false, parse_special = false: every string must give exactly the
//! reference ids.

mod common;

use hearth_tokenizer::{StreamDecoder, TokenizerKind};

#[test]
fn vocab_suite_matches_llama_cpp() {
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for name in common::VOCABS {
        let suite = common::load_suite(name);
        let mut ok = 0;
        for (text, want) in &suite.cases {
            let got = suite.tok.encode(text, false, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name}: {text:?}\n    want {want:?}\n    got  {got:?}"));
            }
        }
        summary.push(format!("{name}: {ok}/{} strings match", suite.cases.len()));
    }
    eprintln!("{}", summary.join("\n"));
    assert!(failures.is_empty(), "{} mismatches:\n{}\n{}", failures.len(), failures.join("\n"), summary.join("\n"));
}

/// Byte-level BPE loses nothing: decoding the reference ids gives the input back, and a
/// stream decoder fed one token at a time produces the same text.
#[test]
fn bpe_round_trip_and_streaming() {
    let mut failures = Vec::new();
    for name in common::VOCABS {
        let suite = common::load_suite(name);
        for (text, want) in &suite.cases {
            let ids = suite.tok.encode(text, false, false);
            let decoded = suite.tok.decode(&ids);
            if suite.tok.kind() == TokenizerKind::Bpe && &decoded != text {
                failures.push(format!("{name}: decode(encode({text:?})) = {decoded:?}"));
            }
            let mut stream = StreamDecoder::new(&suite.tok);
            let mut streamed = String::new();
            for &id in want {
                let part = stream.push(id);
                streamed.push_str(&part);
            }
            if stream.finish() != 0 {
                failures.push(format!("{name}: {text:?} ends inside a character"));
            }
            let whole = suite.tok.decode(want);
            if streamed != whole {
                failures.push(format!("{name}: streamed {streamed:?} != decoded {whole:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An emoji that SentencePiece spells as four byte tokens is held back until complete.
#[test]
fn stream_never_splits_a_character() {
    for name in ["llama-spm", "gpt-2"] {
        let suite = common::load_suite(name);
        let tok = &suite.tok;
        let text = "a🦙b";
        let ids = tok.encode(text, false, false);
        assert!(ids.len() >= 4, "{name}: {ids:?}");
        let mut stream = StreamDecoder::new(tok);
        let mut parts = Vec::new();
        for &id in &ids {
            parts.push(stream.push(id));
        }
        assert_eq!(stream.finish(), 0, "{name}");
        for p in &parts {
            // Every emitted part is whole characters (it is a `String`), and the emoji
            // arrives in one piece.
            assert!(!p.contains('\u{FFFD}'), "{name}: {parts:?}");
        }
        assert!(parts.iter().any(|p| p.contains('🦙')), "{name}: {parts:?}");
        let joined: String = parts.concat();
        assert_eq!(joined, tok.decode(&ids));
        assert!(joined.ends_with("a🦙b"), "{name}: {joined:?}");
    }
}

#[test]
fn spm_emoji_is_byte_tokens() {
    let suite = common::load_suite("llama-spm");
    let tok = &suite.tok;
    let ids = tok.encode("🦙", false, false);
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.decode_token(id).to_vec()).collect();
    assert_eq!(bytes, " 🦙".as_bytes());
    // The four byte tokens each hold one byte.
    assert!(ids.iter().filter(|&&id| tok.decode_token(id).len() == 1).count() >= 4, "{ids:?}");
    let mut stream = StreamDecoder::new(tok);
    let outs: Vec<String> = ids.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(outs.concat(), " 🦙");
    assert_eq!(outs.last().map(String::as_str), Some("🦙"));
}

/// Gemma 3's 262k-token SentencePiece vocabulary (from the real model file, fetched by
/// scripts/fetch-models.sh) on the llama-spm suite's strings: llama.cpp's ids recorded
/// in `tests/data/gemma3.out` by `bench/reference/gemma3_vocab.py`.
#[test]
fn gemma3_vocabulary_matches_llama_cpp() {
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    assert!(model.is_file(), "{} is missing: run scripts/fetch-models.sh", model.display());
    let f = hearth_gguf::GgufFile::open(&model).unwrap();
    let tok = hearth_tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let strings: Vec<String> = common::load_suite("llama-spm").cases.into_iter().map(|(s, _)| s).collect();
    let out = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma3.out")).unwrap();
    let want: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(strings.len(), want.len());
    let bad: Vec<String> = strings
        .iter()
        .zip(&want)
        .filter_map(|(s, w)| {
            let got = tok.encode(s, false, false);
            (&got != w).then(|| format!("{s:?}\n    want {w:?}\n    got  {got:?}"))
        })
        .collect();
    assert!(bad.is_empty(), "{} of {} strings differ:\n{}", bad.len(), strings.len(), bad.join("\n"));
}
