//! The listeners: accept loops, TLS and per-client limits on both the gRPC and the HTTP
//! listener, and warnings about what is exposed without credentials.
//!
//! - [`http`]: serving the HTTP app on our accept loops, with a header deadline.
//! - [`tls`]: TLS on both listeners (rustls), mTLS, certificate reload.
//! - [`certs`]: a development CA and certificates (rcgen) for `certs`.
//! - [`conn_limit`]: per-address connection limits, the live-stream budget, the accept
//!   loops.
//! - [`refuse`]: the answer (HTTP 503, gRPC `UNAVAILABLE`) of a connection over the limit.
//! - [`rate_limit`]: per-address request-rate limits.
//! - [`limits`]: the `serve` flags that configure those limits.
//! - [`exposure`]: warnings for listeners open beyond loopback without TLS or credentials.

pub mod certs;
pub mod conn_limit;
pub mod exposure;
pub mod http;
pub mod limits;
pub mod rate_limit;
pub mod refuse;
pub mod tls;
