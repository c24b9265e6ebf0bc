//! GGML block formats.
//!
//! [`GgmlType`] is the type table (GGUF ids, block sizes, bytes per block) shared by
//! the GGUF reader and the kernels.
#![deny(missing_docs)]

mod types;
pub use types::{GgmlType, QK_K};
