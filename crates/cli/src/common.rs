//! Flags and helpers shared by subcommands: model path resolution, threads, peak RSS.

use anyhow::{bail, Context as _, Result};
use hearth_model::{Context, Model};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// File name of the default model.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Flags every model-running command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file [default: $HEARTH_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Worker threads, 1-1024 [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Context size in tokens (KV cache positions), at most the model's trained context
    /// [default: 2048 (perplexity: 512), capped at the model's trained context]
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx_size: Option<u32>,
    /// Maximum tokens evaluated per forward pass during prefill
    #[arg(short = 'b', long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
}

impl ModelArgs {
    /// Threads to use.
    pub fn threads(&self) -> usize {
        self.threads.map(usize::from).unwrap_or_else(hearth_kernels::physical_cores).max(1)
    }

    /// Load the model, with a one-line error that says how to get the default one.
    pub fn load(&self) -> Result<Arc<Model>> {
        let path = resolve_model(self.model.as_ref())?;
        let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
        Ok(Arc::new(model))
    }

    /// The context size: `--ctx-size`, else `default` capped at the model's trained context.
    pub fn ctx_size(&self, model: &Model, default: usize) -> Result<usize> {
        let train = model.config.n_ctx_train;
        match self.ctx_size {
            Some(c) if c as usize > train => {
                bail!("--ctx-size {c} exceeds the model's trained context length of {train} tokens")
            }
            Some(c) => Ok(c as usize),
            None => Ok(default.min(train)),
        }
    }

    /// An inference context with these flags (`default_ctx` when `--ctx-size` is absent).
    pub fn context(&self, model: &Arc<Model>, default_ctx: usize) -> Result<Context> {
        let n_ctx = self.ctx_size(model, default_ctx)?;
        Ok(Context::new(model.clone(), n_ctx, self.batch_size as usize, self.threads())?)
    }
}

/// Write to stdout, turning a failed write (full disk, closed stream) into an error.
pub fn print_out(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes()).and_then(|_| out.flush()).context("writing to stdout")
}

/// `--model`, else `$HEARTH_MODEL`, else the default model under `./models` or the
/// source checkout's `models/`.
pub fn resolve_model(arg: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("HEARTH_MODEL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let candidates = [
        PathBuf::from("models").join(DEFAULT_MODEL),
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")).join(DEFAULT_MODEL),
    ];
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    bail!(
        "no --model given and the default model {DEFAULT_MODEL} is not in ./models; \
         fetch it with: scripts/fetch-models.sh"
    )
}

/// Peak resident set size of this process in bytes (`VmHWM` in /proc/self/status).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes as MiB with one decimal.
pub fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Parse `true|false|1|0|yes|no`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("expected true or false, got {s:?}")),
    }
}
