//! AVX-512 Q4_K × Q8_K with one weight row per lane, 16 rows a group.
//!
//! `avx2_rows`' Q4_K kernel in 512-bit vectors: per super-block the 16 rows'
//! scales and mins are transposed into one dword lane per row, each 32-byte
//! run of quants into 8 vectors (group `g`: bytes 4g..4g+3 of row i in lane
//! i; low nibbles are sub-block 2jj, high nibbles 2jj + 1), and a token's
//! sub-block is 8 `vpmaddubsw` against its 4-byte groups broadcast from
//! memory, summed as i16, one `vpmaddwd` by the rows' scales, one add. The
//! integer sums and the float steps per (row, token) are `avx2_rows`' (the
//! model is `tests::row_lane_dot_q4_k`), so the two levels give the same
//! bits: llama.cpp's repacked `ggml_gemm_q4_K_8x8_q8_K` order.
//!
//! Why: the avx512 level ran Q4_K prefill on the 256-bit kernel, no faster
//! than avx2, and behind llama.cpp's AVX-512 build (0.85-0.92x on a
//! 1B-shaped file, docs/BENCHMARKS.md); twice the rows per instruction is
//! what the wider registers give.
//!
//! i16 sums cannot overflow: an i16 lane collects 16 products of a nibble
//! (0..15) and a Q8_K quant (|q| ≤ 128): at most 16 · 15 · 128 = 30720.

use super::avx512_rows::{f16x16, halves2, prefetch_groups, transpose16x16, transpose16x32, Group, OneGroup, LANES, MAX_ROW_STRIDE};
use super::rows::Rows;
use crate::dispatch::Panel;
use std::arch::x86_64::*;

/// Bytes of a Q4_K super-block: d, dmin (f16), 12 scale bytes, 128 quant bytes.
const WB: usize = 144;
/// Bytes of a Q8_K super-block: d (f32), 256 quants, 16 i16 sums.
const AB: usize = 292;
/// Most tokens per tile. Measured on a 1B-shaped Q4_K file (`hearth bench
/// -p 128 -n 0 -t 1`, Intel Xeon): 4 tokens 91 tok/s, 8 tokens 107-108, 16
/// tokens 106-112 (the 8 weight vectors of a sub-block serve more tokens;
/// past 8 the accumulators spill).
const MAX_T: usize = 8;

/// The `vpshufb` pattern taking bytes b0 and b1 of every dword to its two
/// i16 halves (zero-extended), in every 128-bit lane.
#[inline(always)]
unsafe fn pairs(b0: i32, b1: i32) -> __m512i {
    const Z: i32 = 0x80;
    let d0 = b0 | (Z << 8) | (b1 << 16) | (Z << 24);
    let d = 0x0404_0404; // + 4 per dword: the same bytes of the next dword
    _mm512_broadcast_i32x4(_mm_setr_epi32(d0, d0 + d, d0 + 2 * d, d0 + 3 * d))
}

/// A super-block's head for 16 rows, one row per dword lane: `sc[j]` = (scale j, scale j)
/// as two i16 (the `vpmaddwd` factor of sub-block j's i16 pair sums), `mn[k]` = (min 2k,
/// min 2k+1) as two i16; and the rows' d and dmin.
type Head = ([__m512i; 8], [__m512i; 4], __m512, __m512);

/// The 16 rows' scales and mins from their 12 scale bytes as dwords 0, 1, 2 of lane i
/// (ggml's `get_scale_min_k4` as dword arithmetic, `utmp` in `ggml_vec_dot_q4_K_q8_K`).
#[inline(always)]
unsafe fn unpack(u: [__m512i; 3]) -> ([__m512i; 8], [__m512i; 4]) {
    let (km1, km2, km3) = (_mm512_set1_epi32(0x3f3f3f3f), _mm512_set1_epi32(0x0f0f0f0f), _mm512_set1_epi32(0x03030303));
    let sc_lo = _mm512_and_si512(u[0], km1);
    let mn_lo = _mm512_and_si512(u[1], km1);
    let sc_hi = _mm512_or_si512(_mm512_and_si512(u[2], km2), _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u[0]), km3)));
    let mn_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(u[2]), km2),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u[1]), km3)),
    );
    let sc = [
        _mm512_shuffle_epi8(sc_lo, pairs(0, 0)),
        _mm512_shuffle_epi8(sc_lo, pairs(1, 1)),
        _mm512_shuffle_epi8(sc_lo, pairs(2, 2)),
        _mm512_shuffle_epi8(sc_lo, pairs(3, 3)),
        _mm512_shuffle_epi8(sc_hi, pairs(0, 0)),
        _mm512_shuffle_epi8(sc_hi, pairs(1, 1)),
        _mm512_shuffle_epi8(sc_hi, pairs(2, 2)),
        _mm512_shuffle_epi8(sc_hi, pairs(3, 3)),
    ];
    let mn = [
        _mm512_shuffle_epi8(mn_lo, pairs(0, 1)),
        _mm512_shuffle_epi8(mn_lo, pairs(2, 3)),
        _mm512_shuffle_epi8(mn_hi, pairs(0, 1)),
        _mm512_shuffle_epi8(mn_hi, pairs(2, 3)),
    ];
    (sc, mn)
}

/// Where a tile's super-blocks come from: GGUF's Q4_K rows ([`RowMajor`]) or Q4_KX8's
/// groups ([`Grouped`]). Both give the tile the same vectors, so the same bits.
trait Q4KSource {
    /// Whether a panel's last 16 rows may be one 8-row group (read as `OneGroup`).
    const GROUPED: bool;
    /// Super-block `b`'s [`Head`].
    unsafe fn head<R: Rows>(g: &Group, rows: &R, b: usize) -> Head;
    /// Quarter `jj` of super-block `b`'s quants: bytes `32jj..32jj + 32` of the 16 rows,
    /// vector g holding bytes 4g..4g+3 of row i in lane i.
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m512i; 8];
    /// The prefetches while quarter `jj` of super-block `b` (of `nsb`) is read by the tile
    /// of `T` tokens from `t0`.
    unsafe fn prefetch<R: Rows, const T: usize>(g: &Group, rows: &R, b: usize, jj: usize, nsb: usize, t0: usize);
}

/// GGUF's Q4_K rows, transposed in registers.
struct RowMajor;
impl Q4KSource for RowMajor {
    const GROUPED: bool = false;
    #[inline(always)]
    unsafe fn head<R: Rows>(g: &Group, rows: &R, b: usize) -> Head {
        let off = b * WB;
        // Bytes off+4..off+20 of row i, transposed: u[h] = dword h in lane i.
        let u = transpose16x16(rows, off + 4);
        let (sc, mn) = unpack([u[0], u[1], u[2]]);
        // d in the low half of the dword at `off`, dmin in the high half.
        let v = _mm512_i32gather_epi32::<1>(g.idx, rows.at(0, off) as *const i32);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)));
        (sc, mn, d, dmin)
    }
    #[inline(always)]
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m512i; 8] {
        transpose16x32(rows, b * WB + 16 + 32 * jj)
    }
    #[inline(always)]
    unsafe fn prefetch<R: Rows, const T: usize>(g: &Group, rows: &R, b: usize, jj: usize, nsb: usize, _t0: usize) {
        // As `avx2_rows`' Q4_K: a quarter of a later group's super-block into L2 per
        // 32-byte run (one burst of 36 lines stalled), and for decode this group's next
        // super-block into L1, four rows per run.
        super::prefetch_group_step(g.next, 4 * b + jj, LANES * WB / 4);
        if T == 1 && b + 1 < nsb {
            for r in 4 * jj..4 * jj + 4 {
                let q = rows.at(r, (b + 1) * WB);
                for o in [0, 64, 128, WB - 1] {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
                }
            }
        }
    }
}

/// How far past its reads each of [`Grouped`]'s two streams prefetches into L1 (the avx2
/// Q4_KX8 tile's 1.5 KiB for its one stream): the best of 1, 1.5 and 3 KiB, 1.5 and 3
/// within noise at 1 thread, on the 7B's decode matmuls (`TYPE=q4_kx8`, Intel host,
/// docs/BENCHMARKS.md session 45).
const Q4_KX8_AHEAD: usize = 1536;

/// Q4_KX8 (`hearth_quant::interleave`): the 16 rows are two 8-row groups
/// (`rows.at(0, ·)`, `rows.at(8, ·)`), per super-block each group's 8 d, 8 dmin, then 35
/// words of 8 rows (3 of scales, 32 of quants) already transposed: 256-bit loads of the
/// two groups side by side, no transposes and no gather.
struct Grouped;
impl Q4KSource for Grouped {
    const GROUPED: bool = true;
    #[inline(always)]
    unsafe fn head<R: Rows>(_g: &Group, rows: &R, b: usize) -> Head {
        let (p, q) = (rows.at(0, 8 * WB * b), rows.at(8, 8 * WB * b));
        let (sc, mn) = unpack([halves2(p.add(32), q.add(32)), halves2(p.add(64), q.add(64)), halves2(p.add(96), q.add(96))]);
        (sc, mn, f16x16(p, q), f16x16(p.add(16), q.add(16)))
    }
    #[inline(always)]
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m512i; 8] {
        let o = 8 * WB * b + 128 + 256 * jj;
        let (p, q) = (rows.at(0, o), rows.at(8, o));
        let h = |g: usize| halves2(p.add(32 * g), q.add(32 * g));
        [h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)]
    }
    /// The first tile of a group (the later ones find its bytes cached): a quarter of
    /// each group's super-block per quarter into L1, [`Q4_KX8_AHEAD`] past its reads.
    #[inline(always)]
    unsafe fn prefetch<R: Rows, const T: usize>(_g: &Group, rows: &R, b: usize, jj: usize, _nsb: usize, t0: usize) {
        if t0 == 0 {
            let off = 8 * WB * b + Q4_KX8_AHEAD;
            prefetch_groups(rows, off + jj * 2 * WB..off + (jj + 1) * 2 * WB);
        }
    }
}

/// The (unaligned) 4 bytes at `p` in every dword lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Sub-block `j` of T tokens: `isum[t] += scale_j * sum(w * a)` per row.
#[inline(always)]
unsafe fn sub<const T: usize>(w: &[__m512i; 8], sc: __m512i, ap: *const u8, stride: usize, j: usize, isum: &mut [__m512i; T]) {
    for (t, isum) in isum.iter_mut().enumerate() {
        let a = ap.add(t * stride + 4 + 32 * j);
        let mut s = _mm512_maddubs_epi16(w[0], bcast4(a));
        for (g, w) in w.iter().enumerate().skip(1) {
            s = _mm512_add_epi16(s, _mm512_maddubs_epi16(*w, bcast4(a.add(4 * g))));
        }
        *isum = _mm512_add_epi32(*isum, _mm512_madd_epi16(s, sc));
    }
}

/// Tokens `t0..t0+T` × the group's rows.
#[inline(always)]
unsafe fn tile<S: Q4KSource, R: Rows, const T: usize>(p: &Panel<'_>, g: &Group, rows: &R, t0: usize, out: &mut [f32]) {
    let nsb = p.cols / 256;
    let ap = p.act.as_ptr().add(t0 * p.act_stride);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    let m4 = _mm512_set1_epi8(0x0f);
    for b in 0..nsb {
        let (sc, mn, dw, dminw) = S::head(g, rows, b);
        let ab = ap.add(b * AB);
        // Mins: imin = sum_j min_j * (sum of sub-block j's activations).
        for (t, acc_min) in acc_min.iter_mut().enumerate() {
            let a = ab.add(t * p.act_stride);
            let bs = _mm256_loadu_si256(a.add(260) as *const __m256i);
            // [sum of sub-block 0, .., 7] as i16 (|sum| ≤ 32 · 128).
            let s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
            let b01 = _mm512_broadcastd_epi32(s32);
            let b23 = _mm512_broadcastd_epi32(_mm_srli_si128::<4>(s32));
            let b45 = _mm512_broadcastd_epi32(_mm_srli_si128::<8>(s32));
            let b67 = _mm512_broadcastd_epi32(_mm_srli_si128::<12>(s32));
            let imin = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_madd_epi16(mn[0], b01), _mm512_madd_epi16(mn[1], b23)),
                _mm512_add_epi32(_mm512_madd_epi16(mn[2], b45), _mm512_madd_epi16(mn[3], b67)),
            );
            let da = _mm512_set1_ps(std::ptr::read_unaligned(a as *const f32));
            *acc_min = _mm512_fmadd_ps(_mm512_mul_ps(dminw, da), _mm512_cvtepi32_ps(imin), *acc_min);
        }
        let mut isum = [_mm512_setzero_si512(); T];
        for jj in 0..4 {
            S::prefetch::<R, T>(g, rows, b, jj, nsb, t0);
            let raw = S::quants(rows, b, jj);
            let lo = |i: usize| _mm512_and_si512(raw[i], m4);
            let w = [lo(0), lo(1), lo(2), lo(3), lo(4), lo(5), lo(6), lo(7)];
            sub::<T>(&w, sc[2 * jj], ab, p.act_stride, 2 * jj, &mut isum);
            let hi = |i: usize| _mm512_and_si512(_mm512_srli_epi16::<4>(raw[i]), m4);
            let w = [hi(0), hi(1), hi(2), hi(3), hi(4), hi(5), hi(6), hi(7)];
            sub::<T>(&w, sc[2 * jj + 1], ab, p.act_stride, 2 * jj + 1, &mut isum);
        }
        for t in 0..T {
            let da = _mm512_set1_ps(std::ptr::read_unaligned(ab.add(t * p.act_stride) as *const f32));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    let mask: __mmask16 = if g.n == LANES { !0 } else { (1u16 << g.n) - 1 };
    for t in 0..T {
        _mm512_mask_storeu_ps(out.as_mut_ptr().add((t0 + t) * p.n_rows + g.r0), mask, _mm512_sub_ps(acc[t], acc_min[t]));
    }
}

/// One group × tiles of up to [`MAX_T`] tokens.
#[inline(always)]
unsafe fn tiles<S: Q4KSource, R: Rows>(p: &Panel<'_>, g: &Group, rows: &R, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < p.n_tokens {
        let nt = MAX_T.min(p.n_tokens - t0);
        macro_rules! go {
            ($($t:literal)*) => {
                match nt {
                    $($t => tile::<S, R, $t>(p, g, rows, t0, out),)*
                    _ => unreachable!("tile of {nt} tokens"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
        t0 += nt;
    }
}

/// The whole panel: 16-row groups × tiles of up to [`MAX_T`] tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn run<S: Q4KSource>(p: &Panel<'_>, out: &mut [f32]) {
    for r0 in (0..p.n_rows).step_by(LANES) {
        let g = Group::new(p, r0);
        if g.n == LANES {
            tiles::<S, _>(p, &g, &g.strided(p), out)
        } else if S::GROUPED {
            tiles::<S, _>(p, &g, &OneGroup(p.w.as_ptr().add(r0 * p.row_stride)), out)
        } else {
            tiles::<S, _>(p, &g, &g.listed(p), out)
        }
    }
}

/// The Q4_K panel: checks bounds first. Rows too far apart for the scale
/// gather's 32-bit offsets take `avx2_rows`' kernel: the same arithmetic.
pub(super) fn panel_q4_k(p: &Panel<'_>, out: &mut [f32]) {
    if p.row_stride > MAX_ROW_STRIDE {
        return super::avx2_rows::panel_q4_k(p, out);
    }
    p.check(hearth_quant::GgmlType::Q8_K, out);
    // SAFETY: this kernel is only in the avx512 level's tables, handed out
    // when AVX2/FMA/F16C and AVX-512 F/BW/VL were detected; `check` bounds
    // every weight and activation read (a partial group's missing rows
    // repeat its last row), and the masked stores stay inside `out`'s
    // checked size.
    unsafe { run::<RowMajor>(p, out) }
}

/// The Q4_KX8 panel (bounds as Q4_K's: `Panel::check` knows its groups; nothing is
/// gathered, so any row stride).
pub(super) fn panel_q4_kx8(p: &Panel<'_>, out: &mut [f32]) {
    p.check(hearth_quant::GgmlType::Q8_K, out);
    // SAFETY: as `panel_q4_k`; whole 8-row groups (`check`): a panel's last 16 rows are
    // two groups (`Strided`) or one (`OneGroup`, whose rows 8-15 read rows 0-7 again).
    unsafe { run::<Grouped>(p, out) }
}
