//! Q4_0 × Q8_0 and Q4_K × Q8_K with one weight row per f32 lane: the x86
//! levels' `avx2_rows` order, llama.cpp's repacked kernels' order.
//!
//! - Q4_0, per (row, token) and block: the exact integer dot, then `acc =
//!   fma(d_w * d_a, float(sum), acc)` (model: `tests::row_lane_dot`).
//! - Q4_K, per super-block: `isum = sum_j scale_j * dot_j` and `imin =
//!   sum_j min_j * (activation sum of sub-block j)`, exact; then `acc =
//!   fma(d_w * d_a, float(isum), acc)`, `acc_min = fma(dmin_w * d_a,
//!   float(imin), acc_min)`, result `acc - acc_min` (model:
//!   `tests::row_lane_q4_k`).
//!
//! Four rows' integer sums land in the four lanes of one vector (two
//! pairwise adds of their 4-group partial sums), so the convert, the scale
//! and the FMA are one instruction each for four rows. Nibbles are made
//! signed (`q - 8`) for Q4_0 before the dot, so no activation sums are needed.

use super::int_dot::IntDot;
use crate::arch::f16::f16_at;
use crate::dispatch::Panel;
use hearth_quant::k::get_scale_min_k4;
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// Rows per group: one per f32 lane.
pub(super) const LANES: usize = 4;
/// Most tokens per tile.
pub(super) const MAX_T: usize = 4;

/// One format's tile of 4 rows × `T` tokens.
pub(super) trait RowTile {
    /// Tokens `t0..t0+T` × the 4 rows starting at `rows`, into `out[t]`.
    unsafe fn tile<D: IntDot, const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]);
}

/// Lane r: the sum of the 4 lanes of `s[r]` (exact).
#[inline(always)]
pub(super) unsafe fn lanes4(s: [int32x4_t; LANES]) -> int32x4_t {
    vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]))
}

/// The f16 at byte `o` of each row, as f32 lanes.
#[inline(always)]
pub(super) unsafe fn f16x4(rows: &[*const u8; LANES], o: usize) -> float32x4_t {
    let d = [f16_at(rows[0].add(o)), f16_at(rows[1].add(o)), f16_at(rows[2].add(o)), f16_at(rows[3].add(o))];
    vld1q_f32(d.as_ptr())
}

/// Low and high nibbles of the 16 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (int8x16_t, int8x16_t) {
    let v = vld1q_u8(p);
    (vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)))
}

/// Q4_0 weights × Q8_0 activations.
pub(super) struct Q4_0;
impl RowTile for Q4_0 {
    #[inline(always)]
    unsafe fn tile<D: IntDot, const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        const WB: usize = 18;
        const AB: usize = 34;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let (eight, z) = (vdupq_n_s8(8), vdupq_n_s32(0));
        let mut acc = [vdupq_n_f32(0.0); T];
        for b in 0..p.cols / 32 {
            // The 4 rows' block: elements 0..16 (low nibbles) and 16..32 (high), q - 8.
            let mut lo = [vdupq_n_s8(0); LANES];
            let mut hi = [vdupq_n_s8(0); LANES];
            for r in 0..LANES {
                let (l, h) = nibbles(rows[r].add(b * WB + 2));
                lo[r] = vsubq_s8(l, eight);
                hi[r] = vsubq_s8(h, eight);
            }
            let dw = f16x4(rows, b * WB);
            for (t, acc) in acc.iter_mut().enumerate() {
                let a = ap.add(t * p.act_stride + b * AB);
                let (a0, a1) = (vld1q_s8(a.add(2) as *const i8), vld1q_s8(a.add(18) as *const i8));
                let s = [
                    D::dot(D::dot(z, lo[0], a0), hi[0], a1),
                    D::dot(D::dot(z, lo[1], a0), hi[1], a1),
                    D::dot(D::dot(z, lo[2], a0), hi[2], a1),
                    D::dot(D::dot(z, lo[3], a0), hi[3], a1),
                ];
                *acc = vfmaq_f32(*acc, vcvtq_f32_s32(lanes4(s)), vmulq_n_f32(dw, f16_at(a)));
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            vst1q_f32(out[t].as_mut_ptr(), *acc);
        }
    }
}

/// The 8 scales and 8 mins of the Q4_K/Q5_K super-block whose 12 scale
/// bytes are at `p` (ggml's `get_scale_min_k4`), as i32 and i16.
#[inline(always)]
pub(super) unsafe fn k4_scales(p: *const u8) -> ([i32; 8], int16x8_t) {
    let q = std::ptr::read_unaligned(p as *const [u8; 12]);
    let mut sc = [0i32; 8];
    let mut mn = [0i16; 8];
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &q);
        sc[j] = s as i32;
        mn[j] = m as i16;
    }
    (sc, vld1q_s16(mn.as_ptr()))
}

/// The 8 sub-block sums of a Q8_K block at `a` (the pairs of its 16-element sums).
#[inline(always)]
pub(super) unsafe fn k4_sub_sums(a: *const u8) -> int16x8_t {
    vpaddq_s16(vld1q_s16(a.add(260) as *const i16), vld1q_s16(a.add(276) as *const i16))
}

/// `[min_j * sub_sums_j]` in 4 lanes (exact: the sum of the lanes is the
/// super-block's min term).
#[inline(always)]
pub(super) unsafe fn k4_min_terms(mn: int16x8_t, sub_sums: int16x8_t) -> int32x4_t {
    vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(sub_sums)), mn, sub_sums)
}

/// Q4_K weights × Q8_K activations.
pub(super) struct Q4K;
impl RowTile for Q4K {
    #[inline(always)]
    unsafe fn tile<D: IntDot, const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        const WB: usize = 144;
        const AB: usize = 292;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let z = vdupq_n_s32(0);
        let mut acc = [vdupq_n_f32(0.0); T];
        let mut acc_min = [vdupq_n_f32(0.0); T];
        for b in 0..p.cols / 256 {
            let dw = f16x4(rows, b * WB);
            let dminw = f16x4(rows, b * WB + 2);
            let mut isum = [[z; LANES]; T];
            let mut imin = [[z; LANES]; T];
            // Per token, once for the 4 rows.
            let mut sub_sums = [vdupq_n_s16(0); T];
            for (t, s) in sub_sums.iter_mut().enumerate() {
                *s = k4_sub_sums(ap.add(t * p.act_stride + b * AB));
            }
            for r in 0..LANES {
                let w = rows[r].add(b * WB);
                let (sc, mn) = k4_scales(w.add(4));
                for t in 0..T {
                    let a = ap.add(t * p.act_stride + b * AB);
                    imin[t][r] = k4_min_terms(mn, sub_sums[t]);
                    // Sub-blocks 2jj (low nibbles) and 2jj + 1 (high) share 32 bytes.
                    let mut s = z;
                    for jj in 0..4 {
                        let (l0, h0) = nibbles(w.add(16 + 32 * jj));
                        let (l1, h1) = nibbles(w.add(32 + 32 * jj));
                        let q = a.add(4 + 64 * jj);
                        let lo = D::dot(D::dot(z, l0, vld1q_s8(q as *const i8)), l1, vld1q_s8(q.add(16) as *const i8));
                        let hi = D::dot(D::dot(z, h0, vld1q_s8(q.add(32) as *const i8)), h1, vld1q_s8(q.add(48) as *const i8));
                        s = vmlaq_n_s32(vmlaq_n_s32(s, lo, sc[2 * jj]), hi, sc[2 * jj + 1]);
                    }
                    isum[t][r] = s;
                }
            }
            for t in 0..T {
                let da = std::ptr::read_unaligned(ap.add(t * p.act_stride + b * AB) as *const f32);
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(lanes4(isum[t])), vmulq_n_f32(dw, da));
                acc_min[t] = vfmaq_f32(acc_min[t], vcvtq_f32_s32(lanes4(imin[t])), vmulq_n_f32(dminw, da));
            }
        }
        for t in 0..T {
            vst1q_f32(out[t].as_mut_ptr(), vsubq_f32(acc[t], acc_min[t]));
        }
    }
}

/// How a tile of 4 rows × `T` tokens is computed.
pub(super) trait TileFn {
    unsafe fn tile<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]);
}

/// `K`'s tiles with integer dots by `D`, one row at a time.
pub(super) struct ByDot<K, D>(PhantomData<(K, D)>);
impl<K: RowTile, D: IntDot> TileFn for ByDot<K, D> {
    #[inline(always)]
    unsafe fn tile<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        K::tile::<D, T>(p, rows, t0, out)
    }
}

/// The whole panel: 4-row groups × tiles of up to [`MAX_T`] tokens. A group
/// past the last row repeats it (those lanes are computed, not stored).
#[inline(always)]
pub(super) unsafe fn run<F: TileFn>(p: &Panel<'_>, out: &mut [f32]) {
    let base = p.w.as_ptr();
    let mut buf = [[0f32; LANES]; MAX_T];
    for r0 in (0..p.n_rows).step_by(LANES) {
        let n = LANES.min(p.n_rows - r0);
        let mut rows = [base; LANES];
        for (i, row) in rows.iter_mut().enumerate() {
            *row = base.add((r0 + i).min(p.n_rows - 1) * p.row_stride);
        }
        let mut t0 = 0;
        while t0 < p.n_tokens {
            let nt = MAX_T.min(p.n_tokens - t0);
            match nt {
                1 => F::tile::<1>(p, &rows, t0, &mut buf),
                2 => F::tile::<2>(p, &rows, t0, &mut buf),
                3 => F::tile::<3>(p, &rows, t0, &mut buf),
                _ => F::tile::<4>(p, &rows, t0, &mut buf),
            }
            for (t, b) in buf.iter().enumerate().take(nt) {
                out[(t0 + t) * p.n_rows + r0..][..n].copy_from_slice(&b[..n]);
            }
            t0 += nt;
        }
    }
}
