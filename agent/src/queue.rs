//! What the agent holds until the collector acks it: the [`Outbox`] boundary and its
//! bounded in-memory implementation, [`MemoryQueue`]. (The on-disk spool of a later issue
//! implements the same trait.)
//!
//! Ticks arrive one by one. They become seq-numbered batches only when there is a session
//! to send them on, so ticks that piled up during an outage are merged into few large
//! batches (up to [`BatchLimits`]) instead of thousands of one-tick ones. A batch keeps its
//! seq until acked: after a reconnect it is resent as it was (the collector's writes are
//! idempotent per seq), oldest first.
//!
//! **When full** (more than `max_ticks` held), the oldest data is dropped — a whole batch
//! if the oldest data is batched, else the oldest tick — and its GPU samples are counted as
//! dropped. A batch the collector rejects as not retryable is dropped and counted the same
//! way. So, in GPU samples, `sampled == acked + dropped + unacked` at all times.

use gpufleet_core::{Batch, DeliveryStats, Tick};
use std::collections::VecDeque;
use std::fmt;

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
    /// Most (estimated) encoded bytes per batch; a single tick may exceed it.
    pub max_bytes: usize,
}

/// Where ticks wait for their ack.
pub trait Outbox: Send {
    /// Takes a freshly sampled tick, dropping the oldest data if over capacity.
    fn push(&mut self, tick: Tick);

    /// A new session began and the collector holds everything up to `last_acked_seq`:
    /// those batches count as acked, new seqs start above it, and every other unacked
    /// batch is to be sent again.
    fn start_session(&mut self, last_acked_seq: u64);

    /// The next batch to send on this session, oldest first: an unacked batch not yet sent
    /// in this session, else a new batch of waiting ticks. `None` when nothing is waiting.
    fn next_to_send(&mut self, limits: BatchLimits) -> Option<Batch>;

    /// The collector acked `seq`. Returns whether it was held.
    fn ack(&mut self, seq: u64) -> bool;

    /// The collector rejected `seq`: dropped for good, or (retryable) to be sent again.
    /// Returns the GPU samples of the batch when it was held.
    fn reject(&mut self, seq: u64, retryable: bool) -> Option<u64>;

    /// Batches sent in this session and not yet acked.
    fn in_flight(&self) -> usize;

    /// Whether nothing is held.
    fn is_empty(&self) -> bool;

    /// The counters.
    fn summary(&self) -> Summary;
}

/// A batch and its delivery state.
#[derive(Debug)]
struct Held {
    /// The batch, seq assigned.
    batch: Batch,
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
    /// Ticks not in a batch yet, oldest first, with their estimated size.
    pending: VecDeque<(Tick, usize)>,
    /// Seq of the next batch formed (starts at 1).
    next_seq: u64,
    /// Most ticks held, batched or pending.
    max_ticks: usize,
    /// Ticks held now.
    ticks_held: usize,
    /// Estimated bytes held now (reported to the collector as backlog).
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
        } else if let Some((t, bytes)) = self.pending.pop_front() {
            let samples = t.gpus.len() as u64;
            self.ticks_held -= 1;
            self.bytes_held -= bytes;
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
    fn push(&mut self, tick: Tick) {
        let samples = tick.gpus.len() as u64;
        let bytes = estimate_tick_bytes(&tick);
        self.counts.sampled += samples;
        self.counts.unacked += samples;
        self.pending.push_back((tick, bytes));
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

    fn next_to_send(&mut self, limits: BatchLimits) -> Option<Batch> {
        let stats = self.stats();
        if let Some(h) = self.batches.iter_mut().find(|h| !h.sent) {
            h.sent = true;
            return Some(Batch {
                delivery: stats,
                ..h.batch.clone()
            });
        }
        if self.pending.is_empty() {
            return None;
        }
        let mut ticks = Vec::new();
        let mut bytes = 0;
        while let Some((_, b)) = self.pending.front() {
            if ticks.len() >= limits.max_ticks.max(1)
                || (!ticks.is_empty() && bytes + b > limits.max_bytes)
            {
                break;
            }
            let Some((t, b)) = self.pending.pop_front() else {
                break;
            };
            bytes += b;
            ticks.push(t);
        }
        let batch = Batch {
            seq: self.next_seq,
            ticks,
            delivery: DeliveryStats::default(),
        };
        self.next_seq += 1;
        let samples = batch.gpu_samples() as u64;
        self.batches.push_back(Held {
            batch: batch.clone(),
            sent: true,
            bytes,
            samples,
        });
        Some(Batch {
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

    fn summary(&self) -> Summary {
        self.counts
    }
}

/// An upper-bound estimate of a tick's protobuf size, cheap enough to run on every tick
/// (used to keep batches under the collector's message limit).
pub fn estimate_tick_bytes(t: &Tick) -> usize {
    let s = |v: &Option<String>| v.as_ref().map_or(0, |s| s.len() + 3);
    let gpus: usize = t
        .gpus
        .iter()
        .map(|g| 220 + g.gpu_uuid.len() + g.nvlinks.len() * 32)
        .sum();
    let procs: usize = t
        .processes
        .iter()
        .map(|p| {
            let w = &p.workload;
            120 + p.gpu_uuid.len()
                + s(&p.user)
                + s(&p.command)
                + s(&p.mig_uuid)
                + w.runtime.len()
                + [
                    &w.container_id,
                    &w.pod_uid,
                    &w.qos,
                    &w.job_id,
                    &w.step,
                    &w.unit,
                ]
                .into_iter()
                .map(s)
                .sum::<usize>()
                + [&w.container_name, &w.image, &w.pod_name, &w.namespace]
                    .into_iter()
                    .map(s)
                    .sum::<usize>()
        })
        .sum();
    let events: usize = t
        .events
        .iter()
        .map(|e| 48 + e.gpu_uuid.len() + e.detail.len())
        .sum();
    let cost = t.cost.as_ref().map_or(0, |c| {
        32 + c
            .slowest_calls_us
            .keys()
            .map(|k| k.len() + 16)
            .sum::<usize>()
    });
    32 + gpus + procs + events + cost + if t.host.is_some() { 80 } else { 0 }
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
        assert_eq!(b1.ticks[0].time_ms, 0);
        assert_eq!(b3.ticks[49].time_ms, 249, "order kept");
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
        let one = estimate_tick_bytes(&tick(0, 8));
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
        assert_eq!(next.ticks[0].time_ms, 4, "oldest surviving tick");
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

    #[test]
    fn estimate_is_an_upper_bound_of_the_encoded_size() {
        use prost::Message;
        let mut s = crate::sim::simulator(crate::sim::SimOptions::new("est", 8)).expect("sim");
        use crate::source::GpuSource;
        let mut t = 1_790_000_000_000;
        for _ in 0..50 {
            t += 1000;
            let mut tick = s.sample(t).expect("tick");
            tick.cost = Some(gpufleet_core::SamplerCost {
                cpu_us: Some(120),
                wall_us: Some(300),
                source_us: Some(200),
                slowest_calls_us: [("gpu0.power_usage".to_owned(), 40)].into_iter().collect(),
            });
            let est = estimate_tick_bytes(&tick);
            let real = gpufleet_proto::v1::Tick::from(tick).encoded_len();
            assert!(est >= real, "estimate {est} < encoded {real}");
            assert!(est < real * 3, "estimate {est} too loose for {real}");
        }
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
