//! `hearth quantize`: requantize a GGUF file to another weight type, as llama-quantize
//! does. The per-tensor recipe and the streaming converter live in
//! `hearth_model::quantize`; this command checks paths and free space, draws the
//! progress bar and prints the summary.

use crate::cmd::synth::{check_space, file_bytes, free_bytes, writing};
use crate::common::{file_type_name, mib};
use anyhow::{bail, Context as _, Result};
use hearth_gguf::GgufFile;
use hearth_model::quantize::{
    plan_quantize, quantize_target_names, quantized_metadata, target_file_type, write_quantized, QuantizeError, QuantizeOptions,
};
use hearth_quant::GgmlType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags of `hearth quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Source GGUF file
    #[arg(value_name = "IN.gguf")]
    pub input: PathBuf,
    /// Output file (written to OUT.tmp-PID, then renamed); must differ from IN
    #[arg(value_name = "OUT.gguf")]
    pub output: PathBuf,
    /// Target type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k (Q3_K_M mix),
    /// q4_k (Q4_K_M mix), q5_k (Q5_K_M mix), q6_k, q4_0x8 (Q4_0's recipe with 8 rows of
    /// each matrix interleaved: hearth's own layout, faster at the x86 levels (avx2,
    /// avxvnni, avx512), refused by llama.cpp; the embedding
    /// table and matrices whose rows are not whole groups of 8 stay q4_0; from q4_0 and
    /// back only moves bytes, but the recipe still upgrades a q4_0 output head (--pure
    /// keeps it)), q4_kx8 (the same over Q4_K_M's mix: its q4_K matrices interleaved, the
    /// rest as Q4_K_M has them; from llama.cpp's Q4_K_M file and back only moves bytes)
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: String,
    /// Type of output.weight (the tied embedding when there is none) [default: recipe]
    #[arg(long, value_name = "TYPE")]
    pub output_type: Option<String>,
    /// Type of token_embd.weight (when tied, it is the output head and --output-type wins) [default: recipe]
    #[arg(long, value_name = "TYPE")]
    pub token_embedding_type: Option<String>,
    /// Allow requantizing tensors that are already quantized to another quantized type (compounds rounding errors; dequantizing to f32/f16/bf16 needs no flag)
    #[arg(long)]
    pub allow_requantize: bool,
    /// Every matrix to --type, without the K-quant mixes and output-head upgrade
    /// (the block-size fallback still applies)
    #[arg(long)]
    pub pure: bool,
    /// Worker threads [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

fn parse_type(flag: &str, s: &str) -> Result<GgmlType> {
    GgmlType::from_name(s).with_context(|| format!("{flag} {s:?}: unknown type (supported: {})", quantize_target_names()))
}

/// The directory `p` will be created in.
fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub fn run(a: Args) -> Result<()> {
    let start = Instant::now();
    let opts = QuantizeOptions {
        ty: parse_type("--type", &a.ty)?,
        output_type: a.output_type.as_deref().map(|s| parse_type("--output-type", s)).transpose()?,
        token_embedding_type: a.token_embedding_type.as_deref().map(|s| parse_type("--token-embedding-type", s)).transpose()?,
        allow_requantize: a.allow_requantize,
        pure: a.pure,
    };
    // The file is written beside OUT and renamed onto it, so it cannot go to a pipe; and a
    // file named "-" is what nobody means.
    if a.output.as_os_str() == "-" {
        bail!("cannot write the quantized file to standard output (\"-\"); give a file name, e.g. model-q4_k.gguf");
    }
    let in_path = a.input.canonicalize().with_context(|| format!("reading {}", a.input.display()))?;
    let out_dir = parent_dir(&a.output);
    let out_dir_abs =
        out_dir.canonicalize().with_context(|| format!("cannot write {}: directory {}", a.output.display(), out_dir.display()))?;
    let out_abs = a.output.canonicalize().unwrap_or_else(|_| out_dir_abs.join(a.output.file_name().unwrap_or_default()));
    if out_abs == in_path {
        bail!("the output {} is the input file; write to another path", a.output.display());
    }
    if out_abs.is_dir() {
        bail!("cannot write {}: it is a directory", a.output.display());
    }
    if out_abs.exists() && !out_abs.is_file() {
        bail!("cannot write {}: it exists and is not a regular file (a device or pipe?)", a.output.display());
    }

    let src = GgufFile::open(&in_path).with_context(|| format!("reading {}", a.input.display()))?;
    let plan = plan_quantize(&src, &opts).map_err(|e| match e {
        QuantizeError::Gguf(_) => anyhow::Error::new(e).context(format!("reading {}", a.input.display())),
        e => e.into(),
    })?;
    let meta = quantized_metadata(&src, opts.ty);
    let specs: Vec<_> = plan.iter().map(|p| hearth_gguf::TensorSpec { name: p.name.clone(), dims: p.dims.clone(), ty: p.dst }).collect();
    let needed = file_bytes(&meta, &specs)?;
    check_space(&a.output, needed, free_bytes(&out_dir)?)?;

    let threads = crate::common::threads_or_default(a.threads);
    let data: u64 = specs.iter().map(|t| t.size().unwrap_or(0)).sum();
    let pb = crate::common::byte_progress(data, format!("quantizing to {}", a.output.display()));
    write_quantized(&src, &a.output, &meta, &plan, threads, &|n| pb.inc(n)).map_err(|e| match e {
        QuantizeError::Gguf(e) => writing(&a.output, e),
        e => anyhow::Error::new(e).context(format!("writing {}", a.output.display())),
    })?;
    pb.finish_and_clear();

    let in_bytes = std::fs::metadata(&in_path).map(|m| m.len()).unwrap_or(0);
    let out_bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(needed);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &plan {
        *counts.entry(p.dst.name()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    // A grouped target's matrices kept in its row type (the embedding table, rows not
    // whole groups) apart from the block-size fallbacks.
    let kept = plan.iter().filter(|p| p.kept_ungrouped).count();
    let fallbacks = plan.iter().filter(|p| p.fallback).count();
    let ftype = target_file_type(opts.ty).map(file_type_name).unwrap_or_default();
    // A grouped target's file type is its row type's (llama.cpp has none for it): say
    // which layout the file holds. --pure follows no recipe: say so.
    let ftype = match (opts.pure, opts.ty.group_rows() > 1) {
        (true, _) => format!("--pure {}, file type {ftype}", opts.ty.name()),
        (false, true) => format!("{ftype} recipe, {} layout", opts.ty.name()),
        (false, false) => ftype,
    };
    eprintln!(
        "wrote {} ({ftype}): {} -> {}; tensors: {}{}; {:.1} s",
        a.output.display(),
        mib(in_bytes),
        mib(out_bytes),
        counts.join(", "),
        [
            (fallbacks > 0).then(|| format!(" ({fallbacks} fell back: rows not whole blocks)")),
            (kept > 0).then(|| format!(" ({kept} kept in their row type: an embedding table, or rows (a fused tensor's parts, an expert's) not whole groups of 8)")),
        ]
        .into_iter()
        .flatten()
        .collect::<String>(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
