//! The pusher's own metrics, shown on `/metrics` (the handler calls [`render`]) while
//! remote-write is configured.

use std::fmt::Write as _;
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

/// Appends the pusher's families in the text exposition format (nothing while
/// remote-write is off).
pub fn render(stats: &Stats, out: &mut String) {
    if !stats.enabled.load(Relaxed) {
        return;
    }
    let families: [(&str, &str, &str, f64); 4] = [
        (
            "gpufleet_remote_write_pending_samples",
            "gauge",
            "Samples read for remote-write and not yet delivered or dropped.",
            stats.pending.load(Relaxed).max(0) as f64,
        ),
        (
            "gpufleet_remote_write_sent_samples_total",
            "counter",
            "Samples the remote-write receiver accepted.",
            stats.sent.load(Relaxed) as f64,
        ),
        (
            "gpufleet_remote_write_failed_samples_total",
            "counter",
            "Samples dropped because the receiver refused them (4xx other than 429).",
            stats.failed.load(Relaxed) as f64,
        ),
        (
            "gpufleet_remote_write_retries_total",
            "counter",
            "Remote-write requests sent again after a 5xx, a 429 or no answer.",
            stats.retries.load(Relaxed) as f64,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_only_when_enabled() {
        let stats = Stats::default();
        let mut out = String::new();
        render(&stats, &mut out);
        assert_eq!(out, "");
        stats.enabled.store(true, Relaxed);
        stats.sent.store(12, Relaxed);
        render(&stats, &mut out);
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
