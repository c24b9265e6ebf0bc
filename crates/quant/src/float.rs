//! Plain float rows: F32, F16, BF16.
//!
//! Conversions follow ggml exactly: f32→f16 rounds to nearest even (what F16C's
//! `vcvtps2ph` and ggml's software fallback both do); f32→bf16 is ggml's
//! `ggml_compute_fp32_to_bf16` (round to nearest even, NaN kept quiet).
//! The reference dots accumulate in f64 like ggml's scalar `ggml_vec_dot_f16`
//! (`ggml_float` is `double`); each product is formed in f32 first, as there.

use half::{bf16, f16};

/// f32 → bf16 bits as ggml rounds them.
#[inline]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: truncate and force quiet.
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// bf16 → f32 (exact).
#[inline]
pub fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

#[inline]
pub(crate) fn rd_f16(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32()
}

#[inline]
pub(crate) fn rd_bf16(b: &[u8], i: usize) -> f32 {
    bf16_to_f32(bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

#[inline]
pub(crate) fn rd_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// `dst[i] = f32(src[i])` for little-endian f32 bytes.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// `dst[i] = f32(src[i])` for little-endian f16 bytes.
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
    }
}

/// `dst[i] = f32(src[i])` for little-endian bf16 bytes.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(bf16::from_le_bytes([s[0], s[1]]));
    }
}

/// Write `src` as little-endian f32 bytes.
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// Write `src` as little-endian f16 bytes (round to nearest even).
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
    }
}

/// Write `src` as little-endian bf16 bytes (ggml's rounding).
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// Reference F32·F32 dot of `n` elements (f32 products, f64 sum).
pub fn vec_dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for i in 0..n {
        s += (rd_f32(w, i) * rd_f32(a, i)) as f64;
    }
    s as f32
}

/// Reference F16·F16 dot of `n` elements (f32 products, f64 sum).
pub fn vec_dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for i in 0..n {
        s += (rd_f16(w, i) * rd_f16(a, i)) as f64;
    }
    s as f32
}

/// Reference BF16·BF16 dot of `n` elements (f32 products, f64 sum).
pub fn vec_dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for i in 0..n {
        s += (rd_bf16(w, i) * rd_bf16(a, i)) as f64;
    }
    s as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        // 1 + 2^-8 is a tie between 1 and 1+2^-7: round to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0).to_bits(), 0x3f80);
        // 1 + 3*2^-8 ties to the odd neighbour's successor: 1 + 2^-6 (even mantissa).
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0).to_bits(), 0x3f82);
        assert_eq!(f32_to_bf16(-2.0).to_bits(), 0xc000);
        assert_eq!(f32_to_bf16(f32::INFINITY).to_bits(), 0x7f80);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(nan).is_nan());
        // Agrees with the half crate (also round-to-nearest-even) on ordinary values.
        for i in 0..10_000u32 {
            let x = f32::from_bits(0x3000_0000 + i * 104_729);
            assert_eq!(f32_to_bf16(x), bf16::from_f32(x), "{x}");
        }
    }

    #[test]
    fn f16_row_round_trip() {
        let x = [0.0f32, 1.0, -2.5, 65504.0, 1e-7, 0.1];
        let mut b = [0u8; 12];
        quantize_row_f16(&x, &mut b);
        assert_eq!(&b[2..4], &[0x00, 0x3c]); // 1.0 = 0x3c00
        let mut y = [0f32; 6];
        dequantize_row_f16(&b, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-7, "{a} {b}");
        }
    }
}
