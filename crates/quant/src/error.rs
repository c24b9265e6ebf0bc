//! The error type of this crate.

use crate::GgmlType;
use std::fmt;

/// Why a quantize, dequantize or dot call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError {
    kind: QuantErrorKind,
}

/// The kinds of [`QuantError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantErrorKind {
    /// `op` is not implemented for type `ty` (yet).
    Unsupported {
        /// The operation (`"dequantize"`, `"quantize"`, `"vec_dot"`).
        op: &'static str,
        /// The type it was asked for.
        ty: GgmlType,
    },
    /// `n` elements are not a whole number of `ty` blocks.
    NotBlockMultiple {
        /// The type whose block size does not divide `n`.
        ty: GgmlType,
        /// The element count.
        n: usize,
    },
    /// `rows` rows are not whole groups of an interleaved type's rows
    /// ([`crate::interleave`]).
    RowGroups {
        /// The interleaved type.
        ty: GgmlType,
        /// The row count.
        rows: usize,
        /// Rows per group.
        group: usize,
    },
    /// A buffer has the wrong length.
    Length {
        /// Which buffer (`"src"`, `"dst"`, `"w_row"`, `"act"`).
        what: &'static str,
        /// The length it needs (bytes or elements, as the buffer's unit).
        expected: usize,
        /// The length it has.
        actual: usize,
    },
}

impl QuantError {
    /// What went wrong.
    pub fn kind(&self) -> &QuantErrorKind {
        &self.kind
    }

    pub(crate) fn unsupported(op: &'static str, ty: GgmlType) -> Self {
        Self { kind: QuantErrorKind::Unsupported { op, ty } }
    }

    pub(crate) fn length(what: &'static str, expected: usize, actual: usize) -> Self {
        Self { kind: QuantErrorKind::Length { what, expected, actual } }
    }

    pub(crate) fn row_groups(ty: GgmlType, rows: usize, group: usize) -> Self {
        Self { kind: QuantErrorKind::RowGroups { ty, rows, group } }
    }

    pub(crate) fn not_block_multiple(ty: GgmlType, n: usize) -> Self {
        Self { kind: QuantErrorKind::NotBlockMultiple { ty, n } }
    }
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            QuantErrorKind::Unsupported { op, ty } => write!(f, "{op} is not supported for type {ty}"),
            QuantErrorKind::RowGroups { ty, rows, group } => {
                write!(f, "{rows} rows are not whole groups of {group} rows, as type {ty} stores them")
            }
            QuantErrorKind::NotBlockMultiple { ty, n } => write!(
                f,
                "{n} elements is not a multiple of the {ty} block size {}",
                ty.block_size()
            ),
            QuantErrorKind::Length { what, expected, actual } => {
                write!(f, "{what} has length {actual}, expected {expected}")
            }
        }
    }
}

impl std::error::Error for QuantError {}
