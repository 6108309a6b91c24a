//! The pusher's queue: a bounded channel of ready requests between the reader and one
//! sender, which sends each in order, retries with exponential backoff, and records the
//! positions a request carried once it is delivered (or dropped).
//!
//! When full, the reader waits: nothing is lost, the samples stay in the store and are
//! read when there is room. A request is retried (5xx, 429 honouring `Retry-After`, the
//! 4xx that say nothing about the samples such as 401 or 404, no answer) until delivered
//! or until the term ends; any other 4xx would be refused again, so it is dropped and its
//! samples counted as failed. Either way its positions are
//! then saved, so a restart resumes after it.

use super::client::{Delivery, Sink};
use super::stats::Stats;
use crate::store::RemoteWriteStore;
use crate::store::remote_write::{STREAM_ENERGY, WorkloadNodeEnergy};
use gpufleet_core::UnixMs;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// One request ready to send, and how far it takes each stream's series.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// The encoded `WriteRequest` (empty: nothing to send, only positions to save).
    pub body: Vec<u8>,
    /// Samples in it.
    pub samples: usize,
    /// `(stream, series, position)` delivered once it is.
    pub positions: Vec<(&'static str, String, UnixMs)>,
    /// The cumulative energy totals pushed up to the energy position it carries, saved
    /// with that position (empty when it carries none).
    pub energy_totals: Vec<WorkloadNodeEnergy>,
}

/// Exponential backoff between retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffOptions {
    /// The first wait.
    pub min: Duration,
    /// The longest wait (the wait doubles up to it).
    pub max: Duration,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        BackoffOptions {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

/// The wait before retry number `attempt` (0: the first retry).
pub fn backoff(options: BackoffOptions, attempt: u32) -> Duration {
    options
        .min
        .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .min(options.max)
}

/// Creates the queue: `capacity` requests at most wait to be sent.
pub fn channel(capacity: usize) -> (mpsc::Sender<Batch>, mpsc::Receiver<Batch>) {
    mpsc::channel(capacity.max(1))
}

/// Sends the queue's requests in order until the queue closes or `term` is cancelled.
/// Pending samples still queued when it returns are forgotten here (their positions were
/// not saved: the next term reads them again).
pub async fn run_sender(
    mut queue: mpsc::Receiver<Batch>,
    sink: Arc<dyn Sink>,
    store: Arc<dyn RemoteWriteStore>,
    stats: Arc<Stats>,
    options: BackoffOptions,
    term: CancellationToken,
) {
    loop {
        let batch = tokio::select! {
            () = term.cancelled() => return,
            next = queue.recv() => match next {
                Some(batch) => batch,
                None => return,
            },
        };
        if !batch.body.is_empty() && !deliver(&batch, &*sink, &stats, options, &term).await {
            return;
        }
        if !save_positions(&batch, &*store, options, &term).await {
            return;
        }
        stats.pending.fetch_sub(count(batch.samples), Relaxed);
    }
}

fn count(samples: usize) -> i64 {
    i64::try_from(samples).unwrap_or(i64::MAX)
}

/// Sends one request until delivered or refused; `false` if `term` ended first.
async fn deliver(
    batch: &Batch,
    sink: &dyn Sink,
    stats: &Stats,
    options: BackoffOptions,
    term: &CancellationToken,
) -> bool {
    let mut attempt = 0u32;
    loop {
        let wait = match sink.send(batch.body.clone()).await {
            Delivery::Sent => {
                stats.sent.fetch_add(batch.samples as u64, Relaxed);
                debug!(samples = batch.samples, "remote-write request delivered");
                return true;
            }
            Delivery::Refused { status, why } => {
                stats.failed.fetch_add(batch.samples as u64, Relaxed);
                warn!(
                    status,
                    samples = batch.samples,
                    answer = %why,
                    "remote-write receiver refused a request; its samples are dropped"
                );
                return true;
            }
            Delivery::Retry { after, why } => {
                // Retry-After is a floor, never below the backoff: a `0` or a date in the
                // past must not turn into a tight loop against a struggling receiver.
                let wait = after.map_or(backoff(options, attempt), |a| {
                    a.max(backoff(options, attempt))
                });
                warn!(
                    attempt,
                    retry_in_ms = wait.as_millis() as u64,
                    reason = %why,
                    "remote-write request not delivered; retrying"
                );
                wait
            }
        };
        stats.retries.fetch_add(1, Relaxed);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            () = term.cancelled() => return false,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Saves the positions a delivered request carried (retrying a failing store); `false`
/// if `term` ended first.
async fn save_positions(
    batch: &Batch,
    store: &dyn RemoteWriteStore,
    options: BackoffOptions,
    term: &CancellationToken,
) -> bool {
    let mut by_stream: BTreeMap<&'static str, Vec<(String, UnixMs)>> = BTreeMap::new();
    for (stream, series, at) in &batch.positions {
        by_stream
            .entry(stream)
            .or_default()
            .push((series.clone(), *at));
    }
    for (stream, positions) in by_stream {
        let mut attempt = 0u32;
        loop {
            // The energy position goes with the totals pushed up to it, in one transaction.
            let saved = match positions.iter().map(|(_, at)| *at).max() {
                Some(at) if stream == STREAM_ENERGY => {
                    store
                        .save_remote_write_energy(at, &batch.energy_totals)
                        .await
                }
                _ => store.save_remote_write_positions(stream, &positions).await,
            };
            let Err(e) = saved else { break };
            let wait = backoff(options, attempt);
            warn!(error = %e, "cannot save the remote-write position; retrying");
            attempt = attempt.saturating_add(1);
            tokio::select! {
                () = term.cancelled() => return false,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::remote_write::STREAM_GPU;
    use async_trait::async_trait;
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// A receiver answering from a script, recording when each request came.
    #[derive(Debug, Default)]
    struct Scripted {
        answers: Mutex<VecDeque<Delivery>>,
        seen: Mutex<Vec<(Instant, Vec<u8>)>>,
    }

    #[async_trait]
    impl Sink for Scripted {
        async fn send(&self, body: Vec<u8>) -> Delivery {
            self.seen.lock().expect("lock").push((Instant::now(), body));
            self.answers
                .lock()
                .expect("lock")
                .pop_front()
                .unwrap_or(Delivery::Sent)
        }
    }

    fn batch(tag: u8, samples: usize, at: UnixMs) -> Batch {
        Batch {
            body: vec![tag],
            samples,
            positions: vec![(STREAM_GPU, "GPU-1".into(), at)],
            ..Batch::default()
        }
    }

    /// Positions in memory (a real store's worker thread would let paused time jump).
    #[derive(Debug, Default)]
    struct Positions(Mutex<BTreeMap<String, UnixMs>>);

    #[async_trait]
    impl RemoteWriteStore for Positions {
        async fn remote_write_positions(
            &self,
            _stream: &str,
        ) -> Result<BTreeMap<String, UnixMs>, crate::store::StoreError> {
            Ok(self.0.lock().expect("lock").clone())
        }
        async fn save_remote_write_positions(
            &self,
            _stream: &str,
            positions: &[(String, UnixMs)],
        ) -> Result<(), crate::store::StoreError> {
            let mut saved = self.0.lock().expect("lock");
            for (series, at) in positions {
                let p = saved.entry(series.clone()).or_insert(*at);
                *p = (*p).max(*at);
            }
            Ok(())
        }
        async fn gpu_samples_after(
            &self,
            wanted: &[(crate::store::GpuId, UnixMs)],
            _per_gpu: usize,
            _total: usize,
        ) -> Result<Vec<Vec<(UnixMs, gpufleet_core::GpuSample)>>, crate::store::StoreError>
        {
            Ok(vec![Vec::new(); wanted.len()])
        }
        async fn workload_energy_minutes(
            &self,
            _after_ms: UnixMs,
            _to_ms: UnixMs,
        ) -> Result<Vec<crate::store::remote_write::WorkloadNodeEnergy>, crate::store::StoreError>
        {
            Ok(Vec::new())
        }
        async fn workload_energy_totals(
            &self,
            _to_ms: UnixMs,
        ) -> Result<Vec<crate::store::remote_write::WorkloadNodeEnergy>, crate::store::StoreError>
        {
            Ok(Vec::new())
        }
        async fn energy_closed_to(
            &self,
            _from_ms: UnixMs,
        ) -> Result<Option<UnixMs>, crate::store::StoreError> {
            Ok(None)
        }
        async fn remote_write_energy_totals(
            &self,
        ) -> Result<Vec<WorkloadNodeEnergy>, crate::store::StoreError> {
            Ok(Vec::new())
        }
        async fn save_remote_write_energy(
            &self,
            position_ms: UnixMs,
            _totals: &[WorkloadNodeEnergy],
        ) -> Result<(), crate::store::StoreError> {
            self.save_remote_write_positions(STREAM_ENERGY, &[(String::new(), position_ms)])
                .await
        }
    }

    async fn store() -> Arc<dyn RemoteWriteStore> {
        Arc::new(Positions::default())
    }

    /// 503s back off exponentially, 429 waits what Retry-After says (never less than the backoff), a 400 drops the
    /// request (counted) and moves on; order is kept and positions saved after each.
    #[tokio::test(start_paused = true)]
    async fn retries_back_off_and_refusals_are_dropped_and_counted() {
        let retry = |after| Delivery::Retry {
            after,
            why: "test".into(),
        };
        let sink = Arc::new(Scripted::default());
        sink.answers.lock().expect("lock").extend([
            retry(None),
            retry(None),
            retry(None),
            retry(Some(Duration::from_secs(7))),
            retry(Some(Duration::ZERO)),
            Delivery::Sent,
            Delivery::Refused {
                status: 400,
                why: "bad".into(),
            },
            Delivery::Sent,
        ]);
        let store = store().await;
        let stats = Arc::new(Stats::default());
        let (tx, rx) = channel(4);
        let options = BackoffOptions {
            min: Duration::from_millis(100),
            max: Duration::from_millis(250),
        };
        stats.pending.store(30, Relaxed);
        for (tag, at) in [(1u8, 10), (2, 20), (3, 30)] {
            tx.send(batch(tag, 10, at)).await.expect("queued");
        }
        drop(tx);
        let start = Instant::now();
        run_sender(
            rx,
            sink.clone(),
            Arc::clone(&store),
            Arc::clone(&stats),
            options,
            CancellationToken::new(),
        )
        .await;

        let times: Vec<(u128, u8)> = sink
            .seen
            .lock()
            .expect("lock")
            .iter()
            .map(|(t, body)| ((*t - start).as_millis(), body[0]))
            .collect();
        // 0, +100, +200, +250 (capped), then Retry-After 7 s, then Retry-After 0 (the
        // backoff's 250 ms is the floor); then batch 2 (refused), 3.
        assert_eq!(
            times,
            [
                (0, 1),
                (100, 1),
                (300, 1),
                (550, 1),
                (7_550, 1),
                (7_800, 1),
                (7_800, 2),
                (7_800, 3)
            ]
        );
        assert_eq!(stats.sent.load(Relaxed), 20);
        assert_eq!(stats.failed.load(Relaxed), 10);
        assert_eq!(stats.retries.load(Relaxed), 5);
        assert_eq!(stats.pending.load(Relaxed), 0);
        let saved = store
            .remote_write_positions(STREAM_GPU)
            .await
            .expect("positions");
        assert_eq!(saved.get("GPU-1"), Some(&30));
    }

    /// A receiver that never answers: the request is retried until the term ends, and
    /// its position is not saved (the next term sends it again).
    #[tokio::test(start_paused = true)]
    async fn an_undelivered_request_keeps_its_position() {
        let sink = Arc::new(Scripted::default());
        sink.answers.lock().expect("lock").extend(
            std::iter::repeat_with(|| Delivery::Retry {
                after: None,
                why: "down".into(),
            })
            .take(1000),
        );
        let store = store().await;
        let stats = Arc::new(Stats::default());
        let (tx, rx) = channel(1);
        tx.send(batch(1, 5, 99)).await.expect("queued");
        let term = CancellationToken::new();
        let sender = tokio::spawn(run_sender(
            rx,
            sink.clone(),
            Arc::clone(&store),
            Arc::clone(&stats),
            BackoffOptions::default(),
            term.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(120)).await;
        term.cancel();
        sender.await.expect("sender");
        // 100 ms doubling to 30 s: 0, .1, .3, .7, 1.5, 3.1, 6.3, 12.7, 25.5, 55.5, 85.5, 115.5
        assert_eq!(sink.seen.lock().expect("lock").len(), 12);
        assert_eq!(stats.sent.load(Relaxed), 0);
        assert!(
            store
                .remote_write_positions(STREAM_GPU)
                .await
                .expect("positions")
                .is_empty()
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let o = BackoffOptions {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
        };
        let waits: Vec<u128> = (0..12).map(|a| backoff(o, a).as_millis()).collect();
        assert_eq!(
            waits,
            [
                100, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 30_000, 30_000, 30_000
            ]
        );
        assert_eq!(backoff(o, u32::MAX), o.max);
    }
}
