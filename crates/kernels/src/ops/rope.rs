//! Rotary position embedding (RoFormer, arXiv 2104.09864, eq. 15) with the scalings
//! llama.cpp applies: linear (`freq_scale`), per-dimension frequency factors (Llama 3.1's
//! `rope_freqs`, Phi-3's LongRoPE factors) and YaRN (Peng et al., arXiv 2309.00071, §3.4).
//!
//! The arithmetic is ggml's CPU `rope` (`ggml_rope_cache_init`, `rope_yarn`,
//! `rotate_pairs`): θ advances by repeated multiplication with `base^(−2/n_dims)` in f32,
//! each dimension pair's angle is `θ / factor`, interpolated by `freq_scale` and, with
//! YaRN, ramped between interpolation and extrapolation over the correction dimensions;
//! cos and sin are scaled by `attn_factor` (YaRN's magnitude correction). Results match
//! llama.cpp's bit for bit when `mul_add` contracts as GCC does (the x0 products fuse).

/// Which dimensions of a head rotate together (ggml's rope `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(2i, 2i+1)` (`GGML_ROPE_TYPE_NORMAL`: llama, Mistral).
    Norm,
    /// Halves `(i, i + n_dims/2)` (`GGML_ROPE_TYPE_NEOX`: Qwen2/3, Gemma 3, Phi-3).
    Neox,
}

/// One RoPE configuration (a layer's: Gemma 3's local layers have their own base).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope<'a> {
    /// Pair layout.
    pub layout: RopeLayout,
    /// Leading dimensions of each head that rotate (even, at most `head_dim`).
    pub n_dims: usize,
    /// Base frequency θ.
    pub freq_base: f32,
    /// Position interpolation: `1 / scaling factor` (1 for none).
    pub freq_scale: f32,
    /// YaRN's extrapolation mix (0: off).
    pub ext_factor: f32,
    /// Scale of cos and sin (YaRN's attention factor; 1 for none).
    pub attn_factor: f32,
    /// YaRN's β_fast and β_slow (rotations per context where the ramp starts and ends).
    pub beta_fast: f32,
    /// See `beta_fast`.
    pub beta_slow: f32,
    /// Context length the model was trained with before scaling (YaRN's correction dims).
    pub n_ctx_orig: usize,
    /// Per-pair frequency divisors, `[n_dims / 2]` (Llama 3.1 `rope_freqs`, LongRoPE).
    pub freq_factors: Option<&'a [f32]>,
}

impl Rope<'static> {
    /// Unscaled RoPE with base `freq_base` over `n_dims` dimensions.
    pub fn plain(layout: RopeLayout, n_dims: usize, freq_base: f32) -> Self {
        Rope {
            layout,
            n_dims,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            freq_factors: None,
        }
    }
}

impl Rope<'_> {
    /// YaRN's correction dimensions `[low, high]` (`ggml_rope_yarn_corr_dims`).
    fn corr_dims(&self) -> [f32; 2] {
        let n = self.n_dims as f32;
        let dim = |n_rot: f32| n * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * self.freq_base.ln());
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n - 1.0)]
    }

    /// `(cos, sin)` of each rotated pair at position `pos` into `cache[..n_dims]`.
    fn cache(&self, pos: usize, corr: [f32; 2], cache: &mut [f32]) {
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let mut theta = pos as f32;
        for i0 in (0..self.n_dims).step_by(2) {
            let ff = self.freq_factors.map_or(1.0, |f| f[i0 / 2]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let (mut t, mut mscale) = (interp, self.attn_factor);
            if self.ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                t = interp * (1.0 - ramp) + extrap * ramp;
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            cache[i0] = t.cos() * mscale;
            cache[i0 + 1] = t.sin() * mscale;
            theta *= theta_scale;
        }
    }
}

/// Rotates `x: [n_tokens, n_heads * head_dim]` in place; token `t` is at position `pos0 + t`.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, r: &Rope<'_>) {
    assert!(r.n_dims <= head_dim && r.n_dims.is_multiple_of(2), "rope: n_dims {} for head_dim {head_dim}", r.n_dims);
    if let Some(f) = r.freq_factors {
        assert!(f.len() >= r.n_dims / 2, "rope: {} frequency factors for {} dims", f.len(), r.n_dims);
    }
    let corr = r.corr_dims();
    let mut cache = [0f32; super::MAX_HEAD_DIM];
    let cache = &mut cache[..r.n_dims];
    #[cfg(target_arch = "x86_64")]
    let fma = std::arch::is_x86_feature_detected!("fma");
    for (t, row) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        r.cache(pos0 + t, corr, cache);
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: the feature was just detected.
            unsafe { x86::rotate(row, head_dim, cache, r.layout) };
            continue;
        }
        rotate(row, head_dim, cache, r.layout);
    }
}

/// Unscaled adjacent-pair RoPE (the llama architecture's), as [`rope`] does it.
pub fn rope_norm(x: &mut [f32], n_heads: usize, head_dim: usize, n_rot: usize, pos0: usize, base: f32) {
    rope(x, n_heads, head_dim, pos0, &Rope::plain(RopeLayout::Norm, n_rot, base))
}

/// Rotates the first `cache.len()` dims of each head of `row` by the `(cos, sin)` pairs
/// in `cache`. As GCC contracts ggml's `rotate_pairs` (-ffp-contract=fast, seen in the
/// reference build's code): the x0 products fuse, the x1 products round first.
#[inline(always)]
fn rotate(row: &mut [f32], head_dim: usize, cache: &[f32], layout: RopeLayout) {
    let half = cache.len() / 2;
    for head in row.chunks_exact_mut(head_dim) {
        for (i, cs) in cache.chunks_exact(2).enumerate() {
            let (i0, i1) = match layout {
                RopeLayout::Norm => (2 * i, 2 * i + 1),
                RopeLayout::Neox => (i, i + half),
            };
            let (a, b, c, s) = (head[i0], head[i1], cs[0], cs[1]);
            head[i0] = a.mul_add(c, -(b * s));
            head[i1] = a.mul_add(s, b * c);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::RopeLayout;

    /// [`super::rotate`] with `mul_add` as an inline FMA instruction.
    #[target_feature(enable = "fma")]
    pub unsafe fn rotate(row: &mut [f32], head_dim: usize, cache: &[f32], layout: RopeLayout) {
        super::rotate(row, head_dim, cache, layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's formulas written out in f64-free scalar steps, one pair at a time, for a
    /// direct comparison (the same operations, so the results must be identical).
    fn reference(x: &mut [f32], head_dim: usize, pos: usize, r: &Rope<'_>) {
        let corr = r.corr_dims();
        let ts = r.freq_base.powf(-2.0 / r.n_dims as f32);
        let mut theta = pos as f32;
        for i0 in (0..r.n_dims).step_by(2) {
            let ff = r.freq_factors.map_or(1.0, |f| f[i0 / 2]);
            let e = theta / ff;
            let mut t = r.freq_scale * e;
            let mut ms = r.attn_factor;
            if r.ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - corr[0]) / f32::max(0.001, corr[1] - corr[0]);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * r.ext_factor;
                t = t * (1.0 - mix) + e * mix;
                ms *= 1.0 + 0.1 * (1.0 / r.freq_scale).ln();
            }
            let (c, s) = (t.cos() * ms, t.sin() * ms);
            for head in x.chunks_exact_mut(head_dim) {
                let (a, b) = match r.layout {
                    RopeLayout::Norm => (i0, i0 + 1),
                    RopeLayout::Neox => (i0 / 2, i0 / 2 + r.n_dims / 2),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0.mul_add(c, -(x1 * s));
                head[b] = x0.mul_add(s, x1 * c);
            }
            theta *= ts;
        }
    }

    #[test]
    fn every_variant_matches_the_reference_steps() {
        let factors: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * 0.5).collect();
        let plain = Rope::plain(RopeLayout::Neox, 32, 10000.0);
        let variants = [
            Rope::plain(RopeLayout::Norm, 32, 10000.0),
            plain,
            Rope { n_dims: 24, ..plain },
            Rope { freq_scale: 0.25, ..plain },
            Rope { freq_factors: Some(&factors), ..plain },
            Rope { freq_scale: 0.25, ext_factor: 1.0, attn_factor: 0.9, n_ctx_orig: 4096, ..plain },
        ];
        for r in &variants {
            for pos in [0usize, 1, 17, 3000] {
                let x0: Vec<f32> = (0..2 * 32).map(|i| (i as f32 * 0.37).sin()).collect();
                let (mut got, mut want) = (x0.clone(), x0.clone());
                rope(&mut got, 2, 32, pos, r);
                reference(&mut want, 32, pos, r);
                assert_eq!(got, want, "{r:?} at {pos}");
                if pos == 0 && r.attn_factor == 1.0 {
                    assert_eq!(got, x0, "position 0 is the identity: {r:?}");
                }
            }
        }
    }

    #[test]
    fn layouts_rotate_different_pairs() {
        let x0: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let (mut a, mut b) = (x0.clone(), x0.clone());
        rope(&mut a, 1, 8, 5, &Rope::plain(RopeLayout::Norm, 8, 100.0));
        rope(&mut b, 1, 8, 5, &Rope::plain(RopeLayout::Neox, 8, 100.0));
        assert_ne!(a, b);
        // Each rotation keeps the norm of its pair.
        let n = |v: &[f32], i: usize, j: usize| (v[i] * v[i] + v[j] * v[j]).sqrt();
        assert!((n(&a, 0, 1) - n(&x0, 0, 1)).abs() < 1e-5);
        assert!((n(&b, 0, 4) - n(&x0, 0, 4)).abs() < 1e-5);
    }

    #[test]
    fn yarn_corr_dims_are_ggml_s() {
        // Llama-style YaRN over 128 dims, trained on 4096: ggml's floor/ceil of the
        // correction dims for β 32 and 1.
        let r = Rope { n_ctx_orig: 4096, ..Rope::plain(RopeLayout::Norm, 128, 10000.0) };
        let [lo, hi] = r.corr_dims();
        let d = |b: f32| 128.0 * (4096.0 / (b * 2.0 * std::f32::consts::PI)).ln() / (2.0 * 10000f32.ln());
        assert_eq!(lo, d(32.0).floor());
        assert_eq!(hi, d(1.0).ceil());
        assert!(lo > 0.0 && hi < 127.0 && lo < hi);
    }
}
