//! Pipelined-ring parallelism over TCP (prima.cpp's ring, issue #7): the coordinator's
//! side ([`gather`] then [`PendingRing::open`]) and the worker's ([`serve_ring`]).
//!
//! A ring session, after the [handshake](crate::handshake) (the `Hello` carries a whole
//! model "shard": ring devices compute whole layers):
//!
//! 1. coordinator → every worker [`Message::ProfileRequest`]; the worker answers
//!    [`Message::Profile`] ([`WorkerProfile`]: its `hearth profile`, threads and memory
//!    budget), which the layer solver needs;
//! 2. the coordinator assigns windows (the solver, or `--layer-window`); a worker given
//!    no layers gets [`Message::Shutdown`] and leaves the ring;
//! 3. coordinator → each ring worker [`Message::RingSession`] (its window per round, a
//!    random link token, whether its predecessor is a worker); the worker builds its
//!    context for those layers only (KV cache included) and answers
//!    [`Message::RingReady`] with the port it waits on for its predecessor;
//! 4. coordinator → each ring worker [`Message::Link`] (the next worker's address, or
//!    none: back to the coordinator). Workers connect to their successor
//!    ([`Message::LinkHello`] with the token), accept their predecessor, and answer
//!    [`Message::Linked`];
//! 5. per forward pass and round: the coordinator runs its window and sends
//!    [`Message::Hop`] to the first worker, each worker runs its window and sends the
//!    hop to the next, the last sends it back to the coordinator. Activations travel in
//!    f32, so every device computes on exactly the numbers one machine would.
//!
//! `StatsRequest` and `Shutdown` travel the ring like hops (each worker answers
//! `Stats` on its own connection to the coordinator). A worker whose predecessor
//! disappears, or whose window fails, sends [`Message::Error`] naming the failed node on
//! along the ring, so the coordinator learns at once which device to drop.

use crate::allreduce::{CommError, Peer};
use crate::auth::ClusterKey;
use crate::cluster::{model_dims, pass_timeout, ClusterError, MakeContext, SessionEnd, WorkerModel, SETUP_TIMEOUT};
use crate::handshake::coordinator_handshake;
use crate::profile::DeviceProfile;
use crate::shard::NodeShard;
use crate::wire::{Hello, Message, NodeStats, RingSession, WireType, PROTOCOL_VERSION};
use hearth_model::{CacheType, CollectiveError, Context, Model, RingLink, RingWindows};
use serde::{Deserialize, Serialize};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a worker reports about itself before a ring session ([`Message::Profile`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerProfile {
    /// Its measured profile (`hearth profile`), when it has one.
    pub profile: Option<DeviceProfile>,
    /// Threads it computes with.
    pub threads: usize,
    /// Bytes of RAM it may use for the model: its `--mem-budget`, else its available RAM.
    pub budget_bytes: u64,
    /// Whether it streams layers that do not fit from disk (it has the model file and a budget).
    pub can_stream: bool,
    /// Whether it has the model file (a ring worker needs it).
    #[serde(default)]
    pub has_model: bool,
}

/// A worker after the handshake, before its ring session.
pub struct RingMember {
    /// Its address (`HOST:PORT`), as the coordinator reached it.
    pub addr: String,
    /// What it reported (default when profiles were not asked for).
    pub profile: WorkerProfile,
    /// Median round trip of a small message to it, ms (0 when not measured).
    pub rtt_ms: f64,
    /// Throughput of a burst of 60 KiB messages to it, Mbit/s (0 when not measured).
    pub mbit: f64,
    peer: Peer,
}

/// Workers connected and profiled, waiting for their windows. Dropped unopened (a plan
/// that only predicts, a refused one), it sends each worker a Shutdown, so a worker can
/// tell a coordinator that is done with it from one that vanished.
pub struct PendingRing {
    /// Nodes `1..`, in `--workers` order.
    pub members: Vec<RingMember>,
}

impl Drop for PendingRing {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.peer.send(&Message::Shutdown);
        }
    }
}

fn whole_shard(model: &Model, node: usize, n_nodes: usize) -> NodeShard {
    let dims = model_dims(model);
    NodeShard { node, n_nodes, kv_heads: 0..dims.n_head_kv, ffn_rows: 0..dims.n_ff, dims }
}

/// Connect to every worker of `workers` (nodes `1..`), authenticate with `key`, check
/// they serve `model` (SHA-256 `sha256`) and, with `profiles`, ask each for its profile
/// (a worker without a cached one measures it first) and time a few round trips.
pub fn gather(
    model: &Model,
    sha256: [u8; 32],
    workers: &[String],
    key: Option<&ClusterKey>,
    timeout: Duration,
    profiles: bool,
) -> Result<PendingRing, ClusterError> {
    let n = workers.len() + 1;
    let mut members = Vec::with_capacity(n - 1);
    let mut dialed = crate::cluster::Dialed::default();
    for (i, addr) in workers.iter().enumerate() {
        let node = i + 1;
        let mut join = || -> Result<RingMember, ClusterError> {
            let mut peer = dialed.dial(addr, node, timeout)?;
            let hello = Hello { version: PROTOCOL_VERSION, model_sha256: sha256, wire: WireType::F32, shard: whole_shard(model, node, n) };
            coordinator_handshake(&mut peer, &hello, key)?;
            let mut profile = WorkerProfile::default();
            let (mut rtt_ms, mut mbit) = (0.0, 0.0);
            if profiles {
                (rtt_ms, mbit) = measure_link(&mut peer)?;
                // A worker without a cached profile measures one now.
                peer.send(&Message::ProfileRequest)?;
                profile = match peer.recv_within(SETUP_TIMEOUT)?.0 {
                    Message::Profile(json) => serde_json::from_slice(&json)
                        .map_err(|e| ClusterError::Refused { node, message: format!("sent a profile that does not parse: {e}") })?,
                    Message::Error(e) => return Err(ClusterError::Refused { node, message: e.message }),
                    other => return Err(ClusterError::Refused { node, message: format!("answered {} instead of Profile", other.name()) }),
                };
            }
            Ok(RingMember { addr: addr.clone(), profile, rtt_ms, mbit, peer })
        };
        match join() {
            Ok(m) => members.push(m),
            Err(e) => {
                crate::cluster::report_setup_failure(members.iter_mut().map(|m| &mut m.peer), &e);
                return Err(e);
            }
        }
    }
    Ok(PendingRing { members })
}

/// Round trip (median of 5 small pings, ms) and throughput (16 pipelined 60 KiB pings,
/// Mbit/s) of the link to a worker that has passed the handshake.
pub fn measure_link(peer: &mut Peer) -> Result<(f64, f64), ClusterError> {
    let pong = |peer: &mut Peer, want: u64| -> Result<(), ClusterError> {
        match peer.recv()?.0 {
            Message::Pong(n) if n == want => Ok(()),
            other => Err(ClusterError::Refused { node: peer.node(), message: format!("answered {} to a ping", other.name()) }),
        }
    };
    let mut rtts = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        peer.send(&Message::Ping(vec![0; 8]))?;
        pong(peer, 8)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    rtts.sort_by(f64::total_cmp);
    const N: usize = 16;
    const BYTES: usize = 60 << 10;
    let t = Instant::now();
    for _ in 0..N {
        peer.send(&Message::Ping(vec![0; BYTES]))?;
    }
    for _ in 0..N {
        pong(peer, BYTES as u64)?;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((rtts[rtts.len() / 2], (N * BYTES * 8) as f64 / 1e6 / secs.max(1e-9)))
}

/// Measure the link to each worker of `addrs` serving `model` (SHA-256 `sha256`): round
/// trip and throughput ([`measure_link`]), after the handshake; each is then left.
pub fn probe_links(
    model: &Model,
    sha256: [u8; 32],
    addrs: &[String],
    key: Option<&ClusterKey>,
    timeout: Duration,
) -> Result<Vec<crate::profile::LinkProfile>, ClusterError> {
    let mut out = Vec::new();
    let mut dialed = crate::cluster::Dialed::default();
    for (i, addr) in addrs.iter().enumerate() {
        let mut peer = dialed.dial(addr, i + 1, timeout)?;
        let hello = Hello {
            version: PROTOCOL_VERSION,
            model_sha256: sha256,
            wire: WireType::F32,
            shard: whole_shard(model, i + 1, addrs.len() + 1),
        };
        coordinator_handshake(&mut peer, &hello, key)?;
        let (rtt_ms, mbit) = measure_link(&mut peer)?;
        let _ = peer.send(&Message::Shutdown);
        out.push(crate::profile::LinkProfile { peer: addr.clone(), rtt_ms, mbit });
    }
    Ok(out)
}

/// One worker of a running ring, as it reported at setup.
#[derive(Debug, Clone)]
pub struct RingWorker {
    /// Its node index (`--workers` position + 1).
    pub node: usize,
    /// Its address.
    pub addr: String,
    /// Its layers per round.
    pub window: usize,
    /// KV cache bytes.
    pub kv_bytes: u64,
    /// Weight bytes of its layers.
    pub weight_bytes: u64,
}

/// A ring ready to run: the coordinator's windows and its link to the others.
pub struct RingGroup {
    /// The coordinator's windows (pass to [`Context::set_ring`] with `link`).
    pub windows: RingWindows,
    /// The link to the first worker and from the last.
    pub link: TcpRing,
    /// The workers in the ring, in ring order (those given no layers left).
    pub workers: Vec<RingWorker>,
}

impl PendingRing {
    /// Open the ring: `windows[i]` layers per round for node `i` (node 0 = this
    /// coordinator; `n_layer` must be a multiple of `Σ windows`). Workers given 0 layers
    /// are sent away. Every ring worker builds its context for `n_ctx` positions,
    /// batches of `n_batch`, KV cache type `cache` and the coordinator's f32 attention
    /// threshold `f32_attn_from`, then the links are made.
    pub fn open(
        mut self,
        model: &Model,
        windows: &[usize],
        n_ctx: usize,
        n_batch: usize,
        cache: CacheType,
        f32_attn_from: usize,
    ) -> Result<RingGroup, ClusterError> {
        let r = self.link_up(model, windows, n_ctx, n_batch, cache, f32_attn_from);
        if let Err(e) = &r {
            // (Then Drop's Shutdown finds them gone.)
            crate::cluster::report_setup_failure(self.members.iter_mut().map(|m| &mut m.peer), e);
        }
        r
    }

    /// [`PendingRing::open`]; the members stay in `self` until the ring is up, so a
    /// failure can be reported to each.
    fn link_up(
        &mut self,
        model: &Model,
        windows: &[usize],
        n_ctx: usize,
        n_batch: usize,
        cache: CacheType,
        f32_attn_from: usize,
    ) -> Result<RingGroup, ClusterError> {
        let n_layer = model.config.n_layer;
        if windows.len() != self.members.len() + 1 {
            return Err(ClusterError::Plan(format!("{} layer windows for {} devices", windows.len(), self.members.len() + 1)));
        }
        let head = RingWindows::from_assignment(n_layer, windows, 0)?;
        let token: [u8; 32] = rand::random();
        // The ring's workers in order: (index in `members`, what it reported, link port).
        let mut ring: Vec<(usize, RingWorker, u16)> = Vec::new();
        for (i, m) in self.members.iter_mut().enumerate() {
            let node = i + 1;
            if windows[node] == 0 {
                let _ = m.peer.send(&Message::Shutdown);
                continue;
            }
            let rounds =
                RingWindows::from_assignment(n_layer, windows, node)?.rounds.iter().map(|r| r.start as u64..r.end as u64).collect();
            let listen = !ring.is_empty();
            let s = RingSession {
                n_ctx: n_ctx as u64,
                n_batch: n_batch as u64,
                cache_type: crate::cluster::cache_byte(cache),
                listen,
                token,
                f32_attn_from: f32_attn_from as u64,
                rounds,
            };
            m.peer.send(&Message::RingSession(s))?;
            match m.peer.recv_within(SETUP_TIMEOUT)?.0 {
                Message::RingReady { kv_bytes, weight_bytes, link_port } => {
                    let w = RingWorker { node, addr: m.addr.clone(), window: windows[node], kv_bytes, weight_bytes };
                    ring.push((i, w, link_port));
                }
                Message::Error(e) => return Err(ClusterError::Refused { node, message: e.message }),
                other => return Err(ClusterError::Refused { node, message: format!("answered {} instead of RingReady", other.name()) }),
            }
        }
        // Each worker's successor: the next ring worker's host (as we reach it) and link
        // port; and its predecessor's address, to name that link in its reports.
        for p in 0..ring.len() {
            let next = ring.get(p + 1).map(|&(i, _, port)| {
                let host = self.members[i].peer.stream().peer_addr().map(|a| a.ip().to_string()).unwrap_or_else(|_| "127.0.0.1".into());
                std::net::SocketAddr::new(host.parse().unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()), port).to_string()
            });
            let prev = p.checked_sub(1).map(|q| self.members[ring[q].0].peer.addr().to_string());
            self.members[ring[p].0].peer.send(&Message::Link { token, next, prev })?;
        }
        for (i, w, _) in &ring {
            match self.members[*i].peer.recv_within(SETUP_TIMEOUT)?.0 {
                Message::Linked => {}
                Message::Error(e) => return Err(ClusterError::Refused { node: w.node, message: e.message }),
                other => {
                    return Err(ClusterError::Refused { node: w.node, message: format!("answered {} instead of Linked", other.name()) })
                }
            }
        }
        let workers = ring.iter().map(|(_, w, _)| w.clone()).collect();
        // (Ring order is `members` order; those given no layers were sent away.)
        let peers: Vec<Peer> = std::mem::take(&mut self.members)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| ring.iter().any(|r| r.0 == *i))
            .map(|(_, m)| m.peer)
            .collect();
        let base_timeout = peers.first().map(|p| p.timeout());
        let inner = Arc::new(Mutex::new(Inner { peers, counters: RingCounters::default() }));
        let link = TcpRing { inner, base_timeout, n_embd: model.config.n_embd, failed: None };
        Ok(RingGroup { windows: head, link, workers })
    }
}

/// The activations did not come back around the ring in time.
#[derive(Debug, thiserror::Error)]
#[error(
    "the ring stalled: the activations did not come back within {:.1} s; one of its devices ({devices}) stopped or is \
     overloaded (if it is only slow, raise --step-timeout)",
    after.as_secs_f64()
)]
pub struct RingStalled {
    /// How long the coordinator waited.
    pub after: Duration,
    /// The ring's workers, for the message.
    pub devices: String,
}

/// The coordinator's time and bytes in the ring.
#[derive(Debug, Clone, Default)]
pub struct RingCounters {
    /// Hops sent around the ring (one per round of each pass).
    pub rounds: u64,
    /// Seconds from sending a hop until it came back: the other devices' windows and
    /// every hop of the round.
    pub ring_secs: f64,
    /// Bytes sent and received.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
}

/// The coordinator's [`RingLink`] over TCP: hops go to the first ring worker and come
/// back from the last (both through their session connections).
pub struct TcpRing {
    inner: Arc<Mutex<Inner>>,
    /// The step timeout for a one-token pass on one device.
    base_timeout: Option<Duration>,
    n_embd: usize,
    /// The error that failed a pass: sent around the ring at the end instead of a
    /// Shutdown, so the devices that are still up log a failed session, not a clean end.
    failed: Option<crate::wire::ErrorMsg>,
}

struct Inner {
    /// Ring workers in ring order (their session connections).
    peers: Vec<Peer>,
    counters: RingCounters,
}

/// The coordinator's view of a running ring, for reports.
#[derive(Clone)]
pub struct RingHandle {
    inner: Arc<Mutex<Inner>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TcpRing {
    /// A handle for reports while the context owns the link.
    pub fn handle(&self) -> RingHandle {
        RingHandle { inner: self.inner.clone() }
    }
}

impl RingHandle {
    /// A snapshot of the coordinator's counters.
    pub fn counters(&self) -> RingCounters {
        lock(&self.inner).counters.clone()
    }

    /// Every ring worker's counters, in ring order. Call between forward passes; the
    /// request travels the ring, each worker answers on its own connection.
    pub fn worker_stats(&self) -> Result<Vec<NodeStats>, CommError> {
        let mut inner = lock(&self.inner);
        let Some(first) = inner.peers.first_mut() else { return Ok(Vec::new()) };
        first.send(&Message::StatsRequest)?;
        crate::cluster::collect_stats(&mut inner.peers)
    }
}

impl RingLink for TcpRing {
    fn pass(&mut self, pos0: usize, round: usize, x: &mut [f32]) -> Result<(), CollectiveError> {
        let r = self.pass_once(pos0, round, x);
        if let Err(e) = &r {
            let comm = e.downcast_ref::<CommError>();
            let text = comm.map_or_else(|| e.to_string(), |c| c.report_text());
            // (No one to blame, as when the ring stalled: the coordinator, node 0, ended it;
            // a relaying device would otherwise name itself.)
            let failed_node = Some(comm.and_then(|c| c.failed_node()).unwrap_or(0) as u64);
            self.failed = Some(crate::wire::ErrorMsg { failed_node, message: format!("the coordinator ended the session after an error: {text}") });
        }
        r
    }

    fn max_elements(&self) -> usize {
        (crate::wire::DEFAULT_MAX_FRAME - 4096) / 4
    }
}

impl TcpRing {
    /// One pass around the ring ([`RingLink::pass`]).
    fn pass_once(&mut self, pos0: usize, round: usize, x: &mut [f32]) -> Result<(), CollectiveError> {
        let t = Instant::now();
        let n_tokens = x.len() / self.n_embd.max(1);
        let base = self.base_timeout;
        let mut inner = lock(&self.inner);
        let Inner { peers, counters } = &mut *inner;
        let n_peers = peers.len();
        let Some(first) = peers.first_mut() else { return Ok(()) };
        let hop = Message::Hop { pos0: pos0 as u64, round: round as u32, x: x.to_vec() };
        let sent = first.send(&hop)? as u64;
        let last = &mut peers[n_peers - 1];
        // The hop crosses every worker: allow each its step timeout for this batch.
        let wait = base.map(|b| pass_timeout(b, n_tokens).mul_f64(n_peers as f64)).unwrap_or(last.timeout());
        let (msg, got) = match last.recv_within(wait) {
            Ok(m) => m,
            // Which device stalls cannot be told from here: every one waits on its predecessor.
            Err(CommError::Timeout { after, .. }) => {
                let devices = peers.iter().map(|p| format!("node {} ({})", p.node(), p.addr())).collect::<Vec<_>>().join(", ");
                return Err(Box::new(RingStalled { after, devices }));
            }
            Err(e) => return Err(Box::new(e)),
        };
        match msg {
            Message::Hop { pos0: p, round: r, x: y } if p == pos0 as u64 && r == round as u32 && y.len() == x.len() => {
                x.copy_from_slice(&y)
            }
            Message::Hop { pos0: p, round: r, x: y } => {
                return Err(Box::new(CommError::Protocol {
                    node: last.node(),
                    addr: last.addr().to_string(),
                    why: format!(
                        "expected the hop of round {round} at {pos0} ({} values), got round {r} at {p} ({} values)",
                        x.len(),
                        y.len()
                    ),
                }))
            }
            Message::Error(e) => {
                let mut err = CommError::relayed(last.node(), e);
                // A device whose link from this coordinator closed blames node 0, us, alive:
                // the device itself may have said why on that link before it closed (another
                // coordinator took it over), so its own report names it.
                if err.failed_node() == Some(0) {
                    if let Some(own) = first_report(peers, Duration::from_millis(300)) {
                        return Err(Box::new(own));
                    }
                }
                // Name the failed device by the address we know it by, unless it is named.
                if let CommError::Relayed { failed, message } = &mut err {
                    if let Some(p) = peers.iter().find(|p| p.node() == *failed).filter(|p| !message.contains(p.addr())) {
                        *message = format!("{message} [node {failed} is {}]", p.addr());
                    }
                }
                return Err(Box::new(err));
            }
            other => {
                return Err(Box::new(CommError::Protocol {
                    node: last.node(),
                    addr: last.addr().to_string(),
                    why: format!("expected Hop, got {}", other.name()),
                }))
            }
        }
        counters.rounds += 1;
        counters.ring_secs += t.elapsed().as_secs_f64();
        counters.bytes_sent += sent;
        counters.bytes_received += got as u64;
        Ok(())
    }
}

/// The first error report a device sent on its own link to the coordinator within `wait`
/// (all the devices together), as that device's error.
fn first_report(peers: &mut [Peer], wait: Duration) -> Option<CommError> {
    let deadline = Instant::now() + wait;
    peers.iter_mut().find_map(|p| match p.recv_within(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))) {
        Ok((Message::Error(e), _)) => Some(CommError::remote(p.node(), p.addr(), e)),
        _ => None,
    })
}

impl Drop for TcpRing {
    /// Ends the session: a Shutdown travels the ring, or after a failed pass its error.
    fn drop(&mut self) {
        if let Some(first) = lock(&self.inner).peers.first_mut() {
            let _ = match self.failed.take() {
                Some(e) => first.send(&Message::Error(e)),
                None => first.send(&Message::Shutdown),
            };
        }
    }
}

/// Where a ring worker sends what it computed.
enum Out {
    /// The next worker (node index), over its link.
    Worker(Peer),
    /// Back to the coordinator, over the session connection.
    Coordinator,
}

/// Serve a ring session on `control` (the coordinator's connection, after the
/// handshake and `session`): build the context for this worker's windows with
/// `make_ctx`, make the links, then run every hop through its window.
pub fn serve_ring(
    mut control: Peer,
    me: usize,
    worker: &WorkerModel,
    session: RingSession,
    make_ctx: MakeContext<'_>,
    timeout: Duration,
) -> Result<SessionEnd, ClusterError> {
    let fail = |control: &mut Peer, e: ClusterError| {
        control.report(Some(me), &e.to_string());
        Err(e)
    };
    let WorkerModel::File { model, .. } = worker else {
        return fail(
            &mut control,
            ClusterError::Plan("a ring worker needs the model file (start it with -m MODEL, not --model-sha256)".into()),
        );
    };
    let n_layer = model.config.n_layer;
    let rounds: Vec<std::ops::Range<usize>> = session
        .rounds
        .iter()
        .map(|r| usize::try_from(r.start).unwrap_or(usize::MAX)..usize::try_from(r.end).unwrap_or(usize::MAX))
        .collect();
    let windows = RingWindows { rounds };
    if let Err(e) = windows.owned(n_layer) {
        return fail(&mut control, e.into());
    }
    let n_ctx = match usize::try_from(session.n_ctx).ok().filter(|&c| c >= 1 && c <= model.config.n_ctx_train) {
        Some(c) => c,
        None => {
            let why = format!("context size {} is outside 1..={} (the model's trained context)", session.n_ctx, model.config.n_ctx_train);
            return fail(&mut control, ClusterError::Plan(why));
        }
    };
    let n_batch = usize::try_from(session.n_batch).unwrap_or(usize::MAX).clamp(1, n_ctx);
    let mut ctx: Context =
        match make_ctx(model.clone(), n_ctx, n_batch, crate::cluster::cache_type(session.cache_type), Some(windows.clone()), None) {
            Ok(c) => c,
            Err(e) => return fail(&mut control, e.into()),
        };
    ctx.set_f32_attention_from(usize::try_from(session.f32_attn_from).unwrap_or(usize::MAX));
    // Our predecessor connects to us on a port of the address the coordinator reached.
    let listener = if session.listen {
        let ip = control.stream().local_addr().map(|a| a.ip()).unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        match TcpListener::bind((ip, 0)) {
            Ok(l) => Some(l),
            Err(e) => return fail(&mut control, ClusterError::Plan(format!("opening a link port on {ip}: {e}"))),
        }
    } else {
        None
    };
    let port = listener.as_ref().and_then(|l| l.local_addr().ok()).map_or(0, |a| a.port());
    let weight_bytes: u64 = {
        let w = &model.weights;
        (0..n_layer)
            .filter(|&il| windows.owned(n_layer).map(|o| o[il]).unwrap_or(false))
            .map(|il| w.layers[il].matrices().iter().map(|t| t.size as u64).sum::<u64>())
            .sum()
    };
    control.send(&Message::RingReady { kv_bytes: ctx.kv_bytes() as u64, weight_bytes, link_port: port })?;
    let (token, next, prev) = match control.recv_within(SETUP_TIMEOUT)?.0 {
        Message::Link { token, next, prev } if token == session.token => (token, next, prev),
        Message::Link { .. } => return fail(&mut control, ClusterError::Plan("the link token does not match the session's".into())),
        Message::Shutdown => return Ok(SessionEnd::Finished { passes: 0, shutdown: true }),
        Message::Error(e) => return Err(ClusterError::Coordinator(e.message)),
        other => return fail(&mut control, ClusterError::Plan(format!("expected Link, got {}", other.name()))),
    };
    let mut out = match next {
        Some(addr) => {
            let r = (|| {
                let mut p = crate::cluster::dial(&addr, me + 1, timeout)?;
                p.send(&Message::LinkHello { token, node: me as u64 })?;
                Ok::<_, ClusterError>(p)
            })();
            match r {
                Ok(p) => Out::Worker(p),
                Err(e) => return fail(&mut control, ClusterError::Plan(format!("linking to the next device {addr}: {e}"))),
            }
        }
        None => Out::Coordinator,
    };
    let mut input = match listener {
        Some(l) => match accept_link(&l, &token, SETUP_TIMEOUT) {
            Ok(p) => Some(match prev {
                Some(a) => p.with_addr(a),
                None => p,
            }),
            Err(e) => return fail(&mut control, e),
        },
        None => None,
    };
    control.send(&Message::Linked)?;

    let mut stats = NodeStats::default();
    loop {
        let from = input.as_ref().map_or(0, |p| p.node());
        let got = match input.as_mut() {
            Some(p) => p.recv_idle(),
            None => control.recv_idle(),
        };
        let mut send = |control: &mut Peer, m: &Message| -> Result<(), CommError> {
            let p = match &mut out {
                Out::Worker(p) => p,
                Out::Coordinator => control,
            };
            p.send(m).map(|_| ())
        };
        let (pos0, round, mut x) = match got {
            Ok((Message::Hop { pos0, round, x }, _)) => (pos0, round, x),
            Ok((Message::StatsRequest, _)) => {
                let io = ctx.source_stats().map_or(0.0, |s| s.wait_secs);
                control.send(&Message::Stats(NodeStats { io_wait_secs: io, ..stats }))?;
                if let Out::Worker(p) = &mut out {
                    p.send(&Message::StatsRequest)?;
                }
                continue;
            }
            // The end (a coordinator that closes its connection ends the ring too).
            Ok((Message::Shutdown, _)) | Err(CommError::Closed { node: 0, .. }) => {
                // A shutdown travels on; a coordinator that vanished is not one.
                let shutdown = matches!(got, Ok((Message::Shutdown, _)));
                if let Out::Worker(p) = &mut out {
                    // The devices after us wait on our link: tell them which end failed,
                    // or they blame us for closing it.
                    let _ = match shutdown {
                        true => p.send(&Message::Shutdown),
                        false => p.send(&Message::Error(crate::wire::ErrorMsg {
                            failed_node: Some(0),
                            message: format!("node {me} lost the coordinator: it closed the connection without a shutdown (it exited or was stopped)"),
                        })),
                    };
                }
                return Ok(SessionEnd::Finished { passes: stats.passes, shutdown });
            }
            Ok((Message::Error(err), _)) => {
                // Pass it on toward the coordinator, then end.
                let _ = send(&mut control, &Message::Error(err.clone()));
                return Err(CommError::relayed(from, err).into());
            }
            Ok((other, _)) => {
                let why = format!("node {me}: expected Hop, got {}", other.name());
                let _ = send(&mut control, &Message::Error(crate::wire::ErrorMsg { failed_node: Some(me as u64), message: why.clone() }));
                return Err(ClusterError::Plan(why));
            }
            Err(err) => {
                // Our predecessor is gone: tell the coordinator (along the ring) which one.
                let why = format!("node {me} lost its link from node {from}: {err}");
                let _ = send(&mut control, &Message::Error(crate::wire::ErrorMsg { failed_node: Some(from as u64), message: why }));
                return Err(err.into());
            }
        };
        let t = Instant::now();
        let pos = usize::try_from(pos0).unwrap_or(usize::MAX);
        let r = ctx.eval_round(pos, round as usize, &mut x);
        stats.busy_secs += t.elapsed().as_secs_f64();
        if let Err(err) = r {
            let why = format!("node {me}: {err}");
            let _ = send(&mut control, &Message::Error(crate::wire::ErrorMsg { failed_node: Some(me as u64), message: why }));
            return Err(err.into());
        }
        let t = Instant::now();
        let hop = Message::Hop { pos0, round, x };
        if let Err(err) = send(&mut control, &hop) {
            // The next device is gone: say so to the coordinator (it may also hear it along the ring).
            control.report(err.failed_node(), &format!("node {me} cannot reach the next device: {err}"));
            return Err(err.into());
        }
        stats.comm_secs += t.elapsed().as_secs_f64();
        stats.busy_secs += t.elapsed().as_secs_f64();
        stats.passes += (round as usize + 1 == ctx_rounds(&ctx)) as u64;
    }
}

fn ctx_rounds(ctx: &Context) -> usize {
    ctx.ring_windows().map_or(1, |w| w.k())
}

/// Accept the predecessor's link on `l`: the first connection that presents `token`
/// within `within` (others are dropped).
fn accept_link(l: &TcpListener, token: &[u8; 32], within: Duration) -> Result<Peer, ClusterError> {
    let deadline = Instant::now() + within;
    l.set_nonblocking(true).map_err(|e| ClusterError::Plan(format!("link listener: {e}")))?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let Ok(mut p) = Peer::new(s, 0, Duration::from_secs(10)).map(|p| p.with_max_frame(crate::cluster::HANDSHAKE_MAX_FRAME))
                else {
                    continue;
                };
                if let Ok((Message::LinkHello { token: t, node }, _)) = p.recv() {
                    if &t == token {
                        let stream: TcpStream = p.into_stream();
                        let node = usize::try_from(node).unwrap_or(usize::MAX);
                        return Peer::new(stream, node, Duration::from_secs(10))
                            .map_err(|e| ClusterError::Plan(format!("link from node {node}: {e}")));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(ClusterError::Plan(format!(
                        "the previous device of the ring did not connect within {} s",
                        within.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(ClusterError::Plan(format!("accepting the link: {e}"))),
        }
    }
}
