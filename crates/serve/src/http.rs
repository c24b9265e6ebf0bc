//! The HTTP front: routes, API-key check, prompt building, and turning scheduler events
//! into whole responses or SSE streams. A dropped connection drops the event receiver,
//! which cancels the sequence at the scheduler's next step.

use crate::constraint::{self, Constraint};
use crate::engines::Engines;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::{self, Head, Kind};
use crate::request::{self, Format, Params, Prompt};
use crate::sequence::{Event, Finish, Job, TokenLogprob};
use crate::tools::{self, CallStream, Piece, ToolChoice};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use hearth_chat::ChatTemplate;
use hearth_model::sampler::SamplerConfig;
use hearth_model::Model;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// What every handler shares.
pub struct App {
    /// Where requests go (least-loaded engine).
    pub scheduler: Engines,
    /// The served model (tokenizer, vocabulary).
    pub model: Arc<Model>,
    /// The model's chat template, when it has a usable one.
    pub template: Result<ChatTemplate, String>,
    /// The id `/v1/models` lists first and responses carry.
    pub model_id: String,
    /// More names `/v1/models` lists.
    pub aliases: Vec<String>,
    /// Requests must name `model_id` or an alias (or omit it); else any name is served.
    pub strict_model: bool,
    /// `Some`: requests to `/v1/*` need `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Unix seconds the server started.
    pub started: u64,
    /// How `/v1/embeddings` pools an input's hidden states.
    pub pooling: hearth_model::embed::Pooling,
    /// Constrained decoding's per-model state (built on the first constrained request).
    pub grammars: constraint::Grammars,
    /// Browser origins allowed besides this machine's (`*`: any); see [`router`].
    pub cors_origins: Vec<String>,
    /// `--timeout`: how long a request body may pause between chunks (named in the 408).
    pub timeout: std::time::Duration,
}

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    let origins = Origins::new(&app.cors_origins);
    let cors = cors(origins.clone());
    let mut r = Router::new().route("/health", get(health)).route("/metrics", get(metrics));
    // The OpenAI paths, and the same without `/v1` (llama.cpp's server takes both).
    for v in ["/v1", ""] {
        r = r
            .route(&format!("{v}/models"), get(models))
            .route(&format!("{v}/models/{{id}}"), get(model))
            .route(&format!("{v}/chat/completions"), post(chat))
            .route(&format!("{v}/completions"), post(completions))
            .route(&format!("{v}/embeddings"), post(crate::embeddings::embeddings));
    }
    r.fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move { ApiError::wrong_method(&method, uri.path()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
            let refused = refused_origin(&origins, &req);
            let too_large = declared_too_large(&req);
            async move {
                match (refused, too_large) {
                    (Some(origin), _) => ApiError::origin_not_allowed(&origin).into_response(),
                    (None, Some(e)) => e.into_response(),
                    (None, None) => next.run(req).await,
                }
            }
        }))
        .layer(cors)
        .with_state(app)
}

/// Largest request body, bytes: 256 embedding inputs of 2048 token ids fit (≈ 3 MiB).
pub const MAX_BODY: usize = 16 << 20;

/// Browser origins that may call the API: this machine's (`localhost`, `127.0.0.1`,
/// `[::1]`, any port and scheme) and those of `--cors-origin` (`*`: any), as Ollama
/// allows by default.
#[derive(Clone)]
struct Origins {
    any: bool,
    extra: Arc<Vec<String>>,
}

impl Origins {
    fn new(extra: &[String]) -> Origins {
        Origins {
            any: extra.iter().any(|o| o == "*"),
            extra: Arc::new(extra.iter().map(|o| o.trim_end_matches('/').to_string()).collect()),
        }
    }

    fn allow(&self, origin: &HeaderValue) -> bool {
        let Ok(o) = origin.to_str() else { return false };
        if self.any || self.extra.iter().any(|e| e == o) {
            return true;
        }
        // scheme://host[:port] and nothing more, as browsers send it.
        let host = o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")).unwrap_or("");
        let (name, port) = match host.strip_prefix('[') {
            Some(v6) => v6.split_once(']').unwrap_or(("", "x")),
            None => host.split_at(host.find(':').unwrap_or(host.len())),
        };
        let port_ok = port.is_empty()
            || port.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
        port_ok && matches!(name, "localhost" | "127.0.0.1" | "::1")
    }
}

/// Cross-origin requests from allowed origins: preflight `OPTIONS` requests answered,
/// the origin echoed.
fn cors(origins: Origins) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |o: &HeaderValue, _: &axum::http::request::Parts| origins.allow(o)))
        .allow_methods([Method::GET, Method::POST])
        .allow_headers(AllowHeaders::mirror_request())
        .max_age(std::time::Duration::from_secs(3600))
}

/// The origin of a request a browser sent from a page the server does not allow, if it
/// is one. CORS only hides the answer from such a page; a POST that needs no preflight
/// (`Content-Type: text/plain`, as a form sends) would still run, so any web page could
/// make a server without an API key generate. Requests without `Origin` (curl, SDKs)
/// and preflights pass.
fn refused_origin(origins: &Origins, req: &axum::extract::Request) -> Option<String> {
    let origin = req.headers().get(axum::http::header::ORIGIN)?;
    (req.method() != Method::OPTIONS && !origins.allow(origin)).then(|| String::from_utf8_lossy(origin.as_bytes()).into_owned())
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let m = &app.metrics;
    let mut v = serde_json::json!({
        "status": "ok",
        "slots": app.scheduler.n_slots(),
        "engines": app.scheduler.len(),
        "slots_busy": m.active.load(Ordering::Relaxed),
        "queue_depth": m.queue_depth.load(Ordering::Relaxed),
    });
    if let Some(c) = m.cluster.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        v["cluster"] = c.json();
    }
    // Every recent forward pass failed: not healthy (503), with the reason.
    if let Some((n, why)) = m.failing() {
        v["status"] = "error".into();
        v["failed_passes_in_a_row"] = n.into();
        v["error"] = why.into();
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(v)).into_response();
    }
    Json(v).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let r = authorize(&app, &headers).map(|()| {
        let meta = serde_json::json!({"n_ctx_per_slot": app.scheduler.n_ctx(), "slots": app.scheduler.n_slots(),
                                      "n_vocab": app.model.config.n_vocab});
        let data: Vec<_> = std::iter::once(&app.model_id)
            .chain(&app.aliases)
            .map(|id| serde_json::json!({"id": id, "object": "model", "created": app.started, "owned_by": "hearth", "meta": meta}))
            .collect();
        Json(serde_json::json!({"object": "list", "data": data})).into_response()
    });
    answer(&app, "/v1/models", r)
}

/// A 413 for a request whose declared `Content-Length` is over [`MAX_BODY`], answered
/// before any of the body is read. Without it the server read up to the limit first, and
/// to a client that asked `Expect: 100-continue` (curl does above 1 MiB) it said
/// `100 Continue`, so the client sent megabytes only to have them refused.
///
/// Only a POST to a route that reads a body is refused so: any other request gets its
/// own answer (404 for an unknown path, 405 for a wrong method) whatever it declares.
fn declared_too_large(req: &axum::extract::Request) -> Option<ApiError> {
    let path = req.uri().path();
    let route = path.strip_prefix("/v1").unwrap_or(path);
    if req.method() != Method::POST || !matches!(route, "/chat/completions" | "/completions" | "/embeddings") {
        return None;
    }
    let declared: u64 = req.headers().get(axum::http::header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()?;
    (declared > MAX_BODY as u64).then(|| too_large(Some(declared)))
}

/// The 413 for a body over [`MAX_BODY`]: `declared` is its `Content-Length` where the
/// client sent one (a chunked body has none).
fn too_large(declared: Option<u64>) -> ApiError {
    let size = declared.map(|n| format!(" ({n} bytes)")).unwrap_or_default();
    ApiError::request_too_large(format!("the request body{size} is larger than this server's limit of {} MiB", MAX_BODY >> 20))
}

/// Whether reading the body failed because it stalled ([`crate::listen`]'s body timeout).
fn stalled(e: &BytesRejection) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A body axum could not read, as an OpenAI error: over [`MAX_BODY`] (a chunked body
/// that grew past it) is a 413; stalled past `--timeout` a 408; cut short or malformed
/// is `invalid_body`.
pub(crate) fn read_body(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            too_large(None)
        } else if stalled(&e) {
            ApiError::invalid_body(
                axum::http::StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body stopped arriving: nothing came for {} s (the server's --timeout); send the whole body without pausing",
                    app.timeout.as_secs()
                ),
            )
        } else {
            // axum's text ("Failed to buffer the request body: error reading a body from
            // connection") names no cause a client can act on.
            ApiError::invalid_body(
                e.status(),
                "the request body could not be read: it ended before its Content-Length, or its chunks are malformed",
            )
        }
    })
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        authorize(&app, &headers)?;
        let body = read_body(&app, body)?;
        let req = request::chat(&body)?;
        let template = app.template.as_ref().map_err(|e| ApiError::invalid("messages", e.clone()))?;
        let c = tools::conversation(template, req.messages, req.fields, req.tools.as_ref());
        let prompt = crate::chat_prompt_with(&app.model.tokenizer, template, &c.messages, &c.fields, &c.extra)
            .map_err(|e| ApiError::invalid("messages", e))?;
        let grammar = match (&req.params.format, &req.tools) {
            (Some(f), _) => Some((json_grammar(f), "response_format")),
            (None, Some((tools, choice))) => tools::grammar(tools, choice).map(|g| (g, "tools")),
            (None, None) => None,
        };
        let constraints = constraints(&app, grammar, req.params.n).await?;
        let calls = req.tools.as_ref().is_some_and(|(_, c)| *c != ToolChoice::None);
        generate(&app, Kind::Chat, prompt, req.params, "messages", constraints, calls).await
    }
    .await;
    answer(&app, "/v1/chat/completions", r)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        authorize(&app, &headers)?;
        let body = read_body(&app, body)?;
        let req = request::completion(&body)?;
        let prompt = match req.prompt {
            Prompt::Text(t) => app.model.tokenizer.encode(&t, true, true),
            Prompt::Tokens(ids) => {
                let n_vocab = app.model.config.n_vocab;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                    return Err(ApiError::invalid("prompt", format!("token id {bad} is outside the vocabulary (n_vocab {n_vocab})")));
                }
                ids
            }
        };
        let grammar = req.params.format.as_ref().map(|f| (json_grammar(f), "response_format"));
        let constraints = constraints(&app, grammar, req.params.n).await?;
        generate(&app, Kind::Completion, prompt, req.params, "prompt", constraints, false).await
    }
    .await;
    answer(&app, "/v1/completions", r)
}

/// The grammar of a `response_format`: the schema (`json_object`: any object), with
/// compact separators unless the schema sets llguidance's options itself.
fn json_grammar(f: &Format) -> llguidance::api::TopLevelGrammar {
    let mut schema = match f {
        Format::JsonObject => serde_json::json!({"type": "object"}),
        Format::JsonSchema(s) => s.clone(),
    };
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(tools::compact);
    }
    constraint::json_grammar(Some(&schema))
}

/// One matcher per choice for `grammar` (none without one), compiled off the async
/// workers (a large schema takes milliseconds; the first one also builds the token
/// trie). A grammar that does not compile is a 400 naming `field`.
async fn constraints(
    app: &Arc<App>,
    grammar: Option<(llguidance::api::TopLevelGrammar, &'static str)>,
    n: usize,
) -> Result<Vec<Constraint>, ApiError> {
    let Some((g, field)) = grammar else { return Ok(Vec::new()) };
    let a = app.clone();
    let built = tokio::task::spawn_blocking(move || {
        (0..n).map(|_| a.grammars.constraint(&a.model.tokenizer, g.clone())).collect::<Result<Vec<_>, _>>()
    })
    .await;
    match built {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(ApiError::invalid(field, format!("`{field}` cannot be used for constrained decoding: {e}"))),
        Err(e) => Err(ApiError::internal(format!("building the grammar failed: {e}"))),
    }
}

/// Count the answer and turn an error into its JSON response.
pub(crate) fn answer(app: &App, endpoint: &str, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    app.metrics.request(endpoint, resp.status().as_u16());
    resp
}

pub(crate) fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &app.api_key else { return Ok(()) };
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    // Compare without an early exit, so timing does not reveal a matching prefix.
    let same = given.is_some_and(|g| g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0);
    if same {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

impl App {
    /// The id and the aliases.
    pub(crate) fn names(&self) -> Vec<&str> {
        std::iter::once(self.model_id.as_str()).chain(self.aliases.iter().map(String::as_str)).collect()
    }

    /// Whether `name` is the id or an alias.
    pub(crate) fn serves(&self, name: &str) -> bool {
        self.names().contains(&name)
    }

    /// The name a response carries: the one the request asked for when it is the id or an
    /// alias (a client that asked for `b` of `--alias a --alias b` is answered `b`, as
    /// vLLM answers with the served name asked for), else the id.
    pub(crate) fn answer_name<'a>(&'a self, asked: Option<&'a str>) -> &'a str {
        asked.filter(|m| self.serves(m)).unwrap_or(&self.model_id)
    }
}

/// `GET /v1/models/{id}`: one model, as `/v1/models` lists it.
async fn model(State(app): State<Arc<App>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let r = authorize(&app, &headers).and_then(|()| {
        if app.serves(&id) {
            Ok(Json(serde_json::json!({"id": id, "object": "model", "created": app.started, "owned_by": "hearth"})).into_response())
        } else {
            Err(ApiError::unknown_model(&id, &app.names()))
        }
    });
    answer(&app, "/v1/models", r)
}

/// Check the request against the server, queue it, and answer whole or as a stream.
/// `constraints`: one per choice, or none; `calls`: read tool calls out of the text.
async fn generate(
    app: &App,
    kind: Kind,
    prompt: Vec<u32>,
    p: Params,
    prompt_field: &str,
    mut constraints: Vec<Constraint>,
    calls: bool,
) -> Result<Response, ApiError> {
    if let Some(m) = p.model.as_deref().filter(|m| app.strict_model && !m.is_empty() && !app.serves(m)) {
        return Err(ApiError::unknown_model(m, &app.names()));
    }
    // The choices are submitted one by one: more than the server takes at once (its
    // slots and its queue) could never all be admitted.
    let (slots, queue) = (app.scheduler.n_slots(), app.scheduler.queue_size());
    if p.n > slots + queue {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be at most {}, the requests this server takes at once ({slots} slots (--parallel) and a queue of {queue} (--queue-size))", slots + queue),
        ));
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid(prompt_field, "the prompt is empty"));
    }
    request::check_logit_bias(&p, app.model.config.n_vocab)?;
    let n_ctx = app.scheduler.n_ctx();
    if prompt.len() >= n_ctx {
        let mut e = ApiError::context_length(prompt.len(), n_ctx);
        e.param = Some(prompt_field.to_string());
        return Err(e);
    }
    // One job per choice, choice `i` sampling with `seed + i`; they run side by side
    // (batched), and a choice whose client is gone is cancelled with the others.
    let mut rxs = Vec::with_capacity(p.n);
    for i in 0..p.n {
        let (tx, rx) = unbounded_channel();
        let sampler = SamplerConfig { seed: p.sampler.seed.wrapping_add(i as u64), ..p.sampler.clone() };
        app.scheduler.submit(Job {
            prompt: prompt.clone(),
            max_tokens: p.max_tokens.unwrap_or(usize::MAX),
            sampler,
            stop: p.stop.clone(),
            logprobs: p.logprobs,
            ignore_eos: p.ignore_eos,
            events: tx,
            arrived: Instant::now(),
            embed: None,
            constraint: constraints.pop(),
        })?;
        rxs.push(rx);
    }
    let events = merge(rxs);
    let mut head = Head::new(kind, app.answer_name(p.model.as_deref()));
    if kind == Kind::Completion && p.logprobs.is_some() {
        head.prompt_chars = app.model.tokenizer.detokenize(&prompt, true, false).chars().count();
    }
    if p.stream {
        Ok(Sse::new(stream(head, events, p.n, p.include_usage, p.logprobs.is_some(), calls)).into_response())
    } else {
        whole(head, events, p.n, p.logprobs.is_some(), calls).await
    }
}

/// The choices' events as one stream of `(choice index, event)`.
fn merge(rxs: Vec<UnboundedReceiver<Event>>) -> impl futures_util::Stream<Item = (usize, Event)> + Unpin + Send {
    futures_util::stream::select_all(rxs.into_iter().enumerate().map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))))
}

/// Usage over the choices: the prompt (and what the cache held of it) once, the
/// generated tokens of all.
fn add_usage(total: &mut Option<openai::Usage>, prompt: usize, cached: usize, completion: usize) {
    let t = total.get_or_insert(openai::Usage { prompt, cached, completion: 0 });
    t.completion += completion;
}

/// Wait for every choice and answer them as one JSON body.
async fn whole(
    head: Head,
    mut events: impl futures_util::Stream<Item = (usize, Event)> + Unpin,
    n: usize,
    want_lps: bool,
    calls: bool,
) -> Result<Response, ApiError> {
    let mut text = vec![String::new(); n];
    let mut lps = vec![Vec::<TokenLogprob>::new(); n];
    let mut finish = vec![None; n];
    let mut usage = None;
    while let Some((i, ev)) = events.next().await {
        match ev {
            Event::Token { text: t, logprob } => {
                text[i].push_str(&t);
                lps[i].extend(logprob);
            }
            Event::Done { finish: f, prompt_tokens, cached_tokens, completion_tokens } => {
                finish[i] = Some(f);
                add_usage(&mut usage, prompt_tokens, cached_tokens, completion_tokens);
                if finish.iter().all(Option::is_some) {
                    // With tools, each text is read for calls the way a stream is.
                    let mut found = vec![Vec::new(); n];
                    if calls {
                        for i in 0..n {
                            let mut s = CallStream::default();
                            let pieces: Vec<Piece> = s.push(&text[i]).into_iter().chain(s.finish()).collect();
                            text[i].clear();
                            for p in pieces {
                                match p {
                                    Piece::Text(t) => text[i].push_str(&t),
                                    Piece::Call(c) => found[i].push((tools::call_id(), c)),
                                }
                            }
                            if !found[i].is_empty() && finish[i] == Some(Finish::Stop) {
                                finish[i] = Some(Finish::ToolCalls);
                            }
                        }
                    }
                    let choices: Vec<openai::Choice<'_>> = (0..n)
                        .map(|i| openai::Choice {
                            text: &text[i],
                            finish: finish[i].unwrap_or(Finish::Stop),
                            lps: want_lps.then_some(&lps[i][..]),
                            calls: &found[i],
                        })
                        .collect();
                    let u = usage.unwrap_or(openai::Usage { prompt: 0, cached: 0, completion: 0 });
                    return Ok(Json(openai::response(&head, &choices, u)).into_response());
                }
            }
            Event::Failed(m) => return Err(ApiError::internal(m)),
            Event::Unavailable(m) => return Err(ApiError::device_failed(m)),
            Event::Embedding { .. } => return Err(ApiError::internal("the scheduler answered a completion with an embedding")),
        }
    }
    Err(ApiError::unavailable())
}

/// Events as SSE chunks: (chat) a first chunk with the role for each choice, one per
/// token with text, one with each choice's finish reason, the usage chunk if asked, then
/// `[DONE]`.
fn stream(
    head: Head,
    events: impl futures_util::Stream<Item = (usize, Event)> + Unpin + Send + 'static,
    n: usize,
    include_usage: bool,
    want_lps: bool,
    calls: bool,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    let data = |v: serde_json::Value| SseEvent::default().data(v.to_string());
    let mut queue = VecDeque::new();
    if head.kind == Kind::Chat {
        for i in 0..n {
            queue.push_back(data(openai::chunk(&head, i, true, Some(""), None, None)));
        }
    }
    // With tools, each choice's text goes through a call reader: content as it is
    // known, calls when complete (`n_calls`: calls sent so far).
    let readers: Vec<(CallStream, usize)> = if calls { (0..n).map(|_| (CallStream::default(), 0)).collect() } else { Vec::new() };
    // Each choice's next `text_offset` (completions' log-probabilities).
    let offsets = vec![head.prompt_chars; n];
    // (events, queue, choices still running, usage so far, finished, call readers, offsets)
    let state = (events, queue, n, None, false, readers, offsets);
    futures_util::stream::unfold(state, move |(mut events, mut queue, mut running, mut usage, mut finished, mut readers, mut offsets)| {
        let head = head.clone();
        async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    return Some((Ok(e), (events, queue, running, usage, finished, readers, offsets)));
                }
                if finished {
                    return None;
                }
                match events.next().await {
                    Some((i, Event::Token { text, logprob })) => {
                        let lp = logprob.filter(|_| want_lps);
                        let at = offsets[i];
                        if let Some(l) = &lp {
                            offsets[i] += l.token.chars().count();
                        }
                        if let Some((reader, n_calls)) = readers.get_mut(i) {
                            for p in reader.push(&text) {
                                queue.extend(piece_chunks(&head, i, p, n_calls).into_iter().map(data));
                            }
                            if let Some(lp) = lp {
                                queue.push_back(data(openai::chunk(&head, i, false, None, Some((&lp, at)), None)));
                            }
                        } else if !text.is_empty() || lp.is_some() {
                            queue.push_back(data(openai::chunk(&head, i, false, Some(&text), lp.as_ref().map(|l| (l, at)), None)));
                        }
                    }
                    Some((i, Event::Done { mut finish, prompt_tokens, cached_tokens, completion_tokens })) => {
                        if let Some((reader, n_calls)) = readers.get_mut(i) {
                            for p in reader.finish() {
                                queue.extend(piece_chunks(&head, i, p, n_calls).into_iter().map(data));
                            }
                            if *n_calls > 0 && finish == Finish::Stop {
                                finish = Finish::ToolCalls;
                            }
                        }
                        let text = (head.kind == Kind::Completion).then_some("");
                        queue.push_back(data(openai::chunk(&head, i, false, text, None, Some(finish))));
                        add_usage(&mut usage, prompt_tokens, cached_tokens, completion_tokens);
                        running -= 1;
                        if running == 0 {
                            if let (true, Some(u)) = (include_usage, usage) {
                                queue.push_back(data(openai::usage_chunk(&head, u)));
                            }
                            queue.push_back(SseEvent::default().data("[DONE]"));
                            finished = true;
                        }
                    }
                    Some((_, Event::Failed(m))) => {
                        queue.push_back(data(ApiError::internal(m).body()));
                        queue.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                    Some((_, Event::Embedding { .. })) => {
                        queue.push_back(data(ApiError::internal("the scheduler answered a completion with an embedding").body()));
                        queue.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                    Some((_, Event::Unavailable(m))) => {
                        queue.push_back(data(ApiError::device_failed(m).body()));
                        queue.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                    None => {
                        queue.push_back(data(ApiError::unavailable().body()));
                        finished = true;
                    }
                }
            }
        }
    })
}

/// The chunks of one piece of a choice's text under tools: content, or a call (`n_calls`
/// counts the choice's calls, for their indices).
fn piece_chunks(head: &Head, i: usize, p: Piece, n_calls: &mut usize) -> Vec<serde_json::Value> {
    match p {
        Piece::Text(t) => vec![openai::chunk(head, i, false, Some(&t), None, None)],
        Piece::Call(c) => {
            *n_calls += 1;
            openai::tool_call_chunks(head, i, *n_calls - 1, &tools::call_id(), &c).into()
        }
    }
}
