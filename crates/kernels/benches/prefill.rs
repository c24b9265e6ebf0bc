//! Prefill matmul speed on real model shapes, robust to a busy machine.
//!
//! `cargo bench -p hearth-kernels --bench prefill [-- THREADS [REPS [TOKENS]]] [FILTER]`
//! (defaults 1, 15, 256; FILTER keeps the cases whose name contains it, e.g.
//! `smollm2/f16/avx512`). For SmolLM2-135M's layer (576/192/1536), a 1B
//! (TinyLlama-shape) layer, and SmolLM2's down and gate alone (`smol-down`:
//! long rows of 1536 columns; `smol-gate`: short ones of 576), each type (F16, Q8_0, Q5_0, Q4_1, Q4_0) and SIMD level runs all
//! the layer's matmuls on TOKENS tokens, REPS times round-robin over the
//! configurations; the best run of each is printed (GFLOP/s = 2 · rows · cols ·
//! tokens / s). The best of many interleaved runs is what the code can do; the
//! mean mostly measures the other load on a shared host. With one thread the
//! GFLOP/s are per second of the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`),
//! which time slicing by other processes does not inflate; wall time otherwise.

mod common;
use common::random_weights;
use hearth_kernels::{matmul_with, SimdLevel, ThreadPool, WeightView};
use hearth_quant::GgmlType;
use std::time::Instant;


/// (rows, cols) of one layer's matmuls: q, k, v, o, gate, up, down.
fn layer(d: usize, kv: usize, ff: usize) -> Vec<(usize, usize)> {
    vec![(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)]
}

/// This thread's CPU time in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let threads = args.first().copied().unwrap_or(1);
    let reps = args.get(1).copied().unwrap_or(15);
    let tokens = args.get(2).copied().unwrap_or(256);
    let filter = std::env::args().skip(1).find(|a| a.parse::<usize>().is_err() && !a.starts_with('-')).unwrap_or_default();
    let pool = ThreadPool::new(threads);
    let levels: Vec<SimdLevel> = SimdLevel::ALL.into_iter().filter(|&l| l != SimdLevel::Scalar && l.is_available()).collect();
    let models = [("smollm2", layer(576, 192, 1536)), ("1b", layer(2048, 256, 5632)), ("smol-down", vec![(576, 1536)]), ("smol-gate", vec![(1536, 576)])];
    let types = [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q4_0];
    struct Case {
        name: String,
        level: SimdLevel,
        mats: Vec<(Vec<u8>, usize, usize)>,
        ty: GgmlType,
        flops: f64,
        best: f64,
    }
    let mut cases = Vec::new();
    for (m, shapes) in &models {
        for &ty in &types {
            if !levels.iter().any(|l| format!("{m}/{ty}/{}", l.name()).contains(&filter)) {
                continue;
            }
            let mats: Vec<_> = shapes.iter().enumerate().map(|(i, &(r, c))| (random_weights(ty, r, c, i as u64 + 1), r, c)).collect();
            let flops = shapes.iter().map(|&(r, c)| 2.0 * (r * c * tokens) as f64).sum();
            for &level in &levels {
                let name = format!("{m}/{ty}/{}", level.name());
                if !name.contains(&filter) {
                    continue;
                }
                cases.push(Case { name, level, mats: mats.clone(), ty, flops, best: f64::INFINITY });
            }
        }
    }
    let maxc = 5632;
    let x: Vec<f32> = (0..tokens * maxc).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    let mut out = vec![0f32; tokens * maxc];
    let mut scratch = Vec::new();
    for _ in 0..reps {
        for c in cases.iter_mut() {
            let (t, c0) = (Instant::now(), thread_cpu());
            for (w, r, cols) in &c.mats {
                let view = WeightView::new(c.ty, w, *r, *cols).unwrap();
                matmul_with(c.level, &pool, &view, &x[..tokens * cols], tokens, &mut out[..tokens * r], &mut scratch).unwrap();
            }
            let secs = if threads == 1 { thread_cpu() - c0 } else { t.elapsed().as_secs_f64() };
            c.best = c.best.min(secs);
        }
    }
    println!("prefill, {tokens} tokens, {threads} thread(s), best of {reps}");
    for c in &cases {
        println!("{:<24} {:8.2} ms  {:6.1} GFLOP/s", c.name, c.best * 1e3, c.flops / c.best / 1e9);
    }
}
