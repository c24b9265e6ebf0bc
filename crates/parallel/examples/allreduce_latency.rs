//! Allreduce latency over emulated links (issue #6): `N` nodes (threads) joined by
//! loopback TCP connections that each pass through an in-process delay link
//! (`net_emu`: one-way delay, per-node interface serialized at the rate), running
//! [`Star`] and [`Ring`] allreduces of `S` f32 elements with the f32 and Q8_0 wires.
//!
//! ```sh
//! cargo run --release -p hearth-parallel --example allreduce_latency -- \
//!     --nodes 2,3,4 --elems 576,4096 --delay-ms 1,5 --rate-mbit 300 --reps 30
//! ```
//!
//! Every repetition starts on all nodes together (a barrier); its time is the slowest
//! node's (the moment every node holds the sum). Prints one Markdown row per
//! configuration: the median ms per allreduce over the repetitions, and the latency
//! model of `hearth_parallel`'s crate docs with `S_bytes` the frame bytes actually
//! sent (34-byte header included) and `B = R/8`:
//!
//! - star: `2τ + 2(N−1)·S_bytes/B`
//! - ring: `2(N−1)·τ + 2(N−1)·C_bytes/B`, `C_bytes` the frame of the largest ring chunk
//!   (`≈ S_bytes/N`, so `≈ 2(N−1)/N·S_bytes/B`).
//!
//! `--direct` adds rows over plain loopback sockets (no emulated link): the software
//! cost alone.

#[allow(dead_code)]
mod net_emu;

use hearth_parallel::{ring_chunks, AllReduce, Peer, Ring, Star, WireType, DEFAULT_TIMEOUT};
use net_emu::{linked_pair, LinkParams, Net};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: allreduce_latency [--nodes 2,3,4] [--elems 576,4096] [--delay-ms 1,5] [--rate-mbit 300] \
                     [--reps 30] [--warmup 3] [--wire f32,q8_0] [--algo star,ring] [--direct]";

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Opts {
    nodes: Vec<usize>,
    elems: Vec<usize>,
    delays: Vec<f64>,
    rate_mbit: f64,
    reps: usize,
    warmup: usize,
    wires: Vec<WireType>,
    algos: Vec<String>,
    direct: bool,
}

fn list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>, String> {
    s.split(',').map(|x| x.trim().parse::<T>().map_err(|_| format!("{what}: bad value {x:?}"))).collect()
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        nodes: vec![2, 3, 4],
        elems: vec![576, 4096],
        delays: vec![1.0, 5.0],
        rate_mbit: 300.0,
        reps: 30,
        warmup: 3,
        wires: vec![WireType::F32, WireType::Q8_0],
        algos: vec!["star".into(), "ring".into()],
        direct: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--direct" {
            o.direct = true;
            continue;
        }
        if a == "-h" || a == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--nodes" => o.nodes = list(&v, "--nodes")?,
            "--elems" => o.elems = list(&v, "--elems")?,
            "--delay-ms" => o.delays = list(&v, "--delay-ms")?,
            "--rate-mbit" => o.rate_mbit = v.parse().map_err(|_| format!("--rate-mbit: bad value {v:?}"))?,
            "--reps" => o.reps = v.parse().map_err(|_| format!("--reps: bad value {v:?}"))?,
            "--warmup" => o.warmup = v.parse().map_err(|_| format!("--warmup: bad value {v:?}"))?,
            "--wire" => o.wires = v.split(',').map(|w| w.trim().parse::<WireType>()).collect::<Result<_, _>>()?,
            "--algo" => o.algos = list(&v, "--algo")?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.nodes.iter().any(|&n| n < 2) || o.reps == 0 {
        return Err("need --nodes ≥ 2 and --reps ≥ 1".into());
    }
    if let Some(a) = o.algos.iter().find(|a| *a != "star" && *a != "ring") {
        return Err(format!("--algo: {a:?} is neither star nor ring"));
    }
    Ok(o)
}

/// Bytes of one `Partial` frame of `n` elements.
fn frame_bytes(n: usize, wire: WireType) -> usize {
    34 + match wire {
        WireType::F32 => 4 * n,
        WireType::Q8_0 => 34 * n.div_ceil(32),
    }
}

/// The model's prediction in seconds (`None` link: direct, no prediction).
fn predict(algo: &str, n: usize, elems: usize, wire: WireType, p: &LinkParams) -> f64 {
    let tau = p.delay.as_secs_f64();
    let b = if p.rate_bps > 0.0 { p.rate_bps / 8.0 } else { f64::INFINITY };
    let steps = 2.0 * (n - 1) as f64;
    if algo == "star" {
        2.0 * tau + steps * frame_bytes(elems, wire) as f64 / b
    } else {
        let chunk = ring_chunks(elems, n).iter().map(|r| r.len()).max().unwrap_or(0);
        steps * (tau + frame_bytes(chunk, wire) as f64 / b)
    }
}

type Group = Vec<Box<dyn AllReduce>>;

/// `n` nodes of `algo` whose connections go through `net` (`None`: plain loopback).
fn build(algo: &str, n: usize, wire: WireType, net: Option<&Arc<Net>>) -> Result<Group, Error> {
    let Some(net) = net else {
        return Ok(if algo == "star" {
            hearth_parallel::loopback::star(n, wire, DEFAULT_TIMEOUT)?.into_iter().map(|s| Box::new(s) as Box<dyn AllReduce>).collect()
        } else {
            hearth_parallel::loopback::ring(n, wire, DEFAULT_TIMEOUT)?.into_iter().map(|s| Box::new(s) as Box<dyn AllReduce>).collect()
        });
    };
    let nics: Vec<_> = (0..n).map(|_| net.nic()).collect();
    if algo == "star" {
        let mut at_master = Vec::new();
        let mut at_worker = Vec::new();
        for i in 1..n {
            let (w, m) = linked_pair(net, nics[i], nics[0])?;
            at_master.push(Peer::new(m, i, DEFAULT_TIMEOUT)?);
            at_worker.push(Peer::new(w, 0, DEFAULT_TIMEOUT)?);
        }
        let mut g: Group = vec![Box::new(Star::master(at_master, wire)?)];
        for (i, p) in at_worker.into_iter().enumerate() {
            g.push(Box::new(Star::worker(i + 1, n, p, wire)?));
        }
        Ok(g)
    } else {
        // Link i → i+1: node i's `next`, node (i+1)'s `prev`.
        let mut nexts = Vec::new();
        let mut prevs: Vec<Option<Peer>> = (0..n).map(|_| None).collect();
        for i in 0..n {
            let j = (i + 1) % n;
            let (a, b) = linked_pair(net, nics[i], nics[j])?;
            nexts.push(Peer::new(a, j, DEFAULT_TIMEOUT)?);
            prevs[j] = Some(Peer::new(b, i, DEFAULT_TIMEOUT)?);
        }
        let mut g: Group = Vec::new();
        for (i, (next, prev)) in nexts.into_iter().zip(prevs).enumerate() {
            let prev = prev.ok_or("ring link missing")?;
            g.push(Box::new(Ring::new(i, n, next, prev, wire)?));
        }
        Ok(g)
    }
}

/// Per repetition, the slowest node's seconds. A failed allreduce or a wrong sum ends
/// the process (the other nodes would wait at the barrier forever).
fn run(group: Group, elems: usize, wire: WireType, warmup: usize, reps: usize) -> Vec<f64> {
    let n = group.len();
    let barrier = Arc::new(Barrier::new(n));
    let value = |j: usize, node: usize| ((j * 7 + node * 13) % 29) as f32 * 0.25 - 3.0;
    let per_node: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(node, mut ar)| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    let input: Vec<f32> = (0..elems).map(|j| value(j, node)).collect();
                    let want: Vec<f32> = (0..elems).map(|j| (0..n).map(|k| value(j, k)).sum()).collect();
                    // Exact in f32 (multiples of 1/4); Q8_0 within a few steps of amax/127.
                    let tol = if wire == WireType::F32 { 1e-6 } else { 0.1 * n as f32 };
                    let mut buf = input.clone();
                    let mut times = Vec::with_capacity(reps);
                    for rep in 0..warmup + reps {
                        buf.copy_from_slice(&input);
                        barrier.wait();
                        let t = Instant::now();
                        let r = ar.allreduce(&mut buf);
                        let dt = t.elapsed().as_secs_f64();
                        if let Err(e) = r {
                            eprintln!("node {node}: allreduce failed: {e}");
                            std::process::exit(1);
                        }
                        if rep >= warmup {
                            times.push(dt);
                        }
                        if let Some(j) = (0..elems).find(|&j| (buf[j] - want[j]).abs() > tol) {
                            eprintln!("node {node}: element {j} is {} instead of {}", buf[j], want[j]);
                            std::process::exit(1);
                        }
                    }
                    times
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("node thread")).collect()
    });
    (0..reps).map(|r| per_node.iter().map(|t| t[r]).fold(0.0, f64::max)).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("allreduce_latency: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    println!("| τ ms | rate Mbit/s | algo | wire | N | S elems | frame B | median ms | p10–p90 ms | model ms | measured − model ms |");
    println!("|---:|---:|---|---|---:|---:|---:|---:|---|---:|---:|");
    let mut links: Vec<Option<f64>> = Vec::new();
    if o.direct {
        links.push(None);
    }
    links.extend(o.delays.iter().map(|&d| Some(d)));
    for link in links {
        for &elems in &o.elems {
            for &n in &o.nodes {
                for algo in &o.algos {
                    for &wire in &o.wires {
                        let params = link.map(|d| LinkParams::new(d, o.rate_mbit));
                        let net = params.map(Net::new);
                        let group = match build(algo, n, wire, net.as_ref()) {
                            Ok(g) => g,
                            Err(e) => {
                                eprintln!("{algo} N={n} S={elems} {wire}: setting up: {e}");
                                std::process::exit(1);
                            }
                        };
                        let mut t = run(group, elems, wire, o.warmup, o.reps);
                        let med = median(&mut t) * 1e3;
                        let (p10, p90) = (t[t.len() / 10] * 1e3, t[(t.len() * 9 / 10).min(t.len() - 1)] * 1e3);
                        let (delay, rate, model, diff) = match params {
                            Some(p) => {
                                let m = predict(algo, n, elems, wire, &p) * 1e3;
                                (
                                    format!("{}", link.unwrap_or(0.0)),
                                    format!("{}", o.rate_mbit),
                                    format!("{m:.3}"),
                                    format!("{:+.3}", med - m),
                                )
                            }
                            None => ("direct".into(), "-".into(), "-".into(), "-".into()),
                        };
                        println!(
                            "| {delay} | {rate} | {algo} | {wire} | {n} | {elems} | {} | {med:.3} | {p10:.3}–{p90:.3} | {model} | {diff} |",
                            frame_bytes(elems, wire),
                        );
                        // Let the relay threads of this group wind down before the next.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
    }
}
