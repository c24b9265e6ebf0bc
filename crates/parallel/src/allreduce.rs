//! Allreduce: every node passes its partial sum and ends with the sum over all nodes.
//!
//! - [`Local`]: one node, nothing to do.
//! - [`Star`]: every worker sends its partial to the master (node 0), which adds them
//!   in node order — its own, then node 1's, node 2's, … — and sends the sum back. The
//!   result is deterministic and, with the f32 wire, bit-identical to
//!   `((x0 + x1) + x2) + …` summed on one machine.
//! - [`Ring`]: reduce-scatter then all-gather around the ring `0 → 1 → … → N−1 → 0`
//!   (`2(N−1)` steps of `1/N` of the buffer each). Deterministic too (fixed schedule),
//!   but each chunk is summed starting from a different node, so its rounding differs
//!   from the star's.
//!
//! With the Q8_0 wire every node still ends with the *same* values: the master (star) or
//! a chunk's owner (ring) replaces its own copy of the final sum by the dequantized
//! bytes it sends, and the ring forwards received bytes verbatim.
//!
//! **Faults.** Every socket has read and write timeouts ([`Peer::new`]); a peer that
//! closes its socket, resets it, sends a bad frame or stays silent past the timeout is
//! an error naming its node. The node that detects a failure tells the others with an
//! [`Message::Error`] naming the failed node before returning (the star master tells
//! every worker; a ring node tells its successor, which forwards it), so the whole
//! group fails within about one timeout with the same culprit. A star worker waits
//! twice the timeout for the master's sum, since the master may need one timeout to
//! detect a silent worker. (A ring node whose predecessor stalls *without* closing its
//! socket names the predecessor it was waiting on, which may be an innocent node
//! itself waiting on the stalled one; a closed or reset socket is named exactly.)
//! After any error the group is [`CommError::Broken`]: the streams may be out of step,
//! so the caller builds a new group (e.g. re-splits over the remaining nodes).

use crate::wire::{read_frame, ErrorMsg, Message, Partial, WireError, WireType, DEFAULT_MAX_FRAME, Q8_0_BLOCK};
use std::io::{self, Write};
use std::net::TcpStream;
use std::ops::{Add, AddAssign, Range};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Default read/write timeout of a [`Peer`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Frames up to this size are written before reading in a ring step (the socket
/// buffers absorb them); larger ones are written from a scoped thread so that the
/// ring cannot deadlock with every node blocked in `write`.
const INLINE_SEND: usize = 64 << 10;

/// How long a ring node whose send failed still listens to its predecessor for an
/// error report naming the real culprit.
const SEND_FAIL_GRACE: Duration = Duration::from_secs(1);

/// What one allreduce cost this node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommStats {
    /// Bytes written to sockets (frames, headers included).
    pub bytes_sent: u64,
    /// Bytes read from sockets.
    pub bytes_received: u64,
    /// Wall-clock seconds inside the call (transfers, waiting for peers, and the
    /// additions).
    pub seconds: f64,
}

impl AddAssign for CommStats {
    fn add_assign(&mut self, o: Self) {
        self.bytes_sent += o.bytes_sent;
        self.bytes_received += o.bytes_received;
        self.seconds += o.seconds;
    }
}

impl Add for CommStats {
    type Output = Self;
    fn add(mut self, o: Self) -> Self {
        self += o;
        self
    }
}

/// A failed allreduce (or a failed send/receive on a [`Peer`]).
#[derive(Debug, Error)]
pub enum CommError {
    /// The peer sent nothing (or took nothing) for the whole timeout.
    #[error(
        "node {node} ({addr}) timed out: nothing for {} while {op} (if it is only slow, e.g. computing a large batch, raise --step-timeout)",
        secs(*after)
    )]
    Timeout {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
        /// What we were doing (`"receiving"`, `"sending"`).
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The peer closed or reset the connection.
    #[error("node {node} ({addr}) closed the connection while {op}")]
    Closed {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
        /// What we were doing.
        op: &'static str,
    },
    /// Another socket error.
    #[error("node {node} ({addr}): {op} failed: {source}")]
    Io {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
        /// What we were doing.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The peer sent a frame that does not decode.
    #[error("node {node} ({addr}) sent a bad frame: {source}")]
    Wire {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
        /// The decoding error.
        #[source]
        source: WireError,
    },
    /// The peer sent a valid frame that does not fit the exchange (wrong message,
    /// sequence number, step, offset, length or wire type).
    #[error("node {node} ({addr}): protocol error: {why}")]
    Protocol {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
        /// What did not fit.
        why: String,
    },
    /// A peer reported a failure (its own, or one it detected in another node). Its
    /// own reads `node 1 (ADDR): MESSAGE` (it may be no failure: another coordinator took
    /// the worker over), another's `node 2 failed (reported by node 1, ADDR): MESSAGE`.
    #[error("{}", remote_text(*.from, .addr, *.failed, .message))]
    Remote {
        /// The node that sent the report.
        from: usize,
        /// Its address.
        addr: String,
        /// The node that failed.
        failed: usize,
        /// The report.
        message: String,
    },
    /// A ring device's failure report that came around the ring: the device that handed
    /// it to us relayed it, so no "reported by" (the report's text names its sender).
    /// One that blames node 0 is about the coordinator and says so itself ("node 1 lost
    /// the coordinator: …"): no "node 0 failed: " before it.
    #[error("{}", relayed_text(*.failed, .message))]
    Relayed {
        /// The node that failed.
        failed: usize,
        /// The report.
        message: String,
    },
    /// The peer ended the session.
    #[error("node {node} ({addr}) shut down")]
    Shutdown {
        /// The peer's node index.
        node: usize,
        /// Its address.
        addr: String,
    },
    /// An earlier allreduce of this group failed; the group cannot be used again.
    #[error("the allreduce group is unusable after an earlier error: {reason}")]
    Broken {
        /// The node that failed then, if known.
        failed: Option<usize>,
        /// The earlier error.
        reason: String,
    },
    /// The group was built wrongly (node indices, counts).
    #[error("invalid allreduce setup: {0}")]
    Setup(String),
}

/// `1.5 s`, `100 ms`.
pub(crate) fn secs(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn relayed_text(failed: usize, message: &str) -> String {
    if failed == 0 {
        message.to_string()
    } else {
        format!("node {failed} failed: {message}")
    }
}

fn remote_text(from: usize, addr: &str, failed: usize, message: &str) -> String {
    if failed == from {
        format!("node {from} ({addr}): {message}")
    } else {
        format!("node {failed} failed (reported by node {from}, {addr}): {message}")
    }
}

impl CommError {
    /// Node `from`'s (at `addr`) error report `e`: it blames the node it names, else
    /// `from` itself.
    pub fn remote(from: usize, addr: &str, e: ErrorMsg) -> Self {
        let failed = e.failed_node.and_then(|n| usize::try_from(n).ok()).unwrap_or(from);
        CommError::Remote { from, addr: addr.to_string(), failed, message: e.message }
    }

    /// A ring device's report `e`, handed on by node `via`: it blames the node it names,
    /// else `via`.
    pub fn relayed(via: usize, e: ErrorMsg) -> Self {
        let failed = e.failed_node.and_then(|n| usize::try_from(n).ok()).unwrap_or(via);
        CommError::Relayed { failed, message: e.message }
    }

    /// The text to pass on to other nodes in an error report: a report
    /// relayed from elsewhere travels as its original message (the receiver
    /// names the failed node and who told it), not nested in ours.
    pub fn report_text(&self) -> String {
        match self {
            CommError::Remote { message, .. } | CommError::Relayed { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The node this error blames, if any: the one to drop before re-splitting.
    pub fn failed_node(&self) -> Option<usize> {
        match self {
            CommError::Timeout { node, .. }
            | CommError::Closed { node, .. }
            | CommError::Io { node, .. }
            | CommError::Wire { node, .. }
            | CommError::Protocol { node, .. }
            | CommError::Shutdown { node, .. } => Some(*node),
            CommError::Remote { failed, .. } | CommError::Relayed { failed, .. } => Some(*failed),
            CommError::Broken { failed, .. } => *failed,
            CommError::Setup(_) => None,
        }
    }
}

/// Sum `buf` in place over every node of a group.
pub trait AllReduce: Send {
    /// Replace `buf` by the element-wise sum of every node's `buf` (all nodes pass the
    /// same length and call in the same order). Every node ends with identical values.
    fn allreduce(&mut self, buf: &mut [f32]) -> Result<CommStats, CommError>;
    /// This node's index.
    fn node(&self) -> usize;
    /// Nodes in the group.
    fn n_nodes(&self) -> usize;
}

/// The single-node group: the sum of one partial is itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl AllReduce for Local {
    fn allreduce(&mut self, _buf: &mut [f32]) -> Result<CommStats, CommError> {
        Ok(CommStats::default())
    }
    fn node(&self) -> usize {
        0
    }
    fn n_nodes(&self) -> usize {
        1
    }
}

/// A connection to another node: a TCP stream with `TCP_NODELAY` and timeouts, labelled
/// with the peer's node index and address for error messages. Also usable for the
/// session's control messages ([`Peer::send`], [`Peer::recv`]).
#[derive(Debug)]
pub struct Peer {
    node: usize,
    addr: String,
    stream: TcpStream,
    timeout: Duration,
    max_frame: usize,
    scratch: Vec<u8>,
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

impl Peer {
    /// Wrap a connected stream to node `node`: sets `TCP_NODELAY` and read/write
    /// timeouts of `timeout` (a zero timeout is raised to 1 ms: zero would mean none).
    pub fn new(stream: TcpStream, node: usize, timeout: Duration) -> io::Result<Self> {
        let timeout = timeout.max(Duration::from_millis(1));
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let addr = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        Ok(Self { node, addr, stream, timeout, max_frame: DEFAULT_MAX_FRAME, scratch: Vec::new() })
    }

    /// Name the peer `addr` in error messages instead of the socket's peer address (an
    /// accepted connection comes from an ephemeral port no one configured).
    pub fn with_addr(mut self, addr: String) -> Self {
        self.addr = addr;
        self
    }

    /// Accept frames up to `max` bytes (default [`DEFAULT_MAX_FRAME`]).
    pub fn with_max_frame(mut self, max: usize) -> Self {
        self.max_frame = max;
        self
    }

    /// The peer's node index.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Change the read/write timeout (e.g. longer for a large batch).
    pub fn set_timeout(&mut self, timeout: Duration) {
        let t = timeout.max(Duration::from_millis(1));
        if t != self.timeout {
            let _ = self.stream.set_read_timeout(Some(t));
            let _ = self.stream.set_write_timeout(Some(t));
            self.timeout = t;
        }
    }

    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The stream (e.g. to shut it down).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The stream, for exchanges that frame their own messages (e.g. [`crate::auth`]).
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// The largest frame accepted.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// The stream back.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    fn io_err(&self, op: &'static str, e: io::Error) -> CommError {
        let (node, addr) = (self.node, self.addr.clone());
        if is_timeout(&e) {
            CommError::Timeout { node, addr, op, after: self.timeout }
        } else if is_closed(&e) {
            CommError::Closed { node, addr, op }
        } else {
            CommError::Io { node, addr, op, source: e }
        }
    }

    /// Send one message; returns the frame's bytes.
    pub fn send(&mut self, msg: &Message) -> Result<usize, CommError> {
        if let Some(d) = emulated_delay() {
            std::thread::sleep(d);
        }
        self.scratch.clear();
        msg.encode_into(&mut self.scratch);
        let r = self.stream.write_all(&self.scratch).and_then(|_| self.stream.flush());
        match r {
            Ok(()) => Ok(self.scratch.len()),
            Err(e) if is_closed(&e) => Err(self.last_words().unwrap_or_else(|| self.io_err("sending", e))),
            Err(e) => Err(self.io_err("sending", e)),
        }
    }

    /// A peer that closed the connection may have said why first: a worker taken over by
    /// another coordinator writes an `Error`, then shuts the socket, and a send that
    /// fails on it reported only "closed the connection". That report, if it is among
    /// the next few frames already here.
    fn last_words(&mut self) -> Option<CommError> {
        let _ = self.stream.set_read_timeout(Some(Duration::from_millis(100)));
        let mut words = None;
        for _ in 0..8 {
            match read_frame(&mut self.stream, self.max_frame) {
                Ok((Message::Error(e), _)) => {
                    words = Some(CommError::remote(self.node, &self.addr, e));
                    break;
                }
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        let _ = self.stream.set_read_timeout(Some(self.timeout));
        words
    }

    /// Receive one message and the frame's bytes.
    pub fn recv(&mut self) -> Result<(Message, usize), CommError> {
        self.recv_within(self.timeout)
    }

    /// Receive one message, waiting as long as it takes (a worker idle between
    /// requests). A closed or reset connection still ends the wait.
    pub fn recv_idle(&mut self) -> Result<(Message, usize), CommError> {
        let _ = self.stream.set_read_timeout(None);
        let r = read_frame(&mut self.stream, self.max_frame);
        let _ = self.stream.set_read_timeout(Some(self.timeout));
        r.map_err(|e| self.recv_err(e, self.timeout))
    }

    fn recv_err(&self, e: WireError, timeout: Duration) -> CommError {
        match e {
            WireError::Io(e) => {
                let mut err = self.io_err("receiving", e);
                if let CommError::Timeout { after, .. } = &mut err {
                    *after = timeout;
                }
                err
            }
            WireError::Closed | WireError::ClosedMidFrame { .. } => {
                CommError::Closed { node: self.node, addr: self.addr.clone(), op: "receiving" }
            }
            source => CommError::Wire { node: self.node, addr: self.addr.clone(), source },
        }
    }

    /// [`Self::recv`] with another timeout for this one message.
    pub fn recv_within(&mut self, timeout: Duration) -> Result<(Message, usize), CommError> {
        if timeout != self.timeout {
            let _ = self.stream.set_read_timeout(Some(timeout));
        }
        let r = read_frame(&mut self.stream, self.max_frame);
        if timeout != self.timeout {
            let _ = self.stream.set_read_timeout(Some(self.timeout));
        }
        r.map_err(|e| self.recv_err(e, timeout))
    }

    /// Best effort: tell the peer about a failure (errors ignored).
    pub fn report(&mut self, failed_node: Option<usize>, message: &str) {
        let m = Message::Error(ErrorMsg { failed_node: failed_node.map(|n| n as u64), message: message.to_string() });
        let _ = self.send(&m);
    }

    fn protocol(&self, why: String) -> CommError {
        CommError::Protocol { node: self.node, addr: self.addr.clone(), why }
    }

    /// Check that `msg` is the expected piece of allreduce `seq`.
    fn expect_partial(&self, msg: Message, seq: u64, step: u32, range: &Range<usize>, wire: WireType) -> Result<Partial, CommError> {
        let p = match msg {
            Message::Partial(p) => p,
            Message::Error(e) => return Err(CommError::remote(self.node, &self.addr, e)),
            Message::Shutdown => return Err(CommError::Shutdown { node: self.node, addr: self.addr.clone() }),
            other => return Err(self.protocol(format!("expected a partial sum, got {}", other.name()))),
        };
        let want = (seq, step, range.start as u64, range.len() as u64, wire);
        let got = (p.seq, p.step, p.offset, p.n, p.wire);
        if want != got {
            return Err(self.protocol(format!(
                "expected partial (seq {}, step {}, offset {}, {} elements, {}), got (seq {}, step {}, offset {}, {} elements, {})",
                want.0, want.1, want.2, want.3, want.4, got.0, got.1, got.2, got.3, got.4
            )));
        }
        Ok(p)
    }
}

/// `HEARTH_EMU_LINK_DELAY_MS`: a one-way delay added before every message this process
/// sends, to emulate a home network's latency on loopback in benchmarks
/// (bench/ring-cluster.py; `netem` is not available here). Unset: none.
fn emulated_delay() -> Option<Duration> {
    static D: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        let ms: f64 = std::env::var("HEARTH_EMU_LINK_DELAY_MS").ok()?.parse().ok()?;
        (ms > 0.0 && ms.is_finite()).then(|| Duration::from_secs_f64(ms / 1e3))
    })
}

/// Remember the first failure; refuse every later call.
#[derive(Debug, Default)]
struct Health(Option<(Option<usize>, String)>);

impl Health {
    fn check(&self) -> Result<(), CommError> {
        match &self.0 {
            None => Ok(()),
            Some((failed, reason)) => Err(CommError::Broken { failed: *failed, reason: reason.clone() }),
        }
    }
    fn fail(&mut self, e: &CommError) {
        self.0 = Some((e.failed_node(), e.to_string()));
    }
}

enum StarRole {
    Master { workers: Vec<Peer> },
    Worker { master: Peer },
}

/// Star allreduce (TPI-LLM's): workers → master (node 0) → workers.
pub struct Star {
    node: usize,
    n_nodes: usize,
    wire: WireType,
    role: StarRole,
    seq: u64,
    health: Health,
}

impl Star {
    /// The master (node 0) of a group of `workers.len() + 1` nodes; the workers must be
    /// nodes `1..=workers.len()`, in any order.
    pub fn master(mut workers: Vec<Peer>, wire: WireType) -> Result<Self, CommError> {
        workers.sort_by_key(|p| p.node);
        for (i, p) in workers.iter().enumerate() {
            if p.node != i + 1 {
                return Err(CommError::Setup(format!("star master needs workers numbered 1..={}, found node {}", workers.len(), p.node)));
            }
        }
        let n_nodes = workers.len() + 1;
        Ok(Self { node: 0, n_nodes, wire, role: StarRole::Master { workers }, seq: 0, health: Health::default() })
    }

    /// Worker `node` (1 ≤ node < n_nodes) connected to the master (a peer of node 0).
    pub fn worker(node: usize, n_nodes: usize, master: Peer, wire: WireType) -> Result<Self, CommError> {
        if node == 0 || node >= n_nodes || master.node != 0 {
            return Err(CommError::Setup(format!(
                "star worker must be node 1..{n_nodes} talking to node 0; got node {node} talking to node {}",
                master.node
            )));
        }
        Ok(Self { node, n_nodes, wire, role: StarRole::Worker { master }, seq: 0, health: Health::default() })
    }

    /// The wire type of the partial sums.
    pub fn wire(&self) -> WireType {
        self.wire
    }

    /// The connections (the master's workers, or a worker's master), for control
    /// messages between allreduces.
    pub fn peers_mut(&mut self) -> &mut [Peer] {
        match &mut self.role {
            StarRole::Master { workers } => workers,
            StarRole::Worker { master } => std::slice::from_mut(master),
        }
    }

    /// The connections back.
    pub fn into_peers(self) -> Vec<Peer> {
        match self.role {
            StarRole::Master { workers } => workers,
            StarRole::Worker { master } => vec![master],
        }
    }

    fn run(&mut self, buf: &mut [f32], st: &mut CommStats) -> Result<(), CommError> {
        let (seq, wire) = (self.seq, self.wire);
        let all = 0..buf.len();
        match &mut self.role {
            StarRole::Master { workers } => {
                // Gather and add in node order: ((x0 + x1) + x2) + ...
                for i in 0..workers.len() {
                    let r = workers[i].recv().and_then(|(m, nb)| {
                        st.bytes_received += nb as u64;
                        workers[i].expect_partial(m, seq, 0, &all, wire)
                    });
                    let added = r.and_then(|p| {
                        p.add_into(buf).map_err(|source| CommError::Wire { node: workers[i].node, addr: workers[i].addr.clone(), source })
                    });
                    if let Err(e) = added {
                        // Tell every worker who failed (the culprit too, if it still
                        // listens: e.g. a length or wire-type mismatch), then give up.
                        let failed = e.failed_node();
                        let text = e.report_text();
                        for w in workers.iter_mut() {
                            w.report(failed, &text);
                        }
                        return Err(e);
                    }
                }
                let sum = Message::Partial(Partial::encode(seq, 1, 0, wire, buf));
                if let (WireType::Q8_0, Message::Partial(p)) = (wire, &sum) {
                    // The master keeps exactly what the workers will decode.
                    let _ = p.decode_into(buf);
                }
                let mut first_err = None;
                for w in workers.iter_mut() {
                    match w.send(&sum) {
                        Ok(nb) => st.bytes_sent += nb as u64,
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if let Some(e) = first_err {
                    let failed = e.failed_node();
                    let text = e.report_text();
                    for w in workers.iter_mut().filter(|w| Some(w.node) != failed) {
                        w.report(failed, &text);
                    }
                    return Err(e);
                }
                Ok(())
            }
            StarRole::Worker { master } => {
                let up = Message::Partial(Partial::encode(seq, 0, 0, wire, buf));
                st.bytes_sent += master.send(&up)? as u64;
                // The master may need a whole timeout to notice a silent worker.
                let wait = master.timeout * 2;
                let (m, nb) = master.recv_within(wait)?;
                st.bytes_received += nb as u64;
                let p = master.expect_partial(m, seq, 1, &all, wire)?;
                p.decode_into(buf).map_err(|source| CommError::Wire { node: 0, addr: master.addr.clone(), source })
            }
        }
    }
}

impl AllReduce for Star {
    fn allreduce(&mut self, buf: &mut [f32]) -> Result<CommStats, CommError> {
        self.health.check()?;
        let t = Instant::now();
        let mut st = CommStats::default();
        let r = self.run(buf, &mut st);
        self.seq += 1;
        st.seconds = t.elapsed().as_secs_f64();
        match r {
            Ok(()) => Ok(st),
            Err(e) => {
                self.health.fail(&e);
                Err(e)
            }
        }
    }
    fn node(&self) -> usize {
        self.node
    }
    fn n_nodes(&self) -> usize {
        self.n_nodes
    }
}

/// The `n` chunks a ring splits `len` elements into: contiguous, in order, whole Q8_0
/// blocks except the last non-empty one, as even as blocks allow (some may be empty).
pub fn ring_chunks(len: usize, n: usize) -> Vec<Range<usize>> {
    let n = n.max(1);
    let blocks = len.div_ceil(Q8_0_BLOCK);
    let mut out = Vec::with_capacity(n);
    let mut b0 = 0;
    for i in 0..n {
        let b1 = b0 + blocks / n + usize::from(i < blocks % n);
        out.push((b0 * Q8_0_BLOCK).min(len)..(b1 * Q8_0_BLOCK).min(len));
        b0 = b1;
    }
    out
}

/// Ring allreduce: reduce-scatter then all-gather over `next` and `prev` links.
pub struct Ring {
    node: usize,
    n_nodes: usize,
    wire: WireType,
    links: Option<(Peer, Peer)>,
    seq: u64,
    health: Health,
}

impl Ring {
    /// Node `node` of an `n_nodes`-ring (≥ 2): `next` is a connection to node
    /// `(node + 1) % n_nodes`, `prev` one to node `(node − 1) % n_nodes` (two
    /// different connections, even when `n_nodes` is 2).
    pub fn new(node: usize, n_nodes: usize, next: Peer, prev: Peer, wire: WireType) -> Result<Self, CommError> {
        if n_nodes < 2 || node >= n_nodes {
            return Err(CommError::Setup(format!("ring node {node} of {n_nodes}: need 2 or more nodes")));
        }
        let (want_next, want_prev) = ((node + 1) % n_nodes, (node + n_nodes - 1) % n_nodes);
        if next.node != want_next || prev.node != want_prev {
            return Err(CommError::Setup(format!(
                "ring node {node}: next must be node {want_next} and prev node {want_prev}, got {} and {}",
                next.node, prev.node
            )));
        }
        Ok(Self { node, n_nodes, wire, links: Some((next, prev)), seq: 0, health: Health::default() })
    }

    /// A ring of one node (no links; the allreduce does nothing).
    pub fn single(wire: WireType) -> Self {
        Self { node: 0, n_nodes: 1, wire, links: None, seq: 0, health: Health::default() }
    }

    /// The connections `(next, prev)`, if any.
    pub fn links_mut(&mut self) -> Option<(&mut Peer, &mut Peer)> {
        self.links.as_mut().map(|(a, b)| (a, b))
    }

    fn run(&mut self, buf: &mut [f32], st: &mut CommStats) -> Result<(), CommError> {
        let Some((next, prev)) = self.links.as_mut() else { return Ok(()) };
        let (n, i, seq, wire) = (self.n_nodes, self.node, self.seq, self.wire);
        let chunks = ring_chunks(buf.len(), n);
        // Reduce-scatter: at step s send chunk (i − s), receive chunk (i − s − 1) and add.
        for s in 0..n - 1 {
            let send = &chunks[(i + n - s) % n];
            let recv = &chunks[(i + 2 * n - s - 1) % n];
            let out = Message::Partial(Partial::encode(seq, s as u32, send.start, wire, &buf[send.clone()]));
            let p = exchange(next, prev, &out, seq, s as u32, recv, wire, st)?;
            p.add_into(&mut buf[recv.clone()]).map_err(|source| wire_err(prev, source))?;
        }
        // Node i now holds the full sum of chunk (i + 1). All-gather: at step s send
        // chunk (i + 1 − s) (first our own, then what we just received, verbatim),
        // receive chunk (i − s).
        let own = &chunks[(i + 1) % n];
        let mut fwd = Partial::encode(seq, (n - 1) as u32, own.start, wire, &buf[own.clone()]);
        if wire == WireType::Q8_0 {
            // Keep exactly what the others will decode.
            let _ = fwd.decode_into(&mut buf[own.clone()]);
        }
        for s in 0..n - 1 {
            let step = (n - 1 + s) as u32;
            fwd.step = step;
            let recv = &chunks[(i + n - s) % n];
            let p = exchange(next, prev, &Message::Partial(fwd), seq, step, recv, wire, st)?;
            p.decode_into(&mut buf[recv.clone()]).map_err(|source| wire_err(prev, source))?;
            fwd = p;
        }
        Ok(())
    }
}

fn wire_err(p: &Peer, source: WireError) -> CommError {
    CommError::Wire { node: p.node, addr: p.addr.clone(), source }
}

/// One ring step: send `out` to `next` while receiving the expected piece from `prev`.
#[allow(clippy::too_many_arguments)]
fn exchange(
    next: &mut Peer,
    prev: &mut Peer,
    out: &Message,
    seq: u64,
    step: u32,
    recv: &Range<usize>,
    wire: WireType,
    st: &mut CommStats,
) -> Result<Partial, CommError> {
    let big = matches!(out, Message::Partial(p) if p.data.len() > INLINE_SEND);
    let (sent, got) = if big {
        // A handle to unblock the sender if the receive fails (the successor may never
        // read this frame).
        let next_handle = next.stream.try_clone().ok();
        std::thread::scope(|s| {
            let h = s.spawn(|| next.send(out));
            let got = prev.recv();
            if got.is_err() {
                if let Some(n) = &next_handle {
                    let _ = n.shutdown(std::net::Shutdown::Both);
                }
            }
            let sent = h.join().unwrap_or_else(|_| Err(CommError::Setup("ring sender thread panicked".into())));
            (sent, got)
        })
    } else {
        let sent = next.send(out);
        // Even if the successor is gone, listen to the predecessor: news of the real
        // culprit may be on its way round the ring (the successor may have closed
        // because it learned of a failure). Wait less long for it then.
        let got = match sent {
            Ok(_) => prev.recv(),
            Err(_) => prev.recv_within(prev.timeout.min(SEND_FAIL_GRACE)),
        };
        (sent, got)
    };
    // Prefer what the predecessor told us (it may name the real culprit) over our own
    // send failure.
    let got = got.and_then(|(m, nb)| {
        st.bytes_received += nb as u64;
        prev.expect_partial(m, seq, step, recv, wire)
    });
    match (sent, got) {
        (Ok(nb), Ok(p)) => {
            st.bytes_sent += nb as u64;
            Ok(p)
        }
        (_, Err(e @ CommError::Remote { .. })) => Err(e),
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e),
    }
}

impl AllReduce for Ring {
    fn allreduce(&mut self, buf: &mut [f32]) -> Result<CommStats, CommError> {
        self.health.check()?;
        let t = Instant::now();
        let mut st = CommStats::default();
        let r = self.run(buf, &mut st);
        self.seq += 1;
        st.seconds = t.elapsed().as_secs_f64();
        match r {
            Ok(()) => Ok(st),
            Err(e) => {
                // Pass the news along the ring (unless the successor is the culprit)
                // and close that link. The link from the predecessor stays open: were
                // it closed, the predecessor would blame us instead of reading the
                // news that is travelling towards it around the ring.
                if let Some((next, _prev)) = self.links.as_mut() {
                    if e.failed_node() != Some(next.node) {
                        next.report(e.failed_node(), &e.report_text());
                    }
                    let _ = next.stream.shutdown(std::net::Shutdown::Both);
                }
                self.health.fail(&e);
                Err(e)
            }
        }
    }
    fn node(&self) -> usize {
        self.node
    }
    fn n_nodes(&self) -> usize {
        self.n_nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_and_align() {
        for len in [0, 1, 31, 32, 33, 100, 576, 4096, 4097] {
            for n in 1..=7 {
                let c = ring_chunks(len, n);
                assert_eq!(c.len(), n);
                let mut at = 0;
                for r in &c {
                    assert_eq!(r.start, at);
                    assert!(r.start % 32 == 0 || r.start == len);
                    at = r.end;
                }
                assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn local_is_identity() {
        let mut b = vec![1.0, 2.0];
        let st = Local.allreduce(&mut b).unwrap();
        assert_eq!(b, vec![1.0, 2.0]);
        assert_eq!(st, CommStats::default());
        assert_eq!((Local.node(), Local.n_nodes()), (0, 1));
    }

    #[test]
    fn stats_add() {
        let a = CommStats { bytes_sent: 1, bytes_received: 2, seconds: 0.5 };
        let b = a + a;
        assert_eq!(b, CommStats { bytes_sent: 2, bytes_received: 4, seconds: 1.0 });
    }
}
