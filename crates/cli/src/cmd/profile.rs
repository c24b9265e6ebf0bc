//! `hearth profile`: measure what this device can do — cores, SIMD level, RAM, memory
//! read bandwidth, disk read throughput of the model's file system, and hearth's matmul
//! rates per weight type and thread count — into a [`DeviceProfile`], the input of the
//! layer-assignment solver (issue #7). The profile is cached in
//! `<cache dir>/profile.json` keyed by a fingerprint of the hardware and the build.

mod cache;
mod disk;
mod matmul;
mod system;

use crate::cmd::bench::membw;
use crate::common::{print_out, resolve_model};
use anyhow::{Context as _, Result};
use hearth_kernels::ThreadPool;
use hearth_parallel::profile::DeviceProfile;
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `hearth profile`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Measuring takes about half a minute (--quick: a few seconds). The result is cached in \
    $HEARTH_CACHE_DIR (default ~/.cache/hearth)/profile.json and reused while the CPU, core count, RAM, SIMD level, \
    hearth binary, model file system and these flags stay the same; --refresh measures again.")]
pub struct Args {
    /// Print the profile as JSON (hearth_parallel::profile::DeviceProfile)
    #[arg(long)]
    pub json: bool,
    /// A file on the file system whose disk reads are measured
    /// [default: $HEARTH_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Comma-separated thread counts for the matmul rates [default: 1 and all cores]
    #[arg(short, long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Vec<u16>,
    /// Comma-separated weight types for the matmul rates
    #[arg(long, value_delimiter = ',', default_value = Args::DEFAULT_TYPES)]
    pub types: Vec<String>,
    /// Smaller buffers and matrices, fewer runs: seconds instead of half a minute
    #[arg(long)]
    pub quick: bool,
    /// Measure again even if a cached profile matches
    #[arg(long)]
    pub refresh: bool,
    /// Also measure the round trip and throughput to these `hearth worker`s (serving the
    /// same model file): comma-separated HOST:PORT; measured on every run, not cached
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    pub peer: Vec<String>,
    /// Shared secret of the workers given with --peer
    #[arg(long, value_name = "KEY", env = "HEARTH_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
}

impl Args {
    const DEFAULT_TYPES: &'static str = "q4_0,q4_1,q8_0,q4_k,q6_k,f16";
}

/// Budgets of one profile run.
struct Sizes {
    membw_bytes: usize,
    membw_passes: usize,
    disk: disk::Limits,
    matmul: matmul::Shape,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                membw_bytes: 64 << 20,
                membw_passes: 3,
                disk: disk::Limits { max_bytes: 64 << 20, max_time: Duration::from_millis(500) },
                // Decode must still stream from RAM, not the last-level cache.
                matmul: matmul::Shape {
                    min_decode_bytes: system::last_level_cache_bytes().map_or(0, |l3| (2 * l3).min(128 << 20)),
                    ..matmul::Shape::QUICK
                },
            }
        } else {
            Self {
                membw_bytes: 512 << 20,
                membw_passes: 5,
                disk: disk::Limits { max_bytes: 256 << 20, max_time: Duration::from_secs(2) },
                // Decode must stream from RAM: twice the last-level cache (at most 512 MiB).
                matmul: matmul::Shape {
                    min_decode_bytes: system::last_level_cache_bytes().map_or(0, |l3| (2 * l3).min(512 << 20)),
                    ..matmul::Shape::FULL
                },
            }
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    let model = resolve_model(a.model.as_ref())?;
    let threads: Vec<usize> = a.threads.iter().map(|&t| t as usize).collect();
    // The links first: a peer that is not there fails before the measurements.
    let links = if a.peer.is_empty() {
        Vec::new()
    } else {
        let key = crate::cluster::read_key(a.cluster_key.as_deref(), None)?;
        let m = hearth_model::Model::load(&model).with_context(|| format!("loading {}", model.display()))?;
        let sha = hearth_parallel::model_hash::file_sha256(&model).with_context(|| format!("hashing {}", model.display()))?;
        let peers: Vec<String> = a.peer.iter().map(|p| crate::cluster::check_addr(p)).collect::<Result<_>>()?;
        if let Some(dup) = peers.iter().enumerate().find_map(|(i, p)| peers[..i].contains(p).then_some(p)) {
            anyhow::bail!("--peer {dup} is listed twice");
        }
        hearth_parallel::ring::probe_links(&m, sha, &peers, key.as_ref(), Duration::from_secs(5))
            .map_err(|e| hearth_engine::explain_workers(e, &peers).context("measuring the links (a worker must serve this model file)"))?
    };
    let (mut profile, cpu) = device_profile(&model, &threads, &a.types, a.quick, a.refresh, None)?;
    profile.links = links;
    if a.json {
        print_out(&(serde_json::to_string_pretty(&profile)? + "\n"))
    } else {
        print_out(&table(&profile, &cpu))
    }
}

/// This device's profile for the ring solver: the cached one, or a quick measurement at
/// `threads` (cached for next time).
pub fn for_ring(model: &Path, threads: usize) -> Result<DeviceProfile> {
    let types: Vec<String> = Args::DEFAULT_TYPES.split(',').map(String::from).collect();
    let why = "measuring this device for the ring's layer solver (hearth profile --quick; cached for next time)";
    Ok(device_profile(model, &[threads], &types, true, false, Some(why))?.0)
}

/// Measure (or load from the cache) this device's profile; also returns the CPU name.
/// `threads` empty: 1 and every core. `why`: a line to print before measuring (not when
/// the profile comes from the cache).
fn device_profile(
    model: &Path,
    threads: &[usize],
    types: &[String],
    quick: bool,
    refresh: bool,
    why: Option<&str>,
) -> Result<(DeviceProfile, String)> {
    if let Err(e) = std::fs::metadata(model) {
        anyhow::bail!("{}: {e} (the disk is measured on the model's file system)", model.display());
    }
    anyhow::ensure!(model.is_file(), "{} is not a file (the disk is measured on the model's file system)", model.display());
    let cores = system::cores();
    let mut threads: Vec<usize> = if threads.is_empty() { vec![1, cores] } else { threads.to_vec() };
    threads.sort_unstable();
    threads.dedup();
    let types = types.iter().map(|t| matmul::parse_type(t.trim())).collect::<Result<Vec<_>>>()?;
    let ram = system::ram().context("reading /proc/meminfo")?;
    let (cpu, simd) = (system::cpu_model(), system::simd());
    let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
    let fp = cache::Fingerprint {
        cpu_model: &cpu,
        cores,
        ram_total: ram.total,
        simd: &simd,
        model,
        params: format!("quick={quick}|threads={threads:?}|types={}", names.join(",")),
    };
    let key = fp.key();
    let cache_path = cache::path();
    let cached = cache_path.as_deref().filter(|_| !refresh).and_then(|path| Some((path, cache::load(path, &key)?)));
    let profile = match cached {
        Some((path, mut p)) => {
            eprintln!("hearth profile: loaded from cache {} (`hearth profile --refresh` measures again)", path.display());
            // RAM availability changes from minute to minute: always current.
            p.ram_available_bytes = ram.available;
            p
        }
        None => {
            if let Some(why) = why {
                eprintln!("{why}");
            }
            let p = measure(model, &threads, &types, ram, simd.clone(), Sizes::new(quick))?;
            match &cache_path {
                Some(path) => match cache::store(path, &key, &p) {
                    Ok(()) => eprintln!("hearth profile: measured; cached in {}", path.display()),
                    Err(e) => eprintln!("hearth profile: measured; could not cache it in {}: {e}", path.display()),
                },
                None => eprintln!("hearth profile: measured (no cache directory: set HEARTH_CACHE_DIR or HOME)"),
            }
            p
        }
    };
    Ok((profile, cpu))
}

/// Run every measurement, with a progress bar on stderr.
fn measure(
    model: &std::path::Path,
    threads: &[usize],
    types: &[hearth_quant::GgmlType],
    ram: system::Ram,
    simd: String,
    sizes: Sizes,
) -> Result<DeviceProfile> {
    let cores = system::cores();
    let pb = ProgressBar::new(2 + (types.len() * threads.len()) as u64);
    pb.set_style(ProgressStyle::with_template("{msg:>16} [{bar:30}] {pos}/{len}, {elapsed}").unwrap().progress_chars("=> "));
    pb.set_message(format!("membw t={cores}"));
    let mem_read_gbps = membw::measure(cores, sizes.membw_bytes, sizes.membw_passes);
    pb.inc(1);
    pb.set_message("disk");
    let d = disk::measure(model, sizes.disk).with_context(|| format!("measuring reads of {}", model.display()))?;
    if !d.direct {
        pb.suspend(|| eprintln!("hearth profile: O_DIRECT is not supported there: disk reads went through the page cache (dropped first)"));
    }
    pb.inc(1);
    let pools: Vec<ThreadPool> = threads.iter().map(|&t| ThreadPool::new(t)).collect();
    let mut rates = Vec::new();
    for &ty in types {
        pb.set_message(format!("matmul {}", ty.name()));
        rates.extend(matmul::measure(ty, &pools, sizes.matmul, || pb.inc(1))?);
    }
    pb.finish_and_clear();
    Ok(DeviceProfile {
        name: system::host_name(),
        cores,
        simd,
        ram_total_bytes: ram.total,
        ram_available_bytes: ram.available,
        swap_total_bytes: ram.swap,
        mem_read_gbps,
        disk_seq_read_gbps: d.seq_gbps,
        disk_rand_read_gbps: d.rand_gbps,
        matmul: rates,
        links: Vec::new(),
    })
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// The human-readable report.
fn table(p: &DeviceProfile, cpu: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "device      {}", p.name);
    let _ = writeln!(s, "cpu         {cpu}, {} logical cores, {}", p.cores, p.simd);
    let _ = writeln!(
        s,
        "ram         {:.2} GiB total, {:.2} GiB available, {:.2} GiB swap",
        gib(p.ram_total_bytes),
        gib(p.ram_available_bytes),
        gib(p.swap_total_bytes)
    );
    let _ = writeln!(s, "memory      {:.2} GB/s read ({} threads)", p.mem_read_gbps, p.cores);
    let _ = writeln!(s, "disk        {:.2} GB/s sequential, {:.2} GB/s random 1 MiB reads", p.disk_seq_read_gbps, p.disk_rand_read_gbps);
    let _ = writeln!(s, "\n| type | threads | decode GB/s | prefill GFLOP/s |\n|---|---:|---:|---:|");
    for m in &p.matmul {
        let _ = writeln!(s, "| {} | {} | {:.2} | {:.1} |", m.ty, m.threads, m.decode_gbps, m.prefill_gflops);
    }
    for l in &p.links {
        let _ = writeln!(s, "link to {}: round trip {:.2} ms, {:.0} Mbit/s", l.peer, l.rtt_ms, l.mbit);
    }
    s
}
