//! The HTTP API (axum): the router, one module per resource under `/api/v1/*`, the
//! Prometheus exposition at `/metrics` and the embedded dashboard at `/`.
//!
//! - [`router`]: `app()`, the handlers' shared state, and the route table.
//! - [`error`]: `ApiError`, the error body, and time parameters.
//! - [`health`], [`nodes`], [`series`]: liveness, the node list, one GPU metric over time.
//! - [`gpu_health`]: fleet health (GPUs and nodes not ok, with reasons) and the Xid catalogue.
//! - [`dashboard`]: the node and GPU detail pages' endpoints (series, events).
//! - [`live`]: the dashboard's Server-Sent Events stream (`/api/v1/live`).
//! - [`energy`], [`carbon`], [`reports`]: energy, carbon intensity and spending reports;
//!   [`renders`]: how many reports and plots are built at once.
//! - [`waste`]: idle-but-allocated episodes (`/api/v1/waste`).
//! - [`openapi`]: the OpenAPI description of `/api/v1/*`.
//! - [`prometheus`]: the `/metrics` text exposition.
//! - [`assets`]: the embedded dashboard bundle (`web/`).
//! - [`fuzz`]: the fuzz entry point for the routes' query parsing.

pub mod alerts;
pub mod assets;
pub mod carbon;
pub mod dashboard;
pub mod energy;
pub mod error;
pub mod fuzz;
pub mod gpu_health;
pub mod health;
pub mod live;
pub mod nodes;
pub mod openapi;
pub mod prometheus;
pub mod renders;
pub mod reports;
pub mod router;
pub mod series;
pub mod state;
pub mod waste;
