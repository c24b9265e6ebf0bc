//! K-quants: 256-element super-blocks with per-sub-block scales
//! (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and Q8_K, the activation format they dot with.
//!
//! Layouts are ggml-common.h's; dequantization and the generic dots follow
//! ggml-quants.c / ggml-cpu/quants.c statement by statement (including the
//! 8-lane `aux32`/`sums` accumulation order of the generic dots), and the
//! quantizers are ggml's `quantize_row_q*_K_ref` (the weighted searches
//! `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`), so a file written
//! here has the bytes llama.cpp's reference quantizer would write.
//!
//! Blocks contain only integers and f16/f32, every bit pattern is valid and
//! there is no padding, so they are copied to and from byte slices with
//! unaligned reads (little-endian hosts only).

// Indexed loops mirror ggml's C loops statement by statement, which is what
// makes them checkable against it.
#![allow(clippy::needless_range_loop)]

use crate::types::QK_K;
use half::f16;

#[cfg(not(target_endian = "little"))]
compile_error!("hearth-quant's K-quant block copies assume a little-endian host");

/// `block_q2_K`: 16 sub-blocks of 16; `x = d * (sc & 15) * q - dmin * (sc >> 4)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ2K {
    /// Scale (low nibble) and min (high nibble) of each sub-block.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// `block_q3_K`: 16 sub-blocks of 16; `x = d * (sc - 32) * (q - 4 * !hbit)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ3K {
    /// High bits of the quants.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants.
    pub qs: [u8; QK_K / 4],
    /// 16 6-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// `block_q4_K`: 8 sub-blocks of 32; `x = d * sc * q - dmin * m` (6-bit sc, m).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each, packed.
    pub scales: [u8; 12],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: as Q4_K with a fifth bit per quant.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each, packed.
    pub scales: [u8; 12],
    /// Fifth bits.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits.
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 16 sub-blocks of 16; `x = d * sc * (q - 32)` (i8 sc).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// `block_q8_K`: `x = d * q`, with the sums of each 16 quants.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    /// Scale (f32, unlike the other formats).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

macro_rules! pod_block {
    ($($t:ty),*) => {$(
        impl $t {
            /// Bytes per block.
            pub const SIZE: usize = std::mem::size_of::<Self>();

            /// Read a block from its first [`Self::SIZE`] bytes.
            #[inline]
            pub fn read(b: &[u8]) -> Self {
                let b = &b[..Self::SIZE];
                // SAFETY: `b` holds SIZE bytes; the struct is plain integers and
                // floats without padding (size asserted), valid for any bits.
                unsafe { std::ptr::read_unaligned(b.as_ptr() as *const Self) }
            }

            /// Write the block to the first [`Self::SIZE`] bytes of `out`.
            #[inline]
            pub fn write(&self, out: &mut [u8]) {
                let out = &mut out[..Self::SIZE];
                // SAFETY: as `read`.
                unsafe { std::ptr::write_unaligned(out.as_mut_ptr() as *mut Self, *self) }
            }
        }
    )*};
}
pod_block!(BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (|x| < 2^22).
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// ggml's `get_scale_min_k4`: scale and min `j` (0..8) of a Q4_K/Q5_K block.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (before the -32 offset is applied: 0..63).
#[inline]
pub fn q3_k_scales(s: &[u8; 12]) -> [i8; 16] {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    let a = |i: usize| u32::from_le_bytes(s[4 * i..4 * i + 4].try_into().unwrap());
    let (a0, a1, tmp) = (a(0), a(1), a(2));
    let aux = [
        (a0 & KM2) | ((tmp & KM1) << 4),
        (a1 & KM2) | (((tmp >> 2) & KM1) << 4),
        ((a0 >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
        ((a1 >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (aux[i / 4] >> (8 * (i % 4))) as u8 as i8;
    }
    out
}

// ---- ggml's quantization searches --------------------------------------

/// `make_qx_quants` (with `qw = NULL`): symmetric `nmax`-level quants of `x`
/// into `l` (offset by `nmax`), returning the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], rmse_type: i32) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let clampq = |v: i32| v.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (li, &v) in l.iter_mut().zip(x) {
            *li = (nmax + clampq(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 { (-rmse_type, true) } else { (rmse_type, false) };
    let weight = |v: f32| match rmse_type {
        1 => v * v,
        2 => 1.0,
        3 => v.abs(),
        _ => v.abs().sqrt(),
    };
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = clampq(nearest_int(iscale * v));
        *li = (q + nmax) as i8;
        let w = weight(v);
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = clampq(nearest_int(iscale * v));
            let w = weight(v);
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + clampq(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse = true`: quants in `l` (offset by `nmax`).
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let li = l[i] as f32;
            let mut slx = sumlx - w * v * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    sumlx / suml2
}

/// `make_qkx2_quants`: asymmetric quants 0..=nmax of `x` with `weights`,
/// searching `nstep + 1` scales. Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

// ---- Q8_K ----------------------------------------------------------------

/// `quantize_row_q8_K_ref`: `iscale = -127 / max` (max: the signed value of
/// largest magnitude), `q = min(127, nearest_int(iscale * x))`, `d = 1 / iscale`,
/// `bsums` the sums of each 16 quants. An all-zero block is all zero bytes
/// (ggml leaves its `bsums` unwritten; zero is what a zeroed buffer holds).
pub fn quantize_row_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ8K::SIZE)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
        if amax != 0.0 {
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(x) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = g.iter().map(|&q| q as i16).sum();
            }
            b.d = 1.0 / iscale;
        }
        b.write(out);
    }
}

/// Dequantize Q8_K (`x = d * q`).
pub fn dequantize_row_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ8K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ8K::read(b);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}

/// The generic K-quant dot's inner loop: `aux32[l] += scale * q8[l] * a[l]`
/// over groups of 8, `scale_of(g)` for 8-group `g`.
#[inline]
fn aux32_dot(a: &[i8; QK_K], q8: &[i8; QK_K], scale_of: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for g in 0..QK_K / 8 {
        let sc = scale_of(g);
        for l in 0..8 {
            let p = (q8[8 * g + l] as i16).wrapping_mul(a[8 * g + l] as i16);
            aux32[l] += sc * p as i32;
        }
    }
    aux32
}

/// `sums[l] += d * aux32[l]`, then (at the end) `sumf += sums[l]` in lane order.
#[inline]
fn add_lanes(sums: &mut [f32; 8], d: f32, aux32: &[i32; 8]) {
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
}

// ---- Q2_K ----------------------------------------------------------------

/// `quantize_row_q2_K_ref`.
pub fn quantize_row_q2_k(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ2K::SIZE)) {
        let mut l = [0u8; QK_K];
        let mut weights = [0f32; 16];
        let (mut mins, mut scales) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut b = BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = f16::from_f32(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = f16::from_f32(max_min / Q4SCALE);
        }
        for j in 0..16 {
            let d = b.d.to_f32() * (b.scales[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = b.dmin.to_f32() * (b.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for j in (0..QK_K).step_by(128) {
            for k in 0..32 {
                b.qs[j / 4 + k] = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
            }
        }
        b.write(out);
    }
}

/// `dequantize_row_q2_K`.
pub fn dequantize_row_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ2K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ2K::read(b);
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        let mut o = 0;
        let mut is = 0;
        for n in (0..QK_K).step_by(128) {
            let q = &b.qs[n / 4..n / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
                    for k in 0..16 {
                        y[o] = dl * ((q[16 * half + k] >> shift) & 3) as f32 - ml;
                        o += 1;
                    }
                }
            }
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`.
pub fn vec_dot_q2_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let x = BlockQ2K::read(&w[i * BlockQ2K::SIZE..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::SIZE..]);
        let summs: i32 = (0..16).map(|j| y.bsums[j] as i32 * (x.scales[j] >> 4) as i32).sum();
        let dall = y.d * x.d.to_f32();
        let dmin = y.d * x.dmin.to_f32();
        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = 0;
        for k in 0..QK_K / 128 {
            let q2 = &x.qs[32 * k..32 * k + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let d = (x.scales[is] & 0xf) as i32;
                    is += 1;
                    let isuml: i32 = (0..16)
                        .map(|l| y.qs[q8 + 16 * half + l] as i32 * ((q2[16 * half + l] >> shift) & 3) as i32)
                        .sum();
                    isum += d * isuml;
                }
                q8 += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

// ---- Q3_K ----------------------------------------------------------------

/// `quantize_row_q3_K_ref`.
pub fn quantize_row_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ3K::SIZE)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut b = BlockQ3K { hmask: [0; 32], qs: [0; 64], scales: [0; 12], d: f16::ZERO };
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // C: `int8_t l = nearest_int(..)` then clamp to -32..31 and add 32.
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    b.scales[j] = (q & 0xf) as u8;
                } else {
                    b.scales[j - 8] |= ((q & 0xf) << 4) as u8;
                }
                b.scales[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
            }
            b.d = f16::from_f32(1.0 / iscale);
        }
        for j in 0..16 {
            let lo = if j < 8 { b.scales[j] & 0xf } else { b.scales[j - 8] >> 4 };
            let sc = (lo | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
            let d = b.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        let (mut m, mut hm) = (0, 1u8);
        for lj in l.iter_mut() {
            if *lj > 3 {
                b.hmask[m] |= hm;
                *lj -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm = hm.wrapping_shl(1);
            }
        }
        for j in (0..QK_K).step_by(128) {
            for k in 0..32 {
                b.qs[j / 4 + k] = (l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6)) as u8;
            }
        }
        b.write(out);
    }
}

/// Q3_K's 256 quants, -4..=3, in element order.
fn q3_k_values(x: &BlockQ3K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    let mut m = 1u8;
    let mut o = 0;
    for n in 0..QK_K / 128 {
        let q3 = &x.qs[32 * n..32 * n + 32];
        for shift in [0, 2, 4, 6] {
            for l in 0..32 {
                a[o + l] = ((q3[l] >> shift) & 3) as i8 - if x.hmask[l] & m != 0 { 0 } else { 4 };
            }
            o += 32;
            m = m.wrapping_shl(1);
        }
    }
    a
}

/// `dequantize_row_q3_K`.
pub fn dequantize_row_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ3K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ3K::read(b);
        let d_all = b.d.to_f32();
        let sc = q3_k_scales(&b.scales);
        let q = q3_k_values(&b);
        for (j, (yj, qj)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d_all * (sc[j] as i32 - 32) as f32;
            for (o, &v) in yj.iter_mut().zip(qj) {
                *o = dl * v as f32;
            }
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K_generic`.
pub fn vec_dot_q3_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sums = [0f32; 8];
    for i in 0..n / QK_K {
        let x = BlockQ3K::read(&w[i * BlockQ3K::SIZE..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::SIZE..]);
        let sc = q3_k_scales(&x.scales);
        let aux32 = aux32_dot(&q3_k_values(&x), &y.qs, |g| sc[g / 2] as i32 - 32);
        add_lanes(&mut sums, x.d.to_f32() * y.d, &aux32);
    }
    sums.iter().fold(0f32, |s, &v| s + v)
}

// ---- Q4_K / Q5_K -----------------------------------------------------------

/// The Q4_K/Q5_K super-block: per 32-element sub-block `make_qkx2_quants`
/// (weights `sqrt(mean x²) + |x|`), 6-bit scales and mins, then requantize
/// with the rounded scales. Returns (d, dmin, packed scales, quants).
fn quantize_k_super(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; 32];
    let (mut mins, mut scales) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sc = [0u8; 12];
    for j in 0..8 {
        // C: `uint8_t ls = nearest_int(..)` (wraps) then MIN(63, ls).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &sc);
        let dj = d.to_f32() * s as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, sc, l)
}

/// `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ4K::SIZE)) {
        let (d, dmin, scales, l) = quantize_k_super(x, 15, -1.0, 20);
        let mut qs = [0u8; QK_K / 2];
        for (j, q) in (0..QK_K).step_by(64).zip(qs.chunks_exact_mut(32)) {
            for k in 0..32 {
                q[k] = l[j + k] | (l[j + k + 32] << 4);
            }
        }
        BlockQ4K { d, dmin, scales, qs }.write(out);
    }
}

/// `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ5K::SIZE)) {
        let (d, dmin, scales, l) = quantize_k_super(x, 31, -0.5, 15);
        let (mut qs, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 8]);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (n, ql) in (0..QK_K).step_by(64).zip(qs.chunks_exact_mut(32)) {
            for j in 0..32 {
                let (mut l1, mut l2) = (l[n + j], l[n + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 = m1.wrapping_shl(2);
            m2 = m2.wrapping_shl(2);
        }
        BlockQ5K { d, dmin, scales, qh, qs }.write(out);
    }
}

/// Q4_K's quants 0..=15 in element order.
fn q4_k_values(qs: &[u8; QK_K / 2]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for j in 0..QK_K / 64 {
        for l in 0..32 {
            a[64 * j + l] = (qs[32 * j + l] & 0xf) as i8;
            a[64 * j + 32 + l] = (qs[32 * j + l] >> 4) as i8;
        }
    }
    a
}

/// Q5_K's quants 0..=31 in element order.
fn q5_k_values(x: &BlockQ5K) -> [i8; QK_K] {
    let mut a = q4_k_values(&x.qs);
    for j in 0..QK_K / 32 {
        for l in 0..32 {
            // ggml: `a[l] += (hm[l] & m ? 16 : 0)` with m = 1 << j.
            a[32 * j + l] += (((x.qh[l] >> j) & 1) << 4) as i8;
        }
    }
    a
}

/// The 8 scales and 8 mins of a Q4_K/Q5_K block.
fn k4_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], mn[j]) = get_scale_min_k4(j, s);
    }
    (sc, mn)
}

fn dequantize_k4(d: f16, dmin: f16, scales: &[u8; 12], q: &[i8; QK_K], y: &mut [f32]) {
    let (d, min) = (d.to_f32(), dmin.to_f32());
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let (dj, mj) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            y[32 * j + l] = dj * q[32 * j + l] as f32 - mj;
        }
    }
}

/// `dequantize_row_q4_K`.
pub fn dequantize_row_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ4K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ4K::read(b);
        dequantize_k4(b.d, b.dmin, &b.scales, &q4_k_values(&b.qs), y);
    }
}

/// `dequantize_row_q5_K`.
pub fn dequantize_row_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ5K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ5K::read(b);
        dequantize_k4(b.d, b.dmin, &b.scales, &q5_k_values(&b), y);
    }
}

/// The Q4_K/Q5_K generic dot of one block: lanes `d * aux32`, and `dmin * sumi(mins)`.
#[inline]
fn dot_k4(sums: &mut [f32; 8], sumf: &mut f32, d: f16, dmin: f16, scales: &[u8; 12], q: &[i8; QK_K], y: &BlockQ8K) {
    let (sc, mn) = k4_scales_mins(scales);
    let sumi: i32 = (0..16).map(|j| y.bsums[j] as i32 * mn[j / 2] as i32).sum();
    let aux32 = aux32_dot(q, &y.qs, |g| sc[g / 4] as i32);
    add_lanes(sums, d.to_f32() * y.d, &aux32);
    *sumf -= dmin.to_f32() * y.d * sumi as f32;
}

/// `ggml_vec_dot_q4_K_q8_K_generic`.
pub fn vec_dot_q4_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut sums, mut sumf) = ([0f32; 8], 0f32);
    for i in 0..n / QK_K {
        let x = BlockQ4K::read(&w[i * BlockQ4K::SIZE..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::SIZE..]);
        dot_k4(&mut sums, &mut sumf, x.d, x.dmin, &x.scales, &q4_k_values(&x.qs), &y);
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
pub fn vec_dot_q5_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mut sums, mut sumf) = ([0f32; 8], 0f32);
    for i in 0..n / QK_K {
        let x = BlockQ5K::read(&w[i * BlockQ5K::SIZE..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::SIZE..]);
        dot_k4(&mut sums, &mut sumf, x.d, x.dmin, &x.scales, &q5_k_values(&x), &y);
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

// ---- Q6_K ----------------------------------------------------------------

/// `quantize_row_q6_K_ref`.
pub fn quantize_row_q6_k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BlockQ6K::SIZE)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..16 {
            let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        let mut b = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO };
        if max_abs_scale < GROUP_MAX_EPS {
            b.write(out);
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16::from_f32(1.0 / iscale);
        for ib in 0..16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..16 {
            let d = b.d.to_f32() * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let l = l.map(|v| v as u8);
        for (j, (ql, qh)) in (0..QK_K).step_by(128).zip(b.ql.chunks_exact_mut(64).zip(b.qh.chunks_exact_mut(32))) {
            for k in 0..32 {
                let (q1, q2, q3, q4) = (l[j + k], l[j + k + 32], l[j + k + 64], l[j + k + 96]);
                ql[k] = (q1 & 0xf) | ((q3 & 0xf) << 4);
                ql[k + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
                qh[k] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        b.write(out);
    }
}

/// Q6_K's quants -32..=31 in element order.
fn q6_k_values(x: &BlockQ6K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for n in 0..QK_K / 128 {
        let (ql, qh, o) = (&x.ql[64 * n..], &x.qh[32 * n..], 128 * n);
        for l in 0..32 {
            a[o + l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[o + l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[o + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[o + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

/// `dequantize_row_q6_K`: `(d * sc) * q`.
pub fn dequantize_row_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BlockQ6K::SIZE).zip(dst.chunks_exact_mut(QK_K)) {
        let b = BlockQ6K::read(b);
        let d = b.d.to_f32();
        let q = q6_k_values(&b);
        for (j, (yj, qj)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let ds = d * b.scales[j] as f32;
            for (o, &v) in yj.iter_mut().zip(qj) {
                *o = ds * v as f32;
            }
        }
    }
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
pub fn vec_dot_q6_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sums = [0f32; 8];
    for i in 0..n / QK_K {
        let x = BlockQ6K::read(&w[i * BlockQ6K::SIZE..]);
        let y = BlockQ8K::read(&a[i * BlockQ8K::SIZE..]);
        let aux32 = aux32_dot(&q6_k_values(&x), &y.qs, |g| x.scales[g / 2] as i32);
        add_lanes(&mut sums, x.d.to_f32() * y.d, &aux32);
    }
    sums.iter().fold(0f32, |s, &v| s + v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (x, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (126.6, 127), (-3.2, -3)] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn q8_k_known_vector() {
        // max = -127 -> iscale = -127 / max = 1, d = 1; bsums of each 16.
        let mut x = [0f32; QK_K];
        x[0] = -127.0;
        x[1] = 2.5; // 2 (half to even)
        x[17] = 126.6; // 127
        x[18] = -100.0;
        let mut b = [0u8; 292];
        quantize_row_q8_k(&x, &mut b);
        let q = BlockQ8K::read(&b);
        assert_eq!(q.d, 1.0);
        assert_eq!(&q.qs[..2], &[-127, 2]);
        assert_eq!(&q.qs[17..19], &[127, -100]);
        assert_eq!(q.bsums[0], -125);
        assert_eq!(q.bsums[1], 27);
        assert!(q.bsums[2..].iter().all(|&s| s == 0));
        let mut y = [0f32; QK_K];
        dequantize_row_q8_k(&b, &mut y);
        assert_eq!(y[0], -127.0);
        assert_eq!(y[1], 2.0);
        // A positive maximum gives a negative scale (iscale = -127 / max).
        quantize_row_q8_k(&[1f32; QK_K], &mut b);
        assert_eq!(BlockQ8K::read(&b).d, -1.0 / 127.0);
    }

    #[test]
    fn q4_k_scale_packing_round_trips() {
        // get_scale_min_k4 inverts the packing in quantize_k_super.
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 37 % 101) as f32 - 50.0) * (1.0 + (i / 32) as f32)).collect();
        let (d, dmin, sc, _) = quantize_k_super(&x, 15, -1.0, 20);
        let (s, m) = k4_scales_mins(&sc);
        // The sub-block with the largest range gets scale 63.
        assert_eq!(*s.iter().max().unwrap(), 63);
        assert_eq!(*m.iter().max().unwrap(), 63);
        assert!(d.to_f32() > 0.0 && dmin.to_f32() > 0.0);
    }

    #[test]
    fn q3_k_scales_unpack() {
        // Scale j: low 4 bits in byte j % 8 (nibble j / 8), high 2 in byte 8 + j % 4 (pair j / 4).
        let want: [i8; 16] = std::array::from_fn(|j| (j as i8 * 4 + 1) % 64);
        let mut s = [0u8; 12];
        for (j, &v) in want.iter().enumerate() {
            let v = v as u8;
            s[j % 8] |= (v & 0xf) << (4 * (j / 8));
            s[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
        }
        assert_eq!(q3_k_scales(&s), want);
    }
}
