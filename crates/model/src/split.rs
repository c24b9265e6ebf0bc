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
        Self {
            kv_heads: 0..c.n_head_kv,
            ffn_rows: 0..c.n_ff,
            gather_rows: None,
        }
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

    /// Check the ranges against the model, including that the column cuts of every
    /// layer's `attn_output` and `ffn_down` fall on quantization-block boundaries.
    pub fn validate(&self, c: &ModelConfig, w: &crate::Weights) -> Result<()> {
        let bad = |why: String| {
            Err(ModelError::Context(format!(
                "invalid tensor split {self:?}: {why}"
            )))
        };
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
            return Ok(());
        }
        let (q, f) = (self.q_rows(c), self.ffn_rows.clone());
        for l in &w.layers {
            for (t, r) in [(&l.wo, &q), (&l.w_down, &f)] {
                let bs = t.ty.block_size();
                if !r.start.is_multiple_of(bs) || !r.end.is_multiple_of(bs) {
                    return bad(format!(
                        "columns {r:?} of {} are not whole {}-element blocks of {}",
                        t.name,
                        bs,
                        t.ty.name()
                    ));
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
    fn begin_pass(
        &mut self,
        pos0: usize,
        x: &[f32],
        n_tokens: usize,
    ) -> std::result::Result<(), CollectiveError>;
    /// Replace `buf` by the sum of every node's `buf`; every node ends with the same values.
    fn allreduce(&mut self, buf: &mut [f32]) -> std::result::Result<(), CollectiveError>;
}

/// An error from a [`Collective`] (the implementation's error, boxed: e.g.
/// `hearth_parallel::CommError`, which names the failed node).
pub type CollectiveError = Box<dyn std::error::Error + Send + Sync>;
