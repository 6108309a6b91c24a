//! The collector's integration tests, one binary: a module per area, and the shared
//! fixtures (`common`: stores, batches, an in-process collector) and the harness that runs
//! the real binaries (`harness`).

/// The collector binary's allocator, so that the in-process benchmarks measure what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod abuse;
mod alerts;
mod carbon;
mod common;
mod demo;
mod deploy;
mod e2e;
mod energy;
mod faults;
mod fleet_bench;
mod fuzz_corpus;
mod grpc_idle;
mod harness;
mod health_alerts_e2e;
mod health_e2e;
mod hostile;
mod http;
mod ingest;
mod limits;
mod memory;
mod metrics_bench;
mod migration;
mod multi;
mod multi_e2e;
mod names_e2e;
mod ownership;
mod pg_restart;
mod prometheus_real;
mod remote_write_bench;
mod remote_write_real;
mod report;
mod retention_stall;
mod store_contract;
mod throughput;
mod tls;
mod web_auth;
mod writer;
