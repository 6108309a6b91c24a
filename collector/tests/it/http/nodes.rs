//! Nodes: the list with status and latest values, status by sample age, node and GPU
//! detail with events, and the fleet summary.

use super::*;

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
