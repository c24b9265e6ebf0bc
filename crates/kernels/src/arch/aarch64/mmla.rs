//! Q4_0 and Q4_K prefill tiles by `smmla` (FEAT_I8MM), the `neon+i8mm`
//! level: the same bits as [`rows`](super::rows), since only the grouping
//! of each block's exact integer dot changes.
//!
//! `smmla` takes two rows' 8 bytes (`[row0 | row1]`, the 64-bit halves of
//! two rows' vectors zipped) and two tokens' (`[tok0 | tok1]`) and adds the
//! four dots `[r0·t0, r0·t1, r1·t0, r1·t1]`. So a tile's 4 rows are two row
//! pairs and its tokens are taken in pairs (an odd last token paired with
//! itself, its duplicate dropped); a 32-element block is 4 `smmla` per row
//! pair and token pair, where `sdot` needs 8 and a pairwise-add tree. The
//! two row pairs' results transpose back (`uzp1`/`uzp2`) into one vector of
//! the 4 rows per token, so the float step (convert, `d_w * d_a`, FMA) is
//! the `rows` one. Weights are zipped while still packed (a byte holds an
//! element of each nibble half), before the nibbles are split: half the
//! zips of zipping the unpacked vectors.
//!
//! A single token (decode) keeps `rows`' `sdot` tile: with one token, half
//! of each `smmla` would be wasted.

use super::int_dot::{smmla, Sdot};
use super::rows::{f16x4, k4_min_terms, k4_scales, k4_sub_sums, lanes4, RowTile, TileFn, LANES, MAX_T};
use crate::arch::f16::f16_at;
use crate::dispatch::Panel;
use std::arch::aarch64::*;
use std::marker::PhantomData;

/// Most token pairs per tile.
const MAX_P: usize = MAX_T / 2;

/// A format's 4-row × `T`-token tile by `smmla` (`T` ≥ 2).
pub(super) trait MmlaTile: RowTile {
    unsafe fn tile_mmla<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]);
}

/// `K`'s tiles by `smmla`, one token by `sdot`.
pub(super) struct ByMmla<K>(PhantomData<K>);
impl<K: MmlaTile> TileFn for ByMmla<K> {
    #[inline(always)]
    unsafe fn tile<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        if T == 1 {
            K::tile::<Sdot, T>(p, rows, t0, out)
        } else {
            K::tile_mmla::<T>(p, rows, t0, out)
        }
    }
}

/// `[a.lo | b.lo]` and `[a.hi | b.hi]`: the 64-bit halves of two rows' (or
/// tokens') 16 bytes, zipped.
#[inline(always)]
unsafe fn zip64(a: uint8x16_t, b: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    let (a, b) = (vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b));
    (vreinterpretq_u8_u64(vzip1q_u64(a, b)), vreinterpretq_u8_u64(vzip2q_u64(a, b)))
}

/// The 32 bytes at `p` of token a and `q` of token b, as 4 `smmla` operands:
/// elements 0..8, 8..16, 16..24, 24..32 of both.
#[inline(always)]
unsafe fn act_pairs(p: *const u8, q: *const u8) -> [int8x16_t; 4] {
    let (x0, x1) = zip64(vld1q_u8(p), vld1q_u8(q));
    let (y0, y1) = zip64(vld1q_u8(p.add(16)), vld1q_u8(q.add(16)));
    [vreinterpretq_s8_u8(x0), vreinterpretq_s8_u8(x1), vreinterpretq_s8_u8(y0), vreinterpretq_s8_u8(y1)]
}

/// `acc` plus the 32-element dots of a row pair's `w` and a token pair's `a`.
#[inline(always)]
unsafe fn mmla32(acc: int32x4_t, w: &[int8x16_t; 4], a: &[int8x16_t; 4]) -> int32x4_t {
    smmla(smmla(smmla(smmla(acc, w[0], a[0]), w[1], a[1]), w[2], a[2]), w[3], a[3])
}

/// The 4 rows' lanes of tokens a and b from the row pairs' 2×2 results
/// `s01 = [r0a, r0b, r1a, r1b]` and `s23`.
#[inline(always)]
unsafe fn untangle(s01: int32x4_t, s23: int32x4_t) -> (int32x4_t, int32x4_t) {
    (vuzp1q_s32(s01, s23), vuzp2q_s32(s01, s23))
}

/// The two tokens of pair `i` of a `T`-token tile: `2i` and `2i + 1`, or
/// the last token twice.
#[inline(always)]
fn pair<const T: usize>(i: usize) -> (usize, usize) {
    (2 * i, (2 * i + 1).min(T - 1))
}

impl MmlaTile for super::rows::Q4_0 {
    #[inline(always)]
    unsafe fn tile_mmla<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        const WB: usize = 18;
        const AB: usize = 34;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let (m4, eight, z) = (vdupq_n_u8(0x0f), vdupq_n_s8(8), vdupq_n_s32(0));
        let np = T.div_ceil(2);
        let mut acc = [vdupq_n_f32(0.0); T];
        for b in 0..p.cols / 32 {
            // Row pair h: elements 0..8, 8..16 (low nibbles), 16..24, 24..32 (high), q - 8.
            let mut w = [[vdupq_n_s8(0); 4]; 2];
            for (h, w) in w.iter_mut().enumerate() {
                let (x0, x1) = zip64(vld1q_u8(rows[2 * h].add(b * WB + 2)), vld1q_u8(rows[2 * h + 1].add(b * WB + 2)));
                let q = |v: uint8x16_t| vsubq_s8(vreinterpretq_s8_u8(v), eight);
                *w = [q(vandq_u8(x0, m4)), q(vandq_u8(x1, m4)), q(vshrq_n_u8::<4>(x0)), q(vshrq_n_u8::<4>(x1))];
            }
            let dw = f16x4(rows, b * WB);
            for i in 0..np {
                let (ta, tb) = pair::<T>(i);
                let (a, a2) = (ap.add(ta * p.act_stride + b * AB), ap.add(tb * p.act_stride + b * AB));
                let x = act_pairs(a.add(2), a2.add(2));
                let (sa, sb) = untangle(mmla32(z, &w[0], &x), mmla32(z, &w[1], &x));
                acc[ta] = vfmaq_f32(acc[ta], vcvtq_f32_s32(sa), vmulq_n_f32(dw, f16_at(a)));
                if tb != ta {
                    acc[tb] = vfmaq_f32(acc[tb], vcvtq_f32_s32(sb), vmulq_n_f32(dw, f16_at(a2)));
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            vst1q_f32(out[t].as_mut_ptr(), *acc);
        }
    }
}

impl MmlaTile for super::rows::Q4K {
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // w[r], sc[r], a[t] by index
    unsafe fn tile_mmla<const T: usize>(p: &Panel<'_>, rows: &[*const u8; LANES], t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        const WB: usize = 144;
        const AB: usize = 292;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let (m4, z) = (vdupq_n_u8(0x0f), vdupq_n_s32(0));
        let np = T.div_ceil(2);
        let mut acc = [vdupq_n_f32(0.0); T];
        let mut acc_min = [vdupq_n_f32(0.0); T];
        for b in 0..p.cols / 256 {
            let dw = f16x4(rows, b * WB);
            let dminw = f16x4(rows, b * WB + 2);
            let mut w = [rows[0]; LANES];
            for r in 0..LANES {
                w[r] = rows[r].add(b * WB);
            }
            let mut a = [ap; T];
            for t in 0..T {
                a[t] = ap.add(t * p.act_stride + b * AB);
            }
            let mut sc = [[0i32; 8]; LANES];
            let mut mn = [vdupq_n_s16(0); LANES];
            for r in 0..LANES {
                (sc[r], mn[r]) = k4_scales(w[r].add(4));
            }
            // The min terms as in `rows`, their FMA now.
            for t in 0..T {
                let ss = k4_sub_sums(a[t]);
                let m = lanes4([k4_min_terms(mn[0], ss), k4_min_terms(mn[1], ss), k4_min_terms(mn[2], ss), k4_min_terms(mn[3], ss)]);
                let da = std::ptr::read_unaligned(a[t] as *const f32);
                acc_min[t] = vfmaq_f32(acc_min[t], vcvtq_f32_s32(m), vmulq_n_f32(dminw, da));
            }
            // Row pair h's scales of sub-block j in `smmla`'s lanes,
            // `[sc[2h][j], sc[2h][j], sc[2h+1][j], sc[2h+1][j]]`: a zip of
            // `sz[h][j / 2]`, the two rows' scales interleaved.
            let mut sz = [[z; 4]; 2];
            for h in 0..2 {
                let (s0, s1) = (sc[2 * h].as_ptr(), sc[2 * h + 1].as_ptr());
                let (lo0, hi0) = (vld1q_s32(s0), vld1q_s32(s0.add(4)));
                let (lo1, hi1) = (vld1q_s32(s1), vld1q_s32(s1.add(4)));
                sz[h] = [vzip1q_s32(lo0, lo1), vzip2q_s32(lo0, lo1), vzip1q_s32(hi0, hi1), vzip2q_s32(hi0, hi1)];
            }
            // isum[i][h]: token pair i × row pair h, 2×2.
            let mut isum = [[z; 2]; MAX_P];
            for jj in 0..4 {
                // Sub-blocks 2jj (low nibbles) and 2jj + 1 (high) share 32 bytes.
                let mut wl = [[vdupq_n_s8(0); 4]; 2];
                let mut wh = [[vdupq_n_s8(0); 4]; 2];
                for h in 0..2 {
                    let (r0, r1) = (w[2 * h].add(16 + 32 * jj), w[2 * h + 1].add(16 + 32 * jj));
                    let (x0, x1) = zip64(vld1q_u8(r0), vld1q_u8(r1));
                    let (y0, y1) = zip64(vld1q_u8(r0.add(16)), vld1q_u8(r1.add(16)));
                    let lo = |v: uint8x16_t| vreinterpretq_s8_u8(vandq_u8(v, m4));
                    let hi = |v: uint8x16_t| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
                    wl[h] = [lo(x0), lo(x1), lo(y0), lo(y1)];
                    wh[h] = [hi(x0), hi(x1), hi(y0), hi(y1)];
                }
                for i in 0..np {
                    let (ta, tb) = pair::<T>(i);
                    let (qa, qb) = (a[ta].add(4 + 64 * jj), a[tb].add(4 + 64 * jj));
                    let (xl, xh) = (act_pairs(qa, qb), act_pairs(qa.add(32), qb.add(32)));
                    for h in 0..2 {
                        let (sl, sh) = (vzip1q_s32(sz[h][jj], sz[h][jj]), vzip2q_s32(sz[h][jj], sz[h][jj]));
                        let s = vmlaq_s32(isum[i][h], mmla32(z, &wl[h], &xl), sl);
                        isum[i][h] = vmlaq_s32(s, mmla32(z, &wh[h], &xh), sh);
                    }
                }
            }
            for i in 0..np {
                let (ta, tb) = pair::<T>(i);
                let (sa, sb) = untangle(isum[i][0], isum[i][1]);
                let da = std::ptr::read_unaligned(a[ta] as *const f32);
                acc[ta] = vfmaq_f32(acc[ta], vcvtq_f32_s32(sa), vmulq_n_f32(dw, da));
                if tb != ta {
                    let da = std::ptr::read_unaligned(a[tb] as *const f32);
                    acc[tb] = vfmaq_f32(acc[tb], vcvtq_f32_s32(sb), vmulq_n_f32(dw, da));
                }
            }
        }
        for t in 0..T {
            vst1q_f32(out[t].as_mut_ptr(), vsubq_f32(acc[t], acc_min[t]));
        }
    }
}
