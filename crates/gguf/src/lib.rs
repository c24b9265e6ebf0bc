//! GGUF reader and writer.
//!
//! [`GgufFile::open`] memory-maps a file, validates its whole header against the file
//! size (magic, version, counts, string and array lengths, shapes, tensor types,
//! block-size multiples, offsets) and then hands out tensors as zero-copy byte views.
//! Every violation is a [`GgufError`] naming the field and offset; nothing is allocated
//! beyond what the file's own bytes can justify. [`write_gguf_file`] writes GGUF v3.
//!
//! ```no_run
//! let f = hearth_gguf::GgufFile::open("model.gguf")?;
//! println!("{}", f.get_str("general.architecture")?);
//! let t = f.tensor("token_embd.weight").unwrap();
//! let bytes: &[u8] = f.tensor_data(t); // no copy
//! # Ok::<(), hearth_gguf::GgufError>(())
//! ```
//!
//! Source of the format: ggml's `docs/gguf.md` (versions 2 and 3 share a layout; v1 used
//! 32-bit counts and is not supported).
#![deny(missing_docs)]

mod error;
mod file;
mod pieces;
mod reader;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use pieces::{PieceWriter, PIECE_BYTES};
pub use reader::{parse_header, Header, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS};
pub use value::{type_name, Value};
pub use writer::{string_array, write_gguf, write_gguf_file, TensorSpec};

/// GGUF metadata value type ids, for building [`Value::Array`]s.
pub mod value_type {
    pub use crate::value::ty::*;
}
