//! The metric families the collector exposes on `/metrics` and pushes by remote-write,
//! owned by neither: each GPU family's name, type, help and how its value is read from a
//! sample, the value type both encode, and the text encoding of one value.

use gpufleet_core::{GpmMetrics, GpuSample};
use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::fmt;

/// A sample value: integers stay integers in the text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl Num {
    /// The value as a float (remote-write's sample type).
    pub fn to_f64(self) -> f64 {
        match self {
            Num::U(v) => v as f64,
            Num::I(v) => v as f64,
            Num::F(v) => v,
        }
    }
}

pub type GpuValue = fn(&GpuSample) -> Option<Num>;
pub type GpmValue = fn(&GpmMetrics) -> Option<Num>;

/// A percentage as a 0..1 ratio.
fn pct(v: Option<u32>) -> Option<Num> {
    v.map(|v| Num::F(f64::from(v) / 100.0))
}

/// Hundredths of a percent (GPM) as a 0..1 ratio.
fn cpct(v: Option<u32>) -> Option<Num> {
    v.map(|v| Num::F(f64::from(v) / 10_000.0))
}

/// Thousandths (mW, mJ) as units.
fn milli(v: Option<u32>) -> Option<Num> {
    v.map(|v| Num::F(f64::from(v) / 1000.0))
}

/// MHz as hertz.
fn mhz(v: Option<u32>) -> Option<Num> {
    v.map(|v| Num::U(u64::from(v) * 1_000_000))
}

/// A count or a quantity in base units, as it is.
pub fn num(v: Option<u64>) -> Option<Num> {
    v.map(Num::U)
}

/// A 32-bit quantity in base units, as it is.
fn int(v: Option<u32>) -> Option<Num> {
    v.map(|v| Num::U(u64::from(v)))
}

/// Per-GPU families: name (counters without `_total`: the encoder adds it), type, help,
/// value.
pub const GPU_FAMILIES: &[(&str, &str, &str, GpuValue)] = &[
    (
        "gpufleet_gpu_utilization_ratio",
        "gauge",
        "GPU (SM) utilization, 0..1.",
        |s| pct(s.util_gpu_pct),
    ),
    (
        "gpufleet_gpu_memory_utilization_ratio",
        "gauge",
        "Memory controller utilization, 0..1.",
        |s| pct(s.util_mem_pct),
    ),
    (
        "gpufleet_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use.",
        |s| num(s.mem_used_bytes),
    ),
    (
        "gpufleet_gpu_memory_total_bytes",
        "gauge",
        "GPU memory in total.",
        |s| num(s.mem_total_bytes),
    ),
    (
        "gpufleet_gpu_power_watts",
        "gauge",
        "Power draw as NVML reports it (a 1 s average on Ampere and newer).",
        |s| milli(s.power_mw),
    ),
    (
        "gpufleet_gpu_power_instant_watts",
        "gauge",
        "Instantaneous power draw.",
        |s| milli(s.power_instant_mw),
    ),
    (
        "gpufleet_gpu_power_limit_watts",
        "gauge",
        "Enforced power limit.",
        |s| milli(s.power_limit_mw),
    ),
    (
        "gpufleet_gpu_energy_joules",
        "counter",
        "Energy since the driver loaded (resets with it).",
        |s| s.energy_mj.map(|v| Num::F(v as f64 / 1000.0)),
    ),
    (
        "gpufleet_gpu_temperature_celsius",
        "gauge",
        "GPU temperature.",
        |s| int(s.temp_gpu_c),
    ),
    (
        "gpufleet_gpu_memory_temperature_celsius",
        "gauge",
        "Memory temperature.",
        |s| int(s.temp_mem_c),
    ),
    (
        "gpufleet_gpu_fan_speed_ratio",
        "gauge",
        "Fan speed, 0..1.",
        |s| pct(s.fan_pct),
    ),
    ("gpufleet_gpu_sm_clock_hertz", "gauge", "SM clock.", |s| {
        mhz(s.clock_sm_mhz)
    }),
    (
        "gpufleet_gpu_memory_clock_hertz",
        "gauge",
        "Memory clock.",
        |s| mhz(s.clock_mem_mhz),
    ),
    (
        "gpufleet_gpu_graphics_clock_hertz",
        "gauge",
        "Graphics clock.",
        |s| mhz(s.clock_graphics_mhz),
    ),
    (
        "gpufleet_gpu_pstate",
        "gauge",
        "Performance state (0 = P0, fastest).",
        |s| int(s.pstate),
    ),
    (
        "gpufleet_gpu_pcie_transmit_bytes_per_second",
        "gauge",
        "PCIe transmit throughput.",
        |s| num(s.pcie_tx_bps),
    ),
    (
        "gpufleet_gpu_pcie_receive_bytes_per_second",
        "gauge",
        "PCIe receive throughput.",
        |s| num(s.pcie_rx_bps),
    ),
    (
        "gpufleet_gpu_nvlink_transmit_bytes_per_second",
        "gauge",
        "NVLink transmit throughput, all links.",
        |s| num(s.nvlink_tx_bps),
    ),
    (
        "gpufleet_gpu_nvlink_receive_bytes_per_second",
        "gauge",
        "NVLink receive throughput, all links.",
        |s| num(s.nvlink_rx_bps),
    ),
    (
        "gpufleet_gpu_ecc_corrected_errors",
        "gauge",
        "Volatile corrected ECC errors (since the driver loaded).",
        |s| num(s.ecc_corrected_volatile),
    ),
    (
        "gpufleet_gpu_ecc_uncorrected_errors",
        "gauge",
        "Volatile uncorrected ECC errors (since the driver loaded).",
        |s| num(s.ecc_uncorrected_volatile),
    ),
    (
        "gpufleet_gpu_throttle_reasons",
        "gauge",
        "NVML clock event (throttle) reason bit mask.",
        |s| num(s.throttle_reasons),
    ),
    (
        "gpufleet_gpu_encoder_utilization_ratio",
        "gauge",
        "Video encoder utilization, 0..1.",
        |s| pct(s.enc_util_pct),
    ),
    (
        "gpufleet_gpu_decoder_utilization_ratio",
        "gauge",
        "Video decoder utilization, 0..1.",
        |s| pct(s.dec_util_pct),
    ),
    (
        "gpufleet_gpu_sm_active_ratio",
        "gauge",
        "SMs with at least one warp resident, 0..1 (GPM, Hopper and newer).",
        |s| cpct(s.gpm.sm_active_cpct),
    ),
    (
        "gpufleet_gpu_sm_occupancy_ratio",
        "gauge",
        "Resident warps of the SMs' maximum, 0..1 (GPM).",
        |s| cpct(s.gpm.sm_occupancy_cpct),
    ),
    (
        "gpufleet_gpu_tensor_active_ratio",
        "gauge",
        "Any tensor-core pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.tensor_active_cpct),
    ),
    (
        "gpufleet_gpu_tensor_hmma_active_ratio",
        "gauge",
        "Half-precision (HMMA) tensor pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.tensor_hmma_cpct),
    ),
    (
        "gpufleet_gpu_tensor_imma_active_ratio",
        "gauge",
        "Integer (IMMA) tensor pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.tensor_imma_cpct),
    ),
    (
        "gpufleet_gpu_tensor_dfma_active_ratio",
        "gauge",
        "Double-precision (DFMA) tensor pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.tensor_dfma_cpct),
    ),
    (
        "gpufleet_gpu_dram_active_ratio",
        "gauge",
        "DRAM bandwidth used, of its peak, 0..1 (GPM).",
        |s| cpct(s.gpm.dram_bw_cpct),
    ),
    (
        "gpufleet_gpu_fp64_active_ratio",
        "gauge",
        "FP64 pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.fp64_cpct),
    ),
    (
        "gpufleet_gpu_fp32_active_ratio",
        "gauge",
        "FP32 pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.fp32_cpct),
    ),
    (
        "gpufleet_gpu_fp16_active_ratio",
        "gauge",
        "FP16 pipe active, 0..1 (GPM).",
        |s| cpct(s.gpm.fp16_cpct),
    ),
    (
        "gpufleet_gpu_gpm_pcie_transmit_bytes_per_second",
        "gauge",
        "PCIe transmit throughput as GPM counts it.",
        |s| num(s.gpm.pcie_tx_bps),
    ),
    (
        "gpufleet_gpu_gpm_pcie_receive_bytes_per_second",
        "gauge",
        "PCIe receive throughput as GPM counts it.",
        |s| num(s.gpm.pcie_rx_bps),
    ),
    (
        "gpufleet_gpu_gpm_nvlink_transmit_bytes_per_second",
        "gauge",
        "NVLink transmit throughput, all links, as GPM counts it.",
        |s| num(s.gpm.nvlink_tx_bps),
    ),
    (
        "gpufleet_gpu_gpm_nvlink_receive_bytes_per_second",
        "gauge",
        "NVLink receive throughput, all links, as GPM counts it.",
        |s| num(s.gpm.nvlink_rx_bps),
    ),
];

/// Per-MIG-instance GPM families (labelled with the GPU's labels and `mig_uuid`,
/// `gpu_instance`): name, help, value.
pub const MIG_GPM_FAMILIES: &[(&str, &str, GpmValue)] = &[
    (
        "gpufleet_mig_sm_active_ratio",
        "SMs with at least one warp resident, 0..1 (GPM, Hopper and newer).",
        |g| cpct(g.sm_active_cpct),
    ),
    (
        "gpufleet_mig_sm_occupancy_ratio",
        "Resident warps of the SMs' maximum, 0..1 (GPM).",
        |g| cpct(g.sm_occupancy_cpct),
    ),
    (
        "gpufleet_mig_tensor_active_ratio",
        "Any tensor-core pipe active, 0..1 (GPM).",
        |g| cpct(g.tensor_active_cpct),
    ),
    (
        "gpufleet_mig_tensor_hmma_active_ratio",
        "Half-precision (HMMA) tensor pipe active, 0..1 (GPM).",
        |g| cpct(g.tensor_hmma_cpct),
    ),
    (
        "gpufleet_mig_tensor_imma_active_ratio",
        "Integer (IMMA) tensor pipe active, 0..1 (GPM).",
        |g| cpct(g.tensor_imma_cpct),
    ),
    (
        "gpufleet_mig_tensor_dfma_active_ratio",
        "Double-precision (DFMA) tensor pipe active, 0..1 (GPM).",
        |g| cpct(g.tensor_dfma_cpct),
    ),
    (
        "gpufleet_mig_dram_active_ratio",
        "DRAM bandwidth used, of its peak, 0..1 (GPM).",
        |g| cpct(g.dram_bw_cpct),
    ),
    (
        "gpufleet_mig_fp64_active_ratio",
        "FP64 pipe active, 0..1 (GPM).",
        |g| cpct(g.fp64_cpct),
    ),
    (
        "gpufleet_mig_fp32_active_ratio",
        "FP32 pipe active, 0..1 (GPM).",
        |g| cpct(g.fp32_cpct),
    ),
    (
        "gpufleet_mig_fp16_active_ratio",
        "FP16 pipe active, 0..1 (GPM).",
        |g| cpct(g.fp16_cpct),
    ),
    (
        "gpufleet_mig_gpm_pcie_transmit_bytes_per_second",
        "PCIe transmit throughput as GPM counts it.",
        |g| num(g.pcie_tx_bps),
    ),
    (
        "gpufleet_mig_gpm_pcie_receive_bytes_per_second",
        "PCIe receive throughput as GPM counts it.",
        |g| num(g.pcie_rx_bps),
    ),
    (
        "gpufleet_mig_gpm_nvlink_transmit_bytes_per_second",
        "NVLink transmit throughput, all links, as GPM counts it.",
        |g| num(g.nvlink_tx_bps),
    ),
    (
        "gpufleet_mig_gpm_nvlink_receive_bytes_per_second",
        "NVLink receive throughput, all links, as GPM counts it.",
        |g| num(g.nvlink_rx_bps),
    ),
];

/// Encodes one value of a family (a counter's as a float counter; a gauge's as an integer
/// when it is one).
pub fn value(e: &mut MetricEncoder, kind: MetricType, v: Num) -> fmt::Result {
    match (kind, v) {
        (MetricType::Counter, Num::U(v)) => e.encode_counter::<NoLabelSet, _, f64>(&v, None),
        (MetricType::Counter, Num::I(v)) => {
            e.encode_counter::<NoLabelSet, _, f64>(&u64::try_from(v).unwrap_or(0), None)
        }
        (MetricType::Counter, Num::F(v)) => e.encode_counter::<NoLabelSet, _, f64>(&v, None),
        // prometheus-client refuses gauges above i64::MAX (a bit mask, a wild counter).
        (_, Num::U(v)) => match i64::try_from(v) {
            Ok(v) => e.encode_gauge(&v),
            Err(_) => e.encode_gauge(&(v as f64)),
        },
        (_, Num::I(v)) => e.encode_gauge(&v),
        (_, Num::F(v)) => e.encode_gauge(&v),
    }
}
