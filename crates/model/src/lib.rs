//! Model architectures and the forward pass.
//!
//! - [`Arch`]: the architectures (llama, qwen2, qwen3, gemma3, phi3, qwen3moe, mixtral), each one file under
//!   `arch/` with its hyperparameters, tensor table and block.
//!
//! - [`Model`]: a GGUF file opened for inference (config, tokenizer, weight views).
//! - [`Context`]: one inference stream (KV cache, scratch, thread pool); [`Context::eval`]
//!   runs a batch of tokens and returns logits.
//! - [`sampler`]: greedy / temperature / top-k / top-p / min-p / repeat penalty.
//! - [`speculative`]: drafters (n-gram lookup, a draft model) for
//!   [`generate_speculative`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use hearth_model::{Model, Context, Logits, sampler::argmax};
//! let model = Arc::new(Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf")?);
//! let mut ctx = Context::new(model.clone(), 512, 512, 2)?;
//! let ids = model.tokenizer.encode("The capital of France is", true, true);
//! let next = argmax(ctx.eval(&ids, Logits::Last)?);
//! # Ok::<(), hearth_model::ModelError>(())
//! ```
#![deny(missing_docs)]

mod arch;
mod attn;
mod block;
mod config;
mod context;
pub mod embed;
mod error;
mod experts;
mod kv_cache;
mod model;
mod moe;
mod ring;
mod source;
mod split;
pub mod sampler;
mod weights;
pub mod quantize;

pub use arch::{Arch, Holds, LayerTensor, Mat, Vector, ARCHS};
pub use config::{ModelConfig, Moe, RopeConfig, RopeScaling, MAX_EXPERTS, MAX_LAYERS, SUPPORTED_ARCHS};
pub use context::{Context, ContextBuffers, Logits, Segment};
pub use error::{ModelError, Result};
pub use experts::{expert_ranges, ExpertSource, ExpertStats};
pub use kv_cache::{CacheType, KvCache, KvLayout};
pub use model::Model;
pub use moe::gathered_len as moe_scratch_len;
pub use ring::{RingLink, RingWindows};
pub use source::{split_rows, unit_ranges, unit_ranges_without_experts, LayerSource, SourceStats, Unit};
pub use split::{keys as shard_keys, slice_experts, slice_matrix, Collective, CollectiveError, TensorSplit};
pub use weights::{file_tensors, layer_table, LayerWeights, SharedExpert, TensorRef, Weights, MATMUL_TYPES};
mod generate;
pub use generate::{generate, generate_speculative, generate_with, perplexity, Generation, Perplexity, StopReason, Timings};
pub mod speculative;
