//! The HTTP API (axum): `/api/v1/*`, `/metrics` and the dashboard at `/`.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/health` | `{"status": "ok", "version", "db", "nodes", "warnings"}` (`warnings`: exposure warnings, [`crate::net::exposure`]); 503 when the database does not answer |
//! | `GET /api/v1/nodes` | every node with status, delivery state, host, GPUs with inventory and latest sample |
//! | `GET /api/v1/gpus/{uuid}/series?metric=&from=&to=&step=` | one metric of one GPU over time |
//! | `GET /metrics` | Prometheus text exposition |
//! | `GET /`, `/node/{name}`, `/gpu/{uuid}`, `/assets/*` | the dashboard ([`crate::api::assets`]) |
//! | `GET /api/v1/live` | live updates, Server-Sent Events ([`crate::api::live`]) |
//! | `GET /api/v1/nodes/{name}[/series, /host/series, /events]`, `/api/v1/gpus/{uuid}` | [`crate::api::dashboard`] |
//! | `GET /api/v1/openapi.json` | the OpenAPI description of `/api/v1/*` ([`crate::api::openapi`]) |
//!
//! Timestamps in responses are RFC 3339 UTC (`last_seen`, `time`, `from`) with a Unix-ms
//! twin (`last_seen_ms`, `time_ms`, `from_ms`). Parameters accept RFC 3339, Unix ms,
//! `now` or `now-15m`. Absent metrics are `null`, never 0. Errors are
//! `{"error": "what went wrong and what to do"}` and never carry database details.

use crate::net::exposure::ExposureWarnings;
use crate::live::state::{Live, LiveGpu, LiveNode};
use crate::metrics::Metrics;
use crate::live::status::{Clock, NodeStatus, StatusPolicy};
use crate::store::rollup::RollupKey;
use crate::store::{GpuMetric, SeriesPoint, Store, StoreError, TimeRange};
use crate::ingest::writer::WriterHandle;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gpufleet_core::config::{format_time, parse_duration, parse_time};
use gpufleet_core::{GpuInfo, GpuSample, HostSample, ProcessSample, SamplerCost, UnixMs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::error;

/// Most points a series request may return.
pub const MAX_SERIES_POINTS: usize = 10_000;
/// The range a series covers when `from` is not given.
const DEFAULT_SERIES_RANGE_MS: i64 = 15 * 60 * 1000;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub live: Arc<Live>,
    pub metrics: Arc<Metrics>,
    /// For the writer's queue depth on `/metrics`; `None` when no writer runs (tests).
    pub writer: Option<WriterHandle>,
    pub status: StatusPolicy,
    /// "Now" for statuses and relative times; injected so tests can fix it.
    pub clock: Clock,
}

/// The router. Tests call it without a socket: `app(state).oneshot(request)`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/api/v1/nodes", get(nodes))
        .route("/api/v1/gpus/{uuid}/series", get(series))
        .route("/metrics", get(metrics))
        // The dashboard: pages and assets, its live stream, node/GPU detail API.
        .merge(crate::api::assets::routes())
        .route("/api/v1/live", get(crate::api::live::live))
        .merge(crate::api::dashboard::routes())
        // Energy per container / pod / job / user, per GPU, fleet totals.
        .merge(crate::api::energy::routes())
        // Carbon intensity per region with forecast and the lowest window.
        .merge(crate::api::carbon::routes())
        // Reports per container / pod / job / node, and their plot.
        .merge(crate::api::reports::routes())
        // The OpenAPI description of all of the above.
        .merge(crate::api::openapi::routes())
        .fallback(not_found)
        .with_state(state)
}

// ------------------------------------------------------------------ errors

/// The body of every error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong and what to do; never database details.
    error: String,
}

/// Why a request failed, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// A bug on our side; the message is safe to show.
    #[error("{0}")]
    Internal(String),
    /// Logged in full; the client only learns that storage failed.
    #[error("storage error: {0}")]
    Store(#[from] StoreError),
}

/// The error answers of routes that take parameters, for the OpenAPI description.
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "never built: only its derived OpenAPI responses are used"
)]
pub(crate) enum ErrorResponses {
    /// A bad parameter; the message names it.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No such node, GPU, workload or data.
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The database does not answer now; try again.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The answers of the layers in front of every route, for the OpenAPI description:
/// [`crate::auth::web`] (a credential is needed off loopback) and [`crate::net::rate_limit`].
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "never built: only its derived OpenAPI responses are used"
)]
pub(crate) enum AccessResponses {
    /// No valid credential where one is needed.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// Too many requests from this address; see `Retry-After`.
    #[response(status = 429)]
    TooManyRequests(ErrorBody),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Internal(m) => {
                error!(error = %m, "request failed");
                (StatusCode::INTERNAL_SERVER_ERROR, m)
            }
            ApiError::Store(e) => {
                error!(error = %e, "request failed in the store");
                let status = if e.is_transient() {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                (status, "storage error; see the collector's log".to_owned())
            }
        };
        (status, Json(ErrorBody { error: message })).into_response()
    }
}

/// A time query parameter (`from`, `to`, …): `None` when absent, else parsed by
/// [`parse_time`] (range-checked, so callers may add and subtract days without overflow),
/// or a 400 that names the parameter.
pub(crate) fn time_param(
    name: &str,
    value: Option<&str>,
    now: UnixMs,
) -> Result<Option<UnixMs>, ApiError> {
    value
        .map(|v| parse_time(v, now))
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("{name}: {e}")))
}

async fn not_found() -> ApiError {
    ApiError::NotFound(
        "no such endpoint; see /api/v1/openapi.json for the API, and /metrics".into(),
    )
}

// ------------------------------------------------------------------ health

/// What `/api/v1/health` answers.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct HealthView<'a> {
    /// `ok`, or `error` (with status 503) when the database does not answer.
    status: &'static str,
    version: &'static str,
    /// The store's backend: `sqlite` or `postgres`.
    db: &'static str,
    /// Nodes known to this collector.
    nodes: usize,
    /// Exposure warnings (plaintext or unauthenticated listeners off loopback); empty when
    /// locked down.
    warnings: &'a [String],
    /// Why the status is `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

/// Liveness and the database's state.
#[utoipa::path(get, path = "/api/v1/health", tag = "fleet", responses(
    (status = 200, description = "the collector and its database answer", body = HealthView),
    (status = 503, description = "the database does not answer", body = HealthView),
    AccessResponses,
))]
async fn health(
    State(st): State<AppState>,
    warnings: Option<Extension<ExposureWarnings>>,
) -> Response {
    let warnings = warnings.map(|Extension(w)| w).unwrap_or_default();
    let mut view = HealthView {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        db: st.store.backend(),
        nodes: st.live.read(|s| s.nodes.len()),
        warnings: warnings.0.as_slice(),
        error: None,
    };
    match st.store.ping().await {
        Ok(()) => Json(view).into_response(),
        Err(e) => {
            error!(error = %e, "health check: the database does not answer");
            view.status = "error";
            view.error = Some("the database does not answer; see the collector's log");
            (StatusCode::SERVICE_UNAVAILABLE, Json(view)).into_response()
        }
    }
}

// ------------------------------------------------------------------ nodes

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
    NodeView {
        name: &r.name,
        status: policy.classify(r.last_seen_ms, now_ms),
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
            .map(|g| {
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
    Some(GpuDetailView {
        gpu,
        node: node.name,
        node_status: node.status,
        interval_ms: node.interval_ms,
    })
}

/// Every node with status, delivery state, host, GPUs with inventory and latest sample.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "fleet", responses(
    (status = 200, description = "every node", body = Vec<NodeView>), AccessResponses,
))]
async fn nodes(State(st): State<AppState>) -> Result<Response, ApiError> {
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

// ------------------------------------------------------------------ series

/// Query parameters of the series endpoint (all optional at parse time, so a missing one
/// gets an error that says what to send).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SeriesParams {
    /// The metric (`util_gpu_pct`, `power_mw`, …).
    #[param(required = true, example = "power_mw")]
    pub(crate) metric: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default 15 minutes before `to`.
    #[param(example = "now-10m")]
    pub(crate) from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    pub(crate) to: Option<String>,
    /// Bucket width (`10s`, `5m`, or ms); raw samples when absent.
    #[param(example = "10s")]
    pub(crate) step: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct SeriesView<'a> {
    uuid: &'a str,
    metric: &'static str,
    unit: &'static str,
    from: String,
    to: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    /// Bucket width when downsampled; `null` for raw samples.
    step_ms: Option<i64>,
    /// Which data answered: `raw` samples or per-minute `rollup`s.
    tier: Tier,
    /// `[time_ms, value]`; value `null` where the metric was absent.
    #[schema(value_type = Vec<Vec<Option<f64>>>)]
    points: Vec<SeriesPoint>,
}

/// The data a series came from: raw samples, or per-minute rollups (used when the step is
/// at least a minute or the range starts before the raw horizon; their buckets hold whole
/// minutes, and the newest, still open minute is not in them yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Tier {
    Raw,
    Rollup,
}

/// One GPU metric over `range` from the tier `tier`: the points and the step they have
/// (a rollup step is at least a minute).
pub(crate) async fn gpu_points(
    st: &AppState,
    gpu: crate::store::GpuId,
    metric: GpuMetric,
    range: TimeRange,
    step_ms: Option<i64>,
    tier: Tier,
) -> Result<(Vec<SeriesPoint>, Option<i64>), ApiError> {
    let limit = MAX_SERIES_POINTS + 1;
    let (points, step_ms) = match tier {
        Tier::Raw => (
            st.store
                .gpu_series(gpu, metric, range, step_ms, limit)
                .await?,
            step_ms,
        ),
        Tier::Rollup => {
            let step = step_ms.unwrap_or(0).max(crate::accounting::energy::MINUTE_MS);
            let points = st
                .store
                .gpu_rollup_series(gpu, metric, range, step, limit)
                .await?;
            (points, Some(step))
        }
    };
    if points.len() > MAX_SERIES_POINTS {
        return Err(too_many_samples(range));
    }
    Ok((points, step_ms))
}

/// The tier for a request: rollups when the step is at least a minute or the range starts
/// before the raw horizon of any of `keys`.
pub(crate) async fn tier_for(
    st: &AppState,
    keys: &[crate::store::rollup::RollupKey],
    range: TimeRange,
    step_ms: Option<i64>,
) -> Result<Tier, ApiError> {
    let horizons = st.store.raw_horizons().await?;
    let horizon = keys.iter().filter_map(|k| horizons.get(k).copied()).max();
    Ok(
        if crate::accounting::rollups::use_rollups(step_ms, range.from_ms, horizon) {
            Tier::Rollup
        } else {
            Tier::Raw
        },
    )
}

fn valid_metrics() -> String {
    GpuMetric::ALL.map(GpuMetric::name).join(", ")
}

/// Parses `step`: a duration (`10s`, `500ms`, `5m`) or a number of milliseconds.
fn parse_step(s: &str) -> Result<i64, String> {
    let ms = match s.trim().parse::<i64>() {
        Ok(ms) => ms,
        Err(_) => i64::try_from(parse_duration(s)?.as_millis()).unwrap_or(i64::MAX),
    };
    if ms <= 0 {
        return Err(format!("step {s:?} must be positive (e.g. 10s or 10000)"));
    }
    Ok(ms)
}

/// A step (in whole seconds, at least 1 s) that keeps `range_ms` within the point limit.
fn suggested_step_s(range_ms: i64) -> i64 {
    let per_point = range_ms / MAX_SERIES_POINTS as i64 + 1;
    (per_point + 999) / 1000
}

/// The `metric` parameter of a series request.
pub(crate) fn parse_metric(metric: Option<&str>) -> Result<GpuMetric, ApiError> {
    match metric {
        None | Some("") => Err(ApiError::BadRequest(format!(
            "metric is required; valid metrics: {}",
            valid_metrics()
        ))),
        Some(m) => GpuMetric::parse(m).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unknown metric {m:?}; valid metrics: {}",
                valid_metrics()
            ))
        }),
    }
}

/// The `from`, `to` and `step` parameters of a series request: `to` defaults to now,
/// `from` to 15 minutes before `to`; at most [`MAX_SERIES_POINTS`] buckets.
pub(crate) fn series_window(
    from: Option<&str>,
    to: Option<&str>,
    step: Option<&str>,
    now: UnixMs,
) -> Result<(TimeRange, Option<i64>), ApiError> {
    let to = time_param("to", to, now)?.unwrap_or(now);
    let from = time_param("from", from, now)?.unwrap_or(to - DEFAULT_SERIES_RANGE_MS);
    if from > to {
        return Err(ApiError::BadRequest(format!(
            "from ({}) is after to ({})",
            format_time(from),
            format_time(to)
        )));
    }
    let step_ms = step
        .map(parse_step)
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("step: {e}")))?;
    if let Some(step) = step_ms {
        let buckets = (to.div_euclid(step) - from.div_euclid(step)).saturating_add(1);
        if buckets > MAX_SERIES_POINTS as i64 {
            return Err(ApiError::BadRequest(format!(
                "from..to with step {step} ms spans {buckets} buckets, more than the limit of \
                 {MAX_SERIES_POINTS}; use step={}s or larger, or a shorter range",
                suggested_step_s(to - from)
            )));
        }
    }
    let range = TimeRange {
        from_ms: from,
        to_ms: to,
    };
    Ok((range, step_ms))
}

/// A raw series over the point limit: ask for a step.
pub(crate) fn too_many_samples(range: TimeRange) -> ApiError {
    ApiError::BadRequest(format!(
        "the range holds more than {MAX_SERIES_POINTS} samples; pass step (e.g. step={}s) \
         to downsample, or a shorter range",
        suggested_step_s(range.to_ms - range.from_ms)
    ))
}

/// One metric of one GPU over time.
#[utoipa::path(get, path = "/api/v1/gpus/{uuid}/series", tag = "fleet",
    params(("uuid" = String, Path, description = "the GPU's UUID"), SeriesParams),
    responses((status = 200, description = "the series", body = SeriesView), ErrorResponses, AccessResponses))]
async fn series(
    State(st): State<AppState>,
    Path(uuid): Path<String>,
    params: Result<Query<SeriesParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let now = (st.clock)();
    let metric = parse_metric(p.metric.as_deref())?;
    let (range, step_ms) =
        series_window(p.from.as_deref(), p.to.as_deref(), p.step.as_deref(), now)?;
    let (from, to) = (range.from_ms, range.to_ms);
    let gpu = st
        .live
        .read(|s| s.find_gpu(&uuid).map(|(_, id)| id))
        .ok_or_else(|| ApiError::NotFound(format!("no GPU with uuid {uuid:?}")))?;
    let tier = tier_for(&st, &[RollupKey::gpu(gpu)], range, step_ms).await?;
    let (points, step_ms) = gpu_points(&st, gpu, metric, range, step_ms, tier).await?;
    Ok(Json(SeriesView {
        uuid: &uuid,
        metric: metric.name(),
        unit: metric.unit(),
        from: format_time(from),
        to: format_time(to),
        from_ms: from,
        to_ms: to,
        step_ms,
        tier,
        points,
    })
    .into_response())
}

// ------------------------------------------------------------------ metrics

async fn metrics(State(st): State<AppState>) -> Response {
    let now = (st.clock)();
    let queued = st.writer.as_ref().map_or(0, WriterHandle::queued);
    let body = st
        .live
        .read(|s| crate::api::prometheus::render(s, &st.metrics, &st.status, now, queued));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_as_durations_or_ms() {
        assert_eq!(parse_step("10s"), Ok(10_000));
        assert_eq!(parse_step("250"), Ok(250));
        assert!(parse_step("0").is_err());
        assert!(parse_step("-5").is_err());
        assert!(parse_step("fast").is_err());
        assert_eq!(suggested_step_s(15 * 60 * 1000), 1);
        assert_eq!(suggested_step_s(7 * 86_400_000), 61);
    }
}
