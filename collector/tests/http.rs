//! The HTTP API through `app(state).oneshot(request)`: no socket, a temporary SQLite
//! store, the real writer (so the live state is updated exactly as in production), and a
//! fixed clock.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use gpufleet_collector::http::{AppState, app};
use gpufleet_collector::live::Live;
use gpufleet_collector::metrics::Metrics;
use gpufleet_collector::status::StatusPolicy;
use gpufleet_collector::store::{NodeRecord, Store};
use gpufleet_collector::writer::{self, WriterHandle, WriterOptions};
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
            Arc::clone(&store),
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
async fn the_page_escapes_node_names() {
    let f = Fixture::new().await;
    f.register(
        "<script>alert('x')</script>&co",
        vec![gpu_info_sparse("GPU-a", 0)],
    )
    .await;
    let (status, body) = f.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;co"),
        "{body}"
    );
    assert!(!body.contains("<script>"), "{body}");
    assert!(body.contains("dashboard comes in a later release"));
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
