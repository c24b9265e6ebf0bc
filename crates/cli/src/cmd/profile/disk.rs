//! Read throughput of the file system holding a file, page cache bypassed: sequential
//! 16 MiB and random 1 MiB reads with `O_DIRECT` (as `--mem-budget`'s window reads).
//!
//! Where the file system refuses `O_DIRECT` (tmpfs, some FUSE), the reads go through
//! the page cache after dropping the file from it, and never re-read a byte, so the
//! figure is still a first read; [`DiskRates::direct`] says which happened.

use std::alloc::{alloc, dealloc, Layout};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Alignment of buffers, offsets and lengths for `O_DIRECT`.
const ALIGN: usize = 4096;
/// Sequential request size.
pub const SEQ_CHUNK: usize = 16 << 20;
/// Random request size.
pub const RAND_CHUNK: usize = 1 << 20;

/// Limits of one measurement: it stops at whichever comes first (after one request).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes read at most.
    pub max_bytes: usize,
    /// Time spent reading at most.
    pub max_time: Duration,
}

/// The measured rates, GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskRates {
    /// Sequential 16 MiB reads from the start of the file.
    pub seq_gbps: f64,
    /// 1 MiB reads at random 4 KiB-aligned offsets.
    pub rand_gbps: f64,
    /// Whether the reads bypassed the page cache (`O_DIRECT`).
    pub direct: bool,
}

/// A zeroed, `ALIGN`-aligned buffer.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> std::io::Result<Self> {
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN).map_err(std::io::Error::other)?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            return Err(std::io::Error::other(format!("could not allocate a {len}-byte read buffer")));
        }
        Ok(Self { ptr, len })
    }

    fn slice(&mut self, n: usize) -> &mut [u8] {
        assert!(n <= self.len);
        // SAFETY: `n` bytes of our allocation, borrowed mutably through `self`; the
        // kernel writes them before anyone reads them (u8 has no invalid values).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len.max(ALIGN), ALIGN)) }
    }
}

/// `path` opened with `O_DIRECT` if reads that way work, else buffered.
fn open(path: &Path, buf: &mut AlignedBuf) -> std::io::Result<(File, bool)> {
    if let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        if f.read_at(buf.slice(ALIGN), 0).is_ok() {
            return Ok((f, true));
        }
    }
    Ok((File::open(path)?, false))
}

/// Read exactly `dst.len()` bytes at `off` (short reads continue).
fn read_full(f: &File, dst: &mut [u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        match f.read_at(&mut dst[done..], off + done as u64) {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while reading")),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Run `next(i) -> (offset, len)` reads until a limit; GB/s over the time spent reading.
fn run(f: &File, buf: &mut AlignedBuf, lim: Limits, mut next: impl FnMut(usize) -> Option<(u64, usize)>) -> std::io::Result<f64> {
    let (mut bytes, mut spent, mut i) = (0usize, Duration::ZERO, 0);
    while bytes < lim.max_bytes.max(1) && spent < lim.max_time {
        let Some((off, len)) = next(i) else { break };
        let t0 = Instant::now();
        read_full(f, buf.slice(len), off)?;
        spent += t0.elapsed();
        bytes += len;
        i += 1;
    }
    Ok(bytes as f64 / spent.as_secs_f64().max(1e-9) / 1e9)
}

/// Measure sequential and random reads of `path` (the file should be at least a few
/// MiB; a smaller one gives noisy figures). Each measurement keeps to `lim`.
pub fn measure(path: &Path, lim: Limits) -> std::io::Result<DiskRates> {
    let len = std::fs::metadata(path)?.len() as usize / ALIGN * ALIGN;
    if len == 0 {
        return Err(std::io::Error::other(format!("{} is smaller than {ALIGN} bytes: cannot measure reads", path.display())));
    }
    let mut buf = AlignedBuf::new(SEQ_CHUNK.min(len))?;
    let (f, direct) = open(path, &mut buf)?;
    // Buffered reads: start cold and never re-read (a second pass would hit the cache).
    let _ = hearth_memory::drop_page_cache(path);
    let seq = run(&f, &mut buf, lim, |i| {
        let chunks = len.div_ceil(SEQ_CHUNK);
        if !direct && i >= chunks {
            return None;
        }
        let off = (i % chunks) * SEQ_CHUNK;
        Some((off as u64, SEQ_CHUNK.min(len - off)))
    })?;
    let _ = hearth_memory::drop_page_cache(path);
    let rlen = RAND_CHUNK.min(len);
    let slots = (len - rlen) / ALIGN + 1;
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ len as u64;
    let mut seen = std::collections::HashSet::new();
    let rand = run(&f, &mut buf, lim, |_| {
        for _ in 0..64 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let off = (s % slots as u64) as usize * ALIGN;
            // Buffered: skip requests overlapping earlier ones (they would hit the cache).
            if direct || seen.insert(off / RAND_CHUNK) && seen.insert((off + rlen - 1) / RAND_CHUNK) {
                return Some((off as u64, rlen));
            }
        }
        None
    })?;
    Ok(DiskRates { seq_gbps: seq, rand_gbps: rand, direct })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_small_file() {
        let dir = std::env::temp_dir().join(format!("hearth-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.bin");
        std::fs::write(&p, vec![7u8; 3 << 20]).unwrap();
        let r = measure(&p, Limits { max_bytes: 8 << 20, max_time: Duration::from_millis(200) }).unwrap();
        assert!(r.seq_gbps > 0.0 && r.rand_gbps > 0.0, "{r:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
