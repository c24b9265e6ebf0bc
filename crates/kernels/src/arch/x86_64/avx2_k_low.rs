//! AVX2 kernels for the low-bit K-quants: Q2_K × Q8_K and Q3_K × Q8_K.
//!
//! Each follows ggml's AVX2 `ggml_vec_dot_q{2,3}_K_q8_K`
//! (ggml-cpu/arch/x86/quants.c), as the kernels in `avx2_k` do: integer sums
//! land in ggml's 8 lanes (lane m holds bytes 4m..4m+3 of each 32-byte group;
//! integer sums are exact, so only the lane assignment matters), then per
//! block `acc = fma(d, float(sumi), acc)` and `hsum_float_8` at the end, so a
//! dot is bit-identical to llama.cpp's. Q2_K's min terms go into the same 8
//! lanes first, one `fma(-d_a·dmin, float(mins · bsums), acc)` per block.
//!
//! As in `avx2_k`, a super-block (256 elements) is one tile step; the weight
//! side of a step keeps its pointer and unpacked 16-bit scales (each 8-scale
//! half in both 128-bit lanes, ggml's `scales[2]`), and the 2-bit (and high
//! bit) unpacking happens per (row, token) pair.

use super::tile::{f16_at, hsum256, Fmt};
use std::arch::x86_64::*;

/// The `_mm256_shuffle_epi8` control that broadcasts 16-bit scale `2k` of a
/// half to the low 128-bit lane and scale `2k + 1` to the high one (ggml's
/// `get_scale_shuffle_q3k(k)`).
#[inline(always)]
unsafe fn scale_shuffle(k: usize) -> __m256i {
    let lo = (((4 * k + 1) << 8) | (4 * k)) as i16;
    let hi = (((4 * k + 3) << 8) | (4 * k + 2)) as i16;
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// 16 i8 scales → 16 i16, as (scales 0..7 in both lanes, scales 8..15 in both lanes).
#[inline(always)]
unsafe fn split_scales(s8: __m128i) -> [__m256i; 2] {
    let all = _mm256_cvtepi8_epi16(s8);
    [_mm256_permute4x64_epi64::<0x44>(all), _mm256_permute4x64_epi64::<0xEE>(all)]
}

/// The four 32-byte groups of Q8_K quants of 128-element chunk `j`.
#[inline(always)]
unsafe fn q8_chunk(ap: *const u8, j: usize) -> [__m256i; 4] {
    let q8 = ap.add(4 + 128 * j);
    [
        _mm256_loadu_si256(q8 as *const __m256i),
        _mm256_loadu_si256(q8.add(32) as *const __m256i),
        _mm256_loadu_si256(q8.add(64) as *const __m256i),
        _mm256_loadu_si256(q8.add(96) as *const __m256i),
    ]
}

/// `sum_k scale_k · p16_k` in 8 i32 lanes, added to `sumi` (ggml's
/// `(p0 + p1) + (p2 + p3)`; integer, so exact in any order).
#[inline(always)]
unsafe fn scale_sum(sumi: __m256i, sc: __m256i, p16: [__m256i; 4]) -> __m256i {
    let p: [__m256i; 4] = [
        _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle(0)), p16[0]),
        _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle(1)), p16[1]),
        _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle(2)), p16[2]),
        _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle(3)), p16[3]),
    ];
    _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])))
}

/// Q2_K weights × Q8_K activations. Block: scales[16] (low nibble scale,
/// high nibble min), qs[64], d, dmin.
pub(super) struct Q2K;
impl Fmt for Q2K {
    const EPB: usize = 256;
    const WB: usize = 84;
    const AB: usize = 292;
    /// (block pointer, scales as i16 per half, 16 mins as i16, d, dmin)
    type W = (*const u8, [__m256i; 2], __m256i, f32, f32);
    /// (block pointer, d)
    type A = (*const u8, f32);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        let m4 = _mm_set1_epi8(0x0f);
        let ms = _mm_loadu_si128(p as *const __m128i);
        let scales = _mm_and_si128(ms, m4);
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(ms), m4);
        (p, split_scales(scales), _mm256_cvtepi8_epi16(mins), f16_at(p.add(80)), f16_at(p.add(82)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let (wp, sc, mins, wd, wdmin) = w;
        let (ap, ad) = a;
        let d = ad * wd;
        let dmin = -ad * wdmin;
        let prod = _mm256_madd_epi16(mins, _mm256_loadu_si256(ap.add(260) as *const __m256i));
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        let m3 = _mm256_set1_epi8(3);
        let mut sumi = _mm256_setzero_si256();
        for (j, &sc) in sc.iter().enumerate() {
            let q2 = _mm256_loadu_si256(wp.add(16 + 32 * j) as *const __m256i);
            let q8 = q8_chunk(ap, j);
            let p16 = [
                _mm256_maddubs_epi16(_mm256_and_si256(q2, m3), q8[0]),
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<2>(q2), m3), q8[1]),
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(q2), m3), q8[2]),
                _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<6>(q2), m3), q8[3]),
            ];
            sumi = scale_sum(sumi, sc, p16);
        }
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}

/// `4` in each byte of `q3h` where bit `BIT` of the hmask byte is clear, else
/// 0 (ggml's `((~hbits & (1 << bit)) >> bit) << 2`, in two instructions).
#[inline(always)]
unsafe fn q3_high<const BIT: i32>(hbits: __m256i) -> __m256i {
    let x = _mm256_andnot_si256(hbits, _mm256_set1_epi8((1u8 << BIT) as i8));
    // Only bit BIT of each byte can be set, so 16-bit shifts stay in the byte.
    match BIT {
        0 => _mm256_slli_epi16::<2>(x),
        1 => _mm256_slli_epi16::<1>(x),
        2 => x,
        3 => _mm256_srli_epi16::<1>(x),
        4 => _mm256_srli_epi16::<2>(x),
        5 => _mm256_srli_epi16::<3>(x),
        6 => _mm256_srli_epi16::<4>(x),
        _ => _mm256_srli_epi16::<5>(x),
    }
}

/// The unscaled 16-bit pair sums `(q3l - q3h) · q8` of the 4 groups of a
/// 128-element chunk, hmask bits `B0..B3` (ggml: `maddubs(q3l, q8) - maddubs(q3h, q8)`).
#[inline(always)]
unsafe fn q3_chunk<const B0: i32, const B1: i32, const B2: i32, const B3: i32>(
    q3: __m256i,
    hbits: __m256i,
    q8: [__m256i; 4],
) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    let l = [
        _mm256_and_si256(q3, m3),
        _mm256_and_si256(_mm256_srli_epi16::<2>(q3), m3),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q3), m3),
        _mm256_and_si256(_mm256_srli_epi16::<6>(q3), m3),
    ];
    let h = [q3_high::<B0>(hbits), q3_high::<B1>(hbits), q3_high::<B2>(hbits), q3_high::<B3>(hbits)];
    let p = |k: usize| _mm256_sub_epi16(_mm256_maddubs_epi16(l[k], q8[k]), _mm256_maddubs_epi16(h[k], q8[k]));
    [p(0), p(1), p(2), p(3)]
}

/// Q3_K weights × Q8_K activations. Block: hmask[32], qs[64], scales[12]
/// (16 packed 6-bit scales, offset 32), d.
pub(super) struct Q3K;
impl Fmt for Q3K {
    const EPB: usize = 256;
    const WB: usize = 110;
    const AB: usize = 292;
    /// (block pointer, scales - 32 as i16 per half, d)
    type W = (*const u8, [__m256i; 2], f32);
    /// (block pointer, d)
    type A = (*const u8, f32);
    type Acc = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        const KM1: u32 = 0x03030303;
        const KM2: u32 = 0x0f0f0f0f;
        let u = |i: usize| std::ptr::read_unaligned(p.add(96 + 4 * i) as *const u32);
        let (a0, a1, a2) = (u(0), u(1), u(2));
        let s = _mm_set_epi32(
            (((a1 >> 4) & KM2) | (((a2 >> 6) & KM1) << 4)) as i32,
            (((a0 >> 4) & KM2) | (((a2 >> 4) & KM1) << 4)) as i32,
            ((a1 & KM2) | (((a2 >> 2) & KM1) << 4)) as i32,
            ((a0 & KM2) | ((a2 & KM1) << 4)) as i32,
        );
        (p, split_scales(_mm_sub_epi8(s, _mm_set1_epi8(32))), f16_at(p.add(108)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m256, w: Self::W, a: Self::A) -> __m256 {
        let (wp, sc, wd) = w;
        let (ap, ad) = a;
        let d = ad * wd;
        let hbits = _mm256_loadu_si256(wp as *const __m256i);
        let q3 = |j: usize| _mm256_loadu_si256(wp.add(32 + 32 * j) as *const __m256i);
        let p0 = q3_chunk::<0, 1, 2, 3>(q3(0), hbits, q8_chunk(ap, 0));
        let sumi = scale_sum(_mm256_setzero_si256(), sc[0], p0);
        let p1 = q3_chunk::<4, 5, 6, 7>(q3(1), hbits, q8_chunk(ap, 1));
        let sumi = scale_sum(sumi, sc[1], p1);
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum256(acc)
    }
}
