//! Pipelined-ring windows in one process: a head context whose [`RingLink`] runs the
//! other devices' contexts ([`Context::eval_round`]) must give the single context's
//! logits bit for bit (every layer runs whole, on the same numbers, in the same order),
//! for several assignments including k > 1 rounds and a head device without layers.

use hearth_model::{CollectiveError, Context, Logits, Model, RingLink, RingWindows};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn model() -> Arc<Model> {
    let p = std::env::var("HEARTH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    Arc::new(Model::load(p).unwrap())
}

/// The rest of the ring, in this process.
struct LocalRing {
    devices: Vec<Context>,
}

impl RingLink for LocalRing {
    fn pass(&mut self, pos0: usize, round: usize, x: &mut [f32]) -> Result<(), CollectiveError> {
        for d in &mut self.devices {
            d.eval_round(pos0, round, x).map_err(|e| -> CollectiveError { Box::new(e) })?;
        }
        Ok(())
    }
    fn max_elements(&self) -> usize {
        usize::MAX
    }
}

fn ring(m: &Arc<Model>, windows: &[usize]) -> Context {
    let l = m.config.n_layer;
    let mut devices = Vec::new();
    for i in 1..windows.len() {
        let mut d = Context::new(m.clone(), 64, 16, 1).unwrap();
        d.set_ring(RingWindows::from_assignment(l, windows, i).unwrap(), None).unwrap();
        devices.push(d);
    }
    let mut head = Context::new(m.clone(), 64, 16, 1).unwrap();
    head.set_ring(RingWindows::from_assignment(l, windows, 0).unwrap(), Some(Box::new(LocalRing { devices }))).unwrap();
    head
}

#[test]
fn ring_windows_give_the_single_context_logits() {
    let m = model();
    let prompt = m.tokenizer.encode("The capital of France is", true, true);
    let run = |ctx: &mut Context| {
        // a prompt longer than one batch (16), then a few decode steps
        let mut toks = prompt.clone();
        toks.extend(prompt.iter().cycle().take(20));
        let mut out = ctx.eval(&toks, Logits::All).unwrap().to_vec();
        for t in [42u32, 7, 1000] {
            out.extend_from_slice(ctx.eval(&[t], Logits::Last).unwrap());
        }
        out
    };
    let want = run(&mut Context::new(m.clone(), 64, 16, 1).unwrap());
    // SmolLM2 has 30 layers: k = 1 (15 + 15), k = 2 (10, 3, 2), k = 3 (0, 4, 6), k = 5 (1, 1, 2, 2).
    for windows in [vec![15, 15], vec![10, 3, 2], vec![0, 4, 6], vec![1, 1, 2, 2]] {
        let got = run(&mut ring(&m, &windows));
        assert!(got == want, "windows {windows:?}: logits differ from the single context's");
    }
}

#[test]
fn ring_kv_cache_holds_only_its_layers() {
    let m = model();
    let whole = Context::new(m.clone(), 64, 16, 1).unwrap().kv_bytes();
    let mut d = Context::new(m.clone(), 64, 16, 1).unwrap();
    d.set_ring(RingWindows::from_assignment(30, &[10, 3, 2], 1).unwrap(), None).unwrap();
    assert_eq!(d.kv_bytes(), whole / 30 * 6);
    // a round it does not have, wrong shapes, a position gap: errors, not panics
    let e = m.config.n_embd;
    assert!(d.eval_round(0, 2, &mut vec![0.0; e]).is_err());
    assert!(d.eval_round(0, 0, &mut vec![0.0; e + 1]).is_err());
    assert!(d.eval_round(5, 0, &mut vec![0.0; e]).is_err());
    d.eval_round(0, 0, &mut vec![0.1; 2 * e]).unwrap();
    assert!(d.eval_round(1, 1, &mut vec![0.1; e]).is_err());
    d.eval_round(0, 1, &mut vec![0.1; 2 * e]).unwrap();
}
