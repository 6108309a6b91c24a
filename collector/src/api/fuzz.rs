//! The fuzz entry point for the API's query parsing (`fuzz/`, `cargo fuzz`), also run over
//! the committed seed corpus by `cargo test`. Bytes are a query string; it goes through
//! axum's `Query` extractor into each route's parameter type and then through the same
//! checks the handlers run, which must answer Ok or a 400, never panic, and never let a
//! range out that later arithmetic could overflow on.

use crate::api::error::ApiError;
use crate::api::series::{SeriesParams, parse_metric, series_window};
use crate::store::TimeRange;
use axum::extract::Query;
use axum::http::Uri;
use gpufleet_core::times::{MAX_TIME_MS, MIN_TIME_MS};
use serde::de::DeserializeOwned;

/// "Now" for relative times, fixed so runs repeat.
const NOW_MS: i64 = gpufleet_core::fuzz::NOW_MS;

fn query<T: DeserializeOwned>(uri: &Uri) -> Option<T> {
    Query::<T>::try_from_uri(uri).ok().map(|Query(p)| p)
}

/// Ok ranges lie within the accepted times (a default may reach 15 minutes or a day
/// before `from`'s floor, never further), and never run backwards.
fn check(r: &Result<TimeRange, ApiError>) {
    if let Ok(r) = r {
        assert!(r.from_ms <= r.to_ms, "{r:?}");
        assert!(
            r.from_ms >= MIN_TIME_MS - 86_400_000 && r.to_ms <= MAX_TIME_MS,
            "{r:?}"
        );
    }
}

/// A query string, through every route's parameter parsing.
pub fn api_query(data: &[u8]) {
    let q = String::from_utf8_lossy(data);
    let Ok(uri) = format!("/?{q}").parse::<Uri>() else {
        return;
    };
    if let Some(p) = query::<SeriesParams>(&uri) {
        let _ = parse_metric(p.metric.as_deref());
        let w = series_window(
            p.from.as_deref(),
            p.to.as_deref(),
            p.step.as_deref(),
            NOW_MS,
        );
        check(&w.map(|(r, _)| r));
    }
    if let Some(p) = query::<crate::api::energy::RangeParams>(&uri) {
        let _ = crate::api::energy::GroupBy::parse(p.group_by.as_deref());
        check(&crate::api::energy::range_at(&p, NOW_MS));
    }
    if let Some(p) = query::<crate::api::carbon::Params>(&uri) {
        let parsed = crate::api::carbon::parse_query(&p, NOW_MS);
        if let Ok(c) = &parsed {
            assert!((1..=86_400_000).contains(&c.window_ms), "{c:?}");
        }
        check(&parsed.map(|c| TimeRange {
            from_ms: c.from,
            to_ms: c.to,
        }));
    }
    if let Some(p) = query::<crate::api::reports::ReportParams>(&uri) {
        let _ = gpufleet_report::Format::parse(p.format.as_deref().unwrap_or("json"));
        let r = crate::api::energy::RangeParams {
            from: p.from,
            to: p.to,
            ..Default::default()
        };
        check(&crate::api::energy::range_at(&r, NOW_MS));
    }
}
