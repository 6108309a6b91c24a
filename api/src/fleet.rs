//! `GET /api/v1/fleet`: every node in brief, what the dashboard's fleet tiles (and
//! `gpufleet top`'s rows) show; a fraction of `/api/v1/nodes`.

use crate::health::HealthState;
use crate::status::NodeStatus;
use gpufleet_core::{GpuSample, HostSample, UnixMs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetNode {
    pub name: String,
    pub status: NodeStatus,
    pub connected: bool,
    pub last_seen_ms: Option<UnixMs>,
    pub labels: BTreeMap<String, String>,
    pub interval_ms: u32,
    /// The node's health (its worst GPU; critical offline, warning stale).
    pub health: FleetHealth,
    pub host: FleetHost,
    pub gpus: Vec<FleetGpu>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHost {
    pub latest: Option<FleetHostLatest>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHostLatest {
    pub time_ms: UnixMs,
    pub cpu_util_pct: Option<f32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
}

impl FleetHostLatest {
    /// The values of host sample `s` taken at `time_ms` (`None`: a tick without host
    /// metrics, every value absent).
    pub fn of(time_ms: UnixMs, s: Option<&HostSample>) -> FleetHostLatest {
        FleetHostLatest {
            time_ms,
            cpu_util_pct: s.and_then(|s| s.cpu_util_pct),
            mem_used_bytes: s.and_then(|s| s.mem_used_bytes),
            mem_total_bytes: s.and_then(|s| s.mem_total_bytes),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetGpu {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub latest: Option<FleetGpuLatest>,
    /// The GPU's health and what is wrong, worst first.
    pub health: FleetHealth,
}

/// A health state and, in brief, the reasons that make it (informational ones and the
/// actions are left out: the node and GPU endpoints have them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHealth {
    pub state: HealthState,
    pub reasons: Vec<FleetReason>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetReason {
    pub code: String,
    pub severity: HealthState,
    pub summary: String,
}

/// The GPU values a fleet tile shows (names and units as in the GPU sample).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetGpuLatest {
    pub time_ms: UnixMs,
    pub util_gpu_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub temp_gpu_c: Option<u32>,
}

impl FleetGpuLatest {
    /// The values of GPU sample `s` taken at `time_ms`.
    pub fn of(time_ms: UnixMs, s: &GpuSample) -> FleetGpuLatest {
        FleetGpuLatest {
            time_ms,
            util_gpu_pct: s.util_gpu_pct,
            mem_used_bytes: s.mem_used_bytes,
            mem_total_bytes: s.mem_total_bytes,
            power_mw: s.power_mw,
            power_limit_mw: s.power_limit_mw,
            temp_gpu_c: s.temp_gpu_c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_values_stay_absent_both_ways() {
        let j = r#"[{"name":"n1","status":"online","connected":true,"last_seen_ms":5,
            "labels":{"rack":"r1"},"interval_ms":1000,
            "health":{"state":"ok","reasons":[]},"host":{"latest":null},
            "gpus":[{"uuid":"GPU-1","index":0,"name":"H100","latest":{"time_ms":5,
            "util_gpu_pct":null,"mem_used_bytes":1,"mem_total_bytes":2,"power_mw":null,
            "power_limit_mw":700000,"temp_gpu_c":40},
            "health":{"state":"warning","reasons":[{"code":"node_stale","severity":"warning",
            "summary":"s"}]}}]}]"#;
        let nodes: Vec<FleetNode> = serde_json::from_str(j).expect("decodes");
        let g = nodes[0].gpus[0].latest.as_ref().expect("latest");
        assert_eq!((g.util_gpu_pct, g.power_mw), (None, None), "absent, not 0");
        assert_eq!(g.temp_gpu_c, Some(40));
        assert_eq!(nodes[0].gpus[0].health.state, HealthState::Warning);
        let again: Vec<FleetNode> =
            serde_json::from_str(&serde_json::to_string(&nodes).expect("encodes"))
                .expect("decodes");
        assert_eq!(again, nodes);
    }

    #[test]
    fn latest_values_come_from_the_sample() {
        let s = GpuSample {
            util_gpu_pct: Some(80),
            power_mw: Some(250_000),
            fan_pct: Some(30),
            ..Default::default()
        };
        let l = FleetGpuLatest::of(9, &s);
        assert_eq!(
            (l.time_ms, l.util_gpu_pct, l.power_mw),
            (9, Some(80), Some(250_000))
        );
        assert_eq!(l.mem_used_bytes, None);
        assert_eq!(FleetHostLatest::of(9, None).cpu_util_pct, None);
    }
}
