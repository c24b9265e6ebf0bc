//! The error type of this crate.

use hearth_quant::{GgmlType, QuantError};
use std::fmt;

/// Why a kernel call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    kind: KernelErrorKind,
}

/// The kinds of [`KernelError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelErrorKind {
    /// No kernel exists for this weight (or activation) type.
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The type.
        ty: GgmlType,
    },
    /// A shape or buffer length does not fit.
    Shape {
        /// Which argument or field (`"x"`, `"out"`, `"data"`, `"cols"`).
        what: &'static str,
        /// The value it needs.
        expected: usize,
        /// The value it has.
        actual: usize,
    },
    /// A column range does not start and end on a block boundary.
    ColumnsNotOnBlocks {
        /// The weight type.
        ty: GgmlType,
        /// First column.
        start: usize,
        /// One past the last column.
        end: usize,
    },
    /// The reference layer refused the call.
    Quant(QuantError),
}

impl KernelError {
    /// What went wrong.
    pub fn kind(&self) -> &KernelErrorKind {
        &self.kind
    }

    pub(crate) fn unsupported(op: &'static str, ty: GgmlType) -> Self {
        Self { kind: KernelErrorKind::Unsupported { op, ty } }
    }

    pub(crate) fn shape(what: &'static str, expected: usize, actual: usize) -> Self {
        Self { kind: KernelErrorKind::Shape { what, expected, actual } }
    }

    pub(crate) fn cols(ty: GgmlType, start: usize, end: usize) -> Self {
        Self { kind: KernelErrorKind::ColumnsNotOnBlocks { ty, start, end } }
    }
}

impl From<QuantError> for KernelError {
    fn from(e: QuantError) -> Self {
        Self { kind: KernelErrorKind::Quant(e) }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KernelErrorKind::Unsupported { op, ty } => write!(f, "{op}: no kernel for type {ty}"),
            KernelErrorKind::Shape { what, expected, actual } => {
                write!(f, "{what} is {actual}, expected {expected}")
            }
            KernelErrorKind::ColumnsNotOnBlocks { ty, start, end } => write!(
                f,
                "columns {start}..{end} are not on {ty} block boundaries (block size {})",
                ty.block_size()
            ),
            KernelErrorKind::Quant(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            KernelErrorKind::Quant(e) => Some(e),
            _ => None,
        }
    }
}
