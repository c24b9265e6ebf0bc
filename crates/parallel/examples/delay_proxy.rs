//! A TCP proxy that adds a one-way delay and a rate limit in user space (no `netem`
//! needed), to put in front of `hearth worker`s (issue #6's network benchmark,
//! `bench/tp-network.sh`):
//!
//! ```sh
//! cargo run --release -p hearth-parallel --example delay_proxy -- \
//!     --listen 127.0.0.1:7071 --target 127.0.0.1:7070 --delay-ms 5 --rate-mbit 300
//! ```
//!
//! Every accepted connection is relayed to a new connection to the target, both
//! directions; each chunk read is delivered after the one-way delay and serialized at
//! the rate per direction (the model is in `net_emu/mod.rs`). `TCP_NODELAY` is set on
//! both sides. Prints `delay proxy listening on ADDR -> TARGET` per listener, first.
//!
//! Several `--listen A --target B` pairs may be given (one per worker): the connecting
//! side of every pair is then taken to be one machine (the coordinator) whose interface
//! all of them share — its partials to, and sums from, several workers queue on one
//! link, as on a switch port. `--separate-clients` gives every pair its own instead.
//! `--rate-mbit 0` is unlimited.

#[allow(dead_code)]
mod net_emu;

use net_emu::{LinkParams, Net};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

const USAGE: &str = "usage: delay_proxy --listen HOST:PORT --target HOST:PORT [--listen … --target …]… \
                     [--delay-ms D] [--rate-mbit R] [--separate-clients]";

fn main() {
    if let Err(e) = run() {
        eprintln!("delay_proxy: {e}\n{USAGE}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut listens = Vec::new();
    let mut targets = Vec::new();
    let (mut delay_ms, mut rate_mbit, mut separate) = (0.0f64, 0.0f64, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--listen" => listens.push(value("--listen")?),
            "--target" => targets.push(value("--target")?),
            "--delay-ms" => delay_ms = number(&value("--delay-ms")?)?,
            "--rate-mbit" => rate_mbit = number(&value("--rate-mbit")?)?,
            "--separate-clients" => separate = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if listens.is_empty() || listens.len() != targets.len() {
        return Err(format!("{} --listen for {} --target: give them in pairs", listens.len(), targets.len()));
    }
    let net = Net::new(LinkParams::new(delay_ms, rate_mbit));
    let shared_client = net.nic();
    let mut servers = Vec::new();
    let mut out = std::io::stdout().lock();
    for (l, t) in listens.iter().zip(&targets) {
        let target: SocketAddr =
            t.to_socket_addrs().map_err(|e| format!("target {t}: {e}"))?.next().ok_or_else(|| format!("target {t}: no address"))?;
        let listener = TcpListener::bind(l).map_err(|e| format!("listening on {l}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let client = if separate { net.nic() } else { shared_client };
        let server = net.nic();
        writeln!(out, "delay proxy listening on {addr} -> {target} ({delay_ms} ms one way, {rate_mbit} Mbit/s)")
            .and_then(|_| out.flush())
            .map_err(|e| e.to_string())?;
        let net = net.clone();
        servers.push(std::thread::spawn(move || net_emu::serve(listener, target, net, client, server)));
    }
    drop(out);
    for s in servers {
        let _ = s.join();
    }
    Ok(())
}

fn number(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number")),
    }
}
