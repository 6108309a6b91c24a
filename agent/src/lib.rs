//! gpufleet's node agent: what only a real node has. The pipeline it runs (sampling thread,
//! outbox, gRPC session) is `gpufleet-uplink`'s; the simulator behind `--simulate` is
//! `gpufleet-sim`'s; `exec` is the `gpufleet-exec` binary, which `gpufleet-agent exec`
//! runs, so this binary links no plotting and no HTTP client but the name sources'.
//!
//! ```text
//! GpuSource (nvml | sim) ─► Named (names cache) ─► Sampler (+ host, cost) ─► Outbox (spool) ─► session ─► collector
//!                                ▲ resolver thread: Kubernetes watch, Docker API, Slurm environ
//! ```
//!
//! Modules, one concept each:
//!
//! - [`nvml`]: the NVML source; the only module that knows NVML.
//! - [`cgroup`]: process → container / pod / Slurm job / host identity.
//! - [`names`]: the names runtimes give those ids, resolved off the sampling path.
//! - [`host`]: host metrics from `/proc` (CPU, memory, disk, network, load).
//! - [`spool`]: the on-disk [`Outbox`](gpufleet_uplink::queue::Outbox): segments,
//!   checksums, trimmed on ack.
//! - [`snapshot`]: `gpufleet-agent snapshot` (table or JSON).
//! - [`cli`]: the flags `gpufleet-agent` and `gpufleet-exec` share; opens the source.

pub mod cgroup;
pub mod cli;
pub mod host;
pub mod names;
pub mod nvml;
pub mod snapshot;
pub mod spool;
