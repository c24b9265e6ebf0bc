//! 4-bit block formats: Q4_0 (symmetric, offset 8) and Q4_1 (scale + minimum).
//!
//! Layouts are ggml-common.h's. In both, `qs[j]` holds element `j` in its low
//! nibble and element `j + 16` in its high nibble. Blocks are read from raw
//! bytes with `from_le_bytes` (the data may sit unaligned in an mmapped file).

use crate::q8::{BlockQ8_0, BlockQ8_1};
use half::f16;

/// Elements per Q4_0 / Q4_1 block.
pub const QK4: usize = 32;

/// `block_q4_0`: `x[j] = d * ((qs nibble j) - 8)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// 32 nibbles.
    pub qs: [u8; QK4 / 2],
}

/// `block_q4_1`: `x[j] = d * (qs nibble j) + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// 32 nibbles.
    pub qs: [u8; QK4 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_0 {
    /// Bytes per block.
    pub const SIZE: usize = 18;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self { d: f16::from_le_bytes([b[0], b[1]]), qs: b[2..18].try_into().unwrap() }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..18].copy_from_slice(&self.qs);
    }
}

impl BlockQ4_1 {
    /// Bytes per block.
    pub const SIZE: usize = 20;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self {
            d: f16::from_le_bytes([b[0], b[1]]),
            m: f16::from_le_bytes([b[2], b[3]]),
            qs: b[4..20].try_into().unwrap(),
        }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..20].copy_from_slice(&self.qs);
    }
}

/// `quantize_row_q4_0_ref`: `src.len()` must be a multiple of 32.
pub fn quantize_row_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK4).zip(dst.chunks_exact_mut(BlockQ4_0::SIZE)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            // C's `(int8_t)(x + 8.5f)` truncates toward zero; `as i8` does too.
            let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let x1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            qs[j] = x0 | (x1 << 4);
        }
        BlockQ4_0 { d: f16::from_f32(d), qs }.write(out);
    }
}

/// `quantize_row_q4_1_ref`: `src.len()` must be a multiple of 32.
pub fn quantize_row_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK4).zip(dst.chunks_exact_mut(BlockQ4_1::SIZE)) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let x0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let x1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            qs[j] = x0 | (x1 << 4);
        }
        BlockQ4_1 { d: f16::from_f32(d), m: f16::from_f32(min), qs }.write(out);
    }
}

/// `dequantize_row_q4_0`.
pub fn dequantize_row_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ4_0::SIZE).zip(dst.chunks_exact_mut(QK4)) {
        let b = BlockQ4_0::read(b);
        let d = b.d.to_f32();
        for j in 0..16 {
            y[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            y[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// `dequantize_row_q4_1`.
pub fn dequantize_row_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ4_1::SIZE).zip(dst.chunks_exact_mut(QK4)) {
        let b = BlockQ4_1::read(b);
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for j in 0..16 {
            y[j] = (b.qs[j] & 0x0f) as f32 * d + m;
            y[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q4_0_q8_0_generic`: `n` elements of a Q4_0 row against Q8_0
/// activations. Per block `sumi * d_w * d_a`, summed in f32 in block order.
pub fn vec_dot_q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK4 {
        let x = BlockQ4_0::read(&w[i * BlockQ4_0::SIZE..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::SIZE..]);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            s0 += ((x.qs[j] & 0x0f) as i32 - 8) * y.qs[j] as i32;
            s1 += ((x.qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
        }
        sumf += (s0 + s1) as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: per block `d_w*d_a*sumi + m_w*s_a`
/// (`s_a` = `d_a * sum(q_a)`, stored in the Q8_1 block).
pub fn vec_dot_q4_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK4 {
        let x = BlockQ4_1::read(&w[i * BlockQ4_1::SIZE..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::SIZE..]);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            s0 += (x.qs[j] & 0x0f) as i32 * y.qs[j] as i32;
            s1 += (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sumf += (x.d.to_f32() * y.d.to_f32()) * (s0 + s1) as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_known_vector() {
        // max |x| is -8 at index 0, so d = -8 / -8 = 1, id = 1: q = trunc(x + 8.5) clamped.
        let mut x = [0f32; 32];
        x[0] = -8.0;
        x[1] = 7.0;
        x[2] = 7.6; // 16.1 -> 16 -> clamped to 15
        x[16] = -0.4; // 8.1 -> 8
        x[17] = -0.6; // 7.9 -> 7
        let mut b = [0u8; 18];
        quantize_row_q4_0(&x, &mut b);
        assert_eq!(&b[0..2], &[0x00, 0x3c]); // d = 1.0
        assert_eq!(b[2], 0x80); // x0 -> 0, x16 -> 8
        assert_eq!(b[3], 0x7f); // x1 -> 15, x17 -> 7
        assert_eq!(b[4], 0x8f); // x2 -> 15, x18 = 0 -> 8
        assert!(b[5..].iter().all(|&q| q == 0x88));
    }

    #[test]
    fn q4_1_known_vector() {
        // min 1, max 16: d = 1, m = 1; q = trunc(x - 1 + 0.5).
        let x: Vec<f32> = (0..32).map(|i| 1.0 + (i % 16) as f32).collect();
        let mut b = [0u8; 20];
        quantize_row_q4_1(&x, &mut b);
        assert_eq!(&b[0..4], &[0x00, 0x3c, 0x00, 0x3c]);
        for j in 0..16 {
            assert_eq!(b[4 + j], (j as u8) | ((j as u8) << 4));
        }
        let mut y = [0f32; 32];
        dequantize_row_q4_1(&b, &mut y);
        assert_eq!(&x[..], &y[..]);
    }
}
