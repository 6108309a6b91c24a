//! End to end, health: the real `gpufleet-agent` on the fake libnvidia-ml (scenario
//! `fake-nvml/scenarios/health-remap-pending.json`: a row remap becomes pending at the
//! third health read) streaming to the real `gpufleet-collector`; the GPU detail answer
//! (`GET /api/v1/gpus/{uuid}`) shows the raw health sample (`health_counters`), the judged health (warning,
//! `row_remap_pending`) and the temperature
//! thresholds once the remap is pending, and the stored health history has it not
//! pending before. (The history, not the first live answer: an agent that connects late
//! sends its first batch with the pending read already in it.)

use crate::harness::{sigterm, start_collector, start_fake_nvml_agent, wait_stdout};
use gpufleet_collector::store::TimeRange;
use serde_json::Value;
use std::time::{Duration, Instant};

const UUID: &str = "GPU-4e9a0000-0000-0000-0000-00000000000a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_row_remap_read_by_the_agent_reaches_the_gpu_detail_answer() {
    let dir = tempfile::tempdir().expect("tempdir");

    let db_url = format!("sqlite://{}", dir.path().join("health.db").display());
    let collector = start_collector(&db_url, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let agent = start_fake_nvml_agent(
        dir.path(),
        "health-remap-pending.json",
        &collector.grpc.to_string(),
        "health-node",
        "100ms",
        "300ms",
    );

    let client = reqwest::Client::new();
    let url = format!("http://{}/api/v1/gpus/{UUID}", collector.http);
    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "no pending remap reached the API: {seen:#?}"
        );
        if let Ok(resp) = client.get(&url).send().await
            && resp.status().is_success()
        {
            let body: Value = resp.json().await.expect("JSON");
            let pending = body["health_counters"]["remapped_rows_pending"].clone();
            if seen
                .last()
                .is_none_or(|h| h["health_counters"] != body["health_counters"])
            {
                seen.push(body.clone());
            }
            if pending == Value::Bool(true) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = seen.last().expect("answers");
    // Judged: a pending remap is a warning (the GPU needs a reset), with what to do.
    let judged = &last["health"];
    assert_eq!(judged["state"], "warning", "{last}");
    let remap = judged["reasons"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["code"] == "row_remap_pending"))
        .unwrap_or_else(|| panic!("no row_remap_pending reason: {judged}"));
    assert_eq!(remap["severity"], "warning");
    assert!(
        remap["action"]
            .as_str()
            .is_some_and(|a| a.contains("reset"))
    );
    let h = &last["health_counters"];
    assert_eq!(h["gpu_uuid"], UUID);
    assert_eq!(h["remapped_rows_uncorrectable"], 1);
    assert_eq!(h["remapped_rows_failed"], false);
    assert_eq!(h["persistence_mode"], true);
    assert!(h["time_ms"].is_i64() && h["time"].is_string(), "{h}");
    assert_eq!(last["inventory"]["temp_slowdown_c"], 89, "{last}");
    assert_eq!(last["inventory"]["temp_shutdown_c"], 92);

    sigterm(&agent);
    wait_stdout(agent, "agent").await;
    let mut c = collector.child;
    sigterm(&c);
    c.wait().await.expect("collector exits");

    // Every health read the agent made is stored, in order: not pending, then pending.
    let store = gpufleet_collector::store::open(&db_url)
        .await
        .expect("open the collector's db");
    let nodes = store.nodes().await.expect("nodes");
    let gpu = nodes
        .iter()
        .filter(|n| n.name == "health-node")
        .flat_map(|n| &n.gpus)
        .find(|g| g.info.uuid == UUID)
        .expect("the GPU is registered");
    let all_time = TimeRange {
        from_ms: 0,
        to_ms: i64::MAX,
    };
    let history = store
        .gpu_health(gpu.id, all_time, 100_000)
        .await
        .expect("health history");
    let pending: Vec<Option<bool>> = history
        .iter()
        .map(|(_, h)| h.remapped_rows_pending)
        .collect();
    let first_true = pending
        .iter()
        .position(|p| *p == Some(true))
        .unwrap_or_else(|| panic!("pending stored: {pending:?}"));
    assert_eq!(
        &pending[..first_true],
        [Some(false), Some(false)],
        "the two reads before the remap became pending"
    );
    assert!(
        pending[first_true..].iter().all(|p| *p == Some(true)),
        "{pending:?}"
    );
    store.close().await;
}
