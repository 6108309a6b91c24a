//! Per-GPU state kept between ticks: its handle, what it does not support, and the
//! counters rates are taken from.

use super::mapping::{FieldKey, Reading, classify};
use gpufleet_core::{GpmMetrics, MigInstance, NvLinkSample, UnixMs};
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, GpmSample};
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A per-tick NVML query; the unit of "unsupported, don't ask again".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Metric {
    Utilization,
    Memory,
    Power,
    PowerLimit,
    Energy,
    TempGpu,
    Fan,
    ClockSm,
    ClockMem,
    ClockGraphics,
    Pstate,
    PcieTx,
    PcieRx,
    EccCorrected,
    EccUncorrected,
    Throttle,
    Encoder,
    Decoder,
    ComputeProcs,
    GraphicsProcs,
    ProcessUtil,
    FieldValues,
    // Health counters (read every health interval, not every tick).
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    RemappedRows,
    EccCorrectedAggregate,
    EccUncorrectedAggregate,
    PcieReplay,
    NvlinkCrcFlit,
    NvlinkCrcData,
    NvlinkReplay,
    NvlinkRecovery,
    Persistence,
}

impl Metric {
    /// The call's name, as it appears in logs and in `slowest_calls_us`.
    pub(super) fn call(self) -> &'static str {
        match self {
            Self::Utilization => "utilization_rates",
            Self::Memory => "memory_info",
            Self::Power => "power_usage",
            Self::PowerLimit => "enforced_power_limit",
            Self::Energy => "total_energy_consumption",
            Self::TempGpu => "temperature",
            Self::Fan => "fan_speed",
            Self::ClockSm => "clock_info.sm",
            Self::ClockMem => "clock_info.mem",
            Self::ClockGraphics => "clock_info.graphics",
            Self::Pstate => "performance_state",
            Self::PcieTx => "pcie_throughput.tx",
            Self::PcieRx => "pcie_throughput.rx",
            Self::EccCorrected => "total_ecc_errors.corrected",
            Self::EccUncorrected => "total_ecc_errors.uncorrected",
            Self::Throttle => "current_throttle_reasons",
            Self::Encoder => "encoder_utilization",
            Self::Decoder => "decoder_utilization",
            Self::ComputeProcs => "running_compute_processes",
            Self::GraphicsProcs => "running_graphics_processes",
            Self::ProcessUtil => "process_utilization_stats",
            Self::FieldValues => "field_values",
            Self::RetiredSbe => "retired_pages.sbe",
            Self::RetiredDbe => "retired_pages.dbe",
            Self::RetiredPending => "are_pages_pending_retired",
            Self::RemappedRows => "field_values.remapped_rows",
            Self::EccCorrectedAggregate => "total_ecc_errors.corrected_aggregate",
            Self::EccUncorrectedAggregate => "total_ecc_errors.uncorrected_aggregate",
            Self::PcieReplay => "pcie_replay_counter",
            Self::NvlinkCrcFlit => "nvlink_error_counter.crc_flit",
            Self::NvlinkCrcData => "nvlink_error_counter.crc_data",
            Self::NvlinkReplay => "nvlink_error_counter.replay",
            Self::NvlinkRecovery => "nvlink_error_counter.recovery",
            Self::Persistence => "is_in_persistent_mode",
        }
    }

    fn bit(self) -> u64 {
        1 << (self as u32)
    }
}

/// A set of [`Metric`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct MetricSet(u64);

impl MetricSet {
    pub(super) fn contains(self, m: Metric) -> bool {
        self.0 & m.bit() != 0
    }

    pub(super) fn insert(&mut self, m: Metric) {
        self.0 |= m.bit();
    }
}

/// One GPU: its cached handle and what we learned about it.
pub(super) struct DeviceState<'n> {
    /// The handle, looked up once.
    pub(super) device: Device<'n>,
    /// NVML index.
    pub(super) index: u32,
    /// UUID: the key of all its samples.
    pub(super) uuid: String,
    /// Metrics this device answered NOT_SUPPORTED (or no permission) for: never asked again.
    pub(super) unsupported: MetricSet,
    /// Metrics whose transient failure was already logged at `warn` (later ones: `debug`).
    pub(super) warned: MetricSet,
    /// Where the last window of per-process utilization completed ended (µs of wall
    /// time; 0: none yet): the next fetch asks for samples after it (see `held`).
    pub(super) util_seen_us: u64,
    /// The volatile ECC counts (corrected, uncorrected) as last read: the ticks between
    /// two reads carry them.
    pub(super) ecc_last: (Option<u64>, Option<u64>),
    /// The PCIe rates (TX, RX, bytes/s) as last read: the ticks between carry them.
    pub(super) pcie_last: [Option<u64>; 2],
    /// The per-link NVLink rates as last read: the ticks between carry them.
    pub(super) nvlinks_last: Vec<NvLinkSample>,
    /// The device fell off the bus: its values are absent; a `GpuLost` event was sent.
    /// Probed once per tick until it answers again.
    pub(super) lost: bool,
    /// Entries still asked in the batched field-value call (an entry the device answers
    /// NOT_SUPPORTED for is removed).
    pub(super) fields: Vec<FieldKey>,
    /// Its active NVLink links, found once.
    pub(super) links: Vec<u32>,
    /// Beside each entry of `fields`: the previous reading (KiB, tick time) of an NVLink
    /// counter, for its rate.
    pub(super) field_prev: Vec<Option<(u64, UnixMs)>>,
    /// The field-value call's buffer, kept between ticks.
    pub(super) field_buf: Vec<nvmlFieldValue_t>,
    /// Per active link, the NVLink error counters it answered NOT_SUPPORTED for: not asked
    /// again on that link (each counter, each link its own: Hopper has no data CRC).
    pub(super) nvlink_unsupported: BTreeMap<u32, MetricSet>,
    /// Its MIG devices (MIG enabled), found once.
    pub(super) migs: Vec<MigDevice<'n>>,
    /// The enforced power limit as last read, and when (tick time): it changes only when
    /// an administrator sets it, so it is read every [`POWER_LIMIT_EVERY_MS`]; absent
    /// when that read gave nothing.
    pub(super) power_limit: Option<(Option<u32>, UnixMs)>,
    /// How many entries the compute, graphics and utilization lists held last tick (the
    /// next call's buffer is sized from it: see `lists`).
    pub(super) list_hints: [u32; 3],
    /// Its GPM windows and readings (see `gpm`).
    pub(super) gpm: GpmState<'n>,
    /// Its PCIe throughput calls waited last tick (the driver samples the link): they are
    /// made side by side with the other GPUs' at the start of the next (see `pcie`).
    pub(super) pcie_waits: bool,
}

/// How often the enforced power limit is read again (ms of tick time).
pub(super) const POWER_LIMIT_EVERY_MS: UnixMs = 30_000;

impl DeviceState<'_> {
    /// Forgets the readings ticks carry between two reads (the GPU was lost: nothing
    /// cached is reported for it; all are read again once it answers).
    pub(super) fn forget_cached(&mut self) {
        self.power_limit = None;
        self.ecc_last = (None, None);
        self.pcie_last = [None; 2];
        self.nvlinks_last.clear();
        self.gpm.forget();
    }

    /// Whether the power limit is to be read at tick time `now_ms`: never read yet, read
    /// [`POWER_LIMIT_EVERY_MS`] ago or more, or the clock went back.
    pub(super) fn power_limit_due(&self, now_ms: UnixMs) -> bool {
        self.power_limit
            .is_none_or(|(_, at)| now_ms < at || now_ms - at >= POWER_LIMIT_EVERY_MS)
    }
}

/// One GPM series (a GPU, or one of its MIG instances): its open window and last reading.
#[derive(Default)]
pub(super) struct Window<'n> {
    /// The sample the next window starts from, and when (tick time) it was taken.
    pub(super) start: Option<(GpmSample<'n>, UnixMs)>,
    /// NOT_SUPPORTED was answered: never asked again.
    pub(super) unsupported: bool,
    /// The last reading, carried by the ticks between reads.
    pub(super) last: GpmMetrics,
}

/// What a GPU knows about its GPM (read by `gpm`).
#[derive(Default)]
pub(super) struct GpmState<'n> {
    pub(super) whole: Window<'n>,
    /// Per MIG device (same order as `DeviceState::migs`).
    pub(super) migs: Vec<Window<'n>>,
    /// A profiler held the counters at this tick time: not asked again for
    /// `gpm::PROFILER_RETRY_MS`.
    pub(super) busy_since: Option<UnixMs>,
    /// The support query's answer, for the log when sampling disagrees.
    pub(super) query: Option<Result<bool, String>>,
    /// A failure was logged at `warn` (later ones: `debug`).
    pub(super) warned: bool,
}

impl GpmState<'_> {
    /// Forgets the windows and readings (the GPU was lost, or GPM failed).
    pub(super) fn forget(&mut self) {
        for w in std::iter::once(&mut self.whole).chain(&mut self.migs) {
            w.start = None;
            w.last = GpmMetrics::default();
        }
    }
}

/// A MIG device of a GPU.
pub(super) struct MigDevice<'n> {
    /// Its handle, for its process list.
    pub(super) device: Device<'n>,
    /// What the inventory reports.
    pub(super) info: MigInstance,
}

/// Calls NVML for `metric` unless the device said it does not support it; times the call
/// and turns its error into an absent value (remembering NOT_SUPPORTED).
pub(super) fn read<'n, T>(
    dev: &mut DeviceState<'n>,
    timer: &mut CallTimer,
    metric: Metric,
    call: impl FnOnce(&Device<'n>) -> Result<T, NvmlError>,
) -> Option<T> {
    if dev.lost || dev.unsupported.contains(metric) {
        return None;
    }
    let reading = attempt(dev, timer, metric, call);
    value_of(dev, metric, reading)
}

/// The value of a reading of `metric`, remembering NOT_SUPPORTED.
pub(super) fn value_of<T>(
    dev: &mut DeviceState<'_>,
    metric: Metric,
    reading: Reading<T>,
) -> Option<T> {
    match reading {
        Reading::Value(v) => Some(v),
        Reading::Unsupported(_) => {
            dev.unsupported.insert(metric);
            None
        }
        Reading::Lost | Reading::Failed(_) => None,
    }
}

/// One NVML call for `metric`, timed and logged, its answer classified: a lost GPU is
/// marked lost; remembering NOT_SUPPORTED is the caller's (per metric, or per NVLink).
pub(super) fn attempt<'n, T>(
    dev: &mut DeviceState<'n>,
    timer: &mut CallTimer,
    metric: Metric,
    call: impl FnOnce(&Device<'n>) -> Result<T, NvmlError>,
) -> Reading<T> {
    let start = Instant::now();
    let result = call(&dev.device);
    settle(dev, timer, metric, result, start.elapsed())
}

/// The answer of a call already made (and how long it took): timed into `timer`, logged,
/// classified; a lost GPU is marked lost. See [`attempt`].
pub(super) fn settle<T>(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    metric: Metric,
    result: Result<T, NvmlError>,
    took: Duration,
) -> Reading<T> {
    timer.record(dev.index, metric.call(), took);
    let reading = classify(result);
    match &reading {
        Reading::Value(_) => {}
        Reading::Unsupported(why) => {
            debug!(gpu = dev.index, call = metric.call(), reason = %why, "not supported; the value stays absent");
        }
        Reading::Lost => {
            dev.lost = true;
            warn!(gpu = dev.index, uuid = %dev.uuid, call = metric.call(), "GPU lost; its values are absent from now on");
        }
        Reading::Failed(why) => {
            if dev.warned.contains(metric) {
                debug!(gpu = dev.index, call = metric.call(), error = %why, "NVML call failed");
            } else {
                dev.warned.insert(metric);
                warn!(gpu = dev.index, call = metric.call(), error = %why, "NVML call failed; the value is absent this tick (further failures logged at debug)");
            }
        }
    }
    reading
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sets_remember_members() {
        let mut s = MetricSet::default();
        assert!(!s.contains(Metric::Fan));
        s.insert(Metric::Fan);
        s.insert(Metric::ProcessUtil);
        assert!(s.contains(Metric::Fan) && s.contains(Metric::ProcessUtil));
        assert!(!s.contains(Metric::Power));
        s.insert(Metric::Persistence);
        assert!(s.contains(Metric::Persistence) && !s.contains(Metric::NvlinkRecovery));
    }
}
