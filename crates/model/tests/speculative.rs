//! Speculative decoding gives the tokens plain decoding gives: greedy and seeded sampling,
//! with n-gram drafts, a draft model equal to the model (every guess taken), and random
//! guesses (almost none taken). The control is the random drafter: its guesses are not
//! the model's tokens, so an output equal to plain decoding's is the check's doing.

use hearth_model::sampler::SamplerConfig;
use hearth_model::speculative::{Drafter, ModelDraft, NgramDraft, Speculation};
use hearth_model::{generate_speculative, Context, Generation, Model, Result};
use std::path::Path;
use std::sync::Arc;

fn model() -> Arc<Model> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    Arc::new(Model::load(p).unwrap())
}

/// A prompt whose continuation repeats it: n-gram drafts have something to find.
const PROMPT: &str = "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew.\n\
                      Copy: apple, banana, cherry, date, elderberry, fig, grape, honeydew.\nList: red, orange, yellow, \
                      green, blue, indigo, violet.\nCopy:";
const N: usize = 40;

/// Random token ids from a fixed xorshift stream.
struct RandomDraft(u64, usize);

impl Drafter for RandomDraft {
    fn draft(&mut self, _history: &[u32], max: usize) -> Result<Vec<u32>> {
        Ok((0..max.min(4))
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (self.0 % self.1 as u64) as u32
            })
            .collect())
    }
}

fn run(model: &Arc<Model>, prompt: &[u32], sampler: &SamplerConfig, spec: Option<&mut Speculation>) -> Generation {
    let mut ctx = Context::new(model.clone(), 512, 64, 2).unwrap();
    generate_speculative(&mut ctx, prompt, N, sampler, false, spec, |_| true).unwrap()
}

fn greedy() -> SamplerConfig {
    SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
}

#[test]
fn greedy_tokens_equal_plain_decoding_whatever_the_drafter() {
    let model = model();
    let prompt = model.tokenizer.encode(PROMPT, true, true);
    let plain = run(&model, &prompt, &greedy(), None);
    assert_eq!(plain.tokens.len(), N);
    assert!(plain.speculative.is_none());

    let mut ngram = Speculation::new(Box::new(NgramDraft::default()));
    let g = run(&model, &prompt, &greedy(), Some(&mut ngram));
    assert_eq!(g.tokens, plain.tokens, "n-gram drafts");
    let s = g.speculative.unwrap();
    assert!(s.drafted > 0 && s.accepted > 0, "the copy task should draft and accept: {s:?}");
    assert!(s.accepted <= s.drafted);
    assert_eq!(g.timings.decode_tokens, N - 1);

    // A draft model equal to the model: every guess is the model's own token.
    let draft_ctx = Context::new(model.clone(), 512, 64, 2).unwrap();
    let mut same = Speculation::new(Box::new(ModelDraft::new(draft_ctx, &model).unwrap()));
    same.max = 5;
    let g = run(&model, &prompt, &greedy(), Some(&mut same));
    assert_eq!(g.tokens, plain.tokens, "self-draft");
    let s = g.speculative.unwrap();
    assert_eq!(s.accepted, s.drafted, "a draft equal to the model is always right: {s:?}");
    assert!(s.passes < N / 2, "5 guesses a pass should need few passes: {s:?}");

    // Random guesses: hardly any right, same tokens.
    let mut random = Speculation::new(Box::new(RandomDraft(0x9e3779b97f4a7c15, model.config.n_vocab)));
    let g = run(&model, &prompt, &greedy(), Some(&mut random));
    assert_eq!(g.tokens, plain.tokens, "random drafts");
    let s = g.speculative.unwrap();
    // (After the first refused pass the draft length drops to one guess a pass.)
    assert!(s.passes >= N - 2 && s.accepted * 20 <= s.drafted, "random guesses are rarely right: {s:?}");
}

#[test]
fn seeded_sampling_gives_plain_decodings_tokens() {
    let model = model();
    let prompt = model.tokenizer.encode(PROMPT, true, true);
    let (mut drafted, mut accepted, mut differ) = (0, 0, 0);
    for seed in 0..6u64 {
        let cfg = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::default() };
        let plain = run(&model, &prompt, &cfg, None);
        let mut ngram = Speculation::new(Box::new(NgramDraft::default()));
        let g = run(&model, &prompt, &cfg, Some(&mut ngram));
        assert_eq!(g.tokens, plain.tokens, "seed {seed}, n-gram drafts");
        let s = g.speculative.unwrap();
        (drafted, accepted) = (drafted + s.drafted, accepted + s.accepted);
        let mut random = Speculation::new(Box::new(RandomDraft(seed + 1, model.config.n_vocab)));
        assert_eq!(run(&model, &prompt, &cfg, Some(&mut random)).tokens, plain.tokens, "seed {seed}, random drafts");
        // With penalties too (they read the history, which grows by the guesses taken).
        let pen = SamplerConfig { repeat_penalty: 1.3, presence_penalty: 0.5, temperature: 0.7, ..cfg.clone() };
        let plain_pen = run(&model, &prompt, &pen, None);
        let mut ngram = Speculation::new(Box::new(NgramDraft::default()));
        assert_eq!(run(&model, &prompt, &pen, Some(&mut ngram)).tokens, plain_pen.tokens, "seed {seed}, penalties");
        differ += (plain_pen.tokens != plain.tokens) as usize;
    }
    assert!(accepted > 0 && accepted < drafted, "sampling takes some guesses and refuses others: {accepted}/{drafted}");
    assert!(differ > 0, "the penalties should change some samples");
}

/// Under sampling the tokens' distribution is plain sampling's: the 2nd and 3rd tokens of
/// 300 seeded runs with a self-draft (whose greedy guesses are checked on verification rows)
/// against 300 plain runs with other seeds, by a two-sample chi-square test. Control: the
/// rule that takes every guess (the 2nd and 3rd tokens greedy after a sampled 1st) is
/// rejected by the same test.
#[test]
fn sampled_tokens_follow_plain_samplings_distribution() {
    let model = model();
    let prompt = model.tokenizer.encode("My favourite animal is the", true, true);
    let cfg = |seed| SamplerConfig { temperature: 1.0, top_k: 6, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::default() };
    let draw = |seed: u64, spec: bool, blind: bool| -> Vec<u32> {
        let mut ctx = Context::new(model.clone(), 64, 64, 2).unwrap();
        if blind {
            // Take the guesses whatever the model samples: a sampled 1st token, then the draft's greedy ones.
            let first = generate_speculative(&mut ctx, &prompt, 1, &cfg(seed), false, None, |_| true).unwrap().tokens;
            let mut rest = Context::new(model.clone(), 64, 64, 2).unwrap();
            let history = [&prompt[..], &first[..]].concat();
            let more = generate_speculative(&mut rest, &history, 2, &greedy(), false, None, |_| true).unwrap().tokens;
            return [first, more].concat();
        }
        let mut s = spec.then(|| {
            let mut s = Speculation::new(Box::new(ModelDraft::new(Context::new(model.clone(), 64, 64, 2).unwrap(), &model).unwrap()));
            s.max = 2;
            s
        });
        generate_speculative(&mut ctx, &prompt, 3, &cfg(seed), false, s.as_mut(), |_| true).unwrap().tokens
    };
    const RUNS: u64 = 300;
    let spec: Vec<Vec<u32>> = (0..RUNS).map(|s| draw(s, true, false)).collect();
    let plain: Vec<Vec<u32>> = (0..RUNS).map(|s| draw(10_000 + s, false, false)).collect();
    let blind: Vec<Vec<u32>> = (0..RUNS).map(|s| draw(20_000 + s, false, true)).collect();
    for pos in 1..3 {
        let at = |runs: &[Vec<u32>]| runs.iter().map(|r| r[pos]).collect::<Vec<u32>>();
        let (chi, df, crit) = chi_square(&at(&spec), &at(&plain));
        assert!(chi < crit, "token {}: chi-square {chi:.1} with {df} degrees of freedom (p < 0.001 above {crit:.1})", pos + 1);
        let (chi_c, df_c, crit_c) = chi_square(&at(&blind), &at(&plain));
        assert!(chi_c > crit_c, "control, token {}: chi-square {chi_c:.1} with {df_c} degrees of freedom should reject", pos + 1);
    }
}

/// Two equal-size samples of categories: Σ (a − b)² / (a + b) over the categories seen
/// at least 5 times in all (rarer ones pooled into one), its degrees of freedom and the
/// chi-square critical value at p = 0.001 (Wilson–Hilferty approximation).
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize, f64) {
    use std::collections::BTreeMap;
    let mut n: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    a.iter().for_each(|&t| n.entry(t).or_default().0 += 1.0);
    b.iter().for_each(|&t| n.entry(t).or_default().1 += 1.0);
    let (mut cats, mut rare) = (Vec::new(), (0.0, 0.0));
    for (x, y) in n.into_values() {
        if x + y >= 5.0 {
            cats.push((x, y));
        } else {
            (rare.0, rare.1) = (rare.0 + x, rare.1 + y);
        }
    }
    if rare.0 + rare.1 > 0.0 {
        cats.push(rare);
    }
    let chi: f64 = cats.iter().map(|(x, y)| (x - y) * (x - y) / (x + y)).sum();
    let df = cats.len().saturating_sub(1).max(1);
    let k = df as f64;
    let z = 3.090; // the normal's 0.999 quantile
    let crit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    (chi, df, crit)
}
