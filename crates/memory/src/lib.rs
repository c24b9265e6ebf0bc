//! Memory accounting.
//!
//! [`ProcMemory::read`] samples this process's memory from `/proc/self/status` (Linux):
//! peak and current resident set, split into file-backed pages (the memory-mapped GGUF
//! weights actually resident) and anonymous pages (KV cache, scratch buffers, per-thread
//! state, the tokenizer). Quantized weights mapped from the file show up as `rss_file`,
//! never as anonymous memory: a dequantized copy would appear as anonymous growth.
//! Field meanings: proc(5), `/proc/[pid]/status`.
//!
//! [`plan`] predicts a run's peak RSS and decode speed bound from GGUF metadata or a
//! named shape ([`ModelSummary`], [`Plan`]); [`available_bytes`] reads how much memory
//! this machine (and its cgroup) can give. [`CountingAlloc`] counts the heap bytes hearth
//! itself asks for ([`heap_stats`]). See docs/MEMORY.md for each term's source.
#![deny(missing_docs)]

pub mod alloc;
pub mod experts;
pub mod pages;
pub mod plan;
pub mod window;
pub use alloc::{heap_stats, CountingAlloc, HeapStats};
pub use plan::{available_bytes, plan_experts, plan_window, preset, ModelShape, ModelSummary, Plan, PlanParams, StaysMapped, TensorSummary, WindowPlan};
pub use experts::ExpertCache;
pub use pages::MappedPages;
pub use window::{drop_page_cache, ReadMode, Window};

use serde::Serialize;

/// One sample of the process's memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProcMemory {
    /// Peak resident set size (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// Current resident set size (`VmRSS`).
    pub rss_bytes: u64,
    /// Resident anonymous memory (`RssAnon`): heap, stacks, KV cache, scratch.
    pub rss_anon_bytes: u64,
    /// Resident file-backed memory (`RssFile`): mapped weights and the binary itself.
    pub rss_file_bytes: u64,
    /// Resident shared memory (`RssShmem`).
    pub rss_shmem_bytes: u64,
}

impl ProcMemory {
    /// Sample `/proc/self/status`; `None` where it is unavailable (non-Linux).
    pub fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/self/status").ok()?)
    }

    /// Parse the text of a `/proc/[pid]/status` file (values are in kB).
    pub fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(':'))?;
            let kb: u64 = line[name.len() + 1..].split_whitespace().next()?.parse().ok()?;
            Some(kb * 1024)
        };
        Some(Self {
            peak_rss_bytes: field("VmHWM")?,
            rss_bytes: field("VmRSS")?,
            rss_anon_bytes: field("RssAnon").unwrap_or(0),
            rss_file_bytes: field("RssFile").unwrap_or(0),
            rss_shmem_bytes: field("RssShmem").unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let s = "Name:\thearth\nVmHWM:\t  134656 kB\nVmRSS:\t  120000 kB\nRssAnon:\t   30000 kB\nRssFile:\t   90000 kB\nRssShmem:\t       0 kB\n";
        let m = ProcMemory::parse(s).unwrap();
        assert_eq!(m.peak_rss_bytes, 134656 * 1024);
        assert_eq!(m.rss_anon_bytes + m.rss_file_bytes, 120000 * 1024);
        assert!(ProcMemory::parse("Name:\tx\n").is_none());
    }

    #[test]
    fn reads_this_process() {
        if let Some(m) = ProcMemory::read() {
            assert!(m.peak_rss_bytes >= m.rss_bytes && m.rss_bytes > 0);
        }
    }
}
