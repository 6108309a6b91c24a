//! Subcommands other than `serve` (the binary's `main.rs` parses and dispatches them).
//!
//! - [`demo`]: the collector plus simulated agents over loopback gRPC.
//! - [`energy`]: the accounting flags and the `check-energy` / `recompute-energy` commands.
//! - [`report`]: `report`, what a workload or node spent, as text or a plot.
//! - [`waste`]: the idle-but-allocated flags (`--waste-*`) and `report waste`.
//! - [`rehome`]: `rehome-gpu`, the only way a GPU changes node.
//! - [`slurm`]: `slurm-epilog` / `slurm-backfill`, each job's energy into Slurm's
//!   `AdminComment`.

pub mod demo;
pub mod energy;
pub mod rehome;
pub mod report;
pub mod slurm;
pub mod waste;
