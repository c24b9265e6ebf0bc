//! `hearth perplexity`: llama-perplexity's method (see `hearth_model::perplexity`).

use crate::common::{mib, peak_rss_bytes, ModelArgs};
use anyhow::{Context as _, Result};
use hearth_model::{perplexity, Context};
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `hearth perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score
    #[arg(short, long)]
    pub file: PathBuf,
    /// Print {"ppl": …, "chunks": …} instead of the running log
    #[arg(long)]
    pub json: bool,
}

pub fn run(mut a: Args) -> Result<()> {
    if a.model.ctx_size == 2048 && !std::env::args().any(|s| s.starts_with("--ctx-size") || s == "-c") {
        a.model.ctx_size = 512; // llama-perplexity's default chunk size
    }
    let model = a.model.load()?;
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let tokens = model.tokenizer.encode(&text, true, true);
    let n_ctx = a.model.ctx_size;
    let mut ctx = Context::new(model.clone(), n_ctx, n_ctx, a.model.threads())?;
    let start = Instant::now();
    let json = a.json;
    if !json {
        eprintln!("{} tokens, {} chunks of {n_ctx}", tokens.len(), tokens.len() / n_ctx.max(1));
    }
    let r = perplexity(&mut ctx, &tokens, |i, ppl| {
        if !json {
            eprint!("[{}]{ppl:.4} ", i + 1);
        }
    })?;
    let secs = start.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({"ppl": r.ppl, "chunks": r.running.len(), "n_ctx": n_ctx, "scored_tokens": r.scored,
                "running": r.running, "seconds": secs, "peak_rss_bytes": peak_rss_bytes()})
        );
    } else {
        eprintln!();
        println!("Final estimate: PPL = {:.4} ({} chunks, {} tokens scored)", r.ppl, r.running.len(), r.scored);
        eprintln!("{:.1} s, {:.1} tok/s, peak RSS {}", secs, (r.running.len() * n_ctx) as f64 / secs, mib(peak_rss_bytes().unwrap_or(0)));
    }
    Ok(())
}
