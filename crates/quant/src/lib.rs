//! GGML block formats and their scalar reference implementations.
//!
//! This crate is the source of truth for what the bytes of a GGUF tensor mean.
//! Everything here is plain scalar Rust written to match ggml bit for bit
//! (`quantize_row_*_ref`, `dequantize_row_*`, `ggml_vec_dot_*_generic`); the
//! SIMD kernels in `hearth-kernels` are tested against it.
//!
//! - [`GgmlType`]: the type table (GGUF ids, block sizes, bytes per block).
//! - [`dequantize_row`] / [`quantize_row`]: whole rows, raw little-endian bytes.
//! - [`vec_dot`]: one weight row against one activation row, where the
//!   activations are already in [`vec_dot_type`]`(weight type)` (Q8_0 for Q4_0,
//!   Q8_1 for Q4_1, ... as ggml's `type_traits_cpu[..].vec_dot_type`).
//! - Block structs ([`BlockQ4_0`], [`BlockQ4_1`], [`BlockQ5_0`], [`BlockQ5_1`],
//!   [`BlockQ8_0`], [`BlockQ8_1`], [`BlockQ4K`], [`BlockQ6K`], ...) are
//!   `#[repr(C)]` with asserted sizes; they are read from and written to byte
//!   slices (field by field, or as an unaligned copy of the whole plain-data
//!   struct), never referenced in place (GGUF data may be unaligned).
//!
//! - [`interleave`]: Q4_0X8 and Q4_KX8, hearth's own layouts of Q4_0 and Q4_K blocks, 8
//!   rows interleaved
//!   (tensor-level: its rows are not contiguous, so it has no row functions here).
//! - K-quants ([`k`]): Q2_K..Q6_K weights with 256-element super-blocks, and
//!   Q8_K, the activation format they dot with.
//!
//! Layout: one module per family (`float`, `q4`, `q5`, `q8`, `k`); a new family
//! is a new module plus arms in the three dispatchers below.
//!
//! ```
//! use hearth_quant::{quantize_row, dequantize_row, vec_dot, vec_dot_type, GgmlType};
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
//! let wty = GgmlType::Q4_1;
//! let mut w = vec![0u8; wty.row_bytes(64).unwrap() as usize];
//! quantize_row(wty, &x, &mut w).unwrap();
//! let aty = vec_dot_type(wty); // Q8_1
//! let mut a = vec![0u8; aty.row_bytes(64).unwrap() as usize];
//! quantize_row(aty, &x, &mut a).unwrap();
//! let dot = vec_dot(wty, &w, &a, 64).unwrap();
//! let exact: f32 = x.iter().map(|v| v * v).sum();
//! assert!((dot - exact).abs() < 0.02 * exact);
//! let mut y = vec![0f32; 64];
//! dequantize_row(wty, &w, &mut y).unwrap();
//! ```
#![deny(missing_docs)]
// `is_multiple_of` needs Rust 1.87; this crate keeps the workspace MSRV.
#![allow(clippy::manual_is_multiple_of)]

mod error;
pub mod float;
pub mod interleave;
pub mod k;
pub mod q4;
pub mod q5;
pub mod q8;
mod types;

pub use error::{QuantError, QuantErrorKind};
pub use k::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
pub use q4::{BlockQ4_0, BlockQ4_1};
pub use q5::{BlockQ5_0, BlockQ5_1};
pub use q8::{BlockQ8_0, BlockQ8_1};
pub use types::{GgmlType, QK_K};

/// The activation type that ggml quantizes the right-hand side into before a
/// dot with weights of type `w` (`type_traits_cpu[w].vec_dot_type`).
pub fn vec_dot_type(w: GgmlType) -> GgmlType {
    use GgmlType::*;
    match w {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 | Q4_0X8 => Q8_0,
        Q4_1 | Q5_1 | Q8_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S
        | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 | Q4_KX8 => Q8_K,
        I8 | I16 | I32 | I64 | F64 => F32,
    }
}

/// Check that `n` elements are whole blocks of `ty` and that `bytes` is exactly
/// their size. Returns the byte count.
fn check_row(ty: GgmlType, what: &'static str, n: usize, bytes: usize) -> Result<usize, QuantError> {
    let need = ty.row_bytes(n as u64).ok_or_else(|| QuantError::not_block_multiple(ty, n))? as usize;
    if bytes != need {
        return Err(QuantError::length(what, need, bytes));
    }
    Ok(need)
}

/// Decode one row of `ty` into `dst` (`dst.len()` elements from exactly
/// `ty.row_bytes(dst.len())` bytes of `src`).
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    let f: fn(&[u8], &mut [f32]) = match ty {
        F32 => float::dequantize_row_f32,
        F16 => float::dequantize_row_f16,
        BF16 => float::dequantize_row_bf16,
        Q4_0 => q4::dequantize_row_q4_0,
        Q4_1 => q4::dequantize_row_q4_1,
        Q8_0 => q8::dequantize_row_q8_0,
        Q8_1 => q8::dequantize_row_q8_1,
        Q5_0 => q5::dequantize_row_q5_0,
        Q5_1 => q5::dequantize_row_q5_1,
        Q2_K => k::dequantize_row_q2_k,
        Q3_K => k::dequantize_row_q3_k,
        Q4_K => k::dequantize_row_q4_k,
        Q5_K => k::dequantize_row_q5_k,
        Q6_K => k::dequantize_row_q6_k,
        Q8_K => k::dequantize_row_q8_k,
        _ => return Err(QuantError::unsupported("dequantize", ty)),
    };
    check_row(ty, "src", dst.len(), src.len())?;
    f(src, dst);
    Ok(())
}

/// Encode `src` as one row of `ty` into exactly `ty.row_bytes(src.len())` bytes,
/// byte-identical to ggml's `quantize_row_*_ref`.
///
/// Supported: as [`dequantize_row`].
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    let f: fn(&[f32], &mut [u8]) = match ty {
        F32 => float::quantize_row_f32,
        F16 => float::quantize_row_f16,
        BF16 => float::quantize_row_bf16,
        Q4_0 => q4::quantize_row_q4_0,
        Q4_1 => q4::quantize_row_q4_1,
        Q8_0 => q8::quantize_row_q8_0,
        Q8_1 => q8::quantize_row_q8_1,
        Q5_0 => q5::quantize_row_q5_0,
        Q5_1 => q5::quantize_row_q5_1,
        Q2_K => k::quantize_row_q2_k,
        Q3_K => k::quantize_row_q3_k,
        Q4_K => k::quantize_row_q4_k,
        Q5_K => k::quantize_row_q5_k,
        Q6_K => k::quantize_row_q6_k,
        Q8_K => k::quantize_row_q8_k,
        _ => return Err(QuantError::unsupported("quantize", ty)),
    };
    check_row(ty, "dst", src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// The reference dot product of `n` elements: one row of weights of type `wty`
/// (`w_row`) against activations already quantized to [`vec_dot_type`]`(wty)`
/// (`act`). Both slices must be exactly one row of `n` elements.
///
/// Supported weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q2_K..Q6_K. Float types sum in
/// f64 (ggml's scalar `ggml_float`); block types sum per-block f32 terms in
/// block order, as ggml's `*_generic` functions.
pub fn vec_dot(wty: GgmlType, w_row: &[u8], act: &[u8], n: usize) -> Result<f32, QuantError> {
    let f = vec_dot_fn(wty).ok_or_else(|| QuantError::unsupported("vec_dot", wty))?;
    check_row(wty, "w_row", n, w_row.len())?;
    check_row(vec_dot_type(wty), "act", n, act.len())?;
    Ok(f(w_row, act, n))
}

/// A reference dot: `(w_row, act, n) -> f32`.
pub type VecDotFn = fn(&[u8], &[u8], usize) -> f32;

/// The unchecked reference dot for `wty` (slices must hold `n` elements), or
/// `None` when `wty` has none. For callers that validated shapes once.
pub fn vec_dot_fn(wty: GgmlType) -> Option<VecDotFn> {
    use GgmlType::*;
    Some(match wty {
        F32 => float::vec_dot_f32,
        F16 => float::vec_dot_f16,
        BF16 => float::vec_dot_bf16,
        Q4_0 => q4::vec_dot_q4_0_q8_0,
        Q4_1 => q4::vec_dot_q4_1_q8_1,
        Q8_0 => q8::vec_dot_q8_0_q8_0,
        Q5_0 => q5::vec_dot_q5_0_q8_0,
        Q5_1 => q5::vec_dot_q5_1_q8_1,
        Q2_K => k::vec_dot_q2_k_q8_k,
        Q3_K => k::vec_dot_q3_k_q8_k,
        Q4_K => k::vec_dot_q4_k_q8_k,
        Q5_K => k::vec_dot_q5_k_q8_k,
        Q6_K => k::vec_dot_q6_k_q8_k,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
