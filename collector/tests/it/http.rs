//! The HTTP API through `app(state).oneshot(request)`: no socket, a temporary SQLite
//! store, the real writer (so the live state is updated exactly as in production), and a
//! fixed clock.

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpufleet_collector::api::router::{AppState, app};
use gpufleet_collector::ingest::writer::{self, WriterHandle, WriterOptions};
use gpufleet_collector::live::state::Live;
use gpufleet_collector::live::status::StatusPolicy;
use gpufleet_collector::metrics::Metrics;
use gpufleet_collector::store::{NodeRecord, Store};
use gpufleet_core::*;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    live: Arc<Live>,
    writer: WriterHandle,
    metrics: Arc<Metrics>,
    now: Arc<AtomicI64>,
}

impl Fixture {
    async fn new() -> Fixture {
        let (dir, store) = sqlite_store().await;
        let live = Arc::new(Live::new());
        let metrics = Arc::new(Metrics::default());
        let (writer, _task) = writer::spawn(
            store.clone(),
            Arc::clone(&live),
            Arc::clone(&metrics),
            WriterOptions::default(),
            CancellationToken::new(),
        );
        Fixture {
            _dir: dir,
            store,
            live,
            writer,
            metrics,
            now: Arc::new(AtomicI64::new(T0)),
        }
    }

    fn state(&self) -> AppState {
        let now = Arc::clone(&self.now);
        AppState {
            store: Arc::clone(&self.store),
            live: Arc::clone(&self.live),
            metrics: Arc::clone(&self.metrics),
            writer: Some(self.writer.clone()),
            status: StatusPolicy::default(),
            clock: Arc::new(move || now.load(Ordering::Relaxed)),
        }
    }

    async fn register(&self, node: &str, gpus: Vec<GpuInfo>) -> NodeRecord {
        let rec = self
            .store
            .register_node(&hello(node), &inventory(gpus), T0)
            .await
            .expect("register");
        self.live.connected(rec.clone());
        rec
    }

    async fn write(&self, rec: &NodeRecord, batch: Batch) {
        let done = self
            .writer
            .submit(node_batch(rec, batch))
            .await
            .expect("writer running");
        done.await.expect("answered").expect("committed");
    }

    async fn get(&self, uri: &str) -> (StatusCode, String) {
        let request = Request::get(uri).body(Body::empty()).expect("request");
        let response = app(self.state())
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
    }

    async fn get_json(&self, uri: &str) -> (StatusCode, Value) {
        let (status, body) = self.get(uri).await;
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{uri}: not JSON ({e}): {body}")),
        )
    }
}

/// Node "node-a" with a fully described GPU-a and a sparse GPU-b, and 3 ticks from T0.
async fn fleet() -> (Fixture, NodeRecord) {
    let f = Fixture::new().await;
    let rec = f
        .register(
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
    f.write(&rec, batch(1, T0, 3, &["GPU-a", "GPU-b"])).await;
    (f, rec)
}

#[tokio::test]
async fn nodes_lists_status_inventory_and_latest_with_nulls_for_absent() {
    let (f, _) = fleet().await;
    f.now.store(T0 + 3000, Ordering::Relaxed);
    let (status, json) = f.get_json("/api/v1/nodes").await;
    assert_eq!(status, StatusCode::OK);
    let nodes = json.as_array().expect("an array");
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n["name"], "node-a");
    assert_eq!(n["status"], "online");
    assert_eq!(n["connected"], true);
    assert_eq!(n["last_seen_ms"], T0 + 2000);
    assert_eq!(n["last_seen"], "2027-01-15T08:00:02.000Z");
    assert_eq!(n["labels"]["rack"], "r1");
    assert_eq!(n["agent_version"], "0.1.0-test");
    assert_eq!(n["source"], "simulator");
    assert_eq!(n["interval_ms"], 1000);
    assert_eq!(n["last_acked_seq"], 1);
    assert_eq!(n["dropped_samples"], 10);
    assert_eq!(n["spool_backlog"]["batches"], 1);
    assert_eq!(n["spool_backlog"]["bytes"], 1000);
    assert_eq!(n["stored_samples"], 6);
    assert_eq!(n["rejected_batches"], 0);
    assert_eq!(n["host"]["hostname"], "node-a.example");
    assert_eq!(n["host"]["driver_version"], "550.54.15");
    assert_eq!(n["host"]["nvml_version"], Value::Null);
    assert_eq!(n["host"]["os"], Value::Null);
    assert_eq!(n["host"]["latest"]["time_ms"], T0 + 2000);
    assert_eq!(n["host"]["latest"]["cpu_util_pct"], 12.5);
    assert_eq!(n["host"]["latest"]["disk_read_bps"], Value::Null);

    let gpus = n["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    let a = &gpus[0];
    assert_eq!(
        (&a["uuid"], &a["index"], &a["name"]),
        (
            &Value::from("GPU-a"),
            &Value::from(0),
            &Value::from("NVIDIA H100 80GB HBM3")
        )
    );
    assert_eq!(a["inventory"]["power_limit_enforced_mw"], 650_000);
    assert_eq!(a["inventory"]["vbios_version"], "96.00.89.00.01");
    assert_eq!(a["latest"]["time"], "2027-01-15T08:00:02.000Z");
    assert_eq!(a["latest"]["time_ms"], T0 + 2000);
    assert_eq!(a["latest"]["power_mw"], 250_002);
    assert_eq!(a["latest"]["fan_pct"], 0, "a measured 0 stays 0");
    assert_eq!(a["processes"][0]["pid"], 4242);
    assert_eq!(a["processes"][0]["workload"]["container_name"], "trainer");

    let b = &gpus[1];
    assert_eq!(b["inventory"]["serial"], Value::Null);
    assert_eq!(b["inventory"]["memory_total_bytes"], Value::Null);
    let latest = b["latest"].as_object().expect("latest");
    assert_eq!(latest["power_mw"], 60_002);
    for absent in [
        "temp_gpu_c",
        "fan_pct",
        "energy_mj",
        "mem_used_bytes",
        "clock_sm_mhz",
        "pstate",
        "throttle_reasons",
    ] {
        assert!(latest.contains_key(absent), "{absent} is present as a key");
        assert_eq!(latest[absent], Value::Null, "{absent} is null, never 0");
    }
}

#[tokio::test]
async fn node_status_follows_the_newest_sample_time() {
    let (f, _) = fleet().await;
    let newest = T0 + 2000;
    for (now, expected) in [
        (newest + 15_000, "online"),
        (newest + 15_001, "stale"),
        (newest + 120_000, "stale"),
        (newest + 120_001, "offline"),
        (newest - 60_000, "online"), // agent clock ahead of ours: capped at now
    ] {
        f.now.store(now, Ordering::Relaxed);
        let (_, json) = f.get_json("/api/v1/nodes").await;
        assert_eq!(
            json[0]["status"],
            expected,
            "now = newest + {} ms",
            now - newest
        );
    }
    // A node that never sent a sample is offline.
    f.register("node-new", vec![]).await;
    let (_, json) = f.get_json("/api/v1/nodes").await;
    assert_eq!(json[1]["name"], "node-new");
    assert_eq!(
        (&json[1]["status"], &json[1]["last_seen"]),
        (&Value::from("offline"), &Value::Null)
    );
}

#[tokio::test]
async fn series_returns_points_and_validates_parameters() {
    let (f, _) = fleet().await;
    f.now.store(T0 + 10_000, Ordering::Relaxed);

    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?metric=power_mw")
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        (&json["uuid"], &json["metric"], &json["unit"]),
        (
            &Value::from("GPU-a"),
            &Value::from("power_mw"),
            &Value::from("milliwatts")
        )
    );
    assert_eq!(json["step_ms"], Value::Null);
    assert_eq!(json["to_ms"], T0 + 10_000);
    assert_eq!(
        json["from_ms"],
        T0 + 10_000 - 15 * 60_000,
        "default range: the last 15 minutes"
    );
    let points: Vec<(i64, f64)> = serde_json::from_value(json["points"].clone()).expect("points");
    assert_eq!(
        points,
        vec![
            (T0, 250_000.0),
            (T0 + 1000, 250_001.0),
            (T0 + 2000, 250_002.0)
        ]
    );

    let uri = format!("/api/v1/gpus/GPU-b/series?metric=temp_gpu_c&from={T0}&to=now");
    let (_, json) = f.get_json(&uri).await;
    assert_eq!(
        json["points"][0],
        serde_json::json!([T0, null]),
        "absent metric values are null"
    );

    let uri = format!(
        "/api/v1/gpus/GPU-a/series?metric=power_mw&from={}&to={}&step=2s",
        T0,
        T0 + 5000
    );
    let (status, json) = f.get_json(&uri).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["step_ms"], 2000);
    assert_eq!(
        json["points"],
        serde_json::json!([[T0, 250_000.5], [T0 + 2000, 250_002.0]])
    );

    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?from=now-1h&to=now")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = json["error"].as_str().expect("error message");
    assert!(
        msg.contains("metric is required") && msg.contains("util_gpu_pct"),
        "{msg}"
    );

    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?metric=power_mw%3B%20DROP%20TABLE%20gpus")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = json["error"].as_str().expect("error message");
    assert!(
        msg.contains("unknown metric") && msg.contains("power_mw, power_instant_mw"),
        "{msg}"
    );

    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?metric=power_mw&from=now-30d&step=1s")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = json["error"].as_str().expect("error message");
    assert!(msg.contains("10000") && msg.contains("step=260s"), "{msg}");

    for bad in [
        "from=yesterday",
        "to=soon",
        "step=fast",
        "step=0",
        "from=now&to=now-1h",
    ] {
        let (status, json) = f
            .get_json(&format!("/api/v1/gpus/GPU-a/series?metric=power_mw&{bad}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {json}");
        assert!(
            json["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{bad}: {json}"
        );
    }

    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-nope/series?metric=power_mw")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        json["error"]
            .as_str()
            .is_some_and(|m| m.contains("GPU-nope")),
        "{json}"
    );
}

#[tokio::test]
async fn raw_series_over_the_point_limit_asks_for_a_step() {
    let f = Fixture::new().await;
    let rec = f
        .register("node-a", vec![gpu_info_sparse("GPU-a", 0)])
        .await;
    let ticks = (0..10_001)
        .map(|i| Tick {
            time_ms: T0 + i * 100,
            gpus: vec![gpu_sample_sparse("GPU-a", 1)],
            ..Default::default()
        })
        .collect();
    f.write(
        &rec,
        Batch {
            seq: 1,
            ticks,
            delivery: DeliveryStats::default(),
        },
    )
    .await;
    f.now.store(T0 + 1_001_000, Ordering::Relaxed);
    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?metric=util_gpu_pct&from=now-1h")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = json["error"].as_str().expect("error message");
    assert!(
        msg.contains("more than 10000 samples") && msg.contains("step="),
        "{msg}"
    );
    let (status, json) = f
        .get_json("/api/v1/gpus/GPU-a/series?metric=util_gpu_pct&from=now-1h&step=1s")
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["points"].as_array().map(Vec::len), Some(1001));
}

#[tokio::test]
async fn metrics_expose_present_values_only() {
    let (f, _) = fleet().await;
    f.now.store(T0 + 3000, Ordering::Relaxed);
    let (status, body) = f.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let a = r#"{node="node-a",gpu="0",uuid="GPU-a",name="NVIDIA H100 80GB HBM3"}"#;
    let b = r#"{node="node-a",gpu="1",uuid="GPU-b",name="Tesla K80"}"#;
    for line in [
        format!("gpufleet_gpu_power_watts{a} 250.002"),
        format!("gpufleet_gpu_utilization_ratio{a} 0.02"),
        format!("gpufleet_gpu_energy_joules_total{a} 123456789.5"),
        format!("gpufleet_gpu_temperature_celsius{a} 65"),
        format!("gpufleet_gpu_power_watts{b} 60.002"),
        "gpufleet_node_up{node=\"node-a\"} 1".to_owned(),
        "gpufleet_node_status{node=\"node-a\",status=\"online\"} 1".to_owned(),
        "gpufleet_collector_gpu_samples_ingested_total 6".to_owned(),
        "gpufleet_collector_commits_total 1".to_owned(),
        "# TYPE gpufleet_collector_commit_duration_seconds histogram".to_owned(),
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(
        !body.contains(&format!("gpufleet_gpu_temperature_celsius{b}")),
        "absent metrics are not emitted"
    );

    // An offline node's GPU values are no longer exposed as current.
    f.now.store(T0 + 3_600_000, Ordering::Relaxed);
    let (_, body) = f.get("/metrics").await;
    assert!(
        body.lines()
            .any(|l| l == "gpufleet_node_up{node=\"node-a\"} 0"),
        "{body}"
    );
    assert!(!body.contains("gpufleet_gpu_power_watts{"), "{body}");
}

#[tokio::test]
async fn health_checks_the_database_and_unknown_paths_are_json_404s() {
    let f = Fixture::new().await;
    let (status, json) = f.get_json("/api/v1/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&json["status"], &json["db"]),
        (&Value::from("ok"), &Value::from("sqlite"))
    );
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));

    let (status, json) = f.get_json("/api/v1/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(json["error"].is_string());

    f.store.close().await;
    let (status, json) = f.get_json("/api/v1/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert_eq!(json["status"], "error");
    let text = json.to_string();
    assert!(
        !text.to_lowercase().contains("sql") || text.contains("sqlite"),
        "no database internals: {text}"
    );
}

// ------------------------------------------------------------------ the dashboard

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
    assert_eq!(assets.len(), 2, "{html}");
    for a in assets {
        let uri: &'static str = Box::leak(a.to_owned().into_boxed_str());
        let (status, ct, cache, body) = get(uri).await;
        assert_eq!(status, StatusCode::OK, "{a}");
        let want = if a.ends_with(".js") {
            "text/javascript; charset=utf-8"
        } else {
            "text/css; charset=utf-8"
        };
        assert_eq!(ct, want, "{a}");
        assert_eq!(cache, "public, max-age=31536000, immutable", "{a}");
        assert!(body.len() > 1000, "{a}");
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

#[tokio::test]
async fn node_detail_gpu_detail_and_events() {
    let f = Fixture::new().await;
    let rec = f
        .register(
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
    let mut b = batch(1, T0, 3, &["GPU-a", "GPU-b"]);
    b.ticks[1].events.push(Event {
        time_ms: T0 + 1000,
        gpu_uuid: "GPU-a".into(),
        kind: EventKind::Xid,
        code: Some(79),
        detail: "GPU has fallen off the bus".into(),
    });
    f.write(&rec, b).await;
    f.now.store(T0 + 3000, Ordering::Relaxed);

    let (status, n) = f.get_json("/api/v1/nodes/node-a").await;
    assert_eq!(status, StatusCode::OK, "{n}");
    let (_, list) = f.get_json("/api/v1/nodes").await;
    assert_eq!(n, list[0], "the detail is the node as listed");
    assert_eq!(n["gpus"][0]["processes"][0]["pid"], 4242);

    let (status, g) = f.get_json("/api/v1/gpus/GPU-b").await;
    assert_eq!(status, StatusCode::OK, "{g}");
    assert_eq!(g["node"], "node-a");
    assert_eq!(g["node_status"], "online");
    assert_eq!(g["interval_ms"], 1000);
    assert_eq!(g["index"], 1);
    assert_eq!(g["latest"]["temp_gpu_c"], Value::Null, "absent is null");
    assert_eq!(g["processes"][0]["pid"], 777);

    let (status, e) = f
        .get_json(&format!("/api/v1/nodes/node-a/events?from={T0}&to=now"))
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(e["truncated"], false);
    let events = e["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{e}");
    assert_eq!(events[0]["time_ms"], T0 + 1000);
    assert_eq!(events[0]["time"], "2027-01-15T08:00:01.000Z");
    assert_eq!(events[0]["kind"], "xid");
    assert_eq!(events[0]["code"], 79);
    assert_eq!(events[0]["gpu_uuid"], "GPU-a");
    let (_, e) = f
        .get_json(&format!("/api/v1/nodes/node-a/events?from={}", T0 + 1001))
        .await;
    assert_eq!(e["events"], serde_json::json!([]), "from is respected");

    for (uri, want) in [
        ("/api/v1/nodes/nope", "nope"),
        ("/api/v1/gpus/GPU-nope", "GPU-nope"),
        ("/api/v1/nodes/nope/events", "nope"),
        ("/api/v1/nodes/nope/host/series", "nope"),
        ("/api/v1/nodes/nope/series?metric=power_mw", "nope"),
    ] {
        let (status, json) = f.get_json(uri).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
        assert!(
            json["error"].as_str().is_some_and(|m| m.contains(want)),
            "{uri}: {json}"
        );
    }
}

/// Ticks at T0 + 0..10 s; GPU-a power (i+1)*100 W, util absent at 5 s; host CPU i*10 %,
/// disk read never reported.
async fn ten_seconds() -> Fixture {
    let f = Fixture::new().await;
    let rec = f
        .register(
            "node-a",
            vec![gpu_info_sparse("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
    let mut b = batch(1, T0, 10, &["GPU-a", "GPU-b"]);
    for (i, t) in b.ticks.iter_mut().enumerate() {
        let i = i as u32;
        t.gpus[0].power_mw = Some((i + 1) * 100_000);
        t.gpus[0].util_gpu_pct = (i != 5).then_some(i * 10);
        let h = t.host.as_mut().expect("host");
        h.cpu_util_pct = Some(i as f32 * 10.0);
        h.disk_read_bps = None;
    }
    f.write(&rec, b).await;
    f.now.store(T0 + 10_000, Ordering::Relaxed);
    f
}

#[tokio::test]
async fn node_series_downsample_every_gpu_with_aligned_buckets() {
    let f = ten_seconds().await;
    // [T0+3 s, T0+8 s] in 4 s buckets: edges at multiples of 4 s (T0 is one), partial
    // edge buckets average only their in-range samples.
    let uri = format!(
        "/api/v1/nodes/node-a/series?metric=power_mw&from={}&to={}&step=4s",
        T0 + 3000,
        T0 + 8000
    );
    let (status, json) = f.get_json(&uri).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        (&json["unit"], &json["step_ms"]),
        (&Value::from("milliwatts"), &Value::from(4000))
    );
    assert_eq!(json["gpus"][0]["uuid"], "GPU-a");
    assert_eq!(
        json["gpus"][0]["points"],
        serde_json::json!([
            [T0, 400_000.0],
            [T0 + 4000, 650_000.0],
            [T0 + 8000, 900_000.0]
        ])
    );
    assert_eq!(json["gpus"][1]["uuid"], "GPU-b");
    assert_eq!(json["gpus"][1]["points"].as_array().map(Vec::len), Some(3));

    let uri = format!(
        "/api/v1/nodes/node-a/series?metric=util_gpu_pct&from={}&to={}&step=1s",
        T0 + 4000,
        T0 + 6999
    );
    let (_, json) = f.get_json(&uri).await;
    assert_eq!(
        json["gpus"][0]["points"],
        serde_json::json!([[T0 + 4000, 40.0], [T0 + 5000, null], [T0 + 6000, 60.0]]),
        "a bucket without the metric is null, not 0"
    );

    let (_, json) = f
        .get_json(&format!(
            "/api/v1/nodes/node-a/series?metric=power_mw&from={T0}"
        ))
        .await;
    assert_eq!(json["step_ms"], Value::Null);
    assert_eq!(json["gpus"][0]["points"].as_array().map(Vec::len), Some(10));

    for bad in [
        "",
        "metric=nope",
        "metric=power_mw&step=0",
        "metric=power_mw&from=now-30d&step=1s",
    ] {
        let (status, json) = f
            .get_json(&format!("/api/v1/nodes/node-a/series?{bad}"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {json}");
    }
}

#[tokio::test]
async fn host_series_average_per_bucket_and_keep_absent_null() {
    let f = ten_seconds().await;
    let uri = format!(
        "/api/v1/nodes/node-a/host/series?from={}&to={}&step=4s",
        T0 + 3000,
        T0 + 9000
    );
    let (status, json) = f.get_json(&uri).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let pts = json["points"].as_array().expect("points");
    let cpu: Vec<(i64, f64)> = pts
        .iter()
        .map(|p| {
            (
                p["time_ms"].as_i64().unwrap_or(-1),
                p["cpu_util_pct"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    assert_eq!(cpu, vec![(T0, 30.0), (T0 + 4000, 55.0), (T0 + 8000, 85.0)]);
    for p in pts {
        assert_eq!(p["disk_read_bps"], Value::Null, "never reported: null");
        assert_eq!(p["net_tx_bps"], 3000.0);
        assert_eq!(p["load1"], 3.25);
    }
    let (_, raw) = f
        .get_json(&format!(
            "/api/v1/nodes/node-a/host/series?from={T0}&to={}",
            T0 + 1000
        ))
        .await;
    assert_eq!(raw["step_ms"], Value::Null);
    assert_eq!(
        raw["points"]
            .as_array()
            .map(|p| p.iter().map(|x| x["time_ms"].clone()).collect::<Vec<_>>()),
        Some(vec![Value::from(T0), Value::from(T0 + 1000)])
    );
}

/// Reads SSE frames until one of `event`; fails after 5 s.
async fn next_event(body: &mut axum::body::BodyDataStream, buf: &mut String, event: &str) -> Value {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let name = frame.lines().find_map(|l| l.strip_prefix("event: "));
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(name), Some(data)) = (name, data)
                && name == event
            {
                return serde_json::from_str(data).expect("event data is JSON");
            }
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("no {event} event within 5 s; got {buf:?}"))
            .expect("the stream is open")
            .expect("a chunk");
        buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
}

#[tokio::test]
async fn the_live_stream_pushes_committed_ticks_and_statuses_and_ends_at_shutdown() {
    let (f, rec) = fleet().await;
    let other = f
        .register("node-b", vec![gpu_info_sparse("GPU-z", 0)])
        .await;
    f.now.store(T0 + 3000, Ordering::Relaxed);
    let response = app(f.state())
        .oneshot(
            Request::get("/api/v1/live?node=node-a")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let mut body = response.into_body().into_data_stream();
    let mut buf = String::new();
    let status = next_event(&mut body, &mut buf, "status").await;
    assert_eq!(status["now_ms"], T0 + 3000);
    assert_eq!(
        status["nodes"],
        serde_json::json!([{"name": "node-a", "status": "online", "last_seen_ms": T0 + 2000, "connected": true}]),
        "only the asked-for node"
    );

    f.write(&other, batch(1, T0 + 3000, 1, &["GPU-z"])).await;
    f.write(&rec, batch(2, T0 + 3000, 2, &["GPU-a", "GPU-b"]))
        .await;
    let tick = next_event(&mut body, &mut buf, "tick").await;
    assert_eq!(tick["node"], "node-a", "node-b's commit is filtered out");
    assert_eq!(tick["time_ms"], T0 + 4000, "the batch's newest tick");
    assert_eq!(tick["gpus"][0]["uuid"], "GPU-a");
    assert_eq!(tick["gpus"][0]["power_mw"], 250_001);
    assert_eq!(tick["gpus"][1]["temp_gpu_c"], Value::Null, "absent is null");
    assert_eq!(tick["host"]["time_ms"], T0 + 4000);
    assert_eq!(tick["host"]["cpu_util_pct"], 12.5);
    assert_eq!(tick["processes"][0]["pid"], 4242);

    // Shutdown ends the stream (or an open dashboard would hold the server open).
    f.live.close();
    use futures::StreamExt;
    let end = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(chunk) = body.next().await {
            chunk.expect("a chunk");
        }
    })
    .await;
    assert!(end.is_ok(), "the stream ends after Live::close");
}

#[tokio::test]
async fn a_client_that_falls_behind_is_told_to_resync_instead_of_buffering() {
    let (f, _) = fleet().await;
    let response = app(f.state())
        .oneshot(
            Request::get("/api/v1/live")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    let mut body = response.into_body().into_data_stream();
    // More commits than the announcement buffer holds, while the client reads nothing.
    for seq in 0..1100 {
        f.live.announce(gpufleet_collector::live::state::Committed {
            node: "node-a".into(),
            batch: batch(seq, T0, 1, &["GPU-a"]),
        });
    }
    let mut buf = String::new();
    let resync = next_event(&mut body, &mut buf, "resync").await;
    assert_eq!(resync["skipped"], 1100 - 1024);
    // Then it goes on with what is still buffered.
    let tick = next_event(&mut body, &mut buf, "tick").await;
    assert_eq!(tick["node"], "node-a");
}

#[tokio::test]
async fn the_fleet_summary_carries_what_tiles_show_with_nulls_for_absent() {
    let (f, _) = fleet().await;
    f.now.store(T0 + 20_000, Ordering::Relaxed);
    let (status, json) = f.get_json("/api/v1/fleet").await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let n = &json[0];
    assert_eq!(
        (&n["name"], &n["status"], &n["last_seen_ms"]),
        (
            &Value::from("node-a"),
            &Value::from("stale"),
            &Value::from(T0 + 2000)
        )
    );
    assert_eq!(n["labels"]["rack"], "r1");
    assert_eq!(n["host"]["latest"]["cpu_util_pct"], 12.5);
    let a = &n["gpus"][0];
    assert_eq!(
        (&a["uuid"], &a["index"]),
        (&Value::from("GPU-a"), &Value::from(0))
    );
    assert_eq!(a["latest"]["time_ms"], T0 + 2000);
    assert_eq!(a["latest"]["power_mw"], 250_002);
    assert!(
        a.get("inventory").is_none() && a.get("processes").is_none(),
        "brief: {a}"
    );
    let b = &n["gpus"][1]["latest"];
    assert_eq!(b["power_mw"], 60_002);
    assert_eq!(b["temp_gpu_c"], Value::Null, "absent is null");
    assert_eq!(b["mem_used_bytes"], Value::Null, "absent is null");
}
