//! gpufleet's shared domain: what agents measure and send, and how it is checked.
//!
//! - [`sample`]: inventory, ticks, GPU / process / host samples, events, workload identity.
//! - [`wire`]: conversions to and from the protobuf wire types, with validation of
//!   everything that arrives from outside ([`wire::decode_batch`]).
//! - [`config`]: the TOML config-file layer, durations, timestamps, logging.

pub mod config;
pub mod sample;
pub mod wire;

pub use sample::*;
