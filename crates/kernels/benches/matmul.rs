//! Matmul throughput per weight type and SIMD level.
//!
//! `cargo bench -p hearth-kernels --bench matmul` (append a filter such as
//! `matvec` or `q4_1` to narrow it). Throughput is weight bytes per second:
//! - `matvec/<level>/<type>`: 4096×4096, one token, one thread (decode).
//! - `prefill64/<level>/<type>`: 4096×4096, 64 tokens, one thread: each
//!   weight byte serves 64 tokens, so this is far above memory bandwidth.
//! - `matvec_l2/<level>/<type>`: 256×4096, one token: cache-resident, so
//!   this is the kernel's compute speed.
//! - `matvec_dram/<level>/<type>/<threads>t`: ~256 MiB of weights (beyond
//!   the L3), one token: what decode sees; compare with `hearth bench --membw`. The
//!   weights are in 2 MiB pages (`MADV_HUGEPAGE`), as that probe's buffer and most of a
//!   mapped model file are: in 4 KiB pages (the default of a heap buffer where THP is
//!   `madvise`) avx2 Q4_0 read 22-24% slower on the Intel host (docs/BENCHMARKS.md, session 42).
//! - `layers_7b_decode/q4_0/<threads>t`: one token through the matmuls of `LAYERS`
//!   (environment, default 4) Llama-7B layers, Q4_0, as a decode step issues them: Q, K, V
//!   in one `matmul_many`, O, gate and up in one, down (11008 columns); 2 MiB pages. The
//!   decode step's matmuls without the rest of the model (compare with `hearth bench`'s
//!   7B decode). Four layers are 437 MiB: on a host with a large L3 use `LAYERS=16`.
//!   `TYPE=q4_k` for Q4_K instead, `TYPE=q4_0x8` / `q4_kx8` for Q4_0X8 / Q4_KX8 (Q4_0 /
//!   Q4_K with 8 rows interleaved, `hearth_quant::interleave`).
//! - `NOISE=1` (environment): `matvec_dram` and `layers_7b_decode` weights are pseudo-random
//!   bytes instead of a small quantized matrix repeated (a check that the repetition, which
//!   a hypervisor could deduplicate, does not flatter the rate: it did not, session 42).
//! - `L2_ROWS=N` (environment): `matvec_l2` with N rows instead of 256 × 4096 / COLS.
//!   256 rows of 4096-column Q4_0 are 576 KiB, beyond Zen 3's 512 KiB L2 (the bench then
//!   reads from L3); `L2_ROWS=96` fits it.
//! - `COLS=576` (environment) gives `matvec_l2` (same bytes) and `matvec_dram` rows of
//!   that many columns instead of 4096: SmolLM2's short rows (types whose blocks do not
//!   divide it are skipped).
//! - `moe_ffn_decode/<shape>/<threads>t`: one token through the FFN of a Qwen3-30B-A3B
//!   layer (Q4_0, n_embd 2048): `experts`, 8 routed experts of 768 rows, their gates and
//!   ups in one `matmul_many` and their downs (768 columns) in another, as
//!   `Block::moe_ffn` runs them; `dense`, the dense FFN reading the same bytes (n_ff
//!   6144 = 8 × 768); `*_down` the down projections alone. Each iteration takes the next
//!   of 8 sets of weights (~170 MB in all, beyond the L3), so every byte comes from memory.
//! - `quantize_act/<activation type>`: one 4096-element activation row into the form a
//!   matmul feeds its kernels (`quantize_activations`, the active level: compare with
//!   `HEARTH_SIMD=scalar`); throughput in elements. Every matmul call does this once per
//!   distinct input before its threads start, and `matvec_l2` includes it.
//! - `smollm2_decode/<threads>t`: one decode step's matmuls of SmolLM2-135M
//!   (30 layers of Q4_1 576/192/1536 matrices + the 49152×576 Q8_0 head),
//!   bytes = all weights touched once.

mod common;
use common::{huge_page_copy, random_weights};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hearth_kernels::{matmul_many, matmul_with, quantize_activations, MatJob, SimdLevel, ThreadPool, WeightView};
use hearth_quant::GgmlType;
use std::time::Duration;

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL.into_iter().filter(|l| l.is_available()).collect()
}

fn square(c: &mut Criterion) {
    let (rows, cols) = (4096, 4096);
    let pool = ThreadPool::new(1);
    let types = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16];
    for (name, tokens) in [("matvec", 1usize), ("prefill64", 64)] {
        let mut g = c.benchmark_group(name);
        g.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2)).sample_size(10);
        for ty in types {
            let w = random_weights(ty, rows, cols, 1);
            let view = WeightView::new(ty, &w, rows, cols).unwrap();
            let x: Vec<f32> = (0..tokens * cols).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
            let mut out = vec![0f32; tokens * rows];
            let mut scratch = Vec::new();
            g.throughput(Throughput::Bytes(w.len() as u64));
            for level in levels() {
                if level == SimdLevel::Scalar && tokens > 1 && ty.block_size() == 1 {
                    continue; // f64-summing reference floats: minutes, not informative
                }
                g.bench_function(BenchmarkId::new(level.name(), ty.name()), |b| {
                    b.iter(|| matmul_with(level, &pool, &view, &x, tokens, &mut out, &mut scratch).unwrap())
                });
            }
        }
        g.finish();
    }
}

/// 256×4096 (≤ 2 MB: in L2, or L3 where L2 is smaller): compute-bound speed of the matvec.
fn cached(c: &mut Criterion) {
    let cols: usize = std::env::var("COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
    let rows = std::env::var("L2_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(256 * 4096 / cols / 4 * 4);
    let pool = ThreadPool::new(1);
    let mut g = c.benchmark_group("matvec_l2");
    g.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(20);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K] {
        if ty.row_bytes(cols as u64).is_none() {
            continue;
        }
        let w = random_weights(ty, rows, cols, 1);
        let view = WeightView::new(ty, &w, rows, cols).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
        let mut out = vec![0f32; rows];
        let mut scratch = Vec::new();
        g.throughput(Throughput::Bytes(w.len() as u64));
        for level in levels().into_iter().filter(|&l| l != SimdLevel::Scalar) {
            g.bench_function(BenchmarkId::new(level.name(), ty.name()), |b| {
                b.iter(|| matmul_with(level, &pool, &view, &x, 1, &mut out, &mut scratch).unwrap())
            });
        }
    }
    g.finish();
}

/// ~256 MiB, one token: memory-bound. Rows repeat a small quantized matrix
/// (quantizing 256 MiB of floats would dominate the bench's start-up).
fn dram(c: &mut Criterion) {
    let cols: usize = std::env::var("COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
    let mut g = c.benchmark_group("matvec_dram");
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(10);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16] {
        let Some(rb) = ty.row_bytes(cols as u64).map(|b| b as usize) else { continue };
        let rows = (256 << 20) / rb / 64 * 64;
        let seed = random_weights(ty, 64, cols, 1);
        let (buf, at) = huge_page_copy(&seed, rows * rb);
        let w = &buf[at..];
        let view = WeightView::new(ty, w, rows, cols).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
        let mut out = vec![0f32; rows];
        let mut scratch = Vec::new();
        g.throughput(Throughput::Bytes(w.len() as u64));
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            for level in levels().into_iter().filter(|&l| l != SimdLevel::Scalar) {
                g.bench_function(format!("{}/{}/{threads}t", level.name(), ty.name()), |b| {
                    b.iter(|| matmul_with(level, &pool, &view, &x, 1, &mut out, &mut scratch).unwrap())
                });
            }
        }
    }
    g.finish();
}

fn smollm2(c: &mut Criterion) {
    let (e, ff, kv, layers, vocab) = (576, 1536, 192, 30, 49152);
    let shapes = [(e, e), (kv, e), (kv, e), (e, e), (ff, e), (ff, e), (e, ff)];
    let mut mats: Vec<(GgmlType, Vec<u8>, usize, usize)> = Vec::new();
    for l in 0..layers {
        for (i, &(r, cc)) in shapes.iter().enumerate() {
            mats.push((GgmlType::Q4_1, random_weights(GgmlType::Q4_1, r, cc, (l * 10 + i) as u64 + 7), r, cc));
        }
    }
    mats.push((GgmlType::Q8_0, random_weights(GgmlType::Q8_0, vocab, e, 99), vocab, e));
    let bytes: usize = mats.iter().map(|m| m.1.len()).sum();
    let x = vec![0.25f32; ff];
    let mut out = vec![0f32; vocab];
    let mut scratch = Vec::new();
    let level = SimdLevel::active();
    let mut g = c.benchmark_group("smollm2_decode");
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3)).sample_size(20);
    g.throughput(Throughput::Bytes(bytes as u64));
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        g.bench_function(format!("{}/{threads}t", level.name()), |b| {
            b.iter(|| {
                for (ty, w, r, cc) in &mats {
                    let v = WeightView::new(*ty, w, *r, *cc).unwrap();
                    matmul_with(level, &pool, &v, &x[..*cc], 1, &mut out[..*r], &mut scratch).unwrap();
                }
            })
        });
    }
    g.finish();
}

/// See the module docs (`moe_ffn_decode`).
fn moe_ffn(c: &mut Criterion) {
    let (e, ff, k, sets) = (2048, 768, 8, 8);
    let ty = GgmlType::Q4_0;
    // Set s: expert j's gate, up, down (routed), or the dense gate, up, down.
    let experts: Vec<[Vec<u8>; 3]> = (0..sets * k)
        .map(|i| {
            [
                random_weights(ty, ff, e, 3 * i as u64),
                random_weights(ty, ff, e, 3 * i as u64 + 1),
                random_weights(ty, e, ff, 3 * i as u64 + 2),
            ]
        })
        .collect();
    let dense: Vec<[Vec<u8>; 3]> = (0..sets)
        .map(|i| {
            [
                random_weights(ty, k * ff, e, 1000 + 3 * i as u64),
                random_weights(ty, k * ff, e, 1001 + 3 * i as u64),
                random_weights(ty, e, k * ff, 1002 + 3 * i as u64),
            ]
        })
        .collect();
    let x = vec![0.25f32; k * ff.max(e)];
    let (mut g_out, mut u_out, mut y) = (vec![0f32; k * ff], vec![0f32; k * ff], vec![0f32; k * e]);
    let mut scratch = Vec::new();
    let bytes_up = 2 * k * experts[0][0].len();
    let bytes_down = k * experts[0][2].len();
    let mut g = c.benchmark_group("moe_ffn_decode");
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3)).sample_size(20);
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for (name, down_only) in [("experts", false), ("experts_down", true)] {
            g.throughput(Throughput::Bytes((if down_only { 0 } else { bytes_up } + bytes_down) as u64));
            let mut set = 0;
            g.bench_function(format!("{name}/{threads}t"), |b| {
                b.iter(|| {
                    set = (set + 1) % sets;
                    let w = &experts[set * k..(set + 1) * k];
                    if !down_only {
                        let views: Vec<[WeightView; 2]> = w
                            .iter()
                            .map(|m| [WeightView::new(ty, &m[0], ff, e).unwrap(), WeightView::new(ty, &m[1], ff, e).unwrap()])
                            .collect();
                        let mut jobs = Vec::with_capacity(2 * k);
                        for ((v, go), uo) in views.iter().zip(g_out.chunks_exact_mut(ff)).zip(u_out.chunks_exact_mut(ff)) {
                            jobs.push(MatJob { w: &v[0], x: &x[..e], n_tokens: 1, out: go });
                            jobs.push(MatJob { w: &v[1], x: &x[..e], n_tokens: 1, out: uo });
                        }
                        matmul_many(&pool, &mut jobs, &mut scratch).unwrap();
                    }
                    let views: Vec<WeightView> = w.iter().map(|m| WeightView::new(ty, &m[2], e, ff).unwrap()).collect();
                    let mut jobs: Vec<MatJob> = views
                        .iter()
                        .zip(y.chunks_exact_mut(e))
                        .enumerate()
                        .map(|(j, (v, yo))| MatJob { w: v, x: &x[j * ff..(j + 1) * ff], n_tokens: 1, out: yo })
                        .collect();
                    matmul_many(&pool, &mut jobs, &mut scratch).unwrap();
                })
            });
        }
        for (name, down_only) in [("dense", false), ("dense_down", true)] {
            g.throughput(Throughput::Bytes((if down_only { 0 } else { bytes_up } + bytes_down) as u64));
            let mut set = 0;
            g.bench_function(format!("{name}/{threads}t"), |b| {
                b.iter(|| {
                    set = (set + 1) % sets;
                    let m = &dense[set];
                    if !down_only {
                        let (vg, vu) = (WeightView::new(ty, &m[0], k * ff, e).unwrap(), WeightView::new(ty, &m[1], k * ff, e).unwrap());
                        let mut jobs = [
                            MatJob { w: &vg, x: &x[..e], n_tokens: 1, out: &mut g_out },
                            MatJob { w: &vu, x: &x[..e], n_tokens: 1, out: &mut u_out },
                        ];
                        matmul_many(&pool, &mut jobs, &mut scratch).unwrap();
                    }
                    let vd = WeightView::new(ty, &m[2], e, k * ff).unwrap();
                    matmul_many(&pool, &mut [MatJob { w: &vd, x: &x[..k * ff], n_tokens: 1, out: &mut y[..e] }], &mut scratch).unwrap();
                })
            });
        }
    }
    g.finish();
}

/// See the module docs (`layers_7b_decode`).
fn layers_7b(c: &mut Criterion) {
    let (e, ff, layers) = (4096usize, 11008usize, std::env::var("LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(4usize));
    let ty = match std::env::var("TYPE").as_deref() {
        Ok("q4_k") => GgmlType::Q4_K,
        Ok("q4_0x8") => GgmlType::Q4_0X8,
        Ok("q4_kx8") => GgmlType::Q4_KX8,
        _ => GgmlType::Q4_0,
    };
    let rb = |cols: usize| ty.row_bytes(cols as u64).unwrap() as usize;
    // Per layer: Q, K, V, O (e × e), gate, up (ff × e), down (e × ff), back to back.
    let shapes = [(e, e), (e, e), (e, e), (e, e), (ff, e), (ff, e), (e, ff)];
    let layer_bytes: usize = shapes.iter().map(|&(r, c)| r * rb(c)).sum();
    // Q4_0X8, Q4_KX8: their row type's bytes (any such bytes are valid blocks of either;
    // only the layout the kernel reads them in differs).
    let seed = random_weights(ty.ungrouped(), 64, e, 7);
    let (buf, at) = huge_page_copy(&seed, layers * layer_bytes);
    // Every layer's 7 views, made once: the timed loop only multiplies.
    let mut off = at;
    let views: Vec<WeightView> = (0..layers)
        .flat_map(|_| shapes)
        .map(|(r, c)| {
            let v = WeightView::new(ty, &buf[off..off + r * rb(c)], r, c).unwrap();
            off += r * rb(c);
            v
        })
        .collect();
    let x = vec![0.25f32; ff];
    let (mut q, mut k, mut v, mut o, mut gt, mut up, mut dn) =
        (vec![0f32; e], vec![0f32; e], vec![0f32; e], vec![0f32; e], vec![0f32; ff], vec![0f32; ff], vec![0f32; e]);
    let mut scratch = Vec::new();
    let mut g = c.benchmark_group("layers_7b_decode");
    g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3)).sample_size(10);
    g.throughput(Throughput::Bytes((layers * layer_bytes) as u64));
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        g.bench_function(format!("{}/{threads}t", ty.name()), |b| {
            b.iter(|| {
                for views in views.chunks_exact(shapes.len()) {
                    let xe = &x[..e];
                    let mut jobs = [
                        MatJob { w: &views[0], x: xe, n_tokens: 1, out: &mut q },
                        MatJob { w: &views[1], x: xe, n_tokens: 1, out: &mut k },
                        MatJob { w: &views[2], x: xe, n_tokens: 1, out: &mut v },
                    ];
                    matmul_many(&pool, &mut jobs, &mut scratch).unwrap();
                    matmul_many(&pool, &mut [MatJob { w: &views[3], x: xe, n_tokens: 1, out: &mut o }], &mut scratch).unwrap();
                    let mut jobs = [
                        MatJob { w: &views[4], x: xe, n_tokens: 1, out: &mut gt },
                        MatJob { w: &views[5], x: xe, n_tokens: 1, out: &mut up },
                    ];
                    matmul_many(&pool, &mut jobs, &mut scratch).unwrap();
                    matmul_many(&pool, &mut [MatJob { w: &views[6], x: &x, n_tokens: 1, out: &mut dn }], &mut scratch).unwrap();
                }
            })
        });
    }
    g.finish();
}

fn quantize_act(c: &mut Criterion) {
    let mut g = c.benchmark_group("quantize_act");
    g.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let x: Vec<f32> = (0..4096).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    g.throughput(Throughput::Elements(x.len() as u64));
    // The activation types of Q4_0 (Q8_0), Q4_1 (Q8_1) and the K-quants (Q8_K).
    for (wty, aty) in [(GgmlType::Q4_0, GgmlType::Q8_0), (GgmlType::Q4_1, GgmlType::Q8_1), (GgmlType::Q4_K, GgmlType::Q8_K)] {
        let mut out = vec![0u8; aty.row_bytes(x.len() as u64).unwrap() as usize];
        g.bench_function(aty.name(), |b| b.iter(|| quantize_activations(wty, &x, &mut out).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, square, cached, dram, smollm2, moe_ffn, layers_7b, quantize_act);
criterion_main!(benches);
