//! The sliding window on SmolLM2: same logits as the mapped run whatever the window,
//! and a file truncated mid-run is an error, not a crash or a hang.

use hearth_memory::{ReadMode, Window};
use hearth_model::{unit_ranges, Context, Logits, Model};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn model_path() -> PathBuf {
    let p = std::env::var("HEARTH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

/// Prefill a prompt, then decode a few greedy tokens; every step's logits.
fn run(ctx: &mut Context, prompt: &[u32], n: usize) -> hearth_model::Result<Vec<Vec<f32>>> {
    let mut out = vec![ctx.eval(prompt, Logits::Last)?.to_vec()];
    for _ in 0..n {
        let next = hearth_model::sampler::argmax(out.last().unwrap());
        out.push(ctx.eval(&[next], Logits::Last)?.to_vec());
    }
    Ok(out)
}

#[test]
fn windowed_runs_match_the_mapped_run_bit_for_bit() {
    let path = model_path();
    let model = Arc::new(Model::load(&path).unwrap());
    let prompt = model.tokenizer.encode("The capital of France is", true, true);
    let mut mapped = Context::new(model.clone(), 64, 64, 2).unwrap();
    let want = run(&mut mapped, &prompt, 6).unwrap();
    let units = unit_ranges(&model.weights).unwrap();
    // Blocks, then the head (tied Q8_0 token_embd, 28.7 MiB) in chunks of at most a block.
    let block = units[0].len();
    assert!(units.len() > model.config.n_layer + 1 && units.iter().all(|r| r.len() <= block + block / 8), "{units:?}");
    // 1 slot (no overlap), 2 (prefetch one), 5 (a wrap-around that is not a divisor),
    // and every unit resident; direct and buffered reads.
    for (slots, mode) in [(1, ReadMode::Direct), (2, ReadMode::Buffered), (5, ReadMode::Direct), (64, ReadMode::Direct)] {
        let w = Window::open(&path, units.clone(), slots, mode).unwrap();
        let mut ctx = Context::new(model.clone(), 64, 64, 2).unwrap();
        ctx.set_source(Box::new(w));
        let got = run(&mut ctx, &prompt, 6).unwrap();
        assert!(got == want, "slots {slots} {mode:?}: logits differ from the mapped run");
        // Logits of every position (perplexity) too, through the head's row chunks.
        ctx.truncate(0);
        mapped.truncate(0);
        let all = ctx.eval(&prompt, Logits::All).unwrap().to_vec();
        assert!(all == mapped.eval(&prompt, Logits::All).unwrap(), "slots {slots}: all-position logits differ");
        let st = ctx.source_stats().unwrap();
        let total: u64 = units.iter().map(|r| r.len() as u64).sum();
        if slots >= units.len() {
            assert!(st.bytes_read >= total && st.bytes_read < total + (units.len() as u64) * 8192, "{st:?}");
        } else {
            // Pinned units are read once; 8 forward passes each stream the others.
            let pinned = hearth_memory::window::pinned_units(units.len(), slots);
            let kept: u64 = units[..pinned].iter().map(|r| r.len() as u64).sum();
            assert!(st.bytes_read >= kept + 8 * (total - kept) && st.bytes_read < kept + 10 * (total - kept), "{st:?}");
        }
    }
}

#[test]
fn a_file_truncated_mid_run_is_an_error() {
    let dir = std::env::temp_dir().join(format!("hearth-window-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("m.gguf");
    std::fs::copy(model_path(), &copy).unwrap();
    let model = Arc::new(Model::load(&copy).unwrap());
    let units = unit_ranges(&model.weights).unwrap();
    let w = Window::open(&copy, units, 3, ReadMode::Direct).unwrap();
    let mut ctx = Context::new(model.clone(), 64, 64, 1).unwrap();
    ctx.set_source(Box::new(w));
    let prompt = model.tokenizer.encode("Hello", true, true);
    ctx.eval(&prompt, Logits::Last).unwrap();
    // Cut the file in half: within the next two passes the loader needs a missing unit.
    let len = std::fs::metadata(&copy).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(len / 2).unwrap();
    let err = (0..3).find_map(|_| ctx.eval(&[42], Logits::Last).err()).expect("a truncated file must fail");
    let msg = err.to_string();
    assert!(msg.contains("truncated") && msg.contains("m.gguf"), "{msg}");
    // And it stays an error (no hang) on the next call.
    assert!(ctx.eval(&[42], Logits::Last).is_err());
    drop(ctx);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_prefetch_nothing_is_read_ahead_and_logits_still_match() {
    let path = model_path();
    let model = Arc::new(Model::load(&path).unwrap());
    let prompt = model.tokenizer.encode("The capital of France is", true, true);
    let want = run(&mut Context::new(model.clone(), 64, 64, 1).unwrap(), &prompt, 2).unwrap();
    let units = unit_ranges(&model.weights).unwrap();
    for prefetch in [true, false] {
        // No unit pinned, 4 slots streaming (a ring device's window).
        let w = Window::open_full(&path, units.clone(), 4, 0, ReadMode::Buffered, prefetch).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let loaded = hearth_model::LayerSource::stats(&w).units_loaded;
        if prefetch {
            assert_eq!(loaded, 4, "the loader fills every slot ahead");
        } else {
            assert_eq!(loaded, 0, "nothing read before it is asked for");
        }
        let mut ctx = Context::new(model.clone(), 64, 64, 1).unwrap();
        ctx.set_source(Box::new(w));
        assert!(run(&mut ctx, &prompt, 2).unwrap() == want, "prefetch {prefetch}: logits differ");
    }
}
