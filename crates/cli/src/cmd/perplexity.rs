//! `hearth perplexity`: llama-perplexity's method (see `hearth_model::perplexity`).

use crate::common::{print_out, MemoryReport, ModelArgs};
use anyhow::Result;
use hearth_model::perplexity;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `hearth perplexity`.
#[derive(clap::Args, Debug)]
#[command(mut_arg("ctx_size", |a| a.help("Tokens per scored chunk (KV cache positions), at most the model's trained context [default: 512, capped at the model's trained context]")))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (`-`: stdin)
    #[arg(short, long)]
    pub file: PathBuf,
    /// Print {"ppl": …, "chunks": …} instead of the running log
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    let text = crate::common::read_text(&a.file)?;
    let tokens = model.tokenizer.encode(&text, true, true);
    // 512: llama-perplexity's default chunk size.
    let crate::common::Prepared { mut ctx, window, .. } = a.model.prepare(&model, 512, true)?;
    let n_ctx = ctx.n_ctx();
    // Before the chunk line, which would otherwise announce chunks that never run.
    if n_ctx < 4 {
        anyhow::bail!("perplexity needs a context of at least 4 tokens (--ctx-size), got {n_ctx}");
    }
    let start = Instant::now();
    let json = a.json;
    if !json && tokens.len() >= n_ctx {
        eprintln!("{}, {} of {n_ctx}", hearth_engine::plural(tokens.len(), "token"), hearth_engine::plural(tokens.len() / n_ctx, "chunk"));
    }
    let r = perplexity(&mut ctx, &tokens, |i, ppl| {
        if !json {
            eprint!("[{}]{ppl:.4} ", i + 1);
        }
    })?;
    let secs = start.elapsed().as_secs_f64();
    let mem = MemoryReport::now(&ctx);
    // Under --mem-budget: the weights read through the window over the whole run.
    let io = window.as_ref().and(ctx.source_stats());
    if json {
        let v = serde_json::json!({"ppl": r.ppl, "chunks": r.running.len(), "n_ctx": n_ctx, "scored_tokens": r.scored,
            "running": r.running, "seconds": secs, "peak_rss_bytes": mem.proc.peak_rss_bytes, "memory": mem.json(),
            "window": window.as_ref().map(|w| serde_json::json!({"plan": crate::budget::plan_json(w), "io": io.as_ref().map(crate::budget::io_json)}))});
        print_out(&format!("{v}\n"))?;
    } else {
        eprintln!();
        print_out(&format!(
            "Final estimate: PPL = {:.4} ({}, {} scored)\n",
            r.ppl,
            hearth_engine::plural(r.running.len(), "chunk"),
            hearth_engine::plural(r.scored, "token")
        ))?;
        eprintln!("{:.1} s, {:.1} tok/s\n{}", secs, (r.running.len() * n_ctx) as f64 / secs, mem.human());
        if let Some(io) = &io {
            // Each chunk runs in batches of at most n_batch tokens.
            let passes = r.running.len() * n_ctx.div_ceil(ctx.n_batch());
            // (The first pass also reads the units the window keeps.)
            eprintln!("{}", crate::budget::io_line(&format!("weights over {passes} forward pass{}", if passes == 1 { "" } else { "es" }), io, secs, passes));
        }
    }
    Ok(())
}
