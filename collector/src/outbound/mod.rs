//! Outbound delivery: how the collector pushes to receivers it does not control
//! (remote-write, alert webhooks), in one place.
//!
//! - `http.rs`: one HTTP attempt ([`send`]) and the answer sorted ([`classify`]) into a
//!   [`Delivery`]: sent, retry (after the receiver's `Retry-After` if it gave one), or
//!   refused for good.
//! - `retry.rs`: the retry loop ([`deliver`]): runs an attempt again with exponential
//!   backoff ([`BackoffOptions`], [`backoff`]) until it is sent, refused, out of attempts
//!   or cancelled, under a [`Policy`] that holds what differs between callers.
//!
//! Callers keep their own queues, counters and logs: the loop reports each retry to them
//! ([`Retrying`]) and returns how the delivery ended ([`Outcome`]). Waits use
//! `tokio::time`, so tests run them in paused time.

mod http;
mod retry;

pub use http::{classify, send};
pub use retry::{BackoffOptions, Outcome, Policy, RetryAfter, Retrying, backoff, deliver};

use std::time::Duration;

/// What became of one attempt, and so what the retry loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// 2xx: the receiver has it.
    Sent,
    /// 5xx, 429, a 4xx that says nothing about the request (401, 403, 404, 407, 408), or
    /// no answer: try again, after `after` if the receiver said (`Retry-After`; how it
    /// combines with the backoff is the [`Policy`]'s), else after the backoff.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// Refused for good (any other 4xx): sending it again would be refused again.
    Refused { status: u16, why: String },
}
