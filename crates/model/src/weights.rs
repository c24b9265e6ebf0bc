//! Named weight tensors of a model, as references into the mapped GGUF file, found
//! through the architecture's tensor table ([`crate::Arch::layer_tensors`]).
//!
//! Nothing here copies a matrix: a [`TensorRef`] is (type, byte range, shape) and
//! becomes a `WeightView` (over the mapping, or a sliding window's buffer: see
//! [`crate::Unit::view`]) only while a kernel runs. This is what
//! lets later layers take views of row/column ranges (tensor parallelism) or of a
//! window of layers (the sliding-window scheduler) without touching the rest. A fused
//! tensor (Phi-3's `attn_qkv`) is several matrices that are row ranges of one tensor.

use crate::arch::{Arch, Holds, LayerTensor, Mat, Vector};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use hearth_gguf::GgufFile;
use hearth_quant::GgmlType;

/// Weight types the matmul kernels compute with directly.
pub const MATMUL_TYPES: &[GgmlType] =
    &[GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_0X8, GgmlType::Q4_KX8];

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
    /// A 0-byte placeholder of shape `[rows, cols]`: a shard file's empty cut (a node
    /// without rows or columns of a matrix), or what a shard file has none of. It lies in
    /// no unit; its view is empty (`Unit::view`).
    pub fn empty(name: String, rows: usize, cols: usize) -> Self {
        TensorRef { name, ty: GgmlType::F32, offset: 0, size: 0, rows, cols }
    }

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

/// Number of [`Vector`] kinds.
const N_VECTORS: usize = 9;

/// One transformer block's tensors. Shapes in `[rows, cols]` = `[out, in]` order.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `wq: [n_head*head_dim, n_embd]`.
    pub wq: TensorRef,
    /// `wk: [n_head_kv*head_dim, n_embd]`.
    pub wk: TensorRef,
    /// `wv: [n_head_kv*head_dim, n_embd]`.
    pub wv: TensorRef,
    /// `wo: [n_embd, n_head*head_dim]`.
    pub wo: TensorRef,
    /// `w_gate: [n_ff, n_embd]` (a mixture of experts: every expert's, stacked,
    /// `[n_expert·n_ff, n_embd]`).
    pub w_gate: TensorRef,
    /// `w_up: [n_ff, n_embd]` (experts: `[n_expert·n_ff, n_embd]`).
    pub w_up: TensorRef,
    /// `w_down: [n_embd, n_ff]` (experts: `[n_expert·n_embd, n_ff]`).
    pub w_down: TensorRef,
    /// A mixture of experts' router `ffn_gate_inp: [n_expert, n_embd]`.
    pub router: Option<TensorRef>,
    /// A mixture of experts' shared expert (Qwen2-MoE), ordinary layer weights: it is in
    /// the layer's unit, never in an expert cache.
    pub shared: Option<SharedExpert>,
    /// Norm weights and biases the file has, by [`Vector`] kind (f32, copied at load).
    vectors: [Option<Vec<f32>>; N_VECTORS],
}

impl LayerWeights {
    /// The seven matrices: `attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down`.
    pub fn matrices(&self) -> [&TensorRef; 7] {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w_gate, &self.w_up, &self.w_down]
    }

    /// The matrix playing role `m`.
    pub fn matrix(&self, m: Mat) -> &TensorRef {
        self.matrices()[m as usize]
    }

    /// Expert `e`'s matrix of role `m` (gate, up or down): rows `e·rows..(e+1)·rows` of
    /// the stacked tensor, `rows` = the tensor's rows / `n_expert` (a view of the same
    /// file bytes, nothing copied).
    pub fn expert(&self, m: Mat, e: usize, n_expert: usize) -> TensorRef {
        let t = self.matrix(m);
        let rows = t.rows / n_expert.max(1);
        t.rows(e * rows..(e + 1) * rows)
    }

    /// A vector the file has (`None`: an optional one it left out).
    pub fn opt(&self, v: Vector) -> Option<&[f32]> {
        self.vectors[v as usize].as_deref()
    }

    /// A vector the architecture requires (checked at load; empty if absent).
    pub fn v(&self, v: Vector) -> &[f32] {
        self.opt(v).unwrap_or(&[])
    }
}

/// The shared expert of a mixture-of-experts layer: a dense SwiGLU FFN of
/// [`crate::Moe::n_ff_shared`] rows whose output is scaled by `sigmoid(gate · x)`.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// `ffn_gate_inp_shexp: [1, n_embd]` (a 1-D tensor in the file).
    pub gate_inp: TensorRef,
    /// `ffn_gate_shexp: [n_ff_shared, n_embd]`.
    pub gate: TensorRef,
    /// `ffn_up_shexp: [n_ff_shared, n_embd]`.
    pub up: TensorRef,
    /// `ffn_down_shexp: [n_embd, n_ff_shared]`.
    pub down: TensorRef,
}

impl SharedExpert {
    /// Its four tensors.
    pub fn tensors(&self) -> [&TensorRef; 4] {
        [&self.gate_inp, &self.gate, &self.up, &self.down]
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
    /// RoPE frequency divisors `[rope_dims / 2]`: Llama 3.1's `rope_freqs.weight`.
    pub rope_freqs: Option<Vec<f32>>,
    /// Phi-3 LongRoPE: `rope_factors_short.weight` and `rope_factors_long.weight`
    /// (the long ones serve contexts beyond the original training length).
    pub rope_factors: Option<[Vec<f32>; 2]>,
}

/// The per-layer tensors to look for: the architecture's table, with fused matrices
/// listed as separate ones in a shard file (which stores them cut, unfused).
pub fn layer_table(c: &ModelConfig, shard: bool) -> Vec<LayerTensor> {
    let mut out = Vec::new();
    for t in c.arch.layer_tensors() {
        match t.holds {
            Holds::Fused(ms) if shard => {
                out.extend(ms.iter().map(|&m| LayerTensor { name: unfused_name(m), holds: Holds::Matrix(m), optional: t.optional }))
            }
            _ => out.push(*t),
        }
    }
    out
}

/// Tensor headers in the order llama.cpp's converter writes them: the embedding, RoPE
/// factors, each block's tensors in the architecture's order, the final norm and (unless
/// `tied`) the output head, matrices in `ty` (the head in `out_ty`), vectors F32: what
/// `hearth synth` writes and the planner sizes for a named shape.
pub fn file_tensors(c: &ModelConfig, ty: GgmlType, out_ty: GgmlType, tied: bool, rope_freqs: bool) -> Vec<hearth_gguf::TensorSpec> {
    // A type that stores rows in groups (Q4_0X8, Q4_KX8) only where a matrix has whole groups of
    // rows (per expert: dims[1]); the rest, and the embedding table (rows looked up one
    // by one), in its row type.
    let t = |name: String, dims: Vec<u64>, ty: GgmlType| {
        let ty = if dims.len() > 1 && !dims[1].is_multiple_of(ty.group_rows() as u64) { ty.ungrouped() } else { ty };
        hearth_gguf::TensorSpec { name, dims, ty }
    };
    let (e, v) = (c.n_embd as u64, c.n_vocab as u64);
    let mut out = vec![t("token_embd.weight".into(), vec![e, v], ty.ungrouped())];
    let pairs = vec![c.rope.dims as u64 / 2];
    if rope_freqs {
        out.push(t("rope_freqs.weight".into(), pairs.clone(), GgmlType::F32));
    }
    if c.arch == Arch::Phi3 {
        out.push(t("rope_factors_long.weight".into(), pairs.clone(), GgmlType::F32));
        out.push(t("rope_factors_short.weight".into(), pairs, GgmlType::F32));
    }
    for i in 0..c.n_layer {
        for lt in c.arch.layer_tensors() {
            let dims = lt.dims(c);
            let ty = if dims.len() == 1 { GgmlType::F32 } else { ty };
            out.push(t(format!("blk.{i}.{}", lt.name), dims, ty));
        }
    }
    out.push(t("output_norm.weight".into(), vec![e], GgmlType::F32));
    if !tied {
        out.push(t("output.weight".into(), vec![e, v], out_ty));
    }
    out
}

/// `attn_q.weight`, …
fn unfused_name(m: Mat) -> &'static str {
    ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"][m as usize]
}

impl Weights {
    /// Locate and check every tensor the config implies (for a shard file, the shapes
    /// of `shard`'s rows and columns, and no embedding or head).
    pub fn load(f: &GgufFile, c: &ModelConfig, shard: Option<&crate::TensorSplit>) -> Result<Self> {
        if f.tensors().is_empty() {
            return Err(ModelError::VocabOnly);
        }
        let n_expert = c.moe.map_or(0, |m| m.n_expert);
        let (e, v) = (c.n_embd, c.n_vocab);
        let whole = crate::TensorSplit::whole(c);
        let shapes = shard.unwrap_or(&whole).matrix_shapes(c).map(|(r, c)| (r.len(), c.len()));
        // The shared expert's gate, up and down (a shard file's are cut, as the FFN's are).
        let shared_shapes = shard.unwrap_or(&whole).shared_shapes(c).map(|(r, c)| (r.len(), c.len()));
        let (token_embd, output) = if shard.is_some() {
            let none = TensorRef::empty("(none in a shard file)".into(), 0, e);
            (none.clone(), none)
        } else {
            let token_embd = matrix(f, "token_embd.weight", v, e)?;
            let output = match f.tensor("output.weight") {
                Some(_) => matrix(f, "output.weight", v, e)?,
                None => token_embd.clone(),
            };
            (token_embd, output)
        };
        let table = layer_table(c, shard.is_some());
        let mut used: std::collections::HashSet<String> =
            [token_embd.name.clone(), output.name.clone(), "output_norm.weight".to_string()].into();
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let mut mats: [Option<TensorRef>; 7] = Default::default();
            let mut router = None;
            // The shared expert's gate input, then its gate, up and down.
            let mut shared: [Option<TensorRef>; 4] = Default::default();
            let mut vectors: [Option<Vec<f32>>; N_VECTORS] = Default::default();
            for t in &table {
                let name = format!("blk.{i}.{}", t.name);
                if t.optional && f.tensor(&name).is_none() {
                    continue;
                }
                if let Holds::Matrix(m) | Holds::Experts(m) = t.holds {
                    let (rows, cols) = shapes[m as usize];
                    if shard.is_some() && (rows == 0 || cols == 0) {
                        // A shard file leaves out this node's empty cuts (stacked experts:
                        // `n_expert` of them, as `experts` reads a real one).
                        let rows = if matches!(t.holds, Holds::Experts(_)) { rows * n_expert } else { rows };
                        mats[m as usize] = Some(TensorRef::empty(name, rows, cols));
                        continue;
                    }
                }
                match t.holds {
                    Holds::Vector(k) => vectors[k as usize] = Some(vector(f, &name, k.len(c))?),
                    Holds::Router => router = Some(matrix(f, &name, n_expert, e)?),
                    Holds::SharedGate => {
                        shared[0] = Some(TensorRef { rows: 1, cols: e, ..flat(f, &name, checked(f, &name, vec![e as u64])?)? })
                    }
                    Holds::Shared(m) => {
                        let slot = match m {
                            Mat::Gate => 1,
                            Mat::Up => 2,
                            _ => 3,
                        };
                        let (rows, cols) = shared_shapes[slot - 1];
                        shared[slot] = Some(if shard.is_some() && (rows == 0 || cols == 0) {
                            // A shard file leaves out this node's empty cuts.
                            TensorRef::empty(name.clone(), rows, cols)
                        } else {
                            matrix(f, &name, rows, cols)?
                        });
                    }
                    Holds::Experts(m) => mats[m as usize] = Some(experts(f, &name, shapes[m as usize], n_expert)?),
                    Holds::Matrix(m) => mats[m as usize] = Some(matrix(f, &name, shapes[m as usize].0, shapes[m as usize].1)?),
                    Holds::Fused(ms) => {
                        let rows: usize = ms.iter().map(|&m| shapes[m as usize].0).sum();
                        let whole = matrix(f, &name, rows, shapes[ms[0] as usize].1)?;
                        let mut r0 = 0;
                        for &m in ms {
                            let n = shapes[m as usize].0;
                            mats[m as usize] = Some(whole.rows(r0..r0 + n));
                            r0 += n;
                        }
                    }
                }
                used.insert(name);
            }
            let [wq, wk, wv, wo, w_gate, w_up, w_down] = mats.map(|m| m.expect("the table names all seven matrices"));
            let shared = match shared {
                [Some(gate_inp), Some(gate), Some(up), Some(down)] => Some(SharedExpert { gate_inp, gate, up, down }),
                _ => None,
            };
            layers.push(LayerWeights { wq, wk, wv, wo, w_gate, w_up, w_down, router, shared, vectors });
        }
        let rope_dims = c.rope.dims / 2;
        let mut opt_vector = |name: &str| -> Result<Option<Vec<f32>>> {
            if f.tensor(name).is_none() {
                return Ok(None);
            }
            used.insert(name.to_string());
            vector(f, name, rope_dims).map(Some)
        };
        let rope_freqs = opt_vector("rope_freqs.weight")?;
        let rope_factors = match (opt_vector("rope_factors_short.weight")?, opt_vector("rope_factors_long.weight")?) {
            (Some(s), Some(l)) => Some([s, l]),
            (None, None) => None,
            _ => return Err(ModelError::MissingTensor("rope_factors_short.weight and rope_factors_long.weight (both or neither)".into())),
        };
        for factors in rope_freqs.iter().chain(rope_factors.iter().flatten()) {
            if let Some(bad) = factors.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
                return Err(ModelError::Weights(format!("a RoPE frequency factor is {bad}: factors must be positive")));
            }
        }
        let w = Self { token_embd, layers, output_norm: vector(f, "output_norm.weight", e)?, output, rope_freqs, rope_factors };
        w.check_row_groups(n_expert)?;
        // Every tensor in the file must be one we use: an extra one means the file is a
        // variant we would silently run wrong (e.g. biases this architecture has none of).
        if let Some(t) = f.tensors().iter().find(|t| !used.contains(&t.name)) {
            return Err(ModelError::UnusedTensor(t.name.clone()));
        }
        Ok(w)
    }

    /// Matrices of a type that stores rows in groups (Q4_0X8, Q4_KX8): not the embedding table
    /// (its rows are looked up one by one), and every matrix the model multiplies (each
    /// expert, each part of a fused tensor, the output head) in whole groups of rows (the
    /// head's row chunks then are too: `source::head_chunks`).
    fn check_row_groups(&self, n_expert: usize) -> Result<()> {
        let bad = |t: &TensorRef, why: String| ModelError::GroupedRows { name: t.name.clone(), ty: t.ty, group: t.ty.group_rows(), why };
        let e = &self.token_embd;
        if e.ty.group_rows() > 1 {
            return Err(bad(e, "the embedding table's rows are looked up one by one; keep it in a row type (`hearth quantize` does)".into()));
        }
        for (t, rows) in self.multiplied(n_expert) {
            if !rows.is_multiple_of(t.ty.group_rows()) {
                return Err(bad(t, format!("{rows} rows are not whole groups")));
            }
        }
        Ok(())
    }

    /// Every matrix the model multiplies, with the rows of one multiplication: a fused
    /// tensor's parts (its `TensorRef`s are views of the same name), an expert of a stack
    /// (`n_expert` of them), the output head.
    pub fn multiplied(&self, n_expert: usize) -> Vec<(&TensorRef, usize)> {
        let mut out = vec![(&self.output, self.output.rows)];
        for l in &self.layers {
            // A layer with a router holds stacked experts, multiplied one at a time.
            let experts = [&l.w_gate, &l.w_up, &l.w_down].map(|t| (t, if l.router.is_some() { t.rows / n_expert.max(1) } else { t.rows }));
            let shared = l.shared.iter().flat_map(|sh| sh.tensors());
            let whole = [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().chain(l.router.as_ref()).chain(shared);
            out.extend(whole.map(|t| (t, t.rows)).chain(experts));
        }
        out
    }

    /// Bytes of the matrices one decode step streams from memory: every block's
    /// matrices and the output head; with experts (`moe`), the router and the
    /// `n_expert_used / n_expert` share of the stacked expert tensors a token routes to,
    /// and the whole shared expert (every token goes through it).
    pub fn matrix_bytes(&self, moe: Option<crate::config::Moe>) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| {
                let [q, k, v, o, gate, up, down] = l.matrices();
                let ffn = gate.size + up.size + down.size;
                let ffn = moe.map_or(ffn, |m| ffn / m.n_expert.max(1) * m.n_expert_used);
                // The shared expert's gate, up and down (its gate input is a vector, `n_embd`
                // floats, which the planner does not count among the matrices either).
                let shared: usize = l.shared.iter().map(|s| s.gate.size + s.up.size + s.down.size).sum();
                q.size + k.size + v.size + o.size + ffn + l.router.as_ref().map_or(0, |r| r.size) + shared
            })
            .sum();
        per_layer + self.output.size
    }
}

fn matrix(f: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<TensorRef> {
    Ok(TensorRef { rows, cols, ..flat(f, name, checked(f, name, vec![cols as u64, rows as u64])?)? })
}

/// The tensor `name`, which must have ggml dims `expected`.
fn checked<'f>(f: &'f GgufFile, name: &str, expected: Vec<u64>) -> Result<&'f hearth_gguf::TensorInfo> {
    let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    if t.dims != expected {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected });
    }
    Ok(t)
}

/// `n_expert` matrices of `[rows, cols]` stacked in one tensor (ggml dims `[cols, rows,
/// n_expert]`), as one `[n_expert·rows, cols]` matrix ([`LayerWeights::expert`] cuts it).
fn experts(f: &GgufFile, name: &str, (rows, cols): (usize, usize), n_expert: usize) -> Result<TensorRef> {
    let t = f.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let expected = vec![cols as u64, rows as u64, n_expert as u64];
    if t.dims != expected {
        return Err(ModelError::BadShape { name: name.into(), found: t.dims.clone(), expected });
    }
    let mut m = flat(f, name, t)?;
    // rows < 2^32 and n_expert ≤ MAX_EXPERTS: no overflow.
    (m.rows, m.cols) = (rows * n_expert, cols);
    Ok(m)
}

/// A tensor of a type the kernels compute with, located in the file (shape set by the caller).
fn flat(f: &GgufFile, name: &str, t: &hearth_gguf::TensorInfo) -> Result<TensorRef> {
    if !MATMUL_TYPES.contains(&t.ty) {
        return Err(ModelError::UnsupportedType {
            name: name.into(),
            ty: t.ty,
            supported: MATMUL_TYPES.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(TensorRef { name: name.into(), ty: t.ty, offset: (f.data_offset() + t.offset) as usize, size: t.size as usize, rows: 0, cols: 0 })
}

/// Norm weights and biases are tiny vectors: converted to f32 once at load.
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
