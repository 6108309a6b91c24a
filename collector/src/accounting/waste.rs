//! Idle-but-allocated waste: GPUs a workload holds while they do no work.
//!
//! **Definition.** A workload (container, pod, Slurm job or host user/unit, as the energy
//! accountant identifies workloads) *wastes* a GPU in a minute when, in that minute:
//! - the GPU did no work: every measured interval of the minute reported GPU
//!   utilization, none above the threshold (`--waste-util-threshold`, default 1 %), i.e.
//!   the minute's `util_max_pct` is known and at or below it (unknown is never idle);
//! - the workload held the GPU the whole measured time: a process of it was listed by
//!   NVML (a process with a context, which holds memory) at the end of every measured
//!   interval of the minute (`gpu_ms == covered_ms`), and the most memory it held at one
//!   of them is not 0 bytes (unknown memory counts as held);
//! - nothing of the minute is missing (no gap: `missing_ms == 0`), so "continuously" is
//!   known, not assumed.
//!
//! An **episode** is a run of such minutes of one (GPU, workload), each the minute right
//! after the previous; it is reported when it lasted at least `min_idle`
//! (`--waste-min-idle`, default 30 min): `until − since ≥ min_idle`, where `since` is the
//! start of its first minute and `until` the end of its last (capped at now). It is
//! *ongoing* when its last minute is the GPU's newest energy minute and ends within
//! [`ongoing_slack_ms`] of now: the gap limit the accountant used for that minute (its
//! grace: `--energy-max-gap`, or 3 sampling intervals) plus a minute.
//!
//! **Its energy** is the workload's share of the GPU's energy in those minutes, as the
//! accountant split it: its active share plus its idle share (by memory held, or equally
//! when memory is unknown; charged to it under the `spread` policy, reported beside it
//! under `separate`). Its **carbon** is that energy priced at each GPU-minute's intensity
//! × PUE, as every other carbon figure; `None` while none of it has a price (never 0),
//! with the unpriced energy counted.
//!
//! **Why minute rows, not raw samples.** The energy minutes are what every other energy
//! and carbon figure is made of: exact, already split, recomputed when late data arrives,
//! and kept after raw samples expire. The accountant stores beside them the two facts
//! waste needs (`util_max_pct`, `mem_max_bytes`, migration 0024), taken from the same
//! samples in the same pass, so the energy of an episode is exactly the sum of its minutes
//! and nothing is estimated. The price is a minute of resolution: a workload that turns
//! idle mid-minute is counted from the next whole minute (at most 60 s late, never early).

use crate::store::energy::{WasteMinute, WasteScope};
use crate::store::{EnergyStore, GpuId, StoreError, TimeRange};
use gpufleet_core::{UnixMs, Workload};
use std::collections::BTreeMap;
use std::time::Duration;

const MINUTE_MS: i64 = 60_000;

/// An episode whose last minute ends longer than this before now is no longer ongoing:
/// the gap limit its GPU's minute was computed with (the accountant closes a minute that
/// long after it, `EnergyOptions::grace_ms`) plus a minute, so a node that stopped
/// reporting does not stay "ongoing" forever.
pub fn ongoing_slack_ms(last: &WasteMinute) -> i64 {
    last.max_gap_ms.max(0).saturating_add(MINUTE_MS)
}

/// How far back [`ongoing`] looks for the start of an ongoing episode.
pub const ONGOING_LOOKBACK: Duration = Duration::from_secs(7 * 24 * 3600);

/// The window [`ongoing`] reads of the whole fleet first (longer only where needed).
pub const ONGOING_FIRST_WINDOW: Duration = Duration::from_secs(3600);

/// The rule's two knobs (`--waste-util-threshold`, `--waste-min-idle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WasteSettings {
    /// A GPU at or below this utilization (percent) does no work.
    pub util_threshold_pct: u32,
    /// Shortest episode reported.
    pub min_idle: Duration,
}

impl Default for WasteSettings {
    fn default() -> Self {
        WasteSettings {
            util_threshold_pct: 1,
            min_idle: Duration::from_secs(30 * 60),
        }
    }
}

/// One idle-but-allocated episode of one workload on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    pub node: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub workload: Workload,
    /// Start of its first idle minute (Unix ms).
    pub since_ms: UnixMs,
    /// End of its last idle minute, capped at now.
    pub until_ms: UnixMs,
    pub ongoing: bool,
    /// Whole idle minutes in it.
    pub minutes: u32,
    /// The most GPU memory it held in the episode; `None` when never reported.
    pub mem_max_bytes: Option<u64>,
    /// Its share of the GPU's energy in the episode: active + idle share, mJ.
    pub energy_mj: u64,
    /// Of which its idle share.
    pub idle_mj: u64,
    /// Of `energy_mj`, what was charged to it (all under `spread`; its active share only
    /// under `separate`).
    pub charged_mj: u64,
    /// Of `energy_mj`, the part in minutes still open (may still change).
    pub provisional_mj: u64,
    /// gCO2 of the priced part of `energy_mj`; `None` while none of it is priced.
    pub carbon_g: Option<f64>,
    /// Of `energy_mj`, the part with a price.
    pub priced_mj: u64,
}

impl Episode {
    /// How long it has been idle: `until − since`.
    pub fn idle_ms(&self) -> i64 {
        self.until_ms - self.since_ms
    }
}

/// Whether a minute row shows its workload holding an idle GPU (the module doc's rule).
pub fn idle_allocated(m: &WasteMinute, util_threshold_pct: u32) -> bool {
    m.util_max_pct.is_some_and(|u| u <= util_threshold_pct)
        && m.missing_ms == 0
        && m.covered_ms > 0
        && m.gpu_ms == m.covered_ms
        && m.mem_max_bytes != Some(0)
}

/// The episodes in `minutes` (any order) at `now_ms` under `settings`, ordered by node,
/// GPU index, since and workload key.
pub fn episodes(minutes: &[WasteMinute], settings: WasteSettings, now_ms: UnixMs) -> Vec<Episode> {
    let min_idle_ms = i64::try_from(settings.min_idle.as_millis()).unwrap_or(i64::MAX);
    let mut out: Vec<Episode> = runs(minutes, settings.util_threshold_pct)
        .iter()
        .map(|run| episode(run, now_ms))
        .filter(|e| e.idle_ms() >= min_idle_ms)
        .collect();
    sort(&mut out);
    out
}

/// The runs of consecutive idle-allocated minutes in `minutes` (any order), per (GPU,
/// workload), each ordered.
fn runs(minutes: &[WasteMinute], util_threshold_pct: u32) -> Vec<Vec<&WasteMinute>> {
    let mut by_series: BTreeMap<(i64, String), Vec<&WasteMinute>> = BTreeMap::new();
    for m in minutes
        .iter()
        .filter(|m| idle_allocated(m, util_threshold_pct))
    {
        by_series
            .entry((m.gpu.0, m.workload.key()))
            .or_default()
            .push(m);
    }
    let mut out = Vec::new();
    for mut run in by_series.into_values() {
        run.sort_by_key(|m| m.minute_ms);
        out.extend(
            run.chunk_by(|a, b| b.minute_ms == a.minute_ms + MINUTE_MS)
                .map(<[&WasteMinute]>::to_vec),
        );
    }
    out
}

/// By node, GPU index, since and workload key.
fn sort(episodes: &mut [Episode]) {
    episodes.sort_by(|a, b| {
        (&a.node, a.gpu_index, a.since_ms, a.workload.key()).cmp(&(
            &b.node,
            b.gpu_index,
            b.since_ms,
            b.workload.key(),
        ))
    });
}

/// One run of consecutive idle minutes (non-empty, ordered) as an episode.
fn episode(run: &[&WasteMinute], now_ms: UnixMs) -> Episode {
    let (first, last) = (run[0], run[run.len() - 1]);
    // The end of its last minute; now, while that minute is still going on.
    let end = last.minute_ms + MINUTE_MS;
    let until_ms = if (last.minute_ms..end).contains(&now_ms) {
        now_ms
    } else {
        end
    };
    let mut e = Episode {
        node: first.node_name.clone(),
        gpu_uuid: first.gpu_uuid.clone(),
        gpu_index: first.gpu_index,
        gpu_name: first.gpu_name.clone(),
        workload: first.workload.clone(),
        since_ms: first.minute_ms,
        until_ms,
        ongoing: last.minute_ms >= last.gpu_last_minute_ms
            && now_ms - (last.minute_ms + MINUTE_MS) <= ongoing_slack_ms(last),
        minutes: u32::try_from(run.len()).unwrap_or(u32::MAX),
        mem_max_bytes: None,
        energy_mj: 0,
        idle_mj: 0,
        charged_mj: 0,
        provisional_mj: 0,
        carbon_g: None,
        priced_mj: 0,
    };
    for m in run {
        let share = m.active_mj.saturating_add(m.idle_mj);
        e.mem_max_bytes = e.mem_max_bytes.max(m.mem_max_bytes);
        e.energy_mj = e.energy_mj.saturating_add(share);
        e.idle_mj = e.idle_mj.saturating_add(m.idle_mj);
        e.charged_mj = e.charged_mj.saturating_add(m.energy_mj);
        if m.provisional {
            e.provisional_mj = e.provisional_mj.saturating_add(share);
        }
        if let Some((g_per_kwh, pue)) = m.price {
            let g = gpufleet_carbon::carbon_g(share, g_per_kwh, pue);
            e.carbon_g = Some(e.carbon_g.unwrap_or(0.0) + g);
            e.priced_mj = e.priced_mj.saturating_add(share);
        }
    }
    e
}

/// One workload's waste over a range: the sum of its episodes.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadWaste {
    pub workload: Workload,
    pub episodes: u32,
    pub idle_ms: i64,
    pub energy_mj: u64,
    pub priced_mj: u64,
    /// `None` while none of its episodes' energy has a price.
    pub carbon_g: Option<f64>,
}

/// Episodes summed per workload (by `Workload::key()`), biggest energy first.
pub fn totals(episodes: &[Episode]) -> Vec<WorkloadWaste> {
    let mut by: BTreeMap<String, WorkloadWaste> = BTreeMap::new();
    for e in episodes {
        let t = by.entry(e.workload.key()).or_insert_with(|| WorkloadWaste {
            workload: e.workload.clone(),
            episodes: 0,
            idle_ms: 0,
            energy_mj: 0,
            priced_mj: 0,
            carbon_g: None,
        });
        t.episodes += 1;
        t.idle_ms += e.idle_ms();
        t.energy_mj = t.energy_mj.saturating_add(e.energy_mj);
        t.priced_mj = t.priced_mj.saturating_add(e.priced_mj);
        if let Some(g) = e.carbon_g {
            t.carbon_g = Some(t.carbon_g.unwrap_or(0.0) + g);
        }
    }
    let mut out: Vec<WorkloadWaste> = by.into_values().collect();
    out.sort_by(|a, b| {
        b.energy_mj
            .cmp(&a.energy_mj)
            .then_with(|| a.workload.key().cmp(&b.workload.key()))
    });
    out
}

/// The episodes of `range` (optionally one node's GPUs) at `now_ms`, from the store. An
/// episode going on at the range's start is found whole (its true start, up to
/// [`ONGOING_LOOKBACK`] before it, with the energy of its earlier minutes), and
/// `min_idle` is judged on the whole of it.
pub async fn find(
    store: &dyn EnergyStore,
    range: TimeRange,
    node: Option<&str>,
    settings: WasteSettings,
    now_ms: UnixMs,
) -> Result<Vec<Episode>, StoreError> {
    let thr = settings.util_threshold_pct;
    let scope = node.map_or(WasteScope::Fleet, WasteScope::Node);
    let minutes = store.waste_minutes(range, scope, thr).await?;
    let from = range.from_ms;
    let horizon = from.saturating_sub(i64::try_from(ONGOING_LOOKBACK.as_millis()).unwrap_or(0));
    let min_idle_ms = i64::try_from(settings.min_idle.as_millis()).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    for run in runs(&minutes, thr) {
        // A run in the range's first minute may have begun before it: found whole.
        let before = if run[0].minute_ms == from {
            earlier(store, run[0], from, horizon, thr, now_ms).await?
        } else {
            None
        };
        let e = joined(before, episode(&run, now_ms));
        if e.idle_ms() >= min_idle_ms {
            out.push(e);
        }
    }
    sort(&mut out);
    Ok(out)
}

/// The episodes going on at `now_ms` (each with its idle time so far: `idle_ms()`,
/// `minutes`), looking back at most [`ONGOING_LOOKBACK`] for their start: what an "idle
/// but allocated" alert reads. One read of the fleet's last [`ONGOING_FIRST_WINDOW`] (or
/// twice `min_idle`), then, only for an episode that reaches back to that window's start,
/// one query for its start and one read of its own earlier minutes. A caller that asks
/// again and again (the `/metrics` refresh) keeps an [`OngoingTracker`] instead.
pub async fn ongoing(
    store: &dyn EnergyStore,
    settings: WasteSettings,
    now_ms: UnixMs,
) -> Result<Vec<Episode>, StoreError> {
    OngoingTracker::default()
        .refresh(store, settings, now_ms)
        .await
}

/// What the ongoing-episode finder reads: the two waste reads of [`EnergyStore`].
pub(crate) trait WasteSource {
    fn minutes(
        &self,
        range: TimeRange,
        scope: WasteScope<'_>,
        util_threshold_pct: u32,
    ) -> impl Future<Output = Result<Vec<WasteMinute>, StoreError>> + Send;

    fn run_start(
        &self,
        gpu: GpuId,
        workload_key: &str,
        last_ms: UnixMs,
        horizon_ms: UnixMs,
        util_threshold_pct: u32,
    ) -> impl Future<Output = Result<Option<UnixMs>, StoreError>> + Send;
}

impl WasteSource for dyn EnergyStore + '_ {
    async fn minutes(
        &self,
        range: TimeRange,
        scope: WasteScope<'_>,
        util_threshold_pct: u32,
    ) -> Result<Vec<WasteMinute>, StoreError> {
        self.waste_minutes(range, scope, util_threshold_pct).await
    }

    async fn run_start(
        &self,
        gpu: GpuId,
        workload_key: &str,
        last_ms: UnixMs,
        horizon_ms: UnixMs,
        util_threshold_pct: u32,
    ) -> Result<Option<UnixMs>, StoreError> {
        self.waste_run_start(gpu, workload_key, last_ms, horizon_ms, util_threshold_pct)
            .await
    }
}

/// How often [`OngoingTracker`] forgets what it kept and reads its first window again (so
/// minutes recomputed long after they were read are taken in).
pub const ONGOING_FULL_EVERY: Duration = Duration::from_secs(3600);

/// How far before now each refresh of [`OngoingTracker`] reads again: minutes still open
/// (provisional) or recomputed when late data arrives.
pub const ONGOING_OVERLAP_MS: i64 = 10 * MINUTE_MS;

/// The ongoing episodes kept from one refresh to the next, so that a refresh reads only
/// the minutes since the last one (plus [`ONGOING_OVERLAP_MS`]): for every run of idle
/// minutes that reaches the next read's first minute, its part before that minute, summed
/// as an episode (its true start found once).
#[derive(Debug, Default)]
pub struct OngoingTracker {
    /// The first minute the next refresh reads; `None` before the first.
    from_ms: Option<UnixMs>,
    /// When the first window was last read whole.
    full_at_ms: UnixMs,
    /// (GPU, workload key) → its run's minutes before `from_ms`.
    head: BTreeMap<(i64, String), Episode>,
}

impl OngoingTracker {
    /// The episodes going on at `now_ms` (as [`ongoing`]).
    pub async fn refresh(
        &mut self,
        store: &dyn EnergyStore,
        settings: WasteSettings,
        now_ms: UnixMs,
    ) -> Result<Vec<Episode>, StoreError> {
        self.refresh_from(store, settings, now_ms).await
    }

    pub(crate) async fn refresh_from<S: WasteSource + ?Sized + Sync>(
        &mut self,
        store: &S,
        settings: WasteSettings,
        now_ms: UnixMs,
    ) -> Result<Vec<Episode>, StoreError> {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let floor = |t: UnixMs| t - t.rem_euclid(MINUTE_MS);
        let thr = settings.util_threshold_pct;
        let horizon = floor(now_ms.saturating_sub(ms(ONGOING_LOOKBACK)));
        let from = match self.from_ms {
            Some(f) if now_ms - self.full_at_ms < ms(ONGOING_FULL_EVERY) && f <= now_ms => f,
            _ => {
                self.head.clear();
                self.full_at_ms = now_ms;
                let span = ms(ONGOING_FIRST_WINDOW).max(ms(settings.min_idle).saturating_mul(2));
                floor(now_ms.saturating_sub(span)).max(horizon)
            }
        };
        let range = TimeRange {
            from_ms: from,
            to_ms: now_ms,
        };
        let minutes = store.minutes(range, WasteScope::Fleet, thr).await?;
        let next_from = floor(now_ms - ONGOING_OVERLAP_MS).max(from);
        let mut head = BTreeMap::new();
        let mut out = Vec::new();
        for run in runs(&minutes, thr) {
            let key = (run[0].gpu.0, run[0].workload.key());
            // Its earlier part: kept from the last refresh, or (first read, or a run that
            // appeared late) looked up once.
            let mut before = None;
            if run[0].minute_ms == from {
                before = self.head.remove(&key);
                if before.is_none() && from > horizon {
                    before = earlier(store, run[0], from, horizon, thr, now_ms).await?;
                }
            }
            let split = run.partition_point(|m| m.minute_ms < next_from);
            if split > 0 && run[split - 1].minute_ms == next_from - MINUTE_MS {
                head.insert(key, joined(before.clone(), episode(&run[..split], now_ms)));
            }
            let e = joined(before, episode(&run, now_ms));
            if e.ongoing && e.idle_ms() >= ms(settings.min_idle) {
                out.push(e);
            }
        }
        self.head = head;
        self.from_ms = Some(next_from);
        sort(&mut out);
        Ok(out)
    }
}

/// The part before `from` of the run of `first`'s series that goes on at `from`.
async fn earlier<S: WasteSource + ?Sized + Sync>(
    store: &S,
    first: &WasteMinute,
    from: UnixMs,
    horizon: UnixMs,
    thr: u32,
    now_ms: UnixMs,
) -> Result<Option<Episode>, StoreError> {
    let key = first.workload.key();
    let last = from - MINUTE_MS;
    let Some(start) = store.run_start(first.gpu, &key, last, horizon, thr).await? else {
        return Ok(None);
    };
    let range = TimeRange {
        from_ms: start,
        to_ms: last,
    };
    let minutes = store
        .minutes(range, WasteScope::Series(first.gpu, &key), thr)
        .await?;
    // Only the run that ends at `last` (the store's answer, checked).
    Ok(runs(&minutes, thr)
        .into_iter()
        .find(|r| r[r.len() - 1].minute_ms == last)
        .map(|r| episode(&r, now_ms)))
}

/// `tail` preceded by `head` (the same series, `head` ending right before `tail`).
fn joined(head: Option<Episode>, tail: Episode) -> Episode {
    let Some(h) = head else { return tail };
    Episode {
        since_ms: h.since_ms,
        minutes: h.minutes.saturating_add(tail.minutes),
        mem_max_bytes: h.mem_max_bytes.max(tail.mem_max_bytes),
        energy_mj: h.energy_mj.saturating_add(tail.energy_mj),
        idle_mj: h.idle_mj.saturating_add(tail.idle_mj),
        charged_mj: h.charged_mj.saturating_add(tail.charged_mj),
        provisional_mj: h.provisional_mj.saturating_add(tail.provisional_mj),
        carbon_g: match (h.carbon_g, tail.carbon_g) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        },
        priced_mj: h.priced_mj.saturating_add(tail.priced_mj),
        ..tail
    }
}

#[cfg(test)]
mod tests;
