//! The gpufleet wire protocol. Generated from `proto/gpufleet/v1/agent.proto`.
//!
//! Wire types stay at the edges (the agent's uplink, the collector's ingest); everything
//! inside uses `gpufleet_core` domain types. Conversions live in `gpufleet_core::wire`.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("gpufleet.v1");
}
