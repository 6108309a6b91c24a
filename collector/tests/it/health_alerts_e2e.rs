//! End to end, health judged and alerted: for each fake-NVML health scenario (Xid 79, 48,
//! 94, a double-bit ECC, a pending row remap, thermal throttling, a lost GPU) the real
//! `gpufleet-agent` on the fake libnvidia-ml streams to the real `gpufleet-collector`
//! (one rule, `for = "0s"`, evaluated every 100 ms); the GPU detail answer shows the
//! expected health state and reason (with an explanation and an action), the rule's
//! alert fires for that GPU, and once the agent stops (the GPU's samples go stale:
//! `--stale-after 1s`, `--offline-after 2s`) the alert is resolved. None of these
//! conditions clears by itself in its scenario (a critical Xid is kept for a day, a pending
//! remap waits for a reset), so stopping the agent is the recovery path used: signals
//! only read fresh samples, and the judge's signals skip offline nodes.

use crate::harness::{sigterm, start_collector, start_fake_nvml_agent, wait_stdout};
use serde_json::Value;
use std::time::{Duration, Instant};

/// What one scenario must show.
struct Case {
    scenario: &'static str,
    uuid: &'static str,
    /// The judged state and a reason code it must list.
    state: &'static str,
    code: &'static str,
    /// The alert rule's condition.
    condition: &'static str,
    /// The firing alert's value, where it is a number.
    value: Option<f64>,
}

/// Polls `check` every 50 ms until it gives a value, failing after `secs` seconds with
/// the last thing seen.
async fn poll<T>(what: &str, secs: u64, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) => assert!(Instant::now() < deadline, "{what}: last seen {last}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let resp = client.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(resp.status().to_string());
    }
    resp.json().await.map_err(|e| e.to_string())
}

async fn run(case: Case) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("collector.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            [alerts]
            evaluation_interval = "100ms"
            default_rules = false
            [[alerts.rules]]
            name = "UnderTest"
            condition = "{}"
            for = "0s"
            severity = "critical"
            "#,
            case.condition
        ),
    )
    .expect("write config");

    let db_url = format!("sqlite://{}", dir.path().join("c.db").display());
    let config_arg = config.display().to_string();
    let collector = start_collector(
        &db_url,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[
            "--config",
            &config_arg,
            "--stale-after",
            "1s",
            "--offline-after",
            "2s",
        ],
    )
    .await;
    let agent = start_fake_nvml_agent(
        dir.path(),
        case.scenario,
        &collector.grpc.to_string(),
        "hnode",
        "50ms",
        "100ms",
    );

    let client = reqwest::Client::new();
    let gpu_url = format!("http://{}/api/v1/gpus/{}", collector.http, case.uuid);
    let firing_url = format!("http://{}/api/v1/alerts?state=firing", collector.http);
    let history_url = format!("http://{}/api/v1/alerts/history", collector.http);

    // The judged health: the expected state, with the reason explained.
    let health = poll("the judged health", 15, async || {
        let body = get(&client, &gpu_url).await?;
        let h = &body["health"];
        let listed =
            (h["reasons"].as_array().into_iter().flatten()).any(|r| r["code"] == case.code);
        if h["state"] == case.state && listed {
            Ok(h.clone())
        } else {
            Err(h.to_string())
        }
    })
    .await;
    let reason = (health["reasons"].as_array().into_iter().flatten())
        .find(|r| r["code"] == case.code)
        .expect("listed");
    for field in ["summary", "action"] {
        assert!(
            reason[field].as_str().is_some_and(|s| !s.is_empty()),
            "{} has no {field}: {reason}",
            case.code
        );
    }

    // The alert fires, for this GPU.
    let fired = poll("the alert firing", 15, async || {
        let body = get(&client, &firing_url).await?;
        let on_gpu = (body["alerts"].as_array().into_iter().flatten())
            .find(|a| a["rule"] == "UnderTest" && a["labels"]["gpu"] == case.uuid)
            // A number's value settles with the readings (84 °C, then 87 °C).
            .filter(|a| case.value.is_none_or(|v| a["value"].as_f64() == Some(v)))
            .cloned();
        on_gpu.ok_or_else(|| body.to_string())
    })
    .await;
    assert_eq!(fired["labels"]["severity"], "critical", "{fired}");

    // The agent stops: the GPU's samples go stale, the alert resolves.
    sigterm(&agent);
    wait_stdout(agent, "agent").await;
    poll("the alert resolved", 15, async || {
        let body = get(&client, &history_url).await?;
        let resolved = (body["transitions"].as_array().into_iter().flatten())
            .any(|t| t["from"] == "firing" && t["to"] == "resolved");
        if resolved {
            Ok(())
        } else {
            Err(body.to_string())
        }
    })
    .await;
    let firing = get(&client, &firing_url).await.expect("firing list");
    assert_eq!(
        firing["alerts"].as_array().map(Vec::len),
        Some(0),
        "{firing}"
    );

    let mut c = collector.child;
    sigterm(&c);
    c.wait().await.expect("collector exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_79_gpu_fell_off_the_bus_is_critical_and_alerts() {
    run(Case {
        scenario: "health-xid79.json",
        uuid: "GPU-79000000-0000-0000-0000-000000000079",
        state: "critical",
        code: "xid_79",
        condition: "xid_critical",
        value: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_48_double_bit_ecc_is_critical_and_alerts() {
    run(Case {
        scenario: "health-xid48.json",
        uuid: "GPU-48000000-0000-0000-0000-000000000048",
        state: "critical",
        code: "xid_48",
        condition: "xid_critical",
        value: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_94_contained_ecc_is_a_warning_and_alerts() {
    run(Case {
        scenario: "health-xid94.json",
        uuid: "GPU-94000000-0000-0000-0000-000000000094",
        state: "warning",
        code: "xid_94",
        condition: "gpu_health == 1",
        value: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_bit_ecc_event_is_critical_and_alerts() {
    run(Case {
        scenario: "health-ecc-dbe.json",
        uuid: "GPU-dbe00000-0000-0000-0000-0000000000db",
        state: "critical",
        code: "ecc_dbe",
        condition: "gpu_health == 2",
        value: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_row_remap_is_a_warning_and_alerts() {
    run(Case {
        scenario: "health-remap-pending.json",
        uuid: "GPU-4e9a0000-0000-0000-0000-00000000000a",
        state: "warning",
        code: "row_remap_pending",
        condition: "gpu_row_remap_pending",
        value: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thermal_throttling_below_slowdown_is_a_warning_and_alerts() {
    run(Case {
        scenario: "health-thermal.json",
        uuid: "GPU-7e000000-0000-0000-0000-0000000000c0",
        // 87 °C: 2 °C under slowdown (89), 5 under shutdown (92). Under slowdown the GPU is
        // not near shutdown (as an H100's 89 / 92 °C thresholds are close): a warning, with
        // its clocks thermally reduced.
        state: "warning",
        code: "throttle_thermal",
        condition: "gpu_temp_margin_c <= 5",
        // 89 °C slowdown - 87 °C.
        value: Some(2.0),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gpu_is_critical_and_alerts() {
    run(Case {
        scenario: "health-gpu-lost.json",
        uuid: "GPU-1057000-0000-0000-0000-000000000010",
        state: "critical",
        code: "gpu_lost",
        condition: "gpu_lost",
        value: None,
    })
    .await;
}
