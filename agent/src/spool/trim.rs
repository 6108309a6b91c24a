//! The watermark and the bound: trimming acked ticks, persisting `meta.json`, and
//! dropping the oldest segments when the spool is full.

use super::record::seg_path;
use super::{Entry, Spool, State};
use std::fs;
use tracing::warn;

impl Spool {
    /// Marks the ticks of held batches overlapping ids `..=hi` dropped, and unbatched ticks
    /// up to `hi` too; counts them.
    fn drop_through(&mut self, hi: u64) {
        let mut upto = hi;
        while self.batches.front().is_some_and(|b| b.lo <= upto) {
            if let Some(b) = self.batches.pop_front() {
                upto = upto.max(b.hi);
            }
        }
        for e in self.entries.iter_mut() {
            if e.id > upto {
                break;
            }
            if matches!(e.state, State::Pending | State::Batched) {
                e.state = State::Dropped;
                Self::release(&mut self.cached, e);
                self.live -= 1;
                self.counts.unacked -= e.samples;
                self.counts.dropped += e.samples;
            }
        }
    }

    /// Trims acked/dropped ticks at the front and moves the watermark (in memory); every
    /// segment but the active one whose ticks are all trimmed is doomed: deleted by
    /// [`Outbox::maintain`](gpufleet_uplink::queue::Outbox::maintain) once the watermark is persisted.
    pub(super) fn trim(&mut self) {
        let before = self.meta.trimmed_through;
        while let Some(e) = self.entries.front() {
            match e.state {
                State::Acked => self.meta.acked_samples += e.samples,
                State::Dropped => self.meta.dropped_samples += e.samples,
                State::Pending | State::Batched => break,
            }
            self.meta.trimmed_through = e.id;
            if let Some(e) = self.entries.pop_front()
                && let Some(b) = e.bytes
            {
                self.cached -= b.len();
            }
        }
        if self.meta.trimmed_through == before {
            return;
        }
        let through = self.meta.trimmed_through;
        self.meta.settled.retain(|(_, hi, _)| *hi > through);
        self.meta_dirty = true;
        while self.segments.len() > 1 {
            let next_first = self.segments[1].first;
            if next_first > self.meta.trimmed_through + 1 {
                break;
            }
            if let Some(s) = self.segments.pop_front() {
                self.doomed.push(s.first);
            }
        }
    }

    /// Persists the watermark, then deletes the doomed segments.
    pub(super) fn persist(&mut self) {
        self.write_meta();
        for first in std::mem::take(&mut self.doomed) {
            let path = seg_path(&self.cfg.dir, first);
            if let Err(e) = fs::remove_file(&path) {
                warn!(segment = %path.display(), error = %e, "cannot delete a trimmed spool segment");
            }
        }
    }

    /// Forgets the in-memory copy of a settled tick.
    pub(super) fn release(cached: &mut usize, e: &mut Entry) {
        if let Some(b) = e.bytes.take() {
            *cached -= b.len();
        }
    }

    /// Drops the oldest segment while over the size bound. A segment holding a batch that
    /// is in flight waits for its answer (the collector may be committing it, and a drop
    /// must mean "not stored"): the bound is exceeded by at most the in-flight window.
    pub(super) fn enforce_bound(&mut self) {
        while self.disk_bytes() > self.cfg.max_bytes && self.segments.len() > 1 {
            let last_id_in_oldest = self.segments[1].first.saturating_sub(1);
            if self
                .batches
                .iter()
                .take_while(|b| b.lo <= last_id_in_oldest)
                .any(|b| b.sent)
            {
                return;
            }
            let before = self.counts.dropped;
            self.drop_through(last_id_in_oldest);
            let dropped = self.counts.dropped - before;
            warn!(
                dropped_samples = dropped,
                total_dropped = self.counts.dropped,
                max_bytes = self.cfg.max_bytes,
                "spool full: dropped the oldest samples"
            );
            let first = self.segments[0].first;
            self.trim();
            // trim() dooms it when everything in it is gone; it is, unless acks of
            // later ticks are missing — then it goes now.
            if self.segments.front().is_some_and(|s| s.first == first)
                && let Some(s) = self.segments.pop_front()
            {
                self.doomed.push(s.first);
                self.meta_dirty = true;
            }
        }
    }
}
