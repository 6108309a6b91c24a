//! Metrics (present values only), the health check, and JSON 404s.

use super::*;

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
        // GPM: a present 0 is exported as 0; 100 % is 1.
        format!("gpufleet_gpu_tensor_active_ratio{a} 0.0"),
        format!("gpufleet_gpu_sm_occupancy_ratio{a} 0.45"),
        format!("gpufleet_gpu_dram_active_ratio{a} 1.0"),
        format!("gpufleet_gpu_gpm_nvlink_transmit_bytes_per_second{a} 0"),
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
    // No GPM (a K80), or a metric the GPU does not give (IMMA): nothing, never 0.
    assert!(
        !body.contains(&format!("gpufleet_gpu_sm_active_ratio{b}")),
        "{body}"
    );
    assert!(!body.contains(&format!("gpufleet_gpu_tensor_imma_active_ratio{a}")));
    let mig = r#"gpufleet_mig_tensor_active_ratio{node="node-a",gpu="0",uuid="GPU-a",name="NVIDIA H100 80GB HBM3",mig_uuid="MIG-4b1e7c52-0000-5000-8000-000000000001",gpu_instance="1"} 0.61"#;
    assert!(
        body.lines().any(|l| l.starts_with(mig)),
        "missing {mig} in\n{body}"
    );
    assert!(
        !body.contains("gpufleet_mig_sm_active_ratio{"),
        "absent per MIG too"
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
