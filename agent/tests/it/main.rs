//! The agent's integration tests, one binary: a module per area, and the shared fixtures
//! (`common`).

mod cgroup_fixtures;
mod cli;
mod common;
mod kube_names;
mod kube_stub;
mod nvml_fake;
mod uplink;
