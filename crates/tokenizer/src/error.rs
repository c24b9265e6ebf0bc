//! Why a tokenizer could not be built from GGUF metadata.

/// A tokenizer could not be built; each variant names the metadata key or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error("tokenizer.ggml.model = {model:?} is not supported (supported: \"gpt2\" = byte-level BPE, \"llama\" = SentencePiece BPE)")]
    UnsupportedModel {
        /// The value found.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("tokenizer.ggml.pre = {pre:?} is not a known pre-tokenizer (supported: {supported})")]
    UnknownPreTokenizer {
        /// The value found.
        pre: String,
        /// The supported values, comma-separated.
        supported: String,
    },
    /// A metadata key is missing, has the wrong type, or holds an impossible value.
    #[error("metadata key {key}: {reason}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pre-tokenizer regex failed to compile.
    #[error("tokenizer.ggml.pre = {pre:?}: regex {pattern:?} cannot be used: {reason}")]
    Regex {
        /// The pre-tokenizer.
        pre: String,
        /// The regex at fault.
        pattern: String,
        /// The compiler's message.
        reason: String,
    },
}

impl TokenizerError {
    pub(crate) fn meta(key: &str, reason: impl Into<String>) -> Self {
        TokenizerError::Metadata { key: key.to_string(), reason: reason.into() }
    }
}
