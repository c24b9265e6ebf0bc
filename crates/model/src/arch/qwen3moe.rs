//! Qwen3-MoE (Yang et al., arXiv 2505.09388; Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's
//! attention (per-head Q/K RMSNorm, NeoX RoPE, `head_dim` of its own) and a mixture of
//! SwiGLU experts instead of the dense FFN, no shared expert. Each expert is
//! `expert_feed_forward_length` wide (llama.cpp: `n_ff / n_expert_used` when the key is
//! missing). The router as llama.cpp's `llm_build_qwen3moe` calls `build_moe_ffn`:
//! softmax over all experts, top `expert_used_count`, weights renormalised to sum to 1
//! (HF's `norm_topk_prob`; llama.cpp always renormalises for this architecture).

use super::{Holds, LayerTensor, Vector, LLAMA_BLOCK, MOE_FFN};
use crate::config::{Keys, ModelConfig};
use crate::error::Result;
use hearth_gguf::GgufFile;

/// Qwen3's attention tensors and `ffn_norm`, then the router and the stacked experts.
pub(crate) const TENSORS: [LayerTensor; 12] = {
    let (l, m) = (LLAMA_BLOCK, MOE_FFN);
    [
        l[0],
        l[1],
        l[2],
        l[3],
        l[4],
        LayerTensor::required("attn_q_norm.weight", Holds::Vector(Vector::QNorm)),
        LayerTensor::required("attn_k_norm.weight", Holds::Vector(Vector::KNorm)),
        l[5],
        m[0],
        m[1],
        m[2],
        m[3],
    ]
};

pub(crate) fn hparams(f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = Keys { f, arch: "qwen3moe".into() };
    c.moe = Some(super::qwen_experts(&k, c)?);
    Ok(())
}

/// Mixtral's block: llama's attention (with the Q/K norms above) and the experts.
pub(crate) use super::mixtral::block;
