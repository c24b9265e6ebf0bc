//! The KV cache: per layer, keys and values of past positions, in the cache type
//! chosen at creation ([`CacheType`]: f32, f16 (default) or Q8_0, llama.cpp's
//! `-ctk` / `-ctv`, one type for both here).
//!
//! Layout per layer and slot: `k, v: [held, kv_dim]` with `kv_dim = n_head_kv · head_dim`
//! (row = one position), the non-transposed V layout llama.cpp uses with flash attention.
//! A full-attention layer holds every position (`held = n_ctx`). A sliding-window layer
//! (Gemma 3's local layers) holds only `window + n_batch − 1` of them as a ring
//! (position `p` in row `p mod held`): the oldest query of a batch of `n_batch` tokens
//! still sees its `window` keys after the batch's own rows are stored. llama.cpp's
//! `llama_kv_cache_iswa` sizes its window cache the same way (`n_swa + n_ubatch`, padded
//! to 256). See [`KvLayout`].
//!
//! Size in bytes, as llama.cpp's `llama_kv_cache` allocates it (`ggml_row_size(type,
//! kv_dim) · held` per tensor, K and V per layer): `2 · Σ_layers held · row_bytes(kv_dim)`,
//! with `row_bytes(n)` = `4n` (f32), `2n` (f16), `34 · n / 32` (Q8_0: an f16 scale and 32
//! int8 per block, ggml-common.h `block_q8_0`). SmolLM2-135M at n_ctx = 512: 22.5 / 11.25
//! / 5.98 MiB.

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
    fn new(ty: CacheType, n_rows: usize, kv_dim: usize) -> Self {
        match ty {
            CacheType::F32 => Rows::F32(resident(n_rows * kv_dim)),
            CacheType::F16 => Rows::F16(vec![f16::ZERO; n_rows * kv_dim]),
            CacheType::Q8_0 => Rows::Q8_0(resident(n_rows * ty.row_bytes(kv_dim))),
        }
    }

    /// Store rows `src: [n, kv_dim]` at rows `row0..row0 + n`.
    fn store(&mut self, row0: usize, kv_dim: usize, src: &[f32]) {
        match self {
            Rows::F32(d) => d[row0 * kv_dim..row0 * kv_dim + src.len()].copy_from_slice(src),
            Rows::F16(d) => {
                for (d, &s) in d[row0 * kv_dim..row0 * kv_dim + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
            Rows::Q8_0(d) => {
                // ggml stores into a quantized cache with the CPU type traits' `from_float`
                // (`ggml_compute_forward_set_rows_f32`), which on x86 is the SIMD
                // `quantize_row_q8_0` (id = 127/amax, round half to even), not `_ref`.
                let rb = CacheType::Q8_0.row_bytes(kv_dim);
                for (t, row) in src.chunks_exact(kv_dim).enumerate() {
                    let at = (row0 + t) * rb;
                    hearth_quant::q8::quantize_row_q8_0_act(row, &mut d[at..at + rb]);
                }
            }
        }
    }

    /// Copy rows `src..src + n` to `dst..dst + n` (non-overlapping).
    fn copy_rows(&mut self, src: usize, dst: usize, n: usize, kv_dim: usize) {
        let w = match self {
            Rows::Q8_0(_) => CacheType::Q8_0.row_bytes(kv_dim),
            _ => kv_dim,
        };
        let (from, to) = (src * w..(src + n) * w, dst * w);
        match self {
            Rows::F32(d) => d.copy_within(from, to),
            Rows::F16(d) => d.copy_within(from, to),
            Rows::Q8_0(d) => d.copy_within(from, to),
        }
    }

    /// Rows `rows` only (row 0 of the view = row `rows.start`).
    fn view_rows(&self, rows: std::ops::Range<usize>, kv_dim: usize) -> KvRows<'_> {
        match self {
            Rows::F32(d) => KvRows::F32(&d[rows.start * kv_dim..rows.end * kv_dim]),
            Rows::F16(d) => KvRows::F16(&d[rows.start * kv_dim..rows.end * kv_dim]),
            Rows::Q8_0(d) => {
                let rb = CacheType::Q8_0.row_bytes(kv_dim);
                KvRows::Q8_0(&d[rows.start * rb..rows.end * rb])
            }
        }
    }
}

/// The shape of a KV cache: how many positions each layer holds per slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Per layer: the attention window in positions (`usize::MAX`: full causal), and
    /// whether this node runs it (a pipelined-ring device caches only its own layers).
    pub layers: Vec<(usize, bool)>,
    /// Positions of a sequence (per slot).
    pub n_ctx: usize,
    /// Most tokens of one pass (sizes a window layer's ring).
    pub n_batch: usize,
    /// Sequences held at once.
    pub n_slots: usize,
    /// `n_head_kv · head_dim` of the heads cached here.
    pub kv_dim: usize,
    /// Element type.
    pub ty: CacheType,
}

impl KvLayout {
    /// [`Self::new`] with the windows of `c`'s layers (a ring for sliding-window ones):
    /// the cache a context of `kv_dim` K (and V) values a position allocates.
    pub fn of_model(c: &crate::ModelConfig, n_ctx: usize, n_batch: usize, kv_dim: usize, ty: CacheType) -> Self {
        Self::new((0..c.n_layer).map(|il| c.window(il)), n_ctx, n_batch, kv_dim, ty)
    }

    /// One slot, every layer run here, windows as listed (`usize::MAX`: full attention).
    pub fn new(windows: impl IntoIterator<Item = usize>, n_ctx: usize, n_batch: usize, kv_dim: usize, ty: CacheType) -> Self {
        Self { layers: windows.into_iter().map(|w| (w, true)).collect(), n_ctx, n_batch: n_batch.clamp(1, n_ctx.max(1)), n_slots: 1, kv_dim, ty }
    }

    /// `n_layer` full-attention layers.
    pub fn full(n_layer: usize, n_ctx: usize, kv_dim: usize, ty: CacheType) -> Self {
        Self::new(std::iter::repeat_n(usize::MAX, n_layer), n_ctx, n_ctx, kv_dim, ty)
    }

    /// Positions one slot of a layer with `window` holds: `n_ctx` for full attention, else
    /// `min(n_ctx, window + n_batch − 1)`: a batch's first query at position `p` needs
    /// keys `p − window + 1 ..= p` while the batch's last token, stored before attention
    /// runs, lands at `p + n_batch − 1`.
    pub fn held_for(window: usize, n_ctx: usize, n_batch: usize) -> usize {
        n_ctx.min(window.saturating_add(n_batch.max(1) - 1))
    }

    /// Positions layer `il` holds per slot (0 for a layer not run here).
    pub fn held(&self, il: usize) -> usize {
        match self.layers.get(il) {
            Some(&(w, true)) => Self::held_for(w, self.n_ctx, self.n_batch),
            _ => 0,
        }
    }

    /// Bytes: `2 · n_slots · Σ_layers held · row_bytes(kv_dim)` (K and V).
    pub fn bytes(&self) -> usize {
        let rows: usize = (0..self.layers.len()).map(|il| self.held(il)).sum();
        2 * self.n_slots * rows * self.ty.row_bytes(self.kv_dim)
    }

    /// Whether every layer still holds what a sequence with `n_past` positions cached
    /// needs to continue from position `n <= n_past` (forgetting the rest): a window
    /// layer's ring has overwritten positions before `n_past − held`, and the next query
    /// at `n` needs those from `n − window + 1` on. Full-attention layers always can, and
    /// so can every layer back to 0 (a new sequence).
    pub fn can_rewind(&self, n_past: usize, n: usize) -> bool {
        n >= n_past
            || n == 0
            || self.layers.iter().enumerate().all(|(il, &(w, _))| {
                let held = self.held(il);
                held == 0 || (n + 1).saturating_sub(w) >= n_past.saturating_sub(held)
            })
    }
}

/// Keys and values of past positions for every layer.
pub struct KvCache {
    k: Vec<Rows>,
    v: Vec<Rows>,
    /// Positions each layer holds per slot.
    held: Vec<usize>,
    layout: KvLayout,
}

impl KvCache {
    /// Allocate a zeroed cache of this layout. For Q8_0, `kv_dim` must be whole blocks of
    /// 32 (callers check the head width with [`CacheType::check`]).
    pub fn new(layout: KvLayout) -> Self {
        let (ty, kv_dim) = (layout.ty, layout.kv_dim);
        assert!(ty != CacheType::Q8_0 || kv_dim.is_multiple_of(32), "q8_0 cache rows must be whole blocks of 32");
        let held: Vec<usize> = (0..layout.layers.len()).map(|il| layout.held(il)).collect();
        let alloc = || held.iter().map(|&h| Rows::new(ty, layout.n_slots * h, kv_dim)).collect();
        Self { k: alloc(), v: alloc(), held, layout }
    }

    /// Re-create this cache as `layout`, freeing the old buffers first so both never
    /// coexist.
    pub fn replace(&mut self, layout: KvLayout) {
        *self = Self::new(KvLayout::full(0, 0, 0, layout.ty));
        *self = Self::new(layout);
    }

    /// The layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Positions of one slot's sequence.
    pub fn n_ctx(&self) -> usize {
        self.layout.n_ctx
    }

    /// The element type.
    pub fn cache_type(&self) -> CacheType {
        self.layout.ty
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layout.bytes()
    }

    /// Bytes a cache of full-attention layers takes: `2 · n_layer · n_ctx ·
    /// ty.row_bytes(kv_dim)` (K and V), as llama.cpp's KV cache allocates.
    pub fn bytes_for(n_layer: usize, n_ctx: usize, kv_dim: usize, ty: CacheType) -> usize {
        KvLayout::full(n_layer, n_ctx, kv_dim, ty).bytes()
    }

    /// Store rows `k, v: [n, kv_dim]` of positions `pos0..pos0+n` of `slot`'s sequence in
    /// `layer`, converted to the cache type (a window layer's ring wraps: at most
    /// `n_batch` rows at once).
    pub fn store(&mut self, layer: usize, slot: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let (held, kvd) = (self.held[layer], self.layout.kv_dim);
        let n = k.len() / kvd;
        debug_assert!(n <= held && pos0 + n <= self.layout.n_ctx, "{n} rows at {pos0} into a layer holding {held}");
        let base = slot * held;
        // At most two runs: up to the ring's end, then from its start.
        let row0 = pos0 % held;
        let first = n.min(held - row0);
        for (rows, at) in [(0..first, base + row0), (first..n, base)] {
            if !rows.is_empty() {
                let r = rows.start * kvd..rows.end * kvd;
                self.k[layer].store(at, kvd, &k[r.clone()]);
                self.v[layer].store(at, kvd, &v[r]);
            }
        }
    }

    /// Copy positions `0..n` of slot `from`'s sequence into slot `to`, every layer (a
    /// window layer's ring: the rows those positions map to, `p mod held`).
    pub fn copy_slot(&mut self, from: usize, to: usize, n: usize) {
        let kvd = self.layout.kv_dim;
        for (il, &held) in self.held.iter().enumerate() {
            let m = n.min(held);
            if m > 0 && from != to {
                self.k[il].copy_rows(from * held, to * held, m, kvd);
                self.v[il].copy_rows(from * held, to * held, m, kvd);
            }
        }
    }

    /// Keys and values of `slot`'s sequence in `layer`, `[held, kv_dim]` each (`held` =
    /// [`KvLayout::held`]): position `p` is row `p mod held`
    /// ([`hearth_kernels::ops::AttnShape::ring`]).
    pub fn layer(&self, layer: usize, slot: usize) -> (KvRows<'_>, KvRows<'_>) {
        let held = self.held[layer];
        let rows = slot * held..(slot + 1) * held;
        (self.k[layer].view_rows(rows.clone(), self.layout.kv_dim), self.v[layer].view_rows(rows, self.layout.kv_dim))
    }
}

#[cfg(test)]
mod tests {
    use super::{CacheType, KvCache, KvLayout};
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
            let c = KvCache::new(KvLayout::full(2, 8, 64, ty));
            assert_eq!(c.bytes(), KvCache::bytes_for(2, 8, 64, ty));
            let (k, v) = c.layer(1, 0);
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
            let mut c = KvCache::new(KvLayout::full(1, 4, 64, ty));
            c.store(0, 0, 1, &rows, &rows);
            let (k, _) = c.layer(0, 0);
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

    /// A window layer holds `window + n_batch − 1` positions as a ring; full layers all.
    #[test]
    fn window_layers_hold_a_ring() {
        // Gemma 3 270M: 18 layers, 5 of each 6 local with a 512-position window, one KV
        // head of 256. At n_ctx 2048, n_batch 512: 3 global layers × 2048 + 15 × 1023.
        let windows = (0..18).map(|il| if il % 6 < 5 { 512 } else { usize::MAX });
        let l = KvLayout::new(windows.clone(), 2048, 512, 256, CacheType::F16);
        assert_eq!(l.bytes(), 2 * (3 * 2048 + 15 * 1023) * 512);
        assert!(l.bytes() < KvCache::bytes_for(18, 2048, 256, CacheType::F16) * 3 / 5);
        // A context no longer than the ring holds every position.
        assert_eq!(KvLayout::new(windows, 575, 64, 256, CacheType::F16).bytes(), KvCache::bytes_for(18, 575, 256, CacheType::F16));
        let ring = KvLayout::new([4], 32, 3, 32, CacheType::F32);
        assert_eq!(ring.held(0), 6);
        assert_eq!(KvLayout { n_slots: 3, ..ring.clone() }.bytes(), 3 * ring.bytes());
        // Rewinding: the ring holds positions n_past − 6 ..; continuing at n needs n − 3 on.
        assert!(ring.can_rewind(6, 0) && ring.can_rewind(20, 17) && ring.can_rewind(20, 18) && ring.can_rewind(20, 25));
        assert!(!ring.can_rewind(20, 16) && !ring.can_rewind(7, 1) && ring.can_rewind(7, 0));
        assert!(KvLayout::full(2, 32, 32, CacheType::F32).can_rewind(30, 0));
        // Rows wrap: positions 0..8 in a ring of 6 end as 6, 7, 2, 3, 4, 5.
        let mut c = KvCache::new(KvLayout { n_slots: 2, ..ring });
        let row = |p: usize| vec![p as f32; 32];
        for (pos0, n) in [(0, 3), (3, 3), (6, 2)] {
            let rows: Vec<f32> = (pos0..pos0 + n).flat_map(row).collect();
            c.store(0, 1, pos0, &rows, &rows);
        }
        let (k, _) = c.layer(0, 1);
        let KvRows::F32(k) = k else { unreachable!() };
        let firsts: Vec<f32> = k.chunks_exact(32).map(|r| r[0]).collect();
        assert_eq!((c.layout().held(0), firsts), (6, vec![6.0, 7.0, 2.0, 3.0, 4.0, 5.0]));
        // Slot 0 untouched.
        let (k0, _) = c.layer(0, 0);
        assert!(matches!(k0, KvRows::F32(x) if x.iter().all(|&v| v == 0.0)));
    }

}
