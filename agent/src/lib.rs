//! gpufleet's node agent: samples the node's NVIDIA GPUs (through NVML, or a simulator)
//! every interval and streams the ticks to a collector over gRPC.
//!
//! ```text
//! GpuSource (nvml | sim) ─► Sampler (+ host, cost) ─► Outbox (queue | spool) ─► uplink ─► collector
//! └──────────── the sampling thread: sample, encode, append ────────────┘   (async runtime)
//! ```
//!
//! Modules, one concept each:
//!
//! - [`source`]: the [`GpuSource`] trait (blocking; inventory + one tick) and its errors.
//! - [`sim`]: the seeded, deterministic simulator (workloads, physics, scenario files).
//! - [`nvml`]: the NVML source; the only module that knows NVML.
//! - [`cgroup`]: process → container / pod / Slurm job / host identity.
//! - [`host`]: host metrics from `/proc` (CPU, memory, disk, network, load).
//! - [`cost`]: what sampling costs (thread CPU time, timed calls).
//! - [`sampler`]: the sampling thread (off the runtime; timestamps; cost).
//! - [`encoded`]: a tick encoded once; the uplink's wire messages carrying those bytes.
//! - [`queue`]: the [`Outbox`](queue::Outbox) of unacked batches; bounded, counts drops.
//! - [`spool`]: the on-disk [`Outbox`](queue::Outbox): segments, checksums, trimmed on ack.
//! - [`uplink`]: the gRPC session, acks, rejects, reconnects with backoff, failover.
//! - [`tls`]: the agent's credentials: CA, client certificate, token.
//! - [`run`]: [`run_agent`], the whole pipeline until shutdown.
//! - [`snapshot`]: `gpufleet-agent snapshot` (table or JSON).
//! - [`exec`]: `gpufleet-agent exec -- COMMAND`: one command measured, its report.
//! - [`proctree`]: a process and its descendants, from `/proc`.
//!
//! Running simulated agents in-process (what `gpufleet-collector demo` does):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpufleet_agent::{RunOptions, SimOptions, run_agent, simulator};
//! use tokio_util::sync::CancellationToken;
//!
//! let shutdown = CancellationToken::new();
//! let sim = simulator(SimOptions::new("gpu-node-01", 8))?;
//! let opts = RunOptions::new("gpu-node-01", vec!["http://127.0.0.1:50051".into()]);
//! let agent = tokio::spawn(run_agent(opts, Box::new(sim), shutdown.clone()));
//! // … later:
//! shutdown.cancel();
//! let summary = agent.await??;
//! println!("{summary}"); // summary sampled=… acked=… dropped=… unacked=…
//! # Ok(()) }
//! ```

pub mod cgroup;
pub mod cost;
pub mod encoded;
pub mod exec;
pub mod host;
pub mod nvml;
pub mod proctree;
pub mod queue;
pub mod run;
pub mod sampler;
pub mod sim;
pub mod snapshot;
pub mod source;
pub mod spool;
pub mod tls;
pub mod uplink;

pub use queue::Summary;
pub use run::{AgentError, RunOptions, run_agent};
pub use sim::scenario::Scenario;
pub use sim::{SimError, SimOptions, Simulator, simulator};
pub use source::{GpuSource, SourceError};
