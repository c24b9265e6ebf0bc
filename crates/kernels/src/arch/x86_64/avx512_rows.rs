//! AVX-512 VNNI dots with one weight row per lane: Q4_0 × Q8_0, Q8_0 × Q8_0.
//!
//! The paired kernels (`avx512_pair`) keep ggml's arithmetic: 8 f32 lanes
//! per (row, token), so every `vpdpbusd` costs three float instructions
//! (convert, scale, FMA) and a tile is bound by them. Here lane `i` of a
//! vector is row `i` of a 16-row group instead: a block's 16 rows are
//! transposed in registers into 8 vectors (group `g`: elements 4g..4g+3 of
//! each row), and a token's block is 8 `vpdpbusd` against its 4-byte groups
//! broadcast from memory, then one convert, one scale and one FMA for all 16
//! rows. The transposition is paid once per block for all the tile's tokens.
//!
//! Arithmetic, per (row, token), blocks in order (the model is
//! `tests::row_lane_dot`): `acc = fma(d_w * d_a, float(sum(w * a)), acc)`
//! with the block's integer dot exact. For Q4_0 that is `avx2_rows`' order
//! (and llama.cpp's repacked kernels'), so the two levels agree bit for bit.
//! For Q8_0 it is not ggml's order (8 partial lanes then a tree), so results
//! differ from the avx2 level in the last bits; they are the same whatever
//! the tile, batch or thread count, which is what batching needs (a
//! sequence's logits do not depend on what shares its batch). SmolLM2's
//! llama.cpp logits, which need ggml's order, are Q4_1: not these types.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: weights are made unsigned
//! (`u = w + K`: Q4_0's nibbles as stored, K = 8; Q8_0's quants xor 0x80,
//! K = 128) and each token's block starts from `-K * sum(a)`, which
//! `matmul` computes once per call (`Panel::act_sums`).

use super::rows::{Listed, Rows, Strided};
use super::tile::f16_at;
use crate::dispatch::Panel;
use std::arch::x86_64::*;

/// Rows per lane group.
pub(super) const LANES: usize = 16;
/// Longest row stride the 32-bit gather offsets of a group reach.
pub(super) const MAX_ROW_STRIDE: usize = i32::MAX as usize / LANES;
/// Most tokens per tile: 16 accumulators + 8 weight vectors + scales fit the 32 registers.
const MAX_T: usize = 16;

/// A symmetric block format read 16 rows at a time.
pub(super) trait RowFmt {
    /// Bytes per 32-element block. (The offset K of its unsigned quants is
    /// `Kernels::act_sum_offset`'s, which `matmul` folds into the sums.)
    const WB: usize;
    /// Block `b`'s quants of 16 rows (`rows[i]` points at row i's first
    /// block) as 8 vectors, vector `g` holding elements 4g..4g+3 of row i in
    /// lane i, unsigned; and the rows' scales.
    unsafe fn load16<R: Rows>(rows: &R, idx: __m512i, off: usize) -> ([__m512i; 8], __m512);
    /// One token (a decode matvec): the blocks from 0 that a faster path
    /// than [`tile`]'s takes, added into `acc` in block order with the
    /// tile's arithmetic; returns how many. None by default.
    #[inline(always)]
    unsafe fn one_token<R: Rows>(_p: &Panel<'_>, _g: &Group, _rows: &R, _t0: usize, _acc: &mut __m512) -> usize {
        0
    }
    /// Whether the weights are a grouped type (`hearth_quant::interleave`): a panel's
    /// last 16 rows may then be one 8-row group ([`run`] reads it as [`OneGroup`]).
    const GROUPED: bool = false;
    /// The prefetches of block `b` in the tile of the group's tokens from `t0`: a later
    /// group's bytes into L2, spread evenly over this group's blocks as one sequential
    /// stream (its rows are contiguous): for a matvec, 16 scattered row streams kept
    /// less memory in flight.
    #[inline(always)]
    unsafe fn prefetch<R: Rows>(g: &Group, _rows: &R, b: usize, _t0: usize) {
        super::prefetch_group_step(g.next, b, LANES * Self::WB);
    }
}

/// The f16 scales at `rows[i] + off`, as f32 in lane i (`idx[i]` =
/// `rows[i] - rows[0]`): one gather of the dwords there, their low halves.
#[inline(always)]
unsafe fn scales16<R: Rows>(rows: &R, idx: __m512i, off: usize) -> __m512 {
    let v = _mm512_i32gather_epi32::<1>(idx, rows.at(0, off) as *const i32);
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// 4×4 transposes of dwords within each 128-bit lane of `a`: out `h`, lane
/// L, dword k = dword h of `a[k]`'s lane L.
#[inline(always)]
unsafe fn transpose4(a: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(a[0], a[1]);
    let t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    let t2 = _mm512_unpacklo_epi32(a[2], a[3]);
    let t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    [_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)]
}

/// Four 16-byte rows in the four 128-bit lanes.
#[inline(always)]
unsafe fn lanes4(p0: *const u8, p1: *const u8, p2: *const u8, p3: *const u8) -> __m512i {
    let v = _mm512_castsi128_si512(_mm_loadu_si128(p0 as *const __m128i));
    let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p1 as *const __m128i));
    let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p2 as *const __m128i));
    _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p3 as *const __m128i))
}

/// Two 32-byte rows in the two 256-bit halves.
#[inline(always)]
pub(super) unsafe fn halves2(p0: *const u8, p1: *const u8) -> __m512i {
    let v = _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i));
    _mm512_inserti64x4::<1>(v, _mm256_loadu_si256(p1 as *const __m256i))
}

/// 16 f16 as f32: 8 at `p0` (lanes 0-7), 8 at `p1` (lanes 8-15); a grouped type's 8-row
/// groups' scales side by side.
#[inline(always)]
pub(super) unsafe fn f16x16(p0: *const u8, p1: *const u8) -> __m512 {
    let lo = _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(lo, _mm_loadu_si128(p1 as *const __m128i)))
}

/// Bytes `range` of both 8-row groups of a grouped type's 16 rows (offsets from each
/// group's first byte, `rows.at(0, 0)` and `rows.at(8, 0)`) into L1, a line at a time:
/// each group is one sequential stream. Past the matrix near its end is harmless: a
/// prefetch never faults.
#[inline(always)]
pub(super) unsafe fn prefetch_groups<R: Rows>(rows: &R, range: std::ops::Range<usize>) {
    for l in range.step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(rows.at(0, 0).wrapping_add(l) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(rows.at(8, 0).wrapping_add(l) as *const i8);
    }
}

/// Bytes `q..q + 16` of the 16 rows transposed: vector h holds bytes
/// 4h..4h+3 of row i in lane i.
#[inline(always)]
pub(super) unsafe fn transpose16x16<R: Rows>(rows: &R, q: usize) -> [__m512i; 4] {
    // Lane L of vector k: row 4L + k, so the transposes put row i in lane i.
    transpose4([
        lanes4(rows.at(0, q), rows.at(4, q), rows.at(8, q), rows.at(12, q)),
        lanes4(rows.at(1, q), rows.at(5, q), rows.at(9, q), rows.at(13, q)),
        lanes4(rows.at(2, q), rows.at(6, q), rows.at(10, q), rows.at(14, q)),
        lanes4(rows.at(3, q), rows.at(7, q), rows.at(11, q), rows.at(15, q)),
    ])
}

/// Bytes `q..q + 32` of the 16 rows transposed: vector g holds bytes
/// 4g..4g+3 of row i in lane i.
#[inline(always)]
pub(super) unsafe fn transpose16x32<R: Rows>(rows: &R, q: usize) -> [__m512i; 8] {
    let h2 = |a: usize, b: usize| halves2(rows.at(a, q), rows.at(b, q));
    // Halves of input k (k < 4): rows k and k + 4; of the second four:
    // rows 8 + k, 12 + k. After the in-lane transposes, u[h] holds dword
    // h (lanes 0, 2) and 4 + h (lanes 1, 3) of rows 0-3, 4-7; v[h] of
    // rows 8-11, 12-15.
    let u = transpose4([h2(0, 4), h2(1, 5), h2(2, 6), h2(3, 7)]);
    let v = transpose4([h2(8, 12), h2(9, 13), h2(10, 14), h2(11, 15)]);
    let lo = |h: usize| _mm512_shuffle_i32x4::<0x88>(u[h], v[h]);
    let hi = |h: usize| _mm512_shuffle_i32x4::<0xdd>(u[h], v[h]);
    [lo(0), lo(1), lo(2), lo(3), hi(0), hi(1), hi(2), hi(3)]
}

pub(super) struct Q4_0;
impl RowFmt for Q4_0 {
    const WB: usize = 18;
    #[inline(always)]
    unsafe fn load16<R: Rows>(rows: &R, idx: __m512i, off: usize) -> ([__m512i; 8], __m512) {
        // (No closures or `array::map` here: they are not reliably inlined
        // into target-feature code, and a call per vector costs 20x.)
        let u = transpose16x16(rows, off + 2);
        let m = _mm512_set1_epi8(0x0f);
        let lo = |v: __m512i| _mm512_and_si512(v, m);
        let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
        let w = [lo(u[0]), lo(u[1]), lo(u[2]), lo(u[3]), hi(u[0]), hi(u[1]), hi(u[2]), hi(u[3])];
        (w, scales16(rows, idx, off))
    }

    #[inline(always)]
    unsafe fn one_token<R: Rows>(p: &Panel<'_>, g: &Group, rows: &R, t0: usize, acc: &mut __m512) -> usize {
        let periods = p.cols / 256;
        let mut s = Q4_0Stream {
            a: p.act.as_ptr().add(t0 * p.act_stride),
            sums: p.act_sums.as_ptr().add(t0 * (p.cols / 32) * 4),
            acc: *acc,
            i: _mm512_setzero_si512(),
            d: _mm512_setzero_ps(),
            d_next: _mm512_setzero_ps(),
        };
        for q in 0..periods {
            let base = q * Q4_0_PERIOD;
            q4_0_chunk::<R, 0>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 1>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 2>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 3>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 4>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 5>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 6>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 7>(g, rows, base, q, &mut s);
            q4_0_chunk::<R, 8>(g, rows, base, q, &mut s);
        }
        *acc = s.acc;
        periods * 8
    }
}

/// Bytes of 8 Q4_0 blocks: 144 = 9 × 16, so a row's bytes from a period's
/// start split into 9 whole 16-byte chunks, 36 dwords.
const Q4_0_PERIOD: usize = 144;

/// The one-token Q4_0 path without the scale gather (`tile` spends about a
/// third of its decode cycles waiting on `vpgatherdd`; docs/BENCHMARKS.md).
/// A period's 9 chunks are transposed as they come, so every dword of the
/// 16 rows reaches a lane exactly once, scales included: a pair of blocks is
/// 36 bytes, 9 dwords, `r = 0..9`: dword 0 holds the even block's f16 scale
/// and its quant bytes 0-1, dwords 1-3 its bytes 2-13, dword 4 its bytes 14-15
/// and the odd block's scale, dwords 5-8 the odd block's 16 quant bytes. The
/// even block's quants sit 2 bytes off the dword grid, so its activations
/// are broadcast from the same 2-byte offset, with zeros against the scale
/// bytes. Integer dots are exact whatever their grouping, so the sums, and
/// then the per-block convert, scale and FMA in block order, are `tile`'s
/// bits.
struct Q4_0Stream {
    /// The token's Q8_0 activation blocks and their `-8 sum(a)` terms.
    a: *const u8,
    sums: *const u8,
    acc: __m512,
    /// The current block's integer dot.
    i: __m512i,
    /// The even block's scales, and the odd block's (read a dword earlier).
    d: __m512,
    d_next: __m512,
}

/// Chunk `C` (bytes 16C..16C+16 of period `q`) of the group's rows.
#[inline(always)]
unsafe fn q4_0_chunk<R: Rows, const C: usize>(g: &Group, rows: &R, base: usize, q: usize, s: &mut Q4_0Stream) {
    if C < 8 {
        super::prefetch_group_step(g.next, 8 * q + C, LANES * 18);
    }
    let v = transpose16x16(rows, base + 16 * C);
    q4_0_dword(v[0], 8 * q, 4 * C, s);
    q4_0_dword(v[1], 8 * q, 4 * C + 1, s);
    q4_0_dword(v[2], 8 * q, 4 * C + 2, s);
    q4_0_dword(v[3], 8 * q, 4 * C + 3, s);
}

/// Dword `k` (0..36) of the period starting at block `b0`: one row in each
/// lane. `k` is a constant once inlined, so the `match` folds away.
#[inline(always)]
unsafe fn q4_0_dword(v: __m512i, b0: usize, k: usize, s: &mut Q4_0Stream) {
    let rd = |p: *const u8| std::ptr::read_unaligned(p as *const u32);
    let (pair, r) = (k / 9, k % 9);
    let b = b0 + 2 * pair + usize::from(r >= 5);
    let a = s.a.add(b * 34);
    // (low nibbles' activations, high nibbles') as 4 bytes; `a` is the Q8_0
    // block: its f16 scale, then quants from byte 2.
    let (lo, hi) = match r {
        0 => {
            s.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
            s.i = _mm512_set1_epi32(std::ptr::read_unaligned(s.sums.add(b * 4) as *const i32));
            (rd(a) & 0xffff_0000, rd(a.add(16)) & 0xffff_0000)
        }
        1..=3 => (rd(a.add(4 * r)), rd(a.add(16 + 4 * r))),
        4 => {
            s.d_next = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)));
            (rd(a.add(16)) & 0xffff, rd(a.add(32)) & 0xffff)
        }
        _ => {
            if r == 5 {
                s.i = _mm512_set1_epi32(std::ptr::read_unaligned(s.sums.add(b * 4) as *const i32));
            }
            (rd(a.add(2 + 4 * (r - 5))), rd(a.add(18 + 4 * (r - 5))))
        }
    };
    let m = _mm512_set1_epi8(0x0f);
    s.i = _mm512_dpbusd_epi32(s.i, _mm512_and_si512(v, m), _mm512_set1_epi32(lo as i32));
    s.i = _mm512_dpbusd_epi32(s.i, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m), _mm512_set1_epi32(hi as i32));
    if r == 4 || r == 8 {
        let d = if r == 4 { s.d } else { s.d_next };
        let d = _mm512_mul_ps(d, _mm512_set1_ps(f16_at(a)));
        s.acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s.i), s.acc);
    }
}

pub(super) struct Q8_0;
impl RowFmt for Q8_0 {
    const WB: usize = 34;
    #[inline(always)]
    unsafe fn load16<R: Rows>(rows: &R, idx: __m512i, off: usize) -> ([__m512i; 8], __m512) {
        let q = transpose16x32(rows, off + 2);
        let s = _mm512_set1_epi8(-128);
        let u = |g: usize| _mm512_xor_si512(q[g], s);
        ([u(0), u(1), u(2), u(3), u(4), u(5), u(6), u(7)], scales16(rows, idx, off))
    }
}

/// How far past its reads each of [`Q4_0X8`]'s two streams prefetches into L1 (the avx2
/// tile's 2 KiB for its one stream): the best of 1, 2 and 3 KiB on the 7B's decode
/// matmuls (`TYPE=q4_0x8`, Intel host, docs/BENCHMARKS.md session 45).
const Q4_0X8_AHEAD: usize = 2048;

/// Q4_0X8 weights (`hearth_quant::interleave`): the 16 rows are two 8-row groups whose
/// blocks come already transposed, scales first (`rows.at(0, ·)` and `rows.at(8, ·)` are
/// the groups' first bytes), so a block is two 16-byte scale loads and four pairs of
/// 32-byte loads: no transposes and no scale gather. The vectors are [`Q4_0`]'s, so is
/// the arithmetic ([`tile`]'s), and so are the bits.
pub(super) struct Q4_0X8;
impl RowFmt for Q4_0X8 {
    const WB: usize = 18;
    const GROUPED: bool = true;
    #[inline(always)]
    unsafe fn load16<R: Rows>(rows: &R, _idx: __m512i, off: usize) -> ([__m512i; 8], __m512) {
        // `off` is block b's offset in a row (18 b); in a group it is 8 rows' worth.
        let (a, b) = (rows.at(0, 8 * off), rows.at(8, 8 * off));
        let u = [halves2(a.add(16), b.add(16)), halves2(a.add(48), b.add(48)), halves2(a.add(80), b.add(80)), halves2(a.add(112), b.add(112))];
        let m = _mm512_set1_epi8(0x0f);
        let lo = |v: __m512i| _mm512_and_si512(v, m);
        let hi = |v: __m512i| _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
        ([lo(u[0]), lo(u[1]), lo(u[2]), lo(u[3]), hi(u[0]), hi(u[1]), hi(u[2]), hi(u[3])], f16x16(a, b))
    }
    /// The first tile of a group (`t0 == 0`; the later ones find its bytes cached):
    /// each group's stream into L1 [`Q4_0X8_AHEAD`] past its reads (as `avx2_rows`'
    /// Q4_0X8 tile: one sequential stream needs only a short prefetch).
    #[inline(always)]
    unsafe fn prefetch<R: Rows>(_g: &Group, rows: &R, b: usize, t0: usize) {
        if t0 == 0 {
            let off = 8 * Self::WB * b + Q4_0X8_AHEAD;
            prefetch_groups(rows, off..off + 8 * Self::WB);
        }
    }
}

/// A grouped type's last 8 rows alone (a panel of an odd number of groups): rows 8-15
/// are rows 0-7 again (their lanes are computed and not stored).
pub(super) struct OneGroup(pub(super) *const u8);
impl Rows for OneGroup {
    #[inline(always)]
    unsafe fn at(&self, _i: usize, off: usize) -> *const u8 {
        self.0.add(off)
    }
}

/// A 16-row group of a panel.
pub(super) struct Group {
    /// `rows[i] - rows[0]`, for the scale gather (rows past the panel
    /// repeat its last row; their lanes are not stored).
    pub(super) idx: __m512i,
    /// The first byte of the next group, to prefetch (null past the matrix).
    pub(super) next: *const u8,
    /// First row and rows stored (≤ 16).
    pub(super) r0: usize,
    pub(super) n: usize,
}

impl Group {
    #[inline(always)]
    pub(super) unsafe fn new(p: &Panel<'_>, r0: usize) -> Self {
        let last = p.n_rows - 1;
        let mut idx = [0i32; LANES];
        for (i, x) in idx.iter_mut().enumerate() {
            // At most 15 rows apart, each at most MAX_ROW_STRIDE (`panel`; a grouped
            // type's rows may be farther apart: it gathers nothing).
            *x = (((r0 + i).min(last) - r0) * p.row_stride) as i32;
        }
        Group {
            idx: _mm512_loadu_si512(idx.as_ptr() as *const _),
            // About 32 kB ahead, capped by the panel (`groups_ahead`).
            next: super::prefetch_units_ahead(p, r0, LANES, groups_ahead(p)),
            r0,
            n: LANES.min(p.n_rows - r0),
        }
    }

    /// Row addresses of a full group.
    #[inline(always)]
    pub(super) fn strided(&self, p: &Panel<'_>) -> Strided {
        Strided::new(p.w.as_ptr().wrapping_add(self.r0 * p.row_stride), p.row_stride)
    }

    /// Row addresses of a partial group.
    #[inline(always)]
    pub(super) fn listed(&self, p: &Panel<'_>) -> Listed<LANES> {
        Listed::new(p.w.as_ptr(), p.row_stride, self.r0, p.n_rows)
    }
}

/// Row groups ahead of the current one that [`Group::new`] prefetches: about
/// `PREFETCH_AHEAD` (32 kB) of weights in whole groups, 1 to `MAX_UNITS_AHEAD`, and at
/// most an eighth of the panel's groups.
///
/// Why: one group ahead (the rule until session 25) is 55 kB for a dense 7B down
/// projection but only 6.9 kB for a Qwen3-30B-A3B expert's 768-column down (432-byte
/// rows), too little in flight: those downs streamed 22-27% slower per byte than a dense
/// down. About 32 kB ahead: the 8 experts' downs 13.2 -> 16.1 GiB/s at 1 thread and
/// 25.9 -> 32.5 at 2, the whole expert FFN 14.2 -> 16.3 and 26.3 -> 29.4 (`cargo bench -p
/// hearth-kernels --bench matmul -- moe_ffn`, Zen 4, medians of 3 alternating runs;
/// docs/BENCHMARKS.md). The cap by panel keeps short panels (SmolLM2's 576-row
/// matrices, split among threads in panels of a few groups) at one group ahead: there
/// the prefetch past a panel's end fetches rows another thread reads, and 4 groups
/// ahead lost 6-9% of SmolLM2 Q8_0 decode at 2 threads.
#[inline(always)]
fn groups_ahead(p: &Panel<'_>) -> usize {
    let by_bytes = super::PREFETCH_AHEAD.div_ceil((LANES * p.row_stride).max(1)).clamp(1, super::MAX_UNITS_AHEAD);
    by_bytes.min((p.n_rows / LANES / 8).max(1))
}

/// Groups `1..ahead` of the panel into L2 before its first group runs: each group then
/// prefetches the one `ahead` past it, so without this those first ones would come
/// unprefetched at every panel's start.
#[inline(always)]
unsafe fn prefetch_panel_start(p: &Panel<'_>, ahead: usize) {
    let group = LANES * p.row_stride;
    let end = (ahead * group).min(p.n_rows * p.row_stride);
    for at in (group.min(end)..end).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(p.w.as_ptr().add(at) as *const i8);
    }
}

/// Tokens `t0..t0+T` × the group's rows.
#[inline(always)]
unsafe fn tile<F: RowFmt, R: Rows, const T: usize>(p: &Panel<'_>, g: &Group, rows: &R, t0: usize, out: &mut [f32]) {
    let nb = p.cols / 32;
    let ap = p.act.as_ptr().add(t0 * p.act_stride);
    let sp = p.act_sums.as_ptr().add(t0 * nb * 4);
    let mut acc = [_mm512_setzero_ps(); T];
    let first = if T == 1 { F::one_token(p, g, rows, t0, &mut acc[0]) } else { 0 };
    for b in first..nb {
        let off = b * F::WB;
        F::prefetch(g, rows, b, t0);
        let (w, dw) = F::load16(rows, g.idx, off);
        for (t, acc) in acc.iter_mut().enumerate() {
            let a = ap.add(t * p.act_stride + b * 34);
            // The block's integer dot: -K sum(a), then sum(u a) 4 bytes a lane.
            let mut i = _mm512_set1_epi32(std::ptr::read_unaligned(sp.add((t * nb + b) * 4) as *const i32));
            for (k, w) in w.iter().enumerate() {
                let x = _mm512_set1_epi32(std::ptr::read_unaligned(a.add(2 + 4 * k) as *const i32));
                i = _mm512_dpbusd_epi32(i, *w, x);
            }
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(f16_at(a)));
            *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(i), *acc);
        }
    }
    let mask: __mmask16 = if g.n == LANES { !0 } else { (1u16 << g.n) - 1 };
    for (t, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.as_mut_ptr().add((t0 + t) * p.n_rows + g.r0), mask, *acc);
    }
}

/// The whole panel: 16-row groups × tiles of up to 16 tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<F: RowFmt>(p: &Panel<'_>, out: &mut [f32]) {
    if !F::GROUPED {
        prefetch_panel_start(p, groups_ahead(p));
    }
    for r0 in (0..p.n_rows).step_by(LANES) {
        let g = Group::new(p, r0);
        if g.n == LANES {
            tiles::<F, _>(p, &g, &g.strided(p), out)
        } else if F::GROUPED {
            tiles::<F, _>(p, &g, &OneGroup(p.w.as_ptr().add(r0 * p.row_stride)), out)
        } else {
            tiles::<F, _>(p, &g, &g.listed(p), out)
        }
    }
}

/// One group × tiles of up to 16 tokens.
#[inline(always)]
unsafe fn tiles<F: RowFmt, R: Rows>(p: &Panel<'_>, g: &Group, rows: &R, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < p.n_tokens {
        let nt = MAX_T.min(p.n_tokens - t0);
        macro_rules! go {
            ($($t:literal)*) => {
                match nt {
                    $($t => tile::<F, R, $t>(p, g, rows, t0, out),)*
                    _ => unreachable!("tile of {nt} tokens"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
        t0 += nt;
    }
}

/// The panel for `F` weights: checks bounds (including the activation sums) first.
#[inline(always)]
pub(super) fn panel<F: RowFmt>(p: &Panel<'_>, out: &mut [f32]) {
    p.check(hearth_quant::GgmlType::Q8_0, out);
    assert!(p.act_sums.len() >= p.n_tokens * (p.cols / 32) * 4, "panel activation sums too short");
    assert!(F::GROUPED || p.row_stride <= MAX_ROW_STRIDE, "row stride beyond the gather offsets");
    // SAFETY: this table is only handed out when AVX-512 F/BW/VL and VNNI
    // were detected; `check` bounds every weight and activation read (a grouped
    // type's panel is whole 8-row groups: an odd last one is read as both halves,
    // `OneGroup`), the assert every sum read, and the stores stay inside `out`'s
    // checked size.
    unsafe { run::<F>(p, out) }
}
