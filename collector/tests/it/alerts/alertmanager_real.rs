//! A real Alertmanager (Debian's `prometheus-alertmanager`, installed by `scripts/need-deb`
//! when missing; the test fails, never skips, when it cannot be had or run) receiving the
//! real collector binary's alerts: a rule from the config file that every simulated GPU
//! meets fires, and the alert appears in Alertmanager's `GET /api/v2/alerts` with its
//! labels, annotations and start; the agent is killed, its GPUs' series go stale, and the
//! alert leaves Alertmanager's active alerts as resolved — within seconds, while the
//! `endsAt` it was sent with lies hours ahead (`resend_delay = "1h"`), so only a resolved
//! notification can have ended it.

use crate::harness::{self, start_sim_agent};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

fn alertmanager_bin() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/need-deb");
    let out = std::process::Command::new(script)
        .args(["prometheus-alertmanager", "prometheus-alertmanager"])
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/need-deb");
    assert!(
        out.status.success(),
        "Alertmanager is needed by this test and could not be installed \
         (scripts/need-deb prometheus-alertmanager prometheus-alertmanager)"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Alertmanager on a free port, clustering off, its data in `dir`.
async fn start_alertmanager(dir: &std::path::Path) -> (Child, String) {
    let config = dir.join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: devnull\n  group_wait: 1s\nreceivers:\n  - name: devnull\n",
    )
    .expect("write alertmanager.yml");
    let listen = format!("127.0.0.1:{}", crate::common::free_port());
    let child = Command::new(alertmanager_bin())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={listen}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus-alertmanager");
    let client = reqwest::Client::new();
    crate::common::wait_until(
        "Alertmanager to be ready",
        Duration::from_secs(30),
        async || {
            let r = client
                .get(format!("http://{listen}/-/ready"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    (child, listen)
}

/// Alertmanager's active alerts named `name`.
async fn active(client: &reqwest::Client, am: &str, name: &str) -> Vec<Value> {
    let v: Value = client
        .get(format!("http://{am}/api/v2/alerts"))
        .query(&[("filter", format!("alertname=\"{name}\""))])
        .send()
        .await
        .expect("GET /api/v2/alerts")
        .json()
        .await
        .expect("Alertmanager answers JSON");
    v.as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn alertmanager_receives_an_alert_that_fires_then_resolves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_am, am) = start_alertmanager(dir.path()).await;
    let config = dir.path().join("collector.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[alerts]
evaluation_interval = "500ms"
resend_delay = "1h"
external_url = "http://gpufleet.test:8080"

[[alerts.rules]]
name = "GpufleetTestWarm"
condition = "gpu_temp_c > 0"
severity = "warning"
labels = {{ team = "infra" }}
annotations = {{ summary = "{{{{ $labels.node }}}} GPU {{{{ $labels.gpu_index }}}} is warm" }}

[[alerts.webhooks]]
kind = "alertmanager"
url = "http://{am}"
timeout = "5s"
"#
        ),
    )
    .expect("write the collector's config");
    let db = format!("sqlite://{}", dir.path().join("c.db").display());
    let config_arg = config.display().to_string();
    let collector = harness::start_collector(
        &db,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[
            "--config",
            &config_arg,
            "--stale-after",
            "1s",
            "--offline-after",
            "1h",
        ],
    )
    .await;
    let spool = dir.path().join("spool");
    let mut agent = start_sim_agent(
        &collector.grpc,
        "am-node",
        &spool,
        2,
        &["--interval", "200ms"],
    );

    let client = reqwest::Client::new();
    let alerts = crate::common::wait_until(
        "both GPUs' alerts in Alertmanager",
        Duration::from_secs(60),
        async || {
            let a = active(&client, &am, "GpufleetTestWarm").await;
            (a.len() == 2).then_some(a)
        },
    )
    .await;
    for a in &alerts {
        assert_eq!(a["labels"]["node"], "am-node");
        assert_eq!(a["labels"]["severity"], "warning");
        assert_eq!(a["labels"]["team"], "infra");
        assert_eq!(a["status"]["state"], "active");
        assert_eq!(a["generatorURL"], "http://gpufleet.test:8080/alerts");
        let index = a["labels"]["gpu_index"].as_str().expect("gpu_index");
        assert_eq!(
            a["annotations"]["summary"],
            format!("am-node GPU {index} is warm")
        );
        assert!(
            a["labels"]["gpu"]
                .as_str()
                .is_some_and(|g| g.starts_with("GPU-")),
            "{a}"
        );
    }
    // The collector's API knows the same alerts as firing.
    let ours: Value = client
        .get(format!(
            "http://{}/api/v1/alerts?state=firing",
            collector.http
        ))
        .send()
        .await
        .expect("GET /api/v1/alerts")
        .json()
        .await
        .expect("JSON");
    assert_eq!(ours["alerts"].as_array().map(Vec::len), Some(2), "{ours}");

    agent.kill().await.expect("kill the agent");
    crate::common::wait_until(
        "the alerts to resolve in Alertmanager",
        Duration::from_secs(30),
        async || {
            active(&client, &am, "GpufleetTestWarm")
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let resolved: Value = client
        .get(format!(
            "http://{}/api/v1/alerts?state=resolved",
            collector.http
        ))
        .send()
        .await
        .expect("GET /api/v1/alerts")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        resolved["alerts"].as_array().map(Vec::len),
        Some(2),
        "{resolved}"
    );
    harness::sigterm(&collector.child);
}
