//! CPU compute kernels on GGML blocks: matmul on quantized weights, run-time
//! SIMD dispatch, and the thread pool that runs them.
//!
//! - [`matmul`]: `out[t][r] = dot(w row r, x[t])` for a [`WeightView`] (a
//!   zero-copy rectangle of a GGUF weight tensor) and `n_tokens` f32
//!   activation rows, quantized on the fly to the weight type's
//!   `vec_dot_type` as ggml does. Bit-identical results for any thread count
//!   and any batch composition.
//! - [`ThreadPool`]: persistent workers; [`physical_cores`] for sizing it.
//! - [`SimdLevel`] / [`simd_level`]: the kernels in use, picked once per
//!   process from CPU features (scalar, AVX2, AVX2 + AVX-VNNI, AVX-512 (+VNNI) on
//!   x86-64; NEON, NEON + dotprod, NEON + dotprod + i8mm on aarch64); capped by the
//!   `HEARTH_SIMD=scalar|avx2|avxvnni|avx512|neon|neon+dotprod|neon+i8mm` environment variable (a
//!   level the CPU lacks means the best one below it).
//! - [`quantize_activations`], [`dequantize_row`]: the row conversions.
//!
//! Layout: `generic.rs` is the portable path (the `hearth-quant` reference);
//! `arch/x86_64/` and `arch/aarch64/` hold the SIMD kernels; `dispatch.rs` holds the table of
//! function pointers; `ops.rs` the elementwise and attention ops.
//!
//! ```
//! use hearth_kernels::{matmul, ThreadPool, WeightView};
//! use hearth_quant::{quantize_row, GgmlType};
//! let (rows, cols) = (4, 64);
//! let wf: Vec<f32> = (0..rows * cols).map(|i| ((i % 7) as f32 - 3.0) / 4.0).collect();
//! let mut wq = vec![0u8; rows * GgmlType::Q4_1.row_bytes(cols as u64).unwrap() as usize];
//! quantize_row(GgmlType::Q4_1, &wf, &mut wq).unwrap();
//! let w = WeightView::new(GgmlType::Q4_1, &wq, rows, cols).unwrap();
//! let x = vec![0.5f32; 2 * cols]; // two tokens
//! let mut out = vec![0f32; 2 * rows];
//! let pool = ThreadPool::new(2);
//! matmul(&pool, &w, &x, 2, &mut out, &mut Vec::new()).unwrap();
//! assert_eq!(out[0], out[rows]); // same input, same result
//! ```
#![deny(missing_docs)]

mod arch;
mod dispatch;
mod error;
mod generic;
mod interleaved;
mod matmul;
pub mod affinity;
pub mod ops;
pub mod pages;
mod pool;
mod view;

pub use dispatch::{has_vnni, simd_level, SimdLevel};
pub use error::{KernelError, KernelErrorKind};
pub use matmul::{dequantize_row, matmul, matmul_many, matmul_with, quantize_activations, supports, MatJob};
pub use pool::{physical_cores, ThreadPool};
pub use view::WeightView;

#[cfg(test)]
mod tests;
