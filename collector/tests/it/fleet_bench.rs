//! How long `GET /api/v1/nodes` and `GET /api/v1/fleet` take for a large fleet (server time: the handler through
//! the router, no socket), 1,000 nodes x 8 GPUs by default, each GPU with a full latest
//! sample and one process. A benchmark, not a timed test (figures in BENCHMARKS.md):
//!
//! ```text
//! cargo test --release -p gpufleet-collector --test it fleet_bench:: -- --ignored --nocapture
//! ```
//!
//! Knobs (environment): `NODES` (1000), `GPUS` (8), `RUNS` (50).

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpufleet_collector::api::router::{AppState, app};
use gpufleet_collector::live::state::Live;
use gpufleet_collector::live::status::StatusPolicy;
use gpufleet_collector::metrics::Metrics;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn nodes_endpoint_for_a_large_fleet() {
    let (nodes, gpus, runs) = (knob("NODES", 1000), knob("GPUS", 8), knob("RUNS", 50));
    let setup = Instant::now();
    let (_dir, store, live) = large_fleet(nodes, gpus).await;
    eprintln!(
        "setup: {nodes} nodes x {gpus} GPUs in {:?}",
        setup.elapsed()
    );

    let state = AppState {
        store,
        live,
        metrics: Arc::new(Metrics::default()),
        writer: None,
        status: StatusPolicy::default(),
        clock: Arc::new(|| T0 + 1000),
        workloads: Default::default(),
        waste: Default::default(),
        renders: Default::default(),
    };
    for uri in ["/api/v1/nodes", "/api/v1/fleet"] {
        let mut times = Vec::with_capacity(runs as usize);
        let mut size = 0;
        for _ in 0..runs {
            let request = Request::get(uri).body(Body::empty()).expect("request");
            let start = Instant::now();
            let response = app(state.clone())
                .oneshot(request)
                .await
                .expect("infallible");
            assert_eq!(response.status(), StatusCode::OK);
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            times.push(start.elapsed());
            size = body.len();
        }
        times.sort();
        let pct = |p: usize| times[(times.len() - 1) * p / 100];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "GET {uri}, {nodes} nodes x {gpus} GPUs: {size} bytes; {runs} runs: min {:.1} ms, \
             median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
            ms(times[0]),
            ms(pct(50)),
            ms(pct(95)),
            ms(times[times.len() - 1])
        );
    }
}

/// A fleet of `nodes` × `gpus` in a fresh SQLite store and a live state, each GPU with a
/// full latest sample and one process (also used by `metrics_bench`).
pub async fn large_fleet(
    nodes: u32,
    gpus: u32,
) -> (
    tempfile::TempDir,
    Arc<dyn gpufleet_collector::store::Store>,
    Arc<Live>,
) {
    let (_dir, store) = sqlite_store().await;
    let live = Arc::new(Live::new());
    for n in 0..nodes {
        let name = format!("node-{n:04}");
        let uuids: Vec<String> = (0..gpus).map(|g| format!("GPU-{n:04}-{g}")).collect();
        let rec = register_gpus(&store, &name, &uuids, T0).await;
        live.connected(rec.clone());
        let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
        let mut b = batch(1, T0, 1, &refs);
        // One process per GPU, as on a busy training node.
        let p = b.ticks[0].processes[0].clone();
        b.ticks[0].processes = uuids
            .iter()
            .map(|u| {
                let mut p = p.clone();
                p.gpu_uuid = u.clone();
                p
            })
            .collect();
        b.ticks[0].gpus = uuids.iter().map(|u| gpu_sample_full(u, 1)).collect();
        live.committed(&node_batch(&rec, b), u64::from(gpus));
    }
    (_dir, store, live)
}
