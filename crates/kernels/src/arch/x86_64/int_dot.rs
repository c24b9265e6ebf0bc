//! The integer step the 256-bit kernels share: u8 × i8 products summed in
//! groups of 4 bytes into 8 i32 lanes (lane k: bytes 4k..4k+3).
//!
//! AVX2 takes two instructions ([`Madd`]: `vpmaddubsw` to saturating i16
//! pair sums, `vpmaddwd` with ones); AVX-VNNI (Alder Lake and later Intel
//! cores, which have no AVX-512; VEX encoding, 256-bit) takes one, and also
//! adds the accumulator ([`Vnni`]: `vpdpbusd`). The i32 lanes are equal
//! whenever no i16 pair sum saturates, which the operands the kernels feed
//! guarantee (nibbles, 5-bit quants, and Q8_0 quants within ±127 as ggml's
//! quantizers write them; see `avx2`). So a kernel generic over [`IntDot`]
//! gives the same bits with either, and the avxvnni level equals the avx2
//! level bit for bit (test: `tests::avxvnni_equals_avx2`). ggml does the
//! same swap under `__AVXVNNI__` (`mul_sum_us8_pairs_float`).

use std::arch::x86_64::*;

/// One way to compute u8 × i8 dots in 4-byte groups.
///
/// `unsafe`: callers run with AVX2 (and, for [`Vnni`], AVX-VNNI) enabled.
pub(super) trait IntDot {
    /// `Σ_{j<4} u[4k+j] · s[4k+j]` in i32 lane k.
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i;
    /// `acc + Σ_g dot(w[g], s[g])` over the 8 (weight, activation) vector
    /// pairs of a one-row-per-lane block (`avx2_rows`), where every product
    /// is at most 15 · 128 in magnitude (so [`Madd`] may add in i16 first).
    unsafe fn dot8_nibbles(acc: __m256i, w: &[__m256i; 8], s: [__m256i; 8]) -> __m256i;
}

/// AVX2: `vpmaddubsw` + `vpmaddwd`.
pub(super) struct Madd;

impl IntDot for Madd {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn dot8_nibbles(acc: __m256i, w: &[__m256i; 8], s: [__m256i; 8]) -> __m256i {
        // i16 sums of the 8 pairs: 16 products of at most 15 · 128 per i16
        // lane is at most 30720, below i16's 32767.
        let mut p = _mm256_maddubs_epi16(w[0], s[0]);
        for g in 1..8 {
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w[g], s[g]));
        }
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}

/// AVX-VNNI: `vpdpbusd` (VEX, ymm).
pub(super) struct Vnni;

impl IntDot for Vnni {
    #[inline(always)]
    unsafe fn dot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }
    #[inline(always)]
    unsafe fn dot8_nibbles(acc: __m256i, w: &[__m256i; 8], s: [__m256i; 8]) -> __m256i {
        // Four chains of two: `vpdpbusd` has 5 cycles of latency, and one
        // chain of eight ran at half the speed of AVX2's independent
        // multiplies (measured: Q4_0 prefill 71 vs 130 GFLOP/s).
        let z = _mm256_setzero_si256();
        let a = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, w[0], s[0]), w[4], s[4]);
        let b = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(z, w[1], s[1]), w[5], s[5]);
        let c = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(z, w[2], s[2]), w[6], s[6]);
        let d = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(z, w[3], s[3]), w[7], s[7]);
        _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d))
    }
}
