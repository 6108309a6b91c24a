//! `GET /api/v1/nodes` (a list of [`NodeView`]) and `GET /api/v1/nodes/{name}` (one): every
//! node with status, delivery state, host and GPUs (inventory, latest sample, processes,
//! health). Times come twice: RFC 3339 (`time`, `last_seen`) and Unix ms (`*_ms`).

use crate::health::{GpuHealth, NodeHealth};
use crate::status::NodeStatus;
use gpufleet_core::{GpuInfo, GpuSample, HostSample, ProcessSample, SamplerCost, UnixMs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    pub name: String,
    pub status: NodeStatus,
    /// Whether an ingest stream from the node to this collector is open now (with several
    /// collectors, a node streaming to another one is `false` and still `online`).
    pub connected: bool,
    pub last_seen: Option<String>,
    pub last_seen_ms: Option<UnixMs>,
    pub labels: BTreeMap<String, String>,
    pub agent_version: String,
    pub boot_id: String,
    pub source: String,
    pub interval_ms: u32,
    pub last_acked_seq: u64,
    pub dropped_samples: u64,
    pub spool_backlog: SpoolView,
    pub rejected_batches: u64,
    pub stored_samples: u64,
    /// The node's health: its worst GPU, critical when offline, warning when stale
    /// (`reasons` holds the node's own; each GPU carries its own).
    pub health: NodeHealth,
    pub host: HostView,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpoolView {
    pub batches: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostView {
    pub hostname: String,
    pub kernel: Option<String>,
    pub os: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub latest: Option<HostLatestView>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostLatestView {
    pub time: String,
    pub time_ms: UnixMs,
    #[serde(flatten)]
    pub sample: HostSample,
    /// What sampling that tick cost the agent.
    pub sampler_cost: Option<SamplerCost>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuView {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub inventory: GpuInfo,
    pub latest: Option<GpuLatestView>,
    /// Processes seen on the GPU in the latest sample's tick.
    pub processes: Vec<ProcessSample>,
    /// The GPU's health (ok / warning / critical) and the reasons, worst first.
    pub health: GpuHealth,
    /// The latest sample's clock-event (throttle) reasons by name (`sw_power_cap`,
    /// `hw_thermal`, …); absent when the sample has no mask.
    pub throttle: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuLatestView {
    pub time: String,
    pub time_ms: UnixMs,
    #[serde(flatten)]
    pub sample: GpuSample,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_round_trips_with_its_flattened_samples() {
        let node = NodeView {
            name: "n1".into(),
            status: NodeStatus::Online,
            last_seen: Some("2026-01-01T00:00:00Z".into()),
            last_seen_ms: Some(1_767_225_600_000),
            host: HostView {
                hostname: "n1".into(),
                latest: Some(HostLatestView {
                    time: "2026-01-01T00:00:00Z".into(),
                    time_ms: 1_767_225_600_000,
                    sample: HostSample {
                        cpu_util_pct: Some(12.5),
                        ..Default::default()
                    },
                    sampler_cost: None,
                }),
                ..Default::default()
            },
            gpus: vec![GpuView {
                uuid: "GPU-1".into(),
                latest: Some(GpuLatestView {
                    time: "2026-01-01T00:00:00Z".into(),
                    time_ms: 1_767_225_600_000,
                    sample: GpuSample {
                        gpu_uuid: "GPU-1".into(),
                        util_gpu_pct: Some(93),
                        ..Default::default()
                    },
                }),
                throttle: Some(vec!["sw_power_cap".into()]),
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&node).expect("encodes");
        assert!(json.contains("\"util_gpu_pct\":93"), "flattened: {json}");
        assert!(json.contains("\"cpu_util_pct\":12.5"), "flattened: {json}");
        let back: NodeView = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, node);
    }
}
