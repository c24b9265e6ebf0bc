//! Cross-type properties of the reference implementation.

use super::*;
use proptest::prelude::*;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
];

fn bytes(ty: GgmlType, n: usize) -> Vec<u8> {
    vec![0u8; ty.row_bytes(n as u64).unwrap() as usize]
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut b = bytes(ty, x.len());
    quantize_row(ty, x, &mut b).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &b, &mut y).unwrap();
    y
}

const F16_ULP: f32 = 1.0 / (1 << 25) as f32 * 1.01;

/// Largest error each format allows for one element of block `blk`.
fn bound(ty: GgmlType, blk: &[f32]) -> f32 {
    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let min = blk.iter().fold(f32::MAX, |m, &v| m.min(v));
    let max = blk.iter().fold(-f32::MAX, |m, &v| m.max(v));
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => amax * 1e-3 + 6e-8,
        GgmlType::BF16 => amax * 8e-3,
        // Half a step, plus f16 rounding of d (up to 127 steps away).
        // f16 subnormals (below 6.1e-5) round d to a multiple of 2^-24: F16_ULP per step.
        GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 127.0 * 0.57 + 127.0 * F16_ULP,
        // The value opposite the signed maximum is clamped from 16 to 15: one step.
        GgmlType::Q4_0 => amax / 8.0 * 1.01 + 8.0 * F16_ULP,
        GgmlType::Q4_1 => (max - min) / 15.0 * 0.52 + min.abs() * 1e-3 + 16.0 * F16_ULP,
        GgmlType::Q5_0 => amax / 16.0 * 1.01 + 16.0 * F16_ULP,
        GgmlType::Q5_1 => (max - min) / 31.0 * 0.52 + min.abs() * 1e-3 + 32.0 * F16_ULP,
        _ => unreachable!(),
    }
}

fn vecs() -> impl Strategy<Value = Vec<f32>> {
    (1usize..6, -3i32..4).prop_flat_map(|(nb, e)| {
        let s = 10f32.powi(e);
        prop::collection::vec(-1f32..1f32, nb * 32).prop_map(move |v| v.iter().map(|x| x * s).collect())
    })
}

proptest! {
    #[test]
    fn quantize_dequantize_error_is_bounded(x in vecs()) {
        for ty in TYPES {
            let y = round_trip(ty, &x);
            for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
                let b = bound(ty, bx);
                for (a, c) in bx.iter().zip(by) {
                    prop_assert!((a - c).abs() <= b, "{ty}: {a} -> {c} (bound {b})");
                }
            }
        }
    }

    #[test]
    fn reference_dot_matches_f64_on_dequantized(w in vecs(), seed in any::<u64>()) {
        let n = w.len();
        // An independent activation vector from the seed.
        let mut s = seed | 1;
        let a: Vec<f32> = (0..n).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s % 2001) as f32 / 1000.0 - 1.0 }).collect();
        for wty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
            let aty = vec_dot_type(wty);
            let mut wb = bytes(wty, n);
            let mut ab = bytes(aty, n);
            quantize_row(wty, &w, &mut wb).unwrap();
            quantize_row(aty, &a, &mut ab).unwrap();
            let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(wty, &wb, &mut wd).unwrap();
            dequantize_row(aty, &ab, &mut ad).unwrap();
            let exact: f64 = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
            let mag: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
            // Q4_1 uses the f16-rounded s = d*sum(q) of each Q8_1 block.
            let mut slack = 0f64;
            if wty == GgmlType::Q4_1 || wty == GgmlType::Q5_1 {
                for (i, blk) in wb.chunks(wty.type_size()).enumerate() {
                    let m = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32() as f64;
                    let s = BlockQ8_1::read(&ab[i * 36..]).s.to_f32() as f64;
                    slack += (m * s).abs() * 1e-3;
                }
            }
            let got = vec_dot(wty, &wb, &ab, n).unwrap() as f64;
            prop_assert!((got - exact).abs() <= 1e-5 * mag + slack + 1e-30, "{wty}: {got} vs {exact} (mag {mag})");
        }
    }
}

#[test]
fn all_zero_rows() {
    for ty in TYPES {
        let y = round_trip(ty, &[0f32; 64]);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn extreme_values_do_not_overflow_blocks() {
    // f16's largest finite value as the block maximum.
    let mut x = [0f32; 32];
    x[3] = 65504.0 * 127.0;
    x[4] = -1.0;
    let y = round_trip(GgmlType::Q8_0, &x);
    assert_eq!(y[3], 65504.0 * 127.0);
    // Q4_0's d = max / -8 must fit f16 too.
    x[3] = 65504.0 * 8.0;
    let y = round_trip(GgmlType::Q4_0, &x);
    assert_eq!(y[3], x[3]);
}

#[test]
fn errors_name_the_problem() {
    let mut out = [0f32; 32];
    let mut out256 = [0f32; 256];
    let e = dequantize_row(GgmlType::IQ4_XS, &[0u8; 136], &mut out256).unwrap_err();
    assert!(e.to_string().contains("iq4_xs"), "{e}");
    let e = dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert_eq!(e.to_string(), "src has length 17, expected 18");
    let e = quantize_row(GgmlType::Q8_0, &[0f32; 33], &mut [0u8; 68]).unwrap_err();
    assert!(matches!(e.kind(), QuantErrorKind::NotBlockMultiple { n: 33, .. }));
    let e = vec_dot(GgmlType::Q4_1, &[0u8; 20], &[0u8; 34], 32).unwrap_err();
    assert!(e.to_string().starts_with("act"), "{e}");
}

#[test]
fn vec_dot_types_follow_ggml() {
    assert_eq!(vec_dot_type(GgmlType::Q4_0), GgmlType::Q8_0);
    assert_eq!(vec_dot_type(GgmlType::Q4_1), GgmlType::Q8_1);
    assert_eq!(vec_dot_type(GgmlType::Q5_1), GgmlType::Q8_1);
    assert_eq!(vec_dot_type(GgmlType::Q8_0), GgmlType::Q8_0);
    assert_eq!(vec_dot_type(GgmlType::Q4_K), GgmlType::Q8_K);
    assert_eq!(vec_dot_type(GgmlType::F16), GgmlType::F16);
    assert_eq!(vec_dot_type(GgmlType::BF16), GgmlType::BF16);
}

#[test]
fn q8_0_dot_of_known_blocks() {
    // w = 1..=32 quantized with d = 32/127, a = all ones: exact integer sums.
    let w: Vec<f32> = (1..=32).map(|i| i as f32).collect();
    let mut wb = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &w, &mut wb).unwrap();
    let mut ab = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &[1f32; 32], &mut ab).unwrap();
    assert!(ab[2..].iter().all(|&q| q == 127));
    let got = vec_dot(GgmlType::Q8_0, &wb, &ab, 32).unwrap();
    assert!((got - 528.0).abs() < 528.0 * 5e-3, "{got}");
}

// ---- K-quants -------------------------------------------------------------

const KTYPES: [GgmlType; 6] = [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K];

/// (largest error / super-block amax, RMS error / RMS of x) each K type allows.
fn k_bounds(ty: GgmlType) -> (f32, f32) {
    match ty {
        // Observed on uniform data: 0.37/0.23, 0.25/0.12, 0.086/0.055, 0.049/0.028, 0.016/0.013.
        GgmlType::Q2_K => (0.55, 0.33),
        GgmlType::Q3_K => (0.38, 0.18),
        GgmlType::Q4_K => (0.13, 0.08),
        GgmlType::Q5_K => (0.075, 0.04),
        GgmlType::Q6_K => (0.025, 0.02),
        GgmlType::Q8_K => (0.5 / 127.0 * 1.001, 0.01),
        _ => unreachable!(),
    }
}

fn kvecs() -> impl Strategy<Value = Vec<f32>> {
    (1usize..3, -1i32..3, any::<bool>()).prop_flat_map(|(nb, e, skew)| {
        let s = 10f32.powi(e);
        prop::collection::vec(-1f32..1f32, nb * QK_K).prop_map(move |v| {
            // `skew`: sub-blocks of very different magnitudes, one all positive.
            v.iter()
                .enumerate()
                .map(|(i, x)| if skew { (x + (i / 64 == 1) as u8 as f32) * s * (1 + (i / 32) % 4) as f32 } else { x * s })
                .collect()
        })
    })
}

fn xorshift_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s % 2001) as f32 / 1000.0 - 1.0 }).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn k_quantize_dequantize_error_is_bounded(x in kvecs()) {
        for ty in KTYPES {
            let y = round_trip(ty, &x);
            let (emax, erms) = k_bounds(ty);
            for (bx, by) in x.chunks(QK_K).zip(y.chunks(QK_K)) {
                let amax = bx.iter().fold(0f32, |m, v| m.max(v.abs()));
                let (mut se, mut sx) = (0f64, 0f64);
                for (a, c) in bx.iter().zip(by) {
                    prop_assert!((a - c).abs() <= emax * amax, "{ty}: {a} -> {c} (amax {amax})");
                    se += ((a - c) as f64).powi(2);
                    sx += (*a as f64).powi(2);
                }
                prop_assert!(se.sqrt() <= erms as f64 * sx.sqrt(), "{ty}: rms error {} of rms {}", se.sqrt(), sx.sqrt());
            }
        }
    }

    #[test]
    fn k_reference_dot_matches_f64_on_dequantized(w in kvecs(), seed in any::<u64>()) {
        let n = w.len();
        let a = xorshift_vec(seed, n);
        for wty in &KTYPES[..5] {
            let wty = *wty;
            let aty = vec_dot_type(wty);
            prop_assert_eq!(aty, GgmlType::Q8_K);
            let (mut wb, mut ab) = (bytes(wty, n), bytes(aty, n));
            quantize_row(wty, &w, &mut wb).unwrap();
            quantize_row(aty, &a, &mut ab).unwrap();
            let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(wty, &wb, &mut wd).unwrap();
            dequantize_row(aty, &ab, &mut ad).unwrap();
            let exact: f64 = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y as f64).sum();
            // Scale and minimum terms are summed apart and may cancel: bound by both.
            let mag: f64 = wd.iter().zip(&ad).map(|(&x, &y)| (x as f64).abs() * (y as f64).abs() * 3.0 + (w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 * y.abs() as f64)).sum();
            let got = vec_dot(wty, &wb, &ab, n).unwrap() as f64;
            prop_assert!((got - exact).abs() <= 1e-5 * mag, "{wty}: {got} vs {exact} (mag {mag})");
        }
    }
}

#[test]
fn k_all_zero_and_constant_blocks() {
    for ty in KTYPES {
        let mut b = bytes(ty, 512);
        quantize_row(ty, &[0f32; 512], &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0), "{ty}: zero input gives zero bytes");
        let y = round_trip(ty, &[0f32; 512]);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
        // A constant block, and a block with one huge value among tiny ones.
        let y = round_trip(ty, &[0.75f32; 256]);
        assert!(y.iter().all(|&v| (v - 0.75).abs() <= 0.75 * k_bounds(ty).0), "{ty}: {:?}", &y[..4]);
        let mut x = [1e-3f32; 256];
        x[77] = -3.0e4;
        let y = round_trip(ty, &x);
        assert!((y[77] + 3.0e4).abs() <= 3.0e4 * 0.01, "{ty}: {}", y[77]);
    }
}

#[test]
fn k_dot_of_known_blocks() {
    // Q6_K of a ramp against Q8_K of ones: the dot is d_a * sum(dequantized w) up to rounding.
    let w: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 64.0).collect();
    for wty in &KTYPES[..5] {
        let mut wb = bytes(*wty, 256);
        quantize_row(*wty, &w, &mut wb).unwrap();
        let mut ab = bytes(GgmlType::Q8_K, 256);
        quantize_row(GgmlType::Q8_K, &[1f32; 256], &mut ab).unwrap();
        let q = BlockQ8K::read(&ab);
        // max = 1: iscale = -127, q = -127, d = -1/127.
        assert_eq!(q.d, 1.0 / -127.0, "{wty}");
        assert!(q.qs.iter().all(|&v| v == -127) && q.bsums.iter().all(|&s| s == -16 * 127));
        let mut wd = vec![0f32; 256];
        dequantize_row(*wty, &wb, &mut wd).unwrap();
        let want: f32 = wd.iter().sum();
        let got = vec_dot(*wty, &wb, &ab, 256).unwrap();
        assert!((got - want).abs() <= 1e-3, "{wty}: {got} vs {want}");
    }
}


