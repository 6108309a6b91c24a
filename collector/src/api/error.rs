//! The API's errors: [`ApiError`] and the JSON body every error answer carries (it never
//! holds database details), the error answers for the OpenAPI description, and the parsing
//! of time parameters shared by the routes.

use crate::store::StoreError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpufleet_core::UnixMs;
use gpufleet_core::config::parse_time;
use serde::Serialize;
use tracing::error;

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
