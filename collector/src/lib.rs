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
//! - [`leader`]: background jobs run once across collectors sharing a database (leases).
//! - [`follow`]: with several collectors on one database, learns what the others committed.
//! - [`status`]: online / stale / offline from the newest sample time; the injectable clock.
//! - [`http`]: the axum router (`app`), handlers and `ApiError`.
//! - [`prometheus`]: the `/metrics` text exposition.
//! - [`metrics`]: the collector's own counters.
//! - [`conn_limit`]: per-address connection limits and our accept loops.
//! - [`certs`]: a development CA and certificates (rcgen) for `certs`.
//! - [`identity`]: which node an agent's credential lets it write as.
//! - [`tls`]: TLS on both listeners (rustls), mTLS, certificate reload.
//! - [`web_auth`]: dashboard/API login (viewer/admin tokens, session cookies).
//! - [`web_security`]: security headers (CSP, nosniff, …) on every HTTP response.
//! - [`rehome`]: `rehome-gpu`, the only way a GPU changes node.
//! - [`tokens`]: agent tokens (`gft_<id>_<secret>`, stored hashed) and `tokens` commands.
//! - [`rollups`]: per-minute rollups and retention (`--retain-raw`, `--retain-rollups`).
//! - [`web`]: the embedded dashboard (`web/`, built by `build.rs`); [`sse`]: its live
//!   stream (`/api/v1/live`); [`dashboard`]: the node/GPU detail, series and events API.

pub mod accountant;
pub mod carbon;
pub mod carbon_api;
pub mod certs;
pub mod conn_limit;
pub mod dashboard;
pub mod demo;
pub mod energy;
pub mod energy_api;
pub mod energy_check;
pub mod energy_cli;
pub mod exposure;
pub mod follow;
pub mod fuzz;
pub mod http;
pub mod http_serve;
pub mod identity;
pub mod ingest;
pub mod leader;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod openapi;
pub mod prometheus;
pub mod rate_limit;
pub mod rehome;
pub mod report;
pub mod report_api;
pub mod rollups;
pub mod server;
pub mod sse;
pub mod status;
pub mod store;
pub mod tls;
pub mod tokens;
pub mod web;
pub mod web_auth;
pub mod web_security;
pub mod writer;

pub use server::{ServeError, ServeOptions, serve, serve_with_store};
