//! AVX-512 kernels (F+BW+VL; VNNI when present).
//!
//! Quantized dots stay on 256-bit vectors (one 32-element block per
//! register) but gain VNNI's `vpdpbusd`, which fuses maddubs+madd, cannot
//! saturate, and starts from an accumulator: Q4_0's `-8 * sum(a)` and Q8_0's
//! `-128 * sum(a)` corrections (for `w + 128` as the unsigned operand) are the
//! starting value, free per pair. The EVEX encoding also gives 32 vector
//! registers, so tiles can be 4 rows × 4 tokens. Float dots use 512-bit FMA.

use super::avx2::{self, nibbles, rd_bf16, rd_f16, rd_f32};
use super::avx2_k;
use super::tile::{f16_at, hsum256, run_panel, tail_dot, Fmt};
use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::GgmlType;
use std::arch::x86_64::*;

/// AVX-512 without VNNI: AVX2 integer dots, 512-bit float dots.
pub(super) static KERNELS: Kernels = Kernels {
    level: SimdLevel::Avx512,
    quantize_q8_0: avx2::quantize_q8_0,
    quantize_q8_1: avx2::quantize_q8_1,
    quantize_f16: avx2::quantize_f16,
    quantize_q8_k: avx2::KERNELS.quantize_q8_k,
    panel_q4_0: |p, o| panel::<avx2::Q4_0>(p, o, GgmlType::Q8_0),
    panel_q4_1: |p, o| panel::<avx2::Q4_1>(p, o, GgmlType::Q8_1),
    panel_q8_0: |p, o| panel::<avx2::Q8_0>(p, o, GgmlType::Q8_0),
    panel_f32: |p, o| panel::<F32>(p, o, GgmlType::F32),
    panel_f16: |p, o| panel::<F16>(p, o, GgmlType::F16),
    panel_bf16: |p, o| panel::<BF16>(p, o, GgmlType::BF16),
    // AVX2 integer arithmetic (same results as the avx2 level), 4×4 tiles.
    panel_q5_0: |p, o| panel::<avx2_k::Q5_0>(p, o, GgmlType::Q8_0),
    panel_q5_1: |p, o| panel::<avx2_k::Q5_1>(p, o, GgmlType::Q8_1),
    panel_q4_k: |p, o| panel::<avx2_k::Q4K>(p, o, GgmlType::Q8_K),
    // Q5_K/Q6_K unpack more per pair: 4×4 tiles measured slower than AVX2's 2×4.
    panel_q6_k: avx2::KERNELS.panel_q6_k,
    panel_q5_k: avx2::KERNELS.panel_q5_k,
    panel_q2_k: avx2::KERNELS.panel_q2_k,
    panel_q3_k: avx2::KERNELS.panel_q3_k,
};

/// AVX-512 with VNNI.
pub(super) static KERNELS_VNNI: Kernels = Kernels {
    panel_q4_0: |p, o| panel_vnni::<Q4_0>(p, o, GgmlType::Q8_0),
    panel_q4_1: |p, o| panel_vnni::<Q4_1>(p, o, GgmlType::Q8_1),
    panel_q8_0: |p, o| panel_vnni::<Q8_0>(p, o, GgmlType::Q8_0),
    ..KERNELS
};

#[inline(always)]
fn panel<F: Fmt>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: this table is only handed out when AVX2/FMA/F16C and AVX-512
    // F/BW/VL were detected; `check` bounds every access of the panel.
    unsafe { panel_avx512::<F>(p, out) }
}

#[inline(always)]
fn panel_vnni<F: Fmt>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: as `panel`, and AVX-512 VNNI was detected for this table.
    unsafe { panel_avx512_vnni::<F>(p, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn panel_avx512<F: Fmt>(p: &Panel<'_>, out: &mut [f32]) {
    if p.n_tokens == 1 {
        run_panel::<F, 4, 1>(p, out)
    } else {
        run_panel::<F, 4, 4>(p, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn panel_avx512_vnni<F: Fmt>(p: &Panel<'_>, out: &mut [f32]) {
    if p.n_tokens == 1 {
        run_panel::<F, 4, 1>(p, out)
    } else {
        run_panel::<F, 4, 4>(p, out)
    }
}

/// `-k * sum(q)` per group of 4 bytes.
#[inline(always)]
unsafe fn neg_sum(q: __m256i, k: i8) -> __m256i {
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(k), q))
}

/// Q4_0 × Q8_0 with VNNI.
struct Q4_0;
impl Fmt for Q4_0 {
    const EPB: usize = 32;
    const WB: usize = 18;
    const AB: usize = 34;
    type W = (__m256i, __m256);
    type A = (__m256i, __m256i, __m256);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (nibbles(p.add(2)), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
        (q, neg_sum(q, 8), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let i = _mm256_dpbusd_epi32(a.1, w.0, a.0);
        _mm256_fmadd_ps(_mm256_mul_ps(w.1, a.2), _mm256_cvtepi32_ps(i), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}

/// Q4_1 × Q8_1 with VNNI (`m_w s_a` summed apart, as the AVX2 kernel).
struct Q4_1;
impl Fmt for Q4_1 {
    const EPB: usize = 32;
    const WB: usize = 20;
    const AB: usize = 36;
    type W = (__m256i, __m256, __m256);
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
        let i = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.0, a.0);
        (_mm256_fmadd_ps(_mm256_mul_ps(w.1, a.1), _mm256_cvtepi32_ps(i), acc.0), _mm256_fmadd_ps(w.2, a.2, acc.1))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum256(acc.0) + _mm256_cvtss_f32(acc.1)
    }
}

/// Q8_0 × Q8_0 with VNNI: `(w + 128)` unsigned, corrected by `-128 sum(a)`.
/// Exact for every i8 weight, -128 included.
struct Q8_0;
impl Fmt for Q8_0 {
    const EPB: usize = 32;
    const WB: usize = 34;
    const AB: usize = 34;
    type W = (__m256i, __m256);
    type A = (__m256i, __m256i, __m256);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
        (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
        (q, neg_sum(q, -128), _mm256_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let i = _mm256_dpbusd_epi32(a.1, w.0, a.0);
        _mm256_fmadd_ps(_mm256_mul_ps(w.1, a.2), _mm256_cvtepi32_ps(i), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}

#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum256(_mm256_add_ps(lo, hi))
}

macro_rules! float_fmt {
    ($name:ident, $esz:literal, $load:expr, $scalar:path) => {
        /// Plain float weights × the same type of activations, 16 lanes.
        struct $name;
        impl Fmt for $name {
            const EPB: usize = 16;
            const WB: usize = 16 * $esz;
            const AB: usize = 16 * $esz;
            type W = __m512;
            type A = __m512;
            type Acc = __m512;
            #[inline(always)]
            unsafe fn zero() -> __m512 {
                _mm512_setzero_ps()
            }
            #[inline(always)]
            unsafe fn load_w(p: *const u8) -> __m512 {
                $load(p)
            }
            #[inline(always)]
            unsafe fn load_a(p: *const u8) -> __m512 {
                $load(p)
            }
            #[inline(always)]
            unsafe fn pair(acc: __m512, w: __m512, a: __m512) -> __m512 {
                _mm512_fmadd_ps(w, a, acc)
            }
            #[inline(always)]
            unsafe fn finish(acc: __m512) -> f32 {
                hsum512(acc)
            }
            #[inline(always)]
            unsafe fn tail(w: *const u8, a: *const u8, n: usize) -> f32 {
                let (w, a) = (std::slice::from_raw_parts(w, n * $esz), std::slice::from_raw_parts(a, n * $esz));
                tail_dot(n, |i| $scalar(w, i), |i| $scalar(a, i))
            }
        }
    };
}

#[inline(always)]
unsafe fn load_f32(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p as *const f32)
}
#[inline(always)]
unsafe fn load_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}
#[inline(always)]
unsafe fn load_bf16(p: *const u8) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i))))
}

float_fmt!(F32, 4, load_f32, rd_f32);
float_fmt!(F16, 2, load_f16, rd_f16);
float_fmt!(BF16, 2, load_bf16, rd_bf16);
