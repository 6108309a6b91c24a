//! Prometheus remote-write: the collector pushes every stored GPU sample and each
//! workload's cumulative energy to a remote-write 1.0 receiver (Prometheus with
//! `--web.enable-remote-write-receiver`, VictoriaMetrics, Mimir, ...).
//!
//! - `encode.rs`: samples → `TimeSeries` (the names and labels of `/metrics`), protobuf +
//!   snappy.
//! - `reader.rs`: reads the store after the saved positions and builds requests.
//! - `queue.rs`: the bounded queue and its sender, which delivers each request through
//!   [`crate::outbound`] (retries without limit, backoff, refused requests dropped) and
//!   saves positions once it is delivered.
//! - `client.rs`: the HTTP client (headers per spec, bearer / basic auth, TLS CA).
//! - `config.rs`: the `--remote-write-*` flags.
//! - `stats.rs`: its metrics on `/metrics`.
//!
//! It runs as the background job [`JOB`] under a lease ([`crate::accounting::leader`]), so
//! of several collectors sharing a database one pushes; positions live in the database,
//! so a restart, or another collector taking over, resumes where delivery stopped.

pub mod client;
pub mod config;
pub mod encode;
pub mod queue;
pub mod reader;
pub mod stats;

pub use crate::outbound::Delivery;
pub use client::{Auth, HttpSink, Sink};
pub use config::RemoteWriteArgs;
pub use stats::{Stats, register};

use crate::live::status::Clock;
use crate::outbound::BackoffOptions;
use crate::store::{FleetReads, RemoteWriteStore};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The background job's lease name.
pub const JOB: &str = "remote-write";

/// Where and how to push.
#[derive(Debug, Clone)]
pub struct RemoteWriteOptions {
    /// The receiver ([`HttpSink`], or a test's fake).
    pub sink: Arc<dyn Sink>,
    /// How often the store is read for new samples.
    pub interval: Duration,
    /// Samples per request at most (a GPU's tick is never split, so a request may hold a
    /// few more).
    pub max_samples_per_send: usize,
    /// Requests waiting to be sent at most; then the reader waits.
    pub queue_capacity: usize,
    pub backoff: BackoffOptions,
    /// How far back a series pushed for the first time starts.
    pub backfill: Duration,
    /// How long after a minute ends its energy is pushed (the accountant closes minutes
    /// after a grace period; an open minute is never pushed).
    pub energy_delay: Duration,
}

impl RemoteWriteOptions {
    /// Defaults for `sink`.
    pub fn new(sink: Arc<dyn Sink>) -> RemoteWriteOptions {
        RemoteWriteOptions {
            sink,
            interval: Duration::from_secs(1),
            max_samples_per_send: 2_000,
            queue_capacity: 8,
            backoff: BackoffOptions::default(),
            backfill: Duration::from_secs(300),
            energy_delay: Duration::from_secs(120),
        }
    }
}

/// One term of leadership: reads and sends until `term` ends. Pending samples not yet
/// delivered are read again by the next term (their positions were not saved).
pub async fn run_term(
    fleet: Arc<dyn FleetReads>,
    store: Arc<dyn RemoteWriteStore>,
    options: RemoteWriteOptions,
    stats: Arc<Stats>,
    clock: Clock,
    term: CancellationToken,
) {
    let (tx, rx) = queue::channel(options.queue_capacity);
    let sender = tokio::spawn(queue::run_sender(
        rx,
        Arc::clone(&options.sink),
        Arc::clone(&store),
        Arc::clone(&stats),
        options.backoff,
        term.clone(),
    ));
    if let Ok(reader) =
        reader::Reader::start(fleet, store, options, Arc::clone(&stats), clock, tx, &term).await
    {
        reader.run(&term).await;
    }
    term.cancel();
    if let Err(e) = sender.await {
        tracing::warn!(error = %e, "the remote-write sender ended abnormally");
    }
    stats.pending.store(0, Relaxed);
}
