//! AVX-512 VNNI dots with ggml's per-block arithmetic, two rows per vector:
//! Q4_1 × Q8_1, Q8_0 × Q8_0 (for rows too long for `avx512_rows`).
//!
//! ggml's AVX2 dots (which the avx2 level reproduces bit for bit, and which
//! the SmolLM2 reference logits need: with activations re-quantized after
//! every matmul, any other summation order drifts by tenths of a logit) keep
//! 8 f32 lanes per (row, token): per 32-element block, lane k gets
//! `fma(d_w d_a, float(sum of the products of bytes 4k..4k+3), acc)`. Here a
//! 512-bit vector holds two rows' 8 lanes side by side (rows r and r+1 of a
//! block in its two 256-bit halves, against the activation block in both),
//! so each instruction does two rows' work while every lane sees exactly
//! ggml's sequence: results equal the avx2 level's. `vpdpbusd` gives the same
//! exact integer lane sums as maddubs+madd and starts from Q8_0's
//! `-128 sum(a)` (for `w + 128` as the unsigned
//! operand). Block scales come from the f16 table: a broadcast load for the
//! first row, a masked broadcast load for the second.

use super::tile::{f16_at, hsum256, Fmt, F16_TABLE};
use std::arch::x86_64::*;

/// The f16 at `p` (first row) in lanes 0..8 and at `q` in lanes 8..16, as f32.
#[inline(always)]
unsafe fn scales2(p: *const u8, q: *const u8) -> __m512 {
    _mm512_mask_broadcastss_ps(_mm512_set1_ps(f16_at(p)), 0xff00, _mm_load_ss(table_at(q)))
}

/// The f16 at `p` as f32 in lanes 0 and 8, zeros elsewhere.
#[inline(always)]
unsafe fn lanes_0_8(p: *const u8) -> __m512 {
    _mm512_maskz_broadcastss_ps(0x0101, _mm_load_ss(table_at(p)))
}

#[inline(always)]
unsafe fn table_at(p: *const u8) -> *const f32 {
    F16_TABLE.as_ptr().add(std::ptr::read_unaligned(p as *const u16) as usize)
}

/// 16 bytes of nibbles at `p` (row r) and `q` (row r+1) → 64 bytes: per row,
/// element j (low nibble of byte j) in byte j, element j+16 in byte j+16.
#[inline(always)]
unsafe fn nibbles2(p: *const u8, q: *const u8) -> __m512i {
    let v = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
    let v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128(q as *const __m128i));
    _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f))
}

/// The 32 activation quants at `p`, in both halves.
#[inline(always)]
unsafe fn act2(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p as *const __m256i))
}

/// `-k * sum(q)` per group of 4 bytes.
#[inline(always)]
unsafe fn neg_sum(q: __m512i, k: i8) -> __m512i {
    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(k), q))
}

/// The two rows' ggml reductions (`hsum_float_8` of each half).
#[inline(always)]
unsafe fn hsum_halves(v: __m512) -> [f32; 2] {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    [hsum256(_mm512_castps512_ps256(v)), hsum256(hi)]
}

/// Weights of two rows whose dot with Q8_0 activations is
/// `d_w d_a (sum(u_w a) - K sum(a))`, `u_w = w + K` unsigned.
pub(super) trait SymPair {
    /// Bytes per block.
    const WB: usize;
    /// The offset K (as the u8 multiplier of `sum(a)`).
    const K: i8;
    /// The unsigned quants of the blocks at `p` and `q`.
    unsafe fn quants(p: *const u8, q: *const u8) -> __m512i;
}

pub(super) struct Q8_0Q;
impl SymPair for Q8_0Q {
    const WB: usize = 34;
    const K: i8 = -128;
    #[inline(always)]
    unsafe fn quants(p: *const u8, q: *const u8) -> __m512i {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p.add(2) as *const __m256i));
        let w = _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(q.add(2) as *const __m256i));
        _mm512_xor_si512(w, _mm512_set1_epi8(-128))
    }
}

/// `SymPair` weights × Q8_0 activations.
pub(super) struct Sym<W>(std::marker::PhantomData<W>);
impl<W: SymPair> Fmt for Sym<W> {
    const EPB: usize = 32;
    const WB: usize = W::WB;
    const AB: usize = 34;
    const ROWS: usize = 2;
    /// (unsigned quants, d per half)
    type W = (__m512i, __m512);
    /// (q, -K sum(q) per group of 4, d)
    type A = (__m512i, __m512i, __m512);
    type Acc = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        Self::load_rows(p, 0)
    }
    #[inline(always)]
    unsafe fn load_rows(p: *const u8, next: usize) -> Self::W {
        (W::quants(p, p.add(next)), scales2(p, p.add(next)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        let q = act2(p.add(2));
        (q, neg_sum(q, W::K), _mm512_set1_ps(f16_at(p)))
    }
    #[inline(always)]
    unsafe fn pair(acc: __m512, w: Self::W, a: Self::A) -> __m512 {
        let i = _mm512_dpbusd_epi32(a.1, w.0, a.0);
        _mm512_fmadd_ps(_mm512_mul_ps(w.1, a.2), _mm512_cvtepi32_ps(i), acc)
    }
    #[inline(always)]
    unsafe fn finish(acc: __m512) -> f32 {
        Self::finish_rows(acc)[0]
    }
    #[inline(always)]
    unsafe fn finish_rows(acc: __m512) -> [f32; 2] {
        hsum_halves(acc)
    }
}

pub(super) type Q8_0 = Sym<Q8_0Q>;

/// Q4_1 × Q8_1: `d_w d_a sum(q_w q_a)` in the 8 lanes, `m_w s_a` summed
/// apart in lane 0 of each half (ggml's `summs`), added after the reduction.
pub(super) struct Q4_1;
impl Fmt for Q4_1 {
    const EPB: usize = 32;
    const WB: usize = 20;
    const AB: usize = 36;
    const ROWS: usize = 2;
    const UNROLL_GROUPS: bool = true;
    /// (nibbles, d per half, m per half)
    type W = (__m512i, __m512, __m512);
    /// (q, d, s in lanes 0 and 8)
    type A = (__m512i, __m512, __m512);
    type Acc = (__m512, __m512);
    #[inline(always)]
    unsafe fn zero() -> Self::Acc {
        (_mm512_setzero_ps(), _mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load_w(p: *const u8) -> Self::W {
        Self::load_rows(p, 0)
    }
    #[inline(always)]
    unsafe fn load_rows(p: *const u8, next: usize) -> Self::W {
        let q = p.add(next);
        (nibbles2(p.add(4), q.add(4)), scales2(p, q), scales2(p.add(2), q.add(2)))
    }
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> Self::A {
        (act2(p.add(4)), _mm512_set1_ps(f16_at(p)), lanes_0_8(p.add(2)))
    }
    #[inline(always)]
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc {
        let i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.0, a.0);
        (_mm512_fmadd_ps(_mm512_mul_ps(w.1, a.1), _mm512_cvtepi32_ps(i), acc.0), _mm512_fmadd_ps(w.2, a.2, acc.1))
    }
    #[inline(always)]
    unsafe fn finish(acc: Self::Acc) -> f32 {
        Self::finish_rows(acc)[0]
    }
    #[inline(always)]
    unsafe fn finish_rows(acc: Self::Acc) -> [f32; 2] {
        let [a, b] = hsum_halves(acc.0);
        let m = _mm512_extractf32x4_ps::<2>(acc.1);
        [a + _mm512_cvtss_f32(acc.1), b + _mm_cvtss_f32(m)]
    }
}
