//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B; the Qwen1.5-MoE blog post "Qwen1.5-MoE:
//! Matching 7B Model Performance with 1/3 Activated Parameters", and Qwen2, arXiv
//! 2407.10671): Qwen2's attention (Q/K/V biases, NeoX RoPE) and a mixture of SwiGLU
//! experts with one *shared expert* (the DeepSeekMoE idea, arXiv 2401.06066: an expert
//! every token goes through, so the routed ones need not each relearn what all tokens
//! need).
//!
//! As llama.cpp's `llm_build_qwen2moe` (src/models/qwen2moe.cpp) computes the FFN of a
//! layer from `h = rmsnorm(x)·ffn_norm`:
//! - routed: `build_moe_ffn(…, LLM_FFN_SILU, norm_w = false, …, SOFTMAX)`: softmax over all
//!   `expert_count` experts, the top `expert_used_count`, their probabilities used as they
//!   are (not renormalised, unlike qwen3moe and Mixtral), each expert
//!   `expert_feed_forward_length` wide (`feed_forward_length / expert_used_count` when the
//!   key is missing);
//! - shared: `sigmoid(ffn_gate_inp_shexp · h) · W_down,s · (silu(W_gate,s · h) ⊙ W_up,s · h)`,
//!   a dense SwiGLU FFN `expert_shared_feed_forward_length` wide (`feed_forward_length`
//!   when missing) scaled by one gate logit per token (llama.cpp writes the sigmoid as
//!   `silu(g) / g`), added to the routed sum: `x += routed + shared`.
//!
//! Both halves run in [`crate::Block::moe_ffn`]; this file only says which tensors the
//! layer has and how wide they are.

use super::{Holds, LayerTensor, Mat, LLAMA_BLOCK, MOE_FFN};
use crate::config::{Keys, ModelConfig};
use crate::error::Result;
use hearth_gguf::GgufFile;

/// Qwen2's attention tensors (optional biases) and `ffn_norm`, the router, the shared
/// expert, then the stacked routed experts. The shared expert sits before the stacked
/// experts so that a block without its routed experts (the unit a window holds beside an
/// expert cache, `unit_ranges_without_experts`) is still one stretch of the file.
pub(crate) const TENSORS: [LayerTensor; 17] = {
    let (q, m) = (super::qwen2::TENSORS, MOE_FFN);
    [
        q[0],
        q[1],
        q[2],
        q[3],
        q[4],
        q[5],
        q[6],
        q[7],
        LLAMA_BLOCK[5],
        m[0],
        LayerTensor::required("ffn_gate_inp_shexp.weight", Holds::SharedGate),
        LayerTensor::required("ffn_gate_shexp.weight", Holds::Shared(Mat::Gate)),
        LayerTensor::required("ffn_down_shexp.weight", Holds::Shared(Mat::Down)),
        LayerTensor::required("ffn_up_shexp.weight", Holds::Shared(Mat::Up)),
        m[1],
        m[2],
        m[3],
    ]
};

pub(crate) fn hparams(f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = Keys { f, arch: "qwen2moe".into() };
    // llama.cpp's default: the dense `feed_forward_length` (read before `qwen_experts`
    // sets `n_ff` to the routed experts' width).
    let n_ff_shared = k.int_or("expert_shared_feed_forward_length", c.n_ff)?;
    let moe = super::qwen_experts(&k, c)?;
    c.moe = Some(crate::config::Moe { norm_weights: false, n_ff_shared, ..moe });
    Ok(())
}

/// Mixtral's block: llama's attention (with the biases above) and the experts, the shared
/// one included.
pub(crate) use super::mixtral::block;
