//! Inputs that once crashed, hung or over-allocated in a fuzz target (fuzz/, see
//! docs/FUZZING.md), kept so the stable suite checks them on every run: each file in
//! tests/fuzz-regressions/ goes through what the `gguf_model` target does (open, config,
//! tokenizer, weights, one forward token), and must end in an error or a model, never a
//! panic. Files with a known cause also check the error names it.

use hearth_gguf::GgufFile;
use hearth_model::{Context, Logits, Model, ModelConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions")
}

/// The `gguf_model` target's checks; the error, if any, as text.
fn load(path: &Path) -> Result<(), String> {
    let f = GgufFile::from_vec(std::fs::read(path).unwrap()).map_err(|e| e.to_string())?;
    let f = Arc::new(f);
    let _ = ModelConfig::from_gguf(&f);
    let _ = hearth_tokenizer::Tokenizer::from_gguf(&f);
    let model = Arc::new(Model::from_file(f).map_err(|e| e.to_string())?);
    let mut ctx = Context::new(model.clone(), 8, 8, 1).map_err(|e| e.to_string())?;
    let logits = ctx.eval(&[0], Logits::Last).map_err(|e| e.to_string())?;
    assert_eq!(logits.len(), model.config.n_vocab);
    Ok(())
}

#[test]
fn every_kept_input_loads_or_fails_cleanly() {
    let mut n = 0;
    for e in std::fs::read_dir(dir()).unwrap().flatten() {
        let _ = load(&e.path());
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir().display());
}

/// A header claiming 2,583,691,264 layers made the config reader allocate a 2.6 GB per-layer
/// table before looking at any tensor.
#[test]
fn absurd_layer_count_is_refused_before_allocating() {
    let e = load(&dir().join("huge-block-count.gguf")).unwrap_err();
    assert!(e.contains("block_count") && e.contains("not a real model"), "{e}");
}
