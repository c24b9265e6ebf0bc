//! [`Model`]: a GGUF file opened for inference — config, tokenizer, weight references.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::Weights;
use hearth_gguf::GgufFile;
use hearth_tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;

/// A loaded model. Weights stay in the memory-mapped file; this holds only references,
/// the tokenizer and the (tiny) norm vectors.
pub struct Model {
    /// The mapped file.
    pub file: Arc<GgufFile>,
    /// Hyperparameters.
    pub config: ModelConfig,
    /// Tokenizer from the file's metadata (shared with the model a shard was cut from:
    /// [`Self::from_file_with_tokenizer`]).
    pub tokenizer: Arc<Tokenizer>,
    /// Tensor references.
    pub weights: Weights,
    /// For a shard file: the node's share its matrices already are (see
    /// [`crate::split::keys`]); `None` for a model file.
    pub shard: Option<crate::TensorSplit>,
}

impl Model {
    /// Open `path`, check architecture, hyperparameters, tensor shapes and types.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(Arc::new(GgufFile::open(path)?))
    }

    /// Build from an already opened file.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Self> {
        // The config first: its checks (e.g. an absurd layer count) come before any work.
        let config = ModelConfig::from_gguf(&file)?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
        Self::build(file, config, tokenizer)
    }

    /// [`Self::from_file`] with `tokenizer` instead of one built from the file's metadata:
    /// a worker's shard file (which carries its model's metadata) next to the model it was
    /// cut from, so the process holds one tokenizer (on a 49K vocabulary about 17 MiB) and
    /// not two under its memory budget.
    pub fn from_file_with_tokenizer(file: Arc<GgufFile>, tokenizer: Arc<Tokenizer>) -> Result<Self> {
        let config = ModelConfig::from_gguf(&file)?;
        Self::build(file, config, tokenizer)
    }

    fn build(file: Arc<GgufFile>, config: ModelConfig, tokenizer: Arc<Tokenizer>) -> Result<Self> {
        let shard = crate::TensorSplit::from_shard_file(&file)?;
        if let Some(s) = &shard {
            s.check_ranges(&config)?;
        }
        let weights = Weights::load(&file, &config, shard.as_ref())?;
        Ok(Self { file, config, tokenizer, weights, shard })
    }

    /// The chat template stored in the file (`tokenizer.chat_template`), else the
    /// architecture's default ([`crate::Arch::default_chat_template`]), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.file.get("tokenizer.chat_template").and_then(|v| v.as_str()).or(self.config.arch.default_chat_template())
    }

    /// Parameter count (elements of all tensors in the file).
    pub fn n_params(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.n_elements()).sum()
    }
}

