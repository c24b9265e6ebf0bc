//! The split plan: which attention heads and which FFN rows each node computes.
//!
//! Megatron-style tensor parallelism for one llama block:
//!
//! - `attn_q`, `attn_k`, `attn_v` are split by **output rows**, in whole KV-head groups:
//!   a node owns KV heads `kv_heads` and the `n_head / n_head_kv` query heads of each
//!   (GQA), so it computes attention for those heads entirely locally.
//! - `attn_output` is split by **input columns**, the same columns as the node's query
//!   rows; its product is a partial sum of the full `n_embd` output → allreduce #1.
//! - `ffn_gate`, `ffn_up` are split by output rows `ffn_rows`; `ffn_down` by the same
//!   input columns → allreduce #2.
//!
//! Column slices of a quantized matrix must be whole quantization blocks, so split
//! points are restricted:
//!
//! - attention: a boundary after KV head `g` is allowed when `g · group · head_dim` is a
//!   multiple of the block size. The unit of assignment is therefore
//!   [`ModelDims::kv_heads_per_unit`] KV heads (1 for every llama shape with a 32-element
//!   block type; 2 for `head_dim` 128 with a 256-element K-quant and GQA group 1); the
//!   last unit may be short (it ends at the tensor's end, which is always a valid split);
//! - FFN: units of `block` rows (the last one may be short).
//!
//! Units are shared in proportion to the per-node weights by the largest-remainder
//! method ([`proportional_split`]): every node gets `floor(quota)` or `ceil(quota)`
//! units, and ties go to the lower node index, so the plan is a pure function of its
//! inputs. Ranges are handed out in node order, so node `i`'s ranges precede node
//! `i + 1`'s.
//!
//! **More nodes than attention units** (e.g. 4 nodes on SmolLM2's 3 KV heads): hearth
//! does not replicate KV heads. The same largest-remainder rule applies, so some nodes
//! get **no attention heads** (an empty `kv_heads` range: they skip the attention
//! matmuls and keep no KV cache, and contribute zeros to allreduce #1) and only an FFN
//! share. With equal weights the attention units go to the lowest-indexed nodes. The
//! FFN share is still proportional to the node's weight alone, so nodes with attention
//! carry slightly more work than FFN-only nodes; a node of weight 0 gets nothing and
//! only takes part in the allreduces.
//!
//! Which block size to pass: the column-split matrices (`attn_output`, `ffn_down`) of
//! every layer must be cut on their own blocks; pass the least common multiple of
//! their types' block sizes ([`lcm_block`]): 32 for the legacy quants, 256 for K-quants,
//! 1 for F32/F16/BF16.

use std::ops::Range;
use thiserror::Error;

/// The hyperparameters that decide a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelDims {
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`); divides `n_head`.
    pub n_head_kv: usize,
    /// Elements per head (`n_embd / n_head` for llama).
    pub head_dim: usize,
    /// Model width (`llama.embedding_length`): length of every allreduced vector.
    pub n_embd: usize,
    /// FFN hidden size (`llama.feed_forward_length`): rows of `ffn_gate`/`ffn_up`.
    pub n_ff: usize,
    /// Quantization block size (elements) that column splits must respect; see
    /// [`lcm_block`].
    pub block: usize,
}

/// Why a split could not be planned, or a received shard is not valid.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ShardError {
    /// A hyperparameter is zero or inconsistent.
    #[error("invalid model dimensions: {0}")]
    Dims(String),
    /// No node weights were given.
    #[error("no nodes: at least one node weight is needed")]
    NoNodes,
    /// A node weight is negative, NaN or infinite.
    #[error("node {node} has weight {weight}: weights must be finite and >= 0")]
    BadWeight {
        /// The node.
        node: usize,
        /// Its weight.
        weight: f64,
    },
    /// Every weight is zero.
    #[error("all node weights are zero")]
    ZeroTotal,
    /// A shard's ranges do not fit the model or are not aligned.
    #[error("invalid shard for node {node}: {why}")]
    Shard {
        /// The node whose shard it is.
        node: usize,
        /// What is wrong.
        why: String,
    },
}

/// Least common multiple of block sizes (1 for an empty list): the block size to pass
/// in [`ModelDims::block`] when the column-split matrices have several types.
pub fn lcm_block(sizes: &[usize]) -> usize {
    sizes.iter().filter(|&&s| s > 0).fold(1, |l, &s| l / num_integer::gcd(l, s) * s)
}

impl ModelDims {
    /// Check the dimensions are non-zero and `n_head_kv` divides `n_head`.
    pub fn validate(&self) -> Result<(), ShardError> {
        let fields = [
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("n_embd", self.n_embd),
            ("n_ff", self.n_ff),
            ("block", self.block),
        ];
        for (name, v) in fields {
            if v == 0 {
                return Err(ShardError::Dims(format!("{name} is 0")));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(ShardError::Dims(format!(
                "n_head {} is not a multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            )));
        }
        Ok(())
    }

    /// Query heads per KV head (the GQA group size).
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv.max(1)
    }

    /// `attn_output` input columns per KV head (its query heads × `head_dim`).
    pub fn kv_group_cols(&self) -> usize {
        self.group() * self.head_dim
    }

    /// KV heads per attention unit: the fewest whose columns are whole blocks.
    pub fn kv_heads_per_unit(&self) -> usize {
        let cols = self.kv_group_cols().max(1);
        let block = self.block.max(1);
        block / num_integer::gcd(cols, block)
    }

    /// Attention units to share out (the last may hold fewer KV heads).
    pub fn attn_units(&self) -> usize {
        self.n_head_kv.div_ceil(self.kv_heads_per_unit())
    }

    /// FFN units (of `block` rows; the last may be short).
    pub fn ffn_units(&self) -> usize {
        self.n_ff.div_ceil(self.block.max(1))
    }
}

/// One node's part of every layer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeShard {
    /// The model it is a part of.
    pub dims: ModelDims,
    /// This node's index (0 = coordinator).
    pub node: usize,
    /// Nodes in the cluster.
    pub n_nodes: usize,
    /// KV heads owned (may be empty: an FFN-only node).
    pub kv_heads: Range<usize>,
    /// FFN rows owned (`ffn_gate`/`ffn_up` rows = `ffn_down` input columns).
    pub ffn_rows: Range<usize>,
}

impl NodeShard {
    /// Query heads owned: the query heads of [`Self::kv_heads`].
    pub fn q_heads(&self) -> Range<usize> {
        let g = self.dims.group();
        self.kv_heads.start * g..self.kv_heads.end * g
    }

    /// Rows of `attn_q` owned (= input columns of `attn_output`).
    pub fn q_rows(&self) -> Range<usize> {
        let h = self.q_heads();
        h.start * self.dims.head_dim..h.end * self.dims.head_dim
    }

    /// Rows of `attn_k` and `attn_v` owned (also this node's KV-cache width per token).
    pub fn kv_rows(&self) -> Range<usize> {
        let d = self.dims.head_dim;
        self.kv_heads.start * d..self.kv_heads.end * d
    }

    /// Input columns of `attn_output` owned (same as [`Self::q_rows`]).
    pub fn attn_out_cols(&self) -> Range<usize> {
        self.q_rows()
    }

    /// Input columns of `ffn_down` owned (same as [`Self::ffn_rows`]).
    pub fn ffn_down_cols(&self) -> Range<usize> {
        self.ffn_rows.clone()
    }

    /// Whether this node computes any attention head.
    pub fn has_attention(&self) -> bool {
        !self.kv_heads.is_empty()
    }

    /// Check a shard (e.g. one received in a handshake) against its model: ranges in
    /// bounds, ordered, and starting and ending on allowed split points.
    pub fn validate(&self) -> Result<(), ShardError> {
        self.dims.validate()?;
        let bad = |why: String| ShardError::Shard { node: self.node, why };
        if self.n_nodes == 0 || self.node >= self.n_nodes {
            return Err(bad(format!("node index {} not below node count {}", self.node, self.n_nodes)));
        }
        let d = &self.dims;
        let (kv, ff) = (&self.kv_heads, &self.ffn_rows);
        if kv.start > kv.end || kv.end > d.n_head_kv {
            return Err(bad(format!("KV heads {kv:?} outside 0..{}", d.n_head_kv)));
        }
        if ff.start > ff.end || ff.end > d.n_ff {
            return Err(bad(format!("FFN rows {ff:?} outside 0..{}", d.n_ff)));
        }
        let u = d.kv_heads_per_unit();
        for b in [kv.start, kv.end] {
            if b % u != 0 && b != d.n_head_kv {
                return Err(bad(format!("KV-head boundary {b} is not a multiple of {u} (block {})", d.block)));
            }
        }
        for b in [ff.start, ff.end] {
            if b % d.block != 0 && b != d.n_ff {
                return Err(bad(format!("FFN boundary {b} is not a multiple of block {}", d.block)));
            }
        }
        Ok(())
    }
}

/// The whole cluster's split: one [`NodeShard`] per node, in node order.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    dims: ModelDims,
    weights: Vec<f64>,
    nodes: Vec<NodeShard>,
}

impl ShardPlan {
    /// Plan a split over `weights.len()` nodes, each's shares proportional to its weight.
    pub fn new(dims: ModelDims, weights: &[f64]) -> Result<Self, ShardError> {
        dims.validate()?;
        let attn = proportional_split(dims.attn_units(), weights)?;
        let ffn = proportional_split(dims.ffn_units(), weights)?;
        let u = dims.kv_heads_per_unit();
        let n = weights.len();
        let mut nodes = Vec::with_capacity(n);
        let (mut a0, mut f0) = (0usize, 0usize);
        for (node, (&a, &f)) in attn.iter().zip(&ffn).enumerate() {
            let (a1, f1) = (a0 + a, f0 + f);
            nodes.push(NodeShard {
                dims,
                node,
                n_nodes: n,
                kv_heads: (a0 * u).min(dims.n_head_kv)..(a1 * u).min(dims.n_head_kv),
                ffn_rows: (f0 * dims.block).min(dims.n_ff)..(f1 * dims.block).min(dims.n_ff),
            });
            (a0, f0) = (a1, f1);
        }
        Ok(Self { dims, weights: weights.to_vec(), nodes })
    }

    /// Plan a split over `n` nodes of equal weight.
    pub fn equal(dims: ModelDims, n: usize) -> Result<Self, ShardError> {
        Self::new(dims, &vec![1.0; n])
    }

    /// The model dimensions.
    pub fn dims(&self) -> &ModelDims {
        &self.dims
    }

    /// The weights the plan was made with.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Every node's shard, in node order.
    pub fn nodes(&self) -> &[NodeShard] {
        &self.nodes
    }

    /// Node `i`'s shard.
    pub fn node(&self, i: usize) -> Option<&NodeShard> {
        self.nodes.get(i)
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
}

/// Share `units` indivisible units among nodes in proportion to `weights`, by the
/// largest-remainder (Hamilton) method: node `i` gets `floor(q_i)` or `ceil(q_i)`
/// units where `q_i = units · w_i / Σw`; the leftover units go to the largest
/// fractional parts, ties to the lower index. The counts sum to `units`; a node of
/// weight 0 gets 0.
pub fn proportional_split(units: usize, weights: &[f64]) -> Result<Vec<usize>, ShardError> {
    if weights.is_empty() {
        return Err(ShardError::NoNodes);
    }
    for (node, &weight) in weights.iter().enumerate() {
        if !weight.is_finite() || weight < 0.0 {
            return Err(ShardError::BadWeight { node, weight });
        }
    }
    // Over the largest weight, so that the sum cannot overflow (1e308 twice is not zero).
    let max = weights.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return Err(ShardError::ZeroTotal);
    }
    let total: f64 = weights.iter().map(|w| w / max).sum();
    let quotas: Vec<f64> = weights.iter().map(|w| units as f64 * (w / max / total)).collect();
    let mut counts: Vec<usize> = quotas.iter().map(|q| (q.floor() as usize).min(units)).collect();
    // Order by descending fractional part, ties to the lower index.
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (quotas[a] - counts[a] as f64, quotas[b] - counts[b] as f64);
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    let mut sum: usize = counts.iter().sum();
    // Float rounding could, in principle, leave the floors above `units`: take back from
    // the smallest remainders first.
    for &i in order.iter().rev() {
        if sum <= units {
            break;
        }
        if counts[i] > 0 {
            counts[i] -= 1;
            sum -= 1;
        }
    }
    // Hand out the leftover units, one per node, largest remainder first (more rounds
    // only if rounding left more than one unit per node, which exact arithmetic can't).
    while sum < units {
        let before = sum;
        for &i in &order {
            if sum == units {
                break;
            }
            if weights[i] > 0.0 {
                counts[i] += 1;
                sum += 1;
            }
        }
        if sum == before {
            break; // unreachable: total > 0 means some weight is > 0
        }
    }
    Ok(counts)
}

/// A node's share of heads or rows for people: `a..b`, or `none` for an empty one (it
/// printed as `3..3`).
pub fn span(r: &Range<usize>) -> String {
    if r.is_empty() {
        "none".into()
    } else {
        format!("{}..{}", r.start, r.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn smollm(block: usize) -> ModelDims {
        ModelDims { n_head: 9, n_head_kv: 3, head_dim: 64, n_embd: 576, n_ff: 1536, block }
    }

    fn llama7b(block: usize) -> ModelDims {
        ModelDims { n_head: 32, n_head_kv: 32, head_dim: 128, n_embd: 4096, n_ff: 11008, block }
    }

    #[test]
    fn smollm_two_nodes_equal() {
        let p = ShardPlan::equal(smollm(32), 2).unwrap();
        let n = p.nodes();
        assert_eq!(n[0].kv_heads, 0..2);
        assert_eq!(n[1].kv_heads, 2..3);
        assert_eq!(n[0].q_heads(), 0..6);
        assert_eq!(n[0].q_rows(), 0..384);
        assert_eq!(n[1].q_rows(), 384..576);
        assert_eq!(n[1].kv_rows(), 128..192);
        // 1536 / 32 = 48 units → 24 each
        assert_eq!(n[0].ffn_rows, 0..768);
        assert_eq!(n[1].ffn_rows, 768..1536);
        for s in n {
            s.validate().unwrap();
        }
    }

    #[test]
    fn more_nodes_than_kv_heads_get_ffn_only() {
        let p = ShardPlan::equal(smollm(32), 5).unwrap();
        let kv: Vec<_> = p.nodes().iter().map(|s| s.kv_heads.clone()).collect();
        assert_eq!(kv, vec![0..1, 1..2, 2..3, 3..3, 3..3]);
        assert!(!p.nodes()[4].has_attention());
        assert_eq!(p.nodes()[4].q_rows().len(), 0);
        // every node still has an FFN share: 48 units over 5 → 10,10,10,9,9
        let ff: Vec<_> = p.nodes().iter().map(|s| s.ffn_rows.len() / 32).collect();
        assert_eq!(ff, vec![10, 10, 10, 9, 9]);
    }

    #[test]
    fn uneven_weights() {
        let p = ShardPlan::new(smollm(32), &[2.0, 1.0, 1.0]).unwrap();
        let kv: Vec<_> = p.nodes().iter().map(|s| s.kv_heads.len()).collect();
        // quotas 1.5, 0.75, 0.75: floors 1,0,0; leftover 2 → nodes 1, 2 (0.75 > 0.5)
        assert_eq!(kv, vec![1, 1, 1]);
        let ff: Vec<_> = p.nodes().iter().map(|s| s.ffn_rows.len()).collect();
        assert_eq!(ff, vec![768, 384, 384]);
    }

    #[test]
    fn k_quant_blocks_pair_heads() {
        // head_dim 128, group 1, block 256 → 2 KV heads per unit
        let d = llama7b(256);
        assert_eq!(d.kv_heads_per_unit(), 2);
        assert_eq!(d.attn_units(), 16);
        let p = ShardPlan::equal(d, 3).unwrap();
        for s in p.nodes() {
            assert_eq!(s.kv_heads.start % 2, 0);
            assert_eq!(s.attn_out_cols().start % 256, 0);
            assert_eq!(s.ffn_down_cols().start % 256, 0);
            s.validate().unwrap();
        }
        // 11008 = 43 blocks of 256
        assert_eq!(p.nodes().last().unwrap().ffn_rows.end, 11008);
    }

    #[test]
    fn smollm_k_quant_single_attention_unit() {
        // 192 columns per KV group, block 256: the only split points are 0 and 3.
        let d = smollm(256);
        assert_eq!(d.kv_heads_per_unit(), 4);
        assert_eq!(d.attn_units(), 1);
        let p = ShardPlan::equal(d, 2).unwrap();
        assert_eq!(p.nodes()[0].kv_heads, 0..3);
        assert_eq!(p.nodes()[1].kv_heads, 3..3);
        for s in p.nodes() {
            s.validate().unwrap();
        }
    }

    #[test]
    fn errors() {
        assert_eq!(ShardPlan::new(smollm(32), &[]), Err(ShardError::NoNodes));
        assert_eq!(ShardPlan::new(smollm(32), &[0.0, 0.0]), Err(ShardError::ZeroTotal));
        // Weights whose sum overflows are not "all zero" (new-user pass, session 46): shared
        // as their ratio.
        assert_eq!(proportional_split(48, &[1e308, 1e308, 1e308]).unwrap(), vec![16, 16, 16]);
        assert_eq!(proportional_split(48, &[f64::MAX, f64::MAX / 2.0]).unwrap(), vec![32, 16]);
        assert!(matches!(ShardPlan::new(smollm(32), &[1.0, f64::NAN]), Err(ShardError::BadWeight { node: 1, .. })));
        assert!(matches!(ShardPlan::new(smollm(32), &[-1.0]), Err(ShardError::BadWeight { node: 0, .. })));
        let mut d = smollm(32);
        d.n_head_kv = 2;
        assert!(matches!(ShardPlan::equal(d, 1), Err(ShardError::Dims(_))));
        d.n_head_kv = 0;
        assert!(matches!(ShardPlan::equal(d, 1), Err(ShardError::Dims(_))));
    }

    #[test]
    fn zero_weight_node_gets_nothing() {
        let p = ShardPlan::new(smollm(32), &[1.0, 0.0, 1.0]).unwrap();
        assert!(p.nodes()[1].kv_heads.is_empty());
        assert!(p.nodes()[1].ffn_rows.is_empty());
    }

    #[test]
    fn validate_rejects_bad_shards() {
        let p = ShardPlan::equal(smollm(32), 2).unwrap();
        let mut s = p.nodes()[0].clone();
        s.ffn_rows = 0..100; // not a block boundary
        assert!(matches!(s.validate(), Err(ShardError::Shard { node: 0, .. })));
        let mut s = p.nodes()[0].clone();
        s.kv_heads = 0..4;
        assert!(s.validate().is_err());
        let mut s = p.nodes()[1].clone();
        s.node = 2;
        assert!(s.validate().is_err());
    }

    #[test]
    fn lcm() {
        assert_eq!(lcm_block(&[]), 1);
        assert_eq!(lcm_block(&[32, 256]), 256);
        assert_eq!(lcm_block(&[32, 1]), 32);
        assert_eq!(lcm_block(&[6, 4]), 12);
    }

    fn dims_strategy() -> impl Strategy<Value = ModelDims> {
        (
            1usize..=16,
            1usize..=8,
            prop::sample::select(vec![1usize, 8, 16, 64, 80, 128]),
            1usize..=400,
            prop::sample::select(vec![1usize, 32, 256]),
        )
            .prop_map(|(n_head_kv, group, head_dim, ff_blocks, block)| ModelDims {
                n_head: n_head_kv * group,
                n_head_kv,
                head_dim,
                n_embd: n_head_kv * group * head_dim,
                n_ff: ff_blocks * block.min(64),
                block,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn plan_covers_everything_once(
            dims in dims_strategy(),
            weights in prop::collection::vec(prop_oneof![Just(0.0f64), 0.01f64..100.0, Just(1.0)], 1..=24),
        ) {
            prop_assume!(weights.iter().sum::<f64>() > 0.0);
            let plan = ShardPlan::new(dims, &weights).unwrap();
            let nodes = plan.nodes();
            prop_assert_eq!(nodes.len(), weights.len());
            // contiguous, in order, covering 0..n_head_kv and 0..n_ff exactly once
            let (mut kv, mut ff) = (0, 0);
            for (i, s) in nodes.iter().enumerate() {
                prop_assert_eq!(s.node, i);
                prop_assert_eq!(s.kv_heads.start, kv);
                prop_assert_eq!(s.ffn_rows.start, ff);
                prop_assert!(s.kv_heads.start <= s.kv_heads.end);
                prop_assert!(s.ffn_rows.start <= s.ffn_rows.end);
                kv = s.kv_heads.end;
                ff = s.ffn_rows.end;
                prop_assert!(s.validate().is_ok(), "{:?}", s.validate());
                // block-aligned column slices
                let cols = s.attn_out_cols();
                prop_assert!(cols.start % dims.block == 0 || cols.start == dims.n_head * dims.head_dim);
                prop_assert!(cols.end % dims.block == 0 || cols.end == dims.n_head * dims.head_dim);
                prop_assert!(s.ffn_rows.start % dims.block == 0 || s.ffn_rows.start == dims.n_ff);
                prop_assert!(s.ffn_rows.end % dims.block == 0 || s.ffn_rows.end == dims.n_ff);
                // query heads follow their KV heads
                prop_assert_eq!(s.q_heads().len(), s.kv_heads.len() * dims.group());
            }
            prop_assert_eq!(kv, dims.n_head_kv);
            prop_assert_eq!(ff, dims.n_ff);
            // shares within one unit of proportional
            let total: f64 = weights.iter().sum();
            let au = dims.attn_units() as f64;
            let fu = dims.ffn_units() as f64;
            let u = dims.kv_heads_per_unit();
            for (s, w) in nodes.iter().zip(&weights) {
                let a = s.kv_heads.len().div_ceil(u) as f64;
                let f = s.ffn_rows.len().div_ceil(dims.block) as f64;
                prop_assert!((a - au * w / total).abs() < 1.0 + 1e-9, "attn {} vs {}", a, au * w / total);
                prop_assert!((f - fu * w / total).abs() < 1.0 + 1e-9, "ffn {} vs {}", f, fu * w / total);
                if *w == 0.0 {
                    prop_assert!(s.kv_heads.is_empty() && s.ffn_rows.is_empty());
                }
            }
        }

        #[test]
        fn split_sums_and_bounds(units in 0usize..10_000, weights in prop::collection::vec(0.0f64..1e6, 1..64)) {
            prop_assume!(weights.iter().sum::<f64>() > 0.0);
            let c = proportional_split(units, &weights).unwrap();
            prop_assert_eq!(c.iter().sum::<usize>(), units);
            let total: f64 = weights.iter().sum();
            for (n, w) in c.iter().zip(&weights) {
                let q = units as f64 * w / total;
                prop_assert!((*n as f64 - q).abs() < 1.0 + 1e-6);
            }
        }
    }
}
