//! `--mem-budget` end to end on SmolLM2 (93.8 MiB of weights): under a budget smaller
//! than the weights the peak RSS stays under it and greedy tokens equal the mapped run's;
//! a budget too small names the smallest that works.

mod common;
use common::*;

const MIB: u64 = 1 << 20;

fn greedy(extra: &[&str]) -> (serde_json::Value, String) {
    let m = model();
    let mut args = vec!["generate", "-m", m.to_str().unwrap(), "-p", "The capital of France is", "--temperature", "0", "-n", "12", "-c", "128", "--json"];
    args.extend_from_slice(extra);
    let out = hearth(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (serde_json::from_slice(&out.stdout).unwrap(), err)
}

#[test]
fn budget_below_the_weights_keeps_rss_under_it_and_tokens_unchanged() {
    let (mapped, _) = greedy(&[]);
    let weights = mapped["memory"]["model_file_bytes"].as_u64().unwrap();
    for (budget, io) in [(64 * MIB, "direct"), (56 * MIB, "buffered")] {
        assert!(budget < weights);
        let b = format!("{}MiB", budget / MIB);
        let (v, err) = greedy(&["--mem-budget", &b, "--window-io", io]);
        assert_eq!(v["completion_tokens"], mapped["completion_tokens"], "{b} {io}");
        let peak = v["peak_rss_bytes"].as_u64().unwrap();
        assert!(peak <= budget, "{b}: peak RSS {peak} over budget\n{err}");
        let w = &v["window"];
        let plan = &w["plan"];
        assert!(plan["slots"].as_u64().unwrap() >= 1 && plan["slots"].as_u64() < plan["n_units"].as_u64(), "{w}");
        // Every decode step reads every unit once (the loader may run a few units ahead).
        let per_pass: u64 = plan["read_bytes_per_token"].as_u64().unwrap();
        let decoded = 11;
        let read = w["decode_io"]["bytes_read"].as_u64().unwrap();
        assert!(read + 2 * per_pass >= decoded * per_pass && read <= (decoded + 2) * per_pass, "{w}");
        assert!(err.contains("window of") && err.contains("; not mapped: its predicted peak RSS") && err.contains("is over the budget"), "{err}");
        // A run measures no disk: no token time predicted from it.
        assert!(plan["disk_gbps"].is_null() && plan["token_secs"].is_null(), "{plan}");
        assert_eq!(v["memory"]["weights_streamed"], true, "{b}");
    }
    assert_eq!(mapped["memory"]["weights_streamed"], false);
}

/// The human memory line says where the weights are: mapped (file-backed), or read
/// through the window (anonymous); it said "weights 93.8 MiB mapped" beside 8 MiB
/// file-backed under a budget.
#[test]
fn the_memory_line_says_the_weights_stream_under_a_budget() {
    let m = model();
    let line = |budget: &str| {
        let out = hearth(&["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2", "-c", "128", "--mem-budget", budget]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err.lines().find(|l| l.starts_with("peak RSS")).unwrap_or_else(|| panic!("no memory line in {err}")).to_string()
    };
    let (streamed, mapped) = (line("64MiB"), line("1GiB"));
    assert!(streamed.contains("file-backed: code;") && streamed.contains("anonymous: buffers and the weights read into the window from the 93.8 MiB file"), "{streamed}");
    assert!(!streamed.contains("mapped"), "{streamed}");
    assert!(mapped.contains("file-backed: weights 93.8 MiB mapped, code;"), "{mapped}");
}

#[test]
fn a_budget_that_holds_the_model_maps_it() {
    let (v, err) = greedy(&["--mem-budget", "1GiB"]);
    assert!(v["window"].is_null() && err.contains("fits mapped"), "{err}");
}

/// Between the window that keeps every unit and the mapped peak plus its margin, the
/// model stays mapped: such a window read all the weights into anonymous memory and saved
/// nothing (a new-user finding). Just below, a window streams some units and says why
/// the model is not mapped.
#[test]
fn a_window_that_would_keep_every_unit_leaves_the_model_mapped() {
    let m = model();
    let plan = |b: u64| {
        let b = b.to_string();
        ok(hearth(&["plan", "-m", m.to_str().unwrap(), "-c", "128", "--membw", "20", "--disk-bw", "1", "--mem-budget", &b, "--json"]))
    };
    let all = plan(1 << 30);
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{all}"));
    let (mapped_peak, kept_peak) = (n(&all["peak_rss_bytes"]), n(&all["window"]["peak_rss_bytes"]));
    // The smallest budget whose window keeps every unit: kept + margin(b) <= b.
    let b = ((kept_peak + 16 * MIB) * 32).div_ceil(31) + 64;
    assert!(mapped_peak + 16 * MIB + b / 32 > b, "the mapping fits {b} with its margin: {all}");
    let w = &plan(b)["window"];
    assert!(w["pinned"] == w["n_units"] && w["stays_mapped"] == true, "{w}");
    let (v, err) = greedy(&["--mem-budget", &b.to_string()]);
    assert!(v["window"].is_null() && err.contains("stays mapped") && err.contains("would keep every unit"), "{err}");
    assert_eq!(v["memory"]["weights_streamed"], false);
    let below = b - MIB;
    let w = &plan(below)["window"];
    assert!(w["pinned"] != w["n_units"] && w["stays_mapped"] == false, "{w}");
    let (v, err) = greedy(&["--mem-budget", &below.to_string()]);
    assert_eq!(v["memory"]["weights_streamed"], true);
    assert!(err.contains("; not mapped: its predicted peak RSS"), "{err}");
}

#[test]
fn a_budget_too_small_names_the_minimum() {
    let m = model();
    let out = hearth(&["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-c", "128", "--mem-budget", "20MiB"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--mem-budget 20.0 MiB is too small") && err.contains("need at least"), "{err}");
    // The minimum it names (rounded up) works.
    let min = err.split("need at least ").nth(1).and_then(|r| r.split(' ').next()).unwrap();
    let out = hearth(&["generate", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "1", "-c", "128", "--mem-budget", &format!("{min}MiB")]);
    assert!(out.status.success(), "{min} MiB: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(err.lines().count(), 1, "{err}");
    for bad in ["12XB", "-5M", "0"] {
        let out = hearth(&["generate", "-m", m.to_str().unwrap(), "-p", "hi", &format!("--mem-budget={bad}")]);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--mem-budget"), "{bad}");
    }
    // A worker refuses at start a budget no session could run under (below the runtime
    // and the window's margin); it said so only when a coordinator came. (A budget above
    // that starts and listens: the tensor-parallel and ring tests run workers under 47
    // and 64 MiB.)
    let out = hearth(&["worker", "--listen", "127.0.0.1:0", "-m", m.to_str().unwrap(), "--mem-budget", "30MiB"]);
    assert_clean_error(&out, "--mem-budget 30.0 MiB can never hold a session of this model: the runtime alone is");
}

#[test]
fn bench_reports_the_window_split() {
    let m = model();
    let out = hearth(&["bench", "-m", m.to_str().unwrap(), "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--mem-budget", "64MiB", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for t in v.as_array().unwrap() {
        let io = &t["window_io"];
        assert!(io["bytes_read"].as_u64().unwrap() > 0 && io["read_gbps"].as_f64().unwrap() > 0.0, "{t}");
        let (c, w, all) = (io["compute_ms_per_pass"].as_f64().unwrap(), io["wait_ms_per_pass"].as_f64().unwrap(), io["ms_per_pass"].as_f64().unwrap());
        assert!((c + w - all).abs() < 1e-6 * all.max(1.0), "{io}");
        assert!(t["memory"]["peak_rss_bytes"].as_u64().unwrap() <= 64 * MIB, "{t}");
    }
}

/// Under a budget that holds the model mapped, bench measures no read bandwidth (its
/// buffer would break the budget) but still reports the weight bandwidth; the JSON says
/// null, not 0.
#[test]
fn bench_under_a_budget_that_maps_reports_the_weight_bandwidth() {
    let m = model();
    let args = ["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "4", "-r", "1", "-t", "1", "--mem-budget", "1GiB"];
    let v = ok(hearth(&[&args[..], &["--json"]].concat()));
    let t = &v[0];
    assert!(t["membw_gbps"].is_null() && t["roofline_pct"].is_null() && t["gbps"].as_f64().unwrap_or(0.0) > 0.0, "{t}");
    // Mapped under this budget: its pages are reported.
    if cfg!(target_os = "linux") {
        assert!(t["weight_pages"]["resident_bytes"].as_u64().unwrap_or(0) > 0, "{t}");
    }
    let out = hearth(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("no read bandwidth measured under --mem-budget"), "{text}");
}

#[test]
fn plan_predicts_the_window() {
    let plan = |budget: &str| ok(hearth(&["plan", "--shape", "7b", "-c", "128", "--membw", "20", "--disk-bw", "1", "--mem-budget", budget, "--json"]));
    let v = plan("1GiB");
    let w = &v["window"];
    let n = |k: &str| w[k].as_u64().unwrap_or_else(|| panic!("{k}: {w}"));
    // 32 blocks + the head in one chunk (Q4_0 head of 49152 rows < a block).
    assert_eq!(n("n_units"), 33);
    assert!(n("slots") >= 2 && n("peak_rss_bytes") + n("margin_bytes") <= 1 << 30, "{w}");
    assert_eq!(n("peak_rss_bytes"), n("fixed_bytes") + n("slots") * n("slot_bytes"));
    // All but two slots keep their unit; one token reads the rest at 1 GB/s.
    assert_eq!(n("pinned"), n("slots") - 2);
    assert!(n("read_bytes_per_token") < 3_900_000_000 - (n("pinned") - 1) * 100_000_000, "{w}");
    let secs = w["token_secs"].as_f64().unwrap();
    assert!((secs - n("read_bytes_per_token") as f64 / 1e9).abs() < 1e-6, "{w}");
    // Too small: the JSON names the minimum, and plan exits 1 as generate does.
    let o = hearth(&["plan", "--shape", "7b", "-c", "128", "--membw", "20", "--disk-bw", "1", "--mem-budget", "100MiB", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let small: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(small["window"]["fits"], false);
    assert!(small["window"]["min_budget_bytes"].as_u64().unwrap() > 100 * MIB);
}

#[test]
fn perplexity_under_a_budget_is_unchanged() {
    // Logits of every position go through the head's row chunks.
    let text = std::env::temp_dir().join(format!("hearth-ppl-{}.txt", std::process::id()));
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog, and then it sleeps. ".repeat(40)).unwrap();
    let m = model();
    let ppl = |extra: &[&str]| {
        let mut args = vec!["perplexity", "-m", m.to_str().unwrap(), "-f", text.to_str().unwrap(), "-c", "128", "--json"];
        args.extend_from_slice(extra);
        ok(hearth(&args))
    };
    let (mapped, windowed) = (ppl(&[]), ppl(&["--mem-budget", "90MiB"]));
    std::fs::remove_file(&text).ok();
    assert_eq!(mapped["ppl"], windowed["ppl"]);
    assert!(windowed["peak_rss_bytes"].as_u64().unwrap() <= 90 * MIB, "{windowed}");
    assert!(windowed["memory"]["rss_file_bytes"].as_u64() < Some(20 * MIB), "weights not mapped: {windowed}");
    // The window and what it read: at least the streamed units once per forward pass.
    let w = &windowed["window"];
    let per_pass = w["plan"]["read_bytes_per_token"].as_u64().unwrap();
    let passes = windowed["chunks"].as_u64().unwrap();
    assert!(per_pass > 0 && w["io"]["bytes_read"].as_u64().unwrap() >= passes * per_pass, "{w}");
    assert!(mapped["window"].is_null(), "{mapped}");
}
