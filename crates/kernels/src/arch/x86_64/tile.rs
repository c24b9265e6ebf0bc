//! The R×T tile skeleton shared by every x86 kernel.

use crate::dispatch::Panel;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// One block format's arithmetic, as the tile skeleton sees it.
///
/// All methods are `unsafe` because they use SIMD intrinsics and raw pointers:
/// callers must have checked the CPU features and the bounds (`Panel::check`).
pub(super) trait Fmt {
    /// Elements per step.
    const EPB: usize;
    /// Weight bytes per step.
    const WB: usize;
    /// Activation bytes per step.
    const AB: usize;
    /// A weight block, unpacked into registers.
    type W: Copy;
    /// An activation block, unpacked into registers.
    type A: Copy;
    /// Accumulator of one (row, token) pair.
    type Acc: Copy;
    unsafe fn zero() -> Self::Acc;
    unsafe fn load_w(p: *const u8) -> Self::W;
    unsafe fn load_a(p: *const u8) -> Self::A;
    unsafe fn pair(acc: Self::Acc, w: Self::W, a: Self::A) -> Self::Acc;
    unsafe fn finish(acc: Self::Acc) -> f32;
    /// The `n` elements after the last whole step (plain float types only).
    #[inline(always)]
    unsafe fn tail(_w: *const u8, _a: *const u8, _n: usize) -> f32 {
        0.0
    }
}

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
/// rather than `vcvtph2ps`: a table read is a plain load (`vbroadcastss` from
/// memory), while convert + broadcast are two more shuffle-port µops per
/// block, and the shuffle port is what limits these kernels.
pub(super) static F16_TABLE: [f32; 65536] = {
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
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY (of the index): any u16 indexes the 65536-entry table.
    *F16_TABLE.get_unchecked(std::ptr::read_unaligned(p as *const u16) as usize)
}

/// Horizontal sum of 8 lanes in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Prefetch distance for weight streams, in bytes.
const PREFETCH: usize = 1024;

/// Rows `r0..r0+R` × tokens `t0..t0+T` of the panel.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // acc[r][t] in both orders
unsafe fn tile<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, r0: usize, t0: usize, out: &mut [f32]) {
    let nb = p.cols / F::EPB;
    let (rs, ast) = (p.row_stride, p.act_stride);
    let wp = p.w.as_ptr().add(r0 * rs);
    let ap = p.act.as_ptr().add(t0 * ast);
    let mut acc = [[F::zero(); T]; R];
    for b in 0..nb {
        // (Not `array::from_fn`: its closure is not reliably inlined into
        // target-feature code, which costs 20x.)
        let mut w = [const { MaybeUninit::<F::W>::uninit() }; R];
        for (r, wr) in w.iter_mut().enumerate() {
            let p = wp.add(r * rs + b * F::WB);
            // Rows of small matrices are short, so the hardware prefetcher
            // barely ramps up before a stream ends; ask for the bytes
            // PREFETCH ahead (possibly the next rows: the address may be past
            // the slice, which a prefetch tolerates).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            wr.write(F::load_w(p));
        }
        for t in 0..T {
            let a = F::load_a(ap.add(t * ast + b * F::AB));
            for r in 0..R {
                acc[r][t] = F::pair(acc[r][t], w[r].assume_init(), a);
            }
        }
    }
    let tail = p.cols - nb * F::EPB;
    for r in 0..R {
        for t in 0..T {
            let mut v = F::finish(acc[r][t]);
            if tail > 0 {
                v += F::tail(wp.add(r * rs + nb * F::WB), ap.add(t * ast + nb * F::AB), tail);
            }
            out[(t0 + t) * p.n_rows + r0 + r] = v;
        }
    }
}

macro_rules! tile_dispatch {
    ($F:ty, $nr:expr, $nt:expr, $p:expr, $r:expr, $t:expr, $out:expr; $(($R:literal, $T:literal))*) => {
        match ($nr, $nt) {
            $(($R, $T) => tile::<$F, $R, $T>($p, $r, $t, $out),)*
            _ => unreachable!("tile shape"),
        }
    };
}

/// The whole panel in tiles of at most R rows × T tokens (R, T ≤ 4).
#[inline(always)]
pub(super) unsafe fn run_panel<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    let mut r = 0;
    while r < p.n_rows {
        let nr = R.min(p.n_rows - r);
        let mut t = 0;
        while t < p.n_tokens {
            let nt = T.min(p.n_tokens - t);
            tile_dispatch!(F, nr, nt, p, r, t, out;
                (1, 1) (1, 2) (1, 3) (1, 4) (2, 1) (2, 2) (2, 3) (2, 4)
                (3, 1) (3, 2) (3, 3) (3, 4) (4, 1) (4, 2) (4, 3) (4, 4));
            t += nt;
        }
        r += nr;
    }
}

/// Sequential f32 sum of `n` products (the tail of a float row).
#[inline(always)]
pub(super) unsafe fn tail_dot(n: usize, w: impl Fn(usize) -> f32, a: impl Fn(usize) -> f32) -> f32 {
    let mut s = 0f32;
    for i in 0..n {
        s += w(i) * a(i);
    }
    s
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
