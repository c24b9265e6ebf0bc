//! Hyperparameters of a decoder-only transformer, read from GGUF metadata
//! (`{arch}.embedding_length`, `{arch}.block_count`, … as named in ggml's GGUF spec).

use crate::error::{ModelError, Result};
use hearth_gguf::GgufFile;

/// Architectures whose forward pass hearth implements.
pub const SUPPORTED_ARCHS: &[&str] = &["llama"];

/// Shapes and constants of the model. All sizes are element counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// Residual stream width (`n_embd`).
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA: `n_head` is a multiple of it).
    pub n_head_kv: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// FFN hidden width.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding matrix).
    pub n_vocab: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency θ.
    pub rope_freq_base: f32,
    /// Number of leading dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
}

impl ModelConfig {
    /// Read and check the hyperparameters.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f.get_str("general.architecture")?.to_string();
        if !SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(ModelError::UnsupportedArchitecture(arch));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| -> Result<usize> {
            let v = f.get_u64(&key(k))?;
            usize::try_from(v).ok().filter(|&v| v > 0 && v < (1 << 32)).ok_or_else(|| ModelError::BadConfig {
                key: key(k),
                reason: format!("{v} is out of range"),
            })
        };
        let n_embd = int("embedding_length")?;
        let n_head = int("attention.head_count")?;
        let n_head_kv = if f.get(&key("attention.head_count_kv")).is_some() {
            int("attention.head_count_kv")?
        } else {
            n_head
        };
        let head_dim = if f.get(&key("attention.key_length")).is_some() { int("attention.key_length")? } else { n_embd / n_head };
        let n_vocab = match f.get(&key("vocab_size")) {
            Some(_) => int("vocab_size")?,
            None => f.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_dims = if f.get(&key("rope.dimension_count")).is_some() { int("rope.dimension_count")? } else { head_dim };
        let cfg = Self {
            n_embd,
            n_layer: int("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: int("feed_forward_length")?,
            n_vocab,
            n_ctx_train: int("context_length")?,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_freq_base: match f.get(&key("rope.freq_base")) {
                Some(_) => f.get_f32(&key("rope.freq_base"))?,
                None => 10000.0,
            },
            rope_dims,
            arch: arch.clone(),
        };
        let bad = |k: &str, reason: String| Err(ModelError::BadConfig { key: key(k), reason });
        if let Some(t) = f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            if t != "none" {
                return bad("rope.scaling.type", format!("RoPE scaling {t:?} is not supported yet"));
            }
        }
        if !cfg.n_head.is_multiple_of(cfg.n_head_kv) {
            return bad("attention.head_count_kv", format!("{} query heads are not a multiple of {} KV heads", n_head, n_head_kv));
        }
        if cfg.rope_dims > cfg.head_dim || !cfg.rope_dims.is_multiple_of(2) {
            return bad("rope.dimension_count", format!("{} must be even and at most head_dim {}", rope_dims, head_dim));
        }
        if !(cfg.rms_eps.is_finite() && cfg.rms_eps > 0.0) {
            return bad("attention.layer_norm_rms_epsilon", format!("{} is not a positive number", cfg.rms_eps));
        }
        if !(cfg.rope_freq_base.is_finite() && cfg.rope_freq_base > 0.0) {
            return bad("rope.freq_base", format!("{} is not a positive number", cfg.rope_freq_base));
        }
        Ok(cfg)
    }

    /// Query width `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
