//! Kernel tests: every SIMD level against the scalar reference, and the
//! determinism guarantees of `matmul`.

use crate::dispatch::{Kernels, Panel, SimdLevel};
use crate::{matmul_with, ThreadPool, WeightView};
use hearth_quant::{quantize_row, vec_dot_fn, vec_dot_type, GgmlType};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const WTYPES: [GgmlType; 6] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// Types whose rows are made by quantizing random floats (their scales are
/// derived data, so random bytes would be unrepresentative).
const QTYPES: [GgmlType; 7] =
    [GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL.into_iter().filter(|l| l.is_available()).collect()
}

fn nbytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).unwrap() as usize
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// A random f16 scale over the whole finite range (with some zeros and maxima).
fn scale(rng: &mut impl Rng) -> f32 {
    match rng.gen_range(0..16) {
        0 => 0.0,
        1 => 65504.0,
        2 => -65504.0,
        _ => {
            let e = rng.gen_range(-20..12);
            let s = if rng.gen() { 1.0 } else { -1.0 };
            s * rng.gen_range(1.0f32..2.0) * 2f32.powi(e)
        }
    }
}

/// `n` elements of random raw blocks of `ty`: arbitrary nibbles, i8 quants in
/// ±127 (what ggml's quantizers produce), scales anywhere in f16's range.
fn raw_row(ty: GgmlType, n: usize, rng: &mut impl Rng, zero: bool) -> Vec<u8> {
    let mut b = vec![0u8; nbytes(ty, n)];
    if zero {
        return b;
    }
    let i8s = |rng: &mut dyn rand::RngCore, s: &mut [u8]| s.iter_mut().for_each(|v| *v = rng.gen_range(-127i8..=127) as u8);
    match ty {
        GgmlType::Q4_0 => b.chunks_mut(18).for_each(|c| {
            c[..2].copy_from_slice(&f16_bytes(scale(rng)));
            rng.fill(&mut c[2..]);
        }),
        GgmlType::Q4_1 => b.chunks_mut(20).for_each(|c| {
            c[..2].copy_from_slice(&f16_bytes(scale(rng).abs()));
            c[2..4].copy_from_slice(&f16_bytes(scale(rng)));
            rng.fill(&mut c[4..]);
        }),
        GgmlType::Q8_0 => b.chunks_mut(34).for_each(|c| {
            c[..2].copy_from_slice(&f16_bytes(scale(rng)));
            i8s(rng, &mut c[2..]);
        }),
        GgmlType::Q8_1 => b.chunks_mut(36).for_each(|c| {
            c[..2].copy_from_slice(&f16_bytes(scale(rng).abs()));
            c[2..4].copy_from_slice(&f16_bytes(scale(rng)));
            i8s(rng, &mut c[4..]);
        }),
        GgmlType::F32 => b.chunks_mut(4).for_each(|c| c.copy_from_slice(&rng.gen_range(-4f32..4.0).to_le_bytes())),
        GgmlType::F16 => b.chunks_mut(2).for_each(|c| c.copy_from_slice(&f16_bytes(rng.gen_range(-4f32..4.0)))),
        GgmlType::BF16 => {
            b.chunks_mut(2).for_each(|c| c.copy_from_slice(&hearth_quant::float::f32_to_bf16(rng.gen_range(-4f32..4.0)).to_le_bytes()))
        }
        _ => {
            // Quantize random floats at a random magnitude (2^-10 .. 2^10).
            let s = 2f32.powi(rng.gen_range(-10..=10));
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1f32..1.0) * s).collect();
            quantize_row(ty, &x, &mut b).unwrap();
        }
    }
    b
}

/// `w` with its quant bits zeroed (so it dequantizes to the minimum terms alone).
fn zero_quants(wty: GgmlType, w: &[u8]) -> Vec<u8> {
    let mut z = w.to_vec();
    let (size, q) = match wty {
        GgmlType::Q2_K => (84, 16..80),
        GgmlType::Q4_K => (144, 16..144),
        GgmlType::Q5_K => (176, 16..176),
        GgmlType::Q5_1 => (24, 4..24),
        _ => return vec![0; w.len()],
    };
    z.chunks_mut(size).for_each(|c| c[q.clone()].fill(0));
    z
}

/// Sum of |terms| of the reference dot (the scale for its rounding error).
fn magnitude(wty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f64 {
    let h = |b: &[u8], o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32() as f64;
    let mut m = 0f64;
    match wty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let (ws, as_, q1) = match wty {
                GgmlType::Q4_0 => (18, 34, false),
                GgmlType::Q4_1 => (20, 36, true),
                _ => (34, 34, false),
            };
            for i in 0..n / 32 {
                let (wb, ab) = (&w[i * ws..(i + 1) * ws], &a[i * as_..(i + 1) * as_]);
                let qa = |j: usize| ab[as_ - 32 + j] as i8 as f64;
                let qw = |j: usize| match wty {
                    GgmlType::Q4_0 => ((wb[2 + j % 16] >> (4 * (j / 16))) & 15) as f64 - 8.0,
                    GgmlType::Q4_1 => ((wb[4 + j % 16] >> (4 * (j / 16))) & 15) as f64,
                    _ => wb[2 + j] as i8 as f64,
                };
                let s: f64 = (0..32).map(|j| (qw(j) * qa(j)).abs()).sum();
                m += (h(wb, 0) * h(ab, 0)).abs() * s;
                if q1 {
                    m += (h(wb, 2) * h(ab, 2)).abs();
                }
            }
        }
        _ => {
            // Products of dequantized values, and of the minimum terms apart
            // (the dots sum scale and minimum terms separately: they may cancel).
            let (mut wf, mut af, mut mf) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            hearth_quant::dequantize_row(wty, w, &mut wf).unwrap();
            hearth_quant::dequantize_row(vec_dot_type(wty), a, &mut af).unwrap();
            hearth_quant::dequantize_row(wty, &zero_quants(wty, w), &mut mf).unwrap();
            m = wf.iter().zip(&af).zip(&mf).map(|((&x, &y), &z)| (x.abs() as f64 + z.abs() as f64) * (y as f64).abs()).sum();
            if wty == GgmlType::Q5_1 {
                // The dot uses Q8_1's stored s = d * sum(q), not the quants.
                for (wb, ab) in w.chunks(24).zip(a.chunks(36)) {
                    m += (h(wb, 2) * h(ab, 2)).abs();
                }
            }
        }
    }
    m
}

/// Panel of every level vs the reference dot on raw random blocks.
fn check_panels(seed: u64, wty: GgmlType, rows: usize, cols: usize, tokens: usize, zero: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let aty = vec_dot_type(wty);
    let (wrb, arb) = (nbytes(wty, cols), nbytes(aty, cols));
    let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, zero)).collect();
    let a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(aty, cols, &mut rng, zero && seed.is_multiple_of(2))).collect();
    let dot = vec_dot_fn(wty).unwrap();
    for level in levels() {
        let k = Kernels::for_level(level).unwrap();
        let (ka, karb) = level_acts(k, wty, &a, cols);
        let sums = act_sums(k, wty, &ka, karb, cols);
        let p = Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &ka, act_stride: karb, n_tokens: tokens, act_sums: &sums };
        let mut out = vec![f32::NAN; rows * tokens];
        (k.panel(wty).unwrap())(&p, &mut out);
        for t in 0..tokens {
            for r in 0..rows {
                let (wr, ar) = (&w[r * wrb..(r + 1) * wrb], &a[t * arb..(t + 1) * arb]);
                let want = dot(wr, ar, cols) as f64;
                let got = out[t * rows + r] as f64;
                let tol = 1e-5 * magnitude(wty, wr, ar, cols) + 1e-30;
                assert!(
                    (got - want).abs() <= tol,
                    "{level:?} {wty} rows={rows} cols={cols} tokens={tokens} (r={r}, t={t}): {got} vs reference {want} (tol {tol})"
                );
            }
        }
    }
}

/// The activation block sums level `k`'s panel for `wty` reads (`Panel::act_sums`).
fn act_sums(k: &Kernels, wty: GgmlType, act: &[u8], arb: usize, cols: usize) -> Vec<u8> {
    let Some(k_off) = k.act_sum_offset(wty) else { return Vec::new() };
    let mut out = vec![0u8; 4 * (act.len() / arb) * (cols / 32)];
    crate::matmul::act_block_sums(k_off, act, arb, cols, &mut out);
    out
}

/// Activations `a` (`vec_dot_type(wty)` rows of `cols`) in the form level
/// `k`'s panels read (`Kernels::act_type`: f32 for F16 weights at avx512),
/// and their row stride. Converting f16 to f32 is exact: same numbers.
fn level_acts(k: &Kernels, wty: GgmlType, a: &[u8], cols: usize) -> (Vec<u8>, usize) {
    let (aty, kty) = (vec_dot_type(wty), k.act_type(wty));
    if kty == aty {
        return (a.to_vec(), nbytes(aty, cols));
    }
    assert_eq!((aty, kty), (GgmlType::F16, GgmlType::F32));
    let out = a.chunks(2).flat_map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes()).collect();
    (out, nbytes(kty, cols))
}

/// The f32 form of F16 activations is the f16 quantizer's values, exactly.
#[test]
fn f16_activations_as_f32_round_like_f16() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut x: Vec<f32> = (0..1000).map(|i| rng.gen_range(-1f32..1.0) * 2f32.powi(i % 40 - 25)).collect();
    x.extend([0.0, -0.0, 65504.0, 65520.0, -1e9, 1e-9, f32::INFINITY, 6.1e-5, 5.9e-8, 2.9e-8]);
    let mut h = vec![0u8; 2 * x.len()];
    quantize_row(GgmlType::F16, &x, &mut h).unwrap();
    let mut f = vec![0u8; 4 * x.len()];
    crate::matmul::quantize_f16_as_f32(&x, &mut f);
    for (i, (h, f)) in h.chunks(2).zip(f.chunks(4)).enumerate() {
        let want = half::f16::from_le_bytes([h[0], h[1]]).to_f32();
        let got = f32::from_le_bytes([f[0], f[1], f[2], f[3]]);
        assert_eq!(got.to_bits(), want.to_bits(), "x[{i}] = {}", x[i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn simd_panels_match_reference(
        seed in any::<u64>(),
        ti in 0usize..9,
        rows in 1usize..=16,
        nb in 1usize..=20,
        tokens in prop::sample::select(vec![1usize, 2, 3, 4, 5, 7, 16, 32]),
        zero in prop::bool::weighted(0.1),
    ) {
        let wty = if ti < 6 { WTYPES[ti] } else { QTYPES[(seed % 7) as usize] };
        // Float types also get lengths that are not a multiple of the vector width.
        let cols = match wty.block_size() {
            1 => nb * 32 - (seed % 17) as usize,
            256 => (nb % 3 + 1) * 256,
            bs => nb * bs,
        };
        check_panels(seed, wty, rows, cols, tokens, zero);
    }

    #[test]
    fn simd_quantize_is_byte_identical(seed in any::<u64>(), nb in 1usize..8, e in -8i32..8) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let s = 2f32.powi(e);
        let mut x: Vec<f32> = (0..nb * 32).map(|_| rng.gen_range(-1f32..1.0) * s).collect();
        if seed % 3 == 0 {
            // Ties: with amax = 127, id = 1 and x = k + 0.5 must round half to even, as ggml's SIMD quantizer.
            for (i, v) in x.iter_mut().enumerate() {
                *v = if i % 32 == 0 { 127.0 } else { (i % 60) as f32 - 30.5 };
            }
        }
        if seed % 5 == 0 {
            x[..32].fill(0.0);
        }
        for wty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
            let aty = vec_dot_type(wty);
            let mut want = vec![0u8; nbytes(aty, x.len())];
            match aty {
                GgmlType::Q8_0 => hearth_quant::q8::quantize_row_q8_0_act(&x, &mut want),
                GgmlType::Q8_1 => hearth_quant::q8::quantize_row_q8_1_act(&x, &mut want),
                _ => quantize_row(aty, &x, &mut want).unwrap(),
            }
            for level in levels() {
                let mut got = vec![0xAAu8; want.len()];
                crate::matmul::quantize_with(level, wty, &x, &mut got).unwrap();
                prop_assert_eq!(&got, &want, "{:?} {}", level, aty);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Q8_K activations (the K-quants' `vec_dot_type`) on every level against the
    /// reference quantizer, including what its scalar loop decides element by element:
    /// which of two equal magnitudes of opposite sign sets the scale (the first), exact
    /// rounding ties, all-zero blocks, NaN and infinite inputs.
    #[test]
    fn simd_q8_k_quantize_is_byte_identical(seed in any::<u64>(), nb in 1usize..5, e in -30i32..30, case in 0u8..6) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let s = 2f32.powi(e);
        let n = nb * 256;
        let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1f32..1.0) * s).collect();
        let at = |rng: &mut rand::rngs::StdRng| rng.gen_range(0..n);
        match case {
            // Two elements of the block's greatest magnitude, opposite signs, in random order.
            1 => for b in 0..nb {
                let (i, j) = (b * 256 + rng.gen_range(0..256), b * 256 + rng.gen_range(0..256));
                let v = 2.0 * s * if rng.gen() { 1.0 } else { -1.0 };
                (x[i], x[j]) = (v, -v);
            },
            // max = -127 gives iscale 1: every x = k + 0.5 is a tie, rounded to even.
            2 => for (i, v) in x.iter_mut().enumerate() {
                *v = if i % 256 == 7 { -127.0 } else { (i % 60) as f32 - 30.5 };
            },
            3 => x[..256].fill(if seed % 2 == 0 { 0.0 } else { -0.0 }),
            4 => for _ in 0..3 { let i = at(&mut rng); x[i] = f32::NAN; },
            5 => { let i = at(&mut rng); x[i] = if seed % 2 == 0 { f32::INFINITY } else { f32::NEG_INFINITY }; }
            _ => {}
        }
        let mut want = vec![0u8; nbytes(GgmlType::Q8_K, n)];
        quantize_row(GgmlType::Q8_K, &x, &mut want).unwrap();
        for level in levels() {
            let mut got = vec![0xAAu8; want.len()];
            crate::matmul::quantize_with(level, GgmlType::Q6_K, &x, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?} case {}", level, case);
        }
    }
}

/// One (row, token) dot in exactly the one-row-per-lane kernels' arithmetic
/// (`avx2_rows`, `avx512_rows`): per block, the exact integer dot, then
/// `acc = fma(d_w * d_a, float(sum), acc)`.
pub(crate) fn row_lane_dot(wty: GgmlType, w: &[u8], a: &[u8], cols: usize) -> f32 {
    if wty == GgmlType::Q4_K {
        return row_lane_q4_k(w, a, cols);
    }
    let h = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let wb = if wty == GgmlType::Q4_0 { 18 } else { 34 };
    let mut acc = 0f32;
    for (wb, ab) in w.chunks(wb).zip(a.chunks(34)).take(cols / 32) {
        let q = |j: usize| -> i32 {
            if wty == GgmlType::Q4_0 {
                let byte = wb[2 + j % 16];
                (if j < 16 { byte & 15 } else { byte >> 4 }) as i32 - 8
            } else {
                wb[2 + j] as i8 as i32
            }
        };
        let s: i32 = (0..32).map(|j| q(j) * ab[2 + j] as i8 as i32).sum();
        acc = (h(wb) * h(ab)).mul_add(s as f32, acc);
    }
    acc
}

/// The weight types whose avx512 kernels hold two rows per vector
/// (`arch/x86_64/avx512_pair*.rs`): odd rows, 8- and 4-row matvec tiles,
/// 4×12 / 4×4 prefill tiles and their remainders.
/// Random raw weights and activations through the panel of each SIMD level
/// this CPU has: (one row per lane?, outputs) per level, the one-row-per-lane
/// kernels checked bit for bit against their scalar model.
fn level_panels(seed: u64, wty: GgmlType, rows: usize, cols: usize, tokens: usize, zero: bool) -> Result<Vec<(bool, Vec<f32>)>, TestCaseError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 1);
    let aty = vec_dot_type(wty);
    let (wrb, arb) = (nbytes(wty, cols), nbytes(aty, cols));
    let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, zero)).collect();
    let x: Vec<u8> = (0..tokens).flat_map(|_| raw_row(aty, cols, &mut rng, false)).collect();
    // (level, one row per lane?, outputs) of the SIMD levels this CPU has.
    let mut outs = Vec::new();
    for level in [SimdLevel::Avx2, SimdLevel::Avx512] {
        let Some(k) = Kernels::for_level(level) else { continue };
        let sums = act_sums(k, wty, &x, arb, cols);
        let p = Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &x, act_stride: arb, n_tokens: tokens, act_sums: &sums };
        let mut o = vec![f32::NAN; rows * tokens];
        (k.panel(wty).unwrap())(&p, &mut o);
        let row_lanes = k.row_lanes.contains(&wty);
        if row_lanes {
            // One row per lane: its own order, bit for bit its scalar model.
            for t in 0..tokens {
                for r in 0..rows {
                    let want = row_lane_dot(wty, &w[r * wrb..][..wrb], &x[t * arb..][..arb], cols);
                    prop_assert!(want.to_bits() == o[t * rows + r].to_bits(), "{:?} {} rows={} cols={} tokens={} (r={}, t={}): {} vs model {}", level, wty, rows, cols, tokens, r, t, o[t * rows + r], want);
                }
            }
        }
        outs.push((row_lanes, o));
    }
    Ok(outs)
}

const PAIRED: [GgmlType; 4] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K];

/// `nb` blocks of 32, or 1..3 blocks of 256 for K-quants.
fn paired_cols(wty: GgmlType, nb: usize) -> usize {
    if wty.block_size() == 256 {
        256 * (nb % 3 + 1)
    } else {
        32 * nb
    }
}

/// Pools of 1, 2 and 3 threads shared by the property tests.
pub(crate) fn pools() -> &'static [ThreadPool] {
    static POOLS: std::sync::OnceLock<Vec<ThreadPool>> = std::sync::OnceLock::new();
    POOLS.get_or_init(|| (1..=3).map(ThreadPool::new).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every level vs the reference around the tile sizes (1..40 rows, 1..13
    /// blocks, tokens 1..26; zero scales and ±65504 come from `raw_row`), and
    /// avx512 bit-identical to avx2 (ggml's order, which SmolLM2's logits
    /// need, or for Q4_0 one row per lane); the one-row-per-lane kernels bit
    /// for bit their scalar model.
    #[test]
    fn paired_panels_match_reference_and_avx2(
        seed in any::<u64>(),
        ti in 0usize..4,
        rows in 1usize..=40,
        nb in 1usize..=13,
        tokens in 1usize..=26,
        zero in prop::bool::weighted(0.1),
    ) {
        let (wty, cols) = (PAIRED[ti], paired_cols(PAIRED[ti], nb));
        check_panels(seed, wty, rows, cols, tokens, zero);
        let outs = level_panels(seed, wty, rows, cols, tokens, zero)?;
        if let [(ra, oa), (rb, ob)] = &outs[..] {
            // Same arithmetic where both levels use the same form; only Q8_0
            // with VNNI is one row per lane at avx512 alone.
            prop_assert!(ra == rb || (!ra && wty == GgmlType::Q8_0), "{}: avx2 one row per lane {}, avx512 {}", wty, ra, rb);
            if ra == rb {
                prop_assert!(bits(oa) == bits(ob), "{} rows={} cols={} tokens={}: avx512 differs from avx2", wty, rows, cols, tokens);
            }
        }
    }

    /// A token's result is bit-identical alone, inside a batch of any size,
    /// and for any thread count (matvec and prefill tiles share the per-pair
    /// arithmetic; matvec panels are larger).
    #[test]
    fn paired_matmul_is_batch_and_thread_invariant(
        seed in any::<u64>(),
        ti in 0usize..4,
        rows in 1usize..=80,
        nb in 1usize..=13,
        tokens in 2usize..=26,
    ) {
        let (wty, cols) = (PAIRED[ti], paired_cols(PAIRED[ti], nb));
        let (w, x) = problem(wty, rows, cols, tokens, seed);
        let view = WeightView::new(wty, &w, rows, cols).unwrap();
        let mut scratch = Vec::new();
        for level in levels() {
            let mut base = vec![0f32; rows * tokens];
            matmul_with(level, &pools()[0], &view, &x, tokens, &mut base, &mut scratch).unwrap();
            for (t, pool) in (0..tokens).zip(pools().iter().cycle()) {
                let mut one = vec![0f32; rows];
                matmul_with(level, pool, &view, &x[t * cols..(t + 1) * cols], 1, &mut one, &mut scratch).unwrap();
                prop_assert!(bits(&one) == bits(&base[t * rows..(t + 1) * rows]), "{:?} {} token {} alone", level, wty, t);
            }
            let t0 = (seed % tokens as u64) as usize;
            let n = tokens - t0;
            let mut sub = vec![0f32; rows * n];
            matmul_with(level, &pools()[2], &view, &x[t0 * cols..], n, &mut sub, &mut scratch).unwrap();
            prop_assert!(bits(&sub) == bits(&base[t0 * rows..]), "{:?} {} tokens {}.. as a batch of {}", level, wty, t0, n);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// One token (a decode matvec) over up to 40 Q4_0 blocks: the avx512
    /// one-token path takes whole 8-block periods without the scale gather,
    /// then the tile's blocks; bit for bit the scalar model and avx2.
    #[test]
    fn q4_0_one_token_matches_model(seed in any::<u64>(), rows in 1usize..=40, nb in 1usize..=40, zero in prop::bool::weighted(0.1)) {
        let outs = level_panels(seed, GgmlType::Q4_0, rows, 32 * nb, 1, zero)?;
        if let [(_, oa), (_, ob)] = &outs[..] {
            prop_assert!(bits(oa) == bits(ob), "rows={} blocks={}: avx512 differs from avx2", rows, nb);
        }
    }
}

#[test]
fn edge_shapes() {
    for (i, &wty) in WTYPES.iter().enumerate() {
        for &(rows, tokens) in &[(1, 1), (3, 1), (5, 3), (17, 7), (33, 64), (2, 65)] {
            check_panels_split(i as u64 * 1000 + rows as u64, wty, rows, 96, tokens);
        }
        check_panels(7, wty, 4, 64, 4, true);
    }
}

/// `check_panels`, with panels no larger than the driver uses.
fn check_panels_split(seed: u64, wty: GgmlType, rows: usize, cols: usize, tokens: usize) {
    for r in (0..rows).step_by(16) {
        for t in (0..tokens).step_by(32) {
            check_panels(seed + (r * 100 + t) as u64, wty, 16.min(rows - r), cols, 32.min(tokens - t), false);
        }
    }
}

/// Random f32 weights quantized to `wty`, and random activations.
fn problem(wty: GgmlType, rows: usize, cols: usize, tokens: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let wf: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1f32..1.0)).collect();
    let mut w = vec![0u8; rows * nbytes(wty, cols)];
    quantize_row(wty, &wf, &mut w).unwrap();
    let x: Vec<f32> = (0..tokens * cols).map(|_| rng.gen_range(-2f32..2.0)).collect();
    (w, x)
}

#[test]
fn matmul_matches_reference_end_to_end() {
    let pool = ThreadPool::new(2);
    for wty in WTYPES {
        let (rows, cols, tokens) = (37, 160, 5);
        let (w, x) = problem(wty, rows, cols, tokens, 1);
        let view = WeightView::new(wty, &w, rows, cols).unwrap();
        let aty = vec_dot_type(wty);
        let arb = nbytes(aty, cols);
        let mut act = vec![0u8; tokens * arb];
        quantize_row(aty, &x, &mut act).unwrap();
        for level in levels() {
            let mut out = vec![0f32; rows * tokens];
            matmul_with(level, &pool, &view, &x, tokens, &mut out, &mut Vec::new()).unwrap();
            for t in 0..tokens {
                for r in 0..rows {
                    let ar = &act[t * arb..(t + 1) * arb];
                    let want = hearth_quant::vec_dot(wty, view.row(r), ar, cols).unwrap();
                    let tol = 1e-5 * magnitude(wty, view.row(r), ar, cols);
                    let got = out[t * rows + r];
                    assert!(((got - want) as f64).abs() <= tol, "{level:?} {wty} r{r} t{t}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn matmul_is_thread_and_batch_invariant() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    for wty in WTYPES {
        let (rows, cols, tokens) = (83, 96 + if wty.block_size() == 1 { 5 } else { 0 }, 64);
        let (w, x) = problem(wty, rows, cols, tokens, 2);
        let view = WeightView::new(wty, &w, rows, cols).unwrap();
        for level in levels() {
            let mut scratch = Vec::new();
            let mut base = vec![0f32; rows * tokens];
            matmul_with(level, &pools[0], &view, &x, tokens, &mut base, &mut scratch).unwrap();
            for pool in &pools[1..] {
                let mut out = vec![0f32; rows * tokens];
                matmul_with(level, pool, &view, &x, tokens, &mut out, &mut scratch).unwrap();
                assert!(bits(&out) == bits(&base), "{level:?} {wty}: {} threads differ from 1", pool.n_threads());
            }
            // Each token alone, and sub-batches of 3 and 7 at odd offsets.
            for &(t0, n) in &[(0, 1), (5, 1), (63, 1), (10, 3), (40, 7), (1, 33)] {
                let mut out = vec![0f32; rows * n];
                matmul_with(level, &pools[1], &view, &x[t0 * cols..(t0 + n) * cols], n, &mut out, &mut scratch).unwrap();
                assert!(
                    bits(&out) == bits(&base[t0 * rows..(t0 + n) * rows]),
                    "{level:?} {wty}: tokens {t0}..{} in a batch of {n} differ from the batch of 64",
                    t0 + n
                );
            }
        }
    }
}

/// A decode matvec over panels long enough for the quarter-interleaved order of the
/// 256-bit levels (`tile::run_matvec`: tile `i` takes rows `i`, `q + i`, `2q + i`,
/// `3q + i`) gives each row the bits the same token gets inside a prefill batch, on 1 to 3
/// threads (whose panels, and so quarters, differ), rows not a multiple of 4 included, and
/// through a view narrower than its rows (stride > row bytes, the last row ending short; with
/// 1000 rows the last panel is 4 whole quarters).
#[test]
fn long_matvec_panels_are_batch_invariant() {
    let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
    let cases = WTYPES.iter().flat_map(|&t| [(t, 1003, false), (t, 1000, true), (t, 1003, true)]);
    for (wty, rows, narrow) in cases {
        let (cols, tokens) = (64 + if wty.block_size() == 1 { 3 } else { 0 }, 3);
        let (full, x) = problem(wty, rows, cols, tokens, 7);
        let rb = full.len() / rows;
        // Narrow: each row followed by 40 bytes of other data, and none after the last.
        let gap = if narrow { 40 } else { 0 };
        let mut w = Vec::new();
        for row in full.chunks(rb) {
            w.extend_from_slice(row);
            w.extend(std::iter::repeat_n(0xa5u8, gap));
        }
        w.truncate(w.len() - gap);
        let stride = rb + gap;
        let view = WeightView::with_stride(wty, &w, rows, cols, stride).unwrap();
        for level in levels() {
            let mut scratch = Vec::new();
            let mut base = vec![0f32; rows * tokens];
            matmul_with(level, &pools[0], &view, &x, tokens, &mut base, &mut scratch).unwrap();
            for pool in &pools {
                for t in 0..tokens {
                    let mut out = vec![f32::NAN; rows];
                    matmul_with(level, pool, &view, &x[t * cols..(t + 1) * cols], 1, &mut out, &mut scratch).unwrap();
                    // First of two jobs, as a decode's Q/K/V are: its one panel is all of
                    // it, up to the end of the view's bytes (the narrow view's last row ends
                    // short of a stride).
                    if t == 0 && pool.n_threads() == 1 {
                        let (fill_w, fill_x) = problem(wty, 2000, cols, 1, 8);
                        let fill = WeightView::new(wty, &fill_w, 2000, cols).unwrap();
                        let (mut a, mut b) = (vec![f32::NAN; rows], vec![0f32; 2000]);
                        let mut jobs = [
                            crate::MatJob { w: &view, x: &x[..cols], n_tokens: 1, out: &mut a },
                            crate::MatJob { w: &fill, x: &fill_x, n_tokens: 1, out: &mut b },
                        ];
                        crate::matmul::matmul_many_with(level, pool, &mut jobs, &mut scratch).unwrap();
                        assert!(bits(&a) == bits(&base[..rows]), "{level:?} {wty}: first of two jobs differs");
                    }
                    let want = &base[t * rows..(t + 1) * rows];
                    if let Some(r) = (0..rows).find(|&r| out[r].to_bits() != want[r].to_bits()) {
                        let n = pool.n_threads();
                        panic!("{level:?} {wty}, {n} threads: token {t} alone differs at row {r}: {} vs {}", out[r], want[r]);
                    }
                }
            }
        }
    }
}

/// `matmul_many` gives each job exactly what `matmul` alone gives it: jobs of
/// several types and token counts, two of them sharing one input (quantized
/// once), one of them empty, over 1–3 threads and every level.
#[test]
fn matmul_many_equals_one_matmul_per_job() {
    let specs = [
        (GgmlType::Q4_0, 70, 256, 1),
        (GgmlType::Q4_0, 33, 256, 1),
        (GgmlType::Q8_0, 48, 256, 1),
        (GgmlType::Q4_K, 17, 256, 3),
        (GgmlType::F16, 9, 64, 40),
        (GgmlType::Q4_1, 0, 64, 2),
    ];
    let problems: Vec<_> = specs.iter().enumerate().map(|(i, &(ty, r, c, t))| problem(ty, r, c, t, 10 + i as u64)).collect();
    let views: Vec<WeightView<'_>> =
        specs.iter().zip(&problems).map(|(&(ty, r, c, _), (w, _))| WeightView::new(ty, w, r, c).unwrap()).collect();
    // Jobs 0–2 share job 0's input (one token of 256).
    let x_of = |j: usize| if j < 3 { &problems[0].1[..] } else { &problems[j].1[..] };
    for level in levels() {
        let mut want: Vec<Vec<f32>> = Vec::new();
        for (j, v) in views.iter().enumerate() {
            let mut out = vec![0f32; v.rows * specs[j].3];
            matmul_with(level, &pools()[0], v, x_of(j), specs[j].3, &mut out, &mut Vec::new()).unwrap();
            want.push(out);
        }
        for pool in pools() {
            let mut outs: Vec<Vec<f32>> = want.iter().map(|w| vec![f32::NAN; w.len()]).collect();
            let mut jobs: Vec<crate::MatJob<'_, '_>> = views
                .iter()
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(j, (w, out))| crate::MatJob { w, x: x_of(j), n_tokens: specs[j].3, out })
                .collect();
            crate::matmul::matmul_many_with(level, pool, &mut jobs, &mut Vec::new()).unwrap();
            for j in 0..views.len() {
                assert!(bits(&outs[j]) == bits(&want[j]), "{level:?} job {j} ({}) on {} threads", specs[j].0, pool.n_threads());
            }
        }
        // A bad job is an error naming the shape.
        let mut out = vec![0f32; 5];
        let e = crate::matmul::matmul_many_with(
            level,
            &pools()[1],
            &mut [crate::MatJob { w: &views[0], x: x_of(0), n_tokens: 1, out: &mut out }],
            &mut Vec::new(),
        );
        assert!(e.is_err());
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn views_compute_sub_blocks() {
    let pool = ThreadPool::new(2);
    let (rows, cols) = (40, 256);
    let (w, x) = problem(GgmlType::Q4_1, rows, cols, 1, 3);
    let full = WeightView::new(GgmlType::Q4_1, &w, rows, cols).unwrap();
    let mut whole = vec![0f32; rows];
    matmul_with(SimdLevel::Scalar, &pool, &full, &x, 1, &mut whole, &mut Vec::new()).unwrap();
    // A row range gives the same rows.
    let part = full.rows(7..30);
    let mut out = vec![0f32; 23];
    matmul_with(SimdLevel::Scalar, &pool, &part, &x, 1, &mut out, &mut Vec::new()).unwrap();
    assert_eq!(&out[..], &whole[7..30]);
    // Two column halves add up to the whole (up to rounding).
    let (mut lo, mut hi) = (vec![0f32; rows], vec![0f32; rows]);
    let c = cols / 2;
    for level in levels() {
        matmul_with(level, &pool, &full.cols(0..c).unwrap(), &x[..c], 1, &mut lo, &mut Vec::new()).unwrap();
        matmul_with(level, &pool, &full.cols(c..cols).unwrap(), &x[c..], 1, &mut hi, &mut Vec::new()).unwrap();
        for r in 0..rows {
            let s = lo[r] + hi[r];
            assert!((s - whole[r]).abs() <= 1e-4 * (1.0 + whole[r].abs()), "{level:?} row {r}: {s} vs {}", whole[r]);
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let pool = ThreadPool::new(1);
    let w = vec![0u8; 2 * 18];
    let v = WeightView::new(GgmlType::Q4_0, &w, 2, 32).unwrap();
    let mut out = vec![0f32; 2];
    let e = crate::matmul(&pool, &v, &[0f32; 31], 1, &mut out, &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("x length"), "{e}");
    let e = crate::matmul(&pool, &v, &[0f32; 32], 1, &mut out[..1], &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("out length"), "{e}");
    let k = WeightView { ty: GgmlType::IQ4_XS, data: &[0u8; 136], rows: 1, cols: 256, row_stride: 136 };
    assert!(crate::matmul(&pool, &k, &[0f32; 256], 1, &mut out[..1], &mut Vec::new()).is_err());
    let mut bad = v;
    bad.rows = 3;
    assert!(crate::matmul(&pool, &bad, &[0f32; 32], 1, &mut [0f32; 3], &mut Vec::new()).is_err());
}

#[test]
fn env_var_caps_the_level() {
    // The active level is fixed per process; here only check names parse.
    assert_eq!(SimdLevel::from_name("AVX2"), Some(SimdLevel::Avx2));
    assert_eq!(SimdLevel::from_name("scalar"), Some(SimdLevel::Scalar));
    assert_eq!(SimdLevel::from_name("neon+dotprod"), Some(SimdLevel::NeonDot));
    assert_eq!(SimdLevel::from_name("NEON+I8MM"), Some(SimdLevel::NeonI8mm));
    for l in SimdLevel::ALL {
        assert_eq!(SimdLevel::from_name(l.name()), Some(l));
    }
    assert!(SimdLevel::Scalar.is_available());
    // Advanced SIMD is baseline on aarch64: its level is always there.
    #[cfg(target_arch = "aarch64")]
    {
        assert!(SimdLevel::Neon.is_available());
        let (dot, i8mm) = (std::arch::is_aarch64_feature_detected!("dotprod"), std::arch::is_aarch64_feature_detected!("i8mm"));
        assert_eq!(SimdLevel::NeonDot.is_available(), dot);
        assert_eq!(SimdLevel::NeonI8mm.is_available(), dot && i8mm);
    }
    // Only this architecture's levels (and scalar) can be available.
    for l in SimdLevel::ALL {
        assert!(l.is_native() || !l.is_available(), "{l:?}");
    }
    assert!(levels().contains(&SimdLevel::active()));
}

#[test]
fn new_types_edge_shapes_and_end_to_end() {
    let pool = ThreadPool::new(2);
    for (i, &wty) in QTYPES.iter().enumerate() {
        let cols = 2 * wty.block_size().max(128);
        for &(rows, tokens) in &[(1, 1), (3, 1), (5, 3), (17, 7), (2, 33)] {
            check_panels_split(i as u64 * 1000 + rows as u64, wty, rows, cols, tokens);
        }
        check_panels(7, wty, 4, cols, 4, true);
        // matmul end to end, and thread / batch invariance.
        let (rows, tokens) = (21, 6);
        let (w, x) = problem(wty, rows, cols, tokens, 5);
        let view = WeightView::new(wty, &w, rows, cols).unwrap();
        let aty = vec_dot_type(wty);
        let arb = nbytes(aty, cols);
        let mut act = vec![0u8; tokens * arb];
        for (xt, at) in x.chunks(cols).zip(act.chunks_mut(arb)) {
            crate::matmul::quantize_with(SimdLevel::Scalar, wty, xt, at).unwrap();
        }
        for level in levels() {
            let mut base = vec![0f32; rows * tokens];
            matmul_with(level, &pool, &view, &x, tokens, &mut base, &mut Vec::new()).unwrap();
            for t in 0..tokens {
                for r in 0..rows {
                    let ar = &act[t * arb..(t + 1) * arb];
                    let want = hearth_quant::vec_dot(wty, view.row(r), ar, cols).unwrap();
                    let tol = 1e-5 * magnitude(wty, view.row(r), ar, cols);
                    let got = base[t * rows + r];
                    assert!(((got - want) as f64).abs() <= tol, "{level:?} {wty} r{r} t{t}: {got} vs {want}");
                }
            }
            let one = ThreadPool::new(1);
            let mut out = vec![0f32; rows * tokens];
            matmul_with(level, &one, &view, &x, tokens, &mut out, &mut Vec::new()).unwrap();
            assert!(bits(&out) == bits(&base), "{level:?} {wty}: thread count changes results");
            let mut out = vec![0f32; rows];
            matmul_with(level, &pool, &view, &x[3 * cols..4 * cols], 1, &mut out, &mut Vec::new()).unwrap();
            assert!(bits(&out) == bits(&base[3 * rows..4 * rows]), "{level:?} {wty}: batch changes results");
        }
    }
}

#[test]
fn q8_k_activations_are_the_reference_on_every_level() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut x: Vec<f32> = (0..1024).map(|_| rng.gen_range(-3f32..3.0)).collect();
    x[256..512].fill(0.0);
    let mut want = vec![0u8; nbytes(GgmlType::Q8_K, x.len())];
    quantize_row(GgmlType::Q8_K, &x, &mut want).unwrap();
    for level in levels() {
        let mut got = vec![0xAAu8; want.len()];
        crate::matmul::quantize_with(level, GgmlType::Q4_K, &x, &mut got).unwrap();
        assert_eq!(got, want, "{level:?}");
    }
    assert!(crate::supports(GgmlType::Q4_K) && crate::supports(GgmlType::Q6_K) && crate::supports(GgmlType::Q5_0));
}

/// ggml's `hsum_float_8`: `(s0 + s2) + (s1 + s3)` with `s_i = v_i + v_{i+4}`.
fn hsum8(v: [f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// llama.cpp's repacked `ggml_gemm_q4_K_8x8_q8_K` / `gemv` (x86) for one
/// (row, token): per super-block the exact integer sums of the scale and min
/// terms, one fma into each accumulator, their difference at the end; the
/// model of `avx2_rows`' Q4_K.
fn row_lane_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use hearth_quant::{k::get_scale_min_k4, BlockQ4K, BlockQ8K};
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for i in 0..n / 256 {
        let x = BlockQ4K::read(&w[i * 144..]);
        let y = BlockQ8K::read(&a[i * 292..]);
        let q = |e: usize| ((x.qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 15) as i32;
        let (mut isum, mut imin) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, &x.scales);
            let dot: i32 = (32 * j..32 * j + 32).map(|e| q(e) * y.qs[e] as i32).sum();
            isum += sc as i32 * dot;
            imin += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
        }
        acc = (x.d.to_f32() * y.d).mul_add(isum as f32, acc);
        acc_m = (x.dmin.to_f32() * y.d).mul_add(imin as f32, acc_m);
    }
    acc - acc_m
}

/// ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`, lane by lane (as in llama.cpp 0c1e570, the
/// reference build): the quants' −32 offset is not subtracted per element but per lane
/// at the end of a block, from the activations' block sums: lane k takes sub-blocks 2k
/// and 2k+1 (`q8sclsub`). The per-lane integers, and so the f32 roundings, differ from
/// subtracting per element.
#[allow(clippy::needless_range_loop)]
fn ggml_avx2_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use hearth_quant::{BlockQ6K, BlockQ8K};
    let mut acc = [0f32; 8];
    for i in 0..n / 256 {
        let x = BlockQ6K::read(&w[i * 210..]);
        let y = BlockQ8K::read(&a[i * 292..]);
        let d = y.d * x.d.to_f32();
        // Element e = 128h + 32g + l: low 4 bits from ql, high 2 from qh.
        let q = |e: usize| {
            let (h, g, l) = (e / 128, (e % 128) / 32, e % 32);
            let lo = (x.ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 15;
            let hi = (x.qh[32 * h + l] >> (2 * g)) & 3;
            (lo | (hi << 4)) as i32
        };
        for k in 0..8 {
            let mut s = 0i32;
            for grp in 0..8 {
                for b in 0..4 {
                    let e = 32 * grp + 4 * k + b;
                    s += x.scales[e / 16] as i32 * q(e) * y.qs[e] as i32;
                }
            }
            let sc = |j: usize| x.scales[j] as i32 * y.bsums[j] as i32;
            s -= (sc(2 * k) + sc(2 * k + 1)) << 5;
            acc[k] = d.mul_add(s as f32, acc[k]);
        }
    }
    hsum8(acc)
}

#[test]
fn avx2_k_dots_are_bit_identical_to_llama_cpps_order() {
    if !SimdLevel::Avx2.is_available() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    // Q4_K: the repacked kernels' order (one row per lane); Q6_K: the plain one.
    for (wty, emulate) in [(GgmlType::Q4_K, row_lane_q4_k as fn(&[u8], &[u8], usize) -> f32), (GgmlType::Q6_K, ggml_avx2_q6_k)] {
        for case in 0..20 {
            let (rows, cols, tokens) = (3, 256 * (1 + case % 4), 2);
            let (wrb, arb) = (nbytes(wty, cols), nbytes(GgmlType::Q8_K, cols));
            let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, false)).collect();
            let a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(GgmlType::Q8_K, cols, &mut rng, false)).collect();
            for level in levels().into_iter().filter(|&l| l != SimdLevel::Scalar) {
                let k = Kernels::for_level(level).unwrap();
                let p =
                    Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &a, act_stride: arb, n_tokens: tokens, act_sums: &[] };
                let mut out = vec![f32::NAN; rows * tokens];
                (k.panel(wty).unwrap())(&p, &mut out);
                for t in 0..tokens {
                    for r in 0..rows {
                        let want = emulate(&w[r * wrb..(r + 1) * wrb], &a[t * arb..(t + 1) * arb], cols);
                        let got = out[t * rows + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {wty} case {case} r{r} t{t}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

/// ggml's AVX2 `ggml_vec_dot_q5_K_q8_K`, lane by lane: lane k of sub-block
/// j sums elements 4k..4k+3 (of its 32) times scale j, exactly, over the
/// block; `acc[k] = fma(d, float(sum), acc[k])`; the min terms one exact
/// integer per block into `summs = fma(-d_a * dmin_w, float(sum), summs)`,
/// added after `hsum_float_8`.
#[allow(clippy::needless_range_loop)]
fn ggml_avx2_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use hearth_quant::{k::get_scale_min_k4, BlockQ5K, BlockQ8K};
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for i in 0..n / 256 {
        let x = BlockQ5K::read(&w[i * 176..]);
        let y = BlockQ8K::read(&a[i * 292..]);
        let (d, dmin) = (y.d * x.d.to_f32(), -y.d * x.dmin.to_f32());
        let prod: i32 = (0..8).map(|j| get_scale_min_k4(j, &x.scales).1 as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)).sum();
        summs = dmin.mul_add(prod as f32, summs);
        // Element e = 64j + 32h + l: nibble h of qs[32j + l], bit 2j + h of qh[l].
        let q = |e: usize| {
            let (j, h, l) = (e / 64, (e % 64) / 32, e % 32);
            (((x.qs[32 * j + l] >> (4 * h)) & 15) | (((x.qh[l] >> (2 * j + h)) & 1) << 4)) as i32
        };
        for k in 0..8 {
            let mut s = 0i32;
            for sb in 0..8 {
                let sc = get_scale_min_k4(sb, &x.scales).0 as i32;
                for b in 0..4 {
                    let e = 32 * sb + 4 * k + b;
                    s += sc * q(e) * y.qs[e] as i32;
                }
            }
            acc[k] = d.mul_add(s as f32, acc[k]);
        }
    }
    hsum8(acc) + summs
}

/// ggml's AVX2 `ggml_vec_dot_q2_K_q8_K`, lane by lane: per block the min
/// terms (`mins[2m]·bsums[2m] + mins[2m+1]·bsums[2m+1]` in lane m) go into the
/// 8 lanes with one fma, then the scale terms with another.
#[allow(clippy::needless_range_loop)]
fn ggml_avx2_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use hearth_quant::{BlockQ2K, BlockQ8K};
    let mut acc = [0f32; 8];
    for i in 0..n / 256 {
        let x = BlockQ2K::read(&w[i * 84..]);
        let y = BlockQ8K::read(&a[i * 292..]);
        let (d, dmin) = (y.d * x.d.to_f32(), -y.d * x.dmin.to_f32());
        let min = |j: usize| (x.scales[j] >> 4) as i32;
        for m in 0..8 {
            let p = min(2 * m) * y.bsums[2 * m] as i32 + min(2 * m + 1) * y.bsums[2 * m + 1] as i32;
            acc[m] = dmin.mul_add(p as f32, acc[m]);
        }
        // Element e = 128j + 32k + b: bits 2k of qs[32j + b], scale e / 16.
        let q = |e: usize| ((x.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) as i32;
        for m in 0..8 {
            let mut s = 0i32;
            for grp in 0..8 {
                for b in 0..4 {
                    let e = 32 * grp + 4 * m + b;
                    s += (x.scales[e / 16] & 15) as i32 * q(e) * y.qs[e] as i32;
                }
            }
            acc[m] = d.mul_add(s as f32, acc[m]);
        }
    }
    hsum8(acc)
}

/// ggml's AVX2 `ggml_vec_dot_q3_K_q8_K`, lane by lane.
#[allow(clippy::needless_range_loop)]
fn ggml_avx2_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use hearth_quant::{k::q3_k_scales, BlockQ3K, BlockQ8K};
    let mut acc = [0f32; 8];
    for i in 0..n / 256 {
        let x = BlockQ3K::read(&w[i * 110..]);
        let y = BlockQ8K::read(&a[i * 292..]);
        let d = y.d * x.d.to_f32();
        let sc = q3_k_scales(&x.scales);
        // Element e = 128j + 32k + b: bits 2k of qs[32j + b], minus 4 unless
        // bit 4j + k of hmask[b] is set.
        let q = |e: usize| {
            let (j, k, b) = (e / 128, (e % 128) / 32, e % 32);
            let lo = ((x.qs[32 * j + b] >> (2 * k)) & 3) as i32;
            lo - if x.hmask[b] >> (4 * j + k) & 1 == 1 { 0 } else { 4 }
        };
        for m in 0..8 {
            let mut s = 0i32;
            for grp in 0..8 {
                for b in 0..4 {
                    let e = 32 * grp + 4 * m + b;
                    s += (sc[e / 16] as i32 - 32) * q(e) * y.qs[e] as i32;
                }
            }
            acc[m] = d.mul_add(s as f32, acc[m]);
        }
    }
    hsum8(acc)
}

/// Q2_K / Q3_K at every SIMD level bit for bit against ggml's AVX2 order, on
/// quantized rows and on raw random blocks (any scale, hmask and quant bits;
/// Q8_K quants over the whole i8 range, -128 included).
#[test]
fn avx2_low_k_dots_are_bit_identical_to_ggml_avx2_order() {
    if !SimdLevel::Avx2.is_available() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    for (wty, emulate) in [(GgmlType::Q2_K, ggml_avx2_q2_k as fn(&[u8], &[u8], usize) -> f32), (GgmlType::Q3_K, ggml_avx2_q3_k)] {
        for case in 0..40 {
            let (rows, cols, tokens) = (1 + case % 5, 256 * (1 + case % 4), 1 + case % 3);
            let (wrb, arb) = (nbytes(wty, cols), nbytes(GgmlType::Q8_K, cols));
            let raw = case % 2 == 1;
            let mut w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, false)).collect();
            let mut a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(GgmlType::Q8_K, cols, &mut rng, false)).collect();
            if raw {
                // Random bytes with finite scales: d/dmin from `scale`, Q8_K's d in ±2^±10.
                let (ws, d_at) = if wty == GgmlType::Q2_K { (84, vec![80, 82]) } else { (110, vec![108]) };
                for blk in w.chunks_mut(ws) {
                    rng.fill(&mut blk[..]);
                    for &o in &d_at {
                        blk[o..o + 2].copy_from_slice(&f16_bytes(scale(&mut rng)));
                    }
                }
                for blk in a.chunks_mut(292) {
                    let d = rng.gen_range(0.5f32..2.0) * 2f32.powi(rng.gen_range(-10..=10));
                    blk[..4].copy_from_slice(&d.to_le_bytes());
                    rng.fill(&mut blk[4..260]);
                    for g in 0..16 {
                        let s: i16 = blk[4 + 16 * g..20 + 16 * g].iter().map(|&q| q as i8 as i16).sum();
                        blk[260 + 2 * g..262 + 2 * g].copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
            for level in levels().into_iter().filter(|&l| l != SimdLevel::Scalar) {
                let k = Kernels::for_level(level).unwrap();
                let p =
                    Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &a, act_stride: arb, n_tokens: tokens, act_sums: &[] };
                let mut out = vec![f32::NAN; rows * tokens];
                (k.panel(wty).unwrap())(&p, &mut out);
                for t in 0..tokens {
                    for r in 0..rows {
                        let want = emulate(&w[r * wrb..(r + 1) * wrb], &a[t * arb..(t + 1) * arb], cols);
                        let got = out[t * rows + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {wty} case {case} r{r} t{t}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The avxvnni level gives the avx2 level's bits for every weight type:
    /// its integer step (`vpdpbusd`) yields the same i32 sums as AVX2's
    /// `vpmaddubsw` + `vpmaddwd` (`arch/x86_64/int_dot.rs`). Skipped on CPUs
    /// without AVX-VNNI.
    #[test]
    fn avxvnni_equals_avx2(
        seed in any::<u64>(),
        ti in 0usize..13,
        rows in 1usize..=40,
        nb in 1usize..=13,
        tokens in 1usize..=26,
        zero in prop::bool::weighted(0.1),
    ) {
        let (Some(avx2), Some(vnni)) = (Kernels::for_level(SimdLevel::Avx2), Kernels::for_level(SimdLevel::AvxVnni)) else {
            return Ok(());
        };
        let wty = if ti < 6 { WTYPES[ti] } else { QTYPES[ti - 6] };
        let cols = match wty.block_size() {
            1 => nb * 32 - (seed % 17) as usize,
            _ => paired_cols(wty, nb),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let aty = vec_dot_type(wty);
        let wrb = nbytes(wty, cols);
        let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, zero)).collect();
        let a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(aty, cols, &mut rng, false)).collect();
        let run = |k: &Kernels| {
            let (ka, karb) = level_acts(k, wty, &a, cols);
            let sums = act_sums(k, wty, &ka, karb, cols);
            let p = Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &ka, act_stride: karb, n_tokens: tokens, act_sums: &sums };
            let mut o = vec![f32::NAN; rows * tokens];
            (k.panel(wty).unwrap())(&p, &mut o);
            bits(&o)
        };
        prop_assert!(run(avx2) == run(vnni), "{} rows={} cols={} tokens={}: avxvnni differs from avx2", wty, rows, cols, tokens);
    }
}

/// ggml's AVX2 `ggml_vec_dot_q8_0_q8_0` and its Q5_0, Q4_1, Q5_1 siblings, lane
/// by lane: lane k of each block sums bytes 4k..4k+3 exactly, then `acc[k] =
/// fma(d_w * d_a, float(sum), acc[k])`, `hsum_float_8` at the end; Q4_1 and
/// Q5_1 add `summs`, the `fma(m_w, s_a, summs)` of each block, last.
fn ggml_avx2_block(wty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let h = |b: &[u8], o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
    let (wb, ab) = (nbytes(wty, 32), nbytes(vec_dot_type(wty), 32));
    let fifth = |b: &[u8], j: usize| (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> j) & 1;
    let nib = |b: &[u8], j: usize| ((b[j % 16] >> (4 * (j / 16))) & 15) as u32;
    let q = |b: &[u8], j: usize| -> i32 {
        match wty {
            GgmlType::Q8_0 => b[2 + j] as i8 as i32,
            GgmlType::Q5_0 => (nib(&b[6..], j) | (fifth(&b[2..], j) << 4)) as i32 - 16,
            GgmlType::Q4_1 => nib(&b[4..], j) as i32,
            _ => (nib(&b[8..], j) | (fifth(&b[4..], j) << 4)) as i32,
        }
    };
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (wb, ab) in w.chunks(wb).zip(a.chunks(ab)).take(n / 32) {
        let d = h(wb, 0) * h(ab, 0);
        let qa = &ab[ab.len() - 32..];
        for (k, acc) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * k..4 * k + 4).map(|j| q(wb, j) * qa[j] as i8 as i32).sum();
            *acc = d.mul_add(s as f32, *acc);
        }
        if matches!(wty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            summs = h(wb, 2).mul_add(h(ab, 2), summs);
        }
    }
    hsum8(acc) + summs
}

/// The 256-bit levels' Q8_0, Q5_0, Q4_1 and Q5_1 panels (`avx2_q8`'s tiles for
/// several tokens, the generic tile for one) are ggml's AVX2 order bit for bit,
/// over tile remainders (1..9 rows, 1..11 tokens) and scales across f16's range.
#[test]
fn block_tiles_equal_ggmls_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(34);
    for wty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q5_1] {
        for level in [SimdLevel::Avx2, SimdLevel::AvxVnni] {
            let Some(k) = Kernels::for_level(level) else { continue };
            for case in 0..60 {
                let (rows, tokens, cols) = (1 + case % 9, 1 + case % 11, 32 * (1 + case % 7));
                let aty = vec_dot_type(wty);
                let (wrb, arb) = (nbytes(wty, cols), nbytes(aty, cols));
                let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, false)).collect();
                let a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(aty, cols, &mut rng, false)).collect();
                let p =
                    Panel { wty, w: &w, row_stride: wrb, n_rows: rows, cols, act: &a, act_stride: arb, n_tokens: tokens, act_sums: &[] };
                let mut out = vec![f32::NAN; rows * tokens];
                (k.panel(wty).unwrap())(&p, &mut out);
                for t in 0..tokens {
                    for r in 0..rows {
                        let want = ggml_avx2_block(wty, &w[r * wrb..][..wrb], &a[t * arb..][..arb], cols);
                        let got = out[t * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{level:?} {wty} case {case} r{r} t{t} ({rows}x{tokens}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// The 256-bit x86 levels' float rows (and the NEON levels', which mirror
/// them), lane by lane: element i into lane `i mod 8` by fma, `hsum_float_8`,
/// then the elements past the last 8 summed in order (multiply, add).
fn float8_dot(wty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    use crate::arch::tail::{rd_bf16, rd_f16, rd_f32};
    let rw = |i| match wty {
        GgmlType::F32 => rd_f32(w, i),
        GgmlType::F16 => rd_f16(w, i),
        _ => rd_bf16(w, i),
    };
    // F16 weights' activations are f16 at the avx2 levels and f32 (the same values) at
    // the NEON ones (`Kernels::act_type`): told apart by their length.
    let ra = |i| match wty {
        GgmlType::BF16 => rd_bf16(a, i),
        GgmlType::F16 if a.len() == 2 * n => rd_f16(a, i),
        _ => rd_f32(a, i),
    };
    let whole = n / 8 * 8;
    let mut acc = [0f32; 8];
    for i in 0..whole {
        acc[i % 8] = rw(i).mul_add(ra(i), acc[i % 8]);
    }
    let mut tail = 0f32;
    for i in whole..n {
        tail += rw(i) * ra(i);
    }
    hsum8(acc) + tail
}

/// The NEON levels compute the avx2 level's bits for every weight type: Q4_0
/// and Q4_K one row per lane, the other block types in ggml's AVX2 order,
/// float rows in 8 lanes; the same models checked on x86 at avx2/avxvnni. Tile remainders (1..9 rows,
/// 1..7 tokens), float lengths off the vector width, scales across f16's
/// range.
#[test]
fn avx2_order_levels_are_bit_identical() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let neon = [SimdLevel::Neon, SimdLevel::NeonDot, SimdLevel::NeonI8mm];
    let avx2_order = [SimdLevel::Avx2, SimdLevel::AvxVnni, SimdLevel::Neon, SimdLevel::NeonDot, SimdLevel::NeonI8mm];
    type Model = fn(GgmlType, &[u8], &[u8], usize) -> f32;
    let cases: [(GgmlType, Model, &[SimdLevel]); 13] = [
        (GgmlType::Q2_K, |_, w, a, n| ggml_avx2_q2_k(w, a, n), &avx2_order),
        (GgmlType::Q3_K, |_, w, a, n| ggml_avx2_q3_k(w, a, n), &avx2_order),
        (GgmlType::Q4_K, |_, w, a, n| row_lane_q4_k(w, a, n), &avx2_order),
        (GgmlType::Q5_K, |_, w, a, n| ggml_avx2_q5_k(w, a, n), &avx2_order),
        (GgmlType::Q5_0, ggml_avx2_block, &avx2_order),
        (GgmlType::Q5_1, ggml_avx2_block, &avx2_order),
        (GgmlType::Q6_K, |_, w, a, n| ggml_avx2_q6_k(w, a, n), &avx2_order),
        (GgmlType::Q4_0, row_lane_dot, &avx2_order),
        (GgmlType::Q8_0, ggml_avx2_block, &neon),
        (GgmlType::Q4_1, ggml_avx2_block, &neon),
        (GgmlType::F32, float8_dot, &avx2_order),
        (GgmlType::F16, float8_dot, &avx2_order),
        (GgmlType::BF16, float8_dot, &avx2_order),
    ];
    for (wty, model, on) in cases {
        for &level in on {
            let Some(k) = Kernels::for_level(level) else { continue };
            for case in 0..40 {
                let (rows, tokens) = (1 + case % 9, 1 + case % 7);
                let cols = match wty.block_size() {
                    1 => 32 * (1 + case % 5) - case % 11,
                    256 => 256 * (1 + case % 3),
                    _ => 32 * (1 + case % 7),
                };
                let aty = vec_dot_type(wty);
                let wrb = nbytes(wty, cols);
                let w: Vec<u8> = (0..rows).flat_map(|_| raw_row(wty, cols, &mut rng, false)).collect();
                let a: Vec<u8> = (0..tokens).flat_map(|_| raw_row(aty, cols, &mut rng, false)).collect();
                let (ka, karb) = level_acts(k, wty, &a, cols);
                let sums = act_sums(k, wty, &ka, karb, cols);
                let p = Panel {
                    wty,
                    w: &w,
                    row_stride: wrb,
                    n_rows: rows,
                    cols,
                    act: &ka,
                    act_stride: karb,
                    n_tokens: tokens,
                    act_sums: &sums,
                };
                let mut out = vec![f32::NAN; rows * tokens];
                (k.panel(wty).unwrap())(&p, &mut out);
                for t in 0..tokens {
                    for r in 0..rows {
                        let want = model(wty, &w[r * wrb..][..wrb], &ka[t * karb..][..karb], cols);
                        let got = out[t * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{level:?} {wty} case {case} r{r} t{t} ({rows}x{tokens}, {cols} cols): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
