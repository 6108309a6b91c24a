//! Health through the API and `/metrics`: a GPU with an Xid 79 committed through the real
//! writer is critical with the catalogue's reason and action on the node, GPU and fleet
//! health endpoints, its events carry the explanation, the gauges say so, a restarted
//! collector (seeded from the store) still says so, and a day later the Xid is forgotten.

use super::*;
use gpufleet_collector::health::{self, HealthState};

fn xid(time_ms: UnixMs, uuid: &str, code: u64) -> Event {
    Event {
        time_ms,
        gpu_uuid: uuid.into(),
        kind: EventKind::Xid,
        code: Some(code),
        detail: format!("NVRM: Xid {code}"),
    }
}

/// GPU-a's health sample: a row remap pending, `pcie` PCIe replays so far.
fn remap_pending(pcie: u64) -> GpuHealthSample {
    GpuHealthSample {
        gpu_uuid: "GPU-a".into(),
        remapped_rows_pending: Some(true),
        remapped_rows_failed: Some(false),
        retired_pages_pending: Some(false),
        pcie_replay_count: Some(pcie),
        ..Default::default()
    }
}

/// `fleet()`, then an Xid 79 on GPU-a and an Xid 13 (the application's doing) on GPU-b;
/// GPU-a's health samples say a row remap is pending and its PCIe replays rose by 5.
async fn with_xids() -> (Fixture, NodeRecord) {
    let (f, rec) = fleet().await;
    let mut later = tick(T0 + 3500, &["GPU-a", "GPU-b"], 4);
    later.health = vec![remap_pending(15), health_sparse("GPU-b")];
    let mut t = tick(T0 + 3000, &["GPU-a", "GPU-b"], 3);
    t.health = vec![remap_pending(10)];
    t.events = vec![
        xid(T0 + 3000, "GPU-a", 79),
        xid(T0 + 3000, "GPU-b", 13),
        Event {
            time_ms: T0 + 3000,
            gpu_uuid: "GPU-b".into(),
            kind: EventKind::Throttle,
            code: None,
            detail: "thermal slowdown".into(),
        },
    ];
    f.write(
        &rec,
        Batch {
            seq: 2,
            ticks: vec![t, later],
            delivery: DeliveryStats::default(),
        },
    )
    .await;
    f.now.store(T0 + 5000, Ordering::Relaxed);
    (f, rec)
}

fn reason_codes(health: &Value) -> Vec<&str> {
    health["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .map(|r| r["code"].as_str().expect("code"))
        .collect()
}

#[tokio::test]
async fn an_xid_79_makes_the_gpu_and_its_node_critical_with_reasons() {
    let (f, _) = with_xids().await;
    let (status, node) = f.get_json("/api/v1/nodes/node-a").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(node["health"]["state"], "critical", "{node}");
    assert_eq!(node["health"]["gpus_critical"], 1);
    let a = &node["gpus"][0]["health"];
    assert_eq!(a["state"], "critical");
    // Worst first: the Xid; the uncorrectable ECC count of the sample, the PCIe replays
    // that rose, the pending remap; then what is only listed (persistence off, power cap).
    assert_eq!(
        reason_codes(a),
        [
            "xid_79",
            "ecc_uncorrected",
            "pcie_replays",
            "row_remap_pending",
            "persistence_off",
            "throttle_power_cap"
        ]
    );
    let remap = &a["reasons"][3];
    assert_eq!(remap["severity"], "warning");
    assert!(
        remap["action"]
            .as_str()
            .is_some_and(|s| s.contains("reset")),
        "{remap}"
    );
    assert!(
        a["reasons"][2]["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("5 PCIe replays")),
        "{a}"
    );
    let r = &a["reasons"][0];
    assert_eq!(r["severity"], "critical");
    assert!(
        r["summary"]
            .as_str()
            .is_some_and(|s| s.contains("fallen off the bus")),
        "{r}"
    );
    assert!(
        r["action"].as_str().is_some_and(|s| s.contains("reboot")),
        "{r}"
    );
    assert_eq!(r["since_ms"], T0 + 3000);
    assert_eq!(
        node["gpus"][0]["throttle"],
        serde_json::json!(["sw_power_cap"])
    );
    let b = &node["gpus"][1]["health"];
    assert_eq!(b["state"], "ok", "an Xid 13 is listed, not judged: {b}");
    assert_eq!(reason_codes(b), ["xid_13"]);
    assert_eq!(
        node["gpus"][1]["throttle"],
        Value::Null,
        "no mask, no names"
    );

    // The fleet listing: states and, in brief, what is wrong (no actions, no
    // informational reasons).
    let (_, fleet) = f.get_json("/api/v1/fleet").await;
    assert_eq!(fleet[0]["health"]["state"], "critical");
    let brief = &fleet[0]["gpus"][0]["health"];
    assert_eq!(
        reason_codes(brief),
        [
            "xid_79",
            "ecc_uncorrected",
            "pcie_replays",
            "row_remap_pending"
        ]
    );
    assert_eq!(brief["reasons"][0].get("action"), None, "{brief}");
    assert_eq!(fleet[0]["gpus"][1]["health"]["state"], "ok");

    let (_, list) = f.get_json("/api/v1/nodes").await;
    assert_eq!(list[0]["health"]["state"], "critical");
    let (_, gpu) = f.get_json("/api/v1/gpus/GPU-a").await;
    assert_eq!(gpu["health"]["state"], "critical");
    assert_eq!(reason_codes(&gpu["health"])[0], "xid_79");
}

#[tokio::test]
async fn the_fleet_health_endpoint_lists_gpus_at_least_that_bad() {
    let (f, _) = with_xids().await;
    let (status, h) = f.get_json("/api/v1/health/gpus").await;
    assert_eq!(status, StatusCode::OK, "{h}");
    assert_eq!(h["min_state"], "warning");
    assert_eq!(
        h["gpus_by_state"],
        serde_json::json!({"ok": 1, "warning": 0, "critical": 1})
    );
    let gpus = h["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "{h}");
    assert_eq!(
        (&gpus[0]["uuid"], &gpus[0]["node"], &gpus[0]["state"]),
        (
            &Value::from("GPU-a"),
            &Value::from("node-a"),
            &Value::from("critical")
        )
    );
    assert_eq!(h["nodes"][0]["node"], "node-a");
    let (_, all) = f.get_json("/api/v1/health/gpus?state=ok").await;
    assert_eq!(all["gpus"].as_array().map(Vec::len), Some(2));
    let (status, bad) = f.get_json("/api/v1/health/gpus?state=purple").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        bad["error"]
            .as_str()
            .is_some_and(|e| e.contains("critical"))
    );

    let (status, x) = f.get_json("/api/v1/health/xid/48").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&x["severity"], &x["known"]),
        (&Value::from("critical"), &Value::from(true))
    );
    let (_, x) = f.get_json("/api/v1/health/xid/123456").await;
    assert_eq!(x["known"], false);
    let (status, _) = f.get_json("/api/v1/health/xid/seventy-nine").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn xid_events_carry_their_explanation() {
    let (f, _) = with_xids().await;
    let (status, ev) = f
        .get_json(&format!(
            "/api/v1/nodes/node-a/events?from={}&to={}",
            T0,
            T0 + 10_000
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{ev}");
    let events = ev["events"].as_array().expect("events");
    let by_code = |c: u64| {
        events
            .iter()
            .find(|e| e["code"] == c)
            .unwrap_or_else(|| panic!("Xid {c} in {ev}"))
    };
    let e79 = &by_code(79)["explanation"];
    assert_eq!(e79["name"], "GPU has fallen off the bus");
    assert_eq!(e79["severity"], "critical");
    assert!(e79["action"].as_str().is_some_and(|a| !a.is_empty()));
    assert_eq!(by_code(13)["explanation"]["severity"], "info");
    let throttle = events
        .iter()
        .find(|e| e["kind"] == "throttle")
        .expect("the throttle event");
    assert_eq!(throttle["explanation"], Value::Null);
}

#[tokio::test]
async fn metrics_carry_health_gauges() {
    let (f, _) = with_xids().await;
    let (_, body) = f.get("/metrics").await;
    let a = r#"node="node-a",gpu="0",uuid="GPU-a",name="NVIDIA H100 80GB HBM3""#;
    let b = r#"node="node-a",gpu="1",uuid="GPU-b",name="Tesla K80""#;
    for line in [
        format!("gpufleet_gpu_health{{{a}}} 2"),
        format!("gpufleet_gpu_health{{{b}}} 0"),
        format!("gpufleet_gpu_health_reason{{{a},reason=\"xid_79\",severity=\"critical\"}} 1"),
        format!(
            "gpufleet_gpu_health_reason{{{a},reason=\"ecc_uncorrected\",severity=\"warning\"}} 1"
        ),
        format!("gpufleet_gpu_health_reason{{{b},reason=\"xid_13\",severity=\"ok\"}} 1"),
        format!(
            "gpufleet_gpu_health_reason{{{a},reason=\"row_remap_pending\",severity=\"warning\"}} 1"
        ),
        format!("gpufleet_gpu_throttle_reason{{{a},reason=\"sw_power_cap\"}} 1"),
        "gpufleet_node_health{node=\"node-a\"} 2".to_owned(),
        "# TYPE gpufleet_gpu_health gauge".to_owned(),
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(
        !body.contains(&format!("gpufleet_gpu_throttle_reason{{{b}")),
        "no mask, no throttle series"
    );
}

#[tokio::test]
async fn a_restarted_collector_remembers_and_a_day_later_forgets() {
    let (f, _) = with_xids().await;
    // A new live state, seeded from the store as `serve` does.
    let live = Arc::new(Live::new());
    live.seed(
        f.store.nodes().await.expect("nodes"),
        f.store.latest_gpu_samples().await.expect("gpus"),
        f.store.latest_host_samples().await.expect("hosts"),
        f.store.latest_gpu_health().await.expect("health"),
    );
    health::seed_memory(f.store.as_ref(), &live, T0 + 5000)
        .await
        .expect("seed");
    let judged = live.read(|s| {
        health::fleet_health(s, &StatusPolicy::default(), &Default::default(), T0 + 5000)
    });
    let a = judged.iter().find(|g| g.uuid == "GPU-a").expect("GPU-a");
    assert_eq!(a.health.state, HealthState::Critical);
    assert_eq!(a.health.reasons[0].code, "xid_79");
    assert!(
        a.health
            .reasons
            .iter()
            .any(|r| r.code == "row_remap_pending"),
        "the stored health sample is seeded: {:?}",
        a.health.reasons
    );

    // 25 hours later: the Xid is forgotten; the node, silent since, is offline.
    f.now.store(T0 + 25 * 3_600_000, Ordering::Relaxed);
    let (_, node) = f.get_json("/api/v1/nodes/node-a").await;
    assert_eq!(node["health"]["state"], "critical");
    assert_eq!(reason_codes(&node["health"]), ["node_offline"]);
    assert!(
        !reason_codes(&node["gpus"][0]["health"]).contains(&"xid_79"),
        "{node}"
    );
}

#[tokio::test]
async fn an_offline_nodes_gpus_keep_their_last_health_series() {
    let (f, _) = with_xids().await;
    // An hour later the node is offline; the Xid 79 (24 h) still holds.
    f.now.store(T0 + 3_600_000, Ordering::Relaxed);
    let (_, body) = f.get("/metrics").await;
    let a = r#"node="node-a",gpu="0",uuid="GPU-a",name="NVIDIA H100 80GB HBM3""#;
    for line in [
        format!("gpufleet_gpu_health{{{a}}} 2"),
        format!("gpufleet_gpu_health_reason{{{a},reason=\"xid_79\",severity=\"critical\"}} 1"),
        "gpufleet_node_health{node=\"node-a\"} 2".to_owned(),
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(
        !body.contains(&format!("gpufleet_gpu_throttle_reason{{{a}")),
        "an offline node's samples are not current: no throttle series\n{body}"
    );
    assert!(
        !body.contains(&format!("gpufleet_gpu_power_watts{{{a}")),
        "nor sample series\n{body}"
    );
}
