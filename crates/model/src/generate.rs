//! Text generation: prefill the prompt, then sample one token per decode step,
//! streaming each token to a callback. Also llama.cpp-compatible perplexity.

use crate::context::{Context, Logits};
use crate::error::{ModelError, Result};
use crate::sampler::{Sampler, SamplerConfig};
use crate::source::SourceStats;
use crate::speculative::{SpecStats, Speculation};
use std::time::Instant;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were generated.
    Length,
    /// The KV cache is full.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

/// Timings of one generation, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Time to evaluate the prompt (prefill).
    pub prefill_ms: f64,
    /// Time to first token: prefill plus sampling the first token.
    pub ttft_ms: f64,
    /// Tokens produced by decode steps: all but the first (which the prompt's pass gives).
    /// Without speculation one per forward pass after the prompt.
    pub decode_tokens: usize,
    /// Time spent in decode steps (with speculation: drafting and checking the guesses).
    pub decode_ms: f64,
    /// Weight I/O during prefill, when weights come through a [`crate::LayerSource`].
    pub prefill_io: SourceStats,
    /// Weight I/O during the decode steps (includes the loader's read-ahead).
    pub decode_io: SourceStats,
}

impl Timings {
    /// Prefill throughput, tokens/s.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_ms)
    }

    /// Decode throughput, tokens/s.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 { n as f64 * 1000.0 / ms } else { 0.0 }
}

/// Result of [`generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated token ids (including a final end-of-generation token, if one was produced).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Timings.
    pub timings: Timings,
    /// What speculative decoding did, when it ran ([`generate_speculative`]).
    pub speculative: Option<SpecStats>,
}

/// Evaluate `prompt` (appended to whatever `ctx` already holds) and generate up to
/// `max_tokens` tokens. `on_token(id)` is called for each new token; returning `false`
/// stops generation.
pub fn generate(
    ctx: &mut Context,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &SamplerConfig,
    on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    generate_with(ctx, prompt, max_tokens, sampler, true, on_token)
}

/// [`generate`], optionally going on past end-of-generation tokens (`stop_at_eog = false`,
/// llama.cpp's `--ignore-eos`, for benchmarks that need a fixed number of tokens).
pub fn generate_with(
    ctx: &mut Context,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &SamplerConfig,
    stop_at_eog: bool,
    on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    generate_speculative(ctx, prompt, max_tokens, sampler, stop_at_eog, None, on_token)
}

/// [`generate_with`], with speculative decoding when `spec` is given: each decode pass
/// evaluates the last token and the drafter's guesses after it as one batch, and keeps
/// the guesses the sampler would have produced itself ([`crate::speculative`] says why
/// the tokens are exactly those of plain decoding). The KV cache is rolled back over the
/// guesses that were not taken (on tensor-parallel workers and ring devices too: a pass
/// tells them its first position and they forget what lies past it).
pub fn generate_speculative(
    ctx: &mut Context,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &SamplerConfig,
    stop_at_eog: bool,
    mut spec: Option<&mut Speculation>,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(ModelError::Input("the prompt is empty: nothing to condition on".into()));
    }
    let model = ctx.model().clone();
    let n_vocab = model.config.n_vocab;
    let mut sampler = Sampler::new(sampler.clone());
    let base = ctx.n_past();
    let mut history: Vec<u32> = prompt.to_vec();
    let mut out = Vec::new();
    let mut t = Timings { prompt_tokens: prompt.len(), ..Default::default() };
    let mut stats = SpecStats::default();

    let io0 = ctx.source_stats().unwrap_or_default();
    let start = Instant::now();
    let mut io1 = None;
    // The next pass: `batch` (the prompt, then the last token and its guesses), whose
    // last `drafted` tokens are guesses.
    let mut batch: Vec<u32> = prompt.to_vec();
    let mut drafted = 0;
    let mut pass_start = start;
    let stop = loop {
        let which = if drafted > 0 { Logits::All } else { Logits::Last };
        let logits = ctx.eval(&batch, which)?;
        if out.is_empty() {
            t.prefill_ms = ms(start);
        }
        if max_tokens == 0 {
            break StopReason::Length; // the prompt is evaluated, nothing sampled
        }
        // One row per token from the last non-guess on: row i predicts the token after it.
        let rows = &logits[if drafted > 0 { (batch.len() - 1 - drafted) * n_vocab } else { 0 }..];
        let guesses = &batch[batch.len() - drafted..];
        let mut stop = None;
        let mut taken = 0;
        for (i, row) in rows.chunks_exact(n_vocab).enumerate() {
            let id = sampler.sample(row, &history);
            if out.is_empty() {
                t.ttft_ms = ms(start);
            }
            out.push(id);
            history.push(id);
            let guessed = i < drafted && id == guesses[i];
            stats.accepted += guessed as usize;
            taken += guessed as usize;
            if !on_token(id) {
                stop = Some(StopReason::Cancelled);
            } else if stop_at_eog && model.tokenizer.is_eog(id) {
                stop = Some(StopReason::EndOfGeneration);
            } else if out.len() == max_tokens {
                stop = Some(StopReason::Length);
            }
            if stop.is_some() || !guessed {
                break;
            }
        }
        if let (Some(sp), true) = (spec.as_deref_mut(), drafted > 0) {
            sp.len.record(drafted, taken, sp.max);
        }
        if pass_start != start {
            t.decode_ms += ms(pass_start);
        } else {
            io1 = ctx.source_stats();
        }
        // The cache keeps everything but the last token, which the next pass feeds.
        let keep = base + history.len() - 1;
        if ctx.truncate(keep) != keep {
            return Err(ModelError::Context(format!("the KV cache cannot roll back to position {keep} after a speculative pass")));
        }
        if let Some(s) = stop {
            break s;
        }
        if ctx.n_past() >= ctx.n_ctx() {
            break StopReason::ContextFull;
        }
        pass_start = Instant::now();
        batch.clear();
        batch.push(out[out.len() - 1]);
        drafted = 0;
        if let Some(sp) = spec.as_deref_mut() {
            // No guess past max_tokens, the context or one pass; and under the f32
            // attention threshold, so a pass of guesses computes attention as a decode
            // step does and the logits are plain decoding's bit for bit.
            let room = (sp.len.next(sp.max).max(sp.min))
                .min(max_tokens - out.len() - 1)
                .min(ctx.n_ctx() - ctx.n_past() - 1)
                .min(ctx.n_batch() - 1)
                .min(if ctx.f32_attention_from() > 1 { ctx.f32_attention_from() - 2 } else { usize::MAX });
            if room >= sp.min.max(1) {
                let mut d = sp.drafter.draft(&history, room)?;
                d.truncate(room);
                if d.len() >= sp.min.max(1) {
                    if let Some(&bad) = d.iter().find(|&&id| id as usize >= n_vocab) {
                        return Err(ModelError::Input(format!("the drafter proposed token {bad}, outside the vocabulary ({n_vocab})")));
                    }
                    drafted = d.len();
                    stats.passes += 1;
                    stats.drafted += drafted;
                    batch.extend_from_slice(&d);
                }
            }
        }
    };
    t.decode_tokens = out.len().saturating_sub(1);
    let io2 = ctx.source_stats().unwrap_or_default();
    let io1 = io1.unwrap_or(io2);
    (t.prefill_io, t.decode_io) = (io1.since(&io0), io2.since(&io1));
    Ok(Generation { tokens: out, stop, timings: t, speculative: spec.map(|_| stats) })
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Perplexity result.
#[derive(Debug, Clone)]
pub struct Perplexity {
    /// Final estimate exp(mean NLL).
    pub ppl: f64,
    /// Running estimate after each chunk.
    pub running: Vec<f64>,
    /// Tokens scored.
    pub scored: usize,
}

/// Perplexity exactly as llama.cpp's `llama-perplexity` computes it: cut `tokens` into
/// `len / n_ctx` non-overlapping chunks of `n_ctx` tokens, put BOS first in each chunk
/// when the model adds BOS, evaluate each chunk from an empty cache and score the
/// predictions for positions `n_ctx/2 .. n_ctx-1` (the second half, which has at least
/// half a window of context). `on_chunk(i, running_ppl)` reports progress.
pub fn perplexity(ctx: &mut Context, tokens: &[u32], mut on_chunk: impl FnMut(usize, f64)) -> Result<Perplexity> {
    let n_ctx = ctx.n_ctx();
    if n_ctx < 4 {
        return Err(ModelError::Context(format!("perplexity needs a context of at least 4 tokens, got {n_ctx}")));
    }
    let n_chunks = tokens.len() / n_ctx;
    if n_chunks == 0 {
        return Err(ModelError::Input(format!(
            "the text has {} tokens, fewer than one chunk of {n_ctx} (lower --ctx-size)",
            tokens.len()
        )));
    }
    let model = ctx.model().clone();
    let bos = if model.tokenizer.add_bos() { model.tokenizer.bos() } else { None };
    let n_vocab = model.config.n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    let mut chunk = vec![0u32; n_ctx];
    for i in 0..n_chunks {
        let start = i * n_ctx;
        chunk.copy_from_slice(&tokens[start..start + n_ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        ctx.truncate(0);
        let logits = ctx.eval(&chunk, Logits::All)?;
        for j in first..n_ctx - 1 {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            nll -= log_softmax_at(row, tokens[start + j + 1] as usize);
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(i, ppl);
    }
    Ok(Perplexity { ppl: *running.last().unwrap_or(&f64::NAN), running, scored: count })
}

/// log softmax(logits)[idx], accumulated in f64.
fn log_softmax_at(logits: &[f32], idx: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (logits[idx] - max) as f64 - sum.ln()
}
