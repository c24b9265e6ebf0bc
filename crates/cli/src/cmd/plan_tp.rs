//! `hearth plan --workers` for tensor parallelism (the default `--parallel tensor`): each
//! node's share of every block, the bytes it holds, and what one token exchanges. It is
//! computed from the file and the node weights alone; the workers are not contacted.

use anyhow::Result;
use hearth_model::{CacheType, KvLayout, Model, TensorSplit};
use hearth_parallel::cluster::{shard_weight_bytes, split_plan, tensor_split};
use hearth_parallel::{span, ClusterOptions, WireType};

/// The split of `model` over this machine and `opts.workers` (their `opts.weights`), with
/// each node's weight and KV cache bytes at `n_ctx` tokens of `cache`.
pub fn report(model: &Model, opts: &ClusterOptions, n_ctx: usize, n_batch: usize, cache: CacheType, json: bool) -> Result<String> {
    let n = opts.workers.len() + 1;
    let (plan, gather) = split_plan(model, opts)?;
    let weights = plan.weights();
    let c = &model.config;
    let names: Vec<String> = std::iter::once("this machine".to_string()).chain(opts.workers.iter().cloned()).collect();
    // K and V rows of the node's heads, as the worker's context allocates them: every
    // position of a full-attention layer, a sliding-window layer's ring (Gemma 3).
    let kv = |heads: usize| KvLayout::of_model(c, n_ctx, n_batch, heads * c.head_dim, cache).bytes() as u64;
    // (The gather schedule also cuts the output rows: its weight shares differ.)
    let rows: Vec<_> = plan
        .nodes()
        .iter()
        .zip(&names)
        .zip(gather)
        .map(|((s, name), g)| -> Result<_> {
            let split = TensorSplit { gather_rows: g, ..tensor_split(s) };
            // What the coordinator would refuse (a file whose rows are stored in groups) is
            // refused here too, rather than planned.
            split.validate(c, &model.weights)?;
            Ok((name, s, shard_weight_bytes(model, &split), kv(s.kv_heads.len()), split.shared_rows(c)))
        })
        .collect::<Result<_>>()?;
    // Node 0 also holds the embedding and computes the output head (one tensor when tied).
    let (embd, head) = (&model.weights.token_embd, &model.weights.output);
    let ends = (embd.size + if head.offset == embd.offset { 0 } else { head.size }) as u64;
    // Per token: the sum schedule adds two partial sums of [n_embd] per block (a star:
    // each worker sends its partial and receives the total); the gather schedule
    // exchanges four times per block (docs/PARALLEL.md).
    // (A shared expert's SwiGLU rows are gathered once more per block.)
    let shared = c.moe.is_some_and(|m| m.n_ff_shared > 0);
    let exchanges = if opts.exact { 4 + usize::from(shared) } else { 2 } * c.n_layer;
    let per_value = match opts.wire {
        WireType::F32 => 4.0,
        WireType::Q8_0 => 34.0 / 32.0,
    };
    let sum_bytes = (2 * c.n_layer * c.n_embd) as f64 * per_value;
    if json {
        let nodes: Vec<_> = rows
            .iter()
            .map(|(name, s, w, k, sh)| {
                serde_json::json!({"node": s.node, "name": name, "kv_heads": [s.kv_heads.start, s.kv_heads.end],
                    "ffn_rows": [s.ffn_rows.start, s.ffn_rows.end], "weight_bytes": w, "kv_cache_bytes": k,
                    "shared_expert_rows": shared.then_some([sh.start, sh.end])})
            })
            .collect();
        let v = serde_json::json!({"parallel": "tensor", "schedule": if opts.exact { "gather" } else { "sum" },
            "n_ctx": n_ctx, "nodes": nodes, "node0_embedding_and_head_bytes": ends, "exchanges_per_token": exchanges,
            "sum_bytes_per_worker_per_token": (!opts.exact).then_some(sum_bytes)});
        return Ok(format!("{v}\n"));
    }
    // A shared expert's rows follow the node's share of the experts' rows, each boundary
    // rounded down to a whole quantization block (`TensorSplit::shared_rows`).
    let ffn = match c.moe {
        Some(m) if shared => format!("FFN rows (of {}, in each of the {} experts; of {} in the shared expert)", c.n_ff, m.n_expert, m.n_ff_shared),
        Some(m) => format!("FFN rows (of {}, in each of the {} experts)", c.n_ff, m.n_expert),
        None => format!("FFN rows (of {})", c.n_ff),
    };
    let mut o = format!(
        "tensor-parallel plan for {} layers over {n} nodes, n_ctx {n_ctx} ({} KV cache); from the file and the node weights, workers not contacted:\n\
         | node | address | weight | KV heads (of {}) | {ffn} | weights | KV cache |\n|---:|---|---:|---|---|---:|---:|\n",
        c.n_layer,
        cache.name(),
        c.n_head_kv,
    );
    for ((name, s, w, k, sh), wt) in rows.iter().zip(weights) {
        let ffn_rows = if shared { format!("{}; shared {}", span(&s.ffn_rows), span(sh)) } else { span(&s.ffn_rows) };
        o += &format!(
            "| {} | {name} | {wt} | {} | {ffn_rows} | {} | {} |\n",
            s.node,
            span(&s.kv_heads),
            super::plan::gb(*w),
            super::plan::gb(*k)
        );
    }
    o += &format!("\nnode 0 also holds the token embedding and output head: {}\n", super::plan::gb(ends));
    o += &format!(
        "per token: {exchanges} round trips between this machine and every worker ({} per block, {} schedule)",
        exchanges / c.n_layer,
        if opts.exact { "gather" } else { "sum" }
    );
    if !opts.exact {
        o += &format!(", each worker sending and receiving {:.1} KiB ({} wire)", sum_bytes / 1024.0, opts.wire);
    }
    o += "; on a home network the round trips' latency, not the bytes, usually sets the pace (docs/PARALLEL.md)\n";
    Ok(o)
}
