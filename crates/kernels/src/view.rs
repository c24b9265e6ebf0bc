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
///
/// A type that stores rows in groups ([`GgmlType::group_rows`] `g` > 1: Q4_0X8, Q4_KX8) keeps
/// whole groups: `rows` and every row range a multiple of `g`; row `r`'s group starts
/// at `r * row_stride` (a group is `g` rows' bytes), and block `b` of the group's rows at
/// `b * g * type_size()` within it. `data` then holds `(rows / g - 1) * g * row_stride
/// + g * row_bytes()` bytes, and [`row`](Self::row) is refused (a row is not contiguous).
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
        whole_groups(ty, rows)?;
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
        whole_groups(self.ty, self.rows)?;
        if self.rows == 0 {
            return Ok(());
        }
        if self.rows > 1 && self.row_stride < rb {
            return Err(KernelError::shape("row_stride", rb, self.row_stride));
        }
        let need = span(self.ty, self.rows, self.row_stride, rb).ok_or(KernelError::shape("view bytes", usize::MAX, self.rows))?;
        if self.data.len() < need {
            return Err(KernelError::shape("data length", need, self.data.len()));
        }
        Ok(())
    }

    /// Bytes of one row of the view.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The bytes of row `r` of the view. Panics if `r >= rows`, or for a type that stores
    /// rows in groups (its rows are not contiguous).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} out of range for a view of {} rows", self.rows);
        assert!(self.ty.group_rows() == 1, "a {} row is not contiguous", self.ty);
        &self.data[r * self.row_stride..r * self.row_stride + self.row_bytes()]
    }

    /// Rows `r` of this view. Panics if the range is out of bounds (like slicing), or
    /// cuts a group of a type that stores rows in groups.
    pub fn rows(&self, r: Range<usize>) -> Self {
        assert!(r.start <= r.end && r.end <= self.rows, "rows {r:?} out of range for a view of {} rows", self.rows);
        let g = self.ty.group_rows();
        assert!(r.start.is_multiple_of(g) && r.end.is_multiple_of(g), "rows {r:?} cut the {g}-row groups of a {} view", self.ty);
        let n = r.end - r.start;
        let data = if n == 0 {
            &self.data[..0]
        } else {
            let start = r.start * self.row_stride;
            &self.data[start..start + span(self.ty, n, self.row_stride, self.row_bytes()).expect("a narrower view fits")]
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
        // A group's block holds its rows' blocks side by side.
        let off = c.start / bs * self.ty.type_size() * self.ty.group_rows();
        let rb = cols / bs * self.ty.type_size();
        let data = if self.rows == 0 {
            &self.data[..0]
        } else {
            &self.data[off..off + span(self.ty, self.rows, self.row_stride, rb).expect("a narrower view fits")]
        };
        Ok(Self { data, cols, ..*self })
    }
}

/// Bytes a view of `rows` rows (`rows` ≥ 1, whole groups) needs from its first:
/// `(rows / g - 1) * g * row_stride + g * rb` for `g` rows per group (1: the last row
/// ends `rb` bytes after its start). `None` on overflow.
pub(crate) fn span(ty: GgmlType, rows: usize, row_stride: usize, rb: usize) -> Option<usize> {
    let g = ty.group_rows();
    (rows / g - 1).checked_mul(g)?.checked_mul(row_stride)?.checked_add(g.checked_mul(rb)?)
}

/// `rows` must be whole groups of a type that stores rows in groups.
fn whole_groups(ty: GgmlType, rows: usize) -> Result<(), KernelError> {
    let g = ty.group_rows();
    if !rows.is_multiple_of(g) {
        return Err(KernelError::shape("rows (whole groups of the type's rows)", rows.next_multiple_of(g), rows));
    }
    Ok(())
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
