//! Whether a node is online, stale or offline.
//!
//! Status comes from the newest *sample* time stored for the node (the agent's clock, capped
//! at the collector's "now"), never from when a batch arrived: a node replaying an hour of
//! spooled backlog is not online until it sends what it measures now.
//!
//! - `online`: newest sample at most `stale_after` old (default 15 s);
//! - `stale`: at most `offline_after` old (default 2 min);
//! - `offline`: older, or no sample ever.

use gpufleet_core::UnixMs;
use std::sync::Arc;
use std::time::Duration;

// A node's liveness as the API and `/metrics` report it: the API's own type, shared with
// its clients.
pub use gpufleet_api::NodeStatus;

/// The thresholds that turn a sample's age into a [`NodeStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusPolicy {
    pub stale_after: Duration,
    pub offline_after: Duration,
}

impl Default for StatusPolicy {
    fn default() -> Self {
        StatusPolicy {
            stale_after: Duration::from_secs(15),
            offline_after: Duration::from_secs(120),
        }
    }
}

impl StatusPolicy {
    /// The status of a node whose newest sample is `last_seen_ms`, at `now_ms`.
    pub fn classify(&self, last_seen_ms: Option<UnixMs>, now_ms: UnixMs) -> NodeStatus {
        let Some(seen) = last_seen_ms else {
            return NodeStatus::Offline;
        };
        // A clock ahead of ours does not make a node "more" online than now.
        let age_ms = u128::try_from(now_ms - seen.min(now_ms)).unwrap_or(0);
        if age_ms <= self.stale_after.as_millis() {
            NodeStatus::Online
        } else if age_ms <= self.offline_after.as_millis() {
            NodeStatus::Stale
        } else {
            NodeStatus::Offline
        }
    }
}

/// The collector's idea of "now" in Unix ms; injected so tests can fix it.
pub type Clock = Arc<dyn Fn() -> UnixMs + Send + Sync>;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(gpufleet_core::config::now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_the_newest_sample_age() {
        let p = StatusPolicy::default();
        let now = 1_800_000_000_000;
        assert_eq!(p.classify(None, now), NodeStatus::Offline);
        assert_eq!(p.classify(Some(now - 15_000), now), NodeStatus::Online);
        assert_eq!(p.classify(Some(now - 15_001), now), NodeStatus::Stale);
        assert_eq!(p.classify(Some(now - 120_000), now), NodeStatus::Stale);
        assert_eq!(p.classify(Some(now - 120_001), now), NodeStatus::Offline);
        assert_eq!(
            p.classify(Some(now + 60_000), now),
            NodeStatus::Online,
            "clock ahead"
        );
    }
}
