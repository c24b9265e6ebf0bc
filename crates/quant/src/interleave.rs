//! Q4_0X8: the blocks of a Q4_0 tensor rearranged so that 8 rows read as one stream.
//!
//! A `[rows, cols]` tensor (`rows` a multiple of 8, `cols` of 32) is stored as groups of
//! 8 rows, one after another; within a group, per 32-column block `b` (144 bytes, the 8
//! Q4_0 blocks it holds):
//!
//! | bytes | what |
//! |---|---|
//! | `0..16` | the 8 rows' f16 scales `d`, row `r` at `2r..2r + 2` |
//! | `16 + 32k..48 + 32k`, `k = 0..4` | quant bytes `4k..4k + 4` of row `r` at `4r..4r + 4` |
//!
//! A quant byte is Q4_0's: byte `j` of a row's block holds element `j` in its low nibble
//! and element `j + 16` in its high one, both `w + 8`. So the tensor has exactly the bytes
//! of its Q4_0 form, moved: [`interleave_q4_0`] and [`deinterleave_q4_0`] are lossless.
//!
//! Why: a one-row-per-lane kernel (`hearth-kernels`' `avx2_rows`) reads a block of 8 rows
//! at once. From GGUF's row-major Q4_0 that is 8 streams 1 row apart per thread, each
//! block's quant bytes transposed in registers and its 8 scales gathered one by one; from
//! this layout it is one sequential stream, 5 loads a block and no shuffles. On the 7B's
//! decode matmuls (`hearth-kernels`' bench `layers_7b_decode`, `TYPE=q4_0x8`) that read
//! 8-12% more bytes per second at 1 thread and 16-19% more at 2, and the 7B decodes 5-13%
//! faster at the avx2 level (docs/BENCHMARKS.md, session 43). The avx512 levels have no
//! tile of their own for it yet (they run avx2's), so there their own Q4_0 kernel
//! prefills faster.
//!
//! The price is compatibility: the type id ([`GgmlType::Q4_0X8`], 1000) is hearth's own,
//! so llama.cpp and other GGUF readers refuse such a file; and rows are not contiguous,
//! so a single row cannot be read on its own (no `dequantize_row`; an embedding table
//! stays Q4_0).

use crate::{GgmlType, QuantError};

/// Rows per group.
pub const GROUP_ROWS: usize = 8;
/// Bytes of one group's block: 8 Q4_0 blocks.
pub const GROUP_BLOCK_BYTES: usize = GROUP_ROWS * Q4_0_BYTES;
const Q4_0_BYTES: usize = 18;

/// Check a `rows` × `cols` Q4_0X8 shape and two buffers' lengths; the tensor's bytes.
fn check(rows: usize, cols: usize, src: usize, dst: usize) -> Result<usize, QuantError> {
    let ty = GgmlType::Q4_0X8;
    if cols % 32 != 0 {
        return Err(QuantError::not_block_multiple(ty, cols));
    }
    if rows % GROUP_ROWS != 0 {
        return Err(QuantError::row_groups(ty, rows, GROUP_ROWS));
    }
    let need = rows.checked_mul(cols / 32 * Q4_0_BYTES).ok_or_else(|| QuantError::length("src", usize::MAX, src))?;
    if src != need {
        return Err(QuantError::length("src", need, src));
    }
    if dst != need {
        return Err(QuantError::length("dst", need, dst));
    }
    Ok(need)
}

/// The quant bytes' place: byte `j` (0..16) of row `r`'s block, within a group's block.
#[inline]
fn quant_at(r: usize, j: usize) -> usize {
    16 + 32 * (j / 4) + 4 * r + j % 4
}

/// One group of 8 rows from the Q4_0 layout (`src`: 8 rows of `cols / 32` blocks) into
/// Q4_0X8 (`dst`: the group's `cols / 32` blocks of 144 bytes).
fn interleave_group(src: &[u8], cols: usize, dst: &mut [u8]) {
    let (nb, rs) = (cols / 32, cols / 32 * Q4_0_BYTES);
    for b in 0..nb {
        let out = &mut dst[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
        for r in 0..GROUP_ROWS {
            let blk = &src[r * rs + b * Q4_0_BYTES..][..Q4_0_BYTES];
            out[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
            for j in 0..16 {
                out[quant_at(r, j)] = blk[2 + j];
            }
        }
    }
}

/// One Q4_0X8 group (`src`, `cols / 32` blocks of 144 bytes) back into its 8 rows of
/// Q4_0 (`dst`, row-major): the inverse of the interleaving.
pub fn deinterleave_group(src: &[u8], cols: usize, dst: &mut [u8]) {
    let (nb, rs) = (cols / 32, cols / 32 * Q4_0_BYTES);
    for b in 0..nb {
        let inp = &src[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
        for r in 0..GROUP_ROWS {
            let blk = &mut dst[r * rs + b * Q4_0_BYTES..][..Q4_0_BYTES];
            blk[..2].copy_from_slice(&inp[2 * r..2 * r + 2]);
            for j in 0..16 {
                blk[2 + j] = inp[quant_at(r, j)];
            }
        }
    }
}

/// A `rows` × `cols` Q4_0 tensor (GGUF's row-major layout, `src`) as Q4_0X8 (`dst`, the
/// same length). Errors: `cols` not whole blocks, `rows` not whole groups of 8, a buffer
/// of the wrong length.
pub fn interleave_q4_0(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    by_groups(src, rows, cols, dst, interleave_group)
}

/// A Q4_0X8 tensor (`src`) back as row-major Q4_0 (`dst`): the inverse of
/// [`interleave_q4_0`], with its errors.
pub fn deinterleave_q4_0(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    by_groups(src, rows, cols, dst, deinterleave_group)
}

/// `group` (either direction) over every 8-row group of a checked tensor.
fn by_groups(src: &[u8], rows: usize, cols: usize, dst: &mut [u8], group: fn(&[u8], usize, &mut [u8])) -> Result<(), QuantError> {
    check(rows, cols, src.len(), dst.len())?;
    let bytes = GROUP_ROWS * cols / 32 * Q4_0_BYTES;
    for (s, d) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(bytes)) {
        group(s, cols, d);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QuantErrorKind;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    #[test]
    fn round_trip_and_places() {
        for (rows, cols) in [(8, 32), (16, 96), (24, 4096), (40, 64)] {
            let n = rows * cols / 32 * 18;
            let q = bytes(n, (rows * cols) as u64);
            let mut x = vec![0u8; n];
            interleave_q4_0(&q, rows, cols, &mut x).unwrap();
            assert_ne!(x, q);
            let mut back = vec![0u8; n];
            deinterleave_q4_0(&x, rows, cols, &mut back).unwrap();
            assert_eq!(back, q);
            // Spot checks against the table in the module docs: row 5's block 1 of group 1.
            let (nb, rs) = (cols / 32, cols / 32 * 18);
            if nb > 1 && rows > 8 {
                let blk = &q[(8 + 5) * rs + 18..][..18];
                let g = &x[8 * rs + 144..][..144];
                assert_eq!(&g[10..12], &blk[..2]);
                assert_eq!(&g[16 + 20..16 + 24], &blk[2..6]);
                assert_eq!(&g[16 + 96 + 20..16 + 96 + 24], &blk[14..18]);
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let q = vec![0u8; 8 * 18];
        let mut x = vec![0u8; 8 * 18];
        assert!(matches!(interleave_q4_0(&q, 8, 33, &mut x).unwrap_err().kind(), QuantErrorKind::NotBlockMultiple { .. }));
        let e = interleave_q4_0(&q[..4 * 18], 4, 32, &mut x[..4 * 18]).unwrap_err();
        assert!(matches!(e.kind(), QuantErrorKind::RowGroups { rows: 4, group: 8, .. }), "{e}");
        assert!(e.to_string().contains("4 rows are not whole groups of 8"), "{e}");
        assert!(matches!(interleave_q4_0(&q, 8, 32, &mut x[1..]).unwrap_err().kind(), QuantErrorKind::Length { what: "dst", .. }));
        assert!(matches!(deinterleave_q4_0(&q[1..], 8, 32, &mut x).unwrap_err().kind(), QuantErrorKind::Length { what: "src", .. }));
        assert!(crate::dequantize_row(GgmlType::Q4_0X8, &q[..18], &mut [0f32; 32]).is_err());
    }
}
