//! Flags and helpers shared by subcommands: model path resolution, threads, peak RSS.

use anyhow::{bail, Context as _, Result};
use hearth_model::Model;
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
    /// Worker threads [default: number of physical cores]
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Context size in tokens (KV cache positions)
    #[arg(short = 'c', long, default_value_t = 2048)]
    pub ctx_size: usize,
    /// Maximum tokens evaluated per forward pass during prefill
    #[arg(short = 'b', long, default_value_t = 512)]
    pub batch_size: usize,
}

impl ModelArgs {
    /// Threads to use.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(hearth_kernels::physical_cores).max(1)
    }

    /// Load the model, with a one-line error that says how to get the default one.
    pub fn load(&self) -> Result<Arc<Model>> {
        let path = resolve_model(self.model.as_ref())?;
        let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
        if self.ctx_size == 0 {
            bail!("--ctx-size must be at least 1");
        }
        Ok(Arc::new(model))
    }
}

/// `--model`, else `$HEARTH_MODEL`, else the default model under `./models` or the
/// source checkout's `models/`.
pub fn resolve_model(arg: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.clone());
    }
    if let Ok(p) = std::env::var("HEARTH_MODEL") {
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
