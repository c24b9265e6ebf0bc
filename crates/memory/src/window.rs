//! The sliding-window layer scheduler: run a model whose weights do not fit in memory.
//!
//! TPI-LLM (Li et al., 2024, §3.3 "sliding window memory scheduler") keeps a window of
//! layers resident while a background thread loads the next ones and releases finished
//! ones; prima.cpp leaves eviction of its mmap to the page cache, which thrashes once the
//! model is larger than RAM. [`Window`] owns the memory instead: `slots` page-aligned
//! buffers, each big enough for the largest unit (a transformer block or a chunk of the
//! output head, see `hearth_model::unit_ranges`). The first `slots − 2` units are read once
//! and kept (*pinned*: a ring that evicts every unit each token would re-read them all);
//! the other units stream through a ring of 2 slots: a loader thread reads them in the
//! order the forward pass uses them, into the next free slot, while the forward pass
//! computes the previous one (and, each token, the pinned ones). Releasing a streamed unit
//! hands its slot back. With `slots ≥` the unit count every unit is pinned; with 1 or 2
//! slots nothing is. Weight memory is exactly `slots × slot_bytes`, whatever the model.
//!
//! Reads use `pread` with `O_DIRECT` where the file system allows it (falling back to
//! buffered reads): the bytes go from disk to the slot without a page-cache copy, so the
//! budget is honest under a cgroup limit that counts page cache, and the kernel does not
//! keep a second copy. Measured on this machine: docs/BENCHMARKS.md ("Larger than RAM").
//!
//! A truncated or unreadable file is an error from [`LayerSource::acquire`] (the loader
//! stops and reports it), never a `SIGBUS`: the mapping is not touched for weights.

use hearth_model::{LayerSource, ModelError, SourceStats, Unit};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Alignment of slot buffers, file offsets and lengths for `O_DIRECT` (bytes).
pub const IO_ALIGN: usize = 4096;
/// Bytes per `pread` call.
const CHUNK: usize = 16 << 20;

/// How the loader reads the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// `O_DIRECT`: disk → slot, no page cache (falls back to buffered where unsupported).
    Direct,
    /// Ordinary buffered `pread` through the page cache.
    Buffered,
}

/// One unit's place in the file, widened to [`IO_ALIGN`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// Aligned start (file offset).
    pub(crate) start: u64,
    /// Bytes from `start` to the unit's end.
    pub(crate) need: usize,
    /// `need` rounded up to [`IO_ALIGN`] (what one read asks for).
    pub(crate) len: usize,
    /// The unit's own first byte, as an offset into the slot.
    pub(crate) skip: usize,
}

impl Span {
    pub(crate) fn new(r: &Range<usize>) -> Self {
        let start = (r.start / IO_ALIGN * IO_ALIGN) as u64;
        let skip = r.start - start as usize;
        let need = skip + r.len();
        Self { start, need, len: need.next_multiple_of(IO_ALIGN), skip }
    }
}

/// Bytes a slot needs for the unit at file range `r` (aligned at both ends): what
/// [`crate::plan::plan_window`] takes per unit.
pub fn aligned_len(r: &Range<usize>) -> usize {
    Span::new(r).len
}

/// Slot bytes needed for units with these file ranges (the largest [`aligned_len`]).
pub fn slot_bytes(units: &[Range<usize>]) -> usize {
    units.iter().map(aligned_len).max().unwrap_or(0)
}

/// Units kept resident for good out of `n_units` with `slots` slots: all when they fit,
/// else all but a 2-slot streaming ring (none with fewer than 3 slots).
pub fn pinned_units(n_units: usize, slots: usize) -> usize {
    if slots >= n_units {
        n_units
    } else {
        slots.saturating_sub(2)
    }
}

/// A zeroed, page-aligned heap buffer written by the loader and read by the forward pass;
/// the [`State`] counters say which side may touch it.
pub(crate) struct SlotBuf {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: access is serialized by the `loaded`/`released` protocol in `State`: the loader
// writes a slot only after the consumer released it, and the consumer reads it only after
// the loader published it under the mutex.
unsafe impl Send for SlotBuf {}
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    pub(crate) fn new(len: usize) -> Result<Self, String> {
        let layout = Layout::from_size_align(len.max(IO_ALIGN), IO_ALIGN).map_err(|e| e.to_string())?;
        // SAFETY: the layout has non-zero size. Zeroed memory comes from fresh pages that
        // only become resident when the loader writes them.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("could not allocate a {len}-byte window slot"));
        }
        Ok(Self { ptr, len })
    }
}

impl Drop for SlotBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len.max(IO_ALIGN), IO_ALIGN)) }
    }
}

/// Pinned units are loaded first, in order; then streamed units get sequence numbers
/// `0, 1, …` (unit `pinned + seq mod (n_units − pinned)`, slot `pinned + seq mod ring`).
#[derive(Default)]
struct State {
    /// Pinned units `< pinned_loaded` are in their slots.
    pinned_loaded: usize,
    /// Streamed sequence numbers `< loaded` are in their slots.
    loaded: u64,
    /// Streamed sequence numbers `< released` are finished with.
    released: u64,
    /// Streamed sequence numbers `< requested` have been asked for by the forward pass
    /// (bounds the loader without prefetch).
    requested: u64,
    error: Option<String>,
    stop: bool,
    bytes_read: u64,
    read_secs: f64,
    units_loaded: u64,
    direct: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    slots: Vec<SlotBuf>,
    spans: Vec<Span>,
    /// Units `0..pinned` are read once and kept, in slots `0..pinned`.
    pinned: usize,
    /// Without prefetch the loader reads a streamed unit only once it is asked for.
    prefetch: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Slots of the streaming ring.
    fn ring(&self) -> u64 {
        (self.slots.len() - self.pinned) as u64
    }
    /// Streamed units.
    fn streamed(&self) -> u64 {
        (self.spans.len() - self.pinned) as u64
    }
}

/// A sliding window of units over a GGUF file (see the module docs); plug it into a
/// context with `hearth_model::Context::set_source`.
pub struct Window {
    shared: Arc<Shared>,
    loader: Option<JoinHandle<()>>,
    /// Buffered handle for embedding rows.
    file: File,
    path: PathBuf,
    /// The consumer's next streamed sequence number.
    next: u64,
    wait_secs: f64,
}

impl Window {
    /// Start streaming `units` (file byte ranges, in forward order) of the file at `path`
    /// through `slots` buffers ([`pinned_units`] of them kept). Fails when the file cannot
    /// be opened or the slots cannot be allocated.
    pub fn open(path: &Path, units: Vec<Range<usize>>, slots: usize, mode: ReadMode) -> Result<Self, ModelError> {
        let pinned = pinned_units(units.len(), slots);
        Self::open_with(path, units, slots, pinned, mode)
    }

    /// [`Self::open`] keeping the first `pinned` units instead of [`pinned_units`]'s
    /// choice. A pipelined-ring device short of memory pins none: all its slots form the
    /// streaming ring, so while the token is on the other devices the loader fills every
    /// slot its last window freed with the next window's layers (prima.cpp's prefetch).
    pub fn open_with(path: &Path, units: Vec<Range<usize>>, slots: usize, pinned: usize, mode: ReadMode) -> Result<Self, ModelError> {
        Self::open_full(path, units, slots, pinned, mode, true)
    }

    /// [`Self::open_with`], with `prefetch` off: the loader reads each streamed unit only
    /// when the forward pass asks for it, so no read overlaps compute or idle time (the
    /// baseline that shows what prefetching buys).
    pub fn open_full(
        path: &Path,
        units: Vec<Range<usize>>,
        slots: usize,
        pinned: usize,
        mode: ReadMode,
        prefetch: bool,
    ) -> Result<Self, ModelError> {
        let err = |what: String| ModelError::Weights(format!("{}: {what}", path.display()));
        if units.is_empty() || slots == 0 {
            return Err(err("a window needs at least one unit and one slot".into()));
        }
        let pinned = if slots >= units.len() { units.len() } else { pinned.min(slots - 1) };
        let file = File::open(path).map_err(|e| err(e.to_string()))?;
        {
            use std::os::fd::AsRawFd;
            // Embedding rows are a few KiB each: no kernel read-ahead (8 MiB here) per row.
            // SAFETY: advisory syscall on an open descriptor.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        }
        let spans: Vec<Span> = units.iter().map(Span::new).collect();
        let n_slots = slots.min(units.len());
        let size = slot_bytes(&units);
        let slots = (0..n_slots).map(|_| SlotBuf::new(size)).collect::<Result<Vec<_>, _>>().map_err(err)?;
        let (reader, direct) = open_reader(path, mode).map_err(err)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { direct, ..State::default() }),
            cv: Condvar::new(),
            slots,
            spans,
            pinned,
            prefetch,
        });
        let (sh, p) = (Arc::clone(&shared), path.to_path_buf());
        let loader = std::thread::Builder::new()
            .name("hearth-window".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_loop(&sh, reader, &p)));
                if r.is_err() {
                    let mut st = sh.lock();
                    st.error.get_or_insert_with(|| "the loader thread panicked".into());
                    sh.cv.notify_all();
                }
            })
            .map_err(|e| err(format!("starting the loader thread: {e}")))?;
        Ok(Self { shared, loader: Some(loader), file, path: path.to_path_buf(), next: 0, wait_secs: 0.0 })
    }

    /// Slots in the ring.
    pub fn slots(&self) -> usize {
        self.shared.slots.len()
    }

    /// Units read once and kept ([`pinned_units`]).
    pub fn pinned(&self) -> usize {
        self.shared.pinned
    }

    /// Bytes of each slot.
    pub fn slot_bytes(&self) -> usize {
        self.shared.slots.first().map_or(0, |s| s.len)
    }

    /// Whether reads bypass the page cache (`O_DIRECT` was accepted).
    pub fn is_direct(&self) -> bool {
        self.shared.lock().direct
    }
}

/// The loader thread: the pinned units, then streamed units into free ring slots until
/// stopped or failed.
fn load_loop(sh: &Shared, mut reader: File, path: &Path) {
    for u in 0..sh.pinned {
        if sh.lock().stop {
            return;
        }
        // SAFETY: pinned slot `u` is written only here, before `pinned_loaded > u`
        // publishes it; the consumer reads it only after that.
        if !load_one(sh, &mut reader, path, u, u, |st| st.pinned_loaded = u + 1) {
            return;
        }
    }
    if sh.streamed() == 0 {
        return;
    }
    let mut seq = 0u64;
    loop {
        {
            let mut st = sh.lock();
            while !st.stop && (seq >= st.released + sh.ring() || (!sh.prefetch && seq >= st.requested)) {
                st = sh.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stop {
                return;
            }
        }
        let unit = sh.pinned + (seq % sh.streamed()) as usize;
        let slot = sh.pinned + (seq % sh.ring()) as usize;
        // SAFETY (of the write in load_one): ring slot `slot` last held sequence
        // `seq - ring`, which the consumer released (checked above); nobody reads it
        // until `loaded = seq + 1` publishes it.
        if !load_one(sh, &mut reader, path, unit, slot, |st| st.loaded = seq + 1) {
            return;
        }
        seq += 1;
    }
}

/// Read `unit` into `slot`, then publish it with `done` (or record the error). Returns
/// whether to go on. The caller guarantees nobody else touches the slot meanwhile.
fn load_one(sh: &Shared, reader: &mut File, path: &Path, unit: usize, slot: usize, done: impl FnOnce(&mut State)) -> bool {
    let span = sh.spans[unit];
    let t0 = Instant::now();
    // SAFETY: see the callers; `span.len <= slot length` (slots hold the largest span).
    let buf = unsafe { std::slice::from_raw_parts_mut(sh.slots[slot].ptr, span.len) };
    let r = read_span(reader, path, span, buf);
    let dt = t0.elapsed().as_secs_f64();
    let mut st = sh.lock();
    let ok = match r {
        Ok(direct) => {
            done(&mut st);
            st.bytes_read += span.need as u64;
            st.read_secs += dt;
            st.units_loaded += 1;
            st.direct &= direct;
            true
        }
        Err(e) => {
            st.error = Some(format!("{}: unit {unit}: {e}", path.display()));
            false
        }
    };
    sh.cv.notify_all();
    ok
}

/// A reader for the loader: `O_DIRECT` where `mode` asks for it and the file system
/// allows it, else buffered; and whether it is direct.
pub(crate) fn open_reader(path: &Path, mode: ReadMode) -> Result<(File, bool), String> {
    let reader = match mode {
        ReadMode::Direct => std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok().filter(direct_reads_work),
        ReadMode::Buffered => None,
    };
    match reader {
        Some(f) => Ok((f, true)),
        None => Ok((File::open(path).map_err(|e| e.to_string())?, false)),
    }
}

/// Whether an `O_DIRECT` read works on this file (tmpfs and some FUSE file systems
/// accept the flag at open and reject the reads).
fn direct_reads_work(f: &File) -> bool {
    match SlotBuf::new(IO_ALIGN) {
        // SAFETY: the buffer is ours and IO_ALIGN bytes long.
        Ok(b) => f.read_at(unsafe { std::slice::from_raw_parts_mut(b.ptr, IO_ALIGN) }, 0).is_ok(),
        Err(_) => false,
    }
}

/// Read `span` into `buf` (its `len` bytes). Switches `reader` to buffered I/O if the
/// file system rejects `O_DIRECT` reads (`EINVAL`). Returns whether the read was direct.
pub(crate) fn read_span(reader: &mut File, path: &Path, span: Span, buf: &mut [u8]) -> Result<bool, String> {
    let mut done = 0;
    let mut direct = is_direct(reader);
    while done < span.need {
        let want = CHUNK.min(span.len - done);
        match reader.read_at(&mut buf[done..done + want], span.start + done as u64) {
            Ok(0) => {
                let size = reader.metadata().map(|m| m.len().to_string()).unwrap_or_else(|_| "?".into());
                return Err(format!(
                    "the file is now {size} bytes but the unit needs bytes up to {} (truncated since it was opened?)",
                    span.start + span.need as u64
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                *reader = File::open(path).map_err(|e| e.to_string())?;
                direct = false;
            }
            Err(e) => return Err(format!("read error at byte {}: {e}", span.start + done as u64)),
        }
    }
    Ok(direct)
}

fn is_direct(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL on an open descriptor has no side effects.
    let fl = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_DIRECT != 0
}

impl LayerSource for Window {
    fn acquire(&mut self, u: usize) -> Result<Unit<'_>, ModelError> {
        let sh = &*self.shared;
        let n = sh.spans.len();
        let seq = self.next;
        let slot = if u < sh.pinned {
            u
        } else {
            let want = sh.pinned + (seq % sh.streamed()) as usize;
            if u >= n || u != want {
                return Err(ModelError::Weights(format!("unit {u} asked for out of order (expected {want})")));
            }
            sh.pinned + (seq % sh.ring()) as usize
        };
        let ready = |st: &State| if u < sh.pinned { st.pinned_loaded > u } else { st.loaded > seq };
        let t0 = Instant::now();
        {
            let mut st = sh.lock();
            if u >= sh.pinned && st.requested <= seq {
                st.requested = seq + 1;
                sh.cv.notify_all();
            }
            while !ready(&st) && st.error.is_none() {
                st = sh.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if !ready(&st) {
                return Err(ModelError::Weights(st.error.clone().unwrap_or_default()));
            }
        }
        self.wait_secs += t0.elapsed().as_secs_f64();
        let span = sh.spans[u];
        // SAFETY: the loader published this unit in this slot and will not write the slot
        // again until we release it (pinned slots: never).
        let bytes = unsafe { std::slice::from_raw_parts(sh.slots[slot].ptr.add(span.skip), span.need - span.skip) };
        Ok(Unit { bytes, base: span.start as usize + span.skip })
    }

    fn release(&mut self, u: usize) {
        if u < self.shared.pinned {
            return;
        }
        self.next += 1;
        let mut st = self.shared.lock();
        st.released = self.next;
        self.shared.cv.notify_all();
    }

    fn read_at(&mut self, offset: u64, dst: &mut [u8]) -> Result<(), ModelError> {
        self.file.read_exact_at(dst, offset).map_err(|e| {
            ModelError::Weights(format!(
                "{}: reading {} bytes at {offset}: {e} (truncated since it was opened?)",
                self.path.display(),
                dst.len()
            ))
        })
    }

    fn stats(&self) -> SourceStats {
        let st = self.shared.lock();
        SourceStats { bytes_read: st.bytes_read, read_secs: st.read_secs, wait_secs: self.wait_secs, units_loaded: st.units_loaded, ..SourceStats::default() }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(h) = self.loader.take() {
            let _ = h.join();
        }
    }
}

/// Sequential read bandwidth of `path` in GB/s: up to `max_bytes` from its start, read
/// as the window reads (`O_DIRECT` where possible, 16 MiB requests). Drop the file from
/// the page cache first ([`drop_page_cache`]) for a cold-disk figure.
pub fn measure_read_gbps(path: &Path, max_bytes: usize) -> std::io::Result<f64> {
    let len = std::fs::metadata(path)?.len() as usize;
    let n = max_bytes.min(len) / IO_ALIGN * IO_ALIGN;
    if n == 0 {
        return Ok(0.0);
    }
    let buf = SlotBuf::new(CHUNK.min(n)).map_err(std::io::Error::other)?;
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).or_else(|_| File::open(path))?;
    let t0 = Instant::now();
    let mut done = 0;
    while done < n {
        let want = CHUNK.min(n - done);
        let span = Span { start: done as u64, need: want, len: want, skip: 0 };
        // SAFETY: `buf` is ours alone and at least CHUNK.min(n) >= want bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.ptr, want) };
        read_span(&mut reader, path, span, b).map_err(std::io::Error::other)?;
        done += want;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e9)
}

/// Drop `path`'s pages from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`), so
/// the next reads come from the disk: `--cold`. Pages mapped by a running process stay.
pub fn drop_page_cache(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}
