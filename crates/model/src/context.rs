//! [`Context`]: one inference stream — KV cache, scratch buffers, thread pool — and the
//! forward pass over a batch of tokens: embedding, the architecture's blocks
//! ([`crate::Arch`], through [`crate::block::Block`]), the output head; with the
//! schedules around them (tensor parallelism, the pipelined ring, a sliding window).

use crate::block::{Acts, Block, Share};
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheType, KvCache, KvLayout};
use crate::model::Model;
use crate::ring::{RingLink, RingWindows};
use crate::experts::ExpertSource;
use crate::source::{LayerSource, SourceStats, Unit};
use crate::split::{Collective, TensorSplit};
use hearth_kernels::ops::{self, AttnScratch, F16DotOrder};
use hearth_kernels::{matmul, ThreadPool};
use std::sync::{Arc, Mutex};

/// Which positions of a batch need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (perplexity).
    All,
}

/// Part of a batch for [`Context::eval_batch`]: `tokens` of the sequence in KV cache slot
/// `slot`, appended at that slot's next position; `logits`: how many of its last tokens
/// need logits (0 none; 1 the last: a prompt's last chunk, a decode step; `1 + k`: a
/// decode step carrying `k` speculative guesses).
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// KV cache slot, `0..n_slots`.
    pub slot: usize,
    /// Tokens to append (at least one).
    pub tokens: &'a [u32],
    /// Return logits for this many of the last `tokens` (at most `tokens.len()`).
    pub logits: usize,
}

/// Rows `row..row + len` of a batch: one sequence's tokens at positions `pos0..` of slot `slot`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub slot: usize,
    pub pos0: usize,
    pub row: usize,
    pub len: usize,
}

/// Scratch activations for up to `n_batch` tokens, allocated once.
struct Scratch {
    x: Vec<f32>,                       // [n_batch, n_embd] residual stream
    xb: Vec<f32>,                      // [n_batch, n_embd] normed input / projection output
    q: Vec<f32>,                       // [n_batch, q_dim]
    k: Vec<f32>,                       // [n_batch, kv_dim]
    v: Vec<f32>,                       // [n_batch, kv_dim]
    attn: Vec<f32>,                    // [n_batch, q_dim]
    gate: Vec<f32>,                    // [n_batch, n_ff]
    up: Vec<f32>,                      // [n_batch, n_ff]
    logits: Vec<f32>,                  // [n_batch or 1, n_vocab]
    quant: Vec<u8>,                    // activations quantized for the current matmul
    part: Vec<f32>,                    // [n_batch, gathered rows] tensor parallel, gather schedule
    gathered: Vec<f32>,                // [n_batch, q_dim or n_ff] gather schedule: every node's inputs
    emb_row: Vec<u8>,                  // one token_embd row read through a LayerSource
    attn_acc: Vec<Mutex<AttnScratch>>, // per-thread attention accumulator [head_dim] (f16 for an f16 V cache, else f32)
}

/// Whether layer `il` is run here, by `layer_unit` (`usize::MAX`: another ring device's
/// layer; past the last layer: none). [`Context::owns_layer`], for the forward pass
/// while `self` is borrowed in parts.
fn owns(layer_unit: &[usize], il: usize) -> bool {
    layer_unit.get(il).is_some_and(|&u| u != usize::MAX)
}

/// The read-ahead's guess of the next layer's experts (decode under an expert cache):
/// its normed input `[n_embd]`, router logits `[n_expert]`, and the top `n_expert_used`.
struct NextExperts {
    h: Vec<f32>,
    logits: Vec<f32>,
    ids: Vec<usize>,
    wt: Vec<f32>,
}

impl NextExperts {
    fn new(n_embd: usize, moe: crate::config::Moe) -> Self {
        let k = moe.n_expert_used;
        NextExperts { h: vec![0.0; n_embd], logits: vec![0.0; moe.n_expert], ids: vec![0; k], wt: vec![0.0; k] }
    }
}

/// Bytes held by one [`Context`]'s buffers, by category (its own allocation counters;
/// compare with the process's anonymous RSS). Shapes as in `Scratch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextBuffers {
    /// K and V of every layer and position ([`KvCache::bytes`]).
    pub kv_cache_bytes: usize,
    /// f32 activations for a batch: `4 · n_batch · (2·n_embd + 2·q_dim + 2·kv_dim + 2·n_ff)`.
    pub activations_bytes: usize,
    /// f32 logits, `[1 or n_batch, n_vocab]` (grown by the first eval).
    pub logits_bytes: usize,
    /// Activations quantized for the current matmul (grown to the widest one seen).
    pub quantized_activations_bytes: usize,
    /// Per-thread attention accumulators.
    pub per_thread_bytes: usize,
    /// Tensor parallel: this node's share of the block weights, copied compact.
    pub weight_shard_bytes: usize,
}

impl ContextBuffers {
    /// Sum of every category.
    pub fn total(&self) -> usize {
        self.kv_cache_bytes
            + self.activations_bytes
            + self.logits_bytes
            + self.quantized_activations_bytes
            + self.per_thread_bytes
            + self.weight_shard_bytes
    }
}

/// An inference stream over a shared [`Model`].
pub struct Context {
    model: Arc<Model>,
    pool: ThreadPool,
    /// `n_slots` sequences of `n_ctx` positions (a window layer holds only its ring).
    kv: KvCache,
    /// Positions cached, per slot (one slot unless `set_slots`).
    n_past: Vec<usize>,
    n_batch: usize,
    s: Scratch,
    /// Where the weights come from when not the mapping (`set_source`).
    source: Option<Box<dyn LayerSource>>,
    /// Where a mixture of experts' expert weights come from when not the layer's unit
    /// (`set_expert_source`). A `RefCell` so a block can hold it beside its unit, which
    /// borrows `source`.
    experts: Option<std::cell::RefCell<Box<dyn ExpertSource>>>,
    /// Row ranges of the output head, one per unit (`0..n_vocab` when mapped).
    head_chunks: Vec<std::ops::Range<usize>>,
    /// `HEARTH_TRACE=1`: print each intermediate's sum to stderr, named as in llama.cpp's
    /// eval-callback traces, for layer-by-layer comparison.
    trace: bool,
    /// Which llama.cpp build's order the f16 attention dots follow (`set_f16_dot_order`).
    f16_dot: F16DotOrder,
    /// Tokens a sequence feeds in a pass from which its attention takes the f32 path
    /// (`set_f32_attention_from`).
    f32_attn_from: usize,
    /// `HEARTH_PROFILE=1`: time split of the forward passes, printed when the context ends.
    profile: Option<Profile>,
    /// Tensor parallelism: this node's share and the group's allreduce (`set_tensor_split`).
    split: Option<SplitState>,
    /// Pipelined ring: this device's windows and, on the head device, the link to the
    /// others (`set_ring`).
    ring: Option<RingState>,
    /// The source unit of each layer (`usize::MAX`: a layer this device does not run),
    /// and of the first output-head chunk: a ring device's source holds only its units.
    layer_unit: Vec<usize>,
    head_unit0: usize,
    /// Phi-3 LongRoPE: whether this context uses the long factors (it is longer than the
    /// original training context), as llama.cpp's `get_rope_factors` decides; `None`
    /// when the model has no such factors.
    rope_factors: Option<bool>,
}

struct RingState {
    windows: RingWindows,
    link: Option<Box<dyn RingLink>>,
    /// The pass [`Context::eval_round`] is in: first position, tokens, next round.
    pass: (usize, usize, usize),
}

/// One block's matrices as this node computes them (shapes as in `blocks`).
pub(crate) struct ShardBlock {
    /// By [`crate::arch::Mat`] index.
    pub m: [Vec<u8>; 7],
    /// A shared expert's gate, up and down (empty without one).
    pub shared: [Vec<u8>; 3],
}

struct SplitState {
    split: TensorSplit,
    /// Per block, this node's rows and columns of the seven matrices, copied into compact
    /// matrices with `pread` (empty when the node computes the whole model). Columns of a
    /// row-major matrix have bytes on every page of it, and the page cache maps whole
    /// folios around what is touched, so computing on the mapping would make far more
    /// than the share resident; the copies keep the RSS at this node's share.
    shard: Vec<ShardBlock>,
    comm: Box<dyn Collective>,
}

/// Where forward-pass time went (`HEARTH_PROFILE=1`).
#[derive(Debug, Default)]
struct Profile {
    passes: usize,
    tokens: usize,
    total: std::time::Duration,
    ops: crate::block::OpTimes,
}

impl Drop for Context {
    fn drop(&mut self) {
        // Nothing to show for a context that never ran (a load refused before any pass).
        if let Some(p) = self.profile.as_ref().filter(|p| p.passes > 0) {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let wait = self.source_stats().map_or(0.0, |s| s.wait_secs * 1e3);
            let pct = |v: f64| {
                if p.total.is_zero() {
                    0.0
                } else {
                    100.0 * v / ms(p.total)
                }
            };
            let mut split = String::new();
            let mut counted = wait;
            for op in crate::block::Op::ALL {
                let t = ms(p.ops.get(op));
                if t > 0.0 {
                    counted += t;
                    split += &format!("; {} {t:.1} ms ({:.0}%)", op.label(), pct(t));
                }
            }
            if wait > 0.0 {
                split += &format!("; waiting for weights {wait:.1} ms ({:.0}%)", pct(wait));
            }
            let rest = ms(p.total) - counted;
            let n = self.pool.n_threads();
            eprintln!(
                "profile: {} forward passes, {} tokens, {n} thread{}: {:.1} ms{split}; the rest (embeddings, the threads' hand-offs outside the ops) {rest:.1} ms ({:.0}%)",
                p.passes,
                p.tokens,
                if n == 1 { "" } else { "s" },
                ms(p.total),
                pct(rest)
            );
        }
    }
}

impl Context {
    /// A context of `n_ctx` positions computing batches of up to `n_batch` tokens on
    /// `n_threads` threads, with the default f16 KV cache.
    pub fn new(model: Arc<Model>, n_ctx: usize, n_batch: usize, n_threads: usize) -> Result<Self> {
        Self::with_cache_type(model, n_ctx, n_batch, n_threads, CacheType::F16)
    }

    /// [`Context::new`] with a KV cache of `cache_type`. Q8_0 needs the model's head width
    /// to be a multiple of 32.
    pub fn with_cache_type(model: Arc<Model>, n_ctx: usize, n_batch: usize, n_threads: usize, cache_type: CacheType) -> Result<Self> {
        let kv_dim = model.config.kv_dim();
        Self::with_kv_dim(model, n_ctx, n_batch, n_threads, cache_type, kv_dim)
    }

    /// [`Context::with_cache_type`] with a KV cache of `kv_dim` K (and V) values a
    /// position, `[n_ctx, kv_dim]` a layer: a tensor-parallel node's heads, whose
    /// [`Self::set_tensor_split`] must follow. (Allocating the whole model's cache first
    /// made a worker's peak RSS hold it at every session start: a SmolLM2 worker with no
    /// KV heads at 8192 tokens peaked at 264 MiB for its 0 B share.)
    pub fn with_kv_dim(model: Arc<Model>, n_ctx: usize, n_batch: usize, n_threads: usize, cache_type: CacheType, kv_dim: usize) -> Result<Self> {
        if n_ctx == 0 {
            return Err(ModelError::Context("context size must be at least 1".into()));
        }
        let c = &model.config;
        cache_type.check(c.head_dim).map_err(ModelError::Context)?;
        if c.head_dim > ops::MAX_HEAD_DIM {
            return Err(ModelError::Context(format!(
                "head_dim {} is wider than the attention kernels' maximum of {}",
                c.head_dim,
                ops::MAX_HEAD_DIM
            )));
        }
        let n_batch = n_batch.clamp(1, n_ctx);
        let z = |n: usize| vec![0f32; n];
        let n_threads = n_threads.max(1);
        let s = Scratch {
            x: z(n_batch * c.n_embd),
            xb: z(n_batch * c.n_embd),
            q: z(n_batch * c.q_dim()),
            k: z(n_batch * c.kv_dim()),
            v: z(n_batch * c.kv_dim()),
            attn: z(n_batch * c.q_dim()),
            gate: z(n_batch * c.n_ff),
            up: z(n_batch * c.n_ff),
            logits: Vec::new(),
            quant: Vec::new(),
            part: Vec::new(),
            gathered: Vec::new(),
            emb_row: Vec::new(),
            attn_acc: (0..n_threads).map(|_| Mutex::new(AttnScratch::new(c.head_dim, cache_type == CacheType::F16))).collect(),
        };
        let kv = KvCache::new(KvLayout::of_model(c, n_ctx, n_batch, kv_dim.min(c.kv_dim()), cache_type));
        let n_layer = c.n_layer;
        let rope_factors = model.weights.rope_factors.as_ref().map(|_| n_ctx > c.rope.n_ctx_orig);
        let trace = std::env::var_os("HEARTH_TRACE").is_some();
        let profile = std::env::var_os("HEARTH_PROFILE").filter(|v| !v.is_empty() && v != "0").map(|_| Profile::default());
        Ok(Self {
            pool: ThreadPool::new(n_threads),
            kv,
            n_past: vec![0],
            n_batch,
            s,
            head_chunks: std::iter::once(0..c.n_vocab).collect(),
            model,
            source: None,
            experts: None,
            trace,
            f16_dot: F16DotOrder::from_env(),
            f32_attn_from: ops::F32_PATH_MIN_TOKENS,
            profile,
            split: None,
            ring: None,
            layer_unit: (0..n_layer).collect(),
            head_unit0: n_layer,
            rope_factors,
        })
    }

    /// Pin this context's threads to distinct cores, physical cores first
    /// ([`hearth_kernels::affinity::pin_order`]); the calling thread becomes thread 0.
    pub fn pin_threads(&mut self) -> Result<()> {
        self.pin_threads_to(&hearth_kernels::affinity::pin_order())
    }

    /// Pin thread `i` to `cpus[i % cpus.len()]`; the calling thread (the one that will
    /// call [`Self::eval`]) becomes thread 0, pinned to `cpus[0]`.
    pub fn pin_threads_to(&mut self, cpus: &[usize]) -> Result<()> {
        let n = self.pool.n_threads();
        self.pool = ThreadPool::new_pinned(n, cpus).map_err(|e| ModelError::Context(format!("pinning threads: {e}")))?;
        Ok(())
    }

    /// Sum the f16 attention dots in the order of llama.cpp built for AVX-512 (the
    /// default, or `HEARTH_F16_DOT_ORDER`) or for AVX2 ([`F16DotOrder`]): the same on
    /// any CPU, it only picks which llama.cpp build this context agrees with bit for bit.
    pub fn set_f16_dot_order(&mut self, order: F16DotOrder) {
        self.f16_dot = order;
    }

    /// With an f16 KV cache, a sequence feeding at least `n` tokens in one pass computes
    /// its attention in f32 (llama.cpp's tiled path), fewer in f16 per query (its
    /// one-query path); default [`ops::F32_PATH_MIN_TOKENS`] (64), as llama.cpp, so
    /// logits match its bit for bit. A token's bits then depend on how its sequence was
    /// cut into passes; with `n = 1` every pass takes the f32 path and they depend only
    /// on the tokens, so a prefix evaluated in another request (a prompt cache), or
    /// decoded rather than prefilled, holds the same K/V bits.
    pub fn set_f32_attention_from(&mut self, n: usize) {
        self.f32_attn_from = n.max(1);
    }

    /// The f32 attention threshold ([`Self::set_f32_attention_from`]).
    pub fn f32_attention_from(&self) -> usize {
        self.f32_attn_from
    }

    /// Read weights through `source` (e.g. `hearth_memory::Window`) instead of the
    /// mapping, one unit at a time ([`LayerSource`]). The mapping's pages are dropped
    /// from the RSS ([`hearth_gguf::GgufFile::release_pages`]): from now on only the
    /// source's buffers hold weights.
    pub fn set_source(&mut self, source: Box<dyn LayerSource>) {
        self.model.file.release_pages();
        self.head_chunks = crate::source::head_chunks(&self.model.weights);
        self.source = Some(source);
    }

    /// Take a mixture of experts' expert weights from `experts` (e.g.
    /// `hearth_memory::ExpertCache`) instead of the layer units; the source set with
    /// [`Self::set_source`] then holds units without experts
    /// ([`crate::unit_ranges_without_experts`]). A pass's experts are loaded in runs of
    /// at most [`ExpertSource::slots`] distinct experts (`moe_ffn`), so the batch size
    /// stays as planned. Must come before the first evaluation.
    pub fn set_expert_source(&mut self, experts: Box<dyn ExpertSource>) -> Result<()> {
        let Some(moe) = self.model.config.moe else {
            return Err(ModelError::Context("an expert source needs a mixture-of-experts model".into()));
        };
        if self.n_past.iter().any(|&n| n > 0) || self.split.is_some() {
            return Err(ModelError::Context(
                "an expert source must be set before the first evaluation, without a tensor split".into(),
            ));
        }
        if experts.slots() < moe.n_expert_used {
            return Err(ModelError::Context(format!(
                "an expert cache of {} slots cannot hold one token's {} experts",
                experts.slots(),
                moe.n_expert_used
            )));
        }
        self.experts = Some(std::cell::RefCell::new(experts));
        Ok(())
    }

    /// Compute only `split`'s share of every block and sum the partial products with
    /// `comm` (tensor parallelism; see [`TensorSplit`]). The KV cache is re-created for
    /// this node's KV heads only, so this must come before the first [`Self::eval`].
    pub fn set_tensor_split(&mut self, split: TensorSplit, comm: Box<dyn Collective>) -> Result<()> {
        if self.n_past.iter().any(|&n| n > 0) || self.ring.is_some() {
            return Err(ModelError::Context("a tensor split must be set before the first evaluation, and not with a ring".into()));
        }
        if self.n_slots() > 1 {
            return Err(ModelError::Context(
                "tensor parallelism serves one sequence: it cannot be combined with several KV cache slots".into(),
            ));
        }
        if (self.source.is_some() || self.experts.is_some()) && self.model.shard.is_none() {
            return Err(ModelError::Context(
                "tensor parallelism with a sliding window (--mem-budget) needs a shard file: a window over the model file would read whole blocks".into(),
            ));
        }
        let c = &self.model.config;
        if let Some(own) = &self.model.shard {
            if own != &split {
                return Err(ModelError::Context(format!("this shard file holds {own:?}, not the split {split:?}")));
            }
        }
        split.validate(c, &self.model.weights)?;
        // Every exchange of a pass must fit one message: cap the batch to it.
        let widest = if split.gather_rows.is_some() { c.n_embd.max(c.q_dim()).max(c.n_ff) } else { c.n_embd };
        // A MoE layer's gather exchanges a run of up to max(n, n_expert_used) (expert,
        // token) pairs' SwiGLU rows (`Block::moe_ffn`), and its router logits.
        let widest = match c.moe {
            // (and a shared expert's gather exchanges its SwiGLU rows, `n_ff_shared` a token).
            Some(m) => widest.max(m.n_expert).max(if split.gather_rows.is_some() { (m.n_expert_used * c.n_ff).max(m.n_ff_shared) } else { 0 }),
            None => widest,
        };
        self.n_batch = self.n_batch.min(comm.max_elements() / widest).max(1);
        let layout = KvLayout { kv_dim: split.kv_rows(c).len(), n_batch: self.n_batch, ..self.kv.layout().clone() };
        if &layout != self.kv.layout() {
            self.kv.replace(layout);
        }
        if let Some(r) = &split.gather_rows {
            self.s.part = vec![0.0; self.n_batch * r.len()];
            self.s.gathered = vec![0.0; self.n_batch * c.q_dim().max(c.n_ff)];
        }
        let mut shard = Vec::new();
        if split != TensorSplit::whole(c) && self.model.shard.is_none() {
            let file = &self.model.file;
            for l in &self.model.weights.layers {
                let mut m: [Vec<u8>; 7] = Default::default();
                for (i, ((t, (rows, cols)), out)) in l.matrices().into_iter().zip(split.matrix_shapes(c)).zip(&mut m).enumerate() {
                    match c.moe {
                        // Stacked experts: each expert's part, laid end to end (`Block::expert_view`).
                        Some(moe) if i >= crate::arch::Mat::Gate as usize => {
                            use crate::arch::Mat;
                            let mat = [Mat::Gate, Mat::Up, Mat::Down][i - Mat::Gate as usize];
                            crate::split::slice_experts(file, l, mat, moe.n_expert, rows, cols, out)?;
                        }
                        _ => crate::split::slice_matrix(file, t, rows, cols, out)?,
                    }
                }
                let mut shared: [Vec<u8>; 3] = Default::default();
                if let Some(sh) = &l.shared {
                    for ((t, (rows, cols)), out) in [&sh.gate, &sh.up, &sh.down].into_iter().zip(split.shared_shapes(c)).zip(&mut shared) {
                        crate::split::slice_matrix(file, t, rows, cols, out)?;
                    }
                }
                shard.push(ShardBlock { m, shared });
            }
        }
        self.split = Some(SplitState { split, shard, comm });
        Ok(())
    }

    /// Run only `windows` of the layers (pipelined ring; see [`RingWindows`]). On the head
    /// device `link` carries the activations around the rest of the ring after each of
    /// its windows and [`Self::eval`] works as usual; on the other devices (`link` =
    /// `None`, windows not the whole model) [`Self::eval_round`] runs one window. The KV
    /// cache is re-created for these layers only, so this must come before the first
    /// evaluation, and before [`Self::set_source`] (whose units are [`Self::units`]).
    pub fn set_ring(&mut self, windows: RingWindows, link: Option<Box<dyn RingLink>>) -> Result<()> {
        if self.n_past.iter().any(|&n| n > 0) || self.split.is_some() || self.source.is_some() || self.n_slots() > 1 {
            return Err(ModelError::Context(
                "a ring must be set before the first evaluation, without a tensor split, a source or several KV cache slots".into(),
            ));
        }
        let c = &self.model.config;
        let owned = windows.owned(c.n_layer)?;
        if let Some(l) = &link {
            self.n_batch = self.n_batch.min(l.max_elements() / c.n_embd).max(1);
        }
        let mut layout = KvLayout { n_batch: self.n_batch, ..self.kv.layout().clone() };
        for (l, &o) in layout.layers.iter_mut().zip(&owned) {
            l.1 = o;
        }
        self.kv.replace(layout);
        let mut next = 0;
        for (il, &o) in owned.iter().enumerate() {
            self.layer_unit[il] = if o { next } else { usize::MAX };
            next += o as usize;
        }
        self.head_unit0 = next;
        self.ring = Some(RingState { windows, link, pass: (0, 0, 0) });
        Ok(())
    }

    /// File byte ranges of the units this context reads, in the order it reads them: its
    /// blocks (all, or a ring device's own), then, with `head`, the output head in row
    /// chunks (see [`crate::unit_ranges`]). What a sliding window over this context streams.
    pub fn units(&self, head: bool) -> Result<Vec<std::ops::Range<usize>>> {
        self.units_of(head, false)
    }

    /// [`Self::units`] with each block's experts left out
    /// ([`crate::unit_ranges_without_experts`]): a window beside an expert cache.
    pub fn units_without_experts(&self, head: bool) -> Result<Vec<std::ops::Range<usize>>> {
        self.units_of(head, true)
    }

    fn units_of(&self, head: bool, without_experts: bool) -> Result<Vec<std::ops::Range<usize>>> {
        let c = &self.model.config;
        let w = &self.model.weights;
        let all = if without_experts { crate::source::unit_ranges_without_experts(w)? } else { crate::source::unit_ranges(w)? };
        let own = (0..c.n_layer).filter(|&il| self.owns_layer(il)).map(|il| all[il].clone());
        Ok(own.chain(if head { all[c.n_layer..].to_vec() } else { Vec::new() }).collect())
    }

    /// Whether this context runs layer `il`: every layer, except on a pipelined-ring
    /// device ([`Self::set_ring`]), which runs its windows' layers only.
    pub fn owns_layer(&self, il: usize) -> bool {
        owns(&self.layer_unit, il)
    }

    /// This device's ring windows, when it runs a pipelined ring ([`Self::set_ring`]).
    pub fn ring_windows(&self) -> Option<&RingWindows> {
        self.ring.as_ref().map(|r| &r.windows)
    }

    /// Hold `n_slots` independent sequences of up to [`Self::n_ctx`] positions each, for
    /// [`Self::eval_batch`]: the KV cache is re-created with `n_slots · n_ctx` positions
    /// (slot `s` owns positions `s · n_ctx ..`), so this must come before the first
    /// evaluation. [`Self::eval`], [`Self::n_past`] and [`Self::truncate`] act on slot 0.
    pub fn set_slots(&mut self, n_slots: usize) -> Result<()> {
        if n_slots == 0 {
            return Err(ModelError::Context("at least one KV cache slot is needed".into()));
        }
        if self.split.is_some() || self.ring.is_some() {
            return Err(ModelError::Context(
                "a tensor-parallel or ring context serves one sequence: it cannot have several KV cache slots".into(),
            ));
        }
        if self.n_past.iter().any(|&n| n > 0) {
            return Err(ModelError::Context("slots must be set before the first evaluation".into()));
        }
        let layout = KvLayout { n_slots, ..self.kv.layout().clone() };
        self.kv.replace(layout);
        self.n_past = vec![0; n_slots];
        Ok(())
    }

    /// KV cache slots (sequences held at once).
    pub fn n_slots(&self) -> usize {
        self.n_past.len()
    }

    /// Positions cached in `slot` (0 for a slot that does not exist).
    pub fn slot_n_past(&self, slot: usize) -> usize {
        self.n_past.get(slot).copied().unwrap_or(0)
    }

    /// Forget positions from `n` on in `slot` (0 frees the slot for a new sequence), and
    /// return the positions kept: `n`, or 0 when a sliding-window layer's ring no longer
    /// holds the keys position `n` would need (more than `n_batch` positions back, see
    /// [`KvLayout::can_rewind`]): the sequence is then evaluated again from its start.
    pub fn truncate_slot(&mut self, slot: usize, n: usize) -> usize {
        let Some(p) = self.n_past.get_mut(slot) else { return 0 };
        *p = if self.kv.layout().can_rewind(*p, n) { (*p).min(n) } else { 0 };
        *p
    }

    /// Start slot `to`'s sequence with the first `n` positions of slot `from`'s (their
    /// K/V copied, so a prompt two requests share is evaluated once; the sequence in
    /// `to` is dropped). Returns the positions copied: `n` capped at what `from` holds,
    /// or 0 when a sliding-window layer's ring no longer holds what position `n` needs
    /// (0 and nothing changed when `from` is `to` or a slot does not exist).
    pub fn copy_slot(&mut self, from: usize, to: usize, n: usize) -> usize {
        let (Some(&have), true) = (self.n_past.get(from), to < self.n_past.len() && from != to) else { return 0 };
        let n = n.min(have);
        let n = if self.kv.layout().can_rewind(have, n) { n } else { 0 };
        self.kv.copy_slot(from, to, n);
        self.n_past[to] = n;
        n
    }

    /// Whether the weights come through a [`LayerSource`] (read into its buffers under a
    /// memory budget) rather than in place from the mapped file.
    pub fn streams_weights(&self) -> bool {
        self.source.is_some()
    }

    /// The source's I/O counters, when weights come through one.
    pub fn source_stats(&self) -> Option<SourceStats> {
        let stats = self.source.as_ref().map(|s| s.stats());
        match &self.experts {
            Some(x) => Some(stats.unwrap_or_default().with_experts(&x.borrow().stats())),
            None => stats,
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Most tokens one forward pass takes.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Threads of the pool.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Positions already in the KV cache (slot 0).
    pub fn n_past(&self) -> usize {
        self.n_past[0]
    }

    /// Capacity in positions (of each slot).
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Bytes of the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// What this context's buffers hold now, by category.
    pub fn buffers(&self) -> ContextBuffers {
        let s = &self.s;
        let f32s = [&s.x, &s.xb, &s.q, &s.k, &s.v, &s.attn, &s.gate, &s.up, &s.part, &s.gathered].iter().map(|b| b.capacity()).sum::<usize>();
        let v_f16 = self.kv.cache_type() == CacheType::F16;
        ContextBuffers {
            kv_cache_bytes: self.kv.bytes(),
            activations_bytes: 4 * f32s,
            logits_bytes: 4 * s.logits.capacity(),
            quantized_activations_bytes: s.quant.capacity(),
            per_thread_bytes: s.attn_acc.len() * AttnScratch::bytes(self.model.config.head_dim, v_f16),
            weight_shard_bytes: self.split.as_ref().map_or(0, |sp| sp.shard.iter().flat_map(|b| b.m.iter().map(Vec::len)).sum()),
        }
    }

    /// Element type of the KV cache.
    pub fn cache_type(&self) -> CacheType {
        self.kv.cache_type()
    }

    /// Forget positions from `n` on (e.g. 0 to start a new conversation); slot 0. Returns
    /// the positions kept ([`Self::truncate_slot`]).
    pub fn truncate(&mut self, n: usize) -> usize {
        self.truncate_slot(0, n)
    }

    /// Run `tokens` through the model at positions `n_past..`, appending them to the KV
    /// cache. Returns logits `[1, n_vocab]` (Last) or `[tokens.len(), n_vocab]` (All).
    pub fn eval(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.check_tokens(0, tokens)?;
        let n_vocab = self.model.config.n_vocab;
        let n_out = if which == Logits::All { tokens.len() } else { 1 };
        self.s.logits.resize(n_out * n_vocab, 0.0);
        let mut done = 0;
        for chunk in tokens.chunks(self.n_batch) {
            let rows: Vec<usize> = match which {
                Logits::All => (0..chunk.len()).collect(),
                Logits::Last if done + chunk.len() == tokens.len() => vec![chunk.len() - 1],
                Logits::Last => Vec::new(),
            };
            let out_row = if which == Logits::All { done } else { 0 };
            let span = Span { slot: 0, pos0: self.n_past[0], row: 0, len: chunk.len() };
            self.forward(chunk, &[span], &rows, out_row)?;
            done += chunk.len();
        }
        Ok(&self.s.logits)
    }

    /// Run several sequences' tokens as one forward pass (continuous batching): each
    /// segment's tokens at its slot's next positions, attending to that slot's cache only,
    /// while the matrix products take all tokens at once. At most [`Self::n_batch`] tokens
    /// in all and one segment per slot. Returns logits `[k, n_vocab]`: each segment's
    /// `logits` rows (its last tokens, in order), segments in order. A sequence's results
    /// do not depend on what else shares its batch (each token's products, norms and
    /// attention are computed the same way alone or in a batch).
    pub fn eval_batch(&mut self, segs: &[Segment<'_>]) -> Result<&[f32]> {
        let n: usize = segs.iter().map(|g| g.tokens.len()).sum();
        if segs.is_empty() {
            return Err(ModelError::Input("an empty batch: no segments to evaluate".into()));
        }
        if n > self.n_batch {
            return Err(ModelError::Input(format!("{n} tokens in one pass exceed the batch size {}", self.n_batch)));
        }
        let mut tokens = Vec::with_capacity(n);
        let (mut spans, mut rows) = (Vec::with_capacity(segs.len()), Vec::new());
        for (i, g) in segs.iter().enumerate() {
            if g.slot >= self.n_slots() {
                return Err(ModelError::Input(format!("slot {} does not exist ({} slots)", g.slot, self.n_slots())));
            }
            if segs[..i].iter().any(|o| o.slot == g.slot) {
                return Err(ModelError::Input(format!("slot {} appears twice in one batch", g.slot)));
            }
            self.check_tokens(g.slot, g.tokens)?;
            if g.logits > g.tokens.len() {
                return Err(ModelError::Input(format!("logits for {} tokens of a segment of {}", g.logits, g.tokens.len())));
            }
            spans.push(Span { slot: g.slot, pos0: self.n_past[g.slot], row: tokens.len(), len: g.tokens.len() });
            tokens.extend_from_slice(g.tokens);
            rows.extend(tokens.len() - g.logits..tokens.len());
        }
        self.s.logits.resize(rows.len() * self.model.config.n_vocab, 0.0);
        self.forward(&tokens, &spans, &rows, 0)?;
        Ok(&self.s.logits)
    }

    /// Run `tokens` through the model at `slot`'s next positions (appending them to its KV
    /// cache, in passes of at most [`Self::n_batch`] tokens) and return their final hidden
    /// states after the output norm, `[tokens.len(), n_embd]` (llama.cpp's `result_norm`:
    /// what [`crate::embed`] pools into an embedding). No logits are computed.
    pub fn eval_hidden(&mut self, slot: usize, tokens: &[u32]) -> Result<Vec<f32>> {
        if slot >= self.n_slots() {
            return Err(ModelError::Input(format!("slot {slot} does not exist ({} slots)", self.n_slots())));
        }
        self.check_tokens(slot, tokens)?;
        let model = Arc::clone(&self.model);
        let (c, w) = (&model.config, &model.weights);
        let e = c.n_embd;
        let mut out = vec![0f32; tokens.len() * e];
        let mut done = 0;
        for chunk in tokens.chunks(self.n_batch) {
            let span = Span { slot, pos0: self.n_past[slot], row: 0, len: chunk.len() };
            self.forward(chunk, &[span], &[], 0)?;
            for (r, o) in out[done * e..(done + chunk.len()) * e].chunks_exact_mut(e).enumerate() {
                ops::rmsnorm(&self.s.x[r * e..(r + 1) * e], &w.output_norm, c.rms_eps, o);
            }
            done += chunk.len();
        }
        Ok(out)
    }

    /// Whether `tokens` can be appended to `slot`: a model with a head, ids in the
    /// vocabulary, room in the slot.
    fn check_tokens(&self, slot: usize, tokens: &[u32]) -> Result<()> {
        let c = &self.model.config;
        if tokens.is_empty() {
            return Err(ModelError::Input("no tokens to evaluate (empty prompt)".into()));
        }
        if self.model.shard.is_some() {
            return Err(ModelError::Input("a shard file has no embedding or output head: it only runs as a tensor-parallel worker".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.n_vocab) {
            return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary (n_vocab {})", c.n_vocab)));
        }
        if self.n_past[slot] + tokens.len() > self.n_ctx() {
            return Err(ModelError::Context(format!(
                "{} tokens do not fit: {} already in a context of {} (raise --ctx-size)",
                tokens.len(),
                self.n_past[slot],
                self.n_ctx()
            )));
        }
        Ok(())
    }

    /// One batch through every layer: `spans` say which rows belong to which slot and
    /// position. `rows`: the rows whose logits are wanted, written to `logits` from row
    /// `out_row` on (none: no logits).
    fn forward(&mut self, tokens: &[u32], spans: &[Span], rows: &[usize], out_row: usize) -> Result<()> {
        let t0 = std::time::Instant::now();
        let n = tokens.len();
        let e = self.model.config.n_embd;
        self.embed(tokens)?;
        let pos0 = spans[0].pos0;
        if let Some(mut ring) = self.ring.take() {
            // Each round: this device's window, then the rest of the ring.
            let r = (|| {
                for (round, win) in ring.windows.rounds.iter().enumerate() {
                    self.blocks(spans, win.clone())?;
                    if let Some(link) = ring.link.as_mut() {
                        link.pass(pos0, round, &mut self.s.x[..n * e]).map_err(ModelError::Collective)?;
                    }
                }
                Ok::<_, ModelError>(())
            })();
            self.ring = Some(ring);
            r?;
        } else {
            if let Some(sp) = &mut self.split {
                sp.comm.begin_pass(pos0, &self.s.x[..n * e], n).map_err(ModelError::Collective)?;
            }
            self.blocks(spans, 0..self.model.config.n_layer)?;
        }
        // A streamed head's waits for its units count to "waiting for weights", not to it.
        let waited = |c: &Self| c.source_stats().map_or(0.0, |s| s.wait_secs);
        let (th, w0) = (std::time::Instant::now(), if self.profile.is_some() { waited(self) } else { 0.0 });
        self.head(rows, out_row)?;
        let head_wait = if self.profile.is_some() { waited(self) - w0 } else { 0.0 };
        if let Some(p) = &mut self.profile {
            p.ops.add(crate::block::Op::Head, th, head_wait);
            p.passes += 1;
            p.tokens += n;
            p.total += t0.elapsed();
        }
        Ok(())
    }

    /// Tensor parallelism, worker side: run `x: [n_tokens, n_embd]` (input embeddings
    /// the coordinator computed) through this node's share of every block at positions
    /// `pos0..`, dropping cached positions from `pos0` on first. No logits: the
    /// coordinator computes them. `n_tokens` must be at most [`Self::n_batch`].
    pub fn eval_embeddings(&mut self, pos0: usize, x: &[f32]) -> Result<()> {
        let e = self.model.config.n_embd;
        let n = x.len() / e;
        if n == 0 || x.len() != n * e {
            return Err(ModelError::Input(format!("embeddings of {} values are not whole rows of n_embd {e}", x.len())));
        }
        if n > self.n_batch {
            return Err(ModelError::Input(format!("{n} tokens in one pass exceed the batch size {}", self.n_batch)));
        }
        if pos0 > self.n_past[0] {
            return Err(ModelError::Context(format!("a pass at position {pos0} but only {} positions are cached", self.n_past[0])));
        }
        self.check_rewind(pos0)?;
        if pos0 + n > self.n_ctx() {
            return Err(ModelError::Context(format!("positions {pos0}..{} do not fit a context of {}", pos0 + n, self.n_ctx())));
        }
        self.n_past[0] = pos0;
        self.s.x[..n * e].copy_from_slice(x);
        self.blocks(&[Span { slot: 0, pos0, row: 0, len: n }], 0..self.model.config.n_layer)?;
        Ok(())
    }

    /// Pipelined ring, on a device other than the head: run `x: [n_tokens, n_embd]` (the
    /// activations of tokens at positions `pos0..`) through this device's window of round
    /// `round`, in place. Round 0 drops cached positions from `pos0` on first.
    /// `n_tokens` must be at most [`Self::n_batch`].
    pub fn eval_round(&mut self, pos0: usize, round: usize, x: &mut [f32]) -> Result<()> {
        let e = self.model.config.n_embd;
        let n = x.len() / e;
        let Some(win) = self.ring.as_ref().and_then(|r| r.windows.rounds.get(round)).cloned() else {
            return Err(ModelError::Input(format!("round {round} is not one of this device's rounds")));
        };
        if n == 0 || x.len() != n * e {
            return Err(ModelError::Input(format!("activations of {} values are not whole rows of n_embd {e}", x.len())));
        }
        if n > self.n_batch {
            return Err(ModelError::Input(format!("{n} tokens in one pass exceed the batch size {}", self.n_batch)));
        }
        let pass = self.ring.as_ref().map_or((0, 0, 0), |r| r.pass);
        if (round == 0 && pos0 > self.n_past[0]) || (round > 0 && pass != (pos0, n, round)) {
            return Err(ModelError::Context(format!(
                "round {round} of a pass of {n} tokens at position {pos0}, but {} positions are cached and the pass under way is {pass:?}",
                self.n_past[0]
            )));
        }
        if pos0 + n > self.n_ctx() {
            return Err(ModelError::Context(format!("positions {pos0}..{} do not fit a context of {}", pos0 + n, self.n_ctx())));
        }
        if round == 0 {
            self.check_rewind(pos0)?;
        }
        self.n_past[0] = pos0;
        self.s.x[..n * e].copy_from_slice(x);
        self.blocks(&[Span { slot: 0, pos0, row: 0, len: n }], win)?;
        if let Some(r) = self.ring.as_mut() {
            r.pass = (pos0, n, round + 1);
        }
        x.copy_from_slice(&self.s.x[..n * e]);
        Ok(())
    }

    /// A worker's pass from `pos0` drops the positions after it: refuse when a window
    /// layer's ring no longer holds the keys it needs ([`KvLayout::can_rewind`]).
    fn check_rewind(&self, pos0: usize) -> Result<()> {
        if self.kv.layout().can_rewind(self.n_past[0], pos0) {
            return Ok(());
        }
        Err(ModelError::Context(format!(
            "a pass at position {pos0} goes back more than a batch from the {} positions cached: the sliding-window layers \
             no longer hold its keys (start the sequence again from position 0)",
            self.n_past[0]
        )))
    }

    /// Rows of `token_embd` for `tokens` into `x`, dequantized.
    fn embed(&mut self, tokens: &[u32]) -> Result<()> {
        let model = Arc::clone(&self.model);
        let (e, emb, file) = (model.config.n_embd, &model.weights.token_embd, &*model.file);
        let row_bytes = emb.row_bytes();
        for (t, &tok) in tokens.iter().enumerate() {
            let at = emb.offset + tok as usize * row_bytes;
            let row = match self.source.as_mut() {
                Some(src) => {
                    self.s.emb_row.resize(row_bytes, 0);
                    src.read_at(at as u64, &mut self.s.emb_row)?;
                    &self.s.emb_row[..]
                }
                None => &file.as_bytes()[at..at + row_bytes],
            };
            let x = &mut self.s.x[t * e..(t + 1) * e];
            hearth_kernels::dequantize_row(emb.ty, row, x)?;
            if let Some(s) = model.config.embd_scale {
                ops::scale(x, s);
            }
        }
        Ok(())
    }

    /// `x: [n, n_embd]` through blocks `layers`, each span's rows at its slot's positions
    /// `pos0..` (the slots' cached positions end there afterwards). Each block is the architecture's ([`crate::Arch`]); with a split,
    /// this node's rows and columns only, and the two partial products of each block
    /// summed across nodes (inside [`Block::matmul`]).
    fn blocks(&mut self, spans: &[Span], layers: std::ops::Range<usize>) -> Result<()> {
        let model = Arc::clone(&self.model);
        let (c, w, file) = (&model.config, &model.weights, &*model.file);
        let n: usize = spans.iter().map(|sp| sp.len).sum();
        let e = c.n_embd;
        let whole = TensorSplit::whole(c);
        let part = self.split.as_ref().map_or(&whole, |sp| &sp.split);
        let share = Share {
            shapes: part.matrix_shapes(c),
            shared: part.shared_shapes(c),
            n_head: part.n_head(c),
            n_head_kv: part.kv_heads.len(),
            gather: part.gather_rows.clone(),
        };
        let (qd, kvd, ff) = (share.n_head * c.head_dim, share.n_head_kv * c.head_dim, part.ffn_rows.len());
        // Attention work items, the same for every layer.
        let items = crate::attn::attn_items(spans, share.n_head, c.n_head / c.n_head_kv, self.pool.n_threads());
        let Scratch { x, xb, q, k, v, attn, gate, up, quant, part: part_buf, gathered, attn_acc, .. } = &mut self.s;
        let (shard, mut comm) = match self.split.as_mut() {
            Some(SplitState { shard, comm, .. }) => (&shard[..], Some(comm)),
            None => (&[][..], None),
        };
        // Phi-3's short or long LongRoPE factors, else Llama 3.1's rope_freqs, if any.
        let rope_factors = self.rope_factors.and_then(|long| w.rope_factors.as_ref().map(|f| &f[long as usize][..]));
        let rope_factors = rope_factors.or(w.rope_freqs.as_deref());
        let block = c.arch.block();
        let mapped = Unit { bytes: file.as_bytes(), base: 0 };
        // The read-ahead's buffers (below), made once a pass when it first runs.
        let mut guess: Option<NextExperts> = None;
        for il in layers {
            let l = &w.layers[il];
            let unit = match self.source.as_mut() {
                Some(src) => src.acquire(self.layer_unit[il])?,
                None => mapped,
            };
            let mut b = Block {
                c,
                il,
                n,
                share: &share,
                l,
                unit,
                expert_cache: self.experts.as_ref(),
                own: shard.get(il),
                pool: &self.pool,
                comm: comm.as_mut().map(|b| &mut ***b as &mut dyn Collective),
                kv: &mut self.kv,
                spans,
                items: &items,
                quant,
                part: part_buf,
                gathered,
                attn_acc,
                rope_factors,
                trace: self.trace,
                f16_dot: self.f16_dot,
                f32_attn_from: self.f32_attn_from,
                times: self.profile.as_ref().map(|p| &p.ops),
            };
            let mut a = Acts {
                x: &mut x[..n * e],
                xb: &mut xb[..n * e],
                q: &mut q[..n * qd],
                k: &mut k[..n * kvd],
                v: &mut v[..n * kvd],
                attn: &mut attn[..n * qd],
                gate: &mut gate[..n * ff],
                up: &mut up[..n * ff],
            };
            block(&mut b, &mut a, l)?;
            if let Some(src) = self.source.as_mut() {
                src.release(self.layer_unit[il]);
            }
            // Read-ahead of the next layer's experts (decode, expert cache): its router on
            // this layer's output, normed with its ffn_norm, guesses its top k (its real
            // input adds its attention, so the guess is close, not exact), and the cache
            // starts reading the ones it lacks while the next layer's attention computes.
            // The router's bytes come from the mapping (n_expert rows: a few hundred KiB a
            // layer stay resident), since the next layer's unit may not be loaded yet.
            // (On a ring device, only when it runs the next layer too.)
            let own_next = owns(&self.layer_unit, il + 1);
            if let (1, None, Some(cache), Some(moe), true) = (n, comm.as_ref(), self.experts.as_ref(), c.moe, own_next) {
                if let Some((next, router)) = w.layers.get(il + 1).and_then(|l| Some((l, l.router.as_ref()?))) {
                    let g = guess.get_or_insert_with(|| NextExperts::new(e, moe));
                    ops::rmsnorm(&x[..e], next.v(crate::arch::Vector::FfnNorm), c.rms_eps, &mut g.h);
                    matmul(&self.pool, &mapped.view(router)?, &g.h, 1, &mut g.logits, quant)?;
                    // A NaN is reported by the next layer's own routing; no guess then.
                    if crate::moe::route(&mut g.logits, moe.n_expert_used, moe.norm_weights, &mut g.ids, &mut g.wt).is_ok() {
                        cache.borrow_mut().prefetch(il + 1, &g.ids);
                    }
                }
            }
        }
        for sp in spans {
            self.n_past[sp.slot] = sp.pos0 + sp.len;
        }
        Ok(())
    }

    /// The output head: logits of rows `logit_rows` of `x` into `logits` from row `out_row` on
    /// (no rows: no logits; a source still streams the head units).
    fn head(&mut self, logit_rows: &[usize], out_row: usize) -> Result<()> {
        let model = Arc::clone(&self.model);
        let (c, w, file) = (&model.config, &model.weights, &*model.file);
        let e = c.n_embd;
        let s = &mut self.s;
        let pool = &self.pool;
        let mapped = Unit { bytes: file.as_bytes(), base: 0 };

        // Output head on the rows that need logits. A source streams it as units
        // n_layer.. (row chunks) on every pass, needed or not, to keep its order.
        let m = logit_rows.len();
        for (i, &r) in logit_rows.iter().enumerate() {
            ops::rmsnorm(&s.x[r * e..(r + 1) * e], &w.output_norm, c.rms_eps, &mut s.xb[i * e..(i + 1) * e]);
        }
        let v = c.n_vocab;
        for (k, rows) in self.head_chunks.iter().enumerate() {
            let unit = match self.source.as_mut() {
                Some(src) => src.acquire(self.head_unit0 + k)?,
                None => mapped,
            };
            if m > 0 {
                let row = out_row;
                let head = unit.view(&w.output.rows(rows.clone()))?;
                let nr = rows.len();
                if m == 1 || nr == v {
                    // [m, nr] is contiguous in the [m, v] logits.
                    let at = row * v + rows.start;
                    matmul(pool, &head, &s.xb[..m * e], m, &mut s.logits[at..at + m * nr], &mut s.quant)?;
                } else {
                    // Logits of every token through a chunk: [tb, nr] at a time in the FFN
                    // buffer (free here, so no memory beyond what the plan counts), then
                    // copied into the token rows.
                    // (A chunk wider than that buffer goes one token at a time, in place.)
                    let tb = (s.gate.len() / nr).min(m);
                    if tb == 0 {
                        for t in 0..m {
                            let at = (row + t) * v + rows.start;
                            matmul(pool, &head, &s.xb[t * e..(t + 1) * e], 1, &mut s.logits[at..at + nr], &mut s.quant)?;
                        }
                    }
                    for t0 in (0..m).step_by(tb.max(1)).take_while(|_| tb > 0) {
                        let k = tb.min(m - t0);
                        let tmp = &mut s.gate[..k * nr];
                        matmul(pool, &head, &s.xb[t0 * e..(t0 + k) * e], k, tmp, &mut s.quant)?;
                        for t in 0..k {
                            let at = (row + t0 + t) * v + rows.start;
                            s.logits[at..at + nr].copy_from_slice(&tmp[t * nr..(t + 1) * nr]);
                        }
                    }
                }
            }
            if let Some(src) = self.source.as_mut() {
                src.release(self.head_unit0 + k);
            }
        }
        if let Some(cap) = c.logit_softcap {
            // ggml: scale by 1/cap, tanh, scale by cap.
            let v = c.n_vocab;
            for x in &mut s.logits[out_row * v..(out_row + m) * v] {
                *x = (*x * (1.0 / cap)).tanh() * cap;
            }
        }
        // A NaN or infinity here (a corrupt weight past the last check, an overflow) would
        // be sampled as some token, often the end of generation, with no word why.
        if let Some(i) = s.logits[out_row * v..(out_row + m) * v].iter().position(|x| !x.is_finite()) {
            return Err(ModelError::NotFinite(format!(
                "the output logits hold {} (token id {} of row {} of this pass): a NaN or infinity from the weights (a corrupt file?) or an overflow in the forward pass",
                s.logits[out_row * v + i],
                i % v,
                i / v
            )));
        }
        Ok(())
    }
}
