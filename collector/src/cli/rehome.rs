//! `gpufleet-collector rehome-gpu`: gives a GPU that really moved to its new node.
//!
//! A GPU UUID belongs to the node that registered it first; another node's Hello naming it
//! is refused ([`crate::store::StoreError::GpuOwned`]), so a credential for one node cannot
//! take another node's GPU and its history. When a card is moved between machines, an
//! operator says so with this command; the GPU's stored history goes with it, and the new
//! node's agent writes it from its next Hello (restart the agent if it is connected).

use crate::store::{self, IngestWrites, Rehomed, StoreError};
use thiserror::Error;

/// `gpufleet-collector rehome-gpu …`.
#[derive(Debug, clap::Args)]
pub struct RehomeArgs {
    /// Database URL (the one `serve` uses).
    #[arg(
        long,
        env = "GPUFLEET_DB",
        default_value = "sqlite://gpufleet.db",
        value_name = "URL"
    )]
    pub db: String,
    /// The GPU's UUID, as `/api/v1/nodes` lists it (`GPU-…`).
    pub uuid: String,
    /// The node it now belongs to (a node that has connected at least once).
    #[arg(long, value_name = "NODE")]
    pub to: String,
}

/// Why a GPU could not be re-homed.
#[derive(Debug, Error)]
pub enum RehomeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no GPU has UUID {0:?} (see /api/v1/nodes)")]
    UnknownGpu(String),
    #[error("no node is named {0:?}: its agent must connect once before a GPU can move to it")]
    UnknownNode(String),
}

/// Opens the store, re-homes, closes; returns what to print.
pub async fn run(args: RehomeArgs) -> Result<String, RehomeError> {
    let store = store::open(&args.db).await?;
    let result = run_on(store.as_ref(), &args.uuid, &args.to).await;
    store.close().await;
    result
}

/// Re-homes `uuid` to node `to` on an open store; returns what to print.
pub async fn run_on(store: &dyn IngestWrites, uuid: &str, to: &str) -> Result<String, RehomeError> {
    let uuid = uuid.trim();
    match store.rehome_gpu(uuid, to).await? {
        Rehomed::Moved { from } => {
            tracing::info!(gpu = %uuid, from = %from, to = %to, "GPU re-homed");
            Ok(format!(
                "GPU {uuid} moved from node {from:?} to node {to:?}, with its history; \
                 node {to:?}'s agent writes it from its next connection\n"
            ))
        }
        Rehomed::Unchanged => Ok(format!("GPU {uuid} already belongs to node {to:?}\n")),
        Rehomed::UnknownGpu => Err(RehomeError::UnknownGpu(uuid.to_owned())),
        Rehomed::UnknownNode => Err(RehomeError::UnknownNode(to.to_owned())),
    }
}
