//! The `neon`, `neon+dotprod` and `neon+i8mm` tables.

use super::blocks::{self, Block, BF16, F16, F32};
use super::int_dot::{IntDot, Sdot, Widen};
use super::kquants;
use super::mmla;
use super::rows;
use super::tile::{run_panel, Fmt};
use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::{float, k, q8, GgmlType};
use std::marker::PhantomData;

/// One panel's work, run inside a level's entry function ([`neon`],
/// [`dotprod`], [`i8mm`]) so that it is compiled with that level's features.
trait Body {
    unsafe fn run(p: &Panel<'_>, out: &mut [f32]);
}

/// A format of `blocks` in tiles: 4 rows for a matvec, 4 rows × 2 tokens
/// otherwise (16 accumulator vectors of the 32).
struct Tiles<F>(PhantomData<F>);
impl<F: Fmt> Body for Tiles<F> {
    #[inline(always)]
    unsafe fn run(p: &Panel<'_>, out: &mut [f32]) {
        if p.n_tokens == 1 {
            run_panel::<F, 4, 1>(p, out)
        } else {
            run_panel::<F, 4, 2>(p, out)
        }
    }
}

/// A format of `rows`, one row per lane, integer dots by `D`.
struct Rows<K, D>(PhantomData<(K, D)>);
impl<K: rows::RowTile, D: IntDot> Body for Rows<K, D> {
    #[inline(always)]
    unsafe fn run(p: &Panel<'_>, out: &mut [f32]) {
        rows::run::<rows::ByDot<K, D>>(p, out)
    }
}

/// A format of `rows` with its tiles of 2 or more tokens by `smmla`
/// ([`mmla`]), one token by `sdot` (`D` unused: the table's `Sdot`).
struct RowsMmla<K, D>(PhantomData<(K, D)>);
impl<K: mmla::MmlaTile, D: IntDot> Body for RowsMmla<K, D> {
    #[inline(always)]
    unsafe fn run(p: &Panel<'_>, out: &mut [f32]) {
        rows::run::<mmla::ByMmla<K>>(p, out)
    }
}

/// The `neon` level: Advanced SIMD is baseline on aarch64.
unsafe fn neon<B: Body>(p: &Panel<'_>, out: &mut [f32]) {
    B::run(p, out)
}

/// The `neon+dotprod` level: compiled with FEAT_DotProd (`sdot`).
#[target_feature(enable = "dotprod")]
unsafe fn dotprod<B: Body>(p: &Panel<'_>, out: &mut [f32]) {
    B::run(p, out)
}

/// The `neon+i8mm` level: compiled with FEAT_I8MM (`smmla`) and
/// FEAT_DotProd (`sdot`).
#[target_feature(enable = "i8mm,dotprod")]
unsafe fn i8mm<B: Body>(p: &Panel<'_>, out: &mut [f32]) {
    B::run(p, out)
}

/// A table entry: bounds checked for activations of `aty`, then `B` in the
/// level's entry function `run`.
macro_rules! entry {
    ($run:ident, $aty:expr, $body:ty) => {
        |p: &Panel<'_>, o: &mut [f32]| {
            p.check($aty, o);
            // SAFETY: `check` bounds every weight and activation read and the
            // stores go through `o`; a level's table is handed out only once
            // its features were detected (`super::kernels`).
            unsafe { $run::<$body>(p, o) }
        }
    };
}

/// A level's table: `run` its entry function, `D` its integer dot, `rows`
/// the body of the one-row-per-lane formats (Q4_0, Q4_K). The
/// activation quantizers are the reference ones (ggml's aarch64 build
/// quantizes with NEON, byte-identical to them).
macro_rules! table {
    ($level:expr, $run:ident, $d:ty, $rows:ident) => {
        Kernels {
            level: $level,
            row_lanes: &[],
            quantize_q8_0: q8::quantize_row_q8_0_act,
            quantize_q8_1: q8::quantize_row_q8_1_act,
            quantize_f16: float::quantize_row_f16,
            quantize_q8_k: k::quantize_row_q8_k,
            panel_q4_0: entry!($run, GgmlType::Q8_0, $rows<rows::Q4_0, $d>),
            panel_q4_1: entry!($run, GgmlType::Q8_1, Tiles<Block<blocks::Q4_1W, $d>>),
            panel_q8_0: entry!($run, GgmlType::Q8_0, Tiles<Block<blocks::Q8_0W, $d>>),
            panel_f32: entry!($run, GgmlType::F32, Tiles<F32>),
            panel_f16: entry!($run, GgmlType::F32, Tiles<F16>),
            panel_bf16: entry!($run, GgmlType::BF16, Tiles<BF16>),
            panel_q5_0: entry!($run, GgmlType::Q8_0, Tiles<Block<blocks::Q5_0W, $d>>),
            panel_q5_1: entry!($run, GgmlType::Q8_1, Tiles<Block<blocks::Q5_1W, $d>>),
            panel_q2_k: entry!($run, GgmlType::Q8_K, Tiles<kquants::Q2K<$d>>),
            panel_q3_k: entry!($run, GgmlType::Q8_K, Tiles<kquants::Q3K<$d>>),
            panel_q4_k: entry!($run, GgmlType::Q8_K, $rows<rows::Q4K, $d>),
            panel_q5_k: entry!($run, GgmlType::Q8_K, Tiles<kquants::Q5K<$d>>),
            panel_q6_k: entry!($run, GgmlType::Q8_K, Tiles<kquants::Q6K<$d>>),
            panel_q4_0x8: |p, o| crate::interleaved::by_rows(p, o, entry!($run, GgmlType::Q8_0, $rows<rows::Q4_0, $d>)),
            panel_q4_kx8: |p, o| crate::interleaved::by_rows(p, o, entry!($run, GgmlType::Q8_K, $rows<rows::Q4K, $d>)),
        }
    };
}

pub(super) static KERNELS: Kernels = table!(SimdLevel::Neon, neon, Widen, Rows);
pub(super) static KERNELS_DOT: Kernels = table!(SimdLevel::NeonDot, dotprod, Sdot, Rows);
/// `neon+dotprod`'s kernels but Q4_0's and Q4_K's prefill tiles.
pub(super) static KERNELS_I8MM: Kernels = table!(SimdLevel::NeonI8mm, i8mm, Sdot, RowsMmla);
