//! gpufleet's agent pipeline, without hardware: what turns a [`GpuSource`] into batches a
//! collector has acked. The node agent runs it over NVML with its on-disk spool; the
//! collector's demo runs it over the simulator, N agents in one process, over real
//! loopback gRPC: the same code path as production.
//!
//! ```text
//! GpuSource ─► Sampler (+ HostSource, cost) ─► Outbox (queue | agent's spool) ─► session ─► collector
//! └────────── the sampling thread: sample, encode, append ──────────┘   (async runtime)
//! ```
//!
//! Modules, one concept each:
//!
//! - [`cost`]: what sampling costs (thread CPU time, timed calls).
//! - [`sampler`]: the sampling thread (off the runtime; timestamps; cost).
//! - [`encoded`]: a tick encoded once; the session's wire messages carrying those bytes.
//! - [`queue`]: the [`Outbox`](queue::Outbox) of unacked batches and its bounded in-memory
//!   implementation; counts drops.
//! - [`session`]: the gRPC session, acks, rejects, reconnects with backoff, failover.
//! - [`tls`]: the agent's credentials: CA, client certificate, token.
//! - [`run`]: [`run_agent`], the whole pipeline until shutdown.
//!
//! Nothing here knows NVML, the spool, cgroups or `/proc`: those are the agent crate's, and
//! come in through [`GpuSource`], [`HostSource`](gpufleet_core::HostSource) and
//! [`OpenOutbox`].
//!
//! Running a simulated agent in-process (what `gpufleet-collector demo` does):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpufleet_sim::{SimOptions, simulator};
//! use gpufleet_uplink::{RunOptions, run_agent};
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

pub mod cost;
pub mod encoded;
pub mod queue;
pub mod redact;
pub mod run;
pub mod sampler;
pub mod session;
pub mod tls;

pub use gpufleet_core::{GpuSource, SourceError};
pub use queue::Summary;
pub use run::{AgentError, OpenOutbox, OutboxError, RunOptions, run_agent, run_agent_with};
