//! Serving the HTTP app on our accept loops with hyper-util's connection builder (in place
//! of `axum::serve`, which has no header deadline):
//!
//! - a connection that has not delivered a complete request head within
//!   `header_timeout` of being accepted is closed: this covers a half-sent request
//!   (slowloris), a connection that sends nothing, and a dribbled HTTP/2 preface; later
//!   requests on a keep-alive HTTP/1 connection get hyper's `header_read_timeout`;
//! - each request carries its peer as `ConnectInfo<SocketAddr>` (for the per-address
//!   rate limit, [`crate::net::rate_limit`]) and its connection's
//!   [`ConnHandle`] (for the live-stream budget, [`crate::net::conn_limit`]);
//! - a connection refused by the per-address limit is answered with a 503
//!   ([`crate::net::refuse`]), never served.
//!
//! Shutdown is graceful: on `stop`, accepting ends, open connections finish their
//! in-flight requests and close (the caller bounds this with its grace period).

use crate::net::conn_limit::{ConnHandle, LimitedConn};
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, mpsc};
use tower::ServiceExt as _;
use tracing::debug;

/// Default for `--http-header-timeout`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on the connections `rx` yields until `stop` completes, then shuts down
/// gracefully.
pub async fn serve<Io>(
    mut rx: mpsc::Receiver<(Io, SocketAddr)>,
    app: Router,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    Io: LimitedConn + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (io, peer) = tokio::select! {
            () = &mut stop => break,
            conn = rx.recv() => match conn {
                Some(conn) => conn,
                // The accept loop ended (shutdown): serve what is open until `stop`.
                None => {
                    (&mut stop).await;
                    break;
                }
            },
        };
        let Some(io) = crate::net::refuse::or_refuse(io, peer) else {
            continue;
        };
        let handle: Option<ConnHandle> = io.limited().handle();
        let first_request = Arc::new(Notify::new());
        let service = {
            let app = app.clone();
            let first_request = Arc::clone(&first_request);
            tower::service_fn(move |mut req: hyper::Request<Incoming>| {
                // Stores a permit: the deadline below sees it whenever it looks.
                first_request.notify_one();
                req.extensions_mut().insert(ConnectInfo(peer));
                if let Some(h) = &handle {
                    req.extensions_mut().insert(h.clone());
                }
                app.clone().oneshot(req)
            })
        };
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(io),
                TowerToHyperService::new(service),
            );
            let conn = watcher.watch(conn);
            let deadline = async {
                if tokio::time::timeout(header_timeout, first_request.notified())
                    .await
                    .is_ok()
                {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                r = conn => if let Err(e) = r {
                    debug!(peer = %peer, error = %e, "HTTP connection ended with an error");
                },
                () = deadline => debug!(
                    peer = %peer,
                    timeout_ms = header_timeout.as_millis(),
                    "HTTP connection closed: no complete request head within the header timeout"
                ),
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}
