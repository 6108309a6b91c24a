//! Series: points, parameters, the point limit, and per-node / host downsampling.

use super::*;

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
