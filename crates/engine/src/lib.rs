//! Run setup: a loaded model and [`EngineOptions`] (threads, context size, KV cache type,
//! KV cache slots, a memory budget, workers in tensor parallel or a pipelined ring) into a
//! ready inference [`Context`] ([`prepare`]). Every command that runs a model (`generate`,
//! `chat`, `perplexity`, `bench`, `serve`) builds its context here, so each of them can
//! stream layers through a window and run across devices.
//!
//! - [`window`]: `--mem-budget`, the sliding window over the model's layers.
//! - [`tensor`]: tensor parallelism over `hearth worker`s (star allreduce).
//! - [`ring`]: the pipelined ring, with the layer solver over the devices' profiles.
//!
//! Decisions (the split, the window, a worker left out) are printed to stderr, as a
//! person starting a run wants to see them.
#![deny(missing_docs)]

pub mod ring;
pub mod tensor;
pub mod window;

use anyhow::{bail, Result};
use hearth_memory::ReadMode;
use hearth_model::{CacheType, Context, Model};
use hearth_parallel::profile::DeviceProfile;
use hearth_parallel::{ClusterOptions, Layout};
use std::path::Path;
use std::sync::Arc;

pub use tensor::{ClusterRun, Handle};

/// Measures this machine's device profile for the ring's layer solver: the model file
/// (its disk is measured) and the threads it will compute with. Measuring lives with the
/// `profile` command (it caches what it measured); the setup only asks for one.
pub type ProfileFn = fn(&Path, usize) -> Result<DeviceProfile>;

/// A memory budget (`--mem-budget`): stream the layers through a window when the mapped
/// model does not fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetOptions {
    /// Peak RSS to stay within, bytes.
    pub bytes: u64,
    /// How the window reads the file.
    pub read_mode: ReadMode,
    /// Read the next layers while the current one computes (off: a baseline).
    pub prefetch: bool,
    /// The command's flags that size the KV cache and the batch, for a too-small-budget
    /// error (`hearth bench` sizes its context from -p / -n).
    pub size_flags: &'static str,
}

/// How to set up a run.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Positions per sequence (per KV cache slot).
    pub n_ctx: usize,
    /// Most tokens per forward pass.
    pub n_batch: usize,
    /// Compute threads.
    pub n_threads: usize,
    /// KV cache type.
    pub cache_type: CacheType,
    /// KV cache slots (sequences held at once, for batched serving); a tensor-parallel or
    /// ring run holds one.
    pub slots: usize,
    /// Pin the compute threads to distinct cores.
    pub pin: bool,
    /// Every position's logits will be asked for (perplexity): the memory plan counts them.
    pub logits_all: bool,
    /// Take the f32 attention path for a sequence feeding at least this many tokens in a
    /// pass (`Context::set_f32_attention_from`; the server's 1 makes K/V bits independent
    /// of how prompts are cut into passes); workers are told the same. `None`: the
    /// context's default.
    pub f32_attention_from: Option<usize>,
    /// Stream layers within this budget.
    pub budget: Option<BudgetOptions>,
    /// Run across these workers (tensor parallel or ring, by `layout`).
    pub cluster: Option<ClusterOptions>,
    /// For a ring whose windows the solver chooses: this machine's profile.
    pub profile: Option<ProfileFn>,
}

impl EngineOptions {
    /// One sequence of `n_ctx` positions, on this machine alone, f16 KV cache.
    pub fn new(n_ctx: usize, n_batch: usize, n_threads: usize) -> Self {
        Self {
            n_ctx,
            n_batch,
            n_threads,
            cache_type: CacheType::F16,
            slots: 1,
            pin: false,
            logits_all: false,
            f32_attention_from: None,
            budget: None,
            cluster: None,
            profile: None,
        }
    }

    /// Whether the run is a pipelined ring.
    pub fn is_ring(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| matches!(c.layout, Layout::Ring { .. }))
    }

    /// These options with worker node `node` (≥ 1) left out, after it failed: its weight
    /// goes, and a ring's explicit windows no longer apply (the solver re-plans over the
    /// rest). With no worker left, the run is this machine's alone.
    pub fn without_node(&self, node: usize) -> Self {
        let mut o = self.clone();
        if let Some(c) = &self.cluster {
            let rest = without_node(c, node);
            o.cluster = (!rest.workers.is_empty()).then_some(rest);
        }
        o
    }
}

/// A context ready to run, with what set it up.
pub struct Prepared {
    /// The inference context.
    pub ctx: Context,
    /// The sliding-window plan, when the budget needed a window.
    pub window: Option<hearth_memory::WindowPlan>,
    /// The group it runs in, when it runs across devices.
    pub cluster: Option<ClusterRun>,
}

/// Why a tensor-parallel coordinator refuses `--mem-budget` (`generate`, `plan`).
pub const TENSOR_BUDGET_UNSUPPORTED: &str =
    "--mem-budget on the coordinator with tensor parallelism is not supported yet (workers split the weights instead; a --parallel ring takes it)";

/// Set up a run of `model` with `o`: the context, its slots, then the ring or tensor
/// split (connecting to the workers), then the window (a ring device streams only its own
/// layers, so the ring comes first). Prints each decision to stderr.
pub fn prepare(model: &Arc<Model>, o: &EngineOptions) -> Result<Prepared> {
    let ring = o.is_ring();
    if o.cluster.is_some() && o.slots > 1 {
        bail!(
            "a run across devices holds one sequence (its workers keep one KV cache): {} KV cache slots cannot be combined with workers",
            o.slots
        );
    }
    if o.cluster.is_some() && !ring && o.budget.is_some() {
        bail!(TENSOR_BUDGET_UNSUPPORTED);
    }
    // A tensor-parallel coordinator's cache holds only its own heads, as a worker's does
    // (the split is known before connecting): building the whole cache and cutting it at
    // the split put all of it in the peak (SmolLM2 with no heads at 8192 tokens: 208 MiB).
    let kv_dim = match &o.cluster {
        Some(c) if !ring => tensor::node0_kv_dim(model, c),
        _ => model.config.kv_dim(),
    };
    let mut ctx = Context::with_kv_dim(model.clone(), o.n_ctx, o.n_batch, o.n_threads, o.cache_type, kv_dim)?;
    if o.pin {
        ctx.pin_threads()?;
    }
    if let Some(n) = o.f32_attention_from {
        ctx.set_f32_attention_from(n); // before the workers connect: they are told it
    }
    if o.slots > 1 {
        ctx.set_slots(o.slots)?;
    }
    let budget = o.budget.as_ref();
    let (window, cluster) = match &o.cluster {
        Some(c) if ring => {
            let run = ring::apply(model, &mut ctx, c, budget.map(|b| b.bytes), o.profile)?;
            (window::apply_ring(model, &mut ctx, budget, true)?, Some(run))
        }
        Some(c) => {
            let w = window::apply(model, &mut ctx, budget, o.logits_all)?;
            (w, Some(tensor::apply(model, &mut ctx, c)?))
        }
        None => (window::apply(model, &mut ctx, budget, o.logits_all)?, None),
    };
    Ok(Prepared { ctx, window, cluster })
}

/// The worker a failed forward pass blames (node index ≥ 1), if the failure was one
/// node's (its link broke, it timed out, it reported an error).
pub fn failed_worker(e: &hearth_model::ModelError) -> Option<usize> {
    match e {
        hearth_model::ModelError::Collective(b) => {
            b.downcast_ref::<hearth_parallel::CommError>().and_then(|c| c.failed_node()).filter(|&n| n >= 1)
        }
        _ => None,
    }
}

/// `opts` without worker node `node` (≥ 1) and its weight (a ring's explicit windows
/// no longer apply: the solver re-plans over the rest).
pub fn without_node(opts: &ClusterOptions, node: usize) -> ClusterOptions {
    let mut o = opts.clone();
    if node >= 1 && node <= o.workers.len() {
        o.workers.remove(node - 1);
        if !o.weights.is_empty() {
            o.weights.remove(node);
        }
        if let Layout::Ring { windows, .. } = &mut o.layout {
            *windows = None;
        }
    }
    o
}

/// A failure to form the group, with the worker's address and what to check.
pub fn explain(e: hearth_parallel::ClusterError, opts: &ClusterOptions) -> anyhow::Error {
    explain_workers(e, &opts.workers)
}

/// [`explain`] for workers `workers` (nodes `1..`).
pub fn explain_workers(e: hearth_parallel::ClusterError, workers: &[String]) -> anyhow::Error {
    use hearth_parallel::{ClusterError as C, CommError, HandshakeError as H};
    let addr = e.failed_node().filter(|&n| n >= 1).and_then(|n| workers.get(n - 1));
    let hint = match &e {
        C::Connect { .. } => " (is `hearth worker` running there, on that port?)",
        C::Comm(CommError::Wire { .. }) | C::Handshake(H::Comm(CommError::Wire { .. })) => {
            " (whatever listens there does not speak hearth's protocol: is it a `hearth worker`?)"
        }
        _ => "",
    };
    let msg = e.to_string();
    match addr {
        Some(a) if !msg.contains(a.as_str()) => anyhow::anyhow!("worker {a}: {msg}{hint}"),
        _ => anyhow::anyhow!("{msg}{hint}"),
    }
}

/// `n` and `word`, plural unless `n` is 1: `1 slot`, `2 slots`, `0 slots`.
pub fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Bytes as MiB with one decimal (below 0.1 MiB, as bytes: `1 B` is not `0.0 MiB`).
pub fn mib(b: u64) -> String {
    if b > 0 && b < (1 << 20) / 10 {
        return format!("{b} B");
    }
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_parallel::WireType;
    use std::time::Duration;

    fn opts(layout: Layout, weights: Vec<f64>) -> ClusterOptions {
        ClusterOptions {
            workers: vec!["a:1".into(), "b:2".into()],
            weights,
            wire: WireType::F32,
            key: None,
            timeout: Duration::from_secs(5),
            exact: false,
            progress: false,
            layout,
        }
    }

    #[test]
    fn leaving_a_node_out_drops_its_weight_and_a_rings_windows() {
        let o = without_node(&opts(Layout::Tensor, vec![2.0, 1.0, 3.0]), 1);
        assert_eq!(o.workers, vec!["b:2".to_string()]);
        assert_eq!(o.weights, vec![2.0, 3.0]);
        let r = without_node(&opts(Layout::Ring { windows: Some(vec![1, 2, 3]), require_all: false }, vec![]), 2);
        assert_eq!(r.workers, vec!["a:1".to_string()]);
        assert!(matches!(r.layout, Layout::Ring { windows: None, .. }));
        // Out of range: unchanged.
        assert_eq!(without_node(&opts(Layout::Tensor, vec![]), 3).workers.len(), 2);
    }

    #[test]
    fn the_last_worker_gone_leaves_this_machine_alone() {
        let mut e = EngineOptions::new(64, 8, 1);
        e.cluster = Some(without_node(&opts(Layout::Tensor, vec![]), 1));
        assert_eq!(e.cluster.as_ref().map(|c| c.workers.len()), Some(1));
        assert!(e.without_node(1).cluster.is_none());
    }
}
