//! `run_agent`: the agent's pipeline, source → sampler → outbox → session, until shutdown.
//! The node agent runs it with its `/proc` host source and its on-disk spool
//! ([`run_agent_with`]); the collector's demo and tests with a simulator and the in-memory
//! queue ([`run_agent`]).

use crate::encoded::EncodedTick;
use crate::queue::{MemoryQueue, Outbox, SharedOutbox, Summary, lock};
use crate::sampler::{Sampler, spawn_sampling};
use crate::session::{self, HelloFacts, UplinkConfig, UplinkError};
use gpufleet_core::{GpuSource, SourceError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// How an agent runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The node name sent in the Hello.
    pub node: String,
    /// Collector addresses (`http://host:port`; comma-separated lists allowed), tried
    /// round-robin on failure.
    pub collectors: Vec<String>,
    /// Sampling interval.
    pub interval: Duration,
    /// Labels sent in the Hello (`rack`, `site`, `region`, …).
    pub labels: BTreeMap<String, String>,
    /// Boot id to report; `None`: the source's, else the host source's.
    pub boot_id: Option<String>,
    /// After shutdown is requested, how long to keep delivering unacked batches.
    pub shutdown_timeout: Duration,
    /// Most ticks per batch.
    pub batch_max_ticks: usize,
    /// Most ticks held unacked in memory (without a durable outbox); beyond, the oldest
    /// are dropped and counted.
    pub queue_max_ticks: usize,
    /// Limit on connecting to a collector and on its Welcome.
    pub connect_timeout: Duration,
    /// TLS trust, client certificate and token ([`crate::tls`]); none by default.
    pub credentials: crate::tls::Credentials,
}

impl RunOptions {
    /// Options with the CLI's defaults: 1 s interval, 100 ticks per batch, one hour of
    /// ticks held, 10 s to deliver at shutdown.
    pub fn new(node: impl Into<String>, collectors: Vec<String>) -> Self {
        Self {
            node: node.into(),
            collectors,
            interval: Duration::from_secs(1),
            labels: BTreeMap::new(),
            boot_id: None,
            shutdown_timeout: Duration::from_secs(10),
            batch_max_ticks: 100,
            queue_max_ticks: 3600,
            connect_timeout: Duration::from_secs(5),
            credentials: crate::tls::Credentials::none(),
        }
    }
}

/// Why an agent could not run.
#[derive(Debug, Error)]
pub enum AgentError {
    /// The options are inconsistent.
    #[error("invalid agent options: {0}")]
    Options(String),
    /// A collector address is unusable.
    #[error(transparent)]
    Collector(#[from] UplinkError),
    /// The source could not say what GPUs there are.
    #[error("cannot read the GPU inventory: {0}")]
    Inventory(#[source] SourceError),
    /// The durable outbox (the spool) could not be opened.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The blocking task opening the durable outbox panicked.
    #[error("opening the spool panicked")]
    OutboxPanicked,
    /// The blocking task reading the inventory panicked.
    #[error("the GPU source panicked while reading the inventory")]
    SourcePanicked,
    /// The sampling thread could not be started.
    #[error("cannot start the sampling thread: {0}")]
    SamplerThread(#[source] std::io::Error),
}

/// Why the durable outbox could not be opened: its own error (the spool's), kept whole so
/// that its message and causes read as they are.
#[derive(Debug)]
pub struct OutboxError(Box<dyn std::error::Error + Send + Sync>);

impl OutboxError {
    /// Wraps the outbox's own error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(error))
    }
}

impl std::fmt::Display for OutboxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OutboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Opens a durable outbox (the node agent's on-disk spool). [`run_agent_with`] calls it on
/// a blocking thread, once the options and the inventory are known to be good.
pub type OpenOutbox = Box<dyn FnOnce() -> Result<Box<dyn Outbox>, OutboxError> + Send>;

/// Runs an agent: samples `source` every interval and streams to the collectors until
/// `shutdown` is cancelled; then delivers what it can within the shutdown timeout and
/// returns the delivery [`Summary`] (`sampled == acked + dropped + unacked`).
///
/// Unacked ticks are held in memory ([`MemoryQueue`], lost on exit) and no host metrics
/// are added: what in-process simulated agents need (the collector's demo, tests), which
/// must not report the real host as theirs. The caller builds the source and owns the
/// shutdown token, so several agents can run in one process.
pub async fn run_agent(
    opts: RunOptions,
    source: Box<dyn GpuSource>,
    shutdown: CancellationToken,
) -> Result<Summary, AgentError> {
    run_agent_with(opts, Sampler::new(source, None), None, shutdown).await
}

/// [`run_agent`] with the node agent's parts: a sampler that may carry a host source
/// (`/proc`), and a durable outbox opened by `open_outbox` (`None`: the in-memory queue of
/// `opts.queue_max_ticks`).
pub async fn run_agent_with(
    opts: RunOptions,
    mut sampler: Sampler,
    open_outbox: Option<OpenOutbox>,
    shutdown: CancellationToken,
) -> Result<Summary, AgentError> {
    if opts.interval.is_zero() {
        return Err(AgentError::Options("the interval must be positive".into()));
    }
    if opts.batch_max_ticks == 0 || opts.queue_max_ticks == 0 {
        return Err(AgentError::Options(
            "--batch-max-ticks and --queue-max-ticks must be at least 1".into(),
        ));
    }
    if opts.node.trim().is_empty() {
        return Err(AgentError::Options("the node name is empty".into()));
    }
    let collectors = session::parse_collectors(&opts.collectors)?;
    opts.credentials
        .check_urls(&collectors)
        .map_err(UplinkError::from)?;
    let (sampler, inventory) = tokio::task::spawn_blocking(move || {
        let inventory = sampler.inventory();
        (sampler, inventory)
    })
    .await
    .map_err(|_| AgentError::SourcePanicked)?;
    let inventory = inventory.map_err(AgentError::Inventory)?;
    let boot_id = opts
        .boot_id
        .clone()
        .or_else(|| sampler.boot_id())
        .unwrap_or_default();
    let shown: Vec<String> = collectors.iter().map(|u| session::redact(u)).collect();
    info!(
        node = %opts.node,
        source = sampler.source_name(),
        gpus = inventory.gpus.len(),
        collectors = ?shown,
        interval = ?opts.interval,
        "agent running"
    );
    let cfg = UplinkConfig {
        collectors,
        hello: HelloFacts {
            node: opts.node.clone(),
            boot_id,
            labels: opts.labels.clone(),
            inventory,
            interval: opts.interval,
            source: sampler.source_name(),
        },
        batch_max_ticks: opts.batch_max_ticks,
        connect_timeout: opts.connect_timeout,
        shutdown_timeout: opts.shutdown_timeout,
        credentials: opts.credentials.clone(),
    };
    let outbox: Box<dyn Outbox> = match open_outbox {
        Some(open) => tokio::task::spawn_blocking(open)
            .await
            .map_err(|_| AgentError::OutboxPanicked)??,
        None => Box::new(MemoryQueue::new(opts.queue_max_ticks)),
    };
    let outbox: SharedOutbox = Arc::new(Mutex::new(outbox));
    // A child token: the sampler may stop this agent without touching the caller's token.
    let stop = shutdown.child_token();
    let wake = Arc::new(Notify::new());
    // On the sampling thread, per tick: encode once, append to the outbox (the spool's
    // write and fsync), deferred spool housekeeping; the uplink is woken once a partial
    // batch's worth of ticks is spooled, or a full batch if that is fewer (the first tick
    // at once). It sends on its own only what its timers hold back: a partial batch whose
    // gap has passed, resends after a reconnect.
    let sink = {
        let (outbox, wake) = (Arc::clone(&outbox), Arc::clone(&wake));
        let every = session::ticks_per_wake(opts.interval).min(opts.batch_max_ticks);
        let mut spooled = every - 1;
        move |tick| {
            let tick = EncodedTick::new(tick);
            {
                let mut outbox = lock(&outbox);
                outbox.push_encoded(tick);
                outbox.maintain();
            }
            spooled += 1;
            if spooled >= every {
                spooled = 0;
                wake.notify_one();
            }
            true
        }
    };
    let sampling = spawn_sampling(sampler, opts.interval, sink, stop.clone())
        .map_err(AgentError::SamplerThread)?;
    let summary = session::run(
        cfg,
        Arc::clone(&outbox),
        wake,
        sampling.done(),
        stop.clone(),
    )
    .await;
    stop.cancel();
    if sampling.join().await.is_none() {
        error!("the sampling thread failed");
    }
    // The spool persists its watermark as it closes (off the hot path, once).
    drop(outbox);
    info!(
        node = %opts.node,
        sampled = summary.sampled,
        acked = summary.acked,
        dropped = summary.dropped,
        unacked = summary.unacked,
        "agent stopped"
    );
    Ok(summary)
}
