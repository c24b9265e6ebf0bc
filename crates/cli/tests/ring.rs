//! Pipelined-ring parallelism across processes on loopback (issue #7): `hearth worker`
//! daemons of unequal thread counts and memory budgets, and `hearth generate --parallel
//! ring` with explicit windows (k = 1 to 6 rounds) or the layer solver's. Every device
//! runs whole layers on f32 activations, so greedy tokens must be exactly one machine's.

mod common;

use common::{addrs, assert_clean_error, cache_dir, model, ok, tokens, Worker};
use std::process::{Command, Stdio};
use std::time::Duration;

const PROMPT: &str = "The three primary colors are red, blue and";

fn generate(extra: &[&str]) -> std::process::Output {
    common::generate_json(PROMPT, &[&["-c", "256"], extra].concat())
}

#[test]
fn ring_tokens_match_single_node_for_several_windows_and_rounds() {
    let m = model();
    let single = tokens(&ok(generate(&[])));
    assert_eq!(single.len(), 20);
    let w_a = Worker::start(&m, &[]);
    let w_b = Worker::start(&m, &["-t", "2"]);
    // 56 MiB: less than its layers (12 of 2.1 MiB) + KV + scratch + runtime, so it streams.
    let w_c = Worker::start(&m, &["--mem-budget", "56MiB"]);
    // SmolLM2 has 30 layers: (windows, workers, k)
    let cases: Vec<(&str, String, u64)> = vec![
        ("15,15", addrs(&[&w_a]), 1),
        ("2,4,4", addrs(&[&w_a, &w_b]), 3),
        ("1,1,2,1", addrs(&[&w_a, &w_b, &w_c]), 6),
        // the coordinator only embeds and samples; the worker under a budget takes 12 layers
        ("0,5,5,5", addrs(&[&w_a, &w_b, &w_c]), 2),
        // a worker given no layers leaves the ring
        ("3,0,7", addrs(&[&w_a, &w_b]), 3),
    ];
    for (windows, workers, k) in cases {
        let out = generate(&["--workers", &workers, "--parallel", "ring", "--layer-window", windows]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let v = ok(out);
        assert_eq!(tokens(&v), single, "--layer-window {windows}: {err}");
        let ring = &v["ring"];
        assert_eq!(ring["k"], k, "{ring}");
        let in_ring = windows.split(',').enumerate().filter(|&(i, w)| i == 0 || w != "0").count();
        assert_eq!(ring["devices"].as_array().unwrap().len(), in_ring, "{ring}");
        assert!(v["tensor_parallel"].is_null());
        if windows == "0,5,5,5" {
            // the budgeted worker streamed its layers: it waited for its disk reads
            let c = &ring["devices"][3];
            assert!(c["disk_wait_ms"].as_f64().unwrap() > 0.0, "{ring}: {err}");
        }
        if windows == "3,0,7" {
            assert!(err.contains("left out (given no layers)"), "{err}");
            assert!(err.contains("note: the ring runs on 2 of 3 devices"), "{err}");
        }
    }
    // The solver's choice (each worker profiles itself on first request): same tokens,
    // and a prediction to compare with.
    let out = generate(&["--workers", &addrs(&[&w_a, &w_b, &w_c]), "--parallel", "ring"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let v = ok(out);
    assert_eq!(tokens(&v), single, "{err}");
    assert!(err.contains("solver: predicted TPOT"), "{err}");
    assert!(v["ring"]["predicted_tpot_ms"].as_f64().unwrap() > 0.0, "{}", v["ring"]);
}

#[test]
fn bad_ring_flags_are_clear_errors() {
    let m = model();
    let w = Worker::start(&m, &[]);
    assert_clean_error(&generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "4,4"]), "multiple of");
    assert_clean_error(&generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "0,0"]), "gives no device any layers");
    assert_clean_error(&generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "4,4,4"]), "3 values for 2 devices");
    assert_clean_error(&generate(&["--workers", &w.addr, "--layer-window", "15,15"]), "--parallel ring");
    assert_clean_error(&generate(&["--workers", &w.addr, "--parallel", "ring", "--tp-schedule", "gather"]), "tensor parallelism");
    assert_clean_error(&generate(&["--parallel", "ring"]), "--workers");
    assert_clean_error(
        &generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "18446744073709551615,1"]),
        "more than the model's 30 layers",
    );
    // a ring left with one device: said plainly, or refused with --require-all-workers
    assert_clean_error(
        &generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "30,0", "--require-all-workers"]),
        "the ring is one device, this machine alone",
    );
    // ... or a worker alone: this machine was said to be the one device (new-user pass)
    let w2 = Worker::start(&m, &[]);
    assert_clean_error(
        &generate(&["--workers", &addrs(&[&w, &w2]), "--parallel", "ring", "--layer-window", "0,30,0", "--require-all-workers"]),
        &format!("the ring is one device, worker {}, and this machine runs no layers", w.addr),
    );
    drop(w2);
    // the worker is still fine
    let single = tokens(&ok(generate(&[])));
    // (spaces after the commas were refused)
    assert_eq!(tokens(&ok(generate(&["--workers", &w.addr, "--parallel", "ring", "--layer-window", "10, 20"]))), single);
    // the same ring from a cluster file
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ring-cluster.toml");
    std::fs::write(&file, format!("parallel = \"ring\"\nlayer_window = 5\n[[worker]]\naddr = \"{}\"\nlayer_window = 10\n", w.addr))
        .unwrap();
    let v = ok(generate(&["--cluster", file.to_str().unwrap()]));
    assert_eq!((tokens(&v), v["ring"]["k"].as_u64()), (single, Some(2)));
    // --parallel tensor over a ring file: the flag wins, and the message says so (it
    // asked to add parallel = "ring", which the file had)
    assert_clean_error(
        &generate(&["--cluster", file.to_str().unwrap(), "--parallel", "tensor"]),
        "--parallel tensor overrides the cluster file",
    );
    std::fs::write(&file, format!("parallel = \"ring\"\nlayer_window = 5\n[[worker]]\naddr = \"{}\"\n", w.addr)).unwrap();
    assert_clean_error(&generate(&["--cluster", file.to_str().unwrap()]), "or for none");
    std::fs::write(&file, format!("parallel = \"ring\"\nweight = 2.0\n[[worker]]\naddr = \"{}\"\n", w.addr)).unwrap();
    assert_clean_error(&generate(&["--cluster", file.to_str().unwrap()]), "weight in the cluster file");
    std::fs::write(&file, format!("parallel = \"ring\"\nwire_type = \"q8_0\"\n[[worker]]\naddr = \"{}\"\n", w.addr)).unwrap();
    assert_clean_error(&generate(&["--cluster", file.to_str().unwrap()]), "q8_0 wire type");
}

#[test]
fn a_killed_ring_worker_fails_the_request_within_5_s_naming_it_and_the_next_request_replans() {
    let m = model();
    // Node 1 dies: node 2 finds its incoming link closed and reports it around the ring,
    // through node 3, to the coordinator. Node 2 once named node 1 by the ephemeral port
    // of that link, node 3 said node 1 "refused the session" and the coordinator "reported
    // by node 3" (new-user pass).
    let logs: Vec<_> = (1..=3).map(|i| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ring-kill-{i}.log"))).collect();
    let log = |i: usize| -> std::process::Stdio { std::fs::File::create(&logs[i]).unwrap().into() };
    let listen = ["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()];
    let mut w1 = Worker::spawn(&listen, log(0));
    let w2 = Worker::spawn(&listen, log(1));
    let w3 = Worker::spawn(&listen, log(2));
    let workers = addrs(&[&w1, &w2, &w3]);
    let ms = m.to_str().unwrap();
    let args = [
        "generate",
        "-m",
        ms,
        "-p",
        PROMPT,
        "-n",
        "1500",
        "--ignore-eos",
        "--temperature",
        "0",
        "-t",
        "1",
        "--workers",
        &workers,
        "--parallel",
        "ring",
        "--layer-window",
        "3,3,2,2",
    ];
    // Tokens stream, then node 1 is killed.
    let out = common::kill_mid_generation(&args, &mut w1);
    common::assert_failed_naming(&out, 1, &w1.addr);
    let err = &out.2;
    assert!(!err.contains("reported by node 3") && !err.contains("refused"), "{err}");
    // Every address in the reports is one the user gave.
    let read = |i: usize| std::fs::read_to_string(&logs[i]).unwrap();
    let start = std::time::Instant::now();
    while !(read(1).contains("session failed") && read(2).contains("session failed")) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (l2, l3) = (read(1), read(2));
    assert!(l2.contains(&format!("session failed: node 1 ({})", w1.addr)), "{l2}");
    assert!(l3.contains(&format!("session failed: node 1 failed: node 2 lost its link from node 1: node 1 ({})", w1.addr)), "{l3}");
    for text in [err.as_str(), &l2, &l3] {
        for (i, _) in text.match_indices("127.0.0.1:") {
            let port: String = text[i + 10..].chars().take_while(|c| c.is_ascii_digit()).collect();
            let a = format!("127.0.0.1:{port}");
            // (the workers' logs start each line with the coordinator's address)
            let coordinator = text[..i].ends_with("coordinator ");
            assert!(coordinator || [&w1.addr, &w2.addr, &w3.addr].contains(&&a), "{a} is no worker's address: {text}");
        }
    }
    // The next request over the remaining workers is planned anew and gives one machine's tokens.
    let single = tokens(&ok(generate(&[])));
    assert_eq!(tokens(&ok(generate(&["--workers", &addrs(&[&w2, &w3]), "--parallel", "ring"]))), single);
}

#[test]
fn plan_and_profile_measure_running_workers() {
    let m = model();
    let log1 = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan-probe-1.log");
    let w1 = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log1).unwrap().into());
    let w2 = Worker::start(&m, &["--mem-budget", "200MiB"]);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .env("HEARTH_CACHE_DIR", cache_dir())
            .env_remove("HEARTH_MODEL")
            .env_remove("HEARTH_CLUSTER_KEY")
            .output()
            .unwrap()
    };
    let ms = m.to_str().unwrap();
    // The solver's ring over the running workers, without running it.
    let v =
        ok(run(&["plan", "-m", ms, "-c", "256", "-t", "1", "-p", "32", "--workers", &addrs(&[&w1, &w2]), "--parallel", "ring", "--json"]));
    let windows: Vec<u64> = v["windows"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).collect();
    assert_eq!(windows.len(), 3, "{v}");
    assert_eq!(30 % windows.iter().sum::<u64>(), 0, "{v}");
    assert!(v["predicted_ms_per_token"].as_f64().unwrap() > 0.0 && v["predicted_ttft_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["devices"].as_array().unwrap().len(), 3, "{v}");
    // Windows given as generate takes them: predicted, not replaced by the solver's; bad
    // ones, a worker left out under --require-all-workers, and serve's slots refused.
    let plan = ["plan", "-m", ms, "-c", "256", "-t", "1", "-p", "32", "--workers", &addrs(&[&w1, &w2]), "--parallel", "ring"];
    let v = ok(run(&[&plan[..], &["--layer-window", "5,5,5", "--json"]].concat()));
    assert_eq!(v["windows"], serde_json::json!([5, 5, 5]), "{v}");
    assert_eq!(v["k"], 2, "{v}");
    // (After the line on where this machine's profile came from.)
    let fails = |extra: &[&str], want: &str| {
        let o = run(&[&plan[..], extra].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want) && !err.contains("panicked"), "{want}: {err}");
    };
    fails(&["--layer-window", "7,7,7"], "must be a multiple of that");
    fails(&["--layer-window", "0,0,0"], "gives no device any layers");
    fails(&["--layer-window", "15,15"], "2 values for 3 devices");
    fails(&["--layer-window", "10,20,0", "--require-all-workers"], "gets no layers");
    assert_clean_error(&run(&["plan", "-m", ms, "--workers", &addrs(&[&w1]), "--parallel", "4"]), "applies to `hearth serve`");
    // The links to both workers: round trip and throughput.
    let p = ok(run(&["profile", "-m", ms, "--quick", "-t", "1", "--types", "q4_0", "--json", "--peer", &addrs(&[&w1, &w2])]));
    let links = p["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "{p}");
    for (l, w) in links.iter().zip([&w1, &w2]) {
        assert_eq!(l["peer"], w.addr.as_str());
        assert!(l["rtt_ms"].as_f64().unwrap() > 0.0 && l["mbit"].as_f64().unwrap() > 0.0, "{l}");
    }
    // A worker that is not there: a clear error.
    assert_clean_error(&run(&["profile", "-m", ms, "--quick", "-t", "1", "--types", "q4_0", "--peer", "127.0.0.1:9"]), "cannot connect");
    // The worker saw plans and probes, not failed sessions (a plan dropped its connections
    // without a word, and the worker logged "session failed: node 0 ... closed").
    drop(w1);
    let log = std::fs::read_to_string(&log1).unwrap();
    assert!(!log.contains("session failed") && log.matches("left without opening a session").count() >= 5, "{log}");
}

#[test]
fn plans_and_profiles_leave_a_running_session_alone() {
    // `profile --peer` and `plan --parallel ring` against a worker that was generating for
    // another coordinator took it over: the generation failed with "another coordinator
    // took over this worker" (new-user pass).
    let m = model();
    let log1 = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("probe-busy-1.log");
    let w1 = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log1).unwrap().into());
    let w2 = Worker::start(&m, &[]);
    let (ms, list) = (m.to_str().unwrap(), addrs(&[&w1, &w2]));
    let args = ["generate", "-m", ms, "-p", "Once upon a time", "-n", "600", "--ignore-eos", "-t", "1"];
    let (coord, out) = common::started_generation(
        &[&args[..], &["--workers", &list, "--parallel", "ring", "--layer-window", "10,10,10"]].concat(),
        Stdio::piped(),
    );
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).env("HEARTH_CACHE_DIR", cache_dir()).output().unwrap();
    ok(run(&["profile", "-m", ms, "--quick", "-t", "1", "--types", "q4_0", "--json", "--peer", &w1.addr]));
    let plan = run(&["plan", "-m", ms, "-c", "256", "--workers", &list, "--parallel", "ring"]);
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
    // Still generating after both probes, then done.
    common::drain(out);
    let done = coord.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success() && !err.contains("took over"), "{err}");
    drop(w1);
    let log = std::fs::read_to_string(&log1).unwrap();
    assert!(!log.contains("replaces the session") && log.matches("left without opening a session").count() == 2, "{log}");
}

#[test]
fn a_stalled_ring_worker_fails_the_request_without_blaming_the_wrong_device() {
    let m = model();
    let w1 = Worker::start(&m, &[]);
    let log2 = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ring-stall-2.log");
    let w2 = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log2).unwrap().into());
    let ms = m.to_str().unwrap();
    let workers = addrs(&[&w1, &w2]);
    let args = ["generate", "-m", ms, "-p", PROMPT, "-n", "1500", "--ignore-eos", "--temperature", "0", "-t", "1", "--step-timeout", "1"];
    let args = [&args[..], &["--workers", &workers, "--parallel", "ring", "--layer-window", "10,10,10"]].concat();
    let pid = w1.child.id().to_string();
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    let (status, took, err) = common::interrupt_mid_generation(&args, || signal("-STOP"));
    signal("-CONT");
    assert_eq!(status, Some(1), "{err}");
    // one step timeout per worker the hop crosses, scaled for the batch
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(err.contains("the ring stalled") && err.contains(&w1.addr) && err.contains(&w2.addr), "{err}");
    // The failed request reaches the devices as an error, not as a Shutdown that each
    // logged as "session ended after N forward passes" (new-user pass).
    let start = std::time::Instant::now();
    let read = || std::fs::read_to_string(&log2).unwrap();
    while !read().contains("session ") && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = read();
    assert!(log.contains("session failed") && log.contains("the coordinator ended the session after an error: the ring stalled"), "{log}");
}

#[test]
fn ring_workers_say_when_the_coordinator_vanished_mid_request() {
    // A coordinator killed mid-run looked like a clean end in every ring worker's log
    // ("session ended after N forward passes"), unlike in tensor mode (new-user pass).
    let m = model();
    let logs: Vec<_> = (1..=2).map(|i| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ring-vanish-{i}.log"))).collect();
    let ws: Vec<Worker> = logs
        .iter()
        .map(|l| Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(l).unwrap().into()))
        .collect();
    let list = addrs(&ws.iter().collect::<Vec<_>>());
    let args = ["generate", "-m", m.to_str().unwrap(), "-p", "Once upon a time", "-n", "2000", "--ignore-eos", "-c", "4096", "-t", "1"];
    // Some tokens out, then the coordinator dies without a word.
    let (mut coord, _out) = common::started_generation(
        &[&args[..], &["--workers", &list, "--parallel", "ring", "--layer-window", "10,10,10"]].concat(),
        Stdio::null(),
    );
    coord.kill().unwrap();
    coord.wait().unwrap();
    let start = std::time::Instant::now();
    let read = |l: &std::path::Path| std::fs::read_to_string(l).unwrap();
    while logs.iter().any(|l| !read(l).contains("forward passes") && !read(l).contains("session failed"))
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(ws);
    let (first, second) = (read(&logs[0]), read(&logs[1]));
    assert!(first.contains("connection closed without a shutdown"), "{first}");
    // An idle worker no longer holds the weights it mapped (its 10 layers: 21 MiB of the
    // file) in its RSS: once 29 MiB file-backed, now only its code.
    let file_mib: f64 = first
        .split("(now ")
        .nth(1)
        .and_then(|r| r.split(" MiB file-backed").next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no file-backed RSS in {first}"));
    assert!(file_mib < 20.0, "{first}");
    assert!(!second.contains("session ended") && second.contains("session failed"), "{second}");
    // ... and blames the coordinator, not the healthy first device whose link closed.
    assert!(second.contains("lost the coordinator") && !second.contains("lost its link from node 1"), "{second}");
    // (It read "node 0 failed: node 1 lost the coordinator".)
    assert!(!second.contains("node 0 failed"), "{second}");
}

#[test]
fn one_worker_listed_under_two_names_is_refused_before_it_takes_itself_over() {
    // `--workers 127.0.0.1:P,localhost:P` passed the listed-twice check (the strings
    // differ), and the worker's second session took over its first (new-user pass).
    use std::net::ToSocketAddrs;
    let m = model();
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("two-names.log");
    let w = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log).unwrap().into());
    let port = w.addr.rsplit(':').next().unwrap();
    let socket = w.addr.to_socket_addrs().unwrap().next();
    let alias = ["localhost", "127.1"]
        .into_iter()
        .map(|h| format!("{h}:{port}"))
        .find(|a| a.to_socket_addrs().ok().and_then(|mut s| s.next()) == socket)
        .expect("a second name for 127.0.0.1");
    let list = format!("{},{alias}", w.addr);
    let ms = m.to_str().unwrap();
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_hearth")).args(args).env("HEARTH_CACHE_DIR", cache_dir()).output().unwrap();
    let gen = ["generate", "-m", ms, "-p", PROMPT, "-n", "4", "-t", "1", "--workers", &list];
    for mode in [&["--parallel", "ring", "--layer-window", "10,10,10"][..], &["--parallel", "tensor"]] {
        assert_clean_error(&run(&[&gen[..], mode].concat()), "are one worker");
    }
    assert_clean_error(&run(&["plan", "-m", ms, "--workers", &list, "--parallel", "ring"]), "are one worker");
    assert_clean_error(&run(&["profile", "-m", ms, "--quick", "-t", "1", "--types", "q4_0", "--peer", &list]), "are one worker");
    drop(w);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("replaces the session") && !log.contains("took over"), "{log}");
    // The second connection, closed before the handshake, is not a failed session.
    assert!(log.contains("closed the connection before a word") && !log.contains("closed the connection while"), "{log}");
    // Its first session heard why it would not open (it logged that the coordinator had
    // exited, or left without opening one).
    assert!(log.matches("session failed: the coordinator could not set up the session: workers").count() >= 3, "{log}");
}

#[test]
fn a_ring_workers_peak_rss_is_the_same_in_every_session() {
    // A worker's first session peaked at 73 MiB and every later one at 105 MiB: glibc's
    // dynamic mmap threshold moved the next context's buffers into the arena, where
    // calloc clears them (helper finding, issue #21).
    let m = model();
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ring-peaks.log");
    let w = Worker::spawn(&["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap()], std::fs::File::create(&log).unwrap().into());
    for _ in 0..3 {
        ok(common::generate_json(PROMPT, &["-c", "4096", "--workers", &w.addr, "--parallel", "ring", "--layer-window", "15,15"]));
    }
    let start = std::time::Instant::now();
    let read = || std::fs::read_to_string(&log).unwrap();
    while read().matches("session ended").count() < 3 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = read();
    let peaks: Vec<f64> = log
        .split("worker peak RSS this session ")
        .skip(1)
        .map(|r| r.split(" MiB").next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{log}")))
        .collect();
    assert_eq!(peaks.len(), 3, "{log}");
    let (lo, hi) = peaks.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &p| (lo.min(p), hi.max(p)));
    assert!(hi - lo < 4.0, "peaks {peaks:?} MiB: {log}");
}

#[test]
fn a_second_coordinator_takes_a_ring_device_over_and_the_first_hears_from_which_device() {
    // The first coordinator read "node 1 lost the coordinator: it closed the connection
    // without a shutdown" (relayed by node 2, blaming node 0: itself), and `hearth serve`
    // answered that request 500 instead of re-planning (leftover since session 29).
    let m = model();
    let ms = m.to_str().unwrap();
    let (w1, w2) = (Worker::start(&m, &[]), Worker::start(&m, &[]));
    let args = ["generate", "-m", ms, "-p", "Once upon a time", "-n", "3000", "--ignore-eos", "-c", "4096", "-t", "1"];
    let ring = ["--workers", &addrs(&[&w1, &w2]), "--parallel", "ring", "--layer-window", "10,10,10"];
    let (first, out) = common::started_generation(&[&args[..], &ring].concat(), Stdio::piped());
    common::drain(out);
    ok(common::generate_json("Hi", &["--workers", &w1.addr, "--parallel", "ring", "--layer-window", "15,15"]));
    let first = first.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("node 1 ({}): another coordinator (", w1.addr)) && err.contains("took over this worker"), "{err}");
    assert!(!err.contains("lost the coordinator"), "{err}");
}
