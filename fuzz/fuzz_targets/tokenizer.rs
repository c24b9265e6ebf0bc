//! Encode/decode of arbitrary text with every vocabulary type: the real vocabularies of
//! llama.cpp's tokenizer suite (SentencePiece and byte-level BPE, from the reference
//! data), and a small byte-level BPE vocabulary under every pre-tokenizer hearth
//! supports. Run with `-timeout` so a super-linear input (a long run of one character
//! through a regex or the merge loop) is reported as a hang.
//!
//! Input: byte 0 picks the tokenizer, byte 1 the flags, the rest is the text (lossily
//! decoded from UTF-8, so invalid bytes reach the tokenizer as U+FFFD).
#![no_main]
use hearth_gguf::{string_array, value_type, write_gguf, GgufFile, Value};
use hearth_tokenizer::{StreamDecoder, Tokenizer, TokenizerKind, SUPPORTED_PRE};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Vocabularies of the reference tokenizer suite (those present are used).
const VOCABS: &[&str] = &["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-coder", "starcoder"];

/// GPT-2's byte-to-char map: the 256 single-byte tokens a byte-level vocabulary has.
fn byte_chars() -> Vec<String> {
    let mut n = 0;
    (0..256u32)
        .map(|b| {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

fn tiny_bpe(pre: &str) -> Tokenizer {
    let mut tokens = byte_chars();
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "ĠĠ", "ĠĠĠĠ", "<|im_end|>", "<|user|>"].map(String::from));
    let n = tokens.len();
    let mut types = vec![Value::I32(1); n];
    types[n - 2] = Value::I32(3);
    types[n - 1] = Value::I32(4);
    let meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), string_array(&tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array { elem_type: value_type::I32, items: types }),
        ("tokenizer.ggml.merges".to_string(), string_array(["h e", "l l", "he ll", "hell o", "Ġ w", "Ġ Ġ", "ĠĠ ĠĠ"])),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(n as u32 - 2)),
    ];
    let bytes = write_gguf(Vec::new(), &meta, &[], |_, _| Ok(())).unwrap();
    Tokenizer::from_gguf(&GgufFile::from_vec(bytes).unwrap()).unwrap_or_else(|e| panic!("pre-tokenizer {pre}: {e}"))
}

/// Each tokenizer, and whether byte-level BPE must round-trip exactly: the small
/// vocabularies' merges all make tokens; a real one's may make strings outside the
/// vocabulary, whose non-ASCII bytes llama.cpp (and so hearth) drops (StarCoder's does).
fn tokenizers() -> &'static [(Tokenizer, bool)] {
    static ALL: OnceLock<Vec<(Tokenizer, bool)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let dir = hearth_fuzz::reference_dir().join("vocab");
        let mut all: Vec<(Tokenizer, bool)> = VOCABS
            .iter()
            .filter_map(|v| GgufFile::open(dir.join(format!("ggml-vocab-{v}.gguf"))).ok())
            .map(|f| (Tokenizer::from_gguf(&f).expect("reference vocabulary loads"), false))
            .collect();
        if all.is_empty() {
            eprintln!("tokenizer target: no reference vocabularies under {}; tiny ones only", dir.display());
        }
        all.extend(SUPPORTED_PRE.iter().map(|p| (tiny_bpe(p), true)));
        all
    })
}

// The vocabularies load once, before the first input: loading seven of them under the
// sanitizer takes seconds on a slow machine, which -timeout counted against the first
// input (CI failed with a "timeout" on the empty input).
fuzz_target!(init: { tokenizers(); }, |data: &[u8]| {
    let all = tokenizers();
    let [pick, flags, text @ ..] = data else { return };
    let (tok, exact) = &all[*pick as usize % all.len()];
    let text = String::from_utf8_lossy(text);
    let (add_special, parse_special) = (flags & 1 != 0, flags & 2 != 0);
    let ids = tok.encode(&text, add_special, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()), "token id out of the vocabulary");
    // Byte-level BPE never invents bytes, and loses none when every merge makes a
    // token; both when nothing is added or parsed as special.
    if tok.kind() == TokenizerKind::Bpe && !add_special && !parse_special {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.decode_token(id).to_vec()).collect();
        if *exact {
            assert_eq!(bytes, text.as_bytes(), "decode(encode(text)) differs");
        } else {
            let mut input = text.as_bytes().iter();
            assert!(bytes.iter().all(|b| input.any(|x| x == b)), "decoded bytes are not a subsequence of the input");
        }
    }
    // A streaming decoder fed token by token gives exactly decode() of all of them.
    let mut stream = StreamDecoder::new(tok);
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&stream.push(id));
    }
    // An incomplete last character: the stream drops it, decode() shows one U+FFFD.
    if stream.finish() > 0 {
        streamed.push(char::REPLACEMENT_CHARACTER);
    }
    assert_eq!(streamed, tok.decode(&ids), "streamed text differs from decode()");
    let _ = tok.detokenize(&ids, flags & 4 != 0, flags & 8 != 0);
});
