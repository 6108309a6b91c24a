//! What the agent holds until the collector acks it: the [`Outbox`] boundary and its
//! bounded in-memory implementation, [`MemoryQueue`]. (The on-disk spool implements the
//! same trait.)
//!
//! Ticks arrive one by one, already encoded ([`EncodedTick`]): the outbox holds and hands
//! out their bytes, never decoding them. They become seq-numbered batches only when there is a session
//! to send them on, so ticks that piled up during an outage are merged into few large
//! batches (up to [`BatchLimits`]) instead of thousands of one-tick ones. A batch keeps its
//! seq until acked: after a reconnect it is resent as it was (the collector's writes are
//! idempotent per seq), oldest first.
//!
//! **When full** (more than `max_ticks` held), the oldest data is dropped — a whole batch
//! if the oldest data is batched, else the oldest tick — and its GPU samples are counted as
//! dropped. A batch the collector rejects as not retryable is dropped and counted the same
//! way. So, in GPU samples, `sampled == acked + dropped + unacked` at all times.

use crate::encoded::{EncodedTick, OutBatch};
use gpufleet_core::{DeliveryStats, Tick};
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The outbox shared by the sampling thread (push, maintain) and the uplink (the rest).
/// Each holds the lock for one short step; the spool's disk writes happen under it on the
/// sampling thread.
pub type SharedOutbox = Arc<Mutex<Box<dyn Outbox>>>;

/// Locks the shared outbox. A thread that panicked while holding it left it usable (every
/// step keeps its counters consistent before it can panic), so poisoning is ignored.
pub fn lock(outbox: &SharedOutbox) -> MutexGuard<'_, Box<dyn Outbox>> {
    outbox.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Delivery counters, in GPU samples (one GPU at one tick).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Sampled and handed to the outbox.
    pub sampled: u64,
    /// Acked by a collector (durable there).
    pub acked: u64,
    /// Dropped: the outbox overflowed, or a collector rejected the batch for good.
    pub dropped: u64,
    /// Still held, not acked.
    pub unacked: u64,
}

impl fmt::Display for Summary {
    /// The line `gpufleet-agent run` prints on exit; scripts parse it, keep it exact.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "summary sampled={} acked={} dropped={} unacked={}",
            self.sampled, self.acked, self.dropped, self.unacked
        )
    }
}

/// How big a new batch may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most ticks per batch.
    pub max_ticks: usize,
    /// Most encoded bytes per batch; a single tick may exceed it.
    pub max_bytes: usize,
}

impl BatchLimits {
    /// How many of the waiting ticks (their wire sizes, oldest first) the next batch
    /// takes, and whether that batch is full: a limit cut it, not the end of the ticks.
    pub fn fit(&self, sizes: impl IntoIterator<Item = usize>) -> (usize, bool) {
        let (mut n, mut bytes) = (0, 0);
        for b in sizes {
            if n >= self.max_ticks.max(1) || (n > 0 && bytes + b > self.max_bytes) {
                return (n, true);
            }
            n += 1;
            bytes += b;
        }
        (n, false)
    }
}

/// Where ticks wait for their ack.
pub trait Outbox: Send {
    /// Takes a freshly sampled, encoded tick, dropping the oldest data if over capacity.
    fn push_encoded(&mut self, tick: EncodedTick);

    /// Encodes `tick` and takes it.
    fn push(&mut self, tick: Tick) {
        self.push_encoded(EncodedTick::new(tick));
    }

    /// Deferred housekeeping (the spool: persisting its watermark, deleting trimmed
    /// segments, interval fsyncs). Called by the sampling thread after each tick, so disk
    /// work stays off the uplink's thread.
    fn maintain(&mut self) {}

    /// A new session began and the collector holds everything up to `last_acked_seq`:
    /// those batches count as acked, new seqs start above it, and every other unacked
    /// batch is to be sent again.
    fn start_session(&mut self, last_acked_seq: u64);

    /// The next batch to send on this session, oldest first: an unacked batch not yet sent
    /// in this session, else a new batch of waiting ticks — when `partial` is false, only
    /// a full one (the uplink lets partial batches out at a limited rate, so ticks taken
    /// every 100 ms travel a few per message). `None` when nothing is to be sent.
    fn next_batch(&mut self, limits: BatchLimits, partial: bool) -> Option<OutBatch>;

    /// The next batch to send, partial or not.
    fn next_to_send(&mut self, limits: BatchLimits) -> Option<OutBatch> {
        self.next_batch(limits, true)
    }

    /// The collector acked `seq`. Returns whether it was held.
    fn ack(&mut self, seq: u64) -> bool;

    /// The collector rejected `seq`: dropped for good, or (retryable) to be sent again.
    /// Returns the GPU samples of the batch when it was held.
    fn reject(&mut self, seq: u64, retryable: bool) -> Option<u64>;

    /// Batches sent in this session and not yet acked.
    fn in_flight(&self) -> usize;

    /// Whether nothing is held.
    fn is_empty(&self) -> bool;

    /// Whether the newest tick waits to be put in a batch (new ticks join the back).
    fn waiting(&self) -> bool;

    /// The counters.
    fn summary(&self) -> Summary;
}

/// A batch and its delivery state.
#[derive(Debug)]
struct Held {
    /// The batch, seq assigned.
    batch: OutBatch,
    /// Sent in the current session (awaiting its ack).
    sent: bool,
    /// Estimated encoded size.
    bytes: usize,
    /// GPU samples in it.
    samples: u64,
}

/// A bounded in-memory [`Outbox`]. Lost on restart (the spool will not be).
#[derive(Debug)]
pub struct MemoryQueue {
    /// Batches with a seq, oldest first, not yet acked.
    batches: VecDeque<Held>,
    /// Ticks not in a batch yet, oldest first.
    pending: VecDeque<EncodedTick>,
    /// Seq of the next batch formed (starts at 1).
    next_seq: u64,
    /// Most ticks held, batched or pending.
    max_ticks: usize,
    /// Ticks held now.
    ticks_held: usize,
    /// Encoded bytes held now (reported to the collector as backlog).
    bytes_held: usize,
    /// Counters; `unacked` is kept up to date too.
    counts: Summary,
}

impl MemoryQueue {
    /// A queue holding at most `max_ticks` ticks (at least 1).
    pub fn new(max_ticks: usize) -> Self {
        Self {
            batches: VecDeque::new(),
            pending: VecDeque::new(),
            next_seq: 1,
            max_ticks: max_ticks.max(1),
            ticks_held: 0,
            bytes_held: 0,
            counts: Summary::default(),
        }
    }

    fn drop_oldest(&mut self) {
        if let Some(h) = self.batches.pop_front() {
            self.ticks_held -= h.batch.ticks.len();
            self.bytes_held -= h.bytes;
            self.counts.unacked -= h.samples;
            self.counts.dropped += h.samples;
        } else if let Some(t) = self.pending.pop_front() {
            let samples = t.samples;
            self.ticks_held -= 1;
            self.bytes_held -= t.wire_bytes();
            self.counts.unacked -= samples;
            self.counts.dropped += samples;
        }
    }

    fn remove(&mut self, seq: u64) -> Option<Held> {
        let at = self
            .batches
            .binary_search_by_key(&seq, |h| h.batch.seq)
            .ok()?;
        let h = self.batches.remove(at)?;
        self.ticks_held -= h.batch.ticks.len();
        self.bytes_held -= h.bytes;
        self.counts.unacked -= h.samples;
        Some(h)
    }

    fn stats(&self) -> DeliveryStats {
        DeliveryStats {
            dropped_samples: self.counts.dropped,
            spool_backlog_batches: self.batches.len() as u64,
            spool_backlog_bytes: self.bytes_held as u64,
        }
    }
}

impl Outbox for MemoryQueue {
    fn push_encoded(&mut self, tick: EncodedTick) {
        let samples = tick.samples;
        let bytes = tick.wire_bytes();
        self.counts.sampled += samples;
        self.counts.unacked += samples;
        self.pending.push_back(tick);
        self.ticks_held += 1;
        self.bytes_held += bytes;
        while self.ticks_held > self.max_ticks {
            self.drop_oldest();
        }
    }

    fn start_session(&mut self, last_acked_seq: u64) {
        self.next_seq = self.next_seq.max(last_acked_seq.saturating_add(1));
        for h in &mut self.batches {
            h.sent = false;
        }
    }

    fn next_batch(&mut self, limits: BatchLimits, partial: bool) -> Option<OutBatch> {
        let stats = self.stats();
        if let Some(h) = self.batches.iter_mut().find(|h| !h.sent) {
            h.sent = true;
            return Some(OutBatch {
                delivery: stats,
                ..h.batch.clone()
            });
        }
        let (n, full) = limits.fit(self.pending.iter().map(EncodedTick::wire_bytes));
        if n == 0 || !(full || partial) {
            return None;
        }
        let mut ticks = Vec::with_capacity(n);
        let mut bytes = 0;
        let mut samples = 0;
        for t in self.pending.drain(..n) {
            bytes += t.wire_bytes();
            samples += t.samples;
            ticks.push(t.bytes);
        }
        let batch = OutBatch {
            seq: self.next_seq,
            ticks,
            delivery: DeliveryStats::default(),
        };
        self.next_seq += 1;
        self.batches.push_back(Held {
            batch: batch.clone(),
            sent: true,
            bytes,
            samples,
        });
        Some(OutBatch {
            delivery: DeliveryStats {
                spool_backlog_batches: self.batches.len() as u64,
                ..stats
            },
            ..batch
        })
    }

    fn ack(&mut self, seq: u64) -> bool {
        match self.remove(seq) {
            Some(h) => {
                self.counts.acked += h.samples;
                true
            }
            None => false,
        }
    }

    fn reject(&mut self, seq: u64, retryable: bool) -> Option<u64> {
        if retryable {
            let at = self
                .batches
                .binary_search_by_key(&seq, |h| h.batch.seq)
                .ok()?;
            let h = &mut self.batches[at];
            h.sent = false;
            return Some(h.samples);
        }
        let h = self.remove(seq)?;
        self.counts.dropped += h.samples;
        Some(h.samples)
    }

    fn in_flight(&self) -> usize {
        self.batches.iter().filter(|h| h.sent).count()
    }

    fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.pending.is_empty()
    }

    fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    fn summary(&self) -> Summary {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::GpuSample;
    use proptest::prelude::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_ticks: 100,
        max_bytes: 4 << 20,
    };

    fn tick(ms: i64, gpus: usize) -> Tick {
        Tick {
            time_ms: ms,
            gpus: (0..gpus)
                .map(|g| GpuSample {
                    gpu_uuid: format!("GPU-{g}"),
                    power_mw: Some(100_000),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn holds(q: &MemoryQueue) {
        let s = q.summary();
        assert_eq!(s.sampled, s.acked + s.dropped + s.unacked, "{s:?}");
    }

    #[test]
    fn summary_line_format_is_exact() {
        let s = Summary {
            sampled: 10,
            acked: 6,
            dropped: 1,
            unacked: 3,
        };
        assert_eq!(
            s.to_string(),
            "summary sampled=10 acked=6 dropped=1 unacked=3"
        );
    }

    #[test]
    fn seqs_start_at_one_and_pending_ticks_merge_into_batches() {
        let mut q = MemoryQueue::new(1000);
        for i in 0..250 {
            q.push(tick(i, 2));
        }
        q.start_session(0);
        let b1 = q.next_to_send(LIMITS).expect("batch");
        let b2 = q.next_to_send(LIMITS).expect("batch");
        let b3 = q.next_to_send(LIMITS).expect("batch");
        assert_eq!((b1.seq, b2.seq, b3.seq), (1, 2, 3));
        assert_eq!(
            (b1.ticks.len(), b2.ticks.len(), b3.ticks.len()),
            (100, 100, 50)
        );
        assert_eq!(b1.decoded()[0].time_ms, 0);
        assert_eq!(b3.decoded()[49].time_ms, 249, "order kept");
        assert!(q.next_to_send(LIMITS).is_none());
        assert_eq!(q.in_flight(), 3);
        assert!(q.ack(2));
        assert!(!q.ack(2), "a second ack is ignored");
        assert_eq!(
            q.summary(),
            Summary {
                sampled: 500,
                acked: 200,
                dropped: 0,
                unacked: 300
            }
        );
        holds(&q);
    }

    #[test]
    fn byte_limit_cuts_batches_but_never_below_one_tick() {
        let mut q = MemoryQueue::new(100);
        for i in 0..10 {
            q.push(tick(i, 8));
        }
        let one = EncodedTick::new(tick(1, 8)).wire_bytes();
        let limits = BatchLimits {
            max_ticks: 100,
            max_bytes: one * 3 + 1,
        };
        assert_eq!(q.next_to_send(limits).map(|b| b.ticks.len()), Some(3));
        let tiny = BatchLimits {
            max_ticks: 100,
            max_bytes: 1,
        };
        assert_eq!(q.next_to_send(tiny).map(|b| b.ticks.len()), Some(1));
    }

    #[test]
    fn a_partial_batch_waits_when_asked_and_a_full_one_or_a_resend_does_not() {
        let mut q = MemoryQueue::new(100);
        let three = BatchLimits {
            max_ticks: 3,
            ..LIMITS
        };
        q.push(tick(1, 1));
        q.push(tick(2, 1));
        assert!(q.waiting());
        assert!(
            q.next_batch(three, false).is_none(),
            "2 of 3 ticks: held back"
        );
        q.push(tick(3, 1));
        q.push(tick(4, 1));
        let full = q.next_batch(three, false).expect("a full batch goes");
        assert_eq!(full.ticks.len(), 3);
        assert!(q.next_batch(three, false).is_none());
        q.start_session(0);
        assert_eq!(
            q.next_batch(three, false).map(|b| b.seq),
            Some(full.seq),
            "a resend goes at once"
        );
        let partial = q.next_batch(three, true).expect("partial allowed");
        assert_eq!(partial.decoded()[0].time_ms, 4);
        assert!(!q.waiting());
    }

    #[test]
    fn overflow_drops_the_oldest_and_counts_its_gpu_samples() {
        let mut q = MemoryQueue::new(5);
        for i in 0..3 {
            q.push(tick(i, 4));
        }
        let b = q.next_to_send(LIMITS).expect("batch of 3");
        assert_eq!(b.ticks.len(), 3);
        for i in 3..6 {
            q.push(tick(i, 4));
            holds(&q);
        }
        // 6 ticks > 5: the oldest data (the whole 3-tick batch) went.
        assert_eq!(
            q.summary(),
            Summary {
                sampled: 24,
                acked: 0,
                dropped: 12,
                unacked: 12
            }
        );
        assert!(!q.ack(1), "its late ack changes nothing");
        for i in 6..9 {
            q.push(tick(i, 4));
        }
        // Only pending ticks now: dropped one at a time.
        assert_eq!(q.summary().dropped, 16);
        let next = q.next_to_send(LIMITS).expect("batch");
        assert_eq!(next.seq, 2);
        assert_eq!(next.decoded()[0].time_ms, 4, "oldest surviving tick");
        assert_eq!(
            next.delivery.dropped_samples, 16,
            "the collector hears about drops"
        );
        holds(&q);
    }

    #[test]
    fn rejects_drop_for_good_or_resend() {
        let mut q = MemoryQueue::new(100);
        q.push(tick(1, 2));
        q.next_to_send(BatchLimits {
            max_ticks: 1,
            ..LIMITS
        });
        q.push(tick(2, 2));
        q.next_to_send(BatchLimits {
            max_ticks: 1,
            ..LIMITS
        });
        assert_eq!(q.reject(1, false), Some(2));
        assert_eq!(q.summary().dropped, 2);
        assert_eq!(q.reject(2, true), Some(2));
        assert_eq!(q.in_flight(), 0);
        let again = q.next_to_send(LIMITS).expect("resent");
        assert_eq!(again.seq, 2, "same seq on resend");
        assert_eq!(q.reject(99, false), None);
        holds(&q);
    }

    #[test]
    fn a_new_session_resends_everything_unacked_and_places_new_seqs_above() {
        let mut q = MemoryQueue::new(100);
        for i in 0..4 {
            q.push(tick(i, 1));
            q.next_to_send(BatchLimits {
                max_ticks: 1,
                ..LIMITS
            });
        }
        // Seq 1 was rejected as retryable, 2 was committed but its ack lost, then the
        // connection broke. The Welcome says 2: a maximum, not "everything up to 2".
        assert_eq!(q.reject(1, true), Some(1));
        q.push(tick(10, 1));
        q.push(tick(11, 1));
        q.start_session(2);
        assert_eq!(q.summary().acked, 0, "the Welcome acks nothing");
        let seqs: Vec<u64> = std::iter::from_fn(|| q.next_to_send(LIMITS))
            .map(|b| b.seq)
            .collect();
        assert_eq!(
            seqs,
            [1, 2, 3, 4, 5],
            "unacked first (seq 1 included), oldest first, then the merged backlog"
        );
        for seq in 1..=5 {
            assert!(q.ack(seq));
        }
        assert_eq!(q.summary().acked, 6);
        holds(&q);

        // A collector that already holds higher seqs (an earlier agent run): new seqs go above.
        let mut fresh = MemoryQueue::new(10);
        fresh.push(tick(1, 1));
        fresh.start_session(500);
        assert_eq!(fresh.next_to_send(LIMITS).map(|b| b.seq), Some(501));
    }

    proptest! {
        #[test]
        fn counts_always_add_up(ops in proptest::collection::vec((0u8..6, 0u64..20), 1..300), cap in 1usize..40) {
            let mut q = MemoryQueue::new(cap);
            let mut t = 0;
            let mut last_seq = 0;
            for (op, arg) in ops {
                match op {
                    0 | 1 => { t += 1; q.push(tick(t, (arg % 4) as usize)); }
                    2 => if let Some(b) = q.next_to_send(BatchLimits { max_ticks: 1 + arg as usize, max_bytes: 1 << 20 }) {
                        prop_assert!(!b.ticks.is_empty());
                        if b.seq > last_seq { last_seq = b.seq; }
                    },
                    3 => { q.ack(arg.min(last_seq)); }
                    4 => { q.reject(arg.min(last_seq), arg % 2 == 0); }
                    _ => q.start_session(arg.min(last_seq)),
                }
                let s = q.summary();
                prop_assert_eq!(s.sampled, s.acked + s.dropped + s.unacked);
                prop_assert!(q.ticks_held <= cap);
            }
        }
    }
}
