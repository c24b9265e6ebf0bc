//! Named weight tensors of a llama-style model, as references into the mapped GGUF file.
//!
//! Nothing here copies a matrix: a [`TensorRef`] is (type, byte range, shape) and
//! becomes a `WeightView` (over the mapping, or a sliding window's buffer: see
//! [`crate::Unit::view`]) only while a kernel runs. This is what
//! lets later layers take views of row/column ranges (tensor parallelism) or of a
//! window of layers (the sliding-window scheduler) without touching the rest.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use hearth_gguf::GgufFile;
use hearth_quant::GgmlType;

/// Weight types the matmul kernels compute with directly.
pub const MATMUL_TYPES: &[GgmlType] =
    &[GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// A 2-D weight matrix `[rows, cols]` (ggml shape `[cols, rows]`) located in the file.
#[derive(Debug, Clone)]
pub struct TensorRef {
    /// Tensor name in the file.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: usize,
    /// Byte length.
    pub size: usize,
    /// Output features (ggml `ne[1]`).
    pub rows: usize,
    /// Input features (ggml `ne[0]`).
    pub cols: usize,
}

impl TensorRef {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.size.checked_div(self.rows).unwrap_or(0)
    }

    /// Rows `r` of this matrix as a matrix of its own (rows are contiguous in the file).
    pub fn rows(&self, r: std::ops::Range<usize>) -> TensorRef {
        let rb = self.row_bytes();
        TensorRef { name: self.name.clone(), ty: self.ty, offset: self.offset + r.start * rb, size: r.len() * rb, rows: r.len(), cols: self.cols }
    }
}

/// One transformer block's tensors. Shapes in `[rows, cols]` = `[out, in]` order.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// RMSNorm weight before attention, `[n_embd]`.
    pub attn_norm: Vec<f32>,
    /// `wq: [n_head*head_dim, n_embd]`.
    pub wq: TensorRef,
    /// `wk: [n_head_kv*head_dim, n_embd]`.
    pub wk: TensorRef,
    /// `wv: [n_head_kv*head_dim, n_embd]`.
    pub wv: TensorRef,
    /// `wo: [n_embd, n_head*head_dim]`.
    pub wo: TensorRef,
    /// RMSNorm weight before the FFN, `[n_embd]`.
    pub ffn_norm: Vec<f32>,
    /// `w_gate: [n_ff, n_embd]`.
    pub w_gate: TensorRef,
    /// `w_up: [n_ff, n_embd]`.
    pub w_up: TensorRef,
    /// `w_down: [n_embd, n_ff]`.
    pub w_down: TensorRef,
}

impl LayerWeights {
    /// The seven matrices: `attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down`.
    pub fn matrices(&self) -> [&TensorRef; 7] {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w_gate, &self.w_up, &self.w_down]
    }
}

/// All tensors of the model.
#[derive(Debug, Clone)]
pub struct Weights {
    /// Token embedding `[n_vocab, n_embd]`; rows are dequantized one token at a time.
    /// (In a shard file, which has neither embedding nor head: `[0, n_embd]`.)
    pub token_embd: TensorRef,
    /// Transformer blocks.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight `[n_embd]`.
    pub output_norm: Vec<f32>,
    /// Output head `[n_vocab, n_embd]`: `output.weight`, or `token_embd` when tied.
    pub output: TensorRef,
}

impl Weights {
    /// Locate and check every tensor the config implies (for a shard file, the shapes
    /// of `shard`'s rows and columns, and no embedding or head).
    pub fn load(f: &GgufFile, c: &ModelConfig, shard: Option<&crate::TensorSplit>) -> Result<Self> {
        if f.tensors().is_empty() {
            return Err(ModelError::VocabOnly);
        }
        let (e, v) = (c.n_embd, c.n_vocab);
        let whole = crate::TensorSplit::whole(c);
        let shapes = shard.unwrap_or(&whole).matrix_shapes(c).map(|(r, c)| (r.len(), c.len()));
        let (token_embd, output) = if shard.is_some() {
            let none = TensorRef { name: "(none in a shard file)".into(), ty: GgmlType::F32, offset: 0, size: 0, rows: 0, cols: e };
            (none.clone(), none)
        } else {
            let token_embd = matrix(f, "token_embd.weight", v, e)?;
            let output = match f.tensor("output.weight") {
                Some(_) => matrix(f, "output.weight", v, e)?,
                None => token_embd.clone(),
            };
            (token_embd, output)
        };
        let layers = (0..c.n_layer)
            .map(|i| {
                let m = |k: usize, n: &str| matrix(f, &format!("blk.{i}.{n}.weight"), shapes[k].0, shapes[k].1);
                Ok(LayerWeights {
                    attn_norm: vector(f, &format!("blk.{i}.attn_norm.weight"), e)?,
                    wq: m(0, "attn_q")?,
                    wk: m(1, "attn_k")?,
                    wv: m(2, "attn_v")?,
                    wo: m(3, "attn_output")?,
                    ffn_norm: vector(f, &format!("blk.{i}.ffn_norm.weight"), e)?,
                    w_gate: m(4, "ffn_gate")?,
                    w_up: m(5, "ffn_up")?,
                    w_down: m(6, "ffn_down")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let w = Self { token_embd, layers, output_norm: vector(f, "output_norm.weight", e)?, output };
        // Every tensor in the file must be one we use: an extra one means the file is a
        // variant we would silently run wrong (e.g. Llama 3.1's rope_freqs).
        let mut used: std::collections::HashSet<&str> =
            [w.token_embd.name.as_str(), w.output.name.as_str(), "output_norm.weight"].into();
        let norms: Vec<String> =
            (0..c.n_layer).flat_map(|i| [format!("blk.{i}.attn_norm.weight"), format!("blk.{i}.ffn_norm.weight")]).collect();
        used.extend(norms.iter().map(String::as_str));
        for l in &w.layers {
            used.extend(l.matrices().map(|t| t.name.as_str()));
        }
        if let Some(t) = f.tensors().iter().find(|t| !used.contains(t.name.as_str())) {
            return Err(ModelError::UnusedTensor(t.name.clone()));
        }
        Ok(w)
    }

    /// Total bytes of all matrices (what one decode step streams from memory).
    pub fn matrix_bytes(&self) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| l.matrices().iter().map(|t| t.size).sum::<usize>())
            .sum();
        per_layer + self.output.size
    }
}

fn matrix(f: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<TensorRef> {
    let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let expected = vec![cols as u64, rows as u64];
    if t.dims != expected {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected });
    }
    if !MATMUL_TYPES.contains(&t.ty) {
        return Err(ModelError::UnsupportedType {
            name: name.into(),
            ty: t.ty,
            supported: MATMUL_TYPES.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(TensorRef {
        name: name.into(),
        ty: t.ty,
        offset: (f.data_offset() + t.offset) as usize,
        size: t.size as usize,
        rows,
        cols,
    })
}

/// Norm weights are tiny vectors: converted to f32 once at load.
fn vector(f: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    if t.dims != [n as u64] {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected: vec![n as u64] });
    }
    let mut out = vec![0f32; n];
    hearth_kernels::dequantize_row(t.ty, &f.read_tensor(t)?, &mut out).map_err(|_| ModelError::UnsupportedType {
        name: name.into(),
        ty: t.ty,
        supported: "f32, f16, bf16".into(),
    })?;
    Ok(out)
}
