//! The HTTP API through `app(state).oneshot(request)`: no socket, a temporary SQLite
//! store, the real writer (so the live state is updated exactly as in production), and a
//! fixed clock.
//!
//! Shared here: the fixture (store, writer, live state, clock) and a two-GPU fleet.

mod dashboard;
mod gpu_health;
mod health;
mod nodes;
mod series;
mod stream;

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpufleet_collector::api::router::{AppState, app};
use gpufleet_collector::ingest::writer::{self, WriterHandle, WriterOptions};
use gpufleet_collector::live::state::Live;
use gpufleet_collector::live::status::StatusPolicy;
use gpufleet_collector::metrics::Metrics;
use gpufleet_collector::store::{NodeRecord, Store};
use gpufleet_core::*;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    live: Arc<Live>,
    writer: WriterHandle,
    metrics: Arc<Metrics>,
    now: Arc<AtomicI64>,
}

impl Fixture {
    async fn new() -> Fixture {
        let (dir, store) = sqlite_store().await;
        let live = Arc::new(Live::new());
        let metrics = Arc::new(Metrics::default());
        let (writer, _task) = writer::spawn(
            store.clone(),
            Arc::clone(&live),
            Arc::clone(&metrics),
            WriterOptions::default(),
            CancellationToken::new(),
        );
        Fixture {
            _dir: dir,
            store,
            live,
            writer,
            metrics,
            now: Arc::new(AtomicI64::new(T0)),
        }
    }

    fn state(&self) -> AppState {
        let now = Arc::clone(&self.now);
        AppState {
            store: Arc::clone(&self.store),
            live: Arc::clone(&self.live),
            metrics: Arc::clone(&self.metrics),
            writer: Some(self.writer.clone()),
            status: StatusPolicy::default(),
            clock: Arc::new(move || now.load(Ordering::Relaxed)),
            workloads: Default::default(),
            waste: Default::default(),
            renders: Default::default(),
        }
    }

    async fn register(&self, node: &str, gpus: Vec<GpuInfo>) -> NodeRecord {
        let rec = self
            .store
            .register_node(&hello(node), &inventory(gpus), T0)
            .await
            .expect("register");
        self.live.connected(rec.clone());
        rec
    }

    async fn write(&self, rec: &NodeRecord, batch: Batch) {
        let done = self
            .writer
            .submit(node_batch(rec, batch))
            .await
            .expect("writer running");
        done.await.expect("answered").expect("committed");
    }

    async fn get(&self, uri: &str) -> (StatusCode, String) {
        let request = Request::get(uri).body(Body::empty()).expect("request");
        let response = app(self.state())
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
    }

    async fn get_json(&self, uri: &str) -> (StatusCode, Value) {
        let (status, body) = self.get(uri).await;
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{uri}: not JSON ({e}): {body}")),
        )
    }
}

/// Node "node-a" with a fully described GPU-a and a sparse GPU-b, and 3 ticks from T0.
async fn fleet() -> (Fixture, NodeRecord) {
    let f = Fixture::new().await;
    let rec = f
        .register(
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
    f.write(&rec, batch(1, T0, 3, &["GPU-a", "GPU-b"])).await;
    (f, rec)
}
