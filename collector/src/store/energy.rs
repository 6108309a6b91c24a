//! What the store keeps and returns for energy accounting (issue 6). The computing is in
//! [`crate::accounting::energy`] (pure) and [`crate::accounting::accountant`]; these are the shapes crossing the
//! store boundary.

use super::{GpuId, NodeId, StoreError};
use crate::accounting::energy::{EnergySample, GpuMinute, IdlePolicy, IdleSource, WorkloadMinute};
use gpufleet_core::{UnixMs, Workload};
use std::collections::BTreeMap;

/// A GPU as the accountant sees it: where it is, what it is, how far it is accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyGpu {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    /// The GPU model (`NVIDIA H100 80GB HBM3`), for per-model idle watts.
    pub name: String,
    pub node: NodeId,
    pub node_name: String,
    /// The node's sampling interval (0: unknown).
    pub interval_ms: u32,
    /// The GPU's default power limit (else its enforced one), for the fallback baseline.
    pub power_limit_mw: Option<u32>,
    /// Oldest and newest stored sample; `None` without samples.
    pub first_sample_ms: Option<UnixMs>,
    pub last_sample_ms: Option<UnixMs>,
    /// Every minute before this has been accounted; `None`: nothing yet.
    pub done_to_ms: Option<UnixMs>,
}

/// The raw inputs of a range `[from, to)` of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyInputs {
    /// The newest sample before `from` (its processes are not loaded: an interval is
    /// attributed by the processes at its end).
    pub prev: Option<EnergySample>,
    /// The samples in the range, oldest first, each with its processes.
    pub samples: Vec<EnergySample>,
}

/// A GPU and a range `[from_ms, to_ms)` of it, for the batched reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnergyRange {
    pub gpu: GpuId,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
}

/// What [`Store::replace_energy_minutes`](super::Store::replace_energy_minutes) takes, for
/// one GPU of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteReplacement {
    pub range: EnergyRange,
    pub minutes: Vec<GpuMinute>,
    pub done_to_ms: Option<UnixMs>,
}

/// One workload's energy on one GPU over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergy {
    pub workload: Workload,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub node_name: String,
    /// Charged to it (active, plus idle under `spread`).
    pub energy_mj: u64,
    pub active_mj: u64,
    /// Its idle share by memory held (charged only under `spread`).
    pub idle_mj: u64,
    /// Of `energy_mj`, the part in minutes still open.
    pub provisional_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
    pub sm_ms: i64,
    pub memory_ms: i64,
    pub equal_ms: i64,
    pub idle_memory_ms: i64,
    pub idle_equal_ms: i64,
    pub first_minute_ms: UnixMs,
    pub last_minute_ms: UnixMs,
}

/// One GPU's energy over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuEnergy {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub node_name: String,
    pub energy_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub attributed_mj: u64,
    /// The idle bucket (charged to no workload).
    pub idle_mj: u64,
    pub unattributed_mj: u64,
    /// The active part of `energy_mj`; the rest is idle.
    pub active_mj: u64,
    /// Of `energy_mj`, the part in minutes still open.
    pub provisional_mj: u64,
    pub covered_ms: i64,
    pub missing_ms: i64,
}

/// A GPU's idle baseline as its newest energy minute used it, with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBaseline {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub node_name: String,
    pub idle_mw: u32,
    pub idle_source: IdleSource,
    /// The minute it was used for.
    pub minute_ms: UnixMs,
    /// The evidence its newest minute carries: the most recent seen-idle time (up to an
    /// hour) and its energy.
    pub seen_idle_mj: u64,
    pub seen_idle_ms: i64,
}

/// One minute of one workload (all its GPUs).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergyPoint {
    pub minute_ms: UnixMs,
    pub energy_mj: u64,
    pub active_mj: u64,
    pub idle_mj: u64,
    pub provisional_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
}

/// The columns of a stored energy-minute row, whichever backend read it, so both stores
/// decode `energy_gpu_minutes` / `energy_workload_minutes` rows with [`minutes_from_rows`].
pub(super) trait MinuteColumns {
    fn int(&self, column: &str) -> Result<i64, StoreError>;
    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError>;
    fn text(&self, column: &str) -> Result<String, StoreError>;
    fn flag(&self, column: &str) -> Result<bool, StoreError>;

    /// A non-negative integer as u64 (energies and sums are never negative; a negative
    /// value means the row was tampered with).
    fn nonneg(&self, column: &str) -> Result<u64, StoreError> {
        let v = self.int(column)?;
        u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
    }
}

/// GPU-minute rows (`SELECT *` of `energy_gpu_minutes`) with their workload rows, each
/// ordered by GPU and minute. Workload rows without their GPU row come back under a GPU
/// row that has nothing, so conservation fails visibly.
pub(super) fn minutes_from_rows<R: MinuteColumns>(
    rows: &[R],
    wrows: &[R],
) -> Result<Vec<(GpuId, GpuMinute)>, StoreError> {
    let mut workloads: BTreeMap<(i64, i64), Vec<WorkloadMinute>> = BTreeMap::new();
    for row in wrows {
        workloads
            .entry((row.int("gpu_id")?, row.int("minute_ms")?))
            .or_default()
            .push(WorkloadMinute {
                workload: row.int("workload_id")?,
                energy_mj: row.nonneg("energy_mj")?,
                active_mj: row.nonneg("active_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                gpu_ms: row.int("gpu_ms")?,
                share_ppm_ms: row.nonneg("share_ppm_ms")?,
                sm_ms: row.int("sm_ms")?,
                memory_ms: row.int("memory_ms")?,
                equal_ms: row.int("equal_ms")?,
                idle_memory_ms: row.int("idle_memory_ms")?,
                idle_equal_ms: row.int("idle_equal_ms")?,
            });
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let gpu_id = row.int("gpu_id")?;
        let minute_ms = row.int("minute_ms")?;
        let policy = row.text("idle_policy")?;
        let source = row.text("idle_source")?;
        let samples = row.int("samples")?;
        let idle_mw = row.int("idle_mw")?;
        out.push((
            GpuId(gpu_id),
            GpuMinute {
                minute_ms,
                energy_mj: row.nonneg("energy_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                attributed_mj: row.nonneg("attributed_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                unattributed_mj: row.nonneg("unattributed_mj")?,
                active_mj: row.nonneg("active_mj")?,
                seen_idle_ms: row.int("seen_idle_ms")?,
                seen_idle_mj: row.nonneg("seen_idle_mj")?,
                learned_idle_ms: row.int("learned_idle_ms")?,
                learned_idle_mj: row.nonneg("learned_idle_mj")?,
                provisional: row.flag("provisional")?,
                rules: u32::try_from(row.int("rules")?)
                    .map_err(|_| StoreError::Corrupt("rules out of range".into()))?,
                covered_ms: row.int("covered_ms")?,
                missing_ms: row.int("missing_ms")?,
                samples: u32::try_from(samples)
                    .map_err(|_| StoreError::Corrupt(format!("samples {samples}")))?,
                min_power_mw: row
                    .opt_int("min_power_mw")?
                    .map(u32::try_from)
                    .transpose()
                    .map_err(|_| StoreError::Corrupt("min_power_mw out of range".into()))?,
                idle_mw: u32::try_from(idle_mw)
                    .map_err(|_| StoreError::Corrupt(format!("idle_mw {idle_mw}")))?,
                idle_policy: IdlePolicy::parse(&policy)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_policy {policy:?}")))?,
                idle_source: IdleSource::parse(&source)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_source {source:?}")))?,
                max_gap_ms: row.int("max_gap_ms")?,
                workloads: workloads.remove(&(gpu_id, minute_ms)).unwrap_or_default(),
            },
        ));
    }
    for ((gpu_id, minute_ms), ws) in workloads {
        out.push((
            GpuId(gpu_id),
            GpuMinute {
                minute_ms,
                workloads: ws,
                ..Default::default()
            },
        ));
    }
    Ok(out)
}
