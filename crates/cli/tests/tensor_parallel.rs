//! Tensor parallelism across processes on loopback: `hearth worker` daemons and a
//! `hearth generate --workers …` coordinator (issue #6).

mod common;

use common::{addrs, assert_clean_error, cache_dir, hearth, model, model_sha, ok, tokens, Worker};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "The three primary colors are red, blue and";

fn generate(extra: &[&str]) -> std::process::Output {
    common::generate_json(PROMPT, extra)
}

#[test]
fn greedy_tokens_match_single_node_for_2_3_and_4_nodes() {
    let m = model();
    let single = tokens(&ok(generate(&[])));
    assert_eq!(single.len(), 20);
    let ws: Vec<Worker> = (0..3).map(|_| Worker::start(&m, &[])).collect();
    let cases: Vec<(String, Vec<&str>)> = vec![
        (addrs(&[&ws[0]]), vec![]),
        (addrs(&[&ws[0], &ws[1]]), vec![]),
        // uneven: this machine 3 parts, node 1 one part (no KV head), node 2 two parts
        (addrs(&[&ws[0], &ws[1]]), vec!["--node-weights", "3,1,2"]),
        // 4 nodes > SmolLM2's 3 KV heads: one node computes only its FFN share
        (addrs(&[&ws[0], &ws[1], &ws[2]]), vec![]),
        // the coordinator computes nothing of the blocks
        (addrs(&[&ws[0], &ws[1], &ws[2]]), vec!["--node-weights", "0,1,1,1"]),
    ];
    for (workers, extra) in cases {
        // The gather schedule is exact: the same tokens as one node, always.
        let mut args = vec!["--workers", workers.as_str(), "--tp-schedule", "gather"];
        args.extend(extra.iter().copied());
        let out = generate(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let v = ok(out);
        assert_eq!(tokens(&v), single, "{args:?}: {err}");
        let n_nodes = workers.split(',').count() + 1;
        let tp = &v["tensor_parallel"];
        assert_eq!(tp["nodes"], n_nodes as u64);
        // 30 blocks × 4 exchanges per forward pass (one prefill pass, 19 decode passes)
        assert_eq!(tp["allreduces"], 120 * tp["passes"].as_u64().unwrap());
        // Every node reports its decode split (workers answer StatsRequest between passes).
        let nodes = tp["decode_nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), n_nodes);
        assert!(nodes[1..].iter().all(|r| r["kb_sent_per_token"].as_f64().unwrap() > 0.0), "{nodes:?}");
        if n_nodes == 4 && extra.is_empty() {
            assert!(err.contains("1 node without a KV head") && err.contains("it computes only its FFN share"), "{err}");
        }
        if extra.contains(&"0,1,1,1") {
            assert!(err.contains("with no KV heads and no FFN rows computes nothing"), "{err}");
        }
    }
    // The same split from a cluster file (this machine's weight, then each worker's).
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-test.toml");
    let toml =
        format!("weight = 3.0\n[[worker]]\naddr = \"{}\"\nweight = 1.0\n[[worker]]\naddr = \"{}\"\nweight = 2.0\n", ws[0].addr, ws[1].addr);
    std::fs::write(&file, toml).unwrap();
    let out = generate(&["--cluster", file.to_str().unwrap(), "--tp-schedule", "gather"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(tokens(&ok(out)), single);
    assert!(err.contains("node 1") && err.contains("KV heads none"), "weights 3:1:2 leave node 1 without a KV head: {err}");
    std::fs::write(&file, "[[worker]]\nadress = \"x\"\n").unwrap();
    assert_clean_error(&generate(&["--cluster", file.to_str().unwrap()]), "unknown field");

    // The sum schedule (the default): two allreduces per block; its rounding differs
    // from one node's (crates/parallel/tests/tensor_split.rs measures by how much).
    let sum = ok(generate(&["--workers", &addrs(&[&ws[0], &ws[1]])]));
    assert_eq!(tokens(&sum).len(), 20);
    assert_eq!(sum["tensor_parallel"]["allreduces"], 60 * sum["tensor_parallel"]["passes"].as_u64().unwrap());
    // Q8_0 partial sums: a quarter of the bytes; tokens may drift, the run must complete.
    let f32_bytes = ok(generate(&["--workers", &ws[0].addr]))["tensor_parallel"]["bytes_sent"].as_u64().unwrap();
    let q8 = ok(generate(&["--workers", &ws[0].addr, "--wire-type", "q8_0"]));
    let q8_bytes = q8["tensor_parallel"]["bytes_sent"].as_u64().unwrap();
    assert_eq!(tokens(&q8).len(), 20);
    assert!(q8_bytes * 3 < f32_bytes, "q8_0 {q8_bytes} vs f32 {f32_bytes}");
}

#[test]
fn a_killed_worker_fails_the_request_within_5_s_naming_it_and_the_rest_still_serve() {
    let m = model();
    let w1 = Worker::start(&m, &[]);
    let mut w2 = Worker::start(&m, &[]);
    let workers = addrs(&[&w1, &w2]);
    let ms = m.to_str().unwrap();
    let args = ["generate", "-m", ms, "-p", PROMPT, "-n", "1500", "--ignore-eos", "--temperature", "0", "-t", "1", "--workers", &workers];
    // Tokens stream, then node 2 is killed.
    let out = common::kill_mid_generation(&args, &mut w2);
    common::assert_failed_naming(&out, 2, &w2.addr);

    // The next request with the remaining worker succeeds, with the single-node tokens.
    let single = tokens(&ok(generate(&[])));
    assert_eq!(tokens(&ok(generate(&["--workers", &w1.addr, "--tp-schedule", "gather"]))), single);
}

#[test]
fn bad_peers_get_clear_errors_and_the_worker_survives() {
    let m = model();
    let keyed = Worker::start(&m, &["--cluster-key", "s3cret"]);
    // no key, wrong key, right key
    assert_clean_error(&generate(&["--workers", &keyed.addr]), "requires a cluster key");
    assert_clean_error(&generate(&["--workers", &keyed.addr, "--cluster-key", "wrong"]), "node 1");
    let single = tokens(&ok(generate(&[])));
    let keyed_run = |extra: &[&str]| {
        tokens(&ok(generate(&[&["--workers", &keyed.addr, "--cluster-key", "s3cret", "--tp-schedule", "gather"], extra].concat())))
    };
    assert_eq!(keyed_run(&[]), single);

    // garbage and a huge length prefix on the socket: the worker drops that connection only
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xff, 0xff, 0xff, 0x7f, 1, 2, 3][..], &[0, 0, 0, 0][..]] {
        let mut s = std::net::TcpStream::connect(&keyed.addr).unwrap();
        std::io::Write::write_all(&mut s, junk).unwrap();
        let _ = s.read(&mut [0u8; 64]);
    }
    assert_eq!(keyed_run(&[]), single);

    // a worker holding another file (same model plus trailing bytes): refused by hash
    let other = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-other.gguf");
    let mut bytes = std::fs::read(&m).unwrap();
    bytes.extend_from_slice(&[0u8; 64]);
    std::fs::write(&other, bytes).unwrap();
    let w_other = Worker::start(&other, &[]);
    assert_clean_error(&generate(&["--workers", &w_other.addr]), "model mismatch");
    // ... and by `profile --peer`, which named it only as "node 1" (new-user pass)
    let probe = hearth(&["profile", "-m", m.to_str().unwrap(), "--quick", "-t", "1", "--types", "q4_0", "--peer", &w_other.addr]);
    assert_clean_error(&probe, "model mismatch");
    assert!(String::from_utf8_lossy(&probe.stderr).contains(&format!("worker {}", w_other.addr)), "{probe:?}");

    // beyond loopback without a key: a loud warning
    let mut open = Worker::spawn(&["--listen", "0.0.0.0:0", "-m", m.to_str().unwrap()], Stdio::piped());
    let _ = open.child.kill();
    let mut warn = String::new();
    open.child.stderr.take().unwrap().read_to_string(&mut warn).unwrap();
    assert!(warn.contains("WARNING") && warn.contains("WITHOUT a cluster key"), "{warn}");

    // nobody listening
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    assert_clean_error(&generate(&["--workers", &dead]), "cannot connect");
    // bad flags
    assert_clean_error(&hearth(&["generate", "-p", "x", "--workers", "127.0.0.1:1", "--node-weights", "1,2,3"]), "--node-weights");
    assert_clean_error(&hearth(&["generate", "-p", "x", "--workers", "127.0.0.1:1,127.0.0.1:1"]), "listed twice");
    assert_clean_error(&hearth(&["generate", "-p", "x", "--workers", "localhost"]), "not HOST:PORT");
    assert_clean_error(&hearth(&["generate", "-p", "x", "--tp-schedule", "gather"]), "add --workers");
    assert_clean_error(&generate(&["--workers", &dead]), "is `hearth worker` running");
}

#[test]
fn chat_re_splits_over_the_remaining_workers_when_one_dies() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let m = model();
    let w1 = Worker::start(&m, &[]);
    let mut w2 = Worker::start(&m, &[]);
    let mut chat = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["chat", "-m", m.to_str().unwrap(), "-n", "8", "--temperature", "0", "-t", "1"])
        .args(["--workers", &addrs(&[&w1, &w2])])
        .env("HEARTH_CACHE_DIR", cache_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = Arc::new(Mutex::new(String::new()));
    let mut stderr = chat.stderr.take().unwrap();
    let sink = err.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let wait_for = |what: &str, count: usize| {
        let t = Instant::now();
        while err.lock().unwrap().matches(what).count() < count {
            assert!(t.elapsed() < Duration::from_secs(60), "waiting for {what:?} ×{count}: {}", err.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut stdin = chat.stdin.take().unwrap();
    wait_for("> ", 1);
    writeln!(stdin, "Hello").unwrap();
    wait_for("> ", 2);
    w2.child.kill().unwrap();
    let _ = w2.child.wait();
    writeln!(stdin, "What is 2+2?").unwrap();
    wait_for("dropping node 2", 1);
    wait_for("> ", 3);
    writeln!(stdin, "What is 2+2?").unwrap();
    wait_for("> ", 4);
    writeln!(stdin, "/exit").unwrap();
    let out = chat.wait_with_output().unwrap();
    let e = err.lock().unwrap().clone();
    assert!(out.status.success(), "{e}");
    assert!(e.contains("re-splitting over 2 node(s)"), "{e}");
    assert_eq!(e.matches("error:").count(), 1, "only the failed turn errs: {e}");
}

#[test]
fn a_worker_without_the_model_file_gets_its_shard_once() {
    let m = model();
    let sha = model_sha(&m);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shard-cache-test");
    let _ = std::fs::remove_dir_all(&cache);
    let start =
        || Worker::spawn(&["--listen", "127.0.0.1:0", "--model-sha256", &sha, "--shard-cache", cache.to_str().unwrap()], Stdio::null());
    let single = tokens(&ok(generate(&[])));
    let w = start();
    let run = |w: &Worker| {
        let out = generate(&["--workers", &w.addr, "--tp-schedule", "gather"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (tokens(&ok(out)), err)
    };
    let (t, err) = run(&w);
    assert_eq!(t, single);
    assert!(err.contains("sending it"), "first session sends the shard: {err}");
    // A restarted worker finds it in its cache.
    drop(w);
    let w = start();
    let (t, err) = run(&w);
    assert_eq!(t, single);
    assert!(!err.contains("sending it"), "the cached shard is reused: {err}");
    // A damaged cache entry is noticed (by hash) and fetched again.
    let shard = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "gguf")).unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0xff;
    std::fs::write(&shard, bytes).unwrap();
    let (t, err) = run(&w);
    assert_eq!(t, single);
    assert!(err.contains("sending it"), "a damaged shard is sent again: {err}");
    // Another model's coordinator is refused.
    let other = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-other-2.gguf");
    let mut bytes = std::fs::read(&m).unwrap();
    bytes.extend_from_slice(&[1u8; 64]);
    std::fs::write(&other, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["generate", "-m", other.to_str().unwrap(), "-p", "Hi", "-n", "2", "--workers", &w.addr])
        .env("HEARTH_CACHE_DIR", cache_dir())
        .output()
        .unwrap();
    assert_clean_error(&out, "model mismatch");
}

#[test]
fn a_worker_under_a_memory_budget_streams_its_shard() {
    let m = model();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shard-cache-budget");
    let w = Worker::start(&m, &["--mem-budget", "64MiB", "--shard-cache", cache.to_str().unwrap()]);
    let single = tokens(&ok(generate(&["-c", "512"])));
    let v = ok(generate(&["-c", "512", "--workers", &w.addr, "--tp-schedule", "gather"]));
    assert_eq!(tokens(&v), single);
}

#[test]
fn every_node_holds_only_its_share_of_the_kv_cache_and_a_worker_gives_a_sessions_heap_back() {
    // A worker kept its largest session's buffers while idle (glibc's arenas keep freed
    // memory): 81 MiB anonymous after an 8192-token session, 18 MiB after a 512-token one.
    // And it allocated the whole model's KV cache before cutting it to its heads: with
    // no KV heads at 8192 tokens it peaked at 264 MiB (new-user passes, session 27).
    let m = model();
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("idle-heap.log");
    let w = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log).unwrap().into());
    let mut coordinator = Vec::new();
    for (c, weights) in [("512", "1,1"), ("8192", "1,1"), ("8192", "1,0"), ("8192", "0,1")] {
        let v = ok(generate(&["--workers", &w.addr, "-c", c, "--node-weights", weights]));
        coordinator.push(v["peak_rss_bytes"].as_f64().unwrap() / (1 << 20) as f64);
    }
    // The coordinator likewise: with no KV heads at 8192 tokens it peaked at 208 MiB.
    assert!(coordinator[3] <= coordinator[0] + 32.0, "coordinator peak MiB of each session {coordinator:?}");
    // "... session ended ...; worker peak RSS this session P MiB (now F MiB file-backed, A MiB anonymous)"
    let field = |after: &str| -> Vec<f64> {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines().filter_map(|l| l.split(after).nth(1)?.split(' ').next()?.parse().ok()).collect()
    };
    let start = Instant::now();
    while field(" file-backed, ").len() < 4 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(w);
    let (anon, peak) = (field(" file-backed, "), field("worker peak RSS this session "));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(anon.len() == 4 && anon[1] <= anon[0] + 16.0, "anonymous MiB after each session {anon:?}: {text}");
    // The whole cache at 8192 tokens is 180 MiB (f16); this worker's share is none of it.
    assert!(peak.len() == 4 && peak[2] <= peak[0] + 32.0, "peak MiB of each session {peak:?}: {text}");
}

#[test]
fn plan_with_workers_shows_the_shares_a_tensor_parallel_run_uses() {
    // `plan --workers` printed a ring plan whatever --parallel said; then the gather
    // schedule's weight bytes were the sum schedule's (new-user passes, session 27).
    let m = model();
    let ws = [Worker::start(&m, &[]), Worker::start(&m, &[])];
    let list = addrs(&ws.iter().collect::<Vec<_>>());
    let mib = |v: &serde_json::Value| format!("{:.1} MiB", v.as_f64().unwrap() / (1024.0 * 1024.0));
    for schedule in ["sum", "gather"] {
        let flags = ["--workers", &list, "--node-weights", "3,1,2", "--tp-schedule", schedule];
        let plan = ok(hearth(&[&["plan", "-m", m.to_str().unwrap(), "--json"], &flags[..]].concat()));
        assert_eq!((plan["parallel"].as_str(), plan["schedule"].as_str()), (Some("tensor"), Some(schedule)), "{plan}");
        let out = generate(&flags);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        ok(out);
        for (i, node) in plan["nodes"].as_array().unwrap().iter().enumerate() {
            // (An empty share reads "none".)
            let span = |r: &serde_json::Value| if r[0] == r[1] { "none".to_string() } else { format!("{}..{}", r[0], r[1]) };
            let (h, f) = (span(&node["kv_heads"]), span(&node["ffn_rows"]));
            let mut want = format!("KV heads {h}, FFN rows {f}, {} of block weights", mib(&node["weight_bytes"]));
            if i > 0 {
                want += &format!(", KV cache {}", mib(&node["kv_cache_bytes"]));
            }
            assert!(err.contains(&want), "{schedule}: plan says node {i} has {want:?}; the run: {err}");
        }
    }
    // generate refuses a tensor-parallel coordinator's --mem-budget; plan ignored it
    assert_clean_error(&hearth(&["plan", "-m", m.to_str().unwrap(), "--workers", &list, "--mem-budget", "1GiB"]), "not supported yet");
    let text = String::from_utf8_lossy(&hearth(&["plan", "-m", m.to_str().unwrap(), "--workers", &list]).stdout).to_string();
    assert!(text.contains("tensor-parallel plan for 30 layers over 3 nodes") && text.contains("60 round trips"), "{text}");
}

#[test]
fn plan_with_workers_counts_sliding_window_layers_kv_as_the_context_allocates_it() {
    // Gemma 3's sliding-window layers keep a ring, not n_ctx positions: the tensor-parallel
    // plan counted every position (144 MiB at 8192 tokens against the 39 MiB allocated).
    let g = common::gemma3();
    let g = g.to_str().unwrap();
    let one = ok(hearth(&["plan", "-m", g, "-c", "8192", "--membw", "10", "--json"]));
    let tp = ok(hearth(&["plan", "-m", g, "-c", "8192", "--workers", "127.0.0.1:9", "--node-weights", "0,1", "--json"]));
    // The worker holds every KV head: the one-machine cache.
    assert_eq!(tp["nodes"][1]["kv_cache_bytes"], one["kv_cache_bytes"], "{tp}\n{one}");
    assert_eq!(tp["nodes"][0]["kv_cache_bytes"], 0, "{tp}");
}

#[test]
fn a_second_coordinator_takes_the_worker_over_and_the_first_hears_from_which_worker() {
    // The first coordinator read "node 1 failed (reported by node 1): another coordinator
    // took over this worker": no failure, and no address (new-user pass).
    let m = model();
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("takeover.log");
    let w = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log).unwrap().into());
    let args =
        ["generate", "-m", m.to_str().unwrap(), "-p", PROMPT, "-n", "3000", "--ignore-eos", "-c", "4096", "-t", "1", "--workers", &w.addr];
    let (first, out) = common::started_generation(&args, Stdio::piped());
    common::drain(out);
    ok(generate(&["--workers", &w.addr]));
    let first = first.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("node 1 ({}): another coordinator (", w.addr)) && err.contains("took over this worker"), "{err}");
    assert!(!err.contains("failed (reported by"), "{err}");
    // The worker's log said the old coordinator had "exited or was stopped".
    drop(w);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("session ended: another coordinator (") && !log.contains("without a shutdown"), "{log}");
}
