//! [`WeightView`]: a rectangle of a weight matrix, borrowed, never copied.

use crate::KernelError;
use hearth_quant::GgmlType;
use std::ops::Range;

/// A range of rows and a range of (whole-block) columns of a 2-D weight tensor.
///
/// GGUF/ggml convention: a tensor with `ne = [cols, rows]` (`ne0` = input
/// features) is stored row-major, each row `cols` elements of `ty` blocks.
/// A view keeps the tensor's `row_stride`, so narrowing rows (tensor/pipeline
/// parallel shards of the output dimension) or columns (shards of the input
/// dimension, whose partial sums the caller adds) is O(1) and zero-copy.
///
/// Invariant (checked by the constructors and again by [`matmul`](crate::matmul)):
/// `data` starts at element (0, 0) of the view and holds at least
/// `(rows - 1) * row_stride + row_bytes()` bytes.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    /// Element type.
    pub ty: GgmlType,
    /// Bytes from the first element of the view on.
    pub data: &'a [u8],
    /// Output features (rows).
    pub rows: usize,
    /// Input features (elements per row), a multiple of `ty.block_size()`.
    pub cols: usize,
    /// Bytes between the starts of consecutive rows.
    pub row_stride: usize,
}

impl<'a> WeightView<'a> {
    /// A whole tensor: `data` must be exactly `rows` rows of `cols` elements.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        let rb = row_bytes(ty, cols)?;
        let need = rows.checked_mul(rb).ok_or(KernelError::shape("rows * row bytes", usize::MAX, rows))?;
        if data.len() != need {
            return Err(KernelError::shape("data length", need, data.len()));
        }
        Ok(Self { ty, data, rows, cols, row_stride: rb })
    }

    /// A view with an explicit row stride (e.g. rows interleaved with other data).
    pub fn with_stride(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Result<Self, KernelError> {
        let v = Self { ty, data, rows, cols, row_stride };
        v.validate()?;
        Ok(v)
    }

    /// Check the invariant (the fields are public, so anyone can break it).
    pub fn validate(&self) -> Result<(), KernelError> {
        let rb = row_bytes(self.ty, self.cols)?;
        if self.rows == 0 {
            return Ok(());
        }
        if self.rows > 1 && self.row_stride < rb {
            return Err(KernelError::shape("row_stride", rb, self.row_stride));
        }
        let need = (self.rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|b| b.checked_add(rb))
            .ok_or(KernelError::shape("view bytes", usize::MAX, self.rows))?;
        if self.data.len() < need {
            return Err(KernelError::shape("data length", need, self.data.len()));
        }
        Ok(())
    }

    /// Bytes of one row of the view.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The bytes of row `r` of the view. Panics if `r >= rows`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} out of range for a view of {} rows", self.rows);
        &self.data[r * self.row_stride..r * self.row_stride + self.row_bytes()]
    }

    /// Rows `r` of this view. Panics if the range is out of bounds (like slicing).
    pub fn rows(&self, r: Range<usize>) -> Self {
        assert!(r.start <= r.end && r.end <= self.rows, "rows {r:?} out of range for a view of {} rows", self.rows);
        let n = r.end - r.start;
        let data = if n == 0 {
            &self.data[..0]
        } else {
            let start = r.start * self.row_stride;
            &self.data[start..start + (n - 1) * self.row_stride + self.row_bytes()]
        };
        Self { data, rows: n, ..*self }
    }

    /// Columns `c` of this view; both ends must be multiples of the block size.
    pub fn cols(&self, c: Range<usize>) -> Result<Self, KernelError> {
        let bs = self.ty.block_size();
        if c.start > c.end || c.end > self.cols || !c.start.is_multiple_of(bs) || !c.end.is_multiple_of(bs) {
            return Err(KernelError::cols(self.ty, c.start, c.end));
        }
        let cols = c.end - c.start;
        let off = c.start / bs * self.ty.type_size();
        let rb = cols / bs * self.ty.type_size();
        let data = if self.rows == 0 {
            &self.data[..0]
        } else {
            &self.data[off..off + (self.rows - 1) * self.row_stride + rb]
        };
        Ok(Self { data, cols, ..*self })
    }
}

fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize, KernelError> {
    ty.row_bytes(cols as u64)
        .map(|b| b as usize)
        .ok_or(KernelError::shape("cols (a multiple of the block size)", cols.next_multiple_of(ty.block_size()), cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_is_zero_copy_and_checked() {
        let data: Vec<u8> = (0..4 * 3 * 18).map(|i| i as u8).collect();
        let w = WeightView::new(GgmlType::Q4_0, &data, 4, 96).unwrap();
        assert_eq!(w.row_bytes(), 54);
        let r = w.rows(1..3);
        assert_eq!(r.rows, 2);
        assert_eq!(r.row(0).as_ptr(), w.row(1).as_ptr());
        let c = r.cols(32..96).unwrap();
        assert_eq!(c.cols, 64);
        assert_eq!(c.row(1), &data[2 * 54 + 18..3 * 54]);
        assert_eq!(c.row_stride, 54);
        c.validate().unwrap();
        assert!(w.cols(16..32).is_err());
        assert!(w.cols(0..128).is_err());
        assert!(WeightView::new(GgmlType::Q4_0, &data, 4, 95).is_err());
        assert!(WeightView::new(GgmlType::Q4_0, &data[1..], 4, 96).is_err());
        let mut bad = w;
        bad.rows = 5;
        assert!(bad.validate().is_err());
        assert_eq!(w.rows(2..2).rows, 0);
    }
}
