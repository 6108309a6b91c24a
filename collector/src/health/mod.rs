//! GPU and node health: what is wrong, how bad, and what to do.
//!
//! - [`xid`]: the Xid catalogue (code → name, meaning, cause, action, severity), cited
//!   from NVIDIA's Xid documentation.
//! - [`judge`]: the pure judge: a GPU's signals → ok / warning / critical with reasons;
//!   a node → its worst GPU plus offline / stale.
//! - [`recent`]: what the live state remembers per GPU for the judge (recent events,
//!   error-counter trends), bounded.
//!
//! This module also gathers a live GPU's signals ([`gpu_signals`]) and judges the whole
//! fleet from a live-state snapshot ([`fleet_health`]): what the API, `/metrics`, the
//! dashboard and the alert rules read.

pub mod judge;
pub mod recent;
pub mod xid;

pub use judge::{
    GpuHealth, GpuSignals, HealthPolicy, HealthReason, HealthState, NodeHealth, decode_throttle,
    judge_gpu, judge_node,
};

use crate::live::state::{LiveNode, LiveState};
use crate::live::status::{NodeStatus, StatusPolicy};
use crate::store::GpuRecord;
use gpufleet_core::UnixMs;
use judge::{HealthFlags, TempThresholds};

/// The signals of GPU `gpu` of `node` at `now_ms`, as the live state holds them.
pub fn gpu_signals<'a>(node: &'a LiveNode, gpu: &'a GpuRecord, now_ms: UnixMs) -> GpuSignals<'a> {
    let memory = node.memory.get(&gpu.id);
    let live = node.gpus.get(&gpu.id);
    let health = live.and_then(|l| l.health.as_ref()).map(|h| &h.sample);
    let info = &gpu.info;
    GpuSignals {
        sample: live.map(|l| &l.sample),
        thresholds: TempThresholds {
            slowdown_c: info.temp_slowdown_c,
            shutdown_c: info.temp_shutdown_c,
            gpu_max_c: info.temp_gpu_max_c,
            mem_max_c: info.temp_mem_max_c,
        },
        flags: HealthFlags {
            retired_pages_pending: health.and_then(|h| h.retired_pages_pending),
            remapped_rows_pending: health.and_then(|h| h.remapped_rows_pending),
            remapped_rows_failed: health.and_then(|h| h.remapped_rows_failed),
            // The health sample's (read every health interval) over the inventory's (read
            // at Hello).
            persistence_mode: health
                .and_then(|h| h.persistence_mode)
                .or(info.persistence_mode),
            pcie_replay_rise: memory.and_then(|m| {
                Some((
                    m.pcie_replays.rise(now_ms, recent::COUNTER_WINDOW_MS)?,
                    m.pcie_replays.since_ms(),
                ))
            }),
            nvlink_error_rise: memory.and_then(|m| {
                Some((
                    m.nvlink_errors.rise(now_ms, recent::COUNTER_WINDOW_MS)?,
                    m.nvlink_errors.since_ms(),
                ))
            }),
        },
        events: memory.map(|m| &m.events),
    }
}

/// A node's health and each of its GPUs' (in the node record's GPU order).
pub fn judge_live_node(
    node: &LiveNode,
    status: NodeStatus,
    status_policy: &StatusPolicy,
    policy: &HealthPolicy,
    now_ms: UnixMs,
) -> (NodeHealth, Vec<GpuHealth>) {
    let gpus: Vec<GpuHealth> = node
        .record
        .gpus
        .iter()
        .map(|g| judge_gpu(&gpu_signals(node, g, now_ms), policy, now_ms))
        .collect();
    let refs: Vec<&GpuHealth> = gpus.iter().collect();
    let offline_after = humantime_secs(status_policy.offline_after.as_secs());
    (judge_node(status, &refs, &offline_after), gpus)
}

fn humantime_secs(s: u64) -> String {
    if s >= 60 && s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// One GPU's judged health, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FleetGpuHealth {
    pub node: String,
    pub node_status: NodeStatus,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    #[serde(flatten)]
    pub health: GpuHealth,
}

/// Every GPU of the fleet, judged at `now_ms` (nodes by name, GPUs in index order).
/// Call it inside [`crate::live::state::Live::read`]: judging is cheap (no I/O).
pub fn fleet_health(
    state: &LiveState,
    status_policy: &StatusPolicy,
    policy: &HealthPolicy,
    now_ms: UnixMs,
) -> Vec<FleetGpuHealth> {
    let mut out = Vec::new();
    for n in state.nodes.values() {
        let status = status_policy.classify(n.record.last_seen_ms, now_ms);
        for g in &n.record.gpus {
            out.push(FleetGpuHealth {
                node: n.record.name.clone(),
                node_status: status,
                uuid: g.info.uuid.clone(),
                index: g.info.index,
                name: g.info.name.clone(),
                health: judge_gpu(&gpu_signals(n, g, now_ms), policy, now_ms),
            });
        }
    }
    out
}

/// Events read per query when seeding the judge's memory at start-up.
pub const SEED_EVENTS_PER_NODE: usize = 10_000;
/// Most queries per node when seeding (a node that logged more events in a day is seeded
/// with its oldest `SEED_PAGES × SEED_EVENTS_PER_NODE`).
const SEED_PAGES: usize = 20;

/// Seeds the judge's memory of every node in `live` from its events stored in the last
/// [`recent::KEEP_MS`] before `now_ms` (at start-up, after [`crate::live::state::Live::seed`]):
/// an Xid from before a restart still counts. One query per node (more for a node with
/// more than [`SEED_EVENTS_PER_NODE`] events).
pub async fn seed_memory(
    store: &dyn crate::store::FleetReads,
    live: &crate::live::state::Live,
    now_ms: UnixMs,
) -> Result<(), crate::store::StoreError> {
    let nodes: Vec<(String, crate::store::NodeId)> = live.read(|s| {
        s.nodes
            .values()
            .map(|n| (n.record.name.clone(), n.record.id))
            .collect()
    });
    let range = crate::store::TimeRange {
        from_ms: now_ms.saturating_sub(recent::KEEP_MS),
        to_ms: now_ms,
    };
    for (name, id) in nodes {
        // Oldest first, a page at a time, so a flood of one Xid does not hide a later one.
        let mut range = range;
        for _ in 0..SEED_PAGES {
            let events = store.events(id, range, SEED_EVENTS_PER_NODE).await?;
            live.seed_events(&name, &events);
            match events.last() {
                Some(last) if events.len() >= SEED_EVENTS_PER_NODE => {
                    range.from_ms = last.time_ms.saturating_add(1);
                }
                _ => break,
            }
        }
    }
    Ok(())
}
