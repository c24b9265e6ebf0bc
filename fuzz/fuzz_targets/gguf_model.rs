//! Raw bytes as a GGUF file, through everything hearth does with one: validate,
//! `inspect`, config, tokenizer, weights, and one forward token when it loads.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hearth_fuzz::check_gguf(data.to_vec()));
