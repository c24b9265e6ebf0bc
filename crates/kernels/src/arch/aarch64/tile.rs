//! The R×T tile skeleton of the NEON block kernels (as `x86_64::tile`): a
//! tile of R weight rows × T tokens keeps R×T accumulators; each weight
//! block is loaded (and unpacked) once per tile and used for T tokens, each
//! activation block once and used for R rows. A (row, token) pair's
//! arithmetic is the same whatever the tile shape, so results do not depend
//! on how rows are split among threads or which tokens share a batch.

use crate::dispatch::Panel;
use std::arch::aarch64::*;
use std::mem::MaybeUninit;

/// One block format's arithmetic, as the tile skeleton sees it.
///
/// `unsafe`: raw pointers, in bounds once the caller ran `Panel::check`.
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

/// ggml's `hsum_float_8` of the 8 lanes `lo ‖ hi`: `(s0 + s2) + (s1 + s3)`
/// with `s_i = lo_i + hi_i`, the x86 levels' `hsum256` order.
#[inline(always)]
pub(super) unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let s = vaddq_f32(lo, hi);
    let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

/// Rows `r0..r0+R` × tokens `t0..t0+T` of the panel.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // w[r] and acc[r][t] in both orders
unsafe fn tile<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, r0: usize, t0: usize, out: &mut [f32]) {
    let nb = p.cols / F::EPB;
    let (rs, ast) = (p.row_stride, p.act_stride);
    let wp = p.w.as_ptr().add(r0 * rs);
    let ap = p.act.as_ptr().add(t0 * ast);
    let mut acc = [[F::zero(); T]; R];
    for b in 0..nb {
        // (Not `array::from_fn`: its closure is not reliably inlined.)
        let mut w = [const { MaybeUninit::<F::W>::uninit() }; R];
        for r in 0..R {
            w[r].write(F::load_w(wp.add(r * rs + b * F::WB)));
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

/// Calls the `tile` of shape (nr, nt) among the listed shapes up to (R, T).
macro_rules! tile_dispatch {
    ($F:ty, $R:ident, $T:ident, $nr:expr, $nt:expr, ($p:expr, $r:expr, $t:expr, $out:expr); $(($rr:literal, $tt:literal))*) => {
        'done: {
            $(if $rr <= $R && $tt <= $T && $nr == $rr && $nt == $tt {
                tile::<$F, $rr, $tt>($p, $r, $t, $out);
                break 'done;
            })*
            unreachable!("tile shape");
        }
    };
}

/// The whole panel in tiles of at most R rows × T tokens: R ∈ {1, 2, 4}
/// (rows left over go in tiles of halving size), T ≤ 4. Token groups are
/// the outer loop, so a group's activations stay in L1 while every row of
/// the panel passes over them.
#[inline(always)]
pub(super) unsafe fn run_panel<F: Fmt, const R: usize, const T: usize>(p: &Panel<'_>, out: &mut [f32]) {
    let mut t = 0;
    while t < p.n_tokens {
        let nt = T.min(p.n_tokens - t);
        let mut r = 0;
        while r < p.n_rows {
            let left = p.n_rows - r;
            let nr = if left >= R { R } else { 1 << left.ilog2() };
            tile_dispatch!(F, R, T, nr, nt, (p, r, t, out);
                (4, 1) (4, 2) (4, 3) (4, 4) (2, 1) (2, 2) (2, 3) (2, 4) (1, 1) (1, 2) (1, 3) (1, 4));
            r += nr;
        }
        t += nt;
    }
}
