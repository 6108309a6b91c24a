//! `GET /api/v1/gpus/{uuid}/series`: one metric of one GPU over time, from raw samples or
//! per-minute rollups; the parameter parsing and tier choice the dashboard's series share.

use crate::api::error::{AccessResponses, ApiError, ErrorResponses, time_param};
use crate::api::state::AppState;
use crate::store::rollup::RollupKey;
use crate::store::{GpuMetric, SeriesPoint, TimeRange};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use gpufleet_core::UnixMs;
use gpufleet_core::config::{format_time, parse_duration};
use serde::{Deserialize, Serialize};

/// Most points a series request may return.
pub const MAX_SERIES_POINTS: usize = 10_000;
/// The range a series covers when `from` is not given.
const DEFAULT_SERIES_RANGE_MS: i64 = 15 * 60 * 1000;

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
            let step = step_ms
                .unwrap_or(0)
                .max(crate::accounting::energy::MINUTE_MS);
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
pub(crate) async fn series(
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
