//! The wire protocol: length-prefixed binary frames over a byte stream.
//!
//! A frame is
//!
//! ```text
//! u32 len (little endian) | u8 type | payload (len - 1 bytes)
//! ```
//!
//! `len` counts the type byte and the payload, so it is at least 1 and at most the
//! reader's maximum ([`DEFAULT_MAX_FRAME`] unless configured); a larger `len` is refused
//! before any allocation. Every integer is little endian; `usize` quantities travel as
//! `u64`. Payloads, by type:
//!
//! | type | message | payload |
//! |---|---|---|
//! | 1 | [`Message::Hello`] | magic `HRTH`, u32 version, 32-byte model SHA-256, u8 wire type, shard (see [`Hello`]) |
//! | 2 | [`Message::HelloAck`] | u32 version, 32-byte model SHA-256, u64 node |
//! | 3 | [`Message::AuthChallenge`] | 32-byte nonce |
//! | 4 | [`Message::AuthResponse`] | 32-byte nonce, 32-byte HMAC-SHA256 |
//! | 5 | [`Message::AuthProof`] | 32-byte HMAC-SHA256 |
//! | 6 | [`Message::Partial`] | u64 seq, u32 step, u64 offset, u64 n, u8 wire type, data (see [`Partial`]) |
//! | 7 | [`Message::Error`] | u8 has-node, u64 failed node, UTF-8 message (rest of the frame) |
//! | 8 | [`Message::Shutdown`] | empty |
//! | 9 | [`Message::Session`] | u64 n_ctx, u64 n_batch, u8 KV cache type (0 f32, 1 f16, 2 q8_0), u8 schedule (0 sum, 1 gather), u64 × 2 gathered rows, u64 f32 attention threshold |
//! | 10 | [`Message::Ready`] | u64 KV-cache bytes, u64 weight bytes of the worker's shard |
//! | 11 | [`Message::Step`] | u64 first position, u64 element count, f32 × count (`[n_tokens, n_embd]` input embeddings) |
//! | 12 | [`Message::NeedShard`] | empty |
//! | 13 | [`Message::ShardData`] | bytes of the shard file (the rest of the frame) |
//! | 14 | [`Message::ShardEnd`] | u64 total bytes, 32-byte SHA-256 of the shard file |
//! | 15 | [`Message::StatsRequest`] | empty |
//! | 16 | [`Message::Stats`] | u64 passes, f64 busy seconds, f64 seconds in allreduces, u64 bytes sent, u64 bytes received, f64 seconds waiting for disk |
//! | 17 | [`Message::ProfileRequest`] | empty |
//! | 18 | [`Message::Profile`] | UTF-8 JSON of the worker's profile and budget (the rest of the frame) |
//! | 19 | [`Message::RingSession`] | u64 n_ctx, u64 n_batch, u8 KV cache type, u8 listen, 32-byte link token, u64 f32 attention threshold, u64 rounds, u64 × 2 per round (first, end layer) |
//! | 20 | [`Message::RingReady`] | u64 KV-cache bytes, u64 weight bytes, u16 link port (0: none) |
//! | 21 | [`Message::Link`] | 32-byte link token, u32 byte length of the next device's address, that address (UTF-8; empty: back to the coordinator), the previous device's address as the coordinator knows it (UTF-8, the rest; empty: the coordinator) |
//! | 22 | [`Message::LinkHello`] | 32-byte link token, u64 node of the sender |
//! | 23 | [`Message::Linked`] | empty |
//! | 24 | [`Message::Hop`] | u64 first position, u32 round, u64 element count, f32 × count (`[n_tokens, n_embd]` activations) |
//! | 25 | [`Message::Ping`] | any bytes (the rest of the frame) |
//! | 26 | [`Message::Pong`] | u64 bytes of the ping answered |
//!
//! Decoding never panics: a wrong length, an unknown type or a truncated payload is a
//! [`WireError`], and the connection it came on should be closed.

use crate::shard::{ModelDims, NodeShard};
use hearth_quant::{dequantize_row, quantize_row, GgmlType};
use std::io::{self, Read, Write};
use thiserror::Error;

/// Version of this protocol; a peer with another version is refused at handshake.
pub const PROTOCOL_VERSION: u32 = 4;

/// Bytes before the payload: u32 length + u8 type.
pub const HEADER_BYTES: usize = 5;

/// Default largest frame accepted (`len` field), 64 MiB: a prefill batch of 512 tokens
/// of an 8192-wide model in f32 is 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;

/// The first bytes of a [`Hello`] payload, so that something that is not hearth fails
/// the handshake clearly.
pub const HELLO_MAGIC: [u8; 4] = *b"HRTH";

/// Elements per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per Q8_0 block (f16 scale + 32 × i8).
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Why a frame could not be read or decoded.
#[derive(Debug, Error)]
pub enum WireError {
    /// The stream failed (including read/write timeouts: kind `WouldBlock`/`TimedOut`).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed by peer mid-frame ({got} of {need} bytes)")]
    ClosedMidFrame {
        /// Bytes of the frame (header included) received.
        got: usize,
        /// Bytes the frame needed.
        need: usize,
    },
    /// The length field exceeds the maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The frame's length field.
        len: usize,
        /// The maximum accepted.
        max: usize,
    },
    /// The length field is 0 (no type byte).
    #[error("empty frame (length 0, no message type)")]
    Empty,
    /// The type byte names no message.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A payload or buffer is shorter than its content needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A payload has bytes after its content.
    #[error("{what}: {extra} unexpected trailing bytes")]
    Trailing {
        /// The message.
        what: &'static str,
        /// How many bytes were left.
        extra: usize,
    },
    /// A field holds a value that cannot be.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// Why.
        why: String,
    },
}

/// How partial sums travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WireType {
    /// 4 bytes per element, exact.
    #[default]
    F32,
    /// Q8_0 blocks: 34 bytes per 32 elements (f16 scale + 32 × i8), ≈ 1/127 of each
    /// block's largest magnitude in error. A short last block is zero-padded.
    Q8_0,
}

impl WireType {
    /// The byte that names it on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            WireType::F32 => 0,
            WireType::Q8_0 => 1,
        }
    }

    /// The type a wire byte names.
    pub fn from_u8(b: u8) -> Result<Self, WireError> {
        match b {
            0 => Ok(WireType::F32),
            1 => Ok(WireType::Q8_0),
            _ => Err(WireError::Invalid { what: "wire type", why: format!("unknown value {b}") }),
        }
    }

    /// Bytes of `n` elements.
    pub fn data_bytes(self, n: usize) -> usize {
        match self {
            WireType::F32 => n * 4,
            WireType::Q8_0 => n.div_ceil(Q8_0_BLOCK) * Q8_0_BLOCK_BYTES,
        }
    }

    /// Its name, as `--wire-type` spells it.
    pub fn name(self) -> &'static str {
        match self {
            WireType::F32 => "f32",
            WireType::Q8_0 => "q8_0",
        }
    }
}

impl std::str::FromStr for WireType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(WireType::F32),
            "q8_0" | "q8" => Ok(WireType::Q8_0),
            _ => Err(format!("unknown wire type {s:?} (expected f32 or q8_0)")),
        }
    }
}

impl std::fmt::Display for WireType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The coordinator's opening message to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u32,
    /// SHA-256 of the GGUF file the cluster runs.
    pub model_sha256: [u8; 32],
    /// How partial sums travel.
    pub wire: WireType,
    /// The worker's assignment: its node index, the node count, the model dimensions
    /// and its KV-head and FFN-row ranges. Payload layout after the wire type: u64 ×
    /// (node, n_nodes, n_head, n_head_kv, head_dim, n_embd, n_ff, block, kv start, kv
    /// end, ffn start, ffn end).
    pub shard: NodeShard,
}

/// Why a [`Hello`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HelloMismatch {
    /// Different protocol versions.
    #[error("protocol version mismatch: peer speaks version {theirs}, this build speaks {ours}")]
    Version {
        /// Ours.
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// Different model files.
    #[error(
        "model mismatch: the coordinator runs the model with SHA-256 {coordinator}, the worker has {worker}: \
         start every node with the same GGUF file (for tensor parallelism, a worker started with --model-sha256 {coordinator} \
         receives its share instead)"
    )]
    Model {
        /// The coordinator's model hash, hex.
        coordinator: String,
        /// The worker's, hex.
        worker: String,
    },
}

/// Lower-case hex of bytes (for hashes in messages).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a peer's version and model hash against ours (`we_are_worker`: which end we are).
pub fn check_peer(version: u32, model_sha256: &[u8; 32], our_sha256: &[u8; 32], we_are_worker: bool) -> Result<(), HelloMismatch> {
    if version != PROTOCOL_VERSION {
        return Err(HelloMismatch::Version { ours: PROTOCOL_VERSION, theirs: version });
    }
    if model_sha256 != our_sha256 {
        let (ours, theirs) = (hex(our_sha256), hex(model_sha256));
        let (coordinator, worker) = if we_are_worker { (theirs, ours) } else { (ours, theirs) };
        return Err(HelloMismatch::Model { coordinator, worker });
    }
    Ok(())
}

/// The worker's acceptance of a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAck {
    /// The worker's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// SHA-256 of the worker's model file.
    pub model_sha256: [u8; 32],
    /// The node index the worker accepted.
    pub node: u64,
}

/// A piece of an allreduce: `n` elements of the buffer starting at `offset`, as
/// `wire`-encoded bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    /// Allreduce sequence number (one per call, the same on every node).
    pub seq: u64,
    /// Step within the allreduce (star: 0 up, 1 down; ring: 0..2(N−1)).
    pub step: u32,
    /// First element of the buffer this piece covers.
    pub offset: u64,
    /// Elements.
    pub n: u64,
    /// Encoding of `data`.
    pub wire: WireType,
    /// `wire.data_bytes(n)` bytes: little-endian f32s or Q8_0 blocks.
    pub data: Vec<u8>,
}

impl Partial {
    /// Encode `values` (the elements `offset..offset + values.len()` of the buffer).
    pub fn encode(seq: u64, step: u32, offset: usize, wire: WireType, values: &[f32]) -> Self {
        let mut data = vec![0u8; wire.data_bytes(values.len())];
        match wire {
            WireType::F32 => {
                for (o, v) in data.chunks_exact_mut(4).zip(values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            WireType::Q8_0 => {
                for (o, x) in data.chunks_exact_mut(Q8_0_BLOCK_BYTES).zip(values.chunks(Q8_0_BLOCK)) {
                    let mut block = [0f32; Q8_0_BLOCK];
                    block[..x.len()].copy_from_slice(x);
                    // Cannot fail: 32 elements into 34 bytes.
                    let _ = quantize_row(GgmlType::Q8_0, &block, o);
                }
            }
        }
        Self { seq, step, offset: offset as u64, n: values.len() as u64, wire, data }
    }

    fn check_dst(&self, dst: &[f32]) -> Result<(), WireError> {
        if dst.len() as u64 != self.n {
            return Err(WireError::Invalid { what: "partial", why: format!("{} elements for a destination of {}", self.n, dst.len()) });
        }
        if self.data.len() != self.wire.data_bytes(dst.len()) {
            return Err(WireError::Truncated { what: "partial data", need: self.wire.data_bytes(dst.len()), have: self.data.len() });
        }
        Ok(())
    }

    fn for_each(&self, dst: &mut [f32], f: impl Fn(&mut f32, f32)) -> Result<(), WireError> {
        self.check_dst(dst)?;
        match self.wire {
            WireType::F32 => {
                for (d, b) in dst.iter_mut().zip(self.data.chunks_exact(4)) {
                    f(d, f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            WireType::Q8_0 => {
                let mut block = [0f32; Q8_0_BLOCK];
                for (d, b) in dst.chunks_mut(Q8_0_BLOCK).zip(self.data.chunks_exact(Q8_0_BLOCK_BYTES)) {
                    // Cannot fail: 34 bytes into 32 elements.
                    let _ = dequantize_row(GgmlType::Q8_0, b, &mut block);
                    for (d, &v) in d.iter_mut().zip(&block) {
                        f(d, v);
                    }
                }
            }
        }
        Ok(())
    }

    /// Decode into `dst` (exactly `n` elements).
    pub fn decode_into(&self, dst: &mut [f32]) -> Result<(), WireError> {
        self.for_each(dst, |d, v| *d = v)
    }

    /// Add the decoded values into `dst` (exactly `n` elements), element by element.
    pub fn add_into(&self, dst: &mut [f32]) -> Result<(), WireError> {
        self.for_each(dst, |d, v| *d += v)
    }
}

/// An error report from a peer; the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMsg {
    /// The node that failed, when the error is about one (e.g. the master telling the
    /// other workers that node 2 disconnected).
    pub failed_node: Option<u64>,
    /// Human-readable reason.
    pub message: String,
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Coordinator → worker: version, model hash, assignment.
    Hello(Hello),
    /// Worker → coordinator: accepted.
    HelloAck(HelloAck),
    /// Initiator → responder: a fresh 32-byte nonce to prove the key on.
    AuthChallenge {
        /// The initiator's nonce.
        nonce: [u8; 32],
    },
    /// Responder → initiator: its own nonce and its proof over both.
    AuthResponse {
        /// The responder's nonce.
        nonce: [u8; 32],
        /// HMAC-SHA256 proving the key (see [`crate::auth`]).
        mac: [u8; 32],
    },
    /// Initiator → responder: the initiator's proof over both nonces.
    AuthProof {
        /// HMAC-SHA256 proving the key.
        mac: [u8; 32],
    },
    /// A piece of an allreduce.
    Partial(Partial),
    /// A failure report.
    Error(ErrorMsg),
    /// Orderly end of the session.
    Shutdown,
    /// Coordinator → worker after the handshake: the inference session's shape.
    Session(Session),
    /// Worker → coordinator: the session's buffers are allocated.
    Ready {
        /// Bytes of the worker's KV cache (its KV heads only).
        kv_bytes: u64,
        /// Bytes of the weight rows and columns the worker computes with.
        weight_bytes: u64,
    },
    /// Coordinator → worker: one forward pass.
    Step {
        /// Position of the first token; the worker forgets cached positions from here on.
        pos0: u64,
        /// Input embeddings `[n_tokens, n_embd]`, row-major.
        x: Vec<f32>,
    },
    /// Worker → coordinator instead of `Ready`: it has no copy of its shard; send it.
    NeedShard,
    /// Coordinator → worker: the next bytes of the worker's shard file.
    ShardData(Vec<u8>),
    /// Coordinator → worker: the shard file is complete.
    ShardEnd {
        /// Bytes sent.
        total: u64,
        /// SHA-256 of those bytes.
        sha256: [u8; 32],
    },
    /// Coordinator → worker between passes: report your counters.
    StatsRequest,
    /// Worker → coordinator: its counters since the session opened.
    Stats(NodeStats),
    /// Coordinator → worker after the handshake: report your device profile.
    ProfileRequest,
    /// Worker → coordinator: its profile and memory budget, JSON
    /// (`hearth_parallel::ring::WorkerProfile`).
    Profile(Vec<u8>),
    /// Coordinator → worker after the handshake: a pipelined-ring session.
    RingSession(RingSession),
    /// Worker → coordinator: the ring session's buffers are allocated.
    RingReady {
        /// Bytes of the worker's KV cache (its layers only).
        kv_bytes: u64,
        /// Weight bytes of its layers.
        weight_bytes: u64,
        /// Port on which it waits for its predecessor's link (0: its predecessor is the
        /// coordinator).
        link_port: u16,
    },
    /// Coordinator → worker: where to send activations after each of its windows.
    Link {
        /// The session's link token (the next device checks it).
        token: [u8; 32],
        /// `HOST:PORT` of the next device, `None`: back to the coordinator.
        next: Option<String>,
        /// The address the coordinator knows the previous device by (`None`: the
        /// coordinator): the name the worker gives its incoming link in error reports,
        /// since that connection comes from an ephemeral port.
        prev: Option<String>,
    },
    /// Worker → next worker, first message of a link.
    LinkHello {
        /// The session's link token.
        token: [u8; 32],
        /// The sender's node index.
        node: u64,
    },
    /// Worker → coordinator: its links are up.
    Linked,
    /// Activations travelling the ring.
    Hop {
        /// Position of the first token.
        pos0: u64,
        /// Round of the pass the activations are in (the window they go through next).
        round: u32,
        /// Activations `[n_tokens, n_embd]`, row-major.
        x: Vec<f32>,
    },
    /// Coordinator → worker before a session: answer with [`Message::Pong`] (link
    /// round trip and throughput measurements).
    Ping(Vec<u8>),
    /// Worker → coordinator: a ping of this many bytes arrived.
    Pong(u64),
}

/// A pipelined-ring session, sent once after the handshake instead of [`Session`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSession {
    /// Context size (KV cache positions).
    pub n_ctx: u64,
    /// Most tokens per forward pass.
    pub n_batch: u64,
    /// KV cache type: 0 f32, 1 f16, 2 q8_0.
    pub cache_type: u8,
    /// Whether the worker's predecessor is another worker (which will connect to it).
    pub listen: bool,
    /// A secret random token for this session's links.
    pub token: [u8; 32],
    /// The coordinator's f32 attention threshold ([`Session::f32_attn_from`]).
    pub f32_attn_from: u64,
    /// The worker's window in each round: layers `start..end`.
    pub rounds: Vec<std::ops::Range<u64>>,
}

/// A worker's counters since its session opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeStats {
    /// Forward passes run.
    pub passes: u64,
    /// Seconds inside forward passes (computing and in allreduces).
    pub busy_secs: f64,
    /// Of those, seconds inside allreduces (transfers and waiting for other nodes).
    pub comm_secs: f64,
    /// Bytes the worker sent.
    pub bytes_sent: u64,
    /// Bytes it received.
    pub bytes_received: u64,
    /// Of `busy_secs`, seconds waiting for weights to come from disk (a memory budget's
    /// sliding window).
    pub io_wait_secs: f64,
}

impl NodeStats {
    /// The counts since `earlier`.
    pub fn since(&self, earlier: &NodeStats) -> NodeStats {
        NodeStats {
            passes: self.passes - earlier.passes,
            busy_secs: self.busy_secs - earlier.busy_secs,
            comm_secs: self.comm_secs - earlier.comm_secs,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
            io_wait_secs: self.io_wait_secs - earlier.io_wait_secs,
        }
    }
}

/// The shape of an inference session, sent once after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Context size (KV cache positions).
    pub n_ctx: u64,
    /// Most tokens per forward pass.
    pub n_batch: u64,
    /// KV cache type: 0 f32, 1 f16, 2 q8_0 (every node must use the coordinator's, for
    /// identical results).
    pub cache_type: u8,
    /// The gather schedule's output rows for this worker (`hearth_model::TensorSplit::gather_rows`);
    /// `None`: partial sums.
    pub gather_rows: Option<std::ops::Range<u64>>,
    /// A sequence feeding at least this many tokens in a pass takes the f32 attention
    /// path (`hearth_model::Context::set_f32_attention_from`): every node must decide as
    /// the coordinator does, or its heads' results differ from one node's.
    pub f32_attn_from: u64,
}

const T_HELLO: u8 = 1;
const T_HELLO_ACK: u8 = 2;
const T_AUTH_CHALLENGE: u8 = 3;
const T_AUTH_RESPONSE: u8 = 4;
const T_AUTH_PROOF: u8 = 5;
const T_PARTIAL: u8 = 6;
const T_ERROR: u8 = 7;
const T_SHUTDOWN: u8 = 8;
const T_SESSION: u8 = 9;
const T_READY: u8 = 10;
const T_STEP: u8 = 11;
const T_NEED_SHARD: u8 = 12;
const T_SHARD_DATA: u8 = 13;
const T_SHARD_END: u8 = 14;
const T_STATS_REQUEST: u8 = 15;
const T_STATS: u8 = 16;
const T_PROFILE_REQUEST: u8 = 17;
const T_PROFILE: u8 = 18;
const T_RING_SESSION: u8 = 19;
const T_RING_READY: u8 = 20;
const T_LINK: u8 = 21;
const T_LINK_HELLO: u8 = 22;
const T_LINKED: u8 = 23;
const T_HOP: u8 = 24;
const T_PING: u8 = 25;
const T_PONG: u8 = 26;

/// Reads fields from a payload, each read checked.
struct Fields<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Fields<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated { what: self.what, need: n, have: self.buf.len() });
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn usize(&mut self, what: &'static str) -> Result<usize, WireError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| WireError::Invalid { what, why: format!("{v} does not fit this machine") })
    }
    /// A u64 count, then that many f32s.
    fn f32s(&mut self) -> Result<Vec<f32>, WireError> {
        let n = self.u64()?;
        let n_us = usize::try_from(n)
            .ok()
            .filter(|&n| n <= usize::MAX / 4)
            .ok_or_else(|| WireError::Invalid { what: self.what, why: format!("element count {n}") })?;
        let data = self.bytes(4 * n_us)?;
        Ok(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    fn finish(self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing { what: self.what, extra: self.buf.len() })
        }
    }
}

fn put_u64(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u64).to_le_bytes());
}

/// u64 count, then the values.
fn put_f32s(out: &mut Vec<u8>, x: &[f32]) {
    put_u64(out, x.len());
    out.reserve(4 * x.len());
    for v in x {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

impl Message {
    /// The frame type byte.
    pub fn type_byte(&self) -> u8 {
        match self {
            Message::Hello(_) => T_HELLO,
            Message::HelloAck(_) => T_HELLO_ACK,
            Message::AuthChallenge { .. } => T_AUTH_CHALLENGE,
            Message::AuthResponse { .. } => T_AUTH_RESPONSE,
            Message::AuthProof { .. } => T_AUTH_PROOF,
            Message::Partial(_) => T_PARTIAL,
            Message::Error(_) => T_ERROR,
            Message::Shutdown => T_SHUTDOWN,
            Message::Session(_) => T_SESSION,
            Message::Ready { .. } => T_READY,
            Message::Step { .. } => T_STEP,
            Message::NeedShard => T_NEED_SHARD,
            Message::ShardData(_) => T_SHARD_DATA,
            Message::ShardEnd { .. } => T_SHARD_END,
            Message::StatsRequest => T_STATS_REQUEST,
            Message::Stats(_) => T_STATS,
            Message::ProfileRequest => T_PROFILE_REQUEST,
            Message::Profile(_) => T_PROFILE,
            Message::RingSession(_) => T_RING_SESSION,
            Message::RingReady { .. } => T_RING_READY,
            Message::Link { .. } => T_LINK,
            Message::LinkHello { .. } => T_LINK_HELLO,
            Message::Linked => T_LINKED,
            Message::Hop { .. } => T_HOP,
            Message::Ping(_) => T_PING,
            Message::Pong(_) => T_PONG,
        }
    }

    /// A short name for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::HelloAck(_) => "HelloAck",
            Message::AuthChallenge { .. } => "AuthChallenge",
            Message::AuthResponse { .. } => "AuthResponse",
            Message::AuthProof { .. } => "AuthProof",
            Message::Partial(_) => "Partial",
            Message::Error(_) => "Error",
            Message::Shutdown => "Shutdown",
            Message::Session(_) => "Session",
            Message::Ready { .. } => "Ready",
            Message::Step { .. } => "Step",
            Message::NeedShard => "NeedShard",
            Message::ShardData(_) => "ShardData",
            Message::ShardEnd { .. } => "ShardEnd",
            Message::StatsRequest => "StatsRequest",
            Message::Stats(_) => "Stats",
            Message::ProfileRequest => "ProfileRequest",
            Message::Profile(_) => "Profile",
            Message::RingSession(_) => "RingSession",
            Message::RingReady { .. } => "RingReady",
            Message::Link { .. } => "Link",
            Message::LinkHello { .. } => "LinkHello",
            Message::Linked => "Linked",
            Message::Hop { .. } => "Hop",
            Message::Ping(_) => "Ping",
            Message::Pong(_) => "Pong",
        }
    }

    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Message::Hello(h) => {
                out.extend_from_slice(&HELLO_MAGIC);
                out.extend_from_slice(&h.version.to_le_bytes());
                out.extend_from_slice(&h.model_sha256);
                out.push(h.wire.to_u8());
                let s = &h.shard;
                let d = &s.dims;
                for v in [
                    s.node,
                    s.n_nodes,
                    d.n_head,
                    d.n_head_kv,
                    d.head_dim,
                    d.n_embd,
                    d.n_ff,
                    d.block,
                    s.kv_heads.start,
                    s.kv_heads.end,
                    s.ffn_rows.start,
                    s.ffn_rows.end,
                ] {
                    put_u64(out, v);
                }
            }
            Message::HelloAck(a) => {
                out.extend_from_slice(&a.version.to_le_bytes());
                out.extend_from_slice(&a.model_sha256);
                out.extend_from_slice(&a.node.to_le_bytes());
            }
            Message::AuthChallenge { nonce } => out.extend_from_slice(nonce),
            Message::AuthResponse { nonce, mac } => {
                out.extend_from_slice(nonce);
                out.extend_from_slice(mac);
            }
            Message::AuthProof { mac } => out.extend_from_slice(mac),
            Message::Partial(p) => {
                out.extend_from_slice(&p.seq.to_le_bytes());
                out.extend_from_slice(&p.step.to_le_bytes());
                out.extend_from_slice(&p.offset.to_le_bytes());
                out.extend_from_slice(&p.n.to_le_bytes());
                out.push(p.wire.to_u8());
                out.extend_from_slice(&p.data);
            }
            Message::Error(e) => {
                out.push(e.failed_node.is_some() as u8);
                out.extend_from_slice(&e.failed_node.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(e.message.as_bytes());
            }
            Message::Shutdown => {}
            Message::Session(x) => {
                out.extend_from_slice(&x.n_ctx.to_le_bytes());
                out.extend_from_slice(&x.n_batch.to_le_bytes());
                out.push(x.cache_type);
                out.push(x.gather_rows.is_some() as u8);
                let r = x.gather_rows.clone().unwrap_or(0..0);
                out.extend_from_slice(&r.start.to_le_bytes());
                out.extend_from_slice(&r.end.to_le_bytes());
                out.extend_from_slice(&x.f32_attn_from.to_le_bytes());
            }
            Message::Ready { kv_bytes, weight_bytes } => {
                out.extend_from_slice(&kv_bytes.to_le_bytes());
                out.extend_from_slice(&weight_bytes.to_le_bytes());
            }
            Message::Step { pos0, x } => {
                out.extend_from_slice(&pos0.to_le_bytes());
                put_f32s(out, x);
            }
            Message::Hop { pos0, round, x } => {
                out.extend_from_slice(&pos0.to_le_bytes());
                out.extend_from_slice(&round.to_le_bytes());
                put_f32s(out, x);
            }
            Message::ProfileRequest | Message::Linked => {}
            Message::Profile(b) | Message::Ping(b) => out.extend_from_slice(b),
            Message::Pong(n) => out.extend_from_slice(&n.to_le_bytes()),
            Message::RingSession(r) => {
                out.extend_from_slice(&r.n_ctx.to_le_bytes());
                out.extend_from_slice(&r.n_batch.to_le_bytes());
                out.push(r.cache_type);
                out.push(r.listen as u8);
                out.extend_from_slice(&r.token);
                out.extend_from_slice(&r.f32_attn_from.to_le_bytes());
                put_u64(out, r.rounds.len());
                for w in &r.rounds {
                    out.extend_from_slice(&w.start.to_le_bytes());
                    out.extend_from_slice(&w.end.to_le_bytes());
                }
            }
            Message::RingReady { kv_bytes, weight_bytes, link_port } => {
                out.extend_from_slice(&kv_bytes.to_le_bytes());
                out.extend_from_slice(&weight_bytes.to_le_bytes());
                out.extend_from_slice(&link_port.to_le_bytes());
            }
            Message::Link { token, next, prev } => {
                out.extend_from_slice(token);
                let next = next.as_deref().unwrap_or("").as_bytes();
                out.extend_from_slice(&(next.len() as u32).to_le_bytes());
                out.extend_from_slice(next);
                out.extend_from_slice(prev.as_deref().unwrap_or("").as_bytes());
            }
            Message::LinkHello { token, node } => {
                out.extend_from_slice(token);
                out.extend_from_slice(&node.to_le_bytes());
            }
            Message::NeedShard => {}
            Message::ShardData(b) => out.extend_from_slice(b),
            Message::ShardEnd { total, sha256 } => {
                out.extend_from_slice(&total.to_le_bytes());
                out.extend_from_slice(sha256);
            }
            Message::StatsRequest => {}
            Message::Stats(n) => {
                out.extend_from_slice(&n.passes.to_le_bytes());
                out.extend_from_slice(&n.busy_secs.to_le_bytes());
                out.extend_from_slice(&n.comm_secs.to_le_bytes());
                out.extend_from_slice(&n.bytes_sent.to_le_bytes());
                out.extend_from_slice(&n.bytes_received.to_le_bytes());
                out.extend_from_slice(&n.io_wait_secs.to_le_bytes());
            }
        }
    }

    /// Append this message's whole frame (header and payload) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_BYTES]);
        self.encode_payload(out);
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4] = self.type_byte();
    }

    /// This message's whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }

    /// Decode a payload of frame type `ty`.
    pub fn decode(ty: u8, payload: &[u8]) -> Result<Message, WireError> {
        let what = match ty {
            T_HELLO => "Hello",
            T_HELLO_ACK => "HelloAck",
            T_AUTH_CHALLENGE => "AuthChallenge",
            T_AUTH_RESPONSE => "AuthResponse",
            T_AUTH_PROOF => "AuthProof",
            T_PARTIAL => "Partial",
            T_ERROR => "Error",
            T_SHUTDOWN => "Shutdown",
            T_SESSION => "Session",
            T_READY => "Ready",
            T_STEP => "Step",
            T_NEED_SHARD => "NeedShard",
            T_SHARD_DATA => "ShardData",
            T_SHARD_END => "ShardEnd",
            T_STATS_REQUEST => "StatsRequest",
            T_STATS => "Stats",
            T_PROFILE_REQUEST => "ProfileRequest",
            T_PROFILE => "Profile",
            T_RING_SESSION => "RingSession",
            T_RING_READY => "RingReady",
            T_LINK => "Link",
            T_LINK_HELLO => "LinkHello",
            T_LINKED => "Linked",
            T_HOP => "Hop",
            T_PING => "Ping",
            T_PONG => "Pong",
            _ => return Err(WireError::UnknownType(ty)),
        };
        let mut f = Fields { buf: payload, what };
        let m = match ty {
            T_HELLO => {
                let magic: [u8; 4] = f.arr()?;
                if magic != HELLO_MAGIC {
                    return Err(WireError::Invalid { what: "Hello", why: format!("bad magic {}", hex(&magic)) });
                }
                let version = f.u32()?;
                let model_sha256 = f.arr()?;
                let wire = WireType::from_u8(f.u8()?)?;
                let node = f.usize("node")?;
                let n_nodes = f.usize("n_nodes")?;
                let dims = ModelDims {
                    n_head: f.usize("n_head")?,
                    n_head_kv: f.usize("n_head_kv")?,
                    head_dim: f.usize("head_dim")?,
                    n_embd: f.usize("n_embd")?,
                    n_ff: f.usize("n_ff")?,
                    block: f.usize("block")?,
                };
                let kv_heads = f.usize("kv start")?..f.usize("kv end")?;
                let ffn_rows = f.usize("ffn start")?..f.usize("ffn end")?;
                Message::Hello(Hello { version, model_sha256, wire, shard: NodeShard { dims, node, n_nodes, kv_heads, ffn_rows } })
            }
            T_HELLO_ACK => Message::HelloAck(HelloAck { version: f.u32()?, model_sha256: f.arr()?, node: f.u64()? }),
            T_AUTH_CHALLENGE => Message::AuthChallenge { nonce: f.arr()? },
            T_AUTH_RESPONSE => Message::AuthResponse { nonce: f.arr()?, mac: f.arr()? },
            T_AUTH_PROOF => Message::AuthProof { mac: f.arr()? },
            T_PARTIAL => {
                let seq = f.u64()?;
                let step = f.u32()?;
                let offset = f.u64()?;
                let n = f.u64()?;
                let wire = WireType::from_u8(f.u8()?)?;
                let n_us = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= usize::MAX / 4)
                    .ok_or_else(|| WireError::Invalid { what: "Partial", why: format!("element count {n}") })?;
                let need = wire.data_bytes(n_us);
                let data = f.bytes(need)?.to_vec();
                Message::Partial(Partial { seq, step, offset, n, wire, data })
            }
            T_ERROR => {
                let has = f.u8()?;
                let node = f.u64()?;
                let failed_node = match has {
                    0 => None,
                    1 => Some(node),
                    _ => return Err(WireError::Invalid { what: "Error", why: format!("has-node flag {has}") }),
                };
                let message = String::from_utf8_lossy(f.rest()).into_owned();
                Message::Error(ErrorMsg { failed_node, message })
            }
            T_SESSION => {
                let (n_ctx, n_batch, cache_type) = (f.u64()?, f.u64()?, f.u8()?);
                if cache_type > 2 {
                    return Err(WireError::Invalid { what: "Session", why: format!("KV cache type {cache_type}") });
                }
                let (gather, start, end) = (f.u8()?, f.u64()?, f.u64()?);
                let gather_rows = match gather {
                    0 => None,
                    1 => Some(start..end),
                    _ => return Err(WireError::Invalid { what: "Session", why: format!("schedule {gather}") }),
                };
                Message::Session(Session { n_ctx, n_batch, cache_type, gather_rows, f32_attn_from: f.u64()? })
            }
            T_READY => Message::Ready { kv_bytes: f.u64()?, weight_bytes: f.u64()? },
            T_STEP => Message::Step { pos0: f.u64()?, x: f.f32s()? },
            T_HOP => Message::Hop { pos0: f.u64()?, round: f.u32()?, x: f.f32s()? },
            T_PROFILE_REQUEST => Message::ProfileRequest,
            T_PROFILE => Message::Profile(f.rest().to_vec()),
            T_PING => Message::Ping(f.rest().to_vec()),
            T_PONG => Message::Pong(f.u64()?),
            T_LINKED => Message::Linked,
            T_RING_SESSION => {
                let (n_ctx, n_batch, cache_type, listen) = (f.u64()?, f.u64()?, f.u8()?, f.u8()?);
                if cache_type > 2 || listen > 1 {
                    return Err(WireError::Invalid { what: "RingSession", why: format!("KV cache type {cache_type}, listen {listen}") });
                }
                let token = f.arr()?;
                let f32_attn_from = f.u64()?;
                let n = f.u64()?;
                let mut rounds = Vec::new();
                for _ in 0..n {
                    // each round is 16 bytes: a count beyond the payload fails here
                    rounds.push(f.u64()?..f.u64()?);
                }
                Message::RingSession(RingSession { n_ctx, n_batch, cache_type, listen: listen == 1, token, f32_attn_from, rounds })
            }
            T_RING_READY => Message::RingReady { kv_bytes: f.u64()?, weight_bytes: f.u64()?, link_port: u16::from_le_bytes(f.arr()?) },
            T_LINK => {
                let token = f.arr()?;
                let utf8 = |b: &[u8]| {
                    let a = std::str::from_utf8(b).map_err(|_| WireError::Invalid { what: "Link", why: "address is not UTF-8".into() })?;
                    Ok::<_, WireError>((!a.is_empty()).then(|| a.to_string()))
                };
                let n = f.u32()? as usize;
                let next = utf8(f.bytes(n)?)?;
                let prev = utf8(f.rest())?;
                Message::Link { token, next, prev }
            }
            T_LINK_HELLO => Message::LinkHello { token: f.arr()?, node: f.u64()? },
            T_NEED_SHARD => Message::NeedShard,
            T_SHARD_DATA => Message::ShardData(f.rest().to_vec()),
            T_SHARD_END => Message::ShardEnd { total: f.u64()?, sha256: f.arr()? },
            T_STATS_REQUEST => Message::StatsRequest,
            T_STATS => Message::Stats(NodeStats {
                passes: f.u64()?,
                busy_secs: f64::from_bits(f.u64()?),
                comm_secs: f64::from_bits(f.u64()?),
                bytes_sent: f.u64()?,
                bytes_received: f.u64()?,
                io_wait_secs: f64::from_bits(f.u64()?),
            }),
            _ => Message::Shutdown,
        };
        f.finish()?;
        Ok(m)
    }
}

/// Decode the first frame of `buf`: the message and the bytes it took. A `buf` shorter
/// than the frame is [`WireError::Truncated`].
pub fn decode_frame(buf: &[u8], max_frame: usize) -> Result<(Message, usize), WireError> {
    let mut f = Fields { buf, what: "frame header" };
    let len = f.u32()? as usize;
    check_len(len, max_frame)?;
    let body = Fields { buf: f.rest(), what: "frame" }.bytes(len)?;
    Ok((Message::decode(body[0], &body[1..])?, 4 + len))
}

fn check_len(len: usize, max_frame: usize) -> Result<(), WireError> {
    if len == 0 {
        return Err(WireError::Empty);
    }
    if len > max_frame {
        return Err(WireError::TooLarge { len, max: max_frame });
    }
    Ok(())
}

/// Fill `buf` from `r`; `Ok(n)` with `n < buf.len()` only at end of stream.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, WireError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(WireError::Io(e)),
        }
    }
    Ok(got)
}

/// Read one frame: the message and the frame's size in bytes (header included).
pub fn read_frame(r: &mut impl Read, max_frame: usize) -> Result<(Message, usize), WireError> {
    let mut len_bytes = [0u8; 4];
    match read_full(r, &mut len_bytes)? {
        0 => return Err(WireError::Closed),
        4 => {}
        got => return Err(WireError::ClosedMidFrame { got, need: HEADER_BYTES }),
    }
    let len = u32::from_le_bytes(len_bytes) as usize;
    check_len(len, max_frame)?;
    let mut body = vec![0u8; len];
    let got = read_full(r, &mut body)?;
    if got < len {
        return Err(WireError::ClosedMidFrame { got: 4 + got, need: 4 + len });
    }
    Ok((Message::decode(body[0], &body[1..])?, 4 + len))
}

/// Write one frame; returns its size in bytes. `scratch` is reused for the encoding.
pub fn write_frame(w: &mut impl Write, msg: &Message, scratch: &mut Vec<u8>) -> Result<usize, WireError> {
    scratch.clear();
    msg.encode_into(scratch);
    w.write_all(scratch)?;
    w.flush()?;
    Ok(scratch.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ShardPlan;
    use proptest::prelude::*;

    fn dims() -> ModelDims {
        ModelDims { n_head: 9, n_head_kv: 3, head_dim: 64, n_embd: 576, n_ff: 1536, block: 32 }
    }

    fn samples() -> Vec<Message> {
        let shard = ShardPlan::equal(dims(), 3).unwrap().nodes()[1].clone();
        vec![
            Message::Hello(Hello { version: PROTOCOL_VERSION, model_sha256: [7; 32], wire: WireType::Q8_0, shard }),
            Message::HelloAck(HelloAck { version: 1, model_sha256: [9; 32], node: 2 }),
            Message::AuthChallenge { nonce: [1; 32] },
            Message::AuthResponse { nonce: [2; 32], mac: [3; 32] },
            Message::AuthProof { mac: [4; 32] },
            Message::Partial(Partial::encode(5, 1, 64, WireType::F32, &[1.0, -2.5, 3.25])),
            Message::Partial(Partial::encode(6, 0, 0, WireType::Q8_0, &[0.5; 40])),
            Message::Error(ErrorMsg { failed_node: Some(3), message: "node 3 closed the connection".into() }),
            Message::Error(ErrorMsg { failed_node: None, message: String::new() }),
            Message::Shutdown,
            Message::Session(Session { n_ctx: 2048, n_batch: 512, cache_type: 1, gather_rows: Some(0..288), f32_attn_from: 64 }),
            Message::Ready { kv_bytes: 1 << 20, weight_bytes: 3 << 20 },
            Message::Step { pos0: 7, x: vec![0.5, -1.0, 2.0] },
            Message::NeedShard,
            Message::ShardData(vec![1, 2, 3, 4]),
            Message::ShardEnd { total: 4, sha256: [5; 32] },
            Message::StatsRequest,
            Message::Stats(NodeStats {
                passes: 3,
                busy_secs: 0.5,
                comm_secs: 0.25,
                bytes_sent: 10,
                bytes_received: 20,
                io_wait_secs: 0.125,
            }),
            Message::ProfileRequest,
            Message::Profile(b"{}".to_vec()),
            Message::RingSession(RingSession {
                n_ctx: 512,
                n_batch: 64,
                cache_type: 1,
                listen: true,
                token: [6; 32],
                f32_attn_from: 1,
                rounds: vec![2..4, 12..14],
            }),
            Message::RingReady { kv_bytes: 1 << 20, weight_bytes: 3 << 20, link_port: 4242 },
            Message::Link { token: [6; 32], next: Some("10.0.0.2:7070".into()), prev: Some("10.0.0.1:7070".into()) },
            Message::Link { token: [6; 32], next: None, prev: None },
            Message::LinkHello { token: [6; 32], node: 2 },
            Message::Linked,
            Message::Hop { pos0: 3, round: 1, x: vec![0.5, -1.0] },
            Message::Ping(vec![0; 3]),
            Message::Pong(3),
        ]
    }

    #[test]
    fn round_trip_samples() {
        for m in samples() {
            let frame = m.encode();
            let (d, used) = decode_frame(&frame, DEFAULT_MAX_FRAME).unwrap();
            assert_eq!(used, frame.len());
            assert_eq!(d, m);
            let (d2, used2) = read_frame(&mut &frame[..], DEFAULT_MAX_FRAME).unwrap();
            assert_eq!((d2, used2), (m, frame.len()));
        }
    }

    #[test]
    fn frame_sizes_match_the_crate_doc() {
        let s = samples();
        let sizes: Vec<usize> = s.iter().map(|m| m.encode().len()).collect();
        // Hello, HelloAck, AuthChallenge, AuthResponse, AuthProof, Partial (3 × f32),
        // Partial (40 as Q8_0), Error (28-byte text), Error (empty), Shutdown, Session,
        // Ready, Step (3 × f32), NeedShard, ShardData (4 bytes), ShardEnd, StatsRequest, Stats,
        // ProfileRequest, Profile (2 bytes), RingSession (2 rounds), RingReady, Link (two 13-byte
        // addresses), Link (none), LinkHello, Linked, Hop (2 × f32), Ping (3 bytes), Pong
        #[rustfmt::skip]
        let want = vec![142, 49, 37, 69, 37, 34 + 12, 34 + 68, 14 + 28, 14, 5, 47, 21, 21 + 12, 5, 5 + 4, 45, 5, 53,
                        5, 7, 71 + 32, 23, 41 + 13 + 13, 41, 45, 5, 25 + 8, 8, 13];
        assert_eq!(sizes, want);
    }

    #[test]
    fn header_layout() {
        let f = Message::Shutdown.encode();
        assert_eq!(f, vec![1, 0, 0, 0, T_SHUTDOWN]);
        let f = Message::AuthProof { mac: [0xab; 32] }.encode();
        assert_eq!(&f[..5], &[33, 0, 0, 0, T_AUTH_PROOF]);
    }

    #[test]
    fn typed_errors() {
        // unknown type
        assert!(matches!(decode_frame(&[1, 0, 0, 0, 99], 100), Err(WireError::UnknownType(99))));
        // empty frame
        assert!(matches!(decode_frame(&[0, 0, 0, 0], 100), Err(WireError::Empty)));
        // too large: refused from the header alone
        let e = decode_frame(&[0xff, 0xff, 0xff, 0x7f], 1 << 20).unwrap_err();
        assert!(matches!(e, WireError::TooLarge { len: 0x7fff_ffff, max: 1048576 }));
        assert!(e.to_string().contains("exceeds the maximum"), "{e}");
        // truncated payload: AuthProof with 10 of 32 bytes
        let mut f = vec![11, 0, 0, 0, T_AUTH_PROOF];
        f.extend_from_slice(&[0; 10]);
        assert!(matches!(decode_frame(&f, 100), Err(WireError::Truncated { what: "AuthProof", need: 32, have: 10 })));
        // trailing bytes
        let mut f = vec![2, 0, 0, 0, T_SHUTDOWN, 0];
        assert!(matches!(decode_frame(&f, 100), Err(WireError::Trailing { what: "Shutdown", extra: 1 })));
        // frame shorter than its length
        f[0] = 9;
        assert!(matches!(decode_frame(&f, 100), Err(WireError::Truncated { .. })));
        // stream closed mid-frame / between frames
        assert!(matches!(read_frame(&mut &f[..], 100), Err(WireError::ClosedMidFrame { got: 6, need: 13 })));
        assert!(matches!(read_frame(&mut &[][..], 100), Err(WireError::Closed)));
        assert!(matches!(read_frame(&mut &[3u8, 0][..], 100), Err(WireError::ClosedMidFrame { got: 2, .. })));
        // bad hello magic
        let mut h = samples()[0].encode();
        h[5] = b'X';
        assert!(matches!(decode_frame(&h, DEFAULT_MAX_FRAME), Err(WireError::Invalid { what: "Hello", .. })));
        // partial whose data is shorter than n says
        let mut p = Message::Partial(Partial::encode(1, 0, 0, WireType::F32, &[1.0, 2.0])).encode();
        p.truncate(p.len() - 4);
        let len = (p.len() - 4) as u32;
        p[..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(decode_frame(&p, 100), Err(WireError::Truncated { what: "Partial", .. })));
        // partial with a huge element count
        let mut p = Message::Partial(Partial::encode(1, 0, 0, WireType::F32, &[])).encode();
        p[5 + 20..5 + 28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_frame(&p, 100).is_err());
        // unknown wire type
        let mut p = Message::Partial(Partial::encode(1, 0, 0, WireType::F32, &[])).encode();
        p[5 + 28] = 9;
        assert!(matches!(decode_frame(&p, 100), Err(WireError::Invalid { what: "wire type", .. })));
    }

    #[test]
    fn partial_values() {
        let x: Vec<f32> = (0..70).map(|i| (i as f32 - 35.0) * 0.37).collect();
        let p = Partial::encode(0, 0, 0, WireType::F32, &x);
        let mut y = vec![0.0; 70];
        p.decode_into(&mut y).unwrap();
        assert_eq!(x, y);
        p.add_into(&mut y).unwrap();
        assert_eq!(y, x.iter().map(|v| v + v).collect::<Vec<_>>());
        let q = Partial::encode(0, 0, 0, WireType::Q8_0, &x);
        assert_eq!(q.data.len(), 3 * 34);
        q.decode_into(&mut y).unwrap();
        for (blk_x, blk_y) in x.chunks(32).zip(y.chunks(32)) {
            let amax = blk_x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in blk_x.iter().zip(blk_y) {
                assert!((a - b).abs() <= amax / 254.0 + amax / 1024.0, "{a} {b}");
            }
        }
        // wrong destination length is an error, not a panic
        assert!(q.decode_into(&mut [0.0; 3]).is_err());
    }

    #[test]
    fn hello_checks() {
        let ours = [1u8; 32];
        assert!(check_peer(PROTOCOL_VERSION, &ours, &ours, true).is_ok());
        let e = check_peer(PROTOCOL_VERSION + 1, &ours, &ours, true).unwrap_err();
        assert!(e.to_string().contains("protocol version mismatch"), "{e}");
        let e = check_peer(PROTOCOL_VERSION, &[2u8; 32], &ours, true).unwrap_err();
        assert!(e.to_string().contains("coordinator runs the model with SHA-256 0202"), "{e}");
        let e = check_peer(PROTOCOL_VERSION, &[2u8; 32], &ours, false).unwrap_err();
        assert!(e.to_string().contains("the worker has 0202"), "{e}");
    }

    #[test]
    fn wire_type_names() {
        assert_eq!("f32".parse::<WireType>().unwrap(), WireType::F32);
        assert_eq!("Q8_0".parse::<WireType>().unwrap(), WireType::Q8_0);
        assert!("q4".parse::<WireType>().is_err());
        assert_eq!(WireType::Q8_0.to_string(), "q8_0");
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let arr = || prop::array::uniform32(any::<u8>());
        prop_oneof![
            (arr(), any::<u32>(), 1usize..8, 0usize..8).prop_map(|(sha, version, n, i)| {
                let plan = ShardPlan::equal(dims(), n).unwrap();
                let shard = plan.nodes()[i % n].clone();
                Message::Hello(Hello { version, model_sha256: sha, wire: WireType::F32, shard })
            }),
            (any::<u32>(), arr(), any::<u64>())
                .prop_map(|(version, model_sha256, node)| { Message::HelloAck(HelloAck { version, model_sha256, node }) }),
            arr().prop_map(|nonce| Message::AuthChallenge { nonce }),
            (arr(), arr()).prop_map(|(nonce, mac)| Message::AuthResponse { nonce, mac }),
            arr().prop_map(|mac| Message::AuthProof { mac }),
            (any::<u64>(), any::<u32>(), 0usize..1 << 20, any::<bool>(), prop::collection::vec(-1e6f32..1e6, 0..200)).prop_map(
                |(seq, step, off, q, v)| {
                    let w = if q { WireType::Q8_0 } else { WireType::F32 };
                    Message::Partial(Partial::encode(seq, step, off, w, &v))
                }
            ),
            (prop::option::of(any::<u64>()), ".{0,40}")
                .prop_map(|(failed_node, message)| { Message::Error(ErrorMsg { failed_node, message }) }),
            Just(Message::Shutdown),
            (any::<u64>(), any::<u64>(), 0u8..3, prop::option::of((any::<u64>(), any::<u64>())), any::<u64>()).prop_map(
                |(n_ctx, n_batch, cache_type, g, f32_attn_from)| Message::Session(Session {
                    n_ctx,
                    n_batch,
                    cache_type,
                    gather_rows: g.map(|(a, b)| a..b),
                    f32_attn_from
                })
            ),
            (any::<u64>(), any::<u64>()).prop_map(|(kv_bytes, weight_bytes)| Message::Ready { kv_bytes, weight_bytes }),
            (any::<u64>(), prop::collection::vec(-1e6f32..1e6, 0..200)).prop_map(|(pos0, x)| Message::Step { pos0, x }),
            Just(Message::NeedShard),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(Message::ShardData),
            (any::<u64>(), arr()).prop_map(|(total, sha256)| Message::ShardEnd { total, sha256 }),
            Just(Message::StatsRequest),
            (any::<u64>(), 0f64..1e6, 0f64..1e6, any::<u64>(), any::<u64>(), 0f64..1e6).prop_map(
                |(passes, busy_secs, comm_secs, bytes_sent, bytes_received, io_wait_secs)| {
                    Message::Stats(NodeStats { passes, busy_secs, comm_secs, bytes_sent, bytes_received, io_wait_secs })
                }
            ),
            Just(Message::ProfileRequest),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(Message::Profile),
            (any::<u64>(), any::<u64>(), 0u8..3, any::<bool>(), arr(), any::<u64>(), prop::collection::vec((any::<u64>(), any::<u64>()), 0..6)).prop_map(
                |(n_ctx, n_batch, cache_type, listen, token, f32_attn_from, r)| Message::RingSession(RingSession {
                    n_ctx,
                    n_batch,
                    cache_type,
                    listen,
                    token,
                    f32_attn_from,
                    rounds: r.into_iter().map(|(a, b)| a..b).collect()
                })
            ),
            (any::<u64>(), any::<u64>(), any::<u16>()).prop_map(|(kv_bytes, weight_bytes, link_port)| Message::RingReady {
                kv_bytes,
                weight_bytes,
                link_port
            }),
            (arr(), prop::option::of("[a-z0-9.:]{1,30}"), prop::option::of("[a-z0-9.:]{1,30}"))
                .prop_map(|(token, next, prev)| Message::Link { token, next, prev }),
            (arr(), any::<u64>()).prop_map(|(token, node)| Message::LinkHello { token, node }),
            Just(Message::Linked),
            (any::<u64>(), any::<u32>(), prop::collection::vec(-1e6f32..1e6, 0..200)).prop_map(|(pos0, round, x)| Message::Hop {
                pos0,
                round,
                x
            }),
            prop::collection::vec(any::<u8>(), 0..300).prop_map(Message::Ping),
            any::<u64>().prop_map(Message::Pong),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn encode_decode_round_trip(m in arb_message()) {
            let frame = m.encode();
            let (d, used) = decode_frame(&frame, DEFAULT_MAX_FRAME).unwrap();
            prop_assert_eq!(used, frame.len());
            prop_assert_eq!(&d, &m);
            // every strict prefix is an error, never a panic
            for cut in [0, 1, 4, 5, frame.len() / 2, frame.len() - 1] {
                if cut < frame.len() {
                    prop_assert!(decode_frame(&frame[..cut], DEFAULT_MAX_FRAME).is_err());
                    prop_assert!(read_frame(&mut &frame[..cut], DEFAULT_MAX_FRAME).is_err());
                }
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frame(&bytes, 4096);
            let _ = read_frame(&mut &bytes[..], 4096);
            if let Some((&ty, payload)) = bytes.split_first() {
                let _ = Message::decode(ty % 28, payload);
            }
        }

        #[test]
        fn mutated_frames_never_panic(m in arb_message(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let mut frame = m.encode();
            for (i, b) in flips {
                let i = i % frame.len();
                frame[i] = b;
            }
            if let Ok((Message::Partial(p), _)) = decode_frame(&frame, DEFAULT_MAX_FRAME) {
                let mut dst = vec![0f32; (p.n as usize).min(1 << 16)];
                let _ = p.add_into(&mut dst);
            }
            let _ = read_frame(&mut &frame[..], DEFAULT_MAX_FRAME);
        }
    }
}
