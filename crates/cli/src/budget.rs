//! `--mem-budget`, `--cold`, `--window-io`: running a model within a memory budget by
//! streaming its layers through a sliding window (`hearth_memory::Window`).

use anyhow::{Context as _, Result};
use hearth_memory::plan::{plan, plan_window, ModelSummary, PlanParams, WindowPlan, DEFAULT_MEMBW_GBPS};
use hearth_memory::{ReadMode, Window};
use hearth_model::{Context, Model, SourceStats};
use std::path::Path;

/// Flags of the memory budget (generate, chat, perplexity, bench).
#[derive(clap::Args, Debug, Clone)]
pub struct BudgetArgs {
    /// Stay within this much RAM (peak RSS), e.g. 1.5GiB, 512MiB, 2G, 3000000000
    /// (K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000). When the model does
    /// not fit mapped, its layers are streamed from disk through a window of as many
    /// layers as the budget holds, read ahead while the current one computes; fails with
    /// the smallest workable budget when even one layer does not fit.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub mem_budget: Option<u64>,
    /// Drop the model file from the page cache before loading, so reads come from disk
    #[arg(long)]
    pub cold: bool,
    /// How the window reads the file: direct (O_DIRECT, bypassing the page cache) or
    /// buffered (through it)
    #[arg(long, value_enum, default_value_t = WindowIo::Direct, requires = "mem_budget")]
    pub window_io: WindowIo,
    /// Read each streamed layer only when the forward pass needs it, never ahead (a
    /// baseline for measuring what prefetching saves)
    #[arg(long, requires = "mem_budget")]
    pub no_prefetch: bool,
}

/// `--window-io` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowIo {
    /// O_DIRECT reads straight into the window (falls back to buffered where unsupported)
    Direct,
    /// Ordinary reads through the page cache
    Buffered,
}

impl BudgetArgs {
    /// Before loading: `--cold`.
    pub fn before_load(&self, path: &Path) -> Result<()> {
        if self.cold {
            hearth_memory::drop_page_cache(path).with_context(|| format!("--cold: dropping {} from the page cache", path.display()))?;
        }
        Ok(())
    }

    /// After the context exists: with `--mem-budget`, plan the window and attach it (or
    /// say the mapped model fits). `logits_all`: the run wants every position's logits
    /// (perplexity). Prints the decision to stderr; returns the window plan.
    pub fn apply(&self, model: &Model, ctx: &mut Context, logits_all: bool) -> Result<Option<WindowPlan>> {
        self.apply_units(model, ctx, logits_all, true)
    }

    /// [`Self::apply`] for a pipelined-ring device: only its own layers (and, on the head
    /// device, `head`, the output head) count and stream. When they do not all fit, no unit
    /// is pinned: every slot streams, so the next window is prefetched while the token is
    /// on the other devices.
    pub fn apply_ring(&self, model: &Model, ctx: &mut Context, head: bool) -> Result<Option<WindowPlan>> {
        self.apply_units(model, ctx, false, head)
    }

    fn apply_units(&self, model: &Model, ctx: &mut Context, logits_all: bool, head: bool) -> Result<Option<WindowPlan>> {
        let Some(budget) = self.mem_budget else { return Ok(None) };
        let summary = ModelSummary::from_gguf(&model.file)?;
        let params =
            PlanParams { n_ctx: ctx.n_ctx(), n_batch: ctx.n_batch(), n_threads: ctx.n_threads(), cache_type: ctx.cache_type(), logits_all };
        let mut p = plan(&summary, params, hearth_memory::available_bytes().unwrap_or(0), DEFAULT_MEMBW_GBPS);
        let ring = ctx.ring_windows().is_some();
        let units = ctx.units(head)?;
        let sizes: Vec<u64> = units.iter().map(|r| hearth_memory::window::aligned_len(r) as u64).collect();
        if ring {
            // Only this device's layers and their KV cache.
            p.kv_cache_bytes = ctx.kv_bytes() as u64;
            p.peak_rss_bytes = units.iter().map(|r| r.len() as u64).sum::<u64>() + p.kv_cache_bytes + p.scratch_bytes + p.overhead_bytes;
        }
        let mut w = plan_window(&p, &sizes, budget, 0.0).map_err(|min| {
            let q8 = if ctx.cache_type() == hearth_model::CacheType::Q8_0 { "" } else { ", or --cache-type q8_0" };
            anyhow::anyhow!(
                "--mem-budget {} is too small: KV cache {} + scratch {} + runtime {} + one unit of {} + a margin of {} \
                 (16 MiB + budget/32, for error in the runtime estimate) need at least {} ({} bytes) \
                 (or lower --ctx-size / --batch-size{q8})",
                mib(budget),
                mib(p.kv_cache_bytes),
                mib(p.scratch_bytes),
                mib(p.overhead_bytes),
                mib(min.slot_bytes),
                mib(min.margin_bytes),
                mib_up(min.min_budget_bytes),
                min.min_budget_bytes
            )
        })?;
        if p.peak_rss_bytes + w.margin_bytes <= budget {
            eprintln!(
                "--mem-budget {}: the model fits mapped (predicted peak RSS {}), no window needed",
                mib(budget),
                mib(p.peak_rss_bytes)
            );
            return Ok(None);
        }
        let mode = match self.window_io {
            WindowIo::Direct => ReadMode::Direct,
            WindowIo::Buffered => ReadMode::Buffered,
        };
        if ring && w.slots < w.n_units {
            w.pinned = 0;
            w.read_bytes_per_token = sizes.iter().sum();
        }
        // Drop the mapping's pages (header, norms) before the window's slots fill up, so the
        // two never count together in the peak.
        model.file.release_pages();
        let window = Window::open_full(model.file.path(), units, w.slots, w.pinned, mode, !self.no_prefetch)?;
        eprintln!(
            "--mem-budget {}: window of {} slots × {} for {} units ({} kept, {} streamed through {} slots) + KV cache {} + scratch {} \
             + runtime {} = predicted peak RSS {}; {} read per token ({} reads){}",
            mib(budget),
            w.slots,
            mib(w.slot_bytes),
            w.n_units,
            w.pinned,
            w.n_units - w.pinned,
            w.slots - w.pinned,
            mib(p.kv_cache_bytes),
            mib(p.scratch_bytes),
            mib(p.overhead_bytes),
            mib(w.peak_rss_bytes),
            mib(w.read_bytes_per_token),
            if window.is_direct() { "O_DIRECT" } else { "buffered" },
            if w.slots == 1 { "; one slot: no read-ahead, every layer waits for its read" } else { "" },
        );
        ctx.set_source(Box::new(window));
        Ok(Some(w))
    }
}

/// One line on weight I/O over `passes` forward passes.
pub fn io_line(what: &str, io: &SourceStats, secs: f64, passes: usize) -> String {
    let per = |v: f64| v / passes.max(1) as f64;
    format!(
        "{what}: {:.1} MB read at {:.2} GB/s; per forward pass {:.0} ms = compute {:.0} ms + waiting for I/O {:.0} ms, {:.1} MB read",
        io.bytes_read as f64 / 1e6,
        io.read_gbps(),
        per(secs * 1e3),
        per((secs - io.wait_secs).max(0.0) * 1e3),
        per(io.wait_secs * 1e3),
        per(io.bytes_read as f64 / 1e6),
    )
}

/// A [`SourceStats`] as JSON (bytes, seconds, GB/s).
pub fn io_json(io: &SourceStats) -> serde_json::Value {
    serde_json::json!({
        "bytes_read": io.bytes_read, "read_secs": io.read_secs, "read_gbps": io.read_gbps(),
        "wait_secs": io.wait_secs, "units_loaded": io.units_loaded,
    })
}

fn mib(b: u64) -> String {
    crate::common::mib(b)
}

/// MiB with one decimal, rounded up (a minimum the user may copy).
fn mib_up(b: u64) -> String {
    format!("{:.1} MiB", (b as f64 / (1024.0 * 1024.0) * 10.0).ceil() / 10.0)
}

/// `1.5GiB`, `512MiB`, `512M`, `2G`, `1000000`, `3GB` → bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 1.5GiB, 512MiB, 2G, 3000000000)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => return Err(format!("unknown size unit {u:?} in {s:?} (use K, M, G, KiB, MiB, GiB, KB, MB, GB)")),
    };
    let b = v * mult;
    if !(1.0..1e18).contains(&b) {
        return Err(format!("{s:?} is not a usable size (between 1 byte and 1 EB)"));
    }
    Ok(b as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "GiB", "1.5XB", "-1G", "0", "1e400"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
