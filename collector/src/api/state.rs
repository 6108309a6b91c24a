//! What the API's handlers share ([`AppState`]) and what each module's route list is made
//! of ([`Route`]). A leaf: handlers and the router import it, it imports neither.

use crate::ingest::writer::WriterHandle;
use crate::live::state::Live;
use crate::live::status::{Clock, StatusPolicy};
use crate::metrics::Metrics;
use crate::store::Store;
use axum::handler::Handler;
use axum::routing::MethodRouter;
use std::sync::Arc;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub live: Arc<Live>,
    pub metrics: Arc<Metrics>,
    /// For the writer's queue depth on `/metrics`; `None` when no writer runs (tests).
    pub writer: Option<WriterHandle>,
    pub status: StatusPolicy,
    /// "Now" for statuses and relative times; injected so tests can fix it.
    pub clock: Clock,
    /// The per-workload counters `/metrics` exposes, refreshed in the background
    /// ([`crate::accounting::counters`]).
    pub workloads: Arc<crate::accounting::counters::WorkloadCounters>,
    /// The idle-but-allocated rule's defaults (`--waste-util-threshold`,
    /// `--waste-min-idle`) for `/api/v1/waste`.
    pub waste: crate::accounting::waste::WasteSettings,
    /// Report and plot builds at once, bounded ([`crate::api::renders`]).
    pub renders: Arc<crate::api::renders::Renders>,
}

/// One route of the table [`app`](crate::api::router::app) is built from: the method and path it serves, its
/// handler, and the line the module doc's table shows for it.
pub struct Route {
    /// `GET`, …: the method it answers, as the doc's table spells it.
    pub method: &'static str,
    /// In axum's syntax: `{name}` is one segment, `{*file}` the rest of the path.
    pub path: &'static str,
    /// One line on what it answers: the table's third column. No `|`, which would split
    /// the row.
    pub what: &'static str,
    /// The handler, made from `method` by the same constructor, so the two cannot disagree.
    pub(super) handler: MethodRouter<AppState>,
}

impl Route {
    /// A `GET` route; like axum's `get`, it answers `HEAD` too, without the body.
    pub fn get<H, T>(path: &'static str, what: &'static str, handler: H) -> Route
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        Route {
            method: "GET",
            path,
            what,
            handler: axum::routing::get(handler),
        }
    }
}
