//! Continuous batching: several sequences in one forward pass ([`Context::eval_batch`])
//! get bit-identical logits to each sequence run alone ([`Context::eval`]), whatever
//! shares their batch and whenever they join it.

use hearth_model::{sampler::argmax, Context, Logits, Model, Segment};
use std::path::Path;
use std::sync::Arc;

fn model() -> Arc<Model> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    Arc::new(Model::load(p).unwrap())
}

const PROMPTS: [&str; 4] =
    ["The capital of France is", "Once upon a time, in a small village by the sea, there lived", "1, 2, 3, 4,", "def fibonacci(n):"];
const STEPS: usize = 8;

/// Greedy tokens and the bits of every step's logits, the sequence alone.
fn alone(model: &Arc<Model>, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut ctx = Context::new(model.clone(), 256, 64, 2).unwrap();
    let mut logits = ctx.eval(prompt, Logits::Last).unwrap().to_vec();
    let (mut toks, mut bits) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        bits.push(logits.iter().map(|x| x.to_bits()).collect());
        let id = argmax(&logits);
        toks.push(id);
        logits = ctx.eval(&[id], Logits::Last).unwrap().to_vec();
    }
    (toks, bits)
}

#[test]
fn batched_sequences_match_each_alone_bit_for_bit() {
    let model = model();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| model.tokenizer.encode(p, true, true)).collect();
    let want: Vec<_> = prompts.iter().map(|p| alone(&model, p)).collect();

    // Sequence i joins at step i (staggered, so prefills and decodes mix), in slot 3 - i,
    // and prefills in chunks of 5 tokens.
    let mut ctx = Context::new(model.clone(), 256, 64, 2).unwrap();
    ctx.set_slots(4).unwrap();
    let n = prompts.len();
    let mut fed = vec![0usize; n]; // prompt tokens evaluated
    let mut got: Vec<(Vec<u32>, Vec<Vec<u32>>)> = vec![Default::default(); n];
    for step in 0.. {
        let mut owned: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for i in 0..n.min(step + 1) {
            if got[i].0.len() == STEPS {
                continue;
            }
            if fed[i] < prompts[i].len() {
                let end = (fed[i] + 5).min(prompts[i].len());
                owned.push((i, prompts[i][fed[i]..end].to_vec(), end == prompts[i].len()));
                fed[i] = end;
            } else {
                owned.push((i, vec![*got[i].0.last().unwrap()], true));
            }
        }
        if owned.is_empty() {
            break;
        }
        let segs: Vec<Segment> = owned.iter().map(|(i, t, l)| Segment { slot: 3 - i, tokens: t, logits: *l as usize }).collect();
        let logits = ctx.eval_batch(&segs).unwrap().to_vec();
        let v = model.config.n_vocab;
        let mut row = 0;
        for (i, _, l) in &owned {
            if *l {
                let lg = &logits[row * v..(row + 1) * v];
                got[*i].1.push(lg.iter().map(|x| x.to_bits()).collect());
                got[*i].0.push(argmax(lg));
                row += 1;
            }
        }
        assert!(step < 100);
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "prompt {i}: greedy tokens differ in a batch");
        for (s, (gb, wb)) in g.1.iter().zip(&w.1).enumerate() {
            assert!(gb == wb, "prompt {i} step {s}: logits are not bit-identical in a batch");
        }
    }
    // Freed slots start over.
    ctx.truncate_slot(1, 0);
    assert_eq!(ctx.slot_n_past(1), 0);
    assert_eq!(ctx.slot_n_past(0), prompts[3].len() + STEPS - 1);
}

#[test]
fn batch_errors_are_reported() {
    let model = model();
    let mut ctx = Context::new(model.clone(), 16, 8, 1).unwrap();
    ctx.set_slots(2).unwrap();
    assert_eq!((ctx.n_slots(), ctx.n_ctx()), (2, 16));
    let t = [1u32, 2, 3];
    let seg = |slot, tokens| Segment { slot, tokens, logits: 1 };
    assert!(ctx.eval_batch(&[]).is_err());
    assert!(ctx.eval_batch(&[seg(2, &t)]).is_err(), "slot out of range");
    assert!(ctx.eval_batch(&[seg(0, &t), seg(0, &t)]).is_err(), "slot twice");
    assert!(ctx.eval_batch(&[seg(0, &[1; 5]), seg(1, &[1; 5])]).is_err(), "over the batch size");
    assert!(ctx.eval_batch(&[seg(0, &[u32::MAX])]).is_err(), "bad token id");
    assert_eq!((ctx.slot_n_past(0), ctx.slot_n_past(1)), (0, 0), "failed batches must not advance a slot");
    let out = ctx.eval_batch(&[seg(0, &t), Segment { slot: 1, tokens: &t, logits: 0 }]).unwrap();
    assert_eq!(out.len(), model.config.n_vocab);
    assert!(ctx.set_slots(3).is_err(), "slots after the first evaluation");
    for _ in 0..4 {
        ctx.eval_batch(&[seg(1, &t)]).unwrap();
    }
    assert!(ctx.eval_batch(&[seg(1, &t)]).is_err(), "slot 1 is full (15 + 3 > 16)");
}

/// A prompt evaluated once and copied to other slots (`Context::copy_slot`, the server's
/// `n` choices) continues exactly as if each slot had evaluated it: the last prompt token
/// fed in the copy gives the same logits bits, then the same greedy steps. Control: a
/// copy of one token fewer than the slot fed, continued from the wrong place, differs.
#[test]
fn copied_slots_continue_bit_for_bit() {
    let model = model();
    let prompt = model.tokenizer.encode(PROMPTS[1], true, true);
    let (want, want_bits) = alone(&model, &prompt);
    let mut ctx = Context::new(model.clone(), 256, 64, 2).unwrap();
    ctx.set_slots(3).unwrap();
    let n = prompt.len() - 1;
    ctx.eval_batch(&[Segment { slot: 0, tokens: &prompt[..n], logits: 0 }]).unwrap();
    for to in [1, 2] {
        assert_eq!(ctx.copy_slot(0, to, n), n);
        let mut logits = ctx.eval_batch(&[Segment { slot: to, tokens: &prompt[n..], logits: 1 }]).unwrap().to_vec();
        for step in 0..STEPS {
            assert_eq!(logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want_bits[step], "slot {to}, step {step}");
            let id = argmax(&logits);
            assert_eq!(id, want[step]);
            logits = ctx.eval_batch(&[Segment { slot: to, tokens: &[id], logits: 1 }]).unwrap().to_vec();
        }
    }
    assert_eq!(ctx.copy_slot(0, 0, 3), 0, "a slot is not copied onto itself");
    assert_eq!(ctx.copy_slot(0, 9, 3), 0, "a missing slot copies nothing");
    // Control: one position short, then fed from the wrong token.
    assert_eq!(ctx.copy_slot(0, 1, n - 1), n - 1);
    let wrong = ctx.eval_batch(&[Segment { slot: 1, tokens: &prompt[n..], logits: 1 }]).unwrap();
    assert_ne!(wrong.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want_bits[0]);
}
