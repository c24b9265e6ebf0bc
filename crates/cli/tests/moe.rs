//! Mixture-of-experts files (`hearth synth --arch qwen3moe|qwen2moe|mixtral`, Q8_0, tiny) in the
//! modes around the forward pass: batch invariance (eight sequences in one pass, prefills
//! grouped by expert, give each sequence's logits bit for bit as when it runs alone),
//! `hearth serve` batching eight requests, the pipelined ring (with a ring worker under a
//! `--mem-budget`: an expert cache), a `--mem-budget` window and tensor parallelism (each expert split by rows) giving one
//! machine's tokens. A shared expert (qwen2moe): batch invariance, the ring, plan and
//! bench counting it as active every token, tensor parallelism cutting it as a dense FFN.
//! (Agreement with llama.cpp: `arch_reference.rs`.)

mod common;

use common::server::Server;
use common::{addrs, assert_clean_error, hearth, model, ok, tokens, Worker};
use hearth_model::{sampler::argmax, Arch, Context, Logits, Model, Segment};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A Q8_0 file of `arch` (`qwen3moe`, `qwen2moe` or `mixtral`): 8 experts, 2 per token,
/// `n_layer` layers of width `n_embd` (qwen2moe: and a shared expert 128 wide).
fn synth(arch: &str, n_embd: u32, n_layer: u32) -> PathBuf {
    synth_ff(arch, n_embd, n_layer, 256)
}

/// [`synth`] with experts `n_ff` wide (mixtral).
fn synth_ff(arch: &str, n_embd: u32, n_layer: u32, n_ff: u32) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-{arch}-{n_embd}x{n_layer}-{n_ff}.gguf"));
    let (e, l, f) = (n_embd.to_string(), n_layer.to_string(), n_ff.to_string());
    let mut args = vec!["synth", "--arch", arch, "--n-embd", &e, "--n-layer", &l, "--n-head", "4", "--n-head-kv", "2", "--n-ff", &f];
    args.extend(["--n-expert", "8", "--n-expert-used", "2", "--type", "q8_0", "--seed", "5", "-t", "2"]);
    if arch == "qwen3moe" {
        args.extend(["--head-dim", "32", "--n-ff-exp", "64"]);
    }
    if arch == "qwen2moe" {
        args.extend(["--n-ff-exp", "64", "--n-ff-shexp", "128"]);
    }
    let m = model();
    args.extend(["--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let o = hearth(&args);
    assert!(o.status.success(), "{arch}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 4,",
    "def fibonacci(n):",
    "The three primary colors are",
    "My favourite food is",
    "In 1492, Columbus",
    "Water boils at",
];
const STEPS: usize = 6;

/// Greedy tokens and each step's logit bits, the sequence alone.
fn alone(m: &Arc<Model>, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut ctx = Context::new(m.clone(), 256, 64, 2).unwrap();
    let mut logits = ctx.eval(prompt, Logits::Last).unwrap().to_vec();
    let (mut toks, mut bits) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        bits.push(logits.iter().map(|x| x.to_bits()).collect());
        toks.push(argmax(&logits));
        logits = ctx.eval(&[*toks.last().unwrap()], Logits::Last).unwrap().to_vec();
    }
    (toks, bits)
}

#[test]
fn eight_batched_sequences_match_each_alone_bit_for_bit() {
    for (arch, want_arch) in [("qwen3moe", Arch::Qwen3Moe), ("qwen2moe", Arch::Qwen2Moe), ("mixtral", Arch::Mixtral)] {
        let m = Arc::new(Model::load(synth(arch, 128, 2)).unwrap());
        assert_eq!(m.config.arch, want_arch);
        let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| m.tokenizer.encode(p, true, true)).collect();
        let want: Vec<_> = prompts.iter().map(|p| alone(&m, p)).collect();
        // Every prompt in one pass (slots in reverse order), then every decode step in one pass.
        let mut ctx = Context::new(m.clone(), 256, 64, 2).unwrap();
        ctx.set_slots(8).unwrap();
        let n = prompts.len();
        let mut got: Vec<(Vec<u32>, Vec<Vec<u32>>)> = vec![Default::default(); n];
        let mut feed: Vec<Vec<u32>> = prompts.clone();
        for _ in 0..STEPS {
            let segs: Vec<Segment> = feed.iter().enumerate().map(|(i, t)| Segment { slot: n - 1 - i, tokens: t, logits: 1 }).collect();
            let logits = ctx.eval_batch(&segs).unwrap().to_vec();
            let v = m.config.n_vocab;
            for (i, g) in got.iter_mut().enumerate() {
                let lg = &logits[i * v..(i + 1) * v];
                g.1.push(lg.iter().map(|x| x.to_bits()).collect());
                g.0.push(argmax(lg));
                feed[i] = vec![argmax(lg)];
            }
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.0, w.0, "{arch} prompt {i}: greedy tokens differ in a batch");
            assert!(g.1 == w.1, "{arch} prompt {i}: logits are not bit-identical in a batch");
        }
        // The prompts chose different experts (else grouping was never exercised).
        assert!(got.iter().any(|g| g.0 != got[0].0), "{arch}: every prompt gave the same tokens");
    }
}

#[test]
fn serve_batches_eight_moe_requests_with_the_tokens_each_gets_alone() {
    let m = synth("qwen3moe", 128, 2);
    let s = Server::start_model(&m, &["--parallel", "8", "-c", "256"]);
    let greedy = |p: &str| {
        let (st, r) = s.post("/v1/completions", &json!({"prompt": p, "max_tokens": 12, "temperature": 0, "logprobs": 0}));
        assert_eq!(st, 200, "{r}");
        r["choices"][0]["logprobs"].clone()
    };
    let alone: Vec<_> = PROMPTS.iter().map(|p| greedy(p)).collect();
    let together: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = PROMPTS.iter().map(|p| sc.spawn(|| greedy(p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "prompt {i} ({:?}) differs when batched with the others", PROMPTS[i]);
    }
    let metrics = s.get("/metrics");
    let bucket = |le: &str| -> u64 {
        let line = metrics.lines().find_map(|l| l.strip_prefix(&format!("hearth_batch_sequences_bucket{{le=\"{le}\"}} ")));
        line.unwrap().trim().parse().unwrap()
    };
    assert!(bucket("+Inf") > bucket("1"), "no step ran more than one sequence:\n{metrics}");
}

/// `hearth generate --json`, 16 greedy tokens of `m` with `extra` flags.
fn generate(m: &Path, extra: &[&str]) -> std::process::Output {
    let p = "The three primary colors are red, blue and";
    let args = ["-m", m.to_str().unwrap(), "-p", p, "-n", "16", "--temperature", "0", "--ignore-eos", "-t", "1", "-c", "256", "--json"];
    common::generate_cmd(&[&args[..], extra].concat())
}

#[test]
fn ring_mem_budget_and_tensor_parallel_give_one_machines_tokens() {
    // 8 layers of 256: 57 MB, so a 50 MiB budget streams its layers.
    let m = synth("mixtral", 256, 8);
    let single = tokens(&ok(generate(&m, &[])));
    assert_eq!(single.len(), 16);
    let v = ok(generate(&m, &["--mem-budget", "50MiB"]));
    assert_eq!(tokens(&v), single, "--mem-budget");
    assert!(v["window"]["decode_io"]["bytes_read"].as_u64().unwrap() > 0, "the budget run read no layers: {}", v["window"]);
    let ws: Vec<Worker> = (0..2).map(|_| Worker::start(&m, &[])).collect();
    let workers = addrs(&[&ws[0], &ws[1]]);
    let v = ok(generate(&m, &["--workers", &workers, "--parallel", "ring", "--layer-window", "2,4,2"]));
    assert_eq!(tokens(&v), single, "ring");
    // Tensor parallel: each expert split by rows over the three nodes. The gather
    // schedule is exact: one machine's tokens. Per layer: attention's two exchanges, the
    // router logits, and per run of experts their SwiGLU rows, then the sums.
    let o = generate(&m, &["--workers", &workers, "--tp-schedule", "gather"]);
    // The split table counts each node's rows of every expert: the nodes' block weights
    // add up to at least the experts' bytes (8 layers · 8 experts · gate, up, down of
    // 256 × 256 at Q8_0's 34 bytes per 32), not one expert's share.
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let held: f64 = err
        .lines()
        .filter(|l| l.trim_start().starts_with("node "))
        .filter_map(|l| l.split(", ").find_map(|p| p.strip_suffix(" MiB of block weights")).and_then(|x| x.parse::<f64>().ok()))
        .sum();
    let experts_mib = (8 * 8 * 3 * 256 * 256 / 32 * 34) as f64 / (1 << 20) as f64;
    assert!(
        held >= experts_mib && held < experts_mib * 1.5,
        "the nodes hold {held} MiB of block weights, the experts are {experts_mib:.2} MiB: {err}"
    );
    let v = ok(o);
    assert_eq!(tokens(&v), single, "tensor parallel, gather schedule");
    let (passes, exchanges) = (v["tensor_parallel"]["passes"].as_u64().unwrap(), v["tensor_parallel"]["allreduces"].as_u64().unwrap());
    assert!(exchanges >= 8 * 5 * passes, "{} exchanges in {passes} passes", exchanges);
    // The sum schedule reassociates the down products (rounding): the run completes,
    // with three exchanges per layer (attention, router logits, the experts' sums).
    let v = ok(generate(&m, &["--workers", &workers, "--tp-schedule", "sum"]));
    assert_eq!(tokens(&v).len(), 16);
    assert_eq!(v["tensor_parallel"]["allreduces"], 8 * 3 * v["tensor_parallel"]["passes"].as_u64().unwrap());
    // A worker without the file gets its shard file (each expert's cut of the stacked
    // gate, up and down, end to end; the router whole) from the coordinator, once, and
    // caches it; a worker under a budget cuts its own and keeps an expert cache of cuts
    // over it (it streamed whole shard blocks). Both give one machine's tokens (a MoE
    // model had no shard files: both were refused).
    let sha = common::model_sha(&m);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-shard-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let no_file = Worker::spawn(
        &["--listen", "127.0.0.1:0", "--model-sha256", &sha, "--shard-cache", cache.to_str().unwrap()],
        std::process::Stdio::null(),
    );
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-shard-budget-worker.log");
    let budgeted = Worker::spawn(
        &["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap(), "--mem-budget", "47MiB", "--shard-cache", cache.to_str().unwrap()],
        std::fs::File::create(&log).unwrap().into(),
    );
    let o = generate(&m, &["--workers", &addrs(&[&no_file, &budgeted]), "--tp-schedule", "gather"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(tokens(&ok(o)), single, "shard files: {err}");
    assert!(err.contains("has no copy of its shard: sending it"), "{err}");
    let shards = std::fs::read_dir(&cache).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "gguf")).count();
    assert_eq!(shards, 2, "one shard file per worker in {}", cache.display());
    drop(budgeted);
    let wlog = std::fs::read_to_string(&log).unwrap();
    assert!(wlog.contains("--mem-budget 47.0 MiB: window of") && wlog.contains("expert slots ×"), "{wlog}");
    assert!(wlog.contains("only the experts each token misses read per token"), "{wlog}");
}

#[test]
fn budgeted_workers_at_their_fewest_expert_slots_or_without_experts_give_one_machines_tokens() {
    // A new-user pass found three budget cases failing (session 26): the gather schedule
    // with a worker whose cache held 2-3 experts (it cut its expert runs by its slots, the
    // others did not: "protocol error: expected partial ... got ..."), the sum schedule
    // with a budgeted worker given no FFN rows (its empty expert cuts were read as one
    // expert's rows: "kernel: out length ..."), and a ring head running no layers under
    // --mem-budget ("too small" above the minimum it named).
    let m = synth("qwen2moe", 128, 4);
    let single = tokens(&ok(generate(&m, &[])));
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-fewest-slots-cache");
    let budgeted = |b: &str, log: &str| {
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(log);
        let args = ["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap(), "--mem-budget", b, "--shard-cache", cache.to_str().unwrap()];
        (Worker::spawn(&args, std::fs::File::create(&log).unwrap().into()), log)
    };
    // The smallest budget the worker's share takes: it has k = 2 expert slots.
    let (w, _) = budgeted("42MiB", "moe-fewest-42.log");
    let o = generate(&m, &["--workers", &w.addr, "--tp-schedule", "gather"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    // "need at least 43.9 MiB (45973422 bytes)": the exact bytes (the MiB are rounded up,
    // by as much as 3 of this model's 32 KiB expert slots).
    let min = err
        .split("need at least ")
        .nth(1)
        .and_then(|r| r.split_once('(')?.1.split(' ').next())
        .unwrap_or_else(|| panic!("{err}"))
        .to_string();
    drop(w);
    let (w, log) = budgeted(&min, "moe-fewest-min.log");
    let plain = Worker::start(&m, &[]);
    for schedule in ["gather", "sum"] {
        let v = ok(generate(&m, &["--workers", &w.addr, "--tp-schedule", schedule]));
        if schedule == "gather" {
            assert_eq!(tokens(&v), single, "gather with a worker at {min} bytes");
        }
        // The budgeted worker last with no weight: no FFN rows, no KV heads, no expert bytes.
        let v = ok(generate(&m, &["--workers", &addrs(&[&plain, &w]), "--node-weights", "1,1,0", "--tp-schedule", schedule]));
        if schedule == "gather" {
            assert_eq!(tokens(&v), single, "gather with an idle budgeted worker");
        }
    }
    drop(w);
    let wlog = std::fs::read_to_string(&log).unwrap();
    assert!(wlog.contains("+ 2 expert slots ×"), "{wlog}");
    // And it stays under its budget: its shard shares the loaded model's tokenizer (two
    // of SmolLM2's vocabulary, about 17 MiB each, took it over).
    let budget = min.parse::<f64>().unwrap() / (1u64 << 20) as f64; // MiB, as the log's peaks
    let peaks: Vec<f64> = wlog
        .lines()
        .filter_map(|l| l.split("worker peak RSS this session ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(peaks.len() == 4 && peaks.iter().all(|&p| p <= budget), "peaks {peaks:?} MiB under a {budget} MiB budget: {wlog}");
    // A ring head running no layers under a budget: nothing of experts to cache.
    let v = ok(generate(&m, &["--workers", &addrs(&[&plain]), "--parallel", "ring", "--layer-window", "0,4", "--mem-budget", "60MiB"]));
    assert_eq!(tokens(&v), single, "ring head with no layers under --mem-budget");
}

#[test]
fn a_ring_worker_under_a_budget_keeps_experts_not_layers() {
    // 8 layers of 512 with experts 1024 wide: 13.6 MB of experts a layer (161 MiB in
    // all). The budgeted worker runs layers 4..8 (54 MiB) under 64 MiB: its window holds
    // the four blocks without their experts, and an expert cache the rest.
    let m = synth_ff("mixtral", 512, 8, 1024);
    let single = tokens(&ok(generate(&m, &[])));
    let run = |env: &[(&str, &str)]| {
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-ring-budget-worker.log");
        let a = Worker::start(&m, &[]);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.envs(env.iter().copied());
        let b = Worker::spawn_cmd(
            cmd,
            &["--listen", "127.0.0.1:0", "-m", m.to_str().unwrap(), "--mem-budget", "64MiB"],
            std::fs::File::create(&log).unwrap().into(),
        );
        let v = ok(generate(&m, &["--workers", &addrs(&[&a, &b]), "--parallel", "ring", "--layer-window", "2,2,4"]));
        drop(b);
        (v, std::fs::read_to_string(&log).unwrap())
    };
    let (v, err) = run(&[]);
    assert_eq!(tokens(&v), single, "{err}");
    // It kept experts (it once streamed whole layers on a ring device), and read the ones
    // each token missed.
    assert!(err.contains("expert slots ×") && err.contains("the experts each token misses"), "{err}");
    assert!(v["ring"]["devices"][2]["disk_wait_ms"].as_f64().unwrap() > 0.0, "{}", v["ring"]);
    // Control: the cache handing out the next expert's bytes changes the tokens.
    let (v, err) = run(&[("HEARTH_TEST_WRONG_EXPERT", "1")]);
    assert_ne!(tokens(&v), single, "{err}");
}

#[test]
fn plan_bounds_decode_by_the_routed_experts_bytes() {
    let m = synth("mixtral", 128, 2);
    let p = ok(hearth(&["plan", "-m", m.to_str().unwrap(), "--json"]));
    let info = ok(hearth(&["inspect", m.to_str().unwrap(), "--json"]));
    // From the tensor table: 2-D layer matrices + the head (token_embd: no output.weight
    // is tied; synth writes one) and the stacked experts (3-D).
    let (mut dense, mut experts, mut head) = (0u64, 0u64, 0u64);
    for t in info["tensors"].as_array().unwrap() {
        let (name, dims, bytes) = (t["name"].as_str().unwrap(), t["shape"].as_array().unwrap().len(), t["bytes"].as_u64().unwrap());
        match (name.starts_with("blk."), dims) {
            (true, 2) => dense += bytes,
            (true, 3) => experts += bytes,
            _ if name == "output.weight" => head = bytes,
            _ => {}
        }
    }
    assert!(experts > 0 && head > 0);
    assert_eq!(p["experts"], json!([8, 2]));
    assert_eq!(p["expert_bytes"].as_u64().unwrap(), experts);
    let active = dense + experts * 2 / 8 + head;
    assert_eq!(p["bytes_per_token"].as_u64().unwrap(), active, "active bytes: 2 of 8 experts");
    let bound = p["membw_gbps"].as_f64().unwrap() * 1e9 / active as f64;
    assert!((p["decode_tok_s_bound"].as_f64().unwrap() / bound - 1.0).abs() < 1e-9);
    // bench's roofline counts the same active bytes (it once counted every expert).
    let b = ok(hearth(&["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "2", "-r", "1", "-t", "1", "--membw-mib", "16", "--json"]));
    assert_eq!(b[0]["matrix_bytes"].as_u64().unwrap(), active, "{b}");
    let text = hearth(&["plan", "-m", m.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("mixture of experts: 2 of 8 experts per token"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    // A --shape is dense: refused for a MoE architecture rather than planned without experts.
    assert_clean_error(&hearth(&["plan", "--shape", "7b", "--arch", "qwen3moe"]), "describes a dense model");
}

/// `m` rewritten with metadata key `key` set to `value` (`None`: removed) and tensor
/// `shape_of` (if any) given dims `dims`, into `out`.
fn altered(m: &Path, out: &str, key: &str, value: Option<hearth_gguf::Value>, shape_of: Option<(&str, Vec<u64>)>) -> PathBuf {
    use hearth_gguf::{write_gguf_file, GgufFile, TensorSpec};
    let f = GgufFile::open(m).unwrap();
    let mut meta: Vec<_> = f.metadata().iter().filter(|(k, _)| k != key).cloned().collect();
    meta.extend(value.map(|v| (key.to_string(), v)));
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| {
            let dims = match &shape_of {
                Some((n, d)) if *n == t.name => d.clone(),
                _ => t.dims.clone(),
            };
            TensorSpec { name: t.name.clone(), dims, ty: t.ty }
        })
        .collect();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    write_gguf_file(&path, &meta, &specs, |i, w| {
        let mut b = f.read_tensor(&f.tensors()[i]).unwrap();
        b.resize(specs[i].size().unwrap() as usize, 0);
        w.write_all(&b)
    })
    .unwrap();
    path
}

#[test]
fn hostile_expert_metadata_and_shapes_are_clean_errors() {
    use hearth_gguf::Value;
    let m = synth("qwen3moe", 128, 2);
    let cases: Vec<(PathBuf, &str)> = vec![
        (altered(&m, "moe-bad-count.gguf", "qwen3moe.expert_count", Some(Value::U32(5000)), None), "more than 1024"),
        (altered(&m, "moe-bad-used.gguf", "qwen3moe.expert_used_count", Some(Value::U32(9)), None), "more than the 8 there are"),
        (altered(&m, "moe-zero-used.gguf", "qwen3moe.expert_used_count", Some(Value::U32(0)), None), "expert_used_count"),
        (altered(&m, "moe-no-experts.gguf", "qwen3moe.expert_count", None, None), "qwen3moe needs experts"),
        (altered(&m, "moe-fewer-experts.gguf", "qwen3moe.expert_count", Some(Value::U32(4)), None), "ffn_gate_inp"),
        (altered(&m, "moe-bad-shape.gguf", "general.name", None, Some(("blk.1.ffn_down_exps.weight", vec![64, 128, 4]))), "ffn_down_exps"),
    ];
    // One expert: its router has one row, fewer than synth's threads (this panicked once).
    let one = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-one-expert.gguf");
    let m1 = model();
    let o = hearth(&[
        "synth",
        "--arch",
        "mixtral",
        "--n-embd",
        "64",
        "--n-layer",
        "2",
        "--n-head",
        "4",
        "--n-head-kv",
        "2",
        "--n-ff",
        "64",
        "--n-expert",
        "1",
        "--n-expert-used",
        "1",
        "-t",
        "2",
        "--tokenizer-from",
        m1.to_str().unwrap(),
        "--out",
        one.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(hearth(&["generate", "-m", one.to_str().unwrap(), "-p", "hi", "-n", "2"]).status.success());
    for (path, want) in cases {
        let o = hearth(&["generate", "-m", path.to_str().unwrap(), "-p", "hi", "-n", "1"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", path.display());
        assert!(!err.contains("panicked") && err.contains(want), "{}: expected {want:?} in {err}", path.display());
    }
}

#[test]
fn a_shared_expert_runs_over_the_ring_and_tensor_parallel_and_counts_as_active() {
    let m = synth("qwen2moe", 128, 4);
    let single = tokens(&ok(generate(&m, &[])));
    assert_eq!(single.len(), 16);
    let ws: Vec<Worker> = (0..2).map(|_| Worker::start(&m, &[])).collect();
    let workers = addrs(&[&ws[0], &ws[1]]);
    let v = ok(generate(&m, &["--workers", &workers, "--parallel", "ring", "--layer-window", "1,2,1"]));
    assert_eq!(tokens(&v), single, "ring");
    // Tensor parallelism cuts the shared expert as a dense FFN (its rows in proportion
    // to each node's rows of the routed experts; it was refused). The gather schedule is
    // exact: one machine's tokens; the sum schedule reassociates (rounding) and runs.
    // Control: these tokens depend on the shared expert (the same greedy run in process
    // gives them with it, others without it), so a node's part left out would show.
    let v = ok(generate(&m, &["--workers", &workers, "--tp-schedule", "gather"]));
    assert_eq!(tokens(&v), single, "tensor parallel, gather schedule");
    let v = ok(generate(&m, &["--workers", &workers, "--tp-schedule", "sum"]));
    assert_eq!(tokens(&v).len(), 16);
    let greedy = |strip: bool| {
        let mut model = Model::load(&m).unwrap();
        if strip {
            model.weights.layers.iter_mut().for_each(|l| l.shared = None);
        }
        let model = Arc::new(model);
        let prompt = model.tokenizer.encode("The three primary colors are red, blue and", true, true);
        let mut ctx = Context::new(model, 256, 64, 1).unwrap();
        let mut logits = ctx.eval(&prompt, Logits::Last).unwrap().to_vec();
        let mut toks = Vec::new();
        for _ in 0..16 {
            toks.push(argmax(&logits) as u64);
            logits = ctx.eval(&[argmax(&logits)], Logits::Last).unwrap().to_vec();
        }
        toks
    };
    assert_eq!(greedy(false), single, "in process, with the shared expert");
    assert_ne!(greedy(true), single, "control: without the shared expert the tokens differ");
    // Workers without the file get shard files holding their cut of it.
    let sha = common::model_sha(&m);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-shexp-shard-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let no_file: Vec<Worker> = (0..2)
        .map(|_| {
            let args = ["--listen", "127.0.0.1:0", "--model-sha256", &sha, "--shard-cache", cache.to_str().unwrap()];
            Worker::spawn(&args, std::process::Stdio::null())
        })
        .collect();
    let o = generate(&m, &["--workers", &addrs(&[&no_file[0], &no_file[1]]), "--tp-schedule", "gather"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(tokens(&ok(o)), single, "shard files: {err}");
    assert!(err.contains("has no copy of its shard: sending it"), "{err}");
    // A cached shard file that is whole but holds another cut (as one cut by an older
    // hearth under the same name would): made again, not a failed session. Control: the
    // run failed with "the shard file ... holds ..., not ...".
    let mut shards: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), 2, "{shards:?}");
    let side = |p: &Path| PathBuf::from(format!("{}.sha256", p.display()));
    let (a, b) = (std::fs::read(&shards[0]).unwrap(), std::fs::read(&shards[1]).unwrap());
    let (sa, sb) = (std::fs::read(side(&shards[0])).unwrap(), std::fs::read(side(&shards[1])).unwrap());
    std::fs::write(&shards[0], &b).unwrap();
    std::fs::write(side(&shards[0]), &sb).unwrap();
    std::fs::write(&shards[1], &a).unwrap();
    std::fs::write(side(&shards[1]), &sa).unwrap();
    let o = generate(&m, &["--workers", &addrs(&[&no_file[0], &no_file[1]]), "--tp-schedule", "gather"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(tokens(&ok(o)), single, "swapped shard files: {err}");

    // plan and bench: the shared expert's matrices (2-D) are active every token, the
    // routed experts (3-D) 2 of 8.
    let p = ok(hearth(&["plan", "-m", m.to_str().unwrap(), "--json"]));
    let info = ok(hearth(&["inspect", m.to_str().unwrap(), "--json"]));
    let (mut dense, mut shared, mut experts, mut head) = (0u64, 0u64, 0u64, 0u64);
    for t in info["tensors"].as_array().unwrap() {
        let (name, dims, bytes) = (t["name"].as_str().unwrap(), t["shape"].as_array().unwrap().len(), t["bytes"].as_u64().unwrap());
        match (name.starts_with("blk."), dims) {
            (true, 2) if name.contains("_shexp") => shared += bytes,
            (true, 2) => dense += bytes,
            (true, 3) => experts += bytes,
            _ if name == "output.weight" => head = bytes,
            _ => {}
        }
    }
    // 4 layers of gate, up (128 × 128) and down (128 × 128) at Q8_0.
    assert_eq!(shared, 4 * 3 * 128 * 128 / 32 * 34);
    let active = dense + shared + experts * 2 / 8 + head;
    assert_eq!(p["bytes_per_token"].as_u64().unwrap(), active, "active bytes: the shared expert and 2 of 8 experts");
    // The tensor-parallel plan shows each node's rows of the shared expert: they
    // partition its 128 rows (it was not shown).
    let tp = ok(hearth(&["plan", "-m", m.to_str().unwrap(), "--workers", &workers, "--json"]));
    let cuts: Vec<(u64, u64)> = tp["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["shared_expert_rows"][0].as_u64().unwrap(), n["shared_expert_rows"][1].as_u64().unwrap()))
        .collect();
    assert!(cuts.len() == 3 && cuts[0].0 == 0 && cuts[2].1 == 128 && cuts.windows(2).all(|w| w[0].1 == w[1].0), "{tp}");
    let b = ok(hearth(&["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "2", "-r", "1", "-t", "1", "--membw-mib", "16", "--json"]));
    assert_eq!(b[0]["matrix_bytes"].as_u64().unwrap(), active, "{b}");

    // A shared expert of the wrong shape, and a shared expert's width in an architecture
    // hearth runs without one: clean errors.
    let bad = altered(&m, "moe-bad-shexp.gguf", "general.name", None, Some(("blk.1.ffn_up_shexp.weight", vec![128, 64])));
    assert_clean_error(&generate(&bad, &[]), "ffn_up_shexp");
    let q3 = synth("qwen3moe", 128, 2);
    let key = "qwen3moe.expert_shared_feed_forward_length";
    let q3_shared = altered(&q3, "moe-q3-shexp.gguf", key, Some(hearth_gguf::Value::U32(128)), None);
    assert_clean_error(&generate(&q3_shared, &[]), "issue #21");

    // The Qwen1.5-MoE-A2.7B shape: 24 layers of 2048, 60 experts of 1408 and a shared
    // expert of 5632 (14.3B parameters with Qwen's 151,936-token vocabulary).
    let tok = model();
    let args =
        ["synth", "--arch", "qwen2moe", "--shape", "a2.7b", "--dry-run", "--tokenizer-from", tok.to_str().unwrap(), "--out", "x.gguf"];
    let v = ok(hearth(&args));
    let (e, v_n) = (2048u64, v["n_vocab"].as_u64().unwrap());
    let layer = 2 * e + 4 * e * e + 3 * e + 60 * e + e + 3 * e * 5632 + 60 * 3 * e * 1408;
    assert_eq!(v["n_params"].as_u64().unwrap(), 2 * v_n * e + e + 24 * layer, "{v}");
    assert_eq!((v["n_layer"].as_u64(), v["n_ff"].as_u64(), v["head_dim"].as_u64()), (Some(24), Some(1408), Some(128)), "{v}");
}

/// A NaN in a router (`ffn_gate_inp`) once routed every token to experts 0..k with NaN
/// weights, and generation stopped at its first token without a word: now a one-line
/// error naming the layer and the router.
#[test]
fn a_shared_expert_is_cut_in_proportion_to_the_experts_rows() {
    // Its rows were rounded down to 256 whenever its width was a multiple of 256: over
    // 3 nodes a 256-wide shared expert of Q8_0 went 0 / 0 / 256 (helper finding). Now a
    // width that is a multiple of the experts' is scaled exactly: here 2x their rows.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-qwen2moe-shexp256.gguf");
    let args = ["synth", "--arch", "qwen2moe", "--n-embd", "128", "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2"];
    let more = ["--n-ff", "256", "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp", "128", "--n-ff-shexp", "256"];
    let m = model();
    let tail = ["--type", "q8_0", "--seed", "7", "-t", "2", "--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap()];
    ok_status(&hearth(&[&args[..], &more, &tail].concat()));
    let ws: Vec<Worker> = (0..2).map(|_| Worker::start(&out, &[])).collect();
    let workers = addrs(&[&ws[0], &ws[1]]);
    let tp = ok(hearth(&["plan", "-m", out.to_str().unwrap(), "--workers", &workers, "--json"]));
    let range = |v: &serde_json::Value| (v[0].as_u64().unwrap(), v[1].as_u64().unwrap());
    let nodes = tp["nodes"].as_array().unwrap();
    let mut nonempty = 0;
    for n in nodes {
        let ((f0, f1), (s0, s1)) = (range(&n["ffn_rows"]), range(&n["shared_expert_rows"]));
        assert_eq!((s0, s1), (2 * f0, 2 * f1), "{tp}");
        nonempty += usize::from(s1 > s0);
    }
    assert!(nonempty >= 2, "{tp}");
    // And a run with that cut gives one machine's tokens (the gather schedule is exact).
    let single = tokens(&ok(generate(&out, &[])));
    assert_eq!(tokens(&ok(generate(&out, &["--workers", &workers, "--tp-schedule", "gather"]))), single);
}

fn ok_status(o: &std::process::Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_nan_in_a_router_is_an_error_naming_it() {
    use hearth_gguf::{write_gguf_file, GgufFile, TensorSpec};
    use hearth_quant::GgmlType;
    let m = synth("qwen3moe", 128, 2);
    let f = GgufFile::open(&m).unwrap();
    let specs: Vec<TensorSpec> = f.tensors().iter().map(|t| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty }).collect();
    // A copy of the file with a NaN as the first weight (F32) or first block scale (f16) of `name`.
    let with_nan = |name: &str| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-nan-{name}.gguf"));
        write_gguf_file(&out, f.metadata(), &specs, |i, w| {
            let t = &f.tensors()[i];
            let mut b = f.read_tensor(t).unwrap();
            if t.name == name {
                match t.ty {
                    GgmlType::F32 => b[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
                    _ => b[..2].copy_from_slice(&0x7e00u16.to_le_bytes()),
                }
            }
            w.write_all(&b)
        })
        .unwrap();
        out
    };
    let bad = with_nan("blk.1.ffn_gate_inp.weight");
    let o = generate(&bad, &[]);
    assert_clean_error(&o, "layer 1: the router (blk.1.ffn_gate_inp.weight)");
    assert_clean_error(&o, "router weights hold a NaN");
    // Served, every request fails with the reason, and after three failed passes in a
    // row `/health` says so with a 503 (it stayed "ok" while no request could succeed).
    let srv = Server::start_model(&bad, &[]);
    let health = || srv.request("GET", "/health", None, "");
    assert_eq!(health().0, 200, "before any request: {}", health().1);
    for i in 0..3 {
        let (status, v) = srv.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 4}));
        assert!(status >= 500 && v["error"]["message"].as_str().unwrap().contains("router weights hold a NaN"), "{status} {v}");
        let (code, body) = health();
        assert_eq!(code, if i < 2 { 200 } else { 503 }, "after {} failed requests: {body}", i + 1);
    }
    let v: serde_json::Value = serde_json::from_str(&health().1).unwrap();
    assert_eq!((v["status"].as_str(), v["failed_passes_in_a_row"].as_u64()), (Some("error"), Some(3)), "{v}");
    assert!(v["error"].as_str().unwrap().contains("blk.1.ffn_gate_inp.weight"), "{v}");
    assert!(srv.get("/metrics").contains("hearth_failed_passes_total 3"));
    drop(srv);
    // Past the last router (here token 0's row of the output head) no router sees it: the
    // logits' check names it (a NaN logit was sampled silently, often as the end).
    assert_clean_error(&generate(&with_nan("output.weight"), &[]), "the output logits hold NaN (token id 0");
    // The control: the file unaltered runs, and is healthy after as many requests.
    assert_eq!(tokens(&ok(generate(&m, &[]))).len(), 16);
    let srv = Server::start_model(&m, &[]);
    for _ in 0..3 {
        assert_eq!(srv.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 4})).0, 200);
    }
    let (code, body) = srv.request("GET", "/health", None, "");
    assert_eq!(code, 200, "{body}");
}

/// The planner's scratch covers what a mixture of experts' prefill grows a context's
/// buffers to, a shared expert wider than the routed ones included (its gate and up rows
/// reuse the experts' scratch, larger): `hearth_memory::plan::scratch_bytes` against
/// `Context::buffers` after a full batch. (It once counted neither the experts' gate/up
/// rows nor the shared expert's: 3·n_batch·n_ff_exp and more floats short.)
#[test]
fn planned_scratch_covers_a_moe_prefill() {
    use hearth_memory::plan::{scratch_bytes, ModelSummary, PlanParams};
    let m = model();
    for (arch, extra) in [("qwen3moe", &["--head-dim", "32", "--n-ff-exp", "64"][..]), ("qwen2moe", &["--n-ff-exp", "64", "--n-ff-shexp", "512"])] {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-scratch-{arch}.gguf"));
        let mut args = vec!["synth", "--arch", arch, "--n-embd", "128", "--n-layer", "2", "--n-head", "4", "--n-head-kv", "2", "--n-ff", "256"];
        args.extend(["--n-expert", "8", "--n-expert-used", "2", "--type", "q8_0", "--seed", "5", "-t", "2"]);
        args.extend(extra);
        args.extend(["--tokenizer-from", m.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        let o = hearth(&args);
        assert!(o.status.success(), "{arch}: {}", String::from_utf8_lossy(&o.stderr));
        let model = Arc::new(Model::load(&out).unwrap());
        let (n_ctx, n_batch) = (256, 64);
        let mut ctx = Context::new(model.clone(), n_ctx, n_batch, 1).unwrap();
        let prompt: Vec<u32> = (0..n_batch as u32).map(|i| 200 + 7 * i).collect();
        ctx.eval(&prompt, Logits::Last).unwrap();
        let b = ctx.buffers();
        let used = b.activations_bytes + b.logits_bytes + b.quantized_activations_bytes + b.per_thread_bytes;
        let summary = ModelSummary::from_gguf(&model.file).unwrap();
        let p = PlanParams { n_ctx, n_batch, n_threads: 1, cache_type: hearth_model::CacheType::F16, logits_all: false };
        let planned = scratch_bytes(&summary, p) as usize;
        assert!(used <= planned, "{arch}: buffers grew to {used} bytes, the plan counts {planned} ({b:?})");
        // And not far above (the plan is a prediction, not a bound to pad).
        assert!(planned - used < 64 << 10, "{arch}: plan {planned} vs {used} bytes");
    }
}

/// Experts and a shared expert stored in groups of 8 rows (`quantize --type q4_0x8`):
/// tensor parallelism cuts each expert in whole groups (it refused grouped files until
/// session 46). The gather schedule gives one machine's tokens, from workers holding the
/// file and from one that gets a shard file of the grouped cuts; the sum schedule (column
/// cuts inside each group's blocks) gives the tokens of the same split of the row-type
/// file, which holds the same bytes.
#[test]
fn grouped_experts_are_cut_in_whole_groups_across_devices() {
    let q8 = synth("qwen2moe", 128, 4);
    let (m, q4) = (Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-qwen2moe-x8.gguf"), Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-qwen2moe-q4_0.gguf"));
    for (out, ty) in [(&m, "q4_0x8"), (&q4, "q4_0")] {
        let o = hearth(&["quantize", q8.to_str().unwrap(), out.to_str().unwrap(), "--type", ty, "--allow-requantize"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let f = hearth_gguf::GgufFile::open(&m).unwrap();
    for name in ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight", "blk.0.ffn_up_shexp.weight", "blk.0.attn_output.weight"] {
        assert_eq!(f.tensor(name).unwrap().ty, hearth_quant::GgmlType::Q4_0X8, "{name}");
    }
    let single = tokens(&ok(generate(&m, &[])));
    let ws = [Worker::start(&m, &[]), Worker::start(&m, &[])];
    let v = ok(generate(&m, &["--workers", &addrs(&[&ws[0], &ws[1]]), "--tp-schedule", "gather", "--node-weights", "3,1,2"]));
    assert_eq!(tokens(&v), single, "two workers with the file");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-x8-shard-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let sha = common::model_sha(&m);
    let no_file = Worker::spawn(&["--listen", "127.0.0.1:0", "--model-sha256", &sha, "--shard-cache", cache.to_str().unwrap()], std::process::Stdio::null());
    let v = ok(generate(&m, &["--workers", &no_file.addr, "--tp-schedule", "gather"]));
    assert_eq!(tokens(&v), single, "a worker with a shard file");
    let row_type = [Worker::start(&q4, &[]), Worker::start(&q4, &[])];
    let sum = |m: &Path, ws: &[Worker; 2]| tokens(&ok(generate(m, &["--workers", &addrs(&[&ws[0], &ws[1]]), "--tp-schedule", "sum", "--node-weights", "3,1,2"])));
    assert_eq!(sum(&m, &ws), sum(&q4, &row_type), "sum schedule: Q4_0X8 against Q4_0");
}
