//! Tensor parallelism over `hearth worker`s: every device computes a share of every
//! block (KV heads and FFN rows), and the partial products meet in a star allreduce
//! (TPI-LLM, Li et al., arXiv 2410.00531, §3.4: on home links latency dominates, so one
//! hop to a hub beats a ring allreduce's 2(n−1)).

use crate::{explain, mib};
use anyhow::{Context as _, Result};
use hearth_model::{Context, Model};
use hearth_parallel::{ClusterOptions, CommCounters, GroupHandle, Layout, NodeStats, WireType};

/// A running group's coordinator-side counters, for reports.
pub struct ClusterRun {
    /// Nodes including this one.
    pub n_nodes: usize,
    /// Wire type.
    pub wire: WireType,
    /// Worker addresses (nodes 1..; for a ring, the workers in the ring, in ring order).
    pub workers: Vec<String>,
    /// This node's counters and the workers' reports.
    pub handle: Handle,
}

/// The running group, by kind.
pub enum Handle {
    /// Tensor parallelism.
    Tensor(GroupHandle),
    /// A pipelined ring.
    Ring(crate::ring::RingRun),
}

impl ClusterRun {
    /// A snapshot of this node's counters (a ring's: seconds the token spent on the
    /// other devices, hops as passes).
    pub fn snapshot(&self) -> CommCounters {
        match &self.handle {
            Handle::Tensor(h) => h.counters(),
            Handle::Ring(r) => r.comm_counters(),
        }
    }

    /// This node's counters and every worker's (between forward passes only).
    pub fn all_stats(&self) -> Option<(CommCounters, Vec<NodeStats>)> {
        let workers = match &self.handle {
            Handle::Tensor(h) => h.worker_stats().ok()?,
            Handle::Ring(r) => r.handle.worker_stats().ok()?,
        };
        Some((self.snapshot(), workers))
    }

    /// The ring, when this run is one.
    pub fn ring(&self) -> Option<&crate::ring::RingRun> {
        match &self.handle {
            Handle::Ring(r) => Some(r),
            Handle::Tensor(_) => None,
        }
    }

    /// `tensor` or `ring`.
    pub fn layout(&self) -> &'static str {
        match &self.handle {
            Handle::Ring(_) => "ring",
            Handle::Tensor(_) => "tensor",
        }
    }
}

/// The KV width of node 0's share under `opts` (its weights, else equal), as
/// [`hearth_parallel::connect`] will split the model; the whole model's when the weights
/// do not split (connecting then says why).
pub fn node0_kv_dim(model: &Model, opts: &ClusterOptions) -> usize {
    let node0 = hearth_parallel::cluster::split_plan(model, opts).ok().and_then(|(plan, _)| plan.node(0).cloned());
    node0.map_or(model.config.kv_dim(), |s| hearth_parallel::cluster::tensor_split(&s).kv_rows(&model.config).len())
}

/// Connect to `opts.workers` and make `ctx` compute node 0's share (a ring layout goes
/// to [`crate::ring::apply`], with the solver's profile unavailable). Prints the split.
pub fn apply(model: &Model, ctx: &mut Context, opts: &ClusterOptions) -> Result<ClusterRun> {
    if matches!(opts.layout, Layout::Ring { .. }) {
        return crate::ring::apply(model, ctx, opts, None, None);
    }
    let path = model.file.path();
    let sha = hearth_parallel::model_hash::file_sha256(path).with_context(|| format!("hashing {}", path.display()))?;
    let group = hearth_parallel::connect(model, sha, opts, ctx.n_ctx(), ctx.n_batch(), ctx.cache_type(), ctx.f32_attention_from())
        .map_err(|e| explain(e, opts))?;
    let c = &model.config;
    eprintln!(
        "tensor parallel over {} nodes (star allreduce, {} wire, {} schedule; {} KV heads, {} FFN rows):",
        group.plan.n_nodes(),
        opts.wire,
        if opts.exact { "gather" } else { "sum" },
        c.n_head_kv,
        c.n_ff
    );
    for (i, s) in group.plan.nodes().iter().enumerate() {
        let who = if i == 0 { "this machine".to_string() } else { group.workers[i - 1].0.clone() };
        // Workers report their own bytes (computed from the shard they accepted).
        let (wb, kv) = match i {
            0 => (hearth_parallel::cluster::shard_weight_bytes(model, &group.split), None),
            _ => (group.workers[i - 1].2, Some(group.workers[i - 1].1)),
        };
        eprintln!(
            "  node {i} ({who}): KV heads {}, FFN rows {}, {} of block weights{}",
            hearth_parallel::span(&s.kv_heads),
            hearth_parallel::span(&s.ffn_rows),
            mib(wb),
            kv.map(|b| format!(", KV cache {}", mib(b))).unwrap_or_default()
        );
    }
    let nodes = group.plan.nodes();
    let idle = nodes.iter().filter(|s| s.kv_heads.is_empty() && s.ffn_rows.is_empty()).count();
    let ffn_only = nodes.iter().filter(|s| s.kv_heads.is_empty() && !s.ffn_rows.is_empty()).count();
    if ffn_only > 0 {
        let they = if ffn_only == 1 { "it computes only its" } else { "they compute only their" };
        eprintln!("  ({} without a KV head: KV heads are not replicated; {they} FFN share)", crate::plural(ffn_only, "node"));
    }
    if idle > 0 {
        // (A small weight can round to no rows: "of weight 0" would not be what was given.)
        let (does, takes) = if idle == 1 { ("computes", "takes") } else { ("compute", "take") };
        eprintln!(
            "  ({} with no KV heads and no FFN rows {does} nothing but still {takes} part in every exchange)",
            crate::plural(idle, "node")
        );
    }
    let handle = group.collective.handle();
    let workers = group.workers.iter().map(|w| w.0.clone()).collect();
    ctx.set_tensor_split(group.split, Box::new(group.collective))?;
    Ok(ClusterRun { n_nodes: group.plan.n_nodes(), wire: opts.wire, workers, handle: Handle::Tensor(handle) })
}
