//! `GET /api/v1/live[?node=NAME]`: a Server-Sent Events stream for the dashboard.
//!
//! Events:
//! - `tick`: after every commit, the committed batch's newest tick of one node:
//!   `{"node", "time_ms", "gpus": [{"uuid", …GPU sample}], "host": {…} | null,
//!   "processes": [...]}` (absent values `null`, as everywhere).
//! - `status`: every second, `{"now_ms", "nodes": [{"name", "status", "last_seen_ms",
//!   "connected", "health", "gpu_health": {uuid: state}}]}` (so stale and offline nodes,
//!   and GPUs whose health changed, are marked without polling; `gpu_health` lists only
//!   GPUs that are not ok).
//! - `resync`: `{"skipped": N}` when this client fell more than the announcement buffer
//!   behind and N commits were skipped: reload `/api/v1/nodes` (or the node) once.
//!
//! A slow client never makes the collector buffer more than the broadcast channel's
//! fixed capacity: it skips instead. Streams end when the collector shuts down.
//!
//! A stream counts against the live budget (`--max-live-streams-per-ip`,
//! `--max-live-streams`), not the connection limit ([`crate::net::conn_limit`]); over
//! the budget it is refused with 503 and `Retry-After`. An unknown `node` is a 404.

use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::live::state::{Announcement, Committed};
use crate::net::conn_limit::{ConnHandle, LiveGuard};
use axum::Extension;
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tracing::debug;

/// How often the `status` event is sent.
pub const STATUS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LiveParams {
    /// Only this node's ticks and status.
    node: Option<String>,
}

// The `tick` and `status` events: the API's own types, shared with its clients.
pub use gpufleet_api::live::{HostView, StatusNode, StatusView, TickGpu, TickView};

fn tick_event(c: &Committed) -> Option<Event> {
    let t = c.batch.ticks.iter().max_by_key(|t| t.time_ms)?;
    let view = TickView {
        node: Cow::Borrowed(c.node.as_str()),
        time_ms: t.time_ms,
        gpus: t
            .gpus
            .iter()
            .map(|s| TickGpu {
                uuid: Cow::Borrowed(s.gpu_uuid.as_str()),
                sample: Cow::Borrowed(s),
            })
            .collect(),
        host: t.host.as_ref().map(|sample| HostView {
            time_ms: t.time_ms,
            sample: Cow::Borrowed(sample),
        }),
        processes: Cow::Borrowed(t.processes.as_slice()),
    };
    Event::default().event("tick").json_data(view).ok()
}

fn status_event(st: &AppState, node: Option<&str>) -> Option<Event> {
    let now = (st.clock)();
    st.live.read(|s| {
        let nodes: Vec<StatusNode> = s
            .nodes
            .values()
            .filter(|n| node.is_none_or(|name| n.record.name == name))
            .map(|n| {
                let status = st.status.classify(n.record.last_seen_ms, now);
                let (health, gpus) = crate::health::judge_live_node(
                    n,
                    status,
                    &st.status,
                    &crate::health::HealthPolicy::default(),
                    now,
                );
                StatusNode {
                    name: n.record.name.clone(),
                    status,
                    last_seen_ms: n.record.last_seen_ms,
                    connected: n.connections > 0,
                    health: health.state,
                    gpu_health: n
                        .record
                        .gpus
                        .iter()
                        .zip(gpus)
                        .filter(|(_, h)| h.state != crate::health::HealthState::Ok)
                        .map(|(g, h)| (g.info.uuid.clone(), h.state))
                        .collect(),
                }
            })
            .collect();
        // Through a JSON value, as ever: its keys (and the nodes') in sorted order.
        serde_json::to_value(StatusView { nodes, now_ms: now })
            .ok()
            .and_then(|view| Event::default().event("status").json_data(view).ok())
    })
}

struct Conn {
    /// This stream's place in the live budget, given back when the stream ends.
    _budget: Option<LiveGuard>,
    st: AppState,
    node: Option<String>,
    rx: broadcast::Receiver<Arc<Announcement>>,
    status: tokio::time::Interval,
}

impl Conn {
    /// The next event, or `None` when the collector is shutting down.
    async fn next(&mut self) -> Option<Event> {
        loop {
            tokio::select! {
                biased;
                () = self.st.live.closing() => return None,
                r = self.rx.recv() => match r {
                    Ok(c) => {
                        if self.node.as_deref().is_some_and(|n| n != c.node) {
                            continue;
                        }
                        if c.partial {
                            debug!("live stream: an announcement came without its ticks; asking the client to resync");
                            return Some(Event::default().event("resync").data("{\"skipped\":1}"));
                        }
                        if let Some(e) = tick_event(&c) {
                            return Some(e);
                        }
                    }
                    Err(RecvError::Lagged(skipped)) => {
                        debug!(skipped, "live stream client fell behind; asking it to resync");
                        return Some(
                            Event::default()
                                .event("resync")
                                .data(format!("{{\"skipped\":{skipped}}}")),
                        );
                    }
                    Err(RecvError::Closed) => return None,
                },
                _ = self.status.tick() => {
                    if let Some(e) = status_event(&self.st, self.node.as_deref()) {
                        return Some(e);
                    }
                }
            }
        }
    }
}

/// The handler of `GET /api/v1/live`.
#[utoipa::path(get, path = "/api/v1/live", tag = "fleet", params(LiveParams),
    responses((status = 200, description = "Server-Sent Events: `tick` (a node's new samples) \
        and `status` (every node's status, each second); never ends",
        content_type = "text/event-stream", body = String),
        (status = 404, description = "no such node", body = crate::api::error::ErrorBody),
        (status = 503, description = "too many live streams from this address, or in all; \
            see `Retry-After`", body = crate::api::error::ErrorBody),
        crate::api::error::AccessResponses))]
pub async fn live(
    State(st): State<AppState>,
    Query(p): Query<LiveParams>,
    conn: Option<Extension<ConnHandle>>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if let Some(node) = &p.node
        && !st.live.read(|s| s.nodes.contains_key(node))
    {
        return Err(ApiError::NotFound(format!(
            "no node {node:?}; /api/v1/nodes lists them"
        )));
    }
    // Connections from our accept loops carry a handle; tests calling the router
    // directly have none, and no budget.
    let budget = match conn {
        Some(Extension(handle)) => Some(handle.start_live().map_err(|e| ApiError::Busy {
            message: e.0,
            retry_after_s: crate::net::refuse::RETRY_AFTER_S,
        })?),
        None => None,
    };
    let mut status = tokio::time::interval(STATUS_EVERY);
    status.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let conn = Conn {
        _budget: budget,
        rx: st.live.subscribe(),
        st,
        node: p.node,
        status,
    };
    let stream = futures::stream::unfold(conn, |mut c| async move {
        let e = c.next().await?;
        Some((Ok(e), c))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
