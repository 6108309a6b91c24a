//! Ingest: how agents' samples get in. The `gpufleet.v1.Ingest/Stream` gRPC service
//! validates each batch and hands it to the group-commit writer, which acks it only once
//! it is durable in the store.
//!
//! - [`stream`]: the gRPC service: Hello, Batches, Ack/Reject, one stream per agent.
//! - [`writer`]: the group-commit writer: one task, a bounded queue, one transaction per group.
//! - [`identity`]: which node an agent's credential lets it write as.

pub mod identity;
pub mod stream;
pub mod writer;
