//! `hearth worker`: a daemon that computes its share of a model for a coordinator
//! (`hearth generate --workers …`), one coordinator session at a time.

use crate::cluster::{parse_secs, read_key};
use crate::common::{resolve_model, threads_or_default};
use anyhow::{Context as _, Result};
use hearth_model::Model;
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
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Worker threads, 1-1024 [default: number of physical cores]
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Shared secret: coordinators must prove it (and this worker proves it to them)
    #[arg(long, value_name = "KEY", conflicts_with = "cluster_key_file", env = "HEARTH_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
    /// Read the shared secret from a file (first line)
    #[arg(long, value_name = "PATH")]
    pub cluster_key_file: Option<PathBuf>,
    /// Seconds to wait for the coordinator within a forward pass
    #[arg(long, default_value_t = 5.0, value_parser = parse_secs)]
    pub step_timeout: f64,
}

pub fn run(a: Args) -> Result<()> {
    let path = resolve_model(a.model.as_ref())?;
    let model = Arc::new(Model::load(&path).with_context(|| format!("loading {}", path.display()))?);
    let key = read_key(a.cluster_key.as_deref(), a.cluster_key_file.as_deref())?;
    let sha = hearth_parallel::model_hash::file_sha256(&path).with_context(|| format!("hashing {}", path.display()))?;
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
        "hearth worker listening on {addr} (model {}, SHA-256 {}, {threads} threads{})\n",
        path.display(),
        hearth_parallel::wire::hex(&sha),
        if key.is_some() { ", cluster key required" } else { "" }
    ))?;

    // The newest authenticated coordinator wins: its session ends the previous one
    // (a coordinator that died without closing its socket must not block the worker).
    let active: Arc<Mutex<Option<TcpStream>>> = Arc::default();
    let timeout = Duration::from_secs_f64(a.step_timeout);
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept failed: {e}");
                continue;
            }
        };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        let (model, key, active) = (model.clone(), key.clone(), active.clone());
        std::thread::spawn(move || {
            let mine = stream.try_clone().ok();
            let r = hearth_parallel::serve_session(stream, &model, &sha, key.as_ref(), threads, timeout, |shard| {
                let mut cur = active.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(old) = cur.take() {
                    let _ = old.shutdown(Shutdown::Both);
                    eprintln!("a new coordinator ({peer}) replaces the previous session");
                }
                *cur = mine;
                eprintln!(
                    "coordinator {peer}: node {} of {}, KV heads {:?}, FFN rows {:?}",
                    shard.node, shard.n_nodes, shard.kv_heads, shard.ffn_rows
                );
            });
            match r {
                Ok(hearth_parallel::cluster::SessionEnd::Finished { passes }) => {
                    let mem = hearth_memory::ProcMemory::read().map(|m| {
                        format!(
                            "; worker peak RSS {} (now {} file-backed, {} anonymous)",
                            crate::common::mib(m.peak_rss_bytes),
                            crate::common::mib(m.rss_file_bytes),
                            crate::common::mib(m.rss_anon_bytes)
                        )
                    });
                    eprintln!("coordinator {peer}: session ended after {passes} forward passes{}", mem.unwrap_or_default())
                }
                Err(e) => eprintln!("coordinator {peer}: session failed: {e}"),
            }
        });
    }
    Ok(())
}
