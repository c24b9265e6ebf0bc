//! The architectures hearth runs. Each is one file that reads top to bottom: its
//! hyperparameters (`hparams`: the GGUF keys beyond the common ones, and the variants it
//! refuses), its tensors (`TENSORS`: names, shapes, which are optional) and its block
//! (`block`: the forward pass of one transformer layer, written against the ops of
//! [`crate::block::Block`]). What is common to every architecture — the embedding, the
//! layers' loop, the output head, tensor parallelism, the pipelined ring and the sliding
//! window — lives outside these files and works for all of them: the schedules enter
//! through `Block::matmul` (a matmul by weight id) and the loop around `block`.
//!
//! The tensor table is the one description of an architecture's weights: the loader
//! ([`crate::Weights::load`]), the planner, the shard cutter and `hearth synth` all read
//! it, so none of them restates tensor names.

use crate::block::{Acts, Block};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::LayerWeights;
use hearth_gguf::GgufFile;

mod gemma3;
mod llama;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;

/// An architecture (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 2/3.x (with `rope_freqs`, linear or YaRN RoPE scaling), Mistral, SmolLM,
    /// TinyLlama, the DeepSeek-R1 Llama distills.
    Llama,
    /// Qwen2 / Qwen2.5, QwQ, the DeepSeek-R1 Qwen distills: Q/K/V biases, NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head Q/K RMSNorm, NeoX RoPE, `head_dim` set on its own.
    Qwen3,
    /// Gemma 3: scaled embeddings, GELU-gated FFN, norms before and after attention and
    /// FFN, Q/K norm, interleaved sliding-window and global layers.
    Gemma3,
    /// Phi-3: fused QKV and gate/up matrices, LongRoPE factors, sliding window.
    Phi3,
    /// Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention, a mixture of
    /// experts with a gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention, a mixture-of-experts FFN.
    Qwen3Moe,
    /// Mixtral: a `llama` file with `llama.expert_count` > 0 (llama's attention, a
    /// mixture-of-experts FFN). Its `general.architecture` is `llama`.
    Mixtral,
}

/// The routed experts of a Qwen-style mixture-of-experts file (`qwen2moe`, `qwen3moe`):
/// `expert_count` and `expert_used_count` (required), and sets `c.n_ff` to each expert's
/// width, `expert_feed_forward_length` (llama.cpp's default when missing: the dense
/// `feed_forward_length / expert_used_count`).
pub(crate) fn qwen_experts(k: &crate::config::Keys<'_>, c: &mut ModelConfig) -> Result<crate::config::Moe> {
    let moe = k
        .moe()?
        .ok_or_else(|| crate::error::ModelError::BadConfig { key: k.key("expert_count"), reason: format!("{} needs experts", k.arch) })?;
    let dense = c.n_ff;
    c.n_ff = k.int_or("expert_feed_forward_length", dense / moe.n_expert_used)?;
    if c.n_ff == 0 {
        return k.bad("feed_forward_length", format!("{dense} over {} experts per token leaves no width", moe.n_expert_used));
    }
    Ok(moe)
}

/// Every architecture, in the order `hearth synth --arch` lists them (the first one of
/// a `general.architecture` name is the one [`Arch::from_name`] gives).
pub const ARCHS: &[Arch] = &[Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Phi3, Arch::Qwen2Moe, Arch::Qwen3Moe, Arch::Mixtral];

/// The seven matrices of a block, by the role they play (the order of
/// [`crate::TensorSplit::matrix_shapes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mat {
    /// `attn_q: [n_head·head_dim, n_embd]`.
    Q = 0,
    /// `attn_k: [n_head_kv·head_dim, n_embd]`.
    K = 1,
    /// `attn_v: [n_head_kv·head_dim, n_embd]`.
    V = 2,
    /// `attn_output: [n_embd, n_head·head_dim]`.
    O = 3,
    /// `ffn_gate: [n_ff, n_embd]`.
    Gate = 4,
    /// `ffn_up: [n_ff, n_embd]`.
    Up = 5,
    /// `ffn_down: [n_embd, n_ff]`.
    Down = 6,
}

impl Mat {
    /// All seven, in index order.
    pub const ALL: [Mat; 7] = [Mat::Q, Mat::K, Mat::V, Mat::O, Mat::Gate, Mat::Up, Mat::Down];

    /// The unfused tensor name (`attn_q`, …): what llama.cpp's converter writes for
    /// llama, and what a shard file holds for every architecture.
    pub fn name(self) -> &'static str {
        ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"][self as usize]
    }

    /// `[rows, cols]` in the whole model.
    pub fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (e, q, kv, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        match self {
            Mat::Q => (q, e),
            Mat::K | Mat::V => (kv, e),
            Mat::O => (e, q),
            Mat::Gate | Mat::Up => (ff, e),
            Mat::Down => (e, ff),
        }
    }

    /// `[rows, cols]` of the shared expert's matrix of this role (gate, up or down), an
    /// FFN of [`crate::Moe::n_ff_shared`] rows.
    pub fn shared_shape(self, c: &ModelConfig) -> (usize, usize) {
        let (e, ff) = (c.n_embd, c.moe.map_or(0, |m| m.n_ff_shared));
        if self == Mat::Down { (e, ff) } else { (ff, e) }
    }
}

/// A per-layer vector (norm weights and biases), converted to f32 at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vector {
    /// RMSNorm before attention, `[n_embd]`.
    AttnNorm,
    /// RMSNorm before the FFN, `[n_embd]`.
    FfnNorm,
    /// Per-head RMSNorm of Q, `[head_dim]`.
    QNorm,
    /// Per-head RMSNorm of K, `[head_dim]`.
    KNorm,
    /// RMSNorm of the attention output, `[n_embd]` (Gemma 3).
    PostAttnNorm,
    /// RMSNorm of the FFN output, `[n_embd]` (Gemma 3).
    PostFfnNorm,
    /// Bias of Q, `[n_head·head_dim]`.
    BiasQ,
    /// Bias of K, `[n_head_kv·head_dim]`.
    BiasK,
    /// Bias of V, `[n_head_kv·head_dim]`.
    BiasV,
}

impl Vector {
    /// Its length.
    pub fn len(self, c: &ModelConfig) -> usize {
        match self {
            Vector::AttnNorm | Vector::FfnNorm | Vector::PostAttnNorm | Vector::PostFfnNorm => c.n_embd,
            Vector::QNorm | Vector::KNorm => c.head_dim,
            Vector::BiasQ => c.q_dim(),
            Vector::BiasK | Vector::BiasV => c.kv_dim(),
        }
    }

    /// Whether it is a norm weight (1.0 in a random-weight file) rather than a bias (0).
    pub fn is_norm(self) -> bool {
        !matches!(self, Vector::BiasQ | Vector::BiasK | Vector::BiasV)
    }
}

/// What one per-layer tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// One matrix.
    Matrix(Mat),
    /// Several matrices stacked by rows, in this order (Phi-3's `attn_qkv`, `ffn_up`).
    Fused(&'static [Mat]),
    /// A vector.
    Vector(Vector),
    /// The router of a mixture of experts, `ffn_gate_inp: [n_expert, n_embd]` (ggml
    /// `[n_embd, n_expert]`).
    Router,
    /// One matrix per expert (gate, up or down, each of an `n_ff`-wide expert), stacked:
    /// ggml `[cols, rows, n_expert]`, so expert `e` is rows `e·rows..(e+1)·rows` of the
    /// tensor read as a `[n_expert·rows, cols]` matrix (`ffn_gate_exps`, …).
    Experts(Mat),
    /// The shared expert's gate input `ffn_gate_inp_shexp: [n_embd]`, the weights of the
    /// one logit whose sigmoid scales the shared expert's output; read as a
    /// `[1, n_embd]` matrix.
    SharedGate,
    /// One matrix of the shared expert (gate, up or down: `ffn_gate_shexp`, …), shaped
    /// as [`Mat::shared_shape`].
    Shared(Mat),
}

/// One per-layer tensor of an architecture: `blk.{i}.{name}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerTensor {
    /// Name after `blk.{i}.`, e.g. `attn_q.weight`.
    pub name: &'static str,
    /// What it holds.
    pub holds: Holds,
    /// Whether a file may leave it out.
    pub optional: bool,
}

impl LayerTensor {
    /// A tensor every file has.
    pub const fn required(name: &'static str, holds: Holds) -> Self {
        Self { name, holds, optional: false }
    }

    /// A tensor a file may leave out.
    pub const fn optional(name: &'static str, holds: Holds) -> Self {
        Self { name, holds, optional: true }
    }

    /// ggml dims (`[cols, rows]` for a matrix, `[len]` for a vector).
    pub fn dims(&self, c: &ModelConfig) -> Vec<u64> {
        match self.holds {
            Holds::Matrix(m) => {
                let (r, k) = m.shape(c);
                vec![k as u64, r as u64]
            }
            Holds::Fused(ms) => {
                let rows: usize = ms.iter().map(|m| m.shape(c).0).sum();
                vec![ms[0].shape(c).1 as u64, rows as u64]
            }
            Holds::Vector(v) => vec![v.len(c) as u64],
            Holds::Router => vec![c.n_embd as u64, n_expert(c)],
            Holds::Experts(m) => {
                let (r, k) = m.shape(c);
                vec![k as u64, r as u64, n_expert(c)]
            }
            Holds::SharedGate => vec![c.n_embd as u64],
            Holds::Shared(m) => {
                let (r, k) = m.shared_shape(c);
                vec![k as u64, r as u64]
            }
        }
    }
}

/// Experts per layer (0 for a dense model).
fn n_expert(c: &ModelConfig) -> u64 {
    c.moe.map_or(0, |m| m.n_expert as u64)
}

/// The mixture-of-experts FFN, after `ffn_norm`: the router and the stacked experts, in
/// the order llama.cpp's converter writes them (Qwen3-MoE, Mixtral).
pub(crate) const MOE_FFN: [LayerTensor; 4] = [
    LayerTensor::required("ffn_gate_inp.weight", Holds::Router),
    LayerTensor::required("ffn_gate_exps.weight", Holds::Experts(Mat::Gate)),
    LayerTensor::required("ffn_down_exps.weight", Holds::Experts(Mat::Down)),
    LayerTensor::required("ffn_up_exps.weight", Holds::Experts(Mat::Up)),
];

/// The seven matrices as separate tensors and the two norms: llama's block.
pub(crate) const LLAMA_BLOCK: [LayerTensor; 9] = [
    LayerTensor::required("attn_norm.weight", Holds::Vector(Vector::AttnNorm)),
    LayerTensor::required("attn_q.weight", Holds::Matrix(Mat::Q)),
    LayerTensor::required("attn_k.weight", Holds::Matrix(Mat::K)),
    LayerTensor::required("attn_v.weight", Holds::Matrix(Mat::V)),
    LayerTensor::required("attn_output.weight", Holds::Matrix(Mat::O)),
    LayerTensor::required("ffn_norm.weight", Holds::Vector(Vector::FfnNorm)),
    LayerTensor::required("ffn_gate.weight", Holds::Matrix(Mat::Gate)),
    LayerTensor::required("ffn_up.weight", Holds::Matrix(Mat::Up)),
    LayerTensor::required("ffn_down.weight", Holds::Matrix(Mat::Down)),
];

/// One layer's forward pass: `a.x: [n_tokens, n_embd]` in, the residual stream after
/// the layer out (`b` holds the layer's weights and the ops).
pub(crate) type BlockFn = fn(&mut Block<'_>, &mut Acts<'_>, &LayerWeights) -> Result<()>;

impl Arch {
    /// The architecture `general.architecture` names, if hearth runs it.
    pub fn from_name(name: &str) -> Option<Self> {
        ARCHS.iter().copied().find(|a| a.name() == name)
    }

    /// Its `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Mixtral => "llama",
        }
    }

    /// Its per-layer tensors, in the order llama.cpp's converter writes them.
    pub fn layer_tensors(self) -> &'static [LayerTensor] {
        match self {
            Arch::Llama => &llama::TENSORS,
            Arch::Qwen2 => &qwen2::TENSORS,
            Arch::Qwen3 => &qwen3::TENSORS,
            Arch::Gemma3 => &gemma3::TENSORS,
            Arch::Phi3 => &phi3::TENSORS,
            Arch::Qwen2Moe => &qwen2moe::TENSORS,
            Arch::Qwen3Moe => &qwen3moe::TENSORS,
            Arch::Mixtral => &mixtral::TENSORS,
        }
    }

    /// Read the hyperparameters this architecture adds to the common ones into `c`,
    /// refusing variants hearth does not run.
    pub(crate) fn hparams(self, f: &GgufFile, c: &mut ModelConfig) -> Result<()> {
        match self {
            Arch::Llama => llama::hparams(f, c),
            Arch::Qwen2 => qwen2::hparams(f, c),
            Arch::Qwen3 => qwen3::hparams(f, c),
            Arch::Gemma3 => gemma3::hparams(f, c),
            Arch::Phi3 => phi3::hparams(f, c),
            Arch::Qwen2Moe => qwen2moe::hparams(f, c),
            Arch::Qwen3Moe => qwen3moe::hparams(f, c),
            Arch::Mixtral => mixtral::hparams(f, c),
        }
    }

    /// How its RoPE pairs dimensions: llama's adjacent pairs, everyone else's NeoX halves.
    pub fn rope_layout(self) -> hearth_kernels::ops::RopeLayout {
        if matches!(self, Arch::Llama | Arch::Mixtral) { hearth_kernels::ops::RopeLayout::Norm } else { hearth_kernels::ops::RopeLayout::Neox }
    }

    /// The chat template to use when a file has none (`None`: no default).
    pub fn default_chat_template(self) -> Option<&'static str> {
        (self == Arch::Gemma3).then_some(gemma3::CHAT_TEMPLATE)
    }

    /// Its block.
    pub(crate) fn block(self) -> BlockFn {
        match self {
            Arch::Llama => llama::block,
            Arch::Qwen2 => qwen2::block,
            Arch::Qwen3 => qwen3::block,
            Arch::Gemma3 => gemma3::block,
            Arch::Phi3 => phi3::block,
            Arch::Qwen2Moe => qwen2moe::block,
            Arch::Qwen3Moe => qwen3moe::block,
            Arch::Mixtral => mixtral::block,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
