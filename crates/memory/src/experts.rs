//! The expert cache: a mixture-of-experts model under a memory budget keeps *experts*,
//! not whole layers.
//!
//! A token uses `n_expert_used` of a layer's `n_expert` experts (8 of 128 for a
//! Qwen3-30B-A3B shape: 21 MB of a 340 MB layer at Q4_0), so a sliding window of whole
//! layers ([`crate::Window`]) reads 16× more than the token needs. [`ExpertCache`] holds
//! a fixed number of *slots* instead, one slot being one expert of one layer: its gate, up
//! and down rows (three file ranges, each aligned to `IO_ALIGN` for `O_DIRECT`, one after the other in
//! the slot). The forward pass asks for a layer's chosen experts once its router has run
//! ([`ExpertSource::load`]); the missing ones are read as one batch (`pread`, `O_DIRECT`
//! where allowed, as the window reads) into the least recently used slots, the others are
//! *hits*. Weight memory is exactly `slots × slot_bytes`.
//!
//! Eviction is least recently used: consecutive tokens route to overlapping experts (the
//! hit rate comes from that reuse), and a slot last used many layers and tokens ago is
//! the one least likely to be asked for next; every expert has the same size within a
//! layer, so no size weighting is needed.
//!
//! Read-ahead ([`ExpertSource::prefetch`]): the forward pass guesses the next layer's
//! experts before it gets there (its router applied to the current hidden state), and a
//! reader thread with its own file handle reads the missing ones into slots reserved for
//! it (*busy*: no unit points into them and eviction skips them) while the layer between
//! computes. A prefetch only decides which slots get filled: `load` still reads whatever
//! it is asked for and does not hold, and waits for a busy slot's read to finish before
//! handing it out, so the bytes a load returns never depend on the guess.
//! `HEARTH_NO_EXPERT_PREFETCH=1` turns it off (the baseline).

use crate::window::{open_reader, read_span, ReadMode, SlotBuf, Span};
use hearth_model::{ExpertSource, ExpertStats, ModelError, Unit};
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// A read-ahead order: expert `key`'s three file ranges into slot `slot`, at `dst` (the
/// slot's address, as an integer so the job can cross to the reader thread).
struct Job {
    slot: usize,
    ranges: [Range<usize>; 3],
    dst: usize,
}

/// A finished read-ahead: its slot, and the read's error if it failed.
struct Done {
    slot: usize,
    result: Result<(), String>,
    secs: f64,
    bytes: u64,
}

/// The reader thread: reads each job's ranges into its slot, in order, with its own handle.
fn reader_thread(mut file: File, path: PathBuf, jobs: Receiver<Job>, done: Sender<Done>) {
    for j in jobs {
        let t0 = Instant::now();
        let mut at = j.dst;
        let mut result = Ok(());
        for range in &j.ranges {
            let span = Span::new(range);
            // SAFETY: the slot is busy (reserved by `ExpertCache::prefetch`): no unit points
            // into it and nothing else writes it until `Done` comes back; `span.len` stays
            // inside the slot; the cache joins this thread before freeing the buffer.
            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, span.len) };
            if let Err(why) = read_span(&mut file, &path, span, dst) {
                result = Err(why);
                break;
            }
            at += span.len;
        }
        let bytes = j.ranges.iter().map(|r| r.len() as u64).sum();
        if done.send(Done { slot: j.slot, result, secs: t0.elapsed().as_secs_f64(), bytes }).is_err() {
            break;
        }
    }
}

/// Slot bytes for one expert with these gate, up and down file ranges: each range
/// widened to [`crate::window::IO_ALIGN`] at both ends.
pub fn expert_slot_bytes(r: &[Range<usize>; 3]) -> usize {
    r.iter().map(|r| Span::new(r).len).sum()
}

/// A cache of expert slots over a GGUF file (see the module docs); plug it into a context
/// with `hearth_model::Context::set_expert_source`.
pub struct ExpertCache {
    /// `[layer][expert] = [gate, up, down]` file ranges (`hearth_model::expert_ranges`).
    ranges: Vec<Vec<[Range<usize>; 3]>>,
    /// `slots × slot_bytes`, page-aligned.
    buf: SlotBuf,
    slot_bytes: usize,
    /// The (layer, expert) each slot holds.
    owner: Vec<Option<(usize, usize)>>,
    /// Where each held (layer, expert) is.
    held: HashMap<(usize, usize), usize>,
    /// The `load` call that last used each slot (0: never): the eviction order.
    last_use: Vec<u64>,
    calls: u64,
    reader: File,
    path: PathBuf,
    direct: bool,
    stats: ExpertStats,
    /// `HEARTH_TEST_WRONG_EXPERT=1` (tests only): read expert `e + 1`'s bytes where `e`'s
    /// belong, so a test can show that wrong expert bytes change the tokens.
    wrong: bool,
    /// Slots the reader thread is filling, and the (layer, expert) each will hold.
    busy: Vec<Option<(usize, usize)>>,
    pending: HashMap<(usize, usize), usize>,
    /// Slots filled by read-ahead and not asked for yet (a first use is a prefetch hit).
    fresh: Vec<bool>,
    /// Orders to and results from the reader thread (None: read-ahead off).
    jobs: Option<Sender<Job>>,
    done: Option<Receiver<Done>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        // The reader writes into `buf`: stop it (no more jobs) and wait for it before the
        // buffer is freed (fields drop after this).
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// SAFETY: the buffer is only touched through `&mut self` (reads into it) or through the
// units `load` returns, which borrow `self`.
unsafe impl Send for ExpertCache {}

impl ExpertCache {
    /// A cache of `slots` experts of the file at `path`, whose experts lie at `ranges`
    /// (`[layer][expert] = [gate, up, down]`). Fails when the file cannot be opened or the
    /// slots cannot be allocated.
    pub fn open(path: &Path, ranges: Vec<Vec<[Range<usize>; 3]>>, slots: usize, mode: ReadMode) -> Result<Self, ModelError> {
        let err = |what: String| ModelError::Weights(format!("{}: {what}", path.display()));
        let slot_bytes = ranges.iter().flatten().map(expert_slot_bytes).max().unwrap_or(0);
        if slots == 0 || slot_bytes == 0 {
            return Err(err("an expert cache needs a model with experts and at least one slot".into()));
        }
        let total = slots.checked_mul(slot_bytes).ok_or_else(|| err("expert cache size overflows".into()))?;
        let buf = SlotBuf::new(total).map_err(err)?;
        let (reader, direct) = open_reader(path, mode).map_err(err)?;
        let off = std::env::var_os("HEARTH_NO_EXPERT_PREFETCH").is_some_and(|v| !v.is_empty() && v != "0");
        let (mut jobs, mut done, mut thread) = (None, None, None);
        if !off {
            let (file, _) = open_reader(path, mode).map_err(err)?;
            let (job_tx, job_rx) = channel();
            let (done_tx, done_rx) = channel();
            let p = path.to_path_buf();
            let t = std::thread::Builder::new()
                .name("hearth-experts".into())
                .spawn(move || reader_thread(file, p, job_rx, done_tx))
                .map_err(|e| err(format!("cannot start the expert reader thread: {e}")))?;
            (jobs, done, thread) = (Some(job_tx), Some(done_rx), Some(t));
        }
        Ok(Self {
            ranges,
            buf,
            slot_bytes,
            owner: vec![None; slots],
            held: HashMap::new(),
            last_use: vec![0; slots],
            calls: 0,
            reader,
            path: path.to_path_buf(),
            direct,
            stats: ExpertStats::default(),
            wrong: std::env::var_os("HEARTH_TEST_WRONG_EXPERT").is_some_and(|v| v == "1"),
            busy: vec![None; slots],
            pending: HashMap::new(),
            fresh: vec![false; slots],
            jobs,
            done,
            thread,
        })
    }

    /// Bytes of each slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Whether reads bypass the page cache (`O_DIRECT` was accepted).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The slot of (layer `il`, expert `e`), reading it into the least recently used slot
    /// not asked for in this call when it is not held.
    fn slot_of(&mut self, il: usize, e: usize) -> Result<usize, ModelError> {
        if let Some(&s) = self.pending.get(&(il, e)) {
            // Being read ahead: wait for it (the forward pass's wait, not the read's).
            let t0 = Instant::now();
            while self.busy[s].is_some() {
                let Some(d) = self.done.as_ref().and_then(|rx| rx.recv().ok()) else { break };
                self.finish(d);
            }
            self.stats.wait_secs += t0.elapsed().as_secs_f64();
        }
        if let Some(&s) = self.held.get(&(il, e)) {
            self.stats.hits += 1;
            if std::mem::take(&mut self.fresh[s]) {
                self.stats.prefetch_hits += 1;
            }
            self.last_use[s] = self.calls;
            return Ok(s);
        }
        let r = self.range_of(il, e)?;
        let s = loop {
            if let Some(s) = self.victim() {
                break s;
            }
            // Every slot this call may take is being read ahead (a small cache): wait for
            // one of those reads, then it can be evicted like any other.
            let t0 = Instant::now();
            let d = self.busy.iter().any(Option::is_some).then(|| self.done.as_ref().and_then(|rx| rx.recv().ok())).flatten();
            self.stats.wait_secs += t0.elapsed().as_secs_f64();
            match d {
                Some(d) => self.finish(d),
                None => return Err(ModelError::Weights("an expert cache was asked for more experts at once than it has slots".into())),
            }
        };
        if let Some(old) = self.owner[s].take() {
            self.held.remove(&old);
        }
        self.fresh[s] = false;
        let t0 = Instant::now();
        let mut at = s * self.slot_bytes;
        for range in &r {
            let span = Span::new(range);
            // SAFETY: `at + span.len` stays inside slot `s` (slot_bytes holds the largest
            // expert's aligned spans), and no unit of slot `s` is alive: units borrow
            // `self`, which this `&mut self` call excludes.
            let dst = unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.add(at), span.len) };
            self.direct &= read_span(&mut self.reader, &self.path, span, dst)
                .map_err(|why| ModelError::Weights(format!("{}: expert {e} of layer {il}: {why}", self.path.display())))?;
            self.stats.bytes_read += range.len() as u64;
            at += span.len;
        }
        self.stats.read_secs += t0.elapsed().as_secs_f64();
        self.stats.wait_secs += t0.elapsed().as_secs_f64();
        self.stats.misses += 1;
        self.owner[s] = Some((il, e));
        self.held.insert((il, e), s);
        self.last_use[s] = self.calls;
        Ok(s)
    }

    /// Expert `e` of layer `il`'s file ranges (the next expert's under the wrong-expert control).
    fn range_of(&self, il: usize, e: usize) -> Result<[Range<usize>; 3], ModelError> {
        let layer = self.ranges.get(il).filter(|l| e < l.len());
        let layer = layer.ok_or_else(|| ModelError::Weights(format!("expert {e} of layer {il} asked for: the file has no such expert")))?;
        Ok(layer[if self.wrong { (e + 1) % layer.len() } else { e }].clone())
    }

    /// The least recently used slot that this call has not used and no read-ahead is filling.
    fn victim(&self) -> Option<usize> {
        (0..self.owner.len()).filter(|&s| self.last_use[s] != self.calls && self.busy[s].is_none()).min_by_key(|&s| self.last_use[s])
    }

    /// A read-ahead came back: its slot holds its expert now (or nothing, if the read failed:
    /// a later `load` reads it again and reports the error then).
    fn finish(&mut self, d: Done) {
        let Some(key) = self.busy[d.slot].take() else { return };
        self.pending.remove(&key);
        self.stats.read_secs += d.secs;
        if d.result.is_ok() {
            self.owner[d.slot] = Some(key);
            self.held.insert(key, d.slot);
            self.fresh[d.slot] = true;
            self.stats.prefetched += 1;
            self.stats.bytes_read += d.bytes;
        }
    }

    /// The gate, up and down units of the expert in slot `s`.
    fn units(&self, s: usize, r: &[Range<usize>; 3]) -> [Unit<'_>; 3] {
        let mut at = s * self.slot_bytes;
        r.clone().map(|range| {
            let span = Span::new(&range);
            // SAFETY: inside slot `s`, written by `slot_of`; borrowed from `&self`.
            let bytes = unsafe { std::slice::from_raw_parts(self.buf.ptr.add(at + span.skip), range.len()) };
            at += span.len;
            Unit { bytes, base: range.start }
        })
    }
}

impl ExpertSource for ExpertCache {
    fn load(&mut self, il: usize, ids: &[usize]) -> Result<Vec<[Unit<'_>; 3]>, ModelError> {
        if ids.len() > self.owner.len() {
            return Err(ModelError::Weights(format!(
                "{} experts asked for at once from an expert cache of {} slots",
                ids.len(),
                self.owner.len()
            )));
        }
        self.calls += 1;
        let slots = ids.iter().map(|&e| self.slot_of(il, e)).collect::<Result<Vec<_>, _>>()?;
        Ok(ids.iter().zip(slots).map(|(&e, s)| self.units(s, &self.ranges[il][e])).collect())
    }

    fn slots(&self) -> usize {
        self.owner.len()
    }

    fn prefetch(&mut self, il: usize, ids: &[usize]) {
        let Some(tx) = self.jobs.clone() else { return };
        while let Some(d) = self.done.as_ref().and_then(|rx| rx.try_recv().ok()) {
            self.finish(d);
        }
        for &e in ids {
            if self.held.contains_key(&(il, e)) || self.pending.contains_key(&(il, e)) {
                continue;
            }
            let (Ok(ranges), Some(s)) = (self.range_of(il, e), self.victim()) else { return };
            if let Some(old) = self.owner[s].take() {
                self.held.remove(&old);
            }
            self.fresh[s] = false;
            // As recent as the current call's experts: the rest of this guess must not
            // evict it, and the layer that just ran keeps its own.
            self.last_use[s] = self.calls;
            self.busy[s] = Some((il, e));
            self.pending.insert((il, e), s);
            // SAFETY: slot `s` lies inside the buffer; only its address travels.
            let dst = unsafe { self.buf.ptr.add(s * self.slot_bytes) } as usize;
            if tx.send(Job { slot: s, ranges, dst }).is_err() {
                self.busy[s] = None;
                self.pending.remove(&(il, e));
                return;
            }
        }
    }

    fn stats(&self) -> ExpertStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file of 2 layers × 4 experts, each gate/up/down range filled with its own byte,
    /// at unaligned offsets: the cache must hand each expert id its own bytes, through
    /// hits, misses and evictions.
    #[test]
    fn each_expert_id_gets_its_own_bytes_through_evictions() {
        let path = std::env::temp_dir().join(format!("hearth-expert-cache-{}.bin", std::process::id()));
        let (n_layer, n_expert, len) = (2usize, 4usize, 5000usize);
        let mut data = vec![0u8; 100];
        let mut ranges = vec![vec![[0..0, 0..0, 0..0]; n_expert]; n_layer];
        for (il, layer) in ranges.iter_mut().enumerate() {
            for (e, r) in layer.iter_mut().enumerate() {
                for (m, slot) in r.iter_mut().enumerate() {
                    let start = data.len();
                    data.extend(std::iter::repeat_n((il * 16 + e * 4 + m) as u8 + 1, len));
                    *slot = start..start + len;
                }
            }
        }
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let mut c = ExpertCache::open(&path, ranges, 3, ReadMode::Direct).unwrap();
        let check = |units: &[[Unit<'_>; 3]], il: usize, ids: &[usize]| {
            for (u, &e) in units.iter().zip(ids) {
                for (m, u) in u.iter().enumerate() {
                    let want = (il * 16 + e * 4 + m) as u8 + 1;
                    assert!(u.bytes.len() == len && u.bytes.iter().all(|&b| b == want), "layer {il} expert {e} matrix {m}");
                    assert_eq!(u.base, 100 + ((il * n_expert + e) * 3 + m) * len);
                }
            }
        };
        for (il, ids) in [(0, vec![1, 2]), (1, vec![2, 3]), (0, vec![1, 3]), (0, vec![2, 1, 0]), (1, vec![3])] {
            let u = c.load(il, &ids).unwrap();
            check(&u, il, &ids);
        }
        // (0,1),(0,2) miss; (1,2),(1,3): one evicts the oldest; (0,1) hit, (0,3) miss; ...
        let s = c.stats();
        assert!(s.hits > 0 && s.misses > 0 && s.hits + s.misses == 10, "{s:?}");
        assert_eq!(s.bytes_read, s.misses * 3 * len as u64);
        assert!(c.load(0, &[0, 1, 2, 3]).is_err(), "more experts than slots");
        assert!(c.load(0, &[9]).is_err(), "no such expert");
        // Read-ahead into every slot the next load could take: that load waits for a read
        // to finish and evicts it, rather than failing for want of slots.
        // Fresh cache of 3 slots: (0,0) takes one; the read-ahead reserves the other two;
        // (1,3) evicts (0,0); (1,0) then finds every other slot busy and must wait.
        let mut c = ExpertCache::open(&path, c.ranges.clone(), 3, ReadMode::Direct).unwrap();
        check(&c.load(0, &[0]).unwrap(), 0, &[0]);
        c.prefetch(1, &[1, 2]);
        check(&c.load(1, &[3, 0]).unwrap(), 1, &[3, 0]);
        check(&c.load(1, &[1, 2]).unwrap(), 1, &[1, 2]);
        if c.jobs.is_some() {
            // (1,0) evicted one of the two read ahead: the other is the one prefetch hit.
            let s = c.stats();
            assert!(s.prefetched == 2 && s.prefetch_hits == 1, "{s:?}");
        }
        std::fs::remove_file(&path).unwrap();
    }
}
