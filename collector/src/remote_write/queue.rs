//! The pusher's queue: a bounded channel of ready requests between the reader and one
//! sender, which sends each in order through [`crate::outbound`], and records the
//! positions a request carried once it is delivered (or dropped).
//!
//! When full, the reader waits: nothing is lost, the samples stay in the store and are
//! read when there is room. A request is retried ([`outbound::classify`]: 5xx, 429, the 4xx
//! that say nothing about the samples such as 401 or 404, no answer) with exponential
//! backoff, `Retry-After` as a floor, until delivered or until the term ends; any other
//! 4xx would be refused again, so it is dropped and its samples counted as failed. Either
//! way its positions are then saved, so a restart resumes after it.

use super::client::Sink;
use super::stats::Stats;
use crate::outbound::{self, Delivery, Outcome, Policy, RetryAfter};
use crate::store::RemoteWriteStore;
use crate::store::remote_write::{STREAM_ENERGY, WorkloadNodeEnergy};
use gpufleet_core::UnixMs;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::outbound::BackoffOptions;

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

/// How the sender retries, a delivery or a save: without limit (samples must not be lost
/// while the receiver or the store is down), so `Retry-After` never below the backoff; an
/// attempt in flight when the term ends is finished, so a delivered request's positions
/// are saved and the next term does not send it again.
fn policy(backoff: BackoffOptions) -> Policy {
    Policy {
        backoff,
        max_attempts: None,
        retry_after: RetryAfter::AtLeastBackoff,
        abandon_in_flight: false,
    }
}

/// Sends one request until delivered or refused; `false` if `term` ended first.
async fn deliver(
    batch: &Batch,
    sink: &dyn Sink,
    stats: &Stats,
    options: BackoffOptions,
    term: &CancellationToken,
) -> bool {
    let body = &batch.body;
    let outcome = outbound::deliver(
        policy(options),
        term,
        move || sink.send(body.clone()),
        |r| {
            warn!(
                // 0: the first retry.
                attempt = r.attempt - 1,
                retry_in_ms = r.wait.as_millis() as u64,
                reason = %r.why,
                "remote-write request not delivered; retrying"
            );
            stats.retries.fetch_add(1, Relaxed);
        },
    )
    .await;
    match outcome {
        Outcome::Sent => {
            stats.sent.fetch_add(batch.samples as u64, Relaxed);
            debug!(samples = batch.samples, "remote-write request delivered");
            true
        }
        Outcome::Refused { status, why } => {
            stats.failed.fetch_add(batch.samples as u64, Relaxed);
            warn!(
                status,
                samples = batch.samples,
                answer = %why,
                "remote-write receiver refused a request; its samples are dropped"
            );
            true
        }
        // Not without an attempt limit; were there one, dropped as a refused request.
        Outcome::GaveUp { attempts, why } => {
            stats.failed.fetch_add(batch.samples as u64, Relaxed);
            warn!(
                attempts,
                samples = batch.samples,
                answer = %why,
                "remote-write request not delivered; its samples are dropped"
            );
            true
        }
        Outcome::Cancelled => false,
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
        let positions = &positions;
        let energy_at = positions.iter().map(|(_, at)| *at).max();
        let save = move || async move {
            // The energy position goes with the totals pushed up to it, in one transaction.
            let saved = match energy_at {
                Some(at) if stream == STREAM_ENERGY => {
                    store
                        .save_remote_write_energy(at, &batch.energy_totals)
                        .await
                }
                _ => store.save_remote_write_positions(stream, positions).await,
            };
            match saved {
                Ok(()) => Delivery::Sent,
                Err(e) => Delivery::Retry {
                    after: None,
                    why: e.to_string(),
                },
            }
        };
        let outcome = outbound::deliver(policy(options), term, save, |r| {
            warn!(error = %r.why, "cannot save the remote-write position; retrying");
        })
        .await;
        if matches!(outcome, Outcome::Cancelled) {
            return false;
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
    use std::time::Duration;
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
}
