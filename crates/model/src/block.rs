//! The ops an architecture's block is written against ([`Block`]), and the activations
//! it works on ([`Acts`]).
//!
//! An architecture file sees whole-model operations: "Q = attn_norm(x) · Wqᵀ",
//! "attention", "xb = attn · Woᵀ". What this node actually computes hides behind them:
//! - [`Block::matmul`] takes a matrix by role ([`Mat`]) and finds it where this node
//!   keeps it (the mapping, a sliding window's unit, a tensor-parallel shard copy);
//!   with tensor parallelism Q/K/V/gate/up give this node's rows only (the activations
//!   are this node's heads and FFN rows), and the two output projections O and down
//!   come back complete: partial products summed across nodes (one allreduce), or, with
//!   the gather schedule, inputs gathered, this node's output rows computed, gathered.
//! - [`Block::attention`] stores K and V in this node's KV cache and attends over it
//!   with the layer's window, tiled over the thread pool.
//!
//! So a block reads like the model's definition, and a schedule never enters it.

use crate::arch::Mat;
use crate::config::ModelConfig;
use crate::attn::{self, AttnItem};
use crate::context::{ShardBlock, Span};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::source::Unit;
use crate::split::Collective;
use crate::weights::LayerWeights;
use hearth_kernels::ops::{self, AttnScratch, AttnShape, F16DotOrder};
use hearth_kernels::{matmul, matmul_many, MatJob, ThreadPool, WeightView};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// The kinds of work a forward pass's time is split into (`HEARTH_PROFILE=1`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// Q, K, V, gate and up: the matmuls that read the normed residual.
    MatIn,
    /// O and down, with the allreduce or gathers of a tensor-parallel split.
    MatOut,
    /// Storing K and V in the cache, and attending.
    Attention,
    /// A mixture of experts' FFN: router, experts, shared expert.
    Moe,
    Norm,
    Rope,
    /// Residual adds, the GLU, biases, the query scaling.
    Elementwise,
    /// The output norm and head.
    Head,
}

impl Op {
    pub(crate) const ALL: [Op; 8] = [Op::MatIn, Op::MatOut, Op::Attention, Op::Moe, Op::Norm, Op::Rope, Op::Elementwise, Op::Head];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Op::MatIn => "matmuls Q/K/V/gate/up",
            Op::MatOut => "matmuls O/down",
            Op::Attention => "attention",
            Op::Moe => "MoE FFN",
            Op::Norm => "norms",
            Op::Rope => "RoPE",
            Op::Elementwise => "adds and GLU",
            Op::Head => "output head",
        }
    }
}

/// Nanoseconds spent in each [`Op`], summed over layers and passes (`HEARTH_PROFILE=1`).
/// Atomic only so a [`Block`] can add to it through a shared reference.
#[derive(Debug, Default)]
pub(crate) struct OpTimes([AtomicU64; Op::ALL.len()]);

impl OpTimes {
    /// Counts the time since `since` to `op`, less `waited` seconds in it that were spent
    /// waiting for weights to be read (the profile shows those on their own).
    pub(crate) fn add(&self, op: Op, since: Instant, waited: f64) {
        let ns = (since.elapsed().as_secs_f64() - waited).max(0.0) * 1e9;
        self.0[op as usize].fetch_add(ns as u64, Relaxed);
    }

    pub(crate) fn get(&self, op: Op) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0[op as usize].load(Relaxed))
    }
}

/// One layer's activations for the `n` tokens of a pass, each `[n, width]` with this
/// node's widths (all of them on one machine).
pub(crate) struct Acts<'a> {
    /// Residual stream `[n, n_embd]`.
    pub x: &'a mut [f32],
    /// Normed input, projection outputs `[n, n_embd]`.
    pub xb: &'a mut [f32],
    /// Queries `[n, n_head·head_dim]` (this node's heads).
    pub q: &'a mut [f32],
    /// Keys `[n, n_head_kv·head_dim]`.
    pub k: &'a mut [f32],
    /// Values `[n, n_head_kv·head_dim]`.
    pub v: &'a mut [f32],
    /// Attention output `[n, n_head·head_dim]`.
    pub attn: &'a mut [f32],
    /// FFN gate `[n, n_ff]` (this node's rows).
    pub gate: &'a mut [f32],
    /// FFN up `[n, n_ff]`.
    pub up: &'a mut [f32],
}

/// This node's part of every block: the row and column ranges of each matrix and the
/// heads it computes.
#[derive(Debug, Clone)]
pub(crate) struct Share {
    /// `[rows, cols]` of each matrix as this node computes with it (by [`Mat`] index).
    pub shapes: [(Range<usize>, Range<usize>); 7],
    /// `[rows, cols]` of a shared expert's gate, up and down (`TensorSplit::shared_shapes`).
    pub shared: [(Range<usize>, Range<usize>); 3],
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// The gather schedule's output rows of O and down (`None`: partial sums).
    pub gather: Option<Range<usize>>,
}

/// Everything one layer's ops need (see the module docs).
pub(crate) struct Block<'a> {
    pub c: &'a ModelConfig,
    /// Layer index.
    pub il: usize,
    /// Tokens in this pass.
    pub n: usize,
    pub(crate) share: &'a Share,
    pub(crate) l: &'a LayerWeights,
    pub(crate) unit: Unit<'a>,
    /// Under a memory budget, where a mixture of experts' expert weights come from
    /// instead of `unit` ([`crate::experts`]).
    pub(crate) expert_cache: Option<&'a std::cell::RefCell<Box<dyn crate::experts::ExpertSource>>>,
    pub(crate) own: Option<&'a ShardBlock>,
    pub(crate) pool: &'a ThreadPool,
    pub(crate) comm: Option<&'a mut dyn Collective>,
    pub(crate) kv: &'a mut KvCache,
    pub(crate) spans: &'a [Span],
    pub(crate) items: &'a [AttnItem],
    pub(crate) quant: &'a mut Vec<u8>,
    /// Gather schedule: `[n, rows]` this node's output rows; `[n, q_dim or n_ff]` the
    /// gathered inputs.
    pub(crate) part: &'a mut Vec<f32>,
    pub(crate) gathered: &'a mut Vec<f32>,
    pub(crate) attn_acc: &'a [Mutex<AttnScratch>],
    /// Per-pair RoPE frequency factors (Llama 3.1, LongRoPE), if any.
    pub(crate) rope_factors: Option<&'a [f32]>,
    pub(crate) trace: bool,
    /// The f16 attention dots' summation order ([`F16DotOrder`]).
    pub(crate) f16_dot: F16DotOrder,
    /// A sequence feeding at least this many tokens in a pass takes the f32 attention
    /// path (`Context::set_f32_attention_from`).
    pub(crate) f32_attn_from: usize,
    /// Where the time goes, when profiling (`HEARTH_PROFILE`).
    pub(crate) times: Option<&'a OpTimes>,
}

impl<'a> Block<'a> {
    /// The start of an op, when profiling.
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.times.map(|_| Instant::now())
    }

    /// Counts the time since `start` (from [`Self::clock`]) to `op`.
    pub(crate) fn spent(&self, op: Op, start: Option<Instant>) {
        if let (Some(times), Some(start)) = (self.times, start) {
            times.add(op, start, 0.0);
        }
    }

    /// Print `x`'s sum as llama.cpp's eval-callback names it (`HEARTH_TRACE=1`); with
    /// `HEARTH_TRACE_DIR` set (non-empty), also write `x` there as `NAME-LAYER.f32`
    /// (little-endian f32, `[n_tokens, width]`) for element-by-element comparison. Each
    /// forward pass overwrites the files: the last pass's tensors remain. After the first
    /// failed write, dumping stops with one message.
    pub fn trace(&self, name: &str, x: &[f32]) {
        use std::sync::atomic::{AtomicBool, Ordering};
        static DUMP_FAILED: AtomicBool = AtomicBool::new(false);
        if self.trace {
            let sum: f64 = x.iter().map(|&v| v as f64).sum();
            eprintln!("trace {name}-{} {sum:.6}", self.il);
            let dir = std::env::var_os("HEARTH_TRACE_DIR").filter(|d| !d.is_empty());
            if let Some(dir) = dir.filter(|_| !DUMP_FAILED.load(Ordering::Relaxed)) {
                let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                let path = std::path::Path::new(&dir).join(format!("{name}-{}.f32", self.il));
                if let Err(e) = std::fs::write(&path, bytes) {
                    DUMP_FAILED.store(true, Ordering::Relaxed);
                    eprintln!("trace: cannot write {}: {e}; not writing tensors any more", path.display());
                }
            }
        }
    }

    // The row-wise and elementwise ops below run over the pool's threads in whole rows
    // (`ThreadPool::for_rows`: a prefill's tokens split among them, the same result
    // whatever the thread count); a decode step's single row stays on one thread.

    /// `out = rmsnorm(x) · w`, rows of `n_embd`.
    pub fn norm(&self, x: &[f32], w: &[f32], out: &mut [f32], name: &str) {
        let (n, t) = (w.len(), self.clock());
        self.pool.for_rows(out, n, |o, r0| ops::rmsnorm(&x[r0 * n..r0 * n + o.len()], w, self.c.rms_eps, o));
        self.spent(Op::Norm, t);
        self.trace(name, out);
    }

    /// `x = rmsnorm(x) · w` in place, rows of `w.len()` (`n_embd`, or one head).
    pub fn norm_inplace(&self, x: &mut [f32], w: &[f32], name: &str) {
        let t = self.clock();
        self.pool.for_rows(x, w.len(), |x, _| ops::rmsnorm_inplace(x, w, self.c.rms_eps));
        self.spent(Op::Norm, t);
        self.trace(name, x);
    }

    /// `x += y`, `[n, width]` each (a residual add).
    pub fn add(&self, x: &mut [f32], y: &[f32], width: usize) {
        let t = self.clock();
        self.pool.for_rows(x, width, |x, r0| ops::add_assign(x, &y[r0 * width..r0 * width + x.len()]));
        self.spent(Op::Elementwise, t);
    }

    /// `x *= s`, element by element (the query scaling of Gemma 3 and Phi-3).
    pub fn scale(&self, x: &mut [f32], s: f32) {
        let t = self.clock();
        ops::scale(x, s);
        self.spent(Op::Elementwise, t);
    }

    /// `gate = act(gate) ⊙ up` with `act` SwiGLU's or GEGLU's (`ops::swiglu`,
    /// `ops::geglu`), `[n, width]` each.
    pub fn glu(&self, act: fn(&mut [f32], &[f32]), gate: &mut [f32], up: &[f32], width: usize) {
        let t = self.clock();
        self.pool.for_rows(gate, width, |g, r0| act(g, &up[r0 * width..r0 * width + g.len()]));
        self.spent(Op::Elementwise, t);
    }

    /// `out += b` for this node's part of a bias of matrix `m`'s outputs (Q, K or V).
    pub fn bias(&self, m: Mat, b: Option<&[f32]>, out: &mut [f32]) {
        if let Some(b) = b {
            let rows = self.share.shapes[m as usize].0.clone();
            if !rows.is_empty() {
                let t = self.clock();
                ops::add_rows(out, &b[rows]);
                self.spent(Op::Elementwise, t);
            }
        }
    }

    /// RoPE of Q and K at each token's position, with the layer's base and frequency
    /// scale and the model's other scaling terms.
    pub fn rope(&self, q: &mut [f32], k: &mut [f32]) {
        let c = self.c;
        let r = c.rope.kernel(c.rope_base(self.il), c.rope_scale(self.il), self.rope_factors);
        let (qd, kvd) = (self.share.n_head * c.head_dim, self.share.n_head_kv * c.head_dim);
        if qd == 0 {
            return;
        }
        let t = self.clock();
        for sp in self.spans {
            // Each token's rotation depends on its position alone.
            let (nh, nkv, hd) = (self.share.n_head, self.share.n_head_kv, c.head_dim);
            self.pool.for_rows(&mut q[sp.row * qd..(sp.row + sp.len) * qd], qd, |x, t0| ops::rope(x, nh, hd, sp.pos0 + t0, &r));
            self.pool.for_rows(&mut k[sp.row * kvd..(sp.row + sp.len) * kvd], kvd, |x, t0| ops::rope(x, nkv, hd, sp.pos0 + t0, &r));
        }
        self.spent(Op::Rope, t);
        self.trace("Qrope", q);
        self.trace("Krope", k);
    }

    /// The view of matrix `m`: this node's compact copy when it has one, else rows ×
    /// columns of the tensor in the unit (or the whole tensor when it already has that
    /// shape: a shard file's matrices are stored cut).
    fn view(&self, m: Mat, rows: Range<usize>, cols: Range<usize>) -> Result<WeightView<'a>> {
        self.view_of(self.l.matrix(m), self.own.map(|b| &b.m[m as usize][..]), rows, cols)
    }

    /// [`Self::view`] of tensor `t`, whose compact copy (if this node has one) is `own`.
    pub(crate) fn view_of(&self, t: &crate::TensorRef, own: Option<&'a [u8]>, rows: Range<usize>, cols: Range<usize>) -> Result<WeightView<'a>> {
        Ok(match own {
            Some(b) => WeightView::new(t.ty, b, rows.len(), cols.len())?,
            None if t.rows == rows.len() && t.cols == cols.len() => self.unit.view(t)?,
            None => self.unit.view(t)?.rows(rows).cols(cols)?,
        })
    }

    pub(crate) fn allreduce(&mut self, buf: &mut [f32]) -> Result<()> {
        match self.comm.as_mut() {
            Some(comm) => comm.allreduce(buf).map_err(ModelError::Collective),
            None => Ok(()),
        }
    }

    /// `out = x · mᵀ` for several matrices that read the same input (Q, K and V; gate
    /// and up), this node's output rows of each (`x: [n, n_embd]`), in one pool dispatch:
    /// the input is quantized once and the threads stream every matrix's rows from one
    /// queue, so no thread waits at the end of each (`hearth_kernels::matmul_many`; the
    /// results are those of one [`Self::matmul`] each, bit for bit).
    pub fn project<const N: usize>(&mut self, x: &[f32], outs: [(Mat, &mut [f32]); N]) -> Result<()> {
        let n = self.n;
        let mut views = Vec::with_capacity(N);
        for (m, _) in &outs {
            debug_assert!(!matches!(m, Mat::O | Mat::Down), "project: {m:?} reduces across nodes");
            let (rows, cols) = self.share.shapes[*m as usize].clone();
            views.push(if rows.is_empty() { None } else { Some(self.view(*m, rows, cols)?) });
        }
        let mut names = [Mat::Q; N];
        let mut jobs = Vec::with_capacity(N);
        for (i, ((m, out), w)) in outs.into_iter().zip(&views).enumerate() {
            names[i] = m;
            if let Some(w) = w {
                jobs.push(MatJob { w, x, n_tokens: n, out });
            }
        }
        let t = self.clock();
        matmul_many(self.pool, &mut jobs, self.quant)?;
        self.spent(Op::MatIn, t);
        if self.trace {
            for (m, job) in names.iter().zip(&jobs) {
                self.trace(["Qcur", "Kcur", "Vcur", "", "ffn_gate", "ffn_up", ""][*m as usize], job.out);
            }
        }
        Ok(())
    }

    /// `out = x · mᵀ` for the pass's `n` tokens. Q, K, V, gate and up: this node's
    /// output rows (`x: [n, n_embd]`). O and down: `x` is this node's part of the input
    /// (`[n, n_head·head_dim]` or `[n, n_ff]`) and `out: [n, n_embd]` the complete
    /// product, the same on every node.
    pub fn matmul(&mut self, m: Mat, x: &[f32], out: &mut [f32]) -> Result<()> {
        let n = self.n;
        let (rows, cols) = self.share.shapes[m as usize].clone();
        if !matches!(m, Mat::O | Mat::Down) {
            if !rows.is_empty() {
                let w = self.view(m, rows, cols)?;
                let t = self.clock();
                matmul(self.pool, &w, x, n, out, self.quant)?;
                self.spent(Op::MatIn, t);
            }
            self.trace(["Qcur", "Kcur", "Vcur", "", "ffn_gate", "ffn_up", ""][m as usize], out);
            return Ok(());
        }
        let e = self.c.n_embd;
        let full = if m == Mat::O { self.c.q_dim() } else { self.c.n_ff };
        // This node's input columns (its heads or FFN rows) within the full input.
        let local = self.share.shapes[if m == Mat::O { Mat::Q } else { Mat::Gate } as usize].0.clone();
        let t = self.clock();
        match self.share.gather.clone() {
            None => {
                if local.is_empty() {
                    out.fill(0.0);
                } else {
                    let w = self.view(m, rows, cols)?;
                    matmul(self.pool, &w, x, n, out, self.quant)?;
                }
            }
            Some(own_rows) => {
                // Exact: gather every node's inputs, then whole dot products for our
                // output rows, gathered again (each element comes from one node).
                let mut g = std::mem::take(self.gathered);
                let mut part = std::mem::take(self.part);
                g.resize(n * full, 0.0);
                place(x, &mut g, n, &local, full);
                let r = (|| {
                    self.allreduce(&mut g)?;
                    let w = self.view(m, own_rows.clone(), 0..full)?;
                    part.resize(n * own_rows.len(), 0.0);
                    matmul(self.pool, &w, &g, n, &mut part, self.quant)?;
                    place(&part, out, n, &own_rows, e);
                    Ok::<_, ModelError>(())
                })();
                *self.gathered = g;
                *self.part = part;
                r?;
            }
        }
        self.allreduce(out)?;
        self.spent(Op::MatOut, t);
        self.trace(if m == Mat::O { "attn_out" } else { "ffn_out" }, out);
        Ok(())
    }

    /// Causal GQA attention of this layer (its window, if it has one) for every span:
    /// K and V are stored at the span's positions of its slot, then each query attends
    /// to its own slot's cache. `q: [n, n_head·head_dim]`, `out` the same shape.
    pub fn attention(&mut self, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) -> Result<()> {
        let c = self.c;
        let (hd, nh) = (c.head_dim, self.share.n_head);
        if nh == 0 {
            return Ok(());
        }
        let (qd, kvd) = (nh * hd, self.share.n_head_kv * hd);
        let il = self.il;
        let t = self.clock();
        for sp in self.spans {
            let r = sp.row * kvd..(sp.row + sp.len) * kvd;
            self.kv.store(il, sp.slot, sp.pos0, &k[r.clone()], &v[r]);
        }
        let kv = &*self.kv;
        let caches: Vec<_> = self.spans.iter().map(|sp| kv.layer(il, sp.slot)).collect();
        let ring = kv.layout().held(il);
        let shape = AttnShape { scale: c.attn_scale, window: c.window(il), ring, f16_dot: self.f16_dot, ..AttnShape::causal(nh, self.share.n_head_kv, hd) };
        attn::run(self.pool, self.items, self.spans, &caches, q, qd, c.n_head / c.n_head_kv, shape, self.f32_attn_from, self.attn_acc, out);
        self.spent(Op::Attention, t);
        self.trace("kqv_out", out);
        Ok(())
    }
}

/// `part: [n, cols.len()]` into columns `cols` of `out: [n, width]`, zeros elsewhere.
pub(crate) fn place(part: &[f32], out: &mut [f32], n: usize, cols: &Range<usize>, width: usize) {
    let k = cols.len();
    out[..n * width].fill(0.0);
    for t in 0..n {
        out[t * width + cols.start..t * width + cols.end].copy_from_slice(&part[t * k..(t + 1) * k]);
    }
}
