//! Energy accounting: how much energy each GPU spent per interval, and who spent it.
//!
//! Pure functions, no SQL and no clock: the accountant ([`crate::accounting::accountant`]) feeds them
//! stored samples and stores what they return; `check-energy` runs them again over the raw
//! samples and compares.
//!
//! **Per interval** (two consecutive samples of one GPU, `(t0, t1]`):
//! - `counter`: the delta of the total-energy counter, when both samples carry it and it did
//!   not go backwards (a driver reload resets it);
//! - `trapezoid`: otherwise, `(p0 + p1) / 2 × (t1 − t0)` over the reported power;
//! - `missing`: when the interval is longer than the gap limit (agent down, samples lost) or
//!   neither method has its inputs. No energy is invented for it; its duration is counted.
//!
//! **Attribution** of an interval's energy `E` (integer millijoules), using the processes
//! seen at its end sample (NVML's per-process utilization covers the window since the
//! previous reading):
//! - idle part `I = min(E, idle_mw × Δt × (1 − u))`, where `u` is the GPU utilization at the
//!   end sample (the share of the interval a kernel ran; unknown: 0). The baseline power
//!   drawn while kernels run is part of running them, so only the GPU's idle *time* is
//!   idle energy. The active part is `E − I`;
//! - no process at all: all of `E` goes to the `idle` bucket — unless the GPU reported
//!   utilization above 0 %, in which case the active part is `unattributed` (work we saw but
//!   cannot name: processes NVML does not list, e.g. in another PID namespace);
//! - otherwise the active part is split over workloads by SM-utilization share (`sm`) when
//!   every process reports one and they sum above 0, else by GPU-memory share (`memory`),
//!   else equally (`equal`); the idle part is split over the resident workloads by the GPU
//!   memory each holds (holding memory is what keeps others off the GPU), else equally.
//!   Under [`IdlePolicy::Spread`] (the default) each workload is charged its idle share;
//!   under [`IdlePolicy::Separate`] the idle part goes to the `idle` bucket and each
//!   workload's idle share is reported beside its energy, not charged.
//!
//! An interval where the GPU did no work (0 % utilization at both ends, no compute process
//! listed) is *seen idle*: its energy and length teach the GPU's idle baseline
//! ([`baseline`]).
//!
//! Every split uses the largest-remainder rule on integers, ties to the lowest workload id,
//! so **attributed + idle + unattributed == E exactly**, for every interval.

pub mod baseline;

use gpufleet_core::UnixMs;
use std::collections::BTreeMap;

pub use gpufleet_store::energy::records::{
    EnergyProcess, EnergySample, GpuMinute, IdlePolicy, IdleSource, WorkloadMinute, WorkloadRef,
};

pub use gpufleet_core::times::{MINUTE_MS, minute_of};

/// The attribution rules minutes are computed with, stored in each minute row: 1 before
/// the idle baseline was learned and idle split by memory (those rows are checked for
/// conservation only; `recompute-energy` rebuilds them), 2 before the waste columns
/// (`util_max_pct`, `mem_max_bytes`, migration 0024: those rows may hold NULL there), 3
/// now.
pub const RULES: u32 = 3;

/// The oldest rules whose rows are compared with raw samples (`check-energy`).
pub const RULES_COMPARED_WITH_RAW: u32 = 2;

/// The first rules whose rows were written with the waste columns.
pub const RULES_WITH_WASTE_COLUMNS: u32 = 3;

/// How an interval's energy was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// Delta of NVML's total-energy counter.
    Counter,
    /// Trapezoid integration of the reported power.
    Trapezoid,
    /// Not measured (gap, or neither counter nor power): no energy, duration counted.
    Missing,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Counter => "counter",
            Method::Trapezoid => "trapezoid",
            Method::Missing => "missing",
        }
    }
}

/// How an interval's active energy was split over workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SplitMethod {
    /// By per-process SM utilization.
    Sm,
    /// By per-process GPU memory (SM utilization missing or all zero).
    Memory,
    /// Equally (neither is usable).
    Equal,
}

/// One workload's part of an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPart {
    pub workload: WorkloadRef,
    /// Everything charged to it: its active share, plus its idle share under
    /// [`IdlePolicy::Spread`], mJ.
    pub energy_mj: u64,
    /// Its share of the active energy, mJ.
    pub active_mj: u64,
    /// Its share of the idle energy (by GPU memory held), under both policies; charged
    /// (part of `energy_mj`) only under [`IdlePolicy::Spread`], mJ.
    pub idle_mj: u64,
    /// Its share of the active split, in parts per million.
    pub share_ppm: u32,
}

/// The accounting of one interval `(start_ms, end_ms]` of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntervalEnergy {
    pub start_ms: UnixMs,
    pub end_ms: UnixMs,
    pub method: Method,
    /// The GPU's energy in the interval (0 when `Missing`), mJ.
    pub energy_mj: u64,
    /// Idle energy not given to workloads (the `idle` bucket), mJ.
    pub idle_bucket_mj: u64,
    /// Active energy with no process to give it to, mJ.
    pub unattributed_mj: u64,
    /// The idle part of the interval (to workloads and the bucket), mJ.
    pub idle_mj: u64,
    /// `None` when no workload received active energy.
    pub split: Option<SplitMethod>,
    /// How the idle part was split over workloads (`memory` or `equal`); `None` without
    /// workloads.
    pub idle_split: Option<SplitMethod>,
    /// The GPU did no work in this interval: it teaches the idle baseline.
    pub seen_idle: bool,
    /// By workload id.
    pub parts: Vec<WorkloadPart>,
}

impl IntervalEnergy {
    pub fn duration_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }

    /// attributed + idle bucket + unattributed; equals `energy_mj` by construction.
    pub fn accounted_mj(&self) -> u64 {
        self.parts.iter().map(|p| p.energy_mj).sum::<u64>()
            + self.idle_bucket_mj
            + self.unattributed_mj
    }
}

/// The GPU's energy over `(prev, cur]` and the method that produced it.
pub fn interval_energy(prev: &EnergySample, cur: &EnergySample, max_gap_ms: i64) -> (Method, u64) {
    let dt = cur.time_ms - prev.time_ms;
    if dt <= 0 || dt > max_gap_ms {
        return (Method::Missing, 0);
    }
    if let (Some(e0), Some(e1)) = (prev.energy_mj, cur.energy_mj)
        && e1 >= e0
    {
        return (Method::Counter, e1 - e0);
    }
    match (prev.power_mw, cur.power_mw) {
        (Some(p0), Some(p1)) => {
            // mW × ms = µJ; / 1000 = mJ; the trapezoid halves: / 2000, rounded to nearest.
            let twice_uj = (u128::from(p0) + u128::from(p1)) * dt as u128;
            let mj = (twice_uj + 1000) / 2000;
            (Method::Trapezoid, u64::try_from(mj).unwrap_or(u64::MAX))
        }
        _ => (Method::Missing, 0),
    }
}

/// Splits `total` into integers proportional to `weights` (largest remainder; ties to the
/// earlier index). The parts always sum to `total`. All-zero weights split equally.
pub fn split_proportional(total: u64, weights: &[u128]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let sum: u128 = weights.iter().sum();
    let (weights, sum): (Vec<u128>, u128) = if sum == 0 {
        (vec![1; weights.len()], weights.len() as u128)
    } else {
        (weights.to_vec(), sum)
    };
    let total128 = u128::from(total);
    let mut parts: Vec<u64> = Vec::with_capacity(weights.len());
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(weights.len());
    for (i, w) in weights.iter().enumerate() {
        let num = total128 * w;
        parts.push(u64::try_from(num / sum).unwrap_or(u64::MAX));
        remainders.push((num % sum, i));
    }
    let given: u64 = parts.iter().sum();
    let mut left = total - given; // < weights.len()
    // Largest remainder first; equal remainders: lower index first.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in remainders {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

/// Whether `(prev, cur]` shows a GPU doing no work: 0 % utilization at both ends and no
/// compute process listed at its end (absent utilization is not 0 %).
pub fn seen_idle(prev: &EnergySample, cur: &EnergySample) -> bool {
    prev.util_gpu_pct == Some(0)
        && cur.util_gpu_pct == Some(0)
        && !cur.processes.iter().any(|p| p.compute)
}

/// Attributes one interval's energy (see the module doc).
pub fn attribute(
    start_ms: UnixMs,
    cur: &EnergySample,
    method: Method,
    energy_mj: u64,
    idle_mw: u32,
    policy: IdlePolicy,
) -> IntervalEnergy {
    let dt = (cur.time_ms - start_ms).max(0);
    let mut out = IntervalEnergy {
        start_ms,
        end_ms: cur.time_ms,
        method,
        energy_mj,
        idle_bucket_mj: 0,
        unattributed_mj: 0,
        idle_mj: 0,
        split: None,
        idle_split: None,
        seen_idle: false,
        parts: Vec::new(),
    };
    if energy_mj == 0 && method == Method::Missing {
        return out;
    }
    // mW × ms × idle % = µJ × 100; / 100_000 = mJ, rounded to nearest.
    let idle_pct = 100 - u128::from(cur.util_gpu_pct.unwrap_or(0).min(100));
    let idle_cap = (u128::from(idle_mw) * dt as u128 * idle_pct + 50_000) / 100_000;
    let idle = u64::try_from(idle_cap.min(u128::from(energy_mj))).unwrap_or(energy_mj);
    let active = energy_mj - idle;
    out.idle_mj = idle;

    // Per workload: SM sum, memory sum; a process without a reading makes the whole
    // method unusable for this interval (absent is not zero).
    let mut by_workload: BTreeMap<WorkloadRef, (u128, u128)> = BTreeMap::new();
    let mut sm_ok = true;
    let mut mem_ok = true;
    for p in &cur.processes {
        let e = by_workload.entry(p.workload).or_default();
        match p.sm_util_pct {
            Some(v) => e.0 += u128::from(v),
            None => sm_ok = false,
        }
        match p.gpu_mem_bytes {
            Some(v) => e.1 += u128::from(v),
            None => mem_ok = false,
        }
    }
    if by_workload.is_empty() {
        if cur.util_gpu_pct.is_some_and(|u| u > 0) {
            out.idle_bucket_mj = idle;
            out.unattributed_mj = active;
        } else {
            out.idle_bucket_mj = energy_mj;
            out.idle_mj = energy_mj;
        }
        return out;
    }
    let ids: Vec<WorkloadRef> = by_workload.keys().copied().collect();
    let sm: Vec<u128> = by_workload.values().map(|v| v.0).collect();
    let mem: Vec<u128> = by_workload.values().map(|v| v.1).collect();
    let mem_usable = mem_ok && mem.iter().sum::<u128>() > 0;
    let (split, weights) = if sm_ok && sm.iter().sum::<u128>() > 0 {
        (SplitMethod::Sm, sm)
    } else if mem_usable {
        (SplitMethod::Memory, mem.clone())
    } else {
        (SplitMethod::Equal, vec![1; ids.len()])
    };
    let (idle_split, idle_weights) = if mem_usable {
        (SplitMethod::Memory, mem)
    } else {
        (SplitMethod::Equal, vec![1; ids.len()])
    };
    let weight_sum: u128 = weights.iter().sum();
    let active_parts = split_proportional(active, &weights);
    let idle_parts = split_proportional(idle, &idle_weights);
    let charged = match policy {
        IdlePolicy::Spread => true,
        IdlePolicy::Separate => {
            out.idle_bucket_mj = idle;
            false
        }
    };
    out.split = Some(split);
    out.idle_split = Some(idle_split);
    out.parts = ids
        .iter()
        .enumerate()
        .map(|(i, &workload)| WorkloadPart {
            workload,
            energy_mj: active_parts[i] + if charged { idle_parts[i] } else { 0 },
            active_mj: active_parts[i],
            idle_mj: idle_parts[i],
            share_ppm: u32::try_from(weights[i] * 1_000_000 / weight_sum.max(1))
                .unwrap_or(1_000_000),
        })
        .collect();
    out
}

/// Accounts every interval that ends at one of `samples` (sorted by time, distinct
/// times); `prev` is the sample before the first, if any.
pub fn account(
    prev: Option<&EnergySample>,
    samples: &[EnergySample],
    max_gap_ms: i64,
    idle_mw: u32,
    policy: IdlePolicy,
) -> Vec<IntervalEnergy> {
    let seq: Vec<&EnergySample> = prev.into_iter().chain(samples).collect();
    let energies = interval_energies(&seq, max_gap_ms);
    seq.windows(2)
        .zip(energies)
        .map(|(pair, (method, e))| {
            let (p, cur) = (pair[0], pair[1]);
            let mut iv = attribute(p.time_ms, cur, method, e, idle_mw, policy);
            iv.seen_idle = method != Method::Missing && seen_idle(p, cur);
            iv
        })
        .collect()
}

/// The energy of each interval between consecutive samples of `seq`
/// ([`interval_energy`]), with the counter spread over the samples between two readings:
/// an agent reads the counter every few seconds (it costs milliseconds of driver CPU)
/// and the ticks between carry none. For a run of intervals from one counter reading to
/// the next (no gap, the counter not gone back), the delta is split over the run's
/// intervals in proportion to their trapezoid energy (by duration where a power reading
/// is missing, or all are 0), so the run adds up to the counter's delta exactly. A run
/// is spread when its intervals all end in one minute (minutes are accounted one at a
/// time); an interval outside such a run (a trailing one whose closing reading has not
/// come, a run across a minute's end) keeps its own method.
pub fn interval_energies(seq: &[&EnergySample], max_gap_ms: i64) -> Vec<(Method, u64)> {
    let mut out: Vec<(Method, u64)> = seq
        .windows(2)
        .map(|w| interval_energy(w[0], w[1], max_gap_ms))
        .collect();
    let readings: Vec<usize> = (0..seq.len())
        .filter(|&i| seq[i].energy_mj.is_some())
        .collect();
    for pair in readings.windows(2) {
        let (i, j) = (pair[0], pair[1]);
        if j == i + 1 {
            continue; // Two readings in a row: `interval_energy` took the delta.
        }
        let (Some(e0), Some(e1)) = (seq[i].energy_mj, seq[j].energy_mj) else {
            continue;
        };
        let run = &seq[i..=j];
        let spans = run.windows(2).all(|w| {
            let dt = w[1].time_ms - w[0].time_ms;
            dt > 0 && dt <= max_gap_ms
        });
        // Minutes are accounted one at a time: a run is spread only when all its
        // intervals end in one minute, so a minute's figures never depend on samples
        // of the next. The agent reads the counter on every minute's last tick.
        let one_minute = minute_of(run[1].time_ms) == minute_of(seq[j].time_ms);
        if e1 < e0 || !spans || !one_minute {
            continue;
        }
        let by_power: Option<Vec<u128>> = run
            .windows(2)
            .map(|w| {
                let dt = u128::try_from(w[1].time_ms - w[0].time_ms).unwrap_or(0);
                Some((u128::from(w[0].power_mw?) + u128::from(w[1].power_mw?)) * dt)
            })
            .collect();
        let weights = by_power
            .filter(|w| w.iter().any(|x| *x > 0))
            .unwrap_or_else(|| {
                run.windows(2)
                    .map(|w| u128::try_from(w[1].time_ms - w[0].time_ms).unwrap_or(0))
                    .collect()
            });
        for (k, mj) in split_proportional(e1 - e0, &weights)
            .into_iter()
            .enumerate()
        {
            out[i + k] = (Method::Counter, mj);
        }
    }
    out
}

/// A workload's part of a GPM activity over one interval: share (ppm) × activity
/// (hundredths of a percent) × interval (ms), in hundredths of a percent × ms. Alone on a
/// GPU (share 1) it is the GPU's activity; two workloads splitting the active energy
/// 3:1 get ¾ and ¼ of it, so the parts of an interval add up to the GPU's (an estimate:
/// GPM measures the GPU, not its processes).
pub fn gpm_share(share_ppm: u32, activity_cpct: u32, dt_ms: i64) -> u64 {
    let dt = u128::try_from(dt_ms).unwrap_or(0);
    u64::try_from(u128::from(share_ppm) * u128::from(activity_cpct) * dt / 1_000_000)
        .unwrap_or(u64::MAX)
}

/// A time-weighted GPM activity in percent: Σ [`gpm_share`] over `ms` of the intervals
/// it covers; `None` when none reported GPM.
pub fn gpm_pct(cpct_ms: u64, ms: i64) -> Option<f64> {
    (ms > 0).then(|| cpct_ms as f64 / ms as f64 / 100.0)
}

/// Splits time-ordered samples into runs of one minute each: `(minute start, samples)`.
pub fn by_minute(samples: &[EnergySample]) -> impl Iterator<Item = (UnixMs, &[EnergySample])> {
    samples
        .chunk_by(|a, b| minute_of(a.time_ms) == minute_of(b.time_ms))
        .map(|run| (minute_of(run[0].time_ms), run))
}

/// The minute's lowest reported power.
pub fn min_power(samples: &[EnergySample]) -> Option<u32> {
    samples.iter().filter_map(|s| s.power_mw).min()
}

/// Rolls up one minute: `samples` are the GPU's samples in `[minute, minute + 1 min)`,
/// `prev` the sample just before them (any age: the gap limit decides).
pub fn rollup_minute(
    minute_ms: UnixMs,
    prev: Option<&EnergySample>,
    samples: &[EnergySample],
    max_gap_ms: i64,
    idle_mw: u32,
    idle_source: IdleSource,
    policy: IdlePolicy,
) -> GpuMinute {
    let intervals = account(prev, samples, max_gap_ms, idle_mw, policy);
    let mut m = GpuMinute {
        minute_ms,
        samples: u32::try_from(samples.len()).unwrap_or(u32::MAX),
        min_power_mw: min_power(samples),
        idle_mw,
        idle_policy: policy,
        idle_source,
        max_gap_ms,
        rules: RULES,
        ..Default::default()
    };
    let mut workloads: BTreeMap<WorkloadRef, WorkloadMinute> = BTreeMap::new();
    // `account` gives one interval per sample after the first (or after `prev`): the
    // interval ending at `samples[i + offset]` is `intervals[i]`.
    let offset = samples.len() - intervals.len();
    // Some(max) while every measured interval's end sample reported utilization.
    let mut util_max: Option<Option<u32>> = None;
    for (i, iv) in intervals.iter().enumerate() {
        let dt = iv.duration_ms();
        match iv.method {
            Method::Missing => {
                m.missing_ms += dt;
                continue;
            }
            Method::Counter => m.counter_mj += iv.energy_mj,
            Method::Trapezoid => m.trapezoid_mj += iv.energy_mj,
        }
        let end = &samples[i + offset];
        util_max = Some(match (util_max, end.util_gpu_pct) {
            (Some(None), _) | (_, None) => None,
            (Some(Some(a)), Some(b)) => Some(a.max(b)),
            (None, Some(b)) => Some(b),
        });
        m.covered_ms += dt;
        m.energy_mj += iv.energy_mj;
        m.active_mj += iv.energy_mj - iv.idle_mj;
        if iv.seen_idle {
            m.seen_idle_ms += dt;
            m.seen_idle_mj += iv.energy_mj;
        }
        m.idle_mj += iv.idle_bucket_mj;
        m.unattributed_mj += iv.unattributed_mj;
        for p in &iv.parts {
            let w = workloads
                .entry(p.workload)
                .or_insert_with(|| WorkloadMinute {
                    workload: p.workload,
                    ..Default::default()
                });
            w.energy_mj += p.energy_mj;
            w.active_mj += p.active_mj;
            w.idle_mj += p.idle_mj;
            match iv.method {
                Method::Counter => w.counter_mj += p.energy_mj,
                _ => w.trapezoid_mj += p.energy_mj,
            }
            w.gpu_ms += dt;
            w.share_ppm_ms += u64::from(p.share_ppm) * dt as u64;
            // GPM by the same share as the active energy: the GPU's activity over the
            // interval, as its end sample reports it (see `gpm_share`).
            if let Some(t) = end.tensor_cpct {
                w.tensor_ms += dt;
                w.tensor_cpct_ms += gpm_share(p.share_ppm, t, dt);
            }
            if let Some(o) = end.occupancy_cpct {
                w.occupancy_ms += dt;
                w.occupancy_cpct_ms += gpm_share(p.share_ppm, o, dt);
            }
            match iv.split {
                Some(SplitMethod::Sm) => w.sm_ms += dt,
                Some(SplitMethod::Memory) => w.memory_ms += dt,
                _ => w.equal_ms += dt,
            }
            match iv.idle_split {
                Some(SplitMethod::Memory) => w.idle_memory_ms += dt,
                _ => w.idle_equal_ms += dt,
            }
            let held = end
                .processes
                .iter()
                .filter(|q| q.workload == p.workload)
                .try_fold(0u64, |a, q| q.gpu_mem_bytes.map(|b| a.saturating_add(b)));
            w.mem_max_bytes = w.mem_max_bytes.max(held);
            m.attributed_mj += p.energy_mj;
        }
    }
    m.workloads = workloads.into_values().collect();
    m.util_max_pct = util_max.flatten();
    m
}

#[cfg(test)]
mod tests;
