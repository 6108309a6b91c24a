//! The demo: its simulated agents all connect from 127.0.0.1, so it must not be held to
//! the per-address limits a real deployment keeps.

use gpufleet_collector::cli::demo::{DemoOptions, run_demo};
use gpufleet_collector::net::limits::LimitOptions;
use gpufleet_collector::net::rate_limit::RateQuota;
use gpufleet_collector::server::ServeOptions;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// With a per-address limit of 2 connections and 1 new stream per second, all 6 of the
/// demo's loopback agents still connect at once (before the fix, only 2 could: the demo
/// stopped at `DEFAULT_MAX_PER_IP` = 256 nodes).
#[tokio::test]
async fn the_demo_connects_more_agents_than_the_per_address_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("grpc");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("http");
    let http_addr = http.local_addr().expect("addr");
    let options = ServeOptions {
        db_url: format!("sqlite://{}", dir.path().join("demo.db").display()),
        max_connections_per_ip: 2,
        limits: LimitOptions {
            grpc_stream_rate: RateQuota {
                per_second: 1,
                burst: 1,
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let demo = DemoOptions {
        nodes: 6,
        gpus_per_node: 1,
        interval: Duration::from_millis(200),
        seed: Some(3),
        history: Duration::ZERO,
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(run_demo(demo, options, grpc, http, stop.clone()));
    let url = format!("http://{http_addr}/api/v1/fleet");
    let client = reqwest::Client::new();
    let connected =
        crate::common::wait_until("6 connected nodes", Duration::from_secs(20), async || {
            let nodes: serde_json::Value = client.get(&url).send().await.ok()?.json().await.ok()?;
            let n = nodes
                .as_array()?
                .iter()
                .filter(|n| n["connected"] == serde_json::json!(true))
                .count();
            (n == 6).then_some(n)
        })
        .await;
    assert_eq!(connected, 6);
    stop.cancel();
    task.await.expect("demo task").expect("demo stops cleanly");
}
