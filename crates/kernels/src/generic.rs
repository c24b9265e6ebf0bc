//! Portable kernels: `hearth-quant`'s scalar reference, one dot per
//! (row, token). The fallback on every CPU and the twin every SIMD kernel is
//! tested against.

use crate::dispatch::{Kernels, Panel, SimdLevel};
use hearth_quant::{float, k, q8, vec_dot_fn, vec_dot_type};

pub(crate) static KERNELS: Kernels = Kernels {
    level: SimdLevel::Scalar,
    row_lanes: &[],
    quantize_q8_0: q8::quantize_row_q8_0_act,
    quantize_q8_1: q8::quantize_row_q8_1_act,
    quantize_f16: float::quantize_row_f16,
    quantize_q8_k: k::quantize_row_q8_k,
    panel_q4_0: panel,
    panel_q4_1: panel,
    panel_q8_0: panel,
    panel_f32: panel,
    panel_f16: panel,
    panel_bf16: panel,
    panel_q5_0: panel,
    panel_q5_1: panel,
    panel_q2_k: panel,
    panel_q3_k: panel,
    panel_q4_k: panel,
    panel_q5_k: panel,
    panel_q6_k: panel,
    panel_q4_0x8: |p, o| crate::interleaved::by_rows(p, o, panel),
    panel_q4_kx8: |p, o| crate::interleaved::by_rows(p, o, panel),
};

/// Every (row, token) pair through the reference `vec_dot`.
pub(crate) fn panel(p: &Panel<'_>, out: &mut [f32]) {
    p.check(vec_dot_type(p.wty), out);
    let dot = vec_dot_fn(p.wty).expect("panel for a type without a reference dot");
    let wrb = p.wty.row_bytes(p.cols as u64).unwrap() as usize;
    let arb = vec_dot_type(p.wty).row_bytes(p.cols as u64).unwrap() as usize;
    for t in 0..p.n_tokens {
        let a = &p.act[t * p.act_stride..][..arb];
        for r in 0..p.n_rows {
            let w = &p.w[r * p.row_stride..][..wrb];
            out[t * p.n_rows + r] = dot(w, a, p.cols);
        }
    }
}
