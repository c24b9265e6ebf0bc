//! `hearth worker`: a daemon that computes its share of a model for a coordinator
//! (`hearth generate --workers …`), one coordinator session at a time.

use crate::cluster::{parse_secs, read_key};
use crate::common::{resolve_model, threads_or_default};
use anyhow::{Context as _, Result};
use hearth_model::{Context, Model, RingWindows};
use hearth_parallel::profile::DeviceProfile;
use hearth_parallel::ring::WorkerProfile;
use hearth_parallel::wire::{write_frame, ErrorMsg};
use hearth_parallel::{Message, SessionEvent, WorkerModel};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Connections allowed in their handshake at once.
const MAX_PENDING: usize = 16;
/// Time a connection has to complete its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Flags of `hearth worker`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on; port 0 picks a free one (printed). Binding beyond loopback
    /// exposes the worker to the network: use --cluster-key there
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "HOST:PORT")]
    pub listen: String,
    /// GGUF model file; coordinators must run the same file (SHA-256 checked at handshake)
    /// [default: $HEARTH_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short, long, value_name = "PATH", conflicts_with = "model_sha256")]
    pub model: Option<PathBuf>,
    /// Serve the model with this SHA-256 without having its file: the coordinator sends
    /// this worker its share once (a shard file, checked by hash and cached in
    /// --shard-cache), later sessions with the same share reuse it
    #[arg(long, value_name = "HEX")]
    pub model_sha256: Option<String>,
    /// Where shard files are kept [default: $HEARTH_CACHE_DIR/shards, else ~/.cache/hearth/shards]
    #[arg(long, value_name = "DIR")]
    pub shard_cache: Option<PathBuf>,
    /// Worker threads, 1-1024 [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Shared secret: coordinators must prove it (and this worker proves it to them)
    #[arg(long, value_name = "KEY", env = "HEARTH_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
    /// Read the shared secret from a file (first line); takes precedence over --cluster-key
    /// and $HEARTH_CLUSTER_KEY
    #[arg(long, value_name = "PATH")]
    pub cluster_key_file: Option<PathBuf>,
    /// Seconds to wait for the coordinator within a forward pass
    #[arg(long, default_value_t = 5.0, value_parser = parse_secs)]
    pub step_timeout: f64,
    /// Stay within this much RAM: the worker's share is kept as a shard file (cut from
    /// the model, or received) and streamed through the sliding window when it does not
    /// fit (see `hearth generate --help`)
    #[command(flatten)]
    pub budget: crate::budget::BudgetArgs,
}

fn parse_sha(hex: &str) -> Result<[u8; 32]> {
    let h = hex.trim();
    let mut out = [0u8; 32];
    if h.len() != 64 {
        anyhow::bail!("--model-sha256 needs 64 hex digits, got {} characters", h.len());
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).map_err(|_| anyhow::anyhow!("--model-sha256 {h:?} is not hex"))?;
    }
    Ok(out)
}

/// What this worker tells a ring coordinator: its profile (measured on first use, see
/// `hearth profile`), threads and memory budget.
fn ring_profile(
    profiled: &OnceLock<Option<DeviceProfile>>,
    model: Option<&std::path::Path>,
    threads: usize,
    budget: Option<u64>,
) -> WorkerProfile {
    let profile = profiled.get_or_init(|| {
        let model = model?;
        crate::cmd::profile::for_ring(model, threads).map_err(|e| eprintln!("could not profile this device: {e:#}")).ok()
    });
    let available = hearth_memory::available_bytes().unwrap_or(0);
    WorkerProfile {
        profile: profile.clone(),
        threads,
        budget_bytes: budget.unwrap_or(available),
        can_stream: budget.is_some() && model.is_some(),
        has_model: model.is_some(),
    }
}

/// Refuse, at start, a `--mem-budget` no session could run under: below the runtime and
/// the window's fixed margin, which every plan needs whatever the coordinator's context
/// size, split or layers (`hearth_memory::plan`). What a session needs beyond them (its KV
/// cache, scratch and weights) is checked when it starts, when those are known.
fn never_fits(model: &Model, budget: u64) -> Result<()> {
    use hearth_memory::plan::{plan, ModelSummary, PlanParams, DEFAULT_MEMBW_GBPS, WINDOW_MARGIN_BASE};
    let summary = ModelSummary::from_gguf(&model.file)?;
    let tiny = PlanParams { n_ctx: 1, n_batch: 1, n_threads: 1, cache_type: hearth_model::CacheType::Q8_0, logits_all: false };
    let runtime = plan(&summary, tiny, 0, DEFAULT_MEMBW_GBPS).overhead_bytes;
    if budget < runtime + WINDOW_MARGIN_BASE {
        anyhow::bail!(
            "--mem-budget {} can never hold a session of this model: the runtime alone is {} and the window keeps a margin of {} \
             (a session also needs its KV cache, scratch and at least one unit of weights)",
            hearth_engine::mib(budget),
            hearth_engine::mib(runtime),
            hearth_engine::mib(WINDOW_MARGIN_BASE)
        );
    }
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    let key = read_key(a.cluster_key.as_deref(), a.cluster_key_file.as_deref())?;
    let shard_dir = hearth_parallel::shard_file::cache_dir(a.shard_cache.as_deref());
    let model_path = if a.model_sha256.is_some() { None } else { Some(resolve_model(a.model.as_ref())?) };
    let (worker, what) = match &a.model_sha256 {
        Some(hex) => {
            let sha = parse_sha(hex)?;
            let dir = shard_dir.context("no --shard-cache and no cache directory ($HEARTH_CACHE_DIR, $XDG_CACHE_HOME, $HOME)")?;
            (WorkerModel::Shards { sha256: sha, dir: dir.clone() }, format!("no model file: shards of {hex} cached in {}", dir.display()))
        }
        None => {
            let path = resolve_model(a.model.as_ref())?;
            a.budget.before_load(&path)?;
            let model = Arc::new(Model::load(&path).with_context(|| format!("loading {}", path.display()))?);
            if let Some(b) = a.budget.mem_budget {
                never_fits(&model, b)?;
            }
            let sha = hearth_parallel::model_hash::file_sha256(&path).with_context(|| format!("hashing {}", path.display()))?;
            // With a budget the share is cut into a shard file, which a window can stream.
            let dir = if a.budget.mem_budget.is_some() {
                Some(shard_dir.clone().context("--mem-budget needs a shard cache: give --shard-cache")?)
            } else {
                None
            };
            let what = format!("model {}, SHA-256 {}", path.display(), hearth_parallel::wire::hex(&sha));
            (WorkerModel::File { model, sha256: sha, shard_dir: dir }, what)
        }
    };
    let listener = TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    let addr = listener.local_addr().context("local address")?;
    if !addr.ip().is_loopback() && key.is_none() {
        eprintln!(
            "WARNING: this worker listens on {addr}, beyond loopback, WITHOUT a cluster key: anyone who can reach it \
             can run the model on it. Start it with --cluster-key (or --cluster-key-file) and give coordinators the same key."
        );
    }
    let threads = threads_or_default(a.threads);
    // The line tests and scripts wait for (stdout, flushed).
    crate::common::print_out(&format!(
        "hearth worker listening on {addr} ({what}, {}{})\n",
        hearth_engine::plural(threads, "thread"),
        if key.is_some() { ", cluster key required" } else { "" }
    ))?;

    // The newest authenticated coordinator wins: its session ends the previous one
    // (a coordinator that died without closing its socket must not block the worker).
    let active: Arc<Mutex<Option<(String, TcpStream)>>> = Arc::default();
    // Sessions ended that way: the old coordinator's address -> the new one's (its own
    // end read as the coordinator's: "connection closed without a shutdown").
    let replaced: Arc<Mutex<std::collections::HashMap<String, String>>> = Arc::default();
    let timeout = Duration::from_secs_f64(a.step_timeout);
    // Connections not yet past the handshake: capped, and each given HANDSHAKE_DEADLINE
    // in all, so that nobody without the key can tie up threads or memory.
    let pending = Arc::new(AtomicUsize::new(0));
    // This device's profile for the ring solver: measured (or loaded) once, when first asked.
    let profiled: Arc<OnceLock<Option<DeviceProfile>>> = Arc::default();
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept failed: {e}");
                continue;
            }
        };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        if pending.load(Ordering::SeqCst) >= MAX_PENDING {
            eprintln!("{peer}: refused, {MAX_PENDING} connections are already in their handshake");
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        pending.fetch_add(1, Ordering::SeqCst);
        let (worker, key, active, budget, pending) = (worker.clone(), key.clone(), active.clone(), a.budget.clone(), pending.clone());
        let replaced = replaced.clone();
        let (profiled, model_path) = (profiled.clone(), model_path.clone());
        std::thread::spawn(move || {
            let mine = stream.try_clone().ok();
            let guard = stream.try_clone().ok();
            let admitted = Arc::new(AtomicBool::new(false));
            if let Ok(w) = stream.try_clone() {
                let admitted = admitted.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(HANDSHAKE_DEADLINE);
                    if !admitted.load(Ordering::SeqCst) {
                        let _ = w.shutdown(Shutdown::Both);
                    }
                });
            }
            let mut counted = true;
            let make = |m: Arc<Model>, n_ctx, n_batch, ct, ring: Option<RingWindows>, kv: Option<usize>| -> Result<Context, hearth_model::ModelError> {
                let mut ctx = Context::with_kv_dim(m.clone(), n_ctx, n_batch, threads, ct, kv.unwrap_or(m.config.kv_dim()))?;
                let window = match ring {
                    Some(w) => {
                        eprintln!("coordinator {peer}: pipelined ring, layers {:?}", w.rounds);
                        ctx.set_ring(w, None)?;
                        hearth_engine::window::apply_ring(&m, &mut ctx, budget.options().as_ref(), false)
                    }
                    None => hearth_engine::window::apply(&m, &mut ctx, budget.options().as_ref(), false),
                };
                window.map_err(|e| hearth_model::ModelError::Context(format!("{e:#}")))?;
                Ok(ctx)
            };
            let profile = || ring_profile(&profiled, model_path.as_deref(), threads, budget.mem_budget);
            let session = || {
                let mut mine = mine;
                let told = |event, shard: &hearth_parallel::NodeShard| match event {
                    SessionEvent::Admitted => {
                        admitted.store(true, Ordering::SeqCst);
                        pending.fetch_sub(1, Ordering::SeqCst);
                        counted = false;
                    }
                    // Only a coordinator that opens a session takes the worker over: one
                    // that measures the link or asks for the profile (`plan`, `profile
                    // --peer`) leaves a running session alone (it ended it, until session 28).
                    SessionEvent::Opening => {
                        let mut cur = active.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some((old_peer, mut old)) = cur.take() {
                            // (Before its session can end and look.)
                            replaced.lock().unwrap_or_else(|p| p.into_inner()).insert(old_peer.clone(), peer.clone());
                            // Tell the old coordinator why (best effort), then end its session.
                            let why = format!("another coordinator ({peer}) {}", hearth_parallel::TAKEN_OVER);
                            let msg = Message::Error(ErrorMsg { failed_node: None, message: why });
                            let _ = write_frame(&mut old, &msg, &mut Vec::new());
                            let _ = old.shutdown(Shutdown::Both);
                            eprintln!("a new coordinator ({peer}) replaces the session of {old_peer}");
                        }
                        *cur = mine.take().map(|s| (peer.clone(), s));
                        // Peak RSS per session: reset the kernel's high-water mark (Linux).
                        let _ = std::fs::write("/proc/self/clear_refs", "5");
                        // A ring session's "shard" is the whole model (its layers come with the session).
                        let whole = shard.kv_heads == (0..shard.dims.n_head_kv) && shard.ffn_rows == (0..shard.dims.n_ff);
                        if whole {
                            // The solver may leave some of the devices offered out of the ring
                            // (it said "node 1 of 3" to a worker of a 2-device ring): the
                            // layers this worker gets are printed when its part arrives.
                            eprintln!("coordinator {peer}: ring session, one of {} devices offered", shard.n_nodes);
                        } else {
                            let (kv, ffn) = (hearth_parallel::span(&shard.kv_heads), hearth_parallel::span(&shard.ffn_rows));
                            eprintln!("coordinator {peer}: node {} of {}, KV heads {kv}, FFN rows {ffn}", shard.node, shard.n_nodes);
                        }
                    }
                };
                hearth_parallel::serve_session(stream, &worker, key.as_ref(), timeout, &profile, &make, told)
            };
            // Whatever happens (a panic included), the connection closes and the slot frees,
            // so the coordinator learns at once instead of waiting for a timeout.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(session));
            if counted {
                pending.fetch_sub(1, Ordering::SeqCst);
            }
            if let Some(g) = guard {
                let _ = g.shutdown(Shutdown::Both);
            }
            let idle = {
                let mut cur = active.lock().unwrap_or_else(|p| p.into_inner());
                if cur.as_ref().is_some_and(|(p, _)| *p == peer) {
                    *cur = None;
                }
                cur.is_none()
            };
            release_freed_memory();
            if let (true, WorkerModel::File { model, .. }) = (idle, &worker) {
                // The weights the session touched stay in the page cache, but leave this
                // process's RSS: an idle worker, and the next session's peak, show only
                // what that session maps (a ring worker given other layers, a tensor
                // worker other rows). The next session re-maps its pages from the cache.
                model.file.release_pages();
            }
            let Ok(r) = r else {
                eprintln!("coordinator {peer}: session aborted by an internal error (a bug: please report it)");
                return;
            };
            if let Some(new) = replaced.lock().unwrap_or_else(|p| p.into_inner()).remove(&peer) {
                eprintln!("coordinator {peer}: session ended: another coordinator ({new}) took over this worker");
                return;
            }
            match r {
                Ok(hearth_parallel::cluster::SessionEnd::Finished { passes, shutdown }) => {
                    let mem = hearth_memory::ProcMemory::read().map(|m| {
                        format!(
                            "; worker peak RSS this session {} (now {} file-backed, {} anonymous)",
                            crate::common::mib(m.peak_rss_bytes),
                            crate::common::mib(m.rss_file_bytes),
                            crate::common::mib(m.rss_anon_bytes)
                        )
                    });
                    // A connection closed without a shutdown: the coordinator exited or
                    // was stopped (perhaps mid-request), not a session that ended cleanly.
                    let how = if shutdown { "session ended" } else { "connection closed without a shutdown (the coordinator exited or was stopped)" };
                    eprintln!("coordinator {peer}: {how} after {passes} forward passes{}", mem.unwrap_or_default())
                }
                Ok(hearth_parallel::cluster::SessionEnd::Unused) => eprintln!(
                    "coordinator {peer}: left without opening a session (a plan, a profile, or a ring that gave this worker no layers)"
                ),
                Ok(hearth_parallel::cluster::SessionEnd::Silent) => eprintln!(
                    "{peer}: closed the connection before a word (a port check, or a coordinator that had reached this worker under another name)"
                ),
                Err(e) => eprintln!("coordinator {peer}: session failed: {e}"),
            }
        });
    }
    Ok(())
}

/// Hands the heap a finished session freed back to the OS. glibc keeps freed
/// memory in its arenas (the session's threads each had one), so an idle worker
/// held its largest session's buffers: 81 MiB anonymous after an 8192-token
/// SmolLM2 session, 18 MiB after a 2048-token one. Elsewhere a no-op.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}
