//! The group-commit writer: answers only after commit, isolates a batch the store refuses,
//! and commits what is queued when stopped.

mod common;

use common::*;
use gpufleet_collector::ingest::writer::{self, WriterOptions};
use gpufleet_collector::live::state::Live;
use gpufleet_collector::metrics::Metrics;
use gpufleet_collector::store::{NodeBatch, NodeKeys};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_refused_batch_does_not_take_its_group_down() {
    let (_dir, store) = sqlite_store().await;
    let live = Arc::new(Live::new());
    let metrics = Arc::new(Metrics::default());
    let a = store
        .register_node(
            &hello("a"),
            &inventory(vec![gpu_info_sparse("GPU-a", 0)]),
            T0,
        )
        .await
        .expect("a");
    let b = store
        .register_node(
            &hello("b"),
            &inventory(vec![gpu_info_sparse("GPU-b", 0)]),
            T0,
        )
        .await
        .expect("b");
    live.connected(a.clone());
    live.connected(b.clone());
    let stop = CancellationToken::new();
    let (handle, task) = writer::spawn(
        Arc::clone(&store),
        Arc::clone(&live),
        Arc::clone(&metrics),
        WriterOptions::default(),
        stop.clone(),
    );
    // Keys that lack the GPU the batch names: the store refuses it (not transiently).
    let broken = Arc::new(NodeKeys {
        gpus: Default::default(),
        ..a.keys()
    });
    let mut events = live.subscribe();
    // Queue everything before the writer can take any of it: one group.
    let answers = vec![
        handle
            .submit(node_batch(&b, batch(1, T0, 2, &["GPU-b"])))
            .await
            .expect("queued"),
        handle
            .submit(NodeBatch {
                keys: broken,
                batch: batch(1, T0, 1, &["GPU-a"]),
            })
            .await
            .expect("queued"),
        handle
            .submit(node_batch(&a, batch(2, T0 + 5000, 1, &["GPU-a"])))
            .await
            .expect("queued"),
        handle
            .submit(node_batch(&b, batch(2, T0 + 5000, 1, &["GPU-b"])))
            .await
            .expect("queued"),
    ];
    let mut results = Vec::new();
    for rx in answers {
        results.push(rx.await.expect("answered").is_ok());
    }
    // b's batches commit; a's refused batch fails, and a's later batch with it (so the
    // store never holds a newer seq of a node without the older one sent with it).
    assert_eq!(results, vec![true, false, false, true]);
    let nodes = store.nodes().await.expect("nodes");
    assert_eq!(
        (
            nodes[0].name.as_str(),
            nodes[0].last_acked_seq,
            nodes[0].stored_samples
        ),
        ("a", 0, 0)
    );
    assert_eq!(
        (
            nodes[1].name.as_str(),
            nodes[1].last_acked_seq,
            nodes[1].stored_samples
        ),
        ("b", 2, 3)
    );
    // The live state and the announcements follow the commits.
    live.read(|s| {
        let n = &s.nodes["b"];
        assert_eq!((n.record.last_acked_seq, n.record.stored_samples), (2, 3));
        assert_eq!(n.gpus.values().next().map(|g| g.time_ms), Some(T0 + 5000));
    });
    let first = events.recv().await.expect("announced");
    assert_eq!((first.node.as_str(), first.batch.seq), ("b", 1));
    assert!(metrics.commit_failures.load(Ordering::Relaxed) >= 1);

    // Stopping commits what is queued, then ends.
    let last = handle
        .submit(node_batch(&a, batch(3, T0 + 9000, 1, &["GPU-a"])))
        .await
        .expect("queued");
    stop.cancel();
    assert!(last.await.expect("answered").is_ok());
    task.await.expect("writer ends");
    assert!(
        handle
            .submit(node_batch(&a, batch(4, T0, 1, &["GPU-a"])))
            .await
            .is_err(),
        "closed"
    );
    assert_eq!(store.nodes().await.expect("nodes")[0].last_acked_seq, 3);
}
