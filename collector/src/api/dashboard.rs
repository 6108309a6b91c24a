//! The JSON endpoints behind the dashboard's node and GPU pages.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/fleet` | every node in brief: what the fleet page's tiles show (a fraction of `/api/v1/nodes`) |
//! | `GET /api/v1/nodes/{name}` | one node, as in `/api/v1/nodes` (GPUs with latest sample and processes) |
//! | `GET /api/v1/nodes/{name}/series?metric=&from=&to=&step=` | one GPU metric for every GPU of the node |
//! | `GET /api/v1/nodes/{name}/host/series?from=&to=&step=` | the node's host metrics (CPU, memory, disk, network) |
//! | `GET /api/v1/nodes/{name}/events?from=&to=` | the node's events (Xid, ECC, …), oldest first |
//! | `GET /api/v1/gpus/{uuid}` | one GPU, with its node's name and sampling interval |
//!
//! Parameters are those of `/api/v1/gpus/{uuid}/series`: times as RFC 3339, Unix ms or
//! `now-15m`; `from` defaults to 15 minutes before `to`; `step` averages per bucket
//! `[k*step, (k+1)*step)`. Absent values are `null`, never 0.

use crate::api::error::{AccessResponses, ApiError, ErrorResponses};
use crate::api::nodes::{GpuDetailView, NodeView, gpu_detail, node_view};
use crate::api::series::{
    MAX_SERIES_POINTS, Tier, gpu_points, parse_metric, series_window, tier_for, too_many_samples,
};
use crate::api::state::{AppState, Route};
use crate::live::state::LiveNode;
use crate::store::rollup::RollupKey;
use crate::store::{HostRow, NodeId, SeriesPoint, TimeRange};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use gpufleet_core::UnixMs;
use gpufleet_core::config::format_time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most host rows read to downsample one host series (about 2.3 days at 1 Hz).
pub const MAX_HOST_ROWS: usize = 200_000;
/// Most events one request returns.
pub const MAX_EVENTS: usize = 10_000;

/// The routes of this module (in [`crate::api::router::routes`]).
pub fn routes() -> Vec<Route> {
    vec![
        Route::get(
            "/api/v1/fleet",
            "every node in brief: what the fleet page's tiles show",
            fleet,
        ),
        Route::get(
            "/api/v1/nodes/{name}",
            "one node, as in `/api/v1/nodes`",
            node,
        ),
        Route::get(
            "/api/v1/nodes/{name}/series",
            "one GPU metric for every GPU of the node",
            node_series,
        ),
        Route::get(
            "/api/v1/nodes/{name}/host/series",
            "the node's host metrics (CPU, memory, disk, network)",
            host_series,
        ),
        Route::get(
            "/api/v1/nodes/{name}/events",
            "the node's events (Xid, ECC, …), oldest first",
            events,
        ),
        Route::get(
            "/api/v1/gpus/{uuid}",
            "one GPU, with its node's name and sampling interval",
            gpu,
        ),
    ]
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct RangeParams {
    /// The GPU metric (`util_gpu_pct`, `power_mw`, …); required by `series`, ignored
    /// elsewhere.
    #[param(example = "util_gpu_pct")]
    metric: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default 15 minutes before `to`.
    #[param(example = "now-10m")]
    from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    to: Option<String>,
    /// Bucket width (`10s`, `5m`, or ms); raw samples when absent.
    #[param(example = "10s")]
    step: Option<String>,
}

/// A parsed `from`/`to`/`step`.
#[derive(Debug, Clone, Copy)]
struct Window {
    range: TimeRange,
    step_ms: Option<i64>,
}

fn window(p: &RangeParams, now: UnixMs) -> Result<Window, ApiError> {
    let (range, step_ms) =
        series_window(p.from.as_deref(), p.to.as_deref(), p.step.as_deref(), now)?;
    Ok(Window { range, step_ms })
}

fn query(params: Result<Query<RangeParams>, QueryRejection>) -> Result<RangeParams, ApiError> {
    params
        .map(|Query(p)| p)
        .map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))
}

fn no_node(name: &str) -> ApiError {
    ApiError::NotFound(format!("no node named {name:?}; see /api/v1/nodes"))
}

// ------------------------------------------------------------------ fleet summary

// The fleet summary: the API's own types, shared with its clients.
pub use gpufleet_api::fleet::{
    FleetGpu, FleetGpuLatest, FleetHealth, FleetHost, FleetHostLatest, FleetNode, FleetReason,
};

/// A health state and, in brief, the reasons that make it (the informational ones left
/// out).
fn fleet_health(
    state: crate::health::HealthState,
    reasons: Vec<crate::health::HealthReason>,
) -> FleetHealth {
    FleetHealth {
        state,
        reasons: reasons
            .into_iter()
            .filter(|r| r.severity != crate::health::HealthState::Ok)
            .map(|r| FleetReason {
                code: r.code,
                severity: r.severity,
                summary: r.summary,
            })
            .collect(),
    }
}

fn fleet_node(n: &LiveNode, st: &AppState, now: UnixMs) -> FleetNode {
    let r = &n.record;
    let status = st.status.classify(r.last_seen_ms, now);
    let (health, gpu_health) = crate::health::judge_live_node(
        n,
        status,
        &st.status,
        &crate::health::HealthPolicy::default(),
        now,
    );
    FleetNode {
        name: r.name.clone(),
        status,
        connected: n.connections > 0,
        last_seen_ms: r.last_seen_ms,
        labels: r.labels.clone(),
        interval_ms: r.interval_ms,
        health: fleet_health(health.state, health.reasons),
        host: FleetHost {
            latest: n
                .host
                .as_ref()
                .map(|h| FleetHostLatest::of(h.time_ms, h.sample.as_ref())),
        },
        gpus: r
            .gpus
            .iter()
            .zip(gpu_health)
            .map(|(g, health)| FleetGpu {
                uuid: g.info.uuid.clone(),
                index: g.info.index,
                name: g.info.name.clone(),
                latest: n
                    .gpus
                    .get(&g.id)
                    .map(|l| FleetGpuLatest::of(l.time_ms, &l.sample)),
                health: fleet_health(health.state, health.reasons),
            })
            .collect(),
    }
}

/// Every node in brief, as the fleet page's tiles show them.
#[utoipa::path(get, path = "/api/v1/fleet", tag = "fleet", responses(
    (status = 200, description = "every node", body = Vec<FleetNode>), AccessResponses,
))]
async fn fleet(State(st): State<AppState>) -> Result<Response, ApiError> {
    let now = (st.clock)();
    let body = st.live.read(|s| {
        let nodes: Vec<FleetNode> = s.nodes.values().map(|n| fleet_node(n, &st, now)).collect();
        serde_json::to_vec(&nodes)
    });
    let body = body.map_err(|e| ApiError::Internal(format!("cannot encode the fleet: {e}")))?;
    Ok(json_bytes(body))
}

fn json_bytes(body: Vec<u8>) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

// ------------------------------------------------------------------ node detail

/// One node, as listed by `/api/v1/nodes`.
#[utoipa::path(get, path = "/api/v1/nodes/{name}", tag = "fleet",
    params(("name" = String, Path, description = "the node's name", example = "gpu-node-01")),
    responses((status = 200, description = "the node", body = NodeView), ErrorResponses, AccessResponses))]
async fn node(State(st): State<AppState>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let now = (st.clock)();
    let body = st.live.read(|s| {
        s.nodes
            .get(&name)
            .map(|n| serde_json::to_vec(&node_view(n, &st.status, now)))
    });
    let body = body
        .ok_or_else(|| no_node(&name))?
        .map_err(|e| ApiError::Internal(format!("cannot encode the node: {e}")))?;
    Ok(json_bytes(body))
}

/// One GPU (as in the node list) with its node's name, status and sampling interval.
#[utoipa::path(get, path = "/api/v1/gpus/{uuid}", tag = "fleet",
    params(("uuid" = String, Path, description = "the GPU's UUID")),
    responses((status = 200, description = "the GPU", body = GpuDetailView), ErrorResponses, AccessResponses))]
async fn gpu(State(st): State<AppState>, Path(uuid): Path<String>) -> Result<Response, ApiError> {
    let now = (st.clock)();
    let body = st.live.read(|s| {
        let (n, _) = s.find_gpu(&uuid)?;
        Some(serde_json::to_vec(&gpu_detail(n, &st.status, now, &uuid)?))
    });
    let body = body
        .ok_or_else(|| ApiError::NotFound(format!("no GPU with uuid {uuid:?}")))?
        .map_err(|e| ApiError::Internal(format!("cannot encode the GPU: {e}")))?;
    Ok(json_bytes(body))
}

// ------------------------------------------------------------------ per-node GPU series

#[derive(Serialize, utoipa::ToSchema)]
struct NodeSeriesView {
    node: String,
    metric: &'static str,
    unit: &'static str,
    from_ms: UnixMs,
    to_ms: UnixMs,
    step_ms: Option<i64>,
    /// `raw` or `rollup` (see `/api/v1/gpus/{uuid}/series`).
    tier: Tier,
    gpus: Vec<GpuPoints>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct GpuPoints {
    uuid: String,
    index: u32,
    /// `[time_ms, value]`; value `null` where the metric was absent.
    #[schema(value_type = Vec<Vec<Option<f64>>>)]
    points: Vec<SeriesPoint>,
}

/// One metric for every GPU of a node.
#[utoipa::path(get, path = "/api/v1/nodes/{name}/series", tag = "fleet",
    params(("name" = String, Path, description = "the node's name", example = "gpu-node-01"), RangeParams),
    responses((status = 200, description = "the series", body = NodeSeriesView), ErrorResponses, AccessResponses))]
async fn node_series(
    State(st): State<AppState>,
    Path(name): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = query(params)?;
    let metric = parse_metric(p.metric.as_deref())?;
    let w = window(&p, (st.clock)())?;
    let gpus = st
        .live
        .read(|s| {
            s.nodes.get(&name).map(|n| {
                n.record
                    .gpus
                    .iter()
                    .map(|g| (g.id, g.info.uuid.clone(), g.info.index))
                    .collect::<Vec<_>>()
            })
        })
        .ok_or_else(|| no_node(&name))?;
    // One tier for the whole node, so its GPUs' points line up.
    let keys: Vec<RollupKey> = gpus.iter().map(|g| RollupKey::gpu(g.0)).collect();
    let tier = tier_for(&st, &keys, w.range, w.step_ms).await?;
    let mut step_ms = w.step_ms;
    let mut out = Vec::with_capacity(gpus.len());
    for (id, uuid, index) in gpus {
        let (points, step) = gpu_points(&st, id, metric, w.range, w.step_ms, tier).await?;
        step_ms = step;
        out.push(GpuPoints {
            uuid,
            index,
            points,
        });
    }
    Ok(Json(NodeSeriesView {
        node: name,
        metric: metric.name(),
        unit: metric.unit(),
        from_ms: w.range.from_ms,
        to_ms: w.range.to_ms,
        step_ms: if tier == Tier::Rollup {
            step_ms.or(Some(crate::accounting::energy::MINUTE_MS))
        } else {
            w.step_ms
        },
        tier,
        gpus: out,
    })
    .into_response())
}

// ------------------------------------------------------------------ host series

/// One host point: a sample, or the average of a bucket's samples (a field is `null` when
/// no sample of the bucket had it).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct HostPoint {
    pub time_ms: UnixMs,
    pub cpu_util_pct: Option<f64>,
    pub mem_used_bytes: Option<f64>,
    pub mem_total_bytes: Option<f64>,
    pub disk_read_bps: Option<f64>,
    pub disk_write_bps: Option<f64>,
    pub net_rx_bps: Option<f64>,
    pub net_tx_bps: Option<f64>,
    pub load1: Option<f64>,
}

const HOST_FIELDS: usize = 8;

fn host_values(r: &HostRow) -> [Option<f64>; HOST_FIELDS] {
    let Some(h) = &r.sample else {
        return [None; HOST_FIELDS];
    };
    let f = |v: Option<u64>| v.map(|v| v as f64);
    [
        h.cpu_util_pct.map(f64::from),
        f(h.mem_used_bytes),
        f(h.mem_total_bytes),
        f(h.disk_read_bps),
        f(h.disk_write_bps),
        f(h.net_rx_bps),
        f(h.net_tx_bps),
        h.load1.map(f64::from),
    ]
}

fn host_point(time_ms: UnixMs, v: [Option<f64>; HOST_FIELDS]) -> HostPoint {
    HostPoint {
        time_ms,
        cpu_util_pct: v[0],
        mem_used_bytes: v[1],
        mem_total_bytes: v[2],
        disk_read_bps: v[3],
        disk_write_bps: v[4],
        net_rx_bps: v[5],
        net_tx_bps: v[6],
        load1: v[7],
    }
}

/// Host rows (oldest first) as points: every row without `step_ms`, else the average per
/// bucket `[k*step, (k+1)*step)` stamped with the bucket start, empty buckets omitted —
/// the same rule as the GPU series.
pub fn downsample_host(rows: &[HostRow], step_ms: Option<i64>) -> Vec<HostPoint> {
    // A row with only the sampler's cost (agents read host metrics every few seconds)
    // is no point of these series, not a gap.
    let rows = rows.iter().filter(|r| r.sample.is_some());
    let Some(step) = step_ms.map(|s| s.max(1)) else {
        return rows
            .map(|r| host_point(r.time_ms, host_values(r)))
            .collect();
    };
    let mut buckets: BTreeMap<i64, [(f64, u32); HOST_FIELDS]> = BTreeMap::new();
    for r in rows {
        let acc = buckets
            .entry(r.time_ms.div_euclid(step) * step)
            .or_insert([(0.0, 0); HOST_FIELDS]);
        for (a, v) in acc.iter_mut().zip(host_values(r)) {
            if let Some(v) = v {
                a.0 += v;
                a.1 += 1;
            }
        }
    }
    buckets
        .into_iter()
        .map(|(t, acc)| host_point(t, acc.map(|(s, n)| (n > 0).then(|| s / f64::from(n)))))
        .collect()
}

#[derive(Serialize, utoipa::ToSchema)]
struct HostSeriesView {
    node: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    step_ms: Option<i64>,
    /// `raw` or `rollup` (see `/api/v1/gpus/{uuid}/series`).
    tier: Tier,
    /// Units are in the field names (`_pct`, `_bytes`, `_bps`); `load1` is the load average.
    points: Vec<HostPoint>,
}

fn node_id(st: &AppState, name: &str) -> Result<NodeId, ApiError> {
    st.live
        .read(|s| s.nodes.get(name).map(|n| n.record.id))
        .ok_or_else(|| no_node(name))
}

/// The node's host metrics over time.
#[utoipa::path(get, path = "/api/v1/nodes/{name}/host/series", tag = "fleet",
    params(("name" = String, Path, description = "the node's name", example = "gpu-node-01"), RangeParams),
    responses((status = 200, description = "the series", body = HostSeriesView), ErrorResponses, AccessResponses))]
async fn host_series(
    State(st): State<AppState>,
    Path(name): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = query(params)?;
    let w = window(&p, (st.clock)())?;
    let id = node_id(&st, &name)?;
    if tier_for(&st, &[RollupKey::host(id)], w.range, w.step_ms).await? == Tier::Rollup {
        let step = w
            .step_ms
            .unwrap_or(0)
            .max(crate::accounting::energy::MINUTE_MS);
        let rows = st
            .store
            .host_rollup_series(id, w.range, step, MAX_SERIES_POINTS + 1)
            .await?;
        if rows.len() > MAX_SERIES_POINTS {
            return Err(too_many_samples(w.range));
        }
        let points = rows
            .into_iter()
            .map(|(t, v)| {
                let mut values = [None; HOST_FIELDS];
                for (slot, v) in values.iter_mut().zip(v) {
                    *slot = v;
                }
                host_point(t, values)
            })
            .collect();
        return Ok(Json(HostSeriesView {
            node: name,
            from_ms: w.range.from_ms,
            to_ms: w.range.to_ms,
            step_ms: Some(step),
            tier: Tier::Rollup,
            points,
        })
        .into_response());
    }
    let limit = if w.step_ms.is_some() {
        MAX_HOST_ROWS
    } else {
        MAX_SERIES_POINTS
    };
    let rows = st.store.host_samples(id, w.range, limit + 1).await?;
    if rows.len() > limit {
        return Err(if w.step_ms.is_some() {
            ApiError::BadRequest(format!(
                "the range holds more than {MAX_HOST_ROWS} host samples; ask for a shorter range"
            ))
        } else {
            too_many_samples(w.range)
        });
    }
    Ok(Json(HostSeriesView {
        node: name,
        from_ms: w.range.from_ms,
        to_ms: w.range.to_ms,
        step_ms: w.step_ms,
        tier: Tier::Raw,
        points: downsample_host(&rows, w.step_ms),
    })
    .into_response())
}

// ------------------------------------------------------------------ events

// The node's events: the API's own types, shared with its clients.
pub use gpufleet_api::events::{EventView, EventsView};

/// The node's events (Xid, ECC, GPU lost, …), oldest first.
#[utoipa::path(get, path = "/api/v1/nodes/{name}/events", tag = "fleet",
    params(("name" = String, Path, description = "the node's name", example = "gpu-node-01"), RangeParams),
    responses((status = 200, description = "the events", body = EventsView), ErrorResponses, AccessResponses))]
async fn events(
    State(st): State<AppState>,
    Path(name): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = query(params)?;
    let w = window(&p, (st.clock)())?;
    let id = node_id(&st, &name)?;
    let events = st.store.events(id, w.range, MAX_EVENTS).await?;
    let truncated = events.len() >= MAX_EVENTS;
    let events: Vec<EventView> = events
        .into_iter()
        .map(|event| EventView {
            time: format_time(event.time_ms),
            explanation: (event.kind == gpufleet_core::EventKind::Xid)
                .then_some(event.code)
                .flatten()
                .map(crate::health::xid::explain),
            event,
        })
        .collect();
    Ok(Json(EventsView {
        node: name,
        from_ms: w.range.from_ms,
        to_ms: w.range.to_ms,
        truncated,
        events,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::HostSample;

    fn row(t: i64, cpu: Option<f32>, rx: Option<u64>) -> HostRow {
        HostRow {
            time_ms: t,
            sample: Some(HostSample {
                cpu_util_pct: cpu,
                net_rx_bps: rx,
                ..Default::default()
            }),
            cost: None,
        }
    }

    #[test]
    fn host_buckets_average_present_values_only() {
        let rows = [
            row(-500, Some(10.0), None),
            row(0, Some(20.0), Some(100)),
            row(999, Some(40.0), None),
            row(1000, None, None),
            row(3500, Some(5.0), Some(7)),
        ];
        let pts = downsample_host(&rows, Some(1000));
        let got: Vec<_> = pts
            .iter()
            .map(|p| (p.time_ms, p.cpu_util_pct, p.net_rx_bps))
            .collect();
        assert_eq!(
            got,
            vec![
                (-1000, Some(10.0), None),
                (0, Some(30.0), Some(100.0)),
                (1000, None, None),
                (3000, Some(5.0), Some(7.0)),
            ]
        );
        assert_eq!(pts[1].mem_used_bytes, None, "absent is not zero");
        let raw = downsample_host(&rows, None);
        assert_eq!(raw.len(), rows.len());
        assert_eq!(raw[2].cpu_util_pct, Some(40.0));
    }

    #[test]
    fn rows_with_only_a_cost_are_no_points() {
        let cost_only = |t| HostRow {
            time_ms: t,
            sample: None,
            cost: Some(Default::default()),
        };
        let rows = [row(0, Some(20.0), None), cost_only(100), cost_only(1100)];
        let times = |step| -> Vec<i64> {
            downsample_host(&rows, step)
                .iter()
                .map(|p| p.time_ms)
                .collect()
        };
        assert_eq!(times(None), [0]);
        assert_eq!(times(Some(1000)), [0], "no empty bucket at 1000");
    }
}
