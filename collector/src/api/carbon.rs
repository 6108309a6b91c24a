//! The carbon-intensity API, read from the store's intensity cache:
//!
//! `GET /api/v1/carbon/intensity?region=R&provider=P&from=&to=&window=2h`
//!
//! - `region`: required (`13`, `national`, `DE`, …); `provider`: `uk` or
//!   `electricitymaps` (default: whichever cached this region);
//! - `from` / `to`: default now-24h .. now+24h (RFC 3339 or Unix ms, `now-1h`);
//! - answers the cached slots (forecast and actual, with factor type and fetch time), and
//!   `lowest_window`: the `window`-long stretch of the next 24 h with the lowest average
//!   intensity, where a forecast covers it (`null` otherwise) — the dashboard's hint of when
//!   to run a job.

use crate::api::error::{AccessResponses, ApiError, ErrorResponses, time_param};
use crate::api::state::{AppState, Route};
use crate::store::TimeRange;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use gpufleet_carbon::{IntensitySlot, ProviderKind};
use gpufleet_core::UnixMs;
use gpufleet_core::config::{format_time, parse_duration};
use serde::{Deserialize, Serialize};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![Route::get(
        "/api/v1/carbon/intensity",
        "one region's carbon intensity, with forecast and the lowest window",
        intensity,
    )]
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct Params {
    /// A UK region id (`13`), `national`, or a zone (`DE`).
    #[param(required = true, example = "national")]
    pub(crate) region: Option<String>,
    /// `uk` or `electricitymaps`; default: whichever cached this region.
    pub(crate) provider: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-1h`; default 24 hours before now.
    pub(crate) from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now+1h`; default 24 hours after now.
    pub(crate) to: Option<String>,
    /// Length of the lowest-intensity window (`2h`, between 1ms and 24h); default 2h.
    pub(crate) window: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct SlotView {
    from: String,
    to: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    g_per_kwh: f64,
    /// `forecast` or `actual`.
    kind: &'static str,
    /// `direct` or `lifecycle`.
    factor_type: &'static str,
    estimated: bool,
    fetched_at: String,
}

#[derive(Debug, Serialize, PartialEq, utoipa::ToSchema)]
struct Window {
    from: String,
    to: String,
    from_ms: UnixMs,
    to_ms: UnixMs,
    avg_g_per_kwh: f64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct IntensityView {
    provider: Option<&'static str>,
    region: String,
    from: String,
    to: String,
    slots: Vec<SlotView>,
    /// Lowest-average stretch of `window_seconds` in the next 24 h, where forecast.
    lowest_window: Option<Window>,
    window_seconds: u64,
}

/// The checked parameters of a request (all but `provider`).
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) region: String,
    pub(crate) from: UnixMs,
    pub(crate) to: UnixMs,
    pub(crate) window_ms: i64,
}

/// Checks `region`, `from` / `to` (default now-24h .. now+24h) and `window`.
pub(crate) fn parse_query(p: &Params, now: UnixMs) -> Result<Parsed, ApiError> {
    let region = p
        .region
        .clone()
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| {
            ApiError::BadRequest(
                "region is required: a UK region id (13), national, or a zone (DE)".into(),
            )
        })?;
    let from = time_param("from", p.from.as_deref(), now)?.unwrap_or(now - DAY_MS);
    let to = time_param("to", p.to.as_deref(), now)?.unwrap_or(now + DAY_MS);
    if from > to {
        return Err(ApiError::BadRequest("from is after to".into()));
    }
    let window = match p.window.as_deref() {
        Some(w) => parse_duration(w).map_err(|e| ApiError::BadRequest(format!("window: {e}")))?,
        None => std::time::Duration::from_secs(2 * 3600),
    };
    // A window too long for i64 ms is out of range too, not wrapped into it.
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    if !(1..=DAY_MS).contains(&window_ms) {
        return Err(ApiError::BadRequest(
            "window must be between 1ms and 24h".into(),
        ));
    }
    Ok(Parsed {
        region,
        from,
        to,
        window_ms,
    })
}

/// Cached carbon intensity of a region, with the lowest-intensity window ahead.
#[utoipa::path(get, path = "/api/v1/carbon/intensity", tag = "carbon", params(Params),
    responses((status = 200, description = "the slots", body = IntensityView), ErrorResponses, AccessResponses))]
async fn intensity(
    State(st): State<AppState>,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Json<IntensityView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let now = (st.clock)();
    let Parsed {
        region,
        from,
        to,
        window_ms,
    } = parse_query(&p, now)?;
    let providers: Vec<ProviderKind> = match p.provider.as_deref() {
        Some(name) => vec![ProviderKind::parse(name).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "provider {name:?}: expected uk or electricitymaps (static and csv figures are not cached)"
            ))
        })?],
        None => vec![ProviderKind::Uk, ProviderKind::Electricitymaps],
    };
    let range = TimeRange {
        from_ms: from,
        to_ms: to,
    };
    let mut found: Option<(ProviderKind, Vec<IntensitySlot>)> = None;
    for &kind in &providers {
        let slots = st.store.intensity_slots(kind, &region, range).await?;
        if !slots.is_empty() {
            found = Some((kind, slots));
            break;
        }
    }
    // Nothing in the range: a region with a slot cached at any time is known (an empty
    // range of it is 200 with no slots); one with none at all is a 404. One row read per
    // provider, whatever the cache holds.
    if found.is_none() {
        let mut known = false;
        for kind in &providers {
            let last = st.store.last_intensity_before(*kind, &region, UnixMs::MAX);
            if last.await?.is_some() {
                known = true;
                break;
            }
        }
        if !known {
            return Err(ApiError::NotFound(format!(
                "no carbon intensity is cached for region {region:?}; the collector caches \
                 the regions its nodes are priced with (the config file's [carbon] table)"
            )));
        }
    }
    // The hint looks at the next 24 h whatever the range shown.
    let lowest = match &found {
        Some((kind, _)) => {
            let ahead = st
                .store
                .intensity_slots(
                    *kind,
                    &region,
                    TimeRange {
                        from_ms: now,
                        to_ms: now + DAY_MS,
                    },
                )
                .await?;
            lowest_window(&ahead, now, window_ms)
        }
        None => None,
    };
    let (provider, slots) = match found {
        Some((k, s)) => (Some(k.as_str()), s),
        None => (None, Vec::new()),
    };
    Ok(Json(IntensityView {
        provider,
        region,
        from: format_time(from),
        to: format_time(to),
        slots: slots
            .into_iter()
            .map(|s| SlotView {
                from: format_time(s.from_ms),
                to: format_time(s.to_ms),
                from_ms: s.from_ms,
                to_ms: s.to_ms,
                g_per_kwh: s.g_per_kwh,
                kind: s.kind.as_str(),
                factor_type: s.factor_type.as_str(),
                estimated: s.estimated,
                fetched_at: format_time(s.fetched_at_ms),
            })
            .collect(),
        lowest_window: lowest,
        window_seconds: u64::try_from(window_ms / 1000).unwrap_or(0),
    }))
}

/// The `window_ms`-long stretch starting at a slot boundary at or after `now` (within 24 h)
/// whose time-weighted average intensity is lowest, over contiguous forecast-or-actual
/// slots; `None` when no such stretch is fully covered.
fn lowest_window(slots: &[IntensitySlot], now: UnixMs, window_ms: i64) -> Option<Window> {
    let mut best: Option<Window> = None;
    for (i, start) in slots.iter().enumerate() {
        if start.from_ms < now - start.to_ms.saturating_sub(start.from_ms)
            || start.from_ms > now + DAY_MS
        {
            continue;
        }
        let begin = start.from_ms.max(now - now.rem_euclid(60_000));
        let end = begin + window_ms;
        let (mut covered_to, mut weighted) = (begin, 0.0);
        for s in &slots[i..] {
            if s.from_ms > covered_to {
                break; // a hole
            }
            let a = covered_to.max(s.from_ms);
            let b = end.min(s.to_ms);
            if b > a {
                weighted += s.g_per_kwh * (b - a) as f64;
                covered_to = b;
            }
            if covered_to >= end {
                break;
            }
        }
        if covered_to < end {
            continue;
        }
        let avg = weighted / window_ms as f64;
        if best.as_ref().is_none_or(|b| avg < b.avg_g_per_kwh) {
            best = Some(Window {
                from: format_time(begin),
                to: format_time(end),
                from_ms: begin,
                to_ms: end,
                avg_g_per_kwh: avg,
            });
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_carbon::{FactorType, IntensityKind};

    fn slot(from_ms: i64, g: f64) -> IntensitySlot {
        IntensitySlot {
            from_ms,
            to_ms: from_ms + 1_800_000,
            g_per_kwh: g,
            kind: IntensityKind::Forecast,
            factor_type: FactorType::Direct,
            provider: ProviderKind::Uk,
            region: "13".into(),
            fetched_at_ms: 0,
            estimated: false,
        }
    }

    #[test]
    fn lowest_hour() {
        let h = 1_800_000;
        let slots: Vec<IntensitySlot> = [200.0, 100.0, 120.0, 90.0, 300.0]
            .iter()
            .enumerate()
            .map(|(i, g)| slot(i as i64 * h, *g))
            .collect();
        // One hour = two slots: (200+100)/2, (100+120)/2=110, (120+90)/2=105, (90+300)/2.
        let w = lowest_window(&slots, 0, 2 * h).expect("a window");
        assert_eq!((w.from_ms, w.to_ms, w.avg_g_per_kwh), (2 * h, 4 * h, 105.0));
        // Longer than the forecast: none.
        assert!(lowest_window(&slots, 0, 6 * h).is_none());
        // A hole breaks coverage.
        let holed = vec![slot(0, 10.0), slot(2 * h, 10.0)];
        assert!(lowest_window(&holed, 0, 2 * h).is_none());
    }
}
