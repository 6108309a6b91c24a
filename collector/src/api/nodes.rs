//! `GET /api/v1/nodes`: every node with status, delivery state, host and GPUs; the node
//! and GPU views the dashboard's detail endpoints reuse.

use crate::api::error::{AccessResponses, ApiError};
use crate::api::router::AppState;
use crate::health::{GpuHealth, HealthPolicy, NodeHealth};
use crate::live::state::{LiveGpu, LiveNode};
use crate::live::status::{NodeStatus, StatusPolicy};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gpufleet_core::config::format_time;
use gpufleet_core::{
    GpuHealthSample, GpuInfo, GpuSample, HostSample, ProcessSample, SamplerCost, UnixMs,
};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct NodeView<'a> {
    name: &'a str,
    status: NodeStatus,
    /// Whether an ingest stream from the node to this collector is open now (with several
    /// collectors, a node streaming to another one is `false` and still `online`).
    connected: bool,
    last_seen: Option<String>,
    last_seen_ms: Option<UnixMs>,
    labels: &'a BTreeMap<String, String>,
    agent_version: &'a str,
    boot_id: &'a str,
    source: &'a str,
    interval_ms: u32,
    last_acked_seq: u64,
    dropped_samples: u64,
    spool_backlog: SpoolView,
    rejected_batches: u64,
    stored_samples: u64,
    /// The node's health: its worst GPU, critical when offline, warning when stale
    /// (`reasons` holds the node's own; each GPU carries its own).
    health: NodeHealth,
    host: HostView<'a>,
    gpus: Vec<GpuView<'a>>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SpoolView {
    batches: u64,
    bytes: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct HostView<'a> {
    hostname: &'a str,
    kernel: Option<&'a str>,
    os: Option<&'a str>,
    cpu_count: Option<u32>,
    memory_total_bytes: Option<u64>,
    driver_version: Option<&'a str>,
    cuda_driver_version: Option<&'a str>,
    nvml_version: Option<&'a str>,
    latest: Option<HostLatestView<'a>>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct HostLatestView<'a> {
    time: String,
    time_ms: UnixMs,
    #[serde(flatten)]
    sample: HostSample,
    /// What sampling that tick cost the agent.
    sampler_cost: Option<&'a SamplerCost>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct GpuView<'a> {
    uuid: &'a str,
    index: u32,
    name: &'a str,
    inventory: &'a GpuInfo,
    latest: Option<GpuLatestView<'a>>,
    /// Processes seen on the GPU in the latest sample's tick.
    processes: &'a [ProcessSample],
    /// The GPU's health (ok / warning / critical) and the reasons, worst first.
    health: GpuHealth,
    /// The latest sample's clock-event (throttle) reasons by name (`sw_power_cap`,
    /// `hw_thermal`, …); absent when the sample has no mask.
    throttle: Option<Vec<&'static str>>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct GpuLatestView<'a> {
    time: String,
    time_ms: UnixMs,
    #[serde(flatten)]
    sample: &'a GpuSample,
}

pub(crate) fn node_view<'a>(
    n: &'a LiveNode,
    policy: &StatusPolicy,
    now_ms: UnixMs,
) -> NodeView<'a> {
    let r = &n.record;
    let status = policy.classify(r.last_seen_ms, now_ms);
    let (health, gpu_health) =
        crate::health::judge_live_node(n, status, policy, &HealthPolicy::default(), now_ms);
    NodeView {
        name: &r.name,
        status,
        connected: n.connections > 0,
        last_seen: r.last_seen_ms.map(format_time),
        last_seen_ms: r.last_seen_ms,
        labels: &r.labels,
        agent_version: &r.agent_version,
        boot_id: &r.boot_id,
        source: &r.source,
        interval_ms: r.interval_ms,
        last_acked_seq: r.last_acked_seq,
        dropped_samples: r.delivery.dropped_samples,
        spool_backlog: SpoolView {
            batches: r.delivery.spool_backlog_batches,
            bytes: r.delivery.spool_backlog_bytes,
        },
        rejected_batches: n.rejected_batches,
        stored_samples: r.stored_samples,
        health,
        host: HostView {
            hostname: &r.host.hostname,
            kernel: r.host.kernel.as_deref(),
            os: r.host.os.as_deref(),
            cpu_count: r.host.cpu_count,
            memory_total_bytes: r.host.memory_total_bytes,
            driver_version: r.driver_version.as_deref(),
            cuda_driver_version: r.cuda_driver_version.as_deref(),
            nvml_version: r.nvml_version.as_deref(),
            latest: n.host.as_ref().map(|h| HostLatestView {
                time: format_time(h.time_ms),
                time_ms: h.time_ms,
                sample: h.sample.clone().unwrap_or_default(),
                sampler_cost: h.cost.as_ref(),
            }),
        },
        gpus: r
            .gpus
            .iter()
            .zip(gpu_health)
            .map(|(g, health)| {
                let latest: Option<&LiveGpu> = n.gpus.get(&g.id);
                GpuView {
                    uuid: &g.info.uuid,
                    index: g.info.index,
                    name: &g.info.name,
                    inventory: &g.info,
                    latest: latest.map(|l| GpuLatestView {
                        time: format_time(l.time_ms),
                        time_ms: l.time_ms,
                        sample: &l.sample,
                    }),
                    processes: latest.map_or(&[], |l| &l.processes),
                    health,
                    throttle: latest
                        .and_then(|l| l.sample.throttle_reasons)
                        .map(crate::health::decode_throttle),
                }
            })
            .collect(),
    }
}

/// One GPU as in the node list, with its node's name, status and sampling interval.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct GpuDetailView<'a> {
    #[serde(flatten)]
    gpu: GpuView<'a>,
    node: &'a str,
    node_status: NodeStatus,
    interval_ms: u32,
    /// The GPU's last health counters as the agent read them (every health interval, and
    /// after an Xid / ECC / GPU-lost event); `null` before the first. Each counter is
    /// `null` where the GPU does not support it. (`health` is the judged state.)
    health_counters: Option<GpuHealthView<'a>>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct GpuHealthView<'a> {
    /// When the agent read them (the tick's time).
    time: String,
    time_ms: UnixMs,
    #[serde(flatten)]
    sample: &'a GpuHealthSample,
}

/// The GPU `uuid` of node `n`, if it has one.
pub(crate) fn gpu_detail<'a>(
    n: &'a LiveNode,
    policy: &StatusPolicy,
    now_ms: UnixMs,
    uuid: &str,
) -> Option<GpuDetailView<'a>> {
    let node = node_view(n, policy, now_ms);
    let gpu = node.gpus.into_iter().find(|g| g.uuid == uuid)?;
    let id = n.record.gpus.iter().find(|g| g.info.uuid == uuid)?.id;
    let health = n.gpus.get(&id).and_then(|l| l.health.as_ref());
    Some(GpuDetailView {
        gpu,
        node: node.name,
        node_status: node.status,
        interval_ms: node.interval_ms,
        health_counters: health.map(|h| GpuHealthView {
            time: format_time(h.time_ms),
            time_ms: h.time_ms,
            sample: &h.sample,
        }),
    })
}

/// Every node with status, delivery state, host, GPUs with inventory and latest sample.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "fleet", responses(
    (status = 200, description = "every node", body = Vec<NodeView>), AccessResponses,
))]
pub(crate) async fn nodes(State(st): State<AppState>) -> Result<Response, ApiError> {
    let now = (st.clock)();
    // Copy under the read lock, encode after it: encoding a large fleet takes tens of ms,
    // and commits (which take the write lock) must not wait for it.
    let nodes: Vec<LiveNode> = st.live.read(|s| s.nodes.values().cloned().collect());
    let views: Vec<NodeView<'_>> = nodes
        .iter()
        .map(|n| node_view(n, &st.status, now))
        .collect();
    let body = serde_json::to_vec(&views)
        .map_err(|e| ApiError::Internal(format!("cannot encode the node list: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
