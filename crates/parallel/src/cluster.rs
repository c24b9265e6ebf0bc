//! A tensor-parallel group running a model: the coordinator's side ([`connect`]) and
//! the worker's ([`serve_session`]), on top of the handshake and the star allreduce.
//!
//! A session, after the [handshake](crate::handshake):
//!
//! 1. coordinator → worker [`Message::Session`] (context size, batch size, KV cache
//!    type); the worker allocates its KV share and answers [`Message::Ready`] with
//!    its KV-cache and weight bytes (or [`Message::Error`]);
//! 2. per forward pass: coordinator → every worker [`Message::Step`] (first position
//!    and the input embeddings `[n_tokens, n_embd]`), then every node runs its share
//!    of each block with two star allreduces per block; the coordinator alone computes
//!    the output head and samples;
//! 3. [`Message::Shutdown`] (or a closed connection) ends it; the worker waits for the
//!    next coordinator.
//!
//! A worker that fails mid-pass sends [`Message::Error`] in place of its partial sum,
//! so the coordinator's allreduce fails naming it; a worker that dies is named by the
//! closed socket; one that stalls, by the step timeout.

use crate::allreduce::{AllReduce, CommError, CommStats, Peer, Star};
use crate::auth::ClusterKey;
use crate::handshake::{coordinator_handshake, worker_handshake, HandshakeError};
use crate::shard::{lcm_block, ModelDims, NodeShard, ShardPlan};
use crate::shard_file;
use crate::wire::{Hello, Message, NodeStats, Session, WireType, PROTOCOL_VERSION};
use hearth_model::{CacheType, Collective, CollectiveError, Context, Model, TensorSplit};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// Why a group could not be formed or a worker session ended with an error.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// Connecting to a worker failed.
    #[error("node {node} ({addr}): cannot connect: {source}")]
    Connect {
        /// The node index it would have had.
        node: usize,
        /// Its address.
        addr: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// A send or receive failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The split could not be planned or does not fit the model.
    #[error("{0}")]
    Plan(String),
    /// A worker refused the session.
    #[error("node {node} refused the session: {message}")]
    Refused {
        /// The worker.
        node: usize,
        /// Its reason.
        message: String,
    },
    /// Two listed worker addresses reach one worker (`localhost:P` and `127.0.0.1:P`).
    #[error("workers {addr} (node {node}) and {earlier_addr} (node {earlier}) are one worker (both reach {socket}): a worker serves one share at a time")]
    SameWorker {
        /// The later node.
        node: usize,
        /// Its address as listed.
        addr: String,
        /// The node listed first.
        earlier: usize,
        /// Its address as listed.
        earlier_addr: String,
        /// The socket address both reach.
        socket: std::net::SocketAddr,
    },
    /// (At a worker.) The coordinator ended the session with this report: its setup
    /// failed at another worker, say.
    #[error("{0}")]
    Coordinator(String),
    /// The local model run failed.
    #[error(transparent)]
    Model(#[from] hearth_model::ModelError),
}

/// Tell the workers already set up (`peers`) that the session will not open, and why:
/// they logged that the coordinator had exited, or left without opening a session, when
/// it failed at a later worker.
pub(crate) fn report_setup_failure<'a>(peers: impl IntoIterator<Item = &'a mut Peer>, e: &ClusterError) {
    let message = format!("the coordinator could not set up the session: {e}");
    for p in peers {
        p.report(e.failed_node(), &message);
    }
}

impl ClusterError {
    /// The node to blame, if any (to drop it before trying again).
    pub fn failed_node(&self) -> Option<usize> {
        match self {
            ClusterError::Connect { node, .. } | ClusterError::Refused { node, .. } => Some(*node),
            ClusterError::Handshake(h) => h.node(),
            ClusterError::Comm(c) => c.failed_node(),
            _ => None,
        }
    }
}

/// The split dimensions of `model` (block: the least common multiple of the block
/// sizes of every column-split matrix, a shared expert's down included, of the groups of
/// rows of the FFN's row-split ones, and of what puts a KV-head boundary on whole groups
/// of `attn_q/k/v`'s rows).
pub fn model_dims(model: &Model) -> ModelDims {
    let c = &model.config;
    // (A shared expert's down is cut as the FFN's: its columns at the FFN rows' scaled
    // boundaries, `TensorSplit::shared_rows`.) A gate or up stored in groups of rows
    // (Q4_0X8, Q4_KX8) is cut in whole groups, so the FFN rows come in them too.
    let blocks: Vec<usize> = model
        .weights
        .layers
        .iter()
        .flat_map(|l| {
            let cols = [&l.wo, &l.w_down].into_iter().chain(l.shared.as_ref().map(|s| &s.down)).map(|t| t.ty.block_size());
            let rows = [&l.w_gate, &l.w_up].into_iter().chain(l.shared.iter().flat_map(|s| [&s.gate, &s.up])).map(|t| t.ty.group_rows());
            // A KV-head boundary cuts q/k/v by rows. `kv_heads_per_unit` makes u heads' q
            // rows (u · group · head_dim) a multiple of the block; a block that is a
            // multiple of q's group and of k/v's group × the GQA group then puts q's cut and
            // k/v's (u · head_dim) on whole groups. Only a head_dim that is not a multiple
            // of the group needs it (none of the usual 64, 80, 96, 128, 256).
            let gqa = c.n_head / c.n_head_kv.max(1);
            let kv = [&l.wk, &l.wv].into_iter().map(|t| t.ty.group_rows()).filter(|g| !c.head_dim.is_multiple_of(*g)).map(move |g| g * gqa);
            let q = Some(l.wq.ty.group_rows()).filter(|g| !(gqa * c.head_dim).is_multiple_of(*g));
            cols.chain(rows).chain(kv).chain(q)
        })
        .collect();
    ModelDims { n_head: c.n_head, n_head_kv: c.n_head_kv, head_dim: c.head_dim, n_embd: c.n_embd, n_ff: c.n_ff, block: lcm_block(&blocks) }
}

/// Each node's gather rows (`None` under the sum schedule), node 0 first.
pub type GatherRows = Vec<Option<std::ops::Range<usize>>>;

/// The split [`connect`] proposes for `opts`: the shard plan over the node weights (the
/// given ones, node 0 first, else equal) and each node's gather rows ([`gather_rows`]).
pub fn split_plan(model: &Model, opts: &ClusterOptions) -> Result<(ShardPlan, GatherRows), ClusterError> {
    let n = opts.workers.len() + 1;
    let weights = if opts.weights.is_empty() { vec![1.0; n] } else { opts.weights.clone() };
    if weights.len() != n {
        return Err(ClusterError::Plan(format!(
            "{} node weights for {n} nodes (the coordinator and {} workers)",
            weights.len(),
            opts.workers.len()
        )));
    }
    let plan = ShardPlan::new(model_dims(model), &weights).map_err(|e| ClusterError::Plan(e.to_string()))?;
    let gather = gather_rows(model.config.n_embd, gather_unit(model), &weights, opts.exact).map_err(|e| ClusterError::Plan(e.to_string()))?;
    Ok((plan, gather))
}

/// Each node's output rows under the gather schedule (`exact`): the `n_embd` rows shared
/// in proportion to the node weights like everything else, in units of `unit` rows (the
/// last one may be short); `None` for every node under the sum schedule.
pub fn gather_rows(n_embd: usize, unit: usize, weights: &[f64], exact: bool) -> Result<GatherRows, crate::ShardError> {
    if !exact {
        return Ok(vec![None; weights.len()]);
    }
    let unit = unit.max(1);
    let mut at = 0;
    Ok(crate::shard::proportional_split(n_embd.div_ceil(unit), weights)?
        .iter()
        .map(|&k| {
            let start = at;
            at = (at + k * unit).min(n_embd);
            Some(start..at)
        })
        .collect())
}

/// The rows a gather cut of `model`'s `attn_output` and `ffn_down` (and a shared
/// expert's down) must come in: a group of rows where one is stored in groups (Q4_0X8,
/// Q4_KX8: cut in whole groups), else 1.
pub fn gather_unit(model: &Model) -> usize {
    let downs = model.weights.layers.iter().flat_map(|l| [&l.wo, &l.w_down].into_iter().chain(l.shared.as_ref().map(|s| &s.down)));
    downs.map(|t| t.ty.group_rows()).fold(1, num_integer::lcm)
}

/// The model's view of a node's shard.
pub fn tensor_split(shard: &NodeShard) -> TensorSplit {
    TensorSplit { kv_heads: shard.kv_heads.clone(), ffn_rows: shard.ffn_rows.clone(), gather_rows: None }
}

pub(crate) fn cache_byte(t: CacheType) -> u8 {
    match t {
        CacheType::F32 => 0,
        CacheType::F16 => 1,
        CacheType::Q8_0 => 2,
    }
}

pub(crate) fn cache_type(b: u8) -> CacheType {
    match b {
        0 => CacheType::F32,
        1 => CacheType::F16,
        _ => CacheType::Q8_0,
    }
}

/// Bytes of the weight rows and columns a node computes with (every block's share;
/// the coordinator's embedding and head are not counted).
pub fn shard_weight_bytes(model: &Model, split: &TensorSplit) -> u64 {
    // Each matrix's share of its bytes: the shape the node computes with (as stored, for
    // a shard file whose matrices are already cut) over the stored shape.
    let shapes = split.matrix_shapes(&model.config);
    let share = |t: &hearth_model::TensorRef, (rows, cols): &(std::ops::Range<usize>, std::ops::Range<usize>)| {
        let (r, c) = if model.shard.is_some() { (t.rows, t.cols) } else { (rows.len(), cols.len()) };
        t.size as u64 * (r * c) as u64 / (t.rows * t.cols).max(1) as u64
    };
    // A MoE layer's gate, up and down are stacked experts (`n_expert` × the shape a node
    // splits): the node holds its rows of every expert.
    let n_expert = model.config.moe.map_or(1, |m| m.n_expert) as u64;
    // (A shard file's stacked experts are already every expert's cut: counted as stored.)
    let per_matrix = |i: usize| if i >= hearth_model::Mat::Gate as usize && model.shard.is_none() { n_expert } else { 1 };
    // A shared expert (qwen2moe): its gate, up and down cut as the FFN is.
    let shared = split.shared_shapes(&model.config);
    model
        .weights
        .layers
        .iter()
        .map(|l| {
            let mats: u64 = l.matrices().into_iter().zip(&shapes).enumerate().map(|(i, (t, s))| per_matrix(i) * share(t, s)).sum();
            let sh =
                l.shared.as_ref().map_or(0, |sh| [&sh.gate, &sh.up, &sh.down].into_iter().zip(&shared).map(|(t, s)| share(t, s)).sum());
            mats + sh
        })
        .sum()
}

/// Communication counters of a tensor-parallel group, shared with whoever reports them.
#[derive(Debug, Clone, Default)]
pub struct CommCounters {
    /// Forward passes.
    pub passes: u64,
    /// Allreduces.
    pub allreduces: u64,
    /// Bytes sent and received by this node, and seconds in calls to the group.
    pub total: CommStats,
    /// Seconds inside allreduces (sending partials, waiting for the slowest node,
    /// receiving sums).
    pub allreduce_secs: f64,
    /// Seconds sending each pass's inputs (coordinator only).
    pub step_secs: f64,
}

impl CommCounters {
    /// The counts since `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &CommCounters) -> CommCounters {
        CommCounters {
            passes: self.passes - earlier.passes,
            allreduces: self.allreduces - earlier.allreduces,
            total: CommStats {
                bytes_sent: self.total.bytes_sent - earlier.total.bytes_sent,
                bytes_received: self.total.bytes_received - earlier.total.bytes_received,
                seconds: self.total.seconds - earlier.total.seconds,
            },
            allreduce_secs: self.allreduce_secs - earlier.allreduce_secs,
            step_secs: self.step_secs - earlier.step_secs,
        }
    }
}

/// A node's [`Collective`]: the star allreduce, plus (on the coordinator) sending each
/// pass's input to the workers.
pub struct StarCollective {
    star: Arc<Mutex<Star>>,
    counters: Arc<Mutex<CommCounters>>,
    /// The step timeout for a one-token pass; larger passes get proportionally more.
    base_timeout: Option<Duration>,
}

/// The timeout of a pass of `n_tokens`: a prefill batch computes longer between two
/// exchanges than a decode step, so the step timeout grows with it (×2 at 64 tokens).
pub fn pass_timeout(base: Duration, n_tokens: usize) -> Duration {
    base.mul_f64(1.0 + n_tokens as f64 / 64.0)
}

impl StarCollective {
    /// Wrap `star`; the counters are readable through [`Self::counters`].
    pub fn new(star: Arc<Mutex<Star>>) -> Self {
        let base_timeout = lock(&star).peers_mut().first().map(|p| p.timeout());
        Self { star, counters: Arc::default(), base_timeout }
    }

    /// The shared counters.
    pub fn counters(&self) -> Arc<Mutex<CommCounters>> {
        self.counters.clone()
    }

    /// A handle for reports while the context owns this collective.
    pub fn handle(&self) -> GroupHandle {
        GroupHandle { star: self.star.clone(), counters: self.counters.clone() }
    }
}

/// The coordinator's view of a running group, for reports.
#[derive(Clone)]
pub struct GroupHandle {
    star: Arc<Mutex<Star>>,
    counters: Arc<Mutex<CommCounters>>,
}

impl GroupHandle {
    /// A snapshot of this node's counters.
    pub fn counters(&self) -> CommCounters {
        lock(&self.counters).clone()
    }

    /// Every worker's counters (nodes 1.., in order). Call between forward passes.
    pub fn worker_stats(&self) -> Result<Vec<NodeStats>, CommError> {
        let mut star = lock(&self.star);
        let peers = star.peers_mut();
        for p in peers.iter_mut() {
            p.send(&Message::StatsRequest)?;
        }
        collect_stats(peers)
    }
}

/// Each peer's answer to a `StatsRequest`, in order (an `Error` instead names the node it
/// reports).
pub(crate) fn collect_stats(peers: &mut [Peer]) -> Result<Vec<NodeStats>, CommError> {
    let mut out = Vec::with_capacity(peers.len());
    for p in peers.iter_mut() {
        match p.recv()?.0 {
            Message::Stats(s) => out.push(s),
            Message::Error(e) => return Err(CommError::remote(p.node(), p.addr(), e)),
            other => {
                let why = format!("expected Stats, got {}", other.name());
                return Err(CommError::Protocol { node: p.node(), addr: p.addr().to_string(), why });
            }
        }
    }
    Ok(out)
}

impl Drop for StarCollective {
    /// The coordinator ends the session politely (workers also cope with a closed socket).
    fn drop(&mut self) {
        let mut star = lock(&self.star);
        if star.node() == 0 {
            for p in star.peers_mut() {
                let _ = p.send(&Message::Shutdown);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Collective for StarCollective {
    fn begin_pass(&mut self, pos0: usize, x: &[f32], n_tokens: usize) -> Result<(), CollectiveError> {
        let t = std::time::Instant::now();
        let mut star = lock(&self.star);
        let mut sent = 0;
        if let Some(base) = self.base_timeout {
            star.peers_mut().iter_mut().for_each(|p| p.set_timeout(pass_timeout(base, n_tokens)));
        }
        if star.node() == 0 {
            let step = Message::Step { pos0: pos0 as u64, x: x.to_vec() };
            for p in star.peers_mut() {
                sent += p.send(&step)? as u64;
            }
        }
        let mut c = lock(&self.counters);
        c.passes += 1;
        c.total.bytes_sent += sent;
        c.step_secs += t.elapsed().as_secs_f64();
        c.total.seconds += t.elapsed().as_secs_f64();
        Ok(())
    }

    fn max_elements(&self) -> usize {
        // A frame carries a header and the partial: leave room for the header.
        (crate::wire::DEFAULT_MAX_FRAME - 4096) / 4
    }

    fn allreduce(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        let st = lock(&self.star).allreduce(buf)?;
        let mut c = lock(&self.counters);
        c.allreduces += 1;
        c.total += st;
        c.allreduce_secs += st.seconds;
        Ok(())
    }
}

/// How the model is split across the devices.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Layout {
    /// Tensor parallelism: every node computes a share of every block.
    #[default]
    Tensor,
    /// Pipelined ring: every device runs whole layers, `windows[i]` per round for device
    /// `i` (this coordinator first), or the solver's choice when `None`.
    Ring {
        /// Layers per round per device.
        windows: Option<Vec<usize>>,
        /// Refuse to run when a worker would get no layers (else it is left out, and
        /// the coordinator says so and why).
        require_all: bool,
    },
}

/// How the coordinator forms the group.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Tensor parallelism or a pipelined ring.
    pub layout: Layout,
    /// Worker addresses (`HOST:PORT`); they become nodes `1..=workers.len()`.
    pub workers: Vec<String>,
    /// Per-node shares, node 0 (this coordinator) first; empty: equal.
    pub weights: Vec<f64>,
    /// Encoding of the partial sums.
    pub wire: WireType,
    /// Shared key for mutual authentication.
    pub key: Option<ClusterKey>,
    /// Per-step timeout (connect, each receive).
    pub timeout: Duration,
    /// The gather schedule: logits bit-identical to one node's, at four exchanges per
    /// block instead of two (see `hearth_model::TensorSplit`).
    pub exact: bool,
    /// Print shard transfers to stderr.
    pub progress: bool,
}

/// The largest frame a worker reads before the session is open (a `Hello` is 142 bytes):
/// an unauthenticated peer cannot make it buffer more.
pub const HANDSHAKE_MAX_FRAME: usize = 64 << 10;

/// How long the coordinator waits for a worker to open a session (it may be cutting,
/// checking or loading a shard file first).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(300);

/// What [`connect`] set up: the coordinator's share and the group, ready for
/// [`Context::set_tensor_split`].
pub struct Group {
    /// The split plan over every node.
    pub plan: ShardPlan,
    /// Node 0's share.
    pub split: TensorSplit,
    /// Node 0's allreduce and step sender.
    pub collective: StarCollective,
    /// Per worker (nodes 1..): `(address, KV-cache bytes, weight bytes)` as it reported.
    pub workers: Vec<(String, u64, u64)>,
}

/// Connect to every worker, hand out shards and open a session of `n_ctx` positions,
/// batches of `n_batch`, KV cache type `cache` and the coordinator's f32 attention
/// threshold `f32_attn_from` (`Context::f32_attention_from`), for `model` whose file has
/// SHA-256 `sha256`.
#[allow(clippy::too_many_arguments)]
pub fn connect(
    model: &Model,
    sha256: [u8; 32],
    opts: &ClusterOptions,
    n_ctx: usize,
    n_batch: usize,
    cache: CacheType,
    f32_attn_from: usize,
) -> Result<Group, ClusterError> {
    let n = opts.workers.len() + 1;
    let (plan, gather) = split_plan(model, opts)?;
    let mut peers = Vec::with_capacity(n - 1);
    let mut workers = Vec::with_capacity(n - 1);
    let mut dialed = Dialed::default();
    for (i, addr) in opts.workers.iter().enumerate() {
        let node = i + 1;
        let mut set_up = || -> Result<(Peer, u64, u64), ClusterError> {
            let mut peer = dialed.dial(addr, node, opts.timeout)?;
            let shard = plan.node(node).expect("node in plan").clone();
            let hello = Hello { version: PROTOCOL_VERSION, model_sha256: sha256, wire: opts.wire, shard };
            coordinator_handshake(&mut peer, &hello, opts.key.as_ref())?;
            let gather_rows = gather[node].clone().map(|r| r.start as u64..r.end as u64);
            peer.send(&Message::Session(Session {
                n_ctx: n_ctx as u64,
                n_batch: n_batch as u64,
                cache_type: cache_byte(cache),
                gather_rows,
                f32_attn_from: f32_attn_from as u64,
            }))?;
            // Opening a session may mean cutting or loading a shard file: wait longer.
            let mut answer = peer.recv_within(SETUP_TIMEOUT)?.0;
            if let Message::NeedShard = answer {
                let mut split = tensor_split(&hello.shard);
                split.gather_rows = gather[node].clone();
                send_shard(&mut peer, model, &split, &sha256, opts.progress)?;
                answer = peer.recv_within(SETUP_TIMEOUT)?.0;
            }
            match answer {
                Message::Ready { kv_bytes, weight_bytes } => Ok((peer, kv_bytes, weight_bytes)),
                Message::Error(e) => Err(ClusterError::Refused { node, message: e.message }),
                other => Err(ClusterError::Refused { node, message: format!("answered {} instead of Ready", other.name()) }),
            }
        };
        match set_up() {
            Ok((peer, kv_bytes, weight_bytes)) => {
                workers.push((addr.clone(), kv_bytes, weight_bytes));
                peers.push(peer);
            }
            Err(e) => {
                report_setup_failure(&mut peers, &e);
                return Err(e);
            }
        }
    }
    let star = Star::master(peers, opts.wire)?;
    let mut split = tensor_split(plan.node(0).expect("node 0"));
    split.gather_rows = gather[0].clone();
    Ok(Group { plan, split, collective: StarCollective::new(Arc::new(Mutex::new(star))), workers })
}

/// Connect to `addr` (node `node`) within `timeout`.
pub(crate) fn dial(addr: &str, node: usize, timeout: Duration) -> Result<Peer, ClusterError> {
    Ok(dial_socket(addr, node, timeout)?.0)
}

fn dial_socket(addr: &str, node: usize, timeout: Duration) -> Result<(Peer, std::net::SocketAddr), ClusterError> {
    let cerr = |source| ClusterError::Connect { node, addr: addr.to_string(), source };
    let sa = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(cerr)?
        .next()
        .ok_or_else(|| cerr(std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolves to nothing")))?;
    let stream = TcpStream::connect_timeout(&sa, timeout).map_err(cerr)?;
    let socket = stream.peer_addr().map_err(cerr)?;
    Ok((Peer::new(stream, node, timeout).map_err(cerr)?, socket))
}

/// The workers a coordinator has dialed so far: [`Dialed::dial`] refuses a second name
/// for one of them before the handshake, which would have let the worker take itself
/// over (the listed strings differ, so the `--workers` check passes them).
#[derive(Default)]
pub(crate) struct Dialed(Vec<(usize, String, std::net::SocketAddr)>);

impl Dialed {
    /// [`dial`] `addr` (node `node`), refusing a socket address dialed before.
    pub(crate) fn dial(&mut self, addr: &str, node: usize, timeout: Duration) -> Result<Peer, ClusterError> {
        let (peer, socket) = dial_socket(addr, node, timeout)?;
        if let Some((earlier, earlier_addr, _)) = self.0.iter().find(|(_, _, s)| *s == socket) {
            return Err(ClusterError::SameWorker {
                node,
                addr: addr.to_string(),
                earlier: *earlier,
                earlier_addr: earlier_addr.clone(),
                socket,
            });
        }
        self.0.push((node, addr.to_string(), socket));
        Ok(peer)
    }
}

/// How a worker session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The coordinator sent Shutdown or closed the connection between passes.
    Finished {
        /// Forward passes served.
        passes: u64,
        /// It sent Shutdown (false: the connection closed without one, so the
        /// coordinator exited or was stopped mid-request).
        shutdown: bool,
    },
    /// The coordinator left before opening a session: it only measured the link or asked
    /// for this worker's profile (`hearth plan`, `hearth profile --peer`), or its ring
    /// gave this worker no layers.
    Unused,
    /// The connection closed before its first byte: a port check, or a coordinator that
    /// found it had reached this worker already under another name ([`Dialed`]).
    Silent,
}

/// What [`serve_session`] tells its caller as a coordinator's connection goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// The coordinator passed the handshake.
    Admitted,
    /// It opens a session (tensor-parallel or ring). A coordinator that only measures the
    /// link or asks for the profile (`hearth plan`, `profile --peer`) never does.
    Opening,
}

/// Where a worker's weights come from.
#[derive(Clone)]
pub enum WorkerModel {
    /// Its own copy of the model file.
    File {
        /// The model.
        model: Arc<Model>,
        /// SHA-256 of its file.
        sha256: [u8; 32],
        /// `Some(dir)`: cut each session's share into a shard file in `dir` and run from
        /// that (what a memory budget needs: a window streams the shard file's blocks).
        shard_dir: Option<PathBuf>,
    },
    /// No model file: shards of the model with SHA-256 `sha256`, sent by the coordinator
    /// the first time and cached in `dir`.
    Shards {
        /// The model this worker serves.
        sha256: [u8; 32],
        /// The shard cache.
        dir: PathBuf,
    },
}

impl WorkerModel {
    /// The SHA-256 of the model this worker serves.
    pub fn sha256(&self) -> &[u8; 32] {
        match self {
            WorkerModel::File { sha256, .. } | WorkerModel::Shards { sha256, .. } => sha256,
        }
    }
}

/// Builds a worker's context for a session: `(model, n_ctx, n_batch, KV cache type, ring
/// windows, KV dim)`; with windows (a ring session) the context must run only those
/// ([`Context::set_ring`]); with a KV dim (a tensor-parallel share) its KV cache holds
/// only that many values a position ([`Context::with_kv_dim`]).
pub type MakeContext<'a> = &'a dyn Fn(
    Arc<Model>,
    usize,
    usize,
    CacheType,
    Option<hearth_model::RingWindows>,
    Option<usize>,
) -> Result<Context, hearth_model::ModelError>;

/// Serve one coordinator on `stream` until it leaves: handshake (against the model's
/// SHA-256 and `key`), find this session's weights (the model, a cached shard file, or
/// one received now), build the context with `make_ctx`, then run every
/// [`Message::Step`] through this node's share — or, when the coordinator opens a
/// pipelined-ring session instead, serve that ([`crate::ring::serve_ring`]); `profile`
/// answers its [`Message::ProfileRequest`]. `told` hears [`SessionEvent::Admitted`] once
/// the coordinator has passed the handshake and [`SessionEvent::Opening`] once it opens a
/// session (before the session allocates anything), with the shard.
/// Errors are reported to the coordinator before returning.
pub fn serve_session(
    stream: TcpStream,
    worker: &WorkerModel,
    key: Option<&ClusterKey>,
    timeout: Duration,
    profile: &dyn Fn() -> crate::ring::WorkerProfile,
    make_ctx: MakeContext<'_>,
    mut told: impl FnMut(SessionEvent, &NodeShard),
) -> Result<SessionEnd, ClusterError> {
    // Until the session is open, a peer may be anyone: accept only small frames.
    let mut peer = Peer::new(stream, 0, timeout)
        .map_err(|source| ClusterError::Connect { node: 0, addr: "coordinator".into(), source })?
        .with_max_frame(HANDSHAKE_MAX_FRAME);
    if matches!(peer.stream().peek(&mut [0u8; 1]), Ok(0)) {
        return Ok(SessionEnd::Silent);
    }
    let sha256 = worker.sha256();
    let hello = worker_handshake(&mut peer, sha256, key)?;
    let shard = hello.shard.clone();
    let me = shard.node;
    if let WorkerModel::File { model, .. } = worker {
        let ours = model_dims(model);
        if shard.dims != ours {
            let why = format!("the shard's model dimensions {:?} are not this model's {ours:?}", shard.dims);
            peer.report(Some(me), &why);
            return Err(ClusterError::Plan(why));
        }
    }
    told(SessionEvent::Admitted, &shard);
    let session = loop {
        let got = match peer.recv_within(SETUP_TIMEOUT) {
            Ok((m, _)) => m,
            // (A coordinator that asked only for a profile may close without a Shutdown.)
            Err(CommError::Closed { .. }) => return Ok(SessionEnd::Unused),
            Err(e) => return Err(e.into()),
        };
        match got {
            Message::Session(s) => {
                told(SessionEvent::Opening, &shard);
                break s;
            }
            Message::Ping(b) => {
                peer.send(&Message::Pong(b.len() as u64))?;
            }
            Message::ProfileRequest => {
                let json = serde_json::to_vec(&profile()).map_err(|e| ClusterError::Plan(format!("encoding the profile: {e}")))?;
                peer.send(&Message::Profile(json))?;
            }
            Message::RingSession(s) => {
                told(SessionEvent::Opening, &shard);
                let peer = peer.with_max_frame(crate::wire::DEFAULT_MAX_FRAME);
                return crate::ring::serve_ring(peer, me, worker, s, make_ctx, timeout);
            }
            // The coordinator is done with this worker (e.g. the ring solver gave it no layers).
            Message::Shutdown => return Ok(SessionEnd::Unused),
            Message::Error(e) => return Err(ClusterError::Coordinator(e.message)),
            other => {
                let why = format!("expected Session, got {}", other.name());
                peer.report(Some(me), &why);
                return Err(ClusterError::Plan(why));
            }
        }
    };
    // The coordinator has passed the handshake: full-size frames (shard data, partials).
    peer = peer.with_max_frame(crate::wire::DEFAULT_MAX_FRAME);
    let mut split = tensor_split(&shard);
    split.gather_rows = session.gather_rows.clone().map(|r| r.start as usize..r.end as usize);
    let model = match session_model(&mut peer, worker, &split) {
        Ok(m) => m,
        Err(e) => {
            peer.report(Some(me), &e.to_string());
            return Err(e);
        }
    };
    let opened = (|| {
        let n_ctx = usize::try_from(session.n_ctx).ok().filter(|&c| c >= 1 && c <= model.config.n_ctx_train).ok_or_else(|| {
            hearth_model::ModelError::Context(format!(
                "context size {} is outside 1..={} (the model's trained context)",
                session.n_ctx, model.config.n_ctx_train
            ))
        })?;
        let n_batch = usize::try_from(session.n_batch).unwrap_or(usize::MAX).clamp(1, n_ctx);
        let kv_dim = split.kv_rows(&model.config).len();
        make_ctx(model.clone(), n_ctx, n_batch, cache_type(session.cache_type), None, Some(kv_dim))
    })();
    let mut ctx = match opened {
        Ok(c) => c,
        Err(e) => {
            peer.report(Some(me), &e.to_string());
            return Err(e.into());
        }
    };
    ctx.set_f32_attention_from(usize::try_from(session.f32_attn_from).unwrap_or(usize::MAX));
    let model = &model;
    let star = Arc::new(Mutex::new(Star::worker(me, shard.n_nodes, peer, hello.wire)?));
    let collective = StarCollective::new(star.clone());
    let counters = collective.counters();
    if let Err(e) = ctx.set_tensor_split(split.clone(), Box::new(collective)) {
        lock(&star).peers_mut()[0].report(Some(me), &e.to_string());
        return Err(e.into());
    }
    let ready = Message::Ready { kv_bytes: ctx.kv_bytes() as u64, weight_bytes: shard_weight_bytes(model, &split) };
    lock(&star).peers_mut()[0].send(&ready)?;

    let mut stats = NodeStats::default();
    loop {
        // Between passes the coordinator may be sampling, or idle between requests.
        let msg = lock(&star).peers_mut()[0].recv_idle();
        let (pos0, x) = match msg {
            Ok((Message::Step { pos0, x }, _)) => (pos0, x),
            Ok((Message::StatsRequest, _)) => {
                let c = lock(&counters).clone();
                let reply = NodeStats {
                    comm_secs: c.total.seconds,
                    bytes_sent: c.total.bytes_sent,
                    bytes_received: c.total.bytes_received,
                    ..stats
                };
                lock(&star).peers_mut()[0].send(&Message::Stats(reply))?;
                continue;
            }
            Ok((Message::Shutdown, _)) => return Ok(SessionEnd::Finished { passes: stats.passes, shutdown: true }),
            Err(CommError::Closed { .. }) => return Ok(SessionEnd::Finished { passes: stats.passes, shutdown: false }),
            Ok((Message::Error(e), _)) => return Err(ClusterError::Coordinator(e.message)),
            Ok((other, _)) => {
                let why = format!("expected Step, got {}", other.name());
                lock(&star).peers_mut()[0].report(Some(me), &why);
                return Err(ClusterError::Plan(why));
            }
            Err(e) => return Err(e.into()),
        };
        let pos0 = usize::try_from(pos0).unwrap_or(usize::MAX);
        let n_embd = model.config.n_embd;
        lock(&star).peers_mut()[0].set_timeout(pass_timeout(timeout, x.len() / n_embd.max(1)));
        let t = std::time::Instant::now();
        let r = ctx.eval_embeddings(pos0, &x);
        stats.busy_secs += t.elapsed().as_secs_f64();
        if let Err(e) = r {
            // A failed allreduce already told the coordinator; anything else is ours.
            if !matches!(e, hearth_model::ModelError::Collective(_)) {
                lock(&star).peers_mut()[0].report(Some(me), &e.to_string());
            }
            return Err(e.into());
        }
        stats.passes += 1;
    }
}

/// The model a session runs: the worker's own, or its shard file (cut from its own
/// model, found in the cache, or received from the coordinator now).
fn session_model(peer: &mut Peer, worker: &WorkerModel, split: &TensorSplit) -> Result<Arc<Model>, ClusterError> {
    let (sha, dir) = match worker {
        WorkerModel::File { model, shard_dir: None, .. } => return Ok(model.clone()),
        WorkerModel::File { sha256, shard_dir: Some(dir), .. } | WorkerModel::Shards { sha256, dir } => (sha256, dir),
    };
    let path = dir.join(shard_file::file_name(sha, split));
    // A cached shard that does not load as this split (say, one an older hearth cut
    // differently under the same name) is made again, once.
    let cached = shard_file::cached(&path).is_some();
    match open_shard(peer, worker, split, sha, &path) {
        Err(e) if cached => {
            eprintln!("the cached shard file {} is unusable ({e}): making it again", path.display());
            let _ = std::fs::remove_file(&path);
            open_shard(peer, worker, split, sha, &path)
        }
        r => r,
    }
}

/// [`session_model`]'s shard file at `path`: cut or received unless cached, then loaded
/// and checked to hold `split` of model `sha` (removed if not).
fn open_shard(
    peer: &mut Peer,
    worker: &WorkerModel,
    split: &TensorSplit,
    sha: &[u8; 32],
    path: &std::path::Path,
) -> Result<Arc<Model>, ClusterError> {
    match worker {
        WorkerModel::File { model, .. } => {
            shard_file::extract(model, split, sha, path)?;
        }
        WorkerModel::Shards { .. } => {
            if shard_file::cached(path).is_none() {
                receive_shard(peer, path)?;
            }
        }
    }
    let model = match worker {
        // The shard carries its model's metadata: share the loaded model's tokenizer.
        WorkerModel::File { model, .. } => {
            let file = hearth_gguf::GgufFile::open(path).map_err(hearth_model::ModelError::from)?;
            Model::from_file_with_tokenizer(Arc::new(file), model.tokenizer.clone())?
        }
        WorkerModel::Shards { .. } => Model::load(path)?,
    };
    let source = model.file.get(hearth_model::shard_keys::SOURCE_SHA256).and_then(|v| v.as_str()).unwrap_or("");
    if model.shard.as_ref() != Some(split) || source != crate::wire::hex(sha) {
        let _ = std::fs::remove_file(path);
        return Err(ClusterError::Plan(format!(
            "the shard file {} holds {:?} of model {source}, not {split:?} of {}",
            path.display(),
            model.shard,
            crate::wire::hex(sha)
        )));
    }
    Ok(Arc::new(model))
}

/// Ask the coordinator for this node's shard file and store it at `path` (written to a
/// temporary file, checked against the coordinator's length and SHA-256, then renamed).
fn receive_shard(peer: &mut Peer, path: &std::path::Path) -> Result<(), ClusterError> {
    use std::io::Write;
    let io = |e: std::io::Error| ClusterError::Plan(format!("storing the shard file {}: {e}", path.display()));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    peer.send(&Message::NeedShard)?;
    let tmp = PathBuf::from(format!("{}.tmp-{}", path.display(), std::process::id()));
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut w = shard_file::HashingWriter::new(hearth_gguf::PieceWriter::new(file));
        loop {
            match peer.recv()?.0 {
                Message::ShardData(b) => w.write_all(&b).map_err(io)?,
                Message::ShardEnd { total, sha256 } => {
                    let got = w.bytes;
                    let (digest, bw) = w.finish();
                    if got != total || digest != sha256 {
                        return Err(ClusterError::Plan(format!(
                            "the shard file arrived damaged: {got} bytes with SHA-256 {}, the coordinator sent {total} bytes with {}",
                            crate::wire::hex(&digest),
                            crate::wire::hex(&sha256)
                        )));
                    }
                    bw.into_inner().map_err(io)?.sync_all().map_err(io)?;
                    std::fs::write(shard_file::sidecar(path), crate::wire::hex(&digest)).map_err(io)?;
                    std::fs::rename(&tmp, path).map_err(io)?;
                    return Ok(());
                }
                Message::Error(e) => return Err(ClusterError::Refused { node: 0, message: e.message }),
                other => return Err(ClusterError::Plan(format!("expected ShardData, got {}", other.name()))),
            }
        }
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Frames written bytes as `ShardData` messages of up to 4 MiB.
struct ShardSink<'a> {
    peer: &'a mut Peer,
    buf: Vec<u8>,
}

impl std::io::Write for ShardSink<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= 4 << 20 {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let msg = Message::ShardData(std::mem::take(&mut self.buf));
            self.peer.send(&msg).map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(())
    }
}

/// Send node `peer`'s shard file (`split` of `model`, whose file has SHA-256 `sha`).
fn send_shard(peer: &mut Peer, model: &Model, split: &TensorSplit, sha: &[u8; 32], progress: bool) -> Result<(), ClusterError> {
    use std::io::Write;
    let node = peer.node();
    // A split the model cannot run is refused before the progress line announces a send
    // (`shard_file::write` checks it again).
    split.validate(&model.config, &model.weights)?;
    let t = std::time::Instant::now();
    if progress {
        eprintln!(
            "node {node} has no copy of its shard: sending it ({:.1} MiB of weights, once; the worker caches it)",
            shard_file::size(model, split) as f64 / (1 << 20) as f64
        );
    }
    let sink = ShardSink { peer, buf: Vec::with_capacity(4 << 20) };
    let mut w = shard_file::write(model, split, sha, shard_file::HashingWriter::new(sink))?;
    w.flush().map_err(|e| ClusterError::Plan(format!("sending node {node} its shard: {e}")))?;
    let total = w.bytes;
    let (sha256, sink) = w.finish();
    sink.peer.send(&Message::ShardEnd { total, sha256 })?;
    if progress {
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "node {node}: shard sent, {:.1} MiB in {s:.1} s ({:.0} MB/s)",
            total as f64 / (1 << 20) as f64,
            total as f64 / 1e6 / s.max(1e-9)
        );
    }
    Ok(())
}
