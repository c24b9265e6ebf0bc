//! The avxvnni level: AVX2 + FMA + F16C with AVX-VNNI's VEX `vpdpbusd`
//! (Intel's cores since Alder Lake, which have no AVX-512; AMD's Zen 5).
//!
//! The avx2 level's kernels with one integer step swapped: u8 × i8 dots in
//! 4-byte groups take one `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd`
//! (`int_dot`). The i32 sums are the same, so every result is bit-identical
//! to the avx2 level's (and so to llama.cpp's, where that level's is). The
//! K-quants other than Q4_K multiply i16 sums by per-sub-block scales in the
//! same `vpmaddwd`, which `vpdpbusd` would not save: they stay AVX2's.

use super::avx2::{self, tiles};
use super::avx2_k;
use super::avx2_q8;
use super::avx2_rows;
use super::int_dot::Vnni;
use super::tile::Fmt;
use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::GgmlType;

pub(super) static KERNELS: Kernels = Kernels {
    level: SimdLevel::AvxVnni,
    panel_q4_0: avx2_rows::panel_q4_0_vnni,
    panel_q4_1: |p, o| panel::<avx2::Q4_1<Vnni>>(p, o, GgmlType::Q8_1),
    panel_q8_0: |p, o| {
        p.check(GgmlType::Q8_0, o);
        // SAFETY: as `panel`.
        unsafe { panel_q8_0_avxvnni(p, o) }
    },
    panel_q5_0: |p, o| {
        p.check(GgmlType::Q8_0, o);
        // SAFETY: as `panel`.
        unsafe { panel_q5_0_avxvnni(p, o) }
    },
    panel_q5_1: |p, o| panel::<avx2_k::Q5_1<Vnni>>(p, o, GgmlType::Q8_1),
    ..avx2::KERNELS
};

#[inline(always)]
fn panel<F: Fmt>(p: &Panel<'_>, out: &mut [f32], aty: GgmlType) {
    p.check(aty, out);
    // SAFETY: this table is only handed out when AVX2, FMA, F16C and
    // AVX-VNNI were detected, and `check` bounds every access of the panel.
    unsafe { panel_avxvnni::<F>(p, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn panel_q8_0_avxvnni(p: &Panel<'_>, out: &mut [f32]) {
    avx2::i8_block_tiles::<avx2::Q8_0<Vnni>, avx2_q8::Q8_0, Vnni>(p, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn panel_q5_0_avxvnni(p: &Panel<'_>, out: &mut [f32]) {
    avx2::i8_block_tiles::<avx2_k::Q5_0<Vnni>, avx2_q8::Q5_0, Vnni>(p, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn panel_avxvnni<F: Fmt>(p: &Panel<'_>, out: &mut [f32]) {
    // The avx2 level's tile shapes for these types.
    tiles::<F, 2, 4>(p, out)
}
