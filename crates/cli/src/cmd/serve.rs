//! `hearth serve`: the OpenAI-compatible HTTP server (crate `hearth-serve`) over one
//! model context with `--parallel` KV cache slots, batched continuously.

use crate::common::{resolve_model, threads_or_default, CacheTypeArg};
use anyhow::{bail, Context as _, Result};
use hearth_model::{Context, Model};
use std::path::PathBuf;
use std::sync::Arc;

/// Flags of `hearth serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file [default: $HEARTH_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the listening line says which)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences generated at once: KV cache slots, each of --ctx-size positions
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Positions per slot (prompt plus generated tokens of one request), at most the
    /// model's trained context [default: 2048, capped at the trained context]
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u32).range(2..))]
    pub ctx_size: Option<u32>,
    /// Tokens per forward pass (the scheduler's per-step budget: decode tokens plus prompt chunks)
    #[arg(short = 'b', long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Requests that may wait for a free slot; more are refused with 429
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_size: u32,
    /// Worker threads per engine, 1-1024 [default: number of physical cores / --groups]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// KV cache type: f32, f16 or q8_0
    #[arg(long, value_enum, default_value_t = CacheTypeArg::F16)]
    pub cache_type: CacheTypeArg,
    /// Pin threads to distinct cores (physical cores first); with --groups, each group
    /// to its own cores
    #[arg(long)]
    pub pin: bool,
    /// Engine instances (worker groups), each with its own --parallel slots and --threads
    /// threads (default: physical cores / G), behind one HTTP front; requests go to the
    /// least-loaded one. The weights are mapped once and shared.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub groups: u32,
    /// Require `Authorization: Bearer KEY` on /v1/* requests
    #[arg(long, env = "HEARTH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A name of the served model (repeatable): the first is the id /v1/models lists and
    /// responses carry [default: the file name without .gguf]; the others are listed too
    #[arg(long, value_name = "NAME")]
    pub alias: Vec<String>,
    /// Answer 404 to a request naming a model other than the id or an --alias (by default
    /// any name is served, as clients often send a fixed one such as gpt-4o-mini)
    #[arg(long)]
    pub strict_model: bool,
    /// Evaluate every prompt from its start: no reuse of the K/V a finished request left
    /// in its slot (the prompt cache, on by default, keeps it and serves a prompt that
    /// shares its prefix, e.g. a chat's next turn, from there)
    #[arg(long)]
    pub no_prompt_cache: bool,
}

pub fn run(a: Args) -> Result<()> {
    // A client that disconnects must not kill the server with SIGPIPE (main sets it to
    // the default for CLI pipes).
    #[cfg(unix)]
    // SAFETY: setting a signal disposition before the server's threads start.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let path = resolve_model(a.model.as_ref())?;
    let model = Arc::new(Model::load(&path).with_context(|| format!("loading {}", path.display()))?);
    let train = model.config.n_ctx_train;
    let n_ctx = match a.ctx_size {
        Some(c) if c as usize > train => bail!("--ctx-size {c} exceeds the model's trained context length of {train} tokens"),
        Some(c) => c as usize,
        None => 2048.min(train),
    };
    let groups = a.groups as usize;
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty: give a key, or leave the flag out to serve without one");
    }
    let cores = threads_or_default(None);
    if groups > cores {
        eprintln!("warning: --groups {groups} engines on {cores} cores: engines will share cores and slow each other down");
    }
    let threads = a.threads.map_or_else(|| (threads_or_default(None) / groups).max(1), usize::from);
    let cpus = if a.pin {
        let order = hearth_kernels::affinity::pin_order();
        hearth_serve::topology::group_cpus(&order, &hearth_serve::topology::numa_nodes(), groups, threads)
            .map_err(|e| anyhow::anyhow!("--pin: {e}"))?
    } else {
        Vec::new()
    };
    let mut engines = Vec::with_capacity(groups);
    for g in 0..groups {
        let mut ctx = Context::with_cache_type(model.clone(), n_ctx, a.batch_size as usize, threads, a.cache_type.into())?;
        ctx.set_slots(a.parallel as usize)?;
        let pin = cpus.get(g).cloned();
        engines.push(hearth_serve::Engine { ctx, pin });
    }
    let ctx = &engines[0].ctx;
    let model_id = a.alias.first().cloned().unwrap_or_else(|| {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });
    eprintln!(
        "hearth serve: {model_id}, {groups} engine(s) × {} slots × {n_ctx} positions (KV cache {:.1} MiB each), {} tokens per step, \
         {} threads each{}",
        a.parallel,
        ctx.kv_bytes() as f64 / (1 << 20) as f64,
        ctx.n_batch(),
        ctx.n_threads(),
        if a.pin { format!(", pinned to CPUs {cpus:?}") } else { String::new() }
    );
    let opts = hearth_serve::ServeOptions { host: a.host, port: a.port, api_key: a.api_key, queue_size: a.queue_size as usize, model_id, aliases: a.alias.iter().skip(1).cloned().collect(), strict_model: a.strict_model, prompt_cache: !a.no_prompt_cache };
    hearth_serve::serve(engines, opts).context("serving")
}
