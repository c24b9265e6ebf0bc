//! A memory budget (`--mem-budget`): when the mapped model does not fit, its layers are
//! streamed from disk through a sliding window (`hearth_memory::Window`) of as many
//! layers as the budget holds, read ahead while the current one computes. A mixture of
//! experts keeps experts instead (`hearth_memory::ExpertCache`; on one machine, a ring
//! device's own layers, or a tensor-parallel worker's shard file of expert cuts): the
//! window holds the blocks without their experts, and the rest of the budget is expert
//! slots.
//! `HEARTH_WHOLE_LAYERS=1` streams whole layers instead (the baseline to compare with).

use crate::{mib, BudgetOptions};
use anyhow::Result;
use hearth_memory::plan::{plan, plan_experts, plan_window, ModelSummary, Plan, PlanParams, StaysMapped, WindowPlan, DEFAULT_MEMBW_GBPS};
use hearth_memory::{ExpertCache, Window};
use hearth_model::{Context, Model};
use std::ops::Range;

/// `HEARTH_WHOLE_LAYERS=1`: a mixture of experts streams whole layers, no expert cache.
fn whole_layers() -> bool {
    std::env::var_os("HEARTH_WHOLE_LAYERS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Every layer's experts' `[gate, up, down]` file ranges ([`hearth_model::expert_ranges`]).
type ExpertRanges = [Vec<[Range<usize>; 3]>];

/// The window plan for `budget` from the file byte ranges of the units (`units`; without
/// their experts when `experts` gives every layer's expert ranges and the experts one
/// token uses): the one computation behind both what `--mem-budget` enforces ([`apply`])
/// and what `hearth plan -m` prints ([`plan_model`]), so plan's smallest budget is the one
/// generate accepts. `Err`: the plan at the smallest workable budget.
pub fn plan_units(
    p: &Plan,
    units: &[Range<usize>],
    experts: Option<(&ExpertRanges, usize)>,
    budget: u64,
    disk_gbps: f64,
) -> Result<WindowPlan, Box<WindowPlan>> {
    let sizes: Vec<u64> = units.iter().map(|r| hearth_memory::window::aligned_len(r) as u64).collect();
    match experts {
        Some((r, k)) => {
            let es = r.iter().flatten().map(hearth_memory::experts::expert_slot_bytes).max().unwrap_or(0) as u64;
            plan_experts(p, &sizes, es, r.iter().map(Vec::len).sum(), k, budget, disk_gbps)
        }
        None => plan_window(p, &sizes, budget, disk_gbps),
    }
}

/// [`plan_units`] for the whole model on one machine, as [`apply`] plans it for
/// `generate --mem-budget` (an expert cache for a mixture of experts unless
/// `HEARTH_WHOLE_LAYERS` is set): `p` from the same [`PlanParams`] gives the same plan.
pub fn plan_model(model: &Model, p: &Plan, budget: u64, disk_gbps: f64) -> Result<Result<WindowPlan, Box<WindowPlan>>> {
    let w = &model.weights;
    Ok(match model.config.moe.filter(|_| !whole_layers()) {
        Some(m) => {
            let r = hearth_model::expert_ranges(w, m.n_expert);
            plan_units(p, &hearth_model::unit_ranges_without_experts(w)?, Some((&r, m.n_expert_used)), budget, disk_gbps)
        }
        None => plan_units(p, &hearth_model::unit_ranges(w)?, None, budget, disk_gbps),
    })
}

/// With a budget, plan the window and attach it to `ctx` (or say the mapped model fits).
/// `logits_all`: the run wants every position's logits (perplexity). Prints the decision
/// to stderr; returns the window plan.
pub fn apply(model: &Model, ctx: &mut Context, budget: Option<&BudgetOptions>, logits_all: bool) -> Result<Option<WindowPlan>> {
    apply_units(model, ctx, budget, logits_all, true)
}

/// [`apply`] for a pipelined-ring device: only its own layers (and, on the head device,
/// `head`, the output head) count and stream. When they do not all fit, no unit is
/// pinned: every slot streams, so the next window is prefetched while the token is on
/// the other devices.
pub fn apply_ring(model: &Model, ctx: &mut Context, budget: Option<&BudgetOptions>, head: bool) -> Result<Option<WindowPlan>> {
    apply_units(model, ctx, budget, false, head)
}

fn apply_units(
    model: &Model,
    ctx: &mut Context,
    budget: Option<&BudgetOptions>,
    logits_all: bool,
    head: bool,
) -> Result<Option<WindowPlan>> {
    let Some(b) = budget else { return Ok(None) };
    let budget = b.bytes;
    let summary = ModelSummary::from_gguf(&model.file)?;
    let params =
        PlanParams { n_ctx: ctx.n_ctx(), n_batch: ctx.n_batch(), n_threads: ctx.n_threads(), cache_type: ctx.cache_type(), logits_all };
    let mut p = plan(&summary, params, hearth_memory::available_bytes().unwrap_or(0), DEFAULT_MEMBW_GBPS);
    let ring = ctx.ring_windows().is_some();
    // Every layer's experts this context runs (none for the layers another ring device
    // runs: the cache is sized over this device's experts and never asked for the others;
    // a tensor-parallel worker's shard file holds each expert's cut end to end, so its
    // cache keeps cuts), and no cache at all when it runs no expert bytes (a ring head
    // with no layers, a tensor-parallel node without FFN rows).
    let owned_experts = model.config.moe.filter(|_| !whole_layers()).and_then(|m| {
        let mut r = hearth_model::expert_ranges(&model.weights, m.n_expert);
        for (il, layer) in r.iter_mut().enumerate() {
            if !ctx.owns_layer(il) {
                layer.clear();
            }
        }
        r.iter().flatten().flatten().any(|x| !x.is_empty()).then_some((r, m))
    });
    let moe = owned_experts.as_ref().map(|(_, m)| *m);
    let units = if moe.is_some() { ctx.units_without_experts(head)? } else { ctx.units(head)? };
    if ring {
        // Only this device's layers (experts included: mapped, it holds them all) and
        // their KV cache.
        let mapped: u64 = ctx.units(head)?.iter().map(|r| r.len() as u64).sum();
        p.kv_cache_bytes = ctx.kv_bytes() as u64;
        p.peak_rss_bytes = mapped + p.kv_cache_bytes + p.scratch_bytes + p.overhead_bytes;
    } else if ctx.n_slots() > 1 {
        // A server's slots: one sequence's KV cache each.
        let kv = p.kv_cache_bytes * ctx.n_slots() as u64;
        p.peak_rss_bytes += kv - p.kv_cache_bytes;
        p.kv_cache_bytes = kv;
    }
    let expert_ranges = owned_experts.map(|(r, _)| r);
    let planned = plan_units(&p, &units, expert_ranges.as_deref().zip(moe.map(|m| m.n_expert_used)), budget, 0.0);
    let mut w = planned.map_err(|min| {
        let q8 = if ctx.cache_type() == hearth_model::CacheType::Q8_0 { "" } else { ", or --cache-type q8_0" };
        anyhow::anyhow!(
            "--mem-budget {} is too small: KV cache {} + scratch {} + runtime {} + one unit of {}{} + a margin of {} \
             (16 MiB + 1/32 of that minimum, for error in the runtime estimate) need at least {} ({} bytes) \
             (or lower {}{q8}{})",
            mib(budget),
            mib(p.kv_cache_bytes),
            mib(p.scratch_bytes),
            mib(p.overhead_bytes),
            mib(min.slot_bytes),
            experts_text(&min),
            mib(min.margin_bytes),
            mib_up(min.min_budget_bytes),
            min.min_budget_bytes,
            b.size_flags,
            if ctx.n_slots() > 1 { " / --parallel" } else { "" }
        )
    })?;
    if let Some(why) = w.stays_mapped(p.peak_rss_bytes) {
        if why == StaysMapped::FitsWithMargin {
            eprintln!(
                "--mem-budget {}: the model fits mapped (predicted peak RSS {}), no window needed",
                mib(budget),
                mib(p.peak_rss_bytes)
            );
        } else {
            eprintln!(
                "--mem-budget {}: the model stays mapped (predicted peak RSS {}): a window would keep every unit \
                 (predicted {}), so it would save nothing",
                mib(budget),
                mib(p.peak_rss_bytes),
                mib(w.peak_rss_bytes)
            );
        }
        return Ok(None);
    }
    // Mapped, the model would fit the budget but not its margin: say why a window it is.
    let why = if p.peak_rss_bytes <= budget {
        format!(
            "; not mapped: its predicted peak RSS {} leaves less than the margin of {} under the budget",
            mib(p.peak_rss_bytes),
            mib(w.margin_bytes)
        )
    } else {
        format!("; not mapped: its predicted peak RSS {} is over the budget", mib(p.peak_rss_bytes))
    };
    if ring && w.slots < w.n_units {
        w.pinned = 0;
        w.read_bytes_per_token = units.iter().map(|r| hearth_memory::window::aligned_len(r) as u64).sum();
    }
    // Drop the mapping's pages (header, norms) before the window's slots fill up, so the
    // two never count together in the peak.
    model.file.release_pages();
    let window = Window::open_full(model.file.path(), units, w.slots, w.pinned, b.read_mode, b.prefetch)?;
    if let Some(r) = expert_ranges {
        let cache = ExpertCache::open(model.file.path(), r, w.expert_slots, b.read_mode)?;
        ctx.set_expert_source(Box::new(cache))?;
    }
    // What a token reads: the streamed units, and with an expert cache the experts missed.
    let read = match (w.read_bytes_per_token, w.expert_slots > 0) {
        (0, true) => "only the experts each token misses".to_string(),
        (b, true) => format!("{} + the experts each token misses", mib(b)),
        (b, false) => mib(b),
    };
    eprintln!(
        "--mem-budget {}: window of {} × {} for {}{} ({} kept, {} streamed through {}) + KV cache {} + scratch {} \
         + runtime {} = predicted peak RSS {}; {read} read per token ({} reads){}{why}",
        mib(budget),
        crate::plural(w.slots, "slot"),
        mib(w.slot_bytes),
        crate::plural(w.n_units, "unit"),
        experts_text(&w),
        crate::plural(w.pinned, "unit"),
        w.n_units - w.pinned,
        crate::plural(w.slots - w.pinned, "slot"),
        mib(p.kv_cache_bytes),
        mib(p.scratch_bytes),
        mib(p.overhead_bytes),
        mib(w.peak_rss_bytes),
        if window.is_direct() { "O_DIRECT" } else { "buffered" },
        if w.slots == 1 { "; one slot: no read-ahead, every layer waits for its read" } else { "" },
    );
    ctx.set_source(Box::new(window));
    Ok(Some(w))
}

/// ` + N expert slots × size (M experts in all)` for a plan with an expert cache.
fn experts_text(w: &WindowPlan) -> String {
    if w.expert_slots == 0 {
        return String::new();
    }
    // A tiny model's expert slot is a few KiB: "0.0 MiB" would say nothing.
    let size = match w.expert_slot_bytes {
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => mib(b),
    };
    format!(" + {} × {size}", crate::plural(w.expert_slots, "expert slot"))
}

/// MiB with one decimal, rounded up (a minimum the user may copy).
fn mib_up(b: u64) -> String {
    format!("{:.1} MiB", (b as f64 / (1024.0 * 1024.0) * 10.0).ceil() / 10.0)
}
