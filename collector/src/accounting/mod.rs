//! Accounting: what the fleet spent, derived from the stored samples by background jobs
//! that run once across collectors sharing a database.
//!
//! - [`energy`]: pure energy accounting per GPU-minute (idle baseline, attribution).
//! - [`accountant`]: the job that turns committed samples into energy minutes.
//! - [`counters`]: per-workload energy and carbon counters for `/metrics`.
//! - [`check`]: verifies stored energy minutes against the raw samples (`check-energy`).
//! - [`rollups`]: per-minute rollups and retention of raw samples and rollups.
//! - [`carbon`]: prices energy minutes in gCO2 from carbon-intensity providers.
//! - [`report`]: what a container, pod, Slurm job or node spent over a range.
//! - [`leader`]: runs a background job under a lease, on one collector at a time.
//! - [`notes`]: what announced commits touched, noted for a job by a task of its own.
//! - [`waste`]: idle-but-allocated episodes (a workload holding an idle GPU) and their energy.

pub mod accountant;
pub mod carbon;
pub mod check;
pub mod counters;
pub mod energy;
pub mod leader;
pub mod notes;
pub mod report;
pub mod rollups;
pub mod waste;
