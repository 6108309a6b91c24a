//! Settings of the per-client limits on the listeners (`serve` flags): the HTTP header
//! deadline ([`crate::net::http`]), the gRPC handshake deadline
//! ([`crate::net::conn_limit::require_h2_preface`]) and the per-address request rates
//! ([`crate::net::rate_limit`]). The connection limit lives with the TLS flags.

use crate::net::rate_limit::{self, RateQuota};
use gpufleet_core::config::parse_duration;
use std::time::Duration;

/// The limits `serve` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOptions {
    /// How long a new HTTP connection gets to deliver a complete request head.
    pub http_header_timeout: Duration,
    /// HTTP requests per second per client address.
    pub http_rate: RateQuota,
    /// New gRPC streams per second per client address.
    pub grpc_stream_rate: RateQuota,
    /// How long a new gRPC connection gets to send the HTTP/2 preface (after its TLS
    /// handshake, with TLS)
    /// ([`crate::net::conn_limit::require_h2_preface`]).
    pub grpc_handshake_timeout: Duration,
}

impl Default for LimitOptions {
    fn default() -> Self {
        LimitOptions {
            http_header_timeout: crate::net::http::DEFAULT_HEADER_TIMEOUT,
            http_rate: RateQuota {
                per_second: rate_limit::DEFAULT_HTTP_RATE,
                burst: rate_limit::DEFAULT_HTTP_BURST,
            },
            grpc_stream_rate: RateQuota {
                per_second: rate_limit::DEFAULT_GRPC_STREAM_RATE,
                burst: rate_limit::DEFAULT_GRPC_STREAM_BURST,
            },
            grpc_handshake_timeout: crate::net::conn_limit::DEFAULT_H2_PREFACE_TIMEOUT,
        }
    }
}

/// Command-line flags for [`LimitOptions`].
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// How long a new HTTP connection gets to send a complete request head; slower ones
    /// are closed (slowloris).
    #[arg(long, env = "GPUFLEET_HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = positive_duration, value_name = "DURATION")]
    pub http_header_timeout: Duration,
    /// HTTP requests per second per client address (0: no limit); more get 429 with
    /// Retry-After.
    #[arg(long, env = "GPUFLEET_HTTP_RATE_LIMIT", default_value_t = rate_limit::DEFAULT_HTTP_RATE, value_name = "N")]
    pub http_rate_limit: u32,
    /// HTTP requests one client address may make at once before --http-rate-limit applies.
    #[arg(long, env = "GPUFLEET_HTTP_RATE_BURST", default_value_t = rate_limit::DEFAULT_HTTP_BURST, value_name = "N")]
    pub http_rate_burst: u32,
    /// New gRPC streams per second per client address (0: no limit); more are refused
    /// with RESOURCE_EXHAUSTED.
    #[arg(long, env = "GPUFLEET_GRPC_STREAM_RATE_LIMIT", default_value_t = rate_limit::DEFAULT_GRPC_STREAM_RATE, value_name = "N")]
    pub grpc_stream_rate_limit: u32,
    /// New gRPC streams one client address may open at once before
    /// --grpc-stream-rate-limit applies.
    #[arg(long, env = "GPUFLEET_GRPC_STREAM_RATE_BURST", default_value_t = rate_limit::DEFAULT_GRPC_STREAM_BURST, value_name = "N")]
    pub grpc_stream_rate_burst: u32,
    /// How long a new gRPC connection gets to start HTTP/2 (send its preface, after the
    /// TLS handshake with TLS); silent ones are closed, so bare connections cannot hold
    /// the per-address connection slots.
    #[arg(long, env = "GPUFLEET_GRPC_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = positive_duration, value_name = "DURATION")]
    pub grpc_handshake_timeout: Duration,
}

/// A duration above zero (a zero header timeout would close every connection).
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be longer than 0, e.g. 10s".into());
    }
    Ok(d)
}

impl LimitArgs {
    pub fn options(&self) -> LimitOptions {
        LimitOptions {
            http_header_timeout: self.http_header_timeout,
            http_rate: RateQuota {
                per_second: self.http_rate_limit,
                burst: self.http_rate_burst,
            },
            grpc_stream_rate: RateQuota {
                per_second: self.grpc_stream_rate_limit,
                burst: self.grpc_stream_rate_burst,
            },
            grpc_handshake_timeout: self.grpc_handshake_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_header_timeout_is_refused() {
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("250ms"), Ok(Duration::from_millis(250)));
    }
}
