//! `hearth plan --ring ring.toml`: assign a model's layers to heterogeneous devices for
//! pipelined-ring parallelism (issue #7) with the solver in `hearth_parallel::solver`,
//! from each device's `hearth profile --json` output.
//!
//! ```toml
//! [[device]]               # device 0: the head of the ring (embedding, output head)
//! name = "laptop"
//! profile = "laptop.json"  # `hearth profile --json > laptop.json` on that device
//! budget = "6GiB"          # RAM the model may use there [default: the profile's available RAM]
//! rtt_ms = 3.0             # round trip of the link to the next device
//! mbit = 300               # its bandwidth
//! [[device]]
//! name = "desktop"
//! profile = "desktop.json"
//! rtt_ms = 3.0
//! mbit = 300
//! ```

use anyhow::{bail, Context as _, Result};
use hearth_memory::plan::ModelSummary;
use hearth_parallel::profile::{DeviceProfile, LinkProfile};
use hearth_parallel::solver::{solve, DeviceSpec, ModelCost};
use hearth_parallel::Layout;
use std::path::Path;

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RingFile {
    device: Vec<DeviceEntry>,
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    name: Option<String>,
    profile: String,
    budget: Option<String>,
    rtt_ms: Option<f64>,
    mbit: Option<f64>,
}

/// The devices of a ring file (profiles resolved relative to the file).
pub fn read_devices(path: &Path) -> Result<Vec<DeviceSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the ring file {}", path.display()))?;
    let f: RingFile = toml::from_str(&text).with_context(|| format!("ring file {}", path.display()))?;
    if f.device.is_empty() {
        bail!("ring file {} names no [[device]]", path.display());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    f.device
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let p = dir.join(&d.profile);
            let json = std::fs::read_to_string(&p).with_context(|| format!("device {i}: reading the profile {}", p.display()))?;
            let mut profile: DeviceProfile = serde_json::from_str(&json)
                .with_context(|| format!("device {i}: {} is not a `hearth profile --json` output", p.display()))?;
            if let Some(n) = &d.name {
                profile.name = n.clone();
            }
            let budget_bytes = match &d.budget {
                Some(b) => crate::budget::parse_size(b).map_err(|e| anyhow::anyhow!("device {i}: budget: {e}"))?,
                None => profile.ram_available_bytes,
            };
            let (rtt_ms, mbit) = (d.rtt_ms.unwrap_or(1.0), d.mbit.unwrap_or(1000.0));
            if !(rtt_ms >= 0.0 && rtt_ms.is_finite() && mbit > 0.0 && mbit.is_finite()) {
                bail!("device {i}: rtt_ms must be >= 0 and mbit > 0");
            }
            let link = LinkProfile { peer: format!("device {}", (i + 1) % f.device.len()), rtt_ms, mbit };
            Ok(DeviceSpec { profile, budget_bytes, link })
        })
        .collect()
}

/// Solve for the devices of a ring file and print (or return as JSON) the assignment.
pub fn run(ring: &Path, m: &ModelSummary, n_ctx: usize, kv_row_bytes: u64, n_prompt: usize, json: bool) -> Result<String> {
    let devices = read_devices(ring)?;
    report(&devices, &hearth_engine::ring::model_cost(m, n_ctx, kv_row_bytes), n_prompt, None, json)
}

/// The windows `given` (`--layer-window`, this machine first) as an assignment: the cost
/// model's prediction for them instead of the solver's choice.
fn given_windows(cost: &ModelCost, devices: &[DeviceSpec], given: &[usize]) -> Result<hearth_parallel::solver::Assignment> {
    if given.len() != devices.len() {
        bail!("--layer-window gives {} windows for {} devices (this machine first)", given.len(), devices.len());
    }
    hearth_engine::ring::check_windows(given, cost.n_layer)?;
    let k = cost.n_layer / given.iter().sum::<usize>();
    let (ms, per_device) = hearth_parallel::solver::predict(cost, devices, k, given).ok_or_else(|| {
        anyhow::anyhow!(
            "--layer-window {given:?} does not fit these devices' memory budgets or links (without it, the solver picks windows that do)"
        )
    })?;
    let explanation = format!("windows {given:?} from --layer-window (not the solver's choice)");
    Ok(hearth_parallel::solver::Assignment { k, windows: given.to_vec(), predicted_ms_per_token: ms, per_device, explanation })
}

/// Solve for `devices` and print (or return as JSON) the assignment, with the predicted
/// TTFT of an `n_prompt`-token prompt and TPOT, per device and in total.
/// `layout`: a ring's given windows and `--require-all-workers`, as `generate` takes them.
pub fn report(devices: &[DeviceSpec], cost: &ModelCost, n_prompt: usize, layout: Option<&Layout>, json: bool) -> Result<String> {
    let (given, require_all) = match layout {
        Some(Layout::Ring { windows, require_all }) => (windows.as_deref(), *require_all),
        _ => (None, false),
    };
    let a = match given {
        Some(w) => given_windows(cost, devices, w)?,
        None => solve(cost, devices)?,
    };
    if let Some(i) = a.windows.iter().skip(1).position(|&w| w == 0).filter(|_| require_all) {
        bail!(
            "--require-all-workers: {} gets no layers (windows {:?}); a run with these flags would refuse to start",
            devices[i + 1].profile.name,
            a.windows
        );
    }
    let (ttft, ttft_per) = hearth_parallel::solver::predict_prefill(cost, devices, a.k, &a.windows, n_prompt)
        .ok_or_else(|| anyhow::anyhow!("the solver's plan has no prefill prediction"))?;
    if json {
        let per: Vec<_> = a
            .per_device
            .iter()
            .zip(devices)
            .zip(&a.windows)
            .zip(&ttft_per)
            .map(|(((p, d), w), t)| {
                serde_json::json!({
                    "name": d.profile.name, "window_layers": w, "layers": w * a.k, "ttft_ms": t,
                    "compute_ms": p.compute_ms, "disk_ms": p.disk_ms, "network_ms": p.network_ms, "resident_bytes": p.resident_bytes,
                    "streaming": p.streaming,
                })
            })
            .collect();
        let v = serde_json::json!({"k": a.k, "windows": a.windows, "predicted_ms_per_token": a.predicted_ms_per_token,
            "n_prompt": n_prompt, "predicted_ttft_ms": ttft,
            "devices": per, "explanation": a.explanation});
        return Ok(format!("{v}\n"));
    }
    let mut o = format!(
        "ring plan for {} layers of {:.1} MiB ({}), n_ctx {}, over {} devices:\n",
        cost.n_layer,
        cost.layer_bytes as f64 / (1 << 20) as f64,
        cost.weight_type,
        cost.n_ctx,
        devices.len()
    );
    o += &format!(
        "| device | layers per round | layers | TTFT ms ({n_prompt} tokens) | compute ms/token | disk ms/token | network ms/token | resident MiB | weights |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    );
    for (((p, d), w), t) in a.per_device.iter().zip(devices).zip(&a.windows).zip(&ttft_per) {
        o += &format!(
            "| {} | {w} | {} | {t:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {} |\n",
            d.profile.name,
            w * a.k,
            p.compute_ms,
            p.disk_ms,
            p.network_ms,
            p.resident_bytes as f64 / (1 << 20) as f64,
            match (p.streaming, p.disk_ms > 0.0) {
                (true, _) => "streamed, next window prefetched",
                (false, true) => "over budget, re-read every token",
                (false, false) => "resident",
            }
        );
    }
    o += &format!(
        "\nk = {} round{}, predicted TTFT {ttft:.0} ms for {n_prompt} prompt tokens, TPOT {:.1} ms/token ({:.2} tok/s)\n{}\n",
        a.k,
        if a.k == 1 { "" } else { "s" },
        a.predicted_ms_per_token,
        1e3 / a.predicted_ms_per_token,
        a.explanation.trim_end()
    );
    Ok(o)
}
