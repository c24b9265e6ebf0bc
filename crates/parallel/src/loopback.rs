//! In-process groups over 127.0.0.1 with ephemeral ports, for tests and benchmarks:
//! real TCP sockets, one [`AllReduce`](crate::AllReduce) per node, to be driven from one
//! thread per node.

use crate::allreduce::{CommError, Peer, Ring, Star};
use crate::wire::WireType;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn pair(l: &TcpListener) -> io::Result<(TcpStream, TcpStream)> {
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    Ok((a, b))
}

fn setup(e: io::Error) -> CommError {
    CommError::Setup(format!("loopback sockets: {e}"))
}

/// `n` star nodes (index = node; node 0 is the master), each socket with `timeout`.
pub fn star(n: usize, wire: WireType, timeout: Duration) -> Result<Vec<Star>, CommError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(setup)?;
    let mut masters = Vec::new();
    let mut workers = Vec::new();
    for node in 1..n.max(1) {
        let (w, m) = pair(&l).map_err(setup)?;
        masters.push(Peer::new(m, node, timeout).map_err(setup)?);
        workers.push(Peer::new(w, 0, timeout).map_err(setup)?);
    }
    let mut out = vec![Star::master(masters, wire)?];
    for (i, p) in workers.into_iter().enumerate() {
        out.push(Star::worker(i + 1, n, p, wire)?);
    }
    Ok(out)
}

/// `n` ring nodes (index = node), each socket with `timeout`.
pub fn ring(n: usize, wire: WireType, timeout: Duration) -> Result<Vec<Ring>, CommError> {
    if n <= 1 {
        return Ok(vec![Ring::single(wire)]);
    }
    let listeners = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<io::Result<Vec<_>>>().map_err(setup)?;
    // Link i → i+1: node i's `next`, node (i+1)'s `prev`.
    let mut nexts = Vec::new();
    let mut prevs: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
    for i in 0..n {
        let j = (i + 1) % n;
        let (a, b) = pair(&listeners[j]).map_err(setup)?;
        nexts.push(Peer::new(a, j, timeout).map_err(setup)?);
        prevs[j] = Some(Peer::new(b, i, timeout).map_err(setup)?);
    }
    nexts
        .into_iter()
        .zip(prevs)
        .enumerate()
        .map(|(i, (next, prev))| {
            let prev = prev.ok_or_else(|| CommError::Setup("ring link missing".into()))?;
            Ring::new(i, n, next, prev, wire)
        })
        .collect()
}
