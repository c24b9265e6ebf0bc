//! Eight f32 lanes: the vector the ops' SIMD bodies are written in (the tiled prefill
//! attention, SwiGLU's `e^x`), so that one body serves x86-64 (one `__m256`: AVX2, FMA,
//! F16C) and aarch64 (two `float32x4_t`: NEON, lanes 0..4 and 4..8). Each operation is
//! the same IEEE operation lane by lane on both (one rounding per add, multiply, divide
//! and fused multiply-add), and the horizontal sum is one fixed tree, so a body gives
//! the same bits on either machine.
//!
//! `unsafe`: raw pointers, valid for 8 elements; the implementations are only used
//! inside functions compiled with their features (`avx2,fma,f16c` on x86-64; Advanced
//! SIMD is baseline on aarch64).

use half::f16;

/// Eight f32 lanes (see the module docs).
pub(super) trait F32x8: Copy {
    /// Per-lane selection mask.
    type Mask: Copy;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// 8 f16 at `p`, widened (exact).
    unsafe fn load_f16(p: *const f16) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    unsafe fn max(self, b: Self) -> Self;
    /// `self · b + c`, one rounding.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    /// `c − self · b`, one rounding.
    unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self;
    /// Lanes `i` with `a ≤ base + i < b`.
    unsafe fn range_mask(base: usize, a: usize, b: usize) -> Self::Mask;
    /// `self` where `m` is set, else `other`.
    unsafe fn select(self, m: Self::Mask, other: Self) -> Self;
    /// `(x0 + x4) + (x2 + x6)` plus `(x1 + x5) + (x3 + x7)`: the halves added, then
    /// twice folded (the 256-bit `hsum8` of ggml's AVX2 soft max).
    unsafe fn hsum(self) -> f32;
    /// The largest lane (no NaN lanes).
    unsafe fn hmax(self) -> f32;
    /// `j · 2^n` for integral `n` with one rounding (`_mm512_scalef_ps`): `2^⌊n/2⌋`
    /// then `2^(n − ⌊n/2⌋)`, the first multiply exact; 0 (`n ≤ 0`) or ∞ where |n| > 192.
    unsafe fn scale_pow2(j: Self, n: Self) -> Self;
    /// The 8 × 8 transpose: lane `j` of result `i` is lane `i` of `r[j]` (moves only, so
    /// exact). Through memory by default; a level may shuffle in registers instead.
    #[inline(always)]
    unsafe fn transpose8(r: [Self; 8]) -> [Self; 8] {
        let mut m = [[0f32; 8]; 8];
        for (row, v) in m.iter_mut().zip(r) {
            v.store(row.as_mut_ptr());
        }
        let mut t = [[0f32; 8]; 8];
        for (i, col) in t.iter_mut().enumerate() {
            for (j, x) in col.iter_mut().enumerate() {
                *x = m[j][i];
            }
        }
        let l = |i: usize| Self::load(t[i].as_ptr());
        [l(0), l(1), l(2), l(3), l(4), l(5), l(6), l(7)]
    }
}

/// [`super::expf_ggml`] on eight lanes, the same operations lane by lane.
#[inline(always)]
pub(super) unsafe fn expf_ggml<V: F32x8>(x: V) -> V {
    use super::{EXP_C, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_SHIFT};
    let c = |b: u32| V::splat(f32::from_bits(b));
    let r = c(EXP_SHIFT);
    let n = x.mul_add(c(EXP_LOG2E), r).sub(r);
    let b = n.neg_mul_add(c(EXP_LN2_LO), n.neg_mul_add(c(EXP_LN2_HI), x));
    let u = b.mul(b);
    let j = c(EXP_C[0])
        .mul_add(b, c(EXP_C[1]))
        .mul_add(u, c(EXP_C[2]).mul_add(b, c(EXP_C[3])))
        .mul_add(u, c(EXP_C[4]).mul_add(b, V::splat(1.0)));
    V::scale_pow2(j, n)
}

/// SwiGLU ([`super::swiglu`]) eight lanes at a time: `gate = x / (1 + e^(0 − x)) · up`;
/// the tail past a multiple of 8 by the scalar definition.
#[inline(always)]
pub(super) unsafe fn swiglu<V: F32x8>(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let (zero, one) = (V::splat(0.0), V::splat(1.0));
    let mut i = 0;
    while i + 8 <= n {
        let p = gate.as_mut_ptr().add(i);
        let x = V::load(p);
        let s = x.div(one.add(expf_ggml(zero.sub(x))));
        s.mul(V::load(up.as_ptr().add(i))).store(p);
        i += 8;
    }
    for (g, &u) in gate[i..n].iter_mut().zip(&up[i..n]) {
        *g = super::silu(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::Avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::F32x8;
    use half::f16;
    use std::arch::x86_64::*;

    /// One `__m256`.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Avx2(__m256);

    impl F32x8 for Avx2 {
        type Mask = __m256;
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Avx2(_mm256_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Avx2(_mm256_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> Self {
            Avx2(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0)
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            Avx2(_mm256_add_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            Avx2(_mm256_sub_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            Avx2(_mm256_mul_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            Avx2(_mm256_div_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            Avx2(_mm256_max_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Avx2(_mm256_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self {
            Avx2(_mm256_fnmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn range_mask(base: usize, a: usize, b: usize) -> __m256 {
            let idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(base as i32));
            let ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(a as i32 - 1));
            let lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(b as i32), idx);
            _mm256_castsi256_ps(_mm256_and_si256(ge, lt))
        }
        #[inline(always)]
        unsafe fn select(self, m: __m256, other: Self) -> Self {
            Avx2(_mm256_blendv_ps(other.0, self.0, m))
        }
        #[inline(always)]
        unsafe fn hsum(self) -> f32 {
            let h = _mm_add_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps::<1>(self.0));
            let f = _mm_add_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_add_ss(f, _mm_movehdup_ps(f)))
        }
        #[inline(always)]
        unsafe fn hmax(self) -> f32 {
            let h = _mm_max_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps::<1>(self.0));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)))
        }
        #[inline(always)]
        unsafe fn scale_pow2(j: Self, n: Self) -> Self {
            let ni = _mm256_cvtps_epi32(n.0);
            let n1 = _mm256_srai_epi32::<1>(ni);
            let n2 = _mm256_sub_epi32(ni, n1);
            let bias = _mm256_set1_epi32(127);
            let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
            let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
            let res = _mm256_mul_ps(_mm256_mul_ps(j.0, p1), p2);
            let d = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(_mm256_set1_ps(-0.0), n.0), _mm256_set1_ps(192.0));
            if _mm256_movemask_ps(d) == 0 {
                return Avx2(res);
            }
            let le0 = _mm256_cmp_ps::<_CMP_LE_OQ>(n.0, _mm256_setzero_ps());
            let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), le0);
            Avx2(_mm256_blendv_ps(res, alt, d))
        }
        /// In registers: pairs interleaved, then quads, then the 128-bit halves swapped
        /// (24 shuffles for 64 values, where the store-and-gather did 64 scalar moves).
        #[inline(always)]
        unsafe fn transpose8(r: [Self; 8]) -> [Self; 8] {
            let r = [r[0].0, r[1].0, r[2].0, r[3].0, r[4].0, r[5].0, r[6].0, r[7].0];
            // t0 = [r0_0 r1_0 r0_1 r1_1 | r0_4 r1_4 r0_5 r1_5], ...
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            // u0 = [r0_0 r1_0 r2_0 r3_0 | r0_4 r1_4 r2_4 r3_4], ...
            let u0 = _mm256_shuffle_ps::<0b01_00_01_00>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0b11_10_11_10>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0b01_00_01_00>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0b11_10_11_10>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0b01_00_01_00>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0b11_10_11_10>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0b01_00_01_00>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0b11_10_11_10>(t5, t7);
            [
                Avx2(_mm256_permute2f128_ps::<0x20>(u0, u4)),
                Avx2(_mm256_permute2f128_ps::<0x20>(u1, u5)),
                Avx2(_mm256_permute2f128_ps::<0x20>(u2, u6)),
                Avx2(_mm256_permute2f128_ps::<0x20>(u3, u7)),
                Avx2(_mm256_permute2f128_ps::<0x31>(u0, u4)),
                Avx2(_mm256_permute2f128_ps::<0x31>(u1, u5)),
                Avx2(_mm256_permute2f128_ps::<0x31>(u2, u6)),
                Avx2(_mm256_permute2f128_ps::<0x31>(u3, u7)),
            ]
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(super) use neon::Neon;

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::F32x8;
    use crate::arch::aarch64::f16x8;
    use half::f16;
    use std::arch::aarch64::*;

    /// Two `float32x4_t`: lanes 0..4 and 4..8.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Neon(float32x4_t, float32x4_t);

    /// `f` on both halves.
    macro_rules! both {
        ($f:ident, $a:expr, $b:expr) => {
            Neon($f($a.0, $b.0), $f($a.1, $b.1))
        };
    }

    impl F32x8 for Neon {
        type Mask = (uint32x4_t, uint32x4_t);
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Neon(vdupq_n_f32(x), vdupq_n_f32(x))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Neon(vld1q_f32(p), vld1q_f32(p.add(4)))
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> Self {
            let (lo, hi) = f16x8::load(p as *const u8);
            Neon(lo, hi)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            vst1q_f32(p, self.0);
            vst1q_f32(p.add(4), self.1);
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            both!(vaddq_f32, self, b)
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            both!(vsubq_f32, self, b)
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            both!(vmulq_f32, self, b)
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            both!(vdivq_f32, self, b)
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            both!(vmaxq_f32, self, b)
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Neon(vfmaq_f32(c.0, self.0, b.0), vfmaq_f32(c.1, self.1, b.1))
        }
        #[inline(always)]
        unsafe fn neg_mul_add(self, b: Self, c: Self) -> Self {
            Neon(vfmsq_f32(c.0, self.0, b.0), vfmsq_f32(c.1, self.1, b.1))
        }
        #[inline(always)]
        unsafe fn range_mask(base: usize, a: usize, b: usize) -> (uint32x4_t, uint32x4_t) {
            let idx = [0u32, 1, 2, 3, 4, 5, 6, 7];
            let (a, b) = (vdupq_n_u32(a.saturating_sub(base) as u32), vdupq_n_u32(b.saturating_sub(base) as u32));
            let m = |i: uint32x4_t| vandq_u32(vcgeq_u32(i, a), vcltq_u32(i, b));
            (m(vld1q_u32(idx.as_ptr())), m(vld1q_u32(idx.as_ptr().add(4))))
        }
        #[inline(always)]
        unsafe fn select(self, m: (uint32x4_t, uint32x4_t), other: Self) -> Self {
            Neon(vbslq_f32(m.0, self.0, other.0), vbslq_f32(m.1, self.1, other.1))
        }
        #[inline(always)]
        unsafe fn hsum(self) -> f32 {
            let h = vaddq_f32(self.0, self.1);
            let f = vadd_f32(vget_low_f32(h), vget_high_f32(h));
            vget_lane_f32::<0>(f) + vget_lane_f32::<1>(f)
        }
        #[inline(always)]
        unsafe fn hmax(self) -> f32 {
            vmaxvq_f32(vmaxq_f32(self.0, self.1))
        }
        #[inline(always)]
        unsafe fn scale_pow2(j: Self, n: Self) -> Self {
            let half = |n: float32x4_t| {
                let ni = vcvtnq_s32_f32(n);
                let n1 = vshrq_n_s32::<1>(ni);
                let n2 = vsubq_s32(ni, n1);
                let bias = vdupq_n_s32(127);
                let p = |e: int32x4_t| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(e, bias)));
                (p(n1), p(n2))
            };
            let scale = |j: float32x4_t, n: float32x4_t| {
                let (p1, p2) = half(n);
                let res = vmulq_f32(vmulq_f32(j, p1), p2);
                let big = vcagtq_f32(n, vdupq_n_f32(192.0));
                let alt = vbslq_f32(vclezq_f32(n), vdupq_n_f32(0.0), vdupq_n_f32(f32::INFINITY));
                vbslq_f32(big, alt, res)
            };
            Neon(scale(j.0, n.0), scale(j.1, n.1))
        }
    }
}
