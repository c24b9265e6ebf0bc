//! Llama (Touvron et al., arXiv 2302.13971 and 2307.09288; Llama 3, arXiv 2407.21783):
//! pre-norm blocks of RMSNorm → GQA attention with RoPE on adjacent pairs → residual,
//! RMSNorm → SwiGLU FFN → residual. Mistral, SmolLM, TinyLlama and the DeepSeek-R1 Llama
//! distills are this architecture. Llama 3.1+ files carry `rope_freqs.weight` (RoPE
//! frequency divisors); `rope.scaling.type` linear and yarn are read as for every
//! architecture (see [`crate::ModelConfig`]).

use super::{LayerTensor, Mat, Vector, LLAMA_BLOCK};
use crate::block::{Acts, Block};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::Result;
use crate::weights::LayerWeights;
use hearth_gguf::GgufFile;
use hearth_kernels::ops;

/// Norms and the seven matrices; `attn_output`/`ffn_*` biases are refused (not loaded).
pub(crate) const TENSORS: [LayerTensor; 9] = LLAMA_BLOCK;

pub(crate) fn hparams(f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    if f.tensor("rope_freqs.weight").is_some() {
        c.rope.scaling = RopeScaling::Factors;
    }
    Ok(())
}

/// The llama-family block. Qwen2, Qwen3 and Phi-3 run it too: their differences are
/// in their tensor tables and hyperparameters (a bias, a Q/K norm or a Q scale is applied
/// when the file has it), not in the order of the steps.
pub(crate) fn block(b: &mut Block<'_>, a: &mut Acts<'_>, l: &LayerWeights) -> Result<()> {
    attention(b, a, l)?;

    // FFN (SwiGLU): x += W_down · (silu(W_gate·xb) ⊙ W_up·xb), xb = rmsnorm(x)·ffn_norm.
    b.norm(a.x, l.v(Vector::FfnNorm), a.xb, "ffn_norm");
    b.project(a.xb, [(Mat::Gate, &mut *a.gate), (Mat::Up, &mut *a.up)])?;
    b.glu(ops::swiglu, a.gate, a.up, a.up.len() / b.n);
    b.trace("ffn_swiglu", a.gate);
    b.matmul(Mat::Down, a.gate, a.xb)?;
    b.add(a.x, a.xb, b.c.n_embd);
    b.trace("l_out", a.x);
    Ok(())
}

/// The llama-family attention half of a block: `x += attention(rmsnorm(x)·attn_norm)·Woᵀ`
/// (the mixture-of-experts blocks share it).
pub(crate) fn attention(b: &mut Block<'_>, a: &mut Acts<'_>, l: &LayerWeights) -> Result<()> {
    // Attention: xb = rmsnorm(x)·attn_norm; q, k, v = xb·Wᵀ (+ bias); q, k normed per
    // head (Qwen3); RoPE; q scaled (Phi-3).
    b.norm(a.x, l.v(Vector::AttnNorm), a.xb, "attn_norm");
    b.project(a.xb, [(Mat::Q, &mut *a.q), (Mat::K, &mut *a.k), (Mat::V, &mut *a.v)])?;
    b.bias(Mat::Q, l.opt(Vector::BiasQ), a.q);
    b.bias(Mat::K, l.opt(Vector::BiasK), a.k);
    b.bias(Mat::V, l.opt(Vector::BiasV), a.v);
    if let (Some(qn), Some(kn)) = (l.opt(Vector::QNorm), l.opt(Vector::KNorm)) {
        b.norm_inplace(a.q, qn, "Qcur_normed");
        b.norm_inplace(a.k, kn, "Kcur_normed");
    }
    b.rope(a.q, a.k);
    if let Some(s) = b.c.q_scale {
        b.scale(a.q, s);
    }
    b.attention(a.q, a.k, a.v, a.attn)?;
    // x += attn·Woᵀ
    b.matmul(Mat::O, a.attn, a.xb)?;
    b.add(a.x, a.xb, b.c.n_embd);
    b.trace("ffn_inp", a.x);
    Ok(())
}
