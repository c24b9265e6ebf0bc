//! aarch64 NEON twins of the f16 attention helpers (`dot_f16` in both of ggml's
//! orders, `mad_f16`, `scale_f16`): the same lanes, the same reduction trees and the
//! same roundings as the x86 paths and the portable code, so the bits are the same on
//! every machine. f16 ↔ f32 by `arch::aarch64::f16x8` (round-to-nearest-even, as F16C's
//! `vcvtps2ph` with `_MM_FROUND_TO_NEAREST_INT`).

use crate::arch::aarch64::f16x8;
use half::f16;
use std::arch::aarch64::*;

/// 8 f16 at `p` as two f32x4 (exact).
#[inline(always)]
unsafe fn load8(p: *const f16) -> (float32x4_t, float32x4_t) {
    f16x8::load(p as *const u8)
}

/// Two f32x4 stored as 8 f16 at `p` (round to nearest even).
#[inline(always)]
unsafe fn store8(p: *mut f16, lo: float32x4_t, hi: float32x4_t) {
    f16x8::store(p as *mut u8, lo, hi)
}

/// `a · b`, `a` f32 (f16-representable), `b` f16, in ggml's AVX-512 build's order or
/// (`avx2_order`) its AVX2 build's: see `super::dot_order`.
pub unsafe fn dot_f16(a: &[f32], b: &[f16], avx2_order: bool) -> f32 {
    let n = a.len().min(b.len());
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let z = vdupq_n_f32(0.0);
    let np;
    let mut sum = if avx2_order {
        // 4 accumulators of 8 lanes (s[j] = lanes 0..4, 4..8) over steps of 32.
        np = n & !31;
        let mut s = [[z; 2]; 4];
        let mut i = 0;
        while i < np {
            for (j, acc) in s.iter_mut().enumerate() {
                let (lo, hi) = load8(bp.add(i + 8 * j));
                acc[0] = vfmaq_f32(acc[0], vld1q_f32(ap.add(i + 8 * j)), lo);
                acc[1] = vfmaq_f32(acc[1], vld1q_f32(ap.add(i + 8 * j + 4)), hi);
            }
            i += 32;
        }
        let x = |h: usize| vaddq_f32(vaddq_f32(s[0][h], s[2][h]), vaddq_f32(s[1][h], s[3][h]));
        // GGML_F32x8_REDUCE's end: t0 = lo + hi, then (t0[0] + t0[1]) + (t0[2] + t0[3]).
        let t0 = vaddq_f32(x(0), x(1));
        let p = vpaddq_f32(t0, t0);
        (vgetq_lane_f32::<0>(p) + vgetq_lane_f32::<1>(p)) as f64
    } else {
        // 4 accumulators of 16 lanes (s[j][q] = lanes 4q..4q+4) over steps of 64.
        np = n & !63;
        let mut s = [[z; 4]; 4];
        let mut i = 0;
        while i < np {
            for (j, acc) in s.iter_mut().enumerate() {
                for h in 0..2 {
                    let off = i + 16 * j + 8 * h;
                    let (lo, hi) = load8(bp.add(off));
                    acc[2 * h] = vfmaq_f32(acc[2 * h], vld1q_f32(ap.add(off)), lo);
                    acc[2 * h + 1] = vfmaq_f32(acc[2 * h + 1], vld1q_f32(ap.add(off + 4)), hi);
                }
            }
            i += 64;
        }
        // x = (s0 + s2) + (s1 + s3); t3[k] = x[8 + k] + x[k]; t6[m] = t3[4 + m] + t3[m];
        // then (t6[0] + t6[2]) + (t6[1] + t6[3]) (`_mm512_reduce_add_ps`'s tree).
        let x = |q: usize| vaddq_f32(vaddq_f32(s[0][q], s[2][q]), vaddq_f32(s[1][q], s[3][q]));
        let t6 = vaddq_f32(vaddq_f32(x(3), x(1)), vaddq_f32(x(2), x(0)));
        let t8 = vadd_f32(vget_low_f32(t6), vget_high_f32(t6));
        (vget_lane_f32::<0>(t8) + vget_lane_f32::<1>(t8)) as f64
    };
    for k in np..n {
        sum += (a[k] * b[k].to_f32()) as f64;
    }
    sum as f32
}

/// `acc[i] = f16(fma(v[i], w, acc[i]))`.
pub unsafe fn mad_f16(acc: &mut [f16], v: &[f16], w: f32) {
    let n = acc.len().min(v.len());
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i + 8 <= n {
        let p = acc.as_mut_ptr().add(i);
        let (a0, a1) = load8(p);
        let (x0, x1) = load8(v.as_ptr().add(i));
        store8(p, vfmaq_f32(a0, x0, wv), vfmaq_f32(a1, x1, wv));
        i += 8;
    }
    for (a, &x) in acc[i..n].iter_mut().zip(&v[i..n]) {
        *a = f16::from_f32(x.to_f32().mul_add(w, a.to_f32()));
    }
}

/// `acc[i] = f16(acc[i] * s)`.
pub unsafe fn scale_f16(acc: &mut [f16], s: f32) {
    let mut i = 0;
    while i + 8 <= acc.len() {
        let p = acc.as_mut_ptr().add(i);
        let (a0, a1) = load8(p);
        store8(p, vmulq_n_f32(a0, s), vmulq_n_f32(a1, s));
        i += 8;
    }
    for a in &mut acc[i..] {
        *a = f16::from_f32(a.to_f32() * s);
    }
}
