//! Flags and helpers shared by subcommands: model path resolution, threads, peak RSS.

use anyhow::{bail, Context as _, Result};
use hearth_model::{CacheType, Context, Model};
use std::io::Write;
use std::path::{Path, PathBuf};
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
    /// [default: 2048, capped at the model's trained context]
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx_size: Option<u32>,
    /// Maximum tokens evaluated per forward pass during prefill (`hearth serve`: per step,
    /// the decoding sequences' tokens and prompt chunks together)
    #[arg(short = 'b', long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// KV cache type for both K and V (llama.cpp's -ctk/-ctv): f32, f16 or q8_0
    /// (q8_0: 34 bytes per 32 values, needs head_dim a multiple of 32)
    #[arg(long, value_enum, default_value_t = CacheTypeArg::F16)]
    pub cache_type: CacheTypeArg,
    /// Pin threads to distinct cores (physical cores first, within this process's CPU set)
    #[arg(long)]
    pub pin: bool,
    #[command(flatten)]
    pub budget: crate::budget::BudgetArgs,
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
}

/// A context ready to run, with what `--mem-budget` and `--workers` set up.
pub use hearth_engine::{mib, Prepared};

/// `--cache-type` values (clap lists them and rejects others).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheTypeArg {
    /// 4 bytes per value
    #[value(name = "f32")]
    F32,
    /// 2 bytes per value (default)
    #[value(name = "f16")]
    F16,
    /// 8.5 bits per value (blocks of 32 int8 with an f16 scale)
    #[value(name = "q8_0")]
    Q8_0,
}

impl From<CacheTypeArg> for CacheType {
    fn from(a: CacheTypeArg) -> Self {
        match a {
            CacheTypeArg::F32 => CacheType::F32,
            CacheTypeArg::F16 => CacheType::F16,
            CacheTypeArg::Q8_0 => CacheType::Q8_0,
        }
    }
}

impl ModelArgs {
    /// Threads to use.
    pub fn threads(&self) -> usize {
        threads_or_default(self.threads)
    }

    /// Load the model, with a one-line error that says how to get the default one.
    pub fn load(&self) -> Result<Arc<Model>> {
        let path = resolve_model(self.model.as_ref())?;
        self.budget.before_load(&path)?;
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

    /// An inference context with these flags (`default_ctx` when `--ctx-size` is absent), with the sliding window (`--mem-budget`) or the
    /// group across devices (`--workers`) it runs with; `logits_all`: every position's logits will be asked for (perplexity).
    pub fn prepare(&self, model: &Arc<Model>, default_ctx: usize, logits_all: bool) -> Result<Prepared> {
        hearth_engine::prepare(model, &self.engine_options(model, default_ctx, logits_all)?)
    }

    /// What [`Self::prepare`] sets up, as the engine's options (one KV cache slot).
    pub fn engine_options(&self, model: &Model, default_ctx: usize, logits_all: bool) -> Result<hearth_engine::EngineOptions> {
        if let Some(n) = self.cluster.slots() {
            bail!("--parallel {n} (KV cache slots) applies to `hearth serve`; this command runs one sequence (across devices: --parallel tensor|ring)");
        }
        self.engine_options_with_slots(model, default_ctx, logits_all, 1)
    }

    /// [`Self::engine_options`] with `slots` KV cache slots (serve).
    pub fn engine_options_with_slots(
        &self,
        model: &Model,
        default_ctx: usize,
        logits_all: bool,
        slots: usize,
    ) -> Result<hearth_engine::EngineOptions> {
        self.cluster.check_unused_unless_enabled()?;
        let cluster = if self.cluster.enabled() { Some(self.cluster.options()?) } else { None };
        Ok(hearth_engine::EngineOptions {
            n_ctx: self.ctx_size(model, default_ctx)?,
            n_batch: self.batch_size as usize,
            n_threads: self.threads(),
            cache_type: self.cache_type.into(),
            slots,
            pin: self.pin,
            logits_all,
            f32_attention_from: None,
            budget: self.budget.options(),
            cluster,
            profile: Some(crate::cmd::profile::for_ring),
        })
    }
}

/// Write to stdout, turning a failed write (full disk, closed stream) into an error.
pub fn print_out(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes()).and_then(|_| out.flush()).context("writing to stdout")
}

/// Open a GGUF file; an error that does not name the file (a malformed field) is
/// prefixed with its path.
pub fn open_gguf(path: &Path) -> Result<hearth_gguf::GgufFile> {
    hearth_gguf::GgufFile::open(path).map_err(|e| match e {
        hearth_gguf::GgufError::Io { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(path.display().to_string()),
    })
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

/// Where this process's memory is, now: /proc (peak, file-backed = mapped weights and
/// code, anonymous), hearth's own buffers by category, and the heap counters.
pub struct MemoryReport {
    pub proc: hearth_memory::ProcMemory,
    pub buffers: hearth_model::ContextBuffers,
    pub heap: hearth_memory::HeapStats,
    pub cache_type: &'static str,
    pub model_file_bytes: u64,
    /// The weights are read into a window's buffers (`--mem-budget`), not used mapped.
    pub weights_streamed: bool,
}

impl MemoryReport {
    pub fn now(ctx: &Context) -> Self {
        Self {
            proc: hearth_memory::ProcMemory::read().unwrap_or_default(),
            buffers: ctx.buffers(),
            heap: hearth_memory::heap_stats(),
            cache_type: ctx.cache_type().name(),
            model_file_bytes: ctx.model().file.as_bytes().len() as u64,
            weights_streamed: ctx.streams_weights(),
        }
    }

    /// The `memory` object of `--json` outputs (all sizes in bytes).
    pub fn json(&self) -> serde_json::Value {
        let (p, b, h) = (&self.proc, &self.buffers, &self.heap);
        serde_json::json!({
            "peak_rss_bytes": p.peak_rss_bytes,
            "rss_bytes": p.rss_bytes,
            "rss_file_bytes": p.rss_file_bytes,
            "rss_anon_bytes": p.rss_anon_bytes,
            "model_file_bytes": self.model_file_bytes,
            "weights_streamed": self.weights_streamed,
            "cache_type": self.cache_type,
            "kv_cache_bytes": b.kv_cache_bytes,
            "activations_bytes": b.activations_bytes,
            "logits_bytes": b.logits_bytes,
            "quantized_activations_bytes": b.quantized_activations_bytes,
            "per_thread_bytes": b.per_thread_bytes,
            "weight_shard_bytes": b.weight_shard_bytes,
            "context_bytes": b.total(),
            "heap_live_bytes": h.heap_live_bytes,
            "heap_peak_bytes": h.heap_peak_bytes,
        })
    }

    /// Two lines for humans.
    pub fn human(&self) -> String {
        let (p, b) = (&self.proc, &self.buffers);
        // Streamed weights sit in the window's buffers (anonymous), not in the mapping:
        // "weights N mapped" beside a few MiB file-backed read as a contradiction.
        let split = if self.weights_streamed {
            format!(
                "now {} file-backed: code; {} anonymous: buffers and the weights read into the window from the {} file",
                mib(p.rss_file_bytes),
                mib(p.rss_anon_bytes),
                mib(self.model_file_bytes)
            )
        } else {
            format!(
                "now {} file-backed: weights {} mapped, code; {} anonymous",
                mib(p.rss_file_bytes),
                mib(self.model_file_bytes),
                mib(p.rss_anon_bytes)
            )
        };
        format!(
            "peak RSS {} ({split})\n\
             hearth buffers {}: KV cache {} ({}), activations {}, logits {}, quantized activations {}, per-thread {}{}; heap peak {}",
            mib(p.peak_rss_bytes),
            mib(b.total() as u64),
            mib(b.kv_cache_bytes as u64),
            self.cache_type,
            mib(b.activations_bytes as u64),
            mib(b.logits_bytes as u64),
            mib(b.quantized_activations_bytes as u64),
            mib(b.per_thread_bytes as u64),
            if b.weight_shard_bytes > 0 {
                format!(", weight shard (tensor parallel) {}", mib(b.weight_shard_bytes as u64))
            } else {
                String::new()
            },
            mib(self.heap.heap_peak_bytes),
        )
    }
}

/// The whole text of `path` (`-`: stdin): a regular file or a pipe (`<(…)`), not a
/// device that may never end (`/dev/zero`) or a directory.
pub fn read_text(path: &std::path::Path) -> Result<String> {
    if path.as_os_str() == "-" {
        return read_stdin_text();
    }
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    #[cfg(unix)]
    let pipe = std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type());
    #[cfg(not(unix))]
    let pipe = false;
    if meta.is_dir() {
        bail!("reading {}: is a directory, not a text file", path.display());
    }
    if !meta.is_file() && !pipe {
        bail!("reading {}: not a regular file or pipe (a device?)", path.display());
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    utf8_text(bytes, &path.display().to_string())
}

/// All of stdin as text (`-f -`).
fn read_stdin_text() -> Result<String> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).context("reading stdin")?;
    utf8_text(bytes, "stdin")
}

/// `bytes` as text, or an error that says where the first byte that is not UTF-8 sits
/// (a Latin-1 or UTF-16 file is the usual cause), so the user can find and fix it.
pub fn utf8_text(mut bytes: Vec<u8>, what: &str) -> Result<String> {
    // A byte-order mark is not text: UTF-8's is dropped (editors on Windows write it);
    // UTF-16's says what to convert from.
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") {
        bail!("{what} is UTF-16 text (it starts with a UTF-16 byte-order mark): convert it to UTF-8 (e.g. `iconv -f utf-16 -t utf-8`)");
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let b = e.as_bytes();
        let line = b[..at].iter().filter(|&&c| c == b'\n').count() + 1;
        let column = at - b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1) + 1;
        anyhow::anyhow!(
            "{what} is not UTF-8 text: byte 0x{:02x} at byte offset {at} (line {line}, byte {column} of the line) is not part of a \
             valid character; convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
            b[at]
        )
    })
}


/// Parse `true|false|1|0|yes|no`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("expected true or false, got {s:?}")),
    }
}

/// llama.cpp's `llama_ftype` values with the names `llama-bench` prints
/// (`general.file_type`: what most of a file's tensors are).
const FILE_TYPES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
];

/// The name of a `general.file_type` value, e.g. 3 → `Q4_1`.
pub fn file_type_name(ftype: u32) -> String {
    FILE_TYPES.iter().find(|(id, _)| *id == ftype).map(|(_, n)| n.to_string()).unwrap_or_else(|| format!("ftype {ftype}"))
}

/// The `general.file_type` of a file whose weights are all `ty` (the `_S` variant for
/// K-quants, which llama.cpp uses for "mostly this type"), or `None` when ggml has none.
pub fn file_type_of(ty: hearth_quant::GgmlType) -> Option<u32> {
    use hearth_quant::GgmlType::*;
    Some(match ty {
        F32 => 0,
        F16 => 1,
        // Q4_0X8 and Q4_KX8 (hearth's, which llama.cpp refuses) hold Q4_0's and Q4_K's numbers.
        Q4_0 | Q4_0X8 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q5_0 => 8,
        Q5_1 => 9,
        Q2_K => 10,
        Q3_K => 11,
        Q4_K | Q4_KX8 => 14,
        Q5_K => 16,
        Q6_K => 18,
        IQ4_NL => 25,
        IQ4_XS => 30,
        BF16 => 32,
        TQ1_0 => 36,
        TQ2_0 => 37,
        _ => return None,
    })
}

/// Parameter count as llama.cpp prints it: `134.52 M`, `6.74 B`.
pub fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

/// `--threads`, else the number of physical cores.
pub fn threads_or_default(threads: Option<u16>) -> usize {
    threads.map(usize::from).unwrap_or_else(hearth_kernels::physical_cores).max(1)
}

/// A progress bar on stderr for writing `total` bytes.
pub fn byte_progress(total: u64, message: String) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}, eta {eta}")
            .expect("constant template")
            .progress_chars("=> "),
    );
    pb.set_message(message);
    pb
}
