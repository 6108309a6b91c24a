//! The OpenAPI 3.1 description of `/api/v1/*`, derived from the handlers' own parameter and
//! response types (utoipa), served at `GET /api/v1/openapi.json`. The schemas are the types
//! the handlers serialize, so they cannot drift from the answers; the list of paths below is
//! kept by hand, so a new route must be added to it (a test in [`crate::api::router`]
//! fails while a `/api/v1/*` route of the route table is not described, or a described
//! one not routed). The schemathesis run in `scripts/test` holds a running collector to it.

use crate::api::state::Route;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::sync::OnceLock;
use utoipa::OpenApi;

/// The description: every `/api/v1/*` route.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "gpufleet collector API",
        description = "GPU fleet telemetry: nodes, GPUs, series, events, energy per workload, \
            carbon intensity and reports. Times are RFC 3339 UTC or Unix ms (also `now`, \
            `now-15m`, `now+1h`), between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z. \
            Absent metrics are `null`, never 0. Errors are `{\"error\": \"...\"}`."
    ),
    paths(
        crate::api::health::health,
        crate::api::nodes::nodes,
        crate::api::series::series,
        crate::api::dashboard::fleet,
        crate::api::dashboard::node,
        crate::api::dashboard::node_series,
        crate::api::dashboard::host_series,
        crate::api::dashboard::events,
        crate::api::dashboard::gpu,
        crate::api::live::live,
        crate::api::gpu_health::gpus,
        crate::api::gpu_health::xid_entry,
        crate::api::energy::containers,
        crate::api::energy::container,
        crate::api::energy::energy,
        crate::api::energy::energy_series,
        crate::api::waste::waste_view,
        crate::api::carbon::intensity,
        crate::api::reports::report,
        crate::api::reports::report_plot,
        crate::api::alerts::alerts,
        crate::api::alerts::history,
        crate::api::alerts::rules,
        openapi_json,
    ),
    // Referred to by `ErrorResponses`, which does not register it itself.
    components(schemas(crate::api::error::ErrorBody)),
    tags(
        (name = "fleet", description = "nodes, GPUs, their samples and events"),
        (name = "health", description = "GPU and node health with reasons and actions; the Xid catalogue"),
        (name = "energy", description = "energy per workload, GPU and node, with carbon"),
        (name = "carbon", description = "carbon intensity per region"),
        (name = "reports", description = "reports per container, pod, job or node"),
        (name = "alerts", description = "alerts: current, history, rules"),
    )
)]
pub struct ApiDoc;

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![Route::get(
        "/api/v1/openapi.json",
        "the OpenAPI 3.1 description of `/api/v1/*`",
        openapi_json,
    )]
}

/// The description as JSON, built once.
pub fn openapi_bytes() -> &'static [u8] {
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    JSON.get_or_init(|| {
        // Serialising a derived description only fails on a bug; an empty object is
        // still valid JSON and the tests would show it.
        ApiDoc::openapi()
            .to_pretty_json()
            .map_or_else(|_| b"{}".to_vec(), String::into_bytes)
    })
}

/// This description (OpenAPI 3.1, JSON).
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "fleet", responses(
    (status = 200, description = "the OpenAPI description", body = Object),
    crate::api::error::AccessResponses,
))]
async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi_bytes(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboard's TypeScript types are generated from `web/openapi.json`
    /// (`npm run gen:api`), so that file must be this description. After an API change:
    /// `GPUFLEET_WRITE_OPENAPI=1 cargo test -p gpufleet-collector --lib committed_openapi`,
    /// then `npm run gen:api` in `web/`.
    #[test]
    fn the_committed_openapi_json_is_this_description() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../web/openapi.json");
        if std::env::var_os("GPUFLEET_WRITE_OPENAPI").is_some() {
            std::fs::write(&path, openapi_bytes()).expect("writes web/openapi.json");
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == openapi_bytes(),
            "{} differs from the API's description: run \
             GPUFLEET_WRITE_OPENAPI=1 cargo test -p gpufleet-collector --lib committed_openapi, \
             then `npm run gen:api` in web/, and commit both",
            path.display()
        );
    }

    #[test]
    fn describes_every_api_route_as_openapi_3_1() {
        let doc: serde_json::Value =
            serde_json::from_slice(openapi_bytes()).expect("the description is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        for p in [
            "/api/v1/health",
            "/api/v1/nodes",
            "/api/v1/fleet",
            "/api/v1/nodes/{name}",
            "/api/v1/nodes/{name}/series",
            "/api/v1/nodes/{name}/host/series",
            "/api/v1/nodes/{name}/events",
            "/api/v1/gpus/{uuid}",
            "/api/v1/gpus/{uuid}/series",
            "/api/v1/live",
            "/api/v1/containers",
            "/api/v1/containers/{key}",
            "/api/v1/energy",
            "/api/v1/energy/series",
            "/api/v1/waste",
            "/api/v1/carbon/intensity",
            "/api/v1/report",
            "/api/v1/report/plot.png",
            "/api/v1/alerts",
            "/api/v1/alerts/history",
            "/api/v1/alerts/rules",
            "/api/v1/openapi.json",
            "/api/v1/health/gpus",
            "/api/v1/health/xid/{code}",
        ] {
            assert!(paths.contains_key(p), "{p} is not described");
        }
        assert_eq!(paths.len(), 24, "{:?}", paths.keys().collect::<Vec<_>>());
        // Time parameters say what they accept.
        let from = &doc["paths"]["/api/v1/energy"]["get"]["parameters"][0];
        assert_eq!(from["name"], "from");
        assert!(
            from["description"]
                .as_str()
                .is_some_and(|d| d.contains("RFC 3339"))
        );
    }
}
