//! How long a `/metrics` scrape takes for a large fleet (1,000 nodes × 8 GPUs by default,
//! each GPU with a full sample and one process), and how long a commit waits for the live
//! state's write lock while scrapes run back to back: with the encoding done after the
//! lock is released (the handler), and with the same encoding done under the read lock
//! (how `/metrics` worked before). A benchmark, not a timed test (BENCHMARKS.md):
//!
//! ```text
//! cargo test --release -p gpufleet-collector --test it metrics_bench:: -- --ignored --nocapture
//! ```
//!
//! Knobs (environment): `NODES` (1000), `GPUS` (8), `RUNS` (30).

use crate::common::*;
use crate::fleet_bench::large_fleet;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpufleet_collector::accounting::counters::WorkloadCounters;
use gpufleet_collector::api::prometheus::render;
use gpufleet_collector::api::prometheus::snapshot::{CollectorSnap, Snapshot};
use gpufleet_collector::api::router::{AppState, app};
use gpufleet_collector::live::status::StatusPolicy;
use gpufleet_collector::metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tower::ServiceExt;

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pct = |p: usize| v[(v.len() - 1) * p / 100];
    format!(
        "n {}, median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        v.len(),
        ms(pct(50)),
        ms(pct(99)),
        ms(v[v.len() - 1])
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn metrics_scrape_and_commit_stall() {
    let (nodes, gpus, runs) = (knob("NODES", 1000), knob("GPUS", 8), knob("RUNS", 30));
    let (_dir, store, live) = large_fleet(nodes, gpus).await;
    // A node that keeps committing while scrapes run.
    let writer = register_gpus(&store, "bench-writer", &["GPU-w-0"], T0).await;
    live.connected(writer.clone());
    let counters = Arc::new(WorkloadCounters::new(100_000));
    let state = AppState {
        store,
        live: Arc::clone(&live),
        metrics: Arc::new(Metrics::default()),
        writer: None,
        status: StatusPolicy::default(),
        clock: Arc::new(|| T0 + 1000),
        workloads: Arc::clone(&counters),
        waste: Default::default(),
        renders: Default::default(),
    };
    let policy = StatusPolicy::default();

    // How long the read lock is held per scrape now (the copy), and the whole snapshot
    // (the copy, then the process series grouped after the lock).
    let (mut copies, mut takes) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let start = Instant::now();
        std::hint::black_box(Snapshot::copy_nodes(&live, &policy, T0 + 1000));
        copies.push(start.elapsed());
        let start = Instant::now();
        let s = Snapshot::take(
            &live,
            &policy,
            T0 + 1000,
            CollectorSnap::default(),
            &counters,
        );
        takes.push(start.elapsed());
        std::hint::black_box(s);
    }
    println!(
        "copy under the read lock, {nodes} x {gpus}: {}",
        stats(copies)
    );
    println!("whole snapshot, {nodes} x {gpus}: {}", stats(takes));

    for under_lock in [true, false] {
        let stop = Arc::new(AtomicBool::new(false));
        let committer = std::thread::spawn({
            let (live, stop, writer) = (Arc::clone(&live), Arc::clone(&stop), writer.clone());
            move || {
                let mut waits = Vec::new();
                let mut seq = 2;
                while !stop.load(Ordering::Relaxed) {
                    let b =
                        node_batch(&writer, batch(seq, T0 + seq as i64 * 1000, 1, &["GPU-w-0"]));
                    let start = Instant::now();
                    live.committed(&b, 1);
                    waits.push(start.elapsed());
                    seq += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                waits
            }
        });
        let mut scrapes = Vec::new();
        let mut size = 0;
        for _ in 0..runs {
            let start = Instant::now();
            if under_lock {
                let s = Snapshot::take(
                    &live,
                    &policy,
                    T0 + 1000,
                    CollectorSnap::default(),
                    &counters,
                );
                size = live.read(|_| render(s, |_| {})).len();
            } else {
                let request = Request::get("/metrics")
                    .body(Body::empty())
                    .expect("request");
                let response = app(state.clone())
                    .oneshot(request)
                    .await
                    .expect("infallible");
                assert_eq!(response.status(), StatusCode::OK);
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body");
                size = body.len();
            }
            scrapes.push(start.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        let waits = committer.join().expect("committer thread");
        let how = if under_lock {
            "encoded under the read lock (before)"
        } else {
            "encoded after the lock (now)"
        };
        println!(
            "/metrics {how}, {nodes} x {gpus}, {size} bytes: scrape {}",
            stats(scrapes)
        );
        println!(
            "  commit (live-state write lock) during scrapes: {}",
            stats(waits)
        );
    }
}
