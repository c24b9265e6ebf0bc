//! Requantizing a GGUF file to another weight type, as `llama-quantize` does.
//!
//! Two halves: [`plan_quantize`] picks each tensor's output type (pure, no I/O), and
//! [`write_quantized`] streams the file tensor by tensor (dequantize a row to f32,
//! quantize it to the new type), in parallel over rows, holding at most one chunk of
//! output rows and one f32 row per thread — never a whole model, nor a whole f32 tensor.
//!
//! Type choice follows llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp) where it
//! applies to the llama architecture, so a file quantized here has the tensor types of
//! the one llama-quantize would write:
//!
//! - 1-D tensors (norms) become F32; tensors not named `*weight` are copied unchanged.
//! - Float targets (f32, f16, bf16): every matrix to that type.
//! - Quantized targets: every matrix to the target, except the output head
//!   (`output.weight`, or `token_embd.weight` when the embedding is tied) which becomes
//!   Q6_K (Q8_0 when its rows are not whole target blocks; unchanged for a Q8_0 target),
//!   and the K-quant "mix" tweaks: q2_k = Q2_K (attn_v Q4_K when n_head/n_head_kv ≥ 4 else
//!   Q3_K; attn_output, ffn_down Q3_K); q3_k = Q3_K_M (attn_v Q5_K for the first two layers
//!   else Q4_K; ffn_down Q5_K for the first 1/16 of layers, else Q4_K; attn_output Q4_K);
//!   q4_k = Q4_K_M and q5_k = Q5_K_M (attn_v and ffn_down Q6_K on `use_more_bits` layers);
//!   q6_k = Q6_K. `pure` turns these tweaks off (llama-quantize `--pure`).
//! - `--token-embedding-type` / `--output-type` override the choice for those tensors.
//! - Fallback, as llama.cpp, when a row is not a whole number of the chosen type's blocks
//!   (K-quants need 256; SmolLM2's n_embd is 576): Q4_K → Q5_0, Q5_K → Q5_1,
//!   Q6_K → Q8_0; Q2_K and Q3_K → Q4_0 (llama.cpp uses IQ4_NL, which hearth cannot
//!   write yet; Q4_0 has the same 4.5 bits per weight); if that still does not fit, F16.
//!   Other types whose blocks do not fit (llama.cpp refuses) also fall back to F16.
//!
//! - q4_0x8: Q4_0 (its recipe), each matrix that is multiplied and has whole groups of 8
//!   rows (per expert) stored as hearth's Q4_0X8 ([`hearth_quant::interleave`]: the same
//!   bytes, 8 rows interleaved; faster decode, but llama.cpp refuses the file); the
//!   embedding table stays Q4_0 (its rows are looked up one by one), as does a matrix
//!   with other rows ([`TensorPlan::kept_ungrouped`]). Q4_0 ↔ Q4_0X8 moves bytes only:
//!   lossless, and no `--allow-requantize` (the recipe still upgrades a Q4_0 output head
//!   unless `pure`).
//! - q4_kx8: the same over Q4_K's recipe (Q4_K_M): the matrices it makes Q4_K become
//!   Q4_KX8; its Q6_K and fallback tensors stay as they are.
//!
//! Quantizing an already-quantized tensor to another quantized type compounds the rounding
//! errors, so it is refused unless `allow_requantize` is set (llama-quantize's
//! `--allow-requantize`); dequantizing to f32/f16/bf16 is always allowed. A tensor whose chosen type equals its source type is copied
//! byte for byte. Quantization uses ggml's reference (no importance matrix) kernels,
//! which is what llama-quantize runs without `--imatrix`.

use hearth_gguf::{write_gguf_file, GgufError, GgufFile, TensorSpec, Value};
use hearth_quant::{dequantize_row, quantize_row, GgmlType, QuantError};
use std::io::Write;
use std::path::Path;

/// Types [`plan_quantize`] accepts as a target (and as an override).
pub const QUANTIZE_TARGETS: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0X8,
    GgmlType::Q4_KX8,
];

/// llama.cpp's `llama_ftype` for a target (`general.file_type`): K-quant targets are the
/// `_M` mixes the recipe implements (Q3_K_M = 12, Q4_K_M = 15, Q5_K_M = 17), the rest the
/// `MOSTLY_*` values. `None` for types that are not targets.
pub fn target_file_type(ty: GgmlType) -> Option<u32> {
    use GgmlType::*;
    Some(match ty {
        F32 => 0,
        F16 => 1,
        // Q4_0X8 and Q4_KX8 have no llama.cpp file type (llama.cpp refuses the file):
        // the numbers of the row type their groups hold.
        Q4_0 | Q4_0X8 => 2,
        Q4_1 => 3,
        Q8_0 => 7,
        Q5_0 => 8,
        Q5_1 => 9,
        Q2_K => 10,
        Q3_K => 12,
        Q4_K | Q4_KX8 => 15,
        Q5_K => 17,
        Q6_K => 18,
        BF16 => 32,
        _ => return None,
    })
}

/// The names of [`QUANTIZE_TARGETS`], comma-separated.
pub fn quantize_target_names() -> String {
    QUANTIZE_TARGETS.iter().map(|t| t.name().to_ascii_lowercase()).collect::<Vec<_>>().join(", ")
}

/// Why a file could not be quantized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// The target (or an override) is not a type hearth can quantize to.
    #[error("{flag} {ty}: hearth cannot quantize to this type (supported: {supported})")]
    UnsupportedTarget {
        /// Which option named it (`--type`, `--output-type`, ...).
        flag: String,
        /// The type as given.
        ty: String,
        /// Supported types.
        supported: String,
    },
    /// `--token-embedding-type`, or `--output-type` where the output head is the tied
    /// embedding table, names a type that stores rows in groups.
    #[error("{flag} {ty}: {what} looked up one by one, so it cannot be stored as {ty} (rows in groups of 8); {} holds the same bytes row by row", ty.ungrouped())]
    GroupedEmbedding {
        /// The option.
        flag: &'static str,
        /// The type asked for.
        ty: GgmlType,
        /// Which tensor, as the message puts it.
        what: &'static str,
    },
    /// A quantized source tensor would be requantized without permission.
    #[error("tensor {name} is already quantized ({ty}); requantizing it loses quality, pass --allow-requantize to do it anyway")]
    Requantize {
        /// Tensor name.
        name: String,
        /// Its type in the source file.
        ty: GgmlType,
    },
    /// A source tensor's type cannot be decoded.
    #[error("tensor {name} has type {ty}, which hearth cannot dequantize")]
    UnsupportedSource {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// Reading or writing the GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A row failed to convert (a bug: shapes are checked when planning).
    #[error("quantize: {0}")]
    Quant(#[from] QuantError),
    /// The input file holds a tensor the model cannot use as it is stored.
    #[error("input: {0}")]
    Input(String),
}

/// Options of [`plan_quantize`].
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    /// Target type of the weight matrices.
    pub ty: GgmlType,
    /// Type of the output head [default: the recipe's choice].
    pub output_type: Option<GgmlType>,
    /// Type of `token_embd.weight` [default: the recipe's choice].
    pub token_embedding_type: Option<GgmlType>,
    /// Allow converting already-quantized tensors to another type.
    pub allow_requantize: bool,
    /// Every matrix to `ty` (still with the block-size fallback): llama-quantize `--pure`.
    pub pure: bool,
}

impl QuantizeOptions {
    /// Defaults for target `ty`.
    pub fn new(ty: GgmlType) -> Self {
        Self { ty, output_type: None, token_embedding_type: None, allow_requantize: false, pure: false }
    }
}

/// One tensor's conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlan {
    /// Tensor name.
    pub name: String,
    /// Shape in ggml order.
    pub dims: Vec<u64>,
    /// Type in the source file.
    pub src: GgmlType,
    /// Type in the output file.
    pub dst: GgmlType,
    /// Whether `dst` is a fallback because the rows are not whole blocks of the recipe's type.
    pub fallback: bool,
    /// Whether a grouped type (Q4_0X8, Q4_KX8) was asked for and `dst` is its row type instead (an
    /// embedding table, or rows not whole groups).
    pub kept_ungrouped: bool,
}

fn check_target(flag: &str, ty: GgmlType) -> Result<(), QuantizeError> {
    if QUANTIZE_TARGETS.contains(&ty) {
        Ok(())
    } else {
        Err(QuantizeError::UnsupportedTarget { flag: flag.into(), ty: ty.name().into(), supported: quantize_target_names() })
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// llama.cpp's `use_more_bits`: the first and last eighth of layers, and every third between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
}

/// llama.cpp's fallback for a type whose blocks do not fit a row of `cols`.
fn fallback(ty: GgmlType, cols: u64) -> (GgmlType, bool) {
    if cols.is_multiple_of(ty.block_size() as u64) {
        return (ty, false);
    }
    let f = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        _ => GgmlType::F16,
    };
    (if cols.is_multiple_of(f.block_size() as u64) { f } else { GgmlType::F16 }, true)
}

/// The rows the model multiplies each matrix of `f` in, where hearth loads `f` as a model:
/// the greatest common divisor over a tensor's parts (a fused tensor's q/k/v or gate/up,
/// each expert of a stack), so a grouped type is chosen only where the loader accepts it
/// (`Weights::load`); empty where hearth cannot load `f` (then a tensor's own rows count).
/// Errors: `f` holds a grouped tensor the loader refuses (copying it would write a file
/// hearth refuses).
fn multiplied_rows(f: &GgufFile) -> Result<std::collections::HashMap<String, usize>, QuantizeError> {
    let mut parts = std::collections::HashMap::new();
    let Ok(c) = crate::ModelConfig::from_gguf(f) else { return Ok(parts) };
    let w = match crate::Weights::load(f, &c, None) {
        Ok(w) => w,
        Err(e @ crate::ModelError::GroupedRows { .. }) => return Err(QuantizeError::Input(e.to_string())),
        Err(_) => return Ok(parts),
    };
    for (t, rows) in w.multiplied(c.moe.map_or(0, |m| m.n_expert)) {
        let r = parts.entry(t.name.clone()).or_insert(rows);
        *r = num_integer::gcd(*r, rows);
    }
    Ok(parts)
}

/// Choose every tensor's output type (see the module docs for the recipe), and check
/// that each conversion is possible and allowed.
pub fn plan_quantize(f: &GgufFile, o: &QuantizeOptions) -> Result<Vec<TensorPlan>, QuantizeError> {
    use GgmlType::*;
    check_target("--type", o.ty)?;
    if let Some(t) = o.output_type {
        check_target("--output-type", t)?;
    }
    if let Some(t) = o.token_embedding_type {
        check_target("--token-embedding-type", t)?;
        if t.group_rows() > 1 {
            return Err(QuantizeError::GroupedEmbedding { flag: "--token-embedding-type", ty: t, what: "the embedding table's rows are" });
        }
    }
    // (Untied, --output-type may group output.weight as any matrix.)
    if let Some(t) = o.output_type.filter(|t| t.group_rows() > 1 && f.tensor("output.weight").is_none()) {
        let what = "this model has no output.weight: its output head is the embedding table (tied), whose rows are";
        return Err(QuantizeError::GroupedEmbedding { flag: "--output-type", ty: t, what });
    }
    // A grouped target follows its row type's recipe; the matrices that can be are then
    // grouped (below).
    let (target, o) = (o.ty, &QuantizeOptions { ty: o.ty.ungrouped(), ..o.clone() });
    let arch = f.get_str("general.architecture").unwrap_or("llama").to_string();
    let n_head = f.get_u64(&format!("{arch}.attention.head_count")).unwrap_or(1).max(1);
    let n_gqa = f.get_u64(&format!("{arch}.attention.head_count_kv")).map(|kv| n_head / kv.max(1)).unwrap_or(1);
    let has_output = f.tensor("output.weight").is_some();
    let n_wv = f.tensors().iter().filter(|t| t.name.contains("attn_v.weight")).count();
    let n_down = f.tensors().iter().filter(|t| t.name.contains("ffn_down")).count();
    let (mut i_wv, mut i_down) = (0usize, 0usize);
    let quantized_target = !is_float(o.ty);
    // (Also for a grouped input: one the model refuses is refused here, not when written.)
    let grouped_input = f.tensors().iter().any(|t| t.ty.group_rows() > 1);
    let parts = if target.group_rows() > 1 || grouped_input { multiplied_rows(f)? } else { Default::default() };

    let mut plan = Vec::with_capacity(f.tensors().len());
    for t in f.tensors() {
        let name = t.name.as_str();
        let matrix = t.dims.len() >= 2 && name.ends_with("weight");
        // A mixture of experts' router stays as it is, as llama-quantize leaves it ("do
        // not quantize expert gating tensors"): rounding its logits changes which experts
        // a token is routed to, for a matrix of a few KiB.
        let router = name.ends_with("ffn_gate_inp.weight");
        let (dst, fell_back, kept_ungrouped) = if t.dims.len() == 1 && is_float(t.ty) {
            (F32, false, false)
        } else if !matrix || router {
            // As it is, but out of a grouped layout unless the target is one (bytes moved).
            (if target.group_rows() == 1 { t.ty.ungrouped() } else { t.ty }, false, false)
        } else {
            let cols = t.dims[0];
            let is_output = name == "output.weight" || (!has_output && name == "token_embd.weight");
            let mut ty = o.ty;
            if quantized_target && !o.pure {
                if is_output {
                    if !cols.is_multiple_of(o.ty.block_size() as u64) {
                        ty = Q8_0;
                    } else if o.ty != Q8_0 {
                        ty = Q6_K;
                    }
                } else if name.contains("attn_v.weight") {
                    ty = match o.ty {
                        Q2_K if n_gqa >= 4 => Q4_K,
                        Q2_K => Q3_K,
                        Q3_K if i_wv < 2 => Q5_K,
                        Q3_K => Q4_K,
                        Q4_K | Q5_K if use_more_bits(i_wv, n_wv) => Q6_K,
                        t => t,
                    };
                    i_wv += 1;
                } else if name.contains("ffn_down") {
                    ty = match o.ty {
                        Q2_K => Q3_K,
                        Q3_K if i_down < n_down / 16 => Q5_K,
                        Q3_K => Q4_K,
                        Q4_K | Q5_K if use_more_bits(i_down, n_down) => Q6_K,
                        t => t,
                    };
                    i_down += 1;
                } else if name.contains("attn_output.weight") {
                    ty = match o.ty {
                        Q2_K => Q3_K,
                        Q3_K => Q4_K,
                        t => t,
                    };
                }
            }
            // As llama-quantize: the output matrix (the token embedding when tied) takes
            // --output-type; an untied token embedding --token-embedding-type.
            if is_output {
                ty = o.output_type.or(o.token_embedding_type.filter(|_| name == "token_embd.weight")).unwrap_or(ty);
            } else if name == "token_embd.weight" {
                ty = o.token_embedding_type.unwrap_or(ty);
            }
            let (ty, fell_back) = fallback(ty, cols);
            // The grouped type asked for (an override, or the target where the recipe
            // chose its row type), where possible: not the embedding table, whole groups
            // of rows (per expert: dims[1]).
            let g = if ty.group_rows() == 1 && target.group_rows() > 1 && ty == target.ungrouped() { target } else { ty };
            if g.group_rows() == 1 {
                (ty, fell_back, false)
            } else if name != "token_embd.weight" && parts.get(name).map_or(t.dims[1], |&r| r as u64).is_multiple_of(g.group_rows() as u64) {
                (g, fell_back, false)
            } else {
                (g.ungrouped(), fell_back, true)
            }
        };
        // A row type <-> its grouped type moves bytes only.
        if dst.ungrouped() != t.ty.ungrouped() {
            // (Dequantizing to a float type compounds no rounding: allowed.)
            if !is_float(t.ty) && !is_float(dst) && !o.allow_requantize {
                return Err(QuantizeError::Requantize { name: name.into(), ty: t.ty });
            }
            let probe = vec![0u8; t.ty.type_size()];
            let mut out = vec![0f32; t.ty.block_size()];
            if dequantize_row(t.ty.ungrouped(), &probe, &mut out).is_err() {
                return Err(QuantizeError::UnsupportedSource { name: name.into(), ty: t.ty });
            }
        }
        plan.push(TensorPlan { name: name.into(), dims: t.dims.clone(), src: t.ty, dst, fallback: fell_back, kept_ungrouped });
    }
    Ok(plan)
}

/// The source metadata with `general.file_type` set for target `ty` (and
/// `general.quantization_version` 2, as llama-quantize writes); everything else,
/// `general.alignment` included, is copied unchanged and in order.
pub fn quantized_metadata(f: &GgufFile, ty: GgmlType) -> Vec<(String, Value)> {
    let mut meta = f.metadata().to_vec();
    let mut set = |k: &str, v: Value| match meta.iter_mut().find(|(key, _)| key == k) {
        Some(slot) => slot.1 = v,
        None => meta.push((k.to_string(), v)),
    };
    if let Some(ft) = target_file_type(ty) {
        set("general.file_type", Value::U32(ft));
    }
    set("general.quantization_version", Value::U32(2));
    meta
}

/// Write `f`'s tensors converted as `plan` says, with `meta`, to `out` atomically (a
/// temporary file renamed into place; nothing is left behind on error). `progress` is
/// called with the number of output bytes written so far in each step.
pub fn write_quantized(
    f: &GgufFile,
    out: &Path,
    meta: &[(String, Value)],
    plan: &[TensorPlan],
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), QuantizeError> {
    let specs: Vec<TensorSpec> = plan.iter().map(|p| TensorSpec { name: p.name.clone(), dims: p.dims.clone(), ty: p.dst }).collect();
    write_gguf_file(out, meta, &specs, |i, w| {
        let p = &plan[i];
        let t = f.tensor(&p.name).expect("planned from this file");
        convert_tensor(p, f.tensor_data(t), threads, w, progress)
    })?;
    Ok(())
}

/// Convert one tensor's bytes (`src`, of type `p.src`) to `p.dst` and write them to `w`.
pub fn convert_tensor(
    p: &TensorPlan,
    src: &[u8],
    threads: usize,
    w: &mut dyn Write,
    progress: &(dyn Fn(u64) + Sync),
) -> std::io::Result<()> {
    if p.src == p.dst {
        progress(src.len() as u64);
        return w.write_all(src);
    }
    let cols = p.dims[0] as usize;
    let rows: usize = p.dims[1..].iter().product::<u64>() as usize;
    let bad = |what: &str| std::io::Error::other(format!("tensor {}: {what}", p.name));
    let (src_rb, dst_rb) = match (p.src.row_bytes(cols as u64), p.dst.row_bytes(cols as u64)) {
        (Some(a), Some(b)) => (a as usize, b as usize),
        _ => return Err(bad("rows are not whole blocks")),
    };
    if src.len() != src_rb * rows {
        return Err(bad("data size does not match its shape"));
    }
    // Rows stored in groups (Q4_0X8, Q4_KX8) are converted as their row type: a chunk
    // is ungrouped after reading and grouped before writing, in whole groups.
    // Each matrix's rows (dims[1]; a stack of experts has n_expert of them) whole groups,
    // so no group straddles two experts.
    let group = p.src.group_rows().max(p.dst.group_rows());
    let per_matrix = p.dims.get(1).map_or(1, |&r| r as usize);
    if !per_matrix.is_multiple_of(group) {
        return Err(bad(&format!("{per_matrix} rows are not whole groups of {group}")));
    }
    let (src_ty, dst_ty) = (p.src.ungrouped(), p.dst.ungrouped());
    let regroup = |ty: GgmlType, from: &[u8], n: usize, to: &mut Vec<u8>, apart: bool| -> std::io::Result<()> {
        to.resize(from.len(), 0);
        let r = if apart {
            hearth_quant::interleave::deinterleave(ty, from, n, cols, to)
        } else {
            hearth_quant::interleave::interleave(ty, from, n, cols, to)
        };
        r.map_err(|e| bad(&format!("{ty}: {e}")))
    };
    let threads = threads.max(1);
    // About 16 MiB of output per step, at least one row per thread, whole groups.
    let chunk_rows = ((16usize << 20) / dst_rb.max(1)).clamp(threads.min(rows.max(1)), rows.max(1)).next_multiple_of(group);
    let mut buf = vec![0u8; chunk_rows * dst_rb];
    let (mut ungrouped, mut grouped) = (Vec::new(), Vec::new());
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk_rows.min(rows - r0);
        let out = &mut buf[..n * dst_rb];
        let mut input = &src[r0 * src_rb..(r0 + n) * src_rb];
        if p.src.group_rows() > 1 {
            regroup(p.src, input, n, &mut ungrouped, true)?;
            input = &ungrouped;
        }
        if src_ty == dst_ty {
            // Q4_0 <-> Q4_0X8, Q4_K <-> Q4_KX8: the bytes, moved.
            out.copy_from_slice(input);
        } else {
            convert_rows(src_ty, dst_ty, cols, input, out, threads).map_err(|e| bad(&e.to_string()))?;
        }
        let out: &[u8] = if p.dst.group_rows() > 1 {
            regroup(p.dst, out, n, &mut grouped, false)?;
            &grouped
        } else {
            out
        };
        w.write_all(out)?;
        progress(out.len() as u64);
        r0 += n;
    }
    Ok(())
}

/// Rows of `src_ty` (`input`) converted to `dst_ty` (`out`) through f32, on `threads`
/// threads (each a run of whole rows).
fn convert_rows(src_ty: GgmlType, dst_ty: GgmlType, cols: usize, input: &[u8], out: &mut [u8], threads: usize) -> Result<(), QuantError> {
    let (src_rb, dst_rb) = (src_ty.row_bytes(cols as u64).unwrap_or(0) as usize, dst_ty.row_bytes(cols as u64).unwrap_or(0) as usize);
    let n = out.len() / dst_rb.max(1);
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = out
            .chunks_mut(per * dst_rb)
            .zip(input.chunks(per * src_rb))
            .map(|(o, i)| {
                s.spawn(move || -> Result<(), QuantError> {
                    let mut x = vec![0f32; cols];
                    for (dst, srow) in o.chunks_mut(dst_rb).zip(i.chunks(src_rb)) {
                        dequantize_row(src_ty, srow, &mut x)?;
                        quantize_row(dst_ty, &x, dst)?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("quantize thread panicked")).find_map(Result::err).map_or(Ok(()), Err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_gguf::write_gguf;

    /// A tiny llama-shaped file: 576-wide embedding (tied), 2 layers, ffn 512.
    fn file(ty: GgmlType) -> GgufFile {
        file_with(ty, false)
    }

    /// [`file`], with a mixture of experts' router in each block when `router`.
    fn file_with(ty: GgmlType, router: bool) -> GgufFile {
        build_file(ty, router, false)
    }

    /// [`file`] with an output head of its own (`output.weight`).
    fn untied_file(ty: GgmlType) -> GgufFile {
        build_file(ty, false, true)
    }

    fn build_file(ty: GgmlType, router: bool, untied: bool) -> GgufFile {
        let meta = vec![
            ("general.architecture".to_string(), Value::String("llama".into())),
            ("general.alignment".to_string(), Value::U32(64)),
            ("llama.attention.head_count".to_string(), Value::U32(9)),
            ("llama.attention.head_count_kv".to_string(), Value::U32(3)),
        ];
        let s = |name: &str, dims: Vec<u64>, ty| TensorSpec { name: name.into(), dims, ty };
        let mut specs = vec![s("token_embd.weight", vec![576, 8], ty)];
        for i in 0..2 {
            specs.push(s(&format!("blk.{i}.attn_norm.weight"), vec![576], GgmlType::F32));
            specs.push(s(&format!("blk.{i}.attn_v.weight"), vec![576, 4], ty));
            specs.push(s(&format!("blk.{i}.ffn_down.weight"), vec![512, 576], ty));
            if router {
                specs.push(s(&format!("blk.{i}.ffn_gate_inp.weight"), vec![576, 8], ty));
            }
        }
        if untied {
            specs.push(s("output.weight", vec![576, 8], ty));
        }
        let bytes = write_gguf(Vec::new(), &meta, &specs, |i, w| {
            let t = &specs[i];
            let cols = t.dims[0] as usize;
            let rows: u64 = t.dims[1..].iter().product();
            let x: Vec<f32> = (0..cols).map(|j| ((j * 7 + i) % 13) as f32 / 13.0 - 0.5).collect();
            let mut row = vec![0u8; t.ty.row_bytes(cols as u64).unwrap() as usize];
            quantize_row(t.ty, &x, &mut row).unwrap();
            (0..rows).try_for_each(|_| w.write_all(&row))
        })
        .unwrap();
        GgufFile::from_vec(bytes).unwrap()
    }

    fn types(plan: &[TensorPlan]) -> Vec<(String, GgmlType)> {
        plan.iter().map(|p| (p.name.clone(), p.dst)).collect()
    }

    #[test]
    fn k_quants_follow_llama_cpp_with_fallback() {
        let f = file(GgmlType::F16);
        let plan = plan_quantize(&f, &QuantizeOptions::new(GgmlType::Q4_K)).unwrap();
        let got = types(&plan);
        let want = [
            ("token_embd.weight", GgmlType::Q8_0), // tied output: Q6_K, falls back on 576
            ("blk.0.attn_norm.weight", GgmlType::F32),
            ("blk.0.attn_v.weight", GgmlType::Q5_0),   // Q4_K falls back on 576
            ("blk.0.ffn_down.weight", GgmlType::Q4_K), // 512 wide: fits
            ("blk.1.attn_norm.weight", GgmlType::F32),
            ("blk.1.attn_v.weight", GgmlType::Q8_0), // use_more_bits(1, 2): Q6_K, falls back
            ("blk.1.ffn_down.weight", GgmlType::Q6_K),
        ];
        assert_eq!(got, want.map(|(n, t)| (n.to_string(), t)));
        assert!(plan[2].fallback && !plan[3].fallback && !plan[0].fallback); // the head picks Q8_0 itself

        let pure = QuantizeOptions { pure: true, ..QuantizeOptions::new(GgmlType::Q4_K) };
        let plan = plan_quantize(&f, &pure).unwrap();
        assert_eq!(plan[0].dst, GgmlType::Q5_0);
        assert_eq!(plan[3].dst, GgmlType::Q4_K);
        let q2 = plan_quantize(&f, &QuantizeOptions { pure: true, ..QuantizeOptions::new(GgmlType::Q2_K) }).unwrap();
        assert_eq!(q2[0].dst, GgmlType::Q4_0);
    }

    #[test]
    fn expert_routers_keep_their_type() {
        for (src, target) in [(GgmlType::F16, GgmlType::Q4_K), (GgmlType::F32, GgmlType::Q8_0), (GgmlType::F16, GgmlType::F32)] {
            let plan = plan_quantize(&file_with(src, true), &QuantizeOptions::new(target)).unwrap();
            for p in &plan {
                if p.name.ends_with("ffn_gate_inp.weight") {
                    assert_eq!(p.dst, src, "{} quantized to {target:?}", p.name);
                } else if p.name.ends_with("ffn_down.weight") {
                    assert_ne!(p.dst, src, "{}", p.name);
                }
            }
        }
    }

    #[test]
    fn simple_types_and_overrides() {
        let f = file(GgmlType::F32);
        let plan = plan_quantize(&f, &QuantizeOptions::new(GgmlType::Q4_0)).unwrap();
        assert_eq!(plan[0].dst, GgmlType::Q8_0); // tied output head: Q6_K, falls back on 576
        assert!(plan[1..].iter().all(|p| p.dst == if p.dims.len() == 1 { GgmlType::F32 } else { GgmlType::Q4_0 }));
        let o = QuantizeOptions { token_embedding_type: Some(GgmlType::F16), ..QuantizeOptions::new(GgmlType::Q8_0) };
        let plan = plan_quantize(&f, &o).unwrap();
        assert_eq!(plan[0].dst, GgmlType::F16);
        // The tied embedding is the output head: --output-type sets it (and wins).
        for out in [GgmlType::F32, GgmlType::Q4_1] {
            let o = QuantizeOptions {
                output_type: Some(out),
                token_embedding_type: Some(GgmlType::F16),
                ..QuantizeOptions::new(GgmlType::Q4_0)
            };
            let plan = plan_quantize(&f, &o).unwrap();
            assert_eq!((plan[0].name.as_str(), plan[0].dst, plan[0].fallback), ("token_embd.weight", out, false));
        }
        let plan = plan_quantize(&f, &QuantizeOptions::new(GgmlType::BF16)).unwrap();
        assert!(plan.iter().all(|p| p.dst == if p.dims.len() == 1 { GgmlType::F32 } else { GgmlType::BF16 }));
    }

    #[test]
    fn requantize_and_bad_targets_are_refused() {
        let f = file(GgmlType::Q4_1);
        let e = plan_quantize(&f, &QuantizeOptions::new(GgmlType::Q8_0)).unwrap_err();
        assert!(matches!(e, QuantizeError::Requantize { ty: GgmlType::Q4_1, .. }), "{e}");
        assert!(e.to_string().contains("--allow-requantize"));
        // Dequantizing loses nothing: no permission needed.
        for ty in [GgmlType::F32, GgmlType::F16] {
            let plan = plan_quantize(&f, &QuantizeOptions::new(ty)).unwrap();
            assert!(plan.iter().all(|p| p.dst == if p.dims.len() == 1 { GgmlType::F32 } else { ty }), "{ty}");
        }
        // Same type: copied, no permission needed.
        let plan = plan_quantize(&f, &QuantizeOptions { pure: true, ..QuantizeOptions::new(GgmlType::Q4_1) }).unwrap();
        assert!(plan.iter().all(|p| p.dst == p.src));
        let e = plan_quantize(&f, &QuantizeOptions::new(GgmlType::IQ4_XS)).unwrap_err().to_string();
        assert!(e.contains("iq4_xs") && e.contains("q4_k") && e.contains("q8_0"), "{e}");
    }

    #[test]
    fn metadata_keeps_alignment_and_sets_file_type() {
        let f = file(GgmlType::F32);
        let meta = quantized_metadata(&f, GgmlType::Q4_K);
        let get = |k: &str| meta.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(get("general.file_type"), Some(Value::U32(15)));
        assert_eq!(get("general.alignment"), Some(Value::U32(64)));
        assert_eq!(get("general.architecture"), Some(Value::String("llama".into())));
    }

    #[test]
    fn conversion_matches_a_direct_quantization_at_any_thread_count() {
        let f = file(GgmlType::F32);
        let t = f.tensor("blk.0.ffn_down.weight").unwrap();
        let p = TensorPlan { name: t.name.clone(), dims: t.dims.clone(), src: t.ty, dst: GgmlType::Q4_K, fallback: false, kept_ungrouped: false };
        let mut one = Vec::new();
        convert_tensor(&p, f.tensor_data(t), 1, &mut one, &|_| {}).unwrap();
        let mut three = Vec::new();
        convert_tensor(&p, f.tensor_data(t), 3, &mut three, &|_| {}).unwrap();
        assert_eq!(one, three);
        let mut x = vec![0f32; 512];
        dequantize_row(GgmlType::F32, &f.tensor_data(t)[..2048], &mut x).unwrap();
        let mut row = vec![0u8; 144 * 2];
        quantize_row(GgmlType::Q4_K, &x, &mut row).unwrap();
        assert_eq!(&one[..288], &row[..]);
        assert_eq!(one.len(), 288 * 576);
    }

    /// q4_0x8: the matrices with whole groups of 8 rows grouped, the tied embedding and a
    /// 4-row matrix kept in Q4_0 (reported as fallbacks); from Q4_0 without permission,
    /// bytes moved (back again byte-identical); from F32 as Q4_0's numbers, grouped.
    #[test]
    fn q4_0x8_groups_what_it_can_and_moves_bytes_only() {
        let f = file(GgmlType::Q4_0);
        let o = QuantizeOptions { pure: true, ..QuantizeOptions::new(GgmlType::Q4_0X8) };
        let plan = plan_quantize(&f, &o).unwrap();
        for p in plan.iter().filter(|p| p.dims.len() > 1) {
            let grouped = p.name.contains("ffn_down");
            assert_eq!(p.dst, if grouped { GgmlType::Q4_0X8 } else { GgmlType::Q4_0 }, "{}", p.name);
            assert_eq!(p.kept_ungrouped, !grouped, "{}", p.name);
            assert!(!p.fallback, "{}", p.name);
        }
        let t = f.tensor("blk.0.ffn_down.weight").unwrap();
        let p = plan.iter().find(|p| p.name == t.name).unwrap();
        let mut x8 = Vec::new();
        convert_tensor(p, f.tensor_data(t), 3, &mut x8, &|_| {}).unwrap();
        let mut want = vec![0u8; x8.len()];
        hearth_quant::interleave::interleave(GgmlType::Q4_0X8, f.tensor_data(t), 576, 512, &mut want).unwrap();
        assert!(x8 == want && x8 != f.tensor_data(t));
        let back = TensorPlan { src: GgmlType::Q4_0X8, dst: GgmlType::Q4_0, ..p.clone() };
        let mut q4 = Vec::new();
        convert_tensor(&back, &x8, 2, &mut q4, &|_| {}).unwrap();
        assert!(q4 == f.tensor_data(t));
        // From F32: Q4_0's rows, grouped.
        let f32 = file(GgmlType::F32);
        let t = f32.tensor("blk.0.ffn_down.weight").unwrap();
        let mut x8 = Vec::new();
        let from_f32 = TensorPlan { src: GgmlType::F32, ..p.clone() };
        convert_tensor(&from_f32, f32.tensor_data(t), 3, &mut x8, &|_| {}).unwrap();
        let q4p = TensorPlan { dst: GgmlType::Q4_0, ..from_f32.clone() };
        let mut q4 = Vec::new();
        convert_tensor(&q4p, f32.tensor_data(t), 1, &mut q4, &|_| {}).unwrap();
        hearth_quant::interleave::interleave(GgmlType::Q4_0X8, &q4, 576, 512, &mut want).unwrap();
        assert!(x8 == want);
        // A stack of experts whose rows per expert are not whole groups is refused (its
        // groups would straddle two experts), though its total rows are.
        let odd = TensorPlan { dims: vec![32, 12, 2], src: GgmlType::Q4_0X8, dst: GgmlType::Q4_0, ..p.clone() };
        let e = convert_tensor(&odd, &[0u8; 24 * 18], 1, &mut Vec::new(), &|_| {}).unwrap_err();
        assert!(e.to_string().contains("12 rows are not whole groups of 8"), "{e}");
        // A grouped embedding table is refused.
        let bad = QuantizeOptions { token_embedding_type: Some(GgmlType::Q4_0X8), ..QuantizeOptions::new(GgmlType::Q4_0) };
        assert!(matches!(plan_quantize(&f, &bad), Err(QuantizeError::GroupedEmbedding { .. })));
        // So is a grouped output head that is the (tied) embedding table; untied, it is grouped.
        let head = QuantizeOptions { output_type: Some(GgmlType::Q4_0X8), ..QuantizeOptions::new(GgmlType::Q4_0) };
        let e = plan_quantize(&f, &head).unwrap_err();
        assert!(e.to_string().starts_with("--output-type q4_0x8: this model has no output.weight"), "{e}");
        assert!(e.to_string().contains("q4_0 holds the same bytes"), "{e}");
        let untied = untied_file(GgmlType::Q4_0);
        let plan = plan_quantize(&untied, &head).unwrap();
        assert_eq!(plan.iter().find(|p| p.name == "output.weight").unwrap().dst, GgmlType::Q4_0X8);
    }
}
