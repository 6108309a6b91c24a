//! The internet providers against a local stub server (127.0.0.1, ephemeral port) serving
//! the real answer shapes from `../shared/carbon/`: paths, retries with backoff, errors,
//! the token header, timeouts.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use gpufleet_carbon::electricitymaps::ElectricityMapsProvider;
use gpufleet_carbon::http::HttpOptions;
use gpufleet_carbon::uk::UkProvider;
use gpufleet_carbon::{CarbonError, FactorType, IntensityKind, IntensityProvider};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DAY0: i64 = 1_795_132_800_000; // 2026-11-20T00:00Z
const HOUR: i64 = 3_600_000;

fn sample_file(name: &str) -> String {
    let path = format!("{}/../../shared/carbon/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(Debug, Default)]
struct Stub {
    /// Answer 503 to this many requests first.
    fail_first: Mutex<u32>,
    /// Sleep this long before answering.
    delay: Mutex<Duration>,
    requests: Mutex<Vec<String>>,
}

async fn handler(
    State(stub): State<Arc<Stub>>,
    uri: Uri,
    headers: HeaderMap,
) -> axum::response::Response {
    let path = uri.path().to_owned();
    stub.requests
        .lock()
        .expect("lock")
        .push(uri.path_and_query().map_or(path.clone(), |p| p.to_string()));
    let delay = *stub.delay.lock().expect("lock");
    tokio::time::sleep(delay).await;
    {
        let mut fail = stub.fail_first.lock().expect("lock");
        if *fail > 0 {
            *fail -= 1;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    let json = |s: String| ([("content-type", "application/json")], s).into_response();
    if path.starts_with("/v3/") {
        if headers.get("auth-token").and_then(|v| v.to_str().ok()) != Some("tok-123") {
            return (
                StatusCode::UNAUTHORIZED,
                json(r#"{"message":"invalid auth-token"}"#.into()),
            )
                .into_response();
        }
        return match path.as_str() {
            "/v3/carbon-intensity/latest" => json(sample_file("em-v3-latest-DE.json")),
            "/v3/carbon-intensity/history" => json(sample_file("em-v3-history-DE.json")),
            _ => StatusCode::NOT_FOUND.into_response(),
        };
    }
    if path.ends_with("/regionid/13") && path.starts_with("/regional/intensity/") {
        return json(sample_file("uk-regional-fw24h-regionid-13.json"));
    }
    if path == "/regional/regionid/13" {
        return json(sample_file("uk-regional-regionid-13.json"));
    }
    if path == "/intensity" {
        return json(sample_file("uk-intensity.json"));
    }
    (
        StatusCode::BAD_REQUEST,
        json(sample_file("uk-error-400.json")),
    )
        .into_response()
}

async fn stub() -> (String, Arc<Stub>) {
    let stub = Arc::new(Stub::default());
    let app = axum::Router::new()
        .fallback(handler)
        .with_state(Arc::clone(&stub));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), stub)
}

fn options(url: &str, retries: u32) -> HttpOptions {
    HttpOptions {
        retries,
        backoff: Duration::from_millis(5),
        timeout: Duration::from_secs(5),
        ..HttpOptions::new(url)
    }
}

#[tokio::test]
async fn uk_regional_range_fw24h_and_latest() {
    let (url, s) = stub().await;
    let uk = UkProvider::new(options(&url, 0)).expect("client");
    let slots = uk
        .slots("13", DAY0 + 20 * 60_000, DAY0 + HOUR + 10 * 60_000)
        .await
        .expect("slots");
    // 00:00-00:30 (82), 00:30-01:00 (81), 01:00-01:30 (80) overlap 00:20..01:10.
    let got: Vec<(i64, f64)> = slots.iter().map(|x| (x.from_ms, x.g_per_kwh)).collect();
    assert_eq!(
        got,
        vec![(DAY0, 82.0), (DAY0 + HOUR / 2, 81.0), (DAY0 + HOUR, 80.0)]
    );
    let day = uk.forecast_24h("13", DAY0).await.expect("fw24h");
    assert_eq!(day.len(), 48);
    let latest = uk.latest("national").await.expect("latest");
    assert_eq!(
        (latest.g_per_kwh, latest.kind),
        (178.0, IntensityKind::Actual)
    );
    let asked = s.requests.lock().expect("lock").clone();
    assert_eq!(
        asked,
        vec![
            "/regional/intensity/2026-11-20T00:20Z/2026-11-20T01:10Z/regionid/13".to_owned(),
            "/regional/intensity/2026-11-20T00:00Z/fw24h/regionid/13".to_owned(),
            "/intensity".to_owned(),
        ]
    );
}

#[tokio::test]
async fn transient_failures_are_retried_with_backoff_and_4xx_is_not() {
    let (url, s) = stub().await;
    *s.fail_first.lock().expect("lock") = 2;
    let uk = UkProvider::new(options(&url, 3)).expect("client");
    uk.latest("13").await.expect("third attempt succeeds");
    assert_eq!(s.requests.lock().expect("lock").len(), 3);

    s.requests.lock().expect("lock").clear();
    *s.fail_first.lock().expect("lock") = 5;
    let uk1 = UkProvider::new(options(&url, 1)).expect("client");
    let e = uk1.latest("13").await.expect_err("gives up");
    assert!(matches!(e, CarbonError::Http { status: 503, .. }), "{e}");
    assert_eq!(s.requests.lock().expect("lock").len(), 2);

    s.requests.lock().expect("lock").clear();
    *s.fail_first.lock().expect("lock") = 0;
    let e = uk.latest("7").await.expect_err("400");
    let msg = e.to_string();
    assert!(
        msg.contains("carbon provider uk")
            && msg.contains(&format!("{url}/regional/regionid/7"))
            && msg.contains("HTTP 400")
            && msg.contains("valid region ID"),
        "{msg}"
    );
    assert_eq!(
        s.requests.lock().expect("lock").len(),
        1,
        "a 400 is not retried"
    );
}

#[tokio::test]
async fn a_slow_provider_times_out_clearly() {
    let (url, s) = stub().await;
    *s.delay.lock().expect("lock") = Duration::from_secs(3);
    let uk = UkProvider::new(HttpOptions {
        timeout: Duration::from_millis(200),
        ..options(&url, 0)
    })
    .expect("client");
    let e = uk.latest("national").await.expect_err("timeout");
    assert!(matches!(e, CarbonError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string().contains("timed out") && e.to_string().contains(&url),
        "{e}"
    );
}

#[tokio::test]
async fn electricity_maps_sends_the_token_and_never_shows_it() {
    let (url, s) = stub().await;
    let em = ElectricityMapsProvider::new(options(&url, 0), "tok-123\n", FactorType::Lifecycle)
        .expect("client");
    let latest = em.latest("DE").await.expect("latest");
    assert_eq!(
        (latest.g_per_kwh, latest.factor_type),
        (302.0, FactorType::Lifecycle)
    );
    let slots = em
        .slots("DE", DAY0, DAY0 + 3 * HOUR)
        .await
        .expect("history");
    let got: Vec<f64> = slots.iter().map(|x| x.g_per_kwh).collect();
    assert_eq!(got, vec![280.0, 295.0, 310.0]);
    assert!(
        s.requests.lock().expect("lock")[0]
            .starts_with("/v3/carbon-intensity/latest?zone=DE&emissionFactorType=lifecycle")
    );

    let wrong =
        ElectricityMapsProvider::new(options(&url, 0), "tok-wrong-secret", FactorType::Lifecycle)
            .expect("client");
    let e = wrong.latest("DE").await.expect_err("401");
    let text = format!("{e} {e:?} {wrong:?}");
    assert!(
        e.to_string().contains("HTTP 401") && e.to_string().contains("invalid auth-token"),
        "{e}"
    );
    assert!(
        !text.contains("tok-wrong-secret"),
        "the token leaked: {text}"
    );

    // Asking for direct factors and getting lifecycle ones is an error, not a silent mix.
    let direct = ElectricityMapsProvider::new(options(&url, 0), "tok-123", FactorType::Direct)
        .expect("client");
    let e = direct.latest("DE").await.expect_err("mix");
    assert!(
        e.to_string()
            .contains("asked for direct emission factors, got lifecycle"),
        "{e}"
    );
}
