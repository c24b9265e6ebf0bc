//! The KV cache: per layer, keys and values of every past position, in f16.
//!
//! Layout per layer: `k, v: [n_ctx, n_head_kv * head_dim]` (row = one position), the
//! non-transposed V layout llama.cpp uses with flash attention. Size in bytes:
//! `2 (K and V) · n_layer · n_ctx · n_head_kv · head_dim · 2 (bytes per f16)`
//! (11.25 MiB for SmolLM2-135M at n_ctx = 512, as llama.cpp reports).

use half::f16;

/// Keys and values of past positions for every layer.
pub struct KvCache {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    n_ctx: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Allocate a zeroed cache for `n_ctx` positions.
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize) -> Self {
        let alloc = || (0..n_layer).map(|_| vec![f16::ZERO; n_ctx * kv_dim]).collect();
        Self { k: alloc(), v: alloc(), n_ctx, kv_dim }
    }

    /// Positions the cache can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        Self::bytes_for(self.k.len(), self.n_ctx, self.kv_dim)
    }

    /// Bytes a cache of this shape takes: `2 · n_layer · n_ctx · kv_dim · 2` (f16 K and V).
    pub fn bytes_for(n_layer: usize, n_ctx: usize, kv_dim: usize) -> usize {
        2 * n_layer * n_ctx * kv_dim * std::mem::size_of::<f16>()
    }

    /// Store rows `k, v: [n, kv_dim]` at positions `pos0..pos0+n` of `layer`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let range = pos0 * self.kv_dim..pos0 * self.kv_dim + k.len();
        for (d, &s) in self.k[layer][range.clone()].iter_mut().zip(k) {
            *d = f16::from_f32(s);
        }
        for (d, &s) in self.v[layer][range].iter_mut().zip(v) {
            *d = f16::from_f32(s);
        }
    }

    /// Keys and values of `layer`, `[n_ctx, kv_dim]` each.
    pub fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        (&self.k[layer], &self.v[layer])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn smollm2_cache_is_11_25_mib_at_512() {
        // llama.cpp reports 11.25 MiB for SmolLM2-135M (30 layers, 3 KV heads × 64) at n_ctx 512.
        assert_eq!(super::KvCache::bytes_for(30, 512, 192), 11_796_480);
    }
}
