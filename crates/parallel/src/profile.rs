//! What a device can do, as measured by `hearth profile` (issue #7): the input of the
//! layer-assignment solver. Plain data with serde, so profiles can be cached on disk
//! and sent between nodes.
//!
//! Units are in the field names: bytes, GB/s (10⁹ bytes per second), GFLOP/s, ms, Mbit/s.

use serde::{Deserialize, Serialize};

/// One device's measured capabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct DeviceProfile {
    /// A name for reports (host name, or the worker's address).
    pub name: String,
    /// Logical CPUs this process may use.
    pub cores: usize,
    /// The SIMD level the kernels run at (`avx512`, `avx2`, `scalar`).
    pub simd: String,
    /// Total RAM, bytes (`MemTotal`).
    pub ram_total_bytes: u64,
    /// RAM available without swapping, bytes (`MemAvailable`, or the cgroup limit minus usage when lower).
    pub ram_available_bytes: u64,
    /// Swap, bytes (`SwapTotal`).
    pub swap_total_bytes: u64,
    /// Memory read bandwidth with all `cores`, GB/s.
    pub mem_read_gbps: f64,
    /// Sequential read of the model's filesystem, page cache bypassed, GB/s.
    pub disk_seq_read_gbps: f64,
    /// Random 4 KiB-aligned reads of 1 MiB on the same filesystem, page cache bypassed, GB/s.
    pub disk_rand_read_gbps: f64,
    /// Matmul throughput per weight type and thread count.
    pub matmul: Vec<MatmulRate>,
    /// Links to peers (empty without `--peer`).
    pub links: Vec<LinkProfile>,
}

/// hearth's own kernels on one weight type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MatmulRate {
    /// GGML type name (`q4_0`, `q4_k`, `f16`, …).
    pub ty: String,
    /// Threads.
    pub threads: usize,
    /// Matrix-vector (decode): weight bytes streamed per second, GB/s.
    pub decode_gbps: f64,
    /// Matrix-matrix over a batch (prefill), GFLOP/s (2 flops per weight per token).
    pub prefill_gflops: f64,
}

/// A measured link to a peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LinkProfile {
    /// The peer (`HOST:PORT`).
    pub peer: String,
    /// Median round-trip time of a small message, ms.
    pub rtt_ms: f64,
    /// Throughput of a bulk transfer, Mbit/s.
    pub mbit: f64,
}

impl DeviceProfile {
    /// The matmul rate for `ty` at the most threads measured, if any.
    pub fn rate(&self, ty: &str) -> Option<&MatmulRate> {
        self.matmul.iter().filter(|m| m.ty == ty).max_by_key(|m| m.threads)
    }
}
