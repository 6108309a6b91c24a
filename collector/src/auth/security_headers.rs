//! Security headers on every HTTP response, as one layer around the whole router (routes
//! added later are covered without doing anything).
//!
//! - `Content-Security-Policy: default-src 'self'; …`: scripts, styles, images and fetches
//!   only from the collector itself; no inline scripts or styles, no framing.
//! - `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//!   `X-Frame-Options: DENY` (for browsers without `frame-ancestors`).

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;

/// The policy: everything from our own origin, nothing inline, never framed.
pub const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; \
                       frame-ancestors 'none'; object-src 'none'";

/// `router` with the security headers added to every response.
pub fn with_security_headers(router: Router) -> Router {
    router.layer(middleware::from_fn(add_headers))
}

async fn add_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
