//! GGUF parser over an untrusted byte slice.
//!
//! Layout (ggml `docs/gguf.md`): magic `GGUF`, u32 version, u64 tensor count,
//! u64 metadata count, the metadata key/value pairs, the tensor infos, padding
//! to `general.alignment` (default 32), then the tensor data section.
//!
//! Every length, count and offset is checked against the bytes that remain
//! before anything is allocated, so a hostile header cannot make us allocate
//! more than the file's own size or read out of bounds.

use crate::error::{GgufError, Result};
use crate::value::{ty, Value};
use hearth_quant::GgmlType;

/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array nesting we accept (real files use 1).
const MAX_ARRAY_DEPTH: usize = 4;

/// One tensor's header: its name, shape, type and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the first byte, relative to the start of the data section.
    pub offset: u64,
    /// Size in bytes (`ggml_nbytes`).
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Everything in a GGUF header, with tensor offsets validated against the file length.
#[derive(Debug, Clone)]
pub struct Header {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key/value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment in bytes.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                needed: n as u64,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn invalid(&self, field: &str, at: usize, reason: impl Into<String>) -> GgufError {
        GgufError::Invalid { field: field.to_string(), offset: at as u64, reason: reason.into() }
    }

    /// A count that must fit in the remaining bytes, given each item takes at least `min_item` bytes.
    fn count(&mut self, field: &str, min_item: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(field)?;
        let max = (self.remaining() / min_item.max(1)) as u64;
        if n > max {
            return Err(self.invalid(
                field,
                at,
                format!("count {n} cannot fit in the {} bytes that remain", self.remaining()),
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, field: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(field)?;
        if len > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: at as u64,
                needed: len,
                len: self.buf.len() as u64,
            });
        }
        let bytes = self.take(len as usize, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.invalid(field, at, format!("not UTF-8: {e}")))
    }

    fn value(&mut self, vtype: u32, field: &str, depth: usize) -> Result<Value> {
        Ok(match vtype {
            ty::U8 => Value::U8(self.array::<1>(field)?[0]),
            ty::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ty::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ty::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ty::U32 => Value::U32(self.u32(field)?),
            ty::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ty::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ty::U64 => Value::U64(self.u64(field)?),
            ty::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ty::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ty::BOOL => {
                let at = self.pos;
                match self.array::<1>(field)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(self.invalid(field, at, format!("bool byte {b} is neither 0 nor 1"))),
                }
            }
            ty::STRING => Value::String(self.string(field)?),
            ty::ARRAY => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(field, at, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem_type = self.u32(field)?;
                let min = min_value_size(elem_type)
                    .ok_or_else(|| self.invalid(field, at, format!("unknown array element type {elem_type}")))?;
                let n = self.count(field, min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_type, field, depth + 1)?);
                }
                Value::Array { elem_type, items }
            }
            other => return Err(self.invalid(field, self.pos, format!("unknown value type {other}"))),
        })
    }
}

/// Smallest encoded size of a value of this type (None for unknown types).
fn min_value_size(t: u32) -> Option<usize> {
    Some(match t {
        ty::U8 | ty::I8 | ty::BOOL => 1,
        ty::U16 | ty::I16 => 2,
        ty::U32 | ty::I32 | ty::F32 => 4,
        ty::U64 | ty::I64 | ty::F64 | ty::STRING => 8,
        ty::ARRAY => 12,
        _ => return None,
    })
}

/// Parse and validate a whole GGUF header. `buf` is the entire file.
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    if buf.len() < 4 || &buf[..4] != b"GGUF" {
        return Err(GgufError::BadMagic { found: buf[..buf.len().min(4)].to_vec() });
    }
    c.pos = 4;
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // Minimal encoded sizes: a tensor info is name len + n_dims + one dim + type + offset.
    let n_tensors = c.count("tensor_count", 8 + 4 + 8 + 4 + 8)?;
    let n_kv = c.count("metadata_kv_count", 8 + 4 + 1)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut seen = std::collections::HashSet::with_capacity(n_kv);
    for _ in 0..n_kv {
        let at = c.pos;
        let key = c.string("metadata key")?;
        let vtype = c.u32(&key)?;
        let value = c.value(vtype, &key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(c.invalid("metadata key", at, format!("duplicate key {key:?}")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(GgufError::Metadata {
                key: "general.alignment".into(),
                reason: format!("must be a power-of-two uint32, got {v:?}"),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let at = c.pos;
        let name = c.string("tensor name")?;
        let field = format!("tensor {name:?}");
        let n_dims = c.u32(&field)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.invalid(&field, at, format!("n_dims {n_dims} not in 1..={MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(c.u64(&field)?);
        }
        let type_at = c.pos;
        let type_id = c.u32(&field)?;
        let ty = GgmlType::from_u32(type_id)
            .ok_or_else(|| c.invalid(&field, type_at, format!("unknown tensor type id {type_id}")))?;
        let offset = c.u64(&field)?;

        if dims.iter().any(|&d| d == 0 || d > i64::MAX as u64) {
            return Err(c.invalid(&field, at, format!("bad dimension in shape {dims:?}")));
        }
        let n_el = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| c.invalid(&field, at, format!("shape {dims:?} overflows")))?;
        if dims[0] % ty.block_size() as u64 != 0 {
            return Err(c.invalid(
                &field,
                at,
                format!("row length {} is not a multiple of {ty}'s block size {}", dims[0], ty.block_size()),
            ));
        }
        let size = ty
            .row_bytes(n_el)
            .ok_or_else(|| c.invalid(&field, at, format!("byte size of shape {dims:?} overflows")))?;
        if offset % alignment != 0 {
            return Err(c.invalid(&field, at, format!("data offset {offset} is not aligned to {alignment}")));
        }
        if !names.insert(name.clone()) {
            return Err(c.invalid("tensor name", at, format!("duplicate tensor {name:?}")));
        }
        tensors.push(TensorInfo { name, dims, ty, offset, size });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size));
        if end.is_none_or(|e| e > file_len) {
            return Err(GgufError::Invalid {
                // "data": the offset is where its bytes would start, not its header entry.
                field: format!("tensor {:?} data", t.name),
                offset: data_offset.saturating_add(t.offset),
                reason: format!(
                    "data [{}+{}, +{} bytes) lies beyond the end of the file ({file_len} bytes): truncated file or corrupt offset",
                    data_offset, t.offset, t.size
                ),
            });
        }
    }
    // Tensors must not share bytes (llama.cpp requires them packed in order; we only
    // require that no two overlap).
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(GgufError::Invalid {
                field: format!("tensor {:?} data", w[1].name),
                offset: data_offset + w[1].offset,
                reason: format!("its data overlaps tensor {:?}", w[0].name),
            });
        }
    }
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}
