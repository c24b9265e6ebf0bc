//! The R×T tile skeleton shared by every x86 kernel.

pub(super) use crate::arch::f16::{f16_at, F16_TABLE};
pub(super) use crate::arch::tail::tail_dot;
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
    /// Weight rows per `W` and per accumulator (2: two rows in the halves of
    /// a 512-bit vector). With 2, `EPB` must be a whole block (no tail).
    const ROWS: usize = 1;
    /// The weights of rows `p` and `p + next` (`next` is 0 for a lone row).
    #[inline(always)]
    unsafe fn load_rows(p: *const u8, _next: usize) -> Self::W {
        Self::load_w(p)
    }
    /// Whether a tile runs its steps in unrolled groups of one prefetch each
    /// (64 weight bytes of a row) rather than one step at a time with a
    /// test for the prefetch in every step. Grouped, the F16 2 × 6 tile at
    /// avx2 lost its per-step test and the address arithmetic that test
    /// kept from folding (72 -> 77 GFLOP/s on SmolLM2's matmuls, `cargo
    /// bench --bench prefill -- 1 9 512 smollm2`), and the avx512 paired
    /// Q4_1 tile ran 80-88 -> 108; the avx512 F16 4 × 6 tile spilled
    /// accumulators across a group (104 -> 72): set by measurement, per
    /// format.
    const UNROLL_GROUPS: bool = false;
    /// The dots of the `ROWS` rows of `acc`.
    #[inline(always)]
    unsafe fn finish_rows(acc: Self::Acc) -> [f32; 2] {
        [Self::finish(acc), 0.0]
    }
    /// `finish` of four accumulators (`ROWS` = 1), each bit-identical to
    /// `finish` alone; a format may share the shuffles among the four.
    #[inline(always)]
    unsafe fn finish4(acc: [Self::Acc; 4]) -> [f32; 4] {
        // Spelled out: `acc.map(..)`'s closure was not inlined into the
        // target-feature caller, so `finish` and its intrinsics became
        // calls (11% of SmolLM2 Q8_0 decode).
        [Self::finish(acc[0]), Self::finish(acc[1]), Self::finish(acc[2]), Self::finish(acc[3])]
    }
}

/// Horizontal sum of 8 lanes in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// [`hsum512`] of four vectors at once: the same pairwise tree per vector
/// (halves, then quarters, then lanes i and i+2, then lanes 0 and 1), so each
/// result is bit-identical to `hsum512` of its vector, in fewer shuffles.
#[inline(always)]
pub(super) unsafe fn hsum512x4(a: __m512, b: __m512, c: __m512, d: __m512) -> [f32; 4] {
    // [a.lo + a.hi | b.lo + b.hi], [c.. | d..]: 256-bit halves added.
    let ab = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b));
    let cd = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(c, d), _mm512_shuffle_f32x4::<0b11_10_11_10>(c, d));
    // Quarter k: vector k's 128-bit halves added.
    let q = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd), _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd));
    // Lane 4k: (q0 + q2) + (q1 + q3) of quarter k.
    let s = _mm512_add_ps(q, _mm512_permute_ps::<0b01_00_11_10>(q));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
    let mut r = [0f32; 16];
    _mm512_storeu_ps(r.as_mut_ptr(), s);
    [r[0], r[4], r[8], r[12]]
}

/// Horizontal sum of 16 lanes in a fixed order (AVX-512F callers only).
#[inline(always)]
pub(super) unsafe fn hsum512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum256(_mm256_add_ps(lo, hi))
}


/// Block `b` of the `R` rows a few tiles on (`prefetch_rows`; null: none),
/// into L2. A row is only a few KiB, so a fixed distance ahead in the row
/// would skip each tile's first KiB; whole tiles ahead keep every stream
/// ahead. Called once per 64 bytes of a row: a prefetch per step of a short
/// block costs more than it brings.
#[inline(always)]
unsafe fn prefetch<F: Fmt, const R: usize>(pf: *const u8, rs: usize, b: usize) {
    if pf.is_null() {
        return;
    }
    for r in 0..R {
        for l in 0..F::WB.div_ceil(64) {
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(r * rs + b * F::WB + 64 * l) as *const i8);
        }
    }
}

/// Step `b` (one `F::EPB`-element block) of every (row, token) pair of a
/// tile whose rows start at `wp` and tokens at `ap`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // w[u] and acc[u][t] in both orders
unsafe fn step<F: Fmt, const R: usize, const T: usize>(mut acc: [[F::Acc; T]; R], wp: *const u8, ap: *const u8, rs: usize, ast: usize, b: usize) -> [[F::Acc; T]; R] {
    let units = R.div_ceil(F::ROWS);
    // (Not `array::from_fn`: its closure is not reliably inlined into
    // target-feature code, which costs 20x.)
    let mut w = [const { MaybeUninit::<F::W>::uninit() }; R];
    for u in 0..units {
        let next = if u * F::ROWS + 1 < R { rs } else { 0 };
        w[u].write(F::load_rows(wp.add(u * F::ROWS * rs + b * F::WB), next));
    }
    for t in 0..T {
        let a = F::load_a(ap.add(t * ast + b * F::AB));
        for u in 0..units {
            acc[u][t] = F::pair(acc[u][t], w[u].assume_init(), a);
        }
    }
    acc
}

/// Rows `r0..r0+R` × tokens `t0..t0+T` of the panel. A weight unit (and an
/// accumulator) holds `F::ROWS` rows: with 2, an odd last row is loaded twice
/// and its second copy's result dropped (lanes never mix, so a row's
/// arithmetic is the same in either half).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // acc[u][t] in both orders
unsafe fn tile<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, r0: usize, t0: usize, out: &mut [f32]) {
    let nb = p.cols / F::EPB;
    let units = R.div_ceil(F::ROWS);
    let (rs, ast) = (p.row_stride, p.act_stride);
    let wp = p.w.as_ptr().add(r0 * rs);
    let ap = p.act.as_ptr().add(t0 * ast);
    let mut acc = [[F::zero(); T]; R];
    let pf = super::prefetch_rows(p, r0, R);
    // One prefetch per 64 bytes of a row: every `group` steps.
    let group = (64 / F::WB).max(1);
    if F::UNROLL_GROUPS {
        let mut b = 0;
        while b + group <= nb {
            prefetch::<F, R>(pf, rs, b);
            for s in 0..group {
                acc = step::<F, R, T>(acc, wp, ap, rs, ast, b + s);
            }
            b += group;
        }
        while b < nb {
            acc = step::<F, R, T>(acc, wp, ap, rs, ast, b);
            b += 1;
        }
    } else {
        for b in 0..nb {
            if b % group == 0 {
                prefetch::<F, R>(pf, rs, b);
            }
            acc = step::<F, R, T>(acc, wp, ap, rs, ast, b);
        }
    }
    let tail = p.cols - nb * F::EPB;
    if F::ROWS == 1 && R.is_multiple_of(4) {
        for t in 0..T {
            for r in (0..R).step_by(4) {
                let v = F::finish4([acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t]]);
                for (k, mut v) in v.into_iter().enumerate() {
                    if tail > 0 {
                        v += F::tail(wp.add((r + k) * rs + nb * F::WB), ap.add(t * ast + nb * F::AB), tail);
                    }
                    out[(t0 + t) * p.n_rows + r0 + r + k] = v;
                }
            }
        }
        return;
    }
    for u in 0..units {
        for t in 0..T {
            let v = F::finish_rows(acc[u][t]);
            for (k, &v) in v.iter().enumerate().take(F::ROWS) {
                let r = u * F::ROWS + k;
                if r < R {
                    let mut v = v;
                    if tail > 0 {
                        v += F::tail(wp.add(r * rs + nb * F::WB), ap.add(t * ast + nb * F::AB), tail);
                    }
                    out[(t0 + t) * p.n_rows + r0 + r] = v;
                }
            }
        }
    }
}

/// Calls the `tile` of shape (nr, nt) for nr in `rows`, nt in `tokens`,
/// skipping shapes beyond (R, T) (never reached: nr ≤ R, nt ≤ T).
macro_rules! tile_dispatch {
    ($F:ty, $R:ident, $T:ident, $nr:expr, $nt:expr, $args:tt; rows $($rr:literal)*; tokens $tts:tt) => {
        'done: {
            $(tile_dispatch!(@row $F, $R, $T, $nr, $nt, $args, 'done, $rr, $tts);)*
            unreachable!("tile shape");
        }
    };
    (@row $F:ty, $R:ident, $T:ident, $nr:expr, $nt:expr, ($p:expr, $r:expr, $t:expr, $out:expr), $done:lifetime, $rr:literal, ($($tt:literal)*)) => {
        $(if $rr <= $R && $tt <= $T && $nr == $rr && $nt == $tt {
            tile::<$F, $rr, $tt>($p, $r, $t, $out);
            break $done;
        })*
    };
}

/// The whole panel in tiles of at most R rows × T tokens: R ∈ {1, 2, 4, 8}
/// (rows left over go in tiles of halving size), T ≤ 12. Token groups are
/// the outer loop: a group's activations stay in L1 while every row of the
/// panel passes over them (the panel's rows are a few KiB each). The tokens
/// are cut into groups of nearly equal size (a 32-token panel at T = 6:
/// 6, 6, 5, 5, 5, 5 rather than 6 × 5 and a 2-token group, which ran at
/// a third of a full tile's FMAs per load); a result does not depend on its
/// group (each (row, token) pair has its own accumulator and step order).
#[inline(always)]
pub(super) unsafe fn run_panel<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    let mut t = 0;
    while t < p.n_tokens {
        let left = p.n_tokens - t;
        let nt = left.div_ceil(left.div_ceil(T));
        let mut r = 0;
        while r < p.n_rows {
            let left = p.n_rows - r;
            let nr = if left >= R { R } else { 1 << left.ilog2() };
            tile_dispatch!(F, R, T, nr, nt, (p, r, t, out); rows 8 4 2 1; tokens (1 2 3 4 5 6 7 8 9 10 11 12));
            r += nr;
        }
        t += nt;
    }
}

/// A matvec panel (one token) of a plain-order format in 4-row tiles whose rows are the
/// panel's 4 quarters: tile `i` takes rows `i`, `q + i`, `2q + i` and `3q + i` (`q` = a
/// quarter), so each of the tile's 4 weight streams walks one quarter's rows in address
/// order. Adjacent rows (`run_panel`) make 4 streams that interleave within the same
/// 4.6 KiB when rows are short (SmolLM2's 576 columns: 1152 bytes of F16), and those read
/// from DRAM at about half the speed of long rows; far-apart streams read as long rows do.
/// Each row's arithmetic is `tile`'s, so every result is bit-identical to `run_panel`'s.
#[inline(always)]
pub(super) unsafe fn run_matvec<F: Fmt>(p: &Panel<'_>, out: &mut [f32]) {
    let q = p.n_rows / 4;
    if q < MATVEC_MIN_QUARTER {
        return run_panel::<F, 4, 1>(p, out);
    }
    let rs = p.row_stride;
    let mut sub = Panel { row_stride: q * rs, n_rows: 4, ..*p };
    let mut o = [0f32; 4];
    // Bounded to the panel's 4q rows: `tile`'s prefetch of rows past its own then finds no
    // room and stays off (the hardware's stream prefetchers follow 4 far-apart streams).
    // The last row may end short of a whole stride (a view narrower than its rows), so
    // `p.w` may end before 4q strides.
    let w = &p.w[..p.w.len().min(4 * q * rs)];
    for i in 0..q {
        sub.w = &w[i * rs..];
        tile::<F, 4, 1>(&sub, 0, 0, &mut o);
        for (k, &v) in o.iter().enumerate() {
            out[k * q + i] = v;
        }
    }
    if p.n_rows > 4 * q {
        let rest = Panel { w: &p.w[4 * q * rs..], n_rows: p.n_rows - 4 * q, ..*p };
        run_panel::<F, 4, 1>(&rest, &mut out[4 * q..]);
    }
}

/// Below this many rows a quarter, `run_matvec` keeps adjacent rows (the streams would be
/// close together anyway).
const MATVEC_MIN_QUARTER: usize = 8;

#[cfg(test)]
mod tests {
    /// `hsum512x4` gives each vector's `hsum512`, bit for bit.
    #[test]
    fn hsum512x4_is_hsum512() {
        if !super::super::has_avx512() {
            return;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn check(v: &[[f32; 16]; 4]) {
            use std::arch::x86_64::_mm512_loadu_ps;
            let l = |i: usize| _mm512_loadu_ps(v[i].as_ptr());
            let got = super::hsum512x4(l(0), l(1), l(2), l(3));
            for (i, g) in got.iter().enumerate() {
                assert_eq!(g.to_bits(), super::hsum512(l(i)).to_bits(), "{v:?}");
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut v = [[0f32; 16]; 4];
            for x in v.iter_mut().flatten() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // Mixed magnitudes, so the summation order shows in the bits.
                *x = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi((s % 40) as i32 - 20);
            }
            // SAFETY: AVX-512F was detected above.
            unsafe { check(&v) };
        }
    }
}
