//! Shard files: one node's share of a model as a GGUF of its own, so a worker without
//! the model file can run (the coordinator sends it once) and a worker can stream its
//! share through the sliding window (`--mem-budget`).
//!
//! A shard file has the full model's metadata plus `hearth.shard.*` keys
//! ([`hearth_model::shard_keys`]: the source file's SHA-256 and the split), every
//! block's vectors (norms, biases) and its seven matrices already cut to the node's rows
//! and columns (named as in the model, shapes of the cut; fused matrices stored as
//! separate ones; a mixture of experts' stacked gate, up and down as every expert's cut,
//! end to end, with its router whole; a shared expert cut as the FFN is, its gate input
//! whole), `output_norm.weight` and any RoPE factors. It has
//! no embedding and no output head. Loading it with `hearth_model::Model::load` gives a
//! model whose `shard` is the split; `Context::set_tensor_split` then uses the matrices
//! as they are.
//!
//! Worker cache: `<cache>/shards/<first 16 hex of the model SHA-256>-<split>.gguf` with a
//! `.sha256` file beside it holding the shard's own hash, checked before every use.

use hearth_gguf::{write_gguf, TensorSpec, Value};
use hearth_model::{shard_keys, slice_experts, slice_matrix, Model, ModelError, TensorSplit};
use sha2::{Digest, Sha256};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The cache file name of `split` of the model with SHA-256 `sha`.
pub fn file_name(sha: &[u8; 32], split: &TensorSplit) -> String {
    let g = split.gather_rows.as_ref().map_or(String::new(), |r| format!("-g{}-{}", r.start, r.end));
    format!(
        "{}-kv{}-{}-ff{}-{}{g}.gguf",
        &crate::wire::hex(sha)[..16],
        split.kv_heads.start,
        split.kv_heads.end,
        split.ffn_rows.start,
        split.ffn_rows.end
    )
}

/// Where a worker keeps its shard files: `dir`, else `<hearth cache>/shards`.
pub fn cache_dir(dir: Option<&Path>) -> Option<PathBuf> {
    dir.map(Path::to_path_buf).or_else(|| crate::model_hash::cache_dir().map(|d| d.join("shards")))
}

/// Bytes of the shard file [`write`] produces (for progress reports).
pub fn size(model: &Model, split: &TensorSplit) -> u64 {
    crate::cluster::shard_weight_bytes(model, split)
}

/// Write `split` of `model` (whose file has SHA-256 `sha`) as a shard GGUF to `out`.
pub fn write<W: Write>(model: &Model, split: &TensorSplit, sha: &[u8; 32], out: W) -> Result<W, ModelError> {
    let c = &model.config;
    // The cuts below are the split's: refuse one the model cannot run (and a matrix the
    // cuts cannot take, Q4_0X8, Q4_KX8) before writing anything.
    split.validate(c, &model.weights)?;
    let f = &model.file;
    let range = |r: &std::ops::Range<usize>| Value::Array {
        elem_type: 10, // u64
        items: vec![Value::U64(r.start as u64), Value::U64(r.end as u64)],
    };
    let mut meta: Vec<(String, Value)> = f.metadata().iter().filter(|(k, _)| !k.starts_with("hearth.shard.")).cloned().collect();
    meta.push((shard_keys::SOURCE_SHA256.into(), Value::String(crate::wire::hex(sha))));
    meta.push((shard_keys::KV_HEADS.into(), range(&split.kv_heads)));
    meta.push((shard_keys::FFN_ROWS.into(), range(&split.ffn_rows)));
    if let Some(g) = &split.gather_rows {
        meta.push((shard_keys::GATHER_ROWS.into(), range(g)));
    }
    // Tensors in file order: per block its tensors in the architecture's order (matrices
    // cut, vectors copied), so each block's matrices are contiguous (a window reads a
    // block in one go); then the final norm and any RoPE factors.
    enum Src<'a> {
        Copy(String),
        Cut(&'a hearth_model::TensorRef, std::ops::Range<usize>, std::ops::Range<usize>),
        // Stacked experts: each expert's cut, laid end to end (a 3-D tensor of the cut's
        // shape × n_expert, as `Context::set_tensor_split` lays out its own copy).
        Experts(&'a hearth_model::LayerWeights, hearth_model::Mat, std::ops::Range<usize>, std::ops::Range<usize>),
    }
    let n_expert = c.moe.map_or(0, |m| m.n_expert);
    let mut specs = Vec::new();
    let mut srcs = Vec::new();
    let copy_spec = |name: &str| -> Result<TensorSpec, ModelError> {
        let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        Ok(TensorSpec { name: name.into(), dims: t.dims.clone(), ty: t.ty })
    };
    let (shapes, shared) = (split.matrix_shapes(c), split.shared_shapes(c));
    let table = hearth_model::layer_table(c, true);
    for (i, l) in model.weights.layers.iter().enumerate() {
        for lt in &table {
            let name = format!("blk.{i}.{}", lt.name);
            match lt.holds {
                // A node without KV heads (or FFN rows) has empty cuts: GGUF has no
                // zero-sized tensors, so they are left out (the loader expects that).
                hearth_model::Holds::Matrix(m) | hearth_model::Holds::Experts(m)
                    if shapes[m as usize].0.is_empty() || shapes[m as usize].1.is_empty() => {}
                hearth_model::Holds::Experts(m) => {
                    let (rows, cols) = shapes[m as usize].clone();
                    let t = l.matrix(m);
                    specs.push(TensorSpec { name, dims: vec![cols.len() as u64, rows.len() as u64, n_expert as u64], ty: t.ty });
                    srcs.push(Src::Experts(l, m, rows, cols));
                }
                hearth_model::Holds::Matrix(m) => {
                    let (rows, cols) = shapes[m as usize].clone();
                    let t = l.matrix(m);
                    specs.push(TensorSpec { name, dims: vec![cols.len() as u64, rows.len() as u64], ty: t.ty });
                    srcs.push(Src::Cut(t, rows, cols));
                }
                // A shared expert (qwen2moe) is cut as the FFN is (`TensorSplit::shared_shapes`).
                hearth_model::Holds::Shared(m) => {
                    let sh = l.shared.as_ref().ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
                    let (t, (rows, cols)) = match m {
                        hearth_model::Mat::Gate => (&sh.gate, shared[0].clone()),
                        hearth_model::Mat::Up => (&sh.up, shared[1].clone()),
                        _ => (&sh.down, shared[2].clone()),
                    };
                    if !rows.is_empty() && !cols.is_empty() {
                        specs.push(TensorSpec { name, dims: vec![cols.len() as u64, rows.len() as u64], ty: t.ty });
                        srcs.push(Src::Cut(t, rows, cols));
                    }
                }
                _ if f.tensor(&name).is_none() => {}
                _ => {
                    specs.push(copy_spec(&name)?);
                    srcs.push(Src::Copy(name));
                }
            }
        }
    }
    for name in ["output_norm.weight", "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"] {
        if name == "output_norm.weight" || f.tensor(name).is_some() {
            specs.push(copy_spec(name)?);
            srcs.push(Src::Copy(name.into()));
        }
    }
    let mut buf = Vec::new();
    let mut failed = None;
    let r = write_gguf(out, &meta, &specs, |i, w| {
        let got = match &srcs[i] {
            Src::Copy(name) => f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string())).and_then(|t| {
                buf = f.read_tensor(t)?;
                Ok(())
            }),
            Src::Cut(t, rows, cols) => slice_matrix(f, t, rows.clone(), cols.clone(), &mut buf),
            Src::Experts(l, m, rows, cols) => slice_experts(f, l, *m, n_expert, rows.clone(), cols.clone(), &mut buf),
        };
        match got {
            Ok(()) => w.write_all(&buf),
            Err(e) => {
                let msg = e.to_string();
                failed = Some(e);
                Err(io::Error::other(msg))
            }
        }
    });
    match (r, failed) {
        (_, Some(e)) => Err(e),
        (Ok(w), None) => Ok(w),
        (Err(e), None) => Err(e.into()),
    }
}

/// A writer that hashes what passes through it.
pub struct HashingWriter<W> {
    /// The destination.
    pub inner: W,
    hasher: Sha256,
    /// Bytes written.
    pub bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wrap `inner`.
    pub fn new(inner: W) -> Self {
        Self { inner, hasher: Sha256::new(), bytes: 0 }
    }

    /// The SHA-256 of everything written, and the destination.
    pub fn finish(self) -> ([u8; 32], W) {
        (self.hasher.finalize().into(), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(b)?;
        self.hasher.update(&b[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The cached shard at `path` if it is there and its bytes still hash to the value
/// recorded beside it; a damaged one is removed.
pub fn cached(path: &Path) -> Option<PathBuf> {
    let want = std::fs::read_to_string(sidecar(path)).ok()?;
    let got = crate::model_hash::hash_reader(std::fs::File::open(path).ok()?).ok()?;
    if crate::wire::hex(&got) == want.trim() {
        Some(path.to_path_buf())
    } else {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(sidecar(path));
        None
    }
}

/// The file holding a shard file's own SHA-256.
pub fn sidecar(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".sha256");
    PathBuf::from(s)
}

/// Cut `split` from the local `model` into the cache at `path` (a worker that has the
/// model file and runs with a memory budget). Returns the path.
pub fn extract(model: &Model, split: &TensorSplit, sha: &[u8; 32], path: &Path) -> Result<PathBuf, ModelError> {
    if let Some(p) = cached(path) {
        return Ok(p);
    }
    let io = |e: io::Error| ModelError::Weights(format!("writing the shard file {}: {e}", path.display()));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    let tmp = PathBuf::from(format!("{}.tmp-{}", path.display(), std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let done = write(model, split, sha, HashingWriter::new(hearth_gguf::PieceWriter::new(file))).and_then(|w| {
        let (digest, bw) = w.finish();
        let f = bw.into_inner().map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::write(sidecar(path), crate::wire::hex(&digest)).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    });
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path.to_path_buf())
}
