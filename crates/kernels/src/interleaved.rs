//! Q4_0X8 and Q4_KX8 panels (`hearth_quant::interleave`) at the levels without a kernel
//! of their own (scalar, NEON): each 8-row group copied back into rows of its row type
//! (Q4_0, Q4_K), then the level's panel for that type on them. The results are that
//! panel's bits, so a grouped tensor multiplies as its row-major form does at every
//! level; the copy costs a pass over the group's bytes, which the x86-64 levels' own
//! kernels (`arch::x86_64::avx2_rows`) do without.

use crate::dispatch::{Panel, PanelFn};
use hearth_quant::interleave::{deinterleave_group, GROUP_ROWS};
use hearth_quant::vec_dot_type;
use std::cell::RefCell;

thread_local! {
    /// A group's rows in their row type and its panel's output: per thread, reused.
    static SCRATCH: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The grouped panel `p` through `row_panel`, a panel of the same level for its row
/// type.
pub(crate) fn by_rows(p: &Panel<'_>, out: &mut [f32], row_panel: PanelFn) {
    let row_ty = p.wty.ungrouped();
    p.check(vec_dot_type(row_ty), out);
    let rb = p.cols / row_ty.block_size() * row_ty.type_size();
    SCRATCH.with_borrow_mut(|(rows, res)| {
        rows.resize(GROUP_ROWS * rb, 0);
        res.resize(GROUP_ROWS * p.n_tokens, 0.0);
        for g in 0..p.n_rows / GROUP_ROWS {
            // The group's blocks (a column view's: contiguous within the group).
            deinterleave_group(p.wty, &p.w[g * GROUP_ROWS * p.row_stride..][..GROUP_ROWS * rb], p.cols, rows);
            let group = Panel { wty: row_ty, w: rows, row_stride: rb, n_rows: GROUP_ROWS, ..*p };
            row_panel(&group, res);
            for t in 0..p.n_tokens {
                out[t * p.n_rows + g * GROUP_ROWS..][..GROUP_ROWS].copy_from_slice(&res[t * GROUP_ROWS..][..GROUP_ROWS]);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::tests::pools;
    use crate::{matmul_with, SimdLevel, ThreadPool, WeightView};
    use hearth_quant::interleave::interleave;
    use hearth_quant::GgmlType;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// `rows` × `cols` random blocks of `ty` (Q4_0 or Q4_K; f16 scales ±2^-12..2^4, some
    /// zero; any other bytes), and `tokens` rows of activations.
    fn weights(ty: GgmlType, rows: usize, cols: usize, tokens: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (wb, halves) = (ty.type_size(), if ty == GgmlType::Q4_K { 2 } else { 1 });
        let mut w = vec![0u8; rows * cols / ty.block_size() * wb];
        for blk in w.chunks_mut(wb) {
            rng.fill(&mut blk[..]);
            for h in 0..halves {
                let d = if rng.gen_range(0..10) == 0 { 0.0 } else { rng.gen_range(-1f32..1.0) * 2f32.powi(rng.gen_range(-12..4)) };
                blk[2 * h..2 * h + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            }
        }
        (w, (0..tokens * cols).map(|_| rng.gen_range(-2f32..2.0)).collect())
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// One matmul at `level` into an output that starts mid cache line (a skew the
    /// panel queue must not follow for Q4_0X8).
    fn run(level: SimdLevel, pool: &ThreadPool, v: &WeightView<'_>, x: &[f32], tokens: usize) -> Vec<f32> {
        let mut out = vec![0f32; v.rows * tokens + 3];
        matmul_with(level, pool, v, x, tokens, &mut out[3..], &mut Vec::new()).unwrap();
        out.split_off(3)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

        /// A Q4_0X8 or Q4_KX8 tensor multiplies to the bits of its row-major form (Q4_0,
        /// Q4_K) at every level, on 1 to 3 threads, decode and prefill, whole and through
        /// row and column views. Control: the row-major bytes read as the grouped type (not
        /// interleaved) give other numbers.
        #[test]
        fn grouped_types_are_their_row_form_at_every_level(
            seed in any::<u64>(), grouped in prop::sample::select(vec![GgmlType::Q4_0X8, GgmlType::Q4_KX8]),
            groups in 1usize..=6, nb in 1usize..=12,
            tokens in prop::sample::select(vec![1usize, 2, 3, 5, 9, 33]), threads in 0usize..3,
        ) {
            let ty = grouped.ungrouped();
            // Q4_K: at most 4 super-blocks (1024 columns) a row.
            let nb = if ty == GgmlType::Q4_K { nb.div_ceil(3) } else { nb };
            let (rows, cols) = (8 * groups, ty.block_size() * nb);
            let (q, x) = weights(ty, rows, cols, tokens, seed);
            let mut ix = vec![0u8; q.len()];
            interleave(grouped, &q, rows, cols, &mut ix).unwrap();
            let qv = WeightView::new(ty, &q, rows, cols).unwrap();
            let xv = WeightView::new(grouped, &ix, rows, cols).unwrap();
            let pool = &pools()[threads];
            for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
                let want = run(level, pool, &qv, &x, tokens);
                prop_assert!(bits(&run(level, pool, &xv, &x, tokens)) == bits(&want), "{:?}: {} x {}, {} tokens", level, rows, cols, tokens);
                // Rows from the second group on; the last column blocks.
                if groups > 1 {
                    let (a, b) = (qv.rows(8..rows), xv.rows(8..rows));
                    prop_assert!(bits(&run(level, pool, &b, &x, tokens)) == bits(&run(level, pool, &a, &x, tokens)), "{:?}: rows 8..", level);
                }
                if nb > 1 {
                    let c0 = ty.block_size() * (nb / 2);
                    let xs: Vec<f32> = x.chunks(cols).flat_map(|t| t[c0..].iter().copied()).collect();
                    let (a, b) = (qv.cols(c0..cols).unwrap(), xv.cols(c0..cols).unwrap());
                    prop_assert!(bits(&run(level, pool, &b, &xs, tokens)) == bits(&run(level, pool, &a, &xs, tokens)), "{:?}: cols {}..", level, c0);
                }
                let raw = WeightView::new(grouped, &q, rows, cols).unwrap();
                if want.iter().any(|v| *v != 0.0) {
                    prop_assert!(bits(&run(level, pool, &raw, &x, tokens)) != bits(&want), "{:?}: the control matched", level);
                }
            }
        }
    }

    /// Where AVX-512 runs in 256-bit halves (AMD Zen 4) the avx512 level decodes the
    /// grouped types with avx2's 8-row tile (`arch::x86_64::split_avx512`). Forced on here,
    /// so every AVX-512 host checks that route: a decode of each grouped type, 1 to 3
    /// threads, gives the bits of its row form at avx512 (as the 16-row tiles do).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_split_avx512_decode_route_gives_the_row_forms_bits() {
        use std::sync::atomic::Ordering::Relaxed;
        if !SimdLevel::Avx512.is_available() {
            return;
        }
        let force = &crate::arch::x86_64::tests::FORCE_SPLIT_AVX512;
        for (grouped, cols) in [(GgmlType::Q4_0X8, 32 * 7), (GgmlType::Q4_KX8, 256 * 3)] {
            let ty = grouped.ungrouped();
            // 5 groups: two 16-row tiles and an odd group at avx512's own tiles.
            let rows = 40;
            let (q, x) = weights(ty, rows, cols, 1, cols as u64);
            let mut ix = vec![0u8; q.len()];
            interleave(grouped, &q, rows, cols, &mut ix).unwrap();
            let qv = WeightView::new(ty, &q, rows, cols).unwrap();
            let xv = WeightView::new(grouped, &ix, rows, cols).unwrap();
            for pool in &pools()[..3] {
                let want = run(SimdLevel::Avx512, pool, &qv, &x, 1);
                assert!(want.iter().any(|v| *v != 0.0));
                force.store(true, Relaxed);
                let got = run(SimdLevel::Avx512, pool, &xv, &x, 1);
                force.store(false, Relaxed);
                assert!(bits(&got) == bits(&want), "{grouped}, {} threads", pool.n_threads());
            }
        }
    }

    #[test]
    fn views_keep_whole_groups() {
        let q = vec![0u8; 16 * 18];
        let e = WeightView::new(GgmlType::Q4_0X8, &q[..12 * 18], 12, 32).unwrap_err();
        assert!(e.to_string().contains("whole groups"), "{e}");
        let v = WeightView::new(GgmlType::Q4_0X8, &q, 16, 32).unwrap();
        assert_eq!(v.rows(8..16).rows, 8);
        assert!(std::panic::catch_unwind(|| v.rows(4..12)).is_err());
        assert!(std::panic::catch_unwind(|| v.row(0)).is_err());
        let mut bad = v;
        bad.rows = 12;
        assert!(bad.validate().is_err());
    }
}
