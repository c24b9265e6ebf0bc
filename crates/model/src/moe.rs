//! The mixture-of-experts FFN ([`Block::moe_ffn`]): a router picks `n_expert_used` of a
//! layer's `n_expert` SwiGLU experts for each token, and the token's FFN output is the
//! weighted sum of those experts' outputs (Shazeer et al., arXiv 1701.06538; Mixtral,
//! arXiv 2401.04088; Qwen3-MoE, arXiv 2505.09388).
//!
//! The router, as llama.cpp's `llm_graph_context::build_moe_ffn` computes it for
//! `qwen3moe` and `llama` with experts (gating `SOFTMAX`, `norm_w = true`, no scale):
//! `p = softmax(W_router · x)` over all experts (`[n_expert]`), the `k` experts of largest
//! `p` (ties: the lower id), and their weights `w_j = p_j / max(Σ_top-k p, 2⁻¹⁴)`.
//! That equals Mixtral's "softmax over the top-k logits" up to rounding. `qwen2moe`
//! (`norm_w = false`) takes `w_j = p_j` as they are, and adds a gated shared expert
//! (`Block::shared_expert`, `crate::arch` qwen2moe's docs).
//!
//! Weights stay where they are: expert `e`'s gate, up and down matrices are row ranges of
//! the stacked `ffn_*_exps` tensors ([`crate::LayerWeights::expert`]), views of the
//! mapped file run through the ordinary quantized matmul, never dequantized or copied.
//! Under a memory budget they are views of an expert cache's slots instead
//! ([`crate::ExpertSource`], asked for each run's experts at once).
//! A pass with many tokens groups them by expert: each chosen expert multiplies all of
//! its tokens at once, so its weights are read once per pass, and only chosen experts
//! are read at all (a decode step reads `k` of them).
//!
//! Batch invariance: a token's rows go through the same kernels whatever other tokens
//! share the pass (the matmul's result for a row does not depend on the other rows), and
//! its output sums its experts in increasing expert id, an order fixed by its own
//! routing. (llama.cpp sums in rank order; the two differ in the last bits only.)

use crate::arch::Mat;
use crate::block::Block;
use crate::error::{ModelError, Result};
use hearth_kernels::{matmul, matmul_many, ops, MatJob, WeightView};

/// llama.cpp clamps the sum of the chosen weights to the smallest normal f16 before
/// dividing (`build_moe_ffn`: `ggml_clamp(weights_sum, 6.103515625e-5, INFINITY)`).
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0; // 2⁻¹⁴ = 6.103515625e-5

/// One token's routing: `logits: [n_expert]` (overwritten by the softmax) to the `k`
/// chosen experts' ids and weights, in rank order (largest probability first).
/// `Err(e)`: expert `e`'s logit is NaN or infinite. The softmax would turn every
/// probability into NaN, the top k would silently become experts `0..k` with NaN
/// weights, and the NaN would reach the logits (generation then stops at its first
/// token with no word why), so the caller reports it instead.
pub(crate) fn route(logits: &mut [f32], k: usize, norm: bool, ids: &mut [usize], weights: &mut [f32]) -> std::result::Result<(), usize> {
    if let Some(e) = logits.iter().position(|v| !v.is_finite()) {
        return Err(e);
    }
    // Softmax as ggml's `soft_max_f32`: max, exp(x − max) in f32 summed in f64, times 1/sum.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in logits.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    logits.iter_mut().for_each(|v| *v *= inv);
    // Top k by probability, the lower id first among equals (k ≤ n_expert, checked at load).
    for j in 0..k {
        let mut best = usize::MAX;
        for (e, &p) in logits.iter().enumerate() {
            if !ids[..j].contains(&e) && (best == usize::MAX || p > logits[best]) {
                best = e;
            }
        }
        ids[j] = best;
        weights[j] = logits[best];
    }
    if !norm {
        return Ok(());
    }
    // Renormalised to sum to 1 (ggml_sum_rows sums in f64, then f32 division).
    let total = (weights[..k].iter().map(|&w| w as f64).sum::<f64>() as f32).max(MIN_WEIGHT_SUM);
    weights[..k].iter_mut().for_each(|w| *w /= total);
    Ok(())
}

/// f32s a pass of `n` tokens grows a block's `gathered` scratch to (`Block::moe_ffn`): the
/// routed experts' runs of up to `max(n, k)` (expert, token) pairs, their gathered inputs
/// and outputs `[pairs, n_embd]` each and their gate, up and gathered SwiGLU `[pairs, n_ff]`
/// each (`n_ff` one expert's width); then, where the layer has a shared expert of
/// `n_ff_shared` rows (0: none), its gate and up `[n, n_ff_shared]`, output `[n, n_embd]` and
/// gate logits `[n]` in the same buffer. The memory planner counts the larger of the two.
pub fn gathered_len(n: usize, n_embd: usize, n_ff: usize, k: usize, n_ff_shared: usize) -> usize {
    routed_len(n, n_embd, n_ff, k).max(shared_len(n, n_embd, n_ff_shared))
}

/// The routed experts' part of [`gathered_len`].
fn routed_len(n: usize, n_embd: usize, n_ff: usize, k: usize) -> usize {
    let cap = n.max(k);
    2 * cap * n_embd + 3 * cap * n_ff
}

/// The shared expert's part of [`gathered_len`] (0 without one).
fn shared_len(n: usize, n_embd: usize, n_ff_shared: usize) -> usize {
    if n_ff_shared == 0 {
        0
    } else {
        n * (2 * n_ff_shared + n_embd + 1)
    }
}

impl<'a> Block<'a> {
    /// `xb = moe(xb)` for the pass's `n` tokens, `xb: [n, n_embd]`: each token's
    /// `Σ_j w_j · W_down,e_j · (silu(W_gate,e_j · x) ⊙ W_up,e_j · x)` over its routed experts,
    /// plus the shared expert's output where the layer has one (`shared_expert`; see the
    /// module docs; tensor parallelism: [`Self::router_rows`] and `experts`).
    pub fn moe_ffn(&mut self, xb: &mut [f32]) -> Result<()> {
        let moe = self.c.moe.ok_or_else(|| ModelError::Weights("moe_ffn on a model without experts".into()))?;
        // Scratch: `part` the router's probabilities [n, n_expert] and the sums [n, n_embd];
        // `gathered` a run of experts' gathered inputs and outputs, [pairs, n_embd] each,
        // and their gate, up (and, gather schedule, all nodes' SwiGLU), [pairs, n_ff] each.
        let (mut part, mut gathered) = (std::mem::take(self.part), std::mem::take(self.gathered));
        // Timed as a whole: the ops inside (its GLUs) count to it alone, and its waits for
        // experts read under a memory budget to "waiting for weights".
        let waited = |b: &Self| b.expert_cache.map_or(0.0, |c| c.borrow().stats().wait_secs);
        let (t, w0) = (self.clock(), if self.times.is_some() { waited(self) } else { 0.0 });
        let times = self.times.take();
        let r = self.moe_ffn_in(moe, xb, &mut part, &mut gathered);
        self.times = times;
        if let (Some(times), Some(t)) = (self.times, t) {
            times.add(crate::block::Op::Moe, t, waited(self) - w0);
        }
        (*self.part, *self.gathered) = (part, gathered);
        r
    }

    /// The experts whose router rows this node computes under tensor parallelism: the
    /// share of `0..n_expert` matching its share of each expert's FFN rows. The nodes'
    /// FFN rows partition `0..n_ff`, so these partition `0..n_expert` (`⌊s·E/F⌋` telescopes).
    fn router_rows(&self, n_expert: usize) -> std::ops::Range<usize> {
        let (f, ff) = (self.share.shapes[Mat::Gate as usize].0.clone(), self.c.n_ff.max(1));
        f.start * n_expert / ff..f.end * n_expert / ff
    }

    fn moe_ffn_in(&mut self, moe: crate::config::Moe, xb: &mut [f32], part: &mut Vec<f32>, gathered: &mut Vec<f32>) -> Result<()> {
        let (n, e, ff) = (self.n, self.c.n_embd, self.c.n_ff);
        let (n_expert, k) = (moe.n_expert, moe.n_expert_used);
        let l = self.l;
        let router = l.router.as_ref().ok_or_else(|| ModelError::MissingTensor(format!("blk.{}.ffn_gate_inp.weight", self.il)))?;
        part.resize(n * (n_expert + e), 0.0);
        let (probs, acc) = part.split_at_mut(n * n_expert);
        if self.comm.is_some() {
            // Tensor parallel: each node computes its experts' router logits and one
            // exchange gives every node all of them, each from one node, so every node
            // routes every token alike (a replicated router could pick differently on
            // a near tie across SIMD levels, and the nodes would then disagree).
            let rows = self.router_rows(n_expert);
            let mut mine = vec![0f32; n * rows.len()];
            if !rows.is_empty() {
                matmul(self.pool, &self.unit.view(router)?.rows(rows.clone()), xb, n, &mut mine, self.quant)?;
            }
            crate::block::place(&mine, probs, n, &rows, n_expert);
            self.allreduce(probs)?;
        } else {
            matmul(self.pool, &self.unit.view(router)?, xb, n, probs, self.quant)?;
        }
        self.trace("ffn_moe_logits", probs);

        // Every (expert, token, weight) of the pass, by expert then token.
        let mut chosen: Vec<(usize, usize, f32)> = Vec::with_capacity(n * k);
        let (mut ids, mut w) = (vec![0usize; k], vec![0f32; k]);
        for (t, row) in probs.chunks_exact_mut(n_expert).enumerate() {
            if let Err(ex) = route(row, k, moe.norm_weights, &mut ids, &mut w) {
                // Name the culprit: a finite input means the router's own weights hold the
                // NaN/inf; otherwise it came from an earlier layer.
                let x = &xb[t * e..(t + 1) * e];
                let cause = if x.iter().all(|v| v.is_finite()) {
                    "its input is finite, so the router weights hold a NaN or infinity (a corrupt file?)"
                } else {
                    "its input (this layer's FFN input) already holds a NaN or infinity from an earlier step"
                };
                return Err(ModelError::NotFinite(format!(
                    "layer {}: the router (blk.{}.ffn_gate_inp.weight) gave logit {} for expert {ex} of token {t} of the pass; {cause}",
                    self.il, self.il, row[ex]
                )));
            }
            chosen.extend(ids.iter().zip(&w).map(|(&ex, &wt)| (ex, t, wt)));
        }
        self.trace("ffn_moe_probs", probs);
        chosen.sort_unstable_by_key(|&(ex, t, _)| (ex, t));

        acc.fill(0.0);
        // Experts in runs of at most `cap` (expert, token) pairs, each run two pool
        // dispatches (every gate and up, then every down) rather than three per expert:
        // a decode step's `k` small experts stream as one matvec would.
        let cap = n.max(k);
        gathered.resize(routed_len(n, e, ff, k), 0.0);
        let (x_in, rest) = gathered.split_at_mut(cap * e);
        let (y, rest) = rest.split_at_mut(cap * e);
        let (g, rest) = rest.split_at_mut(cap * ff);
        let (u, g_all) = rest.split_at_mut(cap * ff);
        // The rows of each token's sum this node computes: all of them, or the gather
        // schedule's rows (the other nodes add the rest).
        let out_rows = self.share.shapes[Mat::Down as usize].0.clone();
        let w_out = out_rows.len();
        // Under a memory budget a run also holds at most the expert cache's slots of
        // distinct experts (all loaded at once), so a long prefill pass needs no cut to
        // the slot count: each run streams its experts once for all of its tokens.
        // Under the gather schedule every run is an exchange, so every node must cut the
        // runs alike whatever its own cache holds: at most `n_expert_used` experts (every
        // expert cache holds that many, `Context::set_expert_source`).
        let max_experts = match self.expert_cache {
            _ if self.comm.is_some() && self.share.gather.is_some() => moe.n_expert_used,
            Some(c) => c.borrow().slots(),
            None => usize::MAX,
        };
        let mut groups = chosen.chunk_by(|a, b| a.0 == b.0).peekable();
        while groups.peek().is_some() {
            let mut run: Vec<&[(usize, usize, f32)]> = Vec::new();
            let mut pairs = 0;
            while let Some(grp) = groups.next_if(|grp| run.is_empty() || (pairs + grp.len() <= cap && run.len() < max_experts)) {
                pairs += grp.len();
                run.push(grp);
            }
            self.experts(moe.n_expert, &run, xb, x_in, g, u, g_all, y)?;
            // ggml_mul by the weight, then the add into the token's sum.
            for (i, &(_, t, wt)) in run.iter().flat_map(|grp| grp.iter()).enumerate() {
                let sum = &mut acc[t * e + out_rows.start..t * e + out_rows.end];
                for (a, &v) in sum.iter_mut().zip(&y[i * w_out..(i + 1) * w_out]) {
                    *a += v * wt;
                }
            }
        }
        // Tensor parallel: partial sums (sum schedule) or disjoint rows (gather) summed,
        // this node's part of a shared expert's output added first, so that one exchange
        // sums both.
        let split = self.comm.is_some();
        if let Some(s) = l.shared.as_ref().filter(|_| split) {
            self.shared_expert(s, xb, acc, gathered)?;
        }
        self.allreduce(acc)?;
        if let Some(s) = l.shared.as_ref().filter(|_| !split) {
            self.trace("ffn_moe_out", acc);
            self.shared_expert(s, xb, acc, gathered)?;
        }
        xb.copy_from_slice(acc);
        self.trace(if l.shared.is_some() { "ffn_out" } else { "ffn_moe_out" }, xb);
        Ok(())
    }

    /// `acc += sigmoid(g · x) · W_down,s · (silu(W_gate,s · x) ⊙ W_up,s · x)` for each token
    /// `x` of `xb` (`acc: [n, n_embd]` the routed experts' sums): the shared expert of
    /// Qwen2-MoE, a dense SwiGLU FFN every token goes through, scaled by one gate logit
    /// per token, as llama.cpp's `llm_build_qwen2moe` (scaled, then added to the routed
    /// sum). The gate logit, gate and up are one pool dispatch (the input quantized once).
    /// Its weights are the layer unit's (an expert cache holds routed experts only); a
    /// token's rows depend on its own row alone, so batch invariance holds as for the
    /// routed part.
    ///
    /// Tensor parallelism cuts it as a dense FFN is cut (`Share::shared`): this node's
    /// rows of its gate and up, then its columns of the down (sum schedule: a partial
    /// product, `acc` summed by the caller's exchange) or, gather schedule, every node's
    /// SwiGLU rows gathered (one exchange) and whole dot products for its output rows.
    /// Every node computes the gate logit itself (each has the whole input), so each
    /// scales its part alike.
    fn shared_expert(&mut self, s: &crate::SharedExpert, xb: &[f32], acc: &mut [f32], scratch: &mut Vec<f32>) -> Result<()> {
        let (n, e) = (self.n, self.c.n_embd);
        let [(rows, cols), _, (out_rows, down_cols)] = self.share.shared.clone();
        let (fl, w_out) = (rows.len(), out_rows.len());
        let all = if self.share.gather.is_some() { down_cols.len() } else { 0 };
        scratch.resize(shared_len(n, e, fl).max(n * (2 * fl + all + w_out + 1)), 0.0);
        let (g, rest) = scratch.split_at_mut(n * fl);
        let (u, rest) = rest.split_at_mut(n * fl);
        let (g_all, rest) = rest.split_at_mut(n * all);
        let (y, rest) = rest.split_at_mut(n * w_out);
        let logit = &mut rest[..n];
        let own = self.own.map(|b| &b.shared);
        let w_gi = self.unit.view(&s.gate_inp)?;
        let mut jobs = vec![MatJob { w: &w_gi, x: xb, n_tokens: n, out: logit }];
        let (w_g, w_u);
        if fl > 0 {
            w_g = self.view_of(&s.gate, own.map(|o| &o[0][..]), rows.clone(), cols.clone())?;
            w_u = self.view_of(&s.up, own.map(|o| &o[1][..]), rows.clone(), cols)?;
            jobs.push(MatJob { w: &w_g, x: xb, n_tokens: n, out: g });
            jobs.push(MatJob { w: &w_u, x: xb, n_tokens: n, out: u });
        }
        matmul_many(self.pool, &mut jobs, self.quant)?;
        drop(jobs);
        self.trace("ffn_shexp_gate_inp", logit);
        self.glu(ops::swiglu, g, u, fl);
        // The down's input: this node's SwiGLU rows, or (gather) every node's.
        let h: &[f32] = if all > 0 {
            crate::block::place(g, g_all, n, &rows, all);
            self.allreduce(g_all)?;
            g_all
        } else {
            g
        };
        if w_out == 0 || h.is_empty() {
            return Ok(()); // nothing of the output is this node's to add
        }
        let w_d = self.view_of(&s.down, own.map(|o| &o[2][..]), out_rows.clone(), down_cols)?;
        matmul(self.pool, &w_d, h, n, y, self.quant)?;
        self.trace("ffn_shexp", y);
        for ((sum, y), &z) in acc.chunks_exact_mut(e).zip(y.chunks_exact(w_out)).zip(logit.iter()) {
            // ggml_mul by the sigmoid, then the add into the routed sum.
            let gate = 1.0 / (1.0 + (-z).exp());
            for (a, &v) in sum[out_rows.clone()].iter_mut().zip(y) {
                *a += v * gate;
            }
        }
        Ok(())
    }

    /// Expert `e`'s matrix `m` as this node computes with it: its part in this node's
    /// compact copy under tensor parallelism (the experts' parts laid end to end), else
    /// the expert's rows of the stacked tensor.
    fn expert_view(&self, m: Mat, e: usize, n_expert: usize) -> Result<WeightView<'a>> {
        let Some(b) = self.own else { return self.unit.view(&self.l.expert(m, e, n_expert)) };
        let (rows, cols) = self.share.shapes[m as usize].clone();
        let t = self.l.matrix(m);
        let size = rows.len() * t.ty.row_bytes(cols.len() as u64).unwrap_or(0) as usize;
        let bytes = b.m[m as usize].get(e * size..(e + 1) * size).ok_or_else(|| {
            ModelError::Weights(format!("expert {e} of {} is past this node's copy ({} bytes)", t.name, b.m[m as usize].len()))
        })?;
        Ok(WeightView::new(t.ty, bytes, rows.len(), cols.len())?)
    }

    /// The expert FFNs of one run of groups (each group one expert's (expert, token,
    /// weight) triples, in token order): `y[i] = W_down · (silu(W_gate · x) ⊙ W_up · x)` for
    /// the run's `i`-th pair, `y: [pairs, rows]` with this node's rows of the output (all
    /// `n_embd`, or the gather schedule's). A group whose tokens are consecutive reads them
    /// from `xb` in place (a decode step's one token: every expert's gate and up then share
    /// one quantized input); others are gathered into `x_in` first.
    ///
    /// Tensor parallelism splits each expert as a dense FFN is split (its gate and up by
    /// rows, its down by the matching columns: `share.shapes`), not the experts among the
    /// nodes: every node then reads its share of every routed expert, so the work stays
    /// balanced whatever the router picks, and a layer costs the exchanges a dense one does
    /// (docs/PARALLEL.md). The gather schedule first gathers every node's SwiGLU rows
    /// (`g_all`) and computes whole dot products for its output rows.
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &mut self,
        n_expert: usize,
        run: &[&[(usize, usize, f32)]],
        xb: &[f32],
        x_in: &mut [f32],
        g: &mut [f32],
        u: &mut [f32],
        g_all: &mut [f32],
        y: &mut [f32],
    ) -> Result<()> {
        let e = self.c.n_embd;
        let ffl = self.share.shapes[Mat::Gate as usize].0.clone();
        let (fl, w_out) = (ffl.len(), self.share.shapes[Mat::Down as usize].0.len());
        let pairs: usize = run.iter().map(|grp| grp.len()).sum();
        if fl == 0 && self.share.gather.is_none() {
            // Sum schedule on a node without FFN rows: its part of every expert is empty.
            y[..pairs * w_out].fill(0.0);
            return Ok(());
        }
        // Under a memory budget an expert cache's slots (all of the run's experts loaded
        // in one call); else the mapping's, the layer unit's or this node's copy's bytes.
        let mut cache = self.expert_cache.map(std::cell::RefCell::borrow_mut);
        let views = match cache.as_deref_mut() {
            Some(c) => crate::experts::views(c, self.l, self.il, n_expert, run)?,
            None => {
                let mut views = Vec::with_capacity(3 * run.len());
                for grp in run {
                    for m in [Mat::Gate, Mat::Up, Mat::Down] {
                        views.push(self.expert_view(m, grp[0].0, n_expert)?);
                    }
                }
                views
            }
        };
        // Inputs: a slice of `xb`, or the gathered rows.
        let in_place: Vec<bool> = run.iter().map(|grp| grp.iter().enumerate().all(|(i, p)| p.1 == grp[0].1 + i)).collect();
        let mut at = 0;
        for (grp, &in_place) in run.iter().zip(&in_place) {
            let m = grp.len();
            if !in_place {
                for (i, &(_, t, _)) in grp.iter().enumerate() {
                    x_in[(at + i) * e..(at + i + 1) * e].copy_from_slice(&xb[t * e..(t + 1) * e]);
                }
            }
            at += m;
        }
        let mut at = 0;
        let (mut g_rest, mut u_rest) = (&mut g[..], &mut u[..]);
        let mut jobs = Vec::with_capacity(2 * run.len());
        for (i, grp) in run.iter().enumerate() {
            let (t0, m) = (grp[0].1, grp.len());
            let x = if in_place[i] { &xb[t0 * e..(t0 + m) * e] } else { &x_in[at * e..(at + m) * e] };
            let (gh, gr) = std::mem::take(&mut g_rest).split_at_mut(m * fl);
            let (uh, ur) = std::mem::take(&mut u_rest).split_at_mut(m * fl);
            (g_rest, u_rest) = (gr, ur);
            jobs.push(MatJob { w: &views[3 * i], x, n_tokens: m, out: gh });
            jobs.push(MatJob { w: &views[3 * i + 1], x, n_tokens: m, out: uh });
            at += m;
        }
        matmul_many(self.pool, &mut jobs, self.quant)?;
        drop(jobs);
        debug_assert_eq!(pairs, at);
        self.glu(ops::swiglu, &mut g[..pairs * fl], &u[..pairs * fl], fl);
        // The down projections' input: this node's SwiGLU rows, or every node's.
        let (h, hw): (&[f32], usize) = if self.share.gather.is_some() {
            let ff = self.c.n_ff;
            let all = &mut g_all[..pairs * ff];
            crate::block::place(&g[..pairs * fl], all, pairs, &ffl, ff);
            self.allreduce(all)?;
            (all, ff)
        } else {
            (g, fl)
        };
        let (mut at, mut y_rest) = (0, &mut y[..]);
        let mut jobs = Vec::with_capacity(run.len());
        for (i, grp) in run.iter().enumerate() {
            let m = grp.len();
            let (yh, yr) = std::mem::take(&mut y_rest).split_at_mut(m * w_out);
            y_rest = yr;
            jobs.push(MatJob { w: &views[3 * i + 2], x: &h[at * hw..(at + m) * hw], n_tokens: m, out: yh });
            at += m;
        }
        matmul_many(self.pool, &mut jobs, self.quant)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_takes_the_top_k_and_renormalises() {
        // softmax([0, ln 2, ln 4, ln 3]) = [1, 2, 4, 3] / 10; top 2: experts 2 and 3.
        let mut l = [0.0, 2f32.ln(), 4f32.ln(), 3f32.ln()];
        let (mut ids, mut w) = ([0; 2], [0.0; 2]);
        route(&mut l, 2, true, &mut ids, &mut w).unwrap();
        assert_eq!(ids, [2, 3]);
        assert!((w[0] - 4.0 / 7.0).abs() < 1e-6 && (w[1] - 3.0 / 7.0).abs() < 1e-6, "{w:?}");
        // Equal probabilities: the lower id first; k = n_expert keeps every expert.
        let mut l = [1.0f32; 3];
        let (mut ids, mut w) = ([0; 3], [0.0; 3]);
        route(&mut l, 3, true, &mut ids, &mut w).unwrap();
        assert_eq!(ids, [0, 1, 2]);
        assert!(w.iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-6));
    }

    #[test]
    fn route_refuses_a_nan_or_infinite_logit() {
        // A NaN once made every probability NaN and the top k experts 0..k, silently.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut l = [0.5, 1.0, bad, 0.25];
            let (mut ids, mut w) = ([0; 2], [0.0; 2]);
            assert_eq!(route(&mut l, 2, true, &mut ids, &mut w), Err(2), "{bad}");
        }
    }
}
