//! The group-commit writer: one task owns every write of samples to the store.
//!
//! Ingest streams hand it validated batches through a **bounded** queue. It takes one
//! batch, then whatever else is already queued up to a row budget, writes them all in one
//! transaction, commits, updates the live state, and only then answers each batch (so an
//! ack always means durable). Many small batches from many nodes thus share one fsync.
//! A batch the store left out as a conflict ([`crate::store::WriteOutcome::conflicts`])
//! is answered with [`StoreError::Conflict`] and is not part of the live state.
//!
//! **After a commit** the live state, the announcements and the answers are a second
//! task's work (the lane's finisher, fed in commit order), so the next group's
//! transaction starts while the last one's batches are applied, announced and dropped;
//! each batch is still answered only after it is durable and in the live state.
//!
//! **When the queue is full**, [`WriterHandle::submit`] waits for room. The stream that
//! submits stops reading its HTTP/2 stream meanwhile, so HTTP/2 flow control pushes back to
//! the agent, whose spool absorbs the delay. Nothing is dropped and nothing is refused for
//! being busy. Memory is bounded by `queue_batches` times the largest batch the message
//! size limit admits (plus each stream's in-flight batches, see `ingest`).
//!
//! **Lanes.** Where the store runs write transactions side by side (PostgreSQL), the
//! writer is several lanes, each a writer as above with its own queue; a node's batches
//! always go to the same lane (by node id), so they are committed in the order they were
//! sent, while one lane's commit overlaps another's preparing and copying. SQLite takes
//! one writer at a time: one lane.
//!
//! A failed transaction is retried batch by batch when it held several and the error was
//! not transient (so one poison batch cannot take others down with it); after a node's
//! batch fails, that node's later batches in the group are refused too, so the store never
//! holds a newer seq of a node without the older ones it was sent with.
//!
//! **When the database is down** (restart, failover), commits fail as transient and every
//! batch is refused as retryable, so agents keep spooling and resend; each attempt waits
//! for the store's connection pool (its acquire timeout paces the retries). The first
//! commit that succeeds again logs `database is back` with the outage's length.

use crate::live::state::{Committed, Live};
use crate::metrics::Metrics;
use crate::store::{IngestWrites, NodeBatch, NodeId, StoreError, WriteOutcome};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// How the writer batches its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// Batches waiting for the writer before submitters wait.
    pub queue_batches: usize,
    /// Rows (GPU + process + host samples + events) the writer gathers into one
    /// transaction before committing; a single larger batch is still written whole. At
    /// saturation, fewer and larger transactions write each table's newest pages fewer
    /// times (SQLite's WAL frames, PostgreSQL's WAL and commit); below it, groups are what
    /// is queued, so small.
    pub max_rows_per_commit: usize,
    /// Lanes committing side by side where the store allows concurrent writes (each
    /// with `queue_batches / lanes` of the queue); one otherwise.
    pub lanes: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            queue_batches: 64,
            max_rows_per_commit: 60_000,
            lanes: 2,
        }
    }
}

/// The answer to one submitted batch: `Ok` once committed, or the store's error
/// (shared by every batch of the failed transaction).
pub type WriteResult = Result<(), Arc<StoreError>>;

/// The writer has stopped (the collector is shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the writer has stopped")]
pub struct WriterClosed;

struct WriteRequest {
    batch: NodeBatch,
    done: oneshot::Sender<WriteResult>,
}

/// Submits batches to the writer. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    /// One queue per lane; a node's batches go to lane `node id mod lanes`.
    lanes: Arc<[mpsc::Sender<WriteRequest>]>,
}

impl WriterHandle {
    /// Queues a batch, waiting while the queue is full. The returned receiver resolves
    /// after the batch's transaction committed (or failed).
    pub async fn submit(
        &self,
        batch: NodeBatch,
    ) -> Result<oneshot::Receiver<WriteResult>, WriterClosed> {
        let (done, rx) = oneshot::channel();
        let lane = batch.keys.id.0.rem_euclid(self.lanes.len() as i64) as usize;
        self.lanes[lane]
            .send(WriteRequest { batch, done })
            .await
            .map_err(|_| WriterClosed)?;
        Ok(rx)
    }

    /// Batches queued and not yet taken by the writer.
    pub fn queued(&self) -> usize {
        (self.lanes.iter())
            .map(|tx| tx.max_capacity() - tx.capacity())
            .sum()
    }
}

/// Starts the writer. It runs until every [`WriterHandle`] is dropped or `stop` is
/// cancelled; either way it first commits and answers everything already queued.
pub fn spawn(
    store: Arc<dyn IngestWrites>,
    live: Arc<Live>,
    metrics: Arc<Metrics>,
    options: WriterOptions,
    stop: CancellationToken,
) -> (WriterHandle, JoinHandle<()>) {
    let lanes = match store.concurrent_writes() {
        true => options.lanes.max(1),
        false => 1,
    };
    let mut senders = Vec::with_capacity(lanes);
    let mut tasks = Vec::with_capacity(2 * lanes);
    for _ in 0..lanes {
        let (tx, rx) = mpsc::channel((options.queue_batches / lanes).max(1));
        // One committed group waits while the finisher works on the one before it.
        let (finished, to_finish) = mpsc::channel(1);
        let finisher = Finisher {
            live: Arc::clone(&live),
            metrics: Arc::clone(&metrics),
        };
        let writer = Writer {
            store: Arc::clone(&store),
            metrics: Arc::clone(&metrics),
            finished,
            options,
            outage: None,
        };
        senders.push(tx);
        tasks.push(tokio::spawn(writer.run(rx, stop.clone())));
        // Ends once its writer has stopped and every committed group is finished.
        tasks.push(tokio::spawn(finisher.run(to_finish)));
    }
    let all = tokio::spawn(async move {
        for t in tasks {
            if let Err(e) = t.await {
                error!(error = %e, "a writer lane failed");
            }
        }
    });
    (
        WriterHandle {
            lanes: senders.into(),
        },
        all,
    )
}

struct Writer {
    store: Arc<dyn IngestWrites>,
    metrics: Arc<Metrics>,
    /// Committed groups, in commit order, for the lane's [`Finisher`].
    finished: mpsc::Sender<CommittedGroup>,
    options: WriterOptions,
    /// Since when commits have been failing with transient errors (the database is
    /// unreachable or restarting), and how many failed; `None` while they succeed.
    outage: Option<Outage>,
}

/// A run of commits that failed with transient errors.
#[derive(Debug, Clone, Copy)]
struct Outage {
    since: Instant,
    failed_commits: u64,
}

impl Writer {
    /// Notes a failed commit; a transient error starts or extends an outage.
    fn failed(&mut self, e: &StoreError) {
        self.metrics.commit_failures.fetch_add(1, Relaxed);
        if e.is_transient() {
            let outage = self.outage.get_or_insert(Outage {
                since: Instant::now(),
                failed_commits: 0,
            });
            outage.failed_commits += 1;
        }
    }

    /// Notes a successful commit; ends an outage, saying so.
    fn succeeded(&mut self) {
        if let Some(o) = self.outage.take() {
            info!(
                failed_commits = o.failed_commits,
                outage_ms = o.since.elapsed().as_millis() as u64,
                "database is back: commits succeed again"
            );
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<WriteRequest>, stop: CancellationToken) {
        let mut stopping = false;
        loop {
            let first = if stopping {
                rx.recv().await
            } else {
                tokio::select! {
                    r = rx.recv() => r,
                    () = stop.cancelled() => {
                        // Refuse new submissions; what is queued is still committed.
                        rx.close();
                        stopping = true;
                        continue;
                    }
                }
            };
            let Some(first) = first else { break };
            let mut rows = first.batch.rows();
            let mut group = vec![first];
            while rows < self.options.max_rows_per_commit {
                match rx.try_recv() {
                    Ok(r) => {
                        rows += r.batch.rows();
                        group.push(r);
                    }
                    Err(_) => break,
                }
            }
            self.commit(group, rows).await;
        }
        debug!("writer stopped");
    }

    async fn commit(&mut self, group: Vec<WriteRequest>, rows: usize) {
        let (batches, waiters): (Vec<NodeBatch>, Vec<_>) =
            group.into_iter().map(|r| (r.batch, r.done)).unzip();
        let started = Instant::now();
        match self.store.write_batches(&batches).await {
            Ok(outcome) => {
                let took = started.elapsed();
                self.metrics.observe_commit(took);
                debug!(
                    batches = batches.len(),
                    rows,
                    ms = took.as_millis() as u64,
                    "committed"
                );
                self.succeeded();
                self.finish(batches, waiters, outcome).await;
            }
            Err(e) if batches.len() > 1 && !e.is_transient() => {
                self.failed(&e);
                warn!(error = %e, batches = batches.len(), "group commit failed; retrying batch by batch");
                self.commit_one_by_one(batches, waiters).await;
            }
            Err(e) => {
                self.failed(&e);
                error!(error = %e, batches = batches.len(), rows, "commit failed; batches refused as retryable");
                let e = Arc::new(e);
                for w in waiters {
                    let _ = w.send(Err(Arc::clone(&e)));
                }
            }
        }
    }

    async fn commit_one_by_one(
        &mut self,
        batches: Vec<NodeBatch>,
        waiters: Vec<oneshot::Sender<WriteResult>>,
    ) {
        let mut failed: HashMap<NodeId, Arc<StoreError>> = HashMap::new();
        for (nb, w) in batches.into_iter().zip(waiters) {
            if let Some(e) = failed.get(&nb.keys.id) {
                let _ = w.send(Err(Arc::clone(e)));
                continue;
            }
            let started = Instant::now();
            match self.store.write_batches(std::slice::from_ref(&nb)).await {
                Ok(outcome) => {
                    self.metrics.observe_commit(started.elapsed());
                    self.succeeded();
                    self.finish(vec![nb], vec![w], outcome).await;
                }
                Err(e) => {
                    self.failed(&e);
                    error!(node = %nb.keys.name, seq = nb.batch.seq, error = %e, "batch could not be stored");
                    let e = Arc::new(e);
                    failed.insert(nb.keys.id, Arc::clone(&e));
                    let _ = w.send(Err(e));
                }
            }
        }
    }

    /// Hands a committed group to the finisher.
    async fn finish(
        &self,
        batches: Vec<NodeBatch>,
        waiters: Vec<oneshot::Sender<WriteResult>>,
        outcome: WriteOutcome,
    ) {
        let group = CommittedGroup {
            batches,
            waiters,
            outcome,
        };
        // The finisher stops only after this writer has (it holds the receiver until
        // the sender is dropped), so a send cannot fail while the writer runs; if it
        // did, the waiters would be dropped and their streams answer "writer stopped".
        if self.finished.send(group).await.is_err() {
            error!("the writer's finisher has stopped; a committed group goes unanswered");
        }
    }
}

/// A committed group on its way to the finisher.
struct CommittedGroup {
    batches: Vec<NodeBatch>,
    waiters: Vec<oneshot::Sender<WriteResult>>,
    outcome: WriteOutcome,
}

/// What follows a lane's commits, in their order: the live state, counters,
/// announcements, then the answers.
struct Finisher {
    live: Arc<Live>,
    metrics: Arc<Metrics>,
}

impl Finisher {
    async fn run(self, mut rx: mpsc::Receiver<CommittedGroup>) {
        while let Some(group) = rx.recv().await {
            self.finish(group);
        }
    }

    fn finish(
        &self,
        CommittedGroup {
            batches,
            waiters,
            mut outcome,
        }: CommittedGroup,
    ) {
        let total: u64 = outcome.inserted_gpu_samples.values().sum();
        self.metrics.gpu_samples_ingested.fetch_add(total, Relaxed);
        // Batches the store left out (conflicts) are answered with their reason and are
        // not part of the live state.
        let mut refused: HashMap<usize, Arc<StoreError>> = HashMap::new();
        for c in std::mem::take(&mut outcome.conflicts) {
            if let Some(nb) = batches.get(c.index) {
                warn!(node = %nb.keys.name, seq = nb.batch.seq, reason = %c.reason, "batch conflicts with stored samples; refused");
                refused.insert(
                    c.index,
                    Arc::new(StoreError::Conflict {
                        node: nb.keys.name.clone(),
                        seq: nb.batch.seq,
                        reason: c.reason,
                    }),
                );
            }
        }
        let (batches, waiters): (Vec<NodeBatch>, Vec<_>) = batches
            .into_iter()
            .zip(waiters)
            .enumerate()
            .filter_map(|(i, (nb, w))| match refused.remove(&i) {
                Some(e) => {
                    let _ = w.send(Err(e));
                    None
                }
                None => Some((nb, w)),
            })
            .unzip();
        let announce = self.live.has_subscribers();
        let mut counted: HashSet<NodeId> = HashSet::new();
        for nb in &batches {
            // The outcome counts per node; credit it once, with the node's first batch.
            let inserted = if counted.insert(nb.keys.id) {
                outcome
                    .inserted_gpu_samples
                    .remove(&nb.keys.id)
                    .unwrap_or(0)
            } else {
                0
            };
            self.live.committed(nb, inserted);
        }
        if announce {
            for nb in batches {
                self.live.announce(Committed {
                    node: nb.keys.name.clone(),
                    batch: nb.batch,
                });
            }
        }
        for w in waiters {
            let _ = w.send(Ok(()));
        }
    }
}
