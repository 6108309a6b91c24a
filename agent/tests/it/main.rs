//! The agent's integration tests, one binary: a module per area, and the shared fixtures
//! (`common`).

mod cgroup_fixtures;
mod cli;
mod common;
mod nvml_fake;
mod uplink;
