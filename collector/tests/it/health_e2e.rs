//! End to end, health: the real `gpufleet-agent` on the fake libnvidia-ml (scenario
//! `fake-nvml/scenarios/health-remap-pending.json`: a row remap becomes pending at the
//! third health read) streaming to the real `gpufleet-collector`; the GPU detail answer
//! (`GET /api/v1/gpus/{uuid}`) shows the raw health sample (`health_counters`) and the
//! temperature thresholds, first without the remap pending, then with it, and the judged
//! health turns warning with the reason `row_remap_pending`.

use crate::harness::{agent_bin, sigterm, start_collector, wait_stdout};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

const UUID: &str = "GPU-4e9a0000-0000-0000-0000-00000000000a";

/// The fake library cargo built for this test binary (fake-nvml is a dev-dependency).
fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    fake_nvml::built_library(&exe).unwrap_or_else(|| {
        panic!(
            "{} not built beside {}",
            fake_nvml::LIBRARY_FILE,
            exe.display()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_row_remap_read_by_the_agent_reaches_the_gpu_detail_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nvml = dir.path().join("nvml");
    std::fs::create_dir(&nvml).expect("mkdir");
    std::fs::copy(fake_library(), nvml.join("libnvidia-ml.so.1")).expect("copy lib");
    let scenario = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fake-nvml/scenarios/health-remap-pending.json");
    std::fs::copy(&scenario, nvml.join(fake_nvml::SCENARIO_FILE)).expect("copy scenario");

    let db_url = format!("sqlite://{}", dir.path().join("health.db").display());
    let collector = start_collector(&db_url, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let agent = Command::new(agent_bin())
        .args(["run", "--collector", &format!("http://{}", collector.grpc)])
        .args(["--node", "health-node", "--interval", "100ms"])
        .args(["--health-interval", "300ms"])
        .arg("--nvml-lib")
        .arg(nvml.join("libnvidia-ml.so.1"))
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .env("GPUFLEET_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-agent");

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
    let first = seen
        .iter()
        .find(|b| !b["health_counters"].is_null())
        .expect("a health sample");
    assert_eq!(
        first["health_counters"]["remapped_rows_pending"], false,
        "{first}"
    );
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
}
