//! Exact i8 × i8 dots in 4-byte groups, with and without `sdot`, and the
//! 2×2 8-byte dots of `smmla`.

use std::arch::aarch64::*;

/// How a kernel computes its integer dots.
pub(super) trait IntDot {
    /// `acc` plus, in lane k, `sum(a[4k + j] * b[4k + j], j < 4)`, exact.
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Widening multiplies: `smull`/`smull2` to 16 i16 products (|p| ≤ 2^14,
/// exact), pairwise widening adds to 8 i32, one pairwise add to the 4
/// groups (4 instructions and the accumulate). Every ARMv8-A core.
pub(super) struct Widen;
impl IntDot for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
    }
}

/// `sdot` (FEAT_DotProd): the 4-byte groups in one instruction. Through
/// inline assembly: its intrinsic (`vdotq_s32`) is stable only from Rust
/// 1.98. Only called from functions compiled with the `dotprod` feature.
pub(super) struct Sdot;
impl IntDot for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }
}

/// `smmla` (FEAT_I8MM): `acc` plus the 2×2 matrix of exact 8-byte dots of
/// the rows of `a` (bytes 0..8, 8..16) with those of `b`, as lanes
/// `[a0·b0, a0·b1, a1·b0, a1·b1]`. Through inline assembly: its intrinsic
/// (`vmmlaq_s32`) is unstable. Only called from functions compiled with the
/// `i8mm` feature.
#[inline(always)]
pub(super) unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    std::arch::asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}
