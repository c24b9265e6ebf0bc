//! 8-bit block formats: Q8_0 (weights and activations) and Q8_1 (activations
//! for the Q4_1/Q5_1 dots: it also stores `s = d * sum(qs)`, so the dot can add
//! the weight minimum's contribution without touching the 32 values).

use half::f16;

/// Elements per Q8_0 / Q8_1 block.
pub const QK8: usize = 32;

/// `block_q8_0`: `x[j] = d * qs[j]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK8],
}

/// `block_q8_1`: `x[j] = d * qs[j]`, `s = d * sum(qs)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK8],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl BlockQ8_0 {
    /// Bytes per block.
    pub const SIZE: usize = 34;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        let mut qs = [0i8; QK8];
        for (q, &v) in qs.iter_mut().zip(&b[2..]) {
            *q = v as i8;
        }
        Self { d: f16::from_le_bytes([b[0], b[1]]), qs }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in out[2..Self::SIZE].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}

impl BlockQ8_1 {
    /// Bytes per block.
    pub const SIZE: usize = 36;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        let mut qs = [0i8; QK8];
        for (q, &v) in qs.iter_mut().zip(&b[4..]) {
            *q = v as i8;
        }
        Self { d: f16::from_le_bytes([b[0], b[1]]), s: f16::from_le_bytes([b[2], b[3]]), qs }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.s.to_le_bytes());
        for (o, &q) in out[4..Self::SIZE].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}

/// `d = amax / 127`, `id = 1/d` (0 for an all-zero block): the scale pair that
/// both Q8 quantizers use.
#[inline]
pub fn q8_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// One block's scale and integer quants: `(d, qs, sum(qs))`, with the rounding given.
#[inline]
fn q8_block(x: &[f32], (d, id): (f32, f32), round: fn(f32) -> f32) -> (f32, [i8; QK8], i32) {
    let mut qs = [0i8; QK8];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round(v * id) as i8;
        sum += *q as i32;
    }
    (d, qs, sum)
}

fn q8_0_row(src: &[f32], dst: &mut [u8], scale: fn(&[f32]) -> (f32, f32), round: fn(f32) -> f32) {
    for (x, out) in src.chunks_exact(QK8).zip(dst.chunks_exact_mut(BlockQ8_0::SIZE)) {
        let (d, qs, _) = q8_block(x, scale(x), round);
        BlockQ8_0 { d: f16::from_f32(d), qs }.write(out);
    }
}

fn q8_1_row(src: &[f32], dst: &mut [u8], scale: fn(&[f32]) -> (f32, f32), round: fn(f32) -> f32) {
    for (x, out) in src.chunks_exact(QK8).zip(dst.chunks_exact_mut(BlockQ8_1::SIZE)) {
        let (d, qs, sum) = q8_block(x, scale(x), round);
        BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(sum as f32 * d), qs }.write(out);
    }
}

/// `quantize_row_q8_0_ref`: `q = roundf(x * id)` (half away from zero).
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) {
    q8_0_row(src, dst, q8_scale, f32::round)
}

/// `quantize_row_q8_1_ref`: as Q8_0, plus `s = f16(sum(q) * d)`.
pub fn quantize_row_q8_1(src: &[f32], dst: &mut [u8]) {
    q8_1_row(src, dst, q8_scale, f32::round)
}

/// Activation quantizer to Q8_0 with the arithmetic of ggml's x86 SIMD `quantize_row_q8_0`
/// (ggml-cpu/arch/x86/quants.c), which is what llama.cpp runs on activations:
/// `id = 127 / amax` (not `1 / d`) and round-half-to-even (`_MM_ROUND_NEAREST`).
/// Matching it keeps our quantized-activation path bit-identical to llama.cpp's; the
/// `_ref` functions above stay the byte-exact file-format quantizers.
pub fn quantize_row_q8_0_act(src: &[f32], dst: &mut [u8]) {
    q8_0_row(src, dst, q8_scale_act, f32::round_ties_even)
}

/// As [`quantize_row_q8_0_act`] for Q8_1, with `s = f16(d * sum(q))`.
pub fn quantize_row_q8_1_act(src: &[f32], dst: &mut [u8]) {
    q8_1_row(src, dst, q8_scale_act, f32::round_ties_even)
}

/// `(d, id)` as ggml's SIMD activation quantizers compute them: `d = amax / 127`, `id = 127 / amax`.
pub fn q8_scale_act(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 })
}

/// `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ8_0::SIZE).zip(dst.chunks_exact_mut(QK8)) {
        let b = BlockQ8_0::read(b);
        let d = b.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Dequantize Q8_1 (`x = d * q`; ggml has no such function, this is the obvious one).
pub fn dequantize_row_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ8_1::SIZE).zip(dst.chunks_exact_mut(QK8)) {
        let b = BlockQ8_1::read(b);
        let d = b.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q8_0_q8_0_generic`: per block `sumi * (d_w * d_a)`, f32 sum.
pub fn vec_dot_q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK8 {
        let x = BlockQ8_0::read(&w[i * BlockQ8_0::SIZE..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::SIZE..]);
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sumf += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_known_vector() {
        // amax = 127 -> d = 1 exactly; rounding is half away from zero.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = -127.0;
        x[2] = 2.5; // -> 3
        x[3] = -2.5; // -> -3
        x[4] = 0.49; // -> 0
        x[5] = 1.5; // -> 2
        let mut b = [0u8; 34];
        quantize_row_q8_0(&x, &mut b);
        assert_eq!(&b[0..2], &[0x00, 0x3c]);
        assert_eq!(&b[2..8], &[127, 129, 3, 253, 0, 2]);
        assert!(b[8..].iter().all(|&q| q == 0));
    }

    #[test]
    fn q8_1_known_vector() {
        // amax = 254 -> d = 2, id = 0.5; q = round(x/2); s = d * sum(q).
        let mut x = [0f32; 32];
        x[0] = 254.0; // 127
        x[16] = 5.0; // 2.5 -> 3
        x[17] = -1.0; // -0.5 -> -1
        let mut b = [0u8; 36];
        quantize_row_q8_1(&x, &mut b);
        assert_eq!(&b[0..2], &f16::from_f32(2.0).to_le_bytes());
        assert_eq!(&b[2..4], &f16::from_f32(2.0 * 129.0).to_le_bytes());
        assert_eq!(b[4], 127);
        assert_eq!(b[4 + 16], 3);
        assert_eq!(b[4 + 17], 255);
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let x = [0f32; 32];
        let mut b = [0xffu8; 36];
        quantize_row_q8_1(&x, &mut b);
        assert!(b.iter().all(|&v| v == 0));
    }
}
