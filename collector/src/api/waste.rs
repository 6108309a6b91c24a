//! The waste API: idle-but-allocated episodes ([`crate::accounting::waste`]).
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/waste?from=&to=&min_idle=&threshold=&node=` | episodes and totals per workload |
//!
//! `from` / `to` as the energy API (default today .. now; from the minute holding
//! `from`), at most 31 days apart (longer: 400); an episode going on at `from` is
//! reported whole, from its true start (up to 7 days before `from`), and `min_idle` is
//! judged on the whole of it. `min_idle` (a
//! duration, `45m`) and `threshold` (percent) default to the collector's
//! `--waste-min-idle` / `--waste-util-threshold`. Energy is the workload's share of the
//! GPU's energy while idle (`energy_mj` exact, `energy_j`, `energy_kwh`); `carbon_g` is
//! `null` while none of it has a price, and `unpriced_j` says how much is not priced.

use crate::accounting::waste::{self, Episode, WasteSettings, WorkloadWaste};
use crate::api::energy::{RangeParams, range};
use crate::api::error::{AccessResponses, ApiError, ErrorResponses};
use crate::api::state::{AppState, Route};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use gpufleet_core::config::{format_time, parse_duration};
use gpufleet_core::{UnixMs, Workload};
use serde::{Deserialize, Serialize};

const DAY_MS: i64 = 24 * 3600 * 1000;

/// The longest range one request reads (a longer one is a 400).
pub const MAX_RANGE_MS: i64 = 31 * DAY_MS;

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![Route::get(
        "/api/v1/waste",
        "idle-but-allocated episodes and totals per workload",
        waste_view,
    )]
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WasteParams {
    /// RFC 3339, Unix ms, `now` or `now-15m`; default today (UTC midnight).
    #[param(example = "now-1d")]
    from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    to: Option<String>,
    /// Shortest episode reported (`30m`, `1h`); default the collector's `--waste-min-idle`.
    #[param(example = "30m")]
    min_idle: Option<String>,
    /// A GPU at or below this utilization (percent, 0..=100) does no work; default the
    /// collector's `--waste-util-threshold`.
    #[param(example = 1)]
    threshold: Option<u32>,
    /// Only this node's GPUs.
    node: Option<String>,
}

/// The settings of a request: the collector's, overridden by the query.
fn settings(base: WasteSettings, p: &WasteParams) -> Result<WasteSettings, ApiError> {
    let mut s = base;
    if let Some(m) = p.min_idle.as_deref() {
        s.min_idle =
            parse_duration(m).map_err(|e| ApiError::BadRequest(format!("min_idle {m:?}: {e}")))?;
    }
    if let Some(t) = p.threshold {
        if t > 100 {
            return Err(ApiError::BadRequest(format!(
                "threshold {t}: a utilization percentage, 0..=100"
            )));
        }
        s.util_threshold_pct = t;
    }
    Ok(s)
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct GpuOf {
    node: String,
    uuid: String,
    index: u32,
    name: String,
}

/// One idle-but-allocated episode.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct EpisodeView {
    gpu: GpuOf,
    /// Who held the GPU: kind, container / pod names and namespace, job id, uid or unit,
    /// as known.
    workload: Workload,
    /// `Workload::key()`.
    workload_key: String,
    /// Start of its first idle minute.
    since: String,
    since_ms: UnixMs,
    /// End of its last idle minute (now, if still open).
    until: String,
    until_ms: UnixMs,
    /// Still going on (its GPU's newest minute is idle and recent).
    ongoing: bool,
    idle_seconds: f64,
    idle_minutes: u32,
    /// The most GPU memory it held while idle; `null` when never reported.
    memory_bytes: Option<u64>,
    /// Its share of the GPU's energy while idle (active + idle share, as the accountant
    /// split it).
    energy_mj: u64,
    energy_j: f64,
    energy_kwh: f64,
    /// Of it, its idle share.
    idle_j: f64,
    /// Of it, what was charged to it (all under `spread`, the active share under
    /// `separate`).
    charged_j: f64,
    /// Of it, the part in minutes still open.
    provisional_j: f64,
    /// gCO2 of the priced part; `null` while none of it is priced.
    carbon_g: Option<f64>,
    unpriced_j: f64,
}

/// One workload's episodes summed.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct WorkloadTotalView {
    workload: Workload,
    workload_key: String,
    episodes: u32,
    idle_seconds: f64,
    energy_mj: u64,
    energy_j: f64,
    energy_kwh: f64,
    carbon_g: Option<f64>,
    unpriced_j: f64,
}

/// Waste over the range.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct WasteView {
    from: String,
    to: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    /// The rule used: utilization at or below `threshold_pct` for at least
    /// `min_idle_seconds`.
    threshold_pct: u32,
    min_idle_seconds: f64,
    /// By node, GPU, start.
    episodes: Vec<EpisodeView>,
    /// Per workload, biggest energy first.
    workloads: Vec<WorkloadTotalView>,
    /// All episodes together.
    energy_mj: u64,
    energy_j: f64,
    energy_kwh: f64,
    carbon_g: Option<f64>,
    unpriced_j: f64,
}

fn j(mj: u64) -> f64 {
    mj as f64 / 1000.0
}

fn kwh(mj: u64) -> f64 {
    mj as f64 / 3.6e9
}

fn episode_view(e: &Episode) -> EpisodeView {
    EpisodeView {
        gpu: GpuOf {
            node: e.node.clone(),
            uuid: e.gpu_uuid.clone(),
            index: e.gpu_index,
            name: e.gpu_name.clone(),
        },
        workload: e.workload.clone(),
        workload_key: e.workload.key(),
        since: format_time(e.since_ms),
        since_ms: e.since_ms,
        until: format_time(e.until_ms),
        until_ms: e.until_ms,
        ongoing: e.ongoing,
        idle_seconds: e.idle_ms() as f64 / 1000.0,
        idle_minutes: e.minutes,
        memory_bytes: e.mem_max_bytes,
        energy_mj: e.energy_mj,
        energy_j: j(e.energy_mj),
        energy_kwh: kwh(e.energy_mj),
        idle_j: j(e.idle_mj),
        charged_j: j(e.charged_mj),
        provisional_j: j(e.provisional_mj),
        carbon_g: e.carbon_g,
        unpriced_j: j(e.energy_mj.saturating_sub(e.priced_mj)),
    }
}

fn total_view(t: &WorkloadWaste) -> WorkloadTotalView {
    WorkloadTotalView {
        workload: t.workload.clone(),
        workload_key: t.workload.key(),
        episodes: t.episodes,
        idle_seconds: t.idle_ms as f64 / 1000.0,
        energy_mj: t.energy_mj,
        energy_j: j(t.energy_mj),
        energy_kwh: kwh(t.energy_mj),
        carbon_g: t.carbon_g,
        unpriced_j: j(t.energy_mj.saturating_sub(t.priced_mj)),
    }
}

/// Idle-but-allocated episodes: workloads holding GPU memory on a GPU that does no work.
#[utoipa::path(get, path = "/api/v1/waste", tag = "energy", params(WasteParams),
    responses((status = 200, description = "idle-but-allocated episodes and totals", body = WasteView), ErrorResponses, AccessResponses))]
async fn waste_view(
    State(st): State<AppState>,
    params: Result<Query<WasteParams>, QueryRejection>,
) -> Result<Json<WasteView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let s = settings(st.waste, &p)?;
    let r = range(
        &st,
        &RangeParams {
            from: p.from.clone(),
            to: p.to.clone(),
            ..Default::default()
        },
    )?;
    if r.to_ms.saturating_sub(r.from_ms) > MAX_RANGE_MS {
        return Err(ApiError::BadRequest(format!(
            "the range {} .. {} is longer than {} days; ask for a shorter one (from / to)",
            format_time(r.from_ms),
            format_time(r.to_ms),
            MAX_RANGE_MS / DAY_MS
        )));
    }
    let episodes = waste::find(st.store.as_ref(), r, p.node.as_deref(), s, (st.clock)()).await?;
    let totals = waste::totals(&episodes);
    let energy_mj: u64 = episodes.iter().map(|e| e.energy_mj).sum();
    let priced_mj: u64 = episodes.iter().map(|e| e.priced_mj).sum();
    let carbon_g = episodes
        .iter()
        .filter_map(|e| e.carbon_g)
        .reduce(|a, b| a + b);
    Ok(Json(WasteView {
        from: format_time(r.from_ms),
        to: format_time(r.to_ms),
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        threshold_pct: s.util_threshold_pct,
        min_idle_seconds: s.min_idle.as_secs_f64(),
        episodes: episodes.iter().map(episode_view).collect(),
        workloads: totals.iter().map(total_view).collect(),
        energy_mj,
        energy_j: j(energy_mj),
        energy_kwh: kwh(energy_mj),
        carbon_g,
        unpriced_j: j(energy_mj.saturating_sub(priced_mj)),
    }))
}
