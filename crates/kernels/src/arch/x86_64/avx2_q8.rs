//! The 32-element block formats with one f16 scale per block (Q8_0, Q5_0,
//! and with a per-block minimum Q4_1, Q5_1) × Q8_0 / Q8_1 activations at the
//! 256-bit levels, in ggml's plain AVX2 order (`ggml_vec_dot_q8_0_q8_0` and
//! its siblings): per (row, token) 8 f32 lanes, lane k += `d_w·d_a · float(Σ
//! w·a over bytes 4k..4k+3)` block by block, then `hsum_float_8`; for Q4_1 and
//! Q5_1 plus the `m_w·s_a` terms, summed apart by one FMA per block (ggml's
//! `summs`, contracted as C compilers do) and added last. The same bits as
//! the generic tile's formats (`avx2::Q8_0`, `avx2::Q4_1`, `avx2_k::Q5_0`,
//! `avx2_k::Q5_1`), and so llama.cpp's (test:
//! `tests::block_tiles_equal_ggmls_order`), in fewer instructions.
//!
//! Why a tile of its own: on AVX2 every step of the plain order runs on the
//! two multiply ports (sign, `vpmaddubsw`, `vpmaddwd`, convert, FMA), and
//! the generic tile (`tile::Fmt`) adds the scale product `d_w·d_a` per pair
//! (a scalar multiply, then a broadcast) and for Q4_1/Q5_1 the `m_w·s_a` FMA
//! per pair. Prefill was bound by those ports (measured: 6 of 7 µops per
//! Q8_0 pair, 61 GFLOP/s on a SmolLM2 layer). Here a tile's scale products
//! are one vector multiply per row (row scale × the T tokens' scales, held
//! in both 128-bit halves), each pair taking its product with one in-lane
//! permute on the shuffle port, and the `m_w·s_a` terms one FMA per row for
//! all T tokens (token t in lane t). Same f32 roundings, same bits.

use super::int_dot::IntDot;
use super::tile::{f16_at, hsum256};
use crate::dispatch::Panel;
use hearth_quant::GgmlType;
use std::arch::x86_64::*;

/// A weight block format: an f16 scale at byte 0 (and with `MIN` an f16
/// minimum at byte 2), then quants that unpack to 32 bytes.
pub(super) trait Block {
    /// Bytes per block.
    const WB: usize;
    /// Quants are i8 (dotted through the sign trick, `|w|` and `sign(a, w)`)
    /// rather than u8.
    const SIGNED: bool;
    /// A minimum per block: Q8_1 activations, and the `m_w·s_a` terms.
    const MIN: bool;
    /// The block at `p`'s 32 quants.
    unsafe fn quants(p: *const u8) -> __m256i;
}

/// The activation type a panel of `B` reads.
pub(super) fn act_type<B: Block>() -> GgmlType {
    if B::MIN {
        GgmlType::Q8_1
    } else {
        GgmlType::Q8_0
    }
}

/// Q8_0: the quants as stored.
pub(super) struct Q8_0;
impl Block for Q8_0 {
    const WB: usize = 34;
    const SIGNED: bool = true;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.add(2) as *const __m256i)
    }
}

/// Q5_0: 4 low bits as nibbles, the fifth from a 32-bit mask, minus 16.
pub(super) struct Q5_0;
impl Block for Q5_0 {
    const WB: usize = 22;
    const SIGNED: bool = true;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        super::avx2_k::q5_0_quants(p)
    }
}

/// Q4_1: nibbles (0..15).
pub(super) struct Q4_1;
impl Block for Q4_1 {
    const WB: usize = 20;
    const SIGNED: bool = false;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        super::avx2::nibbles(p.add(4))
    }
}

/// Q5_1: nibbles and the fifth bit (0..31).
pub(super) struct Q5_1;
impl Block for Q5_1 {
    const WB: usize = 24;
    const SIGNED: bool = false;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> __m256i {
        super::avx2_k::q5_1_quants(p)
    }
}

/// Most tokens per tile: 2 rows × 4 tokens of accumulators, 2 rows of
/// weights (signed and absolute), the scale products (and minimum terms)
/// and temporaries fill the 16 registers.
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

/// The f16 at `a + t * stride` (0 past the tile's `T` tokens).
#[inline(always)]
unsafe fn act_f16<const T: usize>(a: *const u8, stride: usize, t: usize) -> f32 {
    if t < T {
        f16_at(a.add(t * stride))
    } else {
        0.0
    }
}

/// The f16s at `a + t * stride` of the tile's tokens in lane t of both
/// 128-bit halves.
#[inline(always)]
unsafe fn act_f16x4<const T: usize>(a: *const u8, stride: usize) -> __m256 {
    let v = _mm_setr_ps(act_f16::<T>(a, stride, 0), act_f16::<T>(a, stride, 1), act_f16::<T>(a, stride, 2), act_f16::<T>(a, stride, 3));
    _mm256_set_m128(v, v)
}

/// Rows `r0..r0+R` × tokens `t0..t0+T` of the panel.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // acc[r][t] in both orders
unsafe fn tile<B: Block, D: IntDot, const R: usize, const T: usize>(p: &Panel<'_>, r0: usize, t0: usize, out: &mut [f32]) {
    let nb = p.cols / 32;
    let (rs, ast) = (p.row_stride, p.act_stride);
    // Q8_1 (d, s, quants) or Q8_0 (d, quants) activation blocks.
    let (ab, aq) = if B::MIN { (36, 4) } else { (34, 2) };
    let wp = p.w.as_ptr().add(r0 * rs);
    let ap = p.act.as_ptr().add(t0 * ast);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    // m_w·s_a of row r, token t in lane t.
    let mut acc_min = [_mm256_setzero_ps(); R];
    let pf = super::prefetch_rows(p, r0, R);
    for b in 0..nb {
        // The rows a few tiles on, into L2, once per 64 bytes of a row, as
        // the generic tile does.
        if !pf.is_null() && b % (64 / B::WB) == 0 {
            for r in 0..R {
                _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(r * rs + b * B::WB) as *const i8);
            }
        }
        let a = ap.add(b * ab);
        let da = act_f16x4::<T>(a, ast);
        let sa = if B::MIN { act_f16x4::<T>(a.add(2), ast) } else { da };
        for r in 0..R {
            let w = wp.add(r * rs + b * B::WB);
            let q = B::quants(w);
            let u = if B::SIGNED { _mm256_abs_epi8(q) } else { q };
            // d_w·d_a of the T pairs, one rounding each, as ggml's scalar product.
            let d = _mm256_mul_ps(_mm256_set1_ps(f16_at(w)), da);
            if B::MIN {
                acc_min[r] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w.add(2))), sa, acc_min[r]);
            }
            for t in 0..T {
                let x = _mm256_loadu_si256(a.add(t * ast + aq) as *const __m256i);
                let i = if B::SIGNED { D::dot(u, _mm256_sign_epi8(x, q)) } else { D::dot(u, x) };
                acc[r][t] = _mm256_fmadd_ps(lane(d, t), _mm256_cvtepi32_ps(i), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        let mut m = [0f32; 8];
        if B::MIN {
            _mm256_storeu_ps(m.as_mut_ptr(), acc_min[r]);
        }
        for t in 0..T {
            let v = hsum256(acc[r][t]);
            out[(t0 + t) * p.n_rows + r0 + r] = if B::MIN { v + m[t] } else { v };
        }
    }
}

/// Tokens `t0..t0+nt` (nt ≤ [`MAX_T`]) × rows `r0..r0+nr` (nr ≤ 2).
#[inline(always)]
unsafe fn tile_n<B: Block, D: IntDot, const R: usize>(p: &Panel<'_>, r0: usize, t0: usize, nt: usize, out: &mut [f32]) {
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
pub(super) unsafe fn run<B: Block, D: IntDot>(p: &Panel<'_>, out: &mut [f32]) {
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
