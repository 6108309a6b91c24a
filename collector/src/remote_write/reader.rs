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
//! workload on each node, advanced minute by minute; each minute's value is stamped with
//! the minute's end. The totals pushed are saved with the energy position once delivered,
//! and a term starts from them (or from the closed minutes summed up to the position,
//! where higher), so the counter never goes back after a restart, whatever retention
//! deleted since. A minute recomputed after it was pushed (late data) is not sent again:
//! a higher figure shows in the next term's starting total.

use super::RemoteWriteOptions;
use super::encode;
use super::queue::Batch;
use super::stats::Stats;
use crate::live::status::Clock;
use crate::store::remote_write::{STREAM_ENERGY, STREAM_GPU, WorkloadNodeEnergy};
use crate::store::{FleetReads, RemoteWriteStore, StoreError};
use gpufleet_core::UnixMs;
use gpufleet_proto::prometheus::{TimeSeries, WriteRequest};
use std::collections::btree_map::Entry;
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
    /// The totals reached at the energy positions in `positions`, saved with them.
    energy_totals: Vec<WorkloadNodeEnergy>,
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

/// A term's starting counters: the totals last pushed, or the stored minutes summed up to
/// the position where they are higher (a workload never pushed, minutes recomputed
/// higher). Never below what was pushed, though retention deletes minutes and a minute
/// may be recomputed lower.
fn starting_totals(
    summed: Vec<WorkloadNodeEnergy>,
    pushed: Vec<WorkloadNodeEnergy>,
) -> BTreeMap<(String, String), WorkloadNodeEnergy> {
    let mut totals: BTreeMap<(String, String), WorkloadNodeEnergy> = BTreeMap::new();
    for t in summed.into_iter().chain(pushed) {
        match totals.entry((t.workload.key(), t.node.clone())) {
            Entry::Vacant(v) => {
                v.insert(t);
            }
            Entry::Occupied(mut o) => {
                let o = o.get_mut();
                o.active_mj = o.active_mj.max(t.active_mj);
                o.idle_mj = o.idle_mj.max(t.idle_mj);
            }
        }
    }
    totals
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
                let summed = store.workload_energy_totals(energy_ms).await?;
                let pushed = store.remote_write_energy_totals().await?;
                Ok::<_, StoreError>((gpus, energy_ms, summed, pushed))
            }
            .await;
            match loaded {
                Ok((gpus, energy_ms, summed, pushed)) => {
                    return Ok(Reader {
                        fleet,
                        store,
                        floor_ms,
                        gpus: gpus.into_iter().collect(),
                        energy_ms,
                        totals: starting_totals(summed, pushed),
                        energy_totals: Vec::new(),
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
        let chunk = (self.options.max_samples_per_send / encode::gpu_family_count()).max(1);
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
    /// closed than one round reads. A minute is closed once its end is `energy_delay`
    /// behind the clock and the accountant's watermark has passed it on every GPU with
    /// samples in it or later (see [`RemoteWriteStore::energy_closed_to`]): minutes not
    /// accounted yet (an outage, a backlog) hold the position back instead of being
    /// skipped. A minute with more series than a request holds is split, its position
    /// (and the totals saved with it) on the last part.
    async fn energy(&mut self) -> Result<bool, RoundError> {
        let delay = i64::try_from(self.options.energy_delay.as_millis()).unwrap_or(i64::MAX);
        // The newest minute whose end is `energy_delay` behind the clock.
        let mut closed = floor_minute((self.clock)().saturating_sub(delay)) - MINUTE_MS;
        if closed <= self.energy_ms {
            return Ok(false);
        }
        let next = self.energy_ms.saturating_add(MINUTE_MS);
        if let Some(done) = self.store.energy_closed_to(next).await? {
            closed = closed.min(floor_minute(done) - MINUTE_MS);
            if closed <= self.energy_ms {
                return Ok(false);
            }
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
            let mut reached = Vec::with_capacity(rows.len());
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
                let series = encode::energy_series(total, minute + MINUTE_MS);
                reached.push(total.clone());
                if self.samples > 0
                    && self.samples + encode::sample_count(&series)
                        > self.options.max_samples_per_send
                {
                    self.flush().await?;
                }
                self.samples += encode::sample_count(&series);
                self.series.extend(series);
            }
            self.energy_totals.extend(reached);
            self.add(Vec::new(), (STREAM_ENERGY, String::new(), minute))
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
        if self.positions.is_empty() && self.series.is_empty() {
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
            energy_totals: std::mem::take(&mut self.energy_totals),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::{BackoffOptions, Delivery};
    use crate::remote_write::client::Sink;
    use crate::remote_write::queue;
    use async_trait::async_trait;
    use gpufleet_core::{Workload, WorkloadKind};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

    const T0: UnixMs = 1_700_000_040_000 / MINUTE_MS * MINUTE_MS;

    /// The energy side of the store in memory: closed minutes, what re-summing them
    /// gives (retention may have deleted some), the accountant's watermark and what the
    /// sender saved.
    #[derive(Debug, Default)]
    struct Energy {
        minutes: Mutex<Vec<WorkloadNodeEnergy>>,
        summed: Mutex<Vec<WorkloadNodeEnergy>>,
        closed_to: Mutex<Option<UnixMs>>,
        position: Mutex<Option<UnixMs>>,
        pushed: Mutex<BTreeMap<(String, String), WorkloadNodeEnergy>>,
        /// Each energy save: the position and how many totals came with it.
        saves: Mutex<Vec<(UnixMs, usize)>>,
    }

    #[async_trait]
    impl RemoteWriteStore for Energy {
        async fn remote_write_positions(
            &self,
            stream: &str,
        ) -> Result<BTreeMap<String, UnixMs>, StoreError> {
            let position = *self.position.lock().expect("lock");
            Ok(match (stream, position) {
                (STREAM_ENERGY, Some(p)) => BTreeMap::from([(String::new(), p)]),
                _ => BTreeMap::new(),
            })
        }
        async fn save_remote_write_positions(
            &self,
            _stream: &str,
            _positions: &[(String, UnixMs)],
        ) -> Result<(), StoreError> {
            Ok(())
        }
        async fn gpu_samples_after(
            &self,
            wanted: &[(crate::store::GpuId, UnixMs)],
            _per_gpu: usize,
            _total: usize,
        ) -> Result<Vec<Vec<(UnixMs, gpufleet_core::GpuSample)>>, StoreError> {
            Ok(vec![Vec::new(); wanted.len()])
        }
        async fn workload_energy_minutes(
            &self,
            after_ms: UnixMs,
            to_ms: UnixMs,
        ) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
            let minutes = self.minutes.lock().expect("lock");
            Ok(minutes
                .iter()
                .filter(|m| m.minute_ms > after_ms && m.minute_ms <= to_ms)
                .cloned()
                .collect())
        }
        async fn workload_energy_totals(
            &self,
            _to_ms: UnixMs,
        ) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
            Ok(self.summed.lock().expect("lock").clone())
        }
        async fn energy_closed_to(&self, _from_ms: UnixMs) -> Result<Option<UnixMs>, StoreError> {
            Ok(*self.closed_to.lock().expect("lock"))
        }
        async fn remote_write_energy_totals(&self) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
            Ok(self
                .pushed
                .lock()
                .expect("lock")
                .values()
                .cloned()
                .collect())
        }
        async fn save_remote_write_energy(
            &self,
            position_ms: UnixMs,
            totals: &[WorkloadNodeEnergy],
        ) -> Result<(), StoreError> {
            self.saves
                .lock()
                .expect("lock")
                .push((position_ms, totals.len()));
            let mut position = self.position.lock().expect("lock");
            *position = Some(position.map_or(position_ms, |p| p.max(position_ms)));
            let mut pushed = self.pushed.lock().expect("lock");
            for t in totals {
                let saved = pushed
                    .entry((t.workload.key(), t.node.clone()))
                    .or_insert_with(|| t.clone());
                saved.active_mj = saved.active_mj.max(t.active_mj);
                saved.idle_mj = saved.idle_mj.max(t.idle_mj);
            }
            Ok(())
        }
    }

    /// A receiver taking everything, keeping each request.
    #[derive(Debug, Default)]
    struct Receiver(Mutex<Vec<WriteRequest>>);

    #[async_trait]
    impl Sink for Receiver {
        async fn send(&self, body: Vec<u8>) -> Delivery {
            let request = encode::decode(&body).expect("a valid request");
            self.0.lock().expect("lock").push(request);
            Delivery::Sent
        }
    }

    fn minute(at: UnixMs, job: &str, active_mj: u64) -> WorkloadNodeEnergy {
        WorkloadNodeEnergy {
            minute_ms: at,
            workload: Workload {
                kind: WorkloadKind::Slurm,
                job_id: Some(job.into()),
                ..Workload::default()
            },
            node: "node-a".into(),
            active_mj,
            idle_mj: 0,
        }
    }

    /// One term against `store`: one read round at `now`, every request delivered and its
    /// positions saved; the requests (with their energy positions) come back.
    async fn term(
        store: &Arc<Energy>,
        now: &Arc<AtomicI64>,
        max_samples_per_send: usize,
    ) -> Vec<WriteRequest> {
        let fleet: Arc<dyn FleetReads> = Arc::new(
            crate::store::sqlite::SqliteStore::open("sqlite::memory:")
                .await
                .expect("store"),
        );
        let sink = Arc::new(Receiver::default());
        let mut options = RemoteWriteOptions::new(sink.clone());
        options.max_samples_per_send = max_samples_per_send;
        options.queue_capacity = 1_000;
        let clock_now = Arc::clone(now);
        let clock: Clock = Arc::new(move || clock_now.load(SeqCst));
        let stats = Arc::new(Stats::default());
        let (tx, rx) = queue::channel(options.queue_capacity);
        let store_dyn: Arc<dyn RemoteWriteStore> = store.clone();
        let term = CancellationToken::new();
        let mut reader = Reader::start(
            fleet,
            Arc::clone(&store_dyn),
            options,
            Arc::clone(&stats),
            clock,
            tx,
            &term,
        )
        .await
        .expect("started");
        while reader.round().await.expect("round") {}
        drop(reader);
        queue::run_sender(
            rx,
            sink.clone(),
            store_dyn,
            stats,
            BackoffOptions::default(),
            term,
        )
        .await;
        std::mem::take(&mut *sink.0.lock().expect("lock"))
    }

    /// The active joules each request pushed for `job`.
    fn active_joules(requests: &[WriteRequest], job: &str) -> Vec<f64> {
        requests
            .iter()
            .flat_map(|r| &r.timeseries)
            .filter(|s| {
                s.labels
                    .iter()
                    .any(|l| l.name == "state" && l.value == "active")
                    && s.labels.iter().any(|l| l.value == format!("slurm:{job}"))
            })
            .flat_map(|s| s.samples.iter().map(|x| x.value))
            .collect()
    }

    /// A new term after retention deleted the minutes already pushed (re-summing them
    /// gives less) continues from the totals saved with the position: the counter never
    /// goes down.
    #[tokio::test]
    async fn a_new_term_continues_from_the_pushed_totals() {
        let store = Arc::new(Energy::default());
        *store.position.lock().expect("lock") = Some(T0);
        store.minutes.lock().expect("lock").extend([
            minute(T0 + MINUTE_MS, "7", 1_000),
            minute(T0 + 2 * MINUTE_MS, "7", 1_000),
        ]);
        let now = Arc::new(AtomicI64::new(T0 + 10 * MINUTE_MS));
        let first = term(&store, &now, 2_000).await;
        assert_eq!(active_joules(&first, "7"), [1.0, 2.0]);
        assert_eq!(
            *store.position.lock().expect("lock"),
            Some(T0 + 7 * MINUTE_MS)
        );

        // Retention deletes the pushed minutes; a later minute is accounted.
        store.summed.lock().expect("lock").clear();
        *store.minutes.lock().expect("lock") = vec![minute(T0 + 8 * MINUTE_MS, "7", 500)];
        now.store(T0 + 11 * MINUTE_MS, SeqCst);
        let second = term(&store, &now, 2_000).await;
        assert_eq!(
            active_joules(&second, "7"),
            [2.5],
            "never below the 2 J pushed"
        );
    }

    /// The position stops before the first minute the accountant has not closed (its
    /// watermark), whatever the clock says, and moves on once it is closed.
    #[tokio::test]
    async fn the_position_waits_for_the_accountant() {
        let store = Arc::new(Energy::default());
        *store.position.lock().expect("lock") = Some(T0);
        *store.closed_to.lock().expect("lock") = Some(T0 + 2 * MINUTE_MS);
        store
            .minutes
            .lock()
            .expect("lock")
            .push(minute(T0 + MINUTE_MS, "7", 1_000));
        let now = Arc::new(AtomicI64::new(T0 + 30 * MINUTE_MS));
        let first = term(&store, &now, 2_000).await;
        assert_eq!(active_joules(&first, "7"), [1.0]);
        assert_eq!(
            *store.position.lock().expect("lock"),
            Some(T0 + MINUTE_MS),
            "minute 2 is not accounted yet"
        );

        // The accountant catches up (minute 2 written late): it is pushed, not skipped.
        store
            .minutes
            .lock()
            .expect("lock")
            .push(minute(T0 + 2 * MINUTE_MS, "7", 1_000));
        *store.closed_to.lock().expect("lock") = None;
        let second = term(&store, &now, 2_000).await;
        assert_eq!(active_joules(&second, "7"), [2.0]);
        assert_eq!(
            *store.position.lock().expect("lock"),
            Some(T0 + 27 * MINUTE_MS)
        );
    }

    /// A minute with more series than a request holds is split; the totals are saved with
    /// the position on the last part only.
    #[tokio::test]
    async fn a_large_minute_is_split_across_requests() {
        let store = Arc::new(Energy::default());
        *store.position.lock().expect("lock") = Some(T0);
        store
            .minutes
            .lock()
            .expect("lock")
            .extend(["1", "2", "3", "4", "5"].map(|job| minute(T0 + MINUTE_MS, job, 1_000)));
        let now = Arc::new(AtomicI64::new(T0 + 5 * MINUTE_MS));
        let requests = term(&store, &now, 4).await;
        let sizes: Vec<usize> = requests
            .iter()
            .map(|r| encode::sample_count(&r.timeseries))
            .collect();
        assert_eq!(sizes, [4, 4, 2], "two samples (active, idle) a workload");
        assert_eq!(
            *store.saves.lock().expect("lock"),
            [(T0 + 2 * MINUTE_MS, 5)],
            "one save, with the last part: the position and every total"
        );
    }
}
