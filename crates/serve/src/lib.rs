//! `hearth serve`: an OpenAI-compatible HTTP server over one model, with continuous
//! batching.
//!
//! - [`scheduler`]: the thread that owns the model context and its KV cache slots and
//!   runs all active sequences in one forward pass per step.
//! - [`engines`]: worker groups — several schedulers behind one front, least-loaded routing.
//! - [`sequence`]: one request's state in a slot (sampling, detokenizing, stop strings).
//! - [`http`]: routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`), API key, SSE streaming.
//! - [`request`] / [`openai`] / [`error`]: request parsing, response and error bodies.
//! - [`metrics`]: Prometheus counters and histograms.
//! - [`topology`]: CPUs for pinned worker groups (NUMA nodes first, then cores).
#![deny(missing_docs)]

pub mod engines;
pub mod error;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod request;
pub mod scheduler;
pub mod sequence;
pub mod stop;
pub mod topology;

use hearth_chat::ChatTemplate;
use hearth_model::{Context, Model};
use std::sync::Arc;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1`, `0.0.0.0`, `::1`).
    pub host: String,
    /// Port (0: any free one; the listening line says which).
    pub port: u16,
    /// Requests to `/v1/*` must carry `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot; more are answered 429.
    pub queue_size: usize,
    /// The model id clients name.
    pub model_id: String,
}

/// The model's chat template, ready to render (an error message when it has none).
pub fn chat_template(model: &Model) -> Result<ChatTemplate, String> {
    let src = model.chat_template().ok_or("this model has no chat template (tokenizer.chat_template): use /v1/completions")?;
    let tok = &model.tokenizer;
    let text = |id: Option<u32>| id.map(|i| tok.token_text(i).to_string()).unwrap_or_default();
    ChatTemplate::new(src, &text(tok.bos()), &text(tok.eos())).map_err(|e| format!("the model's chat template does not compile: {e}"))
}

/// One engine of a server: a context (its slots are the sequences it generates at once;
/// [`Context::n_batch`] the tokens per step) and, optionally, the CPUs to pin its threads to.
pub struct Engine {
    /// The context, with its slots set.
    pub ctx: Context,
    /// CPUs for its threads (thread `i` on `pin[i % len]`), or `None` to leave them free.
    pub pin: Option<Vec<usize>>,
}

/// Serve `engines` (one, or a worker group each; requests go to the least loaded) until
/// Ctrl-C or SIGTERM. Prints `hearth serve listening on http://ADDR` to stderr once
/// requests are accepted.
pub fn serve(engines: Vec<Engine>, opts: ServeOptions) -> std::io::Result<()> {
    let metrics = Arc::new(metrics::Metrics::default());
    let Some(model) = engines.first().map(|e| e.ctx.model().clone()) else {
        return Err(std::io::Error::other("no engine to serve with"));
    };
    let template = chat_template(&model);
    let mut schedulers = Vec::new();
    for (id, e) in engines.into_iter().enumerate() {
        schedulers.push(scheduler::Scheduler::start(e.ctx, opts.queue_size, metrics.clone(), e.pin, id)?.0);
    }
    let scheduler = engines::Engines::new(schedulers).ok_or_else(|| std::io::Error::other("no engine to serve with"))?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let app = Arc::new(http::App { scheduler, model, template, model_id: opts.model_id, api_key: opts.api_key, metrics, started });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port)).await?;
        eprintln!("hearth serve listening on http://{}", listener.local_addr()?);
        axum::serve(listener, http::router(app)).with_graceful_shutdown(shutdown()).await
    })
}

/// Ctrl-C or SIGTERM.
async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
