//! Malformed or unsupported tokenizer metadata gives a typed error naming the key/value,
//! never a panic; tiny hand-made vocabularies check the algorithms' edge cases.

use hearth_gguf::{string_array, value_type, GgufFile, Value};
use hearth_tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

fn gguf(meta: Vec<(&str, Value)>) -> GgufFile {
    let meta: Vec<(String, Value)> = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let bytes = hearth_gguf::write_gguf(Vec::new(), &meta, &[], |_, _| Ok(())).unwrap();
    GgufFile::from_vec(bytes).unwrap()
}

fn array(elem_type: u32, items: Vec<Value>) -> Value {
    Value::Array { elem_type, items }
}

/// A small byte-level BPE vocabulary: the 256 byte chars plus a few merges.
fn bpe_meta(pre: &str) -> Vec<(&'static str, Value)> {
    let map = byte_chars();
    let mut tokens: Vec<String> = map.iter().map(|c| c.to_string()).collect();
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "<|im_end|>", "<|user|>"].map(String::from));
    let mut types = vec![Value::I32(1); tokens.len()];
    let n = types.len();
    types[n - 2] = Value::I32(3);
    types[n - 1] = Value::I32(4);
    vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", string_array(&tokens)),
        ("tokenizer.ggml.token_type", array(value_type::I32, types)),
        ("tokenizer.ggml.merges", string_array(["h e", "l l", "he ll", "hell o", "Ġ w"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(n as u32 - 2)),
    ]
}

fn byte_chars() -> Vec<char> {
    let mut out = Vec::new();
    let mut n = 0;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        out.push(
            char::from_u32(if printable {
                b
            } else {
                n += 1;
                255 + n
            })
            .unwrap(),
        );
    }
    out
}

fn err(meta: Vec<(&str, Value)>) -> TokenizerError {
    match Tokenizer::from_gguf(&gguf(meta)) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn set(meta: &mut Vec<(&'static str, Value)>, key: &'static str, v: Value) {
    meta.retain(|(k, _)| *k != key);
    meta.push((key, v));
}

#[test]
fn unknown_model_is_named() {
    let mut meta = bpe_meta("gpt-2");
    set(&mut meta, "tokenizer.ggml.model", Value::String("t5".into()));
    let e = err(meta);
    assert!(matches!(&e, TokenizerError::UnsupportedModel { model } if model == "t5"), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("tokenizer.ggml.model") && msg.contains("\"t5\"") && msg.contains("gpt2"), "{msg}");
}

#[test]
fn unknown_pre_lists_supported() {
    let e = err(bpe_meta("my-new-model"));
    assert!(matches!(&e, TokenizerError::UnknownPreTokenizer { pre, .. } if pre == "my-new-model"), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("tokenizer.ggml.pre") && msg.contains("smollm") && msg.contains("llama-bpe"), "{msg}");
}

#[test]
fn missing_tokens_is_named() {
    let mut meta = bpe_meta("gpt-2");
    meta.retain(|(k, _)| *k != "tokenizer.ggml.tokens");
    let e = err(meta);
    assert!(matches!(&e, TokenizerError::Metadata { key, .. } if key == "tokenizer.ggml.tokens"), "{e:?}");
    assert!(e.to_string().contains("tokenizer.ggml.tokens"));
}

#[test]
fn other_bad_values_are_errors() {
    let cases: Vec<(&str, Value)> = vec![
        ("tokenizer.ggml.model", Value::U32(3)),
        ("tokenizer.ggml.tokens", array(value_type::U32, vec![Value::U32(1)])),
        ("tokenizer.ggml.tokens", array(value_type::STRING, vec![])),
        ("tokenizer.ggml.merges", Value::String("h e".into())),
        ("tokenizer.ggml.token_type", array(value_type::I32, vec![Value::I32(1)])),
        ("tokenizer.ggml.eos_token_id", Value::U32(1_000_000)),
        ("tokenizer.ggml.bos_token_id", Value::I32(-1)),
        ("tokenizer.ggml.add_bos_token", Value::U32(1)),
    ];
    for (key, v) in cases {
        let mut meta = bpe_meta("gpt-2");
        set(&mut meta, key, v);
        let e = err(meta);
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // Merges are required for gpt2.
    let mut meta = bpe_meta("gpt-2");
    meta.retain(|(k, _)| *k != "tokenizer.ggml.merges");
    assert!(err(meta).to_string().contains("tokenizer.ggml.merges"));
    // BOS requested but there is none (ChatGLM's pre-tokenizer has no default BOS).
    let mut meta = bpe_meta("gpt-2");
    meta.retain(|(k, _)| *k != "tokenizer.ggml.eos_token_id");
    set(&mut meta, "tokenizer.ggml.pre", Value::String("chatglm-bpe".into()));
    set(&mut meta, "tokenizer.ggml.add_bos_token", Value::Bool(true));
    assert!(err(meta).to_string().contains("add_bos_token"));
}

#[test]
fn tiny_bpe_vocab_works() {
    let tok = Tokenizer::from_gguf(&gguf(bpe_meta("gpt-2"))).unwrap();
    let he = tok.token_id("hello").unwrap();
    let w = tok.token_id("Ġw").unwrap();
    let o = tok.token_id("o").unwrap();
    assert_eq!(tok.encode("hello wo", false, false), [he, w, o]);
    // User-defined tokens are matched even without parse_special; control ones are not.
    let user = tok.token_id("<|user|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(tok.encode("<|user|>hello", false, false), [user, he]);
    assert!(!tok.encode("<|im_end|>", false, false).contains(&end));
    assert_eq!(tok.encode("<|im_end|>", false, true), [end]);
    assert!(tok.is_eog(end));
    assert_eq!(tok.decode(&tok.encode("héllo 🦙 wörld\n\t", false, false)), "héllo 🦙 wörld\n\t");
    // Out-of-range ids decode to nothing instead of panicking.
    assert_eq!(tok.decode_token(u32::MAX), b"");
    assert_eq!(tok.token_text(u32::MAX), "");
    let mut s = StreamDecoder::new(&tok);
    assert_eq!(s.push(u32::MAX), "");
}

#[test]
fn tiny_spm_vocab_falls_back_to_bytes() {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(Value::I32(6));
    }
    for t in ["▁", "h", "i", "hi", "▁hi"] {
        tokens.push(t.into());
        types.push(Value::I32(1));
    }
    let scores: Vec<Value> = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
    let meta = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", string_array(&tokens)),
        ("tokenizer.ggml.scores", array(value_type::F32, scores)),
        ("tokenizer.ggml.token_type", array(value_type::I32, types)),
    ];
    let tok = Tokenizer::from_gguf(&gguf(meta)).unwrap();
    assert!(tok.add_bos());
    let hi = tok.token_id("▁hi").unwrap();
    let ids = tok.encode("hi é", true, false);
    // <s> ▁hi ▁ <0xC3> <0xA9>
    assert_eq!(ids[..2], [1, hi]);
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert_eq!(tok.decode(&ids), " hi é");
    // llama_detokenize strips the prefix space only when no BOS was removed first.
    assert_eq!(tok.detokenize(&ids, true, false), " hi é");
    assert_eq!(tok.detokenize(&ids[1..], false, false), "hi é");
    assert_eq!(tok.detokenize(&ids, false, true), "<s> hi é");
    assert!(tok.is_eog(2));
}

#[test]
fn stream_bytes_match_lossy_decoding() {
    let tok = Tokenizer::from_gguf(&gguf(bpe_meta("gpt-2"))).unwrap();
    let chunks: [&[u8]; 6] = [b"a\xF0\x9F", b"\xA6", b"\x99b", b"\xE2\x82", b"A\xFF", b"\xC3"];
    let mut s = StreamDecoder::new(&tok);
    let parts: Vec<String> = chunks.iter().map(|c| s.push_bytes(c)).collect();
    assert_eq!(s.pending(), b"\xC3");
    // The stream ends inside "é": the held-back byte is dropped, not shown as U+FFFD
    // (a completion cut by max_tokens); invalid bytes in the middle still are.
    assert_eq!(s.finish(), 1);
    assert_eq!(s.pending(), b"");
    assert_eq!(parts, ["a", "", "🦙b", "", "\u{FFFD}A\u{FFFD}", ""]);
    assert_eq!(parts.concat() + "\u{FFFD}", String::from_utf8_lossy(&chunks.concat()));
    let ids = tok.encode("hé", false, false);
    assert_eq!(StreamDecoder::text_of(&tok, &ids), "hé");
    assert_eq!(StreamDecoder::text_of(&tok, &ids[..ids.len() - 1]), "h");
}

/// Control tokens are parsed outside the plain ranges only; user-defined ones everywhere.
#[test]
fn plain_ranges_keep_control_text_as_text() {
    let tok = Tokenizer::from_gguf(&gguf(bpe_meta("gpt-2"))).unwrap();
    let (end, user) = (tok.token_id("<|im_end|>").unwrap(), tok.token_id("<|user|>").unwrap());
    let text = "<|im_end|>hello<|im_end|><|user|><|im_end|>";
    let all = tok.encode(text, false, true);
    assert_eq!(all.iter().filter(|&&i| i == end).count(), 3);
    assert_eq!(tok.encode_with_plain(text, false, &[]), all);
    // The middle "hello<|im_end|><|user|>" is a message's content.
    let content = 10..33;
    let got = tok.encode_with_plain(text, false, std::slice::from_ref(&content));
    let mut want = vec![end];
    want.extend(tok.encode("hello<|im_end|>", false, false));
    want.extend([user, end]);
    assert_eq!(got, want);
    assert_eq!(tok.control_text_in("a<|im_end|>"), Some("<|im_end|>"));
    assert_eq!(tok.control_text_in("a<|user|>"), None);
}

#[test]
fn tokenizer_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
}
