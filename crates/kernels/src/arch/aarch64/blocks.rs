//! NEON block formats in ggml's AVX2 order (the x86 avx2 level's Q8_0,
//! Q4_1, Q5_0, Q5_1, F32, F16, BF16; the K-quants in `kquants`): per (row, token) eight f32 lanes, as two
//! 128-bit vectors `lo ‖ hi`. Lane k of a 32-element block sums elements
//! 4k..4k+3 exactly, then `acc[k] = fma(d_w * d_a, float(sum), acc[k])`;
//! `hsum_float_8` at the end; the `m_w * s_a` terms of the formats with a
//! minimum summed apart (fused) and added last. Float rows: one fma per element into lane `i mod 8`, the
//! same reduction, and the sequential tail. So each dot is bit-identical to
//! the avx2 level's, and to llama.cpp's AVX2 build for the block formats.

use super::f16x8;
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
pub(super) unsafe fn fma_block(acc: float32x4_t, i: int32x4_t, d: f32) -> float32x4_t {
    vfmaq_f32(acc, vcvtq_f32_s32(i), vdupq_n_f32(d))
}

/// The 32 quants of a 32-element block as two halves of i8 (elements 0..16,
/// 16..32), its scale `d`, and its minimum `m` (0 for the symmetric types).
pub(super) trait Quants32 {
    /// Weight bytes per block.
    const WB: usize;
    /// Whether the block has a minimum (Q4_1, Q5_1): its activations are
    /// Q8_1 (`d`, `s = d * sum(q)`, quants from byte 4), and `m_w * s_a` is
    /// summed apart and added after the lanes' sum, as ggml does.
    const MIN: bool;
    unsafe fn load(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32);
}

/// Low nibbles (elements 0..16) and high nibbles (16..32) of the 16 bytes at `p`.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(p);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

/// The fifth bits of a Q5 block (the little-endian u32 at `p`, bit j for
/// element j) as 0x10 in the bytes of elements 0..16 and 16..32.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    let qh = std::ptr::read_unaligned(p as *const [u8; 4]);
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let set = |a: u8, b: u8| vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(a), vdup_n_u8(b)), bit), vdupq_n_u8(0x10));
    (set(qh[0], qh[1]), set(qh[2], qh[3]))
}

/// Q8_0: 32 i8 quants from byte 2.
pub(super) struct Q8_0W;
impl Quants32 for Q8_0W {
    const WB: usize = 34;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        (load16(p.add(2)), load16(p.add(18)), f16_at(p), 0.0)
    }
}

/// Q4_1: nibbles (0..15) from byte 4, d, m.
pub(super) struct Q4_1W;
impl Quants32 for Q4_1W {
    const WB: usize = 20;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let (lo, hi) = nibbles(p.add(4));
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), f16_at(p), f16_at(p.add(2)))
    }
}

/// Q5_0: nibbles from byte 6 with the fifth bits of bytes 2..6, minus 16.
pub(super) struct Q5_0W;
impl Quants32 for Q5_0W {
    const WB: usize = 22;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let ((lo, hi), (h0, h1)) = (nibbles(p.add(6)), fifth_bits(p.add(2)));
        let q = |n: uint8x16_t, h: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(n, h)), vdupq_n_s8(16));
        (q(lo, h0), q(hi, h1), f16_at(p), 0.0)
    }
}

/// Q5_1: nibbles from byte 8 with the fifth bits of bytes 4..8 (0..31), d, m.
pub(super) struct Q5_1W;
impl Quants32 for Q5_1W {
    const WB: usize = 24;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (int8x16_t, int8x16_t, f32, f32) {
        let ((lo, hi), (h0, h1)) = (nibbles(p.add(8)), fifth_bits(p.add(4)));
        (vreinterpretq_s8_u8(vorrq_u8(lo, h0)), vreinterpretq_s8_u8(vorrq_u8(hi, h1)), f16_at(p), f16_at(p.add(2)))
    }
}

/// A 32-element block format × Q8_0 (or, with a minimum, Q8_1) activations.
pub(super) struct Block<Q, D>(PhantomData<(Q, D)>);
impl<Q: Quants32, D: IntDot> Fmt for Block<Q, D> {
    const EPB: usize = 32;
    const WB: usize = Q::WB;
    const AB: usize = if Q::MIN { 36 } else { 34 };
    /// (elements 0..16, 16..32, d, m)
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
        Q::load(p)
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        if Q::MIN {
            (load16(p.add(4)), load16(p.add(20)), f16_at(p), f16_at(p.add(2)))
        } else {
            (load16(p.add(2)), load16(p.add(18)), f16_at(p), 0.0)
        }
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (d, z) = (w.2 * a.2, vdupq_n_s32(0));
        let summs = if Q::MIN { w.3.mul_add(a.3, acc.2) } else { 0.0 };
        (fma_block(acc.0, D::dot(z, w.0, a.0), d), fma_block(acc.1, D::dot(z, w.1, a.1), d), summs)
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        // (Not `+ 0.0` for the symmetric types: it would turn a -0.0 into +0.0.)
        if Q::MIN {
            hsum8(acc.0, acc.1) + acc.2
        } else {
            hsum8(acc.0, acc.1)
        }
    }
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
    F16, (2, f16x8::load, rd_f16), (4, load_f32, rd_f32)
);
float_fmt!(
    /// BF16 weights × bf16 activations.
    BF16, (2, load_bf16, rd_bf16), (2, load_bf16, rd_bf16)
);
