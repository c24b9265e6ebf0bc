//! Qwen2 / Qwen2.5 (Yang et al., arXiv 2407.10671), and the models built on it (QwQ,
//! the DeepSeek-R1 Qwen distills): llama's block with biases on Q, K and V and RoPE on
//! NeoX halves. The output head is `output.weight` or, in the small models, tied to
//! the embedding.

use super::{Holds, LayerTensor, Vector, LLAMA_BLOCK};
use crate::config::ModelConfig;
use crate::error::Result;
use hearth_gguf::GgufFile;

/// llama's tensors and the three biases.
pub(crate) const TENSORS: [LayerTensor; 12] = {
    let l = LLAMA_BLOCK;
    [
        l[0],
        l[1],
        LayerTensor::optional("attn_q.bias", Holds::Vector(Vector::BiasQ)),
        l[2],
        LayerTensor::optional("attn_k.bias", Holds::Vector(Vector::BiasK)),
        l[3],
        LayerTensor::optional("attn_v.bias", Holds::Vector(Vector::BiasV)),
        l[4],
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
