//! The scalar end of a float row whose length is not a multiple of a
//! kernel's vector width, shared by every architecture: the same sequential
//! sum everywhere, so the levels agree on it bit for bit.

/// Sequential f32 sum of `n` products, `s += w(i) * a(i)` (multiply, then
/// add: not fused).
#[inline(always)]
pub(crate) fn tail_dot(n: usize, w: impl Fn(usize) -> f32, a: impl Fn(usize) -> f32) -> f32 {
    let mut s = 0f32;
    for i in 0..n {
        s += w(i) * a(i);
    }
    s
}

/// Element `i` of little-endian f32 bytes.
pub(crate) fn rd_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

/// Element `i` of little-endian f16 bytes, as f32 (exact).
pub(crate) fn rd_f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32()
}

/// Element `i` of little-endian bf16 bytes, as f32 (exact).
pub(crate) fn rd_bf16(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
}
