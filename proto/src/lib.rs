//! The gpufleet wire protocol. Generated from `proto/gpufleet/v1/agent.proto`; and
//! [`prometheus`], the remote-write 1.0 messages the collector pushes.
//!
//! Wire types stay at the edges (the agent's uplink, the collector's ingest); everything
//! inside uses `gpufleet_core` domain types. Conversions live in `gpufleet_core::wire`.

pub mod codec;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("gpufleet.v1");
}

/// Prometheus remote-write 1.0 (`proto/prometheus/remote.proto`): `WriteRequest`,
/// `TimeSeries`, `Label`, `Sample`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod prometheus {
    tonic::include_proto!("prometheus");
}
