//! Run-time kernel selection.
//!
//! Every kernel family exists once per [`SimdLevel`]; a [`Kernels`] table of
//! plain function pointers is built per level and the best one the CPU
//! supports is picked once ([`Kernels::active`]). `HEARTH_SIMD=scalar|avx2|avxvnni|avx512`
//! (x86-64) or `scalar|neon|neon+dotprod|neon+i8mm` (aarch64) caps the level (a level of the
//! other architecture is warned about and ignored) (tests, benchmarks, bisecting a numerical difference).
//! Nothing requires `-C target-cpu=native`.
//!
//! Table entries are safe `fn`s: the arch modules wrap their
//! `#[target_feature]` functions, and a level's table is only handed out after
//! the CPU was seen to have its features.

use hearth_quant::GgmlType;
use std::sync::OnceLock;

/// A SIMD instruction-set level that kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust: `hearth-quant`'s reference code.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C with AVX-VNNI (VEX `vpdpbusd` on 256-bit vectors:
    /// Intel since Alder Lake, AMD Zen 5). Bit-identical to `Avx2`.
    AvxVnni,
    /// x86-64 AVX-512 F+BW+VL (+ VNNI `vpdpbusd` for integer dots when present).
    Avx512,
    /// aarch64 Advanced SIMD (NEON), every ARMv8-A core: integer dots by
    /// widening multiplies (`smull`, `sadalp`). Bit-identical to `Avx2`.
    Neon,
    /// NEON with the dot-product extension (`sdot`: ARMv8.2-A's FEAT_DotProd,
    /// Cortex-A55/A76 and later, Apple M1). Bit-identical to `Neon`.
    NeonDot,
    /// `NeonDot` with the int8 matrix multiplies (`smmla`: FEAT_I8MM,
    /// Cortex-A510/A710/X2 and later, Neoverse V1/N2, Apple M2 and later;
    /// not the Pi 5's Cortex-A76, which has dotprod only) for Q4_0's and
    /// Q4_K's prefill tiles. Bit-identical to `NeonDot`.
    NeonI8mm,
}

impl SimdLevel {
    /// Every level, lowest first.
    /// (Levels of the other architecture are never available, so a cap
    /// orders only the levels of the CPU's own family.)
    pub const ALL: [SimdLevel; 7] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::AvxVnni,
        SimdLevel::Avx512,
        SimdLevel::Neon,
        SimdLevel::NeonDot,
        SimdLevel::NeonI8mm,
    ];

    /// `"scalar"`, `"avx2"`, `"avxvnni"`, `"avx512"`, `"neon"`, `"neon+dotprod"` or `"neon+i8mm"`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::AvxVnni => "avxvnni",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Neon => "neon",
            SimdLevel::NeonDot => "neon+dotprod",
            SimdLevel::NeonI8mm => "neon+i8mm",
        }
    }

    /// Parse a [`name`](Self::name), case-insensitively.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether the level belongs to this build's CPU architecture (scalar: every one).
    pub fn is_native(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            SimdLevel::Avx2 | SimdLevel::AvxVnni | SimdLevel::Avx512 => cfg!(target_arch = "x86_64"),
            SimdLevel::Neon | SimdLevel::NeonDot | SimdLevel::NeonI8mm => cfg!(target_arch = "aarch64"),
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        Kernels::for_level(self).is_some()
    }

    /// The best available level, capped by `HEARTH_SIMD` when set. Chosen once.
    pub fn active() -> Self {
        Kernels::active().level
    }
}

/// Name of the active level (see [`SimdLevel::active`]); `"avx512"` means
/// AVX-512, with VNNI integer dots if [`has_vnni`] says so.
pub fn simd_level() -> &'static str {
    SimdLevel::active().name()
}

/// Whether the quantized dot kernels of the avx512 level use VNNI.
pub fn has_vnni() -> bool {
    crate::arch::has_vnni()
}

/// One panel of a matmul: rows (in whole [`PANEL_ROWS`], as many as `matmul`'s
/// `PANEL_OUT` output buffer holds) × up to [`PANEL_TOKENS`] tokens; a batch of
/// at most `PANEL_TOKENS` tokens is one panel of all of them.
/// `out[t * n_rows + r]` receives dot(weight row r, activation row t).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Panel<'a> {
    pub wty: GgmlType,
    /// Weight bytes from the panel's first row on.
    pub w: &'a [u8],
    pub row_stride: usize,
    pub n_rows: usize,
    /// Elements per row (a whole number of `wty` blocks).
    pub cols: usize,
    /// Activation bytes (type `Kernels::act_type(wty)`) from the first token on.
    pub act: &'a [u8],
    pub act_stride: usize,
    pub n_tokens: usize,
    /// For kernels that ask for them (`Kernels::act_sum_offset`): per token,
    /// per 32-element block, `-K * sum(a)` as little-endian i32, `[n_tokens,
    /// cols / 32]`; empty otherwise. (Only x86-64 kernels ask for them yet.)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub act_sums: &'a [u8],
}

/// Rows per panel (with several tokens): the unit of work handed to a thread.
pub(crate) const PANEL_ROWS: usize = 16;
/// Tokens per panel: bounds the on-stack output tile.
pub(crate) const PANEL_TOKENS: usize = 32;

impl Panel<'_> {
    /// Assert every byte the kernels will touch is in bounds, so they can use
    /// unchecked pointer reads. Cheap: a few multiplies per panel.
    #[inline]
    pub fn check(&self, aty: GgmlType, out: &[f32]) {
        let wrb = self.wty.row_bytes(self.cols as u64).expect("panel cols not whole blocks") as usize;
        let arb = aty.row_bytes(self.cols as u64).expect("panel cols not whole blocks") as usize;
        assert!(self.n_rows >= 1 && self.n_tokens >= 1);
        // Whole groups of a type that stores rows in groups (`WeightView`'s invariant).
        assert!(self.n_rows.is_multiple_of(self.wty.group_rows()), "panel rows not whole groups");
        let span = crate::view::span(self.wty, self.n_rows, self.row_stride, wrb).expect("panel span overflows");
        assert!(self.w.len() >= span, "panel weights out of bounds");
        assert!(self.act.len() >= (self.n_tokens - 1) * self.act_stride + arb, "panel activations out of bounds");
        assert!(out.len() >= self.n_rows * self.n_tokens, "panel output too small");
    }
}

/// Computes one [`Panel`].
pub(crate) type PanelFn = fn(&Panel<'_>, &mut [f32]);
/// Quantizes a row of f32 into activation blocks (`src.len()` whole blocks).
pub(crate) type QuantFn = fn(&[f32], &mut [u8]);

/// The kernels of one [`SimdLevel`].
pub(crate) struct Kernels {
    pub level: SimdLevel,
    /// The weight types whose panels hold one weight row per lane
    /// (`arch::x86_64::avx2_rows`, `avx512_rows`), in llama.cpp's repacked
    /// kernels' order rather than its plain one; Q4_0 and Q8_0 ones read
    /// `Panel::act_sums`.
    pub row_lanes: &'static [GgmlType],
    pub quantize_q8_0: QuantFn,
    pub quantize_q8_1: QuantFn,
    pub quantize_f16: QuantFn,
    pub quantize_q8_k: QuantFn,
    pub panel_q4_0: PanelFn,
    pub panel_q4_1: PanelFn,
    pub panel_q8_0: PanelFn,
    pub panel_f32: PanelFn,
    pub panel_f16: PanelFn,
    pub panel_bf16: PanelFn,
    pub panel_q5_0: PanelFn,
    pub panel_q5_1: PanelFn,
    pub panel_q2_k: PanelFn,
    pub panel_q3_k: PanelFn,
    pub panel_q4_k: PanelFn,
    pub panel_q5_k: PanelFn,
    pub panel_q6_k: PanelFn,
    pub panel_q4_0x8: PanelFn,
    pub panel_q4_kx8: PanelFn,
}

impl Kernels {
    /// The panel kernel for weights of type `ty`.
    pub fn panel(&self, ty: GgmlType) -> Option<PanelFn> {
        Some(match ty {
            GgmlType::Q4_0 => self.panel_q4_0,
            GgmlType::Q4_1 => self.panel_q4_1,
            GgmlType::Q8_0 => self.panel_q8_0,
            GgmlType::F32 => self.panel_f32,
            GgmlType::F16 => self.panel_f16,
            GgmlType::BF16 => self.panel_bf16,
            GgmlType::Q5_0 => self.panel_q5_0,
            GgmlType::Q5_1 => self.panel_q5_1,
            GgmlType::Q2_K => self.panel_q2_k,
            GgmlType::Q3_K => self.panel_q3_k,
            GgmlType::Q4_K => self.panel_q4_k,
            GgmlType::Q5_K => self.panel_q5_k,
            GgmlType::Q6_K => self.panel_q6_k,
            GgmlType::Q4_0X8 => self.panel_q4_0x8,
            GgmlType::Q4_KX8 => self.panel_q4_kx8,
            _ => return None,
        })
    }

    /// The activation type the panel for weights `wty` reads: ggml's
    /// `vec_dot_type(wty)`, except F16 weights at the avx512 and NEON levels,
    /// whose panels read f32 activations holding f16-rounded values (the same
    /// numbers as ggml's f16 activations, stored so the tiles multiply them
    /// without a convert per use: see [`crate::matmul`]). The avx2 levels read
    /// f16: half the bytes, which keeps a tile's activations in L1 on long rows
    /// (see `panel_f16` in `arch/x86_64/avx2.rs`).
    pub fn act_type(&self, wty: GgmlType) -> GgmlType {
        match (self.level, wty) {
            (SimdLevel::Scalar | SimdLevel::Avx2 | SimdLevel::AvxVnni, _) => hearth_quant::vec_dot_type(wty),
            (_, GgmlType::F16) => GgmlType::F32,
            _ => hearth_quant::vec_dot_type(wty),
        }
    }

    /// The quantizer of the activations the panel for `wty` reads (see [`act_type`](Self::act_type)).
    pub fn act_quantize(&self, wty: GgmlType) -> Option<QuantFn> {
        match self.act_type(wty) {
            GgmlType::F32 if wty == GgmlType::F16 => Some(crate::matmul::quantize_f16_as_f32),
            aty => self.quantize(aty),
        }
    }

    /// `K` when the panel for `wty` reads `-K * sum(a)` per activation block
    /// (`Panel::act_sums`): its unsigned weights are `w + K`.
    pub fn act_sum_offset(&self, wty: GgmlType) -> Option<i32> {
        // A grouped type's panels (Q4_0X8, Q4_KX8) read what the level's panels of its row type
        // read: they are its arithmetic (x86-64), or call it (`interleaved::by_rows`).
        let wty = wty.ungrouped();
        if !self.row_lanes.contains(&wty) {
            return None;
        }
        match wty {
            GgmlType::Q4_0 => Some(8),
            GgmlType::Q8_0 => Some(128),
            _ => None,
        }
    }

    /// The activation quantizer for activation type `aty`.
    pub fn quantize(&self, aty: GgmlType) -> Option<QuantFn> {
        Some(match aty {
            GgmlType::Q8_0 => self.quantize_q8_0,
            GgmlType::Q8_1 => self.quantize_q8_1,
            GgmlType::F16 => self.quantize_f16,
            GgmlType::Q8_K => self.quantize_q8_k,
            GgmlType::F32 => hearth_quant::float::quantize_row_f32,
            GgmlType::BF16 => hearth_quant::float::quantize_row_bf16,
            _ => return None,
        })
    }

    /// The table for `level`, if this CPU supports it.
    pub fn for_level(level: SimdLevel) -> Option<&'static Kernels> {
        match level {
            SimdLevel::Scalar => Some(&crate::generic::KERNELS),
            _ => crate::arch::kernels(level),
        }
    }

    /// The best supported table, capped by `HEARTH_SIMD`. Chosen once.
    pub fn active() -> &'static Kernels {
        static ACTIVE: OnceLock<&'static Kernels> = OnceLock::new();
        ACTIVE.get_or_init(|| {
            let cap = std::env::var("HEARTH_SIMD").ok().and_then(|s| {
                let names: Vec<&str> = SimdLevel::ALL.iter().filter(|l| l.is_native()).map(|l| l.name()).collect();
                let level = SimdLevel::from_name(&s);
                match level {
                    // A typo must not silently mean "no cap".
                    None if !s.trim().is_empty() => {
                        eprintln!("warning: HEARTH_SIMD={s:?} is none of {}; using the best level", names.join(", "));
                    }
                    // The cap orders one architecture's levels: another's means nothing here.
                    Some(l) if !l.is_native() => {
                        eprintln!(
                            "warning: HEARTH_SIMD={s:?} is a level of another CPU architecture (this one has {}); using the best level",
                            names.join(", ")
                        );
                        return None;
                    }
                    _ => {}
                }
                level
            });
            SimdLevel::ALL
                .into_iter()
                .rev()
                .filter(|&l| cap.is_none_or(|c| l <= c))
                .find_map(Kernels::for_level)
                .unwrap_or(&crate::generic::KERNELS)
        })
    }
}
