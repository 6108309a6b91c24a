//! The router of the HTTP API (axum): `/api/v1/*`, `/metrics`, the probes and the dashboard
//! at `/`.
//!
//! [`app`] is built from [`routes`], the route table: each route with its method, its
//! handler and one line on what it answers; the modules of [`crate::api`] list their own.
//! The table below is that table, row for row: a test here fails, naming the rows to add
//! or remove, when the two differ. `GET` routes answer `HEAD` too (axum's `get`); each
//! module's doc gives its routes' parameters.
//!
//! | method | path | what |
//! |---|---|---|
//! | `GET` | `/api/v1/health` | liveness: version, database, node count, exposure warnings; 503 when the database does not answer |
//! | `GET` | `/livez` | probe without credentials: the process serves HTTP |
//! | `GET` | `/readyz` | probe without credentials: the store answers (else 503) |
//! | `GET` | `/api/v1/nodes` | every node with status, delivery state, host, GPUs with inventory and latest sample |
//! | `GET` | `/api/v1/gpus/{uuid}/series` | one metric of one GPU over time (`metric`, `from`, `to`, `step`) |
//! | `GET` | `/metrics` | the OpenMetrics exposition |
//! | `GET` | `/api/v1/live` | live updates as Server-Sent Events (`tick`, `status`) |
//! | `GET` | `/` | the dashboard: the fleet page |
//! | `GET` | `/node/{name}` | the dashboard: one node's page |
//! | `GET` | `/gpu/{uuid}` | the dashboard: one GPU's page |
//! | `GET` | `/energy` | the dashboard: the energy page |
//! | `GET` | `/waste` | the dashboard: the waste page |
//! | `GET` | `/alerts` | the dashboard: the alerts page |
//! | `GET` | `/assets/{*file}` | the dashboard bundle's files, cached as immutable |
//! | `GET` | `/api/v1/fleet` | every node in brief: what the fleet page's tiles show |
//! | `GET` | `/api/v1/nodes/{name}` | one node, as in `/api/v1/nodes` |
//! | `GET` | `/api/v1/nodes/{name}/series` | one GPU metric for every GPU of the node |
//! | `GET` | `/api/v1/nodes/{name}/host/series` | the node's host metrics (CPU, memory, disk, network) |
//! | `GET` | `/api/v1/nodes/{name}/events` | the node's events (Xid, ECC, …), oldest first |
//! | `GET` | `/api/v1/gpus/{uuid}` | one GPU, with its node's name and sampling interval |
//! | `GET` | `/api/v1/health/gpus` | every GPU (and node) at least as bad as `state` (default `warning`), worst first |
//! | `GET` | `/api/v1/health/xid/{code}` | the catalogue entry of one Xid code |
//! | `GET` | `/api/v1/containers` | energy per container (or pod, namespace, job, Slurm account, user) |
//! | `GET` | `/api/v1/containers/{key}` | one workload's energy, with a per-minute series |
//! | `GET` | `/api/v1/energy` | fleet total and energy per GPU (missing time, idle, method mix) |
//! | `GET` | `/api/v1/energy/series` | energy over time: the biggest groups, the rest, idle and unattributed per bucket |
//! | `GET` | `/api/v1/carbon/intensity` | one region's carbon intensity, with forecast and the lowest window |
//! | `GET` | `/api/v1/waste` | idle-but-allocated episodes and totals per workload |
//! | `GET` | `/api/v1/report` | the report per container, pod, job or node (`json`, `yaml`, `csv`, `table`) |
//! | `GET` | `/api/v1/report/plot.png` | the report's time-series plot (PNG) |
//! | `GET` | `/api/v1/alerts` | current alerts, firing first |
//! | `GET` | `/api/v1/alerts/history` | alert state changes, newest first |
//! | `GET` | `/api/v1/alerts/rules` | the rules this collector evaluates when it leads, with the signals they can use |
//! | `GET` | `/api/v1/openapi.json` | the OpenAPI 3.1 description of `/api/v1/*` |
//!
//! Timestamps in responses are RFC 3339 UTC (`last_seen`, `time`, `from`) with a Unix-ms
//! twin (`last_seen_ms`, `time_ms`, `from_ms`). Parameters accept RFC 3339, Unix ms,
//! `now` or `now-15m`. Absent metrics are `null`, never 0. Errors are
//! `{"error": "what went wrong and what to do"}` and never carry database details.

use crate::api::error::ApiError;
pub use crate::api::state::{AppState, Route};
use crate::api::{health, nodes, prometheus, series};
use axum::Router;

/// The route table: every route the API serves, in the order of the module doc's table.
/// A new route goes into its module's `routes()` and into that table.
pub fn routes() -> Vec<Route> {
    let mut table = vec![
        Route::get(
            "/api/v1/health",
            "liveness: version, database, node count, exposure warnings; 503 when the database does not answer",
            health::health,
        ),
        Route::get(
            "/livez",
            "probe without credentials: the process serves HTTP",
            health::livez,
        ),
        Route::get(
            "/readyz",
            "probe without credentials: the store answers (else 503)",
            health::readyz,
        ),
        Route::get(
            "/api/v1/nodes",
            "every node with status, delivery state, host, GPUs with inventory and latest sample",
            nodes::nodes,
        ),
        Route::get(
            "/api/v1/gpus/{uuid}/series",
            "one metric of one GPU over time (`metric`, `from`, `to`, `step`)",
            series::series,
        ),
        Route::get(
            "/metrics",
            "the OpenMetrics exposition",
            prometheus::metrics,
        ),
        Route::get(
            "/api/v1/live",
            "live updates as Server-Sent Events (`tick`, `status`)",
            crate::api::live::live,
        ),
    ];
    // The dashboard: its pages and the bundle's files.
    table.extend(crate::api::assets::routes());
    // The node and GPU detail pages' endpoints.
    table.extend(crate::api::dashboard::routes());
    // Fleet health (GPUs / nodes not ok, why, what to do) and the Xid catalogue.
    table.extend(crate::api::gpu_health::routes());
    // Energy per container / pod / job / user, per GPU, fleet totals.
    table.extend(crate::api::energy::routes());
    // Carbon intensity per region with forecast and the lowest window.
    table.extend(crate::api::carbon::routes());
    // Idle-but-allocated episodes: who holds an idle GPU, and what it burns.
    table.extend(crate::api::waste::routes());
    // Reports per container / pod / job / node, and their plot.
    table.extend(crate::api::reports::routes());
    // Current alerts, their history, the rules.
    table.extend(crate::api::alerts::routes());
    // The OpenAPI description of `/api/v1/*`.
    table.extend(crate::api::openapi::routes());
    table
}

/// What the fallback answers for a path no route serves.
const NO_SUCH_ENDPOINT: &str =
    "no such endpoint; see /api/v1/openapi.json for the API, and /metrics";

/// The router, built from [`routes`]. Tests call it without a socket:
/// `app(state).oneshot(request)`.
pub fn app(state: AppState) -> Router {
    routes()
        .into_iter()
        // Routes on one path with different methods are merged by axum into one
        // method router; two on the same path and method panic here, at start.
        .fold(Router::<AppState>::new(), |router, route| {
            router.route(route.path, route.handler)
        })
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound(NO_SUCH_ENDPOINT.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::state::Live;
    use crate::live::status::StatusPolicy;
    use crate::metrics::Metrics;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::ServiceExt;

    /// The source of this module, whose doc holds the table.
    const SOURCE: &str = include_str!("router.rs");

    /// A row of the table: (method, path) → what.
    type Rows = BTreeMap<(String, String), String>;

    /// The rows of the module doc's table (its `//! |` lines, less the header and the
    /// separator), with the backticks around method and path taken off.
    fn doc_rows() -> Rows {
        let mut rows = Rows::new();
        for line in SOURCE.lines().filter_map(|l| l.strip_prefix("//! |")) {
            let cells: Vec<&str> = line
                .trim_end()
                .trim_end_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let [method, path, what] = cells[..] else {
                panic!(
                    "a row of router.rs's route table is not `| method | path | what |`: |{line}"
                );
            };
            if method == "method" || method.starts_with("---") {
                continue;
            }
            let key = (
                method.trim_matches('`').to_owned(),
                path.trim_matches('`').to_owned(),
            );
            let dup = rows.insert(key.clone(), what.to_owned());
            assert!(dup.is_none(), "router.rs's doc lists {key:?} twice");
        }
        rows
    }

    /// The rows as the route table has them; duplicates fail.
    fn table_rows() -> Rows {
        let mut rows = Rows::new();
        for r in routes() {
            assert!(
                !r.what.contains(['|', '\n']) && !r.what.trim().is_empty(),
                "{} {}: `what` must be one non-empty line without `|`",
                r.method,
                r.path
            );
            let key = (r.method.to_owned(), r.path.to_owned());
            let dup = rows.insert(key.clone(), r.what.to_owned());
            assert!(dup.is_none(), "the route table has {key:?} twice");
        }
        rows
    }

    fn doc_line((method, path): &(String, String), what: &str) -> String {
        format!("//! | `{method}` | `{path}` | {what} |")
    }

    /// The table as the router has it, to paste into the module doc.
    fn expected_table() -> String {
        let mut out = String::from("//! | method | path | what |\n//! |---|---|---|\n");
        for r in routes() {
            let key = (r.method.to_owned(), r.path.to_owned());
            out.push_str(&doc_line(&key, r.what));
            out.push('\n');
        }
        out
    }

    #[test]
    fn the_doc_table_lists_every_route_the_router_serves() {
        let doc = doc_rows();
        let table = table_rows();
        let missing: Vec<String> = table
            .iter()
            .filter(|(k, _)| !doc.contains_key(*k))
            .map(|(k, what)| doc_line(k, what))
            .collect();
        let extra: Vec<String> = doc
            .iter()
            .filter(|(k, _)| !table.contains_key(*k))
            .map(|(k, what)| doc_line(k, what))
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "router.rs's module doc table and the route table (`routes()`) differ.\n\
             Routed but not in the doc (add these rows):\n{}\n\
             In the doc but not routed (remove these rows, or route them):\n{}\n\
             The whole table, as the router has it:\n{}",
            missing.join("\n"),
            extra.join("\n"),
            expected_table(),
        );
        // Each row's line says what its route's `what` says.
        let differ: Vec<String> = table
            .iter()
            .filter(|(k, what)| doc.get(*k) != Some(*what))
            .map(|(k, what)| {
                format!(
                    "{}\n  the doc has: {}",
                    doc_line(k, what),
                    doc.get(k).map_or("", String::as_str)
                )
            })
            .collect();
        assert!(
            differ.is_empty(),
            "router.rs's module doc describes these routes otherwise than their `what` in the \
             route table; make the two the same (the table's line first):\n{}\n\
             The whole table, as the router has it:\n{}",
            differ.join("\n"),
            expected_table(),
        );
    }

    /// `path` with each `{param}` (and `{*rest}`) replaced by `1`: a URI it serves.
    fn concrete(path: &str) -> String {
        path.split('/')
            .map(|seg| if seg.starts_with('{') { "1" } else { seg })
            .collect::<Vec<_>>()
            .join("/")
    }

    #[tokio::test]
    async fn every_route_answers_through_the_router() {
        const T0: gpufleet_core::UnixMs = 1_800_000_000_000;
        let store = crate::store::open("sqlite::memory:").await.expect("store");
        let state = AppState {
            store,
            live: Arc::new(Live::new()),
            metrics: Arc::new(Metrics::default()),
            writer: None,
            status: StatusPolicy::default(),
            clock: Arc::new(|| T0),
            workloads: Default::default(),
            waste: Default::default(),
            renders: Default::default(),
        };
        let router = app(state);
        for r in routes() {
            let uri = concrete(r.path);
            let request = Request::builder()
                .method(r.method)
                .uri(uri.as_str())
                .body(Body::empty())
                .expect("request");
            // Any answer but the fallback's (or 405, a path served for other methods
            // only) shows the route is mounted; 400 for missing parameters is fine. The
            // body is read only on 404: `/api/v1/live` never ends its own.
            let response =
                tokio::time::timeout(Duration::from_secs(30), router.clone().oneshot(request))
                    .await
                    .unwrap_or_else(|_| panic!("{} {uri}: no answer in 30 s", r.method))
                    .expect("infallible");
            let status = response.status();
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{} {uri}: the route table's method is not the one routed",
                r.method
            );
            if status == StatusCode::NOT_FOUND {
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
                let body = String::from_utf8_lossy(&body);
                assert!(
                    !body.contains(NO_SUCH_ENDPOINT),
                    "{} {uri} ({}) reached the fallback: {body}",
                    r.method,
                    r.path
                );
            }
        }
    }

    /// Every `/api/v1/*` route is in the OpenAPI description, with its method, and the
    /// description has no path or method the router does not serve.
    #[test]
    fn every_api_route_is_in_the_openapi_description() {
        // (method, path, why): `/api/v1/*` routes deliberately left out of the
        // description. None today: even the SSE stream `/api/v1/live` is described.
        const UNDESCRIBED: &[(&str, &str, &str)] = &[];
        const METHODS: [&str; 8] = [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ];
        let doc: serde_json::Value = serde_json::from_slice(crate::api::openapi::openapi_bytes())
            .expect("the description is JSON");
        let paths = doc["paths"].as_object().expect("paths");
        let mut described = BTreeSet::new();
        for (path, item) in paths {
            for method in item.as_object().expect("a path item").keys() {
                if METHODS.contains(&method.as_str()) {
                    described.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let routed: BTreeSet<(String, String)> = routes()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/"))
            .map(|r| (r.method.to_owned(), r.path.to_owned()))
            .collect();
        let left_out: BTreeSet<(String, String)> = UNDESCRIBED
            .iter()
            .map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned()))
            .collect();
        let missing: Vec<_> = routed
            .difference(&described)
            .filter(|r| !left_out.contains(*r))
            .collect();
        let unrouted: Vec<_> = described.difference(&routed).collect();
        let needless: Vec<_> = left_out.intersection(&described).collect();
        let unknown: Vec<_> = left_out.difference(&routed).collect();
        assert!(
            missing.is_empty() && unrouted.is_empty() && needless.is_empty() && unknown.is_empty(),
            "the OpenAPI description (crate::api::openapi::ApiDoc) and the route table differ.\n\
             Routed, not described (add the handler to ApiDoc's `paths`, or to UNDESCRIBED \
             here with why): {missing:?}\n\
             Described, not routed (route it, or take it out of ApiDoc): {unrouted:?}\n\
             In UNDESCRIBED but described (take it out of UNDESCRIBED): {needless:?}\n\
             In UNDESCRIBED but not routed (take it out of UNDESCRIBED): {unknown:?}"
        );
    }
}
