//! Structure-aware: a tiny, well-formed model file of any architecture, quant type and
//! tokenizer, then a few edits (metadata values, tensor shapes/types/names), so inputs
//! get past the header checks into the model's shape checks and the forward pass.
//!
//! With `HEARTH_FUZZ_DUMP=DIR`, each generated file of at most 64 KiB (the raw target's
//! `-max_len`) that loads as a model is also written to DIR (fuzz/seed.sh uses this for
//! the raw `gguf_model` target's seeds).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|m: hearth_fuzz::TinyModel| {
    let Some(bytes) = m.to_bytes() else { return };
    if let Some(dir) = std::env::var_os("HEARTH_FUZZ_DUMP").filter(|_| bytes.len() <= 65536) {
        // An edited file need not parse (duplicate tensor names, ...): only ones that do
        // and load are seeds.
        let f = hearth_gguf::GgufFile::from_vec(bytes.clone()).map(std::sync::Arc::new);
        if f.is_ok_and(|f| hearth_model::Model::from_file(f).is_ok()) {
            let name = format!("tiny-{:016x}.gguf", bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3)));
            std::fs::write(std::path::Path::new(&dir).join(name), &bytes).expect("write a dumped seed");
        }
    }
    hearth_fuzz::check_gguf(bytes);
});
