//! Matmul throughput of hearth's own kernels per weight type and thread count:
//! decode (one token against a matrix larger than the last-level cache, as weight GB/s)
//! and prefill (a batch of tokens, as GFLOP/s = 2·rows·cols·tokens / s).

use hearth_kernels::{matmul, ThreadPool, WeightView};
use hearth_parallel::profile::MatmulRate;
use hearth_quant::GgmlType;
use std::time::Instant;

/// Shapes and repetitions of the measurement.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Columns (the input width) of both matrices.
    pub cols: usize,
    /// Rows of the decode matrix (rows·cols elements: far beyond the L3 when full-size).
    pub decode_rows: usize,
    /// More decode rows where needed to make the matrix at least this many bytes.
    pub min_decode_bytes: usize,
    /// Rows of the prefill matrix.
    pub prefill_rows: usize,
    /// Tokens of the prefill batch.
    pub tokens: usize,
    /// Timed runs; the median is reported (after one untimed warmup).
    pub runs: usize,
}

impl Shape {
    /// The default: 8192×4096 decode (64 MiB in f16, 18 MiB in q4_0; more rows to reach
    /// `min_decode_bytes`), 2048×4096 × 64 tokens.
    pub const FULL: Shape = Shape { cols: 4096, decode_rows: 8192, min_decode_bytes: 0, prefill_rows: 2048, tokens: 64, runs: 5 };
    /// `--quick`: a quarter of the rows, three runs.
    pub const QUICK: Shape = Shape { cols: 4096, decode_rows: 2048, min_decode_bytes: 0, prefill_rows: 512, tokens: 64, runs: 3 };
}

/// `rows`×`cols` weights of `ty`: 64 pseudo-random rows (values in [-1, 1]) quantized once
/// and repeated, since quantizing tens of millions of floats would dominate the run.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> anyhow::Result<Vec<u8>> {
    let rb = ty.row_bytes(cols as u64).ok_or_else(|| anyhow::anyhow!("{cols} columns are not whole {} blocks", ty.name()))? as usize;
    let seed_rows = rows.min(64);
    let mut seed = vec![0u8; seed_rows * rb];
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut row = vec![0f32; cols];
    for r in 0..seed_rows {
        for v in row.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v = (s % 20001) as f32 / 10000.0 - 1.0;
        }
        hearth_quant::quantize_row(ty.ungrouped(), &row, &mut seed[r * rb..(r + 1) * rb])?;
    }
    // A grouped type (Q4_0X8, Q4_KX8): its row type's rows, interleaved (whole groups).
    if ty.group_rows() > 1 {
        let mut grouped = vec![0u8; seed.len()];
        hearth_quant::interleave::interleave(ty, &seed, seed_rows, cols, &mut grouped)?;
        seed = grouped;
    }
    Ok(seed.iter().copied().cycle().take(rows * rb).collect())
}

/// Median seconds of `runs` calls of `f`, after one warmup call.
fn median_secs(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2].max(1e-9))
}

/// Parse a type name hearth can multiply (`q4_0`, `f16`, …).
pub fn parse_type(name: &str) -> anyhow::Result<GgmlType> {
    let ty = GgmlType::from_name(name).ok_or_else(|| anyhow::anyhow!("unknown weight type {name:?}"))?;
    anyhow::ensure!(hearth_kernels::supports(ty), "hearth's kernels have no matmul for {name}");
    Ok(ty)
}

/// Decode and prefill rates of `ty` with each pool in `pools`, calling `tick` after each.
pub fn measure(ty: GgmlType, pools: &[ThreadPool], shape: Shape, mut tick: impl FnMut()) -> anyhow::Result<Vec<MatmulRate>> {
    let c = shape.cols;
    let rb = ty.row_bytes(c as u64).unwrap_or(1) as usize;
    let decode_rows = shape.decode_rows.max(shape.min_decode_bytes.div_ceil(rb).div_ceil(64) * 64);
    let wd = weights(ty, decode_rows, c)?;
    let decode = WeightView::new(ty, &wd, decode_rows, c)?;
    let wp = weights(ty, shape.prefill_rows, c)?;
    let prefill = WeightView::new(ty, &wp, shape.prefill_rows, c)?;
    let x: Vec<f32> = (0..shape.tokens * c).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    let mut out = vec![0f32; (shape.tokens * shape.prefill_rows).max(decode_rows)];
    let mut scratch = Vec::new();
    let mut rates = Vec::new();
    for pool in pools {
        let d = median_secs(shape.runs, || Ok(matmul(pool, &decode, &x[..c], 1, &mut out[..decode_rows], &mut scratch)?))?;
        let p = median_secs(shape.runs, || {
            Ok(matmul(pool, &prefill, &x, shape.tokens, &mut out[..shape.tokens * shape.prefill_rows], &mut scratch)?)
        })?;
        let flops = 2.0 * (shape.prefill_rows * c * shape.tokens) as f64;
        rates.push(MatmulRate {
            ty: ty.name().to_ascii_lowercase(),
            threads: pool.n_threads(),
            decode_gbps: wd.len() as f64 / d / 1e9,
            prefill_gflops: flops / p / 1e9,
        });
        tick();
    }
    Ok(rates)
}
