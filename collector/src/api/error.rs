//! The API's errors: [`ApiError`] and the JSON body every error answer carries (it never
//! holds database details), the error answers for the OpenAPI description, and the parsing
//! of time parameters shared by the routes.

use crate::store::StoreError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpufleet_core::UnixMs;
use gpufleet_core::config::parse_time;
use tracing::error;

// The body of every error answer: the API's own type, shared with its clients.
pub use gpufleet_api::ErrorBody;

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
    /// Too much of this work at once: 503 with `Retry-After`.
    #[error("{message}")]
    Busy { message: String, retry_after_s: u32 },
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
    /// The database does not answer now, or too many reports are being built; try again
    /// (after `Retry-After`, when given).
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
        let mut retry_after = None;
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
            ApiError::Busy {
                message,
                retry_after_s,
            } => {
                retry_after = Some(retry_after_s);
                (StatusCode::SERVICE_UNAVAILABLE, message)
            }
        };
        let body = Json(ErrorBody {
            error: clip_echoes(&message),
        });
        let mut response = (status, body).into_response();
        if let Some(s) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

/// Longest run of non-blank characters an error message keeps whole; a longer one (an
/// echoed parameter) keeps its start and says how long it was.
pub const ECHO_MAX_CHARS: usize = 64;
/// Longest error message answered, in characters.
pub const MESSAGE_MAX_CHARS: usize = 1024;

/// `message` with every run of non-blank characters longer than [`ECHO_MAX_CHARS`] cut
/// to its start (`abc…(10000 chars)`), and the whole cut to [`MESSAGE_MAX_CHARS`]: error
/// messages quote what the client sent, and must not send a huge parameter back.
pub fn clip_echoes(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MESSAGE_MAX_CHARS + 16));
    let mut total = 0usize;
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let n = word.chars().count();
        if n > ECHO_MAX_CHARS {
            out.extend(word.chars().take(ECHO_MAX_CHARS));
            out.push_str(&format!("…({n} chars)"));
        } else {
            out.push_str(word);
        }
        total += n.min(ECHO_MAX_CHARS) + 1;
        if total > MESSAGE_MAX_CHARS {
            out.push_str(" …");
            break;
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_parameter_is_cut_to_its_start() {
        let long = "x".repeat(10_000);
        let m = clip_echoes(&format!(
            "from: cannot read {long:?} as a time; write now-15m"
        ));
        assert!(m.starts_with("from: cannot read \"xxxx"), "{m}");
        assert!(m.contains("…(10002 chars) as a time; write now-15m"), "{m}");
        assert!(m.chars().count() < 200, "{m}");
        let words = "ab ".repeat(5_000);
        assert!(clip_echoes(&words).chars().count() <= MESSAGE_MAX_CHARS + 4);
        let plain = "give exactly one of container=, pod=, job= or node=";
        assert_eq!(clip_echoes(plain), plain);
    }

    #[test]
    fn busy_is_a_503_with_retry_after() {
        let r = ApiError::Busy {
            message: "later".into(),
            retry_after_s: 2,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "2");
    }
}
