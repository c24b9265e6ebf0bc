//! Small elementwise ops the architectures add to llama's: GELU-gated FFNs (Gemma),
//! per-head RMSNorm of Q and K (Qwen3, Gemma 3), bias rows (Qwen2) and scaling.
//! Each follows the ggml CPU op it stands for, so results track llama.cpp's.

use half::f16;
use std::sync::OnceLock;

/// GELU, tanh approximation (Hendrycks & Gimpel, arXiv 1606.08415, §2), as ggml's
/// `ggml_gelu_f32` compiles: GCC contracts its `1 + a·x·x` into one fused multiply-add
/// (`-ffp-contract=fast`, the default, with FMA under `GGML_NATIVE`). Written as that
/// fma, the f16 table equals libggml-cpu's `ggml_table_gelu_f16` in all 63,488 finite
/// entries (read from the library with ctypes after `ggml_cpu_init`); without it one
/// entry (x = −1.999) is an f16 ulp off. `mul_add` is correctly rounded on any CPU.
fn gelu(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// ggml's `ggml_table_gelu_f16`: GELU of every f16 value, rounded to f16 (what the CPU
/// backend looks up with `GGML_GELU_FP16`, its default).
fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_f32(gelu(f16::from_bits(b).to_f32()))).collect())
}

/// GEGLU: `gate = gelu(gate) · up`, elementwise, as ggml's `ggml_vec_geglu_f32`: GELU is
/// looked up for the input rounded to f16 (0 below −10, the identity above 10).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

/// RMSNorm of every `w.len()`-wide row of `x` in place, times `w`: a per-head norm of
/// `x: [n_tokens, n_heads * head_dim]` with `w: [head_dim]` (ggml's `rms_norm` on the
/// heads, then `mul`).
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for r in x.chunks_exact_mut(n) {
        let ss: f64 = r.iter().map(|&v| (v * v) as f64).sum();
        let scale = 1.0 / ((ss / n as f64) as f32 + eps).sqrt();
        for (v, &g) in r.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `x[t] += b` for every row `t` of `x: [n, b.len()]` (a bias, ggml's broadcast `add`).
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for r in x.chunks_exact_mut(b.len()) {
        for (v, &c) in r.iter_mut().zip(b) {
            *v += c;
        }
    }
}

/// `x *= s`, elementwise (ggml's `scale`).
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geglu_looks_gelu_up_at_f16_inputs() {
        let xs = [-12.0f32, -10.0, -3.3, -0.5, 0.0, 1e-3, 0.7, 2.5, 9.99, 10.0, 30.0];
        let mut g = xs.to_vec();
        let up = vec![2.0f32; xs.len()];
        geglu(&mut g, &up);
        for (&x, &y) in xs.iter().zip(&g) {
            let want = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * 2.0
            } else {
                f16::from_f32(gelu(f16::from_f32(x).to_f32())).to_f32() * 2.0
            };
            assert_eq!(y, want, "x = {x}");
            // And close to the exact (erf) GELU: the tanh form is within ~5e-4 of it, the
            // table adds f16 rounding.
            let exact = 0.5 * x as f64 * (1.0 + libm_erf(x as f64 / 2f64.sqrt()));
            assert!((y as f64 / 2.0 - exact).abs() <= 1e-3 + 2e-3 * exact.abs(), "x = {x}: {y} vs {exact}");
        }
    }

    /// The one table entry where the fused `1 + a·x·x` matters: x = −1.9990234 (f16 bits
    /// 0xBFFF) is 0xA9D3 in libggml-cpu's `ggml_table_gelu_f16`; unfused it is an ulp off.
    #[test]
    fn gelu_table_entry_follows_ggmls_fused_multiply_add() {
        assert_eq!(gelu_table()[0xBFFF].to_bits(), 0xA9D3);
        let x = f16::from_bits(0xBFFF).to_f32();
        let unfused = 0.5 * x * (1.0 + (0.797_884_6f32 * x * (1.0 + 0.044715f32 * x * x)).tanh());
        assert_ne!(f16::from_f32(unfused).to_bits(), 0xA9D3);
    }

    /// erf by its Taylor series (|x| < 3) or 1 (beyond): enough for the check above.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() > 3.0 {
            return x.signum();
        }
        let (mut term, mut sum) = (x, x);
        for n in 1..60 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn head_norm_normalises_each_head() {
        let mut x: Vec<f32> = (0..12).map(|i| i as f32 - 5.0).collect();
        rmsnorm_inplace(&mut x, &[1.0; 4], 0.0);
        for h in x.chunks(4) {
            let rms = (h.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
            assert!((rms - 1.0).abs() < 1e-6);
        }
        let mut y = vec![1.0f32; 6];
        add_rows(&mut y, &[1.0, 2.0, 3.0]);
        assert_eq!(y, [2.0, 3.0, 4.0, 2.0, 3.0, 4.0]);
        scale(&mut y, 0.5);
        assert_eq!(y[..3], [1.0, 1.5, 2.0]);
    }
}
