//! The avxvnni level: AVX2 + FMA + F16C with AVX-VNNI's VEX `vpdpbusd`
//! (Intel's cores since Alder Lake, which have no AVX-512; AMD's Zen 5).
//!
//! The avx2 level's kernels with one integer step swapped: u8 × i8 dots in
//! 4-byte groups take one `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd`
//! (`int_dot`). The i32 sums are the same, so every result is bit-identical
//! to the avx2 level's (and so to llama.cpp's, where that level's is). The
//! K-quants other than Q4_K multiply i16 sums by per-sub-block scales in the
//! same `vpmaddwd`, which `vpdpbusd` would not save: they stay AVX2's.

use super::avx2;
use super::avx2_k;
use super::avx2_q8;
use super::avx2_rows;
use super::int_dot::Vnni;
use super::tile::Fmt;
use crate::dispatch::{Kernels, Panel, SimdLevel};

pub(super) static KERNELS: Kernels = Kernels {
    level: SimdLevel::AvxVnni,
    panel_q4_0: avx2_rows::panel_q4_0_vnni,
    panel_q4_1: panel::<avx2::Q4_1<Vnni>, avx2_q8::Q4_1>,
    panel_q8_0: panel::<avx2::Q8_0<Vnni>, avx2_q8::Q8_0>,
    panel_q5_0: panel::<avx2_k::Q5_0<Vnni>, avx2_q8::Q5_0>,
    panel_q5_1: panel::<avx2_k::Q5_1<Vnni>, avx2_q8::Q5_1>,
    panel_q4_0x8: avx2_rows::panel_q4_0x8_vnni,
    ..avx2::KERNELS
};

fn panel<F: Fmt, B: avx2_q8::Block>(p: &Panel<'_>, out: &mut [f32]) {
    p.check(avx2_q8::act_type::<B>(), out);
    // SAFETY: this table is only handed out when AVX2, FMA, F16C and
    // AVX-VNNI were detected, and `check` bounds every access of the panel.
    unsafe { panel_avxvnni::<F, B>(p, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn panel_avxvnni<F: Fmt, B: avx2_q8::Block>(p: &Panel<'_>, out: &mut [f32]) {
    avx2::block_tiles::<F, B, Vnni>(p, out)
}
