//! Server counters in the Prometheus text format (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A cumulative histogram with fixed upper bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then the sum and the count.
    state: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, state: Mutex::new((vec![0; bounds.len()], 0.0, 0)) }
    }

    /// Record one observation.
    pub fn observe(&self, v: f64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            s.0[i] += 1;
        }
        s.1 += v;
        s.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, n) in self.bounds.iter().zip(&s.0) {
            cum += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", s.2, s.1, s.2);
    }
}

const SECONDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Per-token constraint work: tens of microseconds to tens of milliseconds.
const MASK_SECONDS: &[f64] = &[0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1];
const COUNTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    /// Answered requests by (endpoint, HTTP status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens of admitted sequences.
    pub prompt_tokens: AtomicU64,
    /// Of them, those the prompt cache held.
    pub cached_tokens: AtomicU64,
    /// Generated tokens.
    pub completion_tokens: AtomicU64,
    /// Speculative decoding: tokens guessed and checked.
    pub drafted_tokens: AtomicU64,
    /// Of them, those the model sampled itself (taken).
    pub accepted_tokens: AtomicU64,
    /// Sequences ended because their client went away.
    pub cancelled: AtomicU64,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Sequences holding a slot.
    pub active: AtomicU64,
    /// Forward passes run by the scheduler.
    pub steps: AtomicU64,
    /// Tokens per forward pass.
    pub batch_tokens: Histogram,
    /// Sequences per forward pass.
    pub batch_sequences: Histogram,
    /// Time to first token, from arrival to the first generated token.
    pub ttft: Histogram,
    /// Time per output token after the first, per request.
    pub tpot: Histogram,
    /// The devices of a server running across several (`None` on one machine).
    pub cluster: std::sync::Arc<Mutex<Option<crate::cluster::ClusterState>>>,
    /// Time to compute a constrained sequence's token mask and apply it (per token).
    pub constraint_mask: Histogram,
    /// Forward passes that failed (a lost device is not one: the engine is set up again).
    failed_passes: AtomicU64,
    /// Of them, those since the last pass that worked (`/health`).
    failed_in_a_row: AtomicU64,
    /// The last failure's message (`/health`).
    last_failure: Mutex<Option<String>>,
}

/// Failed forward passes in a row, with none working between, after which `/health`
/// answers 503: one bad request (a prompt that overflows, a client gone) is not a sick
/// engine, but a model whose every pass fails (a NaN in its weights) is, and a load
/// balancer should stop sending it requests.
pub const UNHEALTHY_AFTER_FAILED_PASSES: u64 = 3;

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            drafted_tokens: AtomicU64::new(0),
            accepted_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            active: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            batch_tokens: Histogram::new(COUNTS),
            batch_sequences: Histogram::new(COUNTS),
            ttft: Histogram::new(SECONDS),
            tpot: Histogram::new(SECONDS),
            cluster: Default::default(),
            constraint_mask: Histogram::new(MASK_SECONDS),
            failed_passes: AtomicU64::new(0),
            failed_in_a_row: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    }
}

impl Metrics {
    /// Count an answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// A forward pass worked.
    pub fn pass_ok(&self) {
        self.failed_in_a_row.store(0, Ordering::Relaxed);
    }

    /// A forward pass failed with `why`.
    pub fn pass_failed(&self, why: &str) {
        self.failed_passes.fetch_add(1, Ordering::Relaxed);
        self.failed_in_a_row.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
    }

    /// `Some((passes failed in a row, the last failure))` once at least
    /// [`UNHEALTHY_AFTER_FAILED_PASSES`] have failed with none working since.
    pub fn failing(&self) -> Option<(u64, String)> {
        let n = self.failed_in_a_row.load(Ordering::Relaxed);
        let last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (n >= UNHEALTHY_AFTER_FAILED_PASSES).then(|| (n, last.unwrap_or_default()))
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP hearth_requests_total HTTP requests answered, by endpoint and status.\n# TYPE hearth_requests_total counter"
        );
        for ((ep, code), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "hearth_requests_total{{endpoint=\"{ep}\",code=\"{code}\"}} {n}");
        }
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, kind, help, v) in [
            ("hearth_prompt_tokens_total", "counter", "Prompt tokens of admitted sequences.", get(&self.prompt_tokens)),
            ("hearth_prompt_cached_tokens_total", "counter", "Prompt tokens the prompt cache held (not evaluated again).", get(&self.cached_tokens)),
            ("hearth_completion_tokens_total", "counter", "Generated tokens.", get(&self.completion_tokens)),
            ("hearth_speculative_drafted_tokens_total", "counter", "Speculative decoding: tokens guessed and checked.", get(&self.drafted_tokens)),
            ("hearth_speculative_accepted_tokens_total", "counter", "Speculative decoding: guesses the model sampled itself.", get(&self.accepted_tokens)),
            ("hearth_cancelled_total", "counter", "Sequences cancelled because the client disconnected.", get(&self.cancelled)),
            ("hearth_steps_total", "counter", "Forward passes (scheduler steps).", get(&self.steps)),
            ("hearth_failed_passes_total", "counter", "Forward passes that failed (their sequences got an error).", get(&self.failed_passes)),
            ("hearth_queue_depth", "gauge", "Requests waiting for a KV cache slot.", get(&self.queue_depth)),
            ("hearth_active_sequences", "gauge", "Sequences holding a KV cache slot.", get(&self.active)),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        // The process's memory: with worker groups the engines share one mapping of the
        // weights (file-backed, counted once); each has its own KV cache (anonymous).
        let mem = hearth_memory::ProcMemory::read().unwrap_or_default();
        for (name, help, v) in [
            ("hearth_rss_bytes", "Resident set size.", mem.rss_bytes),
            (
                "hearth_rss_file_bytes",
                "Resident file-backed memory: the mapped weights (shared by all engines) and the binary.",
                mem.rss_file_bytes,
            ),
            ("hearth_rss_anon_bytes", "Resident anonymous memory: KV caches, scratch, heap.", mem.rss_anon_bytes),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        if let Some(c) = self.cluster.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let count = |state: &str| c.nodes.iter().filter(|n| n.state() == state).count();
            let _ = writeln!(
                out,
                "# HELP hearth_cluster_nodes Devices of the group (this machine and the workers), by state (unused: alive, given no layers).\n\
                 # TYPE hearth_cluster_nodes gauge\n\
                 hearth_cluster_nodes{{state=\"up\"}} {}\nhearth_cluster_nodes{{state=\"down\"}} {}\nhearth_cluster_nodes{{state=\"unused\"}} {}",
                count("up"),
                count("down"),
                count("unused")
            );
            let _ = writeln!(
                out,
                "# HELP hearth_cluster_replans_total Times the engine was set up again after a device failed or rejoined.\n\
                 # TYPE hearth_cluster_replans_total counter\nhearth_cluster_replans_total {}\n\
                 # HELP hearth_cluster_rejoins_total Times failed workers that answered again were taken back into the group.\n\
                 # TYPE hearth_cluster_rejoins_total counter\nhearth_cluster_rejoins_total {}",
                c.replans, c.rejoins
            );
        }
        self.batch_tokens.render(&mut out, "hearth_batch_tokens", "Tokens per forward pass (prefill and decode).");
        self.batch_sequences.render(&mut out, "hearth_batch_sequences", "Sequences per forward pass.");
        self.ttft.render(&mut out, "hearth_ttft_seconds", "Time to first token, from arrival (includes queueing).");
        self.tpot.render(&mut out, "hearth_tpot_seconds", "Mean time per output token after the first, per request.");
        self.constraint_mask.render(
            &mut out,
            "hearth_constraint_mask_seconds",
            "Time to compute and apply a constrained sequence's token mask (response_format, tools), per token.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_prometheus_text() {
        let m = super::Metrics::default();
        m.request("/v1/completions", 200);
        m.ttft.observe(0.02);
        m.ttft.observe(100.0);
        let t = m.render();
        assert!(t.contains("hearth_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 1"), "{t}");
        assert!(t.contains("hearth_ttft_seconds_bucket{le=\"0.025\"} 1"), "{t}");
        assert!(t.contains("hearth_ttft_seconds_bucket{le=\"+Inf\"} 2"), "{t}");
        assert!(t.contains("hearth_ttft_seconds_count 2"), "{t}");
    }
}
