//! Accepting connections: HTTP/1.1 on hyper, with what `axum::serve` does not let us set.
//! - A request whose headers or body stop arriving for `timeout` is cut off: headers by
//!   closing the connection, a body with 408 (see [`crate::http::read_body`]). A slow or
//!   dead client then holds its connection for at most that long, not forever.
//! - Connections are tracked, so a stop can wait for the answers in flight.
//!
//! Half-closed clients (`shutdown(SHUT_WR)` after the request, as `nc -N` does) get no
//! answer: the end of their input reads as a client gone, which is what cancels a
//! non-streaming request whose client gave up (both look the same from the server until
//! it writes).

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tower_http::timeout::RequestBodyTimeout;

/// Serve `router` on every connection `listener` accepts, each watched by `connections`.
/// Runs until dropped (accept errors such as running out of file descriptors pause it
/// for a moment instead of ending it).
pub(crate) async fn accept(listener: tokio::net::TcpListener, router: axum::Router, timeout: Duration, connections: &GracefulShutdown) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(timeout);
    // The body's timeout applies between its chunks (a body sent slowly but steadily passes).
    let service = TowerToHyperService::new(RequestBodyTimeout::new(router, timeout));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // Streamed tokens go out as they come, not held back by Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let conn = connections.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
        tokio::spawn(async move {
            // A client that vanished mid-request is its own loss; nothing to report.
            let _ = conn.await;
        });
    }
}

/// Errors of one connection (the client gave up before it was accepted), not of the
/// listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}
