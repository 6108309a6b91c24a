//! The scenario file that drives the fake: GPUs, their static facts, values that change
//! from call to call, processes, unsupported functions and injected failures.
//!
//! JSON. Every field has a default (an A100-like GPU), so a scenario names only what it
//! cares about:
//!
//! ```json
//! { "gpus": [ { "uuid": "GPU-0", "power_mw": [120000, 250000],
//!               "unsupported": ["nvmlDeviceGetFanSpeed_v2", "field:186"],
//!               "compute_processes": [ { "pid": 1101, "used_bytes": 1073741824, "sm_pct": 40 } ],
//!               "lost_after_calls": 200, "lost_for_calls": 3,
//!               "events": [ { "kind": "xid", "code": 79, "after_calls": 60 } ] } ] }
//! ```
//!
//! Cost model: `"cost_model": "h200"` (and/or `"costs": {"nvmlDeviceGetPowerUsage":
//! {"cpu_us": 90}, "field:83": {"cpu_us": 3600}}`) makes each per-device call spin this
//! thread's CPU and then sleep as a real driver does, outside the fake's lock, so that a
//! monitor's measured overhead against the fake is the driver's (see [`CallCost`]).
//!
//! Buffered process samples: with a GPU's `process_sample_ms` > 0,
//! `nvmlDeviceGetProcessUtilization` answers the driver's periodic samples on the wall
//! clock (every multiple of the period, kept `process_buffer_ms`) newer than the caller's
//! `lastSeenTimeStamp`, instead of one fresh sample per call.
//!
//! GPM (GPU Performance Monitoring, Hopper and later): a GPU with `gpm` answers the
//! `nvmlGpm*` functions. `nvmlGpmMetricsGet` over two of its samples answers each metric
//! the scenario names (`"metrics": {"sm_util": [92000, 91000]}`, in thousandths of NVML's
//! unit: % or MiB/s) at the second sample's number; `mig_metrics` does the same per GPU
//! instance for `nvmlGpmMigSampleGet`. The support query can lie (`support_query`) and
//! sampling can fail for a while (`fail_after_samples`, `fail_for_samples`, `fail_with`:
//! a profiler holding the counters answers `in_use`). A GPU without `gpm` (before Hopper)
//! answers `isSupportedDevice` 0 and NOT_SUPPORTED from its sample calls.

use crate::cost::CallCost;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole fake machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2` (e.g. 12040 = 12.4).
    pub cuda_driver_version: i32,
    /// Where `nvmlShutdown` writes the per-function call counts (JSON object
    /// `{"gpu0.nvmlDeviceGetPowerUsage": 3, "nvmlInit_v2": 1, …}`); none if unset.
    pub counts_file: Option<PathBuf>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// A preset of what each per-device call costs, as measured on a real driver:
    /// `"h200"` (an H200, driver 580). Any other name fails `nvmlInit_v2` (UNKNOWN, the
    /// reason on stderr). None: calls cost nothing but the fake's own work.
    pub cost_model: Option<String>,
    /// Per-call costs on top of the preset (or alone, without one; then everything not
    /// named is free): by the C function name (`nvmlDeviceGetPowerUsage`, per-device
    /// functions only), or `field:<id>` for each entry of that field id in
    /// `nvmlDeviceGetFieldValues` (charged on top of the function's own cost).
    /// A key naming nothing fails `nvmlInit_v2` as an unknown preset does.
    pub costs: BTreeMap<String, CallCost>,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            driver_version: "550.54.15".into(),
            nvml_version: "12.550.54.15".into(),
            cuda_driver_version: 12040,
            counts_file: None,
            gpus: Vec::new(),
            cost_model: None,
            costs: BTreeMap::new(),
        }
    }
}

/// A value that may change from one read to the next. The n-th read (0-based) of that
/// value on that GPU gets `Seq[n]` (the last element once past the end) or
/// `start + n * step`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// The same every time.
    Const(u64),
    /// One element per read; the last repeats.
    Seq(Vec<u64>),
    /// A counter: `start + n * step`.
    Ramp {
        /// The first read.
        start: u64,
        /// Added per read.
        step: u64,
    },
}

impl Value {
    /// The value of read number `n` (0-based).
    pub fn at(&self, n: u64) -> u64 {
        match self {
            Self::Const(v) => *v,
            Self::Seq(s) => {
                let i = usize::try_from(n).unwrap_or(usize::MAX);
                s.get(i).or(s.last()).copied().unwrap_or(0)
            }
            Self::Ramp { start, step } => start.saturating_add(n.saturating_mul(*step)),
        }
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Const(v)
    }
}

/// One process on a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Process {
    /// Process id (the fixture tree in `shared/cgroups` has 1101–1111).
    pub pid: u32,
    /// GPU memory; `None` is NVML's "not available" (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_bytes: Option<u64>,
    /// Per-process utilization; the process gets no utilization sample if `None` (nor
    /// an `sm_pct_seq`).
    pub sm_pct: Option<u32>,
    /// With its GPU's `process_sample_ms` > 0 and non-empty: the SM utilization of the
    /// driver's sample at timestamp `ts` is `sm_pct_seq[(ts_ms / process_sample_ms) % len]`
    /// (instead of `sm_pct`; the process has samples even when `sm_pct` is `None`).
    /// Unused with `process_sample_ms` 0.
    pub sm_pct_seq: Vec<u32>,
    /// Memory-bandwidth utilization (with `sm_pct`).
    pub mem_pct: u32,
    /// Encoder utilization (with `sm_pct`).
    pub enc_pct: u32,
    /// Decoder utilization (with `sm_pct`).
    pub dec_pct: u32,
    /// The process shows up from this call of the list function on (0-based, counting
    /// the size query): lets a list grow between the size query and the fill, which
    /// makes the fill answer `NVML_ERROR_INSUFFICIENT_SIZE`.
    pub from_call: u64,
    /// The MIG instance it runs in (index into its GPU's `mig_instances`): it is listed
    /// on that MIG device's handle, and on the GPU's with the instance's ids.
    pub mig: Option<usize>,
    /// Listed only while this path exists: a process whose life a test drives from
    /// outside (a Slurm job's step that starts and ends). Its utilization samples are
    /// answered whether or not it is listed, as a driver's buffer outlives a process.
    pub while_exists: Option<PathBuf>,
}

/// A MIG device (GPU instance + compute instance) of a GPU with MIG enabled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigSpec {
    /// `MIG-…`.
    pub uuid: String,
    /// Profile, e.g. `3g.40gb`; the MIG device's name is `<GPU name> MIG <profile>`.
    pub profile: String,
    pub memory_total_bytes: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// What an event set delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// `nvmlEventTypeXidCriticalError`, with `code` as the Xid.
    Xid,
    /// `nvmlEventTypeDoubleBitEccError`.
    EccDoubleBit,
    /// `nvmlEventTypeSingleBitEccError`.
    EccSingleBit,
}

/// An event that becomes pending once the GPU has answered `after_calls` calls, and is
/// delivered once by `nvmlEventSetWait_v2` to a set it was registered for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Which event.
    pub kind: EventKind,
    /// Xid number (event data).
    #[serde(default)]
    pub code: u64,
    /// Calls to this GPU before it is pending.
    #[serde(default)]
    pub after_calls: u64,
}

/// GPM (GPU Performance Monitoring) of a Hopper or later GPU: what the `nvmlGpm*`
/// functions answer. Sample calls are counted per stream (the whole GPU, and each GPU
/// instance apart): a stream's n-th successful call (0-based) takes sample number n, and
/// `nvmlGpmMetricsGet` over two samples of one stream answers each metric's [`Value`] at
/// the second sample's number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpmSpec {
    /// What `nvmlGpmQueryDeviceSupport` answers: `"answer"` (the truth: supported),
    /// `"version_mismatch"` (`NVML_ERROR_ARGUMENT_VERSION_MISMATCH` whatever the struct's
    /// version, as drivers answered a binding that sent a wrong one) or `"no"`
    /// (`isSupportedDevice` 0, although sampling works).
    pub support_query: String,
    /// The whole GPU's metrics, by NVML's name in lower case without `NVML_GPM_METRIC_`
    /// (`sm_util`, `sm_occupancy`, `graphics_util`, `integer_util`, `any_tensor_util`,
    /// `hmma_tensor_util`, `imma_tensor_util`, `dfma_tensor_util`, `dram_bw_util`,
    /// `fp64_util`, `fp32_util`, `fp16_util`, `pcie_tx_per_sec`, `pcie_rx_per_sec`,
    /// `nvlink_total_rx_per_sec`, `nvlink_total_tx_per_sec`), in thousandths of NVML's
    /// unit: `45500` answers 45.5 (%), `12000` 12 (MiB/s, NVML's unit of the per-second
    /// rates). A metric asked and not named answers NOT_SUPPORTED; an unknown name fails
    /// `nvmlInit_v2`.
    pub metrics: BTreeMap<String, Value>,
    /// Per GPU instance (key: its `gpu_instance_id` in decimal, one of the GPU's
    /// `mig_instances`): the metrics of its `nvmlGpmMigSampleGet` samples, as `metrics`.
    pub mig_metrics: BTreeMap<String, BTreeMap<String, Value>>,
    /// A stream's sample calls numbered (0-based, counting every attempted call, failed
    /// ones included) from this one on fail …
    pub fail_after_samples: Option<u64>,
    /// … for this many calls (for good if unset); the failed calls take no sample number.
    pub fail_for_samples: Option<u64>,
    /// What a failing sample call answers: `"unknown"` (`NVML_ERROR_UNKNOWN`) or
    /// `"in_use"` (`NVML_ERROR_IN_USE`: a profiler such as Nsight Compute or DCGM's
    /// profiling holds the counters).
    pub fail_with: String,
}

impl Default for GpmSpec {
    fn default() -> Self {
        Self {
            support_query: "answer".into(),
            metrics: BTreeMap::new(),
            mig_metrics: BTreeMap::new(),
            fail_after_samples: None,
            fail_for_samples: None,
            fail_with: "unknown".into(),
        }
    }
}

/// Whether call `n` (0-based) is inside the window of calls from `after` on, for `count`
/// calls (for good if `None`): the lost window and GPM's failure window.
pub(crate) fn in_window(n: u64, after: Option<u64>, count: Option<u64>) -> bool {
    match after {
        Some(from) if n >= from => count.is_none_or(|c| n < from.saturating_add(c)),
        _ => false,
    }
}

/// One GPU. Static facts answer the same every call; [`Value`]s change per read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Gpu {
    pub uuid: String,
    pub name: String,
    pub serial: String,
    pub pci_bus_id: String,
    /// `nvmlDeviceArchitecture_t` (7 Ampere, 9 Hopper).
    pub architecture: u32,
    /// `nvmlBrandType_t` (2 Tesla, 14 NVIDIA).
    pub brand: u32,
    pub vbios_version: String,
    pub memory_total_bytes: u64,
    pub memory_reserved_bytes: u64,
    pub power_limit_default_mw: u32,
    pub power_limit_enforced_mw: u32,
    pub power_limit_min_mw: u32,
    pub power_limit_max_mw: u32,
    pub max_clock_sm_mhz: u32,
    pub max_clock_mem_mhz: u32,
    pub max_clock_graphics_mhz: u32,
    /// Active NVLink links (0..n are active).
    pub nvlinks: u32,
    /// MIG mode, current (0/1).
    pub mig_mode: u32,
    /// MIG devices (with `mig_mode` 1); `nvmlDeviceGetMaxMigDeviceCount` answers 7 and
    /// the slots past these answer NOT_FOUND.
    pub mig_instances: Vec<MigSpec>,
    /// `nvmlComputeMode_t`.
    pub compute_mode: u32,
    pub persistence_mode: bool,
    pub cuda_capability: (i32, i32),
    pub pcie_link_gen_max: u32,
    pub pcie_link_width_max: u32,

    pub util_gpu_pct: Value,
    pub util_mem_pct: Value,
    pub mem_used_bytes: Value,
    /// `nvmlDeviceGetPowerUsage` and field `NVML_FI_DEV_POWER_AVERAGE`.
    pub power_mw: Value,
    /// Field `NVML_FI_DEV_POWER_INSTANT`.
    pub power_instant_mw: Value,
    pub energy_mj: Value,
    pub temp_gpu_c: Value,
    /// Field `NVML_FI_DEV_MEMORY_TEMP`.
    pub temp_mem_c: Value,
    /// `nvmlDeviceGetNumFans`: 0 for a fanless board, whose fan 0 answers
    /// INVALID_ARGUMENT (as an H200 SXM does).
    pub fans: u32,
    pub fan_pct: Value,
    pub clock_sm_mhz: Value,
    pub clock_mem_mhz: Value,
    pub clock_graphics_mhz: Value,
    /// `nvmlPstates_t` (0–15, 32 unknown).
    pub pstate: Value,
    /// `nvmlDeviceGetPcieThroughput` waits this long (ms) before it answers, outside the
    /// fake's lock, as a real driver samples the link for ~20 ms: calls made on several
    /// threads overlap. 0: at once. (A cost model's wait for the function, e.g. the
    /// `h200` preset's 20 ms, is paid before this one: a scenario uses one or the other.)
    pub pcie_sample_ms: u64,
    /// KiB/s, as NVML reports it.
    pub pcie_tx_kib: Value,
    pub pcie_rx_kib: Value,
    pub ecc_corrected: Value,
    pub ecc_uncorrected: Value,
    pub throttle_reasons: Value,
    pub enc_util_pct: Value,
    pub dec_util_pct: Value,
    /// Per link (index = link id): the cumulative KiB counter of field
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` (`scopeId` = link); `scopeId` UINT_MAX
    /// answers the sum over the `nvlinks` active links. A link past the list counts 0;
    /// a link past `nvlinks` answers NOT_SUPPORTED. All entries of one
    /// `nvmlDeviceGetFieldValues` call read the same index of their [`Value`]s.
    pub nvlink_tx_kib: Vec<Value>,
    /// As `nvlink_tx_kib`, for `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX`.
    pub nvlink_rx_kib: Vec<Value>,

    pub compute_processes: Vec<Process>,
    pub graphics_processes: Vec<Process>,
    /// `nvmlDeviceGetProcessUtilization`: 0 answers one fresh sample per process with a
    /// utilization per call (stamped now, when now is after `lastSeenTimeStamp`). Above
    /// 0, the driver samples each such process every `process_sample_ms` (wall-clock
    /// timestamps, in µs since the Unix epoch, that are multiples of the period) and a call
    /// answers every buffered sample newer than `lastSeenTimeStamp`, oldest first (at most
    /// 4096 entries: the oldest are dropped).
    pub process_sample_ms: u64,
    /// How far back (ms) the driver keeps the samples of `process_sample_ms`: a sample is
    /// answered while it is younger than this.
    pub process_buffer_ms: u64,

    /// Functions this GPU answers `NVML_ERROR_NOT_SUPPORTED`, by their C name
    /// (`nvmlDeviceGetFanSpeed_v2`), `field:<id>` for one field value (every scope), or
    /// `field:<id>:<scopeId>` for one scope of it (an NVLink field's link),
    /// `nvmlDeviceGetNvLinkErrorCounter:<counter>` for one NVLink error counter on every
    /// link or `…:<counter>:<link>` on one (counter: `crc_flit`, `crc_data`, `replay`,
    /// `recovery`).
    pub unsupported: Vec<String>,
    /// The GPU answers `NVML_ERROR_GPU_IS_LOST` from its n-th call (0-based) …
    pub lost_after_calls: Option<u64>,
    /// … for this many calls (for good if unset), then answers again.
    pub lost_for_calls: Option<u64>,
    /// Events its event sets deliver.
    pub events: Vec<EventSpec>,

    /// `nvmlDeviceGetTemperatureThreshold`: slowdown, shutdown, GPU maximum, memory
    /// maximum (°C).
    pub temp_slowdown_c: u32,
    pub temp_shutdown_c: u32,
    pub temp_gpu_max_c: u32,
    pub temp_mem_max_c: u32,
    /// Pages retired for single-bit / double-bit errors (`nvmlDeviceGetRetiredPages`
    /// answers this many pages; one read per count query, the fill answers the same).
    pub retired_pages_sbe: Value,
    pub retired_pages_dbe: Value,
    /// `nvmlDeviceGetRetiredPagesPendingStatus` (0 / 1).
    pub retired_pages_pending: Value,
    /// Fields `NVML_FI_DEV_REMAPPED_COR` / `_UNC` / `_PENDING` / `_FAILURE` (flags 0 / 1).
    pub remapped_rows_correctable: Value,
    pub remapped_rows_uncorrectable: Value,
    pub remapped_rows_pending: Value,
    pub remapped_rows_failed: Value,
    /// `nvmlDeviceGetTotalEccErrors` with `NVML_AGGREGATE_ECC` (lifetime counts);
    /// `nvmlDeviceGetTotalEccErrors:aggregate` in `unsupported` answers NOT_SUPPORTED for
    /// these only.
    pub ecc_corrected_aggregate: Value,
    pub ecc_uncorrected_aggregate: Value,
    /// `nvmlDeviceGetPcieReplayCounter`.
    pub pcie_replay_count: Value,
    /// `nvmlDeviceGetNvLinkErrorCounter`, per link (index = link id; a link past the list
    /// counts 0, a link past `nvlinks` answers NOT_SUPPORTED): DL CRC flit, DL CRC data,
    /// DL replay, DL recovery. Each (link, counter) has its own read count.
    pub nvlink_crc_flit_errors: Vec<Value>,
    pub nvlink_crc_data_errors: Vec<Value>,
    pub nvlink_replay_errors: Vec<Value>,
    pub nvlink_recovery_errors: Vec<Value>,

    /// GPM (`nvmlGpm*`); unset: a GPU before Hopper, without GPM.
    pub gpm: Option<GpmSpec>,
}

impl Default for Gpu {
    fn default() -> Self {
        Self {
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            serial: "1324021000001".into(),
            pci_bus_id: "00000000:07:00.0".into(),
            architecture: 7,
            brand: 2,
            vbios_version: "92.00.45.00.06".into(),
            memory_total_bytes: 80 << 30,
            memory_reserved_bytes: 512 << 20,
            power_limit_default_mw: 400_000,
            power_limit_enforced_mw: 400_000,
            power_limit_min_mw: 100_000,
            power_limit_max_mw: 400_000,
            max_clock_sm_mhz: 1410,
            max_clock_mem_mhz: 1593,
            max_clock_graphics_mhz: 1410,
            nvlinks: 12,
            mig_mode: 0,
            mig_instances: Vec::new(),
            compute_mode: 0,
            persistence_mode: true,
            cuda_capability: (8, 0),
            pcie_link_gen_max: 4,
            pcie_link_width_max: 16,
            util_gpu_pct: 0.into(),
            util_mem_pct: 0.into(),
            mem_used_bytes: 0.into(),
            power_mw: 60_000.into(),
            power_instant_mw: 60_000.into(),
            energy_mj: Value::Ramp {
                start: 1_000_000,
                step: 60_000,
            },
            temp_gpu_c: 30.into(),
            temp_mem_c: 35.into(),
            fans: 1,
            fan_pct: 0.into(),
            clock_sm_mhz: 210.into(),
            clock_mem_mhz: 1593.into(),
            clock_graphics_mhz: 210.into(),
            pstate: 0.into(),
            pcie_sample_ms: 0,
            pcie_tx_kib: 0.into(),
            pcie_rx_kib: 0.into(),
            ecc_corrected: 0.into(),
            ecc_uncorrected: 0.into(),
            throttle_reasons: 1.into(),
            enc_util_pct: 0.into(),
            dec_util_pct: 0.into(),
            nvlink_tx_kib: Vec::new(),
            nvlink_rx_kib: Vec::new(),
            compute_processes: Vec::new(),
            graphics_processes: Vec::new(),
            process_sample_ms: 0,
            process_buffer_ms: 20_000,
            unsupported: Vec::new(),
            lost_after_calls: None,
            lost_for_calls: None,
            events: Vec::new(),
            temp_slowdown_c: 89,
            temp_shutdown_c: 92,
            temp_gpu_max_c: 87,
            temp_mem_max_c: 95,
            retired_pages_sbe: 0.into(),
            retired_pages_dbe: 0.into(),
            retired_pages_pending: 0.into(),
            remapped_rows_correctable: 0.into(),
            remapped_rows_uncorrectable: 0.into(),
            remapped_rows_pending: 0.into(),
            remapped_rows_failed: 0.into(),
            ecc_corrected_aggregate: 0.into(),
            ecc_uncorrected_aggregate: 0.into(),
            pcie_replay_count: 0.into(),
            nvlink_crc_flit_errors: Vec::new(),
            nvlink_crc_data_errors: Vec::new(),
            nvlink_replay_errors: Vec::new(),
            nvlink_recovery_errors: Vec::new(),
            gpm: None,
        }
    }
}

impl Gpu {
    /// Whether `function` (a C name, or `field:<id>`) answers NOT_SUPPORTED.
    pub fn is_unsupported(&self, function: &str) -> bool {
        self.unsupported.iter().any(|u| u == function)
    }

    /// Whether the GPU is lost on its call number `call` (0-based).
    pub fn is_lost_at(&self, call: u64) -> bool {
        in_window(call, self.lost_after_calls, self.lost_for_calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_their_reads() {
        assert_eq!(Value::Const(5).at(9), 5);
        let s = Value::Seq(vec![1, 2, 3]);
        assert_eq!([s.at(0), s.at(2), s.at(7)], [1, 3, 3]);
        assert_eq!(Value::Seq(vec![]).at(0), 0);
        assert_eq!(Value::Ramp { start: 10, step: 5 }.at(3), 25);
    }

    #[test]
    fn lost_window_is_half_open() {
        let g = Gpu {
            lost_after_calls: Some(4),
            lost_for_calls: Some(2),
            ..Gpu::default()
        };
        let lost: Vec<bool> = (0..8).map(|c| g.is_lost_at(c)).collect();
        assert_eq!(lost, [false, false, false, false, true, true, false, false]);
        let forever = Gpu {
            lost_after_calls: Some(1),
            ..Gpu::default()
        };
        assert!(!forever.is_lost_at(0) && forever.is_lost_at(1_000));
    }

    #[test]
    fn scenarios_parse_with_defaults_and_reject_typos() {
        let s: Scenario = serde_json::from_str(
            r#"{"gpus":[{"uuid":"GPU-1","power_mw":[1,2],"energy_mj":{"start":5,"step":1}}]}"#,
        )
        .expect("parses");
        assert_eq!(s.driver_version, "550.54.15");
        assert_eq!(s.gpus[0].power_mw, Value::Seq(vec![1, 2]));
        assert_eq!(s.gpus[0].energy_mj, Value::Ramp { start: 5, step: 1 });
        assert_eq!(s.gpus[0].name, "NVIDIA A100-SXM4-80GB");
        assert!(serde_json::from_str::<Scenario>(r#"{"gpus":[{"powr_mw":1}]}"#).is_err());
    }

    #[test]
    fn the_bundled_scenario_parses() {
        let s: Scenario = serde_json::from_str(include_str!("../scenarios/two-gpus.json"))
            .expect("scenarios/two-gpus.json parses");
        assert_eq!(s.gpus.len(), 2);
        assert!(s.gpus[1].is_unsupported("field:186"));
    }

    #[test]
    fn cost_model_and_buffered_samples_parse_and_validate() {
        let s: Scenario = serde_json::from_str(
            r#"{"cost_model":"h200","costs":{"nvmlDeviceGetPowerUsage":{"cpu_us":5},
                "field:83":{"wait_us":7}},
                "gpus":[{"process_sample_ms":1000,
                         "compute_processes":[{"pid":1,"sm_pct_seq":[10,20]}]}]}"#,
        )
        .expect("parses");
        assert_eq!(s.cost_model.as_deref(), Some("h200"));
        assert_eq!(
            s.costs.get("field:83"),
            Some(&CallCost {
                cpu_us: 0,
                wait_us: 7
            })
        );
        assert_eq!(s.gpus[0].process_sample_ms, 1000);
        assert_eq!(s.gpus[0].process_buffer_ms, 20_000);
        assert_eq!(s.gpus[0].compute_processes[0].sm_pct_seq, [10, 20]);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(Scenario::default().validate(), Ok(()));
        // A typo in a cost is refused by the parser; an unknown preset by `validate`.
        assert!(
            serde_json::from_str::<Scenario>(r#"{"costs":{"nvmlDeviceGetPowerUsage":{"cpu":1}}}"#)
                .is_err()
        );
        let unknown = Scenario {
            cost_model: Some("h100".into()),
            ..Scenario::default()
        };
        assert!(unknown.validate().is_err_and(|e| e.contains("h100")));
    }

    #[test]
    fn windows_are_half_open_and_open_ended_without_a_count() {
        let w: Vec<bool> = (0..6).map(|n| in_window(n, Some(2), Some(3))).collect();
        assert_eq!(w, [false, false, true, true, true, false]);
        assert!(!in_window(0, Some(0), Some(0)));
        assert!(in_window(u64::MAX, Some(5), None));
        assert!(in_window(u64::MAX - 1, Some(u64::MAX - 2), Some(u64::MAX)));
        assert!(!in_window(7, None, Some(3)));
    }

    #[test]
    fn gpm_parses_with_defaults_and_rejects_typos() {
        let s: Scenario = serde_json::from_str(
            r#"{"gpus":[{"architecture":9,"gpm":{"metrics":{"sm_util":[92000,91000],
                "pcie_tx_per_sec":12000},"fail_after_samples":3}},{}]}"#,
        )
        .expect("parses");
        let gpm = s.gpus[0].gpm.as_ref().expect("GPU 0 has GPM");
        assert_eq!(gpm.support_query, "answer");
        assert_eq!(gpm.fail_with, "unknown");
        assert_eq!(
            gpm.metrics.get("sm_util"),
            Some(&Value::Seq(vec![92_000, 91_000]))
        );
        assert_eq!(
            gpm.metrics.get("pcie_tx_per_sec"),
            Some(&Value::Const(12_000))
        );
        assert_eq!(
            (gpm.fail_after_samples, gpm.fail_for_samples),
            (Some(3), None)
        );
        assert!(gpm.mig_metrics.is_empty());
        assert_eq!(s.gpus[1].gpm, None);
        assert_eq!(s.validate(), Ok(()));
        assert!(serde_json::from_str::<Scenario>(r#"{"gpus":[{"gpm":{"metric":{}}}]}"#).is_err());
    }

    #[test]
    fn gpm_names_are_validated() {
        let with = |json: &str| -> Result<(), String> {
            serde_json::from_str::<Scenario>(json)
                .expect("parses")
                .validate()
        };
        let e = with(r#"{"gpus":[{},{"gpm":{"metrics":{"sm_utilization":1}}}]}"#)
            .expect_err("unknown metric");
        assert!(e.contains("sm_utilization") && e.contains("gpus[1]"), "{e}");
        let e = with(r#"{"gpus":[{"gpm":{"fail_with":"busy"}}]}"#).expect_err("bad fail_with");
        assert!(e.contains("busy"), "{e}");
        let e = with(r#"{"gpus":[{"gpm":{"support_query":"yes"}}]}"#).expect_err("bad query");
        assert!(e.contains("yes"), "{e}");
        // A GPU instance's metrics: the key must be one of its GPU instances.
        let mig = r#"{"gpus":[{"mig_mode":1,"mig_instances":[{"gpu_instance_id":2}],
            "gpm":{"mig_metrics":{"KEY":{"sm_util":1000}},"fail_with":"in_use",
                   "support_query":"version_mismatch"}}]}"#;
        assert_eq!(with(mig.replace("KEY", "2").as_str()), Ok(()));
        let e = with(mig.replace("KEY", "7").as_str()).expect_err("no GPU instance 7");
        assert!(e.contains("\"7\""), "{e}");
    }

    #[test]
    fn the_bundled_gpm_scenario_parses_and_validates() {
        let s: Scenario = serde_json::from_str(include_str!("../scenarios/h100-gpm.json"))
            .expect("scenarios/h100-gpm.json parses");
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.gpus.len(), 2);
        let gpm = s.gpus[0].gpm.as_ref().expect("the H100 has GPM");
        assert!(gpm.metrics.len() >= 14, "{:?}", gpm.metrics.keys());
        assert_eq!(s.gpus[0].compute_processes[0].pid, 1101);
        assert_eq!(s.gpus[1].gpm, None);
        assert_eq!(s.gpus[1].architecture, 7);
    }

    #[test]
    fn the_bundled_cost_model_scenario_parses_and_validates() {
        let s: Scenario = serde_json::from_str(include_str!("../scenarios/h200-cost-model.json"))
            .expect("scenarios/h200-cost-model.json parses");
        assert_eq!(s.validate(), Ok(()));
        assert!(s.gpus[0].process_sample_ms > 0);
    }
}
