//! SmolLM2-135M-Instruct (gpt2 BPE, pre = "smollm") against llama.cpp's token ids: the
//! GPL-3 perplexity text and the four reference prompts (add_special and parse_special
//! on; the model adds no BOS).

mod common;

use hearth_tokenizer::{StreamDecoder, Tokenizer};

fn tokenizer() -> Option<Tokenizer> {
    let Some(path) = common::smollm2_model() else {
        eprintln!("note: models/SmolLM2-135M-Instruct.Q4_1.gguf is absent; skipping");
        return None;
    };
    let f = hearth_gguf::GgufFile::open(path).unwrap();
    Some(Tokenizer::from_gguf(&f).unwrap())
}

fn json(rel: &str) -> serde_json::Value {
    let p = common::reference_dir().join("smollm2").join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn gpl3_text_matches_llama_perplexity_tokens() {
    let Some(tok) = tokenizer() else { return };
    let text = std::fs::read_to_string(common::reference_dir().join("smollm2/ppl_gpl3.txt")).unwrap();
    let want = ids(&json("ppl_gpl3.smollm2_tokens.json")["ids"]);
    assert_eq!(want.len(), 7639);
    let t0 = std::time::Instant::now();
    let got = tok.encode(&text, true, true);
    eprintln!("encoded {} bytes into {} tokens in {:?}", text.len(), got.len(), t0.elapsed());
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "first difference at token {first} (got {} tokens, want {}): got {:?}, want {:?}",
            got.len(),
            want.len(),
            &got[first..(first + 8).min(got.len())],
            &want[first..(first + 8).min(want.len())]
        );
    }
    assert_eq!(tok.decode(&got), text);
}

#[test]
fn reference_prompts_match() {
    let Some(tok) = tokenizer() else { return };
    let reference = json("smollm2_reference.json");
    let prompts = reference["reference_q4_1"]["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 4);
    for p in prompts {
        let text = match p["prompt_file"].as_str() {
            Some(file) => std::fs::read_to_string(common::reference_dir().join("smollm2").join(file)).unwrap(),
            None => p["prompt"].as_str().unwrap().to_string(),
        };
        let want = ids(&p["prompt_token_ids"]);
        assert_eq!(tok.encode(&text, true, true), want, "prompt {text:?}");
    }
}

#[test]
fn special_tokens_and_end_of_generation() {
    let Some(tok) = tokenizer() else { return };
    assert!(!tok.add_bos());
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert_eq!(tok.token_text(1), "<|im_start|>");
    assert!(tok.is_eog(2)); // <|im_end|>
    assert!(tok.is_eog(0)); // <|endoftext|>
    assert!(!tok.is_eog(1));
    // Without parse_special the control text is ordinary text.
    let plain = tok.encode("<|im_end|>", false, false);
    assert!(plain.len() > 1 && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.encode("<|im_end|>", false, true), [2]);
    // Control tokens render as nothing unless asked for.
    assert_eq!(tok.decode_token(2), b"");
    assert_eq!(tok.piece(2, true), b"<|im_end|>");
    assert_eq!(tok.detokenize(&[1, 9690, 2], false, true), "<|im_start|>system<|im_end|>");
    // Streaming the generated reference text gives the reference string.
    let reference = json("smollm2_reference.json");
    for p in reference["reference_q4_1"]["prompts"].as_array().unwrap() {
        let gen = ids(&p["generated_token_ids"]);
        let mut stream = StreamDecoder::new(&tok);
        let text: String = gen.iter().map(|&id| stream.push(id)).collect();
        assert_eq!(stream.finish(), 0, "the reference texts end on whole characters");
        assert_eq!(text, tok.decode(&gen));
        // The reference renders pieces with special = true (the final `<|im_end|>` shows).
        let pieces: Vec<String> =
            gen.iter().map(|&id| String::from_utf8_lossy(&tok.piece(id, true)).into_owned()).collect();
        let want_pieces: Vec<String> =
            p["generated_pieces"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        assert_eq!(pieces, want_pieces);
        assert_eq!(pieces.concat(), p["generated_text"].as_str().unwrap());
    }
}
