//! Prefill attention over an f16 KV cache in f32, block by block ("flash attention",
//! Dao et al. 2022, §3.1, Algorithm 1): a batch of at least
//! [`super::F32_PATH_MIN_TOKENS`] tokens of one sequence takes this path, as llama.cpp's
//! `ggml_compute_forward_flash_attn_ext_tiled` does.
//!
//! For one query `q` (f32, `[head_dim]`) at position `p`, which sees cache rows
//! `lo..=p` (`lo = p + 1 − window`, or 0):
//!
//! ```text
//! m = −∞, l = 0, acc = 0                           (running max, sum, [head_dim])
//! for each block B = [64·b, 64·b + 64) of absolute positions that meets lo..=p:
//!     s_j = (Σ_d q_d · k_jd) · scale                for the visible rows j of B
//!     m' = max(m, max_j s_j)
//!     if m' > m: α = e^(m − m'), l = l·α, acc = acc·α
//!     p_j = e^(s_j − m')  (0 for rows of B it does not see)
//!     l = l + Σ_j p_j,  acc = acc + Σ_j p_j · v_j
//! out = acc / l
//! ```
//!
//! Every rounding follows llama.cpp's `ggml_compute_forward_flash_attn_ext_tiled` on an
//! AVX2 build (KV tiles of 64 cache cells, `GGML_FA_TILE_KV`): each score is one FMA chain
//! over `d` from 0, then one multiply by `scale`; `e^(s − m')` is ggml's vectorised
//! `expf` ([`super::expf_ggml`]) and the rescale `α` is libm's `expf`; `Σ_j p_j` is
//! `ggml_vec_soft_max_f32`'s: each run of 8 by [`hsum8`], the 8 run sums added in f64,
//! then added to `l` in f64 and rounded once; `acc` takes the rows in order, one FMA
//! each. So where llama.cpp's cache cells are the absolute positions (one sequence,
//! no ring), the two give the same bits; and a query's result never depends on the tile
//! it was computed in (batch invariance, issue #8), nor on the vector width:
//! [`attend_portable`] is the definition, and the SIMD kernel (`simd::attend`, one body
//! over eight f32 lanes: AVX2 on x86-64, NEON on aarch64) gives its bits.
//!
//! Why blocks instead of the per-row recurrence ([`super::attend`]): the max
//! and its rescale happen once per 64 rows, `e^x` runs on vectors, and the scores of a
//! block are a small matrix product whose K rows (transposed to `[head_dim, 64]`) each
//! feed several queries from registers.

use super::{expf_ggml, row_elems, Tile};
use half::f16;

/// Cache rows per block; blocks start at multiples of this absolute position.
pub(super) const TILE_KV: usize = 64;

/// The fixed 8-lane sum of [`hsum8`] on a scalar array: `(x0+x4)+(x2+x6)` plus
/// `(x1+x5)+(x3+x7)` (the halves of a 256-bit vector added, then twice folded).
#[inline(always)]
fn hsum8(x: [f32; 8]) -> f32 {
    let h = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// The sum of a block's 64 weights in llama.cpp's order (`ggml_vec_soft_max_f32`, AVX2):
/// each run of 8 summed by [`hsum8`] in f32, the eight sums added in order in f64.
#[inline(always)]
fn block_sum(p: &[f32; TILE_KV]) -> f64 {
    p.chunks_exact(8).map(|c| hsum8(c.try_into().unwrap()) as f64).fold(0.0, |a, x| a + x)
}

/// The rows query `i` of the tile sees: `lo..hi` (absolute positions).
#[inline(always)]
fn visible(t: &Tile, i: usize) -> (usize, usize) {
    let hi = t.n_kv0 + i / t.nh;
    (hi.saturating_sub(t.s.window), hi)
}

/// The tile's queries against f16 K and V rows: `q` holds the queries as f32,
/// `[n_tok · nh, head_dim]`; results to `out`, same shape. Portable; the definition of
/// the path's bits (see the module docs).
pub(super) fn attend_portable(t: Tile, q: &[f32], k: &[f16], v: &[f16], out: &mut [f32]) {
    let s = t.s;
    let hd = s.head_dim;
    for i in 0..t.n_tok * t.nh {
        let qi = &q[i * hd..(i + 1) * hd];
        let (lo, hi) = visible(&t, i);
        let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
        let mut acc = vec![0f32; hd];
        let mut b0 = lo / TILE_KV * TILE_KV;
        while b0 < hi {
            let (r0, r1) = (lo.max(b0), hi.min(b0 + TILE_KV));
            let mut sc = [0f32; TILE_KV];
            let mut mx = f32::NEG_INFINITY;
            for j in r0..r1 {
                let mut d = 0f32;
                for (a, b) in qi.iter().zip(&k[row_elems(j, t.kv_head, s)]) {
                    d = a.mul_add(b.to_f32(), d);
                }
                sc[j - b0] = d * s.scale;
                if sc[j - b0] > mx {
                    mx = sc[j - b0];
                }
            }
            let m_new = if mx > m { mx } else { m };
            if m_new > m && m != f32::NEG_INFINITY {
                let alpha = (m - m_new).exp();
                l *= alpha;
                acc.iter_mut().for_each(|a| *a *= alpha);
            }
            m = m_new;
            let mut p = [0f32; TILE_KV];
            for j in r0..r1 {
                p[j - b0] = expf_ggml(sc[j - b0] - m);
            }
            l = (l as f64 + block_sum(&p)) as f32;
            for j in r0..r1 {
                for (a, x) in acc.iter_mut().zip(&v[row_elems(j, t.kv_head, s)]) {
                    *a = p[j - b0].mul_add(x.to_f32(), *a);
                }
            }
            b0 += TILE_KV;
        }
        let inv = if l == 0.0 { 0.0 } else { 1.0 / l };
        for (o, a) in out[i * hd..(i + 1) * hd].iter_mut().zip(&acc) {
            *o = a * inv;
        }
    }
}

/// [`attend_portable`] on the fastest kernel this CPU has; the same bits.
/// `scratch`: [`BlockScratch`](super::BlockScratch) of at least `head_dim`.
pub(super) fn attend(t: Tile, q: &[f32], k: &[f16], v: &[f16], scratch: &mut super::BlockScratch, out: &mut [f32]) {
    if t.s.head_dim.is_multiple_of(8) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c") {
            scratch.fit_tiled(t.s.head_dim, t.n_tok * t.nh);
            // SAFETY: the features were just detected; `scratch` was sized for this tile.
            unsafe { simd::attend_avx2(t, q, k, v, scratch, out) };
            return;
        }
        #[cfg(target_arch = "aarch64")]
        {
            scratch.fit_tiled(t.s.head_dim, t.n_tok * t.nh);
            // SAFETY: Advanced SIMD is baseline on aarch64; `scratch` was sized for this tile.
            unsafe { simd::attend::<super::f32x8::Neon>(t, q, k, v, scratch, out) };
            return;
        }
    }
    let _ = scratch;
    attend_portable(t, q, k, v, out)
}

/// The kernel, written once over eight f32 lanes ([`F32x8`]): AVX2/FMA/F16C on x86-64,
/// NEON on aarch64.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd {
    use super::super::f32x8::{expf_ggml, F32x8};
    use super::super::{row_elems, BlockScratch, Tile};
    use super::{visible, TILE_KV};
    use half::f16;

    /// [`attend`] compiled with AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_avx2(t: Tile, q: &[f32], k: &[f16], v: &[f16], b: &mut BlockScratch, out: &mut [f32]) {
        attend::<super::super::f32x8::Avx2>(t, q, k, v, b, out)
    }

    /// Scores of `Q` queries (`qs`) against a block's K rows (`kt`: `[head_dim, 64]`, from the
    /// half-block in use): per query 4 vectors of 8 rows each, one FMA chain per lane over `d`.
    #[inline(always)]
    unsafe fn scores<V: F32x8, const Q: usize>(hd: usize, qs: [*const f32; Q], kt: *const f32, scale: f32) -> [[V; 4]; Q] {
        // `kt` points at the half-block's first column; rows of `kt` are TILE_KV apart.
        let mut a = [[V::splat(0.0); 4]; Q];
        for d in 0..hd {
            let k = kt.add(d * TILE_KV);
            let mut x = [V::splat(0.0); Q];
            for (x, q) in x.iter_mut().zip(qs) {
                *x = V::splat(*q.add(d));
            }
            for c in 0..4 {
                let kv = V::load(k.add(8 * c));
                for (a, x) in a.iter_mut().zip(x) {
                    a[c] = x.mul_add(kv, a[c]);
                }
            }
        }
        let sv = V::splat(scale);
        for a in a.iter_mut() {
            for x in a.iter_mut() {
                *x = x.mul(sv);
            }
        }
        a
    }

    /// One query's `acc += Σ_j p_j · v_j` over rows `r0..r1` of the block (`vf`: `[64,
    /// head_dim]`), rows in order, one FMA each; in chunks of up to 64 elements (8
    /// accumulators: a lone query has the registers a group shares).
    #[inline(always)]
    unsafe fn pv_head<V: F32x8>(acc: *mut f32, p: &[f32; TILE_KV], vf: *const f32, hd: usize, r0: usize, r1: usize) {
        let mut off = 0;
        while off < hd {
            let (a, v) = ([acc.add(off)], vf.add(off));
            match (hd - off) / 8 {
                1 => pv_same_chunk::<V, 1, 1>(a, [p], v, hd, r0, r1),
                2 => pv_same_chunk::<V, 1, 2>(a, [p], v, hd, r0, r1),
                3 => pv_same_chunk::<V, 1, 3>(a, [p], v, hd, r0, r1),
                4 => pv_same_chunk::<V, 1, 4>(a, [p], v, hd, r0, r1),
                5 => pv_same_chunk::<V, 1, 5>(a, [p], v, hd, r0, r1),
                6 => pv_same_chunk::<V, 1, 6>(a, [p], v, hd, r0, r1),
                7 => pv_same_chunk::<V, 1, 7>(a, [p], v, hd, r0, r1),
                _ => pv_same_chunk::<V, 1, 8>(a, [p], v, hd, r0, r1),
            }
            off += 64;
        }
    }

    /// [`super::attend_portable`] on eight-lane vectors. Each block's K rows are widened
    /// once for the tile into `b.kf` transposed (`[head_dim, 64]`) and its V rows into
    /// `b.vf` (`[64, head_dim]`); queries go three (the heads of one token) or two at a
    /// time, sharing each K and V load.
    #[inline(always)]
    pub(super) unsafe fn attend<V: F32x8>(t: Tile, q: &[f32], k: &[f16], v: &[f16], b: &mut BlockScratch, out: &mut [f32]) {
        let s = t.s;
        let hd = s.head_dim;
        let nq = t.n_tok * t.nh;
        let (m, l, acc) = (&mut b.m[..nq], &mut b.sum[..nq], &mut b.acc[..nq * hd]);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        acc.fill(0.0);
        // Rows any query of the tile sees: the first query's `lo` to the last one's `hi`.
        let (lo_all, _) = visible(&t, 0);
        let (_, hi_all) = visible(&t, nq - 1);
        let (kt, vf, sc) = (b.kf.as_mut_ptr(), b.vf.as_mut_ptr(), b.score.as_mut_ptr());
        let mut b0 = lo_all / TILE_KV * TILE_KV;
        while b0 < hi_all {
            let (u0, u1) = (lo_all.max(b0), hi_all.min(b0 + TILE_KV));
            // Widen the rows of this block that some query sees. Rows outside u0..u1
            // keep stale values: their scores are masked and their V rows never read.
            for j in u0..u1 {
                let e = row_elems(j, t.kv_head, s);
                let vr = v[e].as_ptr();
                for c in (0..hd).step_by(8) {
                    V::load_f16(vr.add(c)).store(vf.add((j - b0) * hd + c));
                }
            }
            // K transposed: whole runs of 8 rows (8 aligned positions) through an 8 × 8
            // transpose, the rows at either end one element at a time.
            let (lo, hi) = (u0 - b0, u1 - b0);
            let (r8a, r8b) = (lo.next_multiple_of(8), hi / 8 * 8);
            let head_end = r8a.min(hi);
            for r in (r8a..r8b).step_by(8) {
                // (No closures here: they are not reliably inlined into target-feature code.)
                let mut kr = [std::ptr::null::<f16>(); 8];
                for (i, p) in kr.iter_mut().enumerate() {
                    *p = k[row_elems(b0 + r + i, t.kv_head, s)].as_ptr();
                }
                for c in (0..hd).step_by(8) {
                    let mut rows = [V::splat(0.0); 8];
                    for (x, p) in rows.iter_mut().zip(kr) {
                        *x = V::load_f16(p.add(c));
                    }
                    let cols = V::transpose8(rows);
                    for (e, col) in cols.into_iter().enumerate() {
                        col.store(kt.add((c + e) * TILE_KV + r));
                    }
                }
            }
            let mut tmp = [0f32; 8];
            for r in (lo..head_end).chain(r8b.max(head_end)..hi) {
                let kr = k[row_elems(b0 + r, t.kv_head, s)].as_ptr();
                for c in (0..hd).step_by(8) {
                    V::load_f16(kr.add(c)).store(tmp.as_mut_ptr());
                    for (e, &x) in tmp.iter().enumerate() {
                        *kt.add((c + e) * TILE_KV + r) = x;
                    }
                }
            }
            // Queries that see rows of this block, three or two at a time.
            let mut i = 0;
            while i < nq {
                let (lo, hi) = visible(&t, i);
                if hi <= b0 || lo >= b0 + TILE_KV {
                    i += 1;
                    continue;
                }
                // The next query, if it sees this block too (else score query i twice).
                let i1 = if i + 1 < nq {
                    let (lo1, hi1) = visible(&t, i + 1);
                    if hi1 > b0 && lo1 < b0 + TILE_KV {
                        i + 1
                    } else {
                        i
                    }
                } else {
                    i
                };
                // Three heads of one token (GQA) see the same rows: scored and summed
                // together, 12 accumulators where a pair has 8 (SmolLM2's attention, 9
                // heads over 3 KV heads, 512 tokens: ~9% faster on Zen 3 at avx2).
                if i1 == i + 1 && i + 2 < nq && (i + 2) / t.nh == i / t.nh {
                    let qs = [q.as_ptr().add(i * hd), q.as_ptr().add((i + 1) * hd), q.as_ptr().add((i + 2) * hd)];
                    for half in 0..2 {
                        let sq = scores::<V, 3>(hd, qs, kt.add(32 * half), s.scale);
                        for (j, sj) in sq.iter().enumerate() {
                            for (c, x) in sj.iter().enumerate() {
                                x.store(sc.add(j * TILE_KV + 32 * half + 8 * c));
                            }
                        }
                    }
                    let (p0, a0, e0) = step::<V>(&t, i, b0, sc, m, l, acc);
                    let (p1, _, _) = step::<V>(&t, i + 1, b0, sc.add(TILE_KV), m, l, acc);
                    let (p2, _, _) = step::<V>(&t, i + 2, b0, sc.add(2 * TILE_KV), m, l, acc);
                    let x = [acc.as_mut_ptr().add(i * hd), acc.as_mut_ptr().add((i + 1) * hd), acc.as_mut_ptr().add((i + 2) * hd)];
                    pv_same::<V, 3>(x, [&p0, &p1, &p2], vf, hd, a0, e0);
                    i += 3;
                    continue;
                }
                // Each lane's FMA chain is independent, so the block's two halves of 32
                // columns are scored one after the other (8 accumulators, not 16).
                for half in 0..2 {
                    let [s0, s1] = scores::<V, 2>(hd, [q.as_ptr().add(i * hd), q.as_ptr().add(i1 * hd)], kt.add(32 * half), s.scale);
                    for c in 0..4 {
                        s0[c].store(sc.add(32 * half + 8 * c));
                        s1[c].store(sc.add(TILE_KV + 32 * half + 8 * c));
                    }
                }
                let (p0, a0, e0) = step::<V>(&t, i, b0, sc, m, l, acc);
                if i1 == i {
                    pv_head::<V>(acc.as_mut_ptr().add(i * hd), &p0, vf, hd, a0, e0);
                } else {
                    let (p1, a1, e1) = step::<V>(&t, i1, b0, sc.add(TILE_KV), m, l, acc);
                    let (x0, x1) = (acc.as_mut_ptr().add(i * hd), acc.as_mut_ptr().add(i1 * hd));
                    pv_pair::<V>([x0, x1], [&p0, &p1], vf, hd, [(a0, e0), (a1, e1)]);
                }
                i = i1 + 1;
            }
            b0 += TILE_KV;
        }
        for (i, &li) in l.iter().enumerate().take(nq) {
            let inv = V::splat(if li == 0.0 { 0.0 } else { 1.0 / li });
            let (a, o) = (acc.as_ptr().add(i * hd), out.as_mut_ptr().add(i * hd));
            for c in (0..hd).step_by(8) {
                V::load(a.add(c)).mul(inv).store(o.add(c));
            }
        }
    }

    /// One query's update for one block from its 64 scores `sc` (rows it does not see
    /// hold anything): max, rescale, weights and sum. Returns the weights and the rows
    /// `a..b` of the block the query sees, for its `Σ p·v` ([`pv_head`], [`pv_pair`]).
    #[inline(always)]
    unsafe fn step<V: F32x8>(t: &Tile, i: usize, b0: usize, sc: *const f32, m: &mut [f32], l: &mut [f32], acc: &mut [f32]) -> ([f32; TILE_KV], usize, usize) {
        let hd = t.s.head_dim;
        let (lo, hi) = visible(t, i);
        let (a, bnd) = (lo.max(b0) - b0, hi.min(b0 + TILE_KV) - b0);
        let ninf = V::splat(f32::NEG_INFINITY);
        let mut sv = [ninf; TILE_KV / 8];
        let mut mk = [V::range_mask(0, 0, 0); TILE_KV / 8];
        let mut mx = ninf;
        for c in 0..TILE_KV / 8 {
            mk[c] = V::range_mask(8 * c, a, bnd);
            sv[c] = V::load(sc.add(8 * c)).select(mk[c], ninf);
            mx = sv[c].max(mx);
        }
        let mx = mx.hmax();
        let m_old = m[i];
        let m_new = if mx > m_old { mx } else { m_old };
        let ai = acc.as_mut_ptr().add(i * hd);
        if m_new > m_old && m_old != f32::NEG_INFINITY {
            let alpha = (m_old - m_new).exp(); // libm's expf, as llama.cpp's `expf(Mold - Mnew)`
            l[i] *= alpha;
            let av = V::splat(alpha);
            for c in (0..hd).step_by(8) {
                V::load(ai.add(c)).mul(av).store(ai.add(c));
            }
        }
        m[i] = m_new;
        let (mv, zero) = (V::splat(m_new), V::splat(0.0));
        let mut p = [0f32; TILE_KV];
        let mut sum = 0f64;
        for c in 0..TILE_KV / 8 {
            let e = expf_ggml(sv[c].sub(mv)).select(mk[c], zero);
            e.store(p.as_mut_ptr().add(8 * c));
            sum += e.hsum() as f64;
        }
        l[i] = (l[i] as f64 + sum) as f32;
        (p, a, bnd)
    }

    /// [`pv_head`] of two queries (accumulators `acc`, weights `p`, rows `r[q].0..r[q].1`)
    /// over the same V rows: the rows both see share each V load (one load, two FMAs, in
    /// chunks of 32 elements: 8 accumulators), the rows only one sees go alone before or
    /// after them. Each query still takes its rows in order, one FMA each, so its bits
    /// are [`pv_head`]'s. Ranges that do not overlap: one query after the other.
    #[inline(always)]
    unsafe fn pv_pair<V: F32x8>(acc: [*mut f32; 2], p: [&[f32; TILE_KV]; 2], vf: *const f32, hd: usize, r: [(usize, usize); 2]) {
        let (lo, hi) = (r[0].0.max(r[1].0), r[0].1.min(r[1].1));
        if lo >= hi {
            pv_head::<V>(acc[0], p[0], vf, hd, r[0].0, r[0].1);
            pv_head::<V>(acc[1], p[1], vf, hd, r[1].0, r[1].1);
            return;
        }
        // The rows before `lo` belong to the query that starts first, those after `hi`
        // to the one that ends last.
        let first = if r[0].0 < r[1].0 { 0 } else { 1 };
        let last = if r[0].1 > r[1].1 { 0 } else { 1 };
        let rows = [r[first].0, lo, hi, r[last].1];
        let mut off = 0;
        while off < hd {
            let (a, v) = ([acc[0].add(off), acc[1].add(off)], vf.add(off));
            match (hd - off) / 8 {
                1 => pv_pair_chunk::<V, 1>(a, p, v, hd, rows, first, last),
                2 => pv_pair_chunk::<V, 2>(a, p, v, hd, rows, first, last),
                3 => pv_pair_chunk::<V, 3>(a, p, v, hd, rows, first, last),
                _ => pv_pair_chunk::<V, 4>(a, p, v, hd, rows, first, last),
            }
            off += 32;
        }
    }

    /// [`pv_head`] of `Q` queries that see the same rows `r0..r1` of the block: each V
    /// load serves all of them (chunks of 32 elements: `4·Q` accumulators); each query
    /// still takes its rows in order, one FMA each, so its bits are `pv_head`'s.
    #[inline(always)]
    unsafe fn pv_same<V: F32x8, const Q: usize>(acc: [*mut f32; Q], p: [&[f32; TILE_KV]; Q], vf: *const f32, hd: usize, r0: usize, r1: usize) {
        let mut off = 0;
        while off < hd {
            let mut a = acc;
            for a in a.iter_mut() {
                *a = a.add(off);
            }
            let v = vf.add(off);
            match (hd - off) / 8 {
                1 => pv_same_chunk::<V, Q, 1>(a, p, v, hd, r0, r1),
                2 => pv_same_chunk::<V, Q, 2>(a, p, v, hd, r0, r1),
                3 => pv_same_chunk::<V, Q, 3>(a, p, v, hd, r0, r1),
                _ => pv_same_chunk::<V, Q, 4>(a, p, v, hd, r0, r1),
            }
            off += 32;
        }
    }

    /// [`pv_same`] on `8·N` elements of the head.
    #[inline(always)]
    unsafe fn pv_same_chunk<V: F32x8, const Q: usize, const N: usize>(acc: [*mut f32; Q], p: [&[f32; TILE_KV]; Q], vf: *const f32, hd: usize, r0: usize, r1: usize) {
        let mut x = load_acc::<V, Q, N>(acc);
        pv_shared::<V, Q, N>(&mut x, p, vf, hd, r0, r1);
        store_acc::<V, Q, N>(x, acc);
    }

    /// `8·N` accumulator elements of each of `Q` queries.
    #[inline(always)]
    unsafe fn load_acc<V: F32x8, const Q: usize, const N: usize>(acc: [*mut f32; Q]) -> [[V; N]; Q] {
        let mut x = [[V::splat(0.0); N]; Q];
        for (x, a) in x.iter_mut().zip(acc) {
            for (c, x) in x.iter_mut().enumerate() {
                *x = V::load(a.add(8 * c));
            }
        }
        x
    }

    /// [`load_acc`]'s inverse.
    #[inline(always)]
    unsafe fn store_acc<V: F32x8, const Q: usize, const N: usize>(x: [[V; N]; Q], acc: [*mut f32; Q]) {
        for (x, a) in x.iter().zip(acc) {
            for (c, x) in x.iter().enumerate() {
                x.store(a.add(8 * c));
            }
        }
    }

    /// `x[q] += Σ_j p[q]_j · v_j` over rows `r0..r1` that all `Q` queries see: one V load
    /// per 8 elements for all of them, each query's rows in order, one FMA each.
    #[inline(always)]
    unsafe fn pv_shared<V: F32x8, const Q: usize, const N: usize>(x: &mut [[V; N]; Q], p: [&[f32; TILE_KV]; Q], vf: *const f32, hd: usize, r0: usize, r1: usize) {
        for row in r0..r1 {
            let vr = vf.add(row * hd);
            let mut w = [V::splat(0.0); Q];
            for (w, p) in w.iter_mut().zip(p) {
                *w = V::splat(p[row]);
            }
            for c in 0..N {
                let v = V::load(vr.add(8 * c));
                for (x, w) in x.iter_mut().zip(w) {
                    x[c] = w.mul_add(v, x[c]);
                }
            }
        }
    }

    /// [`pv_pair`] on `8·N` elements of the head: rows `rows[0]..rows[1]` of query
    /// `first` alone, `rows[1]..rows[2]` of both, `rows[2]..rows[3]` of query `last`.
    #[inline(always)]
    unsafe fn pv_pair_chunk<V: F32x8, const N: usize>(acc: [*mut f32; 2], p: [&[f32; TILE_KV]; 2], vf: *const f32, hd: usize, rows: [usize; 4], first: usize, last: usize) {
        let mut x = load_acc::<V, 2, N>(acc);
        // (Constant indices into `x`, so that it stays in registers.)
        if first == 0 {
            pv_shared::<V, 1, N>(std::array::from_mut(&mut x[0]), [p[0]], vf, hd, rows[0], rows[1]);
        } else {
            pv_shared::<V, 1, N>(std::array::from_mut(&mut x[1]), [p[1]], vf, hd, rows[0], rows[1]);
        }
        pv_shared::<V, 2, N>(&mut x, p, vf, hd, rows[1], rows[2]);
        if last == 0 {
            pv_shared::<V, 1, N>(std::array::from_mut(&mut x[0]), [p[0]], vf, hd, rows[2], rows[3]);
        } else {
            pv_shared::<V, 1, N>(std::array::from_mut(&mut x[1]), [p[1]], vf, hd, rows[2], rows[3]);
        }
        store_acc::<V, 2, N>(x, acc);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AttnShape, BlockScratch, F16DotOrder};
    use super::*;
    use rand::{Rng, SeedableRng};

    fn shape(n_head: usize, n_head_kv: usize, head_dim: usize, window: usize, ring: usize) -> AttnShape {
        AttnShape {
            n_head,
            n_head_kv,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            ring,
            f32_path: true,
            f16_dot: F16DotOrder::Avx512,
        }
    }

    /// The kernel this CPU runs gives [`attend_portable`]'s bits for every head width
    /// (multiples of 8 up to 256, chunks of 64 and a tail), tile shape, window and ring,
    /// and both are within float error of the exact softmax (f64): a kernel that skipped
    /// the sum's rescale (tried) fails here.
    #[test]
    fn kernel_matches_the_portable_definition_and_exact_softmax() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x711e);
        for &(hd, n_kv_head, nh) in &[(64, 3, 3), (128, 2, 4), (8, 1, 1), (40, 2, 3), (96, 1, 5), (256, 1, 2), (72, 2, 1)] {
            for &(n_kv0, n_tok, window, ring) in
                &[(1, 16, usize::MAX, usize::MAX), (31, 7, usize::MAX, usize::MAX), (64, 9, usize::MAX, usize::MAX), (100, 12, 20, usize::MAX), (90, 5, 33, 40), (3, 1, usize::MAX, usize::MAX)]
            {
                if n_tok * nh > super::super::BLOCK_MAX_QUERIES {
                    continue;
                }
                let s = shape(nh * n_kv_head, n_kv_head, hd, window, ring);
                let rows = (n_kv0 + n_tok).min(ring);
                let spread = if hd == 96 { 6.0 } else { 1.5 };
                let k: Vec<f16> = (0..rows * n_kv_head * hd).map(|_| f16::from_f32(rng.gen_range(-spread..spread))).collect();
                let v: Vec<f16> = (0..rows * n_kv_head * hd).map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0))).collect();
                let nq = n_tok * nh;
                let q: Vec<f32> = (0..nq * hd).map(|_| rng.gen_range(-spread..spread)).collect();
                for kv_head in 0..n_kv_head {
                    let t = Tile { n_tok, nh, kv_head, n_kv0, s };
                    let mut want = vec![0f32; nq * hd];
                    attend_portable(t, &q, &k, &v, &mut want);
                    let mut got = vec![0f32; nq * hd];
                    attend(t, &q, &k, &v, &mut BlockScratch::new(8), &mut got);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "hd {hd} nh {nh} n_kv0 {n_kv0} n_tok {n_tok} window {window} ring {ring}");
                    // Against the exact softmax in f64 over the same f16 rows.
                    for i in 0..nq {
                        let (lo, hi) = visible(&t, i);
                        let at = |j: usize| row_elems(j, kv_head, s);
                        let sc: Vec<f64> = (lo..hi)
                            .map(|j| q[i * hd..][..hd].iter().zip(&k[at(j)]).map(|(&a, b)| a as f64 * b.to_f64()).sum::<f64>() * s.scale as f64)
                            .collect();
                        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                        let tot: f64 = w.iter().sum();
                        for d in 0..hd {
                            let e = (lo..hi).zip(&w).map(|(j, w)| w * v[at(j)][d].to_f64()).sum::<f64>() / tot;
                            let g = got[i * hd + d] as f64;
                            assert!((g - e).abs() < 1e-4 * (1.0 + e.abs()), "hd {hd} query {i} d {d}: {g} vs exact {e}");
                        }
                    }
                }
            }
        }
    }

    /// A query's result depends only on its position and the absolute block grid, not
    /// on the rows its tile neighbours see: the last token alone and inside a tile of 16.
    /// Control: moving the query one position earlier changes its bits.
    #[test]
    fn a_query_alone_equals_the_same_query_in_a_tile() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xb10c);
        let (hd, n_ctx) = (64, 150);
        let s = shape(1, 1, hd, usize::MAX, usize::MAX);
        let k: Vec<f16> = (0..n_ctx * hd).map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0))).collect();
        let v: Vec<f16> = (0..n_ctx * hd).map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0))).collect();
        let q: Vec<f32> = (0..16 * hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let mut sc = BlockScratch::new(hd);
        let mut tile = vec![0f32; 16 * hd];
        attend(Tile { n_tok: 16, nh: 1, kv_head: 0, n_kv0: 120, s }, &q, &k, &v, &mut sc, &mut tile);
        let last = &q[15 * hd..];
        let mut alone = vec![0f32; hd];
        attend(Tile { n_tok: 1, nh: 1, kv_head: 0, n_kv0: 135, s }, last, &k, &v, &mut sc, &mut alone);
        assert_eq!(&tile[15 * hd..], &alone[..]);
        let mut earlier = vec![0f32; hd];
        attend(Tile { n_tok: 1, nh: 1, kv_head: 0, n_kv0: 134, s }, last, &k, &v, &mut sc, &mut earlier);
        assert_ne!(alone, earlier);
    }
}
