//! A persistent thread pool for data-parallel kernels.
//!
//! Design:
//! - Workers are created once and live as long as the pool; an op never
//!   spawns threads.
//! - [`ThreadPool::run`] publishes one closure to every worker by bumping an
//!   epoch counter; the caller runs share 0 itself and then waits. Between ops
//!   workers spin for [`SPIN`] (decode issues hundreds of matmuls per token
//!   with microsecond gaps, and a condvar wake-up costs tens of microseconds),
//!   then sleep on a condvar.
//! - Sleeping is announced through a counter before the final check, under the
//!   same mutex the waker takes, so a wake-up cannot be lost (see `wait_for`).
//! - A panic in any share is caught, the other shares still finish, and `run`
//!   re-panics in the caller: the pool stays usable and never deadlocks.
//! - A `run` from inside a running share (nesting) executes inline as a
//!   single share instead of deadlocking; concurrent `run`s from different
//!   threads take turns.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread spins before it sleeps.
pub const SPIN: Duration = Duration::from_micros(200);

type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

thread_local! {
    /// True on pool workers, and on a caller while it runs its share.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

struct Shared {
    n_threads: usize,
    /// Bumped once per `run` (and once at shutdown).
    epoch: AtomicU64,
    /// The current job; written only while no worker is running one.
    job: UnsafeCell<Option<*const Job<'static>>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The caller is asleep (or about to be) on `done`.
    caller_sleeping: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
}

// SAFETY: `job` is written by the caller only before it publishes an epoch and
// after every worker has finished the previous one (`remaining == 0`), and read
// by workers only between seeing that epoch and decrementing `remaining`; the
// SeqCst epoch bump / AcqRel decrement order these accesses. The pointee is
// `Sync`, and `run` does not return while a worker may still use it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fixed set of worker threads that run data-parallel closures.
///
/// ```
/// use hearth_kernels::ThreadPool;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let pool = ThreadPool::new(3);
/// let sum = AtomicUsize::new(0);
/// pool.run(|i, n| { assert_eq!(n, 3); sum.fetch_add(i + 1, Ordering::Relaxed); });
/// assert_eq!(sum.into_inner(), 6);
/// ```
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, the caller included (so
    /// `n_threads - 1` workers are spawned). `0` is treated as 1; with 1 every
    /// `run` executes inline without any synchronization.
    pub fn new(n_threads: usize) -> Self {
        Self::build(n_threads, Vec::new())
    }

    /// [`new`](Self::new) with thread `i` (the caller is thread 0) pinned to logical CPU
    /// `cpus[i % cpus.len()]` (see [`crate::affinity::pin_order`]). Pins the calling thread
    /// now; fails if the OS refuses (a CPU outside this process's cpuset).
    pub fn new_pinned(n_threads: usize, cpus: &[usize]) -> std::io::Result<Self> {
        let Some(&first) = cpus.first() else {
            return Err(std::io::Error::other("no CPUs to pin to"));
        };
        crate::affinity::pin_current_thread(first)?;
        Ok(Self::build(n_threads, cpus.to_vec()))
    }

    fn build(n_threads: usize, cpus: Vec<usize>) -> Self {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads: n,
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let workers = (1..n)
            .map(|idx| {
                let s = Arc::clone(&shared);
                let cpu = (!cpus.is_empty()).then(|| cpus[idx % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("hearth-worker-{idx}"))
                    .spawn(move || {
                        // Best effort: the caller's pin succeeded, so the set is allowed.
                        if let Some(c) = cpu {
                            let _ = crate::affinity::pin_current_thread(c);
                        }
                        worker(&s, idx)
                    })
                    .expect("failed to spawn a thread pool worker")
            })
            .collect();
        Self { shared, workers, run_lock: Mutex::new(()) }
    }

    /// Threads taking part in each [`run`](Self::run), the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f(thread_idx, n_threads)` once on every thread (the caller is
    /// thread 0) and return when all are done. If any share panicked, this
    /// panics after all shares have finished.
    ///
    /// Called from inside a share, it runs `f(0, 1)` inline.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 || IN_POOL.with(Cell::get) {
            return f(0, 1);
        }
        let _turn = lock(&self.run_lock);
        let s = &*self.shared;
        let job: &Job<'_> = &f;
        // SAFETY: erasing the lifetime is sound because this function does not
        // return (or unwind) before every worker has finished with `job`: the
        // wait below is unconditional and the caller's share is caught.
        let job: *const Job<'static> = unsafe { std::mem::transmute::<&Job<'_>, *const Job<'static>>(job) };
        // SAFETY: no worker reads `job` now (all finished the previous epoch).
        unsafe { *s.job.get() = Some(job) };
        s.panicked.store(false, Relaxed);
        s.remaining.store(n - 1, Relaxed);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = lock(&s.lock);
            s.wake.notify_all();
        }

        IN_POOL.with(|c| c.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        IN_POOL.with(|c| c.set(false));

        wait_for(|| s.remaining.load(SeqCst) == 0, &s.caller_sleeping, &s.done_lock, &s.done);
        // SAFETY: all workers are done with the job.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.load(Acquire) {
            panic!("a hearth thread pool worker panicked");
        }
    }
}

/// Elements below which [`ThreadPool::for_rows`] runs on the calling thread alone:
/// waking the pool costs a few microseconds, about what 16K elements of a norm take.
pub const FOR_ROWS_MIN: usize = 1 << 14;

impl ThreadPool {
    /// Run `f(part, first_row)` over `x` (`[rows, width]`) cut into one run of whole
    /// rows per thread, or over all of `x` on the calling thread when it has fewer than
    /// [`FOR_ROWS_MIN`] elements or the pool one thread.
    ///
    /// For row-wise and elementwise ops (norms, RoPE, activations, residual adds) in
    /// prefill, which otherwise run on one thread while the others wait. Every part
    /// starts at a multiple of 16 elements from `x`'s start, so an op whose SIMD loop
    /// handles 8 or 16 elements at a time and the rest in a scalar tail treats each
    /// element as it would over the whole of `x`: results do not depend on the thread
    /// count.
    pub fn for_rows<F: Fn(&mut [f32], usize) + Sync>(&self, x: &mut [f32], width: usize, f: F) {
        let n = self.n_threads();
        if n == 1 || width == 0 || x.len() < FOR_ROWS_MIN || IN_POOL.with(Cell::get) {
            return f(x, 0);
        }
        let rows = x.len() / width;
        // Rows per 16-element boundary: split points are multiples of this.
        let step = 16 / num_integer::gcd(width, 16);
        let cut = |i: usize| (rows * i / n) / step * step;
        let base = SendPtr(x.as_mut_ptr());
        let len = x.len();
        self.run(|i, n| {
            let (r0, r1) = (cut(i), if i + 1 == n { rows } else { cut(i + 1) });
            let end = if i + 1 == n { len } else { r1 * width };
            if r0 * width < end {
                // SAFETY: the parts [cut(i) * width, cut(i + 1) * width) are disjoint
                // (cut is non-decreasing) and within `x`, which outlives `run`.
                let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(r0 * width), end - r0 * width) };
                f(part, r0);
            }
        });
    }
}

/// A raw pointer that may cross threads; users guarantee disjoint access.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: only used to hand disjoint sub-slices of one `&mut` buffer to the
// pool's threads, which all finish before the borrow ends.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        {
            let _g = lock(&s.lock);
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("n_threads", &self.n_threads()).finish()
    }
}

/// Spin for [`SPIN`], then sleep on `cv` until `ready()`. `sleeping` is set
/// (SeqCst) before the last check under `m`; a waker that changes the state
/// and then sees `sleeping` takes `m` before notifying, so either the check
/// sees the change or the notify finds us waiting.
fn wait_for(ready: impl Fn() -> bool, sleeping: &AtomicBool, m: &Mutex<()>, cv: &Condvar) {
    let start = Instant::now();
    let mut i = 0u32;
    while !ready() {
        backoff(i);
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) && start.elapsed() > SPIN {
            sleeping.store(true, SeqCst);
            let mut g = lock(m);
            while !ready() {
                g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            drop(g);
            sleeping.store(false, SeqCst);
            return;
        }
    }
}

/// One step of a spin-wait: mostly `pause`, with an occasional `yield` so a
/// spinning thread gives its core back when there are more runnable threads
/// than cores (the thread it waits for may be the one that needs it).
#[inline]
fn backoff(i: u32) {
    if i % 256 == 255 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn worker(s: &Shared, idx: usize) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin, then sleep (counted in `sleepers`).
        let start = Instant::now();
        let mut i = 0u32;
        let epoch = loop {
            let e = s.epoch.load(SeqCst);
            if e != seen {
                break e;
            }
            backoff(i);
            i = i.wrapping_add(1);
            if i.is_multiple_of(64) && start.elapsed() > SPIN {
                s.sleepers.fetch_add(1, SeqCst);
                let mut g = lock(&s.lock);
                while s.epoch.load(SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                drop(g);
                s.sleepers.fetch_sub(1, SeqCst);
            }
        };
        seen = epoch;
        if s.shutdown.load(SeqCst) {
            return;
        }
        // SAFETY: the caller published `job` before this epoch and keeps it
        // alive until `remaining` reaches 0, which needs our decrement below.
        let job = unsafe { (*s.job.get()).expect("epoch without a job") };
        let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(idx, s.n_threads) }));
        if r.is_err() {
            s.panicked.store(true, Release);
        }
        if s.remaining.fetch_sub(1, SeqCst) == 1 && s.caller_sleeping.load(SeqCst) {
            let _g = lock(&s.done_lock);
            s.done.notify_all();
        }
    }
}

/// Physical cores available to this process: distinct (package, core) pairs
/// under `/sys/devices/system/cpu/cpu*/topology`, capped by
/// `available_parallelism` (affinity, cgroups). Falls back to
/// `available_parallelism` where sysfs is missing.
pub fn physical_cores() -> usize {
    let avail = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cores = std::collections::HashSet::new();
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in dir.flatten() {
            let name = e.file_name();
            let cpu = name.to_string_lossy().strip_prefix("cpu").and_then(|n| n.parse::<usize>().ok());
            if let Some(core) = cpu.and_then(crate::affinity::core_of) {
                cores.insert(core);
            }
        }
    }
    if cores.is_empty() {
        avail
    } else {
        cores.len().min(avail).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn pinned_threads_run_where_pinned() {
        let order = crate::affinity::pin_order();
        let n = order.len().min(4);
        std::thread::spawn(move || {
            let pool = ThreadPool::new_pinned(n, &order).unwrap();
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(usize::MAX)).collect();
            pool.run(|i, _| seen[i].store(crate::affinity::current_cpu().unwrap_or(usize::MAX - 1), SeqCst));
            for (i, s) in seen.iter().enumerate() {
                assert_eq!(s.load(SeqCst), order[i % order.len()], "thread {i}");
            }
        })
        .join()
        .unwrap();
        assert!(ThreadPool::new_pinned(2, &[]).is_err());
    }

    #[test]
    fn every_thread_runs_once_per_op() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
            }
        }
    }

    #[test]
    fn wakes_after_sleeping() {
        let pool = ThreadPool::new(3);
        for _ in 0..3 {
            std::thread::sleep(SPIN * 5);
            let c = AtomicUsize::new(0);
            pool.run(|_, _| {
                c.fetch_add(1, Relaxed);
            });
            assert_eq!(c.into_inner(), 3);
        }
    }

    #[test]
    fn worker_panic_reaches_caller_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(|i, _| assert_ne!(i, 0, "caller share"))));
        assert!(r.is_err());
        let c = AtomicUsize::new(0);
        pool.run(|_, _| {
            c.fetch_add(1, Relaxed);
        });
        assert_eq!(c.into_inner(), 2);
    }

    #[test]
    fn nested_run_is_inline() {
        let pool = ThreadPool::new(2);
        let c = AtomicUsize::new(0);
        pool.run(|_, _| {
            pool.run(|i, n| {
                assert_eq!((i, n), (0, 1));
                c.fetch_add(1, Relaxed);
            })
        });
        assert_eq!(c.into_inner(), 2);
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let pool = ThreadPool::new(2);
        let c = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        pool.run(|_, _| {
                            c.fetch_add(1, Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(c.into_inner(), 600);
    }

    #[test]
    fn physical_cores_is_sane() {
        let n = physical_cores();
        assert!(n >= 1 && n <= std::thread::available_parallelism().unwrap().get());
    }
}
