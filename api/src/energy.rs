//! `GET /api/v1/containers`: energy (and carbon) per container, pod, namespace, job, Slurm
//! account or user over a range, read from the collector's per-minute rollups.

use gpufleet_core::{UnixMs, Workload};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuRef {
    pub node: String,
    pub uuid: String,
    pub index: u32,
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MethodMix {
    /// Measured by the GPU's energy counter.
    pub counter_j: f64,
    /// Integrated from reported power (counter unsupported or reset).
    pub trapezoid_j: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SplitMix {
    /// Seconds split by per-process SM utilization.
    pub sm_s: f64,
    /// Seconds split by GPU memory (SM utilization not reported).
    pub memory_s: f64,
    /// Seconds split equally (neither reported).
    pub equal_s: f64,
    /// Seconds its idle share was split by GPU memory held, and equally (memory not
    /// reported).
    pub idle_memory_s: f64,
    pub idle_equal_s: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContainerRow {
    /// The row's key: a `Workload::key()` (`container:<64 hex>`, `slurm:<job>`,
    /// `host:<unit>`) or a group (`pod:<uid>`, `namespace:<ns>`, `account:<name>`,
    /// `user:uid-<n>`).
    pub key: String,
    /// The identity of the (first) workload: kind, runtime, full container id, pod UID,
    /// names, job id, as known.
    pub identity: Workload,
    /// The workload keys in this row (one unless grouped).
    pub workloads: Vec<String>,
    pub nodes: Vec<String>,
    pub gpus: Vec<GpuRef>,
    /// Energy charged to it: `active_j` plus `idle_charged_j`.
    pub energy_mj: u64,
    pub energy_j: f64,
    pub energy_kwh: f64,
    /// Its share of the GPUs' active energy.
    pub active_j: f64,
    /// Its share of the GPUs' idle energy while it held them (by GPU memory held):
    /// allocated but idle.
    pub idle_j: f64,
    /// Of `idle_j`, what was charged to it (all of it under `spread`, none under
    /// `separate`).
    pub idle_charged_j: f64,
    /// Of `energy_j`, the part in minutes still open (may still grow).
    pub provisional_j: f64,
    /// GPU time: seconds resident, summed over GPUs.
    pub gpu_seconds: f64,
    /// Average share of the active energy it received while resident (0..1).
    pub avg_share: Option<f64>,
    /// GPM (Hopper and newer): its time-weighted tensor-core activity and SM occupancy
    /// while it held GPUs that report them (percent), each interval's GPU figure times its
    /// share of that interval's active energy: exact alone on a GPU, an estimate on a
    /// shared one. `null` where none of its GPUs reported GPM.
    pub tensor_active_pct: Option<f64>,
    pub sm_occupancy_pct: Option<f64>,
    /// GPU time (seconds, summed over GPUs) the tensor figure covers.
    pub gpm_seconds: f64,
    pub method: MethodMix,
    pub split: SplitMix,
    pub first_minute: String,
    pub last_minute: String,
    /// gCO2 of the priced energy; `null` when none of it has a price.
    pub carbon_g: Option<f64>,
    pub carbon: CarbonView,
}

/// Where a carbon figure came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CarbonView {
    /// Energy-weighted average intensity used (gCO2/kWh, before PUE).
    pub avg_g_per_kwh: Option<f64>,
    /// Share of the energy that has a price (0..1); the rest is `unpriced_j`.
    pub priced_share: Option<f64>,
    /// Share of the priced energy priced with a forecast intensity.
    pub forecast_share: Option<f64>,
    /// Share of the priced energy priced with an estimate (provider unreachable: last
    /// known intensity or the configured default; or the provider's own estimate).
    pub estimated_share: Option<f64>,
    /// Energy without a price yet.
    pub unpriced_j: f64,
    /// `provider:region:factor_type` of the intensities used.
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContainersView {
    pub from: String,
    pub to: String,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
    pub group_by: String,
    pub rows: Vec<ContainerRow>,
}

/// `GET /api/v1/energy/series`: the fleet's energy over time, per bucket, as bands that
/// stack up to the whole: the biggest groups, the rest (`other`), and (grouped by
/// workload) the `idle` energy charged to no workload and the `unattributed` activity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnergySeriesView {
    pub from: String,
    pub to: String,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
    /// `container`, `pod`, `namespace`, `job`, `account`, `user` or `node`.
    pub group_by: String,
    /// The buckets' length: 60 000 (a minute, for ranges up to 6 h) or 3 600 000 (an hour).
    pub step_ms: i64,
    /// Each bucket's start (a multiple of `step_ms`), oldest first; every band has one
    /// value per bucket. A bucket holds the minutes of the range that start in it.
    pub buckets_ms: Vec<UnixMs>,
    /// The GPUs' energy in the range: the sum of every band over every bucket, and
    /// `/api/v1/energy`'s `total.energy_mj` for the same range.
    pub energy_mj: u64,
    /// Bottom to top: the groups by energy, biggest first, then `other`, `unattributed`,
    /// `idle`.
    pub bands: Vec<EnergyBand>,
}

/// One band of [`EnergySeriesView`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnergyBand {
    /// A group's key, as `/api/v1/containers?group_by=` keys its rows (`container:<id>`,
    /// `namespace:<ns>`, …) or `node:<name>`; or `other`, `idle`, `unattributed`.
    pub key: String,
    /// `group`, `other` (the groups without a band of their own), `idle` (idle energy
    /// charged to no workload) or `unattributed` (activity with no process listed).
    pub kind: String,
    /// The identity of the group's first workload (by key), for its name; `null` for a
    /// node and the other bands.
    pub identity: Option<Workload>,
    /// Its energy in the range: the sum of `values_mj` (a group's equals its row's
    /// `energy_mj` in `/api/v1/containers`, or its node's in `/api/v1/energy`).
    pub energy_mj: u64,
    pub energy_j: f64,
    /// Its energy per bucket, mJ, one per `buckets_ms`.
    pub values_mj: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_round_trips_and_unpriced_carbon_stays_null() {
        let v = ContainersView {
            from: "1970-01-01T00:00:00Z".into(),
            to: "1970-01-01T01:00:00Z".into(),
            to_ms: 3_600_000,
            group_by: "container".into(),
            rows: vec![ContainerRow {
                key: "container:abc".into(),
                nodes: vec!["n1".into()],
                energy_j: 7.25,
                carbon_g: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&v).expect("encodes");
        assert!(json.contains("\"carbon_g\":null"), "{json}");
        let back: ContainersView = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, v);
    }
}
