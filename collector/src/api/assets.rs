//! The embedded web dashboard (`web/`, built by `collector/build.rs`): `index.html` at `/`
//! and at the dashboard's own routes (`/node/{name}`, `/gpu/{uuid}`, `/energy`, `/waste`, `/alerts`), and the bundle's
//! files at `/assets/{file}`.
//!
//! Files are looked up by exact name in the table compiled into the binary, so no request
//! can reach anything else. Bundle names carry a content hash: assets are cached as
//! immutable; `index.html` is revalidated on every load, so a new collector's dashboard is
//! picked up at once.

use crate::api::router::AppState;
use axum::Router;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// The dashboard's routes (merged into the API router by [`crate::api::router::app`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/node/{name}", get(index))
        .route("/gpu/{uuid}", get(index))
        .route("/energy", get(index))
        .route("/waste", get(index))
        .route("/alerts", get(index))
        .route("/assets/{*file}", get(asset))
}

/// An embedded file by its path below the bundle root (`index.html`, `assets/main-….js`).
pub fn embedded(path: &str) -> Option<(&'static [u8], &'static str)> {
    ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, bytes, ct)| (*bytes, *ct))
}

fn file(path: &str, cache: &'static str) -> Response {
    match embedded(path) {
        Some((bytes, content_type)) => (
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, cache),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such file in the dashboard\n",
        )
            .into_response(),
    }
}

async fn index() -> Response {
    file("index.html", "no-cache")
}

async fn asset(Path(name): Path<String>) -> Response {
    file(
        &format!("assets/{name}"),
        "public, max-age=31536000, immutable",
    )
}
