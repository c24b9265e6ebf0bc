//! Any byte string must parse or fail with a typed error; parsed tensor views stay in bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = hearth_gguf::GgufFile::from_vec(data.to_vec()) {
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.size);
        }
    }
});
