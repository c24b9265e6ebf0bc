//! Gemma 3 (Gemma Team, arXiv 2503.19786): embeddings scaled by √n_embd; RMSNorm
//! before *and after* attention and the FFN (the GGUF converter has already added
//! Gemma's `1 +` to the norm weights); per-head Q/K RMSNorm; RoPE on NeoX halves; Q
//! scaled by `1/√head_dim` before attention (by `1/√(n_embd/n_head)` in the 27B); a
//! GELU-gated FFN; five sliding-window ("local") layers, with their own RoPE base, to
//! each global one (§2, "5:1 interleaving"). Hyperparameters as llama.cpp's
//! `llama_model_gemma3::load_arch_hparams` reads them.

use super::{Holds, LayerTensor, Mat, Vector};
use crate::block::{Acts, Block};
use crate::config::{Keys, ModelConfig};
use crate::error::{ModelError, Result};
use crate::weights::LayerWeights;
use hearth_gguf::GgufFile;
use hearth_kernels::ops;

pub(crate) const TENSORS: [LayerTensor; 13] = [
    LayerTensor::required("attn_norm.weight", Holds::Vector(Vector::AttnNorm)),
    LayerTensor::required("attn_q.weight", Holds::Matrix(Mat::Q)),
    LayerTensor::required("attn_k.weight", Holds::Matrix(Mat::K)),
    LayerTensor::required("attn_v.weight", Holds::Matrix(Mat::V)),
    LayerTensor::required("attn_q_norm.weight", Holds::Vector(Vector::QNorm)),
    LayerTensor::required("attn_k_norm.weight", Holds::Vector(Vector::KNorm)),
    LayerTensor::required("attn_output.weight", Holds::Matrix(Mat::O)),
    LayerTensor::required("post_attention_norm.weight", Holds::Vector(Vector::PostAttnNorm)),
    LayerTensor::required("ffn_norm.weight", Holds::Vector(Vector::FfnNorm)),
    LayerTensor::required("ffn_gate.weight", Holds::Matrix(Mat::Gate)),
    LayerTensor::required("ffn_up.weight", Holds::Matrix(Mat::Up)),
    LayerTensor::required("ffn_down.weight", Holds::Matrix(Mat::Down)),
    LayerTensor::required("post_ffw_norm.weight", Holds::Vector(Vector::PostFfnNorm)),
];

/// Gemma's turn format, for files that carry no `tokenizer.chat_template` (the 270M
/// one does not): what llama.cpp's built-in `gemma` template renders — a system message
/// is folded into the first user turn, the assistant is `model`, `<bos>` comes from the
/// tokenizer (`add_bos_token`), not from the template.
pub(crate) const CHAT_TEMPLATE: &str = "{%- if messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] + '\n\n' -%}{%- set msgs = messages[1:] -%}\
{%- else -%}{%- set sys = '' -%}{%- set msgs = messages -%}{%- endif -%}\
{%- for m in msgs -%}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n\
{{ (sys if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor -%}\
{%- if add_generation_prompt -%}<start_of_turn>model\n{% endif -%}";

/// Every sixth layer is global unless `attention.sliding_window_pattern` says otherwise.
const SWA_PATTERN: usize = 6;

pub(crate) fn hparams(f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
    let k = Keys { f, arch: c.arch.name().to_string() };
    let window = if k.has("attention.sliding_window") { k.int("attention.sliding_window")? } else { 0 };
    if window > 0 {
        if let Some(v) = f.get(&k.key("attention.sliding_window_pattern")) {
            if v.as_int().is_none() {
                return k.bad("attention.sliding_window_pattern", "a per-layer pattern array is not supported".into());
            }
        }
        let n = k.int_or("attention.sliding_window_pattern", SWA_PATTERN)?;
        c.sliding_window = window;
        // llama_hparams::set_swa_pattern: layer il is local unless il % n == n − 1.
        c.swa_layers = (0..c.n_layer).map(|il| il % n < n - 1).collect();
        c.rope_base_swa = k.f32_or("rope.freq_base_swa", 10000.0)?;
    }
    c.logit_softcap = Some(k.f32_or("final_logit_softcapping", 0.0)?).filter(|&v| v != 0.0);
    // llama.cpp picks the 27B's query scale by its layer count (62).
    let q_scale = if c.n_layer == 62 { 1.0 / ((c.n_embd / c.n_head) as f32).sqrt() } else { 1.0 / (c.head_dim as f32).sqrt() };
    c.q_scale = Some(q_scale);
    c.attn_scale = 1.0;
    c.embd_scale = Some((c.n_embd as f32).sqrt());
    if c.rope.dims != c.head_dim {
        return Err(ModelError::BadConfig { key: k.key("rope.dimension_count"), reason: "gemma3 rotates whole heads".into() });
    }
    Ok(())
}

pub(crate) fn block(b: &mut Block<'_>, a: &mut Acts<'_>, l: &LayerWeights) -> Result<()> {
    // Attention: q, k, v = rmsnorm(x)·W; q, k normed per head; RoPE (the layer's base);
    // q scaled; x += post_norm(attn·Woᵀ).
    b.norm(a.x, l.v(Vector::AttnNorm), a.xb, "attn_norm");
    b.project(a.xb, [(Mat::Q, &mut *a.q), (Mat::K, &mut *a.k), (Mat::V, &mut *a.v)])?;
    b.norm_inplace(a.q, l.v(Vector::QNorm), "Qcur_normed");
    b.norm_inplace(a.k, l.v(Vector::KNorm), "Kcur_normed");
    b.rope(a.q, a.k);
    b.scale(a.q, b.c.q_scale.unwrap_or(1.0));
    b.attention(a.q, a.k, a.v, a.attn)?;
    b.matmul(Mat::O, a.attn, a.xb)?;
    b.norm_inplace(a.xb, l.v(Vector::PostAttnNorm), "attn_post_norm");
    b.add(a.x, a.xb, b.c.n_embd);
    b.trace("sa_out", a.x);

    // FFN (GEGLU): x += post_norm(W_down · (gelu(W_gate·xb) ⊙ W_up·xb)).
    b.norm(a.x, l.v(Vector::FfnNorm), a.xb, "ffn_norm");
    b.project(a.xb, [(Mat::Gate, &mut *a.gate), (Mat::Up, &mut *a.up)])?;
    b.glu(ops::geglu, a.gate, a.up, a.up.len() / b.n);
    b.trace("ffn_geglu", a.gate);
    b.matmul(Mat::Down, a.gate, a.xb)?;
    b.norm_inplace(a.xb, l.v(Vector::PostFfnNorm), "ffn_post_norm");
    b.add(a.x, a.xb, b.c.n_embd);
    b.trace("l_out", a.x);
    Ok(())
}
