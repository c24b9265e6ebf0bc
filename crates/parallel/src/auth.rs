//! Mutual challenge-response authentication over a shared cluster key.
//!
//! Three messages, initiator (the coordinator) I and responder (a worker) R, key K:
//!
//! ```text
//! I → R  AuthChallenge { nonce: nI }                       nI: 32 fresh random bytes
//! R → I  AuthResponse  { nonce: nR, mac: HMAC(K, "hearth-auth-v1" ‖ 'R' ‖ nI ‖ nR) }
//! I → R  AuthProof     { mac: HMAC(K, "hearth-auth-v1" ‖ 'I' ‖ nI ‖ nR) }
//! ```
//!
//! HMAC is HMAC-SHA256 (RustCrypto `hmac` + `sha2`); MACs are compared in constant time
//! (`Mac::verify_slice`). Each side proves the key over a nonce the *other* side just
//! drew, so a recorded response or proof from an earlier session does not verify (the
//! fresh nonce differs); the role byte keeps a responder's MAC from being reflected
//! back as an initiator's proof. The side that finds a bad MAC sends an
//! [`Message::Error`] before closing, so the peer learns why instead of seeing a bare
//! disconnect.
//!
//! This authenticates the peers; it does not encrypt the traffic (activations travel in
//! the clear), which is why a worker binds to loopback unless told otherwise.

use crate::wire::{read_frame, write_frame, ErrorMsg, Message, WireError};
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;
use std::io::{Read, Write};
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

const DOMAIN: &[u8] = b"hearth-auth-v1";

/// A shared cluster key (any non-empty byte string; 32 random bytes is plenty).
#[derive(Clone)]
pub struct ClusterKey {
    /// HMAC state keyed with the key, cloned for each MAC.
    keyed: HmacSha256,
    len: usize,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey(<{} bytes redacted>)", self.len)
    }
}

impl ClusterKey {
    /// A key from raw bytes (e.g. a key file's contents, or `--cluster-key`'s text).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, AuthError> {
        let b = bytes.into();
        if b.is_empty() {
            return Err(AuthError::EmptyKey);
        }
        let keyed = <HmacSha256 as KeyInit>::new_from_slice(&b).map_err(|_| AuthError::EmptyKey)?;
        Ok(Self { keyed, len: b.len() })
    }

    fn mac(&self, role: u8, n_i: &[u8; 32], n_r: &[u8; 32]) -> HmacSha256 {
        let mut m = self.keyed.clone();
        m.update(DOMAIN);
        m.update(&[role]);
        m.update(n_i);
        m.update(n_r);
        m
    }

    fn tag(&self, role: u8, n_i: &[u8; 32], n_r: &[u8; 32]) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(&self.mac(role, n_i, n_r).finalize().into_bytes());
        out
    }

    fn verify(&self, role: u8, n_i: &[u8; 32], n_r: &[u8; 32], mac: &[u8; 32]) -> bool {
        self.mac(role, n_i, n_r).verify_slice(mac).is_ok()
    }
}

/// Why authentication failed.
#[derive(Debug, Error)]
pub enum AuthError {
    /// The key is empty.
    #[error("the cluster key is empty")]
    EmptyKey,
    /// The peer's MAC does not verify.
    #[error(
        "authentication failed: the {peer}'s proof does not match this node's cluster key \
         (a different key, or a replayed message)"
    )]
    BadMac {
        /// `"worker"` or `"coordinator"`.
        peer: &'static str,
    },
    /// The peer refused us (it sent an error, e.g. because our proof did not verify).
    #[error("the peer refused authentication: {0}")]
    Rejected(String),
    /// The peer sent something else than the next step of the exchange.
    #[error("authentication: expected {expected}, got {got}")]
    Unexpected {
        /// The message expected.
        expected: &'static str,
        /// The one received.
        got: &'static str,
    },
    /// The connection failed or sent a bad frame.
    #[error("authentication: {0}")]
    Wire(#[from] WireError),
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

/// The initiator's state between its challenge and the responder's answer.
#[derive(Debug)]
pub struct Initiator {
    key: ClusterKey,
    nonce: [u8; 32],
}

impl Initiator {
    /// Start: a fresh nonce and the challenge to send.
    pub fn start(key: &ClusterKey) -> (Self, Message) {
        let n = nonce();
        (Self { key: key.clone(), nonce: n }, Message::AuthChallenge { nonce: n })
    }

    /// Check the responder's answer; on success, the proof to send back.
    pub fn finish(self, response: &Message) -> Result<Message, AuthError> {
        let Message::AuthResponse { nonce: n_r, mac } = response else {
            return Err(unexpected("AuthResponse", response));
        };
        if !self.key.verify(b'R', &self.nonce, n_r, mac) {
            return Err(AuthError::BadMac { peer: "worker" });
        }
        Ok(Message::AuthProof { mac: self.key.tag(b'I', &self.nonce, n_r) })
    }
}

/// The responder's state between its answer and the initiator's proof.
#[derive(Debug)]
pub struct Responder {
    key: ClusterKey,
    n_i: [u8; 32],
    n_r: [u8; 32],
}

impl Responder {
    /// Answer a challenge: the state to keep and the response to send.
    pub fn respond(key: &ClusterKey, challenge: &Message) -> Result<(Self, Message), AuthError> {
        let Message::AuthChallenge { nonce: n_i } = challenge else {
            return Err(unexpected("AuthChallenge", challenge));
        };
        let n_r = nonce();
        let mac = key.tag(b'R', n_i, &n_r);
        Ok((Self { key: key.clone(), n_i: *n_i, n_r }, Message::AuthResponse { nonce: n_r, mac }))
    }

    /// Check the initiator's proof.
    pub fn finish(self, proof: &Message) -> Result<(), AuthError> {
        let Message::AuthProof { mac } = proof else {
            return Err(unexpected("AuthProof", proof));
        };
        if !self.key.verify(b'I', &self.n_i, &self.n_r, mac) {
            return Err(AuthError::BadMac { peer: "coordinator" });
        }
        Ok(())
    }
}

fn unexpected(expected: &'static str, got: &Message) -> AuthError {
    match got {
        Message::Error(e) => AuthError::Rejected(e.message.clone()),
        _ => AuthError::Unexpected { expected, got: got.name() },
    }
}

fn refuse(s: &mut impl Write, e: &AuthError) {
    let msg = Message::Error(ErrorMsg { failed_node: None, message: e.to_string() });
    let _ = write_frame(s, &msg, &mut Vec::new());
}

/// Run the initiator's side over a stream (sends the challenge first).
pub fn authenticate_initiator<S: Read + Write>(s: &mut S, key: &ClusterKey, max_frame: usize) -> Result<(), AuthError> {
    let (state, challenge) = Initiator::start(key);
    write_frame(s, &challenge, &mut Vec::new())?;
    let (resp, _) = read_frame(s, max_frame)?;
    match state.finish(&resp) {
        Ok(proof) => {
            write_frame(s, &proof, &mut Vec::new())?;
            Ok(())
        }
        Err(e) => {
            refuse(s, &e);
            Err(e)
        }
    }
}

/// Run the responder's side over a stream. `first` is the challenge if the caller
/// already read it (e.g. while waiting for the first frame of a session), else `None`.
pub fn authenticate_responder<S: Read + Write>(
    s: &mut S,
    key: &ClusterKey,
    first: Option<Message>,
    max_frame: usize,
) -> Result<(), AuthError> {
    let challenge = match first {
        Some(m) => m,
        None => read_frame(s, max_frame)?.0,
    };
    let (state, resp) = match Responder::respond(key, &challenge) {
        Ok(x) => x,
        Err(e) => {
            refuse(s, &e);
            return Err(e);
        }
    };
    write_frame(s, &resp, &mut Vec::new())?;
    let (proof, _) = read_frame(s, max_frame)?;
    state.finish(&proof).inspect_err(|e| refuse(s, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DEFAULT_MAX_FRAME;
    use std::net::{TcpListener, TcpStream};
    use std::thread;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn right_key_passes_both_ways() {
        let k = key("correct horse battery staple");
        let (i, challenge) = Initiator::start(&k);
        let (r, resp) = Responder::respond(&k, &challenge).unwrap();
        let proof = i.finish(&resp).unwrap();
        r.finish(&proof).unwrap();
    }

    #[test]
    fn wrong_key_fails_on_each_side() {
        let (a, b) = (key("alpha"), key("beta"));
        // initiator catches a responder with the wrong key
        let (i, challenge) = Initiator::start(&a);
        let (_r, resp) = Responder::respond(&b, &challenge).unwrap();
        let e = i.finish(&resp).unwrap_err();
        assert!(matches!(e, AuthError::BadMac { peer: "worker" }));
        assert!(e.to_string().contains("does not match this node's cluster key"), "{e}");
        // responder catches an initiator with the wrong key: a proof over the right
        // nonces, made with key b, does not verify under key a
        let (i, challenge) = Initiator::start(&b);
        let (r, _resp) = Responder::respond(&a, &challenge).unwrap();
        let forged = Message::AuthProof { mac: b.tag(b'I', &i.nonce, &r.n_r) };
        let e = r.finish(&forged).unwrap_err();
        assert!(matches!(e, AuthError::BadMac { peer: "coordinator" }), "{e}");
    }

    #[test]
    fn replayed_response_fails() {
        let k = key("k");
        // record a valid exchange
        let (i1, c1) = Initiator::start(&k);
        let (r1, resp1) = Responder::respond(&k, &c1).unwrap();
        let proof1 = i1.finish(&resp1).unwrap();
        r1.finish(&proof1).unwrap();
        // an attacker without the key replays the recorded response to a new challenge
        let (i2, _c2) = Initiator::start(&k);
        assert!(matches!(i2.finish(&resp1), Err(AuthError::BadMac { .. })));
        // ... or replays the recorded proof to a worker's new response
        let (r2, _resp2) = Responder::respond(&k, &c1).unwrap();
        assert!(matches!(r2.finish(&proof1), Err(AuthError::BadMac { .. })));
        // ... or reflects the worker's own response MAC back as a proof
        let (i3, c3) = Initiator::start(&k);
        let (r3, resp3) = Responder::respond(&k, &c3).unwrap();
        let Message::AuthResponse { mac, .. } = resp3 else { unreachable!() };
        assert!(matches!(r3.finish(&Message::AuthProof { mac }), Err(AuthError::BadMac { .. })));
        drop(i3);
    }

    #[test]
    fn wrong_messages_are_errors() {
        let k = key("k");
        assert!(matches!(
            Responder::respond(&k, &Message::Shutdown),
            Err(AuthError::Unexpected { expected: "AuthChallenge", got: "Shutdown" })
        ));
        let (i, _) = Initiator::start(&k);
        let err = Message::Error(ErrorMsg { failed_node: None, message: "no".into() });
        assert!(matches!(i.finish(&err), Err(AuthError::Rejected(m)) if m == "no"));
        assert!(matches!(ClusterKey::new(Vec::new()), Err(AuthError::EmptyKey)));
        assert!(!format!("{k:?}").contains('k') || format!("{k:?}").contains("redacted"));
    }

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn over_tcp_right_and_wrong_keys() {
        for (ki, kr, ok) in [("same", "same", true), ("one", "two", false)] {
            let (mut a, mut b) = tcp_pair();
            let (ki, kr) = (key(ki), key(kr));
            let t = thread::spawn(move || authenticate_responder(&mut b, &kr, None, DEFAULT_MAX_FRAME));
            let ri = authenticate_initiator(&mut a, &ki, DEFAULT_MAX_FRAME);
            let rr = t.join().unwrap();
            assert_eq!(ri.is_ok(), ok, "{ri:?}");
            assert_eq!(rr.is_ok(), ok, "{rr:?}");
            if !ok {
                // the initiator found the bad MAC; the responder was told why
                assert!(matches!(ri, Err(AuthError::BadMac { peer: "worker" })));
                let msg = rr.unwrap_err().to_string();
                assert!(msg.contains("refused authentication") && msg.contains("cluster key"), "{msg}");
            }
        }
    }
}
