//! Q4_K × Q8_K with two rows per 512-bit vector (see `avx512_pair`): each
//! 256-bit half runs `avx2_k::Q4K`'s arithmetic (ggml's AVX2 order) for one
//! row, so results equal the avx2 level's bit for bit. The min terms' 4
//! lanes per row sit in the two 128-bit halves of a 256-bit accumulator.

use super::avx2_k::k4_scales_mins;
use super::tile::{f16_at, hsum256, Fmt};
use std::arch::x86_64::*;

/// The 32 bytes at `p` (row r) and `q` (row r+1) side by side.
#[inline(always)]
unsafe fn rows2(p: *const u8, q: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p as *const __m256i));
    _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(q as *const __m256i))
}

/// The 32 bytes at `p` in both halves.
#[inline(always)]
unsafe fn both(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
}

/// `a` in lanes 0..N, `b` in lanes N..2N of a 2N-lane f32 vector.
macro_rules! halves {
    (16, $a:expr, $b:expr) => {
        _mm512_mask_broadcastss_ps(_mm512_set1_ps($a), 0xff00, _mm_set_ss($b))
    };
    (8, $a:expr, $b:expr) => {
        _mm256_blend_ps::<0xf0>(_mm256_set1_ps($a), _mm256_set1_ps($b))
    };
}

/// ggml's reduction of the 4 min-term lanes (`acc_m` of `avx2_k::Q4K`).
#[inline(always)]
unsafe fn hsum4(m: __m128) -> f32 {
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
}

/// ggml's min terms of a block pair: `acc_m + (-d_a dmin_w) * (mins · bsums)`
/// (the activation's 16 bsums summed pairwise to 8).
#[inline(always)]
unsafe fn min_terms(ap: *const u8, ad: f32, mins: __m256i, wdmin: __m256, acc_m: __m256) -> __m256 {
    let dmin = _mm256_mul_ps(_mm256_set1_ps(-ad), wdmin);
    let q8sums = _mm256_loadu_si256(ap.add(260) as *const __m256i);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
    let prod = _mm256_madd_epi16(mins, _mm256_set_m128i(q8s, q8s));
    _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m)
}

/// 64-element group `j` of a block pair (`wp`, `wq`: the two rows' blocks):
/// (low nibbles, high nibbles, their scales as i16 pairs from `scales`).
#[inline(always)]
unsafe fn unpack_group(wp: *const u8, wq: *const u8, scales: __m512i, j: usize) -> (__m512i, __m512i, __m512i, __m512i) {
    let m4 = _mm512_set1_epi8(0x0f);
    let sl = _mm512_shuffle_epi8(scales, _mm512_set1_epi16(((4 * j + 1) << 8 | (4 * j)) as i16));
    let sh = _mm512_shuffle_epi8(scales, _mm512_set1_epi16(((4 * j + 3) << 8 | (4 * j + 2)) as i16));
    let o = 16 + 32 * j;
    let q4 = rows2(wp.add(o), wq.add(o));
    (_mm512_and_si512(q4, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q4), m4), sl, sh)
}

/// `sumi` plus 64-element group `j`'s scaled integer products: (low nibbles,
/// high nibbles, their scales as i16 pairs) against the activation's bytes.
#[inline(always)]
unsafe fn group_dot(sumi: __m512i, (lo, hi, sl, sh): (__m512i, __m512i, __m512i, __m512i), ap: *const u8, j: usize) -> __m512i {
    let pl = _mm512_madd_epi16(sl, _mm512_maddubs_epi16(lo, both(ap.add(4 + 64 * j))));
    let ph = _mm512_madd_epi16(sh, _mm512_maddubs_epi16(hi, both(ap.add(4 + 64 * j + 32))));
    _mm512_add_epi32(sumi, _mm512_add_epi32(pl, ph))
}

pub(super) struct Q4K;
impl Fmt for Q4K {
    const EPB: usize = 256;
    const WB: usize = 144;
    const AB: usize = 292;
    const ROWS: usize = 2;
    /// (block pointers, scales as i16 [r, r, r+1, r+1] per 128 bits, mins as
    /// i16 [r, r+1], d [r ×8, r+1 ×8], dmin [r ×4, r+1 ×4])
    type W = (*const u8, *const u8, __m512i, __m256i, __m512, __m256);
    /// (block pointer, d)
    type A = (*const u8, f32);
    /// (scale terms, min terms)
    type Acc = (__m512, __m256);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm512_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        Self::load_rows(p, 0)
    }
    #[inline(always)]
    unsafe fn load_rows(p: *const u8, next: usize) -> Self::W {
        let q = p.add(next);
        let ms = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(k4_scales_mins(p.add(4))), k4_scales_mins(q.add(4)));
        let sc = _mm512_shuffle_i64x2::<0b10_10_00_00>(ms, ms);
        let mn = _mm512_castsi512_si256(_mm512_shuffle_i64x2::<0b11_01_11_01>(ms, ms));
        (p, q, sc, mn, halves!(16, f16_at(p), f16_at(q)), halves!(8, f16_at(p.add(2)), f16_at(q.add(2))))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (p, std::ptr::read_unaligned(p as *const f32))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (wp, wq, scales, mins, wd, wdmin) = w;
        let (ap, ad) = a;
        let d = _mm512_mul_ps(_mm512_set1_ps(ad), wd);
        let acc_m = min_terms(ap, ad, mins, wdmin, acc.1);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            sumi = group_dot(sumi, unpack_group(wp, wq, scales, j), ap, j);
        }
        (_mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc.0), acc_m)
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        Self::finish_rows(acc)[0]
    }
    #[inline(always)]
    unsafe fn finish_rows(acc: Self::Acc) -> [f32; 2] {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc.0)));
        let (m0, m1) = (_mm256_castps256_ps128(acc.1), _mm256_extractf128_ps::<1>(acc.1));
        [hsum256(_mm512_castps512_ps256(acc.0)) + hsum4(m0), hsum256(hi) + hsum4(m1)]
    }
}

/// [`Q4K`] with the weights' per-block work (quant loads, nibble split,
/// scale shuffles) done once per tile in `load_rows` rather than per token:
/// the same instructions on the same values, so the same results; it holds
/// 16 vectors per pair, so tiles are one pair wide.
pub(super) struct Q4KHoist;
impl Fmt for Q4KHoist {
    const EPB: usize = 256;
    const WB: usize = 144;
    const AB: usize = 292;
    const ROWS: usize = 2;
    /// (low nibbles ×4, high nibbles ×4, low-half scales ×4, high-half
    /// scales ×4, mins, d, dmin), per 64-element group j as in `Q4K::pair`.
    type W = ([__m512i; 4], [__m512i; 4], [__m512i; 4], [__m512i; 4], __m256i, __m512, __m256);
    type A = (*const u8, f32);
    type Acc = (__m512, __m256);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        Q4K::zero()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        Self::load_rows(p, 0)
    }
    #[inline(always)]
    unsafe fn load_rows(p: *const u8, next: usize) -> Self::W {
        let (wp, wq, scales, mins, d, dmin) = Q4K::load_rows(p, next);
        let z = _mm512_setzero_si512();
        let (mut lo, mut hi, mut sl, mut sh) = ([z; 4], [z; 4], [z; 4], [z; 4]);
        for j in 0..4 {
            (lo[j], hi[j], sl[j], sh[j]) = unpack_group(wp, wq, scales, j);
        }
        (lo, hi, sl, sh, mins, d, dmin)
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        Q4K::load_a(p)
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let (lo, hi, sl, sh, mins, wd, wdmin) = w;
        let (ap, ad) = a;
        let d = _mm512_mul_ps(_mm512_set1_ps(ad), wd);
        let acc_m = min_terms(ap, ad, mins, wdmin, acc.1);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            sumi = group_dot(sumi, (lo[j], hi[j], sl[j], sh[j]), ap, j);
        }
        (_mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc.0), acc_m)
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        Q4K::finish(acc)
    }
    #[inline(always)]
    unsafe fn finish_rows(acc: Self::Acc) -> [f32; 2] {
        Q4K::finish_rows(acc)
    }
}
