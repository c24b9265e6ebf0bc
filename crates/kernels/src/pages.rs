//! Asking the kernel for 2 MiB pages under a buffer that kernels will stream.

/// Ask the kernel to back `buf`'s allocation (its whole capacity, filled or not) with
/// 2 MiB pages (`madvise(MADV_HUGEPAGE)` on its 2 MiB-aligned part), before it is first
/// touched. Best effort: a kernel without THP, or a system other than Linux, keeps 4 KiB
/// pages.
///
/// Why: a large model's mapped weights sit mostly in 2 MiB page-cache folios (ext4 and XFS
/// give large folios; on the Zen 4 host 2.3-3.5 of a 7B file's 3.7 GB were PMD-mapped
/// during decode), so decode walks few page tables. A buffer of 4 KiB pages (what `malloc`
/// gives when THP is in `madvise` mode, the common default) measures the page walks too:
/// `hearth bench --membw` read 25.7 GB/s with one thread there against 32.5 with this
/// advice (docs/BENCHMARKS.md, session 28), and the kernel bench `matvec_dram` 22-24% less
/// than with it (session 42).
pub fn advise_huge_pages<T>(buf: &mut Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.as_mut_ptr() as usize;
        let a = start.next_multiple_of(HUGE);
        let end = (start + buf.capacity() * std::mem::size_of::<T>()) & !(HUGE - 1);
        if end > a {
            // SAFETY: [a, end) lies inside the allocation; the advice changes how pages
            // are backed, never their contents.
            unsafe { libc::madvise(a as *mut libc::c_void, end - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
