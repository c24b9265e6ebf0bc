//! `hearth plan`: predict peak RSS and the decode speed bound of a model from its GGUF
//! header (or a named shape) and compare with this machine's available memory. The
//! prediction lives in `hearth_memory::plan`; this module parses flags and formats.

use crate::common::{print_out, resolve_model, CacheTypeArg};
use anyhow::{bail, Context as _, Result};
use hearth_gguf::GgufFile;
use hearth_memory::plan::{
    plan, plan_experts, plan_window, ModelSummary, Plan, PlanParams, StaysMapped, WindowPlan, DEFAULT_MEMBW_GBPS, OVERHEAD_BASE,
    OVERHEAD_PER_VOCAB,
};
use hearth_quant::GgmlType;
use std::path::PathBuf;

/// Flags of `hearth plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file (only its header is read) [default: $HEARTH_MODEL, else the default model]
    #[arg(short, long, value_name = "PATH", conflicts_with = "shape")]
    pub model: Option<PathBuf>,
    /// Named shape instead of a file, as synth writes it (vocab 49152): tiny, 1b, 7b, 13b,
    /// 70b, or the mixtures of experts 30b-a3b (Qwen3-30B-A3B) and a2.7b (Qwen1.5-MoE-A2.7B)
    #[arg(long, value_enum)]
    pub shape: Option<super::synth::Shape>,
    /// Architecture with --shape (as synth's --arch): its tensors, and Gemma 3's
    /// sliding-window layers, which need only a window of KV cache [default: as synth's]
    #[arg(long, value_enum, requires = "shape")]
    pub arch: Option<super::synth::ArchArg>,
    /// Weight type with --shape (as synth's --type) [default: q4_0]
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: Option<String>,
    /// Type of output.weight with --shape [default: the --type]
    #[arg(long, value_name = "TYPE")]
    pub output_type: Option<String>,
    /// Context size in tokens [default: 2048, capped at the model's trained context]
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx_size: Option<u32>,
    /// Batch size (as generate's -b)
    #[arg(short = 'b', long = "batch", alias = "batch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Worker threads [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// KV cache type (as generate's --cache-type): f32, f16 or q8_0
    #[arg(long, value_enum, default_value_t = CacheTypeArg::F16)]
    pub cache_type: CacheTypeArg,
    /// Memory read bandwidth in GB/s [default: measured, 256 MiB buffer]
    #[arg(long, value_name = "GBPS")]
    pub membw: Option<f64>,
    /// Plan a sliding window for this memory budget (as generate's --mem-budget), e.g. 1GiB;
    /// for a mixture of experts, the expert cache beside it. Exits 1 naming the smallest
    /// workable budget (--json: `window.min_budget_bytes`) when it is too small
    #[arg(long, value_name = "BYTES", value_parser = crate::budget::parse_size)]
    pub mem_budget: Option<u64>,
    /// Disk read bandwidth in GB/s for the window's token time [default: measured on the
    /// model file, 1 GiB with O_DIRECT; with --shape: 0.5]
    #[arg(long, value_name = "GBPS")]
    pub disk_bw: Option<f64>,
    /// Assign the layers to the devices of a ring file (pipelined-ring parallelism): each
    /// `[[device]]` names its `hearth profile --json` output, a budget, and the link to the
    /// next device; prints each device's layers and predicted TPOT
    #[arg(long, value_name = "PATH")]
    pub ring: Option<PathBuf>,
    /// Prompt tokens for the ring plan's predicted TTFT
    #[arg(short = 'p', long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub n_prompt: u32,
    /// Plan a pipelined ring over running workers instead (`--workers`/`--cluster`): asks
    /// each for its profile and memory budget, measures the round trip to it, and prints
    /// the solver's assignment with predicted TTFT and TPOT per device (runs nothing)
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

/// Disk bandwidth assumed for a --shape without --disk-bw (GB/s): a SATA SSD.
const DEFAULT_DISK_GBPS: f64 = 0.5;

/// A memory size in binary units (GiB, MiB, KiB), as `generate` and `serve` print peak RSS
/// and `--mem-budget` takes it, so a predicted size compares with a measured one as it is.
pub(super) fn gb(b: u64) -> String {
    let b = b as f64;
    match b {
        b if b >= (1u64 << 30) as f64 => format!("{:.2} GiB", b / (1u64 << 30) as f64),
        b if b >= (1u64 << 20) as f64 => format!("{:.1} MiB", b / (1u64 << 20) as f64),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b} B"),
    }
}

/// Bytes in decimal units (GB, MB, kB), for bytes read per token beside a bandwidth in
/// GB/s (the decode bound is their ratio).
fn dec(b: u64) -> String {
    let b = b as f64;
    match b {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b} B"),
    }
}

/// `gb(b)` and the exact bytes, for a budget the user may copy: two budgets a few KiB
/// apart print as the same `45.7 MiB`.
fn gb_exact(b: u64) -> String {
    format!("{b} bytes ({})", gb(b))
}

/// A window's expert slots as a term of its smallest budget (" + N expert slots of X"),
/// or nothing.
fn experts(w: &WindowPlan) -> String {
    match w.expert_slots {
        0 => String::new(),
        n => format!(" + {} of {}", hearth_engine::plural(n, "expert slot"), gb(w.expert_slot_bytes)),
    }
}

/// A smallest workable budget: exact bytes, and MiB rounded *up*, so that the figure typed
/// back as `--mem-budget` works (rounded to nearest it could fall a few KiB short).
fn min_exact(b: u64) -> String {
    format!("{b} bytes ({:.1} MiB)", (b as f64 / (1u64 << 20) as f64 * 10.0).ceil() / 10.0)
}

/// What each sliding-window unit needs in a slot: its tensors, widened for O_DIRECT.
fn slot_sizes(units: Vec<u64>) -> Vec<u64> {
    units.iter().map(|u| u + 2 * hearth_memory::window::IO_ALIGN as u64).collect()
}

/// The `--mem-budget` plan of a --shape (no file: its tensors' sizes from the header
/// table): a window of whole layers, or for a mixture of experts a window without the
/// experts beside an expert cache. A file is planned by generate's own computation from
/// its byte ranges instead ([`hearth_engine::window::plan_model`]).
fn shape_budget_plan(p: &Plan, m: &ModelSummary, budget: u64, disk: f64) -> Result<WindowPlan, Box<WindowPlan>> {
    match m.experts {
        Some((n, used)) => {
            let units = slot_sizes(m.unit_bytes_without_experts());
            plan_experts(p, &units, m.expert_slot_bytes(), n * p.shape.n_layer, used, budget, disk)
        }
        None => plan_window(p, &slot_sizes(m.unit_bytes()), budget, disk),
    }
}

pub fn run(a: Args) -> Result<()> {
    let threads = crate::common::threads_or_default(a.threads);
    if a.shape.is_none() && (a.ty.is_some() || a.output_type.is_some()) {
        bail!("--type and --output-type describe a --shape; a model file's types come from the file");
    }
    let mut file = None;
    let (summary, n_ctx_train, what) = match &a.shape {
        Some(shape) => {
            let s = shape.name();
            let ty_name = a.ty.as_deref().unwrap_or("q4_0");
            let ty = GgmlType::from_name(ty_name).with_context(|| format!("unknown --type {ty_name:?}"))?;
            let out_name = a.output_type.as_deref().unwrap_or(ty_name);
            let out = GgmlType::from_name(out_name).with_context(|| format!("unknown --output-type {out_name:?}"))?;
            // The file `hearth synth --shape` writes (SmolLM2's vocabulary, synth's default).
            let c = super::synth::shape_config(a.arch, *shape, 49152)?;
            if c.moe.is_some() && shape.moe_arch().is_none() {
                bail!(
                    "--shape {s} describes a dense model: plan a mixture of experts with --shape 30b-a3b or a2.7b, or a file with -m (hearth synth --arch qwen2moe|qwen3moe|mixtral writes one)"
                );
            }
            let m =
                ModelSummary::from_config(&c, ty, out, false).with_context(|| format!("--shape {s} rows are not whole blocks of {ty}"))?;
            (m, c.n_ctx_train, format!("shape {s} {} {ty}", c.arch.name()))
        }
        None => {
            let path = resolve_model(a.model.as_ref())?;
            let f = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
            let m = ModelSummary::from_gguf(&f).with_context(|| format!("reading {}", path.display()))?;
            let train = hearth_model::ModelConfig::from_gguf(&f)?.n_ctx_train;
            // A plan for a file generate would refuse is no plan: check its tensors as the
            // loader does (mapped, not read; a hand-edited block_count or width shows here).
            drop(f);
            hearth_model::Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
            file = Some(path.clone());
            (m, train, path.display().to_string())
        }
    };
    let n_ctx = match a.ctx_size {
        Some(c) if c as usize > n_ctx_train => bail!("--ctx-size {c} exceeds the model's trained context length of {n_ctx_train} tokens"),
        Some(c) => c as usize,
        None => 2048.min(n_ctx_train),
    };
    let (membw, membw_src) = match a.membw {
        // 100 TB/s is far beyond any machine; larger values are typos.
        Some(g) if g > 0.0 && g <= 1e5 => (g, "--membw"),
        Some(g) => bail!("--membw {g:e} must be a bandwidth in GB/s, above 0 and at most 100000"),
        None => {
            let g = super::bench::membw::measure(threads, 256 << 20, 3);
            if g > 0.0 {
                (g, "measured")
            } else {
                (DEFAULT_MEMBW_GBPS, "default")
            }
        }
    };
    let cache_type: hearth_model::CacheType = a.cache_type.into();
    cache_type.check(summary.shape.head_dim).map_err(anyhow::Error::msg)?;
    if let Some(ring) = &a.ring {
        let row = cache_type.row_bytes(summary.shape.kv_dim()) as u64;
        return print_out(&super::plan_ring::run(ring, &summary, n_ctx, row, a.n_prompt as usize, a.json)?);
    }
    if let Some(n) = a.cluster.slots() {
        bail!("--parallel {n} (KV cache slots) applies to `hearth serve`; plan's devices split one sequence (--parallel tensor|ring)");
    }
    if a.cluster.enabled() {
        let path = file.as_ref().context("--workers/--cluster plan a real model file: give -m, not --shape")?;
        let model = hearth_model::Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        let opts = a.cluster.options()?;
        if !matches!(opts.layout, hearth_parallel::Layout::Ring { .. }) {
            anyhow::ensure!(a.mem_budget.is_none(), hearth_engine::TENSOR_BUDGET_UNSUPPORTED);
            return print_out(&super::plan_tp::report(&model, &opts, n_ctx, a.batch as usize, cache_type, a.json)?);
        }
        let sha = hearth_parallel::model_hash::file_sha256(path).with_context(|| format!("hashing {}", path.display()))?;
        let pending = hearth_parallel::ring::gather(&model, sha, &opts.workers, opts.key.as_ref(), opts.timeout, true)
            .map_err(|e| hearth_engine::explain(e, &opts))?;
        let params = PlanParams { n_ctx, n_batch: a.batch as usize, n_threads: threads, cache_type, logits_all: false };
        let (cost, devices) = hearth_engine::ring::devices(&model, params, &pending, a.mem_budget, crate::cmd::profile::for_ring)?;
        return print_out(&super::plan_ring::report(&devices, &cost, a.n_prompt as usize, Some(&opts.layout), a.json)?);
    }
    a.cluster.check_unused()?;
    let available = hearth_memory::available_bytes().unwrap_or(0);
    let p = plan(
        &summary,
        PlanParams { n_ctx, n_batch: a.batch as usize, n_threads: threads, cache_type, logits_all: false },
        available,
        membw,
    );
    // A file's window is planned as generate plans it, from the loaded model's byte
    // ranges (its header estimate once named a minimum ~41 kB off generate's).
    let model = match &file {
        Some(path) if a.mem_budget.is_some() || !p.fits => {
            Some(hearth_model::Model::load(path).with_context(|| format!("loading {}", path.display()))?)
        }
        _ => None,
    };
    let budget_plan = |budget: u64, disk: f64| -> Result<Result<WindowPlan, Box<WindowPlan>>> {
        match &model {
            Some(m) => hearth_engine::window::plan_model(m, &p, budget, disk),
            None => Ok(shape_budget_plan(&p, &summary, budget, disk)),
        }
    };
    let window = match a.mem_budget {
        None => None,
        Some(budget) => {
            let (disk, disk_src) = match (a.disk_bw, &file) {
                (Some(g), _) if g > 0.0 && g <= 1e4 => (g, "--disk-bw"),
                (Some(g), _) => bail!("--disk-bw {g} must be a bandwidth in GB/s, above 0 and at most 10000"),
                (None, Some(f)) => {
                    let g = hearth_memory::window::measure_read_gbps(f, 1 << 30)
                        .with_context(|| format!("measuring the read bandwidth of {}", f.display()))?;
                    (g, "measured on the file")
                }
                (None, None) => (DEFAULT_DISK_GBPS, "assumed"),
            };
            Some((budget_plan(budget, disk)?, disk_src))
        }
    };
    // Exit nonzero on a budget too small, as generate refuses it (after the report).
    let too_small = |w: &WindowPlan| {
        anyhow::anyhow!(
            "--mem-budget {} is too small: the smallest that works is {} (one unit of {}{} + KV cache + scratch + overhead + margin)",
            gb_exact(a.mem_budget.unwrap_or(0)),
            min_exact(w.min_budget_bytes),
            gb(w.slot_bytes),
            experts(w)
        )
    };
    if a.json {
        let mut v = serde_json::to_value(&p)?;
        v["model"] = serde_json::json!(what);
        v["membw_source"] = serde_json::json!(membw_src);
        if let Some((w, src)) = &window {
            v["window"] = match w {
                Ok(w) => {
                    let mut j = serde_json::to_value(w)?;
                    j["stays_mapped"] = serde_json::json!(w.stays_mapped(p.peak_rss_bytes).is_some());
                    j
                }
                Err(min) => serde_json::json!({"fits": false, "min_budget_bytes": min.min_budget_bytes}),
            };
            v["disk_source"] = serde_json::json!(src);
        }
        print_out(&format!("{v}\n"))?;
        return match &window {
            Some((Err(min), _)) => Err(too_small(min)),
            _ => Ok(()),
        };
    }
    let s = &p.shape;
    let mut o = format!("plan for {what}: n_ctx {n_ctx}, n_batch {}, {threads} threads\n\n", p.n_batch);
    o += &format!(
        "  weights     {:>12}  ({} bytes; {})\n",
        gb(p.weights_bytes),
        p.weights_bytes,
        p.weights_by_type.iter().map(|(t, b)| format!("{t} {}", gb(*b))).collect::<Vec<_>>().join(", ")
    );
    let untouched = p.file_bytes - p.file_resident_bytes;
    o += &match untouched {
        0 => format!("  file pages  {:>12}  mapped GGUF (whole file after a decode)\n", gb(p.file_resident_bytes)),
        u => format!(
            "  file pages  {:>12}  mapped GGUF {} less {} of token_embd rows never read (≤ {n_ctx} rows · 64 KiB fault-around)\n",
            gb(p.file_resident_bytes),
            gb(p.file_bytes),
            gb(u)
        ),
    };
    let per_row = match cache_type {
        hearth_model::CacheType::F32 => format!("{} kv_dim · 4 bytes", s.kv_dim()),
        hearth_model::CacheType::F16 => format!("{} kv_dim · 2 bytes", s.kv_dim()),
        hearth_model::CacheType::Q8_0 => format!("{} kv_dim / 32 · 34 bytes", s.kv_dim()),
    };
    let n_local = summary.windows.iter().filter(|&&w| w != usize::MAX).count();
    let held = |w: usize| hearth_model::KvLayout::held_for(w, n_ctx, p.n_batch);
    let layers = match summary.windows.iter().find(|&&w| w != usize::MAX) {
        Some(&w) if held(w) < n_ctx => format!(
            "2 · ({} layers · {n_ctx} ctx + {n_local} sliding-window layers · {} ring (window {w} + batch {} − 1))",
            s.n_layer - n_local,
            held(w),
            p.n_batch
        ),
        _ => format!("2 · {} layers · {n_ctx} ctx", s.n_layer),
    };
    o += &format!("  KV cache    {:>12}  {layers} · {per_row} ({cache_type})\n", gb(p.kv_cache_bytes));
    o += &format!("  scratch     {:>12}  4 · {} batch · (2·{} + 2·{} + 2·{} + 2·{}) + 4 · {} logits + quantized activations + per-thread accumulators\n",
        gb(p.scratch_bytes), p.n_batch, s.n_embd, s.q_dim(), s.kv_dim(), s.n_ff, s.n_vocab);
    o += &format!(
        "  overhead    {:>12}  {OVERHEAD_BASE} + {OVERHEAD_PER_VOCAB} · {} vocab (measured fit)\n",
        gb(p.overhead_bytes),
        s.n_vocab
    );
    o += &format!("  peak RSS    {:>12}  = file pages + KV cache + scratch + overhead\n", gb(p.peak_rss_bytes));
    o += &format!("  available   {:>12}  (MemAvailable, capped by the cgroup limit)\n\n", gb(p.available_bytes));
    if p.fits {
        o += &format!("fits mapped in the available RAM with {} headroom\n", gb(p.headroom_bytes as u64));
    } else {
        o += &format!(
            "does not fit mapped in the available RAM: {} short; --mem-budget streams the layers from disk through a window (see below, or plan with --mem-budget)\n",
            gb(p.headroom_bytes.unsigned_abs()),
        );
    }
    o += &format!(
        "decode bound: {:.1} tok/s = {:.1} GB/s ({membw_src}) / {} per token (layer matrices{} + output head; KV reads add up to {} at a full context)\n",
        p.decode_tok_s_bound,
        membw,
        dec(p.bytes_per_token),
        if p.experts.is_some() { " (of the experts, the routed ones')" } else { "" },
        dec(p.kv_cache_bytes)
    );
    if let Some((n, used)) = p.experts {
        // bytes_per_token counts the routed experts' share (ModelSummary::bytes_per_token).
        let active = (p.expert_bytes as u128 * used as u128 / n.max(1) as u128) as u64;
        o += &format!(
            "mixture of experts: {used} of {n} experts per token read {} of the {} of expert weights: {} per token active, {} in all\n",
            dec(active),
            dec(p.expert_bytes),
            dec(p.bytes_per_token),
            dec(p.bytes_per_token - active + p.expert_bytes)
        );
    }
    let slots = |n: usize| hearth_engine::plural(n, "slot");
    let mut result = Ok(());
    match window {
        None if !p.fits => {
            let min = budget_plan(0, DEFAULT_DISK_GBPS)?.unwrap_or_else(|w| *w);
            o += &format!(
                "smallest --mem-budget: {} (one unit of {}{} + KV cache + scratch + overhead + margin)\n",
                min_exact(min.min_budget_bytes),
                gb(min.slot_bytes),
                experts(&min)
            );
        }
        None => {}
        // (Said once, by the error on stderr.)
        Some((Err(min), _)) => result = Err(too_small(&min)),
        Some((Ok(w), src)) => {
            o += &format!(
                "\nwindow for --mem-budget {}: {} of {} for {} units: {} kept, {} streamed through {}\n",
                gb(w.budget_bytes),
                slots(w.slots),
                gb(w.slot_bytes),
                w.n_units,
                w.pinned,
                w.n_units - w.pinned,
                slots(w.slots - w.pinned)
            );
            o += &format!("  window      {:>12}  {} · {}\n", gb(w.window_bytes), slots(w.slots), gb(w.slot_bytes));
            // Every layer's experts, and whether the cache holds them all (else each token
            // reads the ones it misses, which the plan does not estimate: it depends on
            // how the router spreads tokens; generate reports the hit rate).
            let all_experts = summary.experts.map_or(0, |(n, _)| n * summary.shape.n_layer);
            let misses = w.expert_slots > 0 && w.expert_slots < all_experts;
            if w.expert_slots > 0 {
                o += &format!(
                    "  experts     {:>12}  {} · {} (one expert of one layer each, {} of the {all_experts}; read on a miss)\n",
                    gb(w.expert_slots as u64 * w.expert_slot_bytes),
                    hearth_engine::plural(w.expert_slots, "expert slot"),
                    gb(w.expert_slot_bytes),
                    w.expert_slots
                );
            }
            o += &format!(
                "  peak RSS    {:>12}  = KV cache + scratch + overhead + window{} ({} kept free as margin)\n",
                gb(w.peak_rss_bytes),
                if w.expert_slots > 0 { " + experts" } else { "" },
                gb(w.margin_bytes)
            );
            let missed = if misses { ", plus the experts each token misses (not estimated)" } else { "" };
            if w.read_bytes_per_token == 0 && !misses {
                o += "  every unit stays resident: read once, then decode runs at memory speed\n";
            } else if w.read_bytes_per_token == 0 {
                o += "  token time  every unit stays resident; decode reads only the experts each token misses (not estimated)\n";
            } else {
                o += &format!(
                    "  token time  {:>10.2} s  = max({} ({}) read per token{missed} / {:.2} GB/s ({src}), compute at the decode bound)\n",
                    w.token_secs,
                    gb(w.read_bytes_per_token),
                    dec(w.read_bytes_per_token),
                    w.disk_gbps
                );
            }
            // What generate does with this budget (hearth_engine::window::apply).
            if let Some(why) = w.stays_mapped(p.peak_rss_bytes) {
                o += &format!(
                    "  generate keeps the model mapped instead (peak RSS {} above): {}\n",
                    gb(p.peak_rss_bytes),
                    match why {
                        StaysMapped::FitsWithMargin => "it fits the budget with the margin",
                        StaysMapped::WindowKeepsAll => "it fits the budget, and a window keeping every unit would save nothing",
                    }
                );
            }
        }
    }
    print_out(&o)?;
    result
}
