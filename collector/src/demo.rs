//! `gpufleet-collector demo`: the real collector on an embedded SQLite file, plus N
//! simulated agents that talk to it over real loopback gRPC — the same code paths as a
//! production deployment, with the simulator standing in for the GPUs.

use crate::server::{ServeError, ServeOptions, serve};
use gpufleet_agent::{RunOptions, SimError, SimOptions, run_agent, simulator};
use std::collections::BTreeMap;
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
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot build the simulator for {node}: {source}")]
    Sim { node: String, source: SimError },
    #[error("cannot read the gRPC listener's address: {0}")]
    Listener(#[source] std::io::Error),
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
pub async fn run_demo(
    opts: DemoOptions,
    serve_options: ServeOptions,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), DemoError> {
    let grpc_addr = grpc.local_addr().map_err(DemoError::Listener)?;
    let collector_stop = CancellationToken::new();
    let collector = tokio::spawn(serve(serve_options, grpc, http, collector_stop.clone()));

    let agents_stop = CancellationToken::new();
    let mut agents = JoinSet::new();
    for i in 0..opts.nodes {
        let node = node_name(i);
        let mut sim_opts = SimOptions::new(node.clone(), opts.gpus_per_node);
        sim_opts.seed = opts.seed;
        let sim = simulator(sim_opts).map_err(|source| DemoError::Sim {
            node: node.clone(),
            source,
        })?;
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
