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

/// `len` bytes repeating `seed` (pseudo-random bytes instead when `NOISE` is set in the
/// environment), in a buffer advised to use 2 MiB pages
/// (`madvise(MADV_HUGEPAGE)` before the first touch), as a large model's mapped
/// weights mostly are (docs/BENCHMARKS.md, sessions 28 and 41), and as
/// `hearth bench --membw` measures the read bandwidth. Returns the buffer and the
/// offset of the repeated bytes in it (2 MiB-aligned).
#[allow(dead_code)]
pub fn huge_page_copy(seed: &[u8], len: usize) -> (Vec<u8>, usize) {
    const HUGE: usize = 2 << 20;
    let mut buf: Vec<u8> = Vec::with_capacity(len + HUGE);
    hearth_kernels::pages::advise_huge_pages(&mut buf);
    let at = (buf.as_ptr() as usize).next_multiple_of(HUGE) - buf.as_ptr() as usize;
    buf.resize(at, 0);
    if std::env::var("NOISE").is_ok() {
        let mut x = 0x9e3779b97f4a7c15u64;
        buf.extend((0..len).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
    } else {
        buf.extend(seed.iter().copied().cycle().take(len));
    }
    (buf, at)
}
