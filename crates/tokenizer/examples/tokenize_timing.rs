//! Time loading a GGUF tokenizer and encoding a text file.
//!
//! `cargo run --release -p hearth-tokenizer --example tokenize_timing -- MODEL.gguf TEXT.txt`

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(text)) = (args.next(), args.next()) else {
        eprintln!("usage: tokenize_timing MODEL.gguf TEXT.txt");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(text)?;
    let f = hearth_gguf::GgufFile::open(&model)?;
    let t = Instant::now();
    let tok = hearth_tokenizer::Tokenizer::from_gguf(&f)?;
    println!("load: {:?} ({} tokens, pre {:?})", t.elapsed(), tok.n_vocab(), tok.pre());
    let t = Instant::now();
    let ids = tok.encode(&text, true, true);
    println!("first encode: {:?} ({} bytes -> {} tokens)", t.elapsed(), text.len(), ids.len());
    let runs = 20;
    let t = Instant::now();
    for _ in 0..runs {
        std::hint::black_box(tok.encode(&text, true, true));
    }
    println!("encode: {:?} per run (mean of {runs})", t.elapsed() / runs);
    let t = Instant::now();
    let s = tok.decode(&ids);
    println!("decode: {:?} ({} bytes)", t.elapsed(), s.len());
    Ok(())
}
