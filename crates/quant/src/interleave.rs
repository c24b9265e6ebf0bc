//! Q4_0X8 and Q4_KX8: the blocks of a Q4_0 or Q4_K tensor rearranged so that 8 rows read
//! as one stream.
//!
//! A `[rows, cols]` tensor (`rows` a multiple of 8, `cols` of the block size) is stored as
//! groups of 8 rows, one after another; within a group, per block `b` (the 8 rows' blocks
//! of that column range, `8 × type_size` bytes), first the `h` f16 fields that begin a
//! block, each as the 8 rows' values side by side, then the rest of the block (a whole
//! number of 4-byte words) as the 8 rows' words side by side:
//!
//! | bytes | what |
//! |---|---|
//! | `16f..16f + 16`, `f = 0..h` | the 8 rows' f16 field `f`, row `r` at `16f + 2r` |
//! | `16h + 32k..16h + 32k + 32` | the 8 rows' word `k` of the rest, row `r` at `+ 4r` |
//!
//! | type | row type | `h` | fields | words of the rest | group block |
//! |---|---|---|---|---|---|
//! | Q4_0X8 | Q4_0 (18 B) | 1 | `d` | 4: quant bytes `4k..4k + 4` | 144 B |
//! | Q4_KX8 | Q4_K (144 B) | 2 | `d`, `dmin` | 35: 3 of the 12 scale bytes, then 32 of quants | 1152 B |
//!
//! The bytes within a word are the row type's, unchanged (a Q4_0 quant byte holds element
//! `j` in its low nibble and `j + 16` in its high one; Q4_K's packed 6-bit scales and mins
//! and its quants as GGUF has them). So the tensor has exactly the bytes of its row-major
//! form, moved: [`interleave`] and [`deinterleave`] are lossless.
//!
//! Why: a one-row-per-lane kernel (`hearth-kernels`' `avx2_rows`) reads a block of 8 rows
//! at once. From GGUF's row-major layout that is 8 streams 1 row apart per thread, each
//! block's bytes transposed in registers and its 8 scales gathered one by one; from this
//! layout it is one sequential stream of plain loads. On the 7B's decode matmuls
//! (`hearth-kernels`' bench `layers_7b_decode`, `TYPE=q4_0x8`) Q4_0X8 read 8-12% more
//! bytes per second at 1 thread and 16-19% more at 2, and the 7B decodes 5-13% faster at
//! the avx2 level (docs/BENCHMARKS.md, session 43). The avx512 level reads two groups
//! side by side in 512-bit vectors, 16 rows a step as its own row-type kernels do, without
//! their transposes and scale gathers: there a 7B decodes 27-38% faster than from the
//! row-major file and prefills 4-17% faster (session 45).
//!
//! The price is compatibility: the type ids ([`GgmlType::Q4_0X8`], 1000;
//! [`GgmlType::Q4_KX8`], 1001) are hearth's own, so llama.cpp and other GGUF readers
//! refuse such a file; and rows are not contiguous, so a single row cannot be read on its
//! own (no `dequantize_row`; an embedding table stays in its row type).

use crate::{GgmlType, QuantError};

/// Rows per group.
pub const GROUP_ROWS: usize = 8;

/// How a grouped type lays out its row type's block: the f16 fields it begins with.
struct Layout {
    row: GgmlType,
    halves: usize,
}

/// The layout of grouped type `ty`; `None` for a type that is not grouped.
fn layout(ty: GgmlType) -> Option<Layout> {
    match ty {
        GgmlType::Q4_0X8 => Some(Layout { row: GgmlType::Q4_0, halves: 1 }),
        GgmlType::Q4_KX8 => Some(Layout { row: GgmlType::Q4_K, halves: 2 }),
        _ => None,
    }
}

/// Check a `rows` × `cols` tensor of grouped type `ty` and two buffers' lengths; its
/// layout.
fn check(ty: GgmlType, rows: usize, cols: usize, src: usize, dst: usize) -> Result<Layout, QuantError> {
    let l = layout(ty).ok_or_else(|| QuantError::unsupported("interleave", ty))?;
    if cols % ty.block_size() != 0 {
        return Err(QuantError::not_block_multiple(ty, cols));
    }
    if rows % GROUP_ROWS != 0 {
        return Err(QuantError::row_groups(ty, rows, GROUP_ROWS));
    }
    let need = rows.checked_mul(cols / ty.block_size() * ty.type_size()).ok_or_else(|| QuantError::length("src", usize::MAX, src))?;
    if src != need {
        return Err(QuantError::length("src", need, src));
    }
    if dst != need {
        return Err(QuantError::length("dst", need, dst));
    }
    Ok(l)
}

/// For one group of 8 rows, `cols` wide: `unit(row, group, n)` for each unit of a row's
/// block (an f16 field, `n` = 2, or a word, `n` = 4), with its place in the row-major
/// layout (8 rows of `cols / block` blocks) and in the grouped one.
///
/// (Units, not bytes, in plain loops: a per-byte iterator over the same places took 26
/// ms to copy a 4096 × 4096 Q4_0X8 matrix back to Q4_0, as the scalar and NEON levels do
/// per group; this takes 4-5 ms, session 43's Q4_0-only loops 2-2.5 ms.)
#[inline(always)]
fn for_units(l: &Layout, cols: usize, mut unit: impl FnMut(usize, usize, usize)) {
    let (wb, h) = (l.row.type_size(), 2 * l.halves);
    let (nb, rs) = (cols / l.row.block_size(), cols / l.row.block_size() * wb);
    for b in 0..nb {
        let gb = b * GROUP_ROWS * wb;
        for r in 0..GROUP_ROWS {
            let rb = r * rs + b * wb;
            for f in 0..l.halves {
                unit(rb + 2 * f, gb + 16 * f + 2 * r, 2);
            }
            for k in 0..(wb - h) / 4 {
                unit(rb + h + 4 * k, gb + 8 * h + 32 * k + 4 * r, 4);
            }
        }
    }
}

/// The first `n` (2 or 4) bytes of `src` to `dst`, each length a fixed-size copy.
#[inline(always)]
fn copy(dst: &mut [u8], src: &[u8], n: usize) {
    if n == 2 {
        dst[..2].copy_from_slice(&src[..2]);
    } else {
        dst[..4].copy_from_slice(&src[..4]);
    }
}

/// One group of grouped type `ty` (`src`, `cols` wide) back into its 8 rows of the row
/// type (`dst`, row-major): the inverse of the interleaving. Panics if `ty` is not
/// grouped or a buffer is shorter than the group.
pub fn deinterleave_group(ty: GgmlType, src: &[u8], cols: usize, dst: &mut [u8]) {
    for_units(&layout(ty).expect("a grouped type"), cols, |row, group, n| copy(&mut dst[row..], &src[group..], n));
}

/// A `rows` × `cols` tensor of `ty`'s row type (GGUF's row-major layout, `src`) as grouped
/// type `ty` (Q4_0X8, Q4_KX8; `dst`, the same length). Errors: `ty` not grouped, `cols`
/// not whole blocks, `rows` not whole groups of 8, a buffer of the wrong length.
pub fn interleave(ty: GgmlType, src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    let l = check(ty, rows, cols, src.len(), dst.len())?;
    let bytes = GROUP_ROWS * cols / ty.block_size() * ty.type_size();
    for (s, d) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(bytes)) {
        for_units(&l, cols, |row, group, n| copy(&mut d[group..], &s[row..], n));
    }
    Ok(())
}

/// A tensor of grouped type `ty` (`src`) back in its row type's row-major layout (`dst`):
/// the inverse of [`interleave`], with its errors.
pub fn deinterleave(ty: GgmlType, src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    check(ty, rows, cols, src.len(), dst.len())?;
    let bytes = GROUP_ROWS * cols / ty.block_size() * ty.type_size();
    for (s, d) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(bytes)) {
        deinterleave_group(ty, s, cols, d);
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
            interleave(GgmlType::Q4_0X8, &q, rows, cols, &mut x).unwrap();
            assert_ne!(x, q);
            let mut back = vec![0u8; n];
            deinterleave(GgmlType::Q4_0X8, &x, rows, cols, &mut back).unwrap();
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
    fn q4_kx8_round_trip_and_places() {
        let (rows, cols) = (16, 512);
        let n = rows * cols / 256 * 144;
        let q = bytes(n, 5);
        let mut x = vec![0u8; n];
        interleave(GgmlType::Q4_KX8, &q, rows, cols, &mut x).unwrap();
        let mut back = vec![0u8; n];
        deinterleave(GgmlType::Q4_KX8, &x, rows, cols, &mut back).unwrap();
        assert_eq!(back, q);
        // Row 8 + 3's super-block 1 within group 1's block 1, as the module docs' table says.
        let blk = &q[(8 + 3) * 288 + 144..][..144];
        let g = &x[8 * 288 + 1152..][..1152];
        assert_eq!(&g[6..8], &blk[0..2], "d");
        assert_eq!(&g[16 + 6..16 + 8], &blk[2..4], "dmin");
        assert_eq!(&g[32 + 12..32 + 16], &blk[4..8], "scale word 0");
        assert_eq!(&g[32 + 64 + 12..32 + 64 + 16], &blk[12..16], "scale word 2");
        assert_eq!(&g[32 + 96 + 12..32 + 96 + 16], &blk[16..20], "quant word 0");
        assert_eq!(&g[1152 - 32 + 12..1152 - 32 + 16], &blk[140..144], "last quant word");
    }

    #[test]
    fn shapes_are_checked() {
        let q = vec![0u8; 8 * 18];
        let mut x = vec![0u8; 8 * 18];
        let ty = GgmlType::Q4_0X8;
        assert!(matches!(interleave(ty, &q, 8, 33, &mut x).unwrap_err().kind(), QuantErrorKind::NotBlockMultiple { .. }));
        let e = interleave(ty, &q[..4 * 18], 4, 32, &mut x[..4 * 18]).unwrap_err();
        assert!(matches!(e.kind(), QuantErrorKind::RowGroups { rows: 4, group: 8, .. }), "{e}");
        assert!(e.to_string().contains("4 rows are not whole groups of 8"), "{e}");
        assert!(matches!(interleave(ty, &q, 8, 32, &mut x[1..]).unwrap_err().kind(), QuantErrorKind::Length { what: "dst", .. }));
        assert!(matches!(deinterleave(ty, &q[1..], 8, 32, &mut x).unwrap_err().kind(), QuantErrorKind::Length { what: "src", .. }));
        assert!(interleave(GgmlType::Q4_0, &q, 8, 32, &mut x).is_err(), "Q4_0 is not grouped");
        assert!(crate::dequantize_row(GgmlType::Q4_0X8, &q[..18], &mut [0f32; 32]).is_err());
        assert!(crate::dequantize_row(GgmlType::Q4_KX8, &[0u8; 144], &mut [0f32; 256]).is_err());
        let k = vec![0u8; 8 * 144];
        assert!(matches!(interleave(GgmlType::Q4_KX8, &k, 8, 128, &mut vec![0u8; 8 * 144]).unwrap_err().kind(), QuantErrorKind::NotBlockMultiple { .. }));
    }
}
