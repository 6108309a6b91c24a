//! gpufleet collector: receives agents' samples over gRPC, stores them, and serves the
//! fleet's state over HTTP.
//!
//! Data flow: [`ingest`] (validate) → [`writer`] (group commit into the [`store`]) → ack →
//! [`live`] (latest state, commit announcements) → [`http`] (JSON API, page) and
//! [`prometheus`] (`/metrics`).
//!
//! - [`demo`]: the collector plus simulated agents over loopback gRPC (`demo` command).
//! - [`server`]: [`serve`] wires everything on pre-bound listeners under one shutdown token.
//! - [`store`]: the storage boundary (`Arc<dyn Store>`); the only module that knows SQL.
//! - [`ingest`]: the `gpufleet.v1.Ingest/Stream` gRPC service: Hello, Batches, Ack/Reject.
//! - [`writer`]: the group-commit writer: one task, a bounded queue, one transaction per group.
//! - [`live`]: in-memory latest state per node and GPU, seeded from the store.
//! - [`status`]: online / stale / offline from the newest sample time; the injectable clock.
//! - [`http`]: the axum router (`app`), handlers and `ApiError`.
//! - [`prometheus`]: the `/metrics` text exposition.
//! - [`metrics`]: the collector's own counters.

pub mod accountant;
pub mod demo;
pub mod energy;
pub mod energy_api;
pub mod energy_check;
pub mod energy_cli;
pub mod http;
pub mod ingest;
pub mod live;
pub mod metrics;
pub mod prometheus;
pub mod server;
pub mod status;
pub mod store;
pub mod writer;

pub use server::{ServeError, ServeOptions, serve, serve_with_store};
