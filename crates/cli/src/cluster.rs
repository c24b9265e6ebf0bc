//! `--workers`, `--cluster`, `--node-weights`, `--wire-type`, `--cluster-key`: running one
//! model across several machines with tensor parallelism (`hearth_parallel`).

use anyhow::{bail, Context as _, Result};
use hearth_engine::ClusterRun;
use hearth_parallel::{ClusterKey, ClusterOptions, CommCounters, Layout, NodeStats, WireType};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of a tensor-parallel group (generate, chat, perplexity).
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Split the model across these `hearth worker` daemons as well as this machine
    /// (tensor parallelism, star allreduce), e.g. 192.168.1.10:7070,192.168.1.11:7070
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',', conflicts_with = "cluster")]
    pub workers: Vec<String>,
    /// A cluster file (TOML) naming the workers and optional per-node weights:
    /// `weight = 2.0` (this machine's) and `[[worker]]` tables with `addr` and `weight`;
    /// for a ring, `parallel = "ring"` and optionally `layer_window = N` at the top (this
    /// machine's) and in every `[[worker]]`
    #[arg(long, value_name = "PATH")]
    pub cluster: Option<PathBuf>,
    /// Relative speed of each node, this machine first, e.g. 2,1,1: each gets that share
    /// of the attention heads and FFN rows [default: equal]
    #[arg(long, value_name = "W0,W1,...", value_delimiter = ',', allow_hyphen_values = true, value_parser = parse_trimmed::<f64>)]
    pub node_weights: Vec<f64>,
    /// How partial sums travel: f32 (exact) or q8_0 (27% of the bytes, ~1/127 relative
    /// error per block) [default: the cluster file's wire_type, else f32]
    #[arg(long, value_parser = parse_wire)]
    pub wire_type: Option<WireType>,
    /// Shared secret: the handshake with every worker is mutually authenticated (HMAC-SHA256)
    #[arg(long, value_name = "KEY", env = "HEARTH_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
    /// Read the shared secret from a file (first line); takes precedence over --cluster-key
    /// and $HEARTH_CLUSTER_KEY
    #[arg(long, value_name = "PATH")]
    pub cluster_key_file: Option<PathBuf>,
    /// How the two column-split products of each block are combined: sum (partial sums,
    /// two allreduces per block; logits differ from one node's by rounding) or gather
    /// (four gathers per block; with the f32 wire, logits bit-identical to one node's)
    /// [default: sum]
    #[arg(long, value_enum)]
    pub tp_schedule: Option<TpSchedule>,
    /// Seconds to wait for any node in a one-token step before failing the request, naming
    /// the node; a batch of N tokens gets (1 + N/64) times as long [default: 5]
    #[arg(long, value_parser = parse_secs)]
    pub step_timeout: Option<f64>,
    /// `hearth serve`: a number is the KV cache slots (sequences generated at once, as
    /// llama-server's -np) [default: 4 on one machine, 1 across devices]. With --workers:
    /// how the model is split across devices, tensor (every device computes a share of
    /// every block, two allreduces per block) or ring (pipelined ring, prima.cpp-style:
    /// each device runs whole layers, a window per round, and passes the activations on;
    /// windows from the layer solver over the devices' profiles, or --layer-window)
    /// [default: tensor]
    #[arg(long, value_name = "tensor|ring|N", value_parser = parse_parallel)]
    pub parallel: Option<ParallelArg>,
    /// Ring: layers per round for each device, this machine first (it may be 0), e.g.
    /// 2,6,7; the model's layer count must be a multiple of the sum (k = layers / sum
    /// rounds). A worker given 0 leaves the ring [default: the solver's choice]
    #[arg(long, value_name = "W0,W1,...", value_delimiter = ',', value_parser = parse_trimmed::<usize>)]
    pub layer_window: Vec<usize>,
    /// Ring: refuse to run when the layer solver (or --layer-window) gives a worker no
    /// layers, instead of leaving it out
    #[arg(long)]
    pub require_all_workers: bool,
}

/// `--parallel` values.
#[derive(clap::ValueEnum, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ParallelMode {
    /// Tensor parallelism (star allreduce)
    Tensor,
    /// Pipelined ring with per-device layer windows
    Ring,
}

/// `--tp-schedule` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpSchedule {
    /// Partial sums of attn_output and ffn_down, two allreduces per block (Megatron, TPI-LLM)
    Sum,
    /// Gather their inputs and compute whole rows: four exchanges per block, exact
    Gather,
}

/// `--parallel`: how the model is split across devices, or (serve) KV cache slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelArg {
    /// `tensor` or `ring`.
    Mode(ParallelMode),
    /// A number: KV cache slots (serve).
    Slots(u32),
}

fn parse_parallel(s: &str) -> Result<ParallelArg, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "tensor" => Ok(ParallelArg::Mode(ParallelMode::Tensor)),
        "ring" => Ok(ParallelArg::Mode(ParallelMode::Ring)),
        t => match t.parse::<u32>() {
            Ok(n) if (1..=256).contains(&n) => Ok(ParallelArg::Slots(n)),
            _ => Err(format!("{s:?} is neither tensor, ring nor a number of KV cache slots in 1..=256 (serve)")),
        },
    }
}

fn parse_wire(s: &str) -> Result<WireType, String> {
    s.parse()
}

/// One value of a comma-separated list, spaces around it allowed (`"10, 10,10"`).
fn parse_trimmed<T: std::str::FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.trim().parse().map_err(|e| format!("{s:?}: {e}"))
}

/// Seconds in (0, 3600].
pub fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds in (0, 3600]")),
    }
}

/// The cluster file's contents.
#[derive(serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    /// This machine's weight.
    weight: Option<f64>,
    /// Wire type.
    wire_type: Option<String>,
    /// `tensor` or `ring`.
    parallel: Option<ParallelMode>,
    /// Ring: this machine's layers per round.
    layer_window: Option<usize>,
    #[serde(default)]
    worker: Vec<WorkerEntry>,
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WorkerEntry {
    addr: String,
    /// Ring: its layers per round.
    layer_window: Option<usize>,
    weight: Option<f64>,
}

/// Per node, between two [`ClusterRun::all_stats`] snapshots of a phase of `secs`
/// seconds and `tokens` tokens: ms per token computing and in the group's exchanges,
/// and KB sent/received per token. Node 0's "computing" includes sampling.
pub fn node_rows(
    run: &ClusterRun,
    before: &(CommCounters, Vec<NodeStats>),
    after: &(CommCounters, Vec<NodeStats>),
    secs: f64,
    tokens: usize,
) -> Vec<serde_json::Value> {
    let per = |v: f64| v / tokens.max(1) as f64;
    let c = after.0.since(&before.0);
    let mut rows = vec![serde_json::json!({
        "node": 0, "addr": "this machine",
        "compute_ms_per_token": per((secs - c.total.seconds).max(0.0) * 1e3),
        "comm_ms_per_token": per(c.total.seconds * 1e3),
        "kb_sent_per_token": per(c.total.bytes_sent as f64 / 1e3),
        "kb_received_per_token": per(c.total.bytes_received as f64 / 1e3),
    })];
    for (i, (a, b)) in after.1.iter().zip(&before.1).enumerate() {
        let d = a.since(b);
        rows.push(serde_json::json!({
            "node": i + 1, "addr": run.workers.get(i).cloned().unwrap_or_default(),
            "compute_ms_per_token": per((d.busy_secs - d.comm_secs).max(0.0) * 1e3),
            "comm_ms_per_token": per(d.comm_secs * 1e3),
            "kb_sent_per_token": per(d.bytes_sent as f64 / 1e3),
            "kb_received_per_token": per(d.bytes_received as f64 / 1e3),
        }));
    }
    rows
}

/// [`node_rows`] for humans: one line per node, then the communication floor (the least
/// any node spent in exchanges: transfers and latency; above it, a node waited for
/// slower ones).
pub fn node_lines(what: &str, rows: &[serde_json::Value]) -> String {
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(0.0);
    let mut o = format!("{what} per node (ms/token computing + in exchanges; KB/token sent/received):");
    for r in rows {
        o.push_str(&format!(
            "\n  node {} ({}): {:.2} + {:.2} ms; {:.1}/{:.1} KB",
            r["node"],
            r["addr"].as_str().unwrap_or(""),
            f(r, "compute_ms_per_token"),
            f(r, "comm_ms_per_token"),
            f(r, "kb_sent_per_token"),
            f(r, "kb_received_per_token")
        ));
    }
    let floor = rows.iter().map(|r| f(r, "comm_ms_per_token")).fold(f64::INFINITY, f64::min);
    o.push_str(&format!(
        "\n  communication floor {floor:.2} ms/token (the least any node spent in exchanges); the rest of a node's exchange time is waiting for slower nodes"
    ));
    o
}

/// Read a cluster key from `--cluster-key-file` (first), else `--cluster-key` or
/// `$HEARTH_CLUSTER_KEY`.
pub fn read_key(key: Option<&str>, file: Option<&Path>) -> Result<Option<ClusterKey>> {
    let (text, from) = match (file, key) {
        (Some(f), _) => {
            let s = std::fs::read_to_string(f).with_context(|| format!("reading the cluster key file {}", f.display()))?;
            (s.lines().next().unwrap_or("").trim().to_string(), format!("the first line of --cluster-key-file {}", f.display()))
        }
        (None, Some(k)) => (k.to_string(), "--cluster-key (or $HEARTH_CLUSTER_KEY)".to_string()),
        (None, None) => return Ok(None),
    };
    Ok(Some(ClusterKey::new(text).with_context(|| format!("cluster key from {from}"))?))
}

/// `HOST:PORT` with a port, trimmed; a clear error otherwise.
pub fn check_addr(a: &str) -> Result<String> {
    let t = a.trim();
    match t.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(t.to_string()),
        _ => bail!("worker address {t:?} is not HOST:PORT (e.g. 192.168.1.10:7070; the port `hearth worker --listen` printed)"),
    }
}

impl ClusterArgs {
    /// `--parallel N`: KV cache slots (serve only).
    pub fn slots(&self) -> Option<u32> {
        match self.parallel {
            Some(ParallelArg::Slots(n)) => Some(n),
            _ => None,
        }
    }

    /// `--parallel tensor|ring`.
    fn mode(&self) -> Option<ParallelMode> {
        match self.parallel {
            Some(ParallelArg::Mode(m)) => Some(m),
            _ => None,
        }
    }

    /// Whether any worker was named.
    pub fn enabled(&self) -> bool {
        !self.workers.is_empty() || self.cluster.is_some()
    }

    /// [`Self::check_unused`] when no worker is named.
    pub fn check_unused_unless_enabled(&self) -> Result<()> {
        if self.enabled() {
            Ok(())
        } else {
            self.check_unused()
        }
    }

    /// Without workers, a tensor-parallel flag would be silently ignored: refuse it.
    pub fn check_unused(&self) -> Result<()> {
        let given = [
            ("--node-weights", !self.node_weights.is_empty()),
            ("--wire-type", self.wire_type.is_some()),
            ("--tp-schedule", self.tp_schedule.is_some()),
            ("--step-timeout", self.step_timeout.is_some()),
            ("--cluster-key-file", self.cluster_key_file.is_some()),
            ("--parallel tensor|ring", self.mode().is_some()),
            ("--layer-window", !self.layer_window.is_empty()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            bail!("{flag} only applies to a run across devices: add --workers HOST:PORT,... or --cluster FILE");
        }
        Ok(())
    }

    /// Tensor parallelism or the ring, with the flags that only fit one of them refused.
    /// `file`: the cluster file's `parallel` and layer windows (the flags win).
    fn layout(&self, n_workers: usize, file: (Option<ParallelMode>, Vec<usize>), file_weights: bool, wire: WireType) -> Result<Layout> {
        let parallel = self.mode().or(file.0);
        let layer_window = if self.layer_window.is_empty() { file.1 } else { self.layer_window.clone() };
        if parallel != Some(ParallelMode::Ring) {
            if !layer_window.is_empty() {
                let from = if self.layer_window.is_empty() { "the cluster file's layer_window" } else { "--layer-window" };
                let fix = if self.mode().is_some() && file.0 == Some(ParallelMode::Ring) {
                    "--parallel tensor overrides the cluster file's parallel = \"ring\" (drop the flag to run the file's ring)"
                } else {
                    "add --parallel ring (or parallel = \"ring\" in the cluster file)"
                };
                bail!("{from} applies to a pipelined ring: {fix}");
            }
            return Ok(Layout::Tensor);
        }
        let tp_only = [
            ("--node-weights", !self.node_weights.is_empty()),
            ("--tp-schedule", self.tp_schedule.is_some()),
            ("the q8_0 wire type", wire == WireType::Q8_0),
            ("weight in the cluster file", file_weights),
        ];
        if let Some((flag, _)) = tp_only.iter().find(|(_, g)| *g) {
            bail!(
                "{flag} applies to tensor parallelism, not to a pipelined ring (a ring gives each device whole layers and passes \
                 its activations in f32; --layer-window sets each device's share)"
            );
        }
        if !layer_window.is_empty() && layer_window.len() != n_workers + 1 {
            bail!("--layer-window has {} values for {} devices (this machine first, then each worker)", layer_window.len(), n_workers + 1);
        }
        Ok(Layout::Ring { windows: (!layer_window.is_empty()).then_some(layer_window), require_all: self.require_all_workers })
    }

    /// The workers, weights and wire type from the flags or the cluster file.
    pub fn options(&self) -> Result<ClusterOptions> {
        let mut wire = WireType::F32;
        let mut file_layout = (None, Vec::new());
        let (workers, mut weights) = match &self.cluster {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading the cluster file {}", path.display()))?;
                let f: ClusterFile = toml::from_str(&text).with_context(|| format!("cluster file {}", path.display()))?;
                if f.worker.is_empty() {
                    bail!("cluster file {} names no [[worker]] (each with addr = \"HOST:PORT\")", path.display());
                }
                if let Some(w) = &f.wire_type {
                    wire = w.parse().map_err(|e: String| anyhow::anyhow!("cluster file {}: {e}", path.display()))?;
                }
                let dup = f.worker.iter().position(|w| w.addr.trim().is_empty());
                if let Some(i) = dup {
                    bail!("cluster file {}: [[worker]] {} has an empty addr", path.display(), i + 1);
                }
                file_layout.0 = f.parallel;
                let windows: Vec<Option<usize>> = std::iter::once(f.layer_window).chain(f.worker.iter().map(|w| w.layer_window)).collect();
                if windows.iter().any(Option::is_some) {
                    if windows.iter().any(Option::is_none) {
                        bail!("cluster file {}: give layer_window for this machine and every [[worker]], or for none", path.display());
                    }
                    file_layout.1 = windows.into_iter().flatten().collect();
                }
                let any_weight = f.weight.is_some() || f.worker.iter().any(|w| w.weight.is_some());
                let weights = if any_weight {
                    std::iter::once(f.weight.unwrap_or(1.0)).chain(f.worker.iter().map(|w| w.weight.unwrap_or(1.0))).collect()
                } else {
                    vec![]
                };
                (f.worker.into_iter().map(|w| w.addr).collect::<Vec<_>>(), weights)
            }
            None => (self.workers.clone(), vec![]),
        };
        if !self.node_weights.is_empty() {
            if self.node_weights.len() != workers.len() + 1 {
                bail!(
                    "--node-weights has {} values for {} nodes (this machine first, then each worker)",
                    self.node_weights.len(),
                    workers.len() + 1
                );
            }
            weights = self.node_weights.clone();
        }
        if let Some(w) = workers.iter().find(|w| w.trim().is_empty()) {
            bail!("empty worker address {w:?} in --workers");
        }
        let workers = workers.iter().map(|w| check_addr(w)).collect::<Result<Vec<_>>>()?;
        let pairs = (0..workers.len()).flat_map(|i| (0..i).map(move |j| (j, i)));
        if let Some((j, i)) = pairs.into_iter().find(|&(j, i)| workers[j] == workers[i]) {
            bail!("worker {} is listed twice (as node {} and node {}): a worker serves one share at a time", workers[i], j + 1, i + 1);
        }
        if let Some(w) = self.wire_type {
            wire = w; // the flag overrides the cluster file
        }
        let schedule = self.tp_schedule.unwrap_or(TpSchedule::Sum);
        if schedule == TpSchedule::Gather && wire == WireType::Q8_0 {
            eprintln!("note: --tp-schedule gather with the q8_0 wire is not exact (its gathers are quantized); use --wire-type f32 for results identical to one machine");
        }
        Ok(ClusterOptions {
            layout: self.layout(workers.len(), file_layout, !weights.is_empty() && self.node_weights.is_empty(), wire)?,
            workers,
            weights,
            wire,
            key: read_key(self.cluster_key.as_deref(), self.cluster_key_file.as_deref())?,
            timeout: Duration::from_secs_f64(self.step_timeout.unwrap_or(5.0)),
            exact: schedule == TpSchedule::Gather,
            progress: true,
        })
    }
}

/// One line on the communication between two snapshots of a run's counters: per token,
/// compute vs time in the group, and bytes.
pub fn comm_line(what: &str, n_nodes: usize, before: &CommCounters, now: &CommCounters, secs: f64, tokens: usize) -> String {
    let comm = now.total.seconds - before.total.seconds;
    let sent = now.total.bytes_sent - before.total.bytes_sent;
    let recv = now.total.bytes_received - before.total.bytes_received;
    let per = |v: f64| v / tokens.max(1) as f64;
    let links = n_nodes.saturating_sub(1).max(1) as f64;
    format!(
        "{what}: per token {:.1} ms = compute {:.1} ms + allreduce and waiting for workers {:.1} ms ({:.0}%); \
         {:.1} KB sent, {:.1} KB received per token ({:.1} KB each way per worker link)",
        per(secs * 1e3),
        per((secs - comm).max(0.0) * 1e3),
        per(comm * 1e3),
        if secs > 0.0 { 100.0 * comm / secs } else { 0.0 },
        per(sent as f64 / 1e3),
        per(recv as f64 / 1e3),
        per((sent + recv) as f64 / 2.0 / links / 1e3),
    )
}
