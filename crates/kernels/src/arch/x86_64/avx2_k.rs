//! AVX2 kernels for the 5-bit and K-quant weights: Q5_0 × Q8_0, Q5_1 × Q8_1,
//! Q5_K × Q8_K, Q6_K × Q8_K (Q4_K is one row per lane, in `avx2_rows`).
//!
//! Each follows ggml's AVX2 `ggml_vec_dot_*` (ggml-cpu/arch/x86/quants.c):
//! integer sums land in the same 8 lanes (lane k holds bytes 4k..4k+3 of each
//! 32-byte group), then one `fma(d, float(sumi), acc)` per block and
//! `hsum_float_8` at the end, so a dot is bit-identical to llama.cpp's. ggml's
//! scalar `summs += m * s` lines are fused multiply-adds here: C compilers
//! contract them when FMA is enabled (GCC's default `-ffp-contract=fast`,
//! Clang's `on`), as the Q4_1 kernel in `avx2` also assumes. A
//! K-quant block (256 elements) is one tile step; the weight side of a step
//! keeps only its pointer and unpacked scales, the bit unpacking happens per
//! (row, token) pair (it is a few shifts and masks, cheaper than spilling
//! sixteen registers of unpacked quants).

use super::avx2::nibbles;
use super::int_dot::IntDot;
use super::tile::{f16_at, hsum256, Fmt};
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// ggml's `bytes_from_bits_32`: bit j of the u32 at `p` → byte j = 0xFF or 0.
#[inline(always)]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = std::ptr::read_unaligned(p as *const u32) as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Sum of i8 × i8 products in 8 groups of 4 bytes, as float (ggml's
/// `mul_sum_i8_pairs_float`: `|x|` and `sign(y, x)` through an unsigned dot).
#[inline(always)]
unsafe fn mul_sum_i8_pairs<D: IntDot>(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_cvtepi32_ps(D::dot(ax, sy))
}

/// u8 × i8 products in 8 groups of 4, as float (`mul_sum_us8_pairs_float`).
#[inline(always)]
unsafe fn mul_sum_us8_pairs<D: IntDot>(x: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(D::dot(x, y))
}

/// The 32 quants of the Q5_0 block at `p` as i8 (`q5 - 16`).
#[inline(always)]
pub(super) unsafe fn q5_0_quants(p: *const u8) -> __m256i {
    // (nibble | 0xF0 where the fifth bit is clear) as i8 = q5 - 16.
    let hi = _mm256_andnot_si256(bytes_from_bits_32(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8));
    _mm256_or_si256(nibbles(p.add(6)), hi)
}

/// Q5_0 weights × Q8_0 activations.
pub(super) struct Q5_0<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q5_0<D> {
    const EPB: usize = 32;
    const WB: usize = 22;
    const AB: usize = 34;
    /// (q - 16 as i8, d)
    type W = (__m256i, f32);
    /// (q, d)
    type A = (__m256i, f32);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (q5_0_quants(p), f16_at(p))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (_mm256_loadu_si256(p.add(2) as *const __m256i), f16_at(p))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let d = _mm256_set1_ps(w.1 * a.1);
        _mm256_fmadd_ps(d, mul_sum_i8_pairs::<D>(w.0, a.0), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}

/// The 32 quants of the Q5_1 block at `p` as u8 (0..31).
#[inline(always)]
pub(super) unsafe fn q5_1_quants(p: *const u8) -> __m256i {
    let hi = _mm256_and_si256(bytes_from_bits_32(p.add(4)), _mm256_set1_epi8(0x10));
    _mm256_or_si256(nibbles(p.add(8)), hi)
}

/// Q5_1 weights × Q8_1 activations; `m_w · s_a` summed apart (ggml's `summs`).
pub(super) struct Q5_1<D>(PhantomData<D>);
impl<D: IntDot> Fmt for Q5_1<D> {
    const EPB: usize = 32;
    const WB: usize = 24;
    const AB: usize = 36;
    /// (q5 as u8, d, m)
    type W = (__m256i, f32, f32);
    /// (q, d, s)
    type A = (__m256i, f32, f32);
    type Acc = (__m256, f32);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), 0.0)
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (q5_1_quants(p), f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (_mm256_loadu_si256(p.add(4) as *const __m256i), f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let q = mul_sum_us8_pairs::<D>(w.0, a.0);
        let d = _mm256_mul_ps(_mm256_set1_ps(w.1), _mm256_set1_ps(a.1));
        (_mm256_fmadd_ps(q, d, acc.0), w.2.mul_add(a.2, acc.1))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum256(acc.0) + acc.1
    }
}

/// The 12 packed scale bytes of a Q4_K/Q5_K block at `p` → 8 scales then 8
/// mins as i16 (ggml's `utmp` shuffle and `_mm256_cvtepu8_epi16`).
#[inline(always)]
pub(super) unsafe fn k4_scales_mins(p: *const u8) -> __m256i {
    const KM1: u32 = 0x3f3f3f3f;
    const KM2: u32 = 0x0f0f0f0f;
    const KM3: u32 = 0x03030303;
    let u = |i: usize| std::ptr::read_unaligned(p.add(4 * i) as *const u32);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let t3 = ((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4);
    let t2 = u1 & KM1;
    let t1 = (u2 & KM2) | (((u0 >> 6) & KM3) << 4);
    let t0 = u0 & KM1;
    _mm256_cvtepu8_epi16(_mm_set_epi32(t3 as i32, t2 as i32, t1 as i32, t0 as i32))
}

/// `sum_j mins[j] * (bsums[2j] + bsums[2j+1])` in 4 i32 lanes (pairs of j).
#[inline(always)]
unsafe fn k4_min_prod(ms: __m256i, ap: *const u8) -> __m128i {
    let q8sums = _mm256_loadu_si256(ap.add(260) as *const __m256i);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
    _mm_madd_epi16(_mm256_extracti128_si256::<1>(ms), q8s)
}

/// Q5_K weights × Q8_K activations; unlike Q4_K, ggml sums the min terms
/// as one scalar f32 per block (`summs += dmin * hsum(prod)`).
pub(super) struct Q5K;
impl Fmt for Q5K {
    const EPB: usize = 256;
    const WB: usize = 176;
    const AB: usize = 292;
    /// (block pointer, 8 scales then 8 mins as i16, d, dmin)
    type W = (*const u8, __m256i, f32, f32);
    /// (block pointer, d)
    type A = (*const u8, f32);
    /// (scale terms, min terms)
    type Acc = (__m256, f32);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm256_setzero_ps(), 0.0)
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        (p, k4_scales_mins(p.add(4)), f16_at(p), f16_at(p.add(2)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (wp, ms, wd, wdmin) = w;
        let (ap, ad) = a;
        let d = ad * wd;
        let dmin = -ad * wdmin;
        let prod = k4_min_prod(ms, ap);
        let z = _mm_setzero_si128();
        let hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, z), z);
        let summs = dmin.mul_add(_mm_cvtsi128_si32(hsum) as f32, acc.1);
        let sc = _mm256_castsi256_si128(ms);
        let scales = _mm256_set_m128i(sc, sc);
        let m4 = _mm256_set1_epi8(0x0f);
        let one = _mm256_set1_epi8(1);
        let hbits = _mm256_loadu_si256(wp.add(16) as *const __m256i);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let sl = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(((4 * j + 1) << 8 | (4 * j)) as i16));
            let sh = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(((4 * j + 3) << 8 | (4 * j + 2)) as i16));
            let q5 = _mm256_loadu_si256(wp.add(48 + 32 * j as usize) as *const __m256i);
            // Fifth bits 2j and 2j+1 of each byte of qh, moved to bit 4.
            let h0 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j)), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j + 1)), one);
            let q5l = _mm256_add_epi8(_mm256_and_si256(q5, m4), _mm256_slli_epi16::<4>(h0));
            let q5h = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q5), m4), _mm256_slli_epi16::<4>(h1));
            let q8l = _mm256_loadu_si256(ap.add(4 + 64 * j as usize) as *const __m256i);
            let q8h = _mm256_loadu_si256(ap.add(4 + 64 * j as usize + 32) as *const __m256i);
            let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(q5l, q8l));
            let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(q5h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        (_mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc.0), summs)
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        hsum256(acc.0) + acc.1
    }
}

/// Q6_K weights × Q8_K activations.
pub(super) struct Q6K;
impl Fmt for Q6K {
    const EPB: usize = 256;
    const WB: usize = 210;
    const AB: usize = 292;
    /// (block pointer, d)
    type W = (*const u8, f32);
    /// (block pointer, d)
    type A = (*const u8, f32);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
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
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let (wp, wd) = w;
        let (ap, ad) = a;
        let d = ad * wd;
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(3);
        let scales = _mm_loadu_si128(wp.add(192) as *const __m128i);
        // The 16 scales as i16 (0-7 in the low 128 bits, 8-15 in the high), widened once:
        // each half's 8 in both halves of a vector, from which one in-lane shuffle per 32
        // elements takes scale s to the low half and s + 1 to the high one. (Shuffling and
        // widening them per 32 elements was two shuffle-port instructions, one of them
        // lane-crossing, where this is one: the Q6_K matvec tile alone 18.5-19.2 -> 22.3-23.1
        // GB/s on Zen 3, docs/BENCHMARKS.md.)
        let sc16 = _mm256_cvtepi8_epi16(scales);
        let halves = [_mm256_permute2x128_si256::<0x00>(sc16, sc16), _mm256_permute2x128_si256::<0x11>(sc16, sc16)];
        let mut sumi = _mm256_setzero_si256();
        for (j, half) in halves.iter().enumerate() {
            let (ql, qh, q8) = (wp.add(64 * j), wp.add(128 + 32 * j), ap.add(4 + 128 * j));
            let q4b1 = _mm256_loadu_si256(ql as *const __m256i);
            let q4b2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let hb = _mm256_loadu_si256(qh as *const __m256i);
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, m2));
            let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(hb), m2));
            let h2 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(hb), m2));
            let h3 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(hb), m2));
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4b1, m4), h0),
                _mm256_or_si256(_mm256_and_si256(q4b2, m4), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4b1), m4), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4b2), m4), h3),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let y = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                let p16 = _mm256_maddubs_epi16(q[k], y);
                // Scales 8j+2k (low half) and 8j+2k+1 (high half), as i16: i16 2k resp.
                // 2k+1 of `half`'s lanes, i.e. bytes 4k, 4k+1 resp. 4k+2, 4k+3.
                let (b0, b1) = (4 * k as i32, 4 * k as i32 + 2);
                let (lo, hi) = (b0 | (b0 + 1) << 8, b1 | (b1 + 1) << 8);
                let (lo, hi) = (lo | lo << 16, hi | hi << 16);
                let sc = _mm256_shuffle_epi8(*half, _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi));
                p[k] = _mm256_madd_epi16(sc, p16);
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        // The −32 offset of every quant, from the activations' 16 block sums: lane m
        // takes sub-blocks 2m and 2m+1 (ggml's `q8sclsub`), so each lane's integer sum,
        // and with it the f32 rounding below, is llama.cpp's.
        let bsums = _mm256_loadu_si256(ap.add(260) as *const __m256i);
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
        sumi = _mm256_sub_epi32(sumi, offset);
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}
