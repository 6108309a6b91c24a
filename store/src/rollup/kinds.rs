//! The shapes of rollups: what a series is about, its key, a stored minute and its
//! metrics, and the tables and columns a kind is kept in. A leaf of the packed-tier
//! modules: packing, packed hours and arrival read these; the rollup store uses them all.

use crate::series;
use crate::{GpuId, GpuMetric, NodeId};
use gpufleet_core::UnixMs;
use std::collections::BTreeMap;

/// What a rollup series is about: a GPU's metrics or a node's host metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RollupKind {
    Gpu,
    Host,
}

impl RollupKind {
    /// The description of this kind's packed hours ([`series`]).
    pub(crate) fn series(self) -> &'static series::Series {
        match self {
            RollupKind::Gpu => &series::GPU_ROLLUP,
            RollupKind::Host => &series::HOST_ROLLUP,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RollupKind::Gpu => "gpu",
            RollupKind::Host => "host",
        }
    }

    pub fn parse(s: &str) -> Option<RollupKind> {
        match s {
            "gpu" => Some(RollupKind::Gpu),
            "host" => Some(RollupKind::Host),
            _ => None,
        }
    }
}

/// One rolled-up series: a GPU (`id` = `GpuId.0`) or a node's host metrics (`NodeId.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RollupKey {
    pub kind: RollupKind,
    pub id: i64,
}

impl RollupKey {
    pub fn gpu(gpu: GpuId) -> RollupKey {
        RollupKey {
            kind: RollupKind::Gpu,
            id: gpu.0,
        }
    }

    pub fn host(node: NodeId) -> RollupKey {
        RollupKey {
            kind: RollupKind::Host,
            id: node.0,
        }
    }
}

/// How far one series is rolled up, and the span of its raw samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollupCursor {
    pub key: RollupKey,
    /// Oldest and newest stored raw sample; `None` without samples.
    pub first_sample_ms: Option<UnixMs>,
    pub last_sample_ms: Option<UnixMs>,
    /// Every minute before this has its rollup row; `None`: nothing yet.
    pub done_to_ms: Option<UnixMs>,
}

/// One metric over one minute (or bucket): how many samples reported it, and their
/// average, minimum and maximum — all `None` when `n == 0` (absent is not zero).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MetricStats {
    pub n: u32,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// The host metrics that are rolled up, in storage order (the `host_samples` columns and
/// the host series' field names).
pub const HOST_METRICS: [&str; 8] = [
    "cpu_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "disk_read_bps",
    "disk_write_bps",
    "net_rx_bps",
    "net_tx_bps",
    "load1",
];

/// One minute of one series: sample count and per-metric stats, in [`GpuMetric::ALL`]
/// order for GPUs and [`HOST_METRICS`] order for hosts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RollupMinute {
    pub minute_ms: UnixMs,
    /// Raw samples in the minute when it was computed.
    pub samples: u32,
    pub metrics: Vec<MetricStats>,
}

impl RollupMinute {
    /// A GPU minute's stats for `metric`.
    pub fn gpu(&self, metric: GpuMetric) -> MetricStats {
        GpuMetric::ALL
            .iter()
            .position(|m| *m == metric)
            .and_then(|i| self.metrics.get(i).copied())
            .unwrap_or_default()
    }

    /// A host minute's stats for the metric named `name` (see [`HOST_METRICS`]).
    pub fn host(&self, name: &str) -> MetricStats {
        HOST_METRICS
            .iter()
            .position(|m| *m == name)
            .and_then(|i| self.metrics.get(i).copied())
            .unwrap_or_default()
    }
}

/// What one retention call deleted, rows per table, and how far it moved the raw horizons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetentionOutcome {
    /// Rows deleted per table.
    pub deleted: BTreeMap<&'static str, u64>,
    /// Raw horizons raised by this call.
    pub horizons_raised: usize,
    /// Statements (each its own short transaction) executed.
    pub transactions: usize,
    /// Whole raw partitions dropped (PostgreSQL), by name.
    pub partitions_dropped: Vec<String>,
}

impl RetentionOutcome {
    pub fn total(&self) -> u64 {
        self.deleted.values().sum()
    }
}

/// Where one kind of series lives. Every name is a fixed identifier of this module, never
/// user input.
pub(crate) struct Spec {
    /// The raw table and its id column.
    pub(crate) raw: &'static str,
    pub(crate) id: &'static str,
    /// The rollup table.
    pub(crate) minutes: &'static str,
    /// Rolled-up columns and whether they are REAL (else INTEGER holding u64 bits).
    pub(crate) cols: Vec<(&'static str, bool)>,
}

/// The series whose rollup rows `table` holds under `id`, if it holds rollup rows.
pub(crate) fn rollup_series(table: &str, id: i64) -> Option<RollupKey> {
    [RollupKind::Gpu, RollupKind::Host]
        .into_iter()
        .find(|&kind| spec(kind).minutes == table)
        .map(|kind| RollupKey { kind, id })
}

pub(crate) fn spec(kind: RollupKind) -> Spec {
    match kind {
        RollupKind::Gpu => Spec {
            raw: series::GPU.rows,
            id: series::GPU_ROLLUP.id,
            minutes: series::GPU_ROLLUP.rows,
            cols: GpuMetric::ALL.iter().map(|m| (m.name(), false)).collect(),
        },
        RollupKind::Host => Spec {
            raw: series::HOST.rows,
            id: series::HOST_ROLLUP.id,
            minutes: series::HOST_ROLLUP.rows,
            cols: HOST_METRICS
                .iter()
                .map(|&c| (c, c == "cpu_util_pct" || c == "load1"))
                .collect(),
        },
    }
}
