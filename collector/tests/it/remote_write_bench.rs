//! How long remote-write's GPU read takes for a large fleet over SQLite, 125 nodes x 8
//! GPUs by default, each GPU with `TICKS` stored samples: one round read as one query
//! after each GPU's position ([`RemoteWriteStore::gpu_samples_after`]) against one query
//! per GPU (the reads it replaced). A benchmark, not a timed test (figures in
//! BENCHMARKS.md):
//!
//! ```text
//! cargo test -p gpufleet-collector --test it remote_write_bench:: -- --ignored --nocapture
//! ```
//!
//! Knobs (environment): `NODES` (125), `GPUS` (8), `TICKS` (60), `RUNS` (5).
//!
//! [`RemoteWriteStore::gpu_samples_after`]: gpufleet_collector::store::RemoteWriteStore::gpu_samples_after

use crate::common::*;
use gpufleet_collector::store::{GpuId, TimeRange};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run with --ignored --nocapture"]
async fn gpu_round_for_a_large_fleet() {
    let (nodes, gpus, ticks, runs) = (
        knob("NODES", 125),
        knob("GPUS", 8),
        knob("TICKS", 60),
        knob("RUNS", 5),
    );
    let (_dir, store) = sqlite_store().await;
    let mut ids: Vec<GpuId> = Vec::new();
    for n in 0..nodes {
        let uuids: Vec<String> = (0..gpus).map(|g| format!("GPU-{n:04}-{g}")).collect();
        let rec = register_gpus(&store, &format!("node-{n:04}"), &uuids, T0).await;
        let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
        store
            .write_batches(&[node_batch(&rec, batch(1, T0, ticks, &refs))])
            .await
            .expect("write");
        ids.extend(rec.gpus.iter().map(|g| g.id));
    }
    let newest = T0 + i64::from(ticks.saturating_sub(1)) * 1000;
    // Steady state (each GPU one new sample) and a catch-up (each GPU half its samples).
    for (what, after) in [
        ("1 new sample per GPU", newest - 1),
        (
            "catch-up, half the samples per GPU",
            T0 + i64::from(ticks / 2) * 1000 - 1,
        ),
    ] {
        let wanted: Vec<(GpuId, i64)> = ids.iter().map(|id| (*id, after)).collect();
        let (mut batched, mut per_gpu) = (Duration::MAX, Duration::MAX);
        let mut rows = (0, 0);
        for _ in 0..runs {
            let t = Instant::now();
            let got = store
                .gpu_samples_after(&wanted, 100, 50_000)
                .await
                .expect("batched");
            batched = batched.min(t.elapsed());
            rows.0 = got.iter().map(Vec::len).sum::<usize>();
            let t = Instant::now();
            rows.1 = 0;
            for (id, after) in &wanted {
                let range = TimeRange {
                    from_ms: after + 1,
                    to_ms: i64::MAX,
                };
                rows.1 += store.gpu_samples(*id, range, 100).await.expect("one").len();
            }
            per_gpu = per_gpu.min(t.elapsed());
        }
        assert_eq!(rows.0, rows.1, "both read the same rows");
        eprintln!(
            "{} GPUs, {what}: {} rows; one query {batched:?}, {} queries {per_gpu:?} (best of {runs})",
            ids.len(),
            rows.0,
            wanted.len(),
        );
    }
}
