//! Per-minute rollups and retention: the task that keeps `gpu_minutes` /
//! `host_minutes` up to date and expires old data, and the flags that configure it.
//!
//! It works like the energy [`crate::accounting::accountant`]: per series (a GPU, or a node's host
//! metrics) the store keeps a watermark; a pass rolls up the minutes from the watermark to
//! the minute of the newest sample (a minute is closed once a later sample exists). Late
//! data behind the watermark is found from the commit announcements
//! ([`crate::live::state::Live::subscribe`], noted by a listener of its own with
//! [`touched_series`]: [`crate::accounting::notes`]) and, at start-up or after missed
//! announcements, by comparing stored sample counts with raw counts. The rollups themselves are computed by the store (one `GROUP BY` per range).
//!
//! Retention runs in the same task every `retention_period`: raw samples older than
//! `--retain-raw` go, but only behind both the rollup and the energy watermarks
//! ([`crate::store::RollupStore::expire_raw_before`]); rollups, energy minutes and events older
//! than `--retain-rollups` go too. Minutes before a series' raw horizon are never
//! recomputed from raw (the store refuses), so reports and energy totals stay exact.
//!
//! Packing runs in the same task every `pack_period`, after a pass: closed minutes of host
//! rows, process ticks and GPU samples older than `pack_after`, rolled up (host),
//! energy-accounted (process) or both (GPU), become one packed value per node or GPU per
//! minute, and closed hours of rollup minutes whose raw minutes are packed one value per
//! series per hour ([`crate::store::RollupStore::pack_closed_minutes`]).

use crate::accounting::accountant;
use crate::accounting::energy::{MINUTE_MS, minute_of};
use crate::accounting::notes::Notes;
use crate::live::state::{Committed, Live};
use crate::metrics::Metrics;
use crate::store::rollup::{RetentionOutcome, RollupKey};
use crate::store::{PackOutcome, RollupStore, StoreError};
use gpufleet_core::UnixMs;
use gpufleet_core::config::parse_duration;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Most minutes rolled up per transaction (6 h: 21,600 rows of a GPU at 1 Hz).
const CHUNK_MINUTES: i64 = 360;

/// How rollups and retention run.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionOptions {
    /// Raw samples (GPU, process, host) are kept this long.
    pub retain_raw: Duration,
    /// Rollups, energy minutes and events are kept this long.
    pub retain_rollups: Duration,
    /// How often the task rolls up new minutes.
    pub period: Duration,
    /// How often retention runs.
    pub retention_period: Duration,
    /// Most rows deleted per transaction (about; see `RollupStore::expire_raw_before`).
    pub batch_rows: usize,
    /// How far back the start-up check for late data looks.
    pub recheck_window: Duration,
    /// Closed minutes of host rows, process ticks and GPU samples older than this are
    /// packed (one value per node or GPU per minute); checked every `pack_period`, at most
    /// `pack_budget` minutes of each at a time. It must stay above `recheck_window` (the
    /// start-up recheck counts rows) and the followers' 30 s; rows take several times the
    /// space of their packed minute, so the shorter it is, the less a database holds as rows.
    pub pack_after: Duration,
    pub pack_period: Duration,
    pub pack_budget: usize,
}

impl Default for RetentionOptions {
    fn default() -> Self {
        RetentionOptions {
            retain_raw: Duration::from_secs(7 * 86_400),
            retain_rollups: Duration::from_secs(400 * 86_400),
            period: Duration::from_secs(5),
            retention_period: Duration::from_secs(600),
            batch_rows: 5_000,
            recheck_window: Duration::from_secs(600),
            pack_after: Duration::from_secs(900),
            pack_period: Duration::from_secs(600),
            pack_budget: 20_000,
        }
    }
}

/// `--retain-raw` / `--retain-rollups` (on `serve`).
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// How long raw samples (GPU, process and host samples) are kept. Older ones are
    /// deleted once they are rolled up and energy-accounted; charts of older ranges come
    /// from the per-minute rollups.
    #[arg(long, env = "GPUFLEET_RETAIN_RAW", default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    pub retain_raw: Duration,
    /// How long per-minute rollups, energy minutes and events are kept.
    #[arg(long, env = "GPUFLEET_RETAIN_ROLLUPS", default_value = "400d", value_parser = parse_duration, value_name = "DURATION")]
    pub retain_rollups: Duration,
}

impl RetentionArgs {
    /// The options, or why the flags do not make sense together.
    pub fn options(&self) -> Result<RetentionOptions, String> {
        if self.retain_rollups < self.retain_raw {
            return Err(format!(
                "--retain-rollups ({}) must not be shorter than --retain-raw ({}): \
                 rollups replace raw samples once these expire",
                humantime::format_duration(self.retain_rollups),
                humantime::format_duration(self.retain_raw)
            ));
        }
        if self.retain_raw < Duration::from_secs(3600) {
            return Err(format!(
                "--retain-raw ({}) must be at least 1h (late data needs its raw samples)",
                humantime::format_duration(self.retain_raw)
            ));
        }
        Ok(RetentionOptions {
            retain_raw: self.retain_raw,
            retain_rollups: self.retain_rollups,
            ..Default::default()
        })
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Which tier answers a series request: the rollups when the step is at least a minute
/// or the range starts before the raw horizon (raw samples are gone there), else raw.
pub fn use_rollups(step_ms: Option<i64>, from_ms: UnixMs, horizon: Option<UnixMs>) -> bool {
    step_ms.is_some_and(|s| s >= MINUTE_MS) || horizon.is_some_and(|h| from_ms < h)
}

/// The rollup task's state between passes.
pub struct Rollups {
    store: Arc<dyn RollupStore>,
    options: RetentionOptions,
    clock: crate::live::status::Clock,
    /// (series, minute) touched by commits since the last pass.
    dirty: BTreeSet<(RollupKey, UnixMs)>,
    /// Compare stored minutes with raw sample counts on the next pass (start-up, lag).
    pub recheck: bool,
    /// When retention last ran (collector clock).
    last_expiry: Option<UnixMs>,
    /// When packing last ran (collector clock).
    last_pack: Option<UnixMs>,
}

impl Rollups {
    pub fn new(
        store: Arc<dyn RollupStore>,
        options: RetentionOptions,
        clock: crate::live::status::Clock,
    ) -> Self {
        Rollups {
            store,
            options,
            clock,
            dirty: BTreeSet::new(),
            recheck: true,
            last_expiry: None,
            last_pack: None,
        }
    }

    /// Marks one minute of one series for recomputation.
    pub fn mark(&mut self, key: RollupKey, time_ms: UnixMs) {
        self.dirty.insert((key, minute_of(time_ms)));
    }

    /// One pass: recompute touched minutes behind the watermarks, then advance them.
    /// Returns the minutes written.
    pub async fn pass(&mut self) -> Result<usize, StoreError> {
        let store = Arc::clone(&self.store);
        if self.recheck {
            let since = (self.clock)().saturating_sub(ms(self.options.recheck_window));
            self.dirty.extend(store.stale_rollup_minutes(since).await?);
            self.recheck = false;
        }
        let cursors: HashMap<RollupKey, _> = store
            .rollup_cursors()
            .await?
            .into_iter()
            .map(|c| (c.key, c))
            .collect();
        let mut written = 0;
        let mut failed = BTreeSet::new();
        for (key, minute) in std::mem::take(&mut self.dirty) {
            let Some(done) = cursors.get(&key).and_then(|c| c.done_to_ms) else {
                continue;
            };
            if minute >= done {
                continue; // the forward pass below gets it
            }
            match store
                .replace_rollups(key, minute, minute + MINUTE_MS, None)
                .await
            {
                Ok(n) => written += n,
                Err(e) => {
                    warn!(series = ?key, minute_ms = minute, error = %e, "cannot recompute a rollup minute");
                    failed.insert((key, minute));
                }
            }
        }
        self.dirty.extend(failed);
        for c in cursors.values() {
            let (Some(first), Some(last)) = (c.first_sample_ms, c.last_sample_ms) else {
                continue;
            };
            let mut from = c.done_to_ms.unwrap_or_else(|| minute_of(first));
            let upto = minute_of(last);
            while from < upto {
                let to = (from + CHUNK_MINUTES * MINUTE_MS).min(upto);
                written += store.replace_rollups(c.key, from, to, Some(to)).await?;
                from = to;
            }
        }
        Ok(written)
    }

    /// Retention as of `now_ms`: raw samples older than `retain_raw` (behind the
    /// watermarks), then rollups, energy minutes and events older than `retain_rollups`.
    pub async fn expire(&mut self, now_ms: UnixMs) -> Result<RetentionOutcome, StoreError> {
        let batch = self.options.batch_rows;
        let raw_cutoff = now_ms.saturating_sub(ms(self.options.retain_raw));
        let mut out = self.store.expire_raw_before(raw_cutoff, batch).await?;
        let rollup_cutoff = now_ms.saturating_sub(ms(self.options.retain_rollups));
        let more = self
            .store
            .expire_rollups_before(rollup_cutoff, batch)
            .await?;
        for (table, n) in more.deleted {
            *out.deleted.entry(table).or_default() += n;
        }
        out.horizons_raised += more.horizons_raised;
        out.transactions += more.transactions;
        out.partitions_dropped.extend(more.partitions_dropped);
        self.last_expiry = Some(now_ms);
        if out.total() > 0 || !out.partitions_dropped.is_empty() {
            info!(deleted = ?out.deleted, transactions = out.transactions, partitions_dropped = ?out.partitions_dropped, "retention: expired data deleted");
        }
        Ok(out)
    }

    /// Packs the closed minutes older than `pack_after` as of `now_ms` (behind the rollup
    /// watermarks: run after a pass).
    pub async fn pack(&mut self, now_ms: UnixMs) -> Result<PackOutcome, StoreError> {
        let before = now_ms.saturating_sub(ms(self.options.pack_after));
        let out = (self.store)
            .pack_closed_minutes(before, self.options.pack_budget)
            .await?;
        self.last_pack = Some(now_ms);
        if out.minutes > 0 || out.hours > 0 || out.rollup_minutes > 0 || out.health_readings > 0 {
            debug!(
                minutes = out.minutes,
                hours = out.hours,
                rollup_minutes = out.rollup_minutes,
                health_readings = out.health_readings,
                rows = out.rows,
                "packed closed minutes"
            );
        }
        Ok(out)
    }

    /// Retention, then packing, each if due (after a pass), timed on `metrics`; a failure
    /// is logged and retried at the next period.
    async fn expire_and_pack_if_due(&mut self, metrics: &Metrics) {
        let began = Instant::now();
        match self.expire_if_due().await {
            Ok(ran) => {
                if ran.is_some() {
                    metrics.observe_pass(RETENTION_TASK, began, true);
                }
            }
            Err(e) => {
                metrics.observe_pass(RETENTION_TASK, began, false);
                warn!(error = %e, "retention failed; retrying next period");
            }
        }
        let began = Instant::now();
        match self.pack_if_due().await {
            Ok(ran) => {
                if let Some(out) = ran {
                    metrics.observe_pass(PACKING_TASK, began, true);
                    metrics.packed_rows.fetch_add(out.rows, Relaxed);
                }
            }
            Err(e) => {
                metrics.observe_pass(PACKING_TASK, began, false);
                warn!(error = %e, "packing closed minutes failed; retrying next period");
            }
        }
    }

    /// Runs [`Rollups::pack`] when `pack_period` has passed since the last run; `None`
    /// when it was not due.
    async fn pack_if_due(&mut self) -> Result<Option<PackOutcome>, StoreError> {
        let now = (self.clock)();
        let due = self
            .last_pack
            .is_none_or(|t| now - t >= ms(self.options.pack_period));
        match due {
            true => self.pack(now).await.map(Some),
            false => Ok(None),
        }
    }

    /// Runs [`Rollups::expire`] when `retention_period` has passed since the last run;
    /// `None` when it was not due.
    async fn expire_if_due(&mut self) -> Result<Option<RetentionOutcome>, StoreError> {
        let now = (self.clock)();
        let due = self
            .last_expiry
            .is_none_or(|t| now - t >= ms(self.options.retention_period));
        match due {
            true => self.expire(now).await.map(Some),
            false => Ok(None),
        }
    }
}

/// The (series, minute) pairs a commit wrote into: its GPUs' and its node's host minutes.
pub fn touched_series(live: &Live, c: &Committed) -> BTreeSet<(RollupKey, UnixMs)> {
    let mut out: BTreeSet<(RollupKey, UnixMs)> = accountant::touched_minutes(live, c)
        .into_iter()
        .map(|(gpu, minute)| (RollupKey::gpu(gpu), minute))
        .collect();
    if let Some(node) = live.read(|s| s.nodes.get(&c.node).map(|n| n.record.id)) {
        for tick in &c.batch.ticks {
            out.insert((RollupKey::host(node), minute_of(tick.time_ms)));
        }
    }
    out
}

/// The job name of rollups and retention under [`crate::accounting::leader`].
pub const JOB: &str = "rollups";
/// The names the rollup task's retention and packing passes are counted under on
/// `/metrics` (its rollup passes are counted under [`JOB`]).
pub const RETENTION_TASK: &str = "retention";
pub const PACKING_TASK: &str = "packing";

/// Starts the rollup and retention task; it stops when `stop` is cancelled (finishing
/// the pass it is in). The collector runs it under the `rollups` job lease
/// ([`crate::accounting::leader`]), so once across collectors sharing a database.
pub fn spawn(
    store: Arc<dyn RollupStore>,
    live: Arc<Live>,
    options: RetentionOptions,
    clock: crate::live::status::Clock,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let notes = Notes::start(
        Arc::clone(&live),
        "rollup task",
        stop.clone(),
        touched_series,
    );
    info!(
        retain_raw = %humantime::format_duration(options.retain_raw),
        retain_rollups = %humantime::format_duration(options.retain_rollups),
        "rollups and retention"
    );
    let period = options.period;
    let mut rollups = Rollups::new(store, options, clock);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticker.tick() => {
                    let noted = notes.take();
                    rollups.dirty.extend(noted.touched);
                    rollups.recheck |= noted.missed;
                    let began = Instant::now();
                    let pass = rollups.pass().await;
                    metrics.observe_pass(JOB, began, pass.is_ok());
                    match pass {
                        Ok(_) => rollups.expire_and_pack_if_due(&metrics).await,
                        Err(e) => warn!(error = %e, "rollup pass failed; retrying next period"),
                    }
                }
            }
        }
        debug!("rollup task stopped");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tier_is_rollups_for_minute_steps_or_ranges_before_the_horizon() {
        assert!(!use_rollups(None, 1_000, None));
        assert!(!use_rollups(Some(59_999), 1_000, None));
        assert!(use_rollups(Some(60_000), 1_000, None));
        assert!(use_rollups(None, 1_000, Some(60_000)));
        assert!(!use_rollups(Some(10_000), 60_000, Some(60_000)));
    }

    #[test]
    fn packing_leaves_rows_where_the_recheck_counts_them() {
        // The start-up recheck compares rollup counts with row counts over its window: a
        // minute packed inside it would look stale.
        let o = RetentionOptions::default();
        assert!(o.pack_after > o.recheck_window, "{o:?}");
    }

    #[test]
    fn retention_flags_must_make_sense_together() {
        let args = |raw: u64, rollups: u64| RetentionArgs {
            retain_raw: Duration::from_secs(raw),
            retain_rollups: Duration::from_secs(rollups),
        };
        assert!(args(7 * 86_400, 400 * 86_400).options().is_ok());
        assert!(args(7 * 86_400, 86_400).options().is_err());
        assert!(args(60, 86_400).options().is_err());
    }
}
