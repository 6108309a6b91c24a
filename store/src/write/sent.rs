//! What a write hands its backend: the sample rows of a group commit, the nodes' delivery
//! updates, and how the backend's write ended. A leaf: the backends and the group commit
//! both import it.

use gpufleet_core::{DeliveryStats, GpuSample, ProcessSample, Tick, UnixMs};
use std::collections::HashSet;

/// The delivery-state update of one node.
pub struct NodeUpdate {
    pub id: i64,
    pub newest_ms: i64,
    /// The highest seq written for the node, and that batch's delivery stats.
    pub seq: u64,
    pub delivery: DeliveryStats,
    /// GPU samples newly inserted.
    pub inserted: u64,
}

/// A write's sample rows, as [`collect_rows`](super::collect_rows) collects them and
/// [`Backend::write_samples`](crate::backend::Backend::write_samples) writes them (SQLite binds them row by row, PostgreSQL column
/// by column). Events, workloads and nodes are written alike on both
/// ([`SqlStore::write_rounds`](crate::SqlStore::write_rounds)).
#[derive(Default)]
pub struct Samples<'b> {
    pub gpu: Vec<GpuRow<'b>>,
    pub process: Vec<ProcessRow<'b>>,
    /// The ticks that have host metrics or a sampler cost.
    pub host: Vec<HostTick<'b>>,
}

pub struct GpuRow<'b> {
    /// Index of the node's group in [`Collected::nodes`](super::Collected::nodes).
    pub group: usize,
    pub gpu: i64,
    pub ts: UnixMs,
    pub s: &'b GpuSample,
}

pub struct ProcessRow<'b> {
    pub gpu: i64,
    pub ts: UnixMs,
    /// Index in [`Collected::lives`](super::Collected::lives); resolved to `life` once ids are known.
    pub slot: usize,
    /// Its lifetime's id (`process_lives.id`).
    pub life: i64,
    pub p: &'b ProcessSample,
}

pub struct HostTick<'b> {
    pub node: i64,
    pub ts: UnixMs,
    pub tick: &'b Tick,
}

/// How [`Backend::write_samples`](crate::backend::Backend::write_samples) ended.
pub enum Written {
    /// Every row was sent. `skipped`: some were already stored (replays, or conflicts);
    /// `gpus`: the GPUs some of whose samples were skipped, where the backend can tell
    /// (`None`: any GPU of the write).
    Rows {
        skipped: bool,
        gpus: Option<HashSet<i64>>,
    },
    /// Roll back and redo the write with `fallback` set.
    Fallback,
}
