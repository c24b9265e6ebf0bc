//! Weights whose 32-element blocks are one f16 scale and 32 signed quants
//! (Q8_0, and Q5_0 once unpacked) × Q8_0 activations, at the 256-bit levels,
//! in ggml's plain AVX2 order (`ggml_vec_dot_q8_0_q8_0`, `_q5_0_q8_0`): per
//! (row, token) 8 f32 lanes, lane k += `d_w·d_a · float(Σ w·a over bytes
//! 4k..4k+3)` block by block, then `hsum_float_8`. The same bits as the
//! generic tile's `avx2::Q8_0` and `avx2_k::Q5_0` (and so llama.cpp's; test:
//! `tests::i8_block_tiles_equal_ggmls_order`), in fewer instructions.
//!
//! Why a tile of its own: on AVX2 every step of the plain order runs on the
//! two multiply ports (sign, `vpmaddubsw`, `vpmaddwd`, convert, FMA), and
//! the generic tile (`tile::Fmt`) adds a sixth per pair, the scale product
//! `d_w·d_a` (a scalar multiply, then a broadcast). Prefill was bound by
//! those ports (measured: 6 of 7 µops per pair, 61 GFLOP/s on a SmolLM2
//! layer). Here a tile's scale products are one vector multiply per row
//! (row scale × the T tokens' scales, held in both 128-bit halves), and each
//! pair takes its product with one in-lane permute on the shuffle port:
//! 5 multiply-port µops per pair instead of 6 (4 with AVX-VNNI's `vpdpbusd`).
//! The products are the same f32 roundings, so the bits do not change.

use super::int_dot::IntDot;
use super::tile::{f16_at, hsum256};
use crate::dispatch::Panel;
use std::arch::x86_64::*;

/// A weight block format: an f16 scale at byte 0, then quants that unpack
/// to 32 signed bytes.
pub(super) trait I8Block {
    /// Bytes per block.
    const WB: usize;
    /// The block at `p`'s 32 quants as i8.
    unsafe fn quants(p: *const u8) -> __m256i;
}

/// Q8_0: the quants as stored.
pub(super) struct Q8_0;
impl I8Block for Q8_0 {
    const WB: usize = 34;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.add(2) as *const __m256i)
    }
}

/// Q5_0: 4 low bits as nibbles, the fifth from a 32-bit mask, minus 16.
pub(super) struct Q5_0;
impl I8Block for Q5_0 {
    const WB: usize = 22;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        super::avx2_k::q5_0_quants(p)
    }
}

/// Bytes of a Q8_0 activation block (f16 scale, 32 × i8).
const AB: usize = 34;
/// Most tokens per tile: 2 rows × 4 tokens of accumulators, 2 rows of
/// weights (signed and absolute), the scale products and temporaries fill
/// the 16 registers.
const MAX_T: usize = 4;

/// Lane `t` of each 128-bit half of `v`, in every lane.
#[inline(always)]
unsafe fn lane(v: __m256, t: usize) -> __m256 {
    match t {
        0 => _mm256_permute_ps::<0x00>(v),
        1 => _mm256_permute_ps::<0x55>(v),
        2 => _mm256_permute_ps::<0xAA>(v),
        _ => _mm256_permute_ps::<0xFF>(v),
    }
}

/// The f16 scale of token `t`'s block (0 past the tile's `T` tokens).
#[inline(always)]
unsafe fn act_scale<const T: usize>(a: *const u8, stride: usize, t: usize) -> f32 {
    if t < T {
        f16_at(a.add(t * stride))
    } else {
        0.0
    }
}

/// Rows `r0..r0+R` × tokens `t0..t0+T` of the panel.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // acc[r][t] in both orders
unsafe fn tile<B: I8Block, D: IntDot, const R: usize, const T: usize>(p: &Panel<'_>, r0: usize, t0: usize, out: &mut [f32]) {
    let nb = p.cols / 32;
    let (rs, ast) = (p.row_stride, p.act_stride);
    let wp = p.w.as_ptr().add(r0 * rs);
    let ap = p.act.as_ptr().add(t0 * ast);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for b in 0..nb {
        // The next tile's rows, into L2, once per 64 bytes of a row, as the
        // generic tile does.
        if b % (64 / B::WB) == 0 {
            for r in 0..R {
                _mm_prefetch::<_MM_HINT_T1>(wp.wrapping_add((R + r) * rs + b * B::WB) as *const i8);
            }
        }
        let a = ap.add(b * AB);
        let da = _mm_setr_ps(act_scale::<T>(a, ast, 0), act_scale::<T>(a, ast, 1), act_scale::<T>(a, ast, 2), act_scale::<T>(a, ast, 3));
        let da = _mm256_set_m128(da, da);
        for r in 0..R {
            let w = wp.add(r * rs + b * B::WB);
            let q = B::quants(w);
            let aq = _mm256_abs_epi8(q);
            // d_w·d_a of the T pairs, one rounding each, as ggml's scalar product.
            let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(w)), da);
            for t in 0..T {
                let x = _mm256_loadu_si256(a.add(t * ast + 2) as *const __m256i);
                let i = D::dot(aq, _mm256_sign_epi8(x, q));
                acc[r][t] = _mm256_fmadd_ps(lane(d, t), _mm256_cvtepi32_ps(i), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            out[(t0 + t) * p.n_rows + r0 + r] = hsum256(acc[r][t]);
        }
    }
}

/// Tokens `t0..t0+nt` (nt ≤ [`MAX_T`]) × rows `r0..r0+nr` (nr ≤ 2).
#[inline(always)]
unsafe fn tile_n<B: I8Block, D: IntDot, const R: usize>(p: &Panel<'_>, r0: usize, t0: usize, nt: usize, out: &mut [f32]) {
    match nt {
        1 => tile::<B, D, R, 1>(p, r0, t0, out),
        2 => tile::<B, D, R, 2>(p, r0, t0, out),
        3 => tile::<B, D, R, 3>(p, r0, t0, out),
        _ => tile::<B, D, R, 4>(p, r0, t0, out),
    }
}

/// The whole panel (several tokens): token groups of up to [`MAX_T`] outer,
/// so a group's activations stay in L1 while the panel's rows pass over
/// them, in tiles of 2 rows (the last one alone).
#[inline(always)]
pub(super) unsafe fn run<B: I8Block, D: IntDot>(p: &Panel<'_>, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < p.n_tokens {
        let nt = MAX_T.min(p.n_tokens - t0);
        let mut r0 = 0;
        while r0 + 2 <= p.n_rows {
            tile_n::<B, D, 2>(p, r0, t0, nt, out);
            r0 += 2;
        }
        if r0 < p.n_rows {
            tile_n::<B, D, 1>(p, r0, t0, nt, out);
        }
        t0 += nt;
    }
}
