//! Matrix × activations on quantized weights.
//!
//! `matmul` quantizes the activations once per call (into the caller's
//! scratch, to `vec_dot_type(w.ty)` blocks, exactly like ggml; for F16
//! weights the avx512 level keeps those f16-rounded values as f32, see
//! `Kernels::act_type`, so its tiles convert only the weights), then hands
//! panels of [`PANEL_ROWS`] rows (more for a single token) to the pool's
//! threads through an atomic counter. A panel covers up to [`PANEL_TOKENS`] tokens; inside, the SIMD
//! kernels work in tiles of a few rows × a few tokens so that each weight
//! block read from memory serves several tokens (prefill) and each activation
//! block several rows.
//!
//! Determinism: every output element is one (row, token) dot computed start to
//! finish by one thread with the same instruction sequence whatever the tile,
//! panel, thread count or batch, so results are bit-identical across thread
//! counts and for a token alone vs. inside a batch (per SIMD level).

use crate::dispatch::{Kernels, Panel, SimdLevel, PANEL_ROWS, PANEL_TOKENS};
use crate::pool::SendPtr;
use crate::{KernelError, ThreadPool, WeightView};
use hearth_quant::{vec_dot_type, GgmlType};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Output elements of one panel (the on-stack buffer of each thread, 16 KiB).
const PANEL_OUT: usize = 4096;
/// Batches up to this many tokens are split into panels like a matvec.
const SMALL_BATCH: usize = PANEL_TOKENS;

/// Activations at least this many elements are quantized on all threads.
const PAR_QUANTIZE_MIN: usize = 1 << 15;

/// Quantize activations `x` (a whole number of blocks) into `out` as
/// `vec_dot_type(wty)` — the form [`matmul`] feeds its kernels.
///
/// Byte-identical to `hearth_quant::quantize_row` on every SIMD level (the
/// AVX2 path reproduces `roundf`'s half-away-from-zero; ggml's own AVX2
/// quantizer rounds half to even and so differs from its reference on ties).
pub fn quantize_activations(wty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    quantize_activations_with(Kernels::active(), wty, x, out)
}

fn quantize_activations_with(k: &Kernels, wty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    let aty = vec_dot_type(wty);
    let q = k.quantize(aty).ok_or(KernelError::unsupported("quantize_activations", aty))?;
    let need = aty.row_bytes(x.len() as u64).ok_or(KernelError::shape(
        "x length (whole blocks)",
        x.len().next_multiple_of(aty.block_size()),
        x.len(),
    ))? as usize;
    if out.len() != need {
        return Err(KernelError::shape("out length", need, out.len()));
    }
    q(x, out);
    Ok(())
}

/// F16 activations kept as f32: each value rounded to f16 (as ggml's F16
/// activations, byte for byte the same numbers) and stored back as f32, the
/// form the avx512 F16 panels read (`Kernels::act_type`). `dst` holds
/// `4 * src.len()` bytes.
pub(crate) fn quantize_f16_as_f32(src: &[f32], dst: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    assert_eq!(dst.len(), 4 * src.len(), "quantize_f16_as_f32: dst length");
    const CH: usize = 256;
    let (mut h, mut f) = ([half::f16::ZERO; CH], [0f32; CH]);
    for (s, d) in src.chunks(CH).zip(dst.chunks_mut(4 * CH)) {
        let (h, f) = (&mut h[..s.len()], &mut f[..s.len()]);
        h.convert_from_f32_slice(s);
        h.convert_to_f32_slice(f);
        for (v, o) in f.iter().zip(d.chunks_exact_mut(4)) {
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// `out[t][r] = dot(w row r, x[t])` for `n_tokens` tokens.
///
/// - `x`: `[n_tokens, w.cols]` row-major f32.
/// - `out`: `[n_tokens, w.rows]` row-major f32 (overwritten).
/// - `scratch`: reused between calls for the quantized activations; grows as
///   needed and is never shrunk.
///
/// Uses the active [`SimdLevel`]; see [`matmul_with`] to pick one.
pub fn matmul(
    pool: &ThreadPool,
    w: &WeightView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_impl(Kernels::active(), pool, w, x, n_tokens, out, scratch)
}

/// [`matmul`] on an explicit SIMD `level` (tests, benchmarks).
pub fn matmul_with(
    level: SimdLevel,
    pool: &ThreadPool,
    w: &WeightView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    let k = Kernels::for_level(level).ok_or(KernelError::shape("SIMD level (not on this CPU)", 0, level as usize))?;
    matmul_impl(k, pool, w, x, n_tokens, out, scratch)
}

/// Whether [`matmul`] has a kernel for weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    Kernels::active().panel(ty).is_some()
}

fn matmul_impl(
    k: &Kernels,
    pool: &ThreadPool,
    w: &WeightView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    let panel = k.panel(w.ty).ok_or(KernelError::unsupported("matmul", w.ty))?;
    w.validate()?;
    let (rows, cols) = (w.rows, w.cols);
    if x.len() != n_tokens * cols {
        return Err(KernelError::shape("x length (n_tokens * cols)", n_tokens * cols, x.len()));
    }
    if out.len() != n_tokens * rows {
        return Err(KernelError::shape("out length (n_tokens * rows)", n_tokens * rows, out.len()));
    }
    if n_tokens == 0 || rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(());
    }

    // 1. Activations → vec_dot_type blocks (or the level's form of them,
    // `Kernels::act_type`), once per call.
    let aty = k.act_type(w.ty);
    let quantize = k.act_quantize(w.ty).ok_or(KernelError::unsupported("quantize_activations", aty))?;
    let arb = aty.row_bytes(cols as u64).expect("cols validated as whole blocks") as usize;
    let sum_offset = k.act_sum_offset(w.ty);
    let sums_len = if sum_offset.is_some() { 4 * n_tokens * (cols / 32) } else { 0 };
    if scratch.len() < n_tokens * arb + sums_len {
        scratch.resize(n_tokens * arb + sums_len, 0);
    }
    let (act, sums) = scratch[..n_tokens * arb + sums_len].split_at_mut(n_tokens * arb);
    if n_tokens * cols >= PAR_QUANTIZE_MIN && pool.n_threads() > 1 && n_tokens > 1 {
        let ap = SendPtr(act.as_mut_ptr());
        pool.run(|i, n| {
            let (t0, t1) = (n_tokens * i / n, n_tokens * (i + 1) / n);
            for t in t0..t1 {
                // SAFETY: token rows are disjoint and split without overlap.
                let dst = unsafe { std::slice::from_raw_parts_mut(ap.get().add(t * arb), arb) };
                quantize(&x[t * cols..(t + 1) * cols], dst);
            }
        });
    } else {
        for (xt, at) in x.chunks_exact(cols).zip(act.chunks_exact_mut(arb)) {
            quantize(xt, at);
        }
    }
    if let Some(k_off) = sum_offset {
        act_block_sums(k_off, act, arb, cols, sums);
    }
    let (act, sums) = (&*act, &*sums);

    // 2. Panels of rows, handed out dynamically (`PanelQueue`).
    let most = if n_tokens <= SMALL_BATCH { (PANEL_OUT / n_tokens) / PANEL_ROWS * PANEL_ROWS } else { PANEL_ROWS };
    // Where `out` starts within a cache line, in f32s (see `PanelQueue`).
    let skew = (out.as_ptr() as usize / 4) % LINE_F32;
    let queue = PanelQueue::new(rows, pool.n_threads(), most, skew);
    let op = SendPtr(out.as_mut_ptr());
    pool.run(|_, _| {
        let mut buf = [0f32; PANEL_OUT];
        while let Some((r0, nr)) = queue.take() {
            let wdata = &w.data[r0 * w.row_stride..];
            for t0 in (0..n_tokens).step_by(PANEL_TOKENS) {
                let nt = PANEL_TOKENS.min(n_tokens - t0);
                let p = Panel {
                    wty: w.ty,
                    w: wdata,
                    row_stride: w.row_stride,
                    n_rows: nr,
                    cols,
                    act: &act[t0 * arb..],
                    act_stride: arb,
                    n_tokens: nt,
                    act_sums: if sums.is_empty() { sums } else { &sums[4 * t0 * (cols / 32)..] },
                };
                panel(&p, &mut buf[..nr * nt]);
                for t in 0..nt {
                    // SAFETY: the panel (rows r0..r0+nr) belongs to this
                    // thread alone; `out` has n_tokens * rows elements.
                    let dst = unsafe { std::slice::from_raw_parts_mut(op.get().add((t0 + t) * rows + r0), nr) };
                    dst.copy_from_slice(&buf[t * nr..(t + 1) * nr]);
                }
            }
        }
    });
    Ok(())
}

/// Hands out panels of rows to the pool's threads: guided self-scheduling
/// (Polychronopoulos & Kuck, 1987, with half its panel size), each panel a
/// `1 / (2 · n_threads)` share of the rows left, in whole [`PANEL_ROWS`], between `PANEL_ROWS` and `most`.
///
/// Why: a matvec (decode, or a batch of up to `SMALL_BATCH` tokens, one pass
/// of the tiles over the weights) streams its weights from memory once. Long
/// first panels keep each thread on long contiguous runs, so the kernels'
/// prefetch of the next rows is mostly of rows the same thread reads next;
/// the short last ones keep the threads finishing together. Fixed panels of
/// an eighth of the rows (the earlier split) left one of two threads idle
/// for half a panel on average at the end of every matmul: 7B Q4_0 decode at
/// 2 threads ran 7% faster with this queue (docs/BENCHMARKS.md). With `most`
/// = `PANEL_ROWS` (prefill) every panel is `PANEL_ROWS` rows.
///
/// Panel boundaries fall on the output's 64-byte cache lines (`skew`: where
/// `out` starts within a line, in f32s): a prefill's panel writes one run of
/// its rows per token, and a boundary inside a line has two threads writing
/// that line for every token. With a heap buffer 16 bytes into a line that
/// false sharing cost 2-thread Q8_0 prefill 12-15% (SmolLM2 layer, 120-130
/// against 146 GFLOP/s, docs/BENCHMARKS.md).
///
/// The split never changes a result: each output element is computed by one
/// thread from start to finish the same way whatever its panel.
struct PanelQueue {
    next: AtomicUsize,
    rows: usize,
    share: usize,
    most: usize,
    skew: usize,
}

/// f32s per 64-byte cache line.
const LINE_F32: usize = 16;

impl PanelQueue {
    fn new(rows: usize, n_threads: usize, most: usize, skew: usize) -> Self {
        PanelQueue { next: AtomicUsize::new(0), rows, share: 2 * n_threads.max(1), most: most.max(PANEL_ROWS), skew: skew % LINE_F32 }
    }

    /// Rows of the panel that starts at row `r0`: its share of the rows left,
    /// ending on a line boundary (moved back, or forward when that would
    /// leave it empty) unless it ends the matrix.
    fn len_at(&self, r0: usize) -> usize {
        let left = self.rows - r0;
        let n = (left / self.share).next_multiple_of(PANEL_ROWS).clamp(PANEL_ROWS, self.most).min(left);
        let end = r0 + n;
        if end == self.rows {
            return n;
        }
        let past = (self.skew + end) % LINE_F32;
        let end = if end - past > r0 { end - past } else { end + LINE_F32 - past };
        end.min(self.rows) - r0
    }

    /// The next panel `(first row, rows)`, or `None` when all are taken.
    fn take(&self) -> Option<(usize, usize)> {
        let mut r0 = self.next.load(Ordering::Relaxed);
        while r0 < self.rows {
            let n = self.len_at(r0);
            match self.next.compare_exchange_weak(r0, r0 + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some((r0, n)),
                Err(now) => r0 = now,
            }
        }
        None
    }
}

/// `-k_off * sum(q)` of every 32-element Q8_0 block of the activation rows
/// `act` (row stride `arb`, `cols` elements each), as little-endian i32 in
/// `out` (`[n_tokens, cols / 32]`): the start of each block's integer dot in
/// kernels whose weights are unsigned (`Kernels::act_sum_offset`).
pub(crate) fn act_block_sums(k_off: i32, act: &[u8], arb: usize, cols: usize, out: &mut [u8]) {
    let nb = cols / 32;
    for (row, o) in act.chunks_exact(arb).zip(out.chunks_exact_mut(4 * nb)) {
        for (blk, o) in row.chunks_exact(34).zip(o.chunks_exact_mut(4)) {
            let s: i32 = blk[2..].iter().map(|&q| q as i8 as i32).sum();
            o.copy_from_slice(&(-k_off * s).to_le_bytes());
        }
    }
}

/// Decode one row of `ty` into `dst` (e.g. one embedding row); re-export of
/// the reference [`hearth_quant::dequantize_row`].
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    Ok(hearth_quant::dequantize_row(ty, src, dst)?)
}

#[cfg(test)]
pub(crate) fn quantize_with(level: SimdLevel, wty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    quantize_activations_with(Kernels::for_level(level).unwrap(), wty, x, out)
}

#[cfg(test)]
mod queue_tests {
    use super::{PanelQueue, PANEL_ROWS};

    /// Panels tile the rows exactly once, in order, shrinking, whole
    /// `PANEL_ROWS` but the last, within `most`; with the output at `skew`
    /// f32s into a cache line, every boundary on a line (the first and last
    /// panels shorter or longer by less than a line).
    #[test]
    fn panels_cover_the_rows_once_and_shrink() {
        for rows in [1, 15, 16, 17, 256, 1000, 4096, 11008, 32000] {
            for threads in [1, 2, 3, 8] {
                for most in [PANEL_ROWS, 128, 4096] {
                    for skew in [0, 4, 15] {
                        check(rows, threads, most, skew);
                    }
                }
            }
        }
        // Control: decode of 4096 rows on 2 threads starts with a quarter of them,
        // and a 4-float skew moves its end back by 4 rows.
        assert_eq!(PanelQueue::new(4096, 2, 4096, 0).take(), Some((0, 1024)));
        assert_eq!(PanelQueue::new(4096, 2, 4096, 4).take(), Some((0, 1020)));
    }

    fn check(rows: usize, threads: usize, most: usize, skew: usize) {
        let q = PanelQueue::new(rows, threads, most, skew);
        let mut panels = Vec::new();
        while let Some(p) = q.take() {
            panels.push(p);
        }
        let mut at = 0;
        let line = super::LINE_F32;
        for (i, &(r0, n)) in panels.iter().enumerate() {
            assert_eq!(r0, at, "rows {rows} threads {threads}");
            assert!(n > 0 && n < most.max(PANEL_ROWS) + line, "{panels:?}");
            if i + 1 < panels.len() {
                assert_eq!((skew + r0 + n) % line, 0, "boundary off a line: skew {skew} {panels:?}");
                if i > 0 {
                    assert_eq!(n % PANEL_ROWS, 0);
                    assert!(panels[i + 1].1 <= n, "panels must not grow: {panels:?}");
                }
            }
            at += n;
        }
        assert_eq!(at, rows);
        assert_eq!(q.take(), None);
    }
}
