//! Blockwise attention over the thread pool: a batch's queries cut into tiles
//! ([`AttnItem`]: consecutive tokens of one sequence × query heads of one KV head, so
//! each K/V row read serves the whole tile) that the threads take from a shared counter.

use crate::context::Span;
use hearth_kernels::ops::{self, AttnScratch, AttnShape, KvRows};
use hearth_kernels::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One work item of blockwise attention: tokens `row..row + len` of span `span` × query
/// heads `heads` (all of one KV head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttnItem {
    span: usize,
    row: usize,
    len: usize,
    heads: std::ops::Range<usize>,
}

/// Splits a batch's attention into [`AttnItem`]s, most expensive (latest tokens) first
/// for the pool's threads to take in turn: tiles of up to `64 / heads` tokens of one span
/// × runs of a KV head's `group` query heads (`n_head` local heads); runs are halved while
/// there are fewer than two items per thread (decode: one token per span).
pub(crate) fn attn_items(spans: &[Span], n_head: usize, group: usize, n_threads: usize) -> Vec<AttnItem> {
    let group = group.clamp(1, ops::BLOCK_MAX_QUERIES);
    let tile = (ops::BLOCK_MAX_QUERIES / group).clamp(1, 16);
    let n_tiles: usize = spans.iter().map(|sp| sp.len.div_ceil(tile)).sum();
    let mut run = group;
    while run > 1 && n_tiles * n_head.div_ceil(run) < 2 * n_threads {
        run = run.div_ceil(2);
    }
    let mut items = Vec::new();
    for (si, sp) in spans.iter().enumerate() {
        for o in (0..sp.len).step_by(tile) {
            for g in (0..n_head).step_by(group) {
                let end = (g + group).min(n_head);
                for h in (g..end).step_by(run) {
                    items.push(AttnItem { span: si, row: sp.row + o, len: tile.min(sp.len - o), heads: h..(h + run).min(end) });
                }
            }
        }
    }
    // Longest first: a tile's cost grows with its last position.
    items.sort_by_key(|it| std::cmp::Reverse(spans[it.span].pos0 + it.row - spans[it.span].row + it.len));
    items
}


/// Lets pool threads write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// Causal GQA attention of every item of `items` (`q: [n, qd]` this node's heads;
/// `caches[span]`: that span's slot's K/V rows; `group` query heads per KV head) into
/// `out: [n, qd]`, on the pool's threads, each with its own `accs` scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    pool: &ThreadPool,
    items: &[AttnItem],
    spans: &[Span],
    caches: &[(KvRows<'_>, KvRows<'_>)],
    q: &[f32],
    qd: usize,
    group: usize,
    shape: AttnShape,
    f32_from: usize,
    accs: &[Mutex<AttnScratch>],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let next = AtomicUsize::new(0);
    pool.run(|tid, _| {
        let mut acc = accs[tid].lock().unwrap_or_else(|p| p.into_inner());
        // Capture the whole SyncPtr (Send + Sync), not its raw-pointer field.
        #[allow(clippy::redundant_locals)]
        let out_ptr = out_ptr;
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(it) = items.get(i) else { break };
            let sp = &spans[it.span];
            let (kc, vc) = caches[it.span];
            // As llama.cpp: a sequence's batch of at least 64 tokens (`f32_from`) takes
            // the f32 path. Decided per sequence, so no sequence's arithmetic depends on
            // the others sharing its pass.
            let shape = AttnShape { f32_path: sp.len >= f32_from, ..shape };
            let rows = it.row * qd..(it.row + it.len) * qd;
            let o = ops::attend_block(&q[rows], qd, it.len, it.heads.clone(), kc, vc, it.heads.start / group, sp.pos0 + it.row - sp.row + 1, shape, &mut acc);
            let w = it.heads.len() * hd;
            for (t, src) in o.chunks_exact(w).enumerate() {
                // SAFETY: each (token, head) output slice belongs to exactly one work
                // item, and lies inside `out` ([n, qd]).
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add((it.row + t) * qd + it.heads.start * hd), w) };
                dst.copy_from_slice(src);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (token, head) pair of a batch is in exactly one attention item, each item's
    /// heads share a KV head and its tokens one span.
    #[test]
    fn attn_items_cover_each_query_once() {
        let spans = [
            Span { slot: 0, pos0: 0, row: 0, len: 37 },
            Span { slot: 2, pos0: 90, row: 37, len: 1 },
            Span { slot: 1, pos0: 5, row: 38, len: 16 },
        ];
        let n = 54;
        for (n_head, group, threads) in [(9, 3, 1), (9, 3, 2), (32, 8, 2), (4, 4, 16), (6, 1, 2), (3, 3, 8)] {
            let items = attn_items(&spans, n_head, group, threads);
            let mut seen = vec![0u8; n * n_head];
            for it in &items {
                let sp = &spans[it.span];
                assert!(it.row >= sp.row && it.row + it.len <= sp.row + sp.len, "{it:?}");
                assert!(it.len * it.heads.len() <= ops::BLOCK_MAX_QUERIES);
                assert_eq!(it.heads.start / group, (it.heads.end - 1) / group, "{it:?}");
                for t in it.row..it.row + it.len {
                    for h in it.heads.clone() {
                        seen[t * n_head + h] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "n_head {n_head} group {group}");
        }
    }
}
