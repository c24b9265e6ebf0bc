//! User-space network emulation for the tensor-parallel benchmarks (issue #6): there is
//! no `netem` on the benchmark VM, so latency and bandwidth are added by relaying TCP
//! streams through threads that hold every chunk back until the emulated link would
//! have delivered it.
//!
//! **The link model.** Every node has a network interface ([`Nic`]) with a transmit and
//! a receive side, each a serial resource of rate `R` bits/s that is busy until some
//! time. A chunk of `b` bytes read at time `a` from node X's socket, bound for node Y,
//! starts at `max(a + D, X.tx busy until, Y.rx busy until)` and is delivered once it is
//! serialized, `b·8/R` s later; both resources are then busy until that moment. One
//! chunk alone therefore takes `D + b·8/R` (propagation plus serialization), a burst
//! queues behind itself, and partials that several workers send to one master at once
//! queue at the master's receive side, as they would on its switch port. That is
//! `max(a + D, link_free)` of the benchmark brief, generalized to the two ends of a
//! switched link; with a NIC used by a single connection it is exactly that rule.
//! A rate of 0 means unlimited (delay only).
//!
//! What it leaves out: TCP/IP headers (the rate applies to payload bytes), TCP's own
//! slow start and acknowledgements (each relay hop is a loopback TCP connection, so a
//! sender never waits a round trip for a window), jitter and loss.
//!
//! Used by `examples/delay_proxy.rs` (a standalone proxy in front of `hearth worker`s)
//! and `examples/allreduce_latency.rs` (in-process links for the allreduce
//! microbenchmark).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// One-way delay and rate of every link of an emulated network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// One-way propagation delay `D`.
    pub delay: Duration,
    /// Rate `R` in bits per second; 0 (or less) is unlimited.
    pub rate_bps: f64,
}

impl LinkParams {
    /// `delay_ms` milliseconds one way, `rate_mbit` Mbit/s (10⁶ bits/s; 0 = unlimited).
    pub fn new(delay_ms: f64, rate_mbit: f64) -> Self {
        Self { delay: Duration::from_secs_f64(delay_ms.max(0.0) / 1e3), rate_bps: rate_mbit * 1e6 }
    }

    /// Serialization time of `bytes` at the rate: `bytes·8/R`.
    pub fn serialize(&self, bytes: usize) -> Duration {
        if self.rate_bps > 0.0 {
            Duration::from_secs_f64(bytes as f64 * 8.0 / self.rate_bps)
        } else {
            Duration::ZERO
        }
    }
}

/// The timing rule (times are offsets from any fixed epoch): a chunk of `bytes` read at
/// `arrival` that needs the resources `uses` (indices into `busy_until`) starts at
/// `max(arrival + D, busy_until[r] for r in uses)` and is delivered when serialized,
/// `bytes·8/R` later; the resources are busy until then. Returns the delivery time.
pub fn schedule(p: &LinkParams, arrival: Duration, bytes: usize, busy_until: &mut [Duration], uses: &[usize]) -> Duration {
    let start = uses.iter().fold(arrival + p.delay, |t, &r| t.max(busy_until[r]));
    let done = start + p.serialize(bytes);
    for &r in uses {
        busy_until[r] = done;
    }
    done
}

/// A node's interface: indices of its transmit and receive resources in a [`Net`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nic {
    /// Transmit side.
    pub tx: usize,
    /// Receive side.
    pub rx: usize,
}

/// An emulated network: link parameters and the busy-until time of every resource.
#[derive(Debug)]
pub struct Net {
    params: LinkParams,
    epoch: Instant,
    busy_until: Mutex<Vec<Duration>>,
}

impl Net {
    /// An empty network whose links all have `params`.
    pub fn new(params: LinkParams) -> Arc<Self> {
        Arc::new(Self { params, epoch: Instant::now(), busy_until: Mutex::new(Vec::new()) })
    }

    /// The link parameters.
    pub fn params(&self) -> LinkParams {
        self.params
    }

    /// A new node interface.
    pub fn nic(&self) -> Nic {
        let mut b = self.busy_until.lock().unwrap_or_else(|p| p.into_inner());
        b.extend([Duration::ZERO, Duration::ZERO]);
        Nic { tx: b.len() - 2, rx: b.len() - 1 }
    }

    /// When a chunk of `bytes` read at `arrival` on a connection from `from` to `to`
    /// is delivered (see [`schedule`]).
    pub fn deliver_at(&self, arrival: Instant, bytes: usize, from: Nic, to: Nic) -> Instant {
        let mut b = self.busy_until.lock().unwrap_or_else(|p| p.into_inner());
        let at = arrival.saturating_duration_since(self.epoch);
        self.epoch + schedule(&self.params, at, bytes, &mut b, &[from.tx, to.rx])
    }
}

/// Largest chunk read (and delivered) at once.
const CHUNK: usize = 64 << 10;

/// Relay `src → dst` through the emulated link `from → to` (two threads: a reader that
/// stamps each chunk with its delivery time, a writer that sleeps until then). When
/// `src` ends, `dst`'s write side is shut down after the last chunk; when writing to
/// `dst` fails, `src` is shut down so that its writer notices.
pub fn relay(mut src: TcpStream, mut dst: TcpStream, net: Arc<Net>, from: Nic, to: Nic) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let src_handle = src.try_clone()?;
    thread::Builder::new().name("emu-read".into()).spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = net.deliver_at(Instant::now(), n, from, to);
            if tx.send((at, buf[..n].to_vec())).is_err() {
                break;
            }
        }
        // Dropping `tx` tells the writer that the stream ended.
    })?;
    thread::Builder::new().name("emu-write".into()).spawn(move || {
        precise_sleep();
        for (at, data) in rx {
            let now = Instant::now();
            if at > now {
                thread::sleep(at - now);
            }
            if dst.write_all(&data).is_err() {
                let _ = src_handle.shutdown(Shutdown::Both);
                let _ = dst.shutdown(Shutdown::Both);
                return;
            }
        }
        let _ = dst.shutdown(Shutdown::Write);
    })?;
    Ok(())
}

/// Ask Linux to wake this thread's sleeps without the default 50 µs timer slack
/// (`PR_SET_TIMERSLACK` = 1 ns; best effort). On the benchmark VM this cuts the
/// oversleep of a 1 ms `sleep` from about 105 µs to about 45 µs.
fn precise_sleep() {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::{c_int, c_ulong};
        extern "C" {
            fn prctl(option: c_int, ...) -> c_int;
        }
        const PR_SET_TIMERSLACK: c_int = 29;
        // SAFETY: prctl(PR_SET_TIMERSLACK, n) only changes this thread's timer slack.
        unsafe {
            prctl(PR_SET_TIMERSLACK, 1 as c_ulong, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong);
        }
    }
}

/// Relay an accepted `client` connection to a new connection to `target`, both ways:
/// `client_nic → target_nic` and back. `TCP_NODELAY` on both sockets.
pub fn proxy(client: TcpStream, target: SocketAddr, net: &Arc<Net>, client_nic: Nic, target_nic: Nic) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    relay(client.try_clone()?, server.try_clone()?, net.clone(), client_nic, target_nic)?;
    relay(server, client, net.clone(), target_nic, client_nic)
}

/// Serve `listener` forever: every accepted connection is proxied to `target`.
pub fn serve(listener: TcpListener, target: SocketAddr, net: Arc<Net>, client_nic: Nic, target_nic: Nic) {
    for conn in listener.incoming() {
        let r = conn.and_then(|c| proxy(c, target, &net, client_nic, target_nic));
        if let Err(e) = r {
            eprintln!("delay proxy → {target}: {e}");
        }
    }
}

/// A connected pair of loopback sockets `(a, b)` whose traffic passes through the
/// emulated link between `a_nic` and `b_nic` (in-process; the relay threads end when
/// the sockets are closed). `TCP_NODELAY` is set on every socket.
pub fn linked_pair(net: &Arc<Net>, a_nic: Nic, b_nic: Nic) -> io::Result<(TcpStream, TcpStream)> {
    let target = TcpListener::bind("127.0.0.1:0")?;
    let front = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(front.local_addr()?)?;
    let (client, _) = front.accept()?;
    proxy(client, target.local_addr()?, net, a_nic, b_nic)?;
    let (b, _) = target.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_nanos(10)
    }

    #[test]
    fn timing_arithmetic() {
        // 5 ms one way, 8 Mbit/s: 1000 bytes take 1 ms to serialize.
        let p = LinkParams::new(5.0, 8.0);
        assert!(close(p.serialize(1000), ms(1.0)));
        let mut busy = vec![Duration::ZERO; 4];
        // Alone: delay + serialization.
        assert!(close(schedule(&p, ms(0.0), 1000, &mut busy, &[0, 3]), ms(6.0)));
        // Right behind it: waits for the link (busy until 6 ms), not for its own delay (5.5).
        assert!(close(schedule(&p, ms(0.5), 1000, &mut busy, &[0, 3]), ms(7.0)));
        // Long after: the link is free again.
        assert!(close(schedule(&p, ms(20.0), 500, &mut busy, &[0, 3]), ms(25.5)));
        // Another sender into the same receiver (resource 3, busy until 25.5 ms) queues there.
        assert!(close(schedule(&p, ms(20.0), 1000, &mut busy, &[2, 3]), ms(26.5)));
        assert!(close(busy[2], ms(26.5)) && close(busy[0], ms(25.5)));
        // Unlimited rate: delay only, no queueing.
        let q = LinkParams::new(1.0, 0.0);
        let mut busy = vec![Duration::ZERO; 2];
        assert!(close(schedule(&q, ms(0.0), 1 << 20, &mut busy, &[0, 1]), ms(1.0)));
        assert!(close(schedule(&q, ms(0.0), 1 << 20, &mut busy, &[0, 1]), ms(1.0)));
    }

    #[test]
    fn relayed_bytes_arrive_late_and_intact() {
        let net = Net::new(LinkParams::new(20.0, 0.0));
        let (na, nb) = (net.nic(), net.nic());
        let (mut a, mut b) = linked_pair(&net, na, nb).unwrap();
        let t = Instant::now();
        a.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        let one_way = t.elapsed();
        b.write_all(b"pong").unwrap();
        a.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pong");
        assert!(one_way >= ms(20.0) && t.elapsed() >= ms(40.0), "{one_way:?} {:?}", t.elapsed());
        drop(a);
        // EOF travels too.
        assert_eq!(b.read(&mut got).unwrap(), 0);
    }
}
