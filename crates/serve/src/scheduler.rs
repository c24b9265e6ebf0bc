//! Continuous batching: one thread owns the model [`Context`] and its KV cache slots.
//! Between forward passes it admits waiting requests into free slots and drops those
//! whose client has gone; each pass then runs every active sequence at once — one
//! token per decoding sequence, then prompt chunks of the prefilling ones up to the
//! per-step token budget ([`Context::n_batch`]) — so the weights are read once per
//! step for all of them. Finished sequences free their slot at once.
//!
//! Prompt cache: a freed slot keeps its sequence's K/V and remembers its tokens; a new
//! request goes to the free slot whose tokens share the longest prefix with its prompt
//! (else the least recently used one) and feeds only the rest, so a chat's next turn
//! does not read the conversation again. Every pass computes attention on the f32 path
//! (`Context::set_f32_attention_from(1)`), so a token's K/V bits depend only on the
//! tokens before it, not on how they were cut into passes or which request fed them:
//! cached and uncached runs give the same tokens.

use crate::cluster::Replanner;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::sequence::{Event, Job, Seq};
use hearth_model::{Context, Segment};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;

/// The handle request handlers submit jobs through (cheap to clone).
#[derive(Clone)]
pub struct Scheduler {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
    /// Requests submitted and not yet finished (queued or in a slot): the router's load.
    load: Arc<AtomicUsize>,
    queue_size: usize,
    n_ctx: usize,
    n_slots: usize,
}

impl Scheduler {
    /// Start the scheduler thread on `ctx` (its slots are the sequences served at
    /// once); with every slot taken, at most `queue_size` (≥ 1) requests wait for one,
    /// more are refused.
    /// `pin`: CPUs for the context's threads, pinned from the scheduler thread (which
    /// becomes the pool's thread 0); the thread is named `hearth-scheduler-{id}`.
    /// `prompt_cache`: reuse a freed slot's cached prefix (see the module docs).
    /// `replan`: for a context across devices, how to set it up again when a worker fails.
    /// `draft`: speculative decoding for every decoding sequence (n-gram guesses, or the
    /// draft model's).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        mut ctx: Context,
        queue_size: usize,
        metrics: Arc<Metrics>,
        pin: Option<Vec<usize>>,
        id: usize,
        prompt_cache: bool,
        replan: Option<Replanner>,
        draft: Option<Drafting>,
    ) -> std::io::Result<(Self, std::thread::JoinHandle<()>)> {
        let queue_size = queue_size.max(1);
        let (n_ctx, n_slots) = (ctx.n_ctx(), ctx.n_slots());
        // `submit` admits at most this many unfinished requests, so the channel never fills.
        let (tx, rx) = sync_channel(n_slots + queue_size);
        let (m, load) = (metrics.clone(), Arc::new(AtomicUsize::new(0)));
        let l = load.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(format!("hearth-scheduler-{id}")).spawn(move || {
            if let Some(cpus) = &pin {
                if let Err(e) = ctx.pin_threads_to(cpus) {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            }
            let _ = ready_tx.send(Ok(()));
            ctx.set_f32_attention_from(1);
            run(ctx, rx, &m, &l, prompt_cache, replan.map(|r| (r, pin)), draft)
        })?;
        ready_rx.recv().map_err(std::io::Error::other)?.map_err(std::io::Error::other)?;
        Ok((Self { tx, metrics, load, queue_size, n_ctx, n_slots }, thread))
    }

    /// Requests submitted and not finished yet.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Queue `job`; refused with 429 when every slot is taken and `queue_size` requests
    /// already wait (backpressure), the job handed back. The limit counts requests, not
    /// the channel: the scheduler takes jobs off it only between forward passes, so a
    /// burst arriving during one pass filled a channel of `queue_size` while slots were
    /// free (4 requests at once to `--parallel 4 --queue-size 1` got two 429s).
    pub fn submit(&self, job: Job) -> Result<(), Box<(ApiError, Job)>> {
        if self.load.fetch_add(1, Ordering::Relaxed) >= self.n_slots + self.queue_size {
            self.load.fetch_sub(1, Ordering::Relaxed);
            return Err(Box::new((ApiError::queue_full(self.queue_size), job)));
        }
        self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                self.load.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(j) => Box::new((ApiError::queue_full(self.queue_size), j)),
                    TrySendError::Disconnected(j) => Box::new((ApiError::unavailable(), j)),
                })
            }
        }
    }

    /// Positions of each slot's context.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// KV cache slots: sequences generated at once.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Requests that may wait for a slot.
    pub fn queue_size(&self) -> usize {
        self.queue_size
    }
}

/// Speculative decoding in a scheduler: how many guesses, and where they come from (the
/// draft model, else n-gram lookup).
pub struct Drafting {
    /// Most and fewest guesses per sequence and step.
    pub limits: crate::Draft,
    /// The engine's draft model, or `None` for n-gram lookup.
    pub model: Option<crate::draft::DraftModel>,
}

/// What each slot's KV cache holds once its sequence has ended: its tokens and when it
/// was last used (for least-recently-used eviction).
struct SlotCache {
    tokens: Vec<Vec<u32>>,
    used: Vec<u64>,
    clock: u64,
    on: bool,
}

impl SlotCache {
    fn new(n_slots: usize, on: bool) -> Self {
        Self { tokens: vec![Vec::new(); n_slots], used: vec![0; n_slots], clock: 0, on }
    }

    /// The index into `free` of the slot for `prompt`, and the prefix length it shares:
    /// the longest shared prefix among the slots that would keep at least half of what
    /// they hold (so a conversation's cache is not overwritten by another one that only
    /// shares its system prompt, as llama-server's slot similarity rule); else the least
    /// recently used slot (empty ones first), keeping what it shares.
    fn pick(&self, free: &[usize], prompt: &[u32]) -> (usize, usize) {
        let shared = |s: usize| if self.on { self.tokens[s].iter().zip(prompt).take_while(|(a, b)| a == b).count() } else { 0 };
        let reuse = (0..free.len())
            .map(|i| (i, shared(free[i])))
            .filter(|&(i, n)| n > 0 && 2 * n >= self.tokens[free[i]].len())
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(self.used[free[i]])));
        if let Some(best) = reuse {
            return best;
        }
        let lru = (0..free.len()).min_by_key(|&i| self.used[free[i]]).unwrap_or(0);
        (lru, free.get(lru).map_or(0, |&s| shared(s)))
    }

    /// `slot` now holds `tokens` (a sequence ended in it; empty when one starts).
    fn keep(&mut self, slot: usize, tokens: &[u32]) {
        self.clock += 1;
        self.used[slot] = self.clock;
        self.tokens[slot].clear();
        if self.on {
            self.tokens[slot].extend_from_slice(tokens);
        }
    }
}

/// A context set up again across devices, ready to serve: its threads pinned to `pin`,
/// f32 attention as the server runs it.
fn set_up(mut ctx: Context, pin: Option<&[usize]>) -> Context {
    if let Some(cpus) = pin {
        if let Err(e) = ctx.pin_threads_to(cpus) {
            eprintln!("hearth serve: pinning the new engine's threads: {e}");
        }
    }
    ctx.set_f32_attention_from(1);
    ctx
}

/// The scheduler loop; returns when every [`Scheduler`] handle is gone and no sequence
/// is left, or when a context across devices failed and could not be set up again.
/// `replan`: the replanner and the CPUs to pin a new context's threads to.
fn run(
    mut ctx: Context,
    rx: Receiver<Job>,
    metrics: &Metrics,
    load: &AtomicUsize,
    prompt_cache: bool,
    mut replan: Option<(Replanner, Option<Vec<usize>>)>,
    mut draft: Option<Drafting>,
) {
    let model = ctx.model().clone();
    let tok = &model.tokenizer;
    let (n_ctx, n_vocab) = (ctx.n_ctx(), model.config.n_vocab);
    let mut free: Vec<usize> = (0..ctx.n_slots()).rev().collect();
    let mut cache = SlotCache::new(ctx.n_slots(), prompt_cache);
    let mut active: Vec<Seq> = Vec::new();
    // A worker of a context across devices failed: (its node, the message naming it).
    let mut lost: Option<(usize, String)> = None;
    // Requests waiting for a running sequence to finish evaluating the prompt they share
    // (e.g. the `n` choices of one request), to copy its K/V instead of evaluating it again.
    let mut deferred: Vec<Job> = Vec::new();
    // Idle with a worker down, the wait for a request ran out: look for it (`--rejoin`).
    let mut look = false;
    loop {
        if let (true, Some((r, pin))) = (std::mem::take(&mut look), replan.as_mut()) {
            let back = r.look();
            if !back.is_empty() {
                let Some(next) = r.rejoin(ctx, &back) else { return };
                ctx = set_up(next, pin.as_deref());
                free = (0..ctx.n_slots()).rev().collect();
                cache = SlotCache::new(ctx.n_slots(), prompt_cache);
            }
        }
        if let (Some((node, msg)), Some((r, pin))) = (lost.take(), replan.as_mut()) {
            // Every sequence's K/V on the group is lost: those that have sent nothing yet
            // start over once the engine is set up again (a worker that died while the
            // server was idle costs the next request a delay, not an error); the others
            // fail (503 naming the worker).
            for s in active.drain(..) {
                match s.restart() {
                    Ok(job) => {
                        metrics.active.fetch_sub(1, Ordering::Relaxed);
                        deferred.push(job);
                    }
                    Err(s) => {
                        s.send(Event::Unavailable(msg.clone()));
                        retire(metrics, load);
                    }
                }
            }
            let Some(next) = r.replan(ctx, node, &msg) else { return };
            ctx = set_up(next, pin.as_deref());
            free = (0..ctx.n_slots()).rev().collect();
            cache = SlotCache::new(ctx.n_slots(), prompt_cache);
        }
        // Admit waiting requests into free slots (block only when idle): deferred ones
        // first, in order.
        let mut retry: std::collections::VecDeque<Job> = deferred.drain(..).collect();
        while !free.is_empty() {
            let job = if let Some(j) = retry.pop_front() {
                j
            } else {
                let j = if active.is_empty() {
                    // Block, or until the down workers are due to be looked for.
                    match replan.as_ref().and_then(|(r, _)| r.look_in()) {
                        None => match rx.recv() {
                            Ok(j) => j,
                            Err(_) => return,
                        },
                        Some(wait) => match rx.recv_timeout(wait) {
                            Ok(j) => j,
                            Err(RecvTimeoutError::Timeout) => {
                                look = true;
                                break;
                            }
                            Err(RecvTimeoutError::Disconnected) => return,
                        },
                    }
                } else {
                    match rx.try_recv() {
                        Ok(j) => j,
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                };
                metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                j
            };
            if job.events.is_closed() {
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                load.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if let Some(pooling) = job.embed {
                // An embedding: the whole input in passes of its own, in a free slot.
                let slot = free[cache.pick(&free, &job.prompt).0];
                ctx.truncate_slot(slot, 0);
                cache.keep(slot, &[]);
                metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
                let event = match ctx.eval_hidden(slot, &job.prompt) {
                    Ok(h) => {
                        metrics.pass_ok();
                        cache.keep(slot, &job.prompt); // its K/V are the input's: a prefix to reuse
                        let mut vector = pooling.pool(&h, model.config.n_embd);
                        hearth_model::embed::normalize(&mut vector);
                        Event::Embedding { vector, prompt_tokens: job.prompt.len() }
                    }
                    Err(e) => match replan.as_ref().and_then(|(r, _)| r.failed(&e)) {
                        Some(f) => {
                            // Once the engine is set up again, the input runs again.
                            lost = Some(f);
                            deferred.push(job);
                            break;
                        }
                        None => {
                            let msg = format!("the forward pass failed: {e}");
                            metrics.pass_failed(&msg);
                            Event::Failed(msg)
                        }
                    },
                };
                let _ = job.events.send(event);
                load.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            // At least the last prompt token is fed, for its logits.
            let want = job.prompt.len() - 1;
            let (i, shared) = cache.pick(&free, &job.prompt);
            // The running sequence sharing the longest prefix with this prompt: what it
            // has evaluated so far, and what it will have once its prompt is in.
            let running = active
                .iter()
                .filter(|_| prompt_cache)
                .map(|s| {
                    (
                        common_prefix(&s.tokens[..s.fed], &job.prompt).min(want),
                        common_prefix(&s.tokens[..s.prompt_len()], &job.prompt).min(want),
                        s.slot,
                    )
                })
                .max();
            if running.is_some_and(|(now, later, _)| later > now && later > shared && 2 * later >= want) {
                deferred.push(job); // its prompt is still being evaluated next door
                continue;
            }
            let slot = free.swap_remove(i);
            metrics.active.fetch_add(1, Ordering::Relaxed);
            let cached = match running.filter(|&(now, _, _)| now > shared) {
                Some((now, _, from)) => ctx.copy_slot(from, slot, now),
                None => ctx.truncate_slot(slot, shared.min(want)),
            };
            cache.keep(slot, &[]);
            metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
            metrics.cached_tokens.fetch_add(cached as u64, Ordering::Relaxed);
            active.push(Seq::new(job, slot, tok, cached));
        }
        deferred.extend(retry); // no free slot left for them this step
                                // Cancel sequences whose client has gone.
        active.retain(|s| {
            let gone = s.events.is_closed();
            if gone {
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                cache.keep(s.slot, &s.tokens[..s.fed]);
                free.push(s.slot);
                retire(metrics, load);
            }
            !gone
        });
        if active.is_empty() {
            continue;
        }

        // Speculative decoding: each decoding sequence's guesses at how it goes on.
        match draft.as_mut() {
            Some(Drafting { limits, model: None }) => {
                for s in active.iter_mut().filter(|s| s.decoding()) {
                    s.guess(limits, n_ctx);
                }
            }
            Some(Drafting { limits, model: Some(m) }) => {
                let want: Vec<crate::draft::Want> = active
                    .iter()
                    .filter(|s| s.decoding())
                    .map(|s| crate::draft::Want { slot: s.slot, tokens: &s.tokens, max: s.draft_room(limits, n_ctx) })
                    .collect();
                let guesses = m.guess(&want);
                for (s, g) in active.iter_mut().filter(|s| s.decoding()).zip(guesses) {
                    s.draft = if g.len() >= limits.min { g } else { Vec::new() };
                }
            }
            None => {}
        }
        // This step's batch (`plan_step`): (sequence, tokens this step); guesses ride in
        // what the step leaves over, after every prompt's chunk.
        let state: Vec<(bool, usize)> = active.iter().map(|s| (s.decoding(), s.tokens.len() - s.fed)).collect();
        let mut plan = plan_step(&state, ctx.n_batch(), ctx.n_slots());
        let mut budget = ctx.n_batch() - plan.iter().map(|&(_, t)| t).sum::<usize>();
        let mut in_plan = vec![false; active.len()];
        for (i, take) in plan.iter_mut() {
            in_plan[*i] = true;
            let s = &mut active[*i];
            if s.decoding() {
                s.draft.truncate(budget);
                *take += s.draft.len();
                budget -= s.draft.len();
            }
        }
        for (s, _) in active.iter_mut().zip(&in_plan).filter(|(_, &p)| !p) {
            s.draft.clear();
        }
        let feeds: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, take)| {
                let s = &active[i];
                let own = take - s.draft.len();
                [&s.tokens[s.fed..s.fed + own], &s.draft[..]].concat()
            })
            .collect();
        let segs: Vec<Segment> = plan
            .iter()
            .zip(&feeds)
            .map(|(&(i, take), f)| {
                let s = &active[i];
                let logits = if s.decoding() { take } else { (s.fed + take == s.tokens.len()) as usize };
                Segment { slot: s.slot, tokens: f, logits }
            })
            .collect();
        metrics.steps.fetch_add(1, Ordering::Relaxed);
        metrics.batch_tokens.observe((ctx.n_batch() - budget) as f64);
        metrics.batch_sequences.observe(segs.len() as f64);
        let logits = match ctx.eval_batch(&segs) {
            Ok(l) => {
                metrics.pass_ok();
                l
            }
            Err(e) => {
                if let Some(f) = replan.as_ref().and_then(|(r, _)| r.failed(&e)) {
                    lost = Some(f);
                    continue;
                }
                // Fail this step's sequences; the others go on.
                let msg = format!("the forward pass failed: {e}");
                metrics.pass_failed(&msg);
                let mut failed: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
                failed.sort_unstable();
                for &i in failed.iter().rev() {
                    let s = active.remove(i);
                    s.send(Event::Failed(msg.clone()));
                    cache.keep(s.slot, &[]); // what the failed pass wrote is unknown
                    free.push(s.slot);
                    retire(metrics, load);
                }
                continue;
            }
        };

        // Sample for the sequences that got logits (a decoding one row after row while its
        // guesses are the tokens it samples); retire the finished.
        let mut row = 0;
        let mut done = Vec::new();
        let mut rewind = Vec::new();
        for (&(i, take), seg) in plan.iter().zip(&segs) {
            let s = &mut active[i];
            let guesses = std::mem::take(&mut s.draft);
            s.fed += take - guesses.len();
            let rows = &logits[row * n_vocab..(row + seg.logits) * n_vocab];
            row += seg.logits;
            let mut accepted = 0;
            for (r, lg) in rows.chunks_exact(n_vocab).enumerate() {
                let before = s.tokens.len();
                let finish = s.step(lg, tok, n_ctx, metrics);
                let hit = s.tokens.len() > before && guesses.get(r).is_some_and(|g| s.tokens.last() == Some(g));
                accepted += hit as u64;
                if finish.is_some() {
                    done.push(i);
                    break;
                }
                if !hit {
                    break;
                }
                s.fed += 1; // the guess was this token: its K/V are in, its row is next
            }
            if let (Some(d), false) = (&draft, guesses.is_empty()) {
                s.draft_len.record(guesses.len(), accepted as usize, d.limits.max);
                metrics.drafted_tokens.fetch_add(guesses.len() as u64, Ordering::Relaxed);
                metrics.accepted_tokens.fetch_add(accepted, Ordering::Relaxed);
                rewind.push((s.slot, s.fed));
            }
        }
        for (slot, n) in rewind {
            ctx.truncate_slot(slot, n); // forget the guesses not taken
        }
        done.sort_unstable();
        for &i in done.iter().rev() {
            let s = active.remove(i);
            cache.keep(s.slot, &s.tokens[..s.fed]);
            free.push(s.slot);
            retire(metrics, load);
            s.end();
        }
    }
}

/// Tokens `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A sequence left its slot.
fn retire(metrics: &Metrics, load: &AtomicUsize) {
    metrics.active.fetch_sub(1, Ordering::Relaxed);
    load.fetch_sub(1, Ordering::Relaxed);
}

/// The tokens each sequence feeds in one step, `(index into seqs, tokens)`: decoding
/// sequences first (one token each), then prompts in arrival order. `seqs[i]` is
/// (decoding, tokens left to feed). A prompt is fed in chunks of one size whatever else
/// is running, [`prompt_chunk`], and waits for the next step when its chunk does not fit
/// what is left of the budget: how a prompt is cut, and so which attention path its
/// tokens take (llama.cpp's f32 prefill path for a chunk of at least
/// `F32_PATH_MIN_TOKENS`), does not depend on the other requests, so its logits are
/// bit-identical alone or in a batch.
pub(crate) fn plan_step(seqs: &[(bool, usize)], n_batch: usize, n_slots: usize) -> Vec<(usize, usize)> {
    let chunk = prompt_chunk(n_batch, n_slots);
    let mut budget = n_batch;
    let mut plan = Vec::new();
    for decoding in [true, false] {
        for (i, &(d, left)) in seqs.iter().enumerate().filter(|(_, s)| s.0 == decoding) {
            let take = if d { left.min(1) } else { left.min(chunk) };
            if take > 0 && take <= budget {
                plan.push((i, take));
                budget -= take;
            }
        }
    }
    plan
}

/// Prompt tokens per step: what is left of the batch beside the most decoding sequences
/// a step can have (all slots but the prompt's own), so the first waiting prompt always
/// fits.
pub(crate) fn prompt_chunk(n_batch: usize, n_slots: usize) -> usize {
    (n_batch + 1).saturating_sub(n_slots).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt's chunks are the same whatever runs beside it, and a step never exceeds
    /// the batch.
    #[test]
    fn prompt_chunks_do_not_depend_on_other_sequences() {
        let (n_batch, n_slots) = (64, 4);
        let alone: Vec<usize> = chunks(&[], 150, n_batch, n_slots);
        assert_eq!(alone, vec![61, 61, 28]);
        for others in [vec![(true, 10)], vec![(true, 5), (true, 9), (true, 30)], vec![(false, 100)], vec![(true, 3), (false, 7)]] {
            assert_eq!(chunks(&others, 150, n_batch, n_slots), alone, "beside {others:?}");
        }
        for seqs in [vec![(true, 1); 4], vec![(false, 500); 4], vec![(true, 2), (false, 64), (false, 64), (true, 9)]] {
            let plan = plan_step(&seqs, n_batch, n_slots);
            assert!(plan.iter().map(|p| p.1).sum::<usize>() <= n_batch, "{seqs:?}: {plan:?}");
            assert!(plan.iter().any(|p| !seqs[p.0].0) || seqs.iter().all(|s| s.0), "{seqs:?}: a prompt must make progress");
        }
        assert_eq!(prompt_chunk(8, 1), 8);
        assert_eq!(prompt_chunk(2, 4), 1);
    }

    /// Two conversations that share only a system prompt keep a slot each; a prompt
    /// extending a slot's tokens goes there; with the cache off nothing is shared.
    #[test]
    fn slot_choice_keeps_conversations_apart() {
        let mut c = SlotCache::new(2, true);
        let sys: Vec<u32> = (0..24).collect();
        let conv = |tail: u32, n: u32| sys.iter().copied().chain(tail..tail + n).collect::<Vec<u32>>();
        let (b0, c0) = (conv(100, 30), conv(200, 30));
        // B starts in an empty slot; it ends holding 54 tokens.
        let (i, shared) = c.pick(&[0, 1], &b0);
        assert_eq!((i, shared), (0, 0));
        c.keep(0, &b0);
        // C shares 24 of B's 54: less than half, so the empty slot 1.
        assert_eq!(c.pick(&[0, 1], &c0), (1, 0));
        c.keep(1, &c0);
        // B's next turn extends slot 0's tokens; C's next turn slot 1's.
        let b1: Vec<u32> = b0.iter().copied().chain(300..310).collect();
        assert_eq!(c.pick(&[0, 1], &b1), (0, 54));
        assert_eq!(c.pick(&[1, 0], &conv(200, 40)), (0, 54));
        // A new conversation evicts the least recently used slot (0), keeping the prefix it shares.
        assert_eq!(c.pick(&[0, 1], &conv(900, 5)), (0, 24));
        // Off: the least recently used slot, nothing shared.
        let mut off = SlotCache::new(2, false);
        off.keep(1, &b0);
        assert_eq!(off.pick(&[1, 0], &b0), (1, 0));
    }

    /// The chunk sizes of a prompt of `n` tokens fed beside `others` (which keep their
    /// state: decoders keep decoding, other prompts go first).
    fn chunks(others: &[(bool, usize)], n: usize, n_batch: usize, n_slots: usize) -> Vec<usize> {
        let mut seqs = others.to_vec();
        seqs.push((false, n));
        let me = seqs.len() - 1;
        let mut out = Vec::new();
        while seqs[me].1 > 0 {
            let plan = plan_step(&seqs, n_batch, n_slots);
            for &(i, t) in &plan {
                if i == me {
                    out.push(t);
                }
                if !seqs[i].0 {
                    seqs[i].1 -= t;
                }
            }
            assert!(out.len() < 100);
        }
        out
    }
}
