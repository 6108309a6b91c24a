//! The embedded dashboard: types, cache headers, nothing else served.

use super::*;

#[tokio::test]
async fn the_dashboard_is_embedded_with_types_and_cache_headers_and_nothing_else() {
    let f = Fixture::new().await;
    let get = |uri: &'static str| {
        let st = f.state();
        async move {
            let r = app(st)
                .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
                .await
                .expect("infallible");
            let status = r.status();
            let header = |h: &str| {
                r.headers()
                    .get(h)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (ct, cache) = (header("content-type"), header("cache-control"));
            let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .expect("body");
            (
                status,
                ct,
                cache,
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    let (status, ct, cache, html) = get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ct, "text/html; charset=utf-8");
    assert_eq!(cache, "no-cache");
    // No inline script or style (a strict CSP must not break the page).
    assert!(
        !html.contains("<style") && !html.contains(" style="),
        "{html}"
    );
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script type=\"module\" src=\"/assets/")
            .count(),
        "{html}"
    );
    for route in ["/node/gpu-node-01", "/gpu/GPU-a"] {
        let (status, _, _, body) = get(route).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, html.as_str()),
            "{route}"
        );
    }
    // Every asset the page names is served with its type and as immutable.
    let assets: Vec<&str> = html
        .split('"')
        .filter(|s| s.starts_with("/assets/"))
        .collect();
    // The script, the style sheet and the favicon (so browsers never ask for
    // /favicon.ico and log a 404).
    assert_eq!(assets.len(), 3, "{html}");
    assert!(
        html.contains("<link rel=\"icon\" type=\"image/svg+xml\" href=\"/assets/favicon-"),
        "{html}"
    );
    for a in assets {
        let uri: &'static str = Box::leak(a.to_owned().into_boxed_str());
        let (status, ct, cache, body) = get(uri).await;
        assert_eq!(status, StatusCode::OK, "{a}");
        let (want, least) = if a.ends_with(".js") {
            ("text/javascript; charset=utf-8", 1000)
        } else if a.ends_with(".svg") {
            ("image/svg+xml", 100)
        } else {
            ("text/css; charset=utf-8", 1000)
        };
        assert_eq!(ct, want, "{a}");
        assert_eq!(cache, "public, max-age=31536000, immutable", "{a}");
        assert!(body.len() > least, "{a}");
    }
    for bad in [
        "/assets/nope.js",
        "/assets/../Cargo.toml",
        "/assets/%2e%2e%2fCargo.toml",
        "/assets/..%2f..%2fcollector%2fCargo.toml",
        "/assets//etc/passwd",
        "/index.html/../Cargo.toml",
    ] {
        let (status, _, _, body) = get(bad).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{bad}: {body}");
        assert!(!body.contains("[package]"), "{bad}");
    }
}
