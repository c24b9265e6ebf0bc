//! Hyperparameters of a decoder-only transformer, read from GGUF metadata
//! (`{arch}.embedding_length`, `{arch}.block_count`, … as named in ggml's GGUF spec).
//! The keys every architecture shares are read here, RoPE scaling included (as
//! llama.cpp's `llama_model::load_hparams` and `llama_context` derive it); each
//! architecture's file reads its own on top ([`crate::Arch`]).

use crate::arch::Arch;
use crate::error::{ModelError, Result};
use hearth_gguf::GgufFile;
use hearth_kernels::ops::{Rope, RopeLayout};

/// Most layers a model may have (the largest open models have about 130).
pub const MAX_LAYERS: usize = 4096;

/// Architectures whose forward pass hearth implements (`general.architecture`).
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma3", "phi3"];

/// Most experts a mixture-of-experts layer may have (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 1024;

/// A mixture-of-experts FFN (`{arch}.expert_count`, `{arch}.expert_used_count`): each
/// token's FFN is the weighted sum of `n_expert_used` of `n_expert` SwiGLU experts, each
/// [`ModelConfig::n_ff`] wide, chosen by a router (see `crate::moe`), plus, where the
/// architecture has one (Qwen2-MoE), a shared expert every token goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    /// Experts per layer (`1..=MAX_EXPERTS`).
    pub n_expert: usize,
    /// Experts each token uses (`1..=n_expert`).
    pub n_expert_used: usize,
    /// Whether the chosen experts' weights are renormalised to sum to 1 (llama.cpp's
    /// `norm_w`: true for qwen3moe and llama, false for qwen2moe).
    pub norm_weights: bool,
    /// Width of the shared expert (`expert_shared_feed_forward_length`), a SwiGLU FFN
    /// every token goes through beside its routed experts; 0: no shared expert.
    pub n_ff_shared: usize,
}

/// How positions are scaled before RoPE (`{arch}.rope.scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScaling {
    /// Unscaled.
    None,
    /// Position interpolation by `1 / factor` (Chen et al., arXiv 2306.15595).
    Linear,
    /// YaRN (Peng et al., arXiv 2309.00071).
    Yarn,
    /// Per-dimension frequency factors from the file (Llama 3.1's `rope_freqs`,
    /// Phi-3's LongRoPE `rope_factors_short/long`).
    Factors,
}

/// RoPE as the global (non-sliding-window) layers apply it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// Pair layout: llama's adjacent pairs or NeoX halves.
    pub layout: RopeLayout,
    /// Rotated dimensions of each head (`rope.dimension_count`).
    pub dims: usize,
    /// Base θ (`rope.freq_base`, default 10000).
    pub freq_base: f32,
    /// `1 / rope.scaling.factor` (1 unscaled).
    pub freq_scale: f32,
    /// YaRN's extrapolation mix: 1 with YaRN, else 0.
    pub ext_factor: f32,
    /// Scale of cos/sin (YaRN's magnitude correction as llama.cpp cancels it, times
    /// `rope.scaling.attn_factor`).
    pub attn_factor: f32,
    /// `rope.scaling.original_context_length` (default: the training context).
    pub n_ctx_orig: usize,
    /// Which scaling the file asks for (for display; the numbers above are what runs).
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// The kernel's description at base `freq_base`, with per-pair `factors`.
    pub fn kernel<'a>(&self, freq_base: f32, freq_scale: f32, factors: Option<&'a [f32]>) -> Rope<'a> {
        Rope {
            freq_base,
            freq_scale,
            ext_factor: self.ext_factor,
            attn_factor: self.attn_factor,
            n_ctx_orig: self.n_ctx_orig,
            freq_factors: factors,
            ..Rope::plain(self.layout, self.dims, freq_base)
        }
    }
}

/// Shapes and constants of the model. All sizes are element counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: Arch,
    /// Residual stream width (`n_embd`).
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA: `n_head` is a multiple of it).
    pub n_head_kv: usize,
    /// Width of one attention head (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    /// FFN hidden width (a mixture of experts: one expert's, `expert_feed_forward_length`).
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding matrix).
    pub n_vocab: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE of the global layers.
    pub rope: RopeConfig,
    /// RoPE base of the sliding-window layers (Gemma 3's `rope.freq_base_swa`, 10000 by
    /// default); the global base elsewhere.
    pub rope_base_swa: f32,
    /// RoPE frequency scale of the sliding-window layers: 1 (llama.cpp's
    /// `rope_freq_scale_train_swa`; see [`Self::rope_scale`]).
    pub rope_scale_swa: f32,
    /// Sliding window in positions (`attention.sliding_window`); 0 for none.
    pub sliding_window: usize,
    /// Which layers attend through the window (all `false` without one).
    pub swa_layers: Vec<bool>,
    /// Factor of the attention scores (`1/√head_dim`, or 1 where Q is scaled instead).
    pub attn_scale: f32,
    /// Factor applied to Q after RoPE, before attention (Gemma 3, Phi-3), as llama.cpp
    /// does, so the rounding of Q to the KV cache's type is the same.
    pub q_scale: Option<f32>,
    /// Factor of the input embeddings (Gemma: `√n_embd`).
    pub embd_scale: Option<f32>,
    /// `final_logit_softcapping`: logits become `c·tanh(logits / c)`.
    pub logit_softcap: Option<f32>,
    /// The mixture of experts of every layer's FFN (`None`: a dense FFN).
    pub moe: Option<Moe>,
}

impl ModelConfig {
    /// Read and check the hyperparameters.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let name = f.get_str("general.architecture")?.to_string();
        let arch = Arch::from_name(&name).ok_or_else(|| ModelError::UnsupportedArchitecture(name.clone()))?;
        let k = Keys { f, arch: name };
        // A llama file with experts is Mixtral-style (llama.cpp: `n_expert > 0`).
        let arch = if arch == Arch::Llama && k.moe()?.is_some() { Arch::Mixtral } else { arch };
        let n_embd = k.int("embedding_length")?;
        let n_head = k.int("attention.head_count")?;
        let n_head_kv = k.int_or("attention.head_count_kv", n_head)?;
        let head_dim = k.int_or("attention.key_length", n_embd / n_head)?;
        if k.has("attention.value_length") && k.int("attention.value_length")? != head_dim {
            return k.bad("attention.value_length", "a value width other than the key width is not supported".into());
        }
        let n_vocab = match f.get(&k.key("vocab_size")) {
            Some(_) => k.int("vocab_size")?,
            None => f.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let n_layer = k.int("block_count")?;
        // Per-layer tables are allocated from this count before any tensor is looked
        // at: a fuzzed header saying 2,583,691,264 layers asked for 2.6 GB.
        if n_layer > MAX_LAYERS {
            return k.bad("block_count", format!("{n_layer} layers is more than {MAX_LAYERS}: not a real model"));
        }
        let n_ctx_train = k.int("context_length")?;
        let rope = k.rope(head_dim, n_ctx_train, arch)?;
        let mut cfg = Self {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: k.int("feed_forward_length")?,
            n_vocab,
            n_ctx_train,
            rms_eps: f.get_f32(&k.key("attention.layer_norm_rms_epsilon"))?,
            rope_base_swa: rope.freq_base,
            rope_scale_swa: 1.0,
            rope,
            sliding_window: 0,
            swa_layers: vec![false; n_layer],
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            q_scale: None,
            embd_scale: None,
            logit_softcap: None,
            moe: None,
        };
        arch.hparams(f, &mut cfg)?;
        cfg.check(&k)?;
        Ok(cfg)
    }

    /// The configuration a file of architecture `arch` with these dimensions and no
    /// other keys would have (RoPE base 10000, unscaled; Gemma 3: window 512, local base
    /// 10000, global base 1e6): what `hearth synth` writes and the planner assumes for a
    /// named shape.
    #[allow(clippy::too_many_arguments)]
    pub fn for_shape(arch: Arch, n_embd: usize, n_layer: usize, n_head: usize, n_head_kv: usize, head_dim: usize, n_ff: usize, n_vocab: usize) -> Self {
        let layout = arch.rope_layout();
        let gemma = arch == Arch::Gemma3;
        let freq_base = if gemma { 1_000_000.0 } else { 10000.0 };
        let rope = RopeConfig { layout, dims: head_dim, freq_base, freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0, n_ctx_orig: 4096, scaling: RopeScaling::None };
        let q_scale = matches!(arch, Arch::Gemma3 | Arch::Phi3).then(|| 1.0 / (head_dim as f32).sqrt());
        Self {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train: 4096,
            rms_eps: if gemma { 1e-6 } else { 1e-5 },
            rope,
            rope_base_swa: 10000.0,
            rope_scale_swa: 1.0,
            sliding_window: if gemma { 512 } else { 0 },
            swa_layers: (0..n_layer).map(|il| gemma && il % 6 < 5).collect(),
            attn_scale: if q_scale.is_some() { 1.0 } else { 1.0 / (head_dim as f32).sqrt() },
            q_scale,
            embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
            logit_softcap: None,
            moe: None,
        }
    }

    /// The `{arch}.*` metadata that [`Self::from_gguf`] reads back as this configuration
    /// (with `n_vocab` from the tokenizer), as llama.cpp's converter names the keys.
    pub fn to_metadata(&self) -> Vec<(String, hearth_gguf::Value)> {
        use hearth_gguf::Value;
        let a = self.arch.name();
        let k = |s: &str| format!("{a}.{s}");
        let u = |v: usize| Value::U32(v as u32);
        let mut m = vec![
            (k("vocab_size"), u(self.n_vocab)),
            (k("context_length"), u(self.n_ctx_train)),
            (k("embedding_length"), u(self.n_embd)),
            (k("block_count"), u(self.n_layer)),
            (k("feed_forward_length"), u(self.n_ff)),
            (k("rope.dimension_count"), u(self.rope.dims)),
            (k("attention.head_count"), u(self.n_head)),
            (k("attention.head_count_kv"), u(self.n_head_kv)),
            (k("attention.layer_norm_rms_epsilon"), Value::F32(self.rms_eps)),
            (k("rope.freq_base"), Value::F32(self.rope.freq_base)),
        ];
        if self.head_dim != self.n_embd / self.n_head {
            m.push((k("attention.key_length"), u(self.head_dim)));
            m.push((k("attention.value_length"), u(self.head_dim)));
        }
        if self.sliding_window > 0 {
            m.push((k("attention.sliding_window"), u(self.sliding_window)));
            m.push((k("rope.freq_base_swa"), Value::F32(self.rope_base_swa)));
        }
        let scaling = match self.rope.scaling {
            RopeScaling::Linear => Some("linear"),
            RopeScaling::Yarn => Some("yarn"),
            RopeScaling::None | RopeScaling::Factors => None,
        };
        if let Some(t) = scaling {
            m.push((k("rope.scaling.type"), Value::String(t.into())));
            m.push((k("rope.scaling.factor"), Value::F32(1.0 / self.rope.freq_scale)));
            m.push((k("rope.scaling.original_context_length"), u(self.rope.n_ctx_orig)));
        }
        if let Some(moe) = self.moe {
            m.push((k("expert_count"), u(moe.n_expert)));
            m.push((k("expert_used_count"), u(moe.n_expert_used)));
            if self.arch != Arch::Mixtral {
                m.push((k("expert_feed_forward_length"), u(self.n_ff)));
            }
            if moe.n_ff_shared > 0 {
                m.push((k("expert_shared_feed_forward_length"), u(moe.n_ff_shared)));
            }
        }
        m
    }

    fn check(&self, k: &Keys<'_>) -> Result<()> {
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return k.bad("attention.head_count_kv", format!("{} query heads are not a multiple of {} KV heads", self.n_head, self.n_head_kv));
        }
        let r = &self.rope;
        if r.dims > self.head_dim || !r.dims.is_multiple_of(2) {
            return k.bad("rope.dimension_count", format!("{} must be even and at most head_dim {}", r.dims, self.head_dim));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return k.bad("attention.layer_norm_rms_epsilon", format!("{} is not a positive number", self.rms_eps));
        }
        for (key, v) in [("rope.freq_base", r.freq_base), ("rope.freq_base_swa", self.rope_base_swa)] {
            if !(v.is_finite() && v > 0.0) {
                return k.bad(key, format!("{v} is not a positive number"));
            }
        }
        if !(r.freq_scale.is_finite() && r.freq_scale > 0.0 && r.attn_factor.is_finite()) {
            return k.bad("rope.scaling.factor", format!("scale {} / attention factor {} are not usable", r.freq_scale, r.attn_factor));
        }
        if let Some(c) = self.logit_softcap {
            if !(c.is_finite() && c > 0.0) {
                return k.bad("final_logit_softcapping", format!("{c} is not a positive number"));
            }
        }
        Ok(())
    }

    /// Query width `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key/value width `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Layer `il`'s attention window in positions (`usize::MAX`: full causal).
    pub fn window(&self, il: usize) -> usize {
        if self.swa_layers.get(il).copied().unwrap_or(false) && self.sliding_window > 0 {
            self.sliding_window
        } else {
            usize::MAX
        }
    }

    /// Layer `il`'s RoPE base (the sliding-window layers' own, or the global one).
    pub fn rope_base(&self, il: usize) -> f32 {
        if self.window(il) != usize::MAX { self.rope_base_swa } else { self.rope.freq_base }
    }

    /// Layer `il`'s RoPE frequency scale: the model's (`1 / rope.scaling.factor`) on
    /// global layers, [`Self::rope_scale_swa`] (1) on sliding-window ones. Gemma 3 4B–27B scale positions by 8 on
    /// their global layers only (HF's `rope_scaling` with `rope_local_base_freq` unscaled);
    /// llama.cpp's `get_rope_freq_scale` gives window layers `rope_freq_scale_train_swa`,
    /// which stays 1 for gemma3.
    pub fn rope_scale(&self, il: usize) -> f32 {
        if self.window(il) != usize::MAX { self.rope_scale_swa } else { self.rope.freq_scale }
    }
}

/// Typed access to `{arch}.*` keys with the errors naming the key.
pub(crate) struct Keys<'a> {
    pub f: &'a GgufFile,
    pub arch: String,
}

impl Keys<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn has(&self, k: &str) -> bool {
        self.f.get(&self.key(k)).is_some()
    }

    pub fn bad<T>(&self, k: &str, reason: String) -> Result<T> {
        Err(ModelError::BadConfig { key: self.key(k), reason })
    }

    /// A positive integer below 2^32.
    pub fn int(&self, k: &str) -> Result<usize> {
        let v = self.f.get_u64(&self.key(k))?;
        usize::try_from(v).ok().filter(|&v| v > 0 && v < (1 << 32)).ok_or_else(|| ModelError::BadConfig {
            key: self.key(k),
            reason: format!("{v} is out of range"),
        })
    }

    /// The mixture of experts `expert_count` and `expert_used_count` describe, checked
    /// as llama.cpp's `load_hparams` asserts (`1 ≤ used ≤ count ≤ LLAMA_MAX_EXPERTS`);
    /// `None` when the file has no `expert_count` (or 0: a dense model).
    pub fn moe(&self) -> Result<Option<Moe>> {
        let n_expert = if self.has("expert_count") { self.f.get_u64(&self.key("expert_count"))? } else { 0 };
        if n_expert == 0 {
            return Ok(None);
        }
        if n_expert > MAX_EXPERTS as u64 {
            return self.bad("expert_count", format!("{n_expert} experts is more than {MAX_EXPERTS}"));
        }
        let n_expert = n_expert as usize;
        let n_expert_used = self.int("expert_used_count")?;
        if n_expert_used > n_expert {
            return self.bad("expert_used_count", format!("{n_expert_used} experts per token is more than the {n_expert} there are"));
        }
        for key in ["expert_group_count", "expert_shared_count", "expert_weights_scale", "expert_gating_func"] {
            if self.has(key) {
                return self.bad(key, "this mixture-of-experts variant is not supported (issue #21)".into());
            }
        }
        // A shared expert's width: read by qwen2moe, a variant hearth does not run elsewhere.
        if self.arch != "qwen2moe" && self.has("expert_shared_feed_forward_length") {
            let why = "a shared expert in this architecture is not supported (issue #21)";
            return self.bad("expert_shared_feed_forward_length", why.into());
        }
        Ok(Some(Moe { n_expert, n_expert_used, norm_weights: true, n_ff_shared: 0 }))
    }

    pub fn int_or(&self, k: &str, default: usize) -> Result<usize> {
        if self.has(k) { self.int(k) } else { Ok(default) }
    }

    pub fn f32_or(&self, k: &str, default: f32) -> Result<f32> {
        if self.has(k) { Ok(self.f.get_f32(&self.key(k))?) } else { Ok(default) }
    }

    /// RoPE of the global layers: `rope.*` keys as llama.cpp reads them for every
    /// architecture (`llama_model::load_hparams`), and the YaRN factors as
    /// `llama_context` derives them.
    fn rope(&self, head_dim: usize, n_ctx_train: usize, arch: Arch) -> Result<RopeConfig> {
        let layout = arch.rope_layout();
        let dims = self.int_or("rope.dimension_count", head_dim)?;
        let freq_base = self.f32_or("rope.freq_base", 10000.0)?;
        let ty = match self.f.get(&self.key("rope.scaling.type")) {
            None => "linear".to_string(),
            Some(v) => match v.as_str() {
                Some(s) => s.to_string(),
                None => return self.bad("rope.scaling.type", "not a string".into()),
            },
        };
        let factor = if self.has("rope.scaling.factor") { self.f32_or("rope.scaling.factor", 0.0)? } else { self.f32_or("rope.scale_linear", 0.0)? };
        let mut freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        let n_ctx_orig = self.int_or("rope.scaling.original_context_length", n_ctx_train)?;
        let rope_attn_factor = self.f32_or("rope.scaling.attn_factor", 1.0)?;
        let (scaling, ext_factor, mut attn_factor) = match ty.as_str() {
            "none" => {
                freq_scale = 1.0;
                (RopeScaling::None, 0.0, 1.0)
            }
            "linear" => (if freq_scale == 1.0 { RopeScaling::None } else { RopeScaling::Linear }, 0.0, 1.0),
            "yarn" => {
                if self.has("rope.scaling.yarn_log_multiplier") {
                    return self.bad("rope.scaling.yarn_log_multiplier", "YaRN with a log multiplier (DeepSeek V2-style) is not supported".into());
                }
                // llama_context: attn_factor = mscale(factor) / (1 + 0.1·ln factor),
                // which cancels the mscale `rope_yarn` applies.
                let factor = 1.0 / freq_scale;
                let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
                (RopeScaling::Yarn, 1.0, mscale * (1.0 / (1.0 + 0.1 * factor.ln())))
            }
            "longrope" if arch == Arch::Phi3 => (RopeScaling::Factors, 0.0, 1.0),
            other => return self.bad("rope.scaling.type", format!("RoPE scaling {other:?} is not supported (none, linear, yarn)")),
        };
        attn_factor *= rope_attn_factor;
        Ok(RopeConfig { layout, dims, freq_base, freq_scale, ext_factor, attn_factor, n_ctx_orig, scaling })
    }
}
