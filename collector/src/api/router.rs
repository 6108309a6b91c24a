//! The router of the HTTP API (axum): `/api/v1/*`, `/metrics` and the dashboard at `/`.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/health` | `{"status": "ok", "version", "db", "nodes", "warnings"}` (`warnings`: exposure warnings, [`crate::net::exposure`]); 503 when the database does not answer |
//! | `GET /livez`, `GET /readyz` | probes without credentials: the process serves; the store answers (else 503) |
//! | `GET /api/v1/nodes` | every node with status, delivery state, host, GPUs with inventory and latest sample |
//! | `GET /api/v1/gpus/{uuid}/series?metric=&from=&to=&step=` | one metric of one GPU over time |
//! | `GET /metrics` | OpenMetrics exposition ([`crate::api::prometheus`]) |
//! | `GET /`, `/node/{name}`, `/gpu/{uuid}`, `/assets/*` | the dashboard ([`crate::api::assets`]) |
//! | `GET /api/v1/live` | live updates, Server-Sent Events ([`crate::api::live`]) |
//! | `GET /api/v1/nodes/{name}[/series, /host/series, /events]`, `/api/v1/gpus/{uuid}` | [`crate::api::dashboard`] |
//! | `GET /api/v1/alerts[/history, /rules]` | alerts ([`crate::api::alerts`]) |
//! | `GET /api/v1/health/gpus?state=`, `/api/v1/health/xid/{code}` | fleet health and the Xid catalogue ([`crate::api::gpu_health`]) |
//! | `GET /api/v1/waste` | idle-but-allocated episodes ([`crate::api::waste`]) |
//! | `GET /api/v1/openapi.json` | the OpenAPI description of `/api/v1/*` ([`crate::api::openapi`]) |
//!
//! Timestamps in responses are RFC 3339 UTC (`last_seen`, `time`, `from`) with a Unix-ms
//! twin (`last_seen_ms`, `time_ms`, `from_ms`). Parameters accept RFC 3339, Unix ms,
//! `now` or `now-15m`. Absent metrics are `null`, never 0. Errors are
//! `{"error": "what went wrong and what to do"}` and never carry database details.

use crate::api::error::ApiError;
use crate::api::{health, nodes, prometheus, series};
use crate::ingest::writer::WriterHandle;
use crate::live::state::Live;
use crate::live::status::{Clock, StatusPolicy};
use crate::metrics::Metrics;
use crate::store::Store;
use axum::Router;
use axum::routing::get;
use std::sync::Arc;

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
    /// The per-workload counters `/metrics` exposes, refreshed in the background
    /// ([`crate::accounting::counters`]).
    pub workloads: Arc<crate::accounting::counters::WorkloadCounters>,
    /// The idle-but-allocated rule's defaults (`--waste-util-threshold`,
    /// `--waste-min-idle`) for `/api/v1/waste`.
    pub waste: crate::accounting::waste::WasteSettings,
    /// Report and plot builds at once, bounded ([`crate::api::renders`]).
    pub renders: Arc<crate::api::renders::Renders>,
}

/// The router. Tests call it without a socket: `app(state).oneshot(request)`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/api/v1/health", get(health::health))
        .route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        .route("/api/v1/nodes", get(nodes::nodes))
        .route("/api/v1/gpus/{uuid}/series", get(series::series))
        .route("/metrics", get(prometheus::metrics))
        // The dashboard: pages and assets, its live stream, node/GPU detail API.
        .merge(crate::api::assets::routes())
        .route("/api/v1/live", get(crate::api::live::live))
        .merge(crate::api::dashboard::routes())
        // Fleet health (GPUs / nodes not ok, why, what to do) and the Xid catalogue.
        .merge(crate::api::gpu_health::routes())
        // Energy per container / pod / job / user, per GPU, fleet totals.
        .merge(crate::api::energy::routes())
        // Carbon intensity per region with forecast and the lowest window.
        .merge(crate::api::carbon::routes())
        // Idle-but-allocated episodes: who holds an idle GPU, and what it burns.
        .merge(crate::api::waste::routes())
        // Reports per container / pod / job / node, and their plot.
        .merge(crate::api::reports::routes())
        // Current alerts, their history, the rules.
        .merge(crate::api::alerts::routes())
        // The OpenAPI description of all of the above.
        .merge(crate::api::openapi::routes())
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound(
        "no such endpoint; see /api/v1/openapi.json for the API, and /metrics".into(),
    )
}
