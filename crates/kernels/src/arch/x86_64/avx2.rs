//! AVX2 + FMA + F16C kernels (Q4_0 and Q4_K weights are in `avx2_rows`,
//! Q5_x, Q5_K and Q6_K in `avx2_k`, Q2_K and Q3_K in `avx2_k_low`).
//!
//! Integer dots use ggml's `_mm256_maddubs_epi16` (u8 × i8 → pairs of i16)
//! then `_mm256_madd_epi16` with ones (→ 8 × i32). Q4 nibbles (0..15) are the
//! unsigned operand. Q8_0 weights use the sign trick (`|w|`, `sign(a, w)`): like ggml, a weight
//! of -128 against an activation of ±128 could saturate, which
//! `quantize_row_q8_0` never produces (it stays within ±127).
//!
//! Float arithmetic per (row, token) is ggml's `ggml_vec_dot_*_q8_*` AVX2 order:
//! 8 lanes of 4-byte integer sums, `acc = fma(d_w·d_a, float(sumi), acc)` block by
//! block, the `hsum_float_8` reduction, and Q4_1's `m_w·s_a` summed apart and added
//! last. Integer sums are exact, so each dot is bit-identical to llama.cpp's: that
//! keeps activation re-quantization (where one rounding flip moves a value by a
//! whole step) from making our logits drift from llama.cpp's.

use super::avx2_k;
use super::avx2_k_low;
use super::avx2_q8;
use super::avx2_rows;
use super::int_dot::{IntDot, Madd};
use super::tile::{f16_at, hsum256, run_matvec, run_panel, tail_dot, Fmt};
use crate::arch::tail::{rd_bf16, rd_f16, rd_f32};
use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::GgmlType;
use std::arch::x86_64::*;
use std::marker::PhantomData;

pub(super) static KERNELS: Kernels = Kernels {
    level: SimdLevel::Avx2,
    // Q4_0, Q4_K: one row per lane, llama.cpp's repacked order (see `avx2_rows`).
    row_lanes: &[GgmlType::Q4_0, GgmlType::Q4_K],
    quantize_q8_0,
    quantize_q8_1,
    quantize_f16,
    quantize_q8_k,
    panel_q4_0: avx2_rows::panel_q4_0,
    panel_q4_1: block_panel::<Q4_1<Madd>, avx2_q8::Q4_1>,
    panel_q8_0: block_panel::<Q8_0<Madd>, avx2_q8::Q8_0>,
    panel_f32: |p, o| panel::<F32, 2, 4>(p, o, GgmlType::F32),
    // F16 × f16 activations, both converted as they are loaded (12
    // accumulators + 2 weights + 1 activation of the 16 registers). The avx512
    // level reads f32 activations holding the same f16-rounded values, which
    // spares the activations' converts but doubles their bytes: 6 tokens of a
    // 1536-column row (SmolLM2's down) are then 36 KiB, more than a 32 KiB L1,
    // and the tile streamed them from L2 for every pair of rows. With f16
    // activations, on Zen 3 (`cargo bench -p hearth-kernels --bench prefill --
    // T 7 512 f16/avx2`, two interleaved runs each): SmolLM2's layer 76 -> 80-83
    // GFLOP/s at 1 thread and 138-139 -> 159-162 at 2, its down alone 65-67 ->
    // 84-88, a 1B layer 60-63 -> 77-83 and 121-122 -> 165-167. The same results,
    // bit for bit: the activations are the same f16 values either way.
    panel_f16: |p, o| panel::<F16, 2, 6>(p, o, GgmlType::F16),
    panel_bf16: |p, o| panel::<BF16, 2, 4>(p, o, GgmlType::BF16),
    panel_q5_0: block_panel::<avx2_k::Q5_0<Madd>, avx2_q8::Q5_0>,
    panel_q5_1: block_panel::<avx2_k::Q5_1<Madd>, avx2_q8::Q5_1>,
    panel_q4_k: avx2_rows::panel_q4_k,
    panel_q6_k: |p, o| panel::<avx2_k::Q6K, 2, 4>(p, o, GgmlType::Q8_K),
    panel_q4_0x8: avx2_rows::panel_q4_0x8,
    panel_q4_kx8: avx2_rows::panel_q4_kx8,
    panel_q5_k: |p, o| panel::<avx2_k::Q5K, 2, 4>(p, o, GgmlType::Q8_K),
    panel_q2_k: |p, o| panel::<avx2_k_low::Q2K, 2, 4>(p, o, GgmlType::Q8_K),
    panel_q3_k: |p, o| panel::<avx2_k_low::Q3K, 2, 4>(p, o, GgmlType::Q8_K),
};

#[inline(always)]
fn panel<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: this table is only handed out when AVX2, FMA and F16C were
    // detected, and `check` bounds every access of the panel.
    unsafe { panel_avx2::<F, R, T>(p, out) }
}

/// The panel in the 256-bit tiles: 4 rows for a matvec (one activation step
/// shared by more rows), R rows × T tokens otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_avx2<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    if p.n_tokens == 1 {
        run_matvec::<F>(p, out)
    } else {
        run_panel::<F, R, T>(p, out)
    }
}

/// A Q8_0, Q5_0, Q4_1 or Q5_1 panel: checks bounds first.
fn block_panel<F: Fmt, B: avx2_q8::Block>(p: &Panel<'_>, out: &mut [f32]) {
    p.check(avx2_q8::act_type::<B>(), out);
    // SAFETY: as `panel`.
    unsafe { block_panel_avx2::<F, B>(p, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_panel_avx2<F: Fmt, B: avx2_q8::Block>(p: &Panel<'_>, out: &mut [f32]) {
    block_tiles::<F, B, Madd>(p, out)
}

/// A panel of one of `avx2_q8`'s formats at the 256-bit levels: the generic
/// 4-row tile of `F` for a matvec, `avx2_q8`'s tiles of `B` for several
/// tokens (the same format: the same bits).
#[inline(always)]
pub(super) unsafe fn block_tiles<F: Fmt, B: avx2_q8::Block, D: IntDot>(p: &Panel<'_>, out: &mut [f32]) {
    if p.n_tokens == 1 {
        run_matvec::<F>(p, out)
    } else {
        avx2_q8::run::<B, D>(p, out)
    }
}

/// 16 bytes of nibbles → 32 bytes: element j (low nibble of byte j) in byte
/// j, element j+16 (high nibble) in byte j+16.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    // Broadcast-load (no shuffle µop), shift only the upper half by 4.
    let qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    _mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f))
}

/// Q4_1 weights × Q8_1 activations: `d_w d_a sumi + m_w s_a` per block; the
/// `m_w s_a` terms go to lane 0 of a second accumulator, added after the horizontal sum.
pub(super) struct Q4_1<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q4_1<D> {
    const EPB: usize = 32;
    const WB: usize = 20;
    const AB: usize = 36;
    /// (nibbles, d, [m, 0, ..])
    type W = (__m256i, __m256, __m256);
    /// (q, d, s)
    type A = (__m256i, __m256, __m256);
    /// (d_w·d_a·sumi lanes, m_w·s_a in lane 0): summed apart, as ggml sums `summs`.
    type Acc = (__m256, __m256);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let m = _mm256_setr_ps(f16_at(p.add(2)), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        (nibbles(p.add(4)), _mm256_set1_ps(f16_at(p)), m)
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        let q = _mm256_loadu_si256(p.add(4) as *const __m256i);
        (q, _mm256_set1_ps(f16_at(p)), _mm256_set1_ps(f16_at(p.add(2))))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let i = D::dot(w.0, a.0);
        (_mm256_fmadd_ps(_mm256_mul_ps(w.1, a.1), _mm256_cvtepi32_ps(i), acc.0), _mm256_fmadd_ps(w.2, a.2, acc.1))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum256(acc.0) + _mm256_cvtss_f32(acc.1)
    }
}

/// Q8_0 weights × Q8_0 activations (sign trick).
pub(super) struct Q8_0<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q8_0<D> {
    const EPB: usize = 32;
    const WB: usize = 34;
    const AB: usize = 34;
    /// (w, |w|, d)
    type W = (__m256i, __m256i, __m256);
    /// (q, d)
    type A = (__m256i, __m256);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
        (q, _mm256_abs_epi8(q), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (_mm256_loadu_si256(p.add(2) as *const __m256i), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let i = D::dot(w.1, _mm256_sign_epi8(a.0, w.0));
        _mm256_fmadd_ps(_mm256_mul_ps(w.2, a.1), _mm256_cvtepi32_ps(i), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}

/// A plain-float format, 8 lanes: weights of `$wsz` bytes per element read with
/// `$wload` / `$wrd` (tail), activations of `$asz` bytes with `$aload` / `$ard`.
macro_rules! float_fmt {
    ($(#[$doc:meta])* $name:ident, ($wsz:literal, $wload:expr, $wrd:path), ($asz:literal, $aload:expr, $ard:path)) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl Fmt for $name {
            const EPB: usize = 8;
            const WB: usize = 8 * $wsz;
            const AB: usize = 8 * $asz;
            const UNROLL_GROUPS: bool = true;
            type W = __m256;
            type A = __m256;
            type Acc = __m256;
            #[inline(always)]
            unsafe fn zero() -> __m256 {
                _mm256_setzero_ps()
            }
            #[inline(always)]
            unsafe fn load_w(p: *const u8) -> __m256 {
                $wload(p)
            }
            #[inline(always)]
            unsafe fn load_a(p: *const u8) -> __m256 {
                $aload(p)
            }
            #[inline(always)]
            unsafe fn pair(acc: __m256, w: __m256, a: __m256) -> __m256 {
                _mm256_fmadd_ps(w, a, acc)
            }
            #[inline(always)]
            unsafe fn finish(acc: __m256) -> f32 {
                hsum256(acc)
            }
            #[inline(always)]
            unsafe fn tail(w: *const u8, a: *const u8, n: usize) -> f32 {
                let (w, a) = (std::slice::from_raw_parts(w, n * $wsz), std::slice::from_raw_parts(a, n * $asz));
                tail_dot(n, |i| $wrd(w, i), |i| $ard(a, i))
            }
        }
    };
}

#[inline(always)]
unsafe fn load_f32(p: *const u8) -> __m256 {
    _mm256_loadu_ps(p as *const f32)
}
#[inline(always)]
unsafe fn load_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}
#[inline(always)]
unsafe fn load_bf16(p: *const u8) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i))))
}
float_fmt!(
    /// F32 weights × f32 activations.
    F32, (4, load_f32, rd_f32), (4, load_f32, rd_f32)
);
float_fmt!(
    /// F16 weights × f16 activations.
    F16, (2, load_f16, rd_f16), (2, load_f16, rd_f16)
);
float_fmt!(
    /// BF16 weights × bf16 activations.
    BF16, (2, load_bf16, rd_bf16), (2, load_bf16, rd_bf16)
);

// ---- activation quantization ----------------------------------------------

#[inline(always)]
unsafe fn q8_lanes(v: __m256, id: __m256) -> __m256i {
    _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id)))
}

/// One block of 32 f32 → (d, 32 × i8 stored at `q`, sum of the i8s), with the
/// arithmetic of ggml's x86 activation quantizer (`hearth_quant::q8::quantize_row_q8_0_act`):
/// `d = amax / 127`, `id = 127 / amax`, `q = round_half_even(x * id)`.
#[inline(always)]
unsafe fn q8_block(x: *const f32, q: *mut u8) -> (f32, i32) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let abs = _mm256_set1_ps(-0.0);
    let m = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(abs, v[0]), _mm256_andnot_ps(abs, v[1])),
        _mm256_max_ps(_mm256_andnot_ps(abs, v[2]), _mm256_andnot_ps(abs, v[3])),
    );
    let amax = hmax256(m);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let i = [q8_lanes(v[0], idv), q8_lanes(v[1], idv), q8_lanes(v[2], idv), q8_lanes(v[3], idv)];
    let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    _mm256_storeu_si256(q as *mut __m256i, pack_i8(i));
    (d, sum)
}

/// The largest of the 8 lanes (NaN-free input).
#[inline(always)]
unsafe fn hmax256(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// 4 × 8 i32 (each in -128..=127) → 32 i8 in element order (saturating packs
/// interleave 128-bit lanes; the permute restores the order).
#[inline(always)]
unsafe fn pack_i8(v: [__m256i; 4]) -> __m256i {
    let p8 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let (d, _) = q8_block(x.as_ptr(), out.as_mut_ptr().add(2));
        out[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_1_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(32).zip(dst.chunks_exact_mut(36)) {
        let (d, sum) = q8_block(x.as_ptr(), out.as_mut_ptr().add(4));
        out[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out[2..4].copy_from_slice(&half::f16::from_f32(sum as f32 * d).to_le_bytes());
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_f16_avx2(src: &[f32], dst: &mut [u8]) {
    let mut i = 0;
    while i + 8 <= src.len() {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        i += 8;
    }
    hearth_quant::float::quantize_row_f16(&src[i..], &mut dst[2 * i..]);
}

/// Q8_K activations, byte for byte `hearth_quant::k::quantize_row_q8_k` (ggml's
/// `quantize_row_q8_K_ref`, which its x86 build also uses): per 256 elements, `max` the
/// first element of greatest `|x|`, `iscale = -127 / max`, `q = min(nearest_int(iscale
/// · x), 127)` with the same f32 multiply and the same `+ 1.5·2^23` rounding, `d = 1 /
/// iscale`, and the sums of each 16 quants. The reference's scalar loop took 4.7 µs per
/// 4096 elements on Zen 3 (this one 1.3 µs, `quantize_act` in the matmul bench), as long
/// as 8 rows of the Q4_K decode kernel, on one thread while the others wait, once per
/// matmul input (docs/BENCHMARKS.md).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(src: &[f32], dst: &mut [u8]) {
    let abs = _mm256_set1_ps(-0.0);
    for (x, out) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let p = x.as_ptr();
        // max(|x|, m): a NaN lane keeps `m` (MAXPS returns its second operand when
        // either is NaN), as the reference's `>` skips NaNs.
        let mut m = _mm256_setzero_ps();
        for i in 0..32 {
            m = _mm256_max_ps(_mm256_andnot_ps(abs, _mm256_loadu_ps(p.add(8 * i))), m);
        }
        let amax = hmax256(m);
        if amax == 0.0 {
            out.fill(0);
            continue;
        }
        // The first element of that magnitude: its sign sets the scale's.
        let am = _mm256_set1_ps(amax);
        let first = (0..32)
            .find_map(|i| {
                let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(abs, _mm256_loadu_ps(p.add(8 * i))), am);
                let bits = _mm256_movemask_ps(eq);
                (bits != 0).then(|| 8 * i + bits.trailing_zeros() as usize)
            })
            .expect("amax is one of the block's magnitudes");
        let iscale = -127.0 / x[first];
        let is = _mm256_set1_ps(iscale);
        let (magic, mant, bias, top) =
            (_mm256_set1_ps(12582912.0), _mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000), _mm256_set1_epi32(127));
        // `nearest_int(iscale · x).min(127)`; every result is in -127..=127 (NaNs give
        // small non-negative ones), so `pack_i8`'s saturation keeps it as `as i8` would.
        let q = |i: usize| {
            let v = _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(p.add(8 * i))), magic);
            _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), bias), top)
        };
        let qs = out.as_mut_ptr().add(4);
        let mut bsums = [0i16; 16];
        for k in 0..8 {
            let v = [q(4 * k), q(4 * k + 1), q(4 * k + 2), q(4 * k + 3)];
            _mm256_storeu_si256(qs.add(32 * k) as *mut __m256i, pack_i8(v));
            bsums[2 * k] = hsum_epi32(_mm256_add_epi32(v[0], v[1])) as i16;
            bsums[2 * k + 1] = hsum_epi32(_mm256_add_epi32(v[2], v[3])) as i16;
        }
        out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for (o, s) in out[260..].chunks_exact_mut(2).zip(bsums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// The sum of the 8 i32 lanes.
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_hadd_epi32(s, s);
    _mm_cvtsi128_si32(_mm_hadd_epi32(s, s))
}

fn check_q(src: &[f32], dst: &[u8], bs: usize, ts: usize) {
    assert!(src.len().is_multiple_of(bs) && dst.len() >= src.len() / bs * ts, "quantize: bad lengths");
}

pub(super) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    check_q(src, dst, 32, 34);
    // SAFETY: AVX2/FMA/F16C detected before this table is used; lengths checked.
    unsafe { quantize_q8_0_avx2(src, dst) }
}

pub(super) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    check_q(src, dst, 32, 36);
    // SAFETY: as above.
    unsafe { quantize_q8_1_avx2(src, dst) }
}

pub(super) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    check_q(src, dst, 256, 292);
    // SAFETY: as above.
    unsafe { quantize_q8_k_avx2(src, dst) }
}

pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    check_q(src, dst, 1, 2);
    // SAFETY: as above.
    unsafe { quantize_f16_avx2(src, dst) }
}
