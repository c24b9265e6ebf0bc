//! Memory read bandwidth, STREAM-style: every thread sums its own slice of a buffer far
//! larger than the last-level cache; the best of several passes is reported.
//!
//! Why a read-only sum: decode streams weights and writes almost nothing, so the read
//! bandwidth is the roofline it runs against. The sum is passed through `black_box` so
//! the loads cannot be elided; AVX2 loads (256-bit, four independent accumulators) or on
//! aarch64 NEON pair loads (`ldp q, q`: 256 bits, four accumulators) keep enough loads in
//! flight to saturate a core, with a portable `u64` loop as fallback.

use hearth_kernels::ThreadPool;
use std::hint::black_box;
use std::time::Instant;

/// Passes per thread count; the fastest is kept (the least disturbed by other load).
pub const PASSES: usize = 7;

/// Sum of `x` as wrapping u64 lanes, with the widest loads this CPU has.
fn sum(x: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        return unsafe { sum_avx2(x) };
    }
    // SAFETY: Advanced SIMD is baseline on aarch64.
    #[cfg(target_arch = "aarch64")]
    return unsafe { sum_neon(x) };
    #[cfg(not(target_arch = "aarch64"))]
    sum_scalar(x)
}

/// The portable twin of [`sum_avx2`]: eight independent accumulators.
fn sum_scalar(x: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = x.chunks_exact(8);
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(x: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let n = x.len() / 16 * 16;
    let p = x.as_ptr() as *const __m256i;
    let (mut a0, mut a1, mut a2, mut a3) =
        (_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256());
    let mut i = 0;
    while i < n / 4 {
        // SAFETY: i + 3 < n / 4 vectors of 4 u64 lie inside `x`; loads are unaligned-safe.
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(p.add(i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(p.add(i + 1)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(p.add(i + 2)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(p.add(i + 3)));
        i += 4;
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, s);
    lanes.iter().fold(sum_scalar(&x[n..]), |a, &b| a.wrapping_add(b))
}

/// The aarch64 twin of [`sum_avx2`].
#[cfg(target_arch = "aarch64")]
unsafe fn sum_neon(x: &[u64]) -> u64 {
    use std::arch::aarch64::*;
    let n = x.len() / 8 * 8;
    let p = x.as_ptr();
    let (mut a0, mut a1, mut a2, mut a3) = (vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n elements lie inside `x`; NEON loads need no alignment.
        a0 = vaddq_u64(a0, vld1q_u64(p.add(i)));
        a1 = vaddq_u64(a1, vld1q_u64(p.add(i + 2)));
        a2 = vaddq_u64(a2, vld1q_u64(p.add(i + 4)));
        a3 = vaddq_u64(a3, vld1q_u64(p.add(i + 6)));
        i += 8;
    }
    let s = vaddq_u64(vaddq_u64(a0, a1), vaddq_u64(a2, a3));
    sum_scalar(&x[n..]).wrapping_add(vgetq_lane_u64::<0>(s)).wrapping_add(vgetq_lane_u64::<1>(s))
}

/// Lets pool threads fill disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct SyncPtr(*mut u64);
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The pointer; a method so closures capture the whole `Sync` wrapper, not the field.
    fn get(self) -> *mut u64 {
        self.0
    }
}

/// Read bandwidth in GB/s (10⁹ bytes/s) with `threads` threads over a `bytes`-byte buffer,
/// best of `passes`.
pub fn measure(threads: usize, bytes: usize, passes: usize) -> f64 {
    let n = (bytes / 8).max(1024);
    let pool = ThreadPool::new(threads);
    let mut buf: Vec<u64> = Vec::with_capacity(n);
    // In 2 MiB pages, as most of a mapped model is (see `advise_huge_pages`).
    hearth_kernels::pages::advise_huge_pages(&mut buf);
    let ptr = SyncPtr(buf.as_mut_ptr());
    let share = |tid: usize, nth: usize| (n * tid / nth, n * (tid + 1) / nth);
    // First touch by the thread that will read it (page placement on NUMA machines).
    pool.run(|tid, nth| {
        let (a, b) = share(tid, nth);
        for i in a..b {
            // SAFETY: the ranges of different threads are disjoint and inside the capacity.
            unsafe { ptr.get().add(i).write(i as u64 | 1) };
        }
    });
    // SAFETY: every element 0..n was initialised above.
    unsafe { buf.set_len(n) };
    let buf = &buf;
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let t0 = Instant::now();
        pool.run(|tid, nth| {
            let (a, b) = share(tid, nth);
            black_box(sum(black_box(&buf[a..b])));
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (n * 8) as f64 / best / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_scalar_sums_agree() {
        let x: Vec<u64> = (0..1003u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let want = x.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        assert_eq!(sum_scalar(&x), want);
        assert_eq!(sum(&x), want);
    }

    #[test]
    fn measures_a_positive_bandwidth() {
        assert!(measure(1, 8 << 20, 2) > 0.0);
    }
}
