//! Tensor parallelism inside the forward pass: which part of every block this node
//! computes ([`TensorSplit`]) and the hook that sums the nodes' partial products
//! ([`Collective`]).
//!
//! Megatron-style (Shoeybi et al., arXiv 1909.08053, §3): `attn_q/k/v` and
//! `ffn_gate/up` are cut by output rows, `attn_output` and `ffn_down` by the matching
//! input columns, so each node's `attn_output` (and `ffn_down`) product is a partial
//! sum of the full `[n_tokens, n_embd]` output, and one allreduce per product gives
//! every node the same residual stream. A node's attention heads are whole KV-head
//! groups with their query heads (GQA), so attention itself needs no communication;
//! its KV cache holds only its own KV heads.
//!
//! **Two schedules.** Summing partial products (above, [`TensorSplit::gather_rows`]
//! `None`) reassociates the `attn_output` and `ffn_down` dot products, so its logits
//! differ from one node's by rounding — and, through the on-the-fly Q8 quantization of
//! activations and the f16 KV cache, which turn a last-bit difference into a whole
//! quantization step now and then, by up to a few tenths of a logit on SmolLM2 Q4_1
//! (F32 weights with an f32 cache: ~1e-7 relative). The *gather* schedule
//! (`gather_rows` = `Some(rows)`) instead gathers the full inputs of those two
//! matrices (each node's attention heads, each node's SwiGLU rows) and has each node
//! compute whole dot products for `rows` of their outputs, gathered again: four
//! exchanges per block instead of two, each exact (every element comes from one node,
//! the others add zeros), so the logits are bit-identical to one node's.
//!
//! The plan (how ranges are chosen, proportional to node speed, on quantization-block
//! boundaries) is `hearth-parallel`'s `ShardPlan`; this module only executes one.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use hearth_gguf::GgufFile;
use std::ops::Range;

/// This node's share of every transformer block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSplit {
    /// KV heads this node owns (a range of `0..n_head_kv`), with their
    /// `n_head / n_head_kv` query heads each. Empty: an FFN-only node.
    pub kv_heads: Range<usize>,
    /// Rows of `ffn_gate`/`ffn_up` (= columns of `ffn_down`), a range of `0..n_ff`.
    pub ffn_rows: Range<usize>,
    /// The gather schedule (see the module docs): the output rows of `attn_output`
    /// and `ffn_down` this node computes, a range of `0..n_embd`. `None`: partial sums.
    pub gather_rows: Option<Range<usize>>,
}

impl TensorSplit {
    /// The whole model (a single node).
    pub fn whole(c: &ModelConfig) -> Self {
        Self { kv_heads: 0..c.n_head_kv, ffn_rows: 0..c.n_ff, gather_rows: None }
    }

    /// Rows of `attn_q` (= columns of `attn_output`).
    pub fn q_rows(&self, c: &ModelConfig) -> Range<usize> {
        let g = c.n_head / c.n_head_kv * c.head_dim;
        self.kv_heads.start * g..self.kv_heads.end * g
    }

    /// Rows of `attn_k` and `attn_v` (= columns of the KV cache).
    pub fn kv_rows(&self, c: &ModelConfig) -> Range<usize> {
        self.kv_heads.start * c.head_dim..self.kv_heads.end * c.head_dim
    }

    /// Query heads this node computes.
    pub fn n_head(&self, c: &ModelConfig) -> usize {
        self.kv_heads.len() * (c.n_head / c.n_head_kv)
    }

    /// Check the ranges lie within the model's dimensions.
    pub fn check_ranges(&self, c: &ModelConfig) -> Result<()> {
        let bad = |why: String| Err(ModelError::Context(format!("invalid tensor split {self:?}: {why}")));
        if self.kv_heads.start > self.kv_heads.end || self.kv_heads.end > c.n_head_kv {
            return bad(format!("KV heads must lie in 0..{}", c.n_head_kv));
        }
        if self.ffn_rows.start > self.ffn_rows.end || self.ffn_rows.end > c.n_ff {
            return bad(format!("FFN rows must lie in 0..{}", c.n_ff));
        }
        if let Some(r) = &self.gather_rows {
            if r.start > r.end || r.end > c.n_embd {
                return bad(format!("gathered output rows must lie in 0..{}", c.n_embd));
            }
        }
        Ok(())
    }

    /// Check the ranges against the model, including that the column cuts of every
    /// layer's `attn_output` and `ffn_down` fall on quantization-block boundaries.
    pub fn validate(&self, c: &ModelConfig, w: &crate::Weights) -> Result<()> {
        self.check_ranges(c)?;
        // A matrix whose rows are stored in groups (Q4_0X8, Q4_KX8) is cut in whole groups
        // (`slice_matrix`): its row cut must fall on them. (Its column cut is in whole blocks,
        // as a row type's, below.)
        let (shapes, shared) = (self.matrix_shapes(c), self.shared_shapes(c));
        let roles = crate::arch::Mat::ALL.map(|m| m.name()).into_iter().chain(["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]);
        for l in &w.layers {
            let cuts = l.matrices().into_iter().zip(&shapes).chain(l.shared.iter().flat_map(|sh| [&sh.gate, &sh.up, &sh.down].into_iter().zip(&shared)));
            for ((t, (rows, _)), role) in cuts.zip(roles.clone()) {
                let g = t.ty.group_rows();
                if !rows.start.is_multiple_of(g) || !rows.end.is_multiple_of(g) {
                    // (A fused tensor's part, e.g. phi3's attn_qkv: rows of that part.)
                    let part = if t.name.contains(&format!(".{role}.")) { String::new() } else { format!(" of its {role} part") };
                    return Err(ModelError::Context(format!(
                        "tensor parallelism cannot cut {} (type {}, rows stored in groups of {g}) at rows {rows:?}{part}: this split's cuts are not whole groups; run a file of its row type across devices (`hearth quantize IN OUT --type {}` moves the bytes back, losslessly; add --pure if the file was made with it)",
                        t.name,
                        t.ty.name(),
                        t.ty.ungrouped().name().to_ascii_lowercase()
                    )));
                }
            }
        }
        if self.gather_rows.is_some() {
            return Ok(());
        }
        let bad = |why: String| Err(ModelError::Context(format!("invalid tensor split {self:?}: {why}")));
        let (q, f) = (self.q_rows(c), self.ffn_rows.clone());
        let s = self.shared_rows(c);
        for l in &w.layers {
            let shared = l.shared.as_ref().map(|sh| (&sh.down, &s));
            for (t, r) in [(&l.wo, &q), (&l.w_down, &f)].into_iter().chain(shared) {
                let bs = t.ty.block_size();
                if !r.start.is_multiple_of(bs) || !r.end.is_multiple_of(bs) {
                    return bad(format!("columns {r:?} of {} are not whole {}-element blocks of {}", t.name, bs, t.ty.name()));
                }
            }
        }
        Ok(())
    }
}

/// Sums partial products across the nodes of a tensor-parallel group.
///
/// The forward pass calls [`begin_pass`](Self::begin_pass) once per pass with the
/// input embeddings, then [`allreduce`](Self::allreduce) twice per block (after
/// `attn_output`, after `ffn_down`) on a `[n_tokens, n_embd]` buffer.
pub trait Collective: Send {
    /// A pass over `n_tokens` rows of `x: [n_tokens, n_embd]` starts at position `pos0`
    /// (the coordinator sends them to the workers; a worker has already received them).
    fn begin_pass(&mut self, pos0: usize, x: &[f32], n_tokens: usize) -> std::result::Result<(), CollectiveError>;
    /// Replace `buf` by the sum of every node's `buf`; every node ends with the same values.
    fn allreduce(&mut self, buf: &mut [f32]) -> std::result::Result<(), CollectiveError>;
    /// The most `f32` elements one exchange can carry (the forward pass caps its batch
    /// so that `n_tokens × widest row` fits).
    fn max_elements(&self) -> usize {
        usize::MAX
    }
}

/// An error from a [`Collective`] (the implementation's error, boxed: e.g.
/// `hearth_parallel::CommError`, which names the failed node).
pub type CollectiveError = Box<dyn std::error::Error + Send + Sync>;

/// Metadata keys of a *shard file*: a GGUF holding one node's share of every block
/// (the seven matrices already cut to its rows/columns, named as in the full model, and
/// the norm vectors), with the full model's metadata and these keys added. A worker
/// without the model file runs from one (see `hearth_parallel::shard_file`).
pub mod keys {
    /// Hex SHA-256 of the full model file the shard was cut from.
    pub const SOURCE_SHA256: &str = "hearth.shard.source_sha256";
    /// `[start, end]` of [`super::TensorSplit::kv_heads`].
    pub const KV_HEADS: &str = "hearth.shard.kv_heads";
    /// `[start, end]` of [`super::TensorSplit::ffn_rows`].
    pub const FFN_ROWS: &str = "hearth.shard.ffn_rows";
    /// `[start, end]` of [`super::TensorSplit::gather_rows`]; absent for partial sums.
    pub const GATHER_ROWS: &str = "hearth.shard.gather_rows";
}

impl TensorSplit {
    /// The split a shard file holds (`None` for an ordinary model file).
    pub fn from_shard_file(f: &GgufFile) -> Result<Option<Self>> {
        if f.get(keys::KV_HEADS).is_none() {
            return Ok(None);
        }
        let range = |k: &str| -> Result<Range<usize>> {
            let a = f.get_array(k)?;
            let v: Vec<usize> = a.iter().filter_map(|x| x.as_int()).filter_map(|x| usize::try_from(x).ok()).collect();
            match v[..] {
                [s, e] if s <= e => Ok(s..e),
                _ => Err(ModelError::BadConfig { key: k.into(), reason: "expected [start, end]".into() }),
            }
        };
        let gather_rows = if f.get(keys::GATHER_ROWS).is_some() { Some(range(keys::GATHER_ROWS)?) } else { None };
        Ok(Some(Self { kv_heads: range(keys::KV_HEADS)?, ffn_rows: range(keys::FFN_ROWS)?, gather_rows }))
    }

    /// `[rows, cols]` of each block matrix as this node computes with it, in the order
    /// `attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down`.
    pub fn matrix_shapes(&self, c: &ModelConfig) -> [(Range<usize>, Range<usize>); 7] {
        let (q, kv, f) = (self.q_rows(c), self.kv_rows(c), self.ffn_rows.clone());
        let (e, all_q, all_f) = (0..c.n_embd, 0..c.q_dim(), 0..c.n_ff);
        let (wo, down) = match &self.gather_rows {
            Some(r) => ((r.clone(), all_q), (r.clone(), all_f)),
            None => ((e.clone(), q.clone()), (e.clone(), f.clone())),
        };
        [(q, e.clone()), (kv.clone(), e.clone()), (kv, e.clone()), wo, (f.clone(), e.clone()), (f, e), down]
    }

    /// Rows of a mixture of experts' shared expert (`ffn_gate_shexp`/`ffn_up_shexp`, =
    /// columns of `ffn_down_shexp`) this node computes: its share of `0..n_ff` scaled to
    /// `0..n_ff_shared`. When `n_ff_shared` is a multiple of `n_ff` (every Qwen-MoE file:
    /// 4× or 8×) the scaling is exact: the routed rows' boundaries are whole split blocks,
    /// which count the shared down's block too (`hearth_parallel::cluster::model_dims`), so
    /// these are whole blocks of the down's columns as the sum schedule cuts them.
    /// Otherwise each boundary is rounded down to 256 elements when `n_ff_shared` is a
    /// multiple of 256, else 32 when a multiple of 32. The boundary map is monotone with
    /// `n_ff ↦ n_ff_shared`, so the nodes' cuts partition `0..n_ff_shared`, in proportion
    /// to each node's share of the routed experts' rows. Empty without a shared expert.
    pub fn shared_rows(&self, c: &ModelConfig) -> Range<usize> {
        let fs = c.moe.map_or(0, |m| m.n_ff_shared);
        let n_ff = c.n_ff.max(1);
        let align = [256, 32, 1].into_iter().find(|a| fs.is_multiple_of(*a)).unwrap_or(1);
        let at = |b: usize| match b {
            _ if b >= n_ff => fs,
            _ if fs.is_multiple_of(n_ff) => b * (fs / n_ff),
            _ => b * fs / n_ff / align * align,
        };
        at(self.ffn_rows.start)..at(self.ffn_rows.end)
    }

    /// `[rows, cols]` of the shared expert's gate, up and down as this node computes
    /// with them (as [`Self::matrix_shapes`] cuts `ffn_gate`, `ffn_up` and `ffn_down`,
    /// with [`Self::shared_rows`]).
    pub fn shared_shapes(&self, c: &ModelConfig) -> [(Range<usize>, Range<usize>); 3] {
        let (s, e) = (self.shared_rows(c), 0..c.n_embd);
        let all = 0..c.moe.map_or(0, |m| m.n_ff_shared);
        let down = match &self.gather_rows {
            Some(r) => (r.clone(), all),
            None => (e.clone(), s.clone()),
        };
        [(s.clone(), e.clone()), (s, e), down]
    }
}

/// Rows `rows` × columns `cols` of every expert of layer `l`'s stacked matrix `m`
/// (`n_expert` experts), each cut as [`slice_matrix`] cuts it, laid end to end in `out`
/// (whatever it held is replaced): a tensor-parallel node's copy of a mixture of experts'
/// gate, up or down, and the 3-D tensor a shard file stores for it.
pub fn slice_experts(
    file: &GgufFile,
    l: &crate::LayerWeights,
    m: crate::Mat,
    n_expert: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    out: &mut Vec<u8>,
) -> Result<()> {
    out.clear();
    let mut one = Vec::new();
    for e in 0..n_expert {
        slice_matrix(file, &l.expert(m, e, n_expert), rows.clone(), cols.clone(), &mut one)?;
        out.extend_from_slice(&one);
    }
    Ok(())
}

/// Rows `rows` × columns `cols` (whole blocks) of matrix `t` of `file`, as a compact
/// `[rows.len(), cols.len()]` matrix of `t`'s type, read with `pread` a few MiB at a
/// time into `out` (whatever it held is replaced).
///
/// A type that stores rows in groups (Q4_0X8, Q4_KX8: `hearth_quant::interleave`) is cut
/// in whole groups: a group is laid out as one long row whose blocks are the group's
/// blocks of a column range, so the same cut over groups keeps the layout. Errors: rows
/// that are not whole groups.
pub fn slice_matrix(file: &GgufFile, t: &crate::TensorRef, rows: Range<usize>, cols: Range<usize>, out: &mut Vec<u8>) -> Result<()> {
    let g = t.ty.group_rows();
    if !rows.start.is_multiple_of(g) || !rows.end.is_multiple_of(g) {
        return Err(ModelError::Context(format!("rows {rows:?} of {} are not whole groups of {g} ({})", t.name, t.ty.name())));
    }
    // In units of a group of rows (one row for a row type).
    let (bs, ts) = (t.ty.block_size(), t.ty.type_size() * g);
    let (off, len, rb) = (cols.start / bs * ts, cols.len() / bs * ts, t.row_bytes() * g);
    let rows = rows.start / g..rows.end / g;
    out.clear();
    out.resize(rows.len() * len, 0);
    if len == rb {
        file.read_at((t.offset + rows.start * rb) as u64, out)?;
        return Ok(());
    }
    let per = ((4 << 20) / rb.max(1)).max(1);
    let mut buf = vec![0u8; per.min(rows.len()) * rb];
    for (k, r0) in rows.clone().step_by(per).enumerate() {
        let nr = per.min(rows.end - r0);
        file.read_at((t.offset + r0 * rb) as u64, &mut buf[..nr * rb])?;
        for r in 0..nr {
            let dst = (k * per + r) * len;
            out[dst..dst + len].copy_from_slice(&buf[r * rb + off..r * rb + off + len]);
        }
    }
    Ok(())
}
