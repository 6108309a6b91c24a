//! Settings of the per-client limits on the listeners (`serve` flags): the HTTP header
//! deadline ([`crate::net::http`]), the gRPC handshake deadline
//! ([`crate::net::conn_limit::require_h2_preface`]) and the per-address request rates
//! ([`crate::net::rate_limit`]), the live-stream budget ([`crate::net::conn_limit`]) and
//! the report renders at once ([`crate::api::renders`]). The connection limit lives with
//! the TLS flags.

use crate::net::conn_limit::{self, LiveBudget};
use crate::net::rate_limit::{self, RateQuota};
use gpufleet_core::config::parse_duration;
use std::time::Duration;

/// Default for `--max-renders`.
pub const DEFAULT_RENDERS_AT_ONCE: usize = 2;
/// Default for `--render-queue`.
pub const DEFAULT_RENDER_QUEUE: usize = 8;
/// Default for `--render-wait`.
pub const DEFAULT_RENDER_WAIT: Duration = Duration::from_secs(10);
/// Seconds a refused client is asked to wait.
pub const RETRY_AFTER_S: u32 = 2;

/// How many reports and plots are built and wait at once ([`crate::api::renders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    pub at_once: usize,
    pub queue: usize,
    pub wait: Duration,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            at_once: DEFAULT_RENDERS_AT_ONCE,
            queue: DEFAULT_RENDER_QUEUE,
            wait: DEFAULT_RENDER_WAIT,
        }
    }
}

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
    /// Live streams per client address and in all.
    pub live: LiveBudget,
    /// Reports and plots built at once, and how long and how many may wait.
    pub renders: RenderLimits,
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
            live: LiveBudget::default(),
            renders: RenderLimits::default(),
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
    /// Live streams (/api/v1/live, one per dashboard tab) one client address may hold;
    /// more get 503. They do not count against --max-connections-per-ip.
    #[arg(long, env = "GPUFLEET_MAX_LIVE_STREAMS_PER_IP", default_value_t = conn_limit::DEFAULT_LIVE_PER_IP, value_parser = at_least_one, value_name = "N")]
    pub max_live_streams_per_ip: usize,
    /// Live streams open at once from all addresses; more get 503.
    #[arg(long, env = "GPUFLEET_MAX_LIVE_STREAMS", default_value_t = conn_limit::DEFAULT_LIVE_TOTAL, value_parser = at_least_one, value_name = "N")]
    pub max_live_streams: usize,
    /// Reports and report plots built at once (each plot holds its image in memory).
    #[arg(long, env = "GPUFLEET_MAX_RENDERS", default_value_t = DEFAULT_RENDERS_AT_ONCE, value_parser = at_least_one, value_name = "N")]
    pub max_renders: usize,
    /// Report requests that may wait for a render slot; more get 503 at once.
    #[arg(long, env = "GPUFLEET_RENDER_QUEUE", default_value_t = DEFAULT_RENDER_QUEUE, value_name = "N")]
    pub render_queue: usize,
    /// How long a report request waits for a render slot before it gets 503.
    #[arg(long, env = "GPUFLEET_RENDER_WAIT", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub render_wait: Duration,
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a count of at least 1")),
    }
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
            live: LiveBudget {
                per_ip: self.max_live_streams_per_ip,
                total: self.max_live_streams,
            },
            renders: RenderLimits {
                at_once: self.max_renders,
                queue: self.render_queue,
                wait: self.render_wait,
            },
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
