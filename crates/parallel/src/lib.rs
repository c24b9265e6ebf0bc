//! Tensor parallelism plumbing: one model split across several devices (issue #6).
//!
//! Everything here is independent of the forward pass:
//!
//! - [`shard`]: the split plan — which KV-head groups and FFN rows each node computes
//!   ([`ShardPlan`], [`NodeShard`]), Megatron-style, proportional to per-node weights.
//! - [`wire`]: length-prefixed binary frames and the protocol's messages ([`Message`]).
//! - [`auth`]: mutual HMAC-SHA256 challenge-response over a shared [`ClusterKey`].
//! - [`handshake`]: opening a coordinator ↔ worker session (auth, version, model hash,
//!   shard assignment).
//! - [`allreduce`]: the [`AllReduce`] trait and its [`Local`], [`Star`] and [`Ring`]
//!   implementations over TCP ([`Peer`]); [`loopback`] builds in-process groups.
//!
//! # How a layer uses it
//!
//! Each node holds, for every layer, the rows of `attn_q/k/v` of its KV heads (with
//! their query heads), the matching input columns of `attn_output`, the rows
//! `ffn_rows` of `ffn_gate`/`ffn_up` and those input columns of `ffn_down`. For a batch
//! of `T` tokens and model width `n_embd`, each layer does two allreduces of a
//! `T × n_embd` f32 buffer (row-major, token-major; the same on every node):
//!
//! 1. after `attn_output`: each node's buffer is its heads' contribution to the
//!    attention output (zeros on an FFN-only node); the sum is the full attention
//!    output, added to the residual identically on every node;
//! 2. after `ffn_down`: each node's buffer is its FFN rows' contribution; the sum is the
//!    full FFN output.
//!
//! The coordinator (node 0) also holds the embedding and the output head: it sends the
//! step's input to the workers and computes the logits itself (messages for that are
//! the integration's; this crate carries the allreduces and the session opening).
//!
//! # A session, end to end
//!
//! ```
//! use hearth_parallel::*;
//! use std::net::{TcpListener, TcpStream};
//!
//! let dims = ModelDims { n_head: 9, n_head_kv: 3, head_dim: 64, n_embd: 576, n_ff: 1536, block: 32 };
//! let plan = ShardPlan::new(dims, &[2.0, 1.0])?; // node 0 twice as fast as node 1
//! let sha = [0u8; 32]; // the GGUF's SHA-256
//! let key = ClusterKey::new("shared secret")?;
//!
//! // Worker (`hearth worker --listen 127.0.0.1:0`): accept, check, serve.
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let worker_key = key.clone();
//! let worker = std::thread::spawn(move || -> Result<Vec<f32>, Box<dyn std::error::Error + Send + Sync>> {
//!     let (stream, _) = listener.accept()?;
//!     let mut coord = Peer::new(stream, 0, DEFAULT_TIMEOUT)?;
//!     let hello = worker_handshake(&mut coord, &sha, Some(&worker_key))?;
//!     let shard = &hello.shard; // mmap and keep only these rows/columns
//!     assert_eq!(shard.node, 1);
//!     let mut ar = Star::worker(shard.node, shard.n_nodes, coord, hello.wire)?;
//!     let mut partial = vec![1.0f32; dims.n_embd]; // this node's attn_output product
//!     ar.allreduce(&mut partial)?;
//!     Ok(partial)
//! });
//!
//! // Coordinator (`hearth generate --workers HOST:PORT`): connect, hand out shards.
//! let mut peer = Peer::new(TcpStream::connect(addr)?, 1, DEFAULT_TIMEOUT)?;
//! let hello = Hello {
//!     version: PROTOCOL_VERSION,
//!     model_sha256: sha,
//!     wire: WireType::F32,
//!     shard: plan.node(1).unwrap().clone(),
//! };
//! coordinator_handshake(&mut peer, &hello, Some(&key))?;
//! let mut ar = Star::master(vec![peer], WireType::F32)?;
//! let mut partial = vec![2.0f32; dims.n_embd];
//! let stats = ar.allreduce(&mut partial)?; // per layer, twice
//! assert_eq!(partial[0], 3.0);
//! assert_eq!(stats.bytes_sent, 34 + 4 * 576);
//! assert_eq!(worker.join().unwrap().unwrap()[0], 3.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What travels
//!
//! | message | direction | carries | size |
//! |---|---|---|---|
//! | `Hello` | coordinator → worker | protocol version, model SHA-256, wire type, [`NodeShard`] | 142 B |
//! | `HelloAck` | worker → coordinator | version, model SHA-256, node index | 49 B |
//! | `AuthChallenge` / `AuthResponse` / `AuthProof` | both ways | 32-byte nonces, 32-byte HMAC-SHA256 tags | 37 / 69 / 37 B |
//! | `Partial` | per allreduce step | `T·n_embd` (star) or `≈ T·n_embd/N` (ring) elements as f32 (4 B each) or Q8_0 (34 B per 32) | 34 B header + data |
//! | `Error` | any | failed node index, UTF-8 reason | 14 B + text |
//! | `Shutdown` | any | nothing | 5 B |
//!
//! For decode (`T = 1`) one partial is `4·n_embd` bytes in f32: 2.25 KiB for SmolLM2
//! (`n_embd` 576), 16 KiB for a 7B (4096), 32 KiB for a 70B (8192); Q8_0 is 34/128 ≈
//! 27 % of that (612 B, 4.25 KiB, 8.5 KiB).
//!
//! # Latency model
//!
//! Let `τ` be the one-way link latency (seconds), `B` the link bandwidth (bytes/s),
//! `S` the bytes of one partial, `N` the node count and `L` the layer count.
//!
//! - **Star** ([`Star`]): each worker's partial crosses one link up, the sum one link
//!   down: **2 link latencies** on the critical path per allreduce, whatever `N`; the
//!   master's link carries `(N−1)·S` each way, so
//!   `t_star ≈ 2τ + 2(N−1)·S/B` (+ the master's additions, `N·S/4` flops).
//! - **Ring** ([`Ring`]): `2(N−1)` sequential steps (reduce-scatter then all-gather),
//!   each one link latency plus `S/N` bytes: `t_ring ≈ 2(N−1)·τ + 2(N−1)/N · S/B`.
//!   Bandwidth-optimal, but its latency term grows with `N`.
//!
//! A token is `2L` allreduces (plus the coordinator's `Step` carrying the token's input,
//! one more link latency), so per token `2L·t_allreduce`; for the star that is
//! `2L·(2τ + t_data)` with `t_data = 2(N−1)·S/B` — the form `2·L·(t_data + t_link)` that
//! issue #6 asks the benchmarks to compare against, with `t_link = 2τ` per allreduce.
//! At home-network numbers the latency term dominates: SmolLM2 (`L` = 30, `S` = 2.3 KB)
//! over 4 nodes at `τ` = 1 ms and 300 Mbit/s (TPI-LLM's emulated testbed) spends
//! `60·2 ms = 120 ms` per token in star link latency against `60·2·3·2.3 KB/37.5 MB/s ≈
//! 22 ms` in transfer; a ring would spend `60·6 ms = 360 ms` in latency.
//!
//! TPI-LLM (Li et al., arXiv 2410.00531, §3.4) makes the same argument: on edge
//! networks link latency, not bandwidth, dominates the allreduce, and it counts (as
//! quoted in issue #6) 8τ of link latency per allreduce for a star over 8 devices
//! against 16τ for a tree and 56τ for a ring, with about 256 KB per device per step;
//! hence its star. Those counts add the latency of every hop, including the star's
//! `N` parallel hops; the critical path of the star above is 2τ. (These figures were
//! taken from the issue; the paper's text was not reachable when this was written, so
//! the benchmark doc should re-check them against §3.4 before quoting.)
//!
//! # Determinism
//!
//! The star master adds partials in node order `((x₀ + x₁) + x₂) + …` and sends the
//! same bytes to every worker: with the f32 wire the result is bit-identical to that
//! sum done on one machine, run after run. With Q8_0 every node still ends with the
//! same values (the master keeps the dequantized sum it sends).
#![deny(missing_docs)]

pub mod allreduce;
pub mod auth;
pub mod cluster;
pub mod handshake;
pub mod loopback;
pub mod model_hash;
pub mod profile;
pub mod ring;
pub mod shard;
pub mod shard_file;
pub mod solver;
pub mod wire;

pub use allreduce::{ring_chunks, AllReduce, CommError, CommStats, Local, Peer, Ring, Star, DEFAULT_TIMEOUT};
pub use auth::{AuthError, ClusterKey};
pub use cluster::{connect, serve_session, ClusterError, SessionEvent, ClusterOptions, Layout, CommCounters, Group, GroupHandle, StarCollective, WorkerModel};
pub use handshake::{coordinator_handshake, worker_handshake, HandshakeError};
pub use shard::{lcm_block, proportional_split, span, ModelDims, NodeShard, ShardError, ShardPlan};
pub use wire::{Hello, HelloAck, Message, NodeStats, Partial, Session, WireError, WireType, PROTOCOL_VERSION};

/// The end of the error a worker sends a coordinator whose session another coordinator
/// took over ("another coordinator (ADDR) took over this worker"): `hearth serve` reads it
/// to leave that worker alone rather than take it back (`--rejoin`).
pub const TAKEN_OVER: &str = "took over this worker";
