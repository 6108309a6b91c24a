//! Carbon accounting through the real store, the real accountant and the real HTTP
//! providers, against a local stub server (127.0.0.1, ephemeral port) that serves the
//! UK API's and Electricity Maps' answers from `../shared/carbon/`.

use crate::common::*;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use gpufleet_carbon::config::CarbonFile;
use gpufleet_carbon::{CarbonConfig, CarbonSettings, IntensityKind, ProviderKind};
use gpufleet_collector::accounting::accountant::{
    Accountant, EnergyOptions, IdleConfig, IdleWatts,
};
use gpufleet_collector::accounting::carbon::{CarbonOptions, PassReport, Pricer};
use gpufleet_collector::accounting::energy::IdlePolicy;
use gpufleet_collector::live::status::Clock;
use gpufleet_collector::store::carbon::PriceBasis;
use gpufleet_collector::store::{NodeRecord, Store, TimeRange};
use gpufleet_core::*;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MIN: i64 = 60_000;
/// 2026-11-20T00:00Z, the first slot of `uk-regional-fw24h-regionid-13.json`.
const DAY0: i64 = 1_795_132_800_000;
const HOUR: i64 = 3_600_000;
/// 300 W for 10 s.
const TICK_MJ: u64 = 3_000_000;
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn sample_file(name: &str) -> String {
    let path = format!("{}/../../shared/carbon/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ------------------------------------------------------------------ the stub server

/// What the stub answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// The sample files.
    Up,
    /// National slots: the 10:30 slot with its actual (`uk-intensity-actual-null.json`
    /// with `actual` filled in).
    ActualNow,
    /// HTTP 503, no body.
    Down,
    /// HTTP 400 with `uk-error-400.json`.
    Error400,
    /// HTTP 200 with a body that is JSON but not the API's shape.
    Malformed,
}

#[derive(Debug)]
struct Stub {
    mode: Mutex<Mode>,
    /// Paths (with query) asked, in order.
    requests: Mutex<Vec<String>>,
}

async fn stub_handler(
    State(stub): State<Arc<Stub>>,
    uri: Uri,
    headers: HeaderMap,
) -> axum::response::Response {
    let path = uri.path().to_owned();
    let full = uri.path_and_query().map_or(path.clone(), |p| p.to_string());
    stub.requests.lock().expect("lock").push(full);
    let mode = *stub.mode.lock().expect("lock");
    let json = |body: String| ([("content-type", "application/json")], body).into_response();
    match mode {
        Mode::Down => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Mode::Error400 => {
            return (
                StatusCode::BAD_REQUEST,
                [("content-type", "application/json")],
                sample_file("uk-error-400.json"),
            )
                .into_response();
        }
        Mode::Malformed => return json(r#"{"data": {"regionid": 13, "data": "soon"}}"#.into()),
        Mode::Up | Mode::ActualNow => {}
    }
    if path.starts_with("/v3/") {
        if headers.get("auth-token").and_then(|v| v.to_str().ok()) != Some("em-secret-token") {
            return (
                StatusCode::UNAUTHORIZED,
                json(r#"{"message":"missing or wrong auth-token"}"#.into()),
            )
                .into_response();
        }
        return match path.as_str() {
            "/v3/carbon-intensity/latest" => json(sample_file("em-v3-latest-DE.json")),
            "/v3/carbon-intensity/history" => json(sample_file("em-v3-history-DE.json")),
            _ => StatusCode::NOT_FOUND.into_response(),
        };
    }
    if path.starts_with("/regional/intensity/") && path.ends_with("/regionid/13") {
        return json(sample_file("uk-regional-fw24h-regionid-13.json"));
    }
    if path == "/regional/regionid/13" {
        return json(sample_file("uk-regional-regionid-13.json"));
    }
    if path == "/intensity" || path.starts_with("/intensity/") {
        if mode == Mode::ActualNow {
            let mut v: serde_json::Value =
                serde_json::from_str(&sample_file("uk-intensity-actual-null.json")).expect("json");
            v["data"][0]["intensity"]["actual"] = serde_json::json!(200);
            return json(v.to_string());
        }
        return json(sample_file("uk-intensity-actual-null.json"));
    }
    (
        StatusCode::BAD_REQUEST,
        json(sample_file("uk-error-400.json")),
    )
        .into_response()
}

async fn start_stub() -> (String, Arc<Stub>) {
    let stub = Arc::new(Stub {
        mode: Mutex::new(Mode::Up),
        requests: Mutex::new(Vec::new()),
    });
    let app = axum::Router::new()
        .fallback(stub_handler)
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

fn set_mode(stub: &Stub, mode: Mode) {
    *stub.mode.lock().expect("lock") = mode;
}

// ------------------------------------------------------------------ energy set-up

async fn one_gpu_node(store: &Arc<dyn Store>, node: &str, uuid: &str) -> NodeRecord {
    store
        .register_node(
            &hello(node),
            &inventory(vec![gpu_info_sparse(uuid, 0)]),
            DAY0,
        )
        .await
        .expect("register")
}

/// Ticks every 10 s from `from` to `to` (inclusive) at 300 W, counter exact, one
/// container (A) at 100 % SM.
async fn write_trace(
    store: &Arc<dyn Store>,
    node: &NodeRecord,
    uuid: &str,
    from: UnixMs,
    to: UnixMs,
) {
    let mut ticks = Vec::new();
    let mut k = 0u64;
    let mut t = from;
    while t <= to {
        ticks.push(Tick {
            time_ms: t,
            gpus: vec![GpuSample {
                gpu_uuid: uuid.into(),
                util_gpu_pct: Some(100),
                power_mw: Some(300_000),
                energy_mj: Some(1_000_000 + k * TICK_MJ),
                ..Default::default()
            }],
            processes: vec![ProcessSample {
                gpu_uuid: uuid.into(),
                pid: 42,
                process_type: ProcessType::Compute,
                user: None,
                command: Some("python train.py".into()),
                gpu_mem_bytes: Some(1 << 30),
                sm_util_pct: Some(100),
                mem_util_pct: None,
                enc_util_pct: None,
                dec_util_pct: None,
                workload: container_workload(A, Some("train")),
                mig_uuid: None,
            }],
            ..Default::default()
        });
        k += 1;
        t += 10_000;
    }
    let batch = Batch {
        seq: 1,
        ticks,
        delivery: DeliveryStats::default(),
    };
    store
        .write_batches(&[node_batch(node, batch)])
        .await
        .expect("write");
    let options = EnergyOptions {
        idle_policy: IdlePolicy::Spread,
        idle: IdleConfig {
            default: IdleWatts::Milliwatts(50_000),
            per_model: vec![],
        },
        max_gap: Some(Duration::from_secs(60)),
        // These tests price closed minutes.
        provisional: false,
        ..Default::default()
    };
    let mut acc = Accountant::new(store.clone(), options, Arc::new(move || to));
    acc.pass().await.expect("energy pass");
}

fn carbon_config(args: CarbonSettings) -> Arc<CarbonConfig> {
    Arc::new(CarbonConfig::new(args, CarbonFile::default()).expect("valid carbon config"))
}

fn uk_args(url: &str, region: &str, pue: f64, default: Option<f64>) -> CarbonSettings {
    CarbonSettings {
        carbon_provider: Some(ProviderKind::Uk),
        carbon_region: Some(region.into()),
        carbon_url: Some(url.into()),
        carbon_g_per_kwh: default,
        carbon_retries: 1,
        pue,
        ..Default::default()
    }
}

/// A pricer whose clock reads `now` (shared, so the test can move it).
fn pricer(store: &Arc<dyn Store>, config: Arc<CarbonConfig>, now: Arc<AtomicI64>) -> Pricer {
    let clock: Clock = Arc::new(move || now.load(Ordering::SeqCst));
    let options = CarbonOptions {
        config,
        ..Default::default()
    };
    Pricer::new(store.clone(), store.clone(), options, clock)
}

fn all_time() -> TimeRange {
    TimeRange {
        from_ms: 0,
        to_ms: DAY0 + 48 * HOUR,
    }
}

async fn get_json(store: &Arc<dyn Store>, now: UnixMs, uri: &str) -> (u16, serde_json::Value) {
    api_get_json(store, now, uri).await
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn a_trace_over_three_half_hours_is_priced_slot_by_slot_times_pue() {
    let (_dir, store) = sqlite_store().await;
    priced_slot_by_slot_times_pue(store).await;
}

/// The same pricing, through the API too, on PostgreSQL.
#[tokio::test]
async fn postgres_a_trace_over_three_half_hours_is_priced_slot_by_slot_times_pue() {
    let (_schema, store) = pg_store().await;
    priced_slot_by_slot_times_pue(store).await;
}

async fn priced_slot_by_slot_times_pue(store: Arc<dyn Store>) {
    let (url, stub) = start_stub().await;
    let node = one_gpu_node(&store, "lon-1", "GPU-c1").await;
    // 00:20:00 .. 01:10:00 at 300 W: minutes 00:20 .. 01:09 are closed.
    write_trace(&store, &node, "GPU-c1", DAY0 + 20 * MIN, DAY0 + 70 * MIN).await;
    let now = Arc::new(AtomicI64::new(DAY0 + 2 * HOUR));
    let mut p = pricer(
        &store,
        carbon_config(uk_args(&url, "13", 1.2, None)),
        Arc::clone(&now),
    );
    let report = p.run_once().await.expect("pass");
    assert_eq!(report.provider_errors, Vec::<String>::new());
    assert_eq!(
        (report.priced, report.estimated, report.unpriced),
        (50, 0, 0)
    );

    // By hand. An interval belongs to the minute holding its end; 18 kJ per full minute;
    // minute 00:20 has 5 intervals (15 kJ). The London forecast (fw24h file):
    // 00:00-00:30 82 g/kWh, 00:30-01:00 81, 01:00-01:30 80.
    let e1 = 15_000.0 + 9.0 * 18_000.0; // J in 00:20..00:29
    let e2 = 30.0 * 18_000.0; // 00:30..00:59
    let e3 = 10.0 * 18_000.0; // 01:00..01:09
    let want_g = (e1 * 82.0 + e2 * 81.0 + e3 * 80.0) / 3.6e6 * 1.2;
    assert!(close(want_g, 24.2180), "hand figure {want_g}");

    let gpu = &store.gpu_carbon(all_time()).await.expect("gpu carbon")[0];
    assert!(
        close(gpu.totals.carbon_g, want_g),
        "{} vs {want_g}",
        gpu.totals.carbon_g
    );
    assert_eq!(gpu.totals.sources, vec!["uk:13:direct".to_owned()]);
    assert_eq!(
        gpu.totals.forecast_mj, gpu.totals.priced_mj,
        "regional figures are forecasts"
    );

    // The per-minute rows record their provenance.
    let minutes = store
        .carbon_minutes(None, all_time())
        .await
        .expect("minutes");
    let m = minutes
        .iter()
        .find(|m| m.minute_ms == DAY0 + 45 * MIN)
        .expect("00:45");
    assert_eq!(
        (m.g_per_kwh, m.pue, m.kind, m.basis),
        (81.0, 1.2, IntensityKind::Forecast, PriceBasis::Slot)
    );
    assert_eq!(
        (m.region.as_str(), m.estimated, m.energy_mj),
        ("13", false, 18_000_000)
    );

    // The API: the one container got all the energy, so all the carbon; fleet the same.
    let (s, v) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!("/api/v1/containers?from={DAY0}&to={}", DAY0 + 2 * HOUR),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let row = &v["rows"][0];
    assert!(close(f(&row["carbon_g"]), want_g), "{row}");
    assert!(close(f(&row["carbon"]["forecast_share"]), 1.0), "{row}");
    assert!(close(f(&row["carbon"]["estimated_share"]), 0.0), "{row}");
    assert!(close(f(&row["carbon"]["priced_share"]), 1.0), "{row}");
    let avg = (e1 * 82.0 + e2 * 81.0 + e3 * 80.0) / (e1 + e2 + e3);
    assert!(close(f(&row["carbon"]["avg_g_per_kwh"]), avg), "{row}");
    let key = row["key"].as_str().expect("key").to_owned();
    let (s, one) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!(
            "/api/v1/containers/{key}?from={DAY0}&to={}",
            DAY0 + 2 * HOUR
        ),
    )
    .await;
    assert_eq!(s, 200, "{one}");
    assert!(close(f(&one["carbon_g"]), want_g), "{one}");
    let (s, e) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!("/api/v1/energy?from={DAY0}&to={}", DAY0 + 2 * HOUR),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    assert!(close(f(&e["total"]["carbon_g"]), want_g), "{e}");
    assert!(close(f(&e["nodes"]["lon-1"]["carbon_g"]), want_g), "{e}");
    assert!(close(f(&e["gpus"][0]["carbon_g"]), want_g), "{e}");

    // The pass also prefetched 24 h of forecast; the intensity API shows it with the
    // lowest 2 h window ahead of "now" (02:00).
    let asked = stub.requests.lock().expect("lock").clone();
    assert!(
        asked.iter().any(|r| r.contains("/fw24h/regionid/13")),
        "{asked:?}"
    );
    let (s, iv) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        "/api/v1/carbon/intensity?region=13&window=2h",
    )
    .await;
    assert_eq!(s, 200, "{iv}");
    assert_eq!(iv["provider"], "uk");
    assert!(iv["slots"].as_array().expect("slots").len() >= 48, "{iv}");
    let w = &iv["lowest_window"];
    assert!(w.is_object(), "{iv}");
    // Check the hint against the cached slots by brute force.
    let ahead = store
        .intensity_slots(
            ProviderKind::Uk,
            "13",
            TimeRange {
                from_ms: DAY0 + 2 * HOUR,
                to_ms: DAY0 + 26 * HOUR,
            },
        )
        .await
        .expect("slots");
    let best = ahead
        .windows(4)
        .filter(|s| s[0].from_ms >= DAY0 + 2 * HOUR)
        .map(|s| s.iter().map(|x| x.g_per_kwh).sum::<f64>() / 4.0)
        .fold(f64::INFINITY, f64::min);
    assert!(close(f(&w["avg_g_per_kwh"]), best), "{w} vs {best}");
    // A cached region over a range with no slot is known, with no slots; a region never
    // cached is a 404.
    let (s, empty) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!(
            "/api/v1/carbon/intensity?region=13&from={}&to={}",
            DAY0 - 400 * 24 * HOUR,
            DAY0 - 399 * 24 * HOUR
        ),
    )
    .await;
    assert_eq!(s, 200, "{empty}");
    assert_eq!(empty["slots"].as_array().map(Vec::len), Some(0), "{empty}");
    let (s, _) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        "/api/v1/carbon/intensity?region=99",
    )
    .await;
    assert_eq!(s, 404);

    // A second pass changes nothing already priced (no rewrites, no refetch within 15 min).
    let before = stub.requests.lock().expect("lock").len();
    let again = p.run_once().await.expect("pass");
    assert_eq!(again.priced, 0);
    assert_eq!(
        stub.requests.lock().expect("lock").len(),
        before,
        "cache used"
    );
}

#[tokio::test]
async fn a_forecast_later_replaced_by_the_actual_reprices_and_marks_actual() {
    let (_dir, store) = sqlite_store().await;
    forecast_replaced_by_actual_reprices(store).await;
}

#[tokio::test]
async fn postgres_a_forecast_later_replaced_by_the_actual_reprices_and_marks_actual() {
    let (_schema, store) = pg_store().await;
    forecast_replaced_by_actual_reprices(store).await;
}

async fn forecast_replaced_by_actual_reprices(store: Arc<dyn Store>) {
    let (url, stub) = start_stub().await;
    let node = one_gpu_node(&store, "gb-1", "GPU-c2").await;
    let t1030 = DAY0 + 10 * HOUR + 30 * MIN;
    write_trace(&store, &node, "GPU-c2", t1030, t1030 + 11 * MIN).await;
    let now = Arc::new(AtomicI64::new(t1030 + 12 * MIN));
    let mut p = pricer(
        &store,
        carbon_config(uk_args(&url, "national", 1.0, None)),
        Arc::clone(&now),
    );
    p.run_once().await.expect("pass");
    // 11 closed minutes 10:30..10:40: 15 kJ + 10 × 18 kJ = 195 kJ at the forecast 190.
    let e = 195_000.0;
    let (_, v) = get_json(
        &store,
        now.load(Ordering::SeqCst),
        &format!("/api/v1/energy?from={t1030}&to={}", t1030 + HOUR),
    )
    .await;
    assert!(close(f(&v["total"]["carbon_g"]), e * 190.0 / 3.6e6), "{v}");
    assert!(
        close(f(&v["total"]["carbon"]["forecast_share"]), 1.0),
        "{v}"
    );

    // The API now has the actual (200); after the refetch delay the minutes are re-priced.
    set_mode(&stub, Mode::ActualNow);
    now.fetch_add(16 * MIN, Ordering::SeqCst);
    let r = p.run_once().await.expect("pass");
    assert_eq!(r.priced, 11, "{r:?}");
    let (_, v) = get_json(
        &store,
        now.load(Ordering::SeqCst),
        &format!("/api/v1/energy?from={t1030}&to={}", t1030 + HOUR),
    )
    .await;
    assert!(close(f(&v["total"]["carbon_g"]), e * 200.0 / 3.6e6), "{v}");
    assert!(
        close(f(&v["total"]["carbon"]["forecast_share"]), 0.0),
        "{v}"
    );
    let (_, c) = get_json(
        &store,
        now.load(Ordering::SeqCst),
        &format!("/api/v1/containers?from={t1030}&to={}", t1030 + HOUR),
    )
    .await;
    assert!(
        close(f(&c["rows"][0]["carbon_g"]), e * 200.0 / 3.6e6),
        "{c}"
    );
    let minutes = store
        .carbon_minutes(None, all_time())
        .await
        .expect("minutes");
    assert!(
        minutes
            .iter()
            .all(|m| m.kind == IntensityKind::Actual && m.g_per_kwh == 200.0)
    );

    // A later forecast (the hourly 24 h prefetch serves the forecast-only answer again)
    // never overwrites the actual in the cache.
    set_mode(&stub, Mode::Up);
    let before = stub.requests.lock().expect("lock").len();
    now.fetch_add(61 * MIN, Ordering::SeqCst);
    p.run_once().await.expect("pass");
    let asked = stub.requests.lock().expect("lock").clone();
    assert!(
        asked[before..].iter().any(|r| r.ends_with("/fw24h")),
        "{asked:?}"
    );
    let cached = store
        .intensity_slots(
            ProviderKind::Uk,
            "national",
            TimeRange {
                from_ms: t1030,
                to_ms: t1030 + 1,
            },
        )
        .await
        .expect("cache");
    assert_eq!(
        (cached[0].kind, cached[0].g_per_kwh),
        (IntensityKind::Actual, 200.0)
    );
}

#[tokio::test]
async fn provider_down_prices_estimated_from_last_known_or_default_never_zero() {
    let (url, stub) = start_stub().await;
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, "lon-2", "GPU-c3").await;
    let now = Arc::new(AtomicI64::new(DAY0 + 2 * HOUR));
    set_mode(&stub, Mode::Down);
    write_trace(&store, &node, "GPU-c3", DAY0 + 20 * MIN, DAY0 + 31 * MIN).await;

    // Nothing known, no default: unpriced, and the API says so (null, not 0).
    let mut p = pricer(
        &store,
        carbon_config(uk_args(&url, "13", 1.0, None)),
        Arc::clone(&now),
    );
    let r: PassReport = p.run_once().await.expect("pass");
    assert_eq!((r.priced, r.unpriced), (0, 11), "{r:?}");
    assert!(
        r.provider_errors
            .iter()
            .any(|e| e.contains("uk") && e.contains(&url) && e.contains("503")),
        "{r:?}"
    );
    let (_, v) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!("/api/v1/energy?from={DAY0}&to={}", DAY0 + HOUR),
    )
    .await;
    assert!(v["total"]["carbon_g"].is_null(), "{v}");
    assert!(f(&v["total"]["carbon"]["unpriced_j"]) > 0.0, "{v}");

    // With a default: every minute priced at it, marked estimated, never zero.
    let mut p = pricer(
        &store,
        carbon_config(uk_args(&url, "13", 1.0, Some(250.0))),
        Arc::clone(&now),
    );
    let r = p.run_once().await.expect("pass");
    assert_eq!((r.priced, r.estimated), (11, 11), "{r:?}");
    let e = 15_000.0 + 10.0 * 18_000.0; // minutes 00:20..00:30
    let (_, v) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!("/api/v1/energy?from={DAY0}&to={}", DAY0 + HOUR),
    )
    .await;
    assert!(close(f(&v["total"]["carbon_g"]), e * 250.0 / 3.6e6), "{v}");
    assert!(
        close(f(&v["total"]["carbon"]["estimated_share"]), 1.0),
        "{v}"
    );
    let minutes = store
        .carbon_minutes(None, all_time())
        .await
        .expect("minutes");
    assert!(
        minutes
            .iter()
            .all(|m| m.estimated && m.basis == PriceBasis::Default && m.carbon_g > 0.0)
    );

    // The provider comes back: the estimates are replaced by its figures.
    set_mode(&stub, Mode::Up);
    let r = p.run_once().await.expect("pass");
    assert_eq!((r.priced, r.estimated), (11, 0), "{r:?}");
    let want = (15_000.0 + 9.0 * 18_000.0) * 82.0 + 18_000.0 * 81.0;
    let (_, v) = get_json(
        &store,
        DAY0 + 2 * HOUR,
        &format!("/api/v1/energy?from={DAY0}&to={}", DAY0 + HOUR),
    )
    .await;
    assert!(close(f(&v["total"]["carbon_g"]), want / 3.6e6), "{v}");
    assert!(
        close(f(&v["total"]["carbon"]["estimated_share"]), 0.0),
        "{v}"
    );

    // Down again, for minutes beyond every cached slot: the newest cached slot prices
    // them, marked estimated. (Minute 00:31, closed by these samples, is in a cached slot.)
    set_mode(&stub, Mode::Down);
    let later = DAY0 + 40 * HOUR; // beyond every cached slot (the file covers day 0)
    write_trace(&store, &node, "GPU-c3", later, later + 3 * MIN).await;
    now.store(later + 4 * MIN, Ordering::SeqCst);
    let r = p.run_once().await.expect("pass");
    assert_eq!((r.priced, r.estimated), (4, 3), "{r:?}");
    let last_cached = store
        .last_intensity_before(ProviderKind::Uk, "13", later)
        .await
        .expect("read")
        .expect("a cached slot");
    let late = store
        .carbon_minutes(
            None,
            TimeRange {
                from_ms: later,
                to_ms: later + HOUR,
            },
        )
        .await
        .expect("minutes");
    assert_eq!(late.len(), 3);
    assert!(late.iter().all(|m| m.basis == PriceBasis::LastKnown
        && m.estimated
        && m.g_per_kwh == last_cached.g_per_kwh));
}

#[tokio::test]
async fn error_or_malformed_answers_are_clear_errors_and_store_nothing() {
    let (url, stub) = start_stub().await;
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, "lon-3", "GPU-c4").await;
    write_trace(&store, &node, "GPU-c4", DAY0 + 20 * MIN, DAY0 + 25 * MIN).await;
    let now = Arc::new(AtomicI64::new(DAY0 + 2 * HOUR));
    for (mode, needle) in [
        (
            Mode::Error400,
            "HTTP 400: 400 Bad Request: Please enter a valid region ID",
        ),
        (Mode::Malformed, "not what it should be"),
    ] {
        set_mode(&stub, mode);
        let mut p = pricer(
            &store,
            carbon_config(uk_args(&url, "13", 1.0, None)),
            Arc::clone(&now),
        );
        let r = p.run_once().await.expect("pass");
        assert!(
            r.provider_errors
                .iter()
                .any(|e| e.contains("carbon provider uk")
                    && e.contains(&url)
                    && e.contains(needle)),
            "{mode:?}: {r:?}"
        );
        assert_eq!(r.priced, 0);
        let cached = store
            .intensity_slots(ProviderKind::Uk, "13", all_time())
            .await
            .expect("cache");
        assert!(cached.is_empty(), "{mode:?}: nothing cached");
        assert!(
            store
                .carbon_minutes(None, all_time())
                .await
                .expect("minutes")
                .is_empty()
        );
    }
    // HTTP 400 is not retried (it will not get better); 503 is (retries = 1).
    let asked = stub.requests.lock().expect("lock").len();
    assert!(
        asked <= 4,
        "{asked} requests for two passes with a fetch and a prefetch each"
    );
}

#[tokio::test]
async fn electricity_maps_per_node_override_records_lifecycle_and_sends_the_token() {
    let (url, stub) = start_stub().await;
    let (dir, store) = sqlite_store().await;
    let token = dir.path().join("em-token");
    std::fs::write(&token, "em-secret-token\n").expect("write token");
    let node = one_gpu_node(&store, "fra-1", "GPU-c5").await;
    // 02:00..02:10 (history: 02:00-03:00 is 310 g/kWh, lifecycle).
    write_trace(
        &store,
        &node,
        "GPU-c5",
        DAY0 + 2 * HOUR,
        DAY0 + 2 * HOUR + 11 * MIN,
    )
    .await;
    let file = CarbonFile::from_toml_str(&format!(
        "[[carbon.nodes]]\nnode = \"fra-1\"\nprovider = \"electricitymaps\"\nregion = \"DE\"\nurl = \"{url}\"\ntoken_file = \"{}\"\n",
        token.display()
    ))
    .expect("carbon file");
    let config = CarbonConfig::new(
        CarbonSettings {
            carbon_g_per_kwh: Some(100.0),
            ..Default::default()
        },
        file,
    )
    .expect("valid");
    let now = Arc::new(AtomicI64::new(DAY0 + 3 * HOUR));
    let mut p = pricer(&store, Arc::new(config), now);
    let r = p.run_once().await.expect("pass");
    assert_eq!(r.provider_errors, Vec::<String>::new());
    assert_eq!((r.priced, r.estimated), (11, 0));
    let minutes = store
        .carbon_minutes(None, all_time())
        .await
        .expect("minutes");
    assert!(
        minutes
            .iter()
            .all(|m| m.provider == ProviderKind::Electricitymaps
                && m.factor_type == gpufleet_carbon::FactorType::Lifecycle
                && m.g_per_kwh == 310.0
                && m.region == "DE")
    );
    let asked = stub.requests.lock().expect("lock").clone();
    assert!(
        asked
            .iter()
            .any(|r| r.starts_with("/v3/carbon-intensity/history?zone=DE")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn minutes_that_cannot_be_priced_never_starve_newer_ones() {
    let (url, _stub) = start_stub().await;
    let (_dir, store) = sqlite_store().await;
    let off = one_gpu_node(&store, "off-1", "GPU-off").await;
    let on = one_gpu_node(&store, "lon-9", "GPU-on").await;
    // Node off-1 has no provider (a selector that matches nothing else): its 11 minutes
    // come first in time and stay unpriced.
    write_trace(&store, &off, "GPU-off", DAY0 + 20 * MIN, DAY0 + 31 * MIN).await;
    write_trace(&store, &on, "GPU-on", DAY0 + 40 * MIN, DAY0 + 44 * MIN).await;
    let file = CarbonFile::from_toml_str(&format!(
        "[[carbon.nodes]]\nnode = \"lon-9\"\nprovider = \"uk\"\nregion = \"13\"\nurl = \"{url}\"\n"
    ))
    .expect("carbon file");
    let config = CarbonConfig::new(CarbonSettings::default(), file).expect("valid");
    let clock_now = DAY0 + 2 * HOUR;
    let clock: Clock = Arc::new(move || clock_now);
    let options = CarbonOptions {
        config: Arc::new(config),
        batch: 5,
        ..Default::default()
    };
    let mut p = Pricer::new(store.clone(), store.clone(), options, clock);
    let mut priced = 0;
    for _ in 0..5 {
        priced += p.run_once().await.expect("pass").priced;
    }
    assert_eq!(
        priced, 4,
        "lon-9's minutes 00:40..00:43 are priced despite the backlog"
    );
}
