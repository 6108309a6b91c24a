//! `run_agent`: the agent's pipeline, source → sampler → outbox → uplink, until shutdown.

use crate::encoded::EncodedTick;
use crate::host::{self, HostReader};
use crate::queue::{MemoryQueue, Outbox, SharedOutbox, Summary, lock};
use crate::sampler::{Sampler, spawn_sampling};
use crate::source::{GpuSource, SourceError};
use crate::spool::{Spool, SpoolConfig, SpoolError};
use crate::uplink::{self, HelloFacts, UplinkConfig, UplinkError};
use std::collections::BTreeMap;
use std::path::PathBuf;
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
    /// Root of `/proc` for host metrics (when the source has none) and the boot id.
    /// `None` for in-process simulated agents, which must not read the real host.
    pub proc_root: Option<PathBuf>,
    /// Boot id to report; `None`: the source's, else `<proc_root>/sys/kernel/random/boot_id`.
    pub boot_id: Option<String>,
    /// After shutdown is requested, how long to keep delivering unacked batches.
    pub shutdown_timeout: Duration,
    /// Most ticks per batch.
    pub batch_max_ticks: usize,
    /// Most ticks held unacked in memory (without a spool); beyond, the oldest are
    /// dropped and counted.
    pub queue_max_ticks: usize,
    /// The on-disk spool; `None` holds unacked ticks in memory only (lost on exit).
    pub spool: Option<SpoolConfig>,
    /// Limit on connecting to a collector and on its Welcome.
    pub connect_timeout: Duration,
    /// TLS trust, client certificate and token ([`crate::tls`]); none by default.
    pub credentials: crate::tls::Credentials,
}

impl RunOptions {
    /// Options with the CLI's defaults: 1 s interval, 100 ticks per batch, one hour of
    /// ticks held, 10 s to deliver at shutdown, no `/proc`.
    pub fn new(node: impl Into<String>, collectors: Vec<String>) -> Self {
        Self {
            node: node.into(),
            collectors,
            interval: Duration::from_secs(1),
            labels: BTreeMap::new(),
            proc_root: None,
            boot_id: None,
            shutdown_timeout: Duration::from_secs(10),
            batch_max_ticks: 100,
            queue_max_ticks: 3600,
            spool: None,
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
    /// The spool could not be opened.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The blocking task opening the spool panicked.
    #[error("opening the spool panicked")]
    SpoolPanicked,
    /// The blocking task reading the inventory panicked.
    #[error("the GPU source panicked while reading the inventory")]
    SourcePanicked,
    /// The sampling thread could not be started.
    #[error("cannot start the sampling thread: {0}")]
    SamplerThread(#[source] std::io::Error),
}

/// Runs an agent: samples `source` every interval and streams to the collectors until
/// `shutdown` is cancelled; then delivers what it can within the shutdown timeout and
/// returns the delivery [`Summary`] (`sampled == acked + dropped + unacked`).
///
/// The caller builds the source (`sim::simulator`, `nvml::NvmlSource::open`) and owns the
/// shutdown token, so several agents can run in one process (the collector's demo).
pub async fn run_agent(
    opts: RunOptions,
    source: Box<dyn GpuSource>,
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
    let collectors = uplink::parse_collectors(&opts.collectors)?;
    opts.credentials
        .check_urls(&collectors)
        .map_err(UplinkError::from)?;
    let host = opts.proc_root.as_ref().map(HostReader::new);
    let mut sampler = Sampler::new(source, host);
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
        .or_else(|| opts.proc_root.as_deref().and_then(host::boot_id))
        .unwrap_or_default();
    let shown: Vec<String> = collectors.iter().map(|u| uplink::redact(u)).collect();
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
    let outbox: Box<dyn Outbox> = match opts.spool.clone() {
        Some(cfg) => Box::new(
            tokio::task::spawn_blocking(move || Spool::open(cfg))
                .await
                .map_err(|_| AgentError::SpoolPanicked)??,
        ),
        None => Box::new(MemoryQueue::new(opts.queue_max_ticks)),
    };
    let outbox: SharedOutbox = Arc::new(Mutex::new(outbox));
    // A child token: the sampler may stop this agent without touching the caller's token.
    let stop = shutdown.child_token();
    let wake = Arc::new(Notify::new());
    // On the sampling thread, per tick: encode once, append to the outbox (the spool's
    // write and fsync), deferred spool housekeeping, then one wake-up of the uplink.
    let sink = {
        let (outbox, wake) = (Arc::clone(&outbox), Arc::clone(&wake));
        move |tick| {
            let tick = EncodedTick::new(tick);
            {
                let mut outbox = lock(&outbox);
                outbox.push_encoded(tick);
                outbox.maintain();
            }
            wake.notify_one();
            true
        }
    };
    let sampling = spawn_sampling(sampler, opts.interval, sink, stop.clone())
        .map_err(AgentError::SamplerThread)?;
    let summary = uplink::run(
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
