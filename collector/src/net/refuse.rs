//! Answering the connections the per-address limit refused ([`crate::net::conn_limit`]):
//! a client over the limit is told why instead of seeing its connection vanish.
//!
//! - HTTP listener: every request gets `503 Service Unavailable` with `Retry-After` and
//!   `{"error": reason}` (and `Connection: close` on HTTP/1).
//! - gRPC listener: every call gets `UNAVAILABLE` with the reason as its message (a
//!   trailers-only answer), which agents retry with their backoff.
//!
//! Each answer is served by hyper on the refused connection itself (after its TLS
//! handshake, with TLS), for one request, within [`REFUSAL_DEADLINE`]; the connection
//! holds one of the listener's bounded refusal permits until then.

use crate::net::conn_limit::{LimitedConn, Listener, REFUSAL_DEADLINE};
use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, Version, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tracing::debug;

/// Seconds a refused client is asked to wait (`Retry-After`).
pub const RETRY_AFTER_S: u32 = 5;

/// Gives `io` back when it was admitted; when it was refused, answers it in a task of its
/// own and returns `None`.
pub fn or_refuse<Io>(io: Io, peer: SocketAddr) -> Option<Io>
where
    Io: LimitedConn + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(refusal) = io.limited().refusal() else {
        return Some(io);
    };
    let (listener, reason) = (refusal.listener, Arc::<str>::from(refusal.reason.as_str()));
    tokio::spawn(async move {
        if tokio::time::timeout(REFUSAL_DEADLINE, answer(io, listener, reason))
            .await
            .is_err()
        {
            debug!(peer = %peer, "refused connection closed: no request within the deadline");
        }
    });
    None
}

/// Like [`or_refuse`], for a channel of connections: the admitted ones come out of the
/// returned channel, the refused ones are answered.
pub fn admitted<Io>(
    mut rx: tokio::sync::mpsc::Receiver<(Io, SocketAddr)>,
) -> tokio::sync::mpsc::Receiver<(Io, SocketAddr)>
where
    Io: LimitedConn + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, out) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                () = tx.closed() => None,
                c = rx.recv() => c,
            };
            let Some((io, peer)) = next else { break };
            if let Some(io) = or_refuse(io, peer)
                && tx.send((io, peer)).await.is_err()
            {
                break;
            }
        }
    });
    out
}

/// Serves `io` until it has had one answer, then closes it.
async fn answer<Io>(io: Io, listener: Listener, reason: Arc<str>)
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let answered = Arc::new(Notify::new());
    let service = {
        let answered = Arc::clone(&answered);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            answered.notify_one();
            let response = refusal(listener, &reason, request.version());
            async move { Ok::<_, Infallible>(response) }
        })
    };
    let io = TokioIo::new(io);
    let result = match listener {
        Listener::Http => {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => r,
                () = answered.notified() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
        Listener::Grpc => {
            let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => r.map_err(Into::into),
                () = answered.notified() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await.map_err(Into::into)
                }
            }
        }
    };
    if let Err(e) = result {
        debug!(error = %e, "refused connection ended with an error");
    }
}

/// The answer to every request on a refused connection.
fn refusal(listener: Listener, reason: &str, version: Version) -> Response<Body> {
    let mut response = match listener {
        Listener::Http => {
            let body = serde_json::json!({ "error": reason }).to_string();
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if version < Version::HTTP_2 {
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
        Listener::Grpc => {
            // Trailers-only: status and message in the headers, no body.
            let mut r = Response::new(Body::empty());
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert("grpc-status", HeaderValue::from_static("14"));
            if let Ok(v) = HeaderValue::from_str(&grpc_message(reason)) {
                h.insert("grpc-message", v);
            }
            r
        }
    };
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    response
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII, and `%`.
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_refusal_is_a_503_with_its_reason_and_retry_after() {
        let r = refusal(Listener::Http, "too many (8 open)", Version::HTTP_11);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        assert_eq!(r.headers()[header::CONNECTION], "close");
        let r2 = refusal(Listener::Http, "x", Version::HTTP_2);
        assert!(
            r2.headers().get(header::CONNECTION).is_none(),
            "not on HTTP/2"
        );
    }

    #[test]
    fn a_grpc_refusal_is_unavailable_with_an_encoded_message() {
        let r = refusal(Listener::Grpc, "100% full, é", Version::HTTP_2);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()["grpc-message"], "100%25 full, %C3%A9");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/grpc");
    }
}
