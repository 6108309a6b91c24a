//! Fleet health: which GPUs and nodes are not ok, why, and what to do; and the Xid
//! catalogue.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/health/gpus?state=warning` | every GPU (and node) at least that bad (`ok`, `warning` default, `critical`), worst first |
//! | `GET /api/v1/health/xid/{code}` | the catalogue entry of one Xid code (a generic entry for an unlisted code) |
//!
//! (`GET /api/v1/health` is the collector's own liveness, [`crate::api::health`].)

use crate::api::error::{AccessResponses, ApiError, ErrorResponses};
use crate::api::state::{AppState, Route};
use crate::health::xid::{self, XidInfo};
use crate::health::{FleetGpuHealth, HealthPolicy, HealthState, NodeHealth};
use crate::live::status::NodeStatus;
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use gpufleet_core::UnixMs;
use serde::{Deserialize, Serialize};

/// The routes of this module (in [`crate::api::router::routes`]).
pub fn routes() -> Vec<Route> {
    vec![
        Route::get(
            "/api/v1/health/gpus",
            "every GPU (and node) at least as bad as `state` (default `warning`), worst first",
            gpus,
        ),
        Route::get(
            "/api/v1/health/xid/{code}",
            "the catalogue entry of one Xid code",
            xid_entry,
        ),
    ]
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct HealthParams {
    /// The least bad state listed: `ok` (everything), `warning` (default) or `critical`.
    #[param(example = "warning")]
    state: Option<String>,
}

/// One node's health.
#[derive(Serialize, utoipa::ToSchema)]
struct NodeHealthView {
    node: String,
    status: NodeStatus,
    #[serde(flatten)]
    health: NodeHealth,
}

/// How many GPUs are in each state.
#[derive(Serialize, utoipa::ToSchema, Default)]
struct Counts {
    ok: usize,
    warning: usize,
    critical: usize,
}

#[derive(Serialize, utoipa::ToSchema)]
struct FleetHealthView {
    time_ms: UnixMs,
    /// The least bad state listed.
    min_state: HealthState,
    /// GPUs in each state, the whole fleet.
    gpus_by_state: Counts,
    /// GPUs at least `min_state`, worst first, then by node and index.
    gpus: Vec<FleetGpuHealth>,
    /// Nodes at least `min_state` (their own reasons: offline, stale), worst first.
    nodes: Vec<NodeHealthView>,
}

/// GPUs and nodes that are not ok (or at least `state`), with reasons and actions.
#[utoipa::path(get, path = "/api/v1/health/gpus", tag = "health", params(HealthParams),
    responses((status = 200, description = "the GPUs and nodes at least that bad", body = FleetHealthView),
        ErrorResponses, AccessResponses))]
async fn gpus(
    State(st): State<AppState>,
    params: Result<Query<HealthParams>, QueryRejection>,
) -> Result<Json<FleetHealthView>, ApiError> {
    let p = params
        .map(|Query(p)| p)
        .map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let min = match p.state.as_deref() {
        None => HealthState::Warning,
        Some(s) => HealthState::parse(s).ok_or_else(|| {
            ApiError::BadRequest(format!("state={s:?}: expected ok, warning or critical"))
        })?,
    };
    let now = (st.clock)();
    let policy = HealthPolicy::default();
    let (all, mut nodes) = st.live.read(|s| {
        let gpus = crate::health::fleet_health(s, &st.status, &policy, now);
        let nodes: Vec<NodeHealthView> = s
            .nodes
            .values()
            .filter_map(|n| {
                let status = st.status.classify(n.record.last_seen_ms, now);
                let (health, _) =
                    crate::health::judge_live_node(n, status, &st.status, &policy, now);
                (health.state >= min).then(|| NodeHealthView {
                    node: n.record.name.clone(),
                    status,
                    health,
                })
            })
            .collect();
        (gpus, nodes)
    });
    let mut counts = Counts::default();
    for g in &all {
        match g.health.state {
            HealthState::Ok => counts.ok += 1,
            HealthState::Warning => counts.warning += 1,
            HealthState::Critical => counts.critical += 1,
        }
    }
    let mut gpus: Vec<FleetGpuHealth> = all.into_iter().filter(|g| g.health.state >= min).collect();
    // Stable sorts: nodes come by name and GPUs by index already.
    gpus.sort_by_key(|g| std::cmp::Reverse(g.health.state));
    nodes.sort_by_key(|n| std::cmp::Reverse(n.health.state));
    Ok(Json(FleetHealthView {
        time_ms: now,
        min_state: min,
        gpus_by_state: counts,
        gpus,
        nodes,
    }))
}

/// What an Xid code means, its likely cause, what to do and how bad it is.
#[utoipa::path(get, path = "/api/v1/health/xid/{code}", tag = "health",
    params(("code" = u64, Path, description = "the Xid code", example = 79)),
    responses((status = 200, description = "the catalogue entry (`known: false`: the generic one)", body = XidInfo),
        ErrorResponses, AccessResponses))]
async fn xid_entry(code: Result<Path<u64>, PathRejection>) -> Result<Json<XidInfo>, ApiError> {
    let Path(code) = code.map_err(|e| {
        ApiError::BadRequest(format!("bad Xid code (expected a number such as 79): {e}"))
    })?;
    Ok(Json(xid::explain(code)))
}
