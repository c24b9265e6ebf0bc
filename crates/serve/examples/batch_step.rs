//! Time one decode step of `b` sequences in one forward pass ([`Context::eval_batch`]),
//! for several `b`: how aggregate decode tok/s grows with the batch, without HTTP.
//!
//! `cargo run --release -p hearth-serve --example batch_step -- MODEL.gguf THREADS [B...]`

use hearth_model::{Context, Model, Segment};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: batch_step MODEL.gguf THREADS [B...]")?;
    let threads: usize = args.next().map_or(Ok(2), |t| t.parse())?;
    let sizes: Vec<usize> = args.map(|b| b.parse()).collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() { vec![1, 2, 4, 8, 16] } else { sizes };
    let model = Arc::new(Model::load(&path)?);
    for &b in &sizes {
        let mut ctx = Context::new(model.clone(), 512, 512, threads)?;
        ctx.set_slots(b)?;
        // A 16-token prompt per slot, then timed decode steps.
        let prompt: Vec<u32> = (0..16).map(|i| 100 + i).collect();
        let segs: Vec<Segment> = (0..b).map(|s| Segment { slot: s, tokens: &prompt[..], logits: 0 }).collect();
        for chunk in segs.chunks(32) {
            ctx.eval_batch(chunk)?;
        }
        let steps = 8;
        let tok = [200u32];
        let t0 = Instant::now();
        for _ in 0..steps {
            let segs: Vec<Segment> = (0..b).map(|s| Segment { slot: s, tokens: &tok, logits: 1 }).collect();
            ctx.eval_batch(&segs)?;
        }
        let dt = t0.elapsed().as_secs_f64() / steps as f64;
        println!("batch {b:3}: {:7.1} ms per step, {:7.1} tok/s aggregate", dt * 1e3, b as f64 / dt);
    }
    Ok(())
}
