//! The group-commit writer: answers only after commit, isolates a batch the store refuses,
//! commits what is queued when stopped, and under a store slower than the fleet keeps its
//! queue bounded and loses nothing (over a slow fake of the writes it needs).

use crate::common::*;
use async_trait::async_trait;
use gpufleet_collector::ingest::writer::{self, WriterOptions};
use gpufleet_collector::live::state::Live;
use gpufleet_collector::metrics::Metrics;
use gpufleet_collector::store::{
    GpuId, IngestWrites, NodeBatch, NodeId, NodeKeys, NodeRecord, Rehomed, StoreError, WriteOutcome,
};
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{Inventory, UnixMs};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot::error::TryRecvError;
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
        store.clone(),
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

/// A store slower than the fleet: each commit takes `per_row` for each row it holds. It
/// remembers every batch it committed, as (node, seq), in commit order, and the most
/// writes it saw in flight at once; `concurrent` is what it says of itself.
#[derive(Debug)]
struct SlowWrites {
    per_row: Duration,
    concurrent: bool,
    committed: Mutex<Vec<(String, u64)>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// Batches committed so far, for a test to wait on.
    count: tokio::sync::watch::Sender<usize>,
}

impl SlowWrites {
    fn new(per_row: Duration, concurrent: bool) -> SlowWrites {
        SlowWrites {
            per_row,
            concurrent,
            committed: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            count: tokio::sync::watch::Sender::new(0),
        }
    }
}

#[async_trait]
impl IngestWrites for SlowWrites {
    async fn register_node(
        &self,
        _: &HelloInfo,
        _: &Inventory,
        _: UnixMs,
    ) -> Result<NodeRecord, StoreError> {
        Err(StoreError::Corrupt(
            "the writer never registers nodes".into(),
        ))
    }

    async fn write_batches(&self, batches: &[NodeBatch]) -> Result<WriteOutcome, StoreError> {
        let rows: usize = batches.iter().map(NodeBatch::rows).sum();
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        // No timer when there is nothing to wait: a test that blocks a runtime worker
        // (holding the live state) can leave the runtime's timers undriven meanwhile.
        if !self.per_row.is_zero() {
            tokio::time::sleep(self.per_row * u32::try_from(rows).unwrap_or(u32::MAX)).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed.extend(
            batches
                .iter()
                .map(|nb| (nb.keys.name.clone(), nb.batch.seq)),
        );
        self.count.send_replace(committed.len());
        Ok(WriteOutcome::default())
    }

    fn concurrent_writes(&self) -> bool {
        self.concurrent
    }

    fn set_arrival_clock(&self, _: Option<gpufleet_collector::store::ArrivalClock>) {}

    async fn rehome_gpu(&self, _: &str, _: &str) -> Result<Rehomed, StoreError> {
        Ok(Rehomed::UnknownGpu)
    }
}

/// What the end-to-end overload test showed with real agents (a collector whose store is
/// three times slower than the fleet keeps flat memory while the agents spool), at the
/// writer: its queue never holds more than `queue_batches`, submitters wait for room
/// instead of piling batches up, and once the streams stop every batch is committed
/// exactly once, in each node's order, and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_keeps_the_queue_bounded_and_loses_nothing() {
    slow_store(false).await;
}

/// The same where the store takes concurrent writes (PostgreSQL): the writer's lanes
/// commit side by side, and still each node's batches in its order, each once, within
/// the same queue bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_write_side_by_side_and_keep_each_nodes_order() {
    slow_store(true).await;
}

async fn slow_store(concurrent: bool) {
    const QUEUE: usize = 8;
    const NODES: usize = 3;
    const BATCHES: u64 = 40;
    let store = Arc::new(SlowWrites::new(Duration::from_micros(200), concurrent));
    let options = WriterOptions {
        queue_batches: QUEUE,
        ..WriterOptions::default()
    };
    let stop = CancellationToken::new();
    let (handle, task) = writer::spawn(
        store.clone(),
        Arc::new(Live::new()),
        Arc::new(Metrics::default()),
        options,
        stop.clone(),
    );
    let watch = {
        let handle = handle.clone();
        let done = CancellationToken::new();
        let watching = done.clone();
        let task = tokio::spawn(async move {
            let mut deepest = 0;
            while !watching.is_cancelled() {
                deepest = deepest.max(handle.queued());
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            deepest
        });
        (done, task)
    };
    // Each node's stream submits as fast as the writer lets it (10 ticks of 2 GPUs, 30
    // rows a batch: 6 ms of store time each, far slower than they are offered).
    let streams: Vec<_> = (0..NODES)
        .map(|n| {
            let handle = handle.clone();
            tokio::spawn(async move {
                let name = format!("node-{n}");
                let gpus = [format!("GPU-{n}-0"), format!("GPU-{n}-1")];
                let keys = Arc::new(NodeKeys {
                    id: NodeId(n as i64 + 1),
                    name,
                    gpus: gpus
                        .iter()
                        .enumerate()
                        .map(|(i, g)| (g.clone(), GpuId((n * 2 + i) as i64 + 1)))
                        .collect(),
                });
                let uuids: Vec<&str> = gpus.iter().map(String::as_str).collect();
                let mut answers = Vec::new();
                let mut longest_wait = Duration::ZERO;
                for seq in 1..=BATCHES {
                    let started = std::time::Instant::now();
                    let rx = handle
                        .submit(NodeBatch {
                            keys: Arc::clone(&keys),
                            batch: batch(seq, T0 + seq as i64 * 10_000, 10, &uuids),
                        })
                        .await
                        .expect("queued");
                    longest_wait = longest_wait.max(started.elapsed());
                    answers.push(rx);
                }
                let mut ok = 0;
                for rx in answers {
                    ok += u64::from(rx.await.expect("answered").is_ok());
                }
                (ok, longest_wait)
            })
        })
        .collect();
    let mut waited = Duration::ZERO;
    for s in streams {
        let (ok, longest_wait) = s.await.expect("stream");
        assert_eq!(ok, BATCHES, "every batch is answered as committed");
        waited = waited.max(longest_wait);
    }
    watch.0.cancel();
    let deepest = watch.1.await.expect("watch");
    stop.cancel();
    task.await.expect("writer");
    assert!(
        deepest <= QUEUE,
        "writer queue bounded: {deepest} > {QUEUE}"
    );
    assert!(
        waited >= Duration::from_millis(5),
        "submitters must wait for room while the store is behind (longest wait {waited:?})"
    );
    let committed = store.committed.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        committed.len(),
        NODES * BATCHES as usize,
        "each batch committed once"
    );
    for n in 0..NODES {
        let seqs: Vec<u64> = committed
            .iter()
            .filter(|(name, _)| *name == format!("node-{n}"))
            .map(|(_, seq)| *seq)
            .collect();
        assert_eq!(seqs, (1..=BATCHES).collect::<Vec<_>>(), "node-{n} in order");
    }
    let most = store.most_in_flight.load(Ordering::SeqCst);
    match concurrent {
        true => assert_eq!(most, WriterOptions::default().lanes, "lanes side by side"),
        false => assert_eq!(most, 1, "one write at a time"),
    }
}

/// What follows a commit (the live state, announcements, answers) does not hold up the
/// next commit, and a batch is still answered only once it is in the live state. The
/// live state is held by a reader here, so finishing the first batch waits: the second
/// batch is committed meanwhile, and the first is not answered until the reader lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_commit_does_not_wait_for_the_last_ones_live_state() {
    // The node is registered in a real store so that the live state knows it; the writer
    // writes to the fake, which counts its commits.
    let (_dir, db) = sqlite_store().await;
    let record = register_gpus(&db, "node", &["GPU-0"], T0).await;
    let store = Arc::new(SlowWrites::new(Duration::ZERO, false));
    let live = Arc::new(Live::new());
    live.connected(record.clone());
    let stop = CancellationToken::new();
    let (handle, task) = writer::spawn(
        store.clone(),
        Arc::clone(&live),
        Arc::new(Metrics::default()),
        WriterOptions::default(),
        stop.clone(),
    );
    let keys = Arc::new(record.keys());
    let submit = |seq: u64| {
        handle.submit(NodeBatch {
            keys: Arc::clone(&keys),
            batch: batch(seq, T0 + seq as i64 * 10_000, 2, &["GPU-0"]),
        })
    };
    // A reader holds the live state until told to let go. The finisher then blocks a
    // runtime worker on the live state's lock, and the runtime's timers may go undriven
    // meanwhile, so nothing below needs a timer to pass (the store does not sleep; the
    // waits are on a watch). The reader's own limit, on a plain thread, is what turns a
    // writer that waits for the live state into a failure rather than a hang: it lets go
    // after 60 s, the first batch is then answered, and the check below fails.
    let (holding, held) = std::sync::mpsc::channel();
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let reader = {
        let live = Arc::clone(&live);
        std::thread::spawn(move || {
            live.read(|_| {
                holding.send(()).expect("test waits");
                let _ = wait.recv_timeout(Duration::from_secs(60));
            })
        })
    };
    held.recv().expect("reader holds the live state");
    let mut first = submit(1).await.expect("queued");
    let mut count = store.count.subscribe();
    tokio::time::timeout(Duration::from_secs(10), count.wait_for(|n| *n >= 1))
        .await
        .expect("the first batch is committed")
        .expect("store alive");
    let second = submit(2).await.expect("queued");
    tokio::time::timeout(Duration::from_secs(10), count.wait_for(|n| *n >= 2))
        .await
        .expect("the second batch is committed while the first waits for the live state")
        .expect("store alive");
    let early = first.try_recv();
    assert!(
        matches!(early, Err(TryRecvError::Empty)),
        "the first batch is answered only once it is in the live state: {early:?}"
    );
    release.send(()).expect("reader waits");
    reader.join().expect("reader");
    assert!(first.await.expect("answered").is_ok());
    assert!(second.await.expect("answered").is_ok());
    live.read(|s| {
        let r = &s.nodes["node"].record;
        assert_eq!(r.last_acked_seq, 2, "both batches are in the live state");
    });
    stop.cancel();
    task.await.expect("writer ends");
}
