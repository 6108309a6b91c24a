//! One term of the pusher: read what was stored after each position, build requests of
//! at most `max_samples_per_send` samples, and queue them for the sender.
//!
//! Positions: each GPU's newest sample time delivered (so a node that was away and
//! catches up is pushed in order, its own series never older than what was sent), and
//! the newest closed energy minute delivered. A series seen for the first time starts at
//! `backfill` before the term began, so a first start does not flood the receiver with
//! the whole history. The reader runs ahead of the saved positions by at most the queue;
//! a new term starts from the saved ones, so a request in flight when a collector stops
//! is sent again (Prometheus accepts an identical sample again).
//!
//! Per-workload energy is a counter: the cumulative joules (active and idle) of each
//! workload on each node, summed from the store's closed minutes up to the position when
//! the term starts, then advanced minute by minute; each minute's value is stamped with
//! the minute's end. A minute recomputed after it was pushed (late data) is not sent
//! again: the counter carries the difference from the next minute the workload has.

use super::RemoteWriteOptions;
use super::encode;
use super::queue::Batch;
use super::stats::Stats;
use crate::live::status::Clock;
use crate::store::remote_write::{STREAM_ENERGY, STREAM_GPU, WorkloadNodeEnergy};
use crate::store::{FleetReads, RemoteWriteStore, StoreError};
use gpufleet_core::UnixMs;
use gpufleet_proto::prometheus::{TimeSeries, WriteRequest};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

const MINUTE_MS: i64 = 60_000;
/// Energy minutes read per round at most (a long outage catches up an hour a round).
const ENERGY_MINUTES_PER_ROUND: i64 = 60;
/// GPU sample rows read per round at most, all GPUs together (a fleet of 8,000 GPUs at
/// one sample a second reads its new rows in one round; a catch-up is bounded in memory).
const GPU_ROWS_PER_ROUND: usize = 50_000;

/// The reader's state over one term.
pub struct Reader {
    pub fleet: Arc<dyn FleetReads>,
    pub store: Arc<dyn RemoteWriteStore>,
    pub options: RemoteWriteOptions,
    pub stats: Arc<Stats>,
    pub clock: Clock,
    pub queue: mpsc::Sender<Batch>,
    /// Where a series seen for the first time starts.
    floor_ms: UnixMs,
    /// Read (queued) positions per GPU UUID: ahead of the saved ones by the queue.
    gpus: HashMap<String, UnixMs>,
    /// The newest energy minute read.
    energy_ms: UnixMs,
    /// Cumulative energy per (workload key, node) up to `energy_ms`.
    totals: BTreeMap<(String, String), WorkloadNodeEnergy>,
    /// The request being built.
    series: Vec<TimeSeries>,
    samples: usize,
    positions: Vec<(&'static str, String, UnixMs)>,
}

/// The queue closed or the term ended: stop.
#[derive(Debug)]
pub struct Stop;

/// Why a round ended early.
#[derive(Debug)]
enum RoundError {
    Stop,
    Store(StoreError),
}

impl From<StoreError> for RoundError {
    fn from(e: StoreError) -> Self {
        RoundError::Store(e)
    }
}

impl From<Stop> for RoundError {
    fn from(_: Stop) -> Self {
        RoundError::Stop
    }
}

fn floor_minute(ms: UnixMs) -> UnixMs {
    ms.div_euclid(MINUTE_MS) * MINUTE_MS
}

impl Reader {
    /// Loads the saved positions and energy totals (retrying a failing store until
    /// `term` ends).
    pub async fn start(
        fleet: Arc<dyn FleetReads>,
        store: Arc<dyn RemoteWriteStore>,
        options: RemoteWriteOptions,
        stats: Arc<Stats>,
        clock: Clock,
        queue: mpsc::Sender<Batch>,
        term: &CancellationToken,
    ) -> Result<Reader, Stop> {
        let now = clock();
        let backfill = i64::try_from(options.backfill.as_millis()).unwrap_or(i64::MAX);
        let floor_ms = now.saturating_sub(backfill);
        loop {
            let loaded = async {
                let gpus = store.remote_write_positions(STREAM_GPU).await?;
                let energy = store.remote_write_positions(STREAM_ENERGY).await?;
                let energy_ms = energy
                    .get("")
                    .copied()
                    .unwrap_or_else(|| floor_minute(floor_ms));
                let totals = store.workload_energy_totals(energy_ms).await?;
                Ok::<_, StoreError>((gpus, energy_ms, totals))
            }
            .await;
            match loaded {
                Ok((gpus, energy_ms, totals)) => {
                    return Ok(Reader {
                        fleet,
                        store,
                        floor_ms,
                        gpus: gpus.into_iter().collect(),
                        energy_ms,
                        totals: totals
                            .into_iter()
                            .map(|t| ((t.workload.key(), t.node.clone()), t))
                            .collect(),
                        options,
                        stats,
                        clock,
                        queue,
                        series: Vec::new(),
                        samples: 0,
                        positions: Vec::new(),
                    });
                }
                Err(e) => {
                    warn!(error = %e, "cannot read the remote-write positions; retrying");
                    tokio::select! {
                        () = term.cancelled() => return Err(Stop),
                        () = tokio::time::sleep(options.interval) => {}
                    }
                }
            }
        }
    }

    /// Reads and queues until `term` ends: a round every `interval`, at once again while
    /// a round left more to read.
    pub async fn run(mut self, term: &CancellationToken) {
        loop {
            let wait = match self.round().await {
                Ok(true) => None,
                Ok(false) => Some(self.options.interval),
                Err(RoundError::Stop) => return,
                Err(RoundError::Store(e)) => {
                    warn!(error = %e, "cannot read samples for remote-write; retrying");
                    // What was built is queued with its positions; the rest is read again.
                    if self.flush().await.is_err() {
                        return;
                    }
                    Some(self.options.interval)
                }
            };
            if let Some(wait) = wait {
                tokio::select! {
                    () = term.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            } else if term.is_cancelled() {
                return;
            }
        }
    }

    /// One pass over every GPU and the energy minutes; `Ok(true)` if there is more to
    /// read already.
    async fn round(&mut self) -> Result<bool, RoundError> {
        let mut more = false;
        // Ticks per GPU per read: about a request's worth of one GPU's families.
        let chunk = (self.options.max_samples_per_send / encode::GPU_FAMILIES.len()).max(1);
        let nodes = self.fleet.nodes().await?;
        // The GPUs with data newer than their position, read in one query.
        let mut wanted = Vec::new();
        let mut gpus = Vec::new();
        for node in &nodes {
            for gpu in &node.gpus {
                let from = self
                    .gpus
                    .get(&gpu.info.uuid)
                    .copied()
                    .unwrap_or(self.floor_ms);
                if node.last_seen_ms.is_none_or(|t| t <= from) {
                    continue;
                }
                wanted.push((gpu.id, from));
                gpus.push((node, gpu));
            }
        }
        let read = (self.store)
            .gpu_samples_after(&wanted, chunk, GPU_ROWS_PER_ROUND)
            .await?;
        more |= read.iter().map(Vec::len).sum::<usize>() >= GPU_ROWS_PER_ROUND;
        for ((node, gpu), samples) in gpus.into_iter().zip(read) {
            let Some(&(last, _)) = samples.last() else {
                continue;
            };
            more |= samples.len() == chunk;
            let series = encode::gpu_series(&node.name, gpu, &samples);
            self.add(series, (STREAM_GPU, gpu.info.uuid.clone(), last))
                .await?;
            self.gpus.insert(gpu.info.uuid.clone(), last);
        }
        more |= self.energy().await?;
        self.flush().await?;
        Ok(more)
    }

    /// Adds the closed energy minutes after the energy position; `Ok(true)` if more are
    /// closed than one round reads.
    async fn energy(&mut self) -> Result<bool, RoundError> {
        let delay = i64::try_from(self.options.energy_delay.as_millis()).unwrap_or(i64::MAX);
        // The newest minute whose end is `energy_delay` behind the clock.
        let closed = floor_minute((self.clock)().saturating_sub(delay)) - MINUTE_MS;
        if closed <= self.energy_ms {
            return Ok(false);
        }
        let to = closed.min(self.energy_ms + ENERGY_MINUTES_PER_ROUND * MINUTE_MS);
        let rows = self
            .store
            .workload_energy_minutes(self.energy_ms, to)
            .await?;
        let mut by_minute: BTreeMap<UnixMs, Vec<WorkloadNodeEnergy>> = BTreeMap::new();
        for row in rows {
            by_minute.entry(row.minute_ms).or_default().push(row);
        }
        for (minute, rows) in by_minute {
            let mut series = Vec::with_capacity(rows.len() * 2);
            for row in rows {
                let key = (row.workload.key(), row.node.clone());
                let total = self
                    .totals
                    .entry(key)
                    .or_insert_with(|| WorkloadNodeEnergy {
                        active_mj: 0,
                        idle_mj: 0,
                        ..row.clone()
                    });
                total.active_mj = total.active_mj.saturating_add(row.active_mj);
                total.idle_mj = total.idle_mj.saturating_add(row.idle_mj);
                // Names learned later (pod, container) label the series from then on.
                total.workload = row.workload;
                total.minute_ms = minute;
                series.extend(encode::energy_series(total, minute + MINUTE_MS));
            }
            self.add(series, (STREAM_ENERGY, String::new(), minute))
                .await?;
        }
        self.positions.push((STREAM_ENERGY, String::new(), to));
        self.energy_ms = to;
        Ok(to < closed)
    }

    /// Adds series and the position they take a stream to; queues the request once it
    /// holds `max_samples_per_send` samples.
    async fn add(
        &mut self,
        series: Vec<TimeSeries>,
        position: (&'static str, String, UnixMs),
    ) -> Result<(), Stop> {
        self.samples += encode::sample_count(&series);
        self.series.extend(series);
        self.positions.push(position);
        if self.samples >= self.options.max_samples_per_send {
            self.flush().await?;
        }
        Ok(())
    }

    /// Queues what was built (positions alone too), waiting while the queue is full.
    async fn flush(&mut self) -> Result<(), Stop> {
        if self.positions.is_empty() {
            return Ok(());
        }
        let series = std::mem::take(&mut self.series);
        let body = if series.is_empty() {
            Vec::new()
        } else {
            encode::encode(&WriteRequest { timeseries: series })
        };
        let batch = Batch {
            body,
            samples: std::mem::take(&mut self.samples),
            positions: std::mem::take(&mut self.positions),
        };
        self.stats
            .pending
            .fetch_add(i64::try_from(batch.samples).unwrap_or(i64::MAX), Relaxed);
        let samples = batch.samples;
        if self.queue.send(batch).await.is_err() {
            self.stats
                .pending
                .fetch_sub(i64::try_from(samples).unwrap_or(i64::MAX), Relaxed);
            return Err(Stop);
        }
        Ok(())
    }
}
