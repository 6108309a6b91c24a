//! `GET /api/v1/health`: liveness, the database's state and exposure warnings; and the
//! probes an orchestrator asks, which need no credential and say nothing else:
//! `GET /livez` (200 while the process serves HTTP) and `GET /readyz` (200 when the
//! store answers, else 503).

use crate::api::error::AccessResponses;
use crate::api::state::AppState;
use crate::net::exposure::ExposureWarnings;
use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::error;

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
pub(crate) async fn health(
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

/// `GET /livez`: the process serves HTTP. Never looks at the store: a database outage
/// must not get the collector restarted.
pub(crate) async fn livez() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the store answers (else 503), so an orchestrator sends traffic only to
/// a collector that can ack.
pub(crate) async fn readyz(State(st): State<AppState>) -> Response {
    match st.store.ping().await {
        Ok(()) => "ok\n".into_response(),
        Err(e) => {
            error!(error = %e, "readiness: the database does not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database does not answer\n",
            )
                .into_response()
        }
    }
}
