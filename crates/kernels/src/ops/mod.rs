//! Elementwise ops and attention over an f32, f16 or Q8_0 KV cache.
//!
//! Shapes are row-major `[n_tokens, width]`. The formulas follow ggml's CPU ops so
//! that results track llama.cpp's: RMSNorm accumulates the sum of squares in f64
//! (`ggml_compute_forward_rms_norm_f32`), RoPE advances θ by repeated multiplication
//! (`ggml_rope_cache_init`), SiLU uses ggml's own vectorised expf, and attention follows ggml's flash attention over the
//! cache's type (see [`attend`]).

use half::f16;

mod act;
mod dot_order;
mod f32x8;
#[cfg(target_arch = "aarch64")]
mod neon;
mod rope;
mod tiled;
pub use act::{add_rows, geglu, rmsnorm_inplace, scale};
pub use dot_order::F16DotOrder;
pub use rope::{rope, rope_norm, Rope, RopeLayout};

/// `out = x / sqrt(mean(x²) + eps) * w` for each row of `x: [n, w.len()]`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((ss / n as f64) as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// SwiGLU: `gate = silu(gate) * up`, elementwise, with silu(x) = x / (1 + e^−x) and e^x
/// computed exactly as ggml's AVX-512 `ggml_v_expf` (`ggml_vec_swiglu_f32` in the
/// reference build), not libm's `expf`: they disagree in the last bit for about a quarter
/// of the outputs, enough to flip Q8_1 roundings in the next matmul.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::swiglu(&mut gate[..n], &up[..n]) };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: Advanced SIMD is baseline on aarch64.
    unsafe {
        f32x8::swiglu::<f32x8::Neon>(&mut gate[..n], &up[..n])
    }
    #[cfg(not(target_arch = "aarch64"))]
    for (g, &u) in gate[..n].iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

// Constants of ggml_v_expf (ARM optimized-routines expf): 0x1.8p23, log2(e), ln2 split
// in two, then the polynomial's coefficients from the highest degree down.
const EXP_SHIFT: u32 = 0x4b40_0000;
const EXP_LOG2E: u32 = 0x3fb8_aa3b;
const EXP_LN2_LO: u32 = 0x35bf_be8e;
const EXP_LN2_HI: u32 = 0x3f31_7200;
const EXP_C: [u32; 5] = [0x3c07_2010, 0x3d2b_9f17, 0x3e2a_af33, 0x3eff_fedb, 0x3f7f_fff6];

/// `ggml_v_expf`'s AVX-512 variant for one lane: e^x = 2^n · j(b), b = x − n·ln2, and the
/// final `_mm512_scalef_ps` (j · 2^n with one rounding), done here exactly in f64.
fn expf_ggml(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(EXP_SHIFT);
    let z = x.mul_add(f(EXP_LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(f(EXP_LN2_LO), (-n).mul_add(f(EXP_LN2_HI), x));
    let u = b * b;
    let c = EXP_C.map(f);
    let j = c[0].mul_add(b, c[1]).mul_add(u, c[2].mul_add(b, c[3])).mul_add(u, c[4].mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let p = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * p) as f32
}

/// `ggml_v_silu`: x / (1 + e^(0 − x)).
fn silu(x: f32) -> f32 {
    x / (1.0 + expf_ggml(0.0 - x))
}

/// `x += y`, elementwise.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Dot product of `a` (f32 holding f16-representable values) with an f16 vector.
///
/// Summation order is that of ggml's `ggml_vec_dot_f16` in the build `order` names
/// ([`F16DotOrder`]). AVX-512: four 16-lane accumulators over steps of 64 elements,
/// reduced as `(s0+s2) + (s1+s3)` and then `_mm512_reduce_add_ps`'s halving tree; the
/// tail past a multiple of 64 is added in f64. Products of f16 values are exact in f32,
/// so matching the order makes the result bit-identical.
pub fn dot_f16(order: F16DotOrder, a: &[f32], b: &[f16]) -> f32 {
    let avx2_order = order == F16DotOrder::Avx2;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::dot_f16(a, b, avx2_order) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        // SAFETY: Advanced SIMD was detected (it is baseline on aarch64).
        return unsafe { neon::dot_f16(a, b, avx2_order) };
    }
    if avx2_order {
        return dot_order::dot_f16_avx2_order(a, b);
    }
    dot_order::dot_f16_avx512_order(a, b)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BlockScratch, Tile, BLOCK_ROWS};
    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::swiglu`] compiled with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        super::f32x8::swiglu::<super::f32x8::Avx2>(gate, up)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f32], b: &[f16], avx2_order: bool) -> f32 {
        let n = a.len().min(b.len());
        if avx2_order {
            // ggml's AVX2 build: 4 × 8 lanes over steps of 32, then GGML_F32x8_REDUCE.
            let np = n & !31;
            let mut s = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < np {
                for (j, v) in s.iter_mut().enumerate() {
                    let bv = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i + 8 * j) as *const __m128i));
                    *v = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8 * j)), bv, *v);
                }
                i += 32;
            }
            let x = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
            let mut sum = hadd_tree(x) as f64;
            for k in np..n {
                sum += (a[k] * b[k].to_f32()) as f64;
            }
            return sum as f32;
        }
        let np = n & !63;
        // s[j] = one 16-lane accumulator as two 8-lane halves.
        let mut s = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i < np {
            for (j, acc) in s.iter_mut().enumerate() {
                for (h, v) in acc.iter_mut().enumerate() {
                    let off = i + 16 * j + 8 * h;
                    let bv = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(off) as *const __m128i));
                    *v = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(off)), bv, *v);
                }
            }
            i += 64;
        }
        let half = |h: usize| _mm256_add_ps(_mm256_add_ps(s[0][h], s[2][h]), _mm256_add_ps(s[1][h], s[3][h]));
        let t3 = _mm256_add_ps(half(1), half(0));
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_shuffle_ps::<0b01_00_11_10>(t6, t6));
        let mut sum = (_mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(t8, t8))) as f64;
        for k in np..n {
            sum += (a[k] * b[k].to_f32()) as f64;
        }
        sum as f32
    }

    /// [`super::dot_f32_body`] with `mul_add` as FMA instructions (vectorised by LLVM).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        super::dot_f32_body(a, b)
    }

    /// [`super::dot_q8_0_body`] with `mul_add` as FMA instructions.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_q8_0(k: &[u8], q: &[u8]) -> f32 {
        super::dot_q8_0_body(k, q)
    }

    /// [`super::mad_f32_body`] with `mul_add` as FMA instructions.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mad_f32(acc: &mut [f32], v: &[f32], w: f32) {
        super::mad_f32_body(acc, v, w)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(acc: &mut [f16], s: f32) {
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= acc.len() {
            let p = acc.as_mut_ptr().add(i) as *mut __m128i;
            let a = _mm256_cvtph_ps(_mm_loadu_si128(p));
            _mm_storeu_si128(p, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(a, sv)));
            i += 8;
        }
        for a in &mut acc[i..] {
            *a = f16::from_f32(a.to_f32() * s);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [f16], v: &[f16], w: f32) {
        let n = acc.len().min(v.len());
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            let p = acc.as_mut_ptr().add(i) as *mut __m128i;
            let a = _mm256_cvtph_ps(_mm_loadu_si128(p));
            let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
            _mm_storeu_si128(p, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_fmadd_ps(x, wv, a)));
            i += 8;
        }
        for (a, &x) in acc[i..n].iter_mut().zip(&v[i..n]) {
            *a = f16::from_f32(x.to_f32().mul_add(w, a.to_f32()));
        }
    }

    /// f32 → f16 → f32 (`_mm256_cvtps_ph` round to nearest, as [`mad_f16`] stores).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn round16(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// [`dot_f16`]'s accumulators for one row, reduced to its `t3` vector (8 lanes):
    /// `q`, `k`: `8·nv` f32 (a multiple of 64).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_t3(nv: usize, q: *const f32, k: *const f32) -> __m256 {
        let mut s = [[_mm256_setzero_ps(); 2]; 4];
        let mut i = 0;
        while i < 8 * nv {
            for (j, acc) in s.iter_mut().enumerate() {
                for (h, v) in acc.iter_mut().enumerate() {
                    let off = i + 16 * j + 8 * h;
                    *v = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(off)), _mm256_loadu_ps(k.add(off)), *v);
                }
            }
            i += 64;
        }
        let half = |h: usize| _mm256_add_ps(_mm256_add_ps(s[0][h], s[2][h]), _mm256_add_ps(s[1][h], s[3][h]));
        _mm256_add_ps(half(1), half(0))
    }

    /// The end of [`dot_f16`]'s tree from its `t3` vector.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn hsum_t3(t3: __m256) -> f32 {
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_shuffle_ps::<0b01_00_11_10>(t6, t6));
        _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(t8, t8))
    }

    /// `GGML_F32x8_REDUCE`'s end: `lo128 + hi128`, then two `hadd`s.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn hadd_tree(x: __m256) -> f32 {
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    /// One row's score in ggml's AVX2-build order (4 × 8 lanes over steps of 32):
    /// `q`, `k`: `8·nv` f32 (a multiple of 64, so no tail).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_avx2_order(nv: usize, q: *const f32, k: *const f32) -> f32 {
        let mut s = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < 8 * nv {
            for (j, acc) in s.iter_mut().enumerate() {
                let off = i + 8 * j;
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(off)), _mm256_loadu_ps(k.add(off)), *acc);
            }
            i += 32;
        }
        hadd_tree(_mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3])))
    }

    /// [`scores`] in the AVX2 build's order, one row at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_avx2_order(nv: usize, q: *const f32, kf: *const f32, sc: *mut f32, nr: usize, scale: f32) {
        for r in 0..nr {
            *sc.add(r) = dot_avx2_order(nv, q, kf.add(r * 8 * nv)) * scale;
        }
    }

    /// The horizontal sums of 8 rows' `t3` vectors, each as [`hsum_t3`] finishes one
    /// (each lane sees exactly its additions, in its order).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn combine8(t: [__m256; 8]) -> __m256 {
        // hi128 + lo128 of two rows at once: [t6 of row a | t6 of row b].
        let u = |a: __m256, b: __m256| _mm256_add_ps(_mm256_permute2f128_ps::<0x31>(a, b), _mm256_permute2f128_ps::<0x20>(a, b));
        let (u01, u23, u45, u67) = (u(t[0], t[1]), u(t[2], t[3]), u(t[4], t[5]), u(t[6], t[7]));
        // t8[0..2] = (t6[0] + t6[2], t6[1] + t6[3]): [r0 r0 r2 r2 | r1 r1 r3 r3].
        let w = |a: __m256, b: __m256| _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
        let (w0, w1) = (w(u01, u23), w(u45, u67));
        // t8[0] + t8[1]: [f0 f2 f4 f6 | f1 f3 f5 f7].
        let f = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(w0, w1), _mm256_shuffle_ps::<0xDD>(w0, w1));
        _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// One query's online-softmax steps over a chunk: per row, rescale by `ms` (where
    /// `resc`), then multiply-add the V row by `vs`.
    #[derive(Clone, Copy)]
    struct Steps<'a> {
        ms: &'a [f32],
        vs: &'a [f32],
        resc: &'a [bool],
    }

    /// One row's `t3` vector ([`dot_t3`]'s reduction): 256- or 512-bit products.
    trait RowDot {
        unsafe fn t3(nv: usize, q: *const f32, k: *const f32) -> __m256;
    }

    struct Dot256;
    impl RowDot for Dot256 {
        #[inline(always)]
        unsafe fn t3(nv: usize, q: *const f32, k: *const f32) -> __m256 {
            dot_t3(nv, q, k)
        }
    }

    struct Dot512;
    impl RowDot for Dot512 {
        #[inline(always)]
        unsafe fn t3(nv: usize, q: *const f32, k: *const f32) -> __m256 {
            dot_t3_512(nv, q, k)
        }
    }

    /// Scores of `nr` f32 K rows (`kf`, stride `8·nv`) against `q`, times `scale`: 8 rows
    /// at a time through [`combine8`], then one at a time; each as [`dot_f16`] sums it.
    #[inline(always)]
    unsafe fn scores<D: RowDot>(nv: usize, q: *const f32, kf: *const f32, sc: *mut f32, nr: usize, scale: f32) {
        let hd = 8 * nv;
        let mut r = 0;
        while r + 8 <= nr {
            let k = kf.add(r * hd);
            let d = combine8([
                D::t3(nv, q, k),
                D::t3(nv, q, k.add(hd)),
                D::t3(nv, q, k.add(2 * hd)),
                D::t3(nv, q, k.add(3 * hd)),
                D::t3(nv, q, k.add(4 * hd)),
                D::t3(nv, q, k.add(5 * hd)),
                D::t3(nv, q, k.add(6 * hd)),
                D::t3(nv, q, k.add(7 * hd)),
            ]);
            _mm256_storeu_ps(sc.add(r), _mm256_mul_ps(d, _mm256_set1_ps(scale)));
            r += 8;
        }
        while r < nr {
            *sc.add(r) = hsum_t3(D::t3(nv, q, kf.add(r * hd))) * scale;
            r += 1;
        }
    }

    /// [`scores`] with 256-bit products.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores256(nv: usize, q: *const f32, kf: *const f32, sc: *mut f32, nr: usize, scale: f32) {
        scores::<Dot256>(nv, q, kf, sc, nr, scale)
    }

    /// [`dot_t3`] with 16-lane accumulators (ggml's own AVX-512 `ggml_vec_dot_f16`
    /// layout): the same sums lane for lane, then `hi256 + lo256`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_t3_512(nv: usize, q: *const f32, k: *const f32) -> __m256 {
        let mut s = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i < 8 * nv {
            for (j, acc) in s.iter_mut().enumerate() {
                let off = i + 16 * j;
                *acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(off)), _mm512_loadu_ps(k.add(off)), *acc);
            }
            i += 64;
        }
        let x = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        _mm256_add_ps(hi, _mm512_castps512_ps256(x))
    }

    /// [`scores`] with 512-bit products.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn scores512(nv: usize, q: *const f32, kf: *const f32, sc: *mut f32, nr: usize, scale: f32) {
        scores::<Dot512>(nv, q, kf, sc, nr, scale)
    }

    /// One query's accumulator (`ap`, `8·nv` f32 holding f16 values) through `st`'s steps
    /// over the V rows `vf` (stride `8·nv`), rounded to f16 after each.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn mad256<const NV: usize>(nv: usize, ap: *mut f32, vf: *const f32, st: Steps<'_>) {
        let mut acc = [_mm256_setzero_ps(); NV];
        for (c, a) in acc.iter_mut().enumerate().take(nv) {
            *a = _mm256_loadu_ps(ap.add(8 * c));
        }
        for r in 0..st.vs.len() {
            if st.resc[r] {
                let w = _mm256_set1_ps(st.ms[r]);
                for a in acc.iter_mut().take(nv) {
                    *a = _mm256_mul_ps(*a, w);
                    *a = round16(*a);
                }
            }
            let w = _mm256_set1_ps(st.vs[r]);
            let vp = vf.add(r * 8 * nv);
            for (c, a) in acc.iter_mut().enumerate().take(nv) {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(vp.add(8 * c)), w, *a);
                *a = round16(*a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(nv) {
            _mm256_storeu_ps(ap.add(8 * c), *a);
        }
    }

    /// [`round16`] on 16 lanes.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn round16_512(x: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// [`mad256`] on 16 lanes (`nz` = `head_dim / 16` vectors) for `NQ` queries at once
    /// (accumulators `aps[..NQ]`, steps `st[..NQ]`, all over the same rows): each query
    /// gets the same operations lane for lane; a V row is loaded once for all of them.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn mad512<const NZ: usize, const NQ: usize>(nz: usize, aps: [*mut f32; 4], vf: *const f32, st: [Steps<'_>; 4]) {
        let mut acc = [[_mm512_setzero_ps(); NZ]; NQ];
        for (qa, &ap) in acc.iter_mut().zip(&aps) {
            for (c, a) in qa.iter_mut().enumerate().take(nz) {
                *a = _mm512_loadu_ps(ap.add(16 * c));
            }
        }
        for r in 0..st[0].vs.len() {
            let vp = vf.add(r * 16 * nz);
            let mut vr = [_mm512_setzero_ps(); NZ];
            for (c, x) in vr.iter_mut().enumerate().take(nz) {
                *x = _mm512_loadu_ps(vp.add(16 * c));
            }
            for (qa, sq) in acc.iter_mut().zip(&st) {
                if sq.resc[r] {
                    let w = _mm512_set1_ps(sq.ms[r]);
                    for a in qa.iter_mut().take(nz) {
                        *a = _mm512_mul_ps(*a, w);
                        *a = round16_512(*a);
                    }
                }
                let w = _mm512_set1_ps(sq.vs[r]);
                for (a, &x) in qa.iter_mut().zip(&vr).take(nz) {
                    *a = _mm512_fmadd_ps(x, w, *a);
                    *a = round16_512(*a);
                }
            }
        }
        for (qa, &ap) in acc.iter().zip(&aps) {
            for (c, a) in qa.iter().enumerate().take(nz) {
                _mm512_storeu_ps(ap.add(16 * c), *a);
            }
        }
    }

    /// [`super::attend_block`] with f16 K and V, `head_dim = 8·NV`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn attend_block_f16<const NV: usize>(w512: bool, t: Tile, k: &[f16], v: &[f16], b: &mut BlockScratch, out: &mut [f32]) {
        block_body::<NV>(NV, w512, t, k, v, b, out)
    }

    /// [`super::attend_block`] with f16 K and V, any `head_dim` multiple of 64.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn attend_block_f16_any(w512: bool, t: Tile, k: &[f16], v: &[f16], b: &mut BlockScratch, out: &mut [f32]) {
        block_body::<{ super::MAX_HEAD_DIM / 8 }>(t.s.head_dim / 8, w512, t, k, v, b, out)
    }

    /// The tile walks the cache in chunks of [`BLOCK_ROWS`] rows: each chunk's K and V rows
    /// are converted to f32 once, then every query that sees rows of the chunk scores them
    /// ([`scores`]), runs the online-softmax recurrence over them in order (the
    /// `expf` calls first, then the f16-rounded rescales and multiply-adds with its
    /// accumulator in registers).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block_body<const NV: usize>(nv: usize, w512: bool, t: Tile, k: &[f16], v: &[f16], b: &mut BlockScratch, out: &mut [f32]) {
        let Tile { n_tok, nh, kv_head, n_kv0, s } = t;
        let avx2_order = s.f16_dot == super::F16DotOrder::Avx2;
        let hd = 8 * nv;
        let nq = n_tok * nh;
        let scale = s.scale;
        b.m[..nq].fill(f32::NEG_INFINITY);
        b.sum[..nq].fill(0.0);
        b.acc[..nq * hd].fill(0.0);
        let n_kv_max = n_kv0 + n_tok - 1;
        let mut j0 = n_kv0.saturating_sub(s.window);
        while j0 < n_kv_max {
            let j1 = (j0 + BLOCK_ROWS).min(n_kv_max);
            for j in j0..j1 {
                let r = super::row_elems(j, kv_head, s);
                let (kr, vr) = (&k[r.clone()], &v[r]);
                let (kd, vd) = (b.kf.as_mut_ptr().add((j - j0) * hd), b.vf.as_mut_ptr().add((j - j0) * hd));
                for c in 0..nv {
                    _mm256_storeu_ps(kd.add(8 * c), _mm256_cvtph_ps(_mm_loadu_si128(kr.as_ptr().add(8 * c) as *const __m128i)));
                    _mm256_storeu_ps(vd.add(8 * c), _mm256_cvtph_ps(_mm_loadu_si128(vr.as_ptr().add(8 * c) as *const __m128i)));
                }
            }
            for tt in 0..n_tok {
                let lim = (n_kv0 + tt).min(j1);
                // A sliding window: this token sees rows from `lo` on.
                let lo = (n_kv0 + tt).saturating_sub(s.window).max(j0);
                if lim <= lo {
                    continue;
                }
                let (nr, r0) = (lim - lo, lo - j0);
                // Heads of one token see the same rows: with 512-bit vectors up to 4
                // (head_dim 64) or 2 (128) accumulators step through the rows together,
                // each V row load serving all of them (independent f16 rounding chains).
                let per = match (w512, nv) {
                    (true, 8) => 4,
                    (true, 16) => 2,
                    _ => 1,
                };
                let mut h0 = 0;
                while h0 < nh {
                    let cnt = per.min(nh - h0);
                    let mut ms = [[1f32; BLOCK_ROWS]; 4];
                    let mut vs = [[1f32; BLOCK_ROWS]; 4];
                    let mut resc = [[false; BLOCK_ROWS]; 4];
                    let mut aps = [std::ptr::null_mut::<f32>(); 4];
                    for qi in 0..cnt {
                        let i = tt * nh + h0 + qi;
                        let qp = b.qh.as_ptr().add(i * hd);
                        let kf = b.kf.as_ptr().add(r0 * hd);
                        let sc = b.score.as_mut_ptr();
                        if avx2_order {
                            scores_avx2_order(nv, qp, kf, sc, nr, scale);
                        } else if w512 {
                            scores512(nv, qp, kf, sc, nr, scale);
                        } else {
                            scores256(nv, qp, kf, sc, nr, scale);
                        }
                        // The recurrence's scalars (libm expf, as `online_softmax`).
                        let (mut m, mut sum) = (b.m[i], b.sum[i]);
                        let (ms, vs, resc) = (&mut ms[qi], &mut vs[qi], &mut resc[qi]);
                        for r in 0..nr {
                            let score = *sc.add(r);
                            if score > m {
                                let m_old = m;
                                m = score;
                                ms[r] = (m_old - m).exp();
                                resc[r] = true;
                            } else {
                                vs[r] = (score - m).exp();
                            }
                            sum = sum.mul_add(ms[r], vs[r]);
                        }
                        b.m[i] = m;
                        b.sum[i] = sum;
                        aps[qi] = b.acc.as_mut_ptr().add(i * hd);
                    }
                    // The accumulators, rounded to f16 after every step (`VKQ16`).
                    let st: [Steps<'_>; 4] =
                        std::array::from_fn(|qi| Steps { ms: &ms[qi][..nr], vs: &vs[qi][..nr], resc: &resc[qi][..nr] });
                    let vf = b.vf.as_ptr().add(r0 * hd);
                    match (w512, nv, cnt) {
                        (true, 8, 4) => mad512::<4, 4>(4, aps, vf, st),
                        (true, 8, 3) => mad512::<4, 3>(4, aps, vf, st),
                        (true, 8, 2) => mad512::<4, 2>(4, aps, vf, st),
                        (true, 8, _) => mad512::<4, 1>(4, aps, vf, st),
                        (true, 16, 2) => mad512::<8, 2>(8, aps, vf, st),
                        (true, 16, _) => mad512::<8, 1>(8, aps, vf, st),
                        (true, _, _) => mad512::<{ super::MAX_HEAD_DIM / 16 }, 1>(nv / 2, aps, vf, st),
                        _ => mad256::<NV>(nv, aps[0], vf, st[0]),
                    }
                    h0 += cnt;
                }
            }
            j0 = j1;
        }
        for i in 0..nq {
            let sum = b.sum[i];
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, &a) in out[i * hd..(i + 1) * hd].iter_mut().zip(&b.acc[i * hd..(i + 1) * hd]) {
                *o = a * inv;
            }
        }
    }
}

/// Dimensions of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (each serves `n_head / n_head_kv` query heads).
    pub n_head_kv: usize,
    /// Head width.
    pub head_dim: usize,
    /// Factor of the scores `q·k` before the softmax: `1/√head_dim` for most models;
    /// 1 where the architecture scales Q itself (Gemma 3).
    pub scale: f32,
    /// Sliding window: a query at position `p` sees keys `p − window + 1 ..= p`
    /// (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`); `usize::MAX` for full causal attention.
    pub window: usize,
    /// Rows the cache holds per layer: position `j` lives in row `j mod ring` (a
    /// sliding-window layer's ring buffer of `window + n_batch − 1` rows, enough for the
    /// oldest query of a batch); `usize::MAX` (or any bound above every position): row `j`.
    /// Only where a row is read changes, never the order of the arithmetic, so a ring
    /// gives the same bits as the whole cache.
    pub ring: usize,
    /// With an f16 cache: compute in f32 (queries unrounded, K and V widened, f32
    /// accumulators), block by block over 32 cache rows with a vectorised softmax, as
    /// llama.cpp's tiled flash attention does for batches of at least
    /// [`F32_PATH_MIN_TOKENS`] tokens (not its bits: see `ops/tiled.rs` for the order);
    /// else ggml's per-query path (queries rounded to f16, f16 accumulators), which
    /// llama.cpp runs for smaller batches and decode, to the bit.
    pub f32_path: bool,
    /// Which llama.cpp build's summation order the f16 score dots follow
    /// ([`F16DotOrder`]; default [`F16DotOrder::from_env`]).
    pub f16_dot: F16DotOrder,
}

/// Batches from this many tokens on take llama.cpp's tiled flash-attention path
/// (`GGML_FA_TILE_Q`).
pub const F32_PATH_MIN_TOKENS: usize = 64;

impl AttnShape {
    /// Full causal attention, scores scaled by `1/√head_dim`.
    pub fn causal(n_head: usize, n_head_kv: usize, head_dim: usize) -> Self {
        Self { n_head, n_head_kv, head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window: usize::MAX, ring: usize::MAX, f32_path: false, f16_dot: F16DotOrder::from_env() }
    }
}

/// Widest head the attention kernels take (their per-call buffers live on the stack).
pub const MAX_HEAD_DIM: usize = 512;

/// Rows of one layer's K or V cache, `[n_ctx, n_head_kv * head_dim]` (row = one
/// position), in the cache's element type (llama.cpp's `-ctk` / `-ctv`).
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// Q8_0 blocks: 34 bytes (f16 scale + 32 × i8) per 32 elements; each head is whole blocks.
    Q8_0(&'a [u8]),
}

/// Per-thread buffers of [`attend`] and [`attend_block`]: a tile's prepared queries,
/// accumulators (`[BLOCK_MAX_QUERIES, head_dim]`: f16 when V is f16, ggml's `VKQ16`,
/// else f32, `VKQ32`), running max and sum, results, and the f16 path's K/V chunk as
/// f32. Allocated once for the cache type; grows if a call needs another.
#[derive(Debug, Default)]
pub struct AttnScratch {
    acc16: Vec<f16>,
    /// Q8_0 queries (a Q8_0 K cache), `[BLOCK_MAX_QUERIES, head_dim / 32 · 34]` bytes.
    qq: Vec<u8>,
    /// [`attend_block`]'s results, `[BLOCK_MAX_QUERIES, head_dim]`.
    out: Vec<f32>,
    /// Queries, f32 accumulators, max and sum, and the f16 path's buffers.
    block: BlockScratch,
}

impl AttnScratch {
    /// Scratch for heads of `head_dim` with an f16 (`v_f16`) or other (f32, Q8_0) cache.
    pub fn new(head_dim: usize, v_f16: bool) -> Self {
        let mut s = Self { out: vec![0.0; BLOCK_MAX_QUERIES * head_dim], block: BlockScratch::new(head_dim), ..Self::default() };
        if v_f16 {
            s.acc16 = vec![f16::ZERO; BLOCK_MAX_QUERIES * head_dim];
        } else {
            s.qq = vec![0; Self::q8_0_bytes(head_dim)];
        }
        s
    }

    /// Bytes [`new`](Self::new) allocates: the results (`64 · head_dim · 4`), the
    /// [`BlockScratch`], and f16 accumulators (`64 · head_dim · 2`, f16 cache) or Q8_0
    /// queries (`64 · head_dim / 32 · 34`, other caches).
    pub fn bytes(head_dim: usize, v_f16: bool) -> usize {
        let out = BLOCK_MAX_QUERIES * head_dim * 4;
        out + BlockScratch::bytes(head_dim) + if v_f16 { BLOCK_MAX_QUERIES * head_dim * 2 } else { Self::q8_0_bytes(head_dim) }
    }

    fn q8_0_bytes(head_dim: usize) -> usize {
        BLOCK_MAX_QUERIES * head_dim / QK8_0 * Q8_0_BYTES
    }
}

/// Causal attention of one query row (one token, one head) against cache rows
/// `0..n_kv`, for any K and V cache types.
///
/// The arithmetic is that of ggml's CPU flash attention
/// (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`): Q is converted to the K type's
/// `vec_dot_type` (f16 for f16 K, f32 for f32 K, Q8_0 with ggml's x86 activation
/// quantizer for Q8_0 K) and dotted with each K row by that type's `vec_dot`; scores use
/// an online softmax (running max `M`, running sum `S`); with an f16 V the weighted sum
/// is accumulated in f16 (`ggml_vec_mad_f16`, rescaled by `ggml_vec_scale_f16`), with any
/// other V each row is converted to f32 (`to_float`) and accumulated in f32
/// (`ggml_vec_mad_f32` / `ggml_vec_scale_f32`); the result is divided by `S`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    kv_head: usize,
    n_kv: usize,
    s: AttnShape,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let tile = Tile { n_tok: 1, nh: 1, kv_head, n_kv0: n_kv, s };
    attend_tile(&q[..s.head_dim], s.head_dim, 0, tile, k, v, scratch, &mut out[..s.head_dim]);
}

/// [`attend`] with the f16 cache (the default): the path whose logits are bit-identical
/// to llama.cpp's. `acc` is scratch of `head_dim` f16 values.
#[allow(clippy::too_many_arguments)]
pub fn attend_one(q: &[f32], k: &[f16], v: &[f16], kv_head: usize, n_kv: usize, s: AttnShape, acc: &mut [f16], out: &mut [f32]) {
    let hd = s.head_dim;
    let mut qh = [0f32; MAX_HEAD_DIM];
    round_f16(&q[..hd], &mut qh[..hd]);
    let key = KeyF16 { q: &qh[..hd], k, kv_head, s };
    let tile = Tile { n_tok: 1, nh: 1, kv_head, n_kv0: n_kv, s };
    let val = &mut ValF16 { acc: &mut acc[..hd], v, kv_head, s };
    online_softmax(tile, &key, val, &mut [0.0], &mut [0.0], &mut out[..hd]);
}

/// Most queries (tokens × heads) of one [`attend_block`] tile that share the converted
/// K/V rows (the caller picks tiles of at most this many).
pub const BLOCK_MAX_QUERIES: usize = 64;

/// K/V cache rows a tile's queries go through together.
const BLOCK_ROWS: usize = 32;

/// Per-thread buffers of a tile: its queries (rounded to f16 for an f16 K, as they are
/// for f32 K), f32 accumulators, running max and sum, and (the f16 path) a chunk of K/V
/// rows as f32 and their scores.
#[derive(Debug, Default)]
struct BlockScratch {
    qh: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
    kf: Vec<f32>,
    vf: Vec<f32>,
    score: Vec<f32>,
}

impl BlockScratch {
    /// K/V rows of f32 either path widens at a time: the block path's [`BLOCK_ROWS`],
    /// the tiled path's KV tile ([`tiled::TILE_KV`]).
    const ROWS: usize = if BLOCK_ROWS > tiled::TILE_KV { BLOCK_ROWS } else { tiled::TILE_KV };
    /// Scores kept at a time: one query's block of rows, or three queries' KV tiles.
    const SCORES: usize = if BLOCK_ROWS > 3 * tiled::TILE_KV { BLOCK_ROWS } else { 3 * tiled::TILE_KV };

    fn new(head_dim: usize) -> Self {
        let (q, r) = (BLOCK_MAX_QUERIES * head_dim, Self::ROWS * head_dim);
        Self {
            qh: vec![0.0; q],
            acc: vec![0.0; q],
            m: vec![0.0; BLOCK_MAX_QUERIES],
            sum: vec![0.0; BLOCK_MAX_QUERIES],
            kf: vec![0.0; r],
            vf: vec![0.0; r],
            score: vec![0.0; Self::SCORES],
        }
    }

    fn bytes(head_dim: usize) -> usize {
        4 * (2 * BLOCK_MAX_QUERIES * head_dim + 2 * BLOCK_MAX_QUERIES + 2 * Self::ROWS * head_dim + Self::SCORES)
    }

    /// Grow to what the tiled f32 path needs for `nq` queries of `head_dim` (a scratch
    /// made by [`Self::new`] for a smaller `head_dim` has too few): a KV tile of K and V
    /// rows as f32 and the scores of three queries.
    fn fit_tiled(&mut self, head_dim: usize, nq: usize) {
        let rows = tiled::TILE_KV * head_dim;
        for (buf, n) in [(&mut self.acc, nq * head_dim), (&mut self.kf, rows), (&mut self.vf, rows), (&mut self.score, Self::SCORES), (&mut self.m, nq), (&mut self.sum, nq)] {
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
        }
    }
}

/// `dst[i] = f32(f16(src[i]))`: a query as an f16 K's `vec_dot_type` holds it.
fn round_f16(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(x).to_f32();
    }
}

/// Causal attention of a tile of queries: `n_tok` consecutive tokens of one sequence ×
/// query heads `heads`, all served by KV head `kv_head`; token `t` of the tile sees cache
/// rows `0..n_kv0 + t` (the last `s.window` of them). Query `(t, h)` is `q[t·q_stride + h·head_dim..][..head_dim]`; its
/// result is `ret[(t·heads.len() + h − heads.start)·head_dim..][..head_dim]` of the
/// returned slice (held by `scratch`). At most [`BLOCK_MAX_QUERIES`] queries.
///
/// Blockwise: the tile walks the cache in chunks of 32 rows and every query that sees
/// rows of a chunk goes through them before the next chunk is read, so each K/V row is
/// read from memory once per tile, not once per query. Every query's result is
/// bit-identical to [`attend`] on it: each query does [`attend`]'s exact sequence of
/// operations (same dot-product order, max/rescale steps, rounding of the accumulator,
/// libm `expf`). With an f16 K and V cache (and `head_dim` a multiple of 64,
/// AVX2/FMA/F16C) a chunk is also converted to f32 once for the whole tile and scored
/// with 512-bit vectors where the CPU has AVX-512F (then up to 4 heads of a token step
/// through the V rows together). On the f32 path ([`AttnShape::f32_path`]) with an f16
/// cache the tile runs blockwise (`ops/tiled.rs`): each query's result still depends
/// only on the query, its position and the cache, so it is [`attend`]'s too.
#[allow(clippy::too_many_arguments)]
pub fn attend_block<'s>(
    q: &[f32],
    q_stride: usize,
    n_tok: usize,
    heads: std::ops::Range<usize>,
    k: KvRows<'_>,
    v: KvRows<'_>,
    kv_head: usize,
    n_kv0: usize,
    s: AttnShape,
    scratch: &'s mut AttnScratch,
) -> &'s [f32] {
    // The active (HEARTH_SIMD-capped) level, so `HEARTH_SIMD=avx2` on an AVX-512 CPU
    // measures the whole step as an AVX2-only CPU runs it (the bits are the same).
    let avx512 = crate::SimdLevel::active() == crate::SimdLevel::Avx512;
    attend_block_with(q, q_stride, n_tok, heads, k, v, kv_head, n_kv0, s, scratch, avx512)
}

/// [`attend_block`] with the 512-bit f16 path on (`avx512`, when the CPU has it) or off.
#[allow(clippy::too_many_arguments)]
fn attend_block_with<'s>(
    q: &[f32],
    q_stride: usize,
    n_tok: usize,
    heads: std::ops::Range<usize>,
    k: KvRows<'_>,
    v: KvRows<'_>,
    kv_head: usize,
    n_kv0: usize,
    s: AttnShape,
    scratch: &'s mut AttnScratch,
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] avx512: bool,
) -> &'s [f32] {
    let (hd, nh) = (s.head_dim, heads.len());
    let nq = n_tok * nh;
    assert!(nq <= BLOCK_MAX_QUERIES, "attend_block: {nq} queries, at most {BLOCK_MAX_QUERIES}");
    let mut out = std::mem::take(&mut scratch.out);
    out.resize((nq * hd).max(out.len()), 0.0);
    let tile = Tile { n_tok, nh, kv_head, n_kv0, s };
    #[cfg(target_arch = "x86_64")]
    if let (KvRows::F16(kc), KvRows::F16(vc), false) = (k, v, s.f32_path) {
        if nq > 1
            && hd.is_multiple_of(64)
            && hd <= MAX_HEAD_DIM
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if scratch.block.kf.len() < BLOCK_ROWS * hd || scratch.block.qh.len() < nq * hd {
                scratch.block = BlockScratch::new(hd);
            }
            let b = &mut scratch.block;
            for i in 0..nq {
                round_f16(tile.query(q, q_stride, heads.start, i), &mut b.qh[i * hd..(i + 1) * hd]);
            }
            // SAFETY: the features were just detected; the buffers hold `nq` queries and
            // BLOCK_ROWS rows of `hd` values.
            unsafe {
                let w512 = avx512 && std::arch::is_x86_feature_detected!("avx512f");
                match hd {
                    64 => x86::attend_block_f16::<8>(w512, tile, kc, vc, b, &mut out),
                    128 => x86::attend_block_f16::<16>(w512, tile, kc, vc, b, &mut out),
                    _ => x86::attend_block_f16_any(w512, tile, kc, vc, b, &mut out),
                }
            }
            scratch.out = out;
            return &scratch.out[..nq * hd];
        }
    }
    attend_tile(q, q_stride, heads.start, tile, k, v, scratch, &mut out);
    scratch.out = out;
    &scratch.out[..nq * hd]
}

/// The shape of one [`attend_block`] tile: query `i` is token `i / nh`, head `i % nh`
/// of the tile, and sees cache rows `0..n_kv0 + i / nh` (the last `s.window` of them).
#[derive(Clone, Copy)]
struct Tile {
    n_tok: usize,
    nh: usize,
    kv_head: usize,
    n_kv0: usize,
    s: AttnShape,
}

impl Tile {
    /// Query `i`'s row: token `i / nh`, head `h0 + i % nh` of `q` (rows `q_stride` apart).
    #[inline(always)]
    fn query<'q>(&self, q: &'q [f32], q_stride: usize, h0: usize, i: usize) -> &'q [f32] {
        let hd = self.s.head_dim;
        &q[(i / self.nh) * q_stride + (h0 + i % self.nh) * hd..][..hd]
    }
}

/// A tile for any cache types: its queries converted to K's `vec_dot_type` once, then
/// [`online_softmax`] with the accumulator for V's type. Query `i` is
/// `q[(i / nh)·q_stride + (h0 + i % nh)·head_dim..][..head_dim]`; results to `out`
/// (`[n_tok · nh, head_dim]`).
#[allow(clippy::too_many_arguments)]
fn attend_tile(q: &[f32], q_stride: usize, h0: usize, t: Tile, k: KvRows<'_>, v: KvRows<'_>, scratch: &mut AttnScratch, out: &mut [f32]) {
    let (hd, nq) = (t.s.head_dim, t.n_tok * t.nh);
    assert!(hd <= MAX_HEAD_DIM, "head_dim {hd} above {MAX_HEAD_DIM}");
    let query = |i: usize| t.query(q, q_stride, h0, i);
    let AttnScratch { acc16, qq, block: b, .. } = scratch;
    for buf in [&mut b.qh, &mut b.acc] {
        buf.resize((nq * hd).max(buf.len()), 0.0);
    }
    b.vf.resize((BLOCK_ROWS * hd).max(b.vf.len()), 0.0);
    for buf in [&mut b.m, &mut b.sum] {
        buf.resize(nq.max(buf.len()), 0.0);
    }
    let (kv_head, s) = (t.kv_head, t.s);
    let out = &mut out[..nq * hd];
    if let (KvRows::F16(k), KvRows::F16(v), true) = (k, v, s.f32_path) {
        // llama.cpp's tiled path: f32 queries, K and V rows widened to f32, blockwise.
        for i in 0..nq {
            b.qh[i * hd..(i + 1) * hd].copy_from_slice(query(i));
        }
        let qh = std::mem::take(&mut b.qh);
        tiled::attend(t, &qh[..nq * hd], k, v, b, out);
        b.qh = qh;
        return;
    }
    let vals = Vals { acc16, acc32: &mut b.acc[..nq * hd], rows_f32: &mut b.vf, m: &mut b.m[..nq], sum: &mut b.sum[..nq] };
    match k {
        KvRows::F16(k) if s.f32_path => {
            // f32 queries against f16 K (not rounded), another V type.
            for i in 0..nq {
                b.qh[i * hd..(i + 1) * hd].copy_from_slice(query(i));
            }
            attend_v(t, &KeyF16 { q: &b.qh[..nq * hd], k, kv_head, s }, v, vals, out)
        }
        KvRows::F16(k) => {
            for i in 0..nq {
                round_f16(query(i), &mut b.qh[i * hd..(i + 1) * hd]);
            }
            attend_v(t, &KeyF16 { q: &b.qh[..nq * hd], k, kv_head, s }, v, vals, out)
        }
        KvRows::F32(k) => {
            for i in 0..nq {
                b.qh[i * hd..(i + 1) * hd].copy_from_slice(query(i));
            }
            attend_v(t, &KeyF32 { q: &b.qh[..nq * hd], k, kv_head, s }, v, vals, out)
        }
        KvRows::Q8_0(k) => {
            assert!(hd.is_multiple_of(QK8_0), "a Q8_0 cache needs head_dim a multiple of 32, got {hd}");
            let qb = hd / QK8_0 * Q8_0_BYTES;
            qq.resize((nq * qb).max(qq.len()), 0);
            for i in 0..nq {
                hearth_quant::q8::quantize_row_q8_0_act(query(i), &mut qq[i * qb..(i + 1) * qb]);
            }
            attend_v(t, &KeyQ8_0 { q: &qq[..nq * qb], k, kv_head, s }, v, vals, out)
        }
    }
}

/// A tile's accumulator buffers, handed to [`attend_v`].
struct Vals<'a> {
    acc16: &'a mut Vec<f16>,
    acc32: &'a mut [f32],
    /// A chunk of converted V rows, `[BLOCK_ROWS, head_dim]`.
    rows_f32: &'a mut [f32],
    m: &'a mut [f32],
    sum: &'a mut [f32],
}

/// The V half of [`attend_tile`]: picks the accumulator for V's type.
fn attend_v<K: KeyRows>(t: Tile, key: &K, v: KvRows<'_>, vals: Vals<'_>, out: &mut [f32]) {
    let (kv_head, s) = (t.kv_head, t.s);
    let n = t.n_tok * t.nh * s.head_dim;
    let Vals { acc16, acc32, rows_f32, m, sum } = vals;
    match v {
        KvRows::F16(v) => {
            acc16.resize(n.max(acc16.len()), f16::ZERO);
            online_softmax(t, key, &mut ValF16 { acc: &mut acc16[..n], v, kv_head, s }, m, sum, out)
        }
        KvRows::F32(v) => online_softmax(t, key, &mut ValF32::new(RowsF32 { v, kv_head, s }, acc32, s.head_dim, rows_f32), m, sum, out),
        KvRows::Q8_0(v) => online_softmax(t, key, &mut ValF32::new(RowsQ8_0 { v, kv_head, s }, acc32, s.head_dim, rows_f32), m, sum, out),
    }
}

/// The cache row of position `j` ([`AttnShape::ring`]); the division only once the
/// ring has wrapped.
#[inline(always)]
fn ring_row(j: usize, s: AttnShape) -> usize {
    if j >= s.ring {
        j % s.ring
    } else {
        j
    }
}

/// Elements of head `kv_head` in cache row `j` of an f32/f16 cache.
#[inline(always)]
fn row_elems(j: usize, kv_head: usize, s: AttnShape) -> std::ops::Range<usize> {
    let j = ring_row(j, s);
    let start = j * s.n_head_kv * s.head_dim + kv_head * s.head_dim;
    start..start + s.head_dim
}

/// Bytes of head `kv_head` in cache row `j` of a Q8_0 cache.
#[inline(always)]
fn row_q8_0(j: usize, kv_head: usize, s: AttnShape) -> std::ops::Range<usize> {
    let j = ring_row(j, s);
    let head = s.head_dim / QK8_0 * Q8_0_BYTES;
    let start = (j * s.n_head_kv + kv_head) * head;
    start..start + head
}

const QK8_0: usize = 32;
const Q8_0_BYTES: usize = 34;

/// The online softmax shared by every cache type, for each query `i` of the tile
/// (running max `m[i]`, sum `sum[i]`): for each row `j` it sees, score
/// `s = dot(q_i, k_j) · scale`; on a new maximum rescale the accumulator by
/// `e^(M_old − M)`, else weight the row by `e^(s − M)`; accumulate `v_j`;
/// `S = S·ms + vs`. Finally `out_i = acc_i / S`.
///
/// Rows are taken in chunks of [`BLOCK_ROWS`], every query through a chunk before the
/// next (the chunk stays in cache); a query's own steps keep their order, so its
/// result does not depend on the tile around it.
#[inline(always)]
fn online_softmax<K: KeyRows, V: ValueAcc>(t: Tile, key: &K, val: &mut V, m: &mut [f32], sum: &mut [f32], out: &mut [f32]) {
    let (nq, hd) = (t.n_tok * t.nh, t.s.head_dim);
    let scale = t.s.scale;
    m[..nq].fill(f32::NEG_INFINITY);
    sum[..nq].fill(0.0);
    val.zero();
    let n_kv_max = t.n_kv0 + t.n_tok - 1;
    for j0 in (t.n_kv0.saturating_sub(t.s.window)..n_kv_max).step_by(BLOCK_ROWS) {
        let j1 = (j0 + BLOCK_ROWS).min(n_kv_max);
        val.chunk(j0, j1);
        for i in 0..nq {
            let hi = t.n_kv0 + i / t.nh;
            for j in j0.max(hi.saturating_sub(t.s.window))..hi.min(j1) {
                let score = key.dot(i, j) * scale;
                let (mut ms, mut vs) = (1f32, 1f32);
                if score > m[i] {
                    let m_old = m[i];
                    m[i] = score;
                    ms = (m_old - score).exp();
                    val.rescale(i, ms);
                } else {
                    vs = (score - m[i]).exp();
                }
                val.mad(i, j, vs);
                sum[i] = sum[i].mul_add(ms, vs);
            }
        }
    }
    for i in 0..nq {
        let inv = if sum[i] == 0.0 { 0.0 } else { 1.0 / sum[i] };
        val.finish(i, inv, &mut out[i * hd..(i + 1) * hd]);
    }
}

/// "Score of row j": a tile's query `i`, converted to the K type's `vec_dot_type`,
/// dotted with cache row `j` (unscaled).
trait KeyRows {
    fn dot(&self, i: usize, j: usize) -> f32;
}

/// "Accumulate row j": each query's running weighted sum of V rows.
trait ValueAcc {
    /// Every accumulator = 0.
    fn zero(&mut self);
    /// Rows `j0..j1` are next (a chunk every query goes through).
    fn chunk(&mut self, _j0: usize, _j1: usize) {}
    /// `acc_i *= ms` (the max grew).
    fn rescale(&mut self, i: usize, ms: f32);
    /// `acc_i += vs · v_j`.
    fn mad(&mut self, i: usize, j: usize, vs: f32);
    /// `out = acc_i · inv`.
    fn finish(&mut self, i: usize, inv: f32, out: &mut [f32]);
}

/// f16 K: queries (rounded to f16, or as they are on the f32 path; `[nq, head_dim]`),
/// `ggml_vec_dot_f16`'s order.
struct KeyF16<'a> {
    q: &'a [f32],
    k: &'a [f16],
    kv_head: usize,
    s: AttnShape,
}

impl KeyRows for KeyF16<'_> {
    #[inline(always)]
    fn dot(&self, i: usize, j: usize) -> f32 {
        let hd = self.s.head_dim;
        dot_f16(self.s.f16_dot, &self.q[i * hd..(i + 1) * hd], &self.k[row_elems(j, self.kv_head, self.s)])
    }
}

/// f32 K: queries as they are (`[nq, head_dim]`), `ggml_vec_dot_f32`.
struct KeyF32<'a> {
    q: &'a [f32],
    k: &'a [f32],
    kv_head: usize,
    s: AttnShape,
}

impl KeyRows for KeyF32<'_> {
    #[inline(always)]
    fn dot(&self, i: usize, j: usize) -> f32 {
        let hd = self.s.head_dim;
        dot_f32(&self.q[i * hd..(i + 1) * hd], &self.k[row_elems(j, self.kv_head, self.s)])
    }
}

/// Q8_0 K: queries quantized to Q8_0 as ggml's x86 `quantize_row_q8_0` does
/// (`[nq, head_dim / 32 · 34]` bytes), `ggml_vec_dot_q8_0_q8_0`.
struct KeyQ8_0<'a> {
    q: &'a [u8],
    k: &'a [u8],
    kv_head: usize,
    s: AttnShape,
}

impl KeyRows for KeyQ8_0<'_> {
    #[inline(always)]
    fn dot(&self, i: usize, j: usize) -> f32 {
        let r = row_q8_0(j, self.kv_head, self.s);
        let n = r.len();
        dot_q8_0(&self.k[r], &self.q[i * n..(i + 1) * n])
    }
}

/// f16 V: f16 accumulators (`VKQ16`), `[nq, head_dim]`.
struct ValF16<'a> {
    acc: &'a mut [f16],
    v: &'a [f16],
    kv_head: usize,
    s: AttnShape,
}

impl ValF16<'_> {
    #[inline(always)]
    fn acc(&mut self, i: usize) -> &mut [f16] {
        let hd = self.s.head_dim;
        &mut self.acc[i * hd..(i + 1) * hd]
    }
}

impl ValueAcc for ValF16<'_> {
    #[inline(always)]
    fn zero(&mut self) {
        self.acc.fill(f16::ZERO);
    }
    #[inline(always)]
    fn rescale(&mut self, i: usize, ms: f32) {
        scale_f16(self.acc(i), ms);
    }
    #[inline(always)]
    fn mad(&mut self, i: usize, j: usize, vs: f32) {
        let v = &self.v[row_elems(j, self.kv_head, self.s)];
        mad_f16(self.acc(i), v, vs);
    }
    #[inline(always)]
    fn finish(&mut self, i: usize, inv: f32, out: &mut [f32]) {
        for (o, a) in out.iter_mut().zip(self.acc(i).iter()) {
            *o = a.to_f32() * inv;
        }
    }
}

/// V rows as f32 (`to_float` of ggml's type traits; none for f32).
trait F32Rows {
    /// Whether [`row`](Self::row) converts (fills `tmp`) rather than borrows.
    const CONVERTS: bool;
    /// Row `j` of this head as f32: a slice of the cache, or `tmp` filled.
    fn row<'s>(&'s self, j: usize, tmp: &'s mut [f32]) -> &'s [f32];
}

struct RowsF32<'a> {
    v: &'a [f32],
    kv_head: usize,
    s: AttnShape,
}

impl F32Rows for RowsF32<'_> {
    const CONVERTS: bool = false;
    #[inline(always)]
    fn row<'s>(&'s self, j: usize, _: &'s mut [f32]) -> &'s [f32] {
        &self.v[row_elems(j, self.kv_head, self.s)]
    }
}

struct RowsQ8_0<'a> {
    v: &'a [u8],
    kv_head: usize,
    s: AttnShape,
}

impl F32Rows for RowsQ8_0<'_> {
    const CONVERTS: bool = true;
    #[inline(always)]
    fn row<'s>(&'s self, j: usize, tmp: &'s mut [f32]) -> &'s [f32] {
        hearth_quant::q8::dequantize_row_q8_0(&self.v[row_q8_0(j, self.kv_head, self.s)], tmp);
        tmp
    }
}

/// Any V but f16: rows converted to f32 (once per chunk, into `rows_f32`, when the
/// type converts), f32 accumulators (`VKQ32`), `[nq, head_dim]`.
struct ValF32<'a, R: F32Rows> {
    acc: &'a mut [f32],
    rows: R,
    hd: usize,
    /// The current chunk's rows as f32, `[BLOCK_ROWS, head_dim]` (converting types).
    rows_f32: &'a mut [f32],
    j0: usize,
}

impl<'a, R: F32Rows> ValF32<'a, R> {
    /// Accumulators `acc` (`[nq, head_dim]`) over `rows`, chunks converted into `buf`.
    #[inline(always)]
    fn new(rows: R, acc: &'a mut [f32], hd: usize, buf: &'a mut [f32]) -> Self {
        Self { acc, rows, hd, rows_f32: &mut buf[..BLOCK_ROWS * hd], j0: 0 }
    }
}

impl<R: F32Rows> ValueAcc for ValF32<'_, R> {
    #[inline(always)]
    fn zero(&mut self) {
        self.acc.fill(0.0);
    }
    #[inline(always)]
    fn chunk(&mut self, j0: usize, j1: usize) {
        self.j0 = j0;
        if R::CONVERTS {
            let hd = self.hd;
            for j in j0..j1 {
                let tmp = &mut self.rows_f32[(j - j0) * hd..(j - j0 + 1) * hd];
                self.rows.row(j, tmp);
            }
        }
    }
    #[inline(always)]
    fn rescale(&mut self, i: usize, ms: f32) {
        scale_f32(&mut self.acc[i * self.hd..(i + 1) * self.hd], ms);
    }
    #[inline(always)]
    fn mad(&mut self, i: usize, j: usize, vs: f32) {
        let hd = self.hd;
        let v = if R::CONVERTS { &self.rows_f32[(j - self.j0) * hd..(j - self.j0 + 1) * hd] } else { self.rows.row(j, &mut []) };
        mad_f32(&mut self.acc[i * hd..(i + 1) * hd], v, vs);
    }
    #[inline(always)]
    fn finish(&mut self, i: usize, inv: f32, out: &mut [f32]) {
        let acc = &mut self.acc[i * self.hd..(i + 1) * self.hd];
        scale_f32(acc, inv);
        out[..acc.len()].copy_from_slice(acc);
    }
}

/// `ggml_vec_dot_f32` as built with AVX-512 (the reference build): the order of
/// [`dot_f16`] (four 16-lane FMA accumulators over steps of 64, `(s0+s2) + (s1+s3)`, the
/// `_mm512_reduce_add_ps` tree) with the tail past a multiple of 64 added in f32.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::dot_f32(a, b) };
    }
    dot_f32_body(a, b)
}

#[inline(always)]
fn dot_f32_body(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n & !63;
    let mut s = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, acc) in s.iter_mut().enumerate() {
            let (x, y) = (&a[i + 16 * j..i + 16 * j + 16], &b[i + 16 * j..i + 16 * j + 16]);
            for l in 0..16 {
                acc[l] = x[l].mul_add(y[l], acc[l]);
            }
        }
    }
    let x: [f32; 16] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    let t3: [f32; 8] = std::array::from_fn(|k| x[8 + k] + x[k]);
    let t6: [f32; 4] = std::array::from_fn(|m| t3[4 + m] + t3[m]);
    let mut sum = (t6[0] + t6[2]) + (t6[1] + t6[3]);
    for i in np..n {
        sum = a[i].mul_add(b[i], sum);
    }
    sum
}

/// `ggml_vec_dot_q8_0_q8_0` as ggml's x86 (AVX2) build computes it: per block, eight
/// lanes of 4-product integer sums (exact), `acc[l] = fma(d_k·d_q, sumi[l], acc[l])`,
/// then `hsum_float_8`. `k`, `q`: whole Q8_0 blocks of the same length.
pub fn dot_q8_0(k: &[u8], q: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::dot_q8_0(k, q) };
    }
    dot_q8_0_body(k, q)
}

#[inline(always)]
fn dot_q8_0_body(k: &[u8], q: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in k.chunks_exact(Q8_0_BYTES).zip(q.chunks_exact(Q8_0_BYTES)) {
        let d = f16::from_le_bytes([x[0], x[1]]).to_f32() * f16::from_le_bytes([y[0], y[1]]).to_f32();
        let (xq, yq) = (&x[2..Q8_0_BYTES], &y[2..Q8_0_BYTES]);
        for (l, a) in acc.iter_mut().enumerate() {
            let mut sumi = 0i32;
            for b in 4 * l..4 * l + 4 {
                sumi += xq[b] as i8 as i32 * yq[b] as i8 as i32;
            }
            *a = d.mul_add(sumi as f32, *a);
        }
    }
    // hsum_float_8: high half + low half, then (r0 + r2) + (r1 + r3).
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

/// `acc[i] = fma(v[i], w, acc[i])` (`ggml_vec_mad_f32`).
pub fn mad_f32(acc: &mut [f32], v: &[f32], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::mad_f32(acc, v, w) };
    }
    mad_f32_body(acc, v, w)
}

#[inline(always)]
fn mad_f32_body(acc: &mut [f32], v: &[f32], w: f32) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = x.mul_add(w, *a);
    }
}

/// `acc[i] *= s` (`ggml_vec_scale_f32`).
pub fn scale_f32(acc: &mut [f32], s: f32) {
    for a in acc.iter_mut() {
        *a *= s;
    }
}

/// `acc[i] = f16(acc[i] * s)` (`ggml_vec_scale_f16`).
pub fn scale_f16(acc: &mut [f16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::scale_f16(acc, s) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        // SAFETY: Advanced SIMD was detected.
        return unsafe { neon::scale_f16(acc, s) };
    }
    for a in acc.iter_mut() {
        *a = f16::from_f32(a.to_f32() * s);
    }
}

/// `acc[i] = f16(fma(v[i], w, acc[i]))` (`ggml_vec_mad_f16`).
pub fn mad_f16(acc: &mut [f16], v: &[f16], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { x86::mad_f16(acc, v, w) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        // SAFETY: Advanced SIMD was detected.
        return unsafe { neon::mad_f16(acc, v, w) };
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = f16::from_f32(x.to_f32().mul_add(w, a.to_f32()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_helpers_match_scalar() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f16> = (0..37).map(|i| f16::from_f32((i as f32 * 0.11).cos())).collect();
        let want: f32 = a.iter().zip(&b).map(|(&x, &y)| x * y.to_f32()).sum();
        assert!((dot_f16(F16DotOrder::Avx512, &a, &b) - want).abs() < 1e-4);
        // The SIMD path and the portable one share ggml's summation order exactly.
        let a: Vec<f32> = (0..200).map(|i| f16::from_f32((i as f32 * 0.37).sin()).to_f32()).collect();
        let b: Vec<f16> = (0..200).map(|i| f16::from_f32((i as f32 * 0.11).cos() * 3.0)).collect();
        let simd = dot_f16(F16DotOrder::Avx512, &a, &b);
        let np = 192;
        let mut s = [[0f32; 16]; 4];
        for i in (0..np).step_by(64) {
            for j in 0..4 {
                for l in 0..16 {
                    s[j][l] += a[i + 16 * j + l] * b[i + 16 * j + l].to_f32();
                }
            }
        }
        let x: Vec<f32> = (0..16).map(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l])).collect();
        let t3: Vec<f32> = (0..8).map(|k| x[8 + k] + x[k]).collect();
        let t6: Vec<f32> = (0..4).map(|m| t3[4 + m] + t3[m]).collect();
        let mut sum = ((t6[0] + t6[2]) + (t6[1] + t6[3])) as f64;
        for i in np..200 {
            sum += (a[i] * b[i].to_f32()) as f64;
        }
        assert_eq!(simd, sum as f32);
        let mut acc: Vec<f16> = (0..37).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
        let mut want = acc.clone();
        for (a, &x) in want.iter_mut().zip(&b) {
            *a = f16::from_f32(x.to_f32().mul_add(0.5, a.to_f32()));
        }
        mad_f16(&mut acc, &b, 0.5);
        assert_eq!(acc, want);
        scale_f16(&mut acc, 0.75);
        for (a, w) in acc.iter().zip(&want) {
            assert_eq!(*a, f16::from_f32(w.to_f32() * 0.75));
        }
    }

    /// Each build's order: the SIMD path equals the portable one (written from ggml's
    /// reduction macros), and the two orders do differ (else the choice
    /// would be moot), at head widths 64 and 256 and with a ragged tail.
    #[test]
    fn f16_dot_orders_follow_their_ggml_builds() {
        let mut differ = 0;
        for (n, seed) in [(64, 1u32), (256, 2), (200, 3), (256, 4), (128, 5)] {
            for trial in 0..50u32 {
                let f = |i: usize, k: u32| (i as f32 * 0.731 + (seed * 97 + trial * 13 + k) as f32).sin() * 3.0;
                let a: Vec<f32> = (0..n).map(|i| f16::from_f32(f(i, 0)).to_f32()).collect();
                let b: Vec<f16> = (0..n).map(|i| f16::from_f32(f(i, 7))).collect();
                let avx2 = dot_f16(F16DotOrder::Avx2, &a, &b);
                assert_eq!(avx2.to_bits(), dot_order::dot_f16_avx2_order(&a, &b).to_bits(), "n {n}");
                let avx512 = dot_f16(F16DotOrder::Avx512, &a, &b);
                assert_eq!(avx512.to_bits(), dot_order::dot_f16_avx512_order(&a, &b).to_bits(), "n {n}");
                differ += (avx2 != avx512) as usize;
            }
        }
        assert!(differ > 10, "the two orders agree on {} of 250 dots", 250 - differ);
    }

    #[test]
    fn swiglu_simd_matches_scalar_and_exp() {
        // Many magnitudes, both signs, the overflow/underflow ends, and a ragged tail.
        let mut x: Vec<f32> = (0..20011).map(|i| ((i as f32) * 0.618).sin() * (1.0 + (i % 97) as f32 * 1.5)).collect();
        x.extend([0.0, -0.0, 88.0, -88.0, 103.0, -103.0, 150.0, -150.0, 300.0, -300.0, 1e-30, -1e-30, 20.5]);
        let up: Vec<f32> = (0..x.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut got = x.clone();
        swiglu(&mut got, &up);
        for ((&g, &xi), &u) in got.iter().zip(&x).zip(&up) {
            let want = silu(xi) * u;
            assert_eq!(g.to_bits(), want.to_bits(), "x = {xi}");
            let exact = (xi as f64 / (1.0 + (-xi as f64).exp()) * u as f64) as f32;
            // ggml_v_expf overflows past 88.38 (silu → −0 there).
            if xi.abs() < 80.0 {
                assert!((g - exact).abs() <= 4e-7 * exact.abs().max(1e-30), "x = {xi}: {g} vs {exact}");
            }
        }
    }

    #[test]
    fn rmsnorm_unit_rms() {
        let x = vec![3.0f32, -4.0, 0.0, 5.0];
        let mut o = vec![0f32; 4];
        rmsnorm(&x, &[1.0; 4], 0.0, &mut o);
        let rms = (o.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    /// Softmax attention in f64 over f32 rows: what every cache type approximates.
    fn exact_attention(q: &[f32], k: &[f32], v: &[f32], kv_head: usize, n_kv: usize, s: AttnShape) -> Vec<f32> {
        let kvd = s.n_head_kv * s.head_dim;
        let at = |j: usize| j * kvd + kv_head * s.head_dim..j * kvd + (kv_head + 1) * s.head_dim;
        let sc: Vec<f64> = (0..n_kv)
            .map(|j| q.iter().zip(&k[at(j)]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / (s.head_dim as f64).sqrt())
            .collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
        let tot: f64 = w.iter().sum();
        (0..s.head_dim).map(|d| ((0..n_kv).map(|j| w[j] * v[at(j)][d] as f64).sum::<f64>() / tot) as f32).collect()
    }

    #[test]
    fn attention_every_cache_type_tracks_exact_softmax() {
        let s = AttnShape::causal(4, 2, 64);
        let (n_ctx, kvd) = (37, 128);
        let k: Vec<f32> = (0..n_ctx * kvd).map(|i| ((i as f32) * 0.731).sin() * 1.5).collect();
        let v: Vec<f32> = (0..n_ctx * kvd).map(|i| ((i as f32) * 0.377).cos() * 2.0).collect();
        let q: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.19).sin() * 3.0).collect();
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let q8 = |x: &[f32]| {
            let mut b = vec![0u8; x.len() / 32 * 34];
            hearth_quant::q8::quantize_row_q8_0_act(x, &mut b);
            b
        };
        let (k8, v8) = (q8(&k), q8(&v));
        let rows = [KvRows::F32(&k), KvRows::F16(&k16), KvRows::Q8_0(&k8)];
        let vrows = [KvRows::F32(&v), KvRows::F16(&v16), KvRows::Q8_0(&v8)];
        for n_kv in [1, 2, 37] {
            let want = exact_attention(&q, &k, &v, 1, n_kv, s);
            // The f16 cache through `attend` is `attend_one`, bit for bit.
            let mut one = vec![0f32; 64];
            attend_one(&q, &k16, &v16, 1, n_kv, s, &mut [f16::ZERO; 64], &mut one);
            let mut got = vec![0f32; 64];
            attend(&q, rows[1], vrows[1], 1, n_kv, s, &mut AttnScratch::new(64, true), &mut got);
            assert_eq!(got, one);
            for (ki, kr) in rows.iter().enumerate() {
                for (vi, vr) in vrows.iter().enumerate() {
                    // A scratch made for the other V kind must work too (it grows).
                    let mut scratch = AttnScratch::new(64, vi != 1);
                    attend(&q, *kr, *vr, 1, n_kv, s, &mut scratch, &mut got);
                    let tol = if ki == 2 || vi == 2 {
                        0.06
                    } else if ki == 1 || vi == 1 {
                        0.01
                    } else {
                        1e-5
                    };
                    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(err <= tol, "K {ki} V {vi} n_kv {n_kv}: max err {err}");
                }
            }
        }
    }

    #[test]
    fn f32_and_q8_0_helpers_match_portable_and_reference() {
        let a: Vec<f32> = (0..200).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let b: Vec<f32> = (0..200).map(|i| (i as f32 * 0.11).cos()).collect();
        // The SIMD wrappers run the same bodies.
        assert_eq!(dot_f32(&a, &b), dot_f32_body(&a, &b));
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((dot_f32(&a, &b) as f64 - exact).abs() < 1e-4);
        let mut acc = b.clone();
        mad_f32(&mut acc, &a, 0.5);
        let mut want = b.clone();
        mad_f32_body(&mut want, &a, 0.5);
        assert_eq!(acc, want);
        let mut qa = vec![0u8; 192 / 32 * 34];
        let mut qb = qa.clone();
        hearth_quant::q8::quantize_row_q8_0_act(&a[..192], &mut qa);
        hearth_quant::q8::quantize_row_q8_0_act(&b[..192], &mut qb);
        let d = dot_q8_0(&qa, &qb);
        assert_eq!(d, dot_q8_0_body(&qa, &qb));
        // Same integer sums as the reference; only the float summation order differs.
        let r = hearth_quant::q8::vec_dot_q8_0_q8_0(&qa, &qb, 192);
        assert!((d - r).abs() <= 1e-5 * r.abs().max(1.0), "{d} vs {r}");
    }

    #[test]
    fn attention_single_position_returns_v() {
        let s = AttnShape::causal(1, 1, 4);
        let k: Vec<f16> = [1.0, 0.0, 0.0, 0.0].iter().map(|&x| f16::from_f32(x)).collect();
        let v: Vec<f16> = [0.5, 1.0, -2.0, 3.0].iter().map(|&x| f16::from_f32(x)).collect();
        let mut acc = vec![f16::ZERO; 4];
        let mut out = vec![0f32; 4];
        attend_one(&[1.0, 2.0, 3.0, 4.0], &k, &v, 0, 1, s, &mut acc, &mut out);
        assert_eq!(out, vec![0.5, 1.0, -2.0, 3.0]);
    }

    /// [`attend_block`] gives every query of a tile exactly [`attend`]'s bits: f16, f32 and
    /// Q8_0 caches, mixed K/V types, head widths on and off the fast path, partial head
    /// groups, odd prefixes and tile lengths, scores large enough to move the max often.
    #[test]
    fn attend_block_is_bit_identical_to_attend() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xa77e);
        #[derive(Clone, Copy, Debug)]
        enum Ty {
            F16,
            F32,
            Q8,
        }
        let cases: &[(usize, usize, usize, Ty, Ty)] = &[
            // (head_dim, n_head_kv, group, K type, V type)
            (64, 3, 3, Ty::F16, Ty::F16),
            (64, 2, 8, Ty::F16, Ty::F16),
            (128, 2, 4, Ty::F16, Ty::F16),
            (192, 1, 2, Ty::F16, Ty::F16),
            (32, 2, 2, Ty::F16, Ty::F16),
            (64, 2, 3, Ty::F32, Ty::F32),
            (64, 2, 3, Ty::Q8, Ty::Q8),
            (64, 2, 3, Ty::F16, Ty::F32),
            (96, 1, 3, Ty::Q8, Ty::F16),
        ];
        for &(hd, n_kv_head, group, kt, vt) in cases {
            let n_head = n_kv_head * group;
            // Full causal attention, and a sliding window shorter than most contexts here.
            let full = AttnShape::causal(n_head, n_kv_head, hd);
            for s in [full, AttnShape { window: 20, ..full }, AttnShape { f32_path: true, ..full }] {
            let n_ctx = 157;
            let w = n_kv_head * hd;
            for spread in [0.3f32, 4.0] {
                let kf: Vec<f32> = (0..n_ctx * w).map(|_| rng.gen_range(-1.0f32..1.0) * spread).collect();
                let vf: Vec<f32> = (0..n_ctx * w).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                let cache = |ty: Ty, x: &[f32]| -> (Vec<f16>, Vec<f32>, Vec<u8>) {
                    match ty {
                        Ty::F16 => (x.iter().map(|&v| f16::from_f32(v)).collect(), vec![], vec![]),
                        Ty::F32 => (vec![], x.to_vec(), vec![]),
                        Ty::Q8 => {
                            let mut b = vec![0u8; x.len() / QK8_0 * Q8_0_BYTES];
                            hearth_quant::q8::quantize_row_q8_0(x, &mut b);
                            (vec![], vec![], b)
                        }
                    }
                };
                fn rows(ty: Ty, c: &(Vec<f16>, Vec<f32>, Vec<u8>)) -> KvRows<'_> {
                    match ty {
                        Ty::F16 => KvRows::F16(&c.0),
                        Ty::F32 => KvRows::F32(&c.1),
                        Ty::Q8 => KvRows::Q8_0(&c.2),
                    }
                }
                let (kc, vc) = (cache(kt, &kf), cache(vt, &vf));
                let (k, v) = (rows(kt, &kc), rows(vt, &vc));
                let v_f16 = matches!(vt, Ty::F16);
                let mut one = AttnScratch::new(hd, v_f16);
                let mut blk = AttnScratch::new(hd, v_f16);
                for &(n_kv0, n_tok) in &[(1, 1), (1, 16), (5, 7), (33, 8), (32, 9), (70, 5), (100, 16), (140, 3)] {
                    let q: Vec<f32> = (0..n_tok * n_head * hd).map(|_| rng.gen_range(-1.0f32..1.0) * spread).collect();
                    for kv_head in 0..n_kv_head {
                        let g = kv_head * group..(kv_head + 1) * group;
                        let part = g.start + group / 2..g.end;
                        for (heads, avx512) in [(g.clone(), true), (g.clone(), false), (part, true), (g.start..g.start + 1, false)] {
                            if n_tok * heads.len() > BLOCK_MAX_QUERIES {
                                continue;
                            }
                            let nh = heads.len();
                            let got = attend_block_with(&q, n_head * hd, n_tok, heads.clone(), k, v, kv_head, n_kv0, s, &mut blk, avx512)
                                .to_vec();
                            for t in 0..n_tok {
                                for (hi, h) in heads.clone().enumerate() {
                                    let mut want = vec![0f32; hd];
                                    let qrow = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
                                    attend(qrow, k, v, kv_head, n_kv0 + t, s, &mut one, &mut want);
                                    let i = t * nh + hi;
                                    let g: Vec<u32> = got[i * hd..(i + 1) * hd].iter().map(|x| x.to_bits()).collect();
                                    let w: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
                                    assert_eq!(g, w, "hd {hd} {kt:?}/{vt:?} n_kv0 {n_kv0} tok {t} head {h} avx512 {avx512} window {}", s.window);
                                }
                            }
                        }
                    }
                }
            }
            }
        }
    }

    /// A sliding window of `w` is attention over the last `w` rows alone: the same
    /// result as full attention on a cache that starts `n_kv − w` rows later.
    #[test]
    fn sliding_window_sees_only_the_last_rows() {
        let (hd, n_kv, w) = (64, 90, 24);
        let full = AttnShape::causal(1, 1, hd);
        let k: Vec<f16> = (0..n_kv * hd).map(|i| f16::from_f32(((i * 7919) % 113) as f32 / 113.0 - 0.5)).collect();
        let v: Vec<f16> = (0..n_kv * hd).map(|i| f16::from_f32(((i * 104729) % 97) as f32 / 97.0 - 0.5)).collect();
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let mut sc = AttnScratch::new(hd, true);
        let (mut a, mut b, mut c) = (vec![0f32; hd], vec![0f32; hd], vec![0f32; hd]);
        attend(&q, KvRows::F16(&k), KvRows::F16(&v), 0, n_kv, AttnShape { window: w, ..full }, &mut sc, &mut a);
        let tail = (n_kv - w) * hd..;
        attend(&q, KvRows::F16(&k[tail.clone()]), KvRows::F16(&v[tail]), 0, w, full, &mut sc, &mut b);
        assert_eq!(a, b);
        // Control: without the window the result differs.
        attend(&q, KvRows::F16(&k), KvRows::F16(&v), 0, n_kv, full, &mut sc, &mut c);
        assert_ne!(a, c);
    }

    /// A sliding-window layer's ring buffer (position `j` in row `j mod ring`) gives the
    /// bits of the whole cache, for every cache type and both block paths, once the ring
    /// has wrapped; a ring one row too short for the batch's first query does not.
    #[test]
    fn ring_buffer_rows_equal_the_whole_cache() {
        let (hd, n_kv_head, group, window) = (64, 2, 3, 24);
        let n_head = n_kv_head * group;
        let kvd = n_kv_head * hd;
        let n_ctx = 140;
        let val = |i: usize, m: usize| ((i * m) % 211) as f32 / 211.0 - 0.5;
        let kf: Vec<f32> = (0..n_ctx * kvd).map(|i| val(i, 7919) * 3.0).collect();
        let vf: Vec<f32> = (0..n_ctx * kvd).map(|i| val(i, 104_729)).collect();
        // The last `ring` positions before `end`, each at row `pos mod ring`.
        let wrap = |x: &[f32], ring: usize, end: usize| {
            let mut r = vec![0f32; ring * kvd];
            for p in end.saturating_sub(ring)..end {
                r[(p % ring) * kvd..][..kvd].copy_from_slice(&x[p * kvd..][..kvd]);
            }
            r
        };
        let f16s = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<f16>>();
        let q8 = |x: &[f32]| {
            let mut b = vec![0u8; x.len() / QK8_0 * Q8_0_BYTES];
            hearth_quant::q8::quantize_row_q8_0(x, &mut b);
            b
        };
        let full = AttnShape { window, ..AttnShape::causal(n_head, n_kv_head, hd) };
        for (n_kv0, n_tok) in [(100, 16), (57, 9), (130, 1), (30, 5)] {
            let q: Vec<f32> = (0..n_tok * n_head * hd).map(|i| val(i, 31) * 2.0).collect();
            let end = n_kv0 + n_tok - 1;
            for f32_path in [false, true] {
                let s = AttnShape { f32_path, ..full };
                let need = window + n_tok - 1;
                for (ring, same) in [(need, true), (need + 11, true), (need - 1, false)] {
                    let (kr, vr) = (wrap(&kf, ring, end), wrap(&vf, ring, end));
                    let (k16, v16, kr16, vr16) = (f16s(&kf), f16s(&vf), f16s(&kr), f16s(&vr));
                    let (k8, v8, kr8, vr8) = (q8(&kf), q8(&vf), q8(&kr), q8(&vr));
                    let pairs: [(KvRows<'_>, KvRows<'_>, KvRows<'_>, KvRows<'_>, bool); 3] = [
                        (KvRows::F16(&k16), KvRows::F16(&v16), KvRows::F16(&kr16), KvRows::F16(&vr16), true),
                        (KvRows::F32(&kf), KvRows::F32(&vf), KvRows::F32(&kr), KvRows::F32(&vr), false),
                        (KvRows::Q8_0(&k8), KvRows::Q8_0(&v8), KvRows::Q8_0(&kr8), KvRows::Q8_0(&vr8), false),
                    ];
                    for (k, v, kr, vr, v_f16) in pairs {
                        let mut a = AttnScratch::new(hd, v_f16);
                        let mut b = AttnScratch::new(hd, v_f16);
                        for kv_head in 0..n_kv_head {
                            let heads = kv_head * group..(kv_head + 1) * group;
                            let want = attend_block(&q, n_head * hd, n_tok, heads.clone(), k, v, kv_head, n_kv0, s, &mut a).to_vec();
                            let got = attend_block(&q, n_head * hd, n_tok, heads, kr, vr, kv_head, n_kv0, AttnShape { ring, ..s }, &mut b);
                            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(got) == bits(&want), same, "ring {ring} n_kv0 {n_kv0} n_tok {n_tok} f32_path {f32_path} v_f16 {v_f16}");
                        }
                    }
                }
            }
        }
    }

}
