//! [`StreamDecoder`]: turn tokens into text one at a time without ever splitting a
//! UTF-8 character.
//!
//! A character can span several byte tokens (`<0xF0><0x9F><0xA6><0x99>`), so bytes that
//! could still become a valid character are held back until the next token completes or
//! breaks them. Invalid bytes become U+FFFD exactly as [`String::from_utf8_lossy`] would
//! replace them in the whole output, so the concatenated stream equals
//! [`Tokenizer::decode`] of all tokens.

use crate::Tokenizer;

/// Incremental detokenizer over a [`Tokenizer`].
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing pending.
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self { tok, pending: Vec::new() }
    }

    /// Add one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tok.decode_token(id);
        self.push_bytes(piece)
    }

    /// Add raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just validated, so this never falls back.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[valid + bad..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for later.
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: bytes held back are the start of a character that never
    /// completed (a generation cut by its token limit in the middle of one); they are
    /// dropped, not shown as U+FFFD. Returns how many bytes were dropped.
    pub fn finish(&mut self) -> usize {
        let n = self.pending.len();
        self.pending.clear();
        n
    }

    /// The whole text of `ids` as a stream would show it ([`push`](Self::push) each,
    /// then [`finish`](Self::finish)).
    pub fn text_of(tok: &'a Tokenizer, ids: &[u32]) -> String {
        let mut d = Self::new(tok);
        let mut out: String = ids.iter().map(|&id| d.push(id)).collect();
        d.finish();
        out.shrink_to_fit();
        out
    }
}
