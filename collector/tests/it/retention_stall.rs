//! Retention must not stall ingest on SQLite: while retention deletes hundreds of
//! thousands of rows, the group-commit writer's transactions keep committing within a
//! second. (SQLite has one writer at a time; a waiting writer used to lose every race for
//! the lock to retention's back-to-back delete statements until retention ended.)

use crate::common::*;
use gpufleet_core::{Event, EventKind};
use std::time::{Duration, Instant};

const TICKS: u32 = 4_000;
const EVENTS_PER_TICK: u64 = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_do_not_stall_the_writer() {
    let (_dir, store) = sqlite_store().await;
    let rec = store
        .register_node(
            &hello("node-a"),
            &inventory(vec![gpu_info_sparse("GPU-a", 0)]),
            T0,
        )
        .await
        .expect("register");
    // Old events to expire: TICKS × EVENTS_PER_TICK rows.
    for (seq, start) in (0..TICKS).step_by(100).enumerate() {
        let mut b = batch(
            seq as u64 + 1,
            T0 + i64::from(start) * 1000,
            100,
            &["GPU-a"],
        );
        for t in &mut b.ticks {
            t.events = (0..EVENTS_PER_TICK)
                .map(|code| Event {
                    time_ms: t.time_ms,
                    gpu_uuid: "GPU-a".into(),
                    kind: EventKind::Xid,
                    code: Some(code),
                    detail: String::new(),
                })
                .collect();
        }
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write old events");
    }

    let retention = tokio::spawn({
        let store = std::sync::Arc::clone(&store);
        async move {
            let started = Instant::now();
            let out = store
                .expire_rollups_before(T0 + 30 * 86_400_000, 5_000)
                .await
                .expect("retention");
            (started.elapsed(), out)
        }
    });
    // The writer meanwhile: one small batch after another, each timed.
    let (mut worst, mut writes) = (Duration::ZERO, 0u64);
    let mut seq = 1_000;
    while !retention.is_finished() {
        let b = batch(seq, T0 + 20 * 86_400_000 + seq as i64 * 1000, 1, &["GPU-a"]);
        let started = Instant::now();
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write during retention");
        worst = worst.max(started.elapsed());
        writes += 1;
        seq += 1;
    }
    let (took, out) = retention.await.expect("join");
    let deleted = out.deleted.get("events").copied().unwrap_or(0);
    println!(
        "retention: {deleted} events deleted in {took:?} ({} transactions); \
         writer: {writes} commits meanwhile, worst {worst:?}",
        out.transactions
    );
    assert_eq!(deleted, u64::from(TICKS) * EVENTS_PER_TICK);
    assert!(
        worst < Duration::from_secs(1),
        "a write waited {worst:?} while retention ran for {took:?}"
    );
    assert!(writes > 1, "the writer committed while retention ran");
}
