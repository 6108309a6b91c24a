//! A real demo collector in the test process, and waiting on conditions.

use gpufleet_collector::cli::demo::{DemoOptions, run_demo};
use gpufleet_collector::server::ServeOptions;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A running demo; stopped (and its database removed) on drop.
pub struct Demo {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the demo: `nodes` simulated nodes of `gpus` GPUs, sampling every 200 ms, with
/// two minutes of history (so today's energy has rows). Returns once the fleet lists
/// every node with a sample.
pub async fn start_demo(nodes: u32, gpus: u32) -> Demo {
    let dir = tempfile::tempdir().expect("tempdir");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("grpc");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("http");
    let url = format!("http://{}", http.local_addr().expect("addr"));
    let options = ServeOptions {
        db_url: format!("sqlite://{}", dir.path().join("demo.db").display()),
        ..Default::default()
    };
    let demo = DemoOptions {
        nodes,
        gpus_per_node: gpus,
        interval: Duration::from_millis(200),
        seed: Some(17),
        history: Duration::from_secs(120),
    };
    let stop = CancellationToken::new();
    tokio::spawn(run_demo(demo, options, grpc, http, stop.clone()));
    let d = Demo {
        url,
        stop,
        _dir: dir,
    };
    let fleet = format!("{}/api/v1/fleet", d.url);
    let expected = nodes;
    wait_until(
        "every demo node with a sample",
        Duration::from_secs(60),
        async || {
            let v: serde_json::Value = reqwest::get(&fleet).await.ok()?.json().await.ok()?;
            let nodes = v.as_array()?;
            let live = nodes
                .iter()
                .filter(|n| n["connected"] == serde_json::json!(true))
                .count();
            (live == nodes.len() && u32::try_from(live).ok()? == expected).then_some(())
        },
    )
    .await;
    d
}

/// Polls `f` every 50 ms until it gives a value; fails the test after `within`.
pub async fn wait_until<T>(
    what: &str,
    within: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
