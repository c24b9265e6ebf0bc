//! Layer assignment for pipelined-ring parallelism (issue #7, part 2), in the style of
//! prima.cpp's Halda (Li et al., arXiv 2504.08791).
//!
//! # The setting
//!
//! The `L` transformer layers are cut into windows. A token travels `k` times around a
//! ring of devices (`k` *rounds*); in every round device `i` runs the next `w_i`
//! consecutive layers and hands the activations to the next device of the ring. So
//! `Σ w_i = W = L / k` and device `i` holds `n_i = k·w_i` layers in all. Device 0 (the
//! coordinator) also holds the embedding and the output head and is always in the ring
//! (it may run no layers); any other device with `w_i = 0` is *dropped*: it is not in
//! the ring and costs no hop.
//!
//! # The cost model (per generated token, decode)
//!
//! With `S` the devices in the ring (`|S|` of them):
//!
//! ```text
//! T(k, w) = Σ_{i∈S} [ k·w_i·t_i  +  disk_i ]  +  k·H
//!
//! t_i     = max(layer_bytes / decode_i, layer_flops / peak_i)       ms per layer
//! hop_i   = rtt_i / 2 + act_bytes / bandwidth_i                     ms, device i → the next device of the ring
//! H       = Σ_{i∈S} hop_i  (0 when |S| = 1)                         ms of hops per round
//! need_i  = k·w_i·(layer_bytes + kv_layer) + [i = 0]·extra_bytes    bytes to hold everything
//! disk_i  = min over the regimes device i can use:
//!   resident / spill:  spill_i / disk_i,   spill_i = max(0, need_i − budget_i)
//!                      (spill_i > 0 needs a disk)
//!   streaming:         k·max(0, load_i − T_other_i)
//!                      when it has a disk and
//!                      2·w_i·layer_bytes + k·w_i·kv_layer + [i = 0]·extra_bytes ≤ budget_i
//!     load_i    = w_i·layer_bytes / disk_i                          ms to load its next window
//!     T_other_i = Σ_{j∈S, j≠i} w_j·t_j + H                          ms the token spends elsewhere per round
//! ```
//!
//! - `decode_i` is the device's measured matrix-vector rate on the model's weight type
//!   ([`DeviceProfile::rate`], GB/s of weights streamed) or, when that type was not
//!   measured, its memory read bandwidth; `peak_i` is the measured prefill GFLOP/s of
//!   that type (decode is bandwidth-bound, so the byte term normally wins).
//! - `kv_layer = kv_bytes_per_layer_token · n_ctx`: the KV cache of one layer, sized for
//!   the context. The KV cache and the embedding must stay resident in every regime;
//!   only layer weights and, on device 0, the output head (streamed in row chunks under a
//!   budget) may live on disk. A device with no measured disk
//!   (`disk_seq_read_gbps ≤ 0`) must hold all its layers.
//! - *Resident / spill*: a device whose layers fit holds them all and never touches the
//!   disk. One whose layers do not fit may re-read the part that does not fit from disk
//!   at `disk_seq_read_gbps` for every token, with no overlap (with mmap and a cyclic
//!   access pattern the page cache keeps evicting what it is about to need).
//! - *Streaming with prefetch* (prima.cpp's pipelined ring, Li et al., arXiv 2504.08791):
//!   with `k` rounds a device keeps only two windows of `w_i` layers resident (the one it
//!   runs and the one being loaded) and, in every round, loads its next window while the
//!   token is on the other devices (their compute for the round and the round's hops),
//!   so it stalls only for the part of the load that the rest of the ring does not hide.
//!   Its resident set is `2·w_i` layers of weights plus its whole KV cache (and the head
//!   on device 0). For `k ≤ 2` two windows are all its layers, so streaming only matters
//!   for `k ≥ 3`.
//! - Each device uses whichever of its feasible regimes costs less (ties: resident/spill).
//! - Links: `DeviceSpec::link` is device `i`'s link to the next device. When devices are
//!   dropped, the predecessor's hop is assumed to cost what its measured link costs (links
//!   are not measured pairwise).
//!
//! This remains a simplification of Halda's model, which also models GPUs and
//! OS-specific memory behaviour. The trade-off it captures: hops grow with `k`, and with
//! every device resident `k = 1` is best; but a larger `k` shrinks the windows, so a
//! device short of RAM can stream its layers from a fast disk while the rest of the ring
//! hides the loads, which can beat re-reading spilled weights without overlap at `k = 1`.
//!
//! # The method
//!
//! As issue #7 describes Halda: for every `k` dividing `L` and every set of devices `S` (all subsets
//! containing device 0 for up to [`EXHAUSTIVE_MAX_DEVICES`] devices; beyond that, greedy
//! dropping of one device at a time while that helps), solve the mixed-integer program
//!
//! ```text
//! minimise   Σ k·t_i·w_i + Σ s_i/disk_i + Σ k·u_i + ε·z
//! subject to Σ w_i = L/k,  w_0 ≥ 0,  w_i ≥ 1 (i ∈ S \ {0}),  integer
//!            b_i ∈ {0, 1}  (1 = streaming; fixed to 0 without a disk or when k ≤ 2)
//!            s_i ≥ need_i(w_i) − budget_i − M·b_i,  s_i ≥ 0       (spilled GiB; 0 without a disk)
//!            k·w_i·kv_layer + [i = 0]·(extra − head) ≤ budget_i    (KV and embedding stay resident)
//!            2·w_i·layer + k·w_i·kv_layer + [i = 0]·extra ≤ budget_i + M·(1 − b_i)
//!            u_i ≥ w_i·layer/disk_i − Σ_{j≠i} t_j·w_j − H − M·(1 − b_i),  u_i ≥ 0   (stall per round)
//!            z ≥ k·t_i·w_i                                         (tie-break: balance)
//! ```
//!
//! (`M` a big-M bound on each left-hand side) with the pure-Rust `microlp` backend of
//! `good_lp`, and keep the fastest by [`predict`]. The small `ε` term breaks ties (a
//! homogeneous cluster without spill has many equally fast splits) toward the split with
//! the smallest per-device compute time, which is the balanced one.

use crate::profile::{DeviceProfile, LinkProfile};
use good_lp::{constraint, microlp, variable, variables, Expression, Solution, SolverModel, Variable};
use thiserror::Error;

/// Devices up to which every subset is tried; above, devices are dropped greedily.
pub const EXHAUSTIVE_MAX_DEVICES: usize = 8;

const GIB: f64 = (1u64 << 30) as f64;
/// Weight of the balance tie-break, per ms of the largest per-device compute time.
const TIE_BREAK: f64 = 1e-7;

/// What the model costs, per layer and per token.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCost {
    /// Transformer layers (`L`).
    pub n_layer: usize,
    /// Weight bytes of one layer.
    pub layer_bytes: u64,
    /// Bytes of one layer a decoded token reads: `layer_bytes`, with a mixture of
    /// experts' stacked experts counted at [`Self::expert_active_share`] of their bytes.
    pub active_layer_bytes: u64,
    /// Bytes of one layer's stacked experts (0 for a dense model).
    pub expert_layer_bytes: u64,
    /// The share of a layer's experts one token routes to, `n_expert_used / n_expert`
    /// (1 for a dense model).
    pub expert_active_share: f64,
    /// FLOPs of one layer for one token (2 × the parameters a token uses).
    pub layer_flops: f64,
    /// KV cache bytes of one layer for one token of context.
    pub kv_bytes_per_layer_token: u64,
    /// Context length the KV cache is sized for, tokens.
    pub n_ctx: u64,
    /// Bytes sent per hop (the activations: `n_embd · 4`).
    pub act_bytes: u64,
    /// Bytes of the non-layer part (token embedding + output head), on device 0.
    pub extra_bytes: u64,
    /// GGML type name of the layer weights (`q4_0`, …), to look up the matmul rate.
    pub weight_type: String,
    /// Bytes of the output head streamed per token (on device 0, at its matmul rate).
    pub head_bytes: u64,
}

impl ModelCost {
    /// KV cache of one layer at `n_ctx`, bytes.
    pub fn kv_layer_bytes(&self) -> u64 {
        self.kv_bytes_per_layer_token * self.n_ctx
    }

    /// Whether the layers hold a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.expert_layer_bytes > 0
    }

    /// Bytes a decoded token reads from disk on a device whose `n` layers are `spill`
    /// bytes over its budget. Dense: all of them (every token reads every layer). A
    /// mixture of experts: under a budget hearth keeps experts, not whole layers (an
    /// expert cache, `hearth_memory::ExpertCache`), so of the experts that do not fit a
    /// token reads only those it routes to, `expert_active_share` of them with routing
    /// spread evenly, and any spill beyond the experts (their attention) whole.
    pub fn spill_read_bytes(&self, spill: u64, n: usize) -> f64 {
        let experts = spill.min(n as u64 * self.expert_layer_bytes);
        experts as f64 * self.expert_active_share + (spill - experts) as f64
    }
}

/// One device as the solver sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSpec {
    /// Measured capabilities.
    pub profile: DeviceProfile,
    /// Bytes of RAM the model may use on this device.
    pub budget_bytes: u64,
    /// The link from this device to the next one of the ring.
    pub link: LinkProfile,
}

/// The predicted cost of one device, per token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DevicePrediction {
    /// Running its layers, ms.
    pub compute_ms: f64,
    /// Re-reading spilled weights from disk, ms.
    pub disk_ms: f64,
    /// Its outgoing hops (`k` of them), ms.
    pub network_ms: f64,
    /// Bytes it keeps in RAM (weights, KV cache, and on device 0 the embedding and head).
    pub resident_bytes: u64,
    /// Whether it streams its layers from disk, two windows resident, prefetching the
    /// next window while the token is on the other devices.
    pub streaming: bool,
}

/// The solver's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Rounds per token.
    pub k: usize,
    /// Layers per round for each device (`w_i`); 0 on a device other than 0 = dropped.
    pub windows: Vec<usize>,
    /// The model's prediction for one decoded token, ms.
    pub predicted_ms_per_token: f64,
    /// Per-device breakdown (zeros for dropped devices).
    pub per_device: Vec<DevicePrediction>,
    /// A few lines saying why.
    pub explanation: String,
}

/// Why there is no assignment.
#[derive(Debug, Error, PartialEq)]
pub enum SolveError {
    /// The inputs make no sense (no devices, no layers, no measured rates).
    #[error("bad input: {0}")]
    BadInput(String),
    /// No assignment fits the memory budgets; the text says what is missing where.
    #[error("no layer assignment fits: {0}")]
    Infeasible(String),
}

/// Decode time of one layer on `dev`, ms (see the module docs).
fn layer_ms(model: &ModelCost, dev: &DeviceProfile) -> Option<f64> {
    let (gbps, gflops) = match dev.rate(&model.weight_type) {
        Some(r) if r.decode_gbps > 0.0 => (r.decode_gbps, r.prefill_gflops),
        _ => (dev.mem_read_gbps, 0.0),
    };
    if gbps <= 0.0 || !gbps.is_finite() {
        return None;
    }
    let bytes_ms = model.active_layer_bytes as f64 / (gbps * 1e6);
    let flops_ms = if gflops > 0.0 { model.layer_flops / (gflops * 1e6) } else { 0.0 };
    Some(bytes_ms.max(flops_ms))
}

/// The output head on `dev` (device 0), ms per token.
fn head_ms(model: &ModelCost, dev: &DeviceProfile) -> Option<f64> {
    let gbps = match dev.rate(&model.weight_type) {
        Some(r) if r.decode_gbps > 0.0 => r.decode_gbps,
        _ => dev.mem_read_gbps,
    };
    (gbps > 0.0).then(|| model.head_bytes as f64 / (gbps * 1e6))
}

/// One hop from a device over `link`, ms (infinite when the link has no bandwidth).
fn hop_ms(model: &ModelCost, link: &LinkProfile) -> f64 {
    if link.mbit <= 0.0 {
        return f64::INFINITY;
    }
    link.rtt_ms.max(0.0) / 2.0 + model.act_bytes as f64 * 8.0 / (link.mbit * 1e3)
}

/// Disk time per spilled byte, ms, or `None` when the device may not spill.
fn disk_ms_per_byte(dev: &DeviceProfile) -> Option<f64> {
    (dev.disk_seq_read_gbps > 0.0).then(|| 1.0 / (dev.disk_seq_read_gbps * 1e6))
}

/// Bytes of device `i`'s non-layer part that may live on disk: the output head on device 0
/// (under a budget hearth streams it in row chunks like a layer, `hearth_model::head_chunks`),
/// re-read every token. The embedding and the KV cache stay resident.
fn head_spill(model: &ModelCost, i: usize) -> u64 {
    if i == 0 {
        model.head_bytes.min(model.extra_bytes)
    } else {
        0
    }
}

/// Bytes device `i` must hold for `n` layers (weights + KV, plus the head on device 0).
fn need_bytes(model: &ModelCost, i: usize, n: usize) -> u64 {
    let extra = if i == 0 { model.extra_bytes } else { 0 };
    n as u64 * (model.layer_bytes + model.kv_layer_bytes()) + extra
}

/// The cost model for one given plan: `None` when it does not fit (KV or head over
/// budget, spill without a disk, a hop over a dead link) or `Σ w_i·k ≠ L`.
/// Returns the ms per token and the per-device breakdown. Each device takes the cheaper
/// of its feasible regimes (resident or spilling, streaming with prefetch).
pub fn predict(model: &ModelCost, devices: &[DeviceSpec], k: usize, windows: &[usize]) -> Option<(f64, Vec<DevicePrediction>)> {
    if k == 0 || windows.len() != devices.len() || windows.iter().sum::<usize>() * k != model.n_layer {
        return None;
    }
    let in_ring: Vec<bool> = windows.iter().enumerate().map(|(i, &w)| i == 0 || w > 0).collect();
    let ring_size = in_ring.iter().filter(|&&b| b).count();
    // per-round compute of every device of the ring, and the hops of one round
    let mut round_ms = vec![0.0; devices.len()];
    let mut hops_ms = 0.0;
    for (i, d) in devices.iter().enumerate() {
        if !in_ring[i] {
            continue;
        }
        if windows[i] > 0 {
            round_ms[i] = windows[i] as f64 * layer_ms(model, &d.profile)?;
        }
        if ring_size > 1 {
            hops_ms += hop_ms(model, &d.link);
        }
    }
    let mut out = vec![DevicePrediction::default(); devices.len()];
    for (i, d) in devices.iter().enumerate() {
        if !in_ring[i] {
            continue;
        }
        let n = k * windows[i];
        let need = need_bytes(model, i, n);
        let spill = need.saturating_sub(d.budget_bytes);
        if spill > n as u64 * model.layer_bytes + head_spill(model, i) {
            return None; // the KV cache (or the embedding) does not fit
        }
        let per_byte = disk_ms_per_byte(&d.profile);
        // resident, or spilling and re-reading the excess every token
        let spill_option = match (spill, per_byte) {
            (0, _) => Some((0.0, need)),
            (s, Some(pb)) => Some((model.spill_read_bytes(s, n) * pb, need - s)),
            (_, None) => None,
        };
        // streaming: two windows resident, the next one prefetched while the token is
        // elsewhere (not for a mixture of experts: its budget holds experts, not windows)
        let stream_resident = need - n as u64 * model.layer_bytes + 2 * windows[i] as u64 * model.layer_bytes;
        let stream_option = match per_byte {
            Some(pb) if spill > 0 && stream_resident <= d.budget_bytes && !model.is_moe() => {
                let load = (windows[i] as u64 * model.layer_bytes) as f64 * pb;
                let other: f64 = round_ms.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &r)| r).sum::<f64>() + hops_ms;
                Some((k as f64 * (load - other).max(0.0), stream_resident))
            }
            _ => None,
        };
        let (disk_ms, resident_bytes, streaming) = match (spill_option, stream_option) {
            (Some(a), Some(b)) if b.0 < a.0 => (b.0, b.1, true),
            (Some(a), _) => (a.0, a.1, false),
            (None, Some(b)) => (b.0, b.1, true),
            (None, None) => return None,
        };
        // Device 0 also computes the output head once per token.
        let head_ms = if i == 0 { head_ms(model, &d.profile)? } else { 0.0 };
        let compute_ms = k as f64 * round_ms[i] + head_ms;
        let network_ms = if ring_size > 1 { k as f64 * hop_ms(model, &d.link) } else { 0.0 };
        if !network_ms.is_finite() {
            return None;
        }
        out[i] = DevicePrediction { compute_ms, disk_ms, network_ms, resident_bytes, streaming };
    }
    let total = out.iter().map(|p| p.compute_ms + p.disk_ms + p.network_ms).sum();
    Some((total, out))
}

/// Predicted prefill time of an `n_prompt`-token prompt (TTFT) for the plan `(k,
/// windows)`, ms, and each device's part: its windows at the larger of its byte-bound
/// and FLOP-bound time for the batch (`n_prompt · layer_flops / prefill GFLOP/s`), the
/// output head for one token on device 0, its disk time as for a decoded token, and
/// `k` hops of `n_prompt` activations. `None` when [`predict`] is.
pub fn predict_prefill(model: &ModelCost, devices: &[DeviceSpec], k: usize, windows: &[usize], n_prompt: usize) -> Option<(f64, Vec<f64>)> {
    let (_, decode) = predict(model, devices, k, windows)?;
    let ring_size = windows.iter().enumerate().filter(|&(i, &w)| i == 0 || w > 0).count();
    let mut per = vec![0.0; devices.len()];
    for (i, d) in devices.iter().enumerate() {
        if i != 0 && windows[i] == 0 {
            continue;
        }
        let (gbps, gflops) = match d.profile.rate(&model.weight_type) {
            Some(r) if r.decode_gbps > 0.0 => (r.decode_gbps, r.prefill_gflops),
            _ => (d.profile.mem_read_gbps, 0.0),
        };
        let bytes_ms = model.layer_bytes as f64 / (gbps * 1e6);
        let flops_ms = if gflops > 0.0 { model.layer_flops * n_prompt as f64 / (gflops * 1e6) } else { bytes_ms * n_prompt as f64 };
        let head = if i == 0 { head_ms(model, &d.profile)? } else { 0.0 };
        let hop = if ring_size > 1 {
            let bytes = model.act_bytes as f64 * n_prompt as f64;
            d.link.rtt_ms.max(0.0) / 2.0 + bytes * 8.0 / (d.link.mbit.max(1e-9) * 1e3)
        } else {
            0.0
        };
        per[i] = (k * windows[i]) as f64 * bytes_ms.max(flops_ms) + head + decode[i].disk_ms + k as f64 * hop;
    }
    Some((per.iter().sum(), per))
}

/// The best `w` for rounds `k` over the ring `ring` (device indices, 0 first), by ILP.
/// `None` when infeasible.
fn solve_fixed(model: &ModelCost, devices: &[DeviceSpec], k: usize, ring: &[usize]) -> Option<Vec<usize>> {
    let big_w = model.n_layer / k;
    let kf = k as f64;
    let layer_gib = model.layer_bytes as f64 / GIB;
    let per_layer_gib = (model.layer_bytes + model.kv_layer_bytes()) as f64 / GIB;
    let kv_gib = model.kv_layer_bytes() as f64 / GIB;
    let hops: f64 = if ring.len() > 1 { ring.iter().map(|&i| hop_ms(model, &devices[i].link)).sum() } else { 0.0 };
    if !hops.is_finite() {
        return None;
    }
    let times: Vec<f64> = ring.iter().map(|&i| layer_ms(model, &devices[i].profile)).collect::<Option<_>>()?;
    let mut vars = variables!();
    let z = vars.add(variable().min(0.0));
    let mut w: Vec<Variable> = Vec::new();
    let mut objective: Expression = TIE_BREAK * z;
    let mut constraints = Vec::new();
    let mut sum = Expression::from(0.0);
    for &i in ring {
        let lo = if i == 0 { 0.0 } else { 1.0 };
        w.push(vars.add(variable().integer().min(lo).max(big_w as f64)));
    }
    for (pos, &i) in ring.iter().enumerate() {
        let d = &devices[i];
        let t = times[pos];
        let wi = w[pos];
        let disk = disk_ms_per_byte(&d.profile);
        let extra = if i == 0 { model.extra_bytes as f64 / GIB } else { 0.0 };
        let budget = d.budget_bytes as f64 / GIB;
        // Streaming never beats holding everything for k ≤ 2 (two windows are all of it);
        // a mixture of experts' budget holds experts instead.
        let can_stream = disk.is_some() && k >= 3 && !model.is_moe();
        // b = 1: streaming with prefetch; b = 0: resident or spilling
        let b = vars.add(variable().integer().min(0.0).max(if can_stream { 1.0 } else { 0.0 }));
        let si = vars.add(variable().min(0.0).max(if disk.is_some() { f64::INFINITY } else { 0.0 }));
        // (A mixture of experts reads about the routed share of its spill: exact for a
        // spill of experts, which `predict` then checks.)
        objective += kf * t * wi + disk.unwrap_or(0.0) * GIB * model.expert_active_share * si;
        let m_spill = kf * per_layer_gib * big_w as f64 + extra + 1.0;
        constraints.push(constraint!(si >= kf * per_layer_gib * wi + extra - budget - m_spill * b));
        let resident_extra = extra - head_spill(model, i) as f64 / GIB;
        constraints.push(constraint!(kf * kv_gib * wi + resident_extra <= budget));
        constraints.push(constraint!(z >= kf * t * wi));
        if can_stream {
            let pb = disk.unwrap_or(0.0);
            let load = layer_gib * GIB * pb; // ms per layer from disk
            let m_mem = (2.0 * layer_gib + kf * kv_gib) * big_w as f64 + extra + 1.0;
            let m_load = load * big_w as f64 + 1.0;
            // stall per round
            let ui = vars.add(variable().min(0.0));
            objective += kf * ui;
            constraints.push(constraint!((2.0 * layer_gib + kf * kv_gib) * wi + extra - m_mem * (1.0 - b) <= budget));
            let mut other = Expression::from(hops);
            for (q, &wj) in w.iter().enumerate() {
                if q != pos {
                    other += times[q] * wj;
                }
            }
            constraints.push(constraint!(ui >= load * wi - other - m_load * (1.0 - b)));
        }
        sum += wi;
    }
    constraints.push(constraint!(sum == big_w as f64));
    let mut problem = vars.minimise(objective).using(microlp);
    for c in constraints {
        problem = problem.with(c);
    }
    let solution = problem.solve().ok()?;
    let mut windows = vec![0; devices.len()];
    for (&i, wi) in ring.iter().zip(&w) {
        windows[i] = solution.value(*wi).round() as usize;
    }
    Some(windows)
}

/// The best `(k, windows, ms)` over every divisor `k` of `L` for the ring `ring`.
fn best_for_ring(model: &ModelCost, devices: &[DeviceSpec], ring: &[usize]) -> Option<(usize, Vec<usize>, f64, Vec<DevicePrediction>)> {
    let mut best: Option<(usize, Vec<usize>, f64, Vec<DevicePrediction>)> = None;
    for k in (1..=model.n_layer).filter(|&k| model.n_layer.is_multiple_of(k)) {
        // every device of the ring but device 0 needs a layer per round
        if model.n_layer / k + 1 < ring.len() {
            continue;
        }
        let Some(w) = solve_fixed(model, devices, k, ring) else { continue };
        let Some((ms, per_device)) = predict(model, devices, k, &w) else { continue };
        if best.as_ref().is_none_or(|b| ms < b.2) {
            best = Some((k, w, ms, per_device));
        }
    }
    best
}

/// Finds the layer assignment with the lowest predicted decode time per token.
pub fn solve(model: &ModelCost, devices: &[DeviceSpec]) -> Result<Assignment, SolveError> {
    if devices.is_empty() || model.n_layer == 0 {
        return Err(SolveError::BadInput("need at least one device and one layer".into()));
    }
    if let Some((i, d)) = devices.iter().enumerate().find(|(_, d)| layer_ms(model, &d.profile).is_none()) {
        return Err(SolveError::BadInput(format!(
            "device {i} ({}) has no matmul rate for {} and no memory bandwidth",
            d.profile.name, model.weight_type
        )));
    }
    let m = devices.len();
    // (ring, k, windows, ms) for every ring tried
    let mut tried: Vec<(Vec<usize>, usize, Vec<usize>, f64)> = Vec::new();
    // the per-device predictions of the fastest ring so far (the first of equals)
    let mut best_per_device: Option<(f64, Vec<DevicePrediction>)> = None;
    let mut try_ring = |ring: Vec<usize>| -> Option<f64> {
        let (k, w, ms, per_device) = best_for_ring(model, devices, &ring)?;
        if best_per_device.as_ref().is_none_or(|b| ms < b.0) {
            best_per_device = Some((ms, per_device));
        }
        tried.push((ring, k, w, ms));
        Some(ms)
    };
    if m <= EXHAUSTIVE_MAX_DEVICES {
        for mask in 0..1usize << (m - 1) {
            let ring: Vec<usize> = std::iter::once(0).chain((1..m).filter(|i| mask >> (i - 1) & 1 == 1)).collect();
            try_ring(ring);
        }
    } else {
        // Greedy: drop the device whose removal helps most, while one does.
        let mut ring: Vec<usize> = (0..m).collect();
        let mut cost = try_ring(ring.clone()).unwrap_or(f64::INFINITY);
        loop {
            let mut best_drop: Option<(usize, f64)> = None;
            for pos in 1..ring.len() {
                let mut r = ring.clone();
                r.remove(pos);
                if let Some(c) = try_ring(r) {
                    if c < cost && best_drop.is_none_or(|b| c < b.1) {
                        best_drop = Some((pos, c));
                    }
                }
            }
            let Some((pos, c)) = best_drop else { break };
            ring.remove(pos);
            cost = c;
        }
    }
    let (Some(best), Some((_, per_device))) = (tried.iter().min_by(|a, b| a.3.total_cmp(&b.3)).cloned(), best_per_device) else {
        return Err(SolveError::Infeasible(infeasible_message(model, devices)));
    };
    let (ring, k, windows, ms) = best;
    let explanation = explain(model, devices, &tried, &ring, k, &windows, ms, &per_device);
    Ok(Assignment { k, windows, predicted_ms_per_token: ms, per_device, explanation })
}

/// GiB with one decimal, or MiB below 1 GiB (a small model's budgets and layers would
/// all print as "0.0 GiB").
fn gib(bytes: f64) -> String {
    if bytes >= GIB {
        format!("{:.1} GiB", bytes / GIB)
    } else {
        format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
    }
}

/// Says what memory is missing where, when nothing fits.
fn infeasible_message(model: &ModelCost, devices: &[DeviceSpec]) -> String {
    let l = model.n_layer;
    let share = l.div_ceil(devices.len());
    let mut lines = Vec::new();
    let mut holds = 0.0;
    for (i, d) in devices.iter().enumerate() {
        let budget = d.budget_bytes as f64;
        // what must stay resident per layer: the KV cache, or everything without a disk
        let (per_layer, what) = if disk_ms_per_byte(&d.profile).is_some() {
            (model.kv_layer_bytes(), "KV cache")
        } else {
            (model.layer_bytes + model.kv_layer_bytes(), "layers + KV cache (no disk to spill to)")
        };
        let extra = if i == 0 { model.extra_bytes } else { 0 };
        let need = share as u64 * per_layer + extra;
        let fits = d.budget_bytes.saturating_sub(extra).checked_div(per_layer).unwrap_or(u64::MAX);
        holds += (fits.min(l as u64) as f64 * per_layer as f64 + extra as f64).min(budget);
        if need > d.budget_bytes {
            let head = if i == 0 { " + embedding/head" } else { "" };
            lines.push(format!(
                "device {i} ({}) needs {} for the {what} of an equal share of {share} layers{head} but has a {} budget (room for {} layers)",
                d.profile.name,
                gib(need as f64),
                gib(budget),
                fits.min(l as u64)
            ));
        }
    }
    let must_hold = if devices.iter().all(|d| disk_ms_per_byte(&d.profile).is_some()) {
        l as u64 * model.kv_layer_bytes() + model.extra_bytes
    } else {
        need_bytes(model, 0, l)
    };
    lines.push(format!(
        "all devices together hold {} of the {} that must stay resident (model {}, KV cache {} at {} tokens)",
        gib(holds),
        gib(must_hold as f64),
        gib(need_bytes(model, 0, l).saturating_sub(l as u64 * model.kv_layer_bytes()) as f64),
        gib((l as u64 * model.kv_layer_bytes()) as f64),
        model.n_ctx
    ));
    if lines.len() == 1 {
        lines.insert(0, "no ring of reachable devices fits (a link without bandwidth?)".into());
    }
    lines.join("; ")
}

#[allow(clippy::too_many_arguments)]
fn explain(
    model: &ModelCost,
    devices: &[DeviceSpec],
    tried: &[(Vec<usize>, usize, Vec<usize>, f64)],
    ring: &[usize],
    k: usize,
    windows: &[usize],
    ms: f64,
    per: &[DevicePrediction],
) -> String {
    let sum = |f: fn(&DevicePrediction) -> f64| per.iter().map(f).sum::<f64>();
    let mut s = format!(
        "k = {k} {} of {} layers, windows {windows:?}: {ms:.2} ms/token = {:.2} compute + {:.2} disk + {:.2} network\n",
        if k == 1 { "round" } else { "rounds" },
        model.n_layer / k,
        sum(|p| p.compute_ms),
        sum(|p| p.disk_ms),
        sum(|p| p.network_ms)
    );
    for &i in ring {
        let p = &per[i];
        s += &format!(
            "  device {i} ({}): {} layers{}, {} resident of a {} budget, {:.2} ms compute, {:.2} ms disk, {:.2} ms link\n",
            devices[i].profile.name,
            k * windows[i],
            match (p.streaming, p.disk_ms > 0.0) {
                (true, _) => " (streamed from disk, next window prefetched)",
                // prima.cpp's page-cache spill: what the budget does not hold is read again
                (false, true) => " (more than its budget holds: the rest re-read from disk every token)",
                (false, false) => "",
            },
            gib(p.resident_bytes as f64),
            gib(devices[i].budget_bytes as f64),
            p.compute_ms,
            p.disk_ms,
            p.network_ms
        );
    }
    for i in (0..devices.len()).filter(|i| !ring.contains(i)) {
        let with_it = tried.iter().filter(|t| t.0.contains(&i)).map(|t| t.3).min_by(f64::total_cmp);
        let why = match with_it {
            Some(c) => format!("the best plan using it predicts {c:.2} ms/token (+{:.2})", c - ms),
            None => "no plan using it fits (or it was not tried)".into(),
        };
        s += &format!(
            "  device {i} ({}) dropped: its hop costs {:.2} ms per round; {why}\n",
            devices[i].profile.name,
            hop_ms(model, &devices[i].link)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::MatmulRate;
    use rand::{Rng, SeedableRng};

    const MB: u64 = 1 << 20;
    const GB: u64 = 1 << 30;

    fn model(n_layer: usize, layer_mb: u64) -> ModelCost {
        ModelCost {
            n_layer,
            layer_bytes: layer_mb * MB,
            active_layer_bytes: layer_mb * MB,
            expert_layer_bytes: 0,
            expert_active_share: 1.0,
            layer_flops: 2.0 * (layer_mb * MB) as f64 * 2.0, // ~2 params per byte (4-bit)
            kv_bytes_per_layer_token: 4096,
            n_ctx: 4096,
            act_bytes: 4096 * 4,
            extra_bytes: 500 * MB,
            weight_type: "q4_0".into(),
            head_bytes: 0,
        }
    }

    fn device(name: &str, decode_gbps: f64, budget: u64, disk_gbps: f64, rtt_ms: f64, mbit: f64) -> DeviceSpec {
        DeviceSpec {
            profile: DeviceProfile {
                name: name.into(),
                mem_read_gbps: decode_gbps * 1.5,
                disk_seq_read_gbps: disk_gbps,
                matmul: vec![MatmulRate { ty: "q4_0".into(), threads: 4, decode_gbps, prefill_gflops: 200.0 }],
                ..Default::default()
            },
            budget_bytes: budget,
            link: LinkProfile { peer: "next".into(), rtt_ms, mbit },
        }
    }

    /// The best plan by trying every `(k, w)`.
    fn brute_force(model: &ModelCost, devices: &[DeviceSpec]) -> Option<f64> {
        fn rec(left: usize, slots: usize, cur: &mut Vec<usize>, f: &mut dyn FnMut(&[usize])) {
            if slots == 1 {
                cur.push(left);
                f(cur);
                cur.pop();
                return;
            }
            for x in 0..=left {
                cur.push(x);
                rec(left - x, slots - 1, cur, f);
                cur.pop();
            }
        }
        let mut best: Option<f64> = None;
        for k in (1..=model.n_layer).filter(|&k| model.n_layer.is_multiple_of(k)) {
            rec(model.n_layer / k, devices.len(), &mut Vec::new(), &mut |w| {
                if let Some((ms, _)) = predict(model, devices, k, w) {
                    best = Some(best.map_or(ms, |b: f64| b.min(ms)));
                }
            });
        }
        best
    }

    #[test]
    fn solver_matches_brute_force() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut feasible, mut infeasible) = (0, 0);
        for case in 0..60 {
            let n_layer = rng.gen_range(1..=32);
            let mut m = model(n_layer, rng.gen_range(20..200));
            m.n_ctx = rng.gen_range(0..8192);
            let n_dev = rng.gen_range(1..=4);
            let devices: Vec<DeviceSpec> = (0..n_dev)
                .map(|i| {
                    let mut d = device(
                        &format!("d{i}"),
                        rng.gen_range(2.0..60.0),
                        rng.gen_range(0..(n_layer as u64 * m.layer_bytes / 2 + GB)),
                        if rng.gen_bool(0.8) { rng.gen_range(0.2..5.0) } else { 0.0 },
                        rng.gen_range(0.05..30.0),
                        rng.gen_range(50.0..10_000.0),
                    );
                    if rng.gen_bool(0.3) {
                        d.profile.matmul.clear(); // falls back to mem_read_gbps
                    }
                    d
                })
                .collect();
            let brute = brute_force(&m, &devices);
            match (solve(&m, &devices), brute) {
                (Ok(a), Some(b)) => {
                    feasible += 1;
                    assert!(
                        (a.predicted_ms_per_token - b).abs() <= 1e-6 * b + 1e-9,
                        "case {case}: solver {} vs brute force {b}\n{}",
                        a.predicted_ms_per_token,
                        a.explanation
                    );
                    let (ms, _) = predict(&m, &devices, a.k, &a.windows).unwrap();
                    assert_eq!(ms, a.predicted_ms_per_token);
                }
                (Err(SolveError::Infeasible(msg)), None) => {
                    infeasible += 1;
                    assert!(msg.contains("all devices together hold"), "{msg}");
                }
                (got, want) => panic!("case {case}: solver {got:?}, brute force {want:?}"),
            }
        }
        assert!(feasible >= 30, "only {feasible} feasible cases ({infeasible} infeasible)");
    }

    #[test]
    fn solver_matches_brute_force_when_streaming() {
        // Tight budgets, fast disks and layer counts with many divisors: streaming regimes.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (mut feasible, mut streamed) = (0, 0);
        for case in 0..60 {
            let n_layer = [12, 18, 24, 30, 36][rng.gen_range(0..5)];
            let mut m = model(n_layer, rng.gen_range(50..300));
            m.n_ctx = rng.gen_range(0..2048);
            let n_dev = rng.gen_range(1..=4);
            let devices: Vec<DeviceSpec> = (0..n_dev)
                .map(|i| {
                    device(
                        &format!("d{i}"),
                        rng.gen_range(2.0..30.0),
                        m.extra_bytes + rng.gen_range(0..(n_layer as u64 * m.layer_bytes / n_dev as u64 + 1)),
                        if rng.gen_bool(0.9) { rng.gen_range(1.0..20.0) } else { 0.0 },
                        rng.gen_range(0.05..5.0),
                        rng.gen_range(100.0..10_000.0),
                    )
                })
                .collect();
            let brute = brute_force(&m, &devices);
            match (solve(&m, &devices), brute) {
                (Ok(a), Some(b)) => {
                    feasible += 1;
                    streamed += a.per_device.iter().any(|p| p.streaming) as usize;
                    assert!(
                        (a.predicted_ms_per_token - b).abs() <= 1e-6 * b + 1e-9,
                        "case {case}: solver {} vs brute force {b}\n{}",
                        a.predicted_ms_per_token,
                        a.explanation
                    );
                }
                (Err(SolveError::Infeasible(_)), None) => {}
                (got, want) => panic!("case {case}: solver {got:?}, brute force {want:?}"),
            }
        }
        eprintln!("{feasible} feasible, {streamed} streaming");
        assert!(feasible >= 30 && streamed >= 5, "{feasible} feasible, {streamed} streaming");
    }

    #[test]
    fn infeasible_says_what_is_missing_where() {
        // 40 layers of 1 GiB, no disk anywhere: 40 GiB must be resident, 11 GiB is available.
        let mut m = model(40, 1024);
        m.n_ctx = 0;
        let devices = vec![
            device("big", 20.0, 5 * GB, 0.0, 1.0, 1000.0),
            device("mid", 20.0, 4 * GB, 0.0, 1.0, 1000.0),
            device("small", 20.0, 2 * GB, 0.0, 1.0, 1000.0),
        ];
        let Err(SolveError::Infeasible(msg)) = solve(&m, &devices) else { panic!() };
        assert!(msg.contains("device 2 (small) needs 14.0 GiB"), "{msg}");
        assert!(msg.contains("but has a 2.0 GiB budget (room for 2 layers)"), "{msg}");
        assert!(msg.contains("all devices together hold 10.5 GiB of the 40.5 GiB"), "{msg}");

        // With disks, only the KV cache must fit: 32 layers × 1 GiB of KV at 256 Ki tokens.
        let mut m = model(32, 100);
        m.n_ctx = 256 * 1024;
        let devices = vec![device("a", 20.0, 8 * GB, 2.0, 1.0, 1000.0), device("b", 20.0, 8 * GB, 2.0, 1.0, 1000.0)];
        let Err(SolveError::Infeasible(msg)) = solve(&m, &devices) else { panic!() };
        assert!(msg.contains("KV cache of an equal share of 16 layers"), "{msg}");
    }

    #[test]
    fn slow_link_device_is_dropped() {
        let m = model(32, 200); // 6.25 GiB of layers
        let mut devices: Vec<DeviceSpec> = (0..3).map(|i| device(&format!("fast{i}"), 20.0, 4 * GB, 1.0, 1.0, 1000.0)).collect();
        devices.push(device("far", 40.0, 4 * GB, 1.0, 500.0, 1.0)); // fastest CPU, terrible link
        let a = solve(&m, &devices).unwrap();
        assert_eq!(a.windows[3], 0, "{}", a.explanation);
        assert!(a.explanation.contains("device 3 (far) dropped"), "{}", a.explanation);
        assert_eq!(a.per_device[3], DevicePrediction::default());
    }

    #[test]
    fn many_devices() {
        // 8 devices: every subset × the 10 divisors of 80; 10 devices: the greedy path.
        let m = model(80, 400); // 31 GiB of layers
        for n in [8, 10] {
            let mut devices: Vec<DeviceSpec> =
                (0..n).map(|i| device(&format!("n{i}"), 10.0 + i as f64, 5 * GB, 1.0, 1.0, 1000.0)).collect();
            devices[n - 1].link.mbit = 0.5;
            let start = std::time::Instant::now();
            let a = solve(&m, &devices).unwrap();
            eprintln!("{n} devices: {:?}\n{}", start.elapsed(), a.explanation);
            assert_eq!(a.windows[n - 1], 0, "{}", a.explanation);
            assert_eq!(a.windows.iter().sum::<usize>() * a.k, 80);
            let brute_check = predict(&m, &devices, a.k, &a.windows).unwrap().0;
            assert_eq!(brute_check, a.predicted_ms_per_token);
        }
    }

    #[test]
    fn short_of_ram_device_streams_with_prefetch() {
        // 36 layers of 200 MiB (7 GiB); devices 0 and 1 hold 3 GiB each, device 2 only 1 GiB
        // but reads its NVMe at 10 GB/s. At k = 1 some 4 layers must be re-read from disk
        // every token; with k = 6 rounds of 2 layers each, device 2 keeps 2 windows resident
        // and loads its next 2 layers (42 ms) while the others compute theirs (84 ms).
        let mut m = model(36, 200);
        m.n_ctx = 0;
        let devices = vec![
            device("a", 10.0, 3 * GB, 1.0, 1.0, 1000.0),
            device("b", 10.0, 3 * GB, 1.0, 1.0, 1000.0),
            device("short", 10.0, GB, 10.0, 1.0, 1000.0),
        ];
        let a = solve(&m, &devices).unwrap();
        let mut best_k1 = f64::INFINITY;
        for w0 in 0..=36 {
            for w1 in 0..=36 - w0 {
                if let Some((ms, _)) = predict(&m, &devices, 1, &[w0, w1, 36 - w0 - w1]) {
                    best_k1 = best_k1.min(ms);
                }
            }
        }
        assert!(a.k > 1, "{}", a.explanation);
        assert!(a.predicted_ms_per_token < best_k1, "k = 1 best {best_k1}\n{}", a.explanation);
        assert!(a.per_device[2].streaming, "{}", a.explanation);
        assert_eq!(a.per_device[2].disk_ms, 0.0, "{}", a.explanation); // fully hidden
        assert!(a.per_device[2].resident_bytes <= GB);
        eprintln!("best k = 1: {best_k1:.2} ms\n{}", a.explanation);
        assert_eq!(a.predicted_ms_per_token, brute_force(&m, &devices).unwrap());
    }

    #[test]
    fn a_moe_device_short_of_ram_reads_only_its_routed_experts() {
        // 24 layers of 600 MiB, 560 MiB of them experts of which a token routes to 1/16
        // (Qwen3-30B-A3B's 8 of 128): 75 MiB read per layer per token. Two devices of 6 GiB
        // and 4 GiB, disks at 2 GB/s: 4 GiB of layers cannot be held.
        let mut m = model(24, 600);
        (m.expert_layer_bytes, m.expert_active_share) = (560 * MB, 1.0 / 16.0);
        m.active_layer_bytes = 40 * MB + 35 * MB;
        m.layer_flops = 2.0 * m.active_layer_bytes as f64 * 2.0;
        (m.n_ctx, m.extra_bytes) = (0, 0);
        let devices = vec![device("a", 10.0, 6 * GB, 2.0, 1.0, 1000.0), device("b", 10.0, 4 * GB, 2.0, 1.0, 1000.0)];
        let a = solve(&m, &devices).unwrap();
        let best = brute_force(&m, &devices).unwrap();
        assert!((a.predicted_ms_per_token - best).abs() < 1e-9, "brute force {best}: {}", a.explanation);
        assert!(a.per_device.iter().all(|p| !p.streaming), "an expert cache, not windows: {}", a.explanation);
        // Compute: the bytes a token reads (75 MiB a layer at 10 GB/s), not the layer's 600.
        let layer_ms = 75.0 * MB as f64 / 10e6;
        let n: Vec<usize> = a.windows.iter().map(|w| w * a.k).collect();
        for (p, &n) in a.per_device.iter().zip(&n) {
            assert!((p.compute_ms - n as f64 * layer_ms).abs() < 1e-6, "{}", a.explanation);
        }
        // Disk: of the experts that do not fit, only the routed 1/16 each token.
        let spill: u64 = n.iter().zip(&devices).map(|(&n, d)| (n as u64 * 600 * MB).saturating_sub(d.budget_bytes)).sum();
        assert!(spill >= 4 * GB, "{}", a.explanation);
        let disk: f64 = a.per_device.iter().map(|p| p.disk_ms).sum();
        assert!((disk - spill as f64 / 16.0 / 2e6).abs() < 1e-6, "disk {disk} ms for {spill} bytes spilled: {}", a.explanation);
        // Control: the same layers as whole-layer reads (a dense model's view) re-read
        // every spilled byte, 16 times the disk time.
        let mut whole = m.clone();
        (whole.expert_layer_bytes, whole.expert_active_share) = (0, 1.0);
        let (_, dense) = predict(&whole, &devices, a.k, &a.windows).unwrap();
        let dense_disk: f64 = dense.iter().map(|p| p.disk_ms).sum();
        assert!((dense_disk - 16.0 * disk).abs() < 1e-6, "{dense_disk} vs {disk}");
    }

    #[test]
    fn device_0_may_stream_its_output_head() {
        // A 300 MiB head on a device 0 with 200 MiB: it streams the head (re-read every
        // token) and gives its layers to the other device. Control: a model whose non-layer
        // part cannot be streamed (no head bytes: all embedding) fits nowhere.
        let mut m = model(4, 100);
        (m.extra_bytes, m.head_bytes, m.n_ctx) = (300 * MB, 300 * MB, 0);
        let devices = vec![device("small", 10.0, 200 * MB, 1.0, 1.0, 1000.0), device("big", 10.0, 8 * GB, 1.0, 1.0, 1000.0)];
        let a = solve(&m, &devices).unwrap();
        assert_eq!(a.windows, vec![0, 4], "{}", a.explanation);
        assert!((a.per_device[0].disk_ms - (100 * MB) as f64 / 1e6).abs() < 1e-6, "{}", a.explanation);
        m.head_bytes = 0;
        assert!(matches!(solve(&m, &devices), Err(SolveError::Infeasible(_))));
    }

    #[test]
    fn homogeneous_cluster_gets_equal_windows() {
        // 32 layers of 200 MiB, each device can hold 9 (+ the head on device 0): all four
        // are needed to avoid the disk, and the balanced split wins the tie.
        let mut m = model(32, 200);
        m.extra_bytes = 0;
        m.n_ctx = 0;
        let devices: Vec<DeviceSpec> = (0..4).map(|i| device(&format!("n{i}"), 20.0, 9 * 200 * MB, 0.5, 2.0, 1000.0)).collect();
        let a = solve(&m, &devices).unwrap();
        assert_eq!(a.k, 1, "{}", a.explanation);
        assert_eq!(a.windows, vec![8, 8, 8, 8], "{}", a.explanation);
        let c = a.per_device[0].compute_ms;
        assert!(a.per_device.iter().all(|p| (p.compute_ms - c).abs() < 1e-9));
    }
}
