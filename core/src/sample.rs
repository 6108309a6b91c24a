//! What an agent measures: inventory (once) and ticks (every interval).
//!
//! Every measured value is an `Option`: `None` means the hardware or OS could not report
//! it (NVML `NOT_SUPPORTED`, a missing /proc file). It is never replaced by 0. Units are
//! integers named in the field (`_mw`, `_mj`, `_bytes`, `_bps`, `_mhz`, `_c`, `_pct`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Unix time in milliseconds (UTC).
pub type UnixMs = i64;

/// Static facts about a node and its GPUs, sent once per connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
    pub host: HostInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel: Option<String>,
    pub os: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub serial: Option<String>,
    pub pci_bus_id: Option<String>,
    pub architecture: Option<String>,
    pub brand: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub power_limit_default_mw: Option<u32>,
    pub power_limit_enforced_mw: Option<u32>,
    pub power_limit_min_mw: Option<u32>,
    pub power_limit_max_mw: Option<u32>,
    pub max_clock_sm_mhz: Option<u32>,
    pub max_clock_mem_mhz: Option<u32>,
    pub max_clock_graphics_mhz: Option<u32>,
    pub nvlink_count: Option<u32>,
    pub mig_enabled: Option<bool>,
    pub compute_mode: Option<String>,
    pub persistence_mode: Option<bool>,
    pub cuda_capability_major: Option<u32>,
    pub cuda_capability_minor: Option<u32>,
    pub pcie_link_gen_max: Option<u32>,
    pub pcie_link_width_max: Option<u32>,
    pub vbios_version: Option<String>,
    pub mig_instances: Vec<MigInstance>,
    /// NVML temperature thresholds: the GPU slows itself down at `temp_slowdown_c`, shuts
    /// down at `temp_shutdown_c`; `temp_gpu_max_c` / `temp_mem_max_c` are the maximum
    /// operating temperatures of the GPU and its memory.
    pub temp_slowdown_c: Option<u32>,
    pub temp_shutdown_c: Option<u32>,
    pub temp_gpu_max_c: Option<u32>,
    pub temp_mem_max_c: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigInstance {
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub profile: Option<String>,
    pub memory_total_bytes: Option<u64>,
}

/// Everything sampled at one instant on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub time_ms: UnixMs,
    pub gpus: Vec<GpuSample>,
    pub processes: Vec<ProcessSample>,
    pub host: Option<HostSample>,
    pub events: Vec<Event>,
    pub cost: Option<SamplerCost>,
    /// Health counters and flags, present when the agent read them this tick: the first
    /// tick, then every health interval, and on the tick after an Xid / ECC / GPU-lost event.
    pub health: Vec<GpuHealthSample>,
    /// The agent's failed workload-name look-ups since it started, per source and cause;
    /// empty while none failed. Shown live, not stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub name_failures: Vec<NameFailures>,
}

/// Failed workload-name look-ups of one source for one cause, since the agent started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameFailures {
    /// `kubernetes`, `docker`, `slurm`.
    pub source: String,
    /// `unreachable`, `forbidden`, `not_found`, `malformed`, `timeout`.
    pub cause: String,
    pub count: u64,
}

/// One GPU at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuSample {
    pub gpu_uuid: String,
    pub util_gpu_pct: Option<u32>,
    pub util_mem_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub mem_reserved_bytes: Option<u64>,
    /// As `nvmlDeviceGetPowerUsage` reports it (a 1 s average on Ampere and newer).
    pub power_mw: Option<u32>,
    pub power_instant_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    /// Total energy since the driver loaded (Volta+); the ground truth for energy.
    pub energy_mj: Option<u64>,
    pub temp_gpu_c: Option<u32>,
    pub temp_mem_c: Option<u32>,
    pub fan_pct: Option<u32>,
    pub clock_sm_mhz: Option<u32>,
    pub clock_mem_mhz: Option<u32>,
    pub clock_graphics_mhz: Option<u32>,
    pub pstate: Option<u32>,
    pub pcie_tx_bps: Option<u64>,
    pub pcie_rx_bps: Option<u64>,
    pub nvlink_tx_bps: Option<u64>,
    pub nvlink_rx_bps: Option<u64>,
    pub nvlinks: Vec<NvLinkSample>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub throttle_reasons: Option<u64>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
    /// GPU Performance Monitoring of the whole GPU (all absent without GPM).
    #[serde(default)]
    pub gpm: GpmMetrics,
    /// GPM per MIG instance (MIG enabled and GPM supported).
    #[serde(default)]
    pub mig_gpm: Vec<MigGpm>,
}

/// GPU Performance Monitoring (GPM: Hopper and newer, through NVML) over the window between
/// two GPM samples: how much of the SMs, the tensor cores and the memory system the work
/// used, which NVML's utilization (the share of time any kernel ran) cannot say.
/// Activities are hundredths of a percent (0–10 000) of their unit's peak, rates bytes per
/// second. A GPU without GPM has every field absent, never 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpmMetrics {
    /// SMs with at least one warp resident (NVML_GPM_METRIC_SM_UTIL).
    pub sm_active_cpct: Option<u32>,
    /// Resident warps of the SMs' maximum (NVML_GPM_METRIC_SM_OCCUPANCY).
    pub sm_occupancy_cpct: Option<u32>,
    /// Any tensor-core pipe active.
    pub tensor_active_cpct: Option<u32>,
    /// Half-precision (HMMA), integer (IMMA) and double-precision (DFMA) tensor pipes.
    pub tensor_hmma_cpct: Option<u32>,
    pub tensor_imma_cpct: Option<u32>,
    pub tensor_dfma_cpct: Option<u32>,
    /// DRAM bandwidth used, of its peak.
    pub dram_bw_cpct: Option<u32>,
    /// FP64 / FP32 / FP16 pipes active.
    pub fp64_cpct: Option<u32>,
    pub fp32_cpct: Option<u32>,
    pub fp16_cpct: Option<u32>,
    /// PCIe and NVLink (all links) traffic as GPM counts it.
    pub pcie_tx_bps: Option<u64>,
    pub pcie_rx_bps: Option<u64>,
    pub nvlink_tx_bps: Option<u64>,
    pub nvlink_rx_bps: Option<u64>,
}

/// Declares [`GpmMetrics::NAMES`], `values` and `from_values` from the field list once.
macro_rules! gpm_fields {
    ($($pct:ident),* ; $($rate:ident),*) => {
        impl GpmMetrics {
            /// The field names, in the order of [`GpmMetrics::values`].
            pub const NAMES: [&'static str; 14] =
                [$(stringify!($pct),)* $(stringify!($rate),)*];

            /// Every field as a u64, in [`GpmMetrics::NAMES`] order.
            pub fn values(&self) -> [Option<u64>; 14] {
                [$(self.$pct.map(u64::from),)* $(self.$rate,)*]
            }

            /// The metrics from [`GpmMetrics::values`]; `None` if an activity does not
            /// fit its field.
            pub fn from_values(v: [Option<u64>; 14]) -> Option<GpmMetrics> {
                let mut it = v.into_iter();
                let mut next = || it.next().flatten();
                Some(GpmMetrics {
                    $($pct: match next() {
                        Some(x) => Some(u32::try_from(x).ok()?),
                        None => None,
                    },)*
                    $($rate: next(),)*
                })
            }
        }
    };
}

gpm_fields!(sm_active_cpct, sm_occupancy_cpct, tensor_active_cpct, tensor_hmma_cpct,
    tensor_imma_cpct, tensor_dfma_cpct, dram_bw_cpct, fp64_cpct, fp32_cpct, fp16_cpct;
    pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps);

impl GpmMetrics {
    /// Whether no metric is present.
    pub fn is_empty(&self) -> bool {
        *self == GpmMetrics::default()
    }
}

/// GPM of one MIG instance (GPU instance) of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigGpm {
    /// The MIG device's UUID (`MIG-…`), as in the inventory.
    pub mig_uuid: String,
    pub gpu_instance_id: u32,
    pub gpm: GpmMetrics,
}

/// A GPU's health counters and flags: read less often than the tick (they change rarely),
/// absent (None) when NVML does not support them on this GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuHealthSample {
    pub gpu_uuid: String,
    /// Pages retired for single-bit errors.
    pub retired_pages_sbe: Option<u32>,
    /// Pages retired for double-bit errors.
    pub retired_pages_dbe: Option<u32>,
    /// A retirement waits for a reboot.
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_correctable: Option<u32>,
    pub remapped_rows_uncorrectable: Option<u32>,
    /// A row remap waits for a GPU reset.
    pub remapped_rows_pending: Option<bool>,
    /// A row remap failed: the GPU needs service.
    pub remapped_rows_failed: Option<bool>,
    /// Lifetime (aggregate) ECC error counts, all memory locations.
    pub ecc_corrected_aggregate: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// PCIe replay counter (link-level retransmissions since driver load).
    pub pcie_replay_count: Option<u64>,
    /// NVLink error counters summed over the GPU's links (CRC: flit + data).
    pub nvlink_crc_errors: Option<u64>,
    pub nvlink_replay_errors: Option<u64>,
    pub nvlink_recovery_errors: Option<u64>,
    pub persistence_mode: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NvLinkSample {
    pub link: u32,
    pub tx_bps: Option<u64>,
    pub rx_bps: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ProcessType {
    #[default]
    Compute,
    Graphics,
    ComputeAndGraphics,
}

/// One process on one GPU at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessSample {
    pub gpu_uuid: String,
    pub pid: u32,
    #[serde(rename = "type")]
    pub process_type: ProcessType,
    pub user: Option<String>,
    pub command: Option<String>,
    pub gpu_mem_bytes: Option<u64>,
    pub sm_util_pct: Option<u32>,
    pub mem_util_pct: Option<u32>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
    pub workload: Workload,
    pub mig_uuid: Option<String>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WorkloadKind {
    #[default]
    Host,
    Container,
    Slurm,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Container => "container",
            Self::Slurm => "slurm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "host" => Some(Self::Host),
            "container" => Some(Self::Container),
            "slurm" => Some(Self::Slurm),
            _ => None,
        }
    }
}

/// Who a process belongs to: a container (Docker, containerd, CRI-O, Podman; with its
/// Kubernetes pod when there is one), a Slurm job step, or a host user / systemd unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workload {
    pub kind: WorkloadKind,
    /// docker, containerd, cri-o, podman, unknown (containers); slurm; systemd (host).
    pub runtime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Slurm's job name (`SLURM_JOB_NAME`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The Slurm account the job is charged to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The Slurm partition the job runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The Slurm job's user (its owner, whatever uid a process runs as).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_user: Option<String>,
    /// The Slurm array task this job is, as `sacct` writes it: `<array job id>_<task id>`
    /// (`SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID`); `job_id` is the task's own raw id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub array_task: Option<String>,
    /// The component of a heterogeneous Slurm job this job is, as `sacct` writes it:
    /// `<het job id>+<offset>`; `job_id` is the component's own raw id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub het_component: Option<String>,
    /// Allow-listed labels of the pod or container (`--kube-label`, `--docker-label`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl Workload {
    /// Takes the names `newer` knows, keeping the ones it does not: a workload's latest
    /// names win, and a source that fell silent erases nothing.
    pub fn merge_names(&mut self, newer: &Workload) {
        fn take(old: &mut Option<String>, new: &Option<String>) {
            if new.is_some() {
                old.clone_from(new);
            }
        }
        take(&mut self.container_name, &newer.container_name);
        take(&mut self.image, &newer.image);
        take(&mut self.pod_name, &newer.pod_name);
        take(&mut self.namespace, &newer.namespace);
        take(&mut self.job_name, &newer.job_name);
        take(&mut self.account, &newer.account);
        take(&mut self.partition, &newer.partition);
        take(&mut self.job_user, &newer.job_user);
        take(&mut self.array_task, &newer.array_task);
        take(&mut self.het_component, &newer.het_component);
        if !newer.labels.is_empty() {
            self.labels.clone_from(&newer.labels);
        }
    }

    /// A stable key naming this workload across nodes and time, used for accounting:
    /// `container:<id>`, `slurm:<job>`, `host:<unit or uid>`.
    pub fn key(&self) -> String {
        match self.kind {
            WorkloadKind::Container => {
                format!(
                    "container:{}",
                    self.container_id.as_deref().unwrap_or("unknown")
                )
            }
            WorkloadKind::Slurm => format!("slurm:{}", self.job_id.as_deref().unwrap_or("unknown")),
            WorkloadKind::Host => match (&self.unit, self.uid) {
                (Some(unit), _) => format!("host:{unit}"),
                (None, Some(uid)) => format!("host:uid-{uid}"),
                (None, None) => "host:unknown".to_owned(),
            },
        }
    }

    /// A short human label: container name or short id, `job 123`, the unit.
    pub fn label(&self) -> String {
        match self.kind {
            WorkloadKind::Container => match (&self.container_name, &self.container_id) {
                (Some(name), _) => name.clone(),
                (None, Some(id)) => id.chars().take(12).collect(),
                (None, None) => "container".to_owned(),
            },
            WorkloadKind::Slurm => match &self.job_name {
                Some(name) => name.clone(),
                None => format!("job {}", self.job_id.as_deref().unwrap_or("?")),
            },
            WorkloadKind::Host => self.unit.clone().unwrap_or_else(|| "host".to_owned()),
        }
    }
}

/// Host-level resources (NVDashboard's "Machine Resources").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostSample {
    pub cpu_util_pct: Option<f32>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub disk_read_bps: Option<u64>,
    pub disk_write_bps: Option<u64>,
    pub net_rx_bps: Option<u64>,
    pub net_tx_bps: Option<u64>,
    pub load1: Option<f32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventKind {
    #[default]
    Xid,
    EccDoubleBit,
    EccSingleBit,
    GpuLost,
    GpuRecovered,
    Throttle,
    SpoolDrop,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Xid => "xid",
            Self::EccDoubleBit => "ecc_double_bit",
            Self::EccSingleBit => "ecc_single_bit",
            Self::GpuLost => "gpu_lost",
            Self::GpuRecovered => "gpu_recovered",
            Self::Throttle => "throttle",
            Self::SpoolDrop => "spool_drop",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    pub time_ms: UnixMs,
    /// Empty for node-level events.
    pub gpu_uuid: String,
    pub kind: EventKind,
    /// Xid number for Xid events.
    pub code: Option<u64>,
    pub detail: String,
}

/// What sampling one tick cost the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SamplerCost {
    pub cpu_us: Option<u32>,
    pub wall_us: Option<u32>,
    pub source_us: Option<u32>,
    pub slowest_calls_us: BTreeMap<String, u32>,
}

/// The agent's view of its own delivery state, sent with every batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryStats {
    pub dropped_samples: u64,
    pub spool_backlog_batches: u64,
    pub spool_backlog_bytes: u64,
}

/// A seq-numbered group of ticks: the unit of delivery and acknowledgement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub seq: u64,
    pub ticks: Vec<Tick>,
    pub delivery: DeliveryStats,
}

impl Batch {
    /// GPU samples in this batch (the unit the reliability summary counts).
    pub fn gpu_samples(&self) -> usize {
        self.ticks.iter().map(|t| t.gpus.len()).sum()
    }
}
