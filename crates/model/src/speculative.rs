//! Speculative decoding: a cheap drafter guesses the next tokens and the model checks
//! them all in one forward pass (Leviathan et al. 2023, "Fast Inference from Transformers
//! via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model
//! Decoding with Speculative Sampling"). Decode streams every weight once per pass
//! whatever the batch holds, and on a cluster pays its round trips once per pass, so a
//! pass over `1 + k` tokens costs about one token's; each accepted guess is a token for
//! free.
//!
//! The drafters here propose deterministically — n-gram lookup in the history
//! ([`NgramDraft`]) or a small model's greedy continuation ([`ModelDraft`]) — so the draft
//! distribution `q` is a point mass on the guess `d`. The standard rule then accepts `d`
//! with probability `min(1, p(d)/q(d)) = p(d)` and otherwise samples from
//! `norm(max(0, p − q))`, which is `p` without `d`. [`crate::generate_speculative`]
//! realises exactly that rule by coupling: it draws the token `t ~ p` the way
//! non-speculative decoding would (same sampler, same random stream, same history) and
//! accepts the guess iff `t = d`; `t` is the output either way. So the output
//! distribution is unchanged, and with a seed the tokens are the very ones plain decoding
//! gives (greedy: the argmax, guess or not), because the logits of a token do not depend
//! on how many tokens share its pass (the model's batch invariance).

use crate::context::{Context, Logits};
use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::sampler::argmax;

/// Something that guesses how a token sequence goes on.
pub trait Drafter: Send {
    /// Up to `max` tokens that may follow `history` (the prompt and the tokens generated
    /// so far, oldest first); fewer, or none, when it has no good guess.
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>>;
}

/// Prompt-lookup drafting (no second model): find the most recent earlier occurrence of
/// the history's last `n` tokens (`n` from `n_max` down to `n_min`) and propose what
/// followed it. Strong where the output repeats its input: code editing, summaries,
/// retrieval-augmented answers.
#[derive(Debug, Clone, Copy)]
pub struct NgramDraft {
    /// Longest suffix to look up (tried first).
    pub n_max: usize,
    /// Shortest suffix to look up (at least 1).
    pub n_min: usize,
}

impl Default for NgramDraft {
    /// Suffixes of 4 down to 2 tokens: one token alone matches too often to guess well.
    fn default() -> Self {
        NgramDraft { n_max: 4, n_min: 2 }
    }
}

impl NgramDraft {
    /// Up to `max` tokens that followed the latest earlier occurrence of `history`'s
    /// last `n_max..=n_min` tokens (longest first); none when no suffix recurs.
    pub fn lookup(&self, history: &[u32], max: usize) -> Vec<u32> {
        let len = history.len();
        for n in (self.n_min.max(1)..=self.n_max).rev() {
            if len <= n || max == 0 {
                continue;
            }
            let tail = &history[len - n..];
            // Most recent first: what was said last is the likeliest to be said again.
            if let Some(j) = (0..len - n).rev().find(|&j| &history[j..j + n] == tail) {
                let from = j + n;
                return history[from..len.min(from + max)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDraft {
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>> {
        Ok(self.lookup(history, max))
    }
}

/// Drafting with a smaller model of the same vocabulary (e.g. a 0.5B for a 7B of the same
/// family), run on this machine: its greedy continuation of the history. It keeps its own
/// KV cache in step with the history, evaluating only what changed since the last draft.
pub struct ModelDraft {
    ctx: Context,
    /// The tokens the draft context holds, from position 0.
    cached: Vec<u32>,
}

impl ModelDraft {
    /// Draft with `ctx` (a fresh context of the draft model) for `target`: refused unless
    /// both have the same vocabulary (size and every token's text), since draft tokens
    /// are fed to the target by id.
    pub fn new(mut ctx: Context, target: &Model) -> Result<Self> {
        same_vocabulary(ctx.model(), target)?;
        ctx.truncate(0);
        Ok(ModelDraft { ctx, cached: Vec::new() })
    }

    /// The draft model's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drafter for ModelDraft {
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>> {
        if history.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        // Keep what the cache shares with the history, but evaluate at least the last token
        // (its logits start the draft).
        let same = self.cached.iter().zip(history).take_while(|(a, b)| a == b).count();
        let keep = self.ctx.truncate(same.min(history.len() - 1));
        self.cached.truncate(keep);
        let room = self.ctx.n_ctx().saturating_sub(keep);
        if history.len() - keep > room {
            return Ok(Vec::new()); // the history no longer fits the draft's context
        }
        let mut next = argmax(self.ctx.eval(&history[keep..], Logits::Last)?);
        self.cached.extend_from_slice(&history[keep..]);
        let mut out = vec![next];
        while out.len() < max && self.ctx.n_past() < self.ctx.n_ctx() {
            next = argmax(self.ctx.eval(&[next], Logits::Last)?);
            self.cached.push(out[out.len() - 1]);
            out.push(next);
        }
        Ok(out)
    }
}

/// Whether `draft` can draft for `target`: the same vocabulary (size and every token's
/// text), since draft tokens are fed to the target by id.
pub fn same_vocabulary(draft: &Model, target: &Model) -> Result<()> {
    let (d, t) = (&draft.tokenizer, &target.tokenizer);
    if d.n_vocab() != t.n_vocab() || draft.config.n_vocab != target.config.n_vocab {
        return Err(ModelError::Input(format!(
            "the draft model's vocabulary has {} tokens, the model's {}: a draft model must share the model's vocabulary",
            d.n_vocab(),
            t.n_vocab()
        )));
    }
    if let Some(id) = (0..t.n_vocab() as u32).find(|&id| d.token_text(id) != t.token_text(id)) {
        return Err(ModelError::Input(format!(
            "the draft model's token {id} is {:?} where the model's is {:?}: a draft model must share the model's vocabulary",
            d.token_text(id),
            t.token_text(id)
        )));
    }
    Ok(())
}

/// Speculative decoding settings for [`crate::generate_speculative`].
pub struct Speculation {
    /// Where the guesses come from.
    pub drafter: Box<dyn Drafter>,
    /// Most tokens guessed per pass (llama.cpp's `--draft-max`, default 16).
    pub max: usize,
    /// Fewest guesses worth a pass; a shorter draft is dropped and the step decodes one
    /// token plainly (`--draft-min`).
    pub min: usize,
    /// How many to guess next ([`DraftLength`]).
    pub(crate) len: DraftLength,
}

impl Speculation {
    /// `drafter` with llama.cpp's default of at most 16 guesses per pass, at least 1.
    pub fn new(drafter: Box<dyn Drafter>) -> Self {
        Speculation { drafter, max: 16, min: 1, len: DraftLength::default() }
    }
}

/// How many tokens to guess in the next pass, from how the last pass went: after a pass
/// that took every guess, twice as many (up to the maximum); after one that refused a
/// guess, one more than it took. A refused guess costs a row of compute (a pass of
/// `1 + k` tokens reads the weights once but multiplies `1 + k` rows), so a drafter that
/// is often wrong is asked for little, while a copy task's drafts grow to the maximum.
#[derive(Debug, Clone, Copy, Default)]
pub struct DraftLength(Option<usize>);

impl DraftLength {
    /// Guesses for the next pass, at most `max` (the maximum before any pass).
    pub fn next(&self, max: usize) -> usize {
        self.0.unwrap_or(max).clamp(1, max.max(1))
    }

    /// A pass checked `drafted` guesses and took the first `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize, max: usize) {
        let cur = self.next(max);
        self.0 = Some(if accepted >= drafted { (cur * 2).min(max) } else { accepted + 1 });
    }
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Decode passes that carried guesses.
    pub passes: usize,
    /// Tokens guessed (and checked).
    pub drafted: usize,
    /// Guesses that were the model's own next token.
    pub accepted: usize,
}

impl SpecStats {
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_match() {
        let mut d = NgramDraft { n_max: 3, n_min: 1 };
        // "1 2 3" occurs twice before the tail "1 2 3": the later one (followed by 7 8) wins.
        let h = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(d.draft(&h, 2).unwrap(), vec![7, 8]);
        assert_eq!(d.draft(&h, 10).unwrap(), vec![7, 8, 6, 1, 2, 3]);
        assert_eq!(d.draft(&h, 0).unwrap(), Vec::<u32>::new());
        // No 3-gram match: falls back to shorter suffixes, then to nothing.
        assert_eq!(d.draft(&[5, 6, 1, 2, 9, 2], 3).unwrap(), vec![9, 2]);
        assert_eq!(d.draft(&[1, 2, 3], 3).unwrap(), Vec::<u32>::new());
        let mut d2 = NgramDraft { n_max: 3, n_min: 2 };
        assert_eq!(d2.draft(&[5, 6, 1, 2, 9, 2], 3).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn draft_length_grows_with_taken_guesses_and_shrinks_with_refused_ones() {
        let mut l = DraftLength::default();
        assert_eq!(l.next(16), 16);
        l.record(16, 3, 16);
        assert_eq!(l.next(16), 4);
        l.record(4, 4, 16);
        assert_eq!(l.next(16), 8);
        l.record(2, 2, 16); // a short draft, all taken: still grows
        assert_eq!(l.next(16), 16);
        l.record(16, 16, 16);
        assert_eq!(l.next(16), 16);
        l.record(16, 0, 16);
        assert_eq!(l.next(16), 1);
        assert_eq!(l.next(0), 1);
    }
}
