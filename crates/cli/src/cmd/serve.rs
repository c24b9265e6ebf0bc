//! `hearth serve`: the OpenAI-compatible HTTP server (crate `hearth-serve`) over one
//! model context with `--parallel` KV cache slots, batched continuously.

use crate::common::{resolve_model, threads_or_default, ModelArgs};
use anyhow::{bail, Context as _, Result};

/// Flags of `hearth serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model, threads, context, KV cache type, memory budget, workers. --parallel N sets
    /// the KV cache slots (sequences generated at once); -c is positions per slot
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (an IPv6 one with or without brackets: ::1, [::1])
    #[arg(long, default_value = "127.0.0.1", value_parser = parse_host)]
    pub host: String,
    /// Port to listen on (0: any free port; the listening line says which)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests that may wait once every slot is taken (per engine); more are refused with 429
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue_size: u32,
    /// Engine instances (worker groups), each with its own --parallel slots and --threads
    /// threads (default: physical cores / G), behind one HTTP front; requests go to the
    /// least-loaded one. The weights are mapped once and shared; with --pin each group
    /// gets its own cores (NUMA nodes first)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub groups: u32,
    /// Require `Authorization: Bearer KEY` on /v1/* requests
    #[arg(long, env = "HEARTH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A name of the served model (repeatable): the first is the id /v1/models lists first
    /// [default: the file name without .gguf]; the others are listed too. A response
    /// carries the name its request asked for when it is one of these, else the id
    #[arg(long, value_name = "NAME", value_parser = parse_alias)]
    pub alias: Vec<String>,
    /// Answer 404 to a request naming a model other than the id or an --alias (by default
    /// any name is served, as clients often send a fixed one such as gpt-4o-mini)
    #[arg(long)]
    pub strict_model: bool,
    /// Evaluate every prompt from its start: no reuse of the K/V a finished request left
    /// in its slot (the prompt cache, on by default, keeps it and serves a prompt that
    /// shares its prefix, e.g. a chat's next turn, from there)
    #[arg(long)]
    pub no_prompt_cache: bool,
    /// How /v1/embeddings pools an input's final hidden states (after the output norm)
    /// into one unit vector: mean, cls (first token) or last (last token, what decoder
    /// embedding models use) [default: the file's pooling_type, else mean]
    #[arg(long, value_enum)]
    pub pooling: Option<PoolingArg>,
    /// A browser origin allowed to call the API (CORS), e.g. https://chat.example.org
    /// (repeatable; `*`: any). Pages served from this machine (localhost, 127.0.0.1, [::1],
    /// any port) are always allowed
    #[arg(long, value_name = "ORIGIN", value_parser = parse_origin)]
    pub cors_origin: Vec<String>,
    /// Seconds a request's headers may take to arrive in all (later: the connection is
    /// closed; so is an idle keep-alive connection after this long) and its body may pause
    /// between chunks (longer: a 408 answer). 1 to 86400; a generation's own length is not
    /// limited
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub timeout: u64,
    /// With --workers: seconds after a worker failed to look for it again (a TCP connect,
    /// then while idle every SECS); once it answers, the engine is set up again with it
    /// (a ring's solver re-plans over all the devices). After a failed attempt the wait
    /// doubles, up to 10 minutes. 0: a failed worker stays out until the server restarts
    /// [default: 10]
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub rejoin: Option<u64>,
    /// Speculative decoding for every request (--draft ngram or --draft-model; the tokens are those without it)
    #[command(flatten)]
    pub spec: crate::speculative::SpecArgs,
}

/// `--pooling` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingArg {
    /// The mean over the input's tokens
    Mean,
    /// The first token's
    Cls,
    /// The last token's
    Last,
}

impl From<PoolingArg> for hearth_model::embed::Pooling {
    fn from(p: PoolingArg) -> Self {
        match p {
            PoolingArg::Mean => Self::Mean,
            PoolingArg::Cls => Self::Cls,
            PoolingArg::Last => Self::Last,
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    // A client that disconnects must not kill the server with SIGPIPE (main sets it to
    // the default for CLI pipes).
    #[cfg(unix)]
    // SAFETY: setting a signal disposition before the server's threads start.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if a.model.ctx_size == Some(1) {
        bail!("--ctx-size 1 leaves no position to generate into: a slot needs at least 2");
    }
    let draft = a
        .spec
        .enabled()
        .then(|| hearth_serve::Draft { max: a.spec.draft_max.map_or(16, |n| n as usize), min: a.spec.draft_min.map_or(1, |n| n as usize) });
    a.spec.check()?;
    // A bad --host or a taken port is found before the model loads, not after.
    if let Err(e) = std::net::ToSocketAddrs::to_socket_addrs(&(a.host.as_str(), a.port)) {
        bail!("--host {}: {e}", a.host);
    }
    let listener = std::net::TcpListener::bind((a.host.as_str(), a.port)).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => " (another server is on that port: stop it, or pick another with --port)",
            std::io::ErrorKind::AddrNotAvailable => " (no interface of this machine has that address: see --host)",
            std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges: pick another with --port)",
            _ => "",
        };
        anyhow::anyhow!("cannot listen on {}: {e}{hint}", address(&a.host, a.port))
    })?;
    let path = resolve_model(a.model.model.as_ref())?;
    let model = a.model.load()?;
    let draft_model = match &a.spec.draft_model {
        Some(p) => {
            let d = hearth_model::Model::load(p).with_context(|| format!("loading the draft model {}", p.display()))?;
            hearth_model::speculative::same_vocabulary(&d, &model).with_context(|| format!("--draft-model {}", p.display()))?;
            Some(std::sync::Arc::new(d))
        }
        None => None,
    };
    let groups = a.groups as usize;
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty: give a key, or leave the flag out to serve without one");
    }
    let across = a.model.cluster.enabled();
    if a.rejoin.is_some() && !across {
        bail!("--rejoin only applies to a run across devices: add --workers HOST:PORT,... or --cluster FILE");
    }
    if groups > 1 && (across || a.model.budget.mem_budget.is_some()) {
        bail!(
            "--groups {groups} runs several engines on this machine; with {} there is one engine (give --groups 1)",
            if across { "workers (a worker serves one group at a time)" } else { "--mem-budget (one window of streamed layers)" }
        );
    }
    // Across devices a context holds one sequence: requests wait their turn.
    let mut slots = a.model.cluster.slots().map_or(if across { 1 } else { 4 }, |n| n as usize);
    let cores = threads_or_default(None);
    if groups > cores {
        eprintln!("warning: --groups {groups} engines on {cores} cores: engines will share cores and slow each other down");
    }
    let threads = a.model.threads.map_or_else(|| (threads_or_default(None) / groups).max(1), usize::from);
    let cpus = if a.model.pin {
        let order = hearth_kernels::affinity::pin_order();
        hearth_serve::topology::group_cpus(&order, &hearth_serve::topology::numa_nodes(), groups, threads)
            .map_err(|e| anyhow::anyhow!("--pin: {e}"))?
    } else {
        Vec::new()
    };
    let mut opts = a.model.engine_options_with_slots(&model, 2048, false, slots)?;
    opts.n_threads = threads;
    // Pinned from each engine's scheduler thread, to its own CPUs.
    opts.pin = false;
    // Every pass on the f32 attention path (see hearth_serve::scheduler): workers too.
    opts.f32_attention_from = Some(1);
    let mut engines = Vec::with_capacity(groups);
    for g in 0..groups {
        let mut p = hearth_engine::prepare(&model, &opts)?;
        if p.cluster.as_ref().is_some_and(|c| c.workers.is_empty()) {
            // The ring's solver left every worker out: this is one machine, with its slots.
            drop(p);
            slots = a.model.cluster.slots().map_or(4, |n| n as usize);
            (opts.cluster, opts.slots) = (None, slots);
            eprintln!("hearth serve: the ring is this machine alone, so it serves as one machine ({slots} slots, batched)");
            p = hearth_engine::prepare(&model, &opts)?;
        }
        let setup = p.cluster.as_ref().map(|c| (opts.clone(), c.layout(), c.workers.clone()));
        // The draft model's context: one slot per engine slot, on the engine's threads.
        let draft_ctx = match (&draft_model, &a.spec.draft_model) {
            (Some(d), Some(path)) => {
                if g == 0 {
                    crate::speculative::warn_short_draft(path, d, p.ctx.n_ctx());
                }
                let mut dc = crate::speculative::draft_context(path, d.clone(), p.ctx.n_ctx(), p.ctx.n_batch(), p.ctx.n_threads())?;
                dc.set_slots(p.ctx.n_slots()).context("the draft model's slots")?;
                Some(dc)
            }
            _ => None,
        };
        engines.push(hearth_serve::Engine { ctx: p.ctx, pin: cpus.get(g).cloned(), across: setup, draft: draft_ctx });
    }
    let across = engines[0].across.is_some();
    let ctx = &engines[0].ctx;
    let pooling =
        a.pooling.map(Into::into).or_else(|| hearth_model::embed::Pooling::of_model(&model)).unwrap_or(hearth_model::embed::Pooling::Mean);
    let model_id = a.alias.first().cloned().unwrap_or_else(|| {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });
    eprintln!(
        "hearth serve: {model_id}, {groups} engine(s) × {} × {} positions (KV cache {:.1} MiB per engine), {} tokens per step, \
         {} each, embeddings pooled by {}{}{}{}",
        hearth_engine::plural(slots, "slot"),
        ctx.n_ctx(),
        ctx.kv_bytes() as f64 / (1 << 20) as f64,
        ctx.n_batch(),
        hearth_engine::plural(ctx.n_threads(), "thread"),
        pooling.name(),
        if a.model.pin { format!(", pinned to CPUs {cpus:?}") } else { String::new() },
        if across { "; across devices a context holds one sequence, so requests take turns (no batching)" } else { "" },
        draft.map_or(String::new(), |d| format!(", speculative decoding with {} (up to {} guesses)", a.spec.describe(), d.max)),
    );
    // Each name once: a repeated one would be listed twice.
    let mut aliases: Vec<String> = Vec::new();
    for n in a.alias.iter().skip(1) {
        if *n != model_id && !aliases.contains(n) {
            aliases.push(n.clone());
        }
    }
    let opts = hearth_serve::ServeOptions {
        api_key: a.api_key,
        queue_size: a.queue_size as usize,
        model_id,
        aliases,
        strict_model: a.strict_model,
        prompt_cache: !a.no_prompt_cache,
        pooling: Some(pooling),
        draft,
        cors_origins: a.cors_origin,
        timeout: std::time::Duration::from_secs(a.timeout),
        rejoin: Some(a.rejoin.unwrap_or(10)).filter(|&s| s > 0).map(std::time::Duration::from_secs),
    };
    hearth_serve::serve(engines, listener, opts).context("serving")
}

/// `HOST:PORT`, with an IPv6 host in brackets.
fn address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `--alias`: a name a client can send (not empty, no surrounding spaces).
fn parse_alias(s: &str) -> Result<String, String> {
    if s.is_empty() || s.trim() != s {
        return Err(format!("{s:?}: a model name must be non-empty, without spaces around it"));
    }
    Ok(s.to_string())
}

/// `--host`: brackets around an IPv6 address (`[::1]`, as the listening line prints it)
/// are dropped.
fn parse_host(s: &str) -> Result<String, String> {
    Ok(s.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(s).to_string())
}

/// `--cors-origin`: `*`, `null`, or `scheme://host[:port]` as a browser sends it in
/// `Origin` (lowercase, no default port, no path): a value pasted from the address bar
/// (`https://App.example/`) is brought to that form; one that can never match is refused.
fn parse_origin(s: &str) -> Result<String, String> {
    if s == "*" || s == "null" {
        return Ok(s.to_string());
    }
    let lower = s.trim_end_matches('/').to_ascii_lowercase();
    let Some((scheme, host)) = lower.split_once("://").filter(|(_, h)| !h.is_empty()) else {
        return Err(format!("{s:?} is not an origin: give scheme://host[:port], e.g. https://chat.example.org, or * for any"));
    };
    if host.contains(['/', '?', '#', '@']) {
        return Err(format!("{s:?} is not an origin: an origin has no path, query or user (give {scheme}://HOST[:PORT])"));
    }
    let host = match (scheme, host.rsplit_once(':')) {
        ("https", Some((h, "443"))) | ("http", Some((h, "80"))) if !h.ends_with(':') => h,
        _ => host,
    };
    Ok(format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_take_the_form_browsers_send() {
        for (given, want) in [
            ("https://App.Example/", "https://app.example"),
            ("https://app.example:443", "https://app.example"),
            ("http://app.example:80", "http://app.example"),
            ("https://app.example:8443", "https://app.example:8443"),
            ("http://[::1]:80", "http://[::1]"),
            ("*", "*"),
            ("null", "null"),
        ] {
            assert_eq!(parse_origin(given).as_deref(), Ok(want), "{given}");
        }
        for bad in ["app.example", "", "https://", "https://app.example/chat", "https://u@app.example"] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_host("[::1]").as_deref(), Ok("::1"));
        assert_eq!(parse_host("::1").as_deref(), Ok("::1"));
    }
}
