//! The embedded web dashboard (`web/`, built by `collector/build.rs`): `index.html` at `/`
//! and at the dashboard's own routes (`/node/{name}`, `/gpu/{uuid}`, `/energy`, `/waste`, `/alerts`), and the bundle's
//! files at `/assets/{file}`.
//!
//! Files are looked up by exact name in the table compiled into the binary, so no request
//! can reach anything else. Bundle names carry a content hash: assets are cached as
//! immutable; `index.html` is revalidated on every load, so a new collector's dashboard is
//! picked up at once.

use crate::api::state::Route;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// The dashboard's routes (in [`crate::api::router::routes`]): `index.html` at each of its
/// pages, the bundle's files below `/assets/`.
pub fn routes() -> Vec<Route> {
    vec![
        Route::get("/", "the dashboard: the fleet page", index),
        Route::get("/node/{name}", "the dashboard: one node's page", index),
        Route::get("/gpu/{uuid}", "the dashboard: one GPU's page", index),
        Route::get("/energy", "the dashboard: the energy page", index),
        Route::get("/waste", "the dashboard: the waste page", index),
        Route::get("/alerts", "the dashboard: the alerts page", index),
        Route::get(
            "/assets/{*file}",
            "the dashboard bundle's files, cached as immutable",
            asset,
        ),
    ]
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
