//! aarch64 kernels: NEON (every ARMv8-A core), NEON with `sdot`
//! (FEAT_DotProd), and with `smmla` too (FEAT_I8MM).
//!
//! Each kernel computes the same bits as the x86-64 avx2 level's kernel for
//! its type, so an ARM device and an x86 one agree on every logit:
//! - Q4_0 and Q4_K: one row per lane ([`rows`]), llama.cpp's repacked
//!   order: per block (super-block) the exact integer dots, then `acc =
//!   fma(d_w * d_a, float(sum), acc)`; four rows share each convert and FMA.
//! - Q8_0, Q4_1, Q5_0, Q5_1 and the float types ([`blocks`]), Q2_K, Q3_K,
//!   Q5_K and Q6_K ([`kquants`]): ggml's AVX2 order, eight f32 lanes per
//!   (row, token) held as two 128-bit vectors (lane k: bytes 4k..4k+3 of a
//!   32-byte group), `hsum_float_8` at the end.
//!
//! Integer dots are exact at every level ([`int_dot`]), so `neon`,
//! `neon+dotprod` and `neon+i8mm` give the same bits. `neon+i8mm` is
//! `neon+dotprod` but for Q4_0's and Q4_K's tiles of 2 or more tokens, whose
//! dots `smmla` computes for 2 rows × 2 tokens at once ([`mmla`]).

use crate::dispatch::{Kernels, SimdLevel};

mod blocks;
pub(crate) mod f16x8;
mod int_dot;
mod kquants;
mod mmla;
mod neon;
mod rows;
mod tile;

/// Whether this CPU has the dot-product instructions (`sdot`).
fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// Whether this CPU has the int8 matrix multiplies (`smmla`) and `sdot`.
fn has_i8mm() -> bool {
    has_dotprod() && std::arch::is_aarch64_feature_detected!("i8mm")
}

pub(crate) fn kernels(level: SimdLevel) -> Option<&'static Kernels> {
    match level {
        // Advanced SIMD is part of the aarch64 base architecture (and of the
        // aarch64-unknown-linux-gnu target's baseline).
        SimdLevel::Neon => Some(&neon::KERNELS),
        SimdLevel::NeonDot => has_dotprod().then_some(&neon::KERNELS_DOT),
        SimdLevel::NeonI8mm => has_i8mm().then_some(&neon::KERNELS_I8MM),
        _ => None,
    }
}
