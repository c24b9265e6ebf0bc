//! Session opening between the coordinator and one worker, on a fresh [`Peer`]:
//!
//! ```text
//! [if a cluster key is set: AuthChallenge → AuthResponse → AuthProof   (crate::auth)]
//! coordinator → worker   Hello { version, model SHA-256, wire type, shard }
//! worker → coordinator   HelloAck { version, model SHA-256, node }   or Error { why }
//! ```
//!
//! The worker refuses (with an [`Message::Error`] saying why, then closes) a different
//! protocol version, a different model hash, a shard that does not fit the model, a
//! coordinator without the key when it has one, and a challenge when it has none.

use crate::allreduce::{CommError, Peer};
use crate::auth::{authenticate_initiator, authenticate_responder, AuthError, ClusterKey};
use crate::shard::ShardError;
use crate::wire::{check_peer, Hello, HelloAck, HelloMismatch, Message, PROTOCOL_VERSION};
use thiserror::Error;

/// Why a session could not be opened.
#[derive(Debug, Error)]
pub enum HandshakeError {
    /// The connection failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Authentication failed.
    #[error("node {node}: {source}")]
    Auth {
        /// The peer.
        node: usize,
        /// Why.
        #[source]
        source: AuthError,
    },
    /// Versions or models differ.
    #[error("node {node}: {source}")]
    Mismatch {
        /// The peer.
        node: usize,
        /// What differs.
        #[source]
        source: HelloMismatch,
    },
    /// The assigned shard does not fit the model.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The peer refused the session.
    #[error("node {node} refused the session: {message}")]
    Rejected {
        /// The peer.
        node: usize,
        /// Its reason.
        message: String,
    },
    /// The peer accepted the connection but sent nothing back for the whole timeout.
    /// A worker answers a `Hello` at once (each connection has its own thread, even
    /// while it serves another coordinator), so this is rarely slowness: raising
    /// `--step-timeout` is not the advice here.
    #[error(
        "node {node} ({addr}) accepted the connection but did not answer hearth's handshake for {}: \
         is `hearth worker --listen {addr}` what listens there, and not another program?",
        crate::allreduce::secs(*after)
    )]
    Silent {
        /// The peer.
        node: usize,
        /// Its address.
        addr: String,
        /// How long we waited.
        after: std::time::Duration,
    },
    /// The peer sent a message out of turn.
    #[error("node {node}: expected {expected}, got {got}")]
    Unexpected {
        /// The peer.
        node: usize,
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
}

impl HandshakeError {
    /// The peer this error is about, if known.
    pub fn node(&self) -> Option<usize> {
        match self {
            HandshakeError::Comm(c) => c.failed_node(),
            HandshakeError::Auth { node, .. }
            | HandshakeError::Mismatch { node, .. }
            | HandshakeError::Rejected { node, .. }
            | HandshakeError::Silent { node, .. }
            | HandshakeError::Unexpected { node, .. } => Some(*node),
            HandshakeError::Shard(_) => None,
        }
    }
}

fn auth_err(peer: &Peer, source: AuthError) -> HandshakeError {
    match source {
        AuthError::Rejected(message) => HandshakeError::Rejected { node: peer.node(), message },
        source => HandshakeError::Auth { node: peer.node(), source },
    }
}

/// Coordinator side: authenticate (if `key`), send `hello`, and wait for the worker's
/// acceptance, which must echo our version, model hash and the node index assigned.
pub fn coordinator_handshake(
    peer: &mut Peer,
    hello: &Hello,
    key: Option<&ClusterKey>,
) -> Result<HelloAck, HandshakeError> {
    if let Some(key) = key {
        let max = peer.max_frame();
        authenticate_initiator(peer.stream_mut(), key, max).map_err(|e| auth_err(peer, e))?;
    }
    peer.send(&Message::Hello(hello.clone()))?;
    let (m, _) = peer.recv().map_err(|e| match e {
        CommError::Timeout { node, addr, after, .. } => HandshakeError::Silent { node, addr, after },
        e => e.into(),
    })?;
    let node = peer.node();
    match m {
        Message::HelloAck(ack) => {
            check_peer(ack.version, &ack.model_sha256, &hello.model_sha256, false)
                .map_err(|source| HandshakeError::Mismatch { node, source })?;
            if ack.node != hello.shard.node as u64 {
                return Err(HandshakeError::Rejected {
                    node,
                    message: format!("acknowledged node index {} instead of {}", ack.node, hello.shard.node),
                });
            }
            Ok(ack)
        }
        Message::Error(e) => Err(HandshakeError::Rejected { node, message: e.message }),
        other => Err(HandshakeError::Unexpected { node, expected: "HelloAck", got: other.name() }),
    }
}

/// Worker side: authenticate (if `key`), receive and check the coordinator's
/// [`Hello`], acknowledge it. Every refusal is also sent to the coordinator.
pub fn worker_handshake(
    peer: &mut Peer,
    our_sha256: &[u8; 32],
    key: Option<&ClusterKey>,
) -> Result<Hello, HandshakeError> {
    let node = peer.node();
    let (mut first, _) = peer.recv()?;
    match (key, &first) {
        (Some(key), Message::AuthChallenge { .. }) => {
            let max = peer.max_frame();
            authenticate_responder(peer.stream_mut(), key, Some(first), max).map_err(|e| auth_err(peer, e))?;
            first = peer.recv()?.0;
        }
        (Some(_), other) => {
            let why = format!(
                "this worker requires a cluster key (--cluster-key); the coordinator sent {} without authenticating",
                other.name()
            );
            peer.report(None, &why);
            return Err(HandshakeError::Auth { node, source: AuthError::Rejected(why) });
        }
        (None, Message::AuthChallenge { .. }) => {
            let why = "this worker has no cluster key; start it with the same --cluster-key as the coordinator";
            peer.report(None, why);
            return Err(HandshakeError::Auth { node, source: AuthError::Rejected(why.into()) });
        }
        (None, _) => {}
    }
    let hello = match first {
        Message::Hello(h) => h,
        Message::Error(e) => return Err(HandshakeError::Rejected { node, message: e.message }),
        other => {
            peer.report(None, &format!("expected Hello, got {}", other.name()));
            return Err(HandshakeError::Unexpected { node, expected: "Hello", got: other.name() });
        }
    };
    if let Err(source) = check_peer(hello.version, &hello.model_sha256, our_sha256, true) {
        peer.report(None, &source.to_string());
        return Err(HandshakeError::Mismatch { node, source });
    }
    if hello.shard.node == 0 {
        let why = "a worker cannot be node 0 (the coordinator's index)";
        peer.report(None, why);
        return Err(HandshakeError::Rejected { node, message: why.into() });
    }
    if let Err(e) = hello.shard.validate() {
        peer.report(None, &e.to_string());
        return Err(e.into());
    }
    peer.send(&Message::HelloAck(HelloAck {
        version: PROTOCOL_VERSION,
        model_sha256: *our_sha256,
        node: hello.shard.node as u64,
    }))?;
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{ModelDims, ShardPlan};
    use crate::wire::WireType;
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::Duration;

    fn peers() -> (Peer, Peer) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let t = Duration::from_secs(5);
        (Peer::new(a, 1, t).unwrap(), Peer::new(b, 0, t).unwrap())
    }

    fn hello(sha: [u8; 32], version: u32) -> Hello {
        let d = ModelDims { n_head: 9, n_head_kv: 3, head_dim: 64, n_embd: 576, n_ff: 1536, block: 32 };
        let shard = ShardPlan::equal(d, 2).unwrap().nodes()[1].clone();
        Hello { version, model_sha256: sha, wire: WireType::F32, shard }
    }

    type Outcome = (Result<HelloAck, HandshakeError>, Result<Hello, HandshakeError>);

    fn run(h: Hello, ck: Option<&str>, wk: Option<&str>, worker_sha: [u8; 32]) -> Outcome {
        let (mut c, mut w) = peers();
        let wk = wk.map(|k| ClusterKey::new(k).unwrap());
        let t = thread::spawn(move || worker_handshake(&mut w, &worker_sha, wk.as_ref()));
        let ck = ck.map(|k| ClusterKey::new(k).unwrap());
        let rc = coordinator_handshake(&mut c, &h, ck.as_ref());
        (rc, t.join().unwrap())
    }

    #[test]
    fn accepts_matching_peers() {
        for key in [None, Some("secret")] {
            let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION), key, key, [1; 32]);
            assert_eq!(rc.unwrap().node, 1);
            assert_eq!(rw.unwrap().shard.kv_heads, 2..3);
        }
    }

    #[test]
    fn refuses_other_model_and_version() {
        let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION), None, None, [2; 32]);
        let msg = rc.unwrap_err().to_string();
        assert!(msg.contains("refused") && msg.contains("model mismatch"), "{msg}");
        assert!(matches!(rw, Err(HandshakeError::Mismatch { .. })));
        let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION + 7), None, None, [1; 32]);
        assert!(rc.unwrap_err().to_string().contains("protocol version mismatch"));
        assert!(matches!(rw, Err(HandshakeError::Mismatch { source: HelloMismatch::Version { .. }, .. })));
    }

    #[test]
    fn refuses_key_mismatches() {
        // wrong key
        let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION), Some("a"), Some("b"), [1; 32]);
        assert!(rc.unwrap_err().to_string().contains("cluster key"));
        assert!(rw.is_err());
        // worker wants a key, coordinator has none
        let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION), None, Some("b"), [1; 32]);
        assert!(rc.unwrap_err().to_string().contains("requires a cluster key"));
        assert!(rw.is_err());
        // coordinator has a key, worker has none
        let (rc, rw) = run(hello([1; 32], PROTOCOL_VERSION), Some("a"), None, [1; 32]);
        assert!(rc.unwrap_err().to_string().contains("no cluster key"));
        assert!(rw.is_err());
    }

    #[test]
    fn a_listener_that_never_answers_is_named_not_called_slow() {
        // Another program on the worker's port: it accepts and stays silent.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let a = TcpStream::connect(addr).unwrap();
        let _silent = l.accept().unwrap();
        let mut c = Peer::new(a, 1, Duration::from_millis(200)).unwrap();
        let e = coordinator_handshake(&mut c, &hello([1; 32], PROTOCOL_VERSION), None).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, HandshakeError::Silent { node: 1, .. }), "{e:?}");
        assert!(msg.contains("did not answer hearth's handshake") && msg.contains(&addr.to_string()), "{msg}");
        assert!(!msg.contains("raise --step-timeout"), "{msg}");
        assert_eq!(e.node(), Some(1));
    }

    #[test]
    fn refuses_bad_shard() {
        let mut h = hello([1; 32], PROTOCOL_VERSION);
        h.shard.ffn_rows = 5..9;
        let (rc, rw) = run(h, None, None, [1; 32]);
        assert!(rc.unwrap_err().to_string().contains("invalid shard"));
        assert!(matches!(rw, Err(HandshakeError::Shard(_))));
    }
}
