//! The pusher's own metrics, shown on `/metrics` (the handler calls [`register`]) while
//! remote-write is configured.

use crate::families::{Num, value};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

/// Counters since start-up; lock-free.
#[derive(Debug, Default)]
pub struct Stats {
    /// Set once remote-write is configured: nothing is rendered before.
    pub enabled: AtomicBool,
    /// Samples read from the store and not yet delivered or dropped (in the queue or in
    /// flight).
    pub pending: AtomicI64,
    /// Samples the receiver accepted (2xx).
    pub sent: AtomicU64,
    /// Samples dropped because the receiver refused them for good (4xx other than 429).
    pub failed: AtomicU64,
    /// Requests sent again (after a 5xx, a 429, or no answer).
    pub retries: AtomicU64,
}

/// Registers the pusher's families on a `/metrics` registry (nothing while remote-write
/// is off); the values are read when the registry is encoded.
pub fn register(stats: &Arc<Stats>, registry: &mut Registry) {
    if stats.enabled.load(Relaxed) {
        registry.register_collector(Box::new(StatsCollector(Arc::clone(stats))));
    }
}

#[derive(Debug)]
struct StatsCollector(Arc<Stats>);

impl Collector for StatsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        // Counter names without `_total`: the encoder adds it.
        let families: [(&str, MetricType, &str, Num); 4] = [
            (
                "gpufleet_remote_write_pending_samples",
                MetricType::Gauge,
                "Samples read for remote-write and not yet delivered or dropped.",
                Num::I(s.pending.load(Relaxed).max(0)),
            ),
            (
                "gpufleet_remote_write_sent_samples",
                MetricType::Counter,
                "Samples the remote-write receiver accepted.",
                Num::U(s.sent.load(Relaxed)),
            ),
            (
                "gpufleet_remote_write_failed_samples",
                MetricType::Counter,
                "Samples dropped because the receiver refused them (4xx other than 429).",
                Num::U(s.failed.load(Relaxed)),
            ),
            (
                "gpufleet_remote_write_retries",
                MetricType::Counter,
                "Remote-write requests sent again after a 5xx, a 429 or no answer.",
                Num::U(s.retries.load(Relaxed)),
            ),
        ];
        for (name, kind, help, v) in families {
            let mut m = enc.encode_descriptor(name, help, None, kind)?;
            value(&mut m, kind, v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(stats: &Arc<Stats>) -> String {
        let mut registry = Registry::default();
        register(stats, &mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap_or_default();
        out
    }

    #[test]
    fn renders_only_when_enabled() {
        let stats = Arc::new(Stats::default());
        assert!(!rendered(&stats).contains("remote_write"));
        stats.enabled.store(true, Relaxed);
        stats.sent.store(12, Relaxed);
        let out = rendered(&stats);
        assert!(
            out.contains("gpufleet_remote_write_sent_samples_total 12\n"),
            "{out}"
        );
        assert!(
            out.contains("gpufleet_remote_write_pending_samples 0\n"),
            "{out}"
        );
    }
}
