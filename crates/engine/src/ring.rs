//! `--parallel ring`: the coordinator's side of a pipelined ring (issue #7). Gather the
//! workers (with their profiles when the solver is to choose), assign the layer windows
//! (`hearth_parallel::solver`, or `--layer-window`), open the ring, and report per device
//! what the solver predicted.

use crate::{explain, mib, ClusterRun, Handle, ProfileFn};
use anyhow::{bail, Context as _, Result};
use hearth_memory::plan::{plan, ModelSummary, PlanParams, DEFAULT_MEMBW_GBPS};
use hearth_model::{Context, Model};
use hearth_parallel::profile::LinkProfile;
use hearth_parallel::ring::{PendingRing, RingHandle};
use hearth_parallel::solver::{solve, Assignment, DevicePrediction, DeviceSpec, ModelCost};
use hearth_parallel::{ClusterOptions, CommCounters, CommStats, Layout};

/// Link bandwidth assumed where none was measured, Mbit/s.
const ASSUMED_MBIT: f64 = 1000.0;

/// One device of a running ring.
#[derive(Debug, Clone)]
pub struct RingDevice {
    /// `this machine` or the worker's address.
    pub name: String,
    /// Layers per round.
    pub window: usize,
    /// The solver's prediction for it, when the solver chose the windows.
    pub predicted: Option<DevicePrediction>,
}

/// A running ring, for reports.
pub struct RingRun {
    /// The coordinator's link counters and the workers' stats.
    pub handle: RingHandle,
    /// The devices in ring order, this machine first.
    pub devices: Vec<RingDevice>,
    /// Rounds per token.
    pub k: usize,
    /// The solver's predicted decode ms per token, when it chose.
    pub predicted_ms: Option<f64>,
}

impl RingRun {
    /// The coordinator's counters as a group's: the token's time on the other devices
    /// counts as time "in the group".
    pub fn comm_counters(&self) -> CommCounters {
        let c = self.handle.counters();
        CommCounters {
            passes: c.rounds,
            allreduces: 0,
            total: CommStats { bytes_sent: c.bytes_sent, bytes_received: c.bytes_received, seconds: c.ring_secs },
            allreduce_secs: 0.0,
            step_secs: 0.0,
        }
    }
}

/// Open the ring of `opts` (its layout must be a ring) with `ctx` as the head device;
/// `budget`: this machine's `--mem-budget`, for the solver; `profile`: measures this
/// machine for the solver (needed unless `opts` gives the windows). Prints the assignment.
pub fn apply(
    model: &Model,
    ctx: &mut Context,
    opts: &ClusterOptions,
    budget: Option<u64>,
    profile: Option<ProfileFn>,
) -> Result<ClusterRun> {
    let Layout::Ring { windows, require_all } = &opts.layout else { bail!("not a ring layout") };
    let n_layer = model.config.n_layer;
    if let Some(w) = windows {
        check_windows(w, n_layer)?;
    }
    let path = model.file.path();
    let sha = hearth_parallel::model_hash::file_sha256(path).with_context(|| format!("hashing {}", path.display()))?;
    let pending = hearth_parallel::ring::gather(model, sha, &opts.workers, opts.key.as_ref(), opts.timeout, windows.is_none())
        .map_err(|e| explain(e, opts))?;
    let (windows, assignment) = match windows {
        Some(w) => (w.clone(), None),
        None => {
            let Some(profile) = profile else {
                bail!("the ring's layer solver needs this machine's profile: give the windows with --layer-window");
            };
            let (a, cost, devices) = solve_windows(model, ctx, &pending, budget, profile)?;
            (a.windows.clone(), Some((a, cost, devices)))
        }
    };
    let dropped: Vec<&str> = opts.workers.iter().enumerate().filter(|&(i, _)| windows[i + 1] == 0).map(|(_, a)| a.as_str()).collect();
    if !dropped.is_empty() {
        let why = left_out(&windows, &opts.workers, &dropped, assignment.as_ref().map(|(a, c, d)| (a, c, d.as_slice())));
        if *require_all {
            bail!("--require-all-workers: {why}");
        }
        eprintln!("note: {why}; --require-all-workers refuses instead");
    }
    let assignment = assignment.map(|(a, _, _)| a);
    let per_round: usize = windows.iter().sum();
    let group = pending
        .open(model, &windows, ctx.n_ctx(), ctx.n_batch(), ctx.cache_type(), ctx.f32_attention_from())
        .map_err(|e| explain(e, opts))?;
    let k = n_layer / per_round;
    let pred = |i: usize| assignment.as_ref().map(|a| a.per_device[i].clone());
    let mut devices = vec![RingDevice { name: "this machine".into(), window: windows[0], predicted: pred(0) }];
    devices.extend(group.workers.iter().map(|w| RingDevice { name: w.addr.clone(), window: w.window, predicted: pred(w.node) }));
    eprintln!(
        "pipelined ring over {}: k = {} of {} (activations pass in f32):",
        crate::plural(devices.len(), "device"),
        crate::plural(k, "round"),
        crate::plural(per_round, "layer")
    );
    let layers = |rounds: &[std::ops::Range<usize>]| {
        let spans: Vec<String> = rounds.iter().filter(|r| !r.is_empty()).map(hearth_parallel::span).collect();
        if spans.is_empty() {
            "none".to_string()
        } else {
            spans.join(", ")
        }
    };
    eprintln!("  device 0 (this machine): {} per round, layers {}", crate::plural(windows[0], "layer"), layers(&group.windows.rounds));
    for (p, w) in group.workers.iter().enumerate() {
        let rounds = hearth_model::RingWindows::from_assignment(n_layer, &windows, w.node)?.rounds;
        eprintln!(
            "  device {} ({}): {} per round, layers {}; {} of weights, KV cache {}",
            p + 1,
            w.addr,
            crate::plural(w.window, "layer"),
            layers(&rounds),
            mib(w.weight_bytes),
            mib(w.kv_bytes)
        );
    }
    if !dropped.is_empty() {
        eprintln!("  left out (given no layers): {}", dropped.join(", "));
    }
    if let Some(a) = &assignment {
        eprintln!("  solver: predicted TPOT {:.1} ms/token; {}", a.predicted_ms_per_token, a.explanation.replace('\n', "\n  "));
    }
    let handle = group.link.handle();
    ctx.set_ring(group.windows, Some(Box::new(group.link)))?;
    let workers = devices[1..].iter().map(|d| d.name.clone()).collect();
    let run = RingRun { handle, devices, k, predicted_ms: assignment.map(|a| a.predicted_ms_per_token) };
    Ok(ClusterRun { n_nodes: run.devices.len(), wire: hearth_parallel::WireType::F32, workers, handle: Handle::Ring(run) })
}

/// Refuse `--layer-window` values `w` no ring of `n_layer` layers can run: a window
/// above the model's layers, none above 0, or a sum the layers are not a multiple of.
pub fn check_windows(w: &[usize], n_layer: usize) -> Result<()> {
    if let Some(&big) = w.iter().find(|&&x| x > n_layer) {
        bail!("--layer-window {big} is more than the model's {n_layer} layers");
    }
    let per_round: usize = w.iter().sum();
    if per_round == 0 {
        bail!("--layer-window gives no device any layers: at least one window must be above 0");
    }
    if !n_layer.is_multiple_of(per_round) {
        bail!("--layer-window {w:?} covers {per_round} layers per round; the model's {n_layer} layers must be a multiple of that");
    }
    Ok(())
}

/// Why workers got no layers, in one sentence: how many devices the ring runs on (or
/// that it is this machine alone) and, when the solver chose, its predicted TPOT against
/// an even split over every device.
fn left_out(windows: &[usize], workers: &[String], dropped: &[&str], solved: Option<(&Assignment, &ModelCost, &[DeviceSpec])>) -> String {
    let used = windows.iter().filter(|&&w| w > 0).count();
    let ring = match windows.iter().position(|&w| w > 0) {
        Some(0) if used == 1 => "the ring is one device, this machine alone".to_string(),
        // (This machine still samples and holds the token embeddings.)
        Some(i) if used == 1 => format!("the ring is one device, worker {}, and this machine runs no layers", workers[i - 1]),
        _ => format!("the ring runs on {used} of {} devices", windows.len()),
    };
    let Some((a, cost, devices)) = solved else {
        return format!("{ring}: --layer-window gives {} no layers", dropped.join(", "));
    };
    // An even split of one round over every device (the first ones take the remainder).
    let n = windows.len();
    let even: Vec<usize> = (0..n).map(|i| cost.n_layer / n + usize::from(i < cost.n_layer % n)).collect();
    let all = match hearth_parallel::solver::predict(cost, devices, 1, &even) {
        Some((ms, _)) => format!("{ms:.1} ms/token for an even split over all {n}"),
        None => format!("an even split over all {n} does not fit their memory"),
    };
    format!(
        "{ring}: the layer solver left out {} (predicted TPOT {:.1} ms/token without, {all})",
        dropped.join(", "),
        a.predicted_ms_per_token
    )
}

/// The solver's windows over this machine and the gathered workers, with the cost and
/// devices it solved over.
fn solve_windows(
    model: &Model,
    ctx: &Context,
    pending: &PendingRing,
    budget: Option<u64>,
    profile: ProfileFn,
) -> Result<(Assignment, ModelCost, Vec<DeviceSpec>)> {
    let params = PlanParams {
        n_ctx: ctx.n_ctx(),
        n_batch: ctx.n_batch(),
        n_threads: ctx.n_threads(),
        cache_type: ctx.cache_type(),
        logits_all: false,
    };
    let (cost, devices) = devices(model, params, pending, budget, profile)?;
    let a = solve(&cost, &devices)?;
    Ok((a, cost, devices))
}

/// What the solver needs: the model's cost and every device (this machine, with
/// `budget` or its available RAM, then the gathered workers) with its profile, usable
/// memory (its budget less scratch, runtime and the window's margin, as the memory plan
/// for `params` counts them) and link (the coordinator's measured round trip to the
/// next device; links between workers are not measured).
pub fn devices(
    model: &Model,
    params: PlanParams,
    pending: &PendingRing,
    budget: Option<u64>,
    profile: ProfileFn,
) -> Result<(ModelCost, Vec<DeviceSpec>)> {
    let summary = ModelSummary::from_gguf(&model.file)?;
    let kv_row = params.cache_type.row_bytes(model.config.kv_dim()) as u64;
    let cost = model_cost(&summary, params.n_ctx, kv_row);
    let threads = params.n_threads;
    let p = plan(&summary, params, 0, DEFAULT_MEMBW_GBPS);
    let usable = |b: u64| b.saturating_sub(p.scratch_bytes + p.overhead_bytes + hearth_memory::plan::WINDOW_MARGIN_BASE + b / 32);
    let me = profile(model.file.path(), threads)?;
    // The coordinator's measured link to worker i (bandwidth assumed where unmeasured).
    let link = |peer: String, i: usize| {
        let m = pending.members.get(i);
        let mbit = m.map_or(0.0, |m| m.mbit);
        LinkProfile { peer, rtt_ms: m.map_or(0.0, |m| m.rtt_ms), mbit: if mbit > 0.0 { mbit } else { ASSUMED_MBIT } }
    };
    let mine = budget.unwrap_or(me.ram_available_bytes);
    let mut devices = vec![DeviceSpec { profile: me, budget_bytes: usable(mine), link: link("device 1".into(), 0) }];
    for (i, m) in pending.members.iter().enumerate() {
        if !m.profile.has_model {
            bail!("worker {} has no model file: a ring worker needs it (start it with -m MODEL, not --model-sha256)", m.addr);
        }
        let Some(mut profile) = m.profile.profile.clone() else {
            bail!("worker {} has no device profile (it could not measure one): give the windows with --layer-window", m.addr);
        };
        profile.name = m.addr.clone();
        // Links between workers are not measured: take the coordinator's link to the next device.
        let next = if i + 1 < pending.members.len() { i + 1 } else { i };
        devices.push(DeviceSpec { profile, budget_bytes: usable(m.profile.budget_bytes), link: link(format!("device {}", i + 2), next) });
    }
    Ok((cost, devices))
}

/// What one token costs the solver's model, from the file's tensor table.
pub fn model_cost(m: &ModelSummary, n_ctx: usize, kv_row_bytes: u64) -> ModelCost {
    let layers = m.shape.n_layer.max(1);
    let layer_bytes = m.largest_layer_bytes();
    let is_layer = |n: &str| n.starts_with("blk.");
    // A mixture of experts: a token reads `n_expert_used / n_expert` of the stacked
    // experts (3-D tensors), the rest of the layer whole.
    let share = match m.experts {
        Some((n, used)) if n > 0 => used as f64 / n as f64,
        _ => 1.0,
    };
    let active = |t: &hearth_memory::TensorSummary| if t.n_dims == 3 { t.bytes as f64 * share } else { t.bytes as f64 };
    let expert_layer_bytes = m.expert_bytes() / layers as u64;
    let active_layer_bytes = layer_bytes - expert_layer_bytes.min(layer_bytes) + (expert_layer_bytes as f64 * share) as u64;
    let layer_params: f64 = m
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .map(|t| active(t) * t.ty.block_size() as f64 / t.ty.type_size().max(1) as f64)
        .sum();
    // The type of most of the bytes a token reads in the layers names the matmul rate to use.
    let mut by_type = std::collections::BTreeMap::<String, u64>::new();
    for t in m.tensors.iter().filter(|t| is_layer(&t.name) && t.n_dims >= 2) {
        *by_type.entry(t.ty.name().to_lowercase()).or_default() += active(t) as u64;
    }
    let weight_type = by_type.into_iter().max_by_key(|(_, b)| *b).map(|(t, _)| t).unwrap_or_else(|| "q4_0".into());
    ModelCost {
        n_layer: layers,
        layer_bytes,
        active_layer_bytes,
        expert_layer_bytes,
        expert_active_share: share,
        layer_flops: 2.0 * layer_params,
        kv_bytes_per_layer_token: 2 * kv_row_bytes,
        n_ctx: n_ctx as u64,
        act_bytes: 4 * m.shape.n_embd as u64,
        extra_bytes: m.tensors.iter().filter(|t| !is_layer(&t.name)).map(|t| t.bytes).sum(),
        weight_type,
        head_bytes: m.tensor("output.weight").or_else(|| m.tensor("token_embd.weight")).map_or(0, |t| t.bytes),
    }
}
