//! The accountant: turns committed samples into per-minute energy rollups, incrementally.
//!
//! One task. Per GPU the store keeps a watermark (`done_to_ms`): every minute before it is
//! accounted. A pass closes the minutes from the watermark up to the minute of the GPU's
//! newest sample, and also every minute that ended more than a grace period ago (the gap
//! limit: a few sampling intervals) whether or not a later sample came, so a node that
//! goes silent has its energy up to its last sample accounted. The minute holding a GPU's
//! newest sample, while still open, is stored marked *provisional* (the watermark stays
//! before it) and replaced when it closes: computed on the first pass after the GPU's
//! samples stop, and at most every [`PROVISIONAL_REFRESH_MS`] while they keep coming.
//! Data that lands *behind* the watermark (a replayed spool, an out-of-order batch) is
//! caught two ways: every commit is announced ([`crate::live::state::Live::subscribe`]) and
//! noted by a listener of its own ([`crate::accounting::notes`]), and each (GPU, minute) it
//! touches is recomputed together with the minute holding the next sample (whose interval
//! starts in the changed minute); at start-up, and whenever announcements were missed,
//! minutes whose stored sample count differs from the raw count are recomputed. Recomputing
//! a minute replaces its rows in one transaction, so replays never double-count. Everything
//! computed is the pure [`crate::accounting::energy`] code.

use crate::accounting::energy::{self, GpuMinute, IdlePolicy, MINUTE_MS, baseline, minute_of};
use crate::accounting::notes::Notes;
use crate::live::state::{Committed, Live};
use crate::store::energy::{EnergyGpu, EnergyInputs, EnergyRange, MinuteReplacement};
use crate::store::{EnergyStore, GpuId, JobLeases, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The idle power of a GPU: its baseline ([`crate::accounting::energy::baseline`]), or a set figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleWatts {
    /// Learned from the intervals in which the GPU did no work
    /// ([`crate::accounting::energy::baseline`]); until then the model's default, else the fallback.
    Auto,
    /// A configured power, in milliwatts.
    Milliwatts(u32),
}

/// `--energy-idle`: a default (`min` or watts) and watts per GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleConfig {
    pub default: IdleWatts,
    /// (model substring, case-insensitive; milliwatts). The first match wins.
    pub per_model: Vec<(String, u32)>,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            default: IdleWatts::Auto,
            per_model: Vec::new(),
        }
    }
}

impl IdleConfig {
    /// Parses `auto`, `45` (watts, every GPU), `H100=60,L40S=35` (per model; others
    /// `auto`) or a mix: `H100=60,40`. `min`, the old default, is read as `auto`.
    pub fn parse(s: &str) -> Result<IdleConfig, String> {
        let mut cfg = IdleConfig::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                Some((model, watts)) => {
                    let model = model.trim();
                    if model.is_empty() {
                        return Err(format!("{item:?}: the model before '=' is empty"));
                    }
                    cfg.per_model.push((model.to_owned(), parse_watts(watts)?));
                }
                None if item.eq_ignore_ascii_case("auto") || item.eq_ignore_ascii_case("min") => {
                    cfg.default = IdleWatts::Auto;
                }
                None => cfg.default = IdleWatts::Milliwatts(parse_watts(item)?),
            }
        }
        Ok(cfg)
    }

    /// The idle power for a GPU model.
    pub fn for_model(&self, model: &str) -> IdleWatts {
        let model = model.to_ascii_lowercase();
        self.per_model
            .iter()
            .find(|(m, _)| model.contains(&m.to_ascii_lowercase()))
            .map_or(self.default, |&(_, mw)| IdleWatts::Milliwatts(mw))
    }
}

fn parse_watts(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let t = t.strip_suffix(['W', 'w']).unwrap_or(t).trim();
    let w: f64 = t
        .parse()
        .map_err(|_| format!("{s:?} is not a power in watts (e.g. 45 or 45W) nor `auto`"))?;
    if !(0.0..=100_000.0).contains(&w) {
        return Err(format!("{s:?}: idle watts must be between 0 and 100000"));
    }
    Ok((w * 1000.0).round() as u32)
}

/// How energy is accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyOptions {
    pub idle_policy: IdlePolicy,
    pub idle: IdleConfig,
    /// Intervals longer than this are missing. `None`: 3 × the node's interval (15 s when
    /// the interval is unknown).
    pub max_gap: Option<Duration>,
    /// How often the accountant looks for new minutes.
    pub period: Duration,
    /// How far back the start-up check for late data looks (it reads every sample of
    /// that window once; older late data is found by `check-energy`).
    pub recheck_window: Duration,
    /// Compute and store each GPU's open minute, marked provisional (so a job's energy
    /// shows within a pass of its node going silent, and within
    /// [`PROVISIONAL_REFRESH_MS`] + a pass of its end). Off: only closed minutes are
    /// stored.
    pub provisional: bool,
    /// Most open minutes recomputed in one pass ([`PROVISIONAL_PER_PASS`] by default).
    pub provisional_per_pass: usize,
}

impl Default for EnergyOptions {
    fn default() -> Self {
        EnergyOptions {
            idle_policy: IdlePolicy::default(),
            idle: IdleConfig::default(),
            max_gap: None,
            period: Duration::from_secs(5),
            recheck_window: Duration::from_secs(600),
            provisional: true,
            provisional_per_pass: PROVISIONAL_PER_PASS,
        }
    }
}

impl EnergyOptions {
    /// The gap limit for a node sampling every `interval_ms` (0: unknown).
    pub fn max_gap_ms(&self, interval_ms: u32) -> i64 {
        match self.max_gap {
            Some(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            None if interval_ms == 0 => 15_000,
            None => 3 * i64::from(interval_ms),
        }
    }

    /// How long after its end a minute is closed without a later sample: the gap limit (a
    /// sample later than that would start a missing interval anyway).
    pub fn grace_ms(&self, interval_ms: u32) -> i64 {
        self.max_gap_ms(interval_ms)
    }
}

/// How often a GPU that keeps sending samples has its open minute recomputed (each costs
/// a read of the minute's samples and a write).
pub const PROVISIONAL_REFRESH_MS: i64 = 10_000;

/// Most open minutes recomputed in one pass (each reads the minute's samples so far and
/// rewrites its rows: ~0.35 ms per GPU in release on SQLite, BENCHMARKS.md). Up to this
/// many live GPUs each is refreshed every [`PROVISIONAL_REFRESH_MS`]; beyond it the
/// refresh stretches (1,000 nodes × 8 GPUs: each about every 40 s) while a pass stays
/// well under a second.
pub const PROVISIONAL_PER_PASS: usize = 1024;

/// A GPU's open minute as the accountant last saw it.
#[derive(Debug, Clone, Copy)]
struct OpenMinute {
    /// The newest sample seen at the previous pass.
    seen: UnixMs,
    /// The newest sample the stored provisional minute was computed with, and when.
    computed_with: UnixMs,
    computed_at: UnixMs,
}

/// Most minutes accounted per transaction.
const CHUNK_MINUTES: i64 = 60;

/// Recomputes `[from_ms, to_ms)` (minute-aligned) of one GPU from raw samples with the
/// current options, replaces its stored minutes, and raises the watermark to `to_ms` when
/// `advance`. Returns the minutes written.
pub async fn account_range(
    store: &dyn EnergyStore,
    gpu: &EnergyGpu,
    from_ms: UnixMs,
    to_ms: UnixMs,
    options: &EnergyOptions,
    advance: bool,
) -> Result<usize, StoreError> {
    let mut from = minute_of(from_ms);
    let to = minute_of(to_ms.saturating_add(MINUTE_MS - 1));
    let mut written = 0;
    while from < to {
        // Skip stretches without samples (their stale rows, if any, go).
        let chunk_from = match store.next_sample_ms(gpu.gpu, from).await? {
            Some(t) if t < to => minute_of(t),
            _ => {
                store
                    .replace_energy_minutes(gpu.gpu, from, to, &[], advance.then_some(to))
                    .await?;
                break;
            }
        };
        let chunk_to = (chunk_from + CHUNK_MINUTES * MINUTE_MS).min(to);
        let minutes = compute_minutes(store, gpu, chunk_from, chunk_to, options).await?;
        written += minutes.len();
        store
            .replace_energy_minutes(
                gpu.gpu,
                from,
                chunk_to,
                &minutes,
                advance.then_some(chunk_to),
            )
            .await?;
        from = chunk_to;
    }
    Ok(written)
}

/// The minutes of `[from, to)` (minute-aligned) of one GPU, computed from raw samples.
pub async fn compute_minutes(
    store: &dyn EnergyStore,
    gpu: &EnergyGpu,
    from: UnixMs,
    to: UnixMs,
    options: &EnergyOptions,
) -> Result<Vec<GpuMinute>, StoreError> {
    let inputs = store.energy_inputs(gpu.gpu, from, to).await?;
    // The seen-idle evidence carried by the minute before this range.
    let evidence = store.energy_learned_before(gpu.gpu, from).await?;
    Ok(minutes_from(gpu, &inputs, evidence, options))
}

/// Most GPUs read and written together by [`compute_minutes_many`] and
/// [`Accountant::pass`]: bounds a batch's memory and how long one transaction holds the
/// database (on SQLite, the ingest writer waits for it).
const BATCH_GPUS: usize = 512;

/// [`compute_minutes`] of many GPUs (each with its own minute-aligned range), reading
/// their inputs in a few queries for all of them rather than a few per GPU (callers
/// pass at most [`BATCH_GPUS`]).
pub async fn compute_minutes_many(
    store: &dyn EnergyStore,
    jobs: &[(&EnergyGpu, EnergyRange)],
    options: &EnergyOptions,
) -> Result<Vec<Vec<GpuMinute>>, StoreError> {
    let ranges: Vec<EnergyRange> = jobs.iter().map(|(_, r)| *r).collect();
    let inputs = store.energy_inputs_many(&ranges).await?;
    let evidence = store.energy_learned_before_many(&ranges).await?;
    if inputs.len() != jobs.len() || evidence.len() != jobs.len() {
        return Err(StoreError::Corrupt(format!(
            "energy read: {} ranges asked, {} inputs and {} baselines answered",
            jobs.len(),
            inputs.len(),
            evidence.len()
        )));
    }
    Ok(jobs
        .iter()
        .zip(&inputs)
        .zip(evidence)
        .map(|(((gpu, _), inputs), evidence)| minutes_from(gpu, inputs, evidence, options))
        .collect())
}

/// The minutes of a GPU's samples, given the evidence carried by the minute before them
/// (pure).
fn minutes_from(
    gpu: &EnergyGpu,
    inputs: &EnergyInputs,
    mut evidence: (u64, i64),
    options: &EnergyOptions,
) -> Vec<GpuMinute> {
    let max_gap_ms = options.max_gap_ms(gpu.interval_ms);
    let configured = match options.idle.for_model(&gpu.name) {
        IdleWatts::Milliwatts(mw) => Some(mw),
        IdleWatts::Auto => None,
    };
    let mut out = Vec::new();
    let mut prev = inputs.prev.clone();
    for (minute, this) in energy::by_minute(&inputs.samples) {
        let (idle_mw, source) = baseline::resolve(
            configured,
            evidence.0,
            evidence.1,
            &gpu.name,
            gpu.power_limit_mw,
        );
        let mut m = energy::rollup_minute(
            minute,
            prev.as_ref(),
            this,
            max_gap_ms,
            idle_mw,
            source,
            options.idle_policy,
        );
        evidence = baseline::carry(evidence, (m.seen_idle_mj, m.seen_idle_ms));
        (m.learned_idle_mj, m.learned_idle_ms) = evidence;
        out.push(m);
        prev = this.last().cloned();
    }
    out
}

/// The job name of energy accounting under [`crate::accounting::leader`].
pub const JOB: &str = "energy";

/// Starts the accountant under the `energy` job lease ([`crate::accounting::leader`]): it runs on one
/// collector of those sharing the database at a time. It stops when `stop` is cancelled
/// (finishing the pass it is in).
// Wiring: each argument is one of the accountant's dependencies, handed in by `serve`.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    store: Arc<dyn EnergyStore>,
    leases: Arc<dyn JobLeases>,
    live: Arc<Live>,
    options: EnergyOptions,
    clock: crate::live::status::Clock,
    metrics: Arc<crate::metrics::Metrics>,
    lead: crate::accounting::leader::LeadOptions,
    stop: CancellationToken,
) -> JoinHandle<()> {
    info!(
        idle_policy = options.idle_policy.as_str(),
        idle = ?options.idle,
        max_gap = ?options.max_gap,
        "energy accounting"
    );
    let job_metrics = Arc::clone(&metrics);
    crate::accounting::leader::spawn(leases, JOB, metrics, lead, stop, move |term| {
        run(
            Arc::clone(&store),
            Arc::clone(&live),
            options.clone(),
            Arc::clone(&clock),
            Arc::clone(&job_metrics),
            term,
        )
    })
}

/// One term of accounting: from a full recheck (minutes missed while another collector
/// led, or none did) until `stop` is cancelled.
async fn run(
    store: Arc<dyn EnergyStore>,
    live: Arc<Live>,
    options: EnergyOptions,
    clock: crate::live::status::Clock,
    metrics: Arc<crate::metrics::Metrics>,
    stop: CancellationToken,
) {
    let notes = Notes::start(
        Arc::clone(&live),
        "energy accountant",
        stop.clone(),
        touched_minutes,
    );
    let mut accountant = Accountant::new(store, options, clock);
    let mut ticker = tokio::time::interval(accountant.options.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticker.tick() => {
                if live.take_late_data() {
                    // Another collector stored data behind our watermarks.
                    accountant.recheck = true;
                }
                let noted = notes.take();
                accountant.dirty.extend(noted.touched);
                accountant.recheck |= noted.missed;
                let began = std::time::Instant::now();
                let pass = accountant.pass().await;
                metrics.observe_pass(JOB, began, pass.is_ok());
                if let Err(e) = pass {
                    warn!(error = %e, "energy accounting pass failed; retrying next period");
                }
            }
        }
    }
    debug!("energy accountant stopped");
}

/// The (GPU, minute) pairs a committed batch wrote samples into (also what the rollup
/// task recomputes, [`crate::accounting::rollups`]).
pub fn touched_minutes(live: &Live, c: &Committed) -> BTreeSet<(GpuId, UnixMs)> {
    let mut out = BTreeSet::new();
    // A node lists its GPUs in the same order tick after tick: each position remembers
    // the UUID it last held, its id, and the minute last noted, so a GPU is looked up
    // once per batch and a minute inserted once per run of ticks, not once per sample.
    let mut at: Vec<(&str, Option<GpuId>, Option<UnixMs>)> = Vec::new();
    live.read(|s| {
        for tick in &c.batch.ticks {
            let minute = minute_of(tick.time_ms);
            for (j, g) in tick.gpus.iter().enumerate() {
                let uuid = g.gpu_uuid.as_str();
                if at.get(j).is_none_or(|(u, _, _)| *u != uuid) {
                    let slot = (uuid, s.find_gpu(uuid).map(|(_, id)| id), None);
                    match at.get_mut(j) {
                        Some(old) => *old = slot,
                        None => at.push(slot),
                    }
                }
                if let Some((_, Some(id), noted)) = at.get_mut(j)
                    && *noted != Some(minute)
                {
                    out.insert((*id, minute));
                    *noted = Some(minute);
                }
            }
        }
    });
    out
}

/// The accountant's state between passes.
pub struct Accountant {
    store: Arc<dyn EnergyStore>,
    options: EnergyOptions,
    clock: crate::live::status::Clock,
    /// (GPU, minute) touched by commits since the last pass.
    dirty: BTreeSet<(GpuId, UnixMs)>,
    /// Compare stored minutes with raw sample counts on the next pass (start-up, lag).
    pub recheck: bool,
    /// Per GPU, its open minute as last seen and computed.
    provisional: HashMap<GpuId, OpenMinute>,
}

impl Accountant {
    pub fn new(
        store: Arc<dyn EnergyStore>,
        options: EnergyOptions,
        clock: crate::live::status::Clock,
    ) -> Self {
        Accountant {
            store,
            options,
            clock,
            dirty: BTreeSet::new(),
            recheck: true,
            provisional: HashMap::new(),
        }
    }

    /// Records the minutes a commit touched.
    pub fn note_commit(&mut self, live: &Live, c: &Committed) {
        self.dirty.extend(touched_minutes(live, c));
    }

    /// Marks one minute of one GPU for recomputation.
    pub fn mark(&mut self, gpu: GpuId, time_ms: UnixMs) {
        self.dirty.insert((gpu, minute_of(time_ms)));
    }

    /// One pass: recompute touched minutes behind the watermarks, then advance them.
    /// Returns the minutes written.
    pub async fn pass(&mut self) -> Result<usize, StoreError> {
        let store = Arc::clone(&self.store);
        let store = store.as_ref();
        if self.recheck {
            let window = i64::try_from(self.options.recheck_window.as_millis()).unwrap_or(0);
            for (gpu, minute) in store
                .stale_energy_minutes((self.clock)().saturating_sub(window))
                .await?
            {
                self.dirty.insert((gpu, minute));
            }
            self.recheck = false;
        }
        let gpus: HashMap<GpuId, EnergyGpu> = store
            .energy_gpus()
            .await?
            .into_iter()
            .map(|g| (g.gpu, g))
            .collect();
        // Forget open minutes of GPUs that are gone (deleted, expired by retention).
        self.provisional.retain(|id, _| gpus.contains_key(id));
        let mut written = 0;
        let dirty = std::mem::take(&mut self.dirty);
        let mut failed = BTreeSet::new();
        for &(gpu_id, minute) in &dirty {
            let Some(gpu) = gpus.get(&gpu_id) else {
                continue;
            };
            let Some(done) = gpu.done_to_ms else { continue };
            if minute >= done {
                // The forward pass below gets it (an open minute: computed afresh).
                self.provisional.remove(&gpu_id);
                continue;
            }
            // The interval ending at the next sample after this minute starts in it.
            let next = store.next_sample_ms(gpu_id, minute + MINUTE_MS).await?;
            let to = match next {
                Some(t) if t < done => minute_of(t) + MINUTE_MS,
                _ => (minute + MINUTE_MS).min(done),
            };
            match account_range(store, gpu, minute, to, &self.options, false).await {
                Ok(n) => written += n,
                Err(e) => {
                    warn!(gpu = %gpu.uuid, minute_ms = minute, error = %e, "cannot recompute an energy minute");
                    failed.insert((gpu_id, minute));
                }
            }
        }
        if !dirty.is_empty() {
            debug!(
                minutes = dirty.len(),
                "energy minutes with late data recomputed"
            );
        }
        self.dirty.extend(failed);
        let now = (self.clock)();
        // Minutes to close and open minutes to recompute, each done for many GPUs at once
        // (a few queries and one transaction per batch): at a minute's end every live GPU
        // closes one, and every refresh recomputes every live GPU's open minute.
        let mut closing: Vec<(&EnergyGpu, EnergyRange)> = Vec::new();
        // (GPU, its open minute; quiet, when last computed, newest sample).
        let mut candidates: Vec<(&EnergyGpu, EnergyRange, bool, UnixMs, UnixMs)> = Vec::new();
        for gpu in gpus.values() {
            let (Some(first), Some(last)) = (gpu.first_sample_ms, gpu.last_sample_ms) else {
                continue;
            };
            let from = gpu.done_to_ms.unwrap_or_else(|| minute_of(first));
            // Closed: every minute before the newest sample's, and that one too once the
            // clock is a grace period past its end.
            let open = minute_of(last);
            let closed_by_clock =
                minute_of(now.saturating_sub(self.options.grace_ms(gpu.interval_ms)));
            let upto = open.max(closed_by_clock.min(open + MINUTE_MS));
            if from < upto {
                if upto - from <= CHUNK_MINUTES * MINUTE_MS {
                    closing.push((
                        gpu,
                        EnergyRange {
                            gpu: gpu.gpu,
                            from_ms: from,
                            to_ms: upto,
                        },
                    ));
                } else {
                    // A long catch-up: in chunks, skipping stretches without samples.
                    written += account_range(store, gpu, from, upto, &self.options, true).await?;
                }
            }
            let seen = self.provisional.entry(gpu.gpu).or_insert(OpenMinute {
                seen: i64::MIN,
                computed_with: i64::MIN,
                computed_at: i64::MIN,
            });
            // No new sample since the last pass: the node may have gone silent.
            let quiet = seen.seen == last;
            seen.seen = last;
            let due = quiet || now.saturating_sub(seen.computed_at) >= PROVISIONAL_REFRESH_MS;
            if self.options.provisional && upto <= open && seen.computed_with != last && due {
                candidates.push((
                    gpu,
                    EnergyRange {
                        gpu: gpu.gpu,
                        from_ms: open,
                        to_ms: open + MINUTE_MS,
                    },
                    quiet,
                    seen.computed_at,
                    last,
                ));
            }
        }
        // Closed minutes first: an open minute's baseline evidence comes from them.
        written += self.write_many(&closing, false, true).await?;
        // At most `provisional_per_pass` open minutes a pass: GPUs whose samples stopped
        // first (a job that ended shows whole at once), then the longest since computed;
        // the rest wait for a later pass, so on a large fleet the refresh stretches
        // instead of the pass.
        candidates.sort_by_key(|&(gpu, _, quiet, computed_at, _)| (!quiet, computed_at, gpu.gpu));
        candidates.truncate(self.options.provisional_per_pass.max(1));
        let open_due: Vec<(&EnergyGpu, EnergyRange)> =
            candidates.iter().map(|&(g, r, ..)| (g, r)).collect();
        let due_with = candidates.iter().map(|&(.., last)| last);
        written += self.write_many(&open_due, true, false).await?;
        for ((gpu, _), last) in open_due.iter().zip(due_with) {
            if let Some(seen) = self.provisional.get_mut(&gpu.gpu) {
                seen.computed_with = last;
                seen.computed_at = now;
            }
        }
        Ok(written)
    }
}

impl Accountant {
    /// Computes each job's range (every minute `provisional` or none) and replaces it,
    /// raising the watermark to its end when `advance`; one transaction per
    /// [`BATCH_GPUS`]. Returns the minutes written.
    async fn write_many(
        &self,
        jobs: &[(&EnergyGpu, EnergyRange)],
        provisional: bool,
        advance: bool,
    ) -> Result<usize, StoreError> {
        let mut written = 0;
        for chunk in jobs.chunks(BATCH_GPUS) {
            let computed = compute_minutes_many(self.store.as_ref(), chunk, &self.options).await?;
            let batch: Vec<MinuteReplacement> = chunk
                .iter()
                .zip(computed)
                .map(|((_, range), mut minutes)| {
                    for m in &mut minutes {
                        m.provisional = provisional;
                    }
                    written += minutes.len();
                    MinuteReplacement {
                        range: *range,
                        minutes,
                        done_to_ms: advance.then_some(range.to_ms),
                    }
                })
                .collect();
            self.store.replace_energy_minutes_many(&batch).await?;
        }
        Ok(written)
    }
}

/// Recomputes every GPU's minutes in `range` with `options` (a policy change); returns
/// the minutes written. Watermarks are left as they are.
pub async fn recompute(
    store: &dyn EnergyStore,
    range: TimeRange,
    options: &EnergyOptions,
) -> Result<usize, StoreError> {
    let mut written = 0;
    for gpu in store.energy_gpus().await? {
        let from = minute_of(range.from_ms);
        // Only what the accountant has covered: the rest is its job.
        let to = minute_of(range.to_ms).saturating_add(MINUTE_MS);
        let to = gpu.done_to_ms.map_or(from, |d| to.min(d));
        if from < to {
            written += account_range(store, &gpu, from, to, options, false).await?;
        }
    }
    info!(minutes = written, "energy minutes recomputed");
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_config_parses_min_watts_and_per_model() {
        assert_eq!(IdleConfig::parse("min"), Ok(IdleConfig::default()));
        assert_eq!(IdleConfig::parse("auto"), Ok(IdleConfig::default()));
        let c = IdleConfig::parse("45W").expect("watts");
        assert_eq!(c.for_model("anything"), IdleWatts::Milliwatts(45_000));
        let c = IdleConfig::parse("H100=60, l40s=35.5").expect("per model");
        assert_eq!(
            c.for_model("NVIDIA H100 80GB HBM3"),
            IdleWatts::Milliwatts(60_000)
        );
        assert_eq!(c.for_model("NVIDIA L40S"), IdleWatts::Milliwatts(35_500));
        assert_eq!(c.for_model("Tesla T4"), IdleWatts::Auto);
        assert!(IdleConfig::parse("lots").is_err());
        assert!(IdleConfig::parse("=5").is_err());
        assert!(IdleConfig::parse("-3").is_err());
    }

    proptest::proptest! {
        /// Whatever the order of a batch's GPUs and ticks, and with GPUs the collector
        /// does not know, the touched (GPU, minute) pairs are those of its samples.
        #[test]
        fn touched_minutes_are_those_of_every_sample(
            ticks in proptest::collection::vec(
                (0i64..400_000, proptest::collection::vec(0usize..5, 0..6)),
                0..40,
            ),
        ) {
            use gpufleet_core::{Batch, GpuSample, Tick};
            // GPUs 0 to 2 are known (ids 10 to 12); 3 and 4 are not.
            let uuids = ["GPU-a", "GPU-b", "GPU-c", "GPU-x", "GPU-y"];
            let live = Live::new();
            live.connected(crate::store::NodeRecord::with_gpus(
                1,
                "n",
                &[(10, uuids[0]), (11, uuids[1]), (12, uuids[2])],
            ));
            let batch = Batch {
                ticks: (ticks.iter())
                    .map(|(t, gpus)| Tick {
                        time_ms: *t,
                        gpus: (gpus.iter())
                            .map(|&g| GpuSample {
                                gpu_uuid: uuids[g].into(),
                                ..GpuSample::default()
                            })
                            .collect(),
                        ..Tick::default()
                    })
                    .collect(),
                ..Batch::default()
            };
            let expected: BTreeSet<(GpuId, UnixMs)> = (ticks.iter())
                .flat_map(|(t, gpus)| gpus.iter().map(move |&g| (g, minute_of(*t))))
                .filter(|(g, _)| *g < 3)
                .map(|(g, m)| (GpuId(10 + g as i64), m))
                .collect();
            let committed = Committed {
                node: "n".into(),
                batch,
            };
            proptest::prop_assert_eq!(touched_minutes(&live, &committed), expected);
        }
    }

    #[test]
    fn the_gap_limit_follows_the_node_interval_unless_set() {
        let o = EnergyOptions::default();
        assert_eq!(o.max_gap_ms(1000), 3000);
        assert_eq!(o.max_gap_ms(0), 15_000);
        let o = EnergyOptions {
            max_gap: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        assert_eq!(o.max_gap_ms(1000), 10_000);
    }
}
