//! The collector's API answers `top` reads, typed: only the fields it shows (serde skips
//! the rest, so a collector that adds fields does not break the client). Names and units
//! are the API's (`/api/v1/openapi.json`); an absent value stays `None`, never 0.

use gpufleet_core::{Event, ProcessSample, UnixMs, Workload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A node's status as the collector classifies it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Online,
    Stale,
    Offline,
    /// A status this client does not know (a newer collector).
    #[default]
    #[serde(other)]
    Unknown,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Online => "online",
            NodeStatus::Stale => "stale",
            NodeStatus::Offline => "offline",
            NodeStatus::Unknown => "?",
        }
    }
}

/// A GPU's or node's health as the collector judged it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ok,
    Warning,
    Critical,
    /// A state this client does not know (a newer collector).
    #[default]
    #[serde(other)]
    Unknown,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Warning => "warning",
            Health::Critical => "critical",
            Health::Unknown => "?",
        }
    }
}

/// One reason a GPU or node is not (entirely) ok: what is wrong and what to do.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct HealthReason {
    pub code: String,
    pub severity: Health,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub action: String,
}

/// A GPU's or node's judged health (absent from a collector that does not judge).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct HealthView {
    pub state: Health,
    #[serde(default)]
    pub reasons: Vec<HealthReason>,
}

/// One node of `GET /api/v1/fleet`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct FleetNode {
    pub name: String,
    pub status: NodeStatus,
    #[serde(default)]
    pub connected: bool,
    pub last_seen_ms: Option<UnixMs>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub host: FleetHost,
    #[serde(default)]
    pub gpus: Vec<FleetGpu>,
    #[serde(default)]
    pub health: Option<HealthView>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct FleetHost {
    pub latest: Option<HostLatest>,
}

/// A node's newest host sample (the fields `top` shows).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct HostLatest {
    pub time_ms: UnixMs,
    pub cpu_util_pct: Option<f32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
}

/// One GPU of a fleet node.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct FleetGpu {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub latest: Option<GpuLatest>,
    #[serde(default)]
    pub health: Option<HealthView>,
}

/// A GPU's newest sample: the fleet's fields, and the node view's (present in
/// `/api/v1/nodes/{name}` and live ticks, absent from `/api/v1/fleet`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct GpuLatest {
    #[serde(default)]
    pub time_ms: UnixMs,
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub temp_gpu_c: Option<u32>,
    pub fan_pct: Option<u32>,
    pub clock_sm_mhz: Option<u32>,
    pub pstate: Option<u32>,
    pub ecc_uncorrected_volatile: Option<u64>,
}

/// `GET /api/v1/nodes/{name}`: one node with its GPUs' inventory, latest sample and
/// processes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeDetail {
    pub name: String,
    pub status: NodeStatus,
    pub last_seen_ms: Option<UnixMs>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub agent_version: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub host: NodeHost,
    #[serde(default)]
    pub gpus: Vec<NodeGpu>,
    #[serde(default)]
    pub health: Option<HealthView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeHost {
    #[serde(default)]
    pub hostname: String,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub cpu_count: Option<u32>,
    pub latest: Option<HostLatest>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeGpu {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub latest: Option<GpuLatest>,
    #[serde(default)]
    pub processes: Vec<ProcessSample>,
    #[serde(default)]
    pub health: Option<HealthView>,
}

/// `GET /api/v1/nodes/{name}/events`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Events {
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub events: Vec<EventView>,
}

/// One event, with the Xid catalogue's explanation for Xid events.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EventView {
    #[serde(flatten)]
    pub event: Event,
    #[serde(default)]
    pub explanation: Option<XidExplanation>,
}

impl std::ops::Deref for EventView {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

/// What an Xid means and what to do (the fields `top` shows).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct XidExplanation {
    pub name: String,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub severity: String,
}

/// `GET /api/v1/containers` (default range: today, UTC midnight to now).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Containers {
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
    #[serde(default)]
    pub rows: Vec<WorkloadEnergy>,
}

/// One workload's energy and carbon over the range.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WorkloadEnergy {
    pub key: String,
    #[serde(default)]
    pub identity: Workload,
    #[serde(default)]
    pub nodes: Vec<String>,
    pub energy_j: f64,
    #[serde(default)]
    pub idle_j: f64,
    #[serde(default)]
    pub gpu_seconds: f64,
    /// `None` when none of the energy has a carbon price (carbon off, or not priced yet).
    pub carbon_g: Option<f64>,
}

/// A `tick` event of `/api/v1/live`: a node's newest committed tick.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LiveTick {
    pub node: String,
    pub time_ms: UnixMs,
    #[serde(default)]
    pub gpus: Vec<LiveGpu>,
    pub host: Option<HostLatest>,
}

/// A GPU of a live tick: its sample flattened beside its UUID.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LiveGpu {
    pub uuid: String,
    #[serde(flatten)]
    pub sample: GpuLatest,
}

/// A `status` event of `/api/v1/live`: every node's status, each second.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LiveStatus {
    pub now_ms: UnixMs,
    #[serde(default)]
    pub nodes: Vec<LiveNodeStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LiveNodeStatus {
    pub name: String,
    pub status: NodeStatus,
    pub last_seen_ms: Option<UnixMs>,
    #[serde(default)]
    pub connected: bool,
    /// The node's health state (absent from a collector that does not judge).
    #[serde(default)]
    pub health: Option<Health>,
    /// The GPUs that are not ok, by UUID.
    #[serde(default)]
    pub gpu_health: BTreeMap<String, Health>,
}

/// The error body of every API error: `{"error": "..."}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_node_with_absent_values_stays_absent() {
        let j = r#"[{"name":"n1","status":"online","connected":true,"last_seen_ms":5,
            "labels":{"rack":"r1"},"interval_ms":1000,"host":{"latest":null},
            "gpus":[{"uuid":"GPU-1","index":0,"name":"H100","latest":{"time_ms":5,
            "util_gpu_pct":null,"mem_used_bytes":1,"mem_total_bytes":2,"power_mw":null,
            "power_limit_mw":700000,"temp_gpu_c":40}}]}]"#;
        let nodes: Vec<FleetNode> = serde_json::from_str(j).expect("parses");
        let g = nodes[0].gpus[0].latest.as_ref().expect("latest");
        assert_eq!(g.util_gpu_pct, None);
        assert_eq!(g.power_mw, None);
        assert_eq!(g.temp_gpu_c, Some(40));
        assert_eq!(nodes[0].status, NodeStatus::Online);
    }

    #[test]
    fn health_and_explained_events_parse_and_their_absence_is_kept() {
        let j = r#"{"name":"n1","status":"online","last_seen_ms":5,
            "health":{"state":"critical","reasons":[],"gpus_warning":0,"gpus_critical":1},
            "gpus":[{"uuid":"GPU-1","index":0,"name":"H100","latest":null,
              "health":{"state":"critical","reasons":[{"code":"xid_79","severity":"critical",
              "summary":"Xid 79: GPU has fallen off the bus","action":"Reboot","since_ms":5}]}}]}"#;
        let n: NodeDetail = serde_json::from_str(j).expect("parses");
        let h = n.gpus[0].health.as_ref().expect("health");
        assert_eq!(
            (h.state, h.reasons[0].code.as_str()),
            (Health::Critical, "xid_79")
        );
        let old: FleetNode =
            serde_json::from_str(r#"{"name":"n","status":"online","last_seen_ms":1}"#)
                .expect("parses");
        assert_eq!(old.health, None, "an older collector: no health, not ok");
        let e: Events = serde_json::from_str(
            r#"{"events":[{"time_ms":1,"gpu_uuid":"GPU-1","kind":"xid","code":79,"detail":"x",
              "explanation":{"code":79,"name":"GPU has fallen off the bus","meaning":"m",
              "cause":"c","action":"Reboot","severity":"critical","known":true}},
              {"time_ms":2,"gpu_uuid":"","kind":"spool_drop","code":null,"detail":"y"}]}"#,
        )
        .expect("parses");
        assert_eq!(e.events[0].code, Some(79));
        assert_eq!(
            e.events[0].explanation.as_ref().map(|x| x.name.as_str()),
            Some("GPU has fallen off the bus")
        );
        assert_eq!(e.events[1].explanation, None);
        let s: Health = serde_json::from_str("\"degraded\"").expect("parses");
        assert_eq!(s, Health::Unknown);
    }

    #[test]
    fn an_unknown_status_is_kept_as_unknown() {
        let s: NodeStatus = serde_json::from_str("\"draining\"").expect("parses");
        assert_eq!(s, NodeStatus::Unknown);
    }

    #[test]
    fn a_live_tick_flattens_the_gpu_sample() {
        let j = r#"{"node":"n1","time_ms":7,"gpus":[{"uuid":"GPU-1","gpu_uuid":"GPU-1",
            "util_gpu_pct":93,"power_mw":250000,"nvlinks":[]}],"host":null,"processes":[]}"#;
        let t: LiveTick = serde_json::from_str(j).expect("parses");
        assert_eq!(t.gpus[0].uuid, "GPU-1");
        assert_eq!(t.gpus[0].sample.util_gpu_pct, Some(93));
        assert_eq!(t.gpus[0].sample.mem_used_bytes, None);
    }
}
