//! Idle-but-allocated waste: GPUs a workload holds while they do no work.
//!
//! **Definition.** A workload (container, pod, Slurm job or host user/unit, as the energy
//! accountant identifies workloads) *wastes* a GPU in a minute when, in that minute:
//! - the GPU did no work: every measured interval of the minute reported GPU
//!   utilization, none above the threshold (`--waste-util-threshold`, default 1 %), i.e.
//!   the minute's `util_max_pct` is known and at or below it (unknown is never idle);
//! - the workload held the GPU the whole measured time: a process of it was listed by
//!   NVML (a process with a context, which holds memory) at the end of every measured
//!   interval of the minute (`gpu_ms == covered_ms`), and none of its readings said it
//!   held 0 bytes;
//! - nothing of the minute is missing (no gap: `missing_ms == 0`), so "continuously" is
//!   known, not assumed.
//!
//! An **episode** is a run of such minutes of one (GPU, workload), each the minute right
//! after the previous; it is reported when it lasted at least `min_idle`
//! (`--waste-min-idle`, default 30 min): `until − since ≥ min_idle`, where `since` is the
//! start of its first minute and `until` the end of its last (capped at now). It is
//! *ongoing* when its last minute is the GPU's newest energy minute and ends within
//! [`ONGOING_SLACK_MS`] of now (the accountant closes a minute a grace period after it).
//!
//! **Its energy** is the workload's share of the GPU's energy in those minutes, as the
//! accountant split it: its active share plus its idle share by memory held (charged to it
//! under the `spread` policy, reported beside it under `separate`). Its **carbon** is that
//! energy priced at each GPU-minute's intensity × PUE, as every other carbon figure;
//! `None` while none of it has a price (never 0), with the unpriced energy counted.
//!
//! **Why minute rows, not raw samples.** The energy minutes are what every other energy
//! and carbon figure is made of: exact, already split, recomputed when late data arrives,
//! and kept after raw samples expire. The accountant stores beside them the two facts
//! waste needs (`util_max_pct`, `mem_max_bytes`, migration 0024), taken from the same
//! samples in the same pass, so the energy of an episode is exactly the sum of its minutes
//! and nothing is estimated. The price is a minute of resolution: a workload that turns
//! idle mid-minute is counted from the next whole minute (at most 60 s late, never early).

use crate::store::energy::WasteMinute;
use crate::store::{EnergyStore, StoreError, TimeRange};
use gpufleet_core::{UnixMs, Workload};
use std::collections::BTreeMap;
use std::time::Duration;

const MINUTE_MS: i64 = 60_000;

/// An episode whose last minute ends this long before now is no longer ongoing (the
/// accountant's grace plus a minute: a node that stopped reporting does not stay
/// "ongoing" forever).
pub const ONGOING_SLACK_MS: i64 = 3 * MINUTE_MS;

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
    let mut by_series: BTreeMap<(i64, String), Vec<&WasteMinute>> = BTreeMap::new();
    for m in minutes
        .iter()
        .filter(|m| idle_allocated(m, settings.util_threshold_pct))
    {
        by_series
            .entry((m.gpu.0, m.workload.key()))
            .or_default()
            .push(m);
    }
    let min_idle_ms = i64::try_from(settings.min_idle.as_millis()).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    for mut run in by_series.into_values() {
        run.sort_by_key(|m| m.minute_ms);
        for chunk in run.chunk_by(|a, b| b.minute_ms == a.minute_ms + MINUTE_MS) {
            let e = episode(chunk, now_ms);
            if e.idle_ms() >= min_idle_ms {
                out.push(e);
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.node, a.gpu_index, a.since_ms, a.workload.key()).cmp(&(
            &b.node,
            b.gpu_index,
            b.since_ms,
            b.workload.key(),
        ))
    });
    out
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
            && now_ms - (last.minute_ms + MINUTE_MS) <= ONGOING_SLACK_MS,
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

/// The episodes of `range` (optionally one node's GPUs) at `now_ms`, from the store.
pub async fn find(
    store: &dyn EnergyStore,
    range: TimeRange,
    node: Option<&str>,
    settings: WasteSettings,
    now_ms: UnixMs,
) -> Result<Vec<Episode>, StoreError> {
    let minutes = store
        .waste_minutes(range, node, settings.util_threshold_pct)
        .await?;
    Ok(episodes(&minutes, settings, now_ms))
}

/// The episodes going on at `now_ms` (each with its idle time so far: `idle_ms()`,
/// `minutes`): the signal for the "idle but allocated" alert and the
/// `gpufleet_gpu_idle_allocated_seconds` gauge. Looks back at most [`ONGOING_LOOKBACK`]
/// for their start.
///
/// Called every `/metrics` refresh, so it reads little: the last [`ONGOING_FIRST_WINDOW`]
/// (or twice `min_idle`) of the whole fleet first, then longer windows only for the nodes
/// with an ongoing episode that reaches back to the window's start, until each started
/// inside its window or the lookback is reached.
pub async fn ongoing(
    store: &dyn EnergyStore,
    settings: WasteSettings,
    now_ms: UnixMs,
) -> Result<Vec<Episode>, StoreError> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let horizon = now_ms.saturating_sub(ms(ONGOING_LOOKBACK));
    // Episodes of any length: one clipped by the window may be longer than min_idle.
    let any = WasteSettings {
        min_idle: Duration::ZERO,
        ..settings
    };
    let mut span = ms(ONGOING_FIRST_WINDOW).max(ms(settings.min_idle).saturating_mul(2));
    let mut from = now_ms.saturating_sub(span).max(horizon);
    let read = async |from: UnixMs, node: Option<&str>| -> Result<Vec<Episode>, StoreError> {
        let range = TimeRange {
            from_ms: from,
            to_ms: now_ms,
        };
        let mut e = find(store, range, node, any, now_ms).await?;
        e.retain(|e| e.ongoing);
        Ok(e)
    };
    // Whether an episode may have begun before `from` (it starts in the first minute read).
    let clipped = |e: &Episode, from: UnixMs| e.since_ms - from < MINUTE_MS && from > horizon;
    let mut done: Vec<Episode> = Vec::new();
    let mut open: BTreeMap<String, Vec<Episode>> = BTreeMap::new();
    for e in read(from, None).await? {
        open.entry(e.node.clone()).or_default().push(e);
    }
    loop {
        // A node is settled once none of its ongoing episodes reaches the window's start.
        let (settled, longer): (Vec<_>, Vec<_>) = std::mem::take(&mut open)
            .into_iter()
            .partition(|(_, eps)| !eps.iter().any(|e| clipped(e, from)));
        done.extend(settled.into_iter().flat_map(|(_, eps)| eps));
        if longer.is_empty() {
            break;
        }
        span = span.saturating_mul(4);
        from = now_ms.saturating_sub(span).max(horizon);
        for (node, _) in longer {
            let eps = read(from, Some(&node)).await?;
            open.insert(node, eps);
        }
    }
    let min_idle = ms(settings.min_idle);
    done.retain(|e| e.idle_ms() >= min_idle);
    done.sort_by(|a, b| {
        (&a.node, a.gpu_index, a.since_ms, a.workload.key()).cmp(&(
            &b.node,
            b.gpu_index,
            b.since_ms,
            b.workload.key(),
        ))
    });
    Ok(done)
}

#[cfg(test)]
mod tests;
