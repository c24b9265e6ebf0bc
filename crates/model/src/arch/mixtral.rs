//! Mixtral (Jiang et al., arXiv 2401.04088): llama's block with the FFN replaced by a
//! sparse mixture of SwiGLU experts. The file says `general.architecture = llama` and
//! has `llama.expert_count` > 0 (llama.cpp's `llm_build_llama` takes its MoE branch on
//! `n_expert > 0`); each expert is `feed_forward_length` wide. The router is llama.cpp's
//! `build_moe_ffn(…, LLM_FFN_SILU, norm_w = true, …, SOFTMAX)`: softmax over all
//! experts' logits, the top `expert_used_count`, their probabilities renormalised to sum
//! to 1 — the same weights as Mixtral's "softmax over the top-k logits" (see `crate::moe`).

use super::{LayerTensor, LLAMA_BLOCK, MOE_FFN};
use crate::block::{Acts, Block};
use crate::config::{Keys, ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::weights::LayerWeights;
use crate::Vector;
use hearth_gguf::GgufFile;

/// llama's attention tensors and `ffn_norm`, then the router and the stacked experts.
pub(crate) const TENSORS: [LayerTensor; 10] = {
    let (l, m) = (LLAMA_BLOCK, MOE_FFN);
    [l[0], l[1], l[2], l[3], l[4], l[5], m[0], m[1], m[2], m[3]]
};

pub(crate) fn hparams(f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = Keys { f, arch: "llama".into() };
    c.moe = k.moe()?;
    if c.moe.is_none() {
        return Err(ModelError::BadConfig { key: "llama.expert_count".into(), reason: "a Mixtral-style file needs experts".into() });
    }
    if f.tensor("rope_freqs.weight").is_some() {
        c.rope.scaling = RopeScaling::Factors;
    }
    Ok(())
}

/// llama's attention, then `x += moe(rmsnorm(x)·ffn_norm)` ([`Block::moe_ffn`]).
/// Qwen3-MoE runs it too (its Q/K norms are llama attention's optional step).
pub(crate) fn block(b: &mut Block<'_>, a: &mut Acts<'_>, l: &LayerWeights) -> Result<()> {
    super::llama::attention(b, a, l)?;
    b.norm(a.x, l.v(Vector::FfnNorm), a.xb, "ffn_norm");
    b.moe_ffn(a.xb)?;
    b.add(a.x, a.xb, b.c.n_embd);
    b.trace("l_out", a.x);
    Ok(())
}
