//! Text generation: prefill the prompt, then sample one token per decode step,
//! streaming each token to a callback. Also llama.cpp-compatible perplexity.

use crate::context::{Context, Logits};
use crate::error::{ModelError, Result};
use crate::sampler::{Sampler, SamplerConfig};
use crate::source::SourceStats;
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
    /// Decode steps (forward passes after the prompt).
    pub decode_tokens: usize,
    /// Time spent in decode steps.
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
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(ModelError::Input("the prompt is empty: nothing to condition on".into()));
    }
    let model = ctx.model().clone();
    let mut sampler = Sampler::new(sampler.clone());
    let mut history: Vec<u32> = prompt.to_vec();
    let mut out = Vec::new();
    let mut t = Timings { prompt_tokens: prompt.len(), ..Default::default() };

    let io0 = ctx.source_stats().unwrap_or_default();
    let start = Instant::now();
    let mut logits = ctx.eval(prompt, Logits::Last)?;
    t.prefill_ms = ms(start);
    let mut io1 = None;
    let mut stop = StopReason::Length;
    while out.len() < max_tokens {
        let id = sampler.sample(logits, &history);
        if out.is_empty() {
            t.ttft_ms = ms(start);
            io1 = ctx.source_stats();
        }
        out.push(id);
        history.push(id);
        if !on_token(id) {
            stop = StopReason::Cancelled;
            break;
        }
        if stop_at_eog && model.tokenizer.is_eog(id) {
            stop = StopReason::EndOfGeneration;
            break;
        }
        if out.len() == max_tokens {
            break;
        }
        if ctx.n_past() >= ctx.n_ctx() {
            stop = StopReason::ContextFull;
            break;
        }
        let step = Instant::now();
        logits = ctx.eval(&[id], Logits::Last)?;
        t.decode_ms += ms(step);
        t.decode_tokens += 1;
    }
    let io2 = ctx.source_stats().unwrap_or_default();
    let io1 = io1.unwrap_or(io2);
    (t.prefill_io, t.decode_io) = (io1.since(&io0), io2.since(&io1));
    Ok(Generation { tokens: out, stop, timings: t })
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
