//! `--mem-budget`, `--cold`, `--window-io`: running a model within a memory budget by
//! streaming its layers through a sliding window (`hearth_memory::Window`).

use anyhow::{Context as _, Result};
use hearth_engine::BudgetOptions;
use hearth_memory::ReadMode;
use hearth_model::SourceStats;
use std::path::Path;

/// Flags of the memory budget (generate, chat, perplexity, bench).
#[derive(clap::Args, Debug, Clone)]
pub struct BudgetArgs {
    /// Stay within this much RAM (peak RSS), e.g. 1.5GiB, 512MiB, 2G, 3000000000
    /// (K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000). When the model does
    /// not fit mapped, its layers are streamed from disk through a window of as many
    /// layers as the budget holds, read ahead while the current one computes; fails with
    /// the smallest workable budget when even one layer does not fit. A mixture of experts
    /// keeps experts instead (an expert cache: the layers without their experts, and as
    /// many experts as the rest holds, the ones each token misses read from disk). A ring
    /// worker budgets only its own layers, checked when a coordinator's session starts.
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
    /// Before loading: `--cold`, and a warning when `--mem-budget` is more than this machine
    /// has available (the budget then cannot keep the run out of swap or the OOM killer).
    pub fn before_load(&self, path: &Path) -> Result<()> {
        if let (Some(budget), Some(available)) = (self.mem_budget, hearth_memory::available_bytes()) {
            if let Some(w) = over_available(budget, available) {
                eprintln!("{w}");
            }
        }
        if self.cold {
            hearth_memory::drop_page_cache(path).with_context(|| format!("--cold: dropping {} from the page cache", path.display()))?;
        }
        Ok(())
    }

    /// The engine's budget options, when `--mem-budget` is given.
    pub fn options(&self) -> Option<BudgetOptions> {
        let read_mode = match self.window_io {
            WindowIo::Direct => ReadMode::Direct,
            WindowIo::Buffered => ReadMode::Buffered,
        };
        self.mem_budget.map(|bytes| BudgetOptions {
            bytes,
            read_mode,
            prefetch: !self.no_prefetch,
            size_flags: "--ctx-size / --batch-size",
        })
    }
}

/// The warning for a budget above the RAM available now (`MemAvailable`, or the cgroup's
/// limit minus its usage where lower), or `None` when it fits.
fn over_available(budget: u64, available: u64) -> Option<String> {
    (budget > available).then(|| {
        format!(
            "warning: --mem-budget {} is more than the {} of RAM available now; the run may swap or be killed. \
             Give at most the available RAM to stream the model within it",
            hearth_engine::mib(budget),
            hearth_engine::mib(available)
        )
    })
}

/// One line on weight I/O over `passes` forward passes.
pub fn io_line(what: &str, io: &SourceStats, secs: f64, passes: usize) -> String {
    let per = |v: f64| v / passes.max(1) as f64;
    format!(
        // MiB, as the plan's "read per token" (a rate stays in GB/s, as everywhere).
        "{what}: {} read at {:.2} GB/s; per forward pass {:.0} ms = compute {:.0} ms + waiting for I/O {:.0} ms, {} read",
        hearth_engine::mib(io.bytes_read),
        io.read_gbps(),
        per(secs * 1e3),
        per((secs - io.wait_secs).max(0.0) * 1e3),
        per(io.wait_secs * 1e3),
        hearth_engine::mib(io.bytes_read / passes.max(1) as u64),
    ) + &experts_text(io)
}

/// `; experts: 62.5% hit (hits, misses)` when an expert cache served the run.
fn experts_text(io: &SourceStats) -> String {
    if io.expert_hits + io.expert_misses == 0 {
        return String::new();
    }
    format!(
        "; experts: {:.1}% hit rate ({} hits, {} misses; {} read ahead, {} of them hit)",
        io.expert_hit_rate() * 100.0,
        io.expert_hits,
        io.expert_misses,
        io.experts_prefetched,
        io.expert_prefetch_hits
    )
}

/// A run's window plan as JSON: a run measures no disk (the plan's `disk_gbps` is 0), so
/// the token time it would predict from it is null, not a number without the disk.
pub fn plan_json(w: &hearth_memory::WindowPlan) -> serde_json::Value {
    let mut v = serde_json::to_value(w).unwrap_or_default();
    if w.disk_gbps <= 0.0 {
        v["disk_gbps"] = serde_json::Value::Null;
        v["token_secs"] = serde_json::Value::Null;
    }
    v
}

/// A [`SourceStats`] as JSON (bytes, seconds, GB/s).
pub fn io_json(io: &SourceStats) -> serde_json::Value {
    serde_json::json!({
        "bytes_read": io.bytes_read, "read_secs": io.read_secs, "read_gbps": io.read_gbps(),
        "wait_secs": io.wait_secs, "units_loaded": io.units_loaded,
        "expert_hits": io.expert_hits, "expert_misses": io.expert_misses, "expert_hit_rate": io.expert_hit_rate(),
        "experts_prefetched": io.experts_prefetched, "expert_prefetch_hits": io.expert_prefetch_hits,
    })
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
    use super::{over_available, parse_size};

    #[test]
    fn a_budget_above_the_available_ram_is_warned_about() {
        assert_eq!(over_available(1 << 30, 2 << 30), None);
        assert_eq!(over_available(2 << 30, 2 << 30), None);
        let w = over_available(3 << 30, 2 << 30).unwrap();
        assert!(w.contains("3072.0 MiB") && w.contains("2048.0 MiB"), "{w}");
    }

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
