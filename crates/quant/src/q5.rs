//! 5-bit block formats: Q5_0 (symmetric, offset 16) and Q5_1 (scale + minimum).
//!
//! As Q4_x, with the fifth bit of element `j` in bit `j` of the little-endian
//! `u32` `qh` (elements 0..15 from the low nibbles, 16..31 from the high ones).

use crate::q4::QK4 as QK5;
use crate::q8::{BlockQ8_0, BlockQ8_1};
use half::f16;

/// `block_q5_0`: `x[j] = d * (q5[j] - 16)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, element j in bit j (little-endian).
    pub qh: [u8; 4],
    /// Low nibbles: element j in the low nibble of byte j, element j+16 in its high nibble.
    pub qs: [u8; QK5 / 2],
}

/// `block_q5_1`: `x[j] = d * q5[j] + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bits.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK5 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl BlockQ5_0 {
    /// Bytes per block.
    pub const SIZE: usize = 22;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self { d: f16::from_le_bytes([b[0], b[1]]), qh: b[2..6].try_into().unwrap(), qs: b[6..22].try_into().unwrap() }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..6].copy_from_slice(&self.qh);
        out[6..22].copy_from_slice(&self.qs);
    }

    /// The 32 quants, 0..=31 (before the offset of 16).
    #[inline]
    pub fn q(&self) -> [u8; QK5] {
        q5(&self.qs, self.qh)
    }
}

impl BlockQ5_1 {
    /// Bytes per block.
    pub const SIZE: usize = 24;

    /// Read a block from its first [`Self::SIZE`] bytes.
    #[inline]
    pub fn read(b: &[u8]) -> Self {
        let b = &b[..Self::SIZE];
        Self {
            d: f16::from_le_bytes([b[0], b[1]]),
            m: f16::from_le_bytes([b[2], b[3]]),
            qh: b[4..8].try_into().unwrap(),
            qs: b[8..24].try_into().unwrap(),
        }
    }

    /// Write the block to the first [`Self::SIZE`] bytes of `out`.
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..8].copy_from_slice(&self.qh);
        out[8..24].copy_from_slice(&self.qs);
    }

    /// The 32 quants, 0..=31.
    #[inline]
    pub fn q(&self) -> [u8; QK5] {
        q5(&self.qs, self.qh)
    }
}

#[inline]
fn q5(qs: &[u8; 16], qh: [u8; 4]) -> [u8; QK5] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK5];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((((qh >> j) << 4) & 0x10) as u8);
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    q
}

/// Pack 32 quants (0..=31) into (qs, qh).
#[inline]
fn pack5(q: &[u8; QK5]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

/// `quantize_row_q5_0_ref`: `d = max / -16`, `q = min(31, trunc(x/d + 16.5))`.
pub fn quantize_row_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK5).zip(dst.chunks_exact_mut(BlockQ5_0::SIZE)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK5];
        for (qj, &v) in q.iter_mut().zip(x) {
            // C's `(int8_t)(x + 16.5f)` truncates toward zero, as `as i8` does.
            *qj = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qs, qh) = pack5(&q);
        BlockQ5_0 { d: f16::from_f32(d), qh, qs }.write(out);
    }
}

/// `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `q = trunc((x - min)/d + 0.5)`.
pub fn quantize_row_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK5).zip(dst.chunks_exact_mut(BlockQ5_1::SIZE)) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK5];
        for (qj, &v) in q.iter_mut().zip(x) {
            // ggml: `(uint8_t)(x0 + 0.5f)`, no clamp; only the low 5 bits are stored.
            *qj = ((v - min) * id + 0.5) as u8 & 0x1f;
        }
        let (qs, qh) = pack5(&q);
        BlockQ5_1 { d: f16::from_f32(d), m: f16::from_f32(min), qh, qs }.write(out);
    }
}

/// `dequantize_row_q5_0`.
pub fn dequantize_row_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ5_0::SIZE).zip(dst.chunks_exact_mut(QK5)) {
        let b = BlockQ5_0::read(b);
        let d = b.d.to_f32();
        for (o, &q) in y.iter_mut().zip(&b.q()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// `dequantize_row_q5_1`.
pub fn dequantize_row_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ5_1::SIZE).zip(dst.chunks_exact_mut(QK5)) {
        let b = BlockQ5_1::read(b);
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (o, &q) in y.iter_mut().zip(&b.q()) {
            *o = q as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`: per block `(d_w * d_a) * sumi`, f32 sum.
pub fn vec_dot_q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK5 {
        let x = BlockQ5_0::read(&w[i * BlockQ5_0::SIZE..]);
        let y = BlockQ8_0::read(&a[i * BlockQ8_0::SIZE..]);
        let q = x.q();
        let sumi: i32 = q.iter().zip(&y.qs).map(|(&p, &r)| (p as i32 - 16) * r as i32).sum();
        sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1_generic`: per block `(d_w * d_a) * sumi + m_w * s_a`.
pub fn vec_dot_q5_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK5 {
        let x = BlockQ5_1::read(&w[i * BlockQ5_1::SIZE..]);
        let y = BlockQ8_1::read(&a[i * BlockQ8_1::SIZE..]);
        let q = x.q();
        let sumi: i32 = q.iter().zip(&y.qs).map(|(&p, &r)| p as i32 * r as i32).sum();
        sumf += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_0_known_vector() {
        // max |x| is -16 at index 0: d = 1, q = trunc(x + 16.5) clamped to 31.
        let mut x = [0f32; 32];
        x[0] = -16.0; // 0
        x[1] = 15.0; // 31
        x[2] = 15.6; // 32 -> 31
        x[16] = -0.4; // 16 (bit 4 set)
        x[17] = -0.6; // 15
        let mut b = [0u8; 22];
        quantize_row_q5_0(&x, &mut b);
        assert_eq!(&b[0..2], &[0x00, 0x3c]);
        let q = BlockQ5_0::read(&b).q();
        assert_eq!(&q[..3], &[0, 31, 31]);
        assert_eq!(&q[16..18], &[16, 15]);
        // qh: elements 1, 2, 3..15 (16 -> bit 4), 16, 18..31 have bit 4; 0 and 17 not.
        assert_eq!(u32::from_le_bytes(b[2..6].try_into().unwrap()), !((1 << 0) | (1 << 17)));
        let mut y = [0f32; 32];
        dequantize_row_q5_0(&b, &mut y);
        assert_eq!(y[0], -16.0);
        assert_eq!(y[1], 15.0);
        assert_eq!(y[17], -1.0);
    }

    #[test]
    fn q5_1_known_vector() {
        let x: Vec<f32> = (0..32).map(|i| 1.0 + i as f32).collect();
        let mut b = [0u8; 24];
        quantize_row_q5_1(&x, &mut b);
        assert_eq!(&b[0..4], &[0x00, 0x3c, 0x00, 0x3c]); // d = 1, m = 1
        assert_eq!(&b[4..8], &[0x00, 0x00, 0xff, 0xff]);
        let mut y = [0f32; 32];
        dequantize_row_q5_1(&b, &mut y);
        assert_eq!(&x[..], &y[..]);
    }
}
