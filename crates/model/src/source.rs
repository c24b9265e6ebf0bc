//! Where the forward pass reads its weights from.
//!
//! By default every matrix is a view of the memory-mapped file. A [`LayerSource`] (the
//! sliding-window scheduler in `hearth-memory` is one) instead hands the forward pass
//! one *unit* at a time — a transformer block, or the output head — loaded into its own
//! buffers, and is told when the unit is finished so it can reuse the memory. Units are
//! numbered `0..n_layer` for the blocks and `n_layer` for the output head, and are asked
//! for in that order on every forward pass ([`unit_ranges`] gives their file bytes).
//! The head is split by rows into as many units as it takes for none to be larger than
//! the largest block ([`head_chunks`]), so a window's slot is one block whatever the
//! vocabulary.

use crate::error::{ModelError, Result};
use crate::weights::{TensorRef, Weights};
use hearth_kernels::WeightView;
use std::ops::Range;

/// The bytes of one unit: `bytes[i]` is file byte `base + i`.
#[derive(Debug, Clone, Copy)]
pub struct Unit<'a> {
    /// Loaded bytes, covering the unit's file range.
    pub bytes: &'a [u8],
    /// File offset of `bytes[0]`.
    pub base: usize,
}

impl<'a> Unit<'a> {
    /// A view of tensor `t`, which must lie inside this unit.
    pub fn view(&self, t: &TensorRef) -> Result<WeightView<'a>> {
        if t.size == 0 {
            // A shard file's empty cut (a node without rows or columns of a matrix): a
            // 0-byte placeholder at offset 0, in no unit; its view is empty wherever.
            return Ok(WeightView::new(t.ty, &[], t.rows, t.cols)?);
        }
        let start = t.offset.checked_sub(self.base);
        let data = start.and_then(|s| self.bytes.get(s..s + t.size)).ok_or_else(|| {
            ModelError::Weights(format!(
                "tensor {} (file bytes {}..{}) is not in the loaded unit (bytes {}..{})",
                t.name,
                t.offset,
                t.offset + t.size,
                self.base,
                self.base + self.bytes.len()
            ))
        })?;
        Ok(WeightView::new(t.ty, data, t.rows, t.cols)?)
    }
}

/// I/O counters of a [`LayerSource`] since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SourceStats {
    /// Weight bytes read from the file.
    pub bytes_read: u64,
    /// Seconds the loader spent reading (its achieved bandwidth is `bytes_read / read_secs`).
    pub read_secs: f64,
    /// Seconds the forward pass spent waiting for a unit that was not loaded yet.
    pub wait_secs: f64,
    /// Units loaded.
    pub units_loaded: u64,
    /// Experts an expert cache already held when the forward pass asked for them.
    pub expert_hits: u64,
    /// Experts an expert cache had to read (their bytes are in `bytes_read`).
    pub expert_misses: u64,
    /// Experts an expert cache read ahead (their bytes are in `bytes_read` too).
    pub experts_prefetched: u64,
    /// Hits on experts read ahead (at first use): misses the read-ahead saved.
    pub expert_prefetch_hits: u64,
}

impl SourceStats {
    /// The counts since `earlier`.
    pub fn since(&self, earlier: &SourceStats) -> SourceStats {
        SourceStats {
            bytes_read: self.bytes_read - earlier.bytes_read,
            read_secs: self.read_secs - earlier.read_secs,
            wait_secs: self.wait_secs - earlier.wait_secs,
            units_loaded: self.units_loaded - earlier.units_loaded,
            expert_hits: self.expert_hits - earlier.expert_hits,
            expert_misses: self.expert_misses - earlier.expert_misses,
            experts_prefetched: self.experts_prefetched - earlier.experts_prefetched,
            expert_prefetch_hits: self.expert_prefetch_hits - earlier.expert_prefetch_hits,
        }
    }

    /// These counters plus an expert cache's: its reads add to `bytes_read` and
    /// `read_secs`, the forward pass's waits for them to `wait_secs`.
    pub fn with_experts(mut self, x: &crate::ExpertStats) -> SourceStats {
        self.bytes_read += x.bytes_read;
        self.read_secs += x.read_secs;
        self.wait_secs += x.wait_secs;
        self.expert_hits += x.hits;
        self.expert_misses += x.misses;
        self.experts_prefetched += x.prefetched;
        self.expert_prefetch_hits += x.prefetch_hits;
        self
    }

    /// Share of the experts asked for that were already held (0 without an expert cache).
    pub fn expert_hit_rate(&self) -> f64 {
        let n = self.expert_hits + self.expert_misses;
        if n > 0 { self.expert_hits as f64 / n as f64 } else { 0.0 }
    }

    /// Achieved read bandwidth, GB/s (0 when nothing was read).
    pub fn read_gbps(&self) -> f64 {
        if self.read_secs > 0.0 { self.bytes_read as f64 / self.read_secs / 1e9 } else { 0.0 }
    }
}

/// A provider of units for the forward pass (see the module docs).
pub trait LayerSource: Send {
    /// Unit `u`, blocking until it is loaded. Units must be acquired in order
    /// (`0, 1, …, n_layer, 0, …`) and each released before the next is acquired.
    fn acquire(&mut self, u: usize) -> Result<Unit<'_>>;
    /// The forward pass is done with unit `u`: its memory may be reused.
    fn release(&mut self, u: usize);
    /// Read `dst.len()` bytes at file offset `offset` (embedding rows).
    fn read_at(&mut self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// Counters so far.
    fn stats(&self) -> SourceStats;
}

/// Row ranges of the output head's units: `ceil(head bytes / largest block bytes)`
/// chunks of (nearly) equal rows.
pub fn head_chunks(w: &Weights) -> Vec<Range<usize>> {
    let block = w.layers.iter().map(|l| l.matrices().iter().map(|t| t.size).sum::<usize>()).max();
    split_rows(w.output.rows, w.output.size, block.unwrap_or(0), w.output.ty.group_rows())
}

/// `rows` rows of `bytes` in all, cut into `ceil(bytes / max_bytes)` ranges of (nearly)
/// equal rows (one range when `max_bytes` is 0), each but the last a multiple of
/// `group` rows (a type that stores rows in groups: `GgmlType::group_rows`).
pub fn split_rows(rows: usize, bytes: usize, max_bytes: usize, group: usize) -> Vec<Range<usize>> {
    let k = if max_bytes == 0 { 1 } else { bytes.div_ceil(max_bytes) }.clamp(1, rows.max(1));
    let per = rows.div_ceil(k).max(1).next_multiple_of(group.max(1));
    (0..rows).step_by(per).map(|r| r..(r + per).min(rows)).collect()
}

/// The file byte range of each unit: block `i` spans its matrices (and a mixture of
/// experts' router and shared expert), then the output head
/// (`output.weight`, or the tied `token_embd.weight`) in row chunks no larger than a block ([`split_rows`]). Norm vectors are copied at
/// load, so only the matrices need to be in range; a block whose matrices are spread
/// over much more than their own size (an unusual tensor order) is rejected, since a
/// window would then read the bytes in between.
pub fn unit_ranges(w: &Weights) -> Result<Vec<Range<usize>>> {
    ranges(w, false)
}

/// [`unit_ranges`] with a mixture of experts' stacked `ffn_*_exps` tensors left out of
/// each block (its attention, router and shared expert only), for a source whose experts come from an
/// expert cache ([`crate::ExpertSource`]). A dense model's units are [`unit_ranges`]'s.
pub fn unit_ranges_without_experts(w: &Weights) -> Result<Vec<Range<usize>>> {
    ranges(w, true)
}

fn ranges(w: &Weights, without_experts: bool) -> Result<Vec<Range<usize>>> {
    let mut out = Vec::with_capacity(w.layers.len() + 1);
    for (i, l) in w.layers.iter().enumerate() {
        let experts = without_experts && l.router.is_some();
        let ms = l.matrices();
        let ms = if experts { &ms[..4] } else { &ms[..] };
        // A shared expert is ordinary layer weights: in the unit either way.
        let shared = l.shared.iter().flat_map(|s| s.tensors());
        // (A shard file's empty cuts, e.g. a node without KV heads, are placeholders of
        // 0 bytes at offset 0, not part of the block.)
        let ts: Vec<&TensorRef> = ms.iter().copied().chain(l.router.as_ref()).chain(shared).filter(|t| t.size > 0).collect();
        let lo = ts.iter().map(|t| t.offset).min().unwrap_or(0);
        let hi = ts.iter().map(|t| t.offset + t.size).max().unwrap_or(0);
        let sum: usize = ts.iter().map(|t| t.size).sum();
        if hi - lo > sum + sum / 8 + (1 << 20) {
            return Err(ModelError::Weights(format!(
                "block {i}'s matrices are spread over {} bytes of the file for {sum} bytes of data: \
                 a sliding window needs each block's tensors stored together (rewrite the file with `hearth quantize`)",
                hi - lo
            )));
        }
        out.push(lo..hi);
    }
    let rb = w.output.row_bytes();
    out.extend(head_chunks(w).into_iter().map(|r| w.output.offset + r.start * rb..w.output.offset + r.end * rb));
    Ok(out)
}
