//! Where the rows of a one-row-per-lane group start (`avx2_rows`,
//! `avx512_rows`): a group of N weight rows is read block by block, row `i`
//! into lane `i`.

/// Where the rows of a group start.
pub(super) trait Rows {
    /// Row `i`'s byte `off`.
    unsafe fn at(&self, i: usize, off: usize) -> *const u8;
}

/// A full group: rows `s` bytes apart. Addresses are formed as
/// `quarter + {0,1,2,3}·s`, which x86 addressing does in the load itself,
/// so the loop keeps 6 registers instead of one spilled pointer per row.
pub(super) struct Strided {
    base: *const u8,
    s: usize,
    s3: usize,
    s4: usize,
}

impl Strided {
    /// Rows `base`, `base + s`, `base + 2s`, …
    pub fn new(base: *const u8, s: usize) -> Self {
        Strided { base, s, s3: 3 * s, s4: 4 * s }
    }
}

impl Rows for Strided {
    #[inline(always)]
    #[allow(clippy::pointers_in_nomem_asm_block)]
    unsafe fn at(&self, i: usize, off: usize) -> *const u8 {
        // Opaque to the optimiser: otherwise loop strength reduction makes
        // each row's address its own induction variable, spilled. (The asm
        // reads no memory; it only hides where the pointer came from.)
        let mut b = self.base.add(off);
        std::arch::asm!("/* {0} */", inout(reg) b, options(pure, nomem, nostack, preserves_flags));
        let q = b.add((i / 4) * self.s4);
        match i % 4 {
            0 => q,
            1 => q.add(self.s),
            2 => q.add(2 * self.s),
            _ => q.add(self.s3),
        }
    }
}

/// A group past the panel's last row: the missing rows repeat the last one
/// (their lanes are computed and not stored).
pub(super) struct Listed<const N: usize>(pub [*const u8; N]);

impl<const N: usize> Listed<N> {
    /// Rows `r0..r0 + N` of a panel of `n_rows` rows `s` bytes apart from `base`.
    pub fn new(base: *const u8, s: usize, r0: usize, n_rows: usize) -> Self {
        let mut rows = [base; N];
        for (i, r) in rows.iter_mut().enumerate() {
            *r = base.wrapping_add((r0 + i).min(n_rows - 1) * s);
        }
        Listed(rows)
    }
}

impl<const N: usize> Rows for Listed<N> {
    #[inline(always)]
    unsafe fn at(&self, i: usize, off: usize) -> *const u8 {
        self.0[i].add(off)
    }
}
