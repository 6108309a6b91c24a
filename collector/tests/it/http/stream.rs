//! The live stream (SSE): committed ticks and statuses, shutdown, resync for a slow
//! client.

use super::*;

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
        serde_json::json!([{"name": "node-a", "status": "online", "last_seen_ms": T0 + 2000, "connected": true,
            // GPU-a's sample counts uncorrectable ECC errors: a warning; GPU-b is ok.
            "health": "warning", "gpu_health": {"GPU-a": "warning"}}]),
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
