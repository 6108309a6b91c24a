//! The energy API, read from the per-minute rollups:
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/containers?from=&to=&node=&group_by=` | energy per container (or pod, namespace, job, Slurm account, user) |
//! | `GET /api/v1/containers/{key}?from=&to=` | one workload (`Workload::key()`), with a per-minute series |
//! | `GET /api/v1/energy?from=&to=` | fleet total and energy per GPU (missing time, idle, method mix) |
//! | `GET /api/v1/energy/series?from=&to=&group_by=&top=` | energy over time: the biggest groups, the rest, idle and unattributed per bucket |
//!
//! `from` / `to` default to today (UTC midnight) .. now. Rollups are per minute: a range
//! covers the minutes that start in it (the one holding `from` included). Energy is given
//! exactly (`energy_mj`) and as `energy_j` / `energy_kwh`; `method` says how much of it
//! the energy counter measured and how much was integrated from power.
//!
//! Every row and total says how much of its energy was active and how much idle
//! (`active_j`, `idle_j`); a workload's `idle_j` is its share (by GPU memory held) of the
//! idle energy of the GPUs it held, charged to it (`idle_charged_j`) under the `spread`
//! policy. `provisional_j` is the part in minutes still open (a GPU's newest minute, from
//! the samples so far): it may still grow, and becomes final a grace period after the
//! minute ends. Each GPU of `/api/v1/energy` carries its idle `baseline` and where it
//! came from.
//!
//! `/api/v1/energy/series` buckets the same minutes per minute (ranges up to 6 h) or per
//! hour, into bands that add up to the whole: the `top` (default 8) biggest groups of
//! `group_by` (as `/api/v1/containers` groups them, or `node`), `other`, and, grouped by
//! workload, `unattributed` and `idle` (the idle energy charged to no workload). Every
//! band's sum is exact (mJ): a group's is its row's `energy_mj`, and all bands together
//! are `/api/v1/energy`'s `total.energy_mj`.
//!
//! Carbon sits beside every energy figure: `carbon_g` (null when none of the
//! energy has a price: carbon off, or not priced yet) and `carbon` with its provenance
//! (average intensity, forecast / estimated shares, unpriced energy, sources).

use crate::accounting::energy::{IdleSource, MINUTE_MS, baseline, gpm_pct, minute_of};
use crate::api::error::{AccessResponses, ApiError, ErrorResponses, time_param};
use crate::api::state::{AppState, Route};
use crate::store::TimeRange;
use crate::store::carbon::CarbonTotals;
use crate::store::energy::{EnergyBuckets, GpuBaseline, GpuEnergy, WorkloadEnergy};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use gpufleet_core::config::format_time;
use gpufleet_core::{UnixMs, Workload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![
        Route::get(
            "/api/v1/containers",
            "energy per container (or pod, namespace, job, Slurm account, user)",
            containers,
        ),
        Route::get(
            "/api/v1/containers/{key}",
            "one workload's energy, with a per-minute series",
            container,
        ),
        Route::get(
            "/api/v1/energy",
            "fleet total and energy per GPU (missing time, idle, method mix)",
            energy,
        ),
        Route::get(
            "/api/v1/energy/series",
            "energy over time: the biggest groups, the rest, idle and unattributed per bucket",
            energy_series,
        ),
    ]
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RangeParams {
    /// RFC 3339, Unix ms, `now` or `now-15m`; default today (UTC midnight).
    #[param(example = "now-10m")]
    pub(crate) from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    pub(crate) to: Option<String>,
    /// Only this node's GPUs.
    pub(crate) node: Option<String>,
    /// `container` (default), `pod`, `namespace`, `job`, `account` (the Slurm account:
    /// chargeback) or `user`.
    #[param(example = "pod")]
    pub(crate) group_by: Option<String>,
}

const DAY_MS: i64 = 86_400_000;

/// The range of `from` / `to` (default: today, UTC midnight .. now), from the minute
/// holding `from`.
pub(crate) fn range(st: &AppState, p: &RangeParams) -> Result<TimeRange, ApiError> {
    range_at(p, (st.clock)())
}

/// [`range`] with "now" given.
pub(crate) fn range_at(p: &RangeParams, now: UnixMs) -> Result<TimeRange, ApiError> {
    let to = time_param("to", p.to.as_deref(), now)?.unwrap_or(now);
    let from =
        time_param("from", p.from.as_deref(), now)?.unwrap_or(now.div_euclid(DAY_MS) * DAY_MS);
    if from > to {
        return Err(ApiError::BadRequest(format!(
            "from ({}) is after to ({})",
            format_time(from),
            format_time(to)
        )));
    }
    Ok(TimeRange {
        from_ms: minute_of(from),
        to_ms: to,
    })
}

/// What rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupBy {
    Container,
    Pod,
    Namespace,
    Job,
    Account,
    User,
}

impl GroupBy {
    pub(crate) fn parse(s: Option<&str>) -> Result<GroupBy, ApiError> {
        match s.unwrap_or("container") {
            "container" => Ok(GroupBy::Container),
            "pod" => Ok(GroupBy::Pod),
            "namespace" => Ok(GroupBy::Namespace),
            "job" => Ok(GroupBy::Job),
            "account" => Ok(GroupBy::Account),
            "user" => Ok(GroupBy::User),
            other => Err(ApiError::BadRequest(format!(
                "group_by {other:?}: expected container, pod, namespace, job, account or user"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            GroupBy::Container => "container",
            GroupBy::Pod => "pod",
            GroupBy::Namespace => "namespace",
            GroupBy::Job => "job",
            GroupBy::Account => "account",
            GroupBy::User => "user",
        }
    }

    /// The group a workload falls in. Workloads without the grouping identity (a host
    /// process has no pod) stay on their own under their workload key.
    fn key(self, w: &Workload) -> String {
        let own = w.key();
        match self {
            GroupBy::Container => own,
            GroupBy::Pod => w.pod_uid.as_ref().map_or(own, |p| format!("pod:{p}")),
            GroupBy::Namespace => w.namespace.as_ref().map_or_else(
                || "namespace:(none)".to_owned(),
                |n| format!("namespace:{n}"),
            ),
            GroupBy::Job => w.job_id.as_ref().map_or(own, |j| format!("slurm:{j}")),
            // Every workload not charged to a Slurm account shares one row.
            GroupBy::Account => w
                .account
                .as_ref()
                .map_or_else(|| "account:(none)".to_owned(), |a| format!("account:{a}")),
            GroupBy::User => w
                .uid
                .map_or_else(|| "user:(unknown)".to_owned(), |u| format!("user:uid-{u}")),
        }
    }
}

// A row of `/api/v1/containers` and what it holds: the API's own types, shared with its
// clients.
pub use gpufleet_api::energy::{CarbonView, ContainerRow, GpuRef, MethodMix, SplitMix};

/// The carbon figures of `energy_mj` of which `c` is priced.
pub fn carbon_view(energy_mj: u64, c: &CarbonTotals) -> (Option<f64>, CarbonView) {
    let share = |part: u64, whole: u64| (whole > 0).then(|| part as f64 / whole as f64);
    let carbon_g = (c.priced_mj > 0 || !c.sources.is_empty()).then_some(c.carbon_g);
    (
        carbon_g,
        CarbonView {
            avg_g_per_kwh: c.avg_g_per_kwh(),
            priced_share: share(c.priced_mj.min(energy_mj), energy_mj),
            forecast_share: share(c.forecast_mj, c.priced_mj),
            estimated_share: share(c.estimated_mj, c.priced_mj),
            unpriced_j: j(energy_mj.saturating_sub(c.priced_mj)),
            sources: c.sources.clone(),
        },
    )
}

/// Carbon per (workload key, GPU UUID).
type WorkloadCarbonMap = BTreeMap<(String, String), CarbonTotals>;

#[derive(Default)]
struct Acc {
    identity: Option<Workload>,
    workloads: BTreeSet<String>,
    nodes: BTreeSet<String>,
    gpus: BTreeMap<String, GpuRef>,
    energy_mj: u64,
    active_mj: u64,
    idle_mj: u64,
    provisional_mj: u64,
    counter_mj: u64,
    trapezoid_mj: u64,
    gpu_ms: i64,
    share_ppm_ms: u64,
    sm_ms: i64,
    memory_ms: i64,
    equal_ms: i64,
    idle_memory_ms: i64,
    idle_equal_ms: i64,
    tensor_ms: i64,
    tensor_cpct_ms: u64,
    occupancy_ms: i64,
    occupancy_cpct_ms: u64,
    first: UnixMs,
    last: UnixMs,
    carbon: CarbonTotals,
}

fn j(mj: u64) -> f64 {
    mj as f64 / 1000.0
}

fn kwh(mj: u64) -> f64 {
    mj as f64 / 3.6e9
}

fn group(rows: Vec<WorkloadEnergy>, by: GroupBy, carbon: &WorkloadCarbonMap) -> Vec<ContainerRow> {
    let mut groups: BTreeMap<String, Acc> = BTreeMap::new();
    for r in rows {
        let a = groups.entry(by.key(&r.workload)).or_insert_with(|| Acc {
            first: i64::MAX,
            last: i64::MIN,
            ..Default::default()
        });
        if let Some(c) = carbon.get(&(r.workload.key(), r.gpu_uuid.clone())) {
            a.carbon.add(c);
        }
        a.workloads.insert(r.workload.key());
        a.identity.get_or_insert_with(|| r.workload.clone());
        a.nodes.insert(r.node_name.clone());
        a.gpus.entry(r.gpu_uuid.clone()).or_insert(GpuRef {
            node: r.node_name,
            uuid: r.gpu_uuid,
            index: r.gpu_index,
            name: r.gpu_name,
        });
        a.energy_mj += r.energy_mj;
        a.active_mj += r.active_mj;
        a.idle_mj += r.idle_mj;
        a.provisional_mj += r.provisional_mj;
        a.idle_memory_ms += r.idle_memory_ms;
        a.idle_equal_ms += r.idle_equal_ms;
        a.counter_mj += r.counter_mj;
        a.trapezoid_mj += r.trapezoid_mj;
        a.gpu_ms += r.gpu_ms;
        a.share_ppm_ms += r.share_ppm_ms;
        a.sm_ms += r.sm_ms;
        a.memory_ms += r.memory_ms;
        a.equal_ms += r.equal_ms;
        a.tensor_ms += r.tensor_ms;
        a.tensor_cpct_ms += r.tensor_cpct_ms;
        a.occupancy_ms += r.occupancy_ms;
        a.occupancy_cpct_ms += r.occupancy_cpct_ms;
        a.first = a.first.min(r.first_minute_ms);
        a.last = a.last.max(r.last_minute_ms);
    }
    let mut out: Vec<ContainerRow> = groups
        .into_iter()
        .map(|(key, a)| {
            let (carbon_g, carbon) = carbon_view(a.energy_mj, &a.carbon);
            ContainerRow {
                key,
                identity: a.identity.unwrap_or_default(),
                workloads: a.workloads.into_iter().collect(),
                nodes: a.nodes.into_iter().collect(),
                gpus: a.gpus.into_values().collect(),
                energy_mj: a.energy_mj,
                energy_j: j(a.energy_mj),
                energy_kwh: kwh(a.energy_mj),
                active_j: j(a.active_mj),
                idle_j: j(a.idle_mj),
                idle_charged_j: j(a.energy_mj.saturating_sub(a.active_mj)),
                provisional_j: j(a.provisional_mj),
                gpu_seconds: a.gpu_ms as f64 / 1000.0,
                avg_share: (a.gpu_ms > 0).then(|| a.share_ppm_ms as f64 / a.gpu_ms as f64 / 1e6),
                tensor_active_pct: gpm_pct(a.tensor_cpct_ms, a.tensor_ms),
                sm_occupancy_pct: gpm_pct(a.occupancy_cpct_ms, a.occupancy_ms),
                gpm_seconds: a.tensor_ms as f64 / 1000.0,
                method: MethodMix {
                    counter_j: j(a.counter_mj),
                    trapezoid_j: j(a.trapezoid_mj),
                },
                split: SplitMix {
                    sm_s: a.sm_ms as f64 / 1000.0,
                    memory_s: a.memory_ms as f64 / 1000.0,
                    equal_s: a.equal_ms as f64 / 1000.0,
                    idle_memory_s: a.idle_memory_ms as f64 / 1000.0,
                    idle_equal_s: a.idle_equal_ms as f64 / 1000.0,
                },
                first_minute: format_time(a.first),
                last_minute: format_time(a.last + MINUTE_MS),
                carbon_g,
                carbon,
            }
        })
        .collect();
    // Biggest spenders first.
    out.sort_by(|a, b| b.energy_mj.cmp(&a.energy_mj).then(a.key.cmp(&b.key)));
    out
}

pub use gpufleet_api::energy::ContainersView;

/// Energy per container (or pod, namespace, job, user), biggest first.
#[utoipa::path(get, path = "/api/v1/containers", tag = "energy", params(RangeParams),
    responses((status = 200, description = "energy per workload", body = ContainersView), ErrorResponses, AccessResponses))]
async fn containers(
    State(st): State<AppState>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Json<ContainersView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let r = range(&st, &p)?;
    let by = GroupBy::parse(p.group_by.as_deref())?;
    let rows = st.store.workload_energy(r, p.node.as_deref(), None).await?;
    let carbon = workload_carbon(&st, r, p.node.as_deref(), None).await?;
    Ok(Json(ContainersView {
        from: format_time(r.from_ms),
        to: format_time(r.to_ms),
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        group_by: by.as_str().to_owned(),
        rows: group(rows, by, &carbon),
    }))
}

#[derive(Serialize, utoipa::ToSchema)]
struct MinutePoint {
    minute: String,
    minute_ms: UnixMs,
    energy_j: f64,
    active_j: f64,
    idle_j: f64,
    /// Part of a minute still open.
    provisional_j: f64,
    gpu_seconds: f64,
    avg_share: Option<f64>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ContainerView {
    from: String,
    to: String,
    #[serde(flatten)]
    row: ContainerRow,
    /// Per minute, all GPUs together; minutes without energy rows are absent.
    series: Vec<MinutePoint>,
}

/// One workload's energy, with a per-minute series.
#[utoipa::path(get, path = "/api/v1/containers/{key}", tag = "energy",
    params(("key" = String, Path, description = "a workload key: container:<id>, slurm:<job>, host:<unit>"), RangeParams),
    responses((status = 200, description = "the workload", body = ContainerView), ErrorResponses, AccessResponses))]
async fn container(
    State(st): State<AppState>,
    Path(key): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Json<ContainerView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let r = range(&st, &p)?;
    let rows = st.store.workload_energy(r, None, Some(&key)).await?;
    let carbon = workload_carbon(&st, r, None, Some(&key)).await?;
    let row = group(rows, GroupBy::Container, &carbon)
        .into_iter()
        .next()
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "no energy for workload {key:?} in {} .. {} (keys look like container:<id>, \
                 slurm:<job>, host:<unit>; see /api/v1/containers)",
                format_time(r.from_ms),
                format_time(r.to_ms)
            ))
        })?;
    let series = st
        .store
        .workload_energy_series(&key, r)
        .await?
        .into_iter()
        .map(|m| MinutePoint {
            minute: format_time(m.minute_ms),
            minute_ms: m.minute_ms,
            energy_j: j(m.energy_mj),
            active_j: j(m.active_mj),
            idle_j: j(m.idle_mj),
            provisional_j: j(m.provisional_mj),
            gpu_seconds: m.gpu_ms as f64 / 1000.0,
            avg_share: (m.gpu_ms > 0).then(|| m.share_ppm_ms as f64 / m.gpu_ms as f64 / 1e6),
        })
        .collect();
    Ok(Json(ContainerView {
        from: format_time(r.from_ms),
        to: format_time(r.to_ms),
        row,
        series,
    }))
}

#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
struct EnergyTotals {
    energy_mj: u64,
    energy_j: f64,
    energy_kwh: f64,
    /// Given to workloads (their active share, plus idle under `spread`).
    attributed_j: f64,
    /// The GPUs' active energy (workloads' active shares and `unattributed_j`).
    active_j: f64,
    /// The GPUs' idle energy: the baseline over the time they did no work
    /// (`idle_charged_j` + `idle_bucket_j`).
    idle_j: f64,
    /// Of `idle_j`, charged to the workloads holding the GPUs (policy `spread`).
    idle_charged_j: f64,
    /// Of `idle_j`, charged to no one: GPUs with no process, or idle under `separate`.
    idle_bucket_j: f64,
    /// Active energy with no process listed.
    unattributed_j: f64,
    /// Of `energy_j`, the part in minutes still open (may still grow).
    provisional_j: f64,
    /// Measured time and time lost in gaps (no energy counted for it).
    covered_seconds: f64,
    missing_seconds: f64,
    /// Average power over the measured time; `null` without any.
    avg_power_w: Option<f64>,
    method: MethodMix,
    /// gCO2 of the priced energy; `null` when none of it has a price.
    carbon_g: Option<f64>,
    carbon: CarbonView,
}

async fn workload_carbon(
    st: &AppState,
    r: TimeRange,
    node: Option<&str>,
    key: Option<&str>,
) -> Result<WorkloadCarbonMap, ApiError> {
    Ok(st
        .store
        .workload_carbon(r, node, key)
        .await?
        .into_iter()
        .map(|c| ((c.workload_key, c.gpu_uuid), c.totals))
        .collect())
}

fn totals<'a>(
    gpus: impl IntoIterator<Item = &'a GpuEnergy>,
    carbon: &BTreeMap<String, CarbonTotals>,
) -> EnergyTotals {
    let mut ct = CarbonTotals::default();
    let (mut e, mut at, mut id, mut un, mut cov, mut mis, mut c, mut t) =
        (0u64, 0u64, 0u64, 0u64, 0i64, 0i64, 0u64, 0u64);
    let (mut act, mut prov) = (0u64, 0u64);
    for g in gpus {
        if let Some(c) = carbon.get(&g.uuid) {
            ct.add(c);
        }
        e += g.energy_mj;
        act += g.active_mj;
        prov += g.provisional_mj;
        at += g.attributed_mj;
        id += g.idle_mj;
        un += g.unattributed_mj;
        cov += g.covered_ms;
        mis += g.missing_ms;
        c += g.counter_mj;
        t += g.trapezoid_mj;
    }
    let (carbon_g, carbon) = carbon_view(e, &ct);
    EnergyTotals {
        carbon_g,
        carbon,
        energy_mj: e,
        energy_j: j(e),
        energy_kwh: kwh(e),
        attributed_j: j(at),
        active_j: j(act),
        idle_j: j(e.saturating_sub(act)),
        // Workloads got their active shares (active − unattributed) and the charged idle.
        idle_charged_j: j(at.saturating_sub(act.saturating_sub(un))),
        idle_bucket_j: j(id),
        unattributed_j: j(un),
        provisional_j: j(prov),
        covered_seconds: cov as f64 / 1000.0,
        missing_seconds: mis as f64 / 1000.0,
        avg_power_w: (cov > 0).then(|| e as f64 / cov as f64),
        method: MethodMix {
            counter_j: j(c),
            trapezoid_j: j(t),
        },
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct GpuEnergyView {
    node: String,
    uuid: String,
    index: u32,
    name: String,
    /// The idle baseline of its newest minute; `null` before its first minute.
    baseline: Option<BaselineView>,
    #[serde(flatten)]
    totals: EnergyTotals,
}

/// A GPU's idle baseline and where it came from.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct BaselineView {
    /// The idle power in force, watts.
    idle_w: f64,
    /// `learned` (from the intervals it did no work), `model` (datasheet default),
    /// `fallback`, `watts` (configured with `--energy-idle`) or `min` (older minutes).
    source: &'static str,
    /// The minute it was last used for.
    minute: String,
    /// What it is (or would be) learned from: the GPU's most recent seen-idle time (0 %
    /// utilization, no compute process; up to an hour) and its average power (`null` when
    /// it was never seen idle).
    seen_idle_seconds: f64,
    seen_idle_avg_w: Option<f64>,
    /// The seen-idle time needed before a learned baseline is used.
    learn_after_seconds: f64,
    /// For `model`: the datasheet figure it derives from and where it is published.
    model_max_power_w: Option<u32>,
    model_source: Option<&'static str>,
}

impl BaselineView {
    fn new(b: &GpuBaseline) -> BaselineView {
        let model = (b.idle_source == IdleSource::Model)
            .then(|| baseline::model(&b.name))
            .flatten();
        BaselineView {
            idle_w: f64::from(b.idle_mw) / 1000.0,
            source: b.idle_source.as_str(),
            minute: format_time(b.minute_ms),
            seen_idle_seconds: b.seen_idle_ms as f64 / 1000.0,
            seen_idle_avg_w: (b.seen_idle_ms > 0)
                .then(|| b.seen_idle_mj as f64 / b.seen_idle_ms as f64),
            learn_after_seconds: baseline::MIN_SEEN_IDLE_MS as f64 / 1000.0,
            model_max_power_w: model.map(|m| m.max_power_w),
            model_source: model.map(|m| m.source),
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct EnergyView {
    from: String,
    to: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    /// The whole fleet.
    total: EnergyTotals,
    /// Per node.
    nodes: BTreeMap<String, EnergyTotals>,
    gpus: Vec<GpuEnergyView>,
}

/// Fleet total and energy per node and per GPU.
#[utoipa::path(get, path = "/api/v1/energy", tag = "energy", params(RangeParams),
    responses((status = 200, description = "the totals", body = EnergyView), ErrorResponses, AccessResponses))]
async fn energy(
    State(st): State<AppState>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Json<EnergyView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let r = range(&st, &p)?;
    let mut gpus = st.store.gpu_energy(r).await?;
    if let Some(node) = &p.node {
        gpus.retain(|g| &g.node_name == node);
    }
    let carbon: BTreeMap<String, CarbonTotals> = st
        .store
        .gpu_carbon(r)
        .await?
        .into_iter()
        .map(|c| (c.uuid, c.totals))
        .collect();
    let baselines: BTreeMap<String, GpuBaseline> = st
        .store
        .energy_baselines()
        .await?
        .into_iter()
        .map(|b| (b.uuid.clone(), b))
        .collect();
    let mut by_node: BTreeMap<String, Vec<&GpuEnergy>> = BTreeMap::new();
    for g in &gpus {
        by_node.entry(g.node_name.clone()).or_default().push(g);
    }
    Ok(Json(EnergyView {
        from: format_time(r.from_ms),
        to: format_time(r.to_ms),
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        total: totals(&gpus, &carbon),
        nodes: by_node
            .into_iter()
            .map(|(n, gs)| (n, totals(gs, &carbon)))
            .collect(),
        gpus: gpus
            .iter()
            .map(|g| GpuEnergyView {
                node: g.node_name.clone(),
                uuid: g.uuid.clone(),
                index: g.index,
                name: g.name.clone(),
                baseline: baselines.get(&g.uuid).map(BaselineView::new),
                totals: totals([g], &carbon),
            })
            .collect(),
    }))
}

// `/api/v1/energy/series`'s answer: the API's own types, shared with its clients.
pub use gpufleet_api::energy::{EnergyBand, EnergySeriesView};

/// Ranges up to this long are bucketed per minute, longer ones per hour.
const MINUTE_BUCKETS_UP_TO_MS: i64 = 6 * 3_600_000;
/// The most buckets an answer holds (hourly: about 14 months); a longer range is a 400.
const MAX_BUCKETS: i64 = 10_000;
/// Groups with a band of their own when `top` is not given, and the most it may ask.
const DEFAULT_TOP: usize = 8;
const MAX_TOP: usize = 50;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SeriesParams {
    /// RFC 3339, Unix ms, `now` or `now-15m`; default today (UTC midnight).
    #[param(example = "now-2h")]
    from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    to: Option<String>,
    /// `container` (default), `pod`, `namespace`, `job`, `account`, `user` or `node`.
    #[param(example = "namespace")]
    group_by: Option<String>,
    /// How many of the biggest groups get a band of their own (1 to 50, default 8); the
    /// rest are `other`.
    #[param(example = 8)]
    top: Option<usize>,
}

/// What the bands group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeriesGroup {
    Workloads(GroupBy),
    Node,
}

/// A group's energy per bucket while the bands are built.
struct GroupAcc {
    /// The first workload by key, as `/api/v1/containers` names its row.
    identity: Option<(String, Workload)>,
    total_mj: u64,
    values: Vec<u64>,
}

/// The bands of `buckets` over `n` buckets from `first_ms`, `step_ms` long: the `top`
/// biggest groups (biggest first, ties by key), `other`, then `unattributed` and `idle`
/// (grouped by workload; a node's energy holds its own). Pure: tested below.
fn bands(
    buckets: &EnergyBuckets,
    by: SeriesGroup,
    first_ms: UnixMs,
    step_ms: i64,
    n: usize,
    top: usize,
) -> Vec<EnergyBand> {
    let slot = |bucket_ms: UnixMs| -> Option<usize> {
        let i = (bucket_ms - first_ms).checked_div(step_ms)?;
        usize::try_from(i).ok().filter(|&i| i < n)
    };
    let mut groups: BTreeMap<String, GroupAcc> = BTreeMap::new();
    let mut add = |key: String, identity: Option<&Workload>, i: usize, mj: u64| {
        let g = groups.entry(key).or_insert_with(|| GroupAcc {
            identity: None,
            total_mj: 0,
            values: vec![0; n],
        });
        if let Some(w) = identity {
            let k = w.key();
            if g.identity.as_ref().is_none_or(|(first, _)| k < *first) {
                g.identity = Some((k, w.clone()));
            }
        }
        g.total_mj += mj;
        g.values[i] += mj;
    };
    let mut idle = vec![0u64; n];
    let mut unattributed = vec![0u64; n];
    match by {
        SeriesGroup::Workloads(group_by) => {
            for w in &buckets.workloads {
                if let Some(i) = slot(w.bucket_ms) {
                    add(group_by.key(&w.workload), Some(&w.workload), i, w.energy_mj);
                }
            }
            for b in &buckets.nodes {
                if let Some(i) = slot(b.bucket_ms) {
                    idle[i] += b.idle_mj;
                    unattributed[i] += b.unattributed_mj;
                }
            }
        }
        SeriesGroup::Node => {
            for b in &buckets.nodes {
                if let Some(i) = slot(b.bucket_ms) {
                    add(format!("node:{}", b.node_name), None, i, b.energy_mj);
                }
            }
        }
    }
    let mut ranked: Vec<(String, GroupAcc)> = groups.into_iter().collect();
    ranked.sort_by(|(ka, a), (kb, b)| b.total_mj.cmp(&a.total_mj).then(ka.cmp(kb)));
    let band = |key: String, kind: &str, identity: Option<Workload>, values: Vec<u64>| {
        let energy_mj: u64 = values.iter().sum();
        EnergyBand {
            key,
            kind: kind.to_owned(),
            identity,
            energy_mj,
            energy_j: j(energy_mj),
            values_mj: values,
        }
    };
    let mut other = vec![0u64; n];
    let mut out = Vec::new();
    for (rank, (key, g)) in ranked.into_iter().enumerate() {
        if rank < top {
            out.push(band(key, "group", g.identity.map(|(_, w)| w), g.values));
        } else {
            for (o, v) in other.iter_mut().zip(g.values) {
                *o += v;
            }
        }
    }
    out.push(band("other".into(), "other", None, other));
    if matches!(by, SeriesGroup::Workloads(_)) {
        out.push(band(
            "unattributed".into(),
            "unattributed",
            None,
            unattributed,
        ));
        out.push(band("idle".into(), "idle", None, idle));
    }
    out
}

/// The fleet's energy over time, in bands that add up to the whole.
#[utoipa::path(get, path = "/api/v1/energy/series", tag = "energy", params(SeriesParams),
    responses((status = 200, description = "energy per bucket, in bands", body = EnergySeriesView), ErrorResponses, AccessResponses))]
async fn energy_series(
    State(st): State<AppState>,
    params: Result<Query<SeriesParams>, QueryRejection>,
) -> Result<Json<EnergySeriesView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let r = range(
        &st,
        &RangeParams {
            from: p.from.clone(),
            to: p.to.clone(),
            ..Default::default()
        },
    )?;
    let by = match p.group_by.as_deref() {
        Some("node") => SeriesGroup::Node,
        other => SeriesGroup::Workloads(GroupBy::parse(other).map_err(|_| {
            ApiError::BadRequest(format!(
                "group_by {:?}: expected container, pod, namespace, job, account, user or node",
                other.unwrap_or_default()
            ))
        })?),
    };
    let top = p.top.unwrap_or(DEFAULT_TOP);
    if !(1..=MAX_TOP).contains(&top) {
        return Err(ApiError::BadRequest(format!(
            "top {top}: expected 1 to {MAX_TOP} (groups with a band of their own)"
        )));
    }
    let step_ms = if r.to_ms.saturating_sub(r.from_ms) <= MINUTE_BUCKETS_UP_TO_MS {
        MINUTE_MS
    } else {
        3_600_000
    };
    let first_ms = r.from_ms.div_euclid(step_ms) * step_ms;
    let last_ms = r.to_ms.div_euclid(step_ms) * step_ms;
    let count = (last_ms - first_ms) / step_ms + 1;
    if count > MAX_BUCKETS {
        return Err(ApiError::BadRequest(format!(
            "{} .. {} is {count} hourly buckets, more than {MAX_BUCKETS}: ask for a shorter range",
            format_time(r.from_ms),
            format_time(r.to_ms)
        )));
    }
    let n = usize::try_from(count).unwrap_or(0);
    let buckets = st.store.energy_buckets(r, step_ms).await?;
    let bands = bands(&buckets, by, first_ms, step_ms, n, top);
    let energy_mj: u64 = buckets.nodes.iter().map(|b| b.energy_mj).sum();
    Ok(Json(EnergySeriesView {
        from: format_time(r.from_ms),
        to: format_time(r.to_ms),
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        group_by: match by {
            SeriesGroup::Workloads(g) => g.as_str().to_owned(),
            SeriesGroup::Node => "node".to_owned(),
        },
        step_ms,
        buckets_ms: (0..count).map(|i| first_ms + i * step_ms).collect(),
        energy_mj,
        bands,
    }))
}

#[cfg(test)]
mod series_tests {
    use super::*;
    use crate::store::energy::{NodeBucket, WorkloadBucket};
    use gpufleet_core::WorkloadKind;

    fn container(id: &str, namespace: &str) -> Workload {
        Workload {
            kind: WorkloadKind::Container,
            runtime: "containerd".into(),
            container_id: Some(id.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        }
    }

    fn wb(bucket_ms: UnixMs, w: &Workload, energy_mj: u64) -> WorkloadBucket {
        WorkloadBucket {
            bucket_ms,
            workload: w.clone(),
            energy_mj,
        }
    }

    fn nb(bucket_ms: UnixMs, node: &str, energy_mj: u64, idle_mj: u64, un: u64) -> NodeBucket {
        NodeBucket {
            bucket_ms,
            node_name: node.into(),
            energy_mj,
            idle_mj,
            unattributed_mj: un,
        }
    }

    /// Three containers in two namespaces over two minutes on two nodes, conserving:
    /// per node and bucket, workloads + idle + unattributed == energy.
    fn sample() -> EnergyBuckets {
        let (a, b, c) = (
            container("a", "ml"),
            container("b", "ml"),
            container("c", "web"),
        );
        EnergyBuckets {
            workloads: vec![
                wb(0, &a, 500),
                wb(0, &c, 100),
                wb(60_000, &a, 400),
                wb(60_000, &b, 200),
                wb(60_000, &c, 50),
            ],
            nodes: vec![
                nb(0, "n1", 600, 80, 20),
                nb(0, "n2", 130, 30, 0),
                nb(60_000, "n1", 700, 60, 40),
                nb(60_000, "n2", 60, 10, 0),
            ],
        }
    }

    fn sum(bands: &[EnergyBand]) -> u64 {
        bands.iter().map(|b| b.values_mj.iter().sum::<u64>()).sum()
    }

    #[test]
    fn bands_add_up_to_the_fleet_and_each_group_to_its_total() {
        let s = sample();
        let fleet: u64 = s.nodes.iter().map(|b| b.energy_mj).sum();
        let b = bands(
            &s,
            SeriesGroup::Workloads(GroupBy::Container),
            0,
            60_000,
            2,
            2,
        );
        let keys: Vec<&str> = b.iter().map(|x| x.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "container:a",
                "container:b",
                "other",
                "unattributed",
                "idle"
            ]
        );
        assert_eq!(b[0].values_mj, [500, 400]);
        assert_eq!(b[0].energy_mj, 900);
        assert_eq!(b[2].values_mj, [100, 50], "container:c is the rest");
        assert_eq!(b[3].values_mj, [20, 40]);
        assert_eq!(b[4].values_mj, [110, 70]);
        assert_eq!(sum(&b), fleet);
        assert_eq!(
            b[0].identity.as_ref().map(Workload::key).as_deref(),
            Some("container:a")
        );
    }

    #[test]
    fn groups_by_namespace_and_by_node() {
        let s = sample();
        let fleet: u64 = s.nodes.iter().map(|b| b.energy_mj).sum();
        let b = bands(
            &s,
            SeriesGroup::Workloads(GroupBy::Namespace),
            0,
            60_000,
            2,
            8,
        );
        assert_eq!(b[0].key, "namespace:ml");
        assert_eq!(b[0].energy_mj, 1100);
        assert_eq!(b[1].key, "namespace:web");
        assert_eq!(b[2].key, "other");
        assert_eq!(b[2].energy_mj, 0);
        assert_eq!(sum(&b), fleet);
        let b = bands(&s, SeriesGroup::Node, 0, 60_000, 2, 1);
        let keys: Vec<&str> = b.iter().map(|x| x.key.as_str()).collect();
        assert_eq!(
            keys,
            ["node:n1", "other"],
            "no idle band: a node's energy holds it"
        );
        assert_eq!(b[0].values_mj, [600, 700]);
        assert_eq!(b[1].values_mj, [130, 60]);
        assert_eq!(sum(&b), fleet);
    }

    #[test]
    fn buckets_outside_the_answer_are_left_out_not_misplaced() {
        let s = sample();
        // One bucket only (the first): the second minute is not in it.
        let b = bands(
            &s,
            SeriesGroup::Workloads(GroupBy::Container),
            0,
            60_000,
            1,
            8,
        );
        assert!(b.iter().all(|x| x.values_mj.len() == 1));
        assert_eq!(sum(&b), 730);
    }
}
