//! Architecture-specific kernels. Each submodule builds [`Kernels`] tables
//! for the levels its CPU family has; `dispatch` picks one at run time.

use crate::dispatch::{Kernels, SimdLevel};

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) mod f16;
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) mod tail;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;

/// The table for a SIMD `level` if this CPU supports it.
pub(crate) fn kernels(level: SimdLevel) -> Option<&'static Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::kernels(level)
    }
    #[cfg(target_arch = "aarch64")]
    {
        aarch64::kernels(level)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
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
