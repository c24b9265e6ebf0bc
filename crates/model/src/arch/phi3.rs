//! Phi-3 (Abdin et al., arXiv 2404.14219): llama's block with Q, K, V fused into one
//! `attn_qkv` matrix and gate/up into one `ffn_up` (gate rows first), RoPE on NeoX
//! halves with LongRoPE factors (`rope_factors_short/long.weight`, the long ones for a
//! context beyond `rope.scaling.original_context_length`), and Q scaled by
//! `1/√head_dim` before attention. llama.cpp disables Phi-3's sliding window (its
//! converters do not describe it reliably), and so does hearth, to give the same results.

use super::{Holds, LayerTensor, Mat, Vector};
use crate::config::ModelConfig;
use crate::error::Result;
use hearth_gguf::GgufFile;

pub(crate) const TENSORS: [LayerTensor; 6] = [
    LayerTensor::required("attn_norm.weight", Holds::Vector(Vector::AttnNorm)),
    LayerTensor::required("attn_qkv.weight", Holds::Fused(&[Mat::Q, Mat::K, Mat::V])),
    LayerTensor::required("attn_output.weight", Holds::Matrix(Mat::O)),
    LayerTensor::required("ffn_norm.weight", Holds::Vector(Vector::FfnNorm)),
    LayerTensor::required("ffn_up.weight", Holds::Fused(&[Mat::Gate, Mat::Up])),
    LayerTensor::required("ffn_down.weight", Holds::Matrix(Mat::Down)),
];

pub(crate) fn hparams(_f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    c.q_scale = Some(1.0 / (c.head_dim as f32).sqrt());
    c.attn_scale = 1.0;
    Ok(())
}

/// llama's block: the biases / Q-K norms / Q scale above are its optional steps.
pub(crate) use super::llama::block;
