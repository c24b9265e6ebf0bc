//! Tokenizers built from GGUF metadata that reproduce llama.cpp's token ids exactly.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*` and builds one of two algorithms:
//!
//! - **`gpt2`: byte-level BPE.** Text is split into words by the pre-tokenizer named in
//!   `tokenizer.ggml.pre` (llama.cpp's regex lists, including its hand-written GPT-2 and
//!   Llama 3 scanners and its category-collapsing regex trick, see `pretok.rs`), each word
//!   is mapped byte-by-byte to GPT-2's printable alphabet and merged by merge rank.
//! - **`llama`: SentencePiece BPE.** Spaces become `▁` (plus a leading one when
//!   `add_space_prefix`), adjacent symbols merge by highest token score, and leftovers
//!   fall back to `<0xNN>` byte tokens.
//!
//! Before either runs, special tokens written in the text are cut out (longest first),
//! like llama.cpp's `tokenizer_st_partition`. Decoding is the inverse per token;
//! [`StreamDecoder`] emits text as tokens arrive without splitting UTF-8 characters.
//!
//! Everything llama.cpp derives from token *texts* (end-of-generation set, FIM tokens,
//! Phi-3's `rstrip`) is derived the same way, because GGUF files do not carry it.
//!
//! ```no_run
//! let f = hearth_gguf::GgufFile::open("model.gguf")?;
//! let tok = hearth_tokenizer::Tokenizer::from_gguf(&f)?;
//! let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", true, true);
//! let mut stream = hearth_tokenizer::StreamDecoder::new(&tok);
//! for &id in &ids {
//!     print!("{}", stream.push(id));
//! }
//! stream.finish(); // an incomplete last character is dropped
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod bpe;
mod error;
mod fxhash;
mod pretok;
mod stream;
mod tokenizer;
mod unicode;

pub use error::TokenizerError;
pub use pretok::SUPPORTED_PRE;
pub use stream::StreamDecoder;
pub use tokenizer::{Tokenizer, TokenizerKind};
