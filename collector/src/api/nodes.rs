//! `GET /api/v1/nodes`: every node with status, delivery state, host and GPUs; the node
//! and GPU views the dashboard's detail endpoints reuse.

use crate::api::error::{AccessResponses, ApiError};
use crate::api::state::AppState;
use crate::health::HealthPolicy;
use crate::live::state::{LiveGpu, LiveNode};
use crate::live::status::{NodeStatus, StatusPolicy};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gpufleet_core::config::format_time;
use gpufleet_core::{GpuHealthSample, UnixMs};
use serde::Serialize;

// The node view, its host and its GPUs: the API's own types, shared with its clients.
pub use gpufleet_api::nodes::{
    GpuLatestView, GpuView, HostLatestView, HostView, NodeView, SpoolView,
};

pub(crate) fn node_view(n: &LiveNode, policy: &StatusPolicy, now_ms: UnixMs) -> NodeView {
    let r = &n.record;
    let status = policy.classify(r.last_seen_ms, now_ms);
    let (health, gpu_health) =
        crate::health::judge_live_node(n, status, policy, &HealthPolicy::default(), now_ms);
    NodeView {
        name: r.name.clone(),
        status,
        connected: n.connections > 0,
        last_seen: r.last_seen_ms.map(format_time),
        last_seen_ms: r.last_seen_ms,
        labels: r.labels.clone(),
        agent_version: r.agent_version.clone(),
        boot_id: r.boot_id.clone(),
        source: r.source.clone(),
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
            hostname: r.host.hostname.clone(),
            kernel: r.host.kernel.clone(),
            os: r.host.os.clone(),
            cpu_count: r.host.cpu_count,
            memory_total_bytes: r.host.memory_total_bytes,
            driver_version: r.driver_version.clone(),
            cuda_driver_version: r.cuda_driver_version.clone(),
            nvml_version: r.nvml_version.clone(),
            latest: n.host.as_ref().map(|h| HostLatestView {
                time: format_time(h.time_ms),
                time_ms: h.time_ms,
                sample: h.sample.clone().unwrap_or_default(),
                sampler_cost: h.cost.clone(),
            }),
        },
        gpus: r
            .gpus
            .iter()
            .zip(gpu_health)
            .map(|(g, health)| {
                let latest: Option<&LiveGpu> = n.gpus.get(&g.id);
                GpuView {
                    uuid: g.info.uuid.clone(),
                    index: g.info.index,
                    name: g.info.name.clone(),
                    inventory: g.info.clone(),
                    latest: latest.map(|l| GpuLatestView {
                        time: format_time(l.time_ms),
                        time_ms: l.time_ms,
                        sample: l.sample.clone(),
                    }),
                    processes: latest.map_or_else(Vec::new, |l| l.processes.clone()),
                    health,
                    throttle: latest.and_then(|l| l.sample.throttle_reasons).map(|mask| {
                        crate::health::decode_throttle(mask)
                            .into_iter()
                            .map(str::to_owned)
                            .collect()
                    }),
                }
            })
            .collect(),
    }
}

/// One GPU as in the node list, with its node's name, status and sampling interval.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct GpuDetailView<'a> {
    #[serde(flatten)]
    gpu: GpuView,
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
        node: &n.record.name,
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
    // Build the (owned) views under the read lock, encode after it: encoding a large fleet
    // takes tens of ms, and commits (which take the write lock) must not wait for it.
    let views: Vec<NodeView> = st.live.read(|s| {
        s.nodes
            .values()
            .map(|n| node_view(n, &st.status, now))
            .collect()
    });
    let body = serde_json::to_vec(&views)
        .map_err(|e| ApiError::Internal(format!("cannot encode the node list: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
