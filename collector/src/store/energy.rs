//! What the store keeps and returns for energy accounting (issue 6). The computing is in
//! [`crate::energy`] (pure) and [`crate::accountant`]; these are the shapes crossing the
//! store boundary.

use super::{GpuId, NodeId};
use crate::energy::EnergySample;
use gpufleet_core::{UnixMs, Workload};

/// A GPU as the accountant sees it: where it is, what it is, how far it is accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyGpu {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    /// The GPU model (`NVIDIA H100 80GB HBM3`), for per-model idle watts.
    pub name: String,
    pub node: NodeId,
    pub node_name: String,
    /// The node's sampling interval (0: unknown).
    pub interval_ms: u32,
    /// Oldest and newest stored sample; `None` without samples.
    pub first_sample_ms: Option<UnixMs>,
    pub last_sample_ms: Option<UnixMs>,
    /// Every minute before this has been accounted; `None`: nothing yet.
    pub done_to_ms: Option<UnixMs>,
}

/// The raw inputs of a range `[from, to)` of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyInputs {
    /// The newest sample before `from` (its processes are not loaded: an interval is
    /// attributed by the processes at its end).
    pub prev: Option<EnergySample>,
    /// The samples in the range, oldest first, each with its processes.
    pub samples: Vec<EnergySample>,
}

/// One workload's energy on one GPU over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergy {
    pub workload: Workload,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub node_name: String,
    pub energy_mj: u64,
    pub idle_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
    pub sm_ms: i64,
    pub memory_ms: i64,
    pub equal_ms: i64,
    pub first_minute_ms: UnixMs,
    pub last_minute_ms: UnixMs,
}

/// One GPU's energy over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuEnergy {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub node_name: String,
    pub energy_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub attributed_mj: u64,
    pub idle_mj: u64,
    pub unattributed_mj: u64,
    pub covered_ms: i64,
    pub missing_ms: i64,
}

/// One minute of one workload (all its GPUs).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergyPoint {
    pub minute_ms: UnixMs,
    pub energy_mj: u64,
    pub idle_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
}
