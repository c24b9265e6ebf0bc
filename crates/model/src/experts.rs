//! Where a mixture-of-experts layer's expert weights come from.
//!
//! By default (no [`ExpertSource`]) expert `e`'s gate, up and down matrices are views of
//! the layer's unit (the mapped file, or a whole-layer window slot). Under a memory
//! budget an [`ExpertSource`] (`hearth_memory::ExpertCache`) holds a fixed number of
//! *expert slots* instead: one slot is one expert of one layer, its three row ranges. The
//! forward pass asks it for the experts the router chose, for one layer, once the router
//! has run ([`ExpertSource::load`]); the experts it does not hold are read as one batch,
//! and the views come from the slot bytes. The layer's unit then needs no expert bytes
//! ([`expert_ranges`], `unit_ranges_without_experts`).

use crate::arch::Mat;
use crate::error::Result;
use crate::source::Unit;
use crate::weights::{LayerWeights, Weights};
use hearth_kernels::WeightView;
use std::ops::Range;

/// A provider of expert weights for the mixture-of-experts FFN (see the module docs).
pub trait ExpertSource: Send {
    /// Experts `ids` (distinct) of layer `il`, each as its gate, up and down bytes (in
    /// that order, each covering its file range from [`expert_ranges`]), reading those it
    /// does not hold as one batch. Fails when `ids` has more experts than it has slots.
    fn load(&mut self, il: usize, ids: &[usize]) -> Result<Vec<[Unit<'_>; 3]>>;
    /// A guess that layer `il` will ask for experts `ids` soon: a source may start reading
    /// those it does not hold in the background (never evicting the experts of the last
    /// `load`). Changes only which experts are held, never the bytes a `load` returns.
    fn prefetch(&mut self, _il: usize, _ids: &[usize]) {}
    /// Most experts one [`Self::load`] may ask for (its slots).
    fn slots(&self) -> usize;
    /// Counters so far.
    fn stats(&self) -> ExpertStats;
}

/// Counters of an [`ExpertSource`] since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExpertStats {
    /// Experts asked for that were already in a slot.
    pub hits: u64,
    /// Experts asked for that had to be read.
    pub misses: u64,
    /// Expert bytes read from the file (on demand and ahead).
    pub bytes_read: u64,
    /// Seconds spent reading them.
    pub read_secs: f64,
    /// Seconds the forward pass waited for reads (on-demand reads, and read-ahead not
    /// finished when its expert was asked for).
    pub wait_secs: f64,
    /// Experts read ahead ([`ExpertSource::prefetch`]).
    pub prefetched: u64,
    /// Hits on an expert read ahead, at its first use: misses the read-ahead saved.
    pub prefetch_hits: u64,
}

/// The file byte ranges of every expert: `[layer][expert] = [gate, up, down]` (rows
/// `e·n_ff..(e+1)·n_ff` of the stacked `ffn_*_exps` tensors). Empty for a dense model.
pub fn expert_ranges(w: &Weights, n_expert: usize) -> Vec<Vec<[Range<usize>; 3]>> {
    let range = |l: &LayerWeights, m, e| {
        let t = l.expert(m, e, n_expert);
        t.offset..t.offset + t.size
    };
    w.layers.iter().map(|l| (0..n_expert).map(|e| [Mat::Gate, Mat::Up, Mat::Down].map(|m| range(l, m, e))).collect()).collect()
}

/// Views of the gate, up and down matrices of each group's expert in `run` (each group
/// one expert's `(expert, token, weight)` triples), 3 per group in that order, from
/// `cache`'s slots (all of the run's experts loaded in one call).
pub(crate) fn views<'s>(
    cache: &'s mut Box<dyn ExpertSource>,
    l: &LayerWeights,
    il: usize,
    n_expert: usize,
    run: &[&[(usize, usize, f32)]],
) -> Result<Vec<WeightView<'s>>> {
    let ids: Vec<usize> = run.iter().map(|grp| grp[0].0).collect();
    let units = cache.load(il, &ids)?;
    let mut out = Vec::with_capacity(3 * run.len());
    for (grp, u) in run.iter().zip(&units) {
        for (m, u) in [Mat::Gate, Mat::Up, Mat::Down].into_iter().zip(u) {
            out.push(u.view(&l.expert(m, grp[0].0, n_expert))?);
        }
    }
    Ok(out)
}
