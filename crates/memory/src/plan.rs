//! Memory and speed planning from metadata only.
//!
//! Peak RSS of a `hearth generate` run is predicted as the sum of four terms:
//!
//! * **model file pages**: the mapped GGUF file (tensor bytes, `ggml_nbytes` from the
//!   type table of ggml-common.h, plus the header). A decode reads every matrix, so the
//!   whole file ends up resident, except an untied `token_embd.weight` (a file with a
//!   separate `output.weight`): it is read one row per position, and each read faults in
//!   at most [`FAULT_AROUND_BYTES`] (or the row, if longer) — see
//!   [`ModelSummary::resident_file_bytes`].
//! * **KV cache**: [`ModelSummary::kv_cache_bytes`] (K and V in the cache type:
//!   `2 · Σ_layers held · row_bytes(kv_dim)`, with `held = n_ctx` for full attention and
//!   `min(n_ctx, window + n_batch − 1)` for a sliding-window layer's ring, fully written
//!   at allocation, so fully resident).
//! * **compute scratch**: exactly the buffers `hearth_model::Context::new` and its first
//!   eval allocate (see [`scratch_bytes`]). The f32 buffers come from zeroed allocations
//!   whose pages become resident only when written: the full size is reached once a
//!   prompt fills a whole batch, which is the peak we predict.
//! * **runtime overhead**: binary, shared libraries, tokenizer tables, thread stacks and
//!   allocator slack, fitted on measured runs as `OVERHEAD_BASE + OVERHEAD_PER_VOCAB ·
//!   n_vocab` (docs/MEMORY.md has the data).
//!
//! Nothing here reads tensor data: [`ModelSummary::from_gguf`] uses only the header that
//! `GgufFile::open` parses.

use hearth_gguf::GgufFile;
use hearth_kernels::ops::AttnScratch;
use hearth_model::{Arch, CacheType, KvLayout, ModelConfig};
use hearth_quant::{vec_dot_type, GgmlType};
use serde::Serialize;
use std::collections::BTreeMap;

/// Constant part of the runtime overhead (bytes): binary and library pages, thread
/// stacks, allocator. Least-squares fit over six measured runs (`bench/overhead-fit.py`,
/// docs/MEMORY.md; refitted 2026-12-06, as the binary's code pages had grown by ~2 MB).
pub const OVERHEAD_BASE: u64 = 8_240_000;
/// Per-vocabulary-entry part of the runtime overhead (bytes per token): tokenizer
/// tables (token strings, lookup maps, BPE merge ranks). Same fit.
pub const OVERHEAD_PER_VOCAB: u64 = 357;
/// Bytes a read fault on a file mapping makes resident around the faulting page: Linux's
/// default `fault_around_bytes` (64 KiB, mm/memory.c), when the pages are in the page cache.
pub const FAULT_AROUND_BYTES: u64 = 64 << 10;
/// Memory read bandwidth assumed when neither `--membw` nor a measurement is given
/// (GB/s): a single DDR4-3200 channel.
pub const DEFAULT_MEMBW_GBPS: f64 = 25.6;

/// Hyperparameters that decide sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    /// Residual width.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// FFN hidden width.
    pub n_ff: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
}

impl ModelShape {
    /// The shape of `c`, caching `n_head_kv` KV heads (fewer on a tensor-parallel node).
    pub fn of(c: &ModelConfig, n_head_kv: usize) -> Self {
        Self { n_embd: c.n_embd, n_layer: c.n_layer, n_head: c.n_head, n_head_kv, head_dim: c.head_dim, n_ff: c.n_ff, n_vocab: c.n_vocab }
    }

    /// `n_head · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    /// `n_head_kv · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// Named shapes (`hearth synth --shape`), with SmolLM2's 49152-token vocabulary, which
/// synth copies by default: `tiny`, `1b` (TinyLlama 1.1B), `7b`, `13b`, `70b` (Llama 2).
pub fn preset(name: &str) -> Option<ModelShape> {
    let d = |n_embd, n_layer, n_head, n_head_kv, n_ff| ModelShape {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim: n_embd / n_head,
        n_ff,
        n_vocab: 49152,
    };
    Some(match name {
        "tiny" => d(256, 2, 4, 2, 512),
        "1b" => d(2048, 22, 32, 4, 5632),
        "7b" => d(4096, 32, 32, 32, 11008),
        "13b" => d(5120, 40, 40, 40, 13824),
        "70b" => d(8192, 80, 64, 8, 28672),
        _ => return None,
    })
}

/// One tensor's header facts.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSummary {
    /// Name, e.g. `blk.3.ffn_up.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// `dims[0]` (input features of a matrix).
    pub cols: u64,
    /// Number of dimensions.
    pub n_dims: usize,
    /// `ggml_nbytes`.
    pub bytes: u64,
}

/// What the planner needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSummary {
    /// Hyperparameters.
    pub shape: ModelShape,
    /// Each layer's attention window in positions (`usize::MAX`: full causal).
    pub windows: Vec<usize>,
    /// Every tensor.
    pub tensors: Vec<TensorSummary>,
    /// Bytes that end up mapped: the file length (or, for a shape, the tensor bytes).
    pub file_bytes: u64,
    /// A mixture of experts: `(n_expert, n_expert_used)` (`None`: dense).
    pub experts: Option<(usize, usize)>,
}

impl ModelSummary {
    /// From a parsed GGUF header (tensor data is never read).
    pub fn from_gguf(f: &GgufFile) -> hearth_model::Result<Self> {
        let c = ModelConfig::from_gguf(f)?;
        // A shard file (tensor parallelism) caches only its own KV heads.
        let shard = hearth_model::TensorSplit::from_shard_file(f)?;
        let shape = ModelShape::of(&c, shard.as_ref().map_or(c.n_head_kv, |s| s.kv_heads.len()));
        let tensors = f
            .tensors()
            .iter()
            .map(|t| TensorSummary {
                name: t.name.clone(),
                ty: t.ty,
                cols: t.dims.first().copied().unwrap_or(1),
                n_dims: t.dims.len(),
                bytes: t.size,
            })
            .collect();
        Ok(Self { shape, windows: Self::windows_of(&c), tensors, file_bytes: f.as_bytes().len() as u64, experts: Self::experts_of(&c) })
    }

    /// The tensors `hearth synth --arch llama` writes for `shape` (norms F32, matrices
    /// `ty`, output `out_ty`). `None` when a row is not whole blocks of the type.
    pub fn from_shape(shape: ModelShape, ty: GgmlType, out_ty: GgmlType) -> Option<Self> {
        Self::from_config(&Self::config_for(Arch::Llama, shape), ty, out_ty, false)
    }

    /// The configuration `hearth synth --arch` writes for a shape.
    pub fn config_for(arch: Arch, s: ModelShape) -> ModelConfig {
        ModelConfig::for_shape(arch, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab)
    }

    /// The tensors `hearth synth` writes for `c` ([`hearth_model::file_tensors`]: the
    /// architecture's table, matrices `ty`, the head `out_ty` unless `tied`, vectors F32).
    /// `None` when a row is not whole blocks of the type.
    pub fn from_config(c: &ModelConfig, ty: GgmlType, out_ty: GgmlType, tied: bool) -> Option<Self> {
        let tensors = hearth_model::file_tensors(c, ty, out_ty, tied, false)
            .into_iter()
            .map(|t| {
                let cols = t.dims.first().copied().unwrap_or(1);
                let rows: u64 = t.dims.iter().skip(1).product();
                Some(TensorSummary { name: t.name, ty: t.ty, cols, n_dims: t.dims.len(), bytes: t.ty.row_bytes(cols)?.checked_mul(rows)? })
            })
            .collect::<Option<Vec<_>>>()?;
        // Each tensor is padded to the default 32-byte alignment in the file.
        let file_bytes = tensors.iter().map(|t| t.bytes.div_ceil(32) * 32).sum();
        Some(Self { shape: ModelShape::of(c, c.n_head_kv), windows: Self::windows_of(c), tensors, file_bytes, experts: Self::experts_of(c) })
    }

    fn experts_of(c: &ModelConfig) -> Option<(usize, usize)> {
        c.moe.map(|m| (m.n_expert, m.n_expert_used))
    }

    /// Each layer's attention window (`usize::MAX`: full causal).
    fn windows_of(c: &ModelConfig) -> Vec<usize> {
        (0..c.n_layer).map(|il| c.window(il)).collect()
    }

    /// Bytes of the KV cache `hearth_model::Context` allocates for this model: every
    /// position of full-attention layers, a ring of `window + n_batch − 1` positions of
    /// sliding-window ones ([`KvLayout`]).
    pub fn kv_cache_bytes(&self, p: PlanParams) -> u64 {
        KvLayout::new(self.windows.iter().copied(), p.n_ctx, p.n_batch, self.shape.kv_dim(), p.cache_type).bytes() as u64
    }

    /// Sum of tensor bytes.
    pub fn weights_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Tensor bytes per type name.
    pub fn weights_by_type(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for t in &self.tensors {
            *m.entry(t.ty.name().to_string()).or_insert(0) += t.bytes;
        }
        m
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorSummary> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The output head: `output.weight`, else the tied `token_embd.weight`.
    fn output(&self) -> Option<&TensorSummary> {
        self.tensor("output.weight").or_else(|| self.tensor("token_embd.weight"))
    }

    /// Bytes one decode step streams: every layer matrix plus the output head
    /// (`Weights::matrix_bytes`); of a mixture of experts' stacked expert tensors
    /// (`ffn_*_exps`, 3-D) only the `n_expert_used` of `n_expert` experts a token is routed
    /// to (the active bytes; [`Self::expert_bytes`] has them all).
    pub fn bytes_per_token(&self) -> u64 {
        let layers: u64 = self.tensors.iter().filter(|t| t.name.starts_with("blk.") && t.n_dims == 2).map(|t| t.bytes).sum();
        let experts = match self.experts {
            Some((n, used)) if n > 0 => (self.expert_bytes() as u128 * used as u128 / n as u128) as u64,
            _ => 0,
        };
        layers + experts + self.output().map_or(0, |t| t.bytes)
    }

    /// Bytes of every layer's stacked expert tensors (0 for a dense model).
    pub fn expert_bytes(&self) -> u64 {
        self.tensors.iter().filter(|t| t.name.starts_with("blk.") && t.n_dims == 3).map(|t| t.bytes).sum()
    }

    /// File bytes resident after a run over `n_ctx` positions: the whole file, less the
    /// part of an untied `token_embd.weight` that at most `n_ctx` row reads, each faulting in
    /// `max(FAULT_AROUND_BYTES, row + 4 KiB)`, cannot reach. A tied embedding is the output
    /// head, read whole every token.
    pub fn resident_file_bytes(&self, n_ctx: usize) -> u64 {
        let (Some(embd), Some(_)) = (self.tensor("token_embd.weight"), self.tensor("output.weight")) else {
            return self.file_bytes;
        };
        let row = embd.ty.row_bytes(embd.cols).unwrap_or(embd.bytes);
        let touched = (n_ctx as u64).saturating_mul(FAULT_AROUND_BYTES.max(row + 4096)).min(embd.bytes);
        self.file_bytes - (embd.bytes - touched).min(self.file_bytes)
    }

    /// Bytes of each sliding-window unit, in forward order: every block's matrices, then
    /// the output head (`hearth_model::unit_ranges` on a real file).
    pub fn unit_bytes(&self) -> Vec<u64> {
        self.units(false)
    }

    /// [`Self::unit_bytes`] with each block's stacked experts (`ffn_*_exps`) left out, as
    /// a window beside an expert cache holds them (the head chunks stay as they are).
    pub fn unit_bytes_without_experts(&self) -> Vec<u64> {
        self.units(true)
    }

    /// Bytes of the largest expert slot: one expert's rows of each `ffn_*_exps` tensor of
    /// a block, each aligned at both ends for `O_DIRECT` (0 for a dense model).
    pub fn expert_slot_bytes(&self) -> u64 {
        let Some((n, _)) = self.experts else { return 0 };
        let mut per: BTreeMap<&str, u64> = BTreeMap::new();
        for t in self.tensors.iter().filter(|t| t.name.contains("_exps")) {
            let block = t.name.split('.').nth(1).unwrap_or("");
            *per.entry(block).or_insert(0) += t.bytes / n.max(1) as u64 + 2 * crate::window::IO_ALIGN as u64;
        }
        per.into_values().max().unwrap_or(0)
    }

    fn units(&self, without_experts: bool) -> Vec<u64> {
        let (mut per, mut whole): (BTreeMap<usize, u64>, BTreeMap<usize, u64>) = Default::default();
        // Norms too: they sit between a block's matrices in the file, inside its byte range.
        for t in &self.tensors {
            if let Some(i) = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok()) {
                *whole.entry(i).or_insert(0) += t.bytes;
                if !(without_experts && t.name.contains("_exps")) {
                    *per.entry(i).or_insert(0) += t.bytes;
                }
            }
        }
        let mut units: Vec<u64> = per.into_values().collect();
        // The head in row chunks no larger than a whole block, as the forward pass cuts it.
        if let Some(h) = self.output() {
            let row = h.ty.row_bytes(h.cols).unwrap_or(h.bytes).max(1);
            let block = whole.into_values().max().unwrap_or(0);
            let chunks = hearth_model::split_rows((h.bytes / row) as usize, h.bytes as usize, block as usize, h.ty.group_rows());
            units.extend(chunks.into_iter().map(|r| r.len() as u64 * row));
        }
        units
    }

    /// Bytes of the largest transformer block.
    pub fn largest_layer_bytes(&self) -> u64 {
        let mut per: BTreeMap<usize, u64> = BTreeMap::new();
        for t in &self.tensors {
            if let Some(i) = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse().ok()) {
                *per.entry(i).or_insert(0) += t.bytes;
            }
        }
        per.values().copied().max().unwrap_or(0)
    }

    /// Largest activation-quantization buffer `matmul` grows to: `n_batch` rows (a
    /// mixture of experts: up to `max(n_batch, n_expert_used)` gathered rows) of
    /// `vec_dot_type(ty)` for a layer matrix's input width, or one row for the output head
    /// (only the last token's logits are computed); each row with the 4-byte block sums
    /// the one-row-per-lane kernels take (`act_block_sums`, every 32 columns), and 64 bytes
    /// of cache-line alignment for the buffer and each distinct input of one call (a MoE
    /// pass gathers one per expert). One call may quantize its input into two forms (a
    /// shared expert's f32 gate logit beside its quantized gate and up), so a row counts
    /// the widest matrix of each activation type.
    fn quant_scratch_bytes(&self, n_batch: usize) -> u64 {
        let arb = |t: &TensorSummary| vec_dot_type(t.ty).row_bytes(t.cols).unwrap_or(0) + 4 * (t.cols / 32);
        let mut widest: BTreeMap<&'static str, u64> = BTreeMap::new();
        // Matrices, and the shared expert's gate, a matrix of one row stored as a vector.
        let multiplied = |t: &&TensorSummary| t.n_dims >= 2 || t.name.ends_with(".ffn_gate_inp_shexp.weight");
        for t in self.tensors.iter().filter(|t| t.name.starts_with("blk.")).filter(multiplied) {
            let w = widest.entry(vec_dot_type(t.ty).name()).or_insert(0);
            *w = (*w).max(arb(t));
        }
        let layers: u64 = widest.values().sum();
        let (rows, inputs) = match self.experts {
            Some((n_expert, k)) => (n_batch.max(k), 1 + n_expert.min(n_batch.max(k))),
            None => (n_batch, 1),
        };
        (rows as u64 * layers).max(self.output().map_or(0, arb)) + 64 * inputs as u64
    }
}

/// Run settings the plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanParams {
    /// Context size (KV positions).
    pub n_ctx: usize,
    /// Batch size (`-b`); clamped to `1..=n_ctx` as `Context::new` does.
    pub n_batch: usize,
    /// Threads.
    pub n_threads: usize,
    /// KV cache element type (`--cache-type`).
    pub cache_type: CacheType,
    /// Logits for every position of a batch (perplexity), not only the last.
    pub logits_all: bool,
}

/// Bytes `Context::new` allocates plus what the first eval grows (logits, quant):
/// `4 · n_batch · (2·n_embd + 2·q_dim + 2·kv_dim + 2·n_ff)` f32 activations,
/// `4 · n_vocab` logits (last token only; `4 · n_ctx · n_vocab` with `logits_all`), the
/// activation-quantization buffer, and
/// per thread an attention accumulator of `head_dim` f16 (f16 cache) or f32 (others).
pub fn scratch_bytes(m: &ModelSummary, p: PlanParams) -> u64 {
    let s = &m.shape;
    let nb = p.n_batch.clamp(1, p.n_ctx.max(1));
    let per_row = 2 * s.n_embd + 2 * s.q_dim() + 2 * s.kv_dim() + 2 * s.n_ff;
    let act = 4 * (nb * per_row) as u64;
    let logits = 4 * s.n_vocab as u64 * if p.logits_all { p.n_ctx.max(1) as u64 } else { 1 };
    let acc = (p.n_threads.max(1) * AttnScratch::bytes(s.head_dim, p.cache_type == CacheType::F16)) as u64;
    // A mixture of experts' pass (`Block::moe_ffn`): router probabilities and sums
    // `[n_batch, n_expert + n_embd]`, and the experts' gathered rows (with a shared
    // expert's wider ones: `ffn_down_shexp`'s columns), as the forward pass sizes them.
    let n_ff_shared = m.tensors.iter().find(|t| t.name.ends_with(".ffn_down_shexp.weight")).map_or(0, |t| t.cols as usize);
    let moe = m.experts.map_or(0, |(n_expert, k)| {
        4 * (nb * (n_expert + s.n_embd) + hearth_model::moe_scratch_len(nb, s.n_embd, s.n_ff, k, n_ff_shared)) as u64
    });
    act + logits + m.quant_scratch_bytes(nb) + acc + moe
}

/// Runtime overhead fit: `OVERHEAD_BASE + OVERHEAD_PER_VOCAB · n_vocab`.
pub fn overhead_bytes(n_vocab: usize) -> u64 {
    OVERHEAD_BASE + OVERHEAD_PER_VOCAB * n_vocab as u64
}

/// The prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Hyperparameters.
    pub shape: ModelShape,
    /// Context size used.
    pub n_ctx: usize,
    /// Batch size used (clamped).
    pub n_batch: usize,
    /// Threads.
    pub n_threads: usize,
    /// KV cache element type (`f32`, `f16`, `q8_0`).
    #[serde(serialize_with = "cache_type_name")]
    pub cache_type: CacheType,
    /// Sum of tensor bytes.
    pub weights_bytes: u64,
    /// Tensor bytes per type.
    pub weights_by_type: BTreeMap<String, u64>,
    /// Mapped file bytes.
    pub file_bytes: u64,
    /// File bytes predicted resident ([`ModelSummary::resident_file_bytes`]).
    pub file_resident_bytes: u64,
    /// KV cache bytes.
    pub kv_cache_bytes: u64,
    /// Compute scratch bytes.
    pub scratch_bytes: u64,
    /// Runtime overhead bytes (fit).
    pub overhead_bytes: u64,
    /// `file_resident_bytes + kv_cache_bytes + scratch_bytes + overhead_bytes`.
    pub peak_rss_bytes: u64,
    /// Memory this process may use (MemAvailable, capped by a cgroup limit).
    pub available_bytes: u64,
    /// `peak_rss_bytes <= available_bytes`.
    pub fits: bool,
    /// `available_bytes - peak_rss_bytes` (negative: the shortfall).
    pub headroom_bytes: i64,
    /// Bytes streamed per decoded token (a mixture of experts: the active bytes, the
    /// routed experts' only).
    pub bytes_per_token: u64,
    /// A mixture of experts: `(n_expert, n_expert_used)`.
    pub experts: Option<(usize, usize)>,
    /// Bytes of all experts (0 for a dense model): a token reads
    /// `n_expert_used / n_expert` of them.
    pub expert_bytes: u64,
    /// Memory read bandwidth used (GB/s).
    pub membw_gbps: f64,
    /// `membw_gbps · 1e9 / bytes_per_token`.
    pub decode_tok_s_bound: f64,
}

/// Predict peak RSS and the decode bound of `m` with `p` on a machine with
/// `available` bytes and `membw_gbps` GB/s of read bandwidth.
pub fn plan(m: &ModelSummary, p: PlanParams, available: u64, membw_gbps: f64) -> Plan {
    let s = m.shape;
    let kv = m.kv_cache_bytes(p);
    let scratch = scratch_bytes(m, p);
    let overhead = overhead_bytes(s.n_vocab);
    let resident = m.resident_file_bytes(p.n_ctx);
    let peak = resident + kv + scratch + overhead;
    let bpt = m.bytes_per_token();
    Plan {
        shape: s,
        n_ctx: p.n_ctx,
        n_batch: p.n_batch.clamp(1, p.n_ctx.max(1)),
        n_threads: p.n_threads,
        cache_type: p.cache_type,
        weights_bytes: m.weights_bytes(),
        weights_by_type: m.weights_by_type(),
        file_bytes: m.file_bytes,
        file_resident_bytes: resident,
        kv_cache_bytes: kv,
        scratch_bytes: scratch,
        overhead_bytes: overhead,
        peak_rss_bytes: peak,
        available_bytes: available,
        fits: peak <= available,
        headroom_bytes: available as i64 - peak as i64,
        bytes_per_token: bpt,
        experts: m.experts,
        expert_bytes: m.expert_bytes(),
        membw_gbps,
        decode_tok_s_bound: if bpt == 0 { 0.0 } else { membw_gbps * 1e9 / bpt as f64 },
    }
}

fn cache_type_name<S: serde::Serializer>(t: &CacheType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(t.name())
}

/// `MemAvailable` from the text of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line["MemAvailable:".len()..].split_whitespace().next()?.parse::<u64>().ok()? * 1024)
}

/// A cgroup limit file's value (`max` or an absurd v1 "unlimited" → `None`).
pub fn parse_cgroup_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

/// Bytes this process can still use: `MemAvailable`, capped by the cgroup's limit minus
/// its current usage (v2 `memory.max`/`memory.current`, v1
/// `memory.limit_in_bytes`/`memory.usage_in_bytes`) where one applies.
pub fn available_bytes() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mem = parse_meminfo_available(&read("/proc/meminfo")?)?;
    let cg = [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ]
    .iter()
    .find_map(|(lim, cur)| {
        let lim = parse_cgroup_limit(&read(lim)?)?;
        let cur = read(cur).and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
        Some(lim.saturating_sub(cur))
    });
    Some(cg.map_or(mem, |c| c.min(mem)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n_ctx: usize, n_batch: usize) -> PlanParams {
        PlanParams { n_ctx, n_batch, n_threads: 2, cache_type: CacheType::F16, logits_all: false }
    }

    #[test]
    fn seven_b_q4_0_matches_the_synth_layout() {
        let m = ModelSummary::from_shape(preset("7b").unwrap(), GgmlType::Q4_0, GgmlType::Q4_0).unwrap();
        // 6.88 B parameters (vocab 49152) at 18 bytes / 32 weights, norms f32:
        // 3,870,310,400 bytes (synth --dry-run file_bytes 3,872,096,864 adds metadata).
        let n_params: u64 = 6_878_924_800;
        assert_eq!(m.tensors.iter().map(|t| t.bytes).sum::<u64>(), m.weights_bytes());
        let matrices = n_params - (2 * 32 + 1) * 4096;
        assert_eq!(m.weights_bytes(), matrices / 32 * 18 + (2 * 32 + 1) * 4096 * 4);
        assert_eq!(m.largest_layer_bytes(), (4 * 4096 * 4096 + 3 * 4096 * 11008) / 32 * 18 + 2 * 4096 * 4);
    }

    #[test]
    fn smollm2_kv_and_scratch() {
        // SmolLM2-135M: 576 wide, 30 layers, 9 heads / 3 KV heads of 64, n_ff 1536.
        let shape = ModelShape { n_embd: 576, n_layer: 30, n_head: 9, n_head_kv: 3, head_dim: 64, n_ff: 1536, n_vocab: 49152 };
        let m = ModelSummary::from_shape(shape, GgmlType::Q4_1, GgmlType::Q4_1).unwrap();
        let pl = plan(&m, p(512, 512), 1 << 40, 10.0);
        assert_eq!(pl.kv_cache_bytes, 11_796_480);
        // 5760 f32 per row; q8_1 rows of 1536 (n_ff) are 48 blocks of 36 bytes and 48 block
        // sums of 4, plus a cache line of alignment; 2 threads' attention scratch (one-row
        // f16 accumulator and the blockwise tile buffers).
        let attn = AttnScratch::bytes(64, true) as u64;
        assert!(attn >= 64 * 2);
        assert_eq!(pl.scratch_bytes, 4 * 512 * 5760 + 4 * 49152 + 512 * 48 * (36 + 4) + 64 + 2 * attn);
        assert!(pl.fits && pl.headroom_bytes > 0);
        // Batch is clamped to the context.
        assert_eq!(plan(&m, p(16, 512), 0, 10.0).n_batch, 16);
        assert!(!plan(&m, p(16, 512), 0, 10.0).fits);
    }

    #[test]
    fn kv_cache_bytes_per_type() {
        let shape = ModelShape { n_embd: 576, n_layer: 30, n_head: 9, n_head_kv: 3, head_dim: 64, n_ff: 1536, n_vocab: 49152 };
        let m = ModelSummary::from_shape(shape, GgmlType::Q4_1, GgmlType::Q4_1).unwrap();
        let base = scratch_bytes(&m, p(512, 512));
        for (ty, kv) in [(CacheType::F32, 23_592_960), (CacheType::F16, 11_796_480), (CacheType::Q8_0, 6_266_880)] {
            let pl = plan(&m, PlanParams { cache_type: ty, ..p(512, 512) }, 1 << 40, 10.0);
            assert_eq!(pl.kv_cache_bytes, kv, "{ty}");
            assert_eq!(pl.kv_cache_bytes, hearth_model::KvCache::bytes_for(30, 512, 192, ty) as u64);
            // Per-thread attention scratch: f16 accumulator and tile buffers with an f16 V
            // cache, an f32 accumulator otherwise.
            let per_thread = |f16| AttnScratch::bytes(64, f16) as u64;
            assert_eq!(pl.scratch_bytes, base - 2 * per_thread(true) + 2 * per_thread(ty == CacheType::F16), "{ty}");
        }
    }

    #[test]
    fn presets_and_parsers() {
        assert!(preset("70b").is_some() && preset("3b").is_none());
        assert_eq!(parse_meminfo_available("MemTotal: 10 kB\nMemAvailable:    2048 kB\n"), Some(2 << 20));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit("1073741824\n"), Some(1 << 30));
        assert!(available_bytes().is_none_or(|b| b > 0));
    }
}

/// Budget held back from the window for what the overhead fit misses (bytes):
/// `WINDOW_MARGIN_BASE + budget / WINDOW_MARGIN_DIV`.
pub const WINDOW_MARGIN_BASE: u64 = 16 << 20;
/// See [`WINDOW_MARGIN_BASE`].
pub const WINDOW_MARGIN_DIV: u64 = 32;

/// A sliding-window run (`--mem-budget`): how many units stay resident and what that
/// costs. Peak RSS = KV cache + scratch + runtime overhead (as in [`Plan`]) + the
/// window's `slots × slot_bytes`; no file pages stay mapped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowPlan {
    /// The budget (bytes).
    pub budget_bytes: u64,
    /// Units (blocks + output head).
    pub n_units: usize,
    /// Units resident at once (the window).
    pub slots: usize,
    /// Of those, units read once and kept (`crate::window::pinned_units`); the others
    /// stream through a ring of `slots - pinned` every token.
    pub pinned: usize,
    /// Bytes of one slot (the largest unit, aligned for `O_DIRECT`).
    pub slot_bytes: u64,
    /// `slots × slot_bytes`.
    pub window_bytes: u64,
    /// KV cache + scratch + runtime overhead.
    pub fixed_bytes: u64,
    /// Held back for error in the overhead fit ([`WINDOW_MARGIN_BASE`]).
    pub margin_bytes: u64,
    /// Predicted peak RSS: `fixed_bytes + window_bytes`.
    pub peak_rss_bytes: u64,
    /// The smallest budget that works: `fixed_bytes + slot_bytes + margin` at that budget.
    pub min_budget_bytes: u64,
    /// Bytes read from disk per decoded token: every unit not pinned (0 when all are).
    pub read_bytes_per_token: u64,
    /// Disk read bandwidth used for the time prediction (GB/s).
    pub disk_gbps: f64,
    /// Predicted seconds per decoded token: `max(read_bytes_per_token / disk, memory-bound
    /// compute time)`, since the loader reads while the forward pass computes.
    pub token_secs: f64,
    /// A mixture of experts beside an expert cache ([`plan_experts`]): its slots, one
    /// expert of one layer each (0: whole layers stream through the window). The units
    /// then hold no experts, and `read_bytes_per_token` counts no expert reads (they
    /// depend on the hit rate).
    pub expert_slots: usize,
    /// Bytes of one expert slot (gate, up and down rows, aligned for `O_DIRECT`).
    pub expert_slot_bytes: u64,
}

impl WindowPlan {
    /// Whether a run under this plan's budget keeps the weights mapped instead of opening
    /// the window, given the mapped run's predicted peak RSS (bytes), and why: when that
    /// peak fits the budget with the margin, or fits it at all while the window would keep
    /// every unit (and no expert cache): reading all the weights into anonymous memory would
    /// save nothing over the mapping's clean file pages, which the kernel can also reclaim.
    pub fn stays_mapped(&self, mapped_peak: u64) -> Option<StaysMapped> {
        if mapped_peak + self.margin_bytes <= self.budget_bytes {
            Some(StaysMapped::FitsWithMargin)
        } else if self.pinned == self.n_units && self.expert_slots == 0 && mapped_peak <= self.budget_bytes {
            Some(StaysMapped::WindowKeepsAll)
        } else {
            None
        }
    }
}

/// Why a run under a memory budget keeps the weights mapped ([`WindowPlan::stays_mapped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaysMapped {
    /// The mapped run's predicted peak RSS plus the margin fits the budget.
    FitsWithMargin,
    /// The mapped peak fits the budget (not its margin), and a window would keep every unit.
    WindowKeepsAll,
}

/// Plan a window for `budget` bytes: `p` gives the fixed terms, `units` the bytes each
/// unit needs in a slot, in forward order (the largest is the slot size).
/// `Err` carries the plan at the smallest workable budget when even one slot does not fit.
pub fn plan_window(p: &Plan, units: &[u64], budget: u64, disk_gbps: f64) -> Result<WindowPlan, Box<WindowPlan>> {
    let n_units = units.len();
    let slot_bytes = units.iter().copied().max().unwrap_or(0);
    let fixed = p.kv_cache_bytes + p.scratch_bytes + p.overhead_bytes;
    let margin = |b: u64| WINDOW_MARGIN_BASE + b / WINDOW_MARGIN_DIV;
    // Smallest b with fixed + slot + margin(b) <= b.
    let need = fixed + slot_bytes + WINDOW_MARGIN_BASE;
    // Least k with (need + k) / DIV <= k (iterating a monotone map from 0 reaches it).
    let mut k = 0;
    while (need + k) / WINDOW_MARGIN_DIV > k {
        k = (need + k) / WINDOW_MARGIN_DIV;
    }
    let min_budget = need + k;
    let free = budget.saturating_sub(fixed + margin(budget));
    let slots = ((free / slot_bytes.max(1)) as usize).min(n_units);
    let make = |slots: usize, budget: u64| {
        let pinned = crate::window::pinned_units(n_units, slots);
        let read: u64 = units[pinned..].iter().sum();
        let compute = if p.membw_gbps > 0.0 { p.bytes_per_token as f64 / (p.membw_gbps * 1e9) } else { 0.0 };
        let io = if disk_gbps > 0.0 { read as f64 / (disk_gbps * 1e9) } else { 0.0 };
        WindowPlan {
            budget_bytes: budget,
            n_units,
            slots,
            pinned,
            slot_bytes,
            window_bytes: slots as u64 * slot_bytes,
            fixed_bytes: fixed,
            margin_bytes: margin(budget),
            peak_rss_bytes: fixed + slots as u64 * slot_bytes,
            min_budget_bytes: min_budget,
            read_bytes_per_token: read,
            disk_gbps,
            token_secs: io.max(compute),
            expert_slots: 0,
            expert_slot_bytes: 0,
        }
    };
    if slots == 0 {
        return Err(Box::new(make(1, min_budget)));
    }
    Ok(make(slots, budget))
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn window_fits_the_budget_or_names_the_minimum() {
        let m = ModelSummary::from_shape(preset("7b").unwrap(), GgmlType::Q4_0, GgmlType::Q6_K).unwrap();
        let units = m.unit_bytes();
        // 32 blocks of 113.2 MB; the Q6_K head (165.2 MB) in two chunks.
        assert_eq!(units.len(), 34);
        assert_eq!(units[32] + units[33], m.tensor("output.weight").unwrap().bytes);
        assert!(units[32] <= units[0]);
        let units: Vec<u64> = units.iter().map(|u| u + 2 * 4096).collect();
        let total: u64 = units.iter().sum();
        let params = PlanParams { n_ctx: 256, n_batch: 64, n_threads: 2, cache_type: CacheType::F16, logits_all: false };
        let p = plan(&m, params, 1 << 40, 20.0);
        for budget in [512u64 << 20, 1 << 30, 2 << 30] {
            let w = plan_window(&p, &units, budget, 2.0).unwrap();
            assert!(w.peak_rss_bytes + w.margin_bytes <= budget, "{w:?}");
            // All but two slots pinned; the rest streamed every token.
            assert!(w.slots >= 2 && w.slots < 34 && w.pinned == w.slots.saturating_sub(2) * (w.slots >= 3) as usize, "{w:?}");
            let streamed: u64 = units[w.pinned..].iter().sum();
            assert!(w.read_bytes_per_token == streamed && (streamed < total || w.pinned == 0));
            assert!((w.token_secs - streamed as f64 / 2e9).abs() < 1e-9);
        }
        let small = plan_window(&p, &units, 200 << 20, 2.0).unwrap_err();
        assert_eq!((small.slots, small.pinned, small.read_bytes_per_token), (1, 0, total));
        // The minimum it names works, and a byte less does not.
        assert_eq!(plan_window(&p, &units, small.min_budget_bytes, 2.0).unwrap().slots, 1);
        assert!(plan_window(&p, &units, small.min_budget_bytes - 1, 2.0).is_err());
        // A budget above the model keeps every unit: nothing is re-read.
        let all = plan_window(&p, &units, 8 << 30, 2.0).unwrap();
        assert_eq!((all.slots, all.read_bytes_per_token), (34, 0));
    }
}

/// A window beside an expert cache (`--mem-budget` on a mixture of experts): `units` are
/// the blocks without their experts and the head chunks (aligned bytes, as for
/// [`plan_window`]), `expert_slot` the bytes of one expert slot, `n_experts` the experts
/// of all layers and `k` the experts one token uses per layer. The non-expert units are
/// all kept when that leaves room for `k` experts (they are read every token, an expert
/// only on a miss), else they stream through a 2-slot ring (1 when only that fits); the
/// rest of the budget is expert slots, at most `n_experts`. The plan's `fixed_bytes` and
/// `peak_rss_bytes` include the expert slots. Err: the smallest plan (one unit slot, `k`
/// expert slots), whose `min_budget_bytes` names the minimum. `disk_gbps` as for [`plan_window`].
pub fn plan_experts(
    p: &Plan,
    units: &[u64],
    expert_slot: u64,
    n_experts: usize,
    k: usize,
    budget: u64,
    disk_gbps: f64,
) -> Result<WindowPlan, Box<WindowPlan>> {
    let slot = units.iter().copied().max().unwrap_or(0);
    let with = |slots: usize| {
        let mut q = p.clone();
        q.overhead_bytes += slots as u64 * expert_slot;
        q
    };
    let free = budget.saturating_sub(p.kv_cache_bytes + p.scratch_bytes + p.overhead_bytes + WINDOW_MARGIN_BASE + budget / WINDOW_MARGIN_DIV);
    let k_bytes = k as u64 * expert_slot;
    let all = units.len() as u64 * slot;
    let ring = if free >= all + k_bytes { all } else if free >= 2 * slot + k_bytes { 2 * slot } else { slot };
    let slots = (free.saturating_sub(ring) / expert_slot.max(1)).min(n_experts as u64) as usize;
    // The smallest plan: one unit slot and `k` expert slots. Its minimum is every
    // plan's `min_budget_bytes`, whatever the budget (a plan at a larger budget counts
    // its own expert slots as fixed, and would name a minimum that grows with it).
    let small = plan_window(&with(k), units, 0, 0.0).unwrap_or_else(|e| *e);
    let min_budget = small.min_budget_bytes;
    let mark = |mut w: WindowPlan, slots: usize| {
        w.expert_slots = slots;
        w.expert_slot_bytes = expert_slot;
        w.min_budget_bytes = min_budget;
        w
    };
    if slots < k {
        return Err(Box::new(mark(small, k)));
    }
    match plan_window(&with(slots), units, budget, disk_gbps) {
        Ok(w) => Ok(mark(w, slots)),
        Err(w) => Err(Box::new(mark(*w, k))),
    }
}

#[cfg(test)]
mod expert_tests {
    use super::*;

    #[test]
    fn experts_get_what_the_non_expert_units_leave() {
        let m = ModelSummary::from_shape(preset("7b").unwrap(), GgmlType::Q4_0, GgmlType::Q6_K).unwrap();
        let params = PlanParams { n_ctx: 256, n_batch: 64, n_threads: 2, cache_type: CacheType::F16, logits_all: false };
        let p = plan(&m, params, 1 << 40, 20.0);
        // 4 units of 10 MiB, experts of 2 MiB, 64 of them, 4 per token.
        let (units, es) = (vec![10u64 << 20; 4], 2u64 << 20);
        let fixed = p.kv_cache_bytes + p.scratch_bytes + p.overhead_bytes;
        let budget = fixed + (150 << 20);
        let w = plan_experts(&p, &units, es, 64, 4, budget, 0.0).unwrap();
        assert_eq!((w.slots, w.pinned), (4, 4), "{w:?}");
        assert!(w.expert_slots >= 4 && w.expert_slots < 64, "{w:?}");
        assert!(w.peak_rss_bytes + w.margin_bytes <= budget, "{w:?}");
        assert_eq!(w.peak_rss_bytes, fixed + 40 * (1 << 20) + w.expert_slots as u64 * es);
        // Too small: the error names a minimum that works, and a byte less does not.
        let small = plan_experts(&p, &units, es, 64, 4, fixed, 0.0).unwrap_err();
        assert_eq!(small.expert_slots, 4);
        let ok = plan_experts(&p, &units, es, 64, 4, small.min_budget_bytes, 0.0).unwrap();
        assert_eq!((ok.slots, ok.expert_slots), (1, 4));
        assert!(plan_experts(&p, &units, es, 64, 4, small.min_budget_bytes - 1, 0.0).is_err());
        // A budget above everything keeps every expert.
        let big = plan_experts(&p, &units, es, 64, 4, fixed + (1 << 30), 0.0).unwrap();
        assert_eq!(big.expert_slots, 64);
        // Every plan names the same minimum, whatever its budget and slots.
        for w in [&w, &ok, &big] {
            assert_eq!(w.min_budget_bytes, small.min_budget_bytes, "{w:?}");
        }
    }
}
