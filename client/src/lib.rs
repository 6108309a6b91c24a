//! `gpufleet`, the command-line client of a gpufleet collector. Its `top` command shows
//! the fleet in a terminal, live from the collector's HTTP API.
//!
//! - [`api`]: the API answers it reads, typed; [`net`]: the HTTP client (TLS, token);
//!   [`sse`]: the `/api/v1/live` stream, reconnecting.
//! - [`model`]: what it knows (the fleet kept current by live events, the open node,
//!   today's energy); [`app`]: the UI state and what each key does (pure).
//! - [`ui`]: drawing into any ratatui buffer; [`format`](mod@format): numbers as printed.
//! - [`top`]: the loop tying them together, and `--once`.

pub mod api;
pub mod app;
pub mod format;
pub mod model;
pub mod net;
pub mod sse;
pub mod top;
pub mod ui;
