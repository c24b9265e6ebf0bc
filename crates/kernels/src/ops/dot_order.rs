//! Which of llama.cpp's builds the f16 attention dots agree with, bit for bit.
//!
//! ggml's `ggml_vec_dot_f16` (ggml-cpu/vec.cpp) sums in an order fixed at compile time
//! by the SIMD width of the machine llama.cpp was built on (`GGML_F16_STEP`,
//! `GGML_F16_EPR` and the reduction macro in ggml-cpu/simd-mappings.h):
//!
//! - AVX-512 build: four 16-lane accumulators over steps of 64 elements, reduced as
//!   `(s0+s2) + (s1+s3)` and then `_mm512_reduce_add_ps`'s halving tree;
//! - AVX2 build: four 8-lane accumulators over steps of 32, `(s0+s2) + (s1+s3)`, then the
//!   two 128-bit halves added and two `_mm_hadd_ps` (`GGML_F32x8_REDUCE`).
//!
//! The two differ in the last bits of a score, which the next layers' Q8 activation
//! roundings can grow into different tokens. hearth computes either order on any CPU
//! (both are written with 256-bit vectors, and portably), so its output never depends
//! on the machine it runs on: the order only says which llama.cpp build to agree with.
//! It is a field of [`super::AttnShape`], so each context chooses its own; the default is
//! the AVX-512 build's (the SmolLM2 references in `shared/reference` were made there),
//! or `HEARTH_F16_DOT_ORDER=avx2` for the AVX2 build's (the Gemma 3 references in
//! `crates/model/tests/data` were made on an AVX2 machine).

use half::f16;
use std::sync::OnceLock;

/// The summation order of the f16 score dots in attention (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum F16DotOrder {
    /// As llama.cpp built for AVX-512: 4 × 16 lanes, steps of 64.
    #[default]
    Avx512,
    /// As llama.cpp built for AVX2 without AVX-512: 4 × 8 lanes, steps of 32.
    Avx2,
}

impl F16DotOrder {
    /// `HEARTH_F16_DOT_ORDER` (`avx2` or `avx512`, read once), else AVX-512's: the
    /// default of every new [`super::AttnShape`].
    pub fn from_env() -> Self {
        static ORDER: OnceLock<F16DotOrder> = OnceLock::new();
        *ORDER.get_or_init(|| match std::env::var("HEARTH_F16_DOT_ORDER") {
            Ok(v) if v.trim().eq_ignore_ascii_case("avx2") => F16DotOrder::Avx2,
            Ok(v) if v.trim().eq_ignore_ascii_case("avx512") => F16DotOrder::Avx512,
            Ok(v) => {
                eprintln!("warning: HEARTH_F16_DOT_ORDER={v:?} is neither avx2 nor avx512; using avx512");
                F16DotOrder::Avx512
            }
            Err(_) => F16DotOrder::Avx512,
        })
    }
}

/// `a · b` in the AVX2 build's order, portably: `a` f32 (f16-representable), `b` f16;
/// the tail past a multiple of 32 is added in f64, as ggml's leftover loop.
pub(super) fn dot_f16_avx2_order(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let np = n & !31;
    let mut s = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, v) in acc.iter_mut().enumerate() {
                *v = a[i + 8 * j + l].mul_add(b[i + 8 * j + l].to_f32(), *v);
            }
        }
    }
    let x: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    let mut sum = hadd_tree(x) as f64;
    for i in np..n {
        sum += (a[i] * b[i].to_f32()) as f64;
    }
    sum as f32
}

/// `a · b` in the AVX-512 build's order, portably: four 16-lane accumulators over
/// steps of 64, `(s0+s2) + (s1+s3)`, then `_mm512_reduce_add_ps`'s halving tree; the
/// tail past a multiple of 64 added in f64.
pub(super) fn dot_f16_avx512_order(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let np = n & !63;
    let mut s = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, acc) in s.iter_mut().enumerate() {
            for (l, v) in acc.iter_mut().enumerate() {
                *v = a[i + 16 * j + l].mul_add(b[i + 16 * j + l].to_f32(), *v);
            }
        }
    }
    let mut x = [0f32; 16];
    for l in 0..16 {
        x[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    }
    let t3: [f32; 8] = std::array::from_fn(|k| x[8 + k] + x[k]);
    let t6: [f32; 4] = std::array::from_fn(|m| t3[4 + m] + t3[m]);
    let mut sum = ((t6[0] + t6[2]) + (t6[1] + t6[3])) as f64;
    for i in np..n {
        sum += (a[i] * b[i].to_f32()) as f64;
    }
    sum as f32
}

/// The end of `GGML_F32x8_REDUCE`: `t0 = lo128 + hi128`, then `hadd(hadd(t0))`, i.e.
/// `(t0[0] + t0[1]) + (t0[2] + t0[3])`.
fn hadd_tree(x: [f32; 8]) -> f32 {
    let t0: [f32; 4] = std::array::from_fn(|m| x[m] + x[4 + m]);
    (t0[0] + t0[1]) + (t0[2] + t0[3])
}
