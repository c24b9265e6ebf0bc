//! Reports of a `--parallel ring` run (the setup is `hearth_engine::ring`): per device,
//! what the solver predicted against what was measured.

use hearth_engine::ring::RingRun;
use hearth_parallel::{CommCounters, NodeStats};

/// Per device over decode, between two [`ClusterRun::all_stats`] snapshots of `secs`
/// seconds and `tokens` tokens: measured compute, disk wait and network ms per token
/// next to the solver's prediction (JSON; [`ring_lines`] prints it). `own_io_wait`: this
/// machine's seconds waiting for its window over the same phase.
pub fn ring_rows(
    run: &RingRun,
    before: &(CommCounters, Vec<NodeStats>),
    after: &(CommCounters, Vec<NodeStats>),
    secs: f64,
    tokens: usize,
    own_io_wait: f64,
) -> serde_json::Value {
    let per = |v: f64| v * 1e3 / tokens.max(1) as f64;
    let ring_secs = after.0.total.seconds - before.0.total.seconds;
    let mut measured = vec![((secs - ring_secs - own_io_wait).max(0.0), own_io_wait)];
    for (a, b) in after.1.iter().zip(&before.1) {
        let d = a.since(b);
        measured.push(((d.busy_secs - d.comm_secs - d.io_wait_secs).max(0.0), d.io_wait_secs));
    }
    let worker_busy: f64 = measured[1..].iter().map(|(c, io)| c + io).sum();
    let devices: Vec<serde_json::Value> = run
        .devices
        .iter()
        .zip(&measured)
        .map(|(d, (c, io))| {
            serde_json::json!({
                "name": d.name, "window": d.window, "compute_ms": per(*c), "disk_wait_ms": per(*io),
                "predicted_compute_ms": d.predicted.as_ref().map(|x| x.compute_ms),
                "predicted_disk_ms": d.predicted.as_ref().map(|x| x.disk_ms),
            })
        })
        .collect();
    let net_pred: Option<f64> = run.devices.iter().map(|d| d.predicted.as_ref().map(|x| x.network_ms)).sum();
    serde_json::json!({
        "k": run.k, "devices": devices,
        "network_ms": per((ring_secs - worker_busy).max(0.0)), "predicted_network_ms": net_pred,
        "tpot_ms": per(secs), "predicted_tpot_ms": run.predicted_ms,
    })
}

/// [`ring_rows`] for humans.
pub fn ring_lines(v: &serde_json::Value) -> String {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let p = |v: &serde_json::Value| v.as_f64().map(|v| format!(" ({v:.1})")).unwrap_or_default();
    let k = hearth_engine::plural(v["k"].as_u64().unwrap_or(0) as usize, "round");
    let mut o = format!("decode per device, ms/token measured (predicted): compute + disk wait; k = {k}");
    for (i, d) in v["devices"].as_array().into_iter().flatten().enumerate() {
        o.push_str(&format!(
            "\n  device {i} ({}, {} per round): {:.1}{} + {:.1}{}",
            d["name"].as_str().unwrap_or(""),
            hearth_engine::plural(d["window"].as_u64().unwrap_or(0) as usize, "layer"),
            f(&d["compute_ms"]),
            p(&d["predicted_compute_ms"]),
            f(&d["disk_wait_ms"]),
            p(&d["predicted_disk_ms"]),
        ));
    }
    o.push_str(&format!(
        "\n  network (hops and waiting: the ring's time not spent computing): {:.1}{} ms/token",
        f(&v["network_ms"]),
        p(&v["predicted_network_ms"])
    ));
    if let Some(pred) = v["predicted_tpot_ms"].as_f64() {
        let m = f(&v["tpot_ms"]);
        o.push_str(&format!("\n  TPOT {m:.1} ms measured, {pred:.1} ms predicted ({:+.0}%)", 100.0 * (m - pred) / pred.max(1e-9)));
    }
    o
}
