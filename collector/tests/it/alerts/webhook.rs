//! The alerts job in a real collector (`serve_with_store`), rules from TOML text as the
//! config file gives them, notifying a local JSON webhook: a GPU's temperature over the
//! threshold fires the alert, which is delivered after the receiver's first answer (a
//! 500) through a retry; a temperature under it resolves the alert, notified once; the
//! API shows the alert and its history; the bearer token reaches the receiver.

use crate::common::{gpu_sample_full, open_stream, start_collector, wait_until};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use gpufleet_collector::alerts::notify::JsonPayload;
use gpufleet_collector::alerts::{AlertOptions, AlertsFile};
use gpufleet_collector::outbound::BackoffOptions;
use gpufleet_core::{Batch, Tick};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Seen = Arc<Mutex<Vec<(Option<String>, Bytes, u16)>>>;

/// A receiver that answers 500 to its first request and 200 to the others, recording
/// each request's `Authorization`, body and the status it answered.
async fn receiver() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let seen = Arc::clone(&seen);
            move |headers: HeaderMap, body: Bytes| async move {
                let mut seen = seen.lock().expect("lock");
                let status = if seen.is_empty() { 500 } else { 200 };
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                seen.push((auth, body, status));
                StatusCode::from_u16(status).expect("status")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), seen)
}

fn payloads(seen: &Seen) -> Vec<(Option<String>, JsonPayload, u16)> {
    (seen.lock().expect("lock").iter())
        .map(|(auth, body, status)| {
            let p: JsonPayload = serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("the body is our JSON shape ({e}): {body:?}"));
            (auth.clone(), p, *status)
        })
        .collect()
}

fn tick(temp: u32) -> Tick {
    let mut s = gpu_sample_full("GPU-hot", 1);
    s.temp_gpu_c = Some(temp);
    Tick {
        time_ms: gpufleet_core::config::now_ms(),
        gpus: vec![s],
        ..Tick::default()
    }
}

#[tokio::test]
async fn a_json_webhook_gets_firing_after_a_retry_then_resolved_once() {
    let (url, seen) = receiver().await;
    let toml_text = format!(
        r#"
        [alerts]
        evaluation_interval = "100ms"
        resend_delay = "1h"
        default_rules = false
        [[alerts.rules]]
        name = "GpuHot"
        condition = "gpu_temp_c > 80"
        severity = "critical"
        labels = {{ team = "infra" }}
        annotations = {{ summary = "{{{{ $labels.node }}}} GPU {{{{ $labels.gpu_index }}}} at {{{{ $value }}}} C" }}
        [[alerts.webhooks]]
        kind = "json"
        url = "{url}"
        bearer_token = "hook-s3cret"
        max_attempts = 3
        "#
    );
    let table: toml::Table = toml::from_str(&toml_text).expect("toml");
    let file: AlertsFile = table["alerts"].clone().try_into().expect("[alerts]");
    let settings = file.resolve().expect("valid rules");
    let options = gpufleet_collector::ServeOptions {
        alerts: AlertOptions {
            settings: Arc::new(settings),
            posts: None,
            backoff: BackoffOptions {
                min: Duration::from_millis(50),
                max: Duration::from_millis(200),
            },
        },
        lead: gpufleet_collector::accounting::leader::LeadOptions {
            retry: Duration::from_millis(50),
        },
        ..Default::default()
    };
    let c = start_collector(options).await;
    let mut agent = open_stream(&c, None, "node-7", &["GPU-hot"])
        .await
        .expect("stream");
    let batch = |seq, temp| Batch {
        seq,
        ticks: vec![tick(temp)],
        ..Batch::default()
    };
    agent.send(batch(1, 91)).await;

    let fired = wait_until(
        "the firing notification, delivered",
        Duration::from_secs(30),
        async || {
            let p = payloads(&seen);
            (p.len() >= 2).then_some(p)
        },
    )
    .await;
    let (auth, first, status) = &fired[0];
    assert_eq!(*status, 500, "the receiver refused the first");
    assert_eq!(auth.as_deref(), Some("Bearer hook-s3cret"));
    assert_eq!(fired[1].1, *first, "the same notification, retried");
    assert_eq!(fired[1].2, 200);
    let a = &first.alerts[0];
    assert_eq!(first.alerts.len(), 1);
    assert_eq!(first.source, "gpufleet");
    assert_eq!(
        (a.status.as_str(), a.rule.as_str(), a.severity.as_str()),
        ("firing", "GpuHot", "critical")
    );
    assert_eq!(a.labels["node"], "node-7");
    assert_eq!(a.labels["gpu"], "GPU-hot");
    assert_eq!(a.labels["team"], "infra");
    assert_eq!(a.labels["alertname"], "GpuHot");
    assert_eq!(a.annotations["summary"], "node-7 GPU 0 at 91 C");
    assert_eq!(a.value, 91.0);
    assert_eq!((a.ends_at.as_ref(), a.ends_at_ms), (None, None));
    assert_eq!(a.generator_url, format!("http://{}/alerts", c.http));

    // The API shows it firing.
    let api = |path: &'static str| {
        let http = c.http;
        async move {
            reqwest::get(format!("http://{http}{path}"))
                .await
                .expect("GET")
                .json::<serde_json::Value>()
                .await
                .expect("JSON")
        }
    };
    let current = api("/api/v1/alerts?state=firing").await;
    assert_eq!(current["alerts"][0]["rule"], "GpuHot");
    assert_eq!(current["alerts"][0]["labels"]["gpu"], "GPU-hot");

    agent.send(batch(2, 60)).await;
    let all = wait_until(
        "the resolved notification",
        Duration::from_secs(30),
        async || {
            let p = payloads(&seen);
            (p.len() >= 3).then_some(p)
        },
    )
    .await;
    let resolved = &all[2].1.alerts[0];
    assert_eq!(resolved.status, "resolved");
    assert_eq!(resolved.fingerprint, a.fingerprint);
    assert!(
        resolved.ends_at_ms.is_some_and(|e| e >= a.starts_at_ms),
        "{resolved:?}"
    );
    // Resolved alerts are notified once (and firing ones not before resend_delay).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(payloads(&seen).len(), 3, "nothing more was sent");

    let history = api("/api/v1/alerts/history").await;
    let changes: Vec<(String, String)> = (history["transitions"].as_array().expect("list").iter())
        .map(|t| {
            (
                t["from"].as_str().unwrap_or("").to_owned(),
                t["to"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        changes,
        [
            pair("firing", "resolved"),
            pair("pending", "firing"),
            pair("inactive", "pending")
        ],
        "newest first"
    );
    let resolved_now = api("/api/v1/alerts?state=resolved").await;
    assert_eq!(resolved_now["alerts"][0]["state"], "resolved");
    c.stop().await;
}
