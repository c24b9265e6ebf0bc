//! AVX-512 kernels (F+BW+VL; VNNI when present).
//!
//! Quantized dots keep the avx2 level's arithmetic, so results are
//! bit-identical across the two levels: Q4_0 and Q4_K are one row per lane
//! in llama.cpp's repacked order (Q4_K 16 rows a vector in `avx512_q4k`;
//! Q4_0 `avx2_rows`, or `avx512_rows` with VNNI: the same order); the others are ggml's plain order, with
//! `avx512_pair` putting two weight rows in the halves of a 512-bit vector
//! (Q4_1/Q8_0 without VNNI, Q4_1 with it) and the rest running the AVX2
//! code in the wider tiles the 32 EVEX registers allow. The exception is Q8_0
//! with VNNI (`avx512_rows`: one row per lane, about 2x the prefill speed),
//! whose float order is its own. Float dots use 512-bit FMA. The grouped types
//! (`hearth_quant::interleave`) run their row type's 16-row tiles over two 8-row groups
//! side by side (Q4_KX8 always; Q4_0X8 with VNNI, AVX2's 8-row tile without): the same
//! bits as their row type. Where AVX-512 runs in 256-bit halves (AMD Zen 4) a grouped
//! decode takes AVX2's 8-row tile (`split_avx512`), the matvecs of one row a vector take
//! the panel's quarters (`tiles`).

use super::avx2;
use crate::arch::tail::{rd_bf16, rd_f16, rd_f32};
use super::avx2_k;
use super::int_dot::Madd;
use super::tile::{hsum512, hsum512x4, run_matvec, run_panel, tail_dot, Fmt};
use super::{avx512_pair, avx512_rows};
use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::GgmlType;
use std::arch::x86_64::*;

/// AVX-512 without VNNI: AVX2 integer dots (Q4_0 AVX2's rows; Q4_K 16 rows
/// a vector, `avx512_q4k`),
/// 512-bit float dots. Every quantized dot gives the avx2
/// level's results.
pub(super) static KERNELS: Kernels = Kernels {
    level: SimdLevel::Avx512,
    row_lanes: &[GgmlType::Q4_0, GgmlType::Q4_K],
    quantize_q8_0: avx2::quantize_q8_0,
    quantize_q8_1: avx2::quantize_q8_1,
    quantize_f16: avx2::quantize_f16,
    quantize_q8_k: avx2::KERNELS.quantize_q8_k,
    panel_q4_0: super::avx2_rows::panel_q4_0,
    panel_q4_1: |p, o| panel::<avx2::Q4_1<Madd>, 4, 4, 4>(p, o, GgmlType::Q8_1),
    panel_q8_0: |p, o| panel::<avx2::Q8_0<Madd>, 4, 4, 4>(p, o, GgmlType::Q8_0),
    panel_f32: |p, o| panel::<F32, 4, 4, 4>(p, o, GgmlType::F32),
    // F16 × f32 (f16-rounded) activations: 4 rows × 6 tokens, so each
    // weight convert serves 6 FMAs (24 accumulators + 4 weights + 1
    // activation of the 32 registers).
    panel_f16: |p, o| panel::<F16, 4, 4, 6>(p, o, GgmlType::F32),
    panel_bf16: |p, o| panel::<BF16, 4, 4, 4>(p, o, GgmlType::BF16),
    panel_q5_0: |p, o| panel::<avx2_k::Q5_0<Madd>, 4, 4, 4>(p, o, GgmlType::Q8_0),
    panel_q5_1: |p, o| panel::<avx2_k::Q5_1<Madd>, 4, 4, 4>(p, o, GgmlType::Q8_1),
    // One row per lane, 16 rows in 512-bit vectors: the avx2 level's (and
    // llama.cpp's repacked kernels') order.
    panel_q4_k: super::avx512_q4k::panel_q4_k,
    // Q5_K/Q6_K unpack more per pair: 4×4 tiles measured slower than AVX2's 2×4.
    panel_q6_k: avx2::KERNELS.panel_q6_k,
    panel_q5_k: avx2::KERNELS.panel_q5_k,
    panel_q2_k: avx2::KERNELS.panel_q2_k,
    panel_q3_k: avx2::KERNELS.panel_q3_k,
    // AVX2's (the same bits as the avx512 Q4_0 panels'); AVX-VNNI's `vpdpbusd` is not
    // part of AVX-512 VNNI.
    panel_q4_0x8: avx2::KERNELS.panel_q4_0x8,
    // 16 rows a vector (two groups side by side), as `panel_q4_k`; AVX2's 8-row tile for
    // a decode where AVX-512 runs in halves (`split_avx512`).
    panel_q4_kx8: |p, o| {
        if p.n_tokens == 1 && super::split_avx512() {
            super::avx2_rows::panel_q4_kx8(p, o)
        } else {
            super::avx512_q4k::panel_q4_kx8(p, o)
        }
    },
};

/// AVX-512 with VNNI: Q4_0/Q8_0 one row per lane (`avx512_rows`; Q4_K AVX2's
/// rows, from `KERNELS`), Q4_1 two rows per vector (`avx512_pair`, ggml's
/// arithmetic: SmolLM2's reference).
pub(super) static KERNELS_VNNI: Kernels = Kernels {
    row_lanes: &[GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K],
    // Rows too long for the gather offsets: AVX2's rows, the same order.
    panel_q4_0: |p, o| {
        if p.row_stride <= avx512_rows::MAX_ROW_STRIDE {
            avx512_rows::panel::<avx512_rows::Q4_0>(p, o)
        } else {
            super::avx2_rows::panel_q4_0(p, o)
        }
    },
    panel_q4_1: |p, o| panel_vnni::<avx512_pair::Q4_1, 4, 4, 4>(p, o, GgmlType::Q8_1),
    panel_q8_0: rows_or_pairs::<avx512_rows::Q8_0, avx512_pair::Q8_0>,
    // 16 rows a vector (two groups side by side; nothing gathered, so any row stride):
    // `avx512_rows`' Q4_0 tile and bits; AVX2's 8-row tile (the same bits) for a decode
    // where AVX-512 runs in halves (`split_avx512`).
    panel_q4_0x8: |p, o| {
        if p.n_tokens == 1 && super::split_avx512() {
            super::avx2_rows::panel_q4_0x8(p, o)
        } else {
            avx512_rows::panel::<avx512_rows::Q4_0X8>(p, o)
        }
    },
    ..KERNELS
};

/// The one-row-per-lane panel; rows too long for its 32-bit gather offsets
/// (over 128 MiB) take the paired kernel, whose arithmetic differs (such a
/// matrix is always computed that way, so results stay batch-invariant).
#[inline(always)]
fn rows_or_pairs<R: avx512_rows::RowFmt, P: Fmt>(p: &Panel<'_>, out: &mut [f32]) {
    if p.row_stride <= avx512_rows::MAX_ROW_STRIDE {
        avx512_rows::panel::<R>(p, out)
    } else {
        panel_vnni::<P, 8, 4, 12>(p, out, GgmlType::Q8_0)
    }
}

// Tiles: MR rows for a matvec (one activation step shared by more rows), R
// rows × T tokens otherwise; sized (by measurement) so weights, activations
// and accumulators stay in the 32 registers.

#[inline(always)]
fn panel<F: Fmt, const MR: usize, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: this table is only handed out when AVX2/FMA/F16C and AVX-512
    // F/BW/VL were detected; `check` bounds every access of the panel.
    unsafe { panel_avx512::<F, MR, R, T>(p, out) }
}

#[inline(always)]
fn panel_vnni<F: Fmt, const MR: usize, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: as `panel`, and AVX-512 VNNI was detected for this table.
    unsafe { panel_avx512_vnni::<F, MR, R, T>(p, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn panel_avx512<F: Fmt, const MR: usize, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    tiles::<F, MR, R, T>(p, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn panel_avx512_vnni<F: Fmt, const MR: usize, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    tiles::<F, MR, R, T>(p, out)
}

/// A matvec in 4-row tiles over the panel's quarters (`run_matvec`: four far-apart
/// weight streams, as at the avx2 level) for a format of one row per vector with MR 4,
/// else MR adjacent rows; R × T tiles for several tokens. Every (row, token) result is
/// the same either way.
///
/// Why the quarters here too: on an AMD EPYC (Zen 4) host SmolLM2 F16 decode at this
/// level ran 70-72 tok/s at 1 thread with adjacent rows and 82-91 with quarters (2
/// threads 93-99 and 104-130), where it had trailed llama.cpp (0.89 / 0.93). The
/// two-rows-a-vector formats (`avx512_pair`, Q4_1 here) lost 9-17% at 1 thread with
/// them (143, 139, 145 against 128, 115, 132 tok/s): they keep adjacent rows.
/// (`hearth bench -p 0 -n 64 -t 1,2 -r 3`, alternated; docs/BENCHMARKS.md session 47.)
#[inline(always)]
unsafe fn tiles<F: Fmt, const MR: usize, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    if p.n_tokens == 1 && MR == 4 && F::ROWS == 1 {
        run_matvec::<F>(p, out)
    } else if p.n_tokens == 1 {
        run_panel::<F, MR, 1>(p, out)
    } else {
        run_panel::<F, R, T>(p, out)
    }
}

/// A plain-float format, 16 lanes: weights of `$wsz` bytes per element read with
/// `$wload` / `$wrd` (tail), activations of `$asz` bytes with `$aload` / `$ard`.
macro_rules! float_fmt {
    ($(#[$doc:meta])* $name:ident, ($wsz:literal, $wload:expr, $wrd:path), ($asz:literal, $aload:expr, $ard:path)) => {
        $(#[$doc])*
        struct $name;
        impl Fmt for $name {
            const EPB: usize = 16;
            const WB: usize = 16 * $wsz;
            const AB: usize = 16 * $asz;
            type W = __m512;
            type A = __m512;
            type Acc = __m512;
            #[inline(always)]
            unsafe fn zero() -> __m512 {
                _mm512_setzero_ps()
            }
            #[inline(always)]
            unsafe fn load_w(p: *const u8) -> __m512 {
                $wload(p)
            }
            #[inline(always)]
            unsafe fn load_a(p: *const u8) -> __m512 {
                $aload(p)
            }
            #[inline(always)]
            unsafe fn pair(acc: __m512, w: __m512, a: __m512) -> __m512 {
                _mm512_fmadd_ps(w, a, acc)
            }
            #[inline(always)]
            unsafe fn finish(acc: __m512) -> f32 {
                hsum512(acc)
            }
            #[inline(always)]
            unsafe fn finish4(acc: [__m512; 4]) -> [f32; 4] {
                hsum512x4(acc[0], acc[1], acc[2], acc[3])
            }
            #[inline(always)]
            unsafe fn tail(w: *const u8, a: *const u8, n: usize) -> f32 {
                let (w, a) = (std::slice::from_raw_parts(w, n * $wsz), std::slice::from_raw_parts(a, n * $asz));
                tail_dot(n, |i| $wrd(w, i), |i| $ard(a, i))
            }
        }
    };
}

#[inline(always)]
unsafe fn load_f32(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p as *const f32)
}
#[inline(always)]
unsafe fn load_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}
#[inline(always)]
unsafe fn load_bf16(p: *const u8) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i))))
}

float_fmt!(
    /// F32 weights × f32 activations.
    F32, (4, load_f32, rd_f32), (4, load_f32, rd_f32)
);
float_fmt!(
    /// BF16 weights × bf16 activations.
    BF16, (2, load_bf16, rd_bf16), (2, load_bf16, rd_bf16)
);
float_fmt!(
    /// F16 weights × f32 activations holding f16-rounded values (this level's
    /// `Kernels::act_type` for F16): the same products as f16 × f16, but only
    /// the weights are converted, once per step for all the tile's tokens, and
    /// each activation vector is a plain load (or an FMA memory operand).
    F16, (2, load_f16, rd_f16), (4, load_f32, rd_f32)
);
