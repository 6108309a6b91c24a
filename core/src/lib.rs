//! gpufleet's shared domain: what agents measure and send, and how it is checked.
//!
//! - [`sample`]: inventory, ticks, GPU / process / host samples, events, workload identity.
//! - [`wire`]: conversions to and from the protobuf wire types, with validation of
//!   everything that arrives from outside ([`wire::decode_batch`]).
//! - [`source`]: the boundaries ticks come from: [`GpuSource`] (NVML, the simulator) and
//!   [`HostSource`] (host metrics for a source that has none).
//! - [`config`]: the TOML config file, durations, logging.
//! - [`body`]: reading an HTTP answer's body with a ceiling (every client of ours).
//! - [`fuzz`]: the fuzz targets' entry points (bytes in, no panic out).
//! - [`times`]: timestamps as users type them and as the API writes them (range-checked).

pub mod body;
pub mod config;
pub mod fuzz;
pub mod sample;
pub mod source;
pub mod times;
pub mod wire;

pub use sample::*;
pub use source::{GpuSource, HostSource, SourceError};
