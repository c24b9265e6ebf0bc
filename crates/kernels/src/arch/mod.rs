//! Architecture-specific kernels. Each submodule builds [`Kernels`] tables
//! for the levels its CPU family has; `dispatch` picks one at run time.
//! An `aarch64` (NEON) module would sit beside `x86_64` with the same shape.

use crate::dispatch::{Kernels, SimdLevel};

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;

/// The table for a SIMD `level` if this CPU supports it.
pub(crate) fn kernels(level: SimdLevel) -> Option<&'static Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::kernels(level)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        None
    }
}

/// Whether the AVX-512 level's integer dots use VNNI.
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::has_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
