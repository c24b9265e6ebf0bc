//! Prefill attention of one layer over a prompt, one query row at a time (`ops::attend`)
//! against tiles (`ops::attend_block`), single thread, f16 KV cache, random data.
//!
//! `cargo run --release -p hearth-kernels --example attn_prefill -- [n_prompt] [reps]`
//! prints, per shape, the best-of-`reps` time of each path and checks their bits agree.

use half::f16;
use hearth_kernels::ops::{self, AttnScratch, AttnShape, KvRows, BLOCK_MAX_QUERIES};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(512);
    let reps = args.get(1).copied().unwrap_or(5);
    // (name, n_head, n_head_kv, head_dim)
    for (name, n_head, n_kv_head, hd) in [("SmolLM2 9/3/64", 9, 3, 64), ("1B 32/4/64", 32, 4, 64)] {
        let s = AttnShape::causal(n_head, n_kv_head, hd);
        let group = n_head / n_kv_head;
        let mut seed = 0x2545f491u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let q: Vec<f32> = (0..n * n_head * hd).map(|_| rnd() * 2.0).collect();
        let k: Vec<f16> = (0..n * n_kv_head * hd).map(|_| f16::from_f32(rnd() * 2.0)).collect();
        let v: Vec<f16> = (0..n * n_kv_head * hd).map(|_| f16::from_f32(rnd())).collect();
        let (kc, vc) = (KvRows::F16(&k), KvRows::F16(&v));
        let mut scratch = AttnScratch::new(hd, true);
        let qd = n_head * hd;
        let mut one = vec![0f32; n * qd];
        let mut blk = vec![0f32; n * qd];
        let (mut best_one, mut best_blk) = (f64::MAX, f64::MAX);
        for _ in 0..reps {
            let t0 = Instant::now();
            for t in 0..n {
                for h in 0..n_head {
                    let o = &mut one[t * qd + h * hd..t * qd + (h + 1) * hd];
                    ops::attend(&q[t * qd + h * hd..], kc, vc, h / group, t + 1, s, &mut scratch, o);
                }
            }
            best_one = best_one.min(t0.elapsed().as_secs_f64());
            let tile = (BLOCK_MAX_QUERIES / group).clamp(1, 16);
            let t0 = Instant::now();
            for t0_ in (0..n).step_by(tile) {
                let len = tile.min(n - t0_);
                for g in 0..n_kv_head {
                    let heads = g * group..(g + 1) * group;
                    let o = ops::attend_block(&q[t0_ * qd..], qd, len, heads.clone(), kc, vc, g, t0_ + 1, s, &mut scratch);
                    for t in 0..len {
                        let w = group * hd;
                        blk[(t0_ + t) * qd + g * w..(t0_ + t) * qd + (g + 1) * w].copy_from_slice(&o[t * w..(t + 1) * w]);
                    }
                }
            }
            best_blk = best_blk.min(t0.elapsed().as_secs_f64());
        }
        let same = one.iter().zip(&blk).all(|(a, b)| a.to_bits() == b.to_bits());
        println!(
            "{name}, prompt {n}: one row at a time {:.2} ms, blockwise {:.2} ms, {:.2}x, bit-identical: {same}",
            best_one * 1e3,
            best_blk * 1e3,
            best_one / best_blk
        );
    }
}
