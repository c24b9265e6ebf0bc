//! Helpers shared by the kernel benches.

use hearth_quant::GgmlType;

/// `rows` valid rows of `ty`: a cheap pseudo-random f32 matrix (values in [-1, 1],
/// xorshift from `seed`) quantized one row at a time.
pub fn random_weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).expect("cols are whole blocks of the type") as usize;
    let mut out = vec![0u8; rows * rb];
    let mut s = seed | 1;
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        for v in row.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v = (s % 20001) as f32 / 10000.0 - 1.0;
        }
        hearth_quant::quantize_row(ty, &row, &mut out[r * rb..(r + 1) * rb]).expect("row of the type's length");
    }
    out
}
