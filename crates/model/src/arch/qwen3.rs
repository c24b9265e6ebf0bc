//! Qwen3 (Yang et al., arXiv 2505.09388): llama's block without biases, with a
//! per-head RMSNorm of Q and K before RoPE (NeoX halves); `head_dim`
//! (`attention.key_length`) need not be `n_embd / n_head`.

use super::{Holds, LayerTensor, Vector, LLAMA_BLOCK};
use crate::config::ModelConfig;
use crate::error::Result;
use hearth_gguf::GgufFile;

/// llama's tensors and the Q/K norms.
pub(crate) const TENSORS: [LayerTensor; 11] = {
    let l = LLAMA_BLOCK;
    [
        l[0],
        l[1],
        l[2],
        l[3],
        l[4],
        LayerTensor::required("attn_q_norm.weight", Holds::Vector(Vector::QNorm)),
        LayerTensor::required("attn_k_norm.weight", Holds::Vector(Vector::KNorm)),
        l[5],
        l[6],
        l[7],
        l[8],
    ]
};

pub(crate) fn hparams(_f: &GgufFile, _c: &mut ModelConfig) -> Result<()> {
    Ok(())
}

/// llama's block: the biases / Q-K norms / Q scale above are its optional steps.
pub(crate) use super::llama::block;
