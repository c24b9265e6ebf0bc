//! Model loading and inference errors.

use hearth_quant::GgmlType;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The GGUF file itself is malformed or missing.
    #[error(transparent)]
    Gguf(#[from] hearth_gguf::GgufError),
    /// The tokenizer metadata is unusable.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] hearth_tokenizer::TokenizerError),
    /// `general.architecture` names a model family hearth does not run.
    #[error("unsupported architecture {0:?} (supported: {list}; Mixtral-style files are llama with experts)", list = crate::SUPPORTED_ARCHS.join(", "))]
    UnsupportedArchitecture(String),
    /// A hyperparameter is missing or inconsistent.
    #[error("bad hyperparameter {key}: {reason}")]
    BadConfig {
        /// Metadata key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The file has no tensors at all.
    #[error("the file has no tensors (a vocab-only GGUF?): only `hearth tokenize` can use it")]
    VocabOnly,
    /// The file has a tensor the architecture does not use.
    #[error("tensor {0} is not part of the layout hearth runs for this architecture (wrong block_count, or an unsupported variant)")]
    UnusedTensor(String),
    /// A required tensor is absent.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has the wrong shape.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Shape in the file (ggml order).
        found: Vec<u64>,
        /// Shape the hyperparameters imply.
        expected: Vec<u64>,
    },
    /// A tensor type the kernels cannot compute with.
    #[error("tensor {name} has type {ty}, which hearth cannot compute with yet (supported: {supported})")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Supported list.
        supported: String,
    },
    /// A matrix of a type that stores rows in groups (Q4_0X8, Q4_KX8) where the model needs its
    /// rows one by one (the embedding table) or in other cuts than whole groups.
    #[error("tensor {name} has type {ty}, which stores rows in groups of {group}: {why}")]
    GroupedRows {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Rows per group.
        group: usize,
        /// What the model needs instead.
        why: String,
    },
    /// A kernel rejected its operands (a bug: shapes are validated at load).
    #[error("kernel: {0}")]
    Kernel(#[from] hearth_kernels::KernelError),
    /// The request does not fit the context window.
    #[error("{0}")]
    Context(String),
    /// Invalid input (empty prompt, token id out of range...).
    #[error("{0}")]
    Input(String),
    /// Weights could not be read while running (a truncated or unreadable file under a
    /// sliding window, a unit asked for out of order).
    #[error("reading weights: {0}")]
    Weights(String),
    /// Another device of a tensor-parallel group or pipelined ring failed, or the link to
    /// it broke (the source names the node).
    #[error("across devices: {0}")]
    Collective(#[source] crate::split::CollectiveError),
    /// A NaN or infinity where the forward pass cannot go on (a mixture of experts'
    /// router logits): the message names the layer and tensor.
    #[error("not a finite number: {0}")]
    NotFinite(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, ModelError>;
