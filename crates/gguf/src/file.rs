//! [`GgufFile`]: a memory-mapped GGUF file whose tensors are zero-copy byte views.

use crate::error::{GgufError, Result};
use crate::reader::{parse_header, Header, TensorInfo};
use crate::value::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Backing bytes: a read-only mapping of the file (or an owned buffer, for tests).
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An opened, validated GGUF file.
///
/// Tensor bytes are never copied: [`GgufFile::tensor_data`] returns a slice of the mapping.
pub struct GgufFile {
    bytes: Bytes,
    path: PathBuf,
    header: Header,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Map and validate `path`. Fails with a typed error on any malformed field.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io { path: path.clone(), source };
        // stat before open: opening a FIFO blocks until a writer appears.
        let meta = std::fs::metadata(&path).map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory, not a GGUF file")));
        }
        if !meta.is_file() {
            // A device or pipe has no length to map and may never end (/dev/zero).
            return Err(io(std::io::Error::other("is not a regular file (a device or pipe?)")));
        }
        let file = std::fs::File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 4 {
            // (A /proc file says 0 bytes and has more: show at most the magic's 4.)
            let mut head = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(&file, 4), &mut head).map_err(io)?;
            return Err(GgufError::BadMagic { found: head });
        }
        // SAFETY: the mapping is read-only; like every mmap-based loader we rely on the
        // file not being truncated by another process while it is open.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes(Bytes::Mapped(mmap), path)
    }

    /// Parse an in-memory GGUF image (used by tests and fuzzing).
    pub fn from_vec(bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes(Bytes::Owned(bytes), PathBuf::from("<memory>"))
    }

    fn from_bytes(bytes: Bytes, path: PathBuf) -> Result<Self> {
        let buf: &[u8] = match &bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        };
        let header = parse_header(buf)?;
        let meta_index = header.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Self { bytes, path, header, meta_index, tensor_index })
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    /// A copy of tensor `t`'s bytes, read with `pread` rather than through the mapping for
    /// a mapped file: small tensors read once at load (norm vectors) then cost no mapped
    /// pages. (A fault on the mapping maps a whole page-cache folio, which can be 2 MiB
    /// around a 2 KiB norm.)
    pub fn read_tensor(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; t.size as usize];
        self.read_at(self.data_offset() + t.offset, &mut buf)?;
        Ok(buf)
    }

    /// Fill `buf` from absolute file offset `offset` with `pread` (not through the
    /// mapping: see [`Self::read_tensor`]); an error if the range is past the end.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        match &self.bytes {
            Bytes::Owned(b) => {
                let src = usize::try_from(offset).ok().and_then(|o| b.get(o..o.checked_add(buf.len())?));
                let src = src.ok_or_else(|| GgufError::Io {
                    path: self.path.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the end of the buffer"),
                })?;
                buf.copy_from_slice(src);
                Ok(())
            }
            Bytes::Mapped(_) => {
                use std::os::unix::fs::FileExt;
                let io = |source| GgufError::Io { path: self.path.clone(), source };
                std::fs::File::open(&self.path).and_then(|f| f.read_exact_at(buf, offset)).map_err(io)
            }
        }
    }

    /// Drop the mapping's resident pages from this process (`madvise(MADV_DONTNEED)`):
    /// they leave the RSS and are read from the file again if touched. The sliding-window
    /// scheduler calls this after load, when weights come through its own buffers and the
    /// mapping was only used for the header and norms. No-op for an owned buffer.
    pub fn release_pages(&self) {
        if let Bytes::Mapped(m) = &self.bytes {
            // SAFETY: a read-only file mapping holds no private changes, so dropping its
            // pages loses nothing: a later access re-reads the file.
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// Path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version.
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Data alignment.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.header.metadata[i].1)
    }

    /// A tensor's info.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.header.tensors[i])
    }

    /// A tensor's bytes: a zero-copy view into the mapping (bounds were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + t.offset) as usize;
        &self.as_bytes()[start..start + t.size as usize]
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.require(key)?.as_str().ok_or_else(|| self.wrong_type(key, "a string"))
    }

    /// A required integer value, converted to `u64` if it is non-negative.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.require(key)?
            .as_int()
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| self.wrong_type(key, "a non-negative integer"))
    }

    /// A required number as f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.require(key)?.as_f64().map(|v| v as f32).ok_or_else(|| self.wrong_type(key, "a number"))
    }

    /// An optional bool (`None` when absent; an error when present with another type).
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong_type(key, "a bool")),
        }
    }

    /// A required array.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        self.require(key)?.as_array().ok_or_else(|| self.wrong_type(key, "an array"))
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::Metadata { key: key.into(), reason: "missing".into() })
    }

    fn wrong_type(&self, key: &str, want: &str) -> GgufError {
        let got = self.get(key).map(|v| crate::value::type_name(v.type_id())).unwrap_or("nothing");
        GgufError::Metadata { key: key.into(), reason: format!("expected {want}, found {got}") }
    }
}
