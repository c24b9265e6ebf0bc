//! One request's sequence while it holds a KV cache slot: its tokens, sampler, detokenizer
//! and stop strings, and what each new token sends to the client.

use crate::constraint::Constraint;
use crate::metrics::Metrics;
use crate::stop::StopText;
use hearth_model::sampler::{Sampler, SamplerConfig};
use hearth_model::speculative::{DraftLength, NgramDraft};
use hearth_tokenizer::{StreamDecoder, Tokenizer};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A request for the scheduler.
#[derive(Debug)]
pub struct Job {
    /// Prompt token ids (at least one, fewer than the slot's context).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Stop strings: generation ends before the first match.
    pub stop: Vec<String>,
    /// `Some(k)`: report each token's log-probability and the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Go on past end-of-generation tokens (benchmarks: a fixed number of tokens).
    pub ignore_eos: bool,
    /// Where the sequence's events go; when the receiver is dropped (client gone) the
    /// sequence is cancelled.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (TTFT counts from here, queueing included).
    pub arrived: Instant,
    /// An embedding request: the prompt's final hidden states pooled this way into one
    /// unit vector ([`Event::Embedding`]); nothing is generated.
    pub embed: Option<hearth_model::embed::Pooling>,
    /// A grammar the output must follow (`response_format`, tool calls).
    pub constraint: Option<Constraint>,
}

/// Why a sequence ended, as OpenAI's `finish_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the slot's context is full.
    Length,
    /// The answer is tool calls (set by the HTTP front when it parsed calls).
    ToolCalls,
}

impl Finish {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// A token's log-probability (natural log, of the model's distribution before sampling).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// log p.
    pub logprob: f32,
    /// The most likely tokens at this position: (text, bytes, log p), most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// What the scheduler tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token and the text it releases (empty while it may begin a stop
    /// string or an unfinished UTF-8 character).
    Token {
        /// Text released by this token.
        text: String,
        /// Its log-probability, when asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The sequence ended.
    Done {
        /// Why.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Of them, those whose K/V a previous request left in the slot (not evaluated).
        cached_tokens: usize,
        /// Tokens generated (an end-of-generation token included).
        completion_tokens: usize,
    },
    /// The engine failed on this sequence.
    Failed(String),
    /// The engine lost a device in a forward pass (a worker died): 503, naming it.
    Unavailable(String),
    /// An embedding job's vector (`[n_embd]`, unit length) and its input's token count.
    Embedding {
        /// The pooled, normalized hidden state.
        vector: Vec<f32>,
        /// Tokens of the input.
        prompt_tokens: usize,
    },
}

/// A sequence holding a slot.
pub struct Seq<'t> {
    /// The KV cache slot it holds.
    pub slot: usize,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are in the slot.
    pub fed: usize,
    prompt_len: usize,
    cached: usize,
    max_tokens: usize,
    logprobs: Option<usize>,
    ignore_eos: bool,
    sampler: Sampler,
    dec: StreamDecoder<'t>,
    stop: StopText,
    /// Where its events go.
    pub events: UnboundedSender<Event>,
    arrived: Instant,
    first_token: Option<Instant>,
    constraint: Option<Constraint>,
    /// The request's stop strings as sent (to start it over, [`Seq::restart`]).
    stop_strings: Vec<String>,
    /// Speculative guesses fed after its last token this step ([`Seq::guess`]).
    pub draft: Vec<u32>,
    /// How many to guess next.
    pub draft_len: DraftLength,
    /// The last event (finish or failure), sent by [`Seq::end`] once the scheduler has
    /// stopped counting the request: a client that gets its answer and at once sends
    /// another must not find this one still taking a place in the queue.
    last: Option<Event>,
}

impl<'t> Seq<'t> {
    /// Start `job` in `slot`, whose K/V already hold the first `cached` prompt tokens.
    pub fn new(job: Job, slot: usize, tok: &'t Tokenizer, cached: usize) -> Self {
        Self {
            slot,
            prompt_len: job.prompt.len(),
            cached,
            tokens: job.prompt,
            fed: cached,
            max_tokens: job.max_tokens,
            logprobs: job.logprobs,
            ignore_eos: job.ignore_eos,
            sampler: Sampler::new(job.sampler),
            dec: StreamDecoder::new(tok),
            stop: StopText::new(job.stop.clone()),
            stop_strings: job.stop,
            events: job.events,
            arrived: job.arrived,
            first_token: None,
            constraint: job.constraint,
            draft: Vec::new(),
            last: None,
            draft_len: DraftLength::default(),
        }
    }

    /// How many tokens a decoding sequence may guess this step: as many as its
    /// [`DraftLength`] says (at most `d.max`, at least `d.min`), none past its `max_tokens`
    /// or a context of `n_ctx`.
    pub fn draft_room(&self, d: &crate::Draft, n_ctx: usize) -> usize {
        let room = self.draft_len.next(d.max).max(d.min);
        room.min(self.max_tokens.saturating_sub(self.generated() + 1)).min(n_ctx.saturating_sub(self.fed + 1))
    }

    /// Guess how a decoding sequence goes on by n-gram lookup ([`Self::draft_room`]
    /// tokens at most; fewer than `d.min` are dropped).
    pub fn guess(&mut self, d: &crate::Draft, n_ctx: usize) {
        let room = self.draft_room(d, n_ctx);
        self.draft = if room >= d.min.max(1) { NgramDraft::default().lookup(&self.tokens, room) } else { Vec::new() };
        if self.draft.len() < d.min {
            self.draft.clear();
        }
    }

    /// The request again, to start over in another slot or context, when it has not
    /// generated a token yet (the client has been told nothing); else the sequence back.
    pub fn restart(self) -> Result<Job, Box<Self>> {
        if self.generated() > 0 {
            return Err(Box::new(self));
        }
        let mut prompt = self.tokens;
        prompt.truncate(self.prompt_len);
        Ok(Job {
            prompt,
            max_tokens: self.max_tokens,
            sampler: self.sampler.config().clone(),
            stop: self.stop_strings,
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            events: self.events,
            arrived: self.arrived,
            embed: None,
            constraint: self.constraint,
        })
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens of its prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Whether the sequence is past its prompt (decoding).
    pub fn decoding(&self) -> bool {
        self.generated() > 0
    }

    /// Sample the next token from `logits` and tell the client. Returns `Some` when the
    /// sequence has ended (the `Done` event is already sent).
    pub fn step(&mut self, logits: &[f32], tok: &Tokenizer, n_ctx: usize, metrics: &Metrics) -> Option<Finish> {
        let id = match &mut self.constraint {
            None => self.sampler.sample(logits, &self.tokens),
            Some(c) => {
                // Disallowed tokens get −∞, so every sampler setting (greedy included)
                // picks an allowed one.
                let t0 = Instant::now();
                let masked = c.mask(logits);
                metrics.constraint_mask.observe(t0.elapsed().as_secs_f64());
                match masked {
                    Ok(m) => self.sampler.sample(m, &self.tokens),
                    Err(e) => return self.fail(format!("constrained decoding failed: {e}")),
                }
            }
        };
        // The grammar is complete after this token: the sequence ends here.
        let grammar_done = match &mut self.constraint {
            Some(c) if !tok.is_eog(id) => match c.commit(id) {
                Ok(()) => c.finished(),
                Err(e) => return self.fail(format!("constrained decoding failed: {e}")),
            },
            _ => false,
        };
        let now = Instant::now();
        if self.first_token.is_none() {
            self.first_token = Some(now);
            metrics.ttft.observe((now - self.arrived).as_secs_f64());
        }
        let logprob = self.logprobs.map(|k| token_logprob(logits, id, k, tok));
        self.tokens.push(id);
        metrics.completion_tokens.fetch_add(1, Ordering::Relaxed);
        // Under a grammar an end-of-generation token is only allowed once it is complete,
        // so it ends the sequence even with `ignore_eos`.
        let finish = if tok.is_eog(id) && (!self.ignore_eos || self.constraint.is_some()) {
            // An incomplete character held back is dropped (never sent as U+FFFD);
            // what the stop strings held back is released.
            self.dec.finish();
            let text = self.stop.finish();
            self.send(Event::Token { text, logprob });
            Some(Finish::Stop)
        } else {
            let full = self.generated() >= self.max_tokens || self.tokens.len() > n_ctx;
            let piece = self.dec.push(id);
            if full || grammar_done {
                self.dec.finish();
            }
            let (mut text, hit) = self.stop.push(&piece);
            let finish = if hit {
                Some(Finish::Stop)
            } else if grammar_done {
                text += &self.stop.finish();
                Some(Finish::Stop)
            } else if full {
                text += &self.stop.finish();
                Some(Finish::Length)
            } else {
                None
            };
            self.send(Event::Token { text, logprob });
            finish
        };
        if let Some(f) = finish {
            let n = self.generated();
            if let (Some(first), true) = (self.first_token, n > 1) {
                metrics.tpot.observe((now - first).as_secs_f64() / (n - 1) as f64);
            }
            self.last.get_or_insert(Event::Done {
                finish: f,
                prompt_tokens: self.prompt_len,
                cached_tokens: self.cached,
                completion_tokens: n,
            });
        }
        finish
    }

    /// End the sequence with an error (the client gets it instead of a finish reason).
    fn fail(&mut self, message: String) -> Option<Finish> {
        self.last = Some(Event::Failed(message));
        Some(Finish::Stop)
    }

    /// Send the finish (or failure) [`Seq::step`] ended on; call once the sequence has
    /// left the scheduler's count.
    pub fn end(self) {
        if let Some(e) = self.last {
            let _ = self.events.send(e);
        }
    }

    /// Send an event; a client that has gone is noticed before the next step.
    pub fn send(&self, e: Event) {
        let _ = self.events.send(e);
    }
}

/// log p of `id` under softmax(`logits`), and the `k` most likely tokens.
fn token_logprob(logits: &[f32], id: u32, k: usize, tok: &Tokenizer) -> TokenLogprob {
    let max = logits.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let lse = max as f64 + logits.iter().filter(|x| !x.is_nan()).map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln();
    let lp = |i: usize| (logits.get(i).copied().unwrap_or(f32::NEG_INFINITY) as f64 - lse) as f32;
    let entry = |i: u32| {
        let bytes = tok.decode_token(i).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes, lp(i as usize))
    };
    let mut top = Vec::new();
    if k > 0 && !logits.is_empty() {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let by = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, by);
        idx.truncate(k);
        idx.sort_by(by);
        top = idx.into_iter().map(entry).collect();
    }
    let (token, bytes, logprob) = entry(id);
    TokenLogprob { token, bytes, logprob, top }
}
