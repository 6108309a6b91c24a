//! gpufleet collector: receives agents' samples over gRPC, stores them, and serves the
//! fleet's state over HTTP.
//!
//! Data flow: [`ingest`] (validate, group commit into the [`store`]) → ack → [`live`]
//! (latest state, commit announcements) → [`api`] (JSON API, `/metrics`, dashboard);
//! [`accounting`] derives energy, carbon and rollups from what was stored.
//!
//! - [`server`]: [`serve`] wires everything on pre-bound listeners under one shutdown token.
//! - [`store`]: the storage boundary (a trait per concept, `Store` all of them); the only module that knows SQL.
//! - [`ingest`]: the gRPC ingest service, the group-commit writer, agents' identity.
//! - [`live`]: in-memory latest state, following other collectors, node status.
//! - [`health`]: the Xid catalogue and the GPU / node health judge.
//! - [`accounting`]: energy, rollups and retention, carbon, reports; jobs under leases.
//! - [`api`]: the axum router, one module per resource, OpenAPI, `/metrics`, dashboard.
//! - [`auth`]: agent/viewer/admin tokens, dashboard login, security headers.
//! - [`net`]: listeners, TLS and certificates, connection and rate limits, exposure.
//! - [`cli`]: subcommands other than `serve` (demo, energy checks, rehome).
//! - [`metrics`]: the collector's own counters.
//! - [`alerts`]: alert rules over live signals, evaluated under a lease, stored, sent to webhooks.
//! - [`remote_write`]: pushing samples and workload energy to a Prometheus remote-write receiver.
//! - [`outbound`]: delivery to receivers (remote-write, webhooks): answers classified, retries with backoff.

pub mod accounting;
pub mod alerts;
pub mod api;
pub mod auth;
pub mod cli;
pub mod families;
pub mod health;
pub mod ingest;
pub mod live;
pub mod metrics;
pub mod net;
pub mod outbound;
pub mod remote_write;
pub mod server;
/// The storage boundary, a crate of its own ([`gpufleet_store`]): the collector reaches it as `crate::store`.
pub use gpufleet_store as store;

pub use server::{ServeError, ServeOptions, serve, serve_with_store};
