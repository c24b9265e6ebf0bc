//! The KV cache: per layer, keys and values of every past position, in the cache type
//! chosen at creation ([`CacheType`]: f32, f16 (default) or Q8_0, llama.cpp's
//! `-ctk` / `-ctv`, one type for both here).
//!
//! Layout per layer: `k, v: [n_ctx, kv_dim]` with `kv_dim = n_head_kv · head_dim` (row =
//! one position), the non-transposed V layout llama.cpp uses with flash attention. Size
//! in bytes, as llama.cpp's `llama_kv_cache` allocates it (`ggml_row_size(type, kv_dim) ·
//! n_ctx` per tensor, K and V per layer):
//! `2 · n_layer · n_ctx · row_bytes(kv_dim)`, with `row_bytes(n)` = `4n` (f32), `2n`
//! (f16), `34 · n / 32` (Q8_0: an f16 scale and 32 int8 per block, ggml-common.h
//! `block_q8_0`). SmolLM2-135M at n_ctx = 512: 22.5 / 11.25 / 5.98 MiB.

use half::f16;
use hearth_kernels::ops::KvRows;
use hearth_quant::GgmlType;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheType {
    /// 4 bytes per element.
    F32,
    /// 2 bytes per element (llama.cpp's default).
    #[default]
    F16,
    /// Blocks of 32 elements in 34 bytes (8.5 bits per element); needs `head_dim` a
    /// multiple of 32.
    Q8_0,
}

impl CacheType {
    /// Every type.
    pub const ALL: [CacheType; 3] = [CacheType::F32, CacheType::F16, CacheType::Q8_0];

    /// `f32`, `f16` or `q8_0` (llama.cpp's `-ctk` names).
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Q8_0 => "q8_0",
        }
    }

    /// Parse a [`name`](Self::name), case-insensitively.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The GGML type of the cache tensors.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            CacheType::F32 => GgmlType::F32,
            CacheType::F16 => GgmlType::F16,
            CacheType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of one cache row of `n` elements (`ggml_row_size`): `4n`, `2n` or
    /// `34 · n / 32`. For Q8_0 a partial block counts as a whole one (such shapes are
    /// rejected by [`check`](Self::check)).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            CacheType::F32 => 4 * n,
            CacheType::F16 => 2 * n,
            CacheType::Q8_0 => n.div_ceil(32) * 34,
        }
    }

    /// Whether heads of `head_dim` can be cached in this type: Q8_0 needs every head to
    /// be whole blocks of 32 (so `kv_dim` is too), as ggml's flash attention dots one head
    /// row of K at a time.
    pub fn check(self, head_dim: usize) -> Result<(), String> {
        if self == CacheType::Q8_0 && !head_dim.is_multiple_of(32) {
            return Err(format!(
                "cache type q8_0 needs head_dim (and kv_dim) to be a multiple of 32 (blocks of 32 elements); \
                 this model's head_dim is {head_dim}: use --cache-type f16 or f32"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for CacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One layer's K or V rows.
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<u8>),
}

/// A zeroed buffer whose pages are all resident (written), like llama.cpp's cleared
/// cache buffer: `vec![0; n]` of a primitive comes from `calloc`, whose pages only
/// become resident when first written, which would make RSS grow with the context
/// instead of matching the plan.
fn resident<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..n).step_by(step) {
        // SAFETY: `i < n = v.len()`; a volatile write cannot be elided, so the page faults in.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), T::default()) };
    }
    v
}

impl Rows {
    fn new(ty: CacheType, n_ctx: usize, kv_dim: usize) -> Self {
        match ty {
            CacheType::F32 => Rows::F32(resident(n_ctx * kv_dim)),
            CacheType::F16 => Rows::F16(vec![f16::ZERO; n_ctx * kv_dim]),
            CacheType::Q8_0 => Rows::Q8_0(resident(n_ctx * ty.row_bytes(kv_dim))),
        }
    }

    /// Store rows `src: [n, kv_dim]` at positions `pos0..`.
    fn store(&mut self, pos0: usize, kv_dim: usize, src: &[f32]) {
        match self {
            Rows::F32(d) => d[pos0 * kv_dim..pos0 * kv_dim + src.len()].copy_from_slice(src),
            Rows::F16(d) => {
                for (d, &s) in d[pos0 * kv_dim..pos0 * kv_dim + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
            Rows::Q8_0(d) => {
                // ggml stores into a quantized cache with the CPU type traits' `from_float`
                // (`ggml_compute_forward_set_rows_f32`), which on x86 is the SIMD
                // `quantize_row_q8_0` (id = 127/amax, round half to even), not `_ref`.
                let rb = CacheType::Q8_0.row_bytes(kv_dim);
                for (t, row) in src.chunks_exact(kv_dim).enumerate() {
                    let at = (pos0 + t) * rb;
                    hearth_quant::q8::quantize_row_q8_0_act(row, &mut d[at..at + rb]);
                }
            }
        }
    }

    fn view(&self) -> KvRows<'_> {
        match self {
            Rows::F32(d) => KvRows::F32(d),
            Rows::F16(d) => KvRows::F16(d),
            Rows::Q8_0(d) => KvRows::Q8_0(d),
        }
    }

    /// Rows `pos` only (row 0 of the view = position `pos.start`).
    fn view_rows(&self, pos: std::ops::Range<usize>, kv_dim: usize) -> KvRows<'_> {
        match self {
            Rows::F32(d) => KvRows::F32(&d[pos.start * kv_dim..pos.end * kv_dim]),
            Rows::F16(d) => KvRows::F16(&d[pos.start * kv_dim..pos.end * kv_dim]),
            Rows::Q8_0(d) => {
                let rb = CacheType::Q8_0.row_bytes(kv_dim);
                KvRows::Q8_0(&d[pos.start * rb..pos.end * rb])
            }
        }
    }
}

/// Keys and values of past positions for every layer.
pub struct KvCache {
    k: Vec<Rows>,
    v: Vec<Rows>,
    /// Layers with storage.
    n_layer: usize,
    n_ctx: usize,
    kv_dim: usize,
    ty: CacheType,
}

impl KvCache {
    /// Allocate a zeroed cache of `ty` for `n_ctx` positions. For Q8_0, `kv_dim` must be
    /// whole blocks of 32 (callers check the head width with [`CacheType::check`]).
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize, ty: CacheType) -> Self {
        Self::for_layers(&vec![true; n_layer], n_ctx, kv_dim, ty)
    }

    /// A cache holding only the layers `il` with `owned[il]` (a pipelined-ring device
    /// computes only its windows); the others are empty and must not be used.
    pub fn for_layers(owned: &[bool], n_ctx: usize, kv_dim: usize, ty: CacheType) -> Self {
        assert!(ty != CacheType::Q8_0 || kv_dim.is_multiple_of(32), "q8_0 cache rows must be whole blocks of 32");
        let alloc = || owned.iter().map(|&o| Rows::new(ty, if o { n_ctx } else { 0 }, kv_dim)).collect();
        Self { k: alloc(), v: alloc(), n_layer: owned.iter().filter(|&&o| o).count(), n_ctx, kv_dim, ty }
    }

    /// Positions the cache can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The element type.
    pub fn cache_type(&self) -> CacheType {
        self.ty
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        Self::bytes_for(self.n_layer, self.n_ctx, self.kv_dim, self.ty)
    }

    /// Bytes a cache of this shape takes: `2 · n_layer · n_ctx · ty.row_bytes(kv_dim)`
    /// (K and V), as llama.cpp's KV cache allocates.
    pub fn bytes_for(n_layer: usize, n_ctx: usize, kv_dim: usize, ty: CacheType) -> usize {
        2 * n_layer * n_ctx * ty.row_bytes(kv_dim)
    }

    /// Store rows `k, v: [n, kv_dim]` at positions `pos0..pos0+n` of `layer`, converted
    /// to the cache type.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        self.k[layer].store(pos0, self.kv_dim, k);
        self.v[layer].store(pos0, self.kv_dim, v);
    }

    /// Keys and values of `layer`, `[n_ctx, kv_dim]` each.
    pub fn layer(&self, layer: usize) -> (KvRows<'_>, KvRows<'_>) {
        (self.k[layer].view(), self.v[layer].view())
    }

    /// Keys and values of `layer` at positions `pos` only, `[pos.len(), kv_dim]` each
    /// (a slot's share of a cache that holds several sequences).
    pub fn layer_rows(&self, layer: usize, pos: std::ops::Range<usize>) -> (KvRows<'_>, KvRows<'_>) {
        (self.k[layer].view_rows(pos.clone(), self.kv_dim), self.v[layer].view_rows(pos, self.kv_dim))
    }
}

#[cfg(test)]
mod tests {
    use super::{CacheType, KvCache};
    use hearth_kernels::ops::KvRows;

    #[test]
    fn smollm2_cache_is_11_25_mib_at_512() {
        // llama.cpp reports 11.25 MiB for SmolLM2-135M (30 layers, 3 KV heads × 64) at n_ctx 512.
        assert_eq!(KvCache::bytes_for(30, 512, 192, CacheType::F16), 11_796_480);
    }

    #[test]
    fn bytes_per_type_follow_ggml_row_size() {
        // f32: 4 bytes/element; q8_0: 34 bytes per 32 elements (6 blocks of 192).
        assert_eq!(KvCache::bytes_for(30, 512, 192, CacheType::F32), 23_592_960);
        assert_eq!(KvCache::bytes_for(30, 512, 192, CacheType::Q8_0), 2 * 30 * 512 * 6 * 34);
        assert_eq!(KvCache::bytes_for(30, 512, 192, CacheType::Q8_0), 6_266_880); // 5.98 MiB
                                                                                  // Llama 2 7B at 4096: 2 GiB (f16), 4 GiB (f32), 1.0625 GiB (q8_0), as llama.cpp prints.
        assert_eq!(KvCache::bytes_for(32, 4096, 4096, CacheType::F16), 2 << 30);
        assert_eq!(KvCache::bytes_for(32, 4096, 4096, CacheType::F32), 4 << 30);
        assert_eq!(KvCache::bytes_for(32, 4096, 4096, CacheType::Q8_0), (2 << 30) / 32 * 17);
        for ty in CacheType::ALL {
            let c = KvCache::new(2, 8, 64, ty);
            assert_eq!(c.bytes(), KvCache::bytes_for(2, 8, 64, ty));
            let (k, v) = c.layer(1);
            let len = |r: KvRows<'_>| match r {
                KvRows::F32(x) => x.len() * 4,
                KvRows::F16(x) => x.len() * 2,
                KvRows::Q8_0(x) => x.len(),
            };
            assert_eq!(2 * 2 * len(k), c.bytes());
            assert_eq!(len(k), len(v));
            assert_eq!(CacheType::from_name(ty.name()), Some(ty));
        }
        assert_eq!(CacheType::from_name("Q8_0"), Some(CacheType::Q8_0));
        assert_eq!(CacheType::from_name("q4_0"), None);
        assert!(CacheType::Q8_0.check(64).is_ok() && CacheType::Q8_0.check(80).is_err() && CacheType::F16.check(80).is_ok());
    }

    #[test]
    fn store_converts_rows() {
        let row: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 7.0).collect();
        let rows = [row.clone(), row.iter().map(|x| -x).collect()].concat();
        for ty in CacheType::ALL {
            let mut c = KvCache::new(1, 4, 64, ty);
            c.store(0, 1, &rows, &rows);
            let (k, _) = c.layer(0);
            let mut got = vec![0f32; 64];
            match k {
                KvRows::F32(x) => got.copy_from_slice(&x[2 * 64..3 * 64]),
                KvRows::F16(x) => got.iter_mut().zip(&x[2 * 64..3 * 64]).for_each(|(g, h)| *g = h.to_f32()),
                KvRows::Q8_0(x) => hearth_quant::q8::dequantize_row_q8_0(&x[2 * 68..3 * 68], &mut got),
            }
            let tol = match ty {
                CacheType::F32 => 0.0,
                CacheType::F16 => 2e-3,
                CacheType::Q8_0 => 4.5 / 127.0 * 0.6,
            };
            for (g, w) in got.iter().zip(&rows[64..]) {
                assert!((g - w).abs() <= tol, "{ty}: {g} vs {w}");
            }
        }
    }
}
