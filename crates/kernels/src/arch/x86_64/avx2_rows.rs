//! AVX2 dots with one weight row per lane: Q4_0 × Q8_0 and Q4_K × Q8_K.
//!
//! ggml's plain AVX2 order (`ggml_vec_dot_q4_0_q8_0`; `avx2::Q4_1` keeps it)
//! has 8 f32 lanes per (row, token), so each 32-element block costs six
//! instructions per pair (two integer multiplies, an add, then convert, scale
//! and FMA) and prefill is bound by them. Here lane `i` of a vector is row `i` of an 8-row group: a
//! block's 8 rows are transposed in registers into 8 vectors (vector `g`:
//! elements 4g..4g+3 of each row, as bytes), and a token's block is 8
//! `vpmaddubsw` against its 4-byte groups broadcast from memory, summed as
//! i16, one `vpmaddwd`, then one convert, one scale and one FMA for all 8
//! rows: about 2.5 instructions per pair. The transposition is paid once per
//! block for all the tile's tokens.
//!
//! i16 sums cannot overflow: a nibble (0..15) times a Q8_0 quant (at most 128
//! in magnitude) summed over the 16 elements one i16 lane collects is at most
//! 16 · 15 · 128 = 30720.
//!
//! Arithmetic, per (row, token), blocks in order (the model is
//! `tests::row_lane_dot`): `acc = fma(d_w * d_a, float(sum(w * a)), acc)` with
//! the block's integer dot exact. It is the order of llama.cpp's repacked
//! Q4_0 kernels (`ggml_gemm_q4_0_8x8_q8_0` / `gemv`, which its x86 build
//! uses for Q4_0 by default) and of `avx512_rows`, so the three give the same
//! bits; it is not ggml's plain `ggml_vec_dot_q4_0_q8_0` order.
//!
//! The nibbles are unsigned (`w + 8`); each token's block starts from
//! `-8 * sum(a)`, which `matmul` computes once per call (`Panel::act_sums`).
//!
//! Q4_K the same way, per 32-element sub-block `j` of a super-block: the
//! i16 sums times the rows' 6-bit scales (`vpmaddwd`), summed exactly over
//! the super-block, and the mins' dot with the activations' sub-block sums
//! apart; per super-block `acc = fma(d_w * d_a, float(isum), acc)`,
//! `acc_min = fma(dmin_w * d_a, float(imin), acc_min)`, result `acc -
//! acc_min` (model: `tests::row_lane_dot_q4_k`). That is the order of
//! llama.cpp's repacked `ggml_gemm_q4_K_8x8_q8_K` / `gemv`, which its x86
//! build uses for Q4_K by default; not ggml's plain `ggml_vec_dot_q4_K_q8_K`.
//!
//! Q4_0X8 and Q4_KX8 (`hearth_quant::interleave`) are the same tiles with the same
//! arithmetic reading a group's blocks already transposed, scales first: one sequential
//! stream of plain loads with a short L1 prefetch, instead of 8 row streams transposed in
//! registers.

use super::int_dot::{IntDot, Madd, Vnni};
use super::rows::{Listed, Rows, Strided};
use super::tile::f16_at;
use crate::dispatch::Panel;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Rows per lane group.
const LANES: usize = 8;
/// Most tokens per tile: 8 weight vectors + 4 accumulators + scales and
/// temporaries fill the 16 registers.
const MAX_T: usize = 4;

/// One weight format's tile of 8 rows × `T` tokens.
trait RowTile {
    /// Bytes of one weight block.
    const WB: usize;
    /// Tokens `t0..t0+T` × the 8 rows, into `out[t]`; `next` is what
    /// [`ahead`](Self::ahead) gave for the group's first tile, null for its
    /// later tiles (the first one prefetched for them).
    unsafe fn tile<R: Rows, const T: usize>(p: &Panel<'_>, rows: &R, next: *const u8, t0: usize, out: &mut [[f32; LANES]; MAX_T]);
    /// The `next` of the group at row `r0`'s first tile: a group ahead
    /// ([`super::prefetch_rows`]; null past the matrix).
    #[inline(always)]
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8 {
        super::prefetch_rows(p, r0, LANES)
    }
}

/// 4×4 transposes of dwords within each 128-bit lane of `a`: out `h`, lane
/// L, dword k = dword h of `a[k]`'s lane L.
#[inline(always)]
unsafe fn transpose4(a: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(a[0], a[1]);
    let t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    let t2 = _mm256_unpacklo_epi32(a[2], a[3]);
    let t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    [_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)]
}

/// Two 16-byte rows in the two 128-bit halves.
#[inline(always)]
unsafe fn halves(p0: *const u8, p1: *const u8) -> __m256i {
    let v = _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
    _mm256_inserti128_si256::<1>(v, _mm_loadu_si128(p1 as *const __m128i))
}

/// Bytes `o..o + 16` of the 8 rows transposed: vector h holds bytes
/// 4h..4h+3 of row i in dword lane i (half L of input k is row k + 4L).
#[inline(always)]
unsafe fn transpose4x4_rows<R: Rows>(rows: &R, o: usize) -> [__m256i; 4] {
    transpose4([
        halves(rows.at(0, o), rows.at(4, o)),
        halves(rows.at(1, o), rows.at(5, o)),
        halves(rows.at(2, o), rows.at(6, o)),
        halves(rows.at(3, o), rows.at(7, o)),
    ])
}

/// The f16 at byte `o` of each of the 8 rows, as f32 in lane i: eight
/// `vpinsrw` from memory and one F16C convert (exact, as the table). Plain
/// loads, no gather (slow on Intel parts with the gather-data-sampling
/// mitigation); half the instructions of eight table look-ups and inserts,
/// which were a quarter of the decode loop.
#[inline(always)]
unsafe fn scales8<R: Rows>(rows: &R, o: usize) -> __m256 {
    let mut v = _mm_cvtsi32_si128(f16_bits(rows, 0, o));
    v = _mm_insert_epi16::<1>(v, f16_bits(rows, 1, o));
    v = _mm_insert_epi16::<2>(v, f16_bits(rows, 2, o));
    v = _mm_insert_epi16::<3>(v, f16_bits(rows, 3, o));
    v = _mm_insert_epi16::<4>(v, f16_bits(rows, 4, o));
    v = _mm_insert_epi16::<5>(v, f16_bits(rows, 5, o));
    v = _mm_insert_epi16::<6>(v, f16_bits(rows, 6, o));
    v = _mm_insert_epi16::<7>(v, f16_bits(rows, 7, o));
    _mm256_cvtph_ps(v)
}

/// The f16 bits at byte `o` of row `i`. (A function, not a closure: closures
/// are not reliably inlined into target-feature code.)
#[inline(always)]
unsafe fn f16_bits<R: Rows>(rows: &R, i: usize, o: usize) -> i32 {
    std::ptr::read_unaligned(rows.at(i, o) as *const u16) as i32
}

/// The low nibble of every byte.
#[inline(always)]
unsafe fn lo4(v: __m256i) -> __m256i {
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// The high nibble of every byte.
#[inline(always)]
unsafe fn hi4(v: __m256i) -> __m256i {
    lo4(_mm256_srli_epi16::<4>(v))
}

/// The (unaligned) 4 bytes at `p` in every dword lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// The 8 (unaligned) 4-byte groups from `p` on, each in every dword lane.
#[inline(always)]
unsafe fn bcast4x8(p: *const u8) -> [__m256i; 8] {
    [
        bcast4(p),
        bcast4(p.add(4)),
        bcast4(p.add(8)),
        bcast4(p.add(12)),
        bcast4(p.add(16)),
        bcast4(p.add(20)),
        bcast4(p.add(24)),
        bcast4(p.add(28)),
    ]
}

/// Block `off` of the 8 rows: 8 vectors, vector `g` holding the nibbles of
/// elements 4g..4g+3 of row i in dword lane i (elements 16.. are the high
/// nibbles: vector 4 + h comes from the same bytes as vector h); and the
/// rows' scales.
#[inline(always)]
unsafe fn load8<R: Rows>(rows: &R, off: usize) -> ([__m256i; 8], __m256) {
    let u = transpose4x4_rows(rows, off + 2);
    let w = [lo4(u[0]), lo4(u[1]), lo4(u[2]), lo4(u[3]), hi4(u[0]), hi4(u[1]), hi4(u[2]), hi4(u[3])];
    (w, scales8(rows, off))
}

/// Bytes of a Q4_0 block (a named constant: `Self::WB` cannot size the
/// prefetch of a generic impl).
const Q4_0_WB: usize = 18;

/// Q4_0 weights × Q8_0 activations, integer dots by `D`.
struct Q4_0<D>(PhantomData<D>);
impl<D: IntDot> RowTile for Q4_0<D> {
    const WB: usize = Q4_0_WB;
    #[inline(always)]
    unsafe fn tile<R: Rows, const T: usize>(p: &Panel<'_>, rows: &R, next: *const u8, t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        let nb = p.cols / 32;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let sp = p.act_sums.as_ptr().add(t0 * nb * 4);
        let mut acc = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let off = b * Self::WB;
            super::prefetch_group_step(next, b, LANES * Q4_0_WB);
            let (w, dw) = load8(rows, off);
            q4_0_tokens::<D, T>(p, ap, sp, b, &w, dw, &mut acc);
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[t].as_mut_ptr(), *acc);
        }
    }
}

/// Block `b` of the 8 rows (nibbles `w` as [`load8`] gives them, scales `dw`) for the
/// tile's tokens (activations from `ap`, their `-8 sum(a)` from `sp`):
/// `acc[t] += dw · d_a · float(-8 sum(a) + sum(w a))`.
#[inline(always)]
unsafe fn q4_0_tokens<D: IntDot, const T: usize>(
    p: &Panel<'_>,
    ap: *const u8,
    sp: *const u8,
    b: usize,
    w: &[__m256i; 8],
    dw: __m256,
    acc: &mut [__m256; T],
) {
    let nb = p.cols / 32;
    for (t, acc) in acc.iter_mut().enumerate() {
        // The Q8_0 block's quants from byte 2; group k = bytes 2 + 4k.
        let a = ap.add(t * p.act_stride + b * 34);
        // The block's integer dot: -8 sum(a) + sum(u a).
        let bias = bcast4(sp.add((t * nb + b) * 4));
        let i = D::dot8_nibbles(bias, w, bcast4x8(a.add(2)));
        let d = _mm256_mul_ps(dw, _mm256_set1_ps(f16_at(a)));
        *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i), *acc);
    }
}

/// How far past its reads the Q4_0X8 tile prefetches into L1: the best of 1, 1.5, 2, 3,
/// 4.5 and 6 KiB, into L1 or L2, for a prototype of this tile on the 7B's decode matmuls
/// (Intel host, docs/BENCHMARKS.md session 43): farther read slower (6 KiB: 12%), and
/// with no software prefetch the one stream read 25% slower.
const Q4_0X8_AHEAD: usize = 2048;

/// Q4_0X8 weights (`hearth_quant::interleave`) × Q8_0 activations: [`Q4_0`]'s tile and
/// arithmetic, but a block's 8 rows come already transposed, scales first, so a group is
/// one sequential stream: 5 loads a block, no transposes, no scale inserts.
struct Q4_0X8<D>(PhantomData<D>);
impl<D: IntDot> RowTile for Q4_0X8<D> {
    const WB: usize = LANES * Q4_0_WB;
    #[inline(always)]
    unsafe fn tile<R: Rows, const T: usize>(p: &Panel<'_>, rows: &R, next: *const u8, t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        let nb = p.cols / 32;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let sp = p.act_sums.as_ptr().add(t0 * nb * 4);
        let mut acc = [_mm256_setzero_ps(); T];
        let far = if !next.is_null() && super::far_prefetch() { super::GROUPED_FAR_AHEAD } else { 0 };
        for b in 0..nb {
            // The group's block b: rows.at(0, ·) is the group's first byte.
            let q = rows.at(0, b * Self::WB);
            if !next.is_null() {
                for l in (0..Self::WB).step_by(64) {
                    // Past the matrix near its end: a prefetch never faults.
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(Q4_0X8_AHEAD + l) as *const i8);
                    if far > 0 {
                        _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(far + l) as *const i8);
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(q as *const __m128i));
            let u = [0, 1, 2, 3].map(|k| _mm256_loadu_si256(q.add(16 + 32 * k) as *const __m256i));
            let w = [lo4(u[0]), lo4(u[1]), lo4(u[2]), lo4(u[3]), hi4(u[0]), hi4(u[1]), hi4(u[2]), hi4(u[3])];
            q4_0_tokens::<D, T>(p, ap, sp, b, &w, dw, &mut acc);
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[t].as_mut_ptr(), *acc);
        }
    }
    /// Non-null for the first tile (it prefetches [`Q4_0X8_AHEAD`] past its own reads).
    #[inline(always)]
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8 {
        p.w.as_ptr().wrapping_add(r0 * p.row_stride)
    }
}

/// One group × tiles of up to [`MAX_T`] tokens.
#[inline(always)]
unsafe fn group<K: RowTile, R: Rows>(p: &Panel<'_>, rows: &R, r0: usize, out: &mut [f32]) {
    let n = LANES.min(p.n_rows - r0);
    let next_group = K::ahead(p, r0);
    let mut buf = [[0f32; LANES]; MAX_T];
    let mut t0 = 0;
    while t0 < p.n_tokens {
        let nt = MAX_T.min(p.n_tokens - t0);
        // The first tile prefetches a group ahead; the others find it cached.
        let next = if t0 == 0 { next_group } else { std::ptr::null() };
        match nt {
            1 => K::tile::<R, 1>(p, rows, next, t0, &mut buf),
            2 => K::tile::<R, 2>(p, rows, next, t0, &mut buf),
            3 => K::tile::<R, 3>(p, rows, next, t0, &mut buf),
            _ => K::tile::<R, 4>(p, rows, next, t0, &mut buf),
        }
        for (t, b) in buf.iter().enumerate().take(nt) {
            out[(t0 + t) * p.n_rows + r0..][..n].copy_from_slice(&b[..n]);
        }
        t0 += nt;
    }
}

/// The whole panel: 8-row groups × tiles of up to [`MAX_T`] tokens.
#[inline(always)]
unsafe fn run_groups<K: RowTile>(p: &Panel<'_>, out: &mut [f32]) {
    let base = p.w.as_ptr();
    for r0 in (0..p.n_rows).step_by(LANES) {
        if r0 + LANES <= p.n_rows {
            group::<K, _>(p, &Strided::new(base.add(r0 * p.row_stride), p.row_stride), r0, out)
        } else {
            group::<K, _>(p, &Listed::<LANES>::new(base, p.row_stride, r0, p.n_rows), r0, out)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<K: RowTile>(p: &Panel<'_>, out: &mut [f32]) {
    run_groups::<K>(p, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn run_vnni<K: RowTile>(p: &Panel<'_>, out: &mut [f32]) {
    run_groups::<K>(p, out)
}

/// Bounds of a Q4_0 panel, including the activation sums.
fn check_q4_0(p: &Panel<'_>, out: &[f32]) {
    p.check(hearth_quant::GgmlType::Q8_0, out);
    assert!(p.act_sums.len() >= p.n_tokens * (p.cols / 32) * 4, "panel activation sums too short");
}

/// The Q4_0 panel: checks bounds (including the activation sums) first.
pub(super) fn panel_q4_0(p: &Panel<'_>, out: &mut [f32]) {
    check_q4_0(p, out);
    // SAFETY: this kernel is only in tables handed out when AVX2, FMA and
    // F16C were detected; `check_q4_0` bounds every weight, activation and
    // sum read, and the stores go through slices of `out`.
    unsafe { run::<Q4_0<Madd>>(p, out) }
}

/// The Q4_0 panel with AVX-VNNI dots (the same bits as [`panel_q4_0`]).
pub(super) fn panel_q4_0_vnni(p: &Panel<'_>, out: &mut [f32]) {
    check_q4_0(p, out);
    // SAFETY: as `panel_q4_0`, and this kernel is only in the avxvnni
    // level's table, handed out when AVX-VNNI was detected too.
    unsafe { run_vnni::<Q4_0<Vnni>>(p, out) }
}

/// The Q4_0X8 panel (bounds as Q4_0's: `Panel::check` knows its groups).
pub(super) fn panel_q4_0x8(p: &Panel<'_>, out: &mut [f32]) {
    check_q4_0(p, out);
    // SAFETY: as `panel_q4_0`; whole 8-row groups (`check`), so every group is `Strided`.
    unsafe { run::<Q4_0X8<Madd>>(p, out) }
}

/// The Q4_0X8 panel with AVX-VNNI dots.
pub(super) fn panel_q4_0x8_vnni(p: &Panel<'_>, out: &mut [f32]) {
    check_q4_0(p, out);
    // SAFETY: as `panel_q4_0_vnni`.
    unsafe { run_vnni::<Q4_0X8<Vnni>>(p, out) }
}

/// The Q4_K panel: checks bounds first.
pub(super) fn panel_q4_k(p: &Panel<'_>, out: &mut [f32]) {
    p.check(hearth_quant::GgmlType::Q8_K, out);
    // SAFETY: as `panel_q4_0`; this kernel reads no activation sums.
    unsafe { run::<Q4K<RowMajor>>(p, out) }
}

/// The Q4_KX8 panel (bounds as Q4_K's: `Panel::check` knows its groups).
pub(super) fn panel_q4_kx8(p: &Panel<'_>, out: &mut [f32]) {
    p.check(hearth_quant::GgmlType::Q8_K, out);
    // SAFETY: as `panel_q4_k`; whole 8-row groups (`check`), so every group is `Strided`.
    unsafe { run::<Q4K<Grouped>>(p, out) }
}

/// The 8 rows' scales and mins of the super-block at `off`, one row per
/// dword lane: `sc[j]` = (scale j, scale j) as two i16 (the `vpmaddwd`
/// factor of sub-block j's i16 pair sums), `mn[k]` = (min 2k, min 2k+1) as
/// two i16; and the rows' d and dmin.
#[inline(always)]
unsafe fn q4_k_scales<R: Rows>(rows: &R, off: usize) -> Q4KHead {
    // Bytes off..off+16 of row i in lane i: dword 0 is (d, dmin), dwords
    // 1..3 the 12 scale bytes. One transpose for all of them: reading d and
    // dmin with 16 `vpinsrw` instead (`scales8`) cost 8% of 7B Q4_K decode.
    let u = transpose4x4_rows(rows, off);
    let (sc, mn) = q4_k_unpack(u[1], u[2], u[3]);
    // Per 128-bit lane (rows 0-3, 4-7): the d halves into bytes 0..8, the
    // dmin halves into 8..16; then d of rows 0-7 in the low 128 bits, dmin
    // in the high: exact f16 → f32 (as the table).
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
    );
    let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(u[0], split));
    (sc, mn, _mm256_cvtph_ps(_mm256_castsi256_si128(v)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(v)))
}

/// A super-block's scales and mins as the tile multiplies them (see [`q4_k_scales`]).
type Q4KHead = ([__m256i; 8], [__m256i; 4], __m256, __m256);

/// The 12 scale bytes of the 8 rows, as dwords 0, 1, 2 (`u1`, `u2`, `u3`) of row i in
/// lane i → the scale and min pairs of [`q4_k_scales`] (ggml's `get_scale_min_k4` as
/// dword arithmetic, `utmp` in `ggml_vec_dot_q4_K_q8_K`).
#[inline(always)]
unsafe fn q4_k_unpack(u1: __m256i, u2: __m256i, u3: __m256i) -> ([__m256i; 8], [__m256i; 4]) {
    let (km1, km2, km3) = (_mm256_set1_epi32(0x3f3f3f3f), _mm256_set1_epi32(0x0f0f0f0f), _mm256_set1_epi32(0x03030303));
    let sc_lo = _mm256_and_si256(u1, km1);
    let mn_lo = _mm256_and_si256(u2, km1);
    let sc_hi = _mm256_or_si256(_mm256_and_si256(u3, km2), _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u1), km3)));
    let mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32::<4>(u3), km2),
        _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u2), km3)),
    );
    // Bytes b0, b1 of each dword → i16 pairs: pshufb patterns per dword.
    let sc = [
        _mm256_shuffle_epi8(sc_lo, pairs(0, 0)),
        _mm256_shuffle_epi8(sc_lo, pairs(1, 1)),
        _mm256_shuffle_epi8(sc_lo, pairs(2, 2)),
        _mm256_shuffle_epi8(sc_lo, pairs(3, 3)),
        _mm256_shuffle_epi8(sc_hi, pairs(0, 0)),
        _mm256_shuffle_epi8(sc_hi, pairs(1, 1)),
        _mm256_shuffle_epi8(sc_hi, pairs(2, 2)),
        _mm256_shuffle_epi8(sc_hi, pairs(3, 3)),
    ];
    let mn = [
        _mm256_shuffle_epi8(mn_lo, pairs(0, 1)),
        _mm256_shuffle_epi8(mn_lo, pairs(2, 3)),
        _mm256_shuffle_epi8(mn_hi, pairs(0, 1)),
        _mm256_shuffle_epi8(mn_hi, pairs(2, 3)),
    ];
    (sc, mn)
}

/// The `vpshufb` pattern taking bytes b0 and b1 of every dword to its two
/// i16 halves (zero-extended).
#[inline(always)]
unsafe fn pairs(b0: i32, b1: i32) -> __m256i {
    const Z: i32 = 0x80;
    let d0 = b0 | (Z << 8) | (b1 << 16) | (Z << 24);
    let d = 0x0404_0404; // + 4 per dword: the same bytes of the next dword
    _mm256_setr_epi32(d0, d0 + d, d0 + 2 * d, d0 + 3 * d, d0, d0 + d, d0 + 2 * d, d0 + 3 * d)
}

/// Bytes `off..off + 32` of the 8 rows transposed: vector g holds bytes
/// 4g..4g+3 of row i in dword lane i.
#[inline(always)]
unsafe fn transpose8x32<R: Rows>(rows: &R, off: usize) -> [__m256i; 8] {
    let a = transpose4x4_rows(rows, off);
    let b = transpose4x4_rows(rows, off + 16);
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// Sub-block `j` of T tokens: `isum[t] += scale_j * sum(w * a)` per row.
#[inline(always)]
unsafe fn q4_k_sub<const T: usize>(w: &[__m256i; 8], sc: __m256i, ap: *const u8, stride: usize, j: usize, isum: &mut [__m256i; T]) {
    for (t, isum) in isum.iter_mut().enumerate() {
        let a = ap.add(t * stride + 4 + 32 * j);
        let mut s = _mm256_maddubs_epi16(w[0], bcast4(a));
        for (g, w) in w.iter().enumerate().skip(1) {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(*w, bcast4(a.add(4 * g))));
        }
        *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(s, sc));
    }
}

/// Where a Q4_K tile's super-blocks come from: row-major Q4_K ([`RowMajor`]) or the
/// Q4_KX8 groups ([`Grouped`]).
trait Q4KSource {
    /// Bytes the tile steps per super-block from its group's first byte
    /// (`rows.at(i, b * STEP)`).
    const STEP: usize;
    /// Super-block `b`'s scales, mins, d and dmin (see [`q4_k_scales`]).
    unsafe fn head<R: Rows>(rows: &R, b: usize) -> Q4KHead;
    /// Quarter `jj` of super-block `b`'s quants: bytes `32jj..32jj + 32` of the 8 rows,
    /// vector g holding bytes 4g..4g+3 of row i in dword lane i.
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m256i; 8];
    /// Prefetches of quarter `jj` of super-block `b` (of `nsb`); `next` as
    /// [`RowTile::tile`]'s.
    unsafe fn prefetch<R: Rows, const T: usize>(rows: &R, next: *const u8, b: usize, jj: usize, nsb: usize);
    /// [`RowTile::ahead`].
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8;
}

/// GGUF's Q4_K rows, transposed in registers.
struct RowMajor;
impl Q4KSource for RowMajor {
    const STEP: usize = 144;
    #[inline(always)]
    unsafe fn head<R: Rows>(rows: &R, b: usize) -> Q4KHead {
        q4_k_scales(rows, b * Self::STEP)
    }
    #[inline(always)]
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m256i; 8] {
        transpose8x32(rows, b * Self::STEP + 16 + 32 * jj)
    }
    #[inline(always)]
    unsafe fn prefetch<R: Rows, const T: usize>(rows: &R, next: *const u8, b: usize, jj: usize, nsb: usize) {
        // A quarter of a later group's super-block into L2 per 32-byte run: 18
        // prefetches in one burst at the top of the super-block stalled on fill
        // buffers (7B Q4_K decode at avx2, 1 thread: 2.58 tok/s in one burst, 2.80
        // in four, 2.53 with none).
        super::prefetch_group_step(next, 4 * b + jj, LANES * Self::STEP / 4);
        // Decode: rows 2jj and 2jj+1 of the next super-block into L1 as well (lines
        // of its first, middle and last bytes), so the transposes' loads find them
        // there: 7B Q4_K at avx2, 1 thread 2.80 -> 2.96 tok/s, 2 threads 5.30 ->
        // 5.56; the L1 prefetch alone ran 2.50. (Prefill tiles are bound by their
        // arithmetic, not by these loads.)
        if T == 1 && b + 1 < nsb {
            for r in 2 * jj..2 * jj + 2 {
                let q = rows.at(r, (b + 1) * Self::STEP);
                for o in [0, 64, 128, Self::STEP - 1] {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
                }
            }
        }
    }
    #[inline(always)]
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8 {
        super::prefetch_rows(p, r0, LANES)
    }
}

/// How far past its reads the Q4_KX8 tile prefetches into L1, as [`Q4_0X8_AHEAD`]: the
/// best of 0.5, 1, 1.5, 2, 3 and 4 KiB on the 7B's decode matmuls (`TYPE=q4_kx8`, Intel
/// host, docs/BENCHMARKS.md session 44): 1-2 KiB within noise of each other, 0.5 KiB 5-8%
/// slower, 3 and 4 KiB 16% and 27%; an L2 prefetch 8 or 16 KiB ahead besides lost 3-5%.
const Q4_KX8_AHEAD: usize = 1536;

/// Q4_KX8 groups (`hearth_quant::interleave`): per super-block the 8 rows' d, then
/// their dmin, then 35 words of 8 rows (3 of scales, 32 of quants) already transposed,
/// one sequential stream of plain loads.
struct Grouped;
impl Q4KSource for Grouped {
    const STEP: usize = LANES * 144;
    #[inline(always)]
    unsafe fn head<R: Rows>(rows: &R, b: usize) -> Q4KHead {
        let q = rows.at(0, b * Self::STEP);
        let word = |k: usize| _mm256_loadu_si256(q.add(32 + 32 * k) as *const __m256i);
        let (sc, mn) = q4_k_unpack(word(0), word(1), word(2));
        let d = _mm_loadu_si128(q as *const __m128i);
        let dmin = _mm_loadu_si128(q.add(16) as *const __m128i);
        (sc, mn, _mm256_cvtph_ps(d), _mm256_cvtph_ps(dmin))
    }
    #[inline(always)]
    unsafe fn quants<R: Rows>(rows: &R, b: usize, jj: usize) -> [__m256i; 8] {
        let q = rows.at(0, b * Self::STEP + 128 + 256 * jj);
        [0, 1, 2, 3, 4, 5, 6, 7].map(|g| _mm256_loadu_si256(q.add(32 * g) as *const __m256i))
    }
    #[inline(always)]
    unsafe fn prefetch<R: Rows, const T: usize>(rows: &R, next: *const u8, b: usize, jj: usize, _nsb: usize) {
        if next.is_null() {
            return;
        }
        // A quarter of the super-block's bytes per quarter, [`Q4_KX8_AHEAD`] ahead (and
        // into L2 `GROUPED_FAR_AHEAD` ahead where `far_prefetch`).
        let q = rows.at(0, b * Self::STEP + Q4_KX8_AHEAD);
        let far = super::far_prefetch();
        for l in (jj * Self::STEP / 4..(jj + 1) * Self::STEP / 4).step_by(64) {
            // Past the matrix near its end: a prefetch never faults.
            _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(l) as *const i8);
            if far {
                _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(super::GROUPED_FAR_AHEAD - Q4_KX8_AHEAD + l) as *const i8);
            }
        }
    }
    /// Non-null for the first tile (it prefetches [`Q4_KX8_AHEAD`] past its own reads).
    #[inline(always)]
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8 {
        p.w.as_ptr().wrapping_add(r0 * p.row_stride)
    }
}

/// Q4_K weights × Q8_K activations (see the module docs), from `S`.
struct Q4K<S>(PhantomData<S>);
impl<S: Q4KSource> RowTile for Q4K<S> {
    const WB: usize = S::STEP;
    #[inline(always)]
    unsafe fn tile<R: Rows, const T: usize>(p: &Panel<'_>, rows: &R, next: *const u8, t0: usize, out: &mut [[f32; LANES]; MAX_T]) {
        let nsb = p.cols / 256;
        let ap = p.act.as_ptr().add(t0 * p.act_stride);
        let mut acc = [_mm256_setzero_ps(); T];
        let mut acc_min = [_mm256_setzero_ps(); T];
        for b in 0..nsb {
            let (sc, mn, dw, dminw) = S::head(rows, b);
            let ab = ap.add(b * 292);
            // Mins: imin = sum_j min_j * (sum of sub-block j's activations).
            for (t, acc_min) in acc_min.iter_mut().enumerate() {
                let a = ab.add(t * p.act_stride);
                let bs = _mm256_loadu_si256(a.add(260) as *const __m256i);
                // [sum of sub-block 0, .., 7] as i16 (|sum| ≤ 32 · 128).
                let s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
                let b01 = _mm256_broadcastd_epi32(s32);
                let b23 = _mm256_broadcastd_epi32(_mm_srli_si128::<4>(s32));
                let b45 = _mm256_broadcastd_epi32(_mm_srli_si128::<8>(s32));
                let b67 = _mm256_broadcastd_epi32(_mm_srli_si128::<12>(s32));
                let imin = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_madd_epi16(mn[0], b01), _mm256_madd_epi16(mn[1], b23)),
                    _mm256_add_epi32(_mm256_madd_epi16(mn[2], b45), _mm256_madd_epi16(mn[3], b67)),
                );
                let da = _mm256_set1_ps(std::ptr::read_unaligned(a as *const f32));
                *acc_min = _mm256_fmadd_ps(_mm256_mul_ps(dminw, da), _mm256_cvtepi32_ps(imin), *acc_min);
            }
            let mut isum = [_mm256_setzero_si256(); T];
            for jj in 0..4 {
                S::prefetch::<R, T>(rows, next, b, jj, nsb);
                let raw = S::quants(rows, b, jj);
                let lo = [lo4(raw[0]), lo4(raw[1]), lo4(raw[2]), lo4(raw[3]), lo4(raw[4]), lo4(raw[5]), lo4(raw[6]), lo4(raw[7])];
                q4_k_sub::<T>(&lo, sc[2 * jj], ab, p.act_stride, 2 * jj, &mut isum);
                let hi = [hi4(raw[0]), hi4(raw[1]), hi4(raw[2]), hi4(raw[3]), hi4(raw[4]), hi4(raw[5]), hi4(raw[6]), hi4(raw[7])];
                q4_k_sub::<T>(&hi, sc[2 * jj + 1], ab, p.act_stride, 2 * jj + 1, &mut isum);
            }
            for t in 0..T {
                let da = _mm256_set1_ps(std::ptr::read_unaligned(ab.add(t * p.act_stride) as *const f32));
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], acc_min[t]));
        }
    }
    #[inline(always)]
    fn ahead(p: &Panel<'_>, r0: usize) -> *const u8 {
        S::ahead(p, r0)
    }
}
