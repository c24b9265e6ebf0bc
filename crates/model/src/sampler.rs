//! Choosing the next token from logits, as llama.cpp's default sampler chain does.
//!
//! The chain is, in llama.cpp's default order: repeat penalty → top-k → top-p →
//! min-p → temperature → softmax → seeded draw. Order matters: top-p and min-p see
//! the *untempered* distribution, so temperature only reshapes what survives the
//! cuts (a high temperature cannot resurrect tokens min-p removed).
//!
//! Design notes:
//! - One candidate buffer lives in the [`Sampler`] and is refilled per token; no
//!   allocation per token after the first.
//! - Top-k uses `select_nth_unstable` (O(vocab)) and only sorts the k survivors; a
//!   full sort of the vocabulary happens only when top-p runs without top-k.
//! - Ties are broken by token id (lower first), so selection is deterministic and
//!   the same seed, config and logits always give the same token.
//! - Bad numbers never panic: NaN logits are treated as −∞ (never chosen), +∞ as the
//!   largest finite value; probabilities are computed in f64 relative to the max,
//!   so no temperature can overflow them.
//! - The RNG is `ChaCha8Rng`: portable and reproducible across platforms, but its
//!   stream differs from llama.cpp's `mt19937`, so seeded runs match themselves,
//!   not llama.cpp.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings. Each filter has an "off" value; [`Default`] gives llama.cpp's
/// defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repeat penalty
/// or presence/frequency penalty over a 64-token window, random seed).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides logits before the draw; `<= 0` (or NaN) means greedy: the argmax,
    /// no randomness. Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off. Default 40.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sums to at
    /// least `top_p`; `>= 1.0` (or NaN) = off. Default 0.95.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0`
    /// (or NaN) = off. Default 0.05.
    pub min_p: f32,
    /// Penalise tokens seen in the last `repeat_last_n` tokens of history: positive
    /// logits are divided by it, negative ones multiplied. 1.0 = off; values
    /// `<= 0` or non-finite are treated as off. Default 1.0.
    pub repeat_penalty: f32,
    /// Subtracted from the logit of every token seen in the last `repeat_last_n`
    /// tokens of history, once however often it was seen (OpenAI's
    /// `presence_penalty`, llama.cpp's `--presence-penalty`). 0.0 = off; non-finite
    /// values are treated as off. Default 0.0.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen in the last
    /// `repeat_last_n` tokens of history (OpenAI's `frequency_penalty`). 0.0 = off;
    /// non-finite values are treated as off. Default 0.0.
    pub frequency_penalty: f32,
    /// How many trailing history tokens the penalties look at; 0 = off.
    /// Default 64.
    pub repeat_last_n: usize,
    /// RNG seed; the same seed, config and logits reproduce the same tokens.
    /// Default: random.
    pub seed: u64,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`);
    /// `f32::NEG_INFINITY` bans a token. Ids past the logits are ignored. Default none.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: rand::random(),
            logit_bias: Vec::new(),
        }
    }
}

/// One token under consideration.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Most likely first; ties by lower id, so every ordering is total and deterministic.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A stateful sampler: its RNG advances with every random draw.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    /// Candidate buffer, reused across calls (capacity = vocabulary size).
    cands: Vec<Candidate>,
    /// Distinct tokens of the penalty window, reused across calls.
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler with `cfg`; its RNG is seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Sampler { cfg, rng, cands: Vec::new(), window: Vec::new() }
    }

    /// The configuration this sampler runs.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary entry). `history` is
    /// the tokens so far (prompt and generated); only its last `repeat_last_n`
    /// matter, and only when a penalty is set.
    ///
    /// Returns 0 for empty logits, and the lowest id when every logit is NaN or −∞.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let penalties = self.penalties_on(history);
        let greedy = self.cfg.temperature.is_nan() || self.cfg.temperature <= 0.0;
        if greedy && !penalties && self.cfg.logit_bias.is_empty() {
            return argmax(logits);
        }

        // Refill the candidate buffer (ids == indices until the first reordering).
        self.cands.clear();
        self.cands.extend(logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: sanitize(l) }));
        if self.cands.is_empty() {
            return 0;
        }
        for &(id, bias) in &self.cfg.logit_bias {
            if let Some(c) = self.cands.get_mut(id as usize) {
                c.logit = sanitize(c.logit + bias);
            }
        }
        if penalties {
            self.apply_penalties(history);
        }
        if greedy {
            // Every filter keeps the most likely token, so greedy skips them.
            return self.first_max().id;
        }

        let mut sorted = self.apply_top_k();
        self.apply_top_p(&mut sorted);
        self.apply_min_p(sorted);
        self.draw()
    }

    /// The repeat penalty factor, 1.0 when off.
    fn repeat_factor(&self) -> f32 {
        let p = self.cfg.repeat_penalty;
        if p.is_finite() && p > 0.0 {
            p
        } else {
            1.0
        }
    }

    /// The presence and frequency penalties, 0.0 when off.
    fn additive_penalties(&self) -> (f32, f32) {
        let on = |x: f32| if x.is_finite() { x } else { 0.0 };
        (on(self.cfg.presence_penalty), on(self.cfg.frequency_penalty))
    }

    /// Whether some penalty can change anything.
    fn penalties_on(&self, history: &[u32]) -> bool {
        let any = self.repeat_factor() != 1.0 || self.additive_penalties() != (0.0, 0.0);
        any && self.cfg.repeat_last_n > 0 && !history.is_empty()
    }

    /// llama.cpp's penalties sampler (`llama_sampler_penalties_apply`), for each
    /// distinct token seen `count` times in the window: positive logits are divided
    /// by the repeat penalty and the others multiplied (once, however often it was
    /// seen), then `count · frequency + presence` is subtracted (OpenAI's formula,
    /// "Frequency and presence penalties" in its API reference).
    fn apply_penalties(&mut self, history: &[u32]) {
        let (repeat, (presence, frequency)) = (self.repeat_factor(), self.additive_penalties());
        let start = history.len().saturating_sub(self.cfg.repeat_last_n);
        self.window.clear();
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            // Out-of-vocabulary ids in the history are ignored.
            if let Some(c) = self.cands.get_mut(run[0] as usize) {
                c.logit = if c.logit <= 0.0 { c.logit * repeat } else { c.logit / repeat };
                c.logit -= run.len() as f32 * frequency + presence;
            }
        }
    }

    /// The most likely candidate (lowest id among ties). `cands` is non-empty.
    fn first_max(&self) -> Candidate {
        let mut best = self.cands[0];
        for &c in &self.cands[1..] {
            if by_logit_desc(&c, &best).is_lt() {
                best = c;
            }
        }
        best
    }

    /// Keeps the `top_k` most likely candidates, sorted. Returns whether `cands` is
    /// now sorted most-likely-first.
    fn apply_top_k(&mut self) -> bool {
        let k = self.cfg.top_k;
        if k == 0 || k >= self.cands.len() {
            return false;
        }
        self.cands.select_nth_unstable_by(k - 1, by_logit_desc);
        self.cands.truncate(k);
        self.cands.sort_unstable_by(by_logit_desc);
        true
    }

    /// Keeps the shortest most-likely-first prefix whose probability (at
    /// temperature 1) reaches `top_p`. Sorts `cands` if it was not.
    fn apply_top_p(&mut self, sorted: &mut bool) {
        let p = self.cfg.top_p;
        if p.is_nan() || p >= 1.0 {
            return;
        }
        let max = if *sorted { self.cands[0].logit } else { self.first_max().logit };
        let total: f64 = self.cands.iter().map(|c| weight(c.logit, max, 1.0)).sum();
        if total <= 0.0 || !total.is_finite() {
            return;
        }
        let target = p.max(0.0) as f64 * total;
        // Walk the most-likely-first order, sorting only as far as needed: when
        // unsorted, select and sort the next block of candidates (doubling its
        // size) instead of sorting the whole vocabulary up front.
        let n = self.cands.len();
        let mut cum = 0.0;
        let mut done = 0; // cands[..done] are the `done` best, sorted
        let mut end = if *sorted { n } else { n.min(64) };
        loop {
            if !*sorted {
                let rest = &mut self.cands[done..];
                let m = end - done;
                if m < rest.len() {
                    rest.select_nth_unstable_by(m - 1, by_logit_desc);
                }
                rest[..m].sort_unstable_by(by_logit_desc);
            }
            for i in done..end {
                cum += weight(self.cands[i].logit, max, 1.0);
                if cum >= target {
                    self.cands.truncate(i + 1);
                    *sorted = true;
                    return;
                }
            }
            if end == n {
                // Rounding kept the target out of reach: keep everything.
                *sorted = true;
                return;
            }
            done = end;
            end = n.min(end * 2);
        }
    }

    /// Drops candidates whose probability is below `min_p` times the top one's,
    /// i.e. whose logit is below `max + ln(min_p)`.
    fn apply_min_p(&mut self, sorted: bool) {
        let p = self.cfg.min_p;
        if p.is_nan() || p <= 0.0 {
            return;
        }
        let max = if sorted { self.cands[0].logit } else { self.first_max().logit };
        let threshold = max as f64 + (p.min(1.0) as f64).ln();
        // The max itself always survives (logit - max = 0 >= ln(p) for p <= 1).
        self.cands.retain(|c| c.logit as f64 >= threshold || c.logit == max);
    }

    /// Softmax at the configured temperature, then one seeded draw.
    fn draw(&mut self) -> u32 {
        let max = self.first_max();
        if max.logit == f32::NEG_INFINITY {
            // Nothing has any probability; pick deterministically.
            return max.id;
        }
        let inv_t = 1.0 / self.cfg.temperature as f64;
        let total: f64 = self.cands.iter().map(|c| weight(c.logit, max.logit, inv_t)).sum();
        if total <= 0.0 || !total.is_finite() {
            return max.id;
        }
        let target = self.rng.gen::<f64>() * total;
        let mut cum = 0.0;
        let mut last = max.id;
        for c in &self.cands {
            let w = weight(c.logit, max.logit, inv_t);
            if w > 0.0 {
                cum += w;
                last = c.id;
                if target < cum {
                    return c.id;
                }
            }
        }
        // Rounding left `target` past the sum: the last token with weight wins.
        last
    }
}

/// NaN can never be chosen; +∞ becomes the largest finite logit so arithmetic
/// relative to the max stays finite.
fn sanitize(logit: f32) -> f32 {
    if logit.is_nan() {
        f32::NEG_INFINITY
    } else if logit == f32::INFINITY {
        f32::MAX
    } else {
        logit
    }
}

/// Unnormalised probability `exp((logit - max) / T)`, in f64 so that neither a
/// tiny temperature nor huge logits overflow.
fn weight(logit: f32, max: f32, inv_t: f64) -> f64 {
    if logit == f32::NEG_INFINITY {
        return 0.0;
    }
    let w = ((logit as f64 - max as f64) * inv_t).exp();
    if w.is_nan() {
        0.0
    } else {
        w
    }
}

/// Index of the largest logit (the first one among ties). NaN entries are skipped;
/// returns 0 for an empty slice or one with only NaN.
pub fn argmax(logits: &[f32]) -> u32 {
    let Some(first) = logits.iter().position(|l| !l.is_nan()) else {
        return 0;
    };
    let (mut best_i, mut best) = (first, logits[first]);
    for (i, &l) in logits.iter().enumerate().skip(first + 1) {
        // NaN compares false, so it never wins; `>` keeps the first of ties.
        if l > best {
            best_i = i;
            best = l;
        }
    }
    best_i as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 42,
            logit_bias: Vec::new(),
        }
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    /// Distinct tokens drawn over many samples.
    fn support(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<u32> {
        let mut seen: Vec<u32> = (0..n).map(|_| s.sample(logits, &[])).collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    /// A pseudo-random vocabulary-sized logit vector (no RNG dependency).
    fn noisy_logits(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let x = i.wrapping_mul(2_654_435_761).wrapping_add(salt.wrapping_mul(40_503));
                (x % 10_000) as f32 / 1000.0 - 5.0
            })
            .collect()
    }

    #[test]
    fn argmax_first_max_and_nan_safe() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 5.0]), 3);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[0.0, f32::INFINITY, 1.0]), 1);
    }

    #[test]
    fn greedy_picks_argmax() {
        let logits = noisy_logits(50_000, 1);
        let mut s = Sampler::new(cfg(0.0, 40, 0.95, 0.05));
        for _ in 0..3 {
            assert_eq!(s.sample(&logits, &[1, 2, 3]), argmax(&logits));
        }
        let mut neg = Sampler::new(cfg(-1.0, 0, 1.0, 0.0));
        assert_eq!(neg.sample(&logits, &[]), argmax(&logits));
        let mut nan = Sampler::new(cfg(f32::NAN, 0, 1.0, 0.0));
        assert_eq!(nan.sample(&logits, &[]), argmax(&logits));
    }

    #[test]
    fn top_k_one_equals_greedy() {
        for salt in 0..10 {
            let logits = noisy_logits(50_000, salt);
            let mut s = Sampler::new(SamplerConfig { seed: salt as u64, ..cfg(1.5, 1, 1.0, 0.0) });
            assert_eq!(s.sample(&logits, &[]), argmax(&logits));
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let logits = noisy_logits(50_000, 7);
        let run = |seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg(1.0, 0, 1.0, 0.0) });
            (0..32).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(123), run(123));
        assert_ne!(run(123), run(124));
        // Default chain, too.
        let run_default = |seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..SamplerConfig::default() });
            (0..32).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run_default(5), run_default(5));
    }

    #[test]
    fn top_k_keeps_k_best() {
        let logits = [0.0, 5.0, 1.0, 4.0, 3.0, 2.0];
        let mut s = Sampler::new(cfg(100.0, 3, 1.0, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![1, 3, 4]);
    }

    #[test]
    fn top_p_cuts_at_cumulative_mass() {
        // Sorted: 0.5, 0.3, 0.15, 0.05.
        let logits = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        // 0.5 < 0.7 <= 0.8: tokens 1 and 3.
        let mut s = Sampler::new(cfg(1.0, 0, 0.7, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![1, 3]);
        // The cut is at the first prefix whose mass reaches p: 0.5 + 0.3 >= 0.79.
        let mut s = Sampler::new(cfg(1.0, 0, 0.79, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![1, 3]);
        // 0.8 < 0.9 <= 0.95: three tokens.
        let mut s = Sampler::new(cfg(1.0, 0, 0.9, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![0, 1, 3]);
        // Tiny p keeps only the top token.
        let mut s = Sampler::new(cfg(1.0, 0, 0.01, 0.0));
        assert_eq!(support(&mut s, &logits, 200), vec![1]);
        // top_p also applies after top_k.
        let mut s = Sampler::new(cfg(1.0, 3, 0.7, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![1, 3]);
    }

    #[test]
    fn top_p_partial_sort_matches_full_sort() {
        for (salt, p) in [(1, 0.05), (2, 0.3), (3, 0.9), (4, 0.999)] {
            let logits = noisy_logits(5_000, salt);
            let mut s = Sampler::new(cfg(1.0, 0, p, 0.0));
            s.cands.extend(logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }));
            let mut sorted = false;
            s.apply_top_p(&mut sorted);
            assert!(sorted);
            let got: Vec<u32> = s.cands.iter().map(|c| c.id).collect();

            // Reference: full sort, then the shortest prefix reaching p.
            let mut all: Vec<Candidate> = logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }).collect();
            all.sort_by(by_logit_desc);
            let max = all[0].logit;
            let total: f64 = all.iter().map(|c| weight(c.logit, max, 1.0)).sum();
            let mut cum = 0.0;
            let keep = all
                .iter()
                .position(|c| {
                    cum += weight(c.logit, max, 1.0);
                    cum >= p as f64 * total
                })
                .map_or(all.len(), |i| i + 1);
            let want: Vec<u32> = all[..keep].iter().map(|c| c.id).collect();
            assert_eq!(got, want, "top_p {p}");
        }
    }

    /// `logit_bias` moves greedy and sampled choices alike; −∞ bans a token; ids past
    /// the vocabulary are ignored. (Without the bias the argmax is token 2.)
    #[test]
    fn logit_bias_moves_and_bans_tokens() {
        let logits = [1.0f32, 2.0, 3.0, 0.5];
        let greedy = |bias: Vec<(u32, f32)>| Sampler::new(SamplerConfig { logit_bias: bias, ..cfg(0.0, 0, 1.0, 0.0) }).sample(&logits, &[]);
        assert_eq!(greedy(vec![]), 2);
        assert_eq!(greedy(vec![(0, 2.5)]), 0);
        assert_eq!(greedy(vec![(2, f32::NEG_INFINITY)]), 1);
        assert_eq!(greedy(vec![(99, 50.0)]), 2);
        for seed in 0..20 {
            let mut s = Sampler::new(SamplerConfig { seed, logit_bias: vec![(1, f32::NEG_INFINITY), (3, 100.0)], ..cfg(1.0, 0, 1.0, 0.0) });
            assert_eq!(s.sample(&logits, &[]), 3);
            let mut s = Sampler::new(SamplerConfig { seed, logit_bias: vec![(2, f32::NEG_INFINITY)], ..cfg(1.0, 0, 1.0, 0.0) });
            assert_ne!(s.sample(&logits, &[]), 2);
        }
    }

    #[test]
    fn top_p_ignores_temperature() {
        // Temperature comes after the cut: even a huge one cannot bring back token 2.
        let logits = logits_of(&[0.15, 0.5, 0.05, 0.3]);
        let mut s = Sampler::new(cfg(1000.0, 0, 0.9, 0.0));
        assert_eq!(support(&mut s, &logits, 2000), vec![0, 1, 3]);
    }

    #[test]
    fn min_p_cuts_relative_to_top() {
        let logits = logits_of(&[0.4, 0.3, 0.2, 0.08, 0.02]);
        // min_p 0.25: threshold 0.1 → tokens 0, 1, 2.
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.25));
        assert_eq!(support(&mut s, &logits, 2000), vec![0, 1, 2]);
        // min_p 0.6: threshold 0.24 → tokens 0, 1.
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.6));
        assert_eq!(support(&mut s, &logits, 2000), vec![0, 1]);
        // min_p 1 keeps only the top; out-of-range values are clamped.
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0));
        assert_eq!(support(&mut s, &logits, 200), vec![0]);
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 7.0));
        assert_eq!(support(&mut s, &logits, 200), vec![0]);
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = logits_of(&[0.7, 0.2, 0.1]);
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0));
        let n = 20_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            counts[s.sample(&logits, &[]) as usize] += 1;
        }
        for (c, p) in counts.iter().zip([0.7, 0.2, 0.1]) {
            let f = *c as f64 / n as f64;
            assert!((f - p).abs() < 0.02, "frequency {f} vs probability {p}: {counts:?}");
        }
    }

    #[test]
    fn repeat_penalty_discourages_recent_tokens() {
        let logits = [2.0, 1.9, -1.0, -1.1];
        let penalised = SamplerConfig { repeat_penalty: 1.5, ..cfg(0.0, 0, 1.0, 0.0) };
        // Token 0 seen: 2.0 / 1.5 < 1.9, so token 1 wins.
        assert_eq!(Sampler::new(penalised.clone()).sample(&logits, &[0]), 1);
        // Seen three times, still penalised once: 2.0 / 1.5 = 1.33 > 1.9 / 1.5.
        assert_eq!(Sampler::new(penalised.clone()).sample(&logits, &[0, 0, 0, 1]), 0);
        // Negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.1.
        let neg = [-1.0, -1.1];
        assert_eq!(Sampler::new(penalised.clone()).sample(&neg, &[0]), 1);
        // Only the last repeat_last_n tokens count.
        let window = SamplerConfig { repeat_last_n: 2, ..penalised.clone() };
        assert_eq!(Sampler::new(window).sample(&logits, &[0, 5, 6]), 0);
        // Off when 1.0, or when the value is nonsense.
        for p in [1.0, 0.0, -2.0, f32::NAN, f32::INFINITY] {
            let off = SamplerConfig { repeat_penalty: p, ..penalised.clone() };
            assert_eq!(Sampler::new(off).sample(&logits, &[0]), 0, "penalty {p}");
        }
        // Out-of-vocabulary ids in history are ignored.
        assert_eq!(Sampler::new(penalised).sample(&logits, &[u32::MAX, 99]), 0);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract_from_seen_tokens() {
        let logits = [2.0, 1.5, 1.0, 0.0];
        let greedy = cfg(0.0, 0, 1.0, 0.0);
        let with =
            |presence: f32, frequency: f32| SamplerConfig { presence_penalty: presence, frequency_penalty: frequency, ..greedy.clone() };
        // Control: no penalty, token 0 wins.
        assert_eq!(Sampler::new(greedy.clone()).sample(&logits, &[0, 0, 1]), 0);
        // Presence: 2.0 - 0.6 = 1.4 < 1.5, whatever the count.
        assert_eq!(Sampler::new(with(0.6, 0.0)).sample(&logits, &[0]), 1);
        assert_eq!(Sampler::new(with(0.4, 0.0)).sample(&logits, &[0, 0, 0]), 0);
        // Frequency: once per occurrence; 2.0 - 3 * 0.2 = 1.4 < 1.5 but 2.0 - 0.2 > 1.5.
        assert_eq!(Sampler::new(with(0.0, 0.2)).sample(&logits, &[0, 0, 0]), 1);
        assert_eq!(Sampler::new(with(0.0, 0.2)).sample(&logits, &[0]), 0);
        // Both: 1.5 - (2 * 0.3 + 0.3) = 0.6 < 1.0 and 2.0 - 0.6 = 1.4 > 1.0; three
        // zeros take 2.0 to 2.0 - 1.2 = 0.8 < 1.0.
        assert_eq!(Sampler::new(with(0.3, 0.3)).sample(&logits, &[1, 1, 0]), 0);
        assert_eq!(Sampler::new(with(0.3, 0.3)).sample(&logits, &[1, 1, 0, 0, 0]), 2);
        // Negative values encourage repeats: token 3 jumps to 0.0 + 2.5.
        assert_eq!(Sampler::new(with(-2.5, 0.0)).sample(&logits, &[3]), 3);
        // Only the window counts; non-finite values are off.
        let window = SamplerConfig { repeat_last_n: 1, ..with(0.0, 0.2) };
        assert_eq!(Sampler::new(window).sample(&logits, &[0, 0, 0, 2]), 0);
        assert_eq!(Sampler::new(with(f32::NAN, f32::INFINITY)).sample(&logits, &[0]), 0);
    }

    #[test]
    fn repeat_penalty_applies_when_sampling() {
        let logits = [5.0, 0.0];
        let cfg = SamplerConfig { repeat_penalty: 1e6, ..cfg(1.0, 0, 1.0, 0.0) };
        let mut s = Sampler::new(cfg);
        // 5.0 / 1e6 ≈ 0: both tokens about equally likely now.
        assert_eq!(support(&mut s, &logits, 500), vec![0, 1]);
    }

    #[test]
    fn nan_and_inf_never_panic() {
        let cases: [&[f32]; 7] = [
            &[],
            &[f32::NAN; 4],
            &[f32::NEG_INFINITY; 4],
            &[f32::NAN, 1.0, f32::NAN],
            &[0.0, f32::INFINITY, f32::INFINITY, 1.0],
            &[f32::MAX, -f32::MAX, f32::NAN, f32::INFINITY],
            &[1.0],
        ];
        let configs = [
            cfg(0.8, 40, 0.95, 0.05),
            cfg(1.0, 0, 1.0, 0.0),
            cfg(1e-30, 0, 0.5, 0.5),
            cfg(f32::INFINITY, 2, f32::NAN, f32::NAN),
            SamplerConfig { repeat_penalty: 1.3, ..cfg(0.7, 0, 0.9, 0.1) },
            SamplerConfig { repeat_penalty: 1.3, ..cfg(0.0, 0, 1.0, 0.0) },
        ];
        for c in &configs {
            let mut s = Sampler::new(c.clone());
            for logits in cases {
                let id = s.sample(logits, &[0, 1, 2, 3]);
                assert!(logits.is_empty() && id == 0 || (id as usize) < logits.len(), "{c:?} {logits:?} -> {id}");
            }
        }
        // NaN is never chosen when something else exists; +inf always is.
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0));
        for _ in 0..100 {
            assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[]), 1);
            let id = s.sample(&[0.0, f32::INFINITY, f32::INFINITY, 1.0], &[]);
            assert!(id == 1 || id == 2);
        }
    }

    #[test]
    fn buffer_is_reused() {
        let logits = noisy_logits(50_000, 3);
        let mut s = Sampler::new(SamplerConfig { seed: 1, ..SamplerConfig::default() });
        s.sample(&logits, &[]);
        let cap = s.cands.capacity();
        let ptr = s.cands.as_ptr();
        for _ in 0..10 {
            s.sample(&logits, &[]);
        }
        assert_eq!((s.cands.capacity(), s.cands.as_ptr()), (cap, ptr));
    }
}
