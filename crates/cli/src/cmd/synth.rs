//! `hearth synth`: write a random-weight GGUF of any architecture hearth runs
//! (`--arch llama|qwen2|qwen3|gemma3|phi3|qwen2moe|qwen3moe|mixtral`) and a standard shape, to benchmark shapes
//! whose real weights we do not have (speed does not depend on values) and to test each
//! architecture against llama.cpp on the same file.
//!
//! The file is what llama.cpp's converter writes: the architecture's tensor names and
//! order (from its table, [`hearth_model::Arch::layer_tensors`]), `{arch}.*`
//! hyperparameters ([`ModelConfig::to_metadata`]), `general.file_type`, and the tokenizer
//! copied from a real model (so the vocabulary, and with it the embedding and output
//! shapes, are that model's). Norms are 1.0 (F32); biases and a shared expert's gate
//! input random (F32); RoPE frequency
//! factors a fixed ramp; every matrix is random f32 values (uniform, σ 0.02 like an
//! initialised model) quantized row by row with `hearth_quant::quantize_row`, so every
//! block is valid. Rows are seeded from (seed, tensor, row): the output does not
//! depend on the thread count. Free space is checked before writing, and the writer
//! renames a finished temporary file into place.

use clap::ValueEnum as _;
use crate::common::{file_type_of, mib, params_label, print_out, resolve_model};
use anyhow::{bail, Context as _, Result};
use hearth_gguf::{write_gguf_file, GgufFile, TensorSpec, Value};
use hearth_model::{Arch, ModelConfig, RopeScaling};
use hearth_quant::GgmlType;
use indicatif::ProgressBar;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Named shapes (llama.cpp's baseline used the 1B and 7B ones).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// n_embd 256, 2 layers, 4 heads, 2 KV heads, n_ff 512 (for tests)
    Tiny,
    /// TinyLlama 1.1B: n_embd 2048, 22 layers, 32 heads, 4 KV heads, n_ff 5632
    #[value(name = "1b")]
    B1,
    /// Llama 2 7B: n_embd 4096, 32 layers, 32 heads, 32 KV heads, n_ff 11008
    #[value(name = "7b")]
    B7,
    /// Llama 2 13B: n_embd 5120, 40 layers, 40 heads, 40 KV heads, n_ff 13824
    #[value(name = "13b")]
    B13,
    /// Llama 2 70B: n_embd 8192, 80 layers, 64 heads, 8 KV heads, n_ff 28672
    #[value(name = "70b")]
    B70,
    /// Qwen3-30B-A3B: n_embd 2048, 48 layers, 32 heads of 128, 4 KV heads, 128 experts of
    /// 768 (8 per token); for --arch qwen3moe (synth's --n-layer cuts it to fit)
    #[value(name = "30b-a3b")]
    A3b,
    /// Qwen1.5-MoE-A2.7B: n_embd 2048, 24 layers, 16 heads, 16 KV heads, 60 experts of 1408
    /// (4 per token) and a shared expert of 5632; for --arch qwen2moe
    #[value(name = "a2.7b")]
    A2_7b,
}

/// Hyperparameters of the file to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_ff: u64,
}

impl Shape {
    /// The preset's hyperparameters (one table, shared with `hearth plan`).
    fn dims(self) -> Dims {
        if self == Shape::A3b {
            return Dims { n_embd: 2048, n_layer: 48, n_head: 32, n_head_kv: 4, n_ff: 768 };
        }
        if self == Shape::A2_7b {
            return Dims { n_embd: 2048, n_layer: 24, n_head: 16, n_head_kv: 16, n_ff: 1408 };
        }
        let name = self.to_possible_value().expect("no skipped variants").get_name().to_string();
        let p = hearth_memory::preset(&name).expect("every --shape value has a preset");
        let n = |v: usize| v as u64;
        Dims { n_embd: n(p.n_embd), n_layer: n(p.n_layer), n_head: n(p.n_head), n_head_kv: n(p.n_head_kv), n_ff: n(p.n_ff) }
    }
}

impl Shape {
    /// The mixture of experts a MoE shape is the shape of (`None`: a dense shape, which
    /// any --arch takes, a MoE one with 8 experts of --n-ff, 2 per token).
    pub fn moe_arch(self) -> Option<ArchArg> {
        match self {
            Shape::A3b => Some(ArchArg::Qwen3moe),
            Shape::A2_7b => Some(ArchArg::Qwen2moe),
            _ => None,
        }
    }

    /// The `--shape` value, e.g. `30b-a3b`.
    pub fn name(self) -> String {
        flag_value(self)
    }
}

/// A `--shape` or `--arch` value as typed on the command line.
fn flag_value(v: impl clap::ValueEnum) -> String {
    v.to_possible_value().expect("no skipped variants").get_name().to_string()
}

/// `--arch`, or the shape's own architecture when it is a mixture of experts (else llama).
pub fn arch_for(arch: Option<ArchArg>, shape: Shape) -> Result<ArchArg> {
    let Some(model) = shape.moe_arch() else { return Ok(arch.unwrap_or(ArchArg::Llama)) };
    match arch {
        None => Ok(model),
        Some(a) if matches!(a, ArchArg::Qwen2moe | ArchArg::Qwen3moe | ArchArg::Mixtral) => Ok(a),
        // Experts are the point of these shapes: a dense model of one expert's width
        // is not what the user asked for.
        Some(a) => {
            let others: Vec<String> =
                [ArchArg::Qwen2moe, ArchArg::Qwen3moe, ArchArg::Mixtral].into_iter().filter(|&o| o != model).map(ArchArg::name).collect();
            bail!(
                "--shape {} is a mixture of experts: it takes --arch {} (its own, the default) or {}, not --arch {}",
                shape.name(),
                model.name(),
                others.join(" or "),
                a.name()
            )
        }
    }
}

/// `--arch` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArchArg {
    /// Llama 2/3, Mistral (RoPE on adjacent pairs)
    Llama,
    /// Qwen2/2.5: Q/K/V biases, NeoX RoPE
    Qwen2,
    /// Qwen3: per-head Q/K norms, NeoX RoPE
    Qwen3,
    /// Gemma 3: scaled embeddings, GELU FFN, pre/post norms, Q/K norms, 5 local (512-position window) : 1 global layers
    Gemma3,
    /// Phi-3: fused QKV and gate/up, LongRoPE factors
    Phi3,
    /// Qwen2-MoE: Qwen2's attention, --n-expert experts of --n-ff-exp and a shared expert of --n-ff-shexp
    Qwen2moe,
    /// Qwen3-MoE: Qwen3's attention, a mixture of --n-expert experts of --n-ff-exp
    Qwen3moe,
    /// Mixtral: a llama file with --n-expert experts of --n-ff
    Mixtral,
}

impl ArchArg {
    /// The `--arch` value, e.g. `qwen3moe`.
    pub fn name(self) -> String {
        flag_value(self)
    }

    /// The architecture.
    pub fn arch(self) -> Arch {
        match self {
            ArchArg::Llama => Arch::Llama,
            ArchArg::Qwen2 => Arch::Qwen2,
            ArchArg::Qwen3 => Arch::Qwen3,
            ArchArg::Gemma3 => Arch::Gemma3,
            ArchArg::Phi3 => Arch::Phi3,
            ArchArg::Qwen2moe => Arch::Qwen2Moe,
            ArchArg::Qwen3moe => Arch::Qwen3Moe,
            ArchArg::Mixtral => Arch::Mixtral,
        }
    }
}

/// `--rope-scaling` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalingArg {
    /// Unscaled
    None,
    /// Position interpolation by 1/--rope-scale
    Linear,
    /// YaRN with factor --rope-scale over --rope-orig-ctx
    Yarn,
}

fn parse_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| format!("unknown tensor type {s:?} (e.g. f32, f16, bf16, q4_0, q4_1, q8_0)"))
}

/// Flags of `hearth synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Architecture of the file [default: the shape's for 30b-a3b (qwen3moe) and a2.7b
    /// (qwen2moe), else llama]
    #[arg(long, value_enum)]
    pub arch: Option<ArchArg>,
    /// Named shape; --n-embd etc. override single values of it
    #[arg(long, value_enum, default_value = "tiny")]
    pub shape: Shape,
    /// Width of one attention head [default: n_embd / n_head]
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=512))]
    pub head_dim: Option<u64>,
    /// RoPE scaling written to {arch}.rope.scaling.*
    #[arg(long, value_enum, default_value = "none")]
    pub rope_scaling: ScalingArg,
    /// RoPE scaling factor (with --rope-scaling linear|yarn)
    #[arg(long, default_value_t = 4.0)]
    pub rope_scale: f32,
    /// Original training context of a YaRN-scaled model
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub rope_orig_ctx: u64,
    /// Write a Llama-3.1-style rope_freqs.weight (per-pair RoPE frequency divisors; llama only)
    #[arg(long)]
    pub rope_freqs: bool,
    /// Tie the output head to the embedding (no output.weight)
    #[arg(long)]
    pub tied: bool,
    /// Residual width [default: from --shape]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_embd: Option<u64>,
    /// Transformer blocks [default: from --shape]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_layer: Option<u64>,
    /// Query heads [default: from --shape]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_head: Option<u64>,
    /// Key/value heads, dividing --n-head [default: from --shape]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_head_kv: Option<u64>,
    /// FFN hidden width [default: from --shape]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_ff: Option<u64>,
    /// Experts per layer (qwen2moe, qwen3moe, mixtral) [default: 8; 30b-a3b: 128; a2.7b: 60]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=hearth_model::MAX_EXPERTS as u64))]
    pub n_expert: Option<u64>,
    /// Experts each token uses (at most --n-expert) [default: 2; 30b-a3b: 8; a2.7b: 4]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_expert_used: Option<u64>,
    /// Width of one expert, qwen3moe's expert_feed_forward_length [default: --n-ff]
    /// (Mixtral's experts are --n-ff wide)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_ff_exp: Option<u64>,
    /// Width of qwen2moe's shared expert, expert_shared_feed_forward_length [default: --n-ff;
    /// a2.7b: 5632]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n_ff_shexp: Option<u64>,
    /// Type of the embedding and the layer matrices (any type hearth can quantize to;
    /// q4_0x8 / q4_kx8: Q4_0 / Q4_K with 8 rows interleaved, hearth's own layouts, the
    /// embedding in q4_0 / q4_k)
    #[arg(long = "type", value_name = "TYPE", default_value = "q4_0", value_parser = parse_type)]
    pub ty: GgmlType,
    /// Type of output.weight [default: the --type]
    #[arg(long, value_name = "TYPE", value_parser = parse_type)]
    pub output_type: Option<GgmlType>,
    /// GGUF whose tokenizer.* metadata is copied (its vocabulary sets n_vocab)
    /// [default: $HEARTH_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, value_name = "MODEL.gguf")]
    pub tokenizer_from: Option<PathBuf>,
    /// Output file (written to OUT.tmp-PID, then renamed)
    #[arg(long, value_name = "FILE.gguf")]
    pub out: PathBuf,
    /// Trained context length written to llama.context_length
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub context_length: u64,
    /// Seed of the random weights (the same seed and shape give the same file)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Print the shape, parameter count and file size as JSON, and write nothing
    #[arg(long)]
    pub dry_run: bool,
}

/// Exact size of the GGUF file `write_gguf` produces for this metadata and these tensors
/// (default alignment 32).
pub fn file_bytes(metadata: &[(String, Value)], tensors: &[TensorSpec]) -> Result<u64> {
    const ALIGN: u64 = hearth_gguf::DEFAULT_ALIGNMENT;
    // Magic, version, tensor count, metadata count; key/value records; tensor infos
    // (name, n_dims, dims, type, offset); padding; then each tensor padded.
    let kv: u64 = metadata.iter().map(|(k, v)| record_bytes(k, v)).sum();
    let infos: u64 = tensors.iter().map(|t| 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8).sum();
    let mut total = (24 + kv + infos).div_ceil(ALIGN) * ALIGN;
    for t in tensors {
        total += t.size()?.div_ceil(ALIGN) * ALIGN;
    }
    Ok(total)
}

/// Serialized bytes of one metadata key/value record.
fn record_bytes(k: &str, v: &Value) -> u64 {
    fn value_bytes(v: &Value) -> u64 {
        match v {
            Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
            Value::U16(_) | Value::I16(_) => 2,
            Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
            Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
            Value::String(s) => 8 + s.len() as u64,
            Value::Array { items, .. } => 4 + 8 + items.iter().map(value_bytes).sum::<u64>(),
        }
    }
    8 + k.len() as u64 + 4 + value_bytes(v)
}

/// Bytes available to an unprivileged writer on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).context("path contains a NUL byte")?;
    // SAFETY: `c` is a valid C string; `st` is plain data filled by statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", dir.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A failed write of `path`: an I/O error already names the file ("writing PATH: why"),
/// anything else gets it as context.
pub(crate) fn writing(path: &Path, e: hearth_gguf::GgufError) -> anyhow::Error {
    match e {
        hearth_gguf::GgufError::Io { .. } => anyhow::anyhow!("writing {e}"),
        e => anyhow::Error::new(e).context(format!("writing {}", path.display())),
    }
}

/// Refuse when `needed` bytes do not fit in `available` (with 64 MiB to spare).
pub fn check_space(out: &Path, needed: u64, available: u64) -> Result<()> {
    const SPARE: u64 = 64 << 20;
    if needed + SPARE > available {
        bail!(
            "not enough disk space for {}: it needs {needed} bytes ({}) plus {} spare, but only {available} bytes ({}) are free there",
            out.display(),
            gib(needed),
            mib(SPARE),
            gib(available)
        );
    }
    Ok(())
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// splitmix64: a fast, well-mixed hash to seed each row.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `row` with uniform values of standard deviation 0.02 (xorshift64* stream).
fn random_row(seed: u64, row: &mut [f32]) {
    let mut s = splitmix(seed) | 1;
    const A: f32 = 0.02 * 1.732_050_8; // uniform on [-A, A] has σ = A / √3
    for x in row {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // 24 random bits → [0, 1) → [-A, A)
        *x = ((r >> 40) as f32 * (1.0 / (1u32 << 24) as f32) * 2.0 - 1.0) * A;
    }
}

/// Write tensor `ti`'s bytes: rows quantized in parallel, a chunk of rows at a time.
fn fill_tensor(t: &TensorSpec, ti: usize, seed: u64, threads: usize, w: &mut dyn Write, pb: &ProgressBar) -> std::io::Result<()> {
    if t.dims.len() == 1 {
        // A norm: all ones; a bias: random; RoPE factors: a ramp from 1 (Llama 3.1's run
        // from 1 to 8; LongRoPE's short factors near 1, long ones up to 4).
        let n = t.dims[0] as usize;
        let ramp = |top: f32| (0..n).map(move |i| 1.0 + (top - 1.0) * i as f32 / (n.max(2) - 1) as f32);
        let vals: Vec<f32> = match t.name.as_str() {
            name if name.ends_with(".bias") || name.ends_with("ffn_gate_inp_shexp.weight") => {
                let mut b = vec![0f32; n];
                random_row(splitmix(seed ^ splitmix(ti as u64)), &mut b);
                b
            }
            "rope_freqs.weight" => ramp(8.0).collect(),
            "rope_factors_short.weight" => ramp(1.5).collect(),
            "rope_factors_long.weight" => ramp(4.0).collect(),
            _ => vec![1.0; n],
        };
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        pb.inc(bytes.len() as u64);
        return w.write_all(&bytes);
    }
    // A matrix, or stacked experts ([cols, rows, n_expert]: n_expert·rows rows).
    let (cols, rows) = (t.dims[0] as usize, t.dims[1..].iter().product::<u64>() as usize);
    let row_bytes = t.ty.row_bytes(cols as u64).expect("checked by TensorSpec::size") as usize;
    // Rows stored in groups (Q4_0X8, Q4_KX8): quantized as their row type, then grouped, a chunk
    // of whole groups at a time (`file_tensors` gives such a type whole groups only).
    let (group, row_ty) = (t.ty.group_rows(), t.ty.ungrouped());
    // (A tensor of fewer rows than threads, e.g. the router of a 1-expert file, is one chunk.)
    let chunk_rows = ((64usize << 20) / row_bytes).clamp(threads.min(rows.max(1)), rows.max(1)).next_multiple_of(group);
    let mut buf = vec![0u8; chunk_rows * row_bytes];
    let mut grouped = Vec::new();
    let tseed = splitmix(seed ^ splitmix(ti as u64));
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk_rows.min(rows - r0);
        let out = &mut buf[..n * row_bytes];
        let per = n.div_ceil(threads);
        let err = std::thread::scope(|s| {
            let hs: Vec<_> = out
                .chunks_mut(per * row_bytes)
                .enumerate()
                .map(|(k, part)| {
                    s.spawn(move || -> Result<(), hearth_quant::QuantError> {
                        let mut x = vec![0f32; cols];
                        for (j, dst) in part.chunks_mut(row_bytes).enumerate() {
                            random_row(tseed ^ splitmix((r0 + k * per + j) as u64), &mut x);
                            hearth_quant::quantize_row(row_ty, &x, dst)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("quantize thread panicked")).find_map(Result::err)
        });
        if let Some(e) = err {
            return Err(std::io::Error::other(e));
        }
        let out: &[u8] = if group > 1 {
            grouped.resize(out.len(), 0);
            hearth_quant::interleave::interleave(t.ty, out, n, cols, &mut grouped).map_err(std::io::Error::other)?;
            &grouped
        } else {
            out
        };
        w.write_all(out)?;
        pb.inc(out.len() as u64);
        r0 += n;
    }
    Ok(())
}

/// The configuration `hearth synth --arch <arch> --shape <shape>` writes with no other
/// flags, for a vocabulary of `n_vocab` (`hearth plan --shape` plans that file): parsed
/// as synth's own flags, so the two never differ.
pub fn shape_config(arch: Option<ArchArg>, shape: Shape, n_vocab: u64) -> Result<ModelConfig> {
    #[derive(clap::Parser)]
    struct Synth {
        #[command(flatten)]
        a: Args,
    }
    let mut argv = vec!["synth".to_string(), "--shape".into(), shape.name(), "--out".into(), "unused.gguf".into()];
    if let Some(arch) = arch {
        argv.extend(["--arch".into(), arch.name()]);
    }
    let a = <Synth as clap::Parser>::try_parse_from(argv)?.a;
    Ok(config(&a, n_vocab)?.0)
}

/// The file's configuration from the flags (and its dims, n_ff one expert's width).
fn config(a: &Args, n_vocab: u64) -> Result<(ModelConfig, Dims)> {
    let base = a.shape.dims();
    let d = Dims {
        n_embd: a.n_embd.unwrap_or(base.n_embd),
        n_layer: a.n_layer.unwrap_or(base.n_layer),
        n_head: a.n_head.unwrap_or(base.n_head),
        n_head_kv: a.n_head_kv.unwrap_or(base.n_head_kv),
        n_ff: a.n_ff.unwrap_or(base.n_ff),
    };
    if !d.n_embd.is_multiple_of(d.n_head) {
        bail!("--n-embd {} is not a multiple of --n-head {}", d.n_embd, d.n_head);
    }
    if !d.n_head.is_multiple_of(d.n_head_kv) {
        bail!("--n-head {} is not a multiple of --n-head-kv {}", d.n_head, d.n_head_kv);
    }
    let head_dim = a.head_dim.unwrap_or(if a.shape == Shape::A3b { 128 } else { d.n_embd / d.n_head });
    if !head_dim.is_multiple_of(2) {
        bail!("head size {head_dim} (--head-dim, or --n-embd / --n-head) must be even for RoPE");
    }
    let arch = arch_for(a.arch, a.shape)?.arch();
    let moe = match arch {
        Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Mixtral => {
            let (n_expert, n_expert_used) = match a.shape {
                Shape::A3b => (128, 8),
                Shape::A2_7b => (60, 4),
                _ => (8, 2),
            };
            let n_expert = a.n_expert.unwrap_or(n_expert);
            let n_expert_used = a.n_expert_used.unwrap_or(n_expert_used);
            if n_expert_used > n_expert {
                bail!("--n-expert-used {n_expert_used} is more than --n-expert {n_expert}");
            }
            if arch == Arch::Mixtral && a.n_ff_exp.is_some() {
                bail!("--n-ff-exp is qwen3moe's; Mixtral's experts are --n-ff wide");
            }
            if arch != Arch::Qwen2Moe && a.n_ff_shexp.is_some() {
                bail!("--n-ff-shexp is qwen2moe's shared expert; --arch {arch} has none");
            }
            // qwen2moe: the shared expert is --n-ff wide (the shape's 5632 for a2.7b).
            let n_ff_shared = match arch {
                Arch::Qwen2Moe => a.n_ff_shexp.unwrap_or(if a.shape == Shape::A2_7b && a.n_ff.is_none() { 5632 } else { d.n_ff }) as usize,
                _ => 0,
            };
            let norm_weights = arch != Arch::Qwen2Moe;
            Some(hearth_model::Moe { n_expert: n_expert as usize, n_expert_used: n_expert_used as usize, norm_weights, n_ff_shared })
        }
        _ => {
            if a.n_expert.is_some() || a.n_expert_used.is_some() || a.n_ff_exp.is_some() || a.n_ff_shexp.is_some() {
                bail!("--n-expert, --n-expert-used, --n-ff-exp and --n-ff-shexp are for --arch qwen2moe, qwen3moe or mixtral");
            }
            None
        }
    };
    // A mixture of experts' n_ff is one expert's width.
    let d = Dims { n_ff: a.n_ff_exp.unwrap_or(d.n_ff), ..d };
    if a.rope_freqs && !matches!(arch, Arch::Llama | Arch::Mixtral) {
        bail!("--rope-freqs is a llama-architecture tensor (Llama 3.1); --arch {arch} has none");
    }
    if !(a.rope_scale.is_finite() && a.rope_scale >= 1.0) {
        bail!("--rope-scale {} must be at least 1", a.rope_scale);
    }
    let us = |v: u64| v as usize;
    let mut cfg =
        ModelConfig::for_shape(arch, us(d.n_embd), us(d.n_layer), us(d.n_head), us(d.n_head_kv), us(head_dim), us(d.n_ff), us(n_vocab));
    cfg.n_ctx_train = us(a.context_length);
    cfg.moe = moe;
    match a.rope_scaling {
        ScalingArg::None => {}
        ScalingArg::Linear => (cfg.rope.scaling, cfg.rope.freq_scale) = (RopeScaling::Linear, 1.0 / a.rope_scale),
        ScalingArg::Yarn => {
            (cfg.rope.scaling, cfg.rope.freq_scale, cfg.rope.n_ctx_orig) = (RopeScaling::Yarn, 1.0 / a.rope_scale, us(a.rope_orig_ctx))
        }
    }
    Ok((cfg, d))
}

pub fn run(a: Args) -> Result<()> {
    // A shape/arch mismatch is refused before the tokenizer is looked for.
    arch_for(a.arch, a.shape)?;
    let out_ty = a.output_type.unwrap_or(a.ty);
    for (flag, ty) in [("--type", a.ty), ("--output-type", out_ty)] {
        let probe = vec![0f32; ty.block_size()];
        let mut dst = vec![0u8; ty.type_size()];
        if hearth_quant::quantize_row(ty.ungrouped(), &probe, &mut dst).is_err() {
            bail!("{flag} {ty}: hearth cannot quantize to this type yet");
        }
    }
    let ftype = file_type_of(a.ty).with_context(|| format!("--type {}: llama.cpp has no file type for it", a.ty))?;

    let tok_path = resolve_model(a.tokenizer_from.as_ref())?;
    let src = GgufFile::open(&tok_path).with_context(|| format!("reading the tokenizer from {}", tok_path.display()))?;
    let n_vocab = src.get_array("tokenizer.ggml.tokens").with_context(|| format!("{} has no tokenizer", tok_path.display()))?.len() as u64;
    let (cfg, d) = config(&a, n_vocab)?;
    let (arch, head_dim) = (cfg.arch, cfg.head_dim);
    let name = format!("hearth-synth {arch} {} {}", shape_label(&a, &d), a.ty.name().to_uppercase());
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.name().into())),
        ("general.name".into(), Value::String(name)),
        ("general.file_type".into(), Value::U32(ftype)),
        ("general.quantization_version".into(), Value::U32(2)),
    ];
    meta.extend(cfg.to_metadata());
    meta.extend(src.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned());
    let tensors = hearth_model::file_tensors(&cfg, a.ty, out_ty, a.tied, a.rope_freqs);
    for t in &tensors {
        t.size().with_context(|| format!("{} needs every row to be whole blocks", t.ty))?;
    }
    let needed = file_bytes(&meta, &tensors)?;
    let n_params: u64 = tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum();
    if a.dry_run {
        let mut v = serde_json::json!({"arch": arch.name(), "head_dim": head_dim, "n_embd": d.n_embd, "n_layer": d.n_layer, "n_head": d.n_head, "n_head_kv": d.n_head_kv,
            "n_ff": d.n_ff, "n_vocab": n_vocab, "type": a.ty.name(), "output_type": out_ty.name(),
            "n_params": n_params, "file_bytes": needed});
        if let Some(m) = cfg.moe {
            // n_ff is then one routed expert's width; the file's expert metadata as well.
            v["n_expert"] = m.n_expert.into();
            v["n_expert_used"] = m.n_expert_used.into();
            v["n_ff_exp"] = d.n_ff.into();
            v["n_ff_shexp"] = m.n_ff_shared.into();
        }
        if arch == Arch::Mixtral {
            // llama.cpp reads Mixtral as a llama file with experts, and so does the file:
            // general.architecture is "llama".
            v["arch_flag"] = "mixtral".into();
            v["note"] = "Mixtral is written as general.architecture llama with expert tensors (as llama.cpp's converter does)".into();
        }
        return print_out(&format!("{v}\n"));
    }
    let dir = match a.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    check_space(&a.out, needed, free_bytes(&dir)?)?;

    let threads = crate::common::threads_or_default(a.threads);
    let data: u64 = tensors.iter().map(|t| t.size().unwrap_or(0)).sum();
    let pb = crate::common::byte_progress(data, format!("writing {}", a.out.display()));
    let seed = a.seed;
    write_gguf_file(&a.out, &meta, &tensors, |i, w| fill_tensor(&tensors[i], i, seed, threads, w, &pb)).map_err(|e| writing(&a.out, e))?;
    pb.finish_and_clear();
    eprintln!(
        "wrote {}: {} params, {} layers, n_embd {}, n_vocab {n_vocab}, {} ({} bytes)",
        a.out.display(),
        params_label(n_params),
        d.n_layer,
        d.n_embd,
        gib(needed),
        needed
    );
    Ok(())
}

fn shape_label(a: &Args, d: &Dims) -> String {
    let named = a.shape.dims() == *d;
    match (named, a.shape) {
        (true, Shape::Tiny) => "tiny".into(),
        (true, Shape::B1) => "1B".into(),
        (true, Shape::B7) => "7B".into(),
        (true, Shape::B13) => "13B".into(),
        (true, Shape::B70) => "70B".into(),
        (true, Shape::A3b) => "30B-A3B".into(),
        (true, Shape::A2_7b) => "A2.7B".into(),
        (false, _) => format!("{}x{}", d.n_layer, d.n_embd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_gguf::write_gguf;

    fn meta() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("llama.block_count".into(), Value::U32(2)),
            ("tokenizer.ggml.tokens".into(), hearth_gguf::string_array(["a", "bc", "def"])),
        ]
    }

    fn cfg(arch: Arch, d: &Dims, n_vocab: usize) -> ModelConfig {
        let u = |v: u64| v as usize;
        ModelConfig::for_shape(arch, u(d.n_embd), u(d.n_layer), u(d.n_head), u(d.n_head_kv), u(d.n_embd / d.n_head), u(d.n_ff), n_vocab)
    }

    #[test]
    fn file_bytes_is_exact() {
        let d = Shape::Tiny.dims();
        let d = Dims { n_embd: 64, n_ff: 96, ..d };
        for ty in [GgmlType::F32, GgmlType::Q4_0, GgmlType::Q8_0] {
            let specs = hearth_model::file_tensors(&cfg(Arch::Llama, &d, 32), ty, GgmlType::F16, false, false);
            let bytes = write_gguf(Vec::new(), &meta(), &specs, |i, w| {
                w.write_all(&vec![0u8; specs[i].size().unwrap() as usize])
            })
            .unwrap();
            assert_eq!(file_bytes(&meta(), &specs).unwrap(), bytes.len() as u64, "{ty}");
        }
    }

    #[test]
    fn big_shapes_have_the_published_sizes() {
        // llama.cpp baseline: 7B Q4_0 + Q6_K output, vocab 49152 → 6.88 B params; 1B → 1.17 B.
        let n = |s: Shape| {
            hearth_model::file_tensors(&cfg(Arch::Llama, &s.dims(), 49152), GgmlType::Q4_0, GgmlType::Q4_0, false, false).iter().map(|t| t.dims.iter().product::<u64>()).sum::<u64>()
        };
        assert_eq!((n(Shape::B7) as f64 / 1e7).round(), 688.0);
        assert_eq!((n(Shape::B1) as f64 / 1e7).round(), 117.0);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let e = check_space(Path::new("/x/70b.gguf"), 280_000_000_000, 60_000_000_000).unwrap_err().to_string();
        assert!(e.contains("280000000000 bytes") && e.contains("60000000000 bytes"), "{e}");
        check_space(Path::new("x"), 1 << 20, 1 << 30).unwrap();
    }

    #[test]
    fn rows_are_reproducible_and_scaled() {
        let (mut a, mut b) = (vec![0f32; 4096], vec![0f32; 4096]);
        random_row(7, &mut a);
        random_row(7, &mut b);
        assert_eq!(a, b);
        let var = a.iter().map(|x| x * x).sum::<f32>() / a.len() as f32;
        assert!((var.sqrt() - 0.02).abs() < 0.002, "{}", var.sqrt());
    }
}
