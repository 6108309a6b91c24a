//! The collector's own counters (what it ingested, refused, and how long commits took;
//! its background tasks' passes and what packing moved), exposed on `/metrics` next to the
//! fleet's GPU metrics. Lock-free where the ingest path counts: it only touches atomics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the commit-duration histogram buckets.
pub const COMMIT_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Counters since start-up.
#[derive(Debug, Default)]
pub struct Metrics {
    pub batches_acked: AtomicU64,
    /// Refused as malformed or out of range (`REJECT_CODE_INVALID`).
    pub batches_rejected_invalid: AtomicU64,
    /// Refused for exceeding a limit (`REJECT_CODE_TOO_LARGE`).
    pub batches_rejected_too_large: AtomicU64,
    /// Refused because the store failed (`REJECT_CODE_UNAVAILABLE`, retryable).
    pub batches_rejected_unavailable: AtomicU64,
    /// Refused because rows with the same keys are stored with other values
    /// (`REJECT_CODE_CONFLICT`): a second agent writing as the node, or a clock that went
    /// back. Replays of the node's own batches are not conflicts.
    pub batches_rejected_conflict: AtomicU64,
    /// Refused because their seq is absurdly far above the node's highest stored seq
    /// (`REJECT_CODE_OUT_OF_ORDER`).
    pub batches_rejected_seq: AtomicU64,
    /// GPU samples newly stored (replays excluded).
    pub gpu_samples_ingested: AtomicU64,
    /// Transactions committed by the group-commit writer.
    pub commits: AtomicU64,
    /// Transactions that failed.
    pub commit_failures: AtomicU64,
    /// Ingest streams open now.
    pub streams_active: AtomicI64,
    /// Commit duration histogram: cumulative counts per [`COMMIT_BUCKETS`] bound.
    pub commit_buckets: [AtomicU64; COMMIT_BUCKETS.len()],
    /// Sum of commit durations, in microseconds.
    pub commit_micros_sum: AtomicU64,
    /// Per background job run under a lease ([`crate::accounting::leader`]): whether this collector
    /// leads it now. Written when leadership changes, read by `/metrics`.
    leading: Mutex<BTreeMap<&'static str, bool>>,
    /// Per background task (`energy`, `rollups`, `retention`, `packing`): how many passes
    /// ran here and how long they took, so an operator sees whether the tasks keep up.
    passes: Mutex<BTreeMap<&'static str, PassStats>>,
    /// Raw rows (GPU samples, process ticks, host rows) moved into packed values.
    pub packed_rows: AtomicU64,
    /// The remote-write pusher's counters ([`crate::remote_write`]).
    pub remote_write: std::sync::Arc<crate::remote_write::Stats>,
    /// The alert notifier's counters ([`crate::alerts::notify`]).
    pub alerts: std::sync::Arc<crate::alerts::notify::NotifyStats>,
    /// The listeners' refused connections and live streams ([`crate::net::conn_limit`]).
    pub connections: std::sync::Arc<crate::net::conn_limit::ConnStats>,
    /// Report and plot requests refused for being one too many at once
    /// ([`crate::api::renders`]).
    pub renders_refused: AtomicU64,
}

/// One background task's passes on this collector since start-up.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PassStats {
    pub ok: u64,
    pub failed: u64,
    /// Time spent in passes, ok or failed.
    pub seconds: f64,
}

impl Metrics {
    /// Records a pass of `task` that began at `began` and ended now, `ok` or failed.
    pub fn observe_pass(&self, task: &'static str, began: Instant, ok: bool) {
        let took = began.elapsed().as_secs_f64();
        let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        let p = passes.entry(task).or_default();
        if ok {
            p.ok += 1;
        } else {
            p.failed += 1;
        }
        p.seconds += took;
    }

    /// Every task that ran a pass here, by name.
    pub fn passes(&self) -> Vec<(&'static str, PassStats)> {
        by_job(&self.passes)
    }

    /// Records whether this collector now leads `job`.
    pub fn set_leading(&self, job: &'static str, leading: bool) {
        self.leading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(job, leading);
    }

    /// Every job run under a lease here, and whether this collector leads it now.
    pub fn leading(&self) -> Vec<(&'static str, bool)> {
        by_job(&self.leading)
    }

    /// Records one commit's duration.
    pub fn observe_commit(&self, took: Duration) {
        let secs = took.as_secs_f64();
        for (bound, count) in COMMIT_BUCKETS.iter().zip(&self.commit_buckets) {
            if secs <= *bound {
                count.fetch_add(1, Relaxed);
            }
        }
        self.commits.fetch_add(1, Relaxed);
        self.commit_micros_sum
            .fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }
}

/// A map's entries, by job or task name.
fn by_job<V: Copy>(map: &Mutex<BTreeMap<&'static str, V>>) -> Vec<(&'static str, V)> {
    (map.lock().unwrap_or_else(PoisonError::into_inner).iter())
        .map(|(&j, &v)| (j, v))
        .collect()
}
