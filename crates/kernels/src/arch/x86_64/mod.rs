//! x86-64 kernels: AVX2+FMA+F16C, the same with AVX-VNNI, and AVX-512
//! (F+BW+VL, VNNI when present).
//!
//! All kernels share one skeleton ([`tile`]): a tile of R weight rows × T
//! tokens keeps R×T vector accumulators; each weight block is loaded (and
//! unpacked) once per tile and used for T tokens, each activation block once
//! and used for R rows. The per-(row, token) arithmetic is the same sequence
//! of instructions whatever the tile shape, so results do not depend on how
//! rows are split among threads or which tokens share a batch. Some AVX-512
//! kernels hold two rows per vector (a unit of `Fmt::ROWS` rows): lanes never
//! mix, so a row's arithmetic is the same in either half, or alone. Q4_0
//! (and Q8_0 with VNNI) go further ([`avx2_rows`], [`avx512_rows`]): one row
//! per lane, 8 or 16 rows transposed in registers, in llama.cpp's repacked
//! kernels' float order rather than its plain `ggml_vec_dot` one.

use crate::dispatch::{Kernels, Panel, SimdLevel};
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};

mod avx2;
mod avx2_k;
mod avx2_k_low;
mod avx2_q8;
mod avx2_rows;
mod avx512;
mod avx512_pair;
mod avx512_q4k;
pub(crate) mod avx512_rows;
mod avxvnni;
mod int_dot;
mod rows;
mod tile;

/// How far ahead of the rows being multiplied the kernels prefetch the
/// matrix into L2: about this many bytes of weights, in whole units (a tile's
/// or a row group's rows), at least [`MIN_UNITS_AHEAD`] and at most
/// [`MAX_UNITS_AHEAD`] units.
///
/// Why: one unit ahead (the rule until session 14) kept too little in flight
/// on an AMD EPYC (Zen 4) host whose memory answers later than the Intel host
/// it was tuned on: at the avx2 level, 1 thread, SmolLM2 Q8_0 decode ran
/// 80-88 tok/s one tile (2.4 KiB) ahead and 111-131 four tiles ahead; the
/// 7B Q4_0 4.6 tok/s one group (18 KiB) ahead and 5.5-5.7 two groups ahead;
/// the 1B 20-22 tok/s one group ahead, 23-27 four ahead (docs/BENCHMARKS.md).
/// More than four short units ahead lost again (the first units of every
/// matrix come unprefetched, and SmolLM2's matrices are only 0.3-1 MiB).
const PREFETCH_AHEAD: usize = 32 << 10;
const MIN_UNITS_AHEAD: usize = 2;
const MAX_UNITS_AHEAD: usize = 4;

/// The first byte of the `unit` rows [`PREFETCH_AHEAD`] past row `r` of the
/// panel, for a 256-bit kernel to prefetch while it works on rows
/// `r..r + unit` (see [`prefetch_units_ahead`]).
#[inline(always)]
fn prefetch_rows(p: &Panel<'_>, r: usize, unit: usize) -> *const u8 {
    let ahead = PREFETCH_AHEAD.div_ceil((unit * p.row_stride).max(1)).clamp(MIN_UNITS_AHEAD, MAX_UNITS_AHEAD);
    prefetch_units_ahead(p, r, unit, ahead)
}

/// The first byte of the `unit` rows `ahead` units past row `r` of the
/// panel; null when those rows run past the matrix's end (`p.w` runs to
/// it), where a prefetch would only bring in bytes of another tensor.
///
/// Ahead of the panel's own end is still the right place: clamping the
/// prefetch to the panel (threads take the panels in turn) lost 8-20% of
/// SmolLM2 Q8_0 decode at both 1 and 2 threads (panels then start cold).
#[inline(always)]
fn prefetch_units_ahead(p: &Panel<'_>, r: usize, unit: usize, ahead: usize) -> *const u8 {
    let start = (r + ahead * unit) * p.row_stride;
    if start + unit * p.row_stride <= p.w.len() {
        p.w.as_ptr().wrapping_add(start)
    } else {
        std::ptr::null()
    }
}

/// Step `b` of a row group's prefetch of a later group (`group`, from
/// [`prefetch_rows`] or [`prefetch_units_ahead`]; null: nothing): that
/// group's `step_bytes` bytes of block `b` (the group's rows are contiguous,
/// so the blocks of all its rows make one sequential stream, spread evenly
/// over the current group's blocks), into L2.
#[inline(always)]
unsafe fn prefetch_group_step(group: *const u8, b: usize, step_bytes: usize) {
    if group.is_null() {
        return;
    }
    let pf = group.wrapping_add(b * step_bytes);
    for l in (0..step_bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(l) as *const i8);
    }
}

/// How far ahead of their reads the grouped types' 8-row tiles (`avx2_rows`' Q4_0X8 and
/// Q4_KX8) also prefetch into L2 where [`far_prefetch`] says so.
const GROUPED_FAR_AHEAD: usize = PREFETCH_AHEAD;

/// Whether the grouped tiles add an L2 prefetch [`GROUPED_FAR_AHEAD`] bytes ahead to their
/// short L1 one: on AMD's cores, not Intel's.
///
/// Why by vendor: a group is one sequential stream per thread. On the Intel host the
/// layout was tuned on (sessions 43-45) the L1 prefetch alone was best; an L2 prefetch 8
/// or 16 KiB ahead besides lost 3-5%. On an AMD EPYC (Zen 4) host the same stream read
/// slower than the row types' 8 streams: 7B Q4_0X8 decode at 1 thread 5.6-6.4 tok/s at
/// the avx2 level against 6.7-8.0 with an L2 prefetch 18-36 KiB ahead (8 KiB: 7.1-7.7),
/// Q4_KX8 5.6-6.6 against 7.0-7.4 (`hearth bench -p 0 -n 16 -t 1`, alternated;
/// docs/BENCHMARKS.md session 47); at 2 threads both stay at the memory's limit. Zen 3
/// (not measured with it) takes it too: the row types' 32 KiB L2 prefetch
/// ([`PREFETCH_AHEAD`]), tuned on Zen 4, served it as well.
pub(crate) fn far_prefetch() -> bool {
    cpu_id().0
}

/// Whether AVX-512 runs in 256-bit halves (AMD family 0x19, Zen 4): the avx512 level then
/// decodes the grouped types with avx2's 8-row tile (the same bits).
///
/// Why: there the 16-row avx512 tile over two groups decoded the 7B Q4_0X8 at 4.8-6.1
/// tok/s (1 thread, with every L2 prefetch distance tried) where avx2's tile ran 6.7-8.0,
/// and Q4_KX8 4.1-7.4 against 7.0-7.4; its prefill stays faster (pp64 24.9 against 14.8
/// tok/s).
/// (Zen 3 shares the family and has no AVX-512.) Zen 5 (family 0x1a) has full-width
/// AVX-512 and is not measured: it keeps the avx512 tile.
pub(crate) fn split_avx512() -> bool {
    #[cfg(test)]
    if tests::FORCE_SPLIT_AVX512.load(std::sync::atomic::Ordering::Relaxed) {
        return true;
    }
    cpu_id() == (true, 0x19)
}

/// (vendor is AMD, family) from CPUID leaves 0 and 1, read once (the kernels ask per panel).
fn cpu_id() -> (bool, u32) {
    static ID: std::sync::OnceLock<(bool, u32)> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        // (Safe in this Rust: CPUID leaves 0 and 1 exist on every x86-64 CPU.)
        let (v, f) = (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1));
        let amd = (v.ebx, v.edx, v.ecx) == (u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"enti"), u32::from_le_bytes(*b"cAMD"));
        let base = (f.eax >> 8) & 0xf;
        let family = if base == 0xf { base + ((f.eax >> 20) & 0xff) } else { base };
        (amd, family)
    })
}

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

pub(crate) fn has_vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

pub(crate) fn kernels(level: SimdLevel) -> Option<&'static Kernels> {
    match level {
        SimdLevel::Scalar | SimdLevel::Neon | SimdLevel::NeonDot | SimdLevel::NeonI8mm => None,
        SimdLevel::Avx2 => has_avx2().then_some(&avx2::KERNELS),
        SimdLevel::AvxVnni => has_avx_vnni().then_some(&avxvnni::KERNELS),
        SimdLevel::Avx512 if has_vnni() => Some(&avx512::KERNELS_VNNI),
        SimdLevel::Avx512 => has_avx512().then_some(&avx512::KERNELS),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// Makes [`super::split_avx512`] true on any host, so its route is tested where the
    /// CPU would not take it (the route gives the same bits, so other tests running at
    /// the same time are unaffected).
    pub(crate) static FORCE_SPLIT_AVX512: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    #[test]
    fn cpu_id_reads_the_vendor() {
        let (amd, family) = super::cpu_id();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        if cpuinfo.contains("vendor_id") {
            assert_eq!(amd, cpuinfo.contains("AuthenticAMD"), "{family:#x}");
            let want = cpuinfo.lines().find(|l| l.starts_with("cpu family")).and_then(|l| l.split(':').nth(1)).and_then(|v| v.trim().parse::<u32>().ok());
            assert_eq!(Some(family), want);
        }
    }
}
