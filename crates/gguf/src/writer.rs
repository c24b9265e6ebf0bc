//! GGUF v3 writer: streams tensor data so multi-GB files never sit in memory, and
//! writes to a temporary file renamed into place, so a failure leaves no partial output.

use crate::error::{GgufError, Result};
use crate::reader::DEFAULT_ALIGNMENT;
use crate::value::{ty, Value};
use hearth_quant::GgmlType;
use crate::pieces::PieceWriter;
use std::io::Write;
use std::path::Path;

/// The header of one tensor to be written.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Shape in ggml order (`dims[0]` innermost).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Byte size of the tensor's data, or an error when the row length is not a whole
    /// number of blocks.
    pub fn size(&self) -> Result<u64> {
        let n: u64 = self.dims.iter().product();
        self.ty.row_bytes(n).filter(|_| self.dims[0].is_multiple_of(self.ty.block_size() as u64)).ok_or_else(|| {
            GgufError::Invalid {
                field: format!("tensor {:?}", self.name),
                offset: 0,
                reason: format!("shape {:?} is not a whole number of {} blocks", self.dims, self.ty),
            }
        })
    }
}

fn put_str(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn put_value(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&[*x as u8]),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => put_str(w, s),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Array { elem_type, items } => {
            w.write_all(&elem_type.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|it| put_value(w, it))
        }
    }
}

/// Counts bytes so the writer can check each tensor's fill wrote exactly its size.
struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Serialise a GGUF v3 file to `out`.
///
/// `fill(i, w)` must write exactly the bytes of `tensors[i]`; it is called in order.
/// The alignment is taken from `general.alignment` when present (as a u32).
pub fn write_gguf<W: Write>(
    out: W,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut fill: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> Result<W> {
    let io = |source| GgufError::Io { path: "<output>".into(), source };
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| match v {
            Value::U32(a) if a.is_power_of_two() => Some(*a as u64),
            _ => None,
        })
        .unwrap_or(DEFAULT_ALIGNMENT);
    let sizes = tensors.iter().map(TensorSpec::size).collect::<Result<Vec<_>>>()?;

    let mut w = Counting { inner: out, n: 0 };
    let mut header = || -> std::io::Result<()> {
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(metadata.len() as u64).to_le_bytes())?;
        for (k, v) in metadata {
            put_str(&mut w, k)?;
            w.write_all(&v.type_id().to_le_bytes())?;
            put_value(&mut w, v)?;
        }
        let mut offset = 0u64;
        for (t, size) in tensors.iter().zip(&sizes) {
            put_str(&mut w, &t.name)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            t.dims.iter().try_for_each(|d| w.write_all(&d.to_le_bytes()))?;
            w.write_all(&(t.ty as u32).to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset += size.div_ceil(alignment) * alignment;
        }
        Ok(())
    };
    header().map_err(io)?;
    let pad = |w: &mut Counting<W>| -> std::io::Result<()> {
        let rem = (alignment - w.n % alignment) % alignment;
        w.write_all(&vec![0u8; rem as usize])
    };
    pad(&mut w).map_err(io)?;
    for (i, (t, &size)) in tensors.iter().zip(&sizes).enumerate() {
        let start = w.n;
        fill(i, &mut w).map_err(io)?;
        if w.n - start != size {
            return Err(GgufError::Invalid {
                field: format!("tensor {:?}", t.name),
                offset: start,
                reason: format!("writer produced {} bytes, expected {size}", w.n - start),
            });
        }
        pad(&mut w).map_err(io)?;
    }
    w.flush().map_err(io)?;
    Ok(w.inner)
}

/// Write a GGUF file at `path` atomically: into `path.tmp-<pid>` first, renamed on success,
/// removed on failure.
pub fn write_gguf_file(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    fill: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let io = |source| GgufError::Io { path: path.to_path_buf(), source };
    // The rename below would replace whatever OUT is: refuse anything but a regular file
    // (a device such as /dev/null must never be swapped for a file).
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(io(std::io::Error::other("exists and is not a regular file; refusing to replace it")));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let file = std::fs::File::create(&tmp).map_err(io)?;
    // In 2 MiB pieces, so that the page cache can hold the file as 2 MiB folios (where the
    // filesystem has large folios and memory allows) and a model run straight after (a
    // benchmark of what `hearth synth` wrote) can map it in 2 MiB pages.
    let result = write_gguf(PieceWriter::new(file), metadata, tensors, fill)
        // Name the file, not write_gguf's "<output>".
        .map_err(|e| match e {
            GgufError::Io { source, .. } => io(source),
            other => other,
        })
        .and_then(|w| w.into_inner().map_err(io))
        .and_then(|f| f.sync_all().map_err(io))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(io));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A string array value.
pub fn string_array<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Value {
    Value::Array {
        elem_type: ty::STRING,
        items: items.into_iter().map(|s| Value::String(s.as_ref().to_string())).collect(),
    }
}
