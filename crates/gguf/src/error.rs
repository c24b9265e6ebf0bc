//! Typed errors: each names the field and the byte offset where parsing stopped.

use std::path::PathBuf;

/// Why a GGUF file was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, mapped or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic bytes {found:02x?}, expected \"GGUF\")")]
    BadMagic {
        /// The bytes found.
        found: Vec<u8>,
    },
    /// A version this reader does not understand.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The file ends before a field that should be there.
    #[error("truncated file: {field} at offset {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        /// What was being read.
        field: String,
        /// Where.
        offset: u64,
        /// How many bytes it needed.
        needed: u64,
        /// File length.
        len: u64,
    },
    /// A field holds a value that cannot be right (count, length, type id, shape, offset...).
    #[error("invalid {field} at offset {offset}: {reason}")]
    Invalid {
        /// What was being read.
        field: String,
        /// Where.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A metadata key is missing or of the wrong type.
    #[error("metadata key {key}: {reason}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, GgufError>;
