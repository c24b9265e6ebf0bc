//! NEON block formats in ggml's AVX2 order (the x86 avx2 level's `Q8_0`,
//! `Q4_1`, `F32`, `F16`, `BF16`): per (row, token) eight f32 lanes, as two
//! 128-bit vectors `lo ‖ hi`. Lane k of a 32-element block sums elements
//! 4k..4k+3 exactly, then `acc[k] = fma(d_w * d_a, float(sum), acc[k])`;
//! `hsum_float_8` at the end; Q4_1's `m_w * s_a` terms summed apart (fused)
//! and added last. Float rows: one fma per element into lane `i mod 8`, the
//! same reduction, and the sequential tail. So each dot is bit-identical to
//! the avx2 level's, and to llama.cpp's AVX2 build for the block formats.

use super::int_dot::IntDot;
use super::tile::{hsum8, Fmt};
use crate::arch::f16::f16_at;
use crate::arch::tail::{rd_bf16, rd_f16, rd_f32, tail_dot};
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// The 16 bytes at `p`.
#[inline(always)]
unsafe fn load16(p: *const u8) -> int8x16_t {
    vld1q_s8(p as *const i8)
}

/// `acc + float(i) * d` in each lane, fused.
#[inline(always)]
unsafe fn fma_block(acc: float32x4_t, i: int32x4_t, d: f32) -> float32x4_t {
    vfmaq_f32(acc, vcvtq_f32_s32(i), vdupq_n_f32(d))
}

/// Q8_0 weights × Q8_0 activations.
pub(super) struct Q8_0<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q8_0<D> {
    const EPB: usize = 32;
    const WB: usize = 34;
    const AB: usize = 34;
    /// (elements 0..16, 16..32, d)
    type W = (int8x16_t, int8x16_t, f32);
    type A = (int8x16_t, int8x16_t, f32);
    /// lanes 0..4, 4..8
    type Acc = (float32x4_t, float32x4_t);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0))
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (load16(p.add(2)), load16(p.add(18)), f16_at(p))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (load16(p.add(2)), load16(p.add(18)), f16_at(p))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (d, z) = (w.2 * a.2, vdupq_n_s32(0));
        (fma_block(acc.0, D::dot(z, w.0, a.0), d), fma_block(acc.1, D::dot(z, w.1, a.1), d))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1)
    }
}

/// Q4_1 weights × Q8_1 activations: `d_w d_a sumi + m_w s_a` per block.
pub(super) struct Q4_1<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q4_1<D> {
    const EPB: usize = 32;
    const WB: usize = 20;
    const AB: usize = 36;
    /// (elements 0..16 (low nibbles), 16..32 (high nibbles), d, m)
    type W = (int8x16_t, int8x16_t, f32, f32);
    /// (elements 0..16, 16..32, d, s)
    type A = (int8x16_t, int8x16_t, f32, f32);
    /// (lanes 0..4, lanes 4..8, sum of m_w s_a)
    type Acc = (float32x4_t, float32x4_t, f32);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (vdupq_n_f32(0.0), vdupq_n_f32(0.0), 0.0)
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let q = vld1q_u8(p.add(4));
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
        (lo, hi, f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (load16(p.add(4)), load16(p.add(20)), f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (d, z) = (w.2 * a.2, vdupq_n_s32(0));
        (fma_block(acc.0, D::dot(z, w.0, a.0), d), fma_block(acc.1, D::dot(z, w.1, a.1), d), w.3.mul_add(a.3, acc.2))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum8(acc.0, acc.1) + acc.2
    }
}

/// 8 f16 at `p` as f32, exact (`fcvtl`, `fcvtl2`: base ARMv8-A; by inline
/// assembly because stable Rust has no f16 vector type yet).
#[inline(always)]
unsafe fn load_f16(p: *const u8) -> (float32x4_t, float32x4_t) {
    let h = vld1q_u16(p as *const u16);
    let (lo, hi): (float32x4_t, float32x4_t);
    std::arch::asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags)
    );
    (lo, hi)
}

/// 8 f32 at `p`.
#[inline(always)]
unsafe fn load_f32(p: *const u8) -> (float32x4_t, float32x4_t) {
    let p = p as *const f32;
    (vld1q_f32(p), vld1q_f32(p.add(4)))
}

/// 8 bf16 at `p` as f32 (the bits shifted up: exact).
#[inline(always)]
unsafe fn load_bf16(p: *const u8) -> (float32x4_t, float32x4_t) {
    let h = vld1q_u16(p as *const u16);
    (vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))), vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)))
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
            type W = (float32x4_t, float32x4_t);
            type A = (float32x4_t, float32x4_t);
            type Acc = (float32x4_t, float32x4_t);
            #[inline(always)]
            unsafe fn zero() -> Self::Acc {
                (vdupq_n_f32(0.0), vdupq_n_f32(0.0))
            }
            #[inline(always)]
            unsafe fn load_w(p: *const u8) -> Self::W {
                $wload(p)
            }
            #[inline(always)]
            unsafe fn load_a(p: *const u8) -> Self::A {
                $aload(p)
            }
            #[inline(always)]
            unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
                (vfmaq_f32(acc.0, w.0, a.0), vfmaq_f32(acc.1, w.1, a.1))
            }
            #[inline(always)]
            unsafe fn finish(acc: Self::Acc) -> f32 {
                hsum8(acc.0, acc.1)
            }
            #[inline(always)]
            unsafe fn tail(w: *const u8, a: *const u8, n: usize) -> f32 {
                let (w, a) = (std::slice::from_raw_parts(w, n * $wsz), std::slice::from_raw_parts(a, n * $asz));
                tail_dot(n, |i| $wrd(w, i), |i| $ard(a, i))
            }
        }
    };
}

float_fmt!(
    /// F32 weights × f32 activations.
    F32, (4, load_f32, rd_f32), (4, load_f32, rd_f32)
);
float_fmt!(
    /// F16 weights × f32 activations holding f16-rounded values
    /// (`Kernels::act_type`), as at the x86 levels.
    F16, (2, load_f16, rd_f16), (4, load_f32, rd_f32)
);
float_fmt!(
    /// BF16 weights × bf16 activations.
    BF16, (2, load_bf16, rd_bf16), (2, load_bf16, rd_bf16)
);

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
