//! f16 block scales as f32, by table: shared by every architecture's kernels.

/// f16 bits → f32, exact (a `const fn` so the table is built at compile time).
const fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: man * 2^-24; normalize.
            let (mut m, mut e) = (man, 0u32);
            while m & 0x400 == 0 {
                m <<= 1;
                e += 1;
            }
            sign | ((127 - 14 - e) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Every f16 as f32 (256 KiB). Block scales are read through this table
/// rather than converted: on x86 a table read is a plain load (`vbroadcastss`
/// from memory), while `vcvtph2ps` + broadcast are two more shuffle-port µops
/// per block, and the shuffle port is what limits those kernels; on aarch64
/// stable Rust has no f16 vector type to convert a lone scale with.
pub(crate) static F16_TABLE: [f32; 65536] = {
    let mut t = [0f32; 65536];
    let mut i = 0;
    while i < 65536 {
        t[i] = f16_bits_to_f32(i as u16);
        i += 1;
    }
    t
};

/// The f16 at `p` (unaligned), as f32.
#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY (of the index): any u16 indexes the 65536-entry table.
    *F16_TABLE.get_unchecked(std::ptr::read_unaligned(p as *const u16) as usize)
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_table_is_exact() {
        for i in 0..=u16::MAX {
            let want = half::f16::from_bits(i).to_f32();
            let got = super::F16_TABLE[i as usize];
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{i:#x}: {got} vs {want}");
        }
    }
}
