//! A draft model for the server's speculative decoding (`serve --draft-model`): a context
//! of the small model with one KV cache slot per engine slot, kept in step with each
//! sequence's tokens, drafting greedily for every decoding sequence at once — one batched
//! pass of the draft model per guessed position, so its weights too are read once per
//! step for all sequences.

use hearth_model::sampler::argmax;
use hearth_model::{Context, Segment};

/// The draft model's context and what each of its slots holds.
pub struct DraftModel {
    ctx: Context,
    /// Per slot: the tokens whose K/V the draft slot holds, from position 0.
    cached: Vec<Vec<u32>>,
}

/// One sequence to draft for: its slot, its tokens so far, how many guesses at most.
pub struct Want<'a> {
    /// The engine slot (the draft context has as many).
    pub slot: usize,
    /// Prompt and generated tokens.
    pub tokens: &'a [u32],
    /// Most guesses.
    pub max: usize,
}

impl DraftModel {
    /// Draft with `ctx` (a context of the draft model with the engine's slot count; its
    /// vocabulary checked by the caller, [`hearth_model::speculative::same_vocabulary`]).
    /// Every pass takes the f32 attention path, as the engine's.
    pub fn new(mut ctx: Context) -> Self {
        ctx.set_f32_attention_from(1);
        let cached = vec![Vec::new(); ctx.n_slots()];
        DraftModel { ctx, cached }
    }

    /// Greedy guesses for each of `want` (in order; empty where none could be made). A
    /// failing draft pass is no error for the requests: they decode without guesses.
    pub fn guess(&mut self, want: &[Want<'_>]) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); want.len()];
        if let Err(e) = self.run(want, &mut out) {
            eprintln!("hearth serve: the draft model failed ({e}); decoding without guesses this step");
            out.iter_mut().for_each(Vec::clear);
            self.cached.iter_mut().for_each(Vec::clear);
            (0..self.ctx.n_slots()).for_each(|s| {
                self.ctx.truncate_slot(s, 0);
            });
        }
        out
    }

    fn run(&mut self, want: &[Want<'_>], out: &mut [Vec<u32>]) -> hearth_model::Result<()> {
        let (n_vocab, n_batch, n_ctx) = (self.ctx.model().config.n_vocab, self.ctx.n_batch(), self.ctx.n_ctx());
        // Catch each draft slot up with its sequence (all but what it already holds, and at
        // least the last token, whose logits start the draft), in passes of n_batch tokens.
        let mut feed: Vec<(usize, usize)> = Vec::new(); // (index into want, next token to feed)
        for (i, w) in want.iter().enumerate() {
            if w.slot >= self.cached.len() || w.tokens.is_empty() || w.max == 0 || w.tokens.len() + w.max > n_ctx {
                continue;
            }
            let c = &mut self.cached[w.slot];
            let same = c.iter().zip(w.tokens).take_while(|(a, b)| a == b).count().min(w.tokens.len() - 1);
            let kept = self.ctx.truncate_slot(w.slot, same);
            c.truncate(kept);
            feed.push((i, kept));
        }
        let mut last: Vec<Option<u32>> = vec![None; want.len()];
        while feed.iter().any(|&(i, at)| at < want[i].tokens.len()) {
            let mut budget = n_batch;
            let mut segs = Vec::new();
            for &(i, at) in &feed {
                let w = &want[i];
                let take = (w.tokens.len() - at).min(budget);
                if take == 0 {
                    continue;
                }
                budget -= take;
                segs.push((i, at, take));
            }
            let segments: Vec<Segment> = segs
                .iter()
                .map(|&(i, at, take)| {
                    let w = &want[i];
                    Segment { slot: w.slot, tokens: &w.tokens[at..at + take], logits: (at + take == w.tokens.len()) as usize }
                })
                .collect();
            let logits = self.ctx.eval_batch(&segments)?;
            let mut row = 0;
            for (&(i, at, take), seg) in segs.iter().zip(&segments) {
                let w = &want[i];
                self.cached[w.slot].extend_from_slice(&w.tokens[at..at + take]);
                if seg.logits == 1 {
                    last[i] = Some(argmax(&logits[row * n_vocab..(row + 1) * n_vocab]));
                    row += 1;
                }
            }
            for f in feed.iter_mut() {
                if let Some(&(_, _, take)) = segs.iter().find(|s| s.0 == f.0) {
                    f.1 += take;
                }
            }
        }
        for &(i, _) in &feed {
            out[i].extend(last[i]);
        }
        // Then one batched pass per further guess, for the sequences that want more.
        loop {
            let more: Vec<usize> = feed.iter().map(|&(i, _)| i).filter(|&i| !out[i].is_empty() && out[i].len() < want[i].max).collect();
            if more.is_empty() {
                return Ok(());
            }
            let toks: Vec<[u32; 1]> = more.iter().map(|&i| [out[i][out[i].len() - 1]]).collect();
            let segments: Vec<Segment> =
                more.iter().zip(&toks).map(|(&i, t)| Segment { slot: want[i].slot, tokens: t, logits: 1 }).collect();
            let logits = self.ctx.eval_batch(&segments)?;
            for (r, &i) in more.iter().enumerate() {
                self.cached[want[i].slot].push(toks[r][0]);
                out[i].push(argmax(&logits[r * n_vocab..(r + 1) * n_vocab]));
            }
        }
    }
}
