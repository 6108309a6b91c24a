//! `gpufleet-collector demo`: the real collector on an embedded SQLite file, plus N
//! simulated agents that talk to it over real loopback gRPC — the same code paths as a
//! production deployment, with the simulator standing in for the GPUs.
//!
//! With `history`, each simulated node's recent past (the same simulator, sampled at the
//! same interval) is written to the store before the collector starts, so the energy
//! pages have figures at once instead of after the first accounted minute.

use crate::server::{ServeError, ServeOptions, serve_with_store};
use crate::store::{self, NodeBatch, Store, StoreError};
use gpufleet_core::GpuSource;
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{Batch, DeliveryStats, UnixMs};
use gpufleet_sim::{SimError, SimOptions, Simulator, simulator};
use gpufleet_uplink::{RunOptions, run_agent};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What the demo simulates.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Sampling interval of every simulated agent.
    pub interval: Duration,
    /// Base seed; each node mixes in its name, so nodes differ but runs repeat.
    pub seed: Option<u64>,
    /// Simulated past written before the agents start (zero: none).
    pub history: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot build the simulator for {node}: {source}")]
    Sim { node: String, source: SimError },
    #[error("cannot read the gRPC listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("cannot write the simulated history of {node}: {source}")]
    History { node: String, source: StoreError },
    #[error("the simulator of {node} failed while writing its history: {reason}")]
    HistorySim { node: String, reason: String },
}

/// The node names the demo uses: `gpu-node-01`, `gpu-node-02`, …
pub fn node_name(i: u32) -> String {
    format!("gpu-node-{:02}", i + 1)
}

/// Labels that make the demo fleet look like a real one (racks, two sites).
fn labels(i: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("rack".to_owned(), format!("r{}", i / 4 + 1)),
        (
            "site".to_owned(),
            if i.is_multiple_of(2) {
                "lab-east"
            } else {
                "lab-west"
            }
            .to_owned(),
        ),
    ])
}

/// Runs the collector on the given listeners and `opts.nodes` simulated agents until
/// `shutdown` is cancelled; then the agents deliver what they hold, and the collector
/// commits and stops.
///
/// The agents all connect from loopback, so the gRPC listener spares loopback addresses
/// its per-address connection limit and stream rate (one real node needs one
/// connection; the demo's thousand would be refused past the limit). Other addresses
/// stay limited.
pub async fn run_demo(
    opts: DemoOptions,
    mut serve_options: ServeOptions,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), DemoError> {
    let grpc_addr = grpc.local_addr().map_err(DemoError::Listener)?;
    serve_options.spare_loopback_agents = true;
    let store = store::open(&serve_options.db_url)
        .await
        .map_err(ServeError::from)?;
    let mut sims = Vec::new();
    for i in 0..opts.nodes {
        let node = node_name(i);
        let mut sim_opts = SimOptions::new(node.clone(), opts.gpus_per_node);
        sim_opts.seed = opts.seed;
        let mut sim = simulator(sim_opts).map_err(|source| DemoError::Sim {
            node: node.clone(),
            source,
        })?;
        let history = if opts.history.is_zero() {
            None
        } else {
            let mut h = start_history(&store, &mut sim, &node, labels(i), &opts).await?;
            h.fill(&store, &mut sim).await?;
            Some(h)
        };
        sims.push((i, node, sim, history));
    }
    // Writing the others took time: bring every node's history up to now again, so the
    // live agents carry on without a gap.
    for (_, node, sim, history) in &mut sims {
        if let Some(h) = history {
            h.fill(&store, sim).await?;
            info!(node = %node, batches = h.seq, "simulated history written");
        }
    }
    let collector_stop = CancellationToken::new();
    let collector = tokio::spawn({
        let store = Arc::clone(&store);
        let stop = collector_stop.clone();
        async move {
            let result =
                serve_with_store(Arc::clone(&store), serve_options, grpc, http, stop).await;
            store.close().await;
            result
        }
    });

    let agents_stop = CancellationToken::new();
    let mut agents = JoinSet::new();
    for (i, node, sim, _) in sims {
        let mut run = RunOptions::new(node.clone(), vec![format!("http://{grpc_addr}")]);
        run.interval = opts.interval;
        run.labels = labels(i);
        let stop = agents_stop.clone();
        agents.spawn(async move { (node, run_agent(run, Box::new(sim), stop).await) });
    }
    info!(
        nodes = opts.nodes,
        gpus_per_node = opts.gpus_per_node,
        "simulated agents started"
    );

    tokio::select! {
        () = shutdown.cancelled() => {}
        // The collector ending on its own (e.g. a store error) ends the demo.
        () = collector_stop.cancelled() => {}
    }
    agents_stop.cancel();
    while let Some(joined) = agents.join_next().await {
        match joined {
            Ok((node, Ok(summary))) => info!(node = %node, "{summary}"),
            Ok((node, Err(e))) => warn!(node = %node, error = %e, "simulated agent failed"),
            Err(e) => warn!(error = %e, "simulated agent task panicked"),
        }
    }
    collector_stop.cancel();
    match collector.await {
        Ok(result) => result.map_err(DemoError::from),
        Err(e) => {
            warn!(error = %e, "collector task panicked");
            Ok(())
        }
    }
}

/// Ticks per history batch (well under the ingest limit of 1,000).
const HISTORY_BATCH: usize = 500;

/// A node's simulated history being written: where it stands.
struct History {
    node: String,
    keys: Arc<crate::store::NodeKeys>,
    /// The last seq written (the node's stored one to begin with).
    seq: u64,
    /// The time of the next tick.
    next_ms: UnixMs,
    step_ms: i64,
}

/// Registers `node` as its agent would and starts its history `opts.history` ago.
async fn start_history(
    store: &Arc<dyn Store>,
    sim: &mut Simulator,
    node: &str,
    labels: BTreeMap<String, String>,
    opts: &DemoOptions,
) -> Result<History, DemoError> {
    let step_ms = i64::try_from(opts.interval.as_millis().max(1)).unwrap_or(i64::MAX);
    let span = i64::try_from(opts.history.as_millis()).unwrap_or(i64::MAX);
    let now: UnixMs = gpufleet_core::config::now_ms();
    let inventory = sim.inventory().map_err(|e| DemoError::HistorySim {
        node: node.to_owned(),
        reason: e.to_string(),
    })?;
    let hello = HelloInfo {
        node: node.to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        boot_id: sim.boot_id().unwrap_or_default(),
        labels,
        interval_ms: u32::try_from(step_ms).unwrap_or(u32::MAX),
        source: sim.name().to_owned(),
    };
    let record = store
        .register_node(&hello, &inventory, now)
        .await
        .map_err(|source| DemoError::History {
            node: node.to_owned(),
            source,
        })?;
    // A reused database (`--db`) may hold this node's samples already: carry on after them.
    let start = now.saturating_sub(span);
    Ok(History {
        node: node.to_owned(),
        keys: Arc::new(record.keys()),
        seq: record.last_acked_seq,
        next_ms: record
            .last_seen_ms
            .map_or(start, |seen| start.max(seen + step_ms)),
        step_ms,
    })
}

impl History {
    /// Writes the simulator's ticks from where the history stands up to now, through the
    /// store (seqs 1, 2, …; the live agent's seqs start above them).
    async fn fill(&mut self, store: &Arc<dyn Store>, sim: &mut Simulator) -> Result<(), DemoError> {
        let now: UnixMs = gpufleet_core::config::now_ms();
        while self.next_ms < now {
            let mut ticks = Vec::with_capacity(HISTORY_BATCH);
            while self.next_ms < now && ticks.len() < HISTORY_BATCH {
                ticks.push(
                    sim.sample(self.next_ms)
                        .map_err(|e| DemoError::HistorySim {
                            node: self.node.clone(),
                            reason: e.to_string(),
                        })?,
                );
                self.next_ms += self.step_ms;
            }
            self.seq += 1;
            let batch = NodeBatch {
                keys: Arc::clone(&self.keys),
                batch: Batch {
                    seq: self.seq,
                    ticks,
                    delivery: DeliveryStats::default(),
                },
            };
            store
                .write_batches(&[batch])
                .await
                .map_err(|source| DemoError::History {
                    node: self.node.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}
