//! Shared code of the fuzz targets: the checks every GGUF input goes through, and a
//! structure-aware generator of tiny model files ([`TinyModel`]) so the fuzzer reaches
//! the hyperparameter, tensor-shape and forward-pass logic instead of stopping at
//! header checks. The targets themselves are in `fuzz_targets/`.

use arbitrary::Arbitrary;
use hearth_gguf::{string_array, value_type, write_gguf, GgufFile, TensorSpec, Value};
use hearth_model::{Arch, Context, Logits, Model, ModelConfig, ARCHS, MATMUL_TYPES};
use hearth_quant::GgmlType;
use hearth_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

/// Largest file the forward pass runs on: one token over a bigger model would make a
/// single execution slow without reaching new code.
const MAX_FORWARD_BYTES: usize = 1 << 20;

/// `$HEARTH_REFERENCE_DIR`, else `../shared/reference` next to the repository (as the
/// test suite finds it).
pub fn reference_dir() -> PathBuf {
    std::env::var_os("HEARTH_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference")))
}

/// Everything hearth does with a GGUF from a stranger, in the order the CLI does it:
/// open and validate, `inspect`'s formatting, hyperparameters, tokenizer, weights, and
/// for a small file that loads, one forward token. Errors are fine; panics, hangs and
/// runaway allocations are the bugs.
pub fn check_gguf(bytes: Vec<u8>) {
    let Ok(f) = GgufFile::from_vec(bytes) else { return };
    // What `hearth inspect` prints (text and --json).
    for (_, v) in f.metadata() {
        let _ = v.summary(8);
        let _ = v.to_json();
    }
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.size, "tensor view of {:?} has the wrong size", t.name);
        let _ = (t.ty.name(), t.n_elements());
    }
    let f = Arc::new(f);
    // Each stage on its own, so a file that fails one still exercises the others.
    let _ = ModelConfig::from_gguf(&f);
    if let Ok(tok) = Tokenizer::from_gguf(&f) {
        let ids = tok.encode("Hello, world! 123 <s>", true, true);
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()), "token id out of the vocabulary");
        let _ = tok.detokenize(&ids, false, true);
    }
    let small = f.as_bytes().len() <= MAX_FORWARD_BYTES;
    let Ok(model) = Model::from_file(f) else { return };
    let _ = model.chat_template();
    if !small {
        return;
    }
    let model = Arc::new(model);
    let n_vocab = model.config.n_vocab;
    let Ok(mut ctx) = Context::new(model.clone(), 8, 8, 1) else { return };
    // Token 0 always exists (the vocabulary is not empty); the last one too.
    for tok in [0, n_vocab as u32 - 1] {
        if let Ok(logits) = ctx.eval(&[tok], Logits::Last) {
            assert_eq!(logits.len(), n_vocab, "one token's logits must cover the vocabulary");
        }
    }
}

/// Pieces a tiny SentencePiece vocabulary is built from (specials first).
const SPM_PIECES: &[&str] = &[
    "<unk>", "<s>", "</s>", "<0x00>", "<0x0A>", "<0x41>", "<0xE2>", "▁", "▁a", "a", "b", "ab", "▁ab", "c", "abc", "<|im_end|>", "é", "▁▁",
];
/// Pieces of a tiny byte-level BPE vocabulary (GPT-2's byte alphabet: `Ġ` is a space).
const BPE_PIECES: &[&str] = &[
    "<|endoftext|>", "a", "b", "c", "Ġ", "Ċ", "ab", "Ġa", "abc", "1", "12", "<|im_start|>", "<|im_end|>", "!", "Ã", "©",
];
const BPE_MERGES: &[&str] = &["a b", "Ġ a", "ab c", "1 2", "Ã ©"];
/// A few pre-tokenizers with different regex sets (the tokenizer target covers all).
const PRES: &[&str] = &["default", "llama3", "qwen2", "gpt-2", "deepseek-llm", "smollm", "tekken", "chameleon"];

/// A metadata value the fuzzer picks (for edits of the generated file).
#[derive(Arbitrary, Debug)]
pub enum ArbValue {
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    U32s(Vec<u32>),
    Strs(Vec<String>),
}

impl ArbValue {
    fn value(self) -> Value {
        match self {
            ArbValue::U32(x) => Value::U32(x),
            ArbValue::I32(x) => Value::I32(x),
            ArbValue::U64(x) => Value::U64(x),
            ArbValue::F32(x) => Value::F32(x),
            ArbValue::Bool(x) => Value::Bool(x),
            ArbValue::Str(s) => Value::String(s),
            ArbValue::U32s(v) => Value::Array { elem_type: value_type::U32, items: v.into_iter().map(Value::U32).collect() },
            ArbValue::Strs(v) => string_array(v),
        }
    }
}

/// One change to an otherwise well-formed file.
#[derive(Arbitrary, Debug)]
pub enum Edit {
    /// Replace the value of the n-th metadata key (modulo the count).
    SetMeta(u8, ArbValue),
    /// Remove the n-th metadata key.
    DropMeta(u8),
    /// Add a key (named after one the readers look for, or any string).
    AddMeta(u8, String, ArbValue),
    /// Remove the n-th tensor.
    DropTensor(u8),
    /// Change one dimension of the n-th tensor.
    SetDim(u8, u8, u32),
    /// Add or remove a dimension of the n-th tensor.
    Reshape(u8, bool),
    /// Change the n-th tensor's type.
    SetType(u8, u8),
    /// Rename the n-th tensor to the name of the m-th (a duplicate) or a string.
    Rename(u8, String),
}

/// Keys the model and tokenizer readers look up (suffixes of `{arch}.` or full names),
/// so `AddMeta` reaches optional-key paths.
const KEYS: &[&str] = &[
    "vocab_size", "attention.key_length", "attention.value_length", "rope.dimension_count", "rope.freq_base", "rope.scaling.type",
    "rope.scaling.factor", "rope.scale_linear", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
    "rope.scaling.yarn_log_multiplier", "attention.sliding_window", "rope.freq_base_swa", "final_logit_softcapping",
    "attention.layer_norm_rms_epsilon", "attention.head_count_kv", "rope.scaling.finetuned",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.chat_template",
    "general.alignment", "split.count", "hearth.shard.node", "hearth.shard.kv_heads", "hearth.shard.ffn_rows",
];

/// A tiny model file: an architecture, small dimensions, a tiny vocabulary, weight
/// bytes, then a few [`Edit`]s. Valid by construction before the edits, so most inputs
/// get past the header into config, weights and the forward pass.
#[derive(Arbitrary, Debug)]
pub struct TinyModel {
    arch: u8,
    n_embd: u8,
    n_layer: u8,
    n_head: u8,
    n_head_kv: u8,
    n_ff: u8,
    ty: u8,
    out_ty: u8,
    tied: bool,
    rope_freqs: bool,
    spm: bool,
    pre: u8,
    n_vocab: u8,
    fill: u64,
    edits: Vec<Edit>,
}

impl TinyModel {
    /// The file's bytes (`None` when an edit made it unwritable, e.g. a shape that is
    /// not a whole number of blocks: the writer refuses those).
    pub fn to_bytes(self) -> Option<Vec<u8>> {
        let arch: Arch = ARCHS[self.arch as usize % ARCHS.len()];
        let ty = MATMUL_TYPES[self.ty as usize % MATMUL_TYPES.len()];
        let out_ty = MATMUL_TYPES[self.out_ty as usize % MATMUL_TYPES.len()];
        // K-quants need rows of 256; the others 32.
        let unit = ty.block_size().max(out_ty.block_size()).max(32);
        let n_embd = unit * (1 + self.n_embd as usize % 2);
        let n_head = [1, 2, 4][self.n_head as usize % 3];
        let n_head_kv = [1, 2, 4][self.n_head_kv as usize % 3].min(n_head);
        let head_dim = n_embd / n_head;
        let n_ff = unit * (1 + self.n_ff as usize % 2);
        let n_layer = 1 + self.n_layer as usize % 2;
        let pieces = if self.spm { SPM_PIECES } else { BPE_PIECES };
        let n_vocab = 4 + self.n_vocab as usize % (pieces.len() - 3);
        let cfg = ModelConfig::for_shape(arch, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab);

        let mut meta = vec![
            ("general.architecture".to_string(), Value::String(arch.name().into())),
            ("general.file_type".to_string(), Value::U32(1)),
        ];
        meta.extend(cfg.to_metadata());
        let tokens = &pieces[..n_vocab];
        let types: Vec<Value> = tokens
            .iter()
            .map(|t| Value::I32(if t.starts_with("<0x") { 6 } else if t.starts_with('<') { 3 } else { 1 }))
            .collect();
        let t = |k: &str| format!("tokenizer.ggml.{k}");
        if self.spm {
            meta.push((t("model"), Value::String("llama".into())));
            let scores = (0..n_vocab).map(|i| Value::F32(-(i as f32))).collect();
            meta.push((t("scores"), Value::Array { elem_type: value_type::F32, items: scores }));
        } else {
            meta.push((t("model"), Value::String("gpt2".into())));
            meta.push((t("pre"), Value::String(PRES[self.pre as usize % PRES.len()].into())));
            meta.push((t("merges"), string_array(BPE_MERGES)));
        }
        meta.push((t("tokens"), string_array(tokens)));
        meta.push((t("token_type"), Value::Array { elem_type: value_type::I32, items: types }));
        let mut tensors: Vec<TensorSpec> = hearth_model::file_tensors(&cfg, ty, out_ty, self.tied, self.rope_freqs);

        for e in self.edits.into_iter().take(8) {
            let nt = tensors.len().max(1);
            match e {
                Edit::SetMeta(i, v) if !meta.is_empty() => {
                    let n = meta.len();
                    meta[i as usize % n].1 = v.value();
                }
                Edit::DropMeta(i) if !meta.is_empty() => {
                    let n = meta.len();
                    meta.remove(i as usize % n);
                }
                Edit::AddMeta(i, name, v) => {
                    let k = KEYS[i as usize % KEYS.len()];
                    let key = if !name.is_empty() {
                        name
                    } else if k.contains('.') && (k.starts_with("tokenizer.") || k.starts_with("general.") || k.starts_with("split.") || k.starts_with("hearth.")) {
                        k.to_string()
                    } else {
                        format!("{}.{k}", arch.name())
                    };
                    meta.retain(|(k, _)| *k != key);
                    meta.push((key, v.value()));
                }
                Edit::DropTensor(i) if !tensors.is_empty() => {
                    tensors.remove(i as usize % nt);
                }
                Edit::SetDim(i, d, v) if !tensors.is_empty() => {
                    let dims = &mut tensors[i as usize % nt].dims;
                    let n = dims.len();
                    // Keep tensors small: a huge dimension only fails the size checks.
                    dims[d as usize % n] = (v % 4096).max(1) as u64;
                }
                Edit::Reshape(i, grow) if !tensors.is_empty() => {
                    let dims = &mut tensors[i as usize % nt].dims;
                    if grow && dims.len() < 4 {
                        dims.push(1 + dims.len() as u64);
                    } else if !grow && dims.len() > 1 {
                        dims.pop();
                    }
                }
                Edit::SetType(i, ty) if !tensors.is_empty() => {
                    tensors[i as usize % nt].ty = GgmlType::ALL[ty as usize % GgmlType::ALL.len()];
                }
                Edit::Rename(i, name) if !tensors.is_empty() => {
                    let name = if name.len() < 3 {
                        tensors[name.len() % nt].name.clone()
                    } else {
                        name
                    };
                    tensors[i as usize % nt].name = name;
                }
                _ => {}
            }
        }
        // Keep a single execution fast: tensor bytes are written in full.
        let total: u64 = tensors.iter().filter_map(|t| t.size().ok()).sum();
        if total > 8 << 20 {
            return None;
        }
        // Weight bytes: a cheap deterministic stream from `fill` (values do not change
        // which code runs, except NaN/inf scales, which this reaches too).
        // Written through one 4 KiB block (a multiple of 8, so the stream is the same as
        // one 8-byte step per word over each whole tensor) into a buffer sized up front:
        // a tensor-sized scratch buffer and the output's regrowth were a third of the
        // time of an execution once the tokenizer's regexes were cached.
        let mut state = self.fill | 1;
        let sizes: Vec<u64> = tensors.iter().map(|t| t.size()).collect::<Result<_, _>>().ok()?;
        // Metadata and tensor infos come from an input of at most -max_len bytes plus the
        // tiny vocabulary; padding is 32 bytes a tensor unless an edit changed the
        // alignment (then the buffer grows as needed).
        let mut buf = Vec::with_capacity(total as usize + 32 * (tensors.len() + 1) + (64 << 10));
        let mut block = [0u8; 4096];
        let written = write_gguf(&mut buf, &meta, &tensors, |i, w| {
            let mut left = sizes[i] as usize;
            while left > 0 {
                let n = left.min(block.len());
                for b in block[..n].chunks_mut(8) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Small values: mostly finite f16/f32 scales.
                    let v = (state & 0x3f3f_3f3f_3f3f_3f3f).to_le_bytes();
                    b.copy_from_slice(&v[..b.len()]);
                }
                w.write_all(&block[..n])?;
                left -= n;
            }
            Ok(())
        });
        written.ok()?;
        Some(buf)
    }
}
