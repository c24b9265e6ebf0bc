//! The GGML tensor type table: ids as stored in GGUF, block sizes and bytes per block.
//!
//! Source: ggml's `ggml.h` (`enum ggml_type`) and `ggml-common.h` (block structs).
//! Types whose ids were removed from ggml (4, 5: Q4_2/Q4_3; 31-33: the old
//! interleaved Q4_0_4_4 etc.) are not listed and are rejected by the GGUF reader.

/// A tensor element type as numbered in GGUF files (`ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    /// hearth's own: Q4_0 blocks of 8 rows interleaved ([`crate::interleave`]). Not a
    /// ggml type: ggml's ids stop below 64, and llama.cpp refuses a file that holds it.
    Q4_0X8 = 1000,
    /// hearth's own: Q4_K super-blocks of 8 rows interleaved ([`crate::interleave`]),
    /// likewise refused by llama.cpp.
    Q4_KX8 = 1001,
}

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: &'static [GgmlType] = &[
        Self::F32, Self::F16, Self::Q4_0, Self::Q4_1, Self::Q5_0, Self::Q5_1, Self::Q8_0,
        Self::Q8_1, Self::Q2_K, Self::Q3_K, Self::Q4_K, Self::Q5_K, Self::Q6_K, Self::Q8_K,
        Self::IQ2_XXS, Self::IQ2_XS, Self::IQ3_XXS, Self::IQ1_S, Self::IQ4_NL, Self::IQ3_S,
        Self::IQ2_S, Self::IQ4_XS, Self::I8, Self::I16, Self::I32, Self::I64, Self::F64,
        Self::IQ1_M, Self::BF16, Self::TQ1_0, Self::TQ2_0, Self::MXFP4, Self::Q4_0X8,
        Self::Q4_KX8,
    ];

    /// The type with GGUF id `id`, or `None` for an unknown or retired id.
    pub fn from_u32(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// Elements per block (1 for plain scalar types).
    pub const fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 | Q4_0X8 => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_xxx)` in ggml-common.h).
    pub const fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            // Per row and block on average: an 8-row group's block is 8 × 18 bytes (8 ×
            // 144 for Q4_KX8).
            Q4_0 | Q4_0X8 => 2 + 16,
            Q4_1 => 2 + 2 + 16,
            Q5_0 => 2 + 4 + 16,
            Q5_1 => 2 + 2 + 4 + 16,
            Q8_0 => 2 + 32,
            Q8_1 => 2 + 2 + 32,
            Q2_K => 16 + 64 + 2 + 2,
            Q3_K => 32 + 64 + 12 + 2,
            Q4_K | Q4_KX8 => 2 + 2 + 12 + 128,
            Q5_K => 2 + 2 + 12 + 32 + 128,
            Q6_K => 128 + 64 + 16 + 2,
            Q8_K => 4 + 256 + 32,
            IQ2_XXS => 2 + 64,
            IQ2_XS => 2 + 64 + 8,
            IQ3_XXS => 2 + 96,
            IQ1_S => 2 + 32 + 16,
            IQ4_NL => 2 + 16,
            IQ3_S => 2 + 64 + 8 + 32 + 4,
            IQ2_S => 2 + 64 + 8 + 8,
            IQ4_XS => 2 + 2 + 4 + 128,
            IQ1_M => 32 + 16 + 8,
            TQ1_0 => 2 + 48 + 4,
            TQ2_0 => 2 + 64,
            MXFP4 => 1 + 16,
        }
    }

    /// Rows stored together: 8 for [`GgmlType::Q4_0X8`] and [`GgmlType::Q4_KX8`] (a tensor of it holds whole groups
    /// of 8 rows, each block of a group 8 rows' blocks side by side, see
    /// [`crate::interleave`]), 1 for every ggml type (rows one after another).
    pub const fn group_rows(self) -> usize {
        match self {
            GgmlType::Q4_0X8 | GgmlType::Q4_KX8 => crate::interleave::GROUP_ROWS,
            _ => 1,
        }
    }

    /// The row type this type's groups hold: Q4_0 for [`GgmlType::Q4_0X8`], Q4_K for
    /// [`GgmlType::Q4_KX8`], the type
    /// itself for every other. The two hold the same bytes, moved
    /// ([`crate::interleave`]).
    pub const fn ungrouped(self) -> Self {
        match self {
            GgmlType::Q4_0X8 => GgmlType::Q4_0,
            GgmlType::Q4_KX8 => GgmlType::Q4_K,
            t => t,
        }
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// The name ggml uses (`ggml_type_name`), e.g. `q4_0`, `f16`.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32", F16 => "f16", Q4_0 => "q4_0", Q4_1 => "q4_1", Q5_0 => "q5_0",
            Q5_1 => "q5_1", Q8_0 => "q8_0", Q8_1 => "q8_1", Q2_K => "q2_K", Q3_K => "q3_K",
            Q4_K => "q4_K", Q5_K => "q5_K", Q6_K => "q6_K", Q8_K => "q8_K",
            IQ2_XXS => "iq2_xxs", IQ2_XS => "iq2_xs", IQ3_XXS => "iq3_xxs", IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl", IQ3_S => "iq3_s", IQ2_S => "iq2_s", IQ4_XS => "iq4_xs",
            I8 => "i8", I16 => "i16", I32 => "i32", I64 => "i64", F64 => "f64", IQ1_M => "iq1_m",
            BF16 => "bf16", TQ1_0 => "tq1_0", TQ2_0 => "tq2_0", MXFP4 => "mxfp4",
            Q4_0X8 => "q4_0x8", Q4_KX8 => "q4_Kx8",
        }
    }

    /// Parse a type name, case-insensitively (`Q4_K`, `q4_k`, `f16`).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(t as u32), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_u32(4), None);
        assert_eq!(GgmlType::from_u32(999), None);
        assert_eq!(GgmlType::from_u32(1000), Some(GgmlType::Q4_0X8));
        assert_eq!(GgmlType::from_u32(1001), Some(GgmlType::Q4_KX8));
        assert_eq!(GgmlType::from_name("q4_kx8"), Some(GgmlType::Q4_KX8));
    }

    #[test]
    fn sizes_match_ggml_common() {
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q4_1.type_size(), 20);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(577), None);
    }
}
