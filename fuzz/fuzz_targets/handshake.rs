//! The session-opening state machines over real loopback sockets, with the other end
//! played by the fuzzer: the worker's (`worker_handshake`, what `hearth worker` runs on
//! every connection from the LAN) and the coordinator's (`coordinator_handshake`), each
//! without a key, with a key before authentication (the fuzzer cannot forge the MAC),
//! and with a key after a genuine authentication (the fuzzer's bytes follow a correct
//! challenge-response, so Hello/HelloAck parsing and checks are reached too).
//!
//! Input: byte 0 picks the side and mode, the rest is what the fuzzer's end sends.
#![no_main]
use hearth_parallel::auth::{authenticate_initiator, authenticate_responder};
use hearth_parallel::cluster::HANDSHAKE_MAX_FRAME;
use hearth_parallel::shard::{ModelDims, ShardPlan};
use hearth_parallel::wire::WireType;
use hearth_parallel::{coordinator_handshake, worker_handshake, ClusterKey, Hello, Peer, PROTOCOL_VERSION};
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

const SHA: [u8; 32] = [7; 32];

fn listener() -> &'static TcpListener {
    static L: OnceLock<TcpListener> = OnceLock::new();
    L.get_or_init(|| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
}

fn key() -> ClusterKey {
    ClusterKey::new("fuzz cluster key").unwrap()
}

fuzz_target!(|data: &[u8]| {
    let [mode, bytes @ ..] = data else { return };
    let (coordinator, keyed, after_auth) = match mode % 6 {
        0 => (false, false, false),
        1 => (false, true, false),
        2 => (false, true, true),
        3 => (true, false, false),
        4 => (true, true, false),
        _ => (true, true, true),
    };
    let l = listener();
    let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (theirs, _) = l.accept().unwrap();
    let bytes = bytes.to_vec();
    // The fuzzer's end: authenticate for real if asked, send the input, then read
    // whatever comes back until the product side closes (so its writes never block).
    let fuzzer = std::thread::spawn(move || {
        let mut s = theirs;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if after_auth {
            let authed = if coordinator {
                authenticate_responder(&mut s, &key(), None, HANDSHAKE_MAX_FRAME)
            } else {
                authenticate_initiator(&mut s, &key(), HANDSHAKE_MAX_FRAME)
            };
            assert!(authed.is_ok(), "a genuine authentication failed: {authed:?}");
        }
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(Shutdown::Write);
        let _ = std::io::copy(&mut s, &mut std::io::sink());
    });
    let timeout = Duration::from_secs(5);
    let key = keyed.then(key);
    {
        let mut peer = Peer::new(ours, if coordinator { 1 } else { 0 }, timeout).unwrap().with_max_frame(HANDSHAKE_MAX_FRAME);
        if coordinator {
            let dims = ModelDims { n_head: 9, n_head_kv: 3, head_dim: 64, n_embd: 576, n_ff: 1536, block: 32 };
            let shard = ShardPlan::equal(dims, 2).unwrap().nodes()[1].clone();
            let hello = Hello { version: PROTOCOL_VERSION, model_sha256: SHA, wire: WireType::F32, shard };
            let _ = coordinator_handshake(&mut peer, &hello, key.as_ref());
        } else if let Ok(hello) = worker_handshake(&mut peer, &SHA, key.as_ref()) {
            // Accepted: what the worker does next with the assignment.
            assert!(hello.shard.validate().is_ok());
            let _ = hello.shard.node;
        }
        let _ = peer.stream_mut().shutdown(Shutdown::Both);
    }
    fuzzer.join().expect("the fuzzer's end of the socket");
});

