//! Star and ring allreduce over loopback TCP, one thread per node.

use hearth_parallel::{loopback, AllReduce, CommError, CommStats, Peer, Star, WireType};
use rand::{Rng, SeedableRng};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

fn inputs(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| (0..len).map(|_| rng.gen_range(-4.0f32..4.0)).collect()).collect()
}

/// Sum in node order, as the star master does.
fn ordered_sum(xs: &[Vec<f32>]) -> Vec<f32> {
    let mut acc = xs[0].clone();
    for x in &xs[1..] {
        for (a, v) in acc.iter_mut().zip(x) {
            *a += v;
        }
    }
    acc
}

/// Run `rounds` allreduces on every node (round r uses inputs seeded r); returns each
/// node's buffers per round and stats.
fn run_group<A: AllReduce + 'static>(group: Vec<A>, len: usize, rounds: u64) -> Vec<Vec<(Vec<f32>, CommStats)>> {
    let n = group.len();
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(i, mut a)| {
            thread::spawn(move || {
                assert_eq!(a.node(), i);
                assert_eq!(a.n_nodes(), n);
                (0..rounds)
                    .map(|r| {
                        let mut buf = inputs(n, len, r)[i].clone();
                        let st = a.allreduce(&mut buf).expect("allreduce");
                        (buf, st)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

const T: Duration = Duration::from_secs(10);

#[test]
fn star_f32_is_bit_identical_to_node_order_sum() {
    for n in 1..=5 {
        for len in [1, 576, 4097, 40_000] {
            let out = run_group(loopback::star(n, WireType::F32, T).unwrap(), len, 3);
            for r in 0..3 {
                let want = ordered_sum(&inputs(n, len, r));
                for (node, rounds) in out.iter().enumerate() {
                    assert!(
                        rounds[r as usize].0.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "n {n} len {len} round {r} node {node}"
                    );
                }
            }
            // traffic: each worker sends and receives one frame of len f32 + 34 B
            if n > 1 {
                let frame = (34 + 4 * len) as u64;
                let (_, st0) = &out[0][0];
                assert_eq!(st0.bytes_received, (n as u64 - 1) * frame);
                assert_eq!(st0.bytes_sent, (n as u64 - 1) * frame);
                let (_, st1) = &out[1][0];
                assert_eq!((st1.bytes_sent, st1.bytes_received), (frame, frame));
                assert!(st1.seconds > 0.0);
            }
        }
    }
}

#[test]
fn ring_f32_matches_sum_and_all_nodes_agree() {
    for n in 1..=5 {
        // 40_000 f32 chunks exceed the inline-send size at small n: exercises the
        // threaded send.
        for len in [1, 576, 4097, 40_000] {
            let out = run_group(loopback::ring(n, WireType::F32, T).unwrap(), len, 2);
            for r in 0..2 {
                let xs = inputs(n, len, r);
                let want = ordered_sum(&xs);
                let first = &out[0][r as usize].0;
                for (node, rounds) in out.iter().enumerate() {
                    let got = &rounds[r as usize].0;
                    assert_eq!(got, first, "nodes disagree: n {n} len {len} node {node}");
                    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                        let scale: f32 = xs.iter().map(|x| x[k].abs()).sum();
                        assert!((a - b).abs() <= 4.0 * f32::EPSILON * scale * n as f32, "{a} vs {b}");
                    }
                }
            }
        }
    }
}

/// Per element bound for Q8_0: each quantization errs by at most half a step
/// (amax/254 of its 32-block) plus the f16 rounding of the scale (127·2⁻¹¹·d ≈
/// amax/2048); partial sums are quantized at most N times on their way, the final sum
/// once more.
fn q8_bound(xs: &[Vec<f32>], k: usize) -> f32 {
    let b = k / 32 * 32;
    let amax: f32 = xs.iter().map(|x| x[b..(b + 32).min(x.len())].iter().fold(0f32, |m, v| m.max(v.abs()))).sum();
    (xs.len() as f32 + 1.0) * amax * (1.0 / 254.0 + 1.0 / 2048.0) + 1e-6
}

#[test]
fn q8_0_wire_within_quantization_error() {
    for n in 1..=5 {
        for len in [5, 576, 4100] {
            for ring in [false, true] {
                let out = if ring {
                    run_group(loopback::ring(n, WireType::Q8_0, T).unwrap(), len, 1)
                } else {
                    run_group(loopback::star(n, WireType::Q8_0, T).unwrap(), len, 1)
                };
                let xs = inputs(n, len, 0);
                let want = ordered_sum(&xs);
                let first = &out[0][0].0;
                for rounds in &out {
                    assert_eq!(&rounds[0].0, first, "all nodes must hold the same values (ring {ring}, n {n})");
                }
                let mut worst = 0f32;
                for (k, (a, b)) in first.iter().zip(&want).enumerate() {
                    let bound = q8_bound(&xs, k);
                    assert!((a - b).abs() <= bound, "ring {ring} n {n} k {k}: {a} vs {b} (bound {bound})");
                    worst = worst.max((a - b).abs());
                }
                if n > 1 {
                    assert!(worst > 0.0, "Q8_0 should not be exact");
                    if !ring {
                        // one frame of 34-byte blocks each way
                        let frame = 34 + 34 * len.div_ceil(32) as u64;
                        let st = &out[1][0].1;
                        assert_eq!((st.bytes_sent, st.bytes_received), (frame, frame));
                    }
                }
            }
        }
    }
}

/// Node `dead` does one allreduce, then drops its sockets while the others start the
/// second: they must fail within 5 s with an error naming it.
fn closing_peer<A: AllReduce + 'static>(group: Vec<A>, dead: usize) {
    let n = group.len();
    let start = Instant::now();
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(i, mut a)| {
            thread::spawn(move || {
                let mut buf = vec![1.0f32; 1000];
                a.allreduce(&mut buf).expect("first allreduce");
                assert_eq!(buf[0], n as f32);
                if i == dead {
                    drop(a);
                    return None;
                }
                let mut buf = vec![1.0f32; 1000];
                let e = a.allreduce(&mut buf).expect_err("second allreduce must fail");
                // The group stays broken.
                let again = a.allreduce(&mut buf).expect_err("broken");
                assert!(matches!(again, CommError::Broken { .. }), "{again}");
                Some((e, start.elapsed()))
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        if let Some((e, took)) = h.join().unwrap() {
            assert_eq!(e.failed_node(), Some(dead), "node {i} blamed the wrong node: {e}");
            assert!(e.to_string().contains(&format!("node {dead}")), "{e}");
            // A report relayed around a ring or by the star's root is passed on as
            // its original text, not nested once per hop.
            assert!(e.to_string().matches("reported by").count() <= 1, "node {i}: {e}");
            assert!(took < Duration::from_secs(5), "node {i} took {took:?}: {e}");
        }
    }
}

#[test]
fn star_peer_closing_is_named() {
    for n in 2..=5 {
        for dead in 0..n {
            closing_peer(loopback::star(n, WireType::F32, T).unwrap(), dead);
        }
    }
}

#[test]
fn ring_peer_closing_is_named() {
    for n in 2..=5 {
        for dead in 0..n {
            closing_peer(loopback::ring(n, WireType::F32, T).unwrap(), dead);
        }
    }
}

#[test]
fn star_silent_peer_times_out_and_is_named() {
    // Node `dead` keeps its sockets open but never calls allreduce.
    let timeout = Duration::from_millis(500);
    for (n, dead) in [(2, 1), (3, 2), (4, 1), (3, 0)] {
        let group = loopback::star(n, WireType::F32, timeout).unwrap();
        let start = Instant::now();
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(i, mut a)| {
                thread::spawn(move || {
                    if i == dead {
                        thread::sleep(Duration::from_millis(1500));
                        return None;
                    }
                    let mut buf = vec![1.0f32; 64];
                    Some(a.allreduce(&mut buf).expect_err("must time out"))
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            if let Some(e) = h.join().unwrap() {
                assert_eq!(e.failed_node(), Some(dead), "n {n} node {i}: {e}");
            }
        }
        assert!(start.elapsed() < Duration::from_secs(4));
    }
}

#[test]
fn ring_silent_peer_times_out() {
    let timeout = Duration::from_millis(500);
    let group = loopback::ring(3, WireType::F32, timeout).unwrap();
    let start = Instant::now();
    let handles: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(i, mut a)| {
            thread::spawn(move || {
                if i == 1 {
                    thread::sleep(Duration::from_millis(1500));
                    return None;
                }
                let mut buf = vec![1.0f32; 64];
                Some(a.allreduce(&mut buf).expect_err("must time out"))
            })
        })
        .collect();
    for h in handles {
        if let Some(e) = h.join().unwrap() {
            assert!(e.failed_node().is_some(), "{e}");
        }
    }
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn mismatched_lengths_and_wire_types_are_protocol_errors() {
    let group = loopback::star(2, WireType::F32, T).unwrap();
    let h: Vec<_> = group
        .into_iter()
        .enumerate()
        .map(|(i, mut a)| thread::spawn(move || a.allreduce(&mut vec![1.0f32; 10 + i]).map(|_| ())))
        .collect();
    let r: Vec<_> = h.into_iter().map(|h| h.join().unwrap()).collect();
    let e = r[0].as_ref().unwrap_err();
    assert!(e.to_string().contains("protocol error") && e.to_string().contains("11 elements"), "{e}");
    assert!(r[1].is_err());

    // a Q8_0 worker against an f32 master
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (m, _) = l.accept().unwrap();
    let mut master = Star::master(vec![Peer::new(m, 1, T).unwrap()], WireType::F32).unwrap();
    let mut worker = Star::worker(1, 2, Peer::new(w, 0, T).unwrap(), WireType::Q8_0).unwrap();
    let t = thread::spawn(move || worker.allreduce(&mut [1.0; 64]).map(|_| ()));
    let e = master.allreduce(&mut [1.0; 64]).unwrap_err();
    assert!(e.to_string().contains("q8_0"), "{e}");
    assert_eq!(e.failed_node(), Some(1));
    let we = t.join().unwrap().unwrap_err();
    assert_eq!(we.failed_node(), Some(1), "{we}");
}

#[test]
fn setup_errors() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (m, _) = l.accept().unwrap();
    // worker numbered 2 in a group of 2
    assert!(matches!(Star::master(vec![Peer::new(m, 2, T).unwrap()], WireType::F32), Err(CommError::Setup(_))));
    assert!(matches!(Star::worker(0, 2, Peer::new(w, 0, T).unwrap(), WireType::F32), Err(CommError::Setup(_))));
}

#[test]
fn stats_accumulate_over_calls() {
    let out = run_group(loopback::star(3, WireType::F32, T).unwrap(), 100, 4);
    let total = out[2].iter().fold(CommStats::default(), |a, (_, s)| a + *s);
    assert_eq!(total.bytes_sent, 4 * (34 + 400));
}

#[test]
fn garbage_from_a_peer_is_an_error_naming_it() {
    use std::io::Write;
    for garbage in [&[0xffu8, 0xff, 0xff, 0xff, 6][..], &[1, 0, 0, 0, 200], &[3, 0, 0]] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (m, _) = l.accept().unwrap();
        let mut master = Star::master(vec![Peer::new(m, 1, T).unwrap()], WireType::F32).unwrap();
        w.write_all(garbage).unwrap();
        drop(w); // the truncated case ends with a close
        let start = Instant::now();
        let e = master.allreduce(&mut [0.0; 8]).unwrap_err();
        assert_eq!(e.failed_node(), Some(1), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        let text = e.to_string();
        assert!(
            text.contains("exceeds the maximum") || text.contains("unknown message type") || text.contains("closed"),
            "{text}"
        );
    }
}
