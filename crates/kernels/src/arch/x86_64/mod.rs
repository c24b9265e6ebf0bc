//! x86-64 kernels: AVX2+FMA+F16C, the same with AVX-VNNI, and AVX-512
//! (F+BW+VL, VNNI when present).
//!
//! All kernels share one skeleton ([`tile`]): a tile of R weight rows × T
//! tokens keeps R×T vector accumulators; each weight block is loaded (and
//! unpacked) once per tile and used for T tokens, each activation block once
//! and used for R rows. The per-(row, token) arithmetic is the same sequence
//! of instructions whatever the tile shape, so results do not depend on how
//! rows are split among threads or which tokens share a batch. Some AVX-512
//! kernels hold two rows per vector (a unit of `Fmt::ROWS` rows): lanes never
//! mix, so a row's arithmetic is the same in either half, or alone. Q4_0
//! (and Q8_0 with VNNI) go further ([`avx2_rows`], [`avx512_rows`]): one row
//! per lane, 8 or 16 rows transposed in registers, in llama.cpp's repacked
//! kernels' float order rather than its plain `ggml_vec_dot` one.

use crate::dispatch::{Kernels, SimdLevel};

mod avx2;
mod avx2_k;
mod avx2_k_low;
mod avx2_q8;
mod avx2_rows;
mod avx512;
mod avx512_pair;
pub(crate) mod avx512_rows;
mod avxvnni;
mod int_dot;
mod rows;
mod tile;

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

pub(crate) fn has_vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

pub(crate) fn kernels(level: SimdLevel) -> Option<&'static Kernels> {
    match level {
        SimdLevel::Scalar => None,
        SimdLevel::Avx2 => has_avx2().then_some(&avx2::KERNELS),
        SimdLevel::AvxVnni => has_avx_vnni().then_some(&avxvnni::KERNELS),
        SimdLevel::Avx512 if has_vnni() => Some(&avx512::KERNELS_VNNI),
        SimdLevel::Avx512 => has_avx512().then_some(&avx512::KERNELS),
    }
}
