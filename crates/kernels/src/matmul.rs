//! Matrix × activations on quantized weights.
//!
//! `matmul` quantizes the activations once per call (into the caller's
//! scratch, to `vec_dot_type(w.ty)` blocks, exactly like ggml; for F16
//! weights the avx512 and NEON levels keep those f16-rounded values as f32,
//! see `Kernels::act_type`, so their tiles convert only the weights), then hands
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

use crate::dispatch::{Kernels, Panel, PanelFn, QuantFn, SimdLevel, PANEL_ROWS, PANEL_TOKENS};
use crate::pool::SendPtr;
use crate::{KernelError, ThreadPool, WeightView};
use hearth_quant::{vec_dot_type, GgmlType};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Output elements of one panel (the on-stack buffer of each thread, 16 KiB).
const PANEL_OUT: usize = 4096;

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

/// One product of a [`matmul_many`] call: `out[t][r] = dot(w row r, x[t])`,
/// `x: [n_tokens, w.cols]`, `out: [n_tokens, w.rows]`, as in [`matmul`].
pub struct MatJob<'a, 'w> {
    /// The weights, `[rows, cols]`.
    pub w: &'a WeightView<'w>,
    /// Activations, `[n_tokens, cols]` row-major f32.
    pub x: &'a [f32],
    /// Tokens (rows of `x`).
    pub n_tokens: usize,
    /// Result, `[n_tokens, rows]` row-major f32 (overwritten).
    pub out: &'a mut [f32],
}

/// Several matmuls in one pass of the pool: every job's activations are
/// quantized first (once per distinct `x` slice and activation type, so jobs
/// that share an input, such as a SwiGLU's gate and up or Q, K and V, quantize
/// it once), then the threads take panels of rows from all jobs in turn from
/// one queue.
///
/// Why: a mixture-of-experts decode step multiplies `n_expert_used` small
/// expert matrices (0.9 MB each for a 30B-A3B shape) three times over; one
/// pool dispatch each costs the wake-up and, worse, a tail where one thread
/// finishes the last panel alone. One queue over all of them streams the
/// bytes as one long matvec would.
///
/// Each output element is computed exactly as [`matmul`] computes it, so
/// results are bit-identical to one [`matmul`] per job.
pub fn matmul_many(pool: &ThreadPool, jobs: &mut [MatJob<'_, '_>], scratch: &mut Vec<u8>) -> Result<(), KernelError> {
    matmul_many_impl(Kernels::active(), pool, jobs, scratch)
}

/// [`matmul_many`] on an explicit SIMD `level` (tests).
#[cfg(test)]
pub(crate) fn matmul_many_with(
    level: SimdLevel,
    pool: &ThreadPool,
    jobs: &mut [MatJob<'_, '_>],
    scratch: &mut Vec<u8>,
) -> Result<(), KernelError> {
    matmul_many_impl(Kernels::for_level(level).unwrap(), pool, jobs, scratch)
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
    matmul_many_impl(k, pool, &mut [MatJob { w, x, n_tokens, out }], scratch)
}

/// One distinct activation input of a [`matmul_many`] call and where its
/// quantized form lies in the scratch (byte offsets).
struct Input<'a> {
    x: &'a [f32],
    cols: usize,
    arb: usize,
    quantize: QuantFn,
    sum_offset: Option<i32>,
    act: usize,
    sums: Option<usize>,
}

/// A job checked and laid out: where its quantized activations (and their
/// block sums) lie in the scratch.
struct Prepared<'a, 'w> {
    w: &'a WeightView<'w>,
    panel: PanelFn,
    n_tokens: usize,
    arb: usize,
    /// Byte offsets of the activations and of their block sums (`None`: the
    /// kernel takes none) in the scratch.
    act: usize,
    sums: Option<usize>,
    out: SendPtr<f32>,
}

fn matmul_many_impl(k: &Kernels, pool: &ThreadPool, jobs: &mut [MatJob<'_, '_>], scratch: &mut Vec<u8>) -> Result<(), KernelError> {
    // 1. Check every job and lay out its activations; a job whose `x` slice and
    // activation form match an earlier one's shares that one's bytes.
    let mut prepared: Vec<Prepared<'_, '_>> = Vec::with_capacity(jobs.len());
    let mut inputs: Vec<Input<'_>> = Vec::new();
    let mut size = 0usize;
    for job in jobs.iter_mut() {
        let w = job.w;
        let panel = k.panel(w.ty).ok_or(KernelError::unsupported("matmul", w.ty))?;
        w.validate()?;
        let (rows, cols, n_tokens) = (w.rows, w.cols, job.n_tokens);
        if job.x.len() != n_tokens * cols {
            return Err(KernelError::shape("x length (n_tokens * cols)", n_tokens * cols, job.x.len()));
        }
        if job.out.len() != n_tokens * rows {
            return Err(KernelError::shape("out length (n_tokens * rows)", n_tokens * rows, job.out.len()));
        }
        if n_tokens == 0 || rows == 0 {
            continue;
        }
        if cols == 0 {
            job.out.fill(0.0);
            continue;
        }
        // Activations → vec_dot_type blocks (or the level's form of them, `Kernels::act_type`).
        let aty = k.act_type(w.ty);
        let quantize = k.act_quantize(w.ty).ok_or(KernelError::unsupported("quantize_activations", aty))?;
        let arb = aty.row_bytes(cols as u64).expect("cols validated as whole blocks") as usize;
        let sum_offset = k.act_sum_offset(w.ty);
        let same = |i: &&Input<'_>| {
            std::ptr::eq(i.x, job.x) && i.quantize as usize == quantize as usize && i.arb == arb && i.sum_offset == sum_offset
        };
        let (act, sums) = match inputs.iter().find(same) {
            Some(i) => (i.act, i.sums),
            None => {
                // Each input starts on a cache line (with the scratch's start, below), so
                // a 32-byte activation load never straddles two lines when the rows are
                // whole lines (f32 activations).
                size = size.next_multiple_of(64);
                let act = size;
                size += n_tokens * arb;
                let sums = sum_offset.map(|_| size);
                size += if sum_offset.is_some() { 4 * n_tokens * (cols / 32) } else { 0 };
                inputs.push(Input { x: job.x, cols, arb, quantize, sum_offset, act, sums });
                (act, sums)
            }
        };
        prepared.push(Prepared { w, panel, n_tokens, arb, act, sums, out: SendPtr(job.out.as_mut_ptr()) });
    }
    if prepared.is_empty() {
        return Ok(());
    }

    // 2. Quantize each distinct input once (a long one on all threads).
    if scratch.len() < size + 63 {
        scratch.resize(size + 63, 0);
    }
    // From a cache line on: the allocator's start is 16 bytes into one (glibc),
    // and with f32 activations half the 32-byte loads then straddled two lines
    // (SmolLM2 F16 prefill at avx2, Zen 4: 77.7 -> 81.5 GFLOP/s, `cargo bench
    // --bench prefill -- 1 30 512 smollm2/f16/avx2`).
    let base = scratch.as_ptr().align_offset(64);
    let scratch = &mut scratch[base..base + size];
    for i in &inputs {
        let (x, cols, arb, quantize) = (i.x, i.cols, i.arb, i.quantize);
        let n_tokens = x.len() / cols;
        let dst = &mut scratch[i.act..i.act + n_tokens * arb];
        if n_tokens * cols >= PAR_QUANTIZE_MIN && pool.n_threads() > 1 && n_tokens > 1 {
            let ap = SendPtr(dst.as_mut_ptr());
            pool.run(|i, n| {
                let (t0, t1) = (n_tokens * i / n, n_tokens * (i + 1) / n);
                for t in t0..t1 {
                    // SAFETY: token rows are disjoint and split without overlap.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ap.get().add(t * arb), arb) };
                    quantize(&x[t * cols..(t + 1) * cols], dst);
                }
            });
        } else {
            for (xt, at) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(arb)) {
                quantize(xt, at);
            }
        }
        if let (Some(s), Some(k_off)) = (i.sums, i.sum_offset) {
            let (act, sums) = scratch.split_at_mut(s);
            act_block_sums(k_off, &act[i.act..i.act + n_tokens * arb], arb, cols, &mut sums[..4 * n_tokens * (cols / 32)]);
        }
    }
    let scratch = &*scratch;

    // 3. Panels of rows of every job, handed out dynamically (`PanelQueue`).
    let segs = prepared
        .iter()
        .map(|p| Segment {
            rows: p.w.rows,
            // As many rows as the output buffer holds for a chunk of tokens. A prefill
            // panel runs its rows over every token, in chunks of `PANEL_TOKENS`: the
            // activations stream through once per panel, so long panels read them
            // fewer times (SmolLM2 F16 layer at avx2, Zen 4, 512 tokens: 16-row panels
            // 83 GFLOP/s at 1 thread and 143 at 2, 128-row panels 91 and 175).
            most: (PANEL_OUT / p.n_tokens.min(PANEL_TOKENS)) / PANEL_ROWS * PANEL_ROWS,
            // Where `out` starts within a cache line, in f32s (see `PanelQueue`); none
            // for a type that stores rows in groups, whose panels must end on them
            // (`PANEL_ROWS` is a multiple of 8).
            skew: if p.w.ty.group_rows() > 1 { 0 } else { (p.out.0 as usize / 4) % LINE_F32 },
        })
        .collect();
    let queue = PanelQueue::new(segs, pool.n_threads());
    pool.run(|_, _| {
        let mut buf = [0f32; PANEL_OUT];
        while let Some((j, r0, nr)) = queue.take() {
            let p = &prepared[j];
            let (w, rows, cols, n_tokens) = (p.w, p.w.rows, p.w.cols, p.n_tokens);
            let wdata = &w.data[r0 * w.row_stride..];
            let act = &scratch[p.act..p.act + n_tokens * p.arb];
            let sums = p.sums.map_or(&[][..], |s| &scratch[s..s + 4 * n_tokens * (cols / 32)]);
            for t0 in (0..n_tokens).step_by(PANEL_TOKENS) {
                let nt = PANEL_TOKENS.min(n_tokens - t0);
                let panel = Panel {
                    wty: w.ty,
                    w: wdata,
                    row_stride: w.row_stride,
                    n_rows: nr,
                    cols,
                    act: &act[t0 * p.arb..],
                    act_stride: p.arb,
                    n_tokens: nt,
                    act_sums: if sums.is_empty() { sums } else { &sums[4 * t0 * (cols / 32)..] },
                };
                (p.panel)(&panel, &mut buf[..nr * nt]);
                for t in 0..nt {
                    // SAFETY: the panel (rows r0..r0+nr of job j) belongs to this
                    // thread alone; job j's `out` has n_tokens * rows elements and
                    // no two jobs' outputs overlap (each was a `&mut`).
                    let dst = unsafe { std::slice::from_raw_parts_mut(p.out.get().add((t0 + t) * rows + r0), nr) };
                    dst.copy_from_slice(&buf[t * nr..(t + 1) * nr]);
                }
            }
        }
    });
    Ok(())
}

/// One job's rows in a [`PanelQueue`]: how many, the longest panel, and where
/// its output starts within a cache line (in f32s).
struct Segment {
    rows: usize,
    most: usize,
    skew: usize,
}

/// Hands out panels of rows to the pool's threads: guided self-scheduling
/// (Polychronopoulos & Kuck, 1987, with half its panel size), each panel a
/// `1 / (2 · n_threads)` share of the rows left (in all jobs), in whole
/// [`PANEL_ROWS`], between `PANEL_ROWS` and its job's `most`, never across
/// the end of a job. The queue walks one row index over the jobs' rows laid
/// end to end, so one job's schedule is what it always was.
///
/// Why: a matvec (decode, or a batch of up to `PANEL_TOKENS` tokens, one pass
/// of the tiles over the weights) streams its weights from memory once. Long
/// first panels keep each thread on long contiguous runs, so the kernels'
/// prefetch of the next rows is mostly of rows the same thread reads next;
/// the short last ones keep the threads finishing together. Fixed panels of
/// an eighth of the rows (the earlier split) left one of two threads idle
/// for half a panel on average at the end of every matmul: 7B Q4_0 decode at
/// 2 threads ran 7% faster with this queue (docs/BENCHMARKS.md). A prefill's
/// panels are long for a second reason: each sweeps all of the activations
/// (`most` above).
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
    /// The next row to hand out, counting over all jobs' rows in order.
    next: AtomicUsize,
    segs: Vec<Segment>,
    /// `starts[j]`: the first row of job `j` in that count; `starts[len]` the total.
    starts: Vec<usize>,
    share: usize,
}

/// f32s per 64-byte cache line.
const LINE_F32: usize = 16;
// Panels of a type that stores rows in groups end on whole groups (`Segment::skew`).
const _: () = assert!(PANEL_ROWS.is_multiple_of(hearth_quant::interleave::GROUP_ROWS));

impl PanelQueue {
    fn new(segs: Vec<Segment>, n_threads: usize) -> Self {
        let mut starts = Vec::with_capacity(segs.len() + 1);
        let mut at = 0;
        for s in &segs {
            starts.push(at);
            at += s.rows;
        }
        starts.push(at);
        let segs = segs.into_iter().map(|s| Segment { most: s.most.max(PANEL_ROWS), skew: s.skew % LINE_F32, ..s }).collect();
        PanelQueue { next: AtomicUsize::new(0), segs, starts, share: 2 * n_threads.max(1) }
    }

    /// Job `j`'s panel that starts at its row `r0`, with `left` rows left in
    /// all: its share of those, ending on a line boundary (moved back, or
    /// forward when that would leave it empty) unless it ends the job.
    fn len_at(&self, j: usize, r0: usize, left: usize) -> usize {
        let s = &self.segs[j];
        let n = (left / self.share).next_multiple_of(PANEL_ROWS).clamp(PANEL_ROWS, s.most).min(s.rows - r0);
        let end = r0 + n;
        if end == s.rows {
            return n;
        }
        let past = (s.skew + end) % LINE_F32;
        let end = if end - past > r0 { end - past } else { end + LINE_F32 - past };
        end.min(s.rows) - r0
    }

    /// The next panel `(job, first row, rows)`, or `None` when all are taken.
    fn take(&self) -> Option<(usize, usize, usize)> {
        let total = self.starts[self.segs.len()];
        let mut at = self.next.load(Ordering::Relaxed);
        while at < total {
            // The job holding row `at`.
            let j = self.starts.partition_point(|&s| s <= at) - 1;
            let r0 = at - self.starts[j];
            let n = self.len_at(j, r0, total - at);
            match self.next.compare_exchange_weak(at, at + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some((j, r0, n)),
                Err(now) => at = now,
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
    use super::{PanelQueue, Segment, PANEL_ROWS};

    fn one(rows: usize, threads: usize, most: usize, skew: usize) -> PanelQueue {
        PanelQueue::new(vec![Segment { rows, most, skew }], threads)
    }

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
        assert_eq!(one(4096, 2, 4096, 0).take(), Some((0, 0, 1024)));
        assert_eq!(one(4096, 2, 4096, 4).take(), Some((0, 0, 1020)));
    }

    fn check(rows: usize, threads: usize, most: usize, skew: usize) {
        let q = one(rows, threads, most, skew);
        let mut panels = Vec::new();
        while let Some((j, r0, n)) = q.take() {
            assert_eq!(j, 0);
            panels.push((r0, n));
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

    /// Several jobs: each job's rows are covered once, in order, by panels
    /// that never cross a job's end; jobs come one after another; the first
    /// panel is a share of all the jobs' rows.
    #[test]
    fn jobs_are_covered_in_turn() {
        let segs = |v: &[usize]| v.iter().map(|&rows| Segment { rows, most: 4096, skew: 0 }).collect::<Vec<_>>();
        for rows in [vec![768; 16], vec![1, 17, 2048, 3], vec![2048; 8]] {
            let q = PanelQueue::new(segs(&rows), 2);
            let mut at = vec![0; rows.len()];
            let mut last = 0;
            while let Some((j, r0, n)) = q.take() {
                assert!(j >= last, "jobs in order");
                last = j;
                assert_eq!(r0, at[j]);
                assert!(n > 0 && r0 + n <= rows[j]);
                at[j] += n;
            }
            assert_eq!(at, rows);
        }
        // 16 × 768 rows on 2 threads: the first panel is a quarter of all rows, cut at the job's end.
        assert_eq!(PanelQueue::new(segs(&[768; 16]), 2).take(), Some((0, 0, 768)));
    }
}
