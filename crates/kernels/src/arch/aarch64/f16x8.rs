//! Eight f16 ↔ two f32x4, by `fcvtl`/`fcvtl2` and `fcvtn`/`fcvtn2` (base ARMv8-A;
//! inline assembly because stable Rust has no f16 vector type yet): exact one way,
//! round-to-nearest-even the other (the default FPCR mode). Shared by the F16 matmul
//! kernel and the attention helpers (`ops::neon`).

use std::arch::aarch64::*;

/// 8 f16 at `p` (unaligned) as f32, exact.
#[inline(always)]
pub(crate) unsafe fn load(p: *const u8) -> (float32x4_t, float32x4_t) {
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

/// `lo ‖ hi` stored as 8 f16 at `p` (unaligned), rounded to nearest even.
#[inline(always)]
pub(crate) unsafe fn store(p: *mut u8, lo: float32x4_t, hi: float32x4_t) {
    let h: uint16x8_t;
    std::arch::asm!(
        "fcvtn {h:v}.4h, {lo:v}.4s",
        "fcvtn2 {h:v}.8h, {hi:v}.4s",
        h = out(vreg) h,
        lo = in(vreg) lo,
        hi = in(vreg) hi,
        options(pure, nomem, nostack, preserves_flags)
    );
    vst1q_u16(p as *mut u16, h);
}
