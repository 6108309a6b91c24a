//! Request-rate limits per client address, on both listeners: keyed token buckets
//! (GCRA, the `governor` crate), one bucket per IP address. A flood from one address
//! gets refused (HTTP 429 with `Retry-After`; gRPC `RESOURCE_EXHAUSTED` on new streams)
//! while other addresses keep their full rate.
//!
//! The per-address state is bounded: at most [`MAX_TRACKED_ADDRESSES`] buckets. When
//! that many are held, buckets that have refilled (idle addresses) are dropped; if the
//! table is still full, addresses without a bucket are let through unmetered rather than
//! growing it (the connection limit still applies to them).

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tracing::debug;

/// Most client addresses with a bucket at once, per limiter.
pub const MAX_TRACKED_ADDRESSES: usize = 100_000;
/// Defaults for `--http-rate-limit` / `--http-rate-burst`: generous, because a dashboard
/// loads one series per GPU and metric at once, and everyone behind a NAT or a reverse
/// proxy shares one address; a flood (thousands a second) is still cut.
pub const DEFAULT_HTTP_RATE: u32 = 100;
pub const DEFAULT_HTTP_BURST: u32 = 1000;
/// Defaults for `--grpc-stream-rate-limit` / `--grpc-stream-rate-burst` (new streams per
/// second per address; an agent opens one and keeps it).
pub const DEFAULT_GRPC_STREAM_RATE: u32 = 10;
pub const DEFAULT_GRPC_STREAM_BURST: u32 = 50;

/// Requests per second per address, with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateQuota {
    /// Sustained rate; 0 turns the limit off.
    pub per_second: u32,
    /// Requests allowed at once from a full bucket (at least 1).
    pub burst: u32,
}

/// A per-address rate limiter.
#[derive(Debug)]
pub struct PerIpRate {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
    max_tracked: usize,
}

impl PerIpRate {
    /// `None` when the quota's rate is 0 (no limit).
    pub fn new(quota: RateQuota) -> Option<Arc<PerIpRate>> {
        Self::with_capacity(quota, MAX_TRACKED_ADDRESSES)
    }

    fn with_capacity(quota: RateQuota, max_tracked: usize) -> Option<Arc<PerIpRate>> {
        let rate = NonZeroU32::new(quota.per_second)?;
        let burst = NonZeroU32::new(quota.burst).unwrap_or(NonZeroU32::MIN);
        let clock = DefaultClock::default();
        Some(Arc::new(PerIpRate {
            limiter: RateLimiter::dashmap_with_clock(
                Quota::per_second(rate).allow_burst(burst),
                clock.clone(),
            ),
            clock,
            max_tracked: max_tracked.max(1),
        }))
    }

    /// `Ok` when `ip` may make one more request now; `Err(wait)` when it must wait.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        if self.limiter.len() >= self.max_tracked {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
            if self.limiter.len() >= self.max_tracked {
                debug!(ip = %ip, "rate limiter table full; request not metered");
                return Ok(());
            }
        }
        self.limiter
            .check_key(&ip)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Addresses that currently have a bucket.
    pub fn tracked(&self) -> usize {
        self.limiter.len()
    }
}

/// `Retry-After` in whole seconds, rounded up (at least 1).
fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0 || wait.is_zero())
}

/// Wraps an HTTP app so requests over the per-address rate get 429 with `Retry-After`
/// before any other work (authentication included). The peer comes from the
/// `ConnectInfo<SocketAddr>` extension ([`crate::net::http`] sets it); requests without
/// it (in-process tests) are not metered.
pub fn with_http_rate_limit(app: axum::Router, limit: Option<Arc<PerIpRate>>) -> axum::Router {
    match limit {
        None => app,
        Some(limit) => app.layer(axum::middleware::from_fn_with_state(limit, http_middleware)),
    }
}

async fn http_middleware(
    State(limit): State<Arc<PerIpRate>>,
    req: Request,
    next: Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    if let Some(peer) = peer
        && let Err(wait) = limit.check(peer.ip())
    {
        debug!(peer = %peer, "HTTP request refused: over the per-address rate limit");
        let secs = retry_after_secs(wait);
        let mut response = (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(serde_json::json!({
                "error": format!("too many requests from this address; retry in {secs} s"),
            })),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return response;
    }
    next.run(req).await
}

/// A tonic interceptor that refuses new gRPC streams (calls) over the per-address rate
/// with `RESOURCE_EXHAUSTED`; with `spare_loopback`, loopback peers (the demo's own
/// simulated agents) are not limited.
pub fn grpc_interceptor(
    limit: Option<Arc<PerIpRate>>,
    spare_loopback: bool,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |req: tonic::Request<()>| {
        if let (Some(limit), Some(peer)) = (&limit, req.remote_addr())
            && !(spare_loopback && peer.ip().is_loopback())
            && let Err(wait) = limit.check(peer.ip())
        {
            debug!(peer = %peer, "gRPC stream refused: over the per-address rate limit");
            return Err(tonic::Status::resource_exhausted(format!(
                "too many new streams from this address; retry in {} s",
                retry_after_secs(wait)
            )));
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_over_its_burst_is_refused_while_another_is_served() {
        let limit = PerIpRate::new(RateQuota {
            per_second: 1,
            burst: 3,
        })
        .expect("limit on");
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        for _ in 0..3 {
            assert!(limit.check(a).is_ok());
        }
        let wait = limit.check(a).expect_err("4th within the second refused");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(limit.check(b).is_ok(), "b has its own bucket");
    }

    #[test]
    fn the_table_of_addresses_is_bounded() {
        let limit = PerIpRate::with_capacity(
            RateQuota {
                per_second: 1,
                burst: 1,
            },
            8,
        )
        .expect("limit on");
        for i in 0..100u8 {
            // Each address spends its whole burst, so none can be pruned as idle.
            let _ = limit.check([10, 0, 1, i].into());
        }
        assert!(limit.tracked() <= 8, "tracked {}", limit.tracked());
    }

    #[test]
    fn rate_zero_is_off_and_retry_after_rounds_up() {
        assert!(
            PerIpRate::new(RateQuota {
                per_second: 0,
                burst: 10
            })
            .is_none()
        );
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }
}
