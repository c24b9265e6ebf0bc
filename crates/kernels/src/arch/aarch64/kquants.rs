//! NEON K-quant formats in ggml's AVX2 order (the x86 avx2 level's Q2_K,
//! Q3_K, Q5_K, Q6_K; Q4_K is one row per lane, in `rows`): per (row, token)
//! eight f32 lanes as two 128-bit vectors; lane k of each 32-element group
//! sums elements 4k..4k+3 times their scale, exactly, over the super-block;
//! then `acc[k] = fma(d, float(sum), acc[k])` and `hsum_float_8` at the end.

use super::blocks::{fma_block, nibbles};
use super::int_dot::IntDot;
use super::rows::{k4_min_terms, k4_scales, k4_sub_sums};
use super::tile::{hsum8, Fmt};
use crate::arch::f16::f16_at;
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// `acc` plus, per lane, `scale` times the dot of `q` and the 16 activation
/// quants at `y`.
#[inline(always)]
unsafe fn scaled_dot<D: IntDot>(acc: int32x4_t, q: int8x16_t, y: *const u8, scale: i32) -> int32x4_t {
    vmlaq_n_s32(acc, D::dot(vdupq_n_s32(0), q, vld1q_s8(y as *const i8)), scale)
}

/// Lanes 0..4 and 4..8 of `[(x[2m] * y[2m] + x[2m + 1] * y[2m + 1])]` for 16 i16 pairs.
#[inline(always)]
unsafe fn pair_products(x: [int16x8_t; 2], y: [int16x8_t; 2]) -> (int32x4_t, int32x4_t) {
    let p = |x: int16x8_t, y: int16x8_t| vpaddq_s32(vmull_s16(vget_low_s16(x), vget_low_s16(y)), vmull_high_s16(x, y));
    (p(x[0], y[0]), p(x[1], y[1]))
}

/// The 16 block sums of a Q8_K block at `a` (two halves of 8).
#[inline(always)]
unsafe fn bsums(a: *const u8) -> [int16x8_t; 2] {
    let b = a.add(260) as *const i16;
    [vld1q_s16(b), vld1q_s16(b.add(8))]
}

/// 16 i8 → two halves of 8 i16.
#[inline(always)]
unsafe fn widen(v: int8x16_t) -> [int16x8_t; 2] {
    [vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v)]
}

/// Q2_K weights × Q8_K activations (model: `tests::ggml_avx2_q2_k`): the
/// min terms (`mins[2m]·bsums[2m] + mins[2m+1]·bsums[2m+1]` in lane m) go
/// into the lanes first, `fma(-d_a·dmin, ..)`, then the scale terms.
pub(super) struct Q2K<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q2K<D> {
    const EPB: usize = 256;
    const WB: usize = 84;
    const AB: usize = 292;
    /// (block pointer, d, dmin)
    type W = (*const u8, f32, f32);
    type A = (*const u8, f32);
    type Acc = (float32x4_t, float32x4_t);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0))
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (p, f16_at(p.add(80)), f16_at(p.add(82)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let ((wp, wd, wdmin), (ap, ad)) = (w, a);
        // Scales: low nibbles (0..15); mins: high nibbles.
        let s = vld1q_u8(wp);
        let mins = widen(vreinterpretq_s8_u8(vshrq_n_u8::<4>(s)));
        let (m_lo, m_hi) = pair_products(mins, bsums(ap));
        let dmin = -ad * wdmin;
        let acc = (fma_block(acc.0, m_lo, dmin), fma_block(acc.1, m_hi, dmin));
        let mut sc = [0u8; 16];
        vst1q_u8(sc.as_mut_ptr(), vandq_u8(s, vdupq_n_u8(0x0f)));
        let (m3, z) = (vdupq_n_u8(3), vdupq_n_s32(0));
        let mut lanes = [z, z];
        // Element e = 128j + 32k + l: bits 2k of qs[32j + l], scale e / 16.
        for j in 0..2 {
            for (h, lanes) in lanes.iter_mut().enumerate() {
                let q2 = vld1q_u8(wp.add(16 + 32 * j + 16 * h));
                for k in 0..4 {
                    let q = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q2, vdupq_n_s8(-2 * k as i8)), m3));
                    *lanes = scaled_dot::<D>(*lanes, q, ap.add(4 + 128 * j + 32 * k + 16 * h), sc[8 * j + 2 * k + h] as i32);
                }
            }
        }
        let d = ad * wd;
        (fma_block(acc.0, lanes[0], d), fma_block(acc.1, lanes[1], d))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1)
    }
}

/// Q3_K weights × Q8_K activations (model: `tests::ggml_avx2_q3_k`): the
/// quants `(2 bits) - 4` where the hmask bit is clear, 16 scales `s - 32`.
pub(super) struct Q3K<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q3K<D> {
    const EPB: usize = 256;
    const WB: usize = 110;
    const AB: usize = 292;
    /// (block pointer, d)
    type W = (*const u8, f32);
    type A = (*const u8, f32);
    type Acc = (float32x4_t, float32x4_t);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0))
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (p, f16_at(p.add(108)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let ((wp, wd), (ap, ad)) = (w, a);
        let sc = hearth_quant::k::q3_k_scales(&std::ptr::read_unaligned(wp.add(96) as *const [u8; 12]));
        let (m3, one, z) = (vdupq_n_u8(3), vdupq_n_u8(1), vdupq_n_s32(0));
        let mut lanes = [z, z];
        // Element e = 128j + 32k + l: bits 2k of qs[32j + l], minus 4 unless
        // bit 4j + k of hmask[l] is set; scale e / 16.
        for (h, lanes) in lanes.iter_mut().enumerate() {
            let clear = vmvnq_u8(vld1q_u8(wp.add(16 * h)));
            for j in 0..2 {
                let q3 = vld1q_u8(wp.add(32 + 32 * j + 16 * h));
                for k in 0..4 {
                    let lo = vandq_u8(vshlq_u8(q3, vdupq_n_s8(-2 * k as i8)), m3);
                    let high = vshlq_n_u8::<2>(vandq_u8(vshlq_u8(clear, vdupq_n_s8(-((4 * j + k) as i8))), one));
                    let q = vsubq_s8(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(high));
                    let s = sc[8 * j + 2 * k + h] as i32 - 32;
                    *lanes = scaled_dot::<D>(*lanes, q, ap.add(4 + 128 * j + 32 * k + 16 * h), s);
                }
            }
        }
        let d = ad * wd;
        (fma_block(acc.0, lanes[0], d), fma_block(acc.1, lanes[1], d))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1)
    }
}

/// Q5_K weights × Q8_K activations in ggml's AVX2 order: lane k of each
/// 32-element sub-block j takes elements 4k..4k+3 times scale j; the min
/// terms are one exact integer per block, `summs = fma(-d_a * dmin_w,
/// float(sum), summs)`, added after the lanes' sum.
pub(super) struct Q5K<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q5K<D> {
    const EPB: usize = 256;
    const WB: usize = 176;
    const AB: usize = 292;
    /// (block pointer, d, dmin)
    type W = (*const u8, f32, f32);
    type A = (*const u8, f32);
    /// (lanes 0..4, lanes 4..8, min terms)
    type Acc = (float32x4_t, float32x4_t, f32);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0), 0.0)
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (p, f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let ((wp, wd, wdmin), (ap, ad)) = (w, a);
        let (sc, mn) = k4_scales(wp.add(4));
        let summs = (-ad * wdmin).mul_add(vaddvq_s32(k4_min_terms(mn, k4_sub_sums(ap))) as f32, acc.2);
        let (one, z) = (vdupq_n_u8(1), vdupq_n_s32(0));
        let (mut lo, mut hi) = (z, z);
        for half in 0..2 {
            // Elements l in 16 * half .. 16 * half + 16 of each sub-block.
            let qh = vld1q_u8(wp.add(16 + 16 * half));
            for j in 0..4 {
                let (l, h) = nibbles(wp.add(48 + 32 * j + 16 * half));
                // Sub-block 2j: low nibbles and bit 2j of qh; 2j + 1: high nibbles, bit 2j + 1.
                let b0 = vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * j as i8)), one));
                let b1 = vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, vdupq_n_s8(-(2 * j as i8) - 1)), one));
                let y = ap.add(4 + 64 * j + 16 * half);
                let dl = D::dot(z, vreinterpretq_s8_u8(vorrq_u8(l, b0)), vld1q_s8(y as *const i8));
                let dh = D::dot(z, vreinterpretq_s8_u8(vorrq_u8(h, b1)), vld1q_s8(y.add(32) as *const i8));
                let s = vmlaq_n_s32(vmlaq_n_s32(z, dl, sc[2 * j]), dh, sc[2 * j + 1]);
                if half == 0 {
                    lo = vaddq_s32(lo, s);
                } else {
                    hi = vaddq_s32(hi, s);
                }
            }
        }
        let d = ad * wd;
        (fma_block(acc.0, lo, d), fma_block(acc.1, hi, d), summs)
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1) + acc.2
    }
}

/// Q6_K weights × Q8_K activations in ggml's AVX2 order (model:
/// `tests::ggml_avx2_q6_k`): lane k of each 32-element group takes elements
/// 4k..4k+3 times their 16-element scale, the quants unsigned (0..63); the
/// −32 offset comes off per lane at the end of the block, from the
/// activations' block sums (lane k: sub-blocks 2k and 2k+1, `q8sclsub`).
pub(super) struct Q6K<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q6K<D> {
    const EPB: usize = 256;
    const WB: usize = 210;
    const AB: usize = 292;
    /// (block pointer, d)
    type W = (*const u8, f32);
    type A = (*const u8, f32);
    type Acc = (float32x4_t, float32x4_t);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0))
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (p, f16_at(p.add(208)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let ((wp, wd), (ap, ad)) = (w, a);
        let (m4, m3, z) = (vdupq_n_u8(0x0f), vdupq_n_u8(3), vdupq_n_s32(0));
        let sc = wp.add(192) as *const i8;
        let (mut lo, mut hi) = (z, z);
        // Element e = 128h + 32g + l: low 4 bits from ql[64h + 32(g % 2) + l]
        // (nibble g / 2), high 2 from qh[32h + l] (bits 2g, 2g + 1).
        for h in 0..2 {
            for half in 0..2 {
                // l in 16 * half .. 16 * half + 16
                let qh = vld1q_u8(wp.add(128 + 32 * h + 16 * half));
                let ql = [vld1q_u8(wp.add(64 * h + 16 * half)), vld1q_u8(wp.add(64 * h + 32 + 16 * half))];
                for g in 0..4 {
                    let low = if g < 2 { vandq_u8(ql[g], m4) } else { vshrq_n_u8::<4>(ql[g - 2]) };
                    let high = vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * g as i8)), m3));
                    let q = vreinterpretq_s8_u8(vorrq_u8(low, high));
                    let y = vld1q_s8(ap.add(4 + 128 * h + 32 * g + 16 * half) as *const i8);
                    // Group 4h + g's scale for its 16-element half.
                    let s = *sc.add(8 * h + 2 * g + half) as i32;
                    let d = D::dot(z, q, y);
                    if half == 0 {
                        lo = vmlaq_n_s32(lo, d, s);
                    } else {
                        hi = vmlaq_n_s32(hi, d, s);
                    }
                }
            }
        }
        // Lane k: (scale * bsum) of sub-blocks 2k and 2k + 1, times 32.
        let scales = vld1q_s8(sc);
        let (s_lo, s_hi) = (vmovl_s8(vget_low_s8(scales)), vmovl_high_s8(scales));
        let bs = ap.add(260) as *const i16;
        let (b_lo, b_hi) = (vld1q_s16(bs), vld1q_s16(bs.add(8)));
        let off_lo = vpaddq_s32(vmull_s16(vget_low_s16(s_lo), vget_low_s16(b_lo)), vmull_high_s16(s_lo, b_lo));
        let off_hi = vpaddq_s32(vmull_s16(vget_low_s16(s_hi), vget_low_s16(b_hi)), vmull_high_s16(s_hi, b_hi));
        let lo = vsubq_s32(lo, vshlq_n_s32::<5>(off_lo));
        let hi = vsubq_s32(hi, vshlq_n_s32::<5>(off_hi));
        let d = ad * wd;
        (fma_block(acc.0, lo, d), fma_block(acc.1, hi, d))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1)
    }
}
