//! The agent's integration tests, one binary: a module per area.

mod cgroup_fixtures;
mod cli;
mod exec;
mod nvml_fake;
mod uplink;
