//! Health counters: retired pages, row remapping, lifetime ECC counts, the PCIe replay
//! counter, NVLink error counters (summed over the active links) and persistence mode.
//! They change rarely, so they are read every health interval and on the tick after an
//! Xid / ECC / GPU-lost event, never on the per-tick path. Each is absent where NVML
//! answers NOT_SUPPORTED (and not asked again on that GPU), never 0. NVLink counters keep
//! that per counter and link: the CRC count is the flit and data CRC summed over what is
//! supported (Hopper: flit only), and absent for a read where any link failed.

use super::device::{DeviceState, Metric};
use super::device::{attempt, read};
use super::fields::field_values_scoped;
use super::mapping::{FieldKey, REMAP_FIELDS, Reading, field_readings, link_total, remap_from};
use gpufleet_core::{GpuHealthSample, UnixMs};
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use std::time::Duration;

/// The agent's default `--health-interval`.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);

/// When health is read: the first tick, every interval of tick time, and the tick after
/// one that carried an Xid / ECC / GPU-lost event.
#[derive(Debug, Clone)]
pub(super) struct HealthSchedule {
    every_ms: i64,
    last_ms: Option<UnixMs>,
    after_event: bool,
}

impl HealthSchedule {
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every_ms: i64::try_from(every.as_millis()).unwrap_or(i64::MAX).max(1),
            last_ms: None,
            after_event: false,
        }
    }

    /// Whether the tick at `now_ms` reads health (and, if so, notes it as read).
    pub(super) fn due(&mut self, now_ms: UnixMs) -> bool {
        let due = self.after_event
            || self
                .last_ms
                .is_none_or(|last| now_ms < last || now_ms - last >= self.every_ms);
        if due {
            self.last_ms = Some(now_ms);
            self.after_event = false;
        }
        due
    }

    /// The tick just built carried an Xid / ECC / GPU-lost event: read health next tick.
    pub(super) fn event_seen(&mut self) {
        self.after_event = true;
    }
}

/// One GPU's health counters (the GPU must not be lost: its values would all be absent).
pub(super) fn read_health(dev: &mut DeviceState<'_>, timer: &mut CallTimer) -> GpuHealthSample {
    let count = |v: Vec<_>| u32::try_from(v.len()).unwrap_or(u32::MAX);
    let retired_pages_sbe = read(dev, timer, Metric::RetiredSbe, |d| {
        d.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
    })
    .map(count);
    let retired_pages_dbe = read(dev, timer, Metric::RetiredDbe, |d| {
        d.retired_pages(RetirementCause::DoubleBitEccError)
    })
    .map(count);
    let retired_pages_pending = read(dev, timer, Metric::RetiredPending, |d| {
        d.are_pages_pending_retired()
    });
    let keys: Vec<FieldKey> = REMAP_FIELDS
        .iter()
        .map(|&field| FieldKey { field, scope: 0 })
        .collect();
    let remap = read(dev, timer, Metric::RemappedRows, |d| {
        field_values_scoped(d, &keys)
    })
    .map(|samples| {
        let (values, unsupported) = field_readings(&keys, &samples);
        if unsupported.len() == keys.len() {
            // The call answers, each entry NOT_SUPPORTED: not asked again either.
            dev.unsupported.insert(Metric::RemappedRows);
        }
        remap_from(&values)
    })
    .unwrap_or_default();
    let ecc_corrected_aggregate = read(dev, timer, Metric::EccCorrectedAggregate, |d| {
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Aggregate)
    });
    let ecc_uncorrected_aggregate = read(dev, timer, Metric::EccUncorrectedAggregate, |d| {
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
    });
    let pcie_replay_count =
        read(dev, timer, Metric::PcieReplay, |d| d.pcie_replay_counter()).map(u64::from);
    let crc_flit = link_readings(dev, timer, Metric::NvlinkCrcFlit, ErrorCounter::DlCrcFlit);
    let crc_data = link_readings(dev, timer, Metric::NvlinkCrcData, ErrorCounter::DlCrcData);
    let nvlink_crc_errors = link_total(crc_flit.iter().chain(&crc_data));
    let nvlink_replay_errors = link_total(&link_readings(
        dev,
        timer,
        Metric::NvlinkReplay,
        ErrorCounter::DlReplay,
    ));
    let nvlink_recovery_errors = link_total(&link_readings(
        dev,
        timer,
        Metric::NvlinkRecovery,
        ErrorCounter::DlRecovery,
    ));
    let persistence_mode = read(dev, timer, Metric::Persistence, |d| {
        d.is_in_persistent_mode()
    });
    GpuHealthSample {
        gpu_uuid: dev.uuid.clone(),
        retired_pages_sbe,
        retired_pages_dbe,
        retired_pages_pending,
        remapped_rows_correctable: remap.correctable,
        remapped_rows_uncorrectable: remap.uncorrectable,
        remapped_rows_pending: remap.pending,
        remapped_rows_failed: remap.failed,
        ecc_corrected_aggregate,
        ecc_uncorrected_aggregate,
        pcie_replay_count,
        nvlink_crc_errors,
        nvlink_replay_errors,
        nvlink_recovery_errors,
        persistence_mode,
    }
}

/// NVLink error counter `counter` on each active link not known to lack it (a link's
/// NOT_SUPPORTED is remembered for that link and counter only); nothing once the GPU is
/// lost, and a `Lost` reading when it is lost on the way.
fn link_readings(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    metric: Metric,
    counter: ErrorCounter,
) -> Vec<Reading<u64>> {
    let mut readings = Vec::with_capacity(dev.links.len());
    for link in dev.links.clone() {
        if dev.lost {
            readings.push(Reading::Lost);
            break;
        }
        if dev
            .nvlink_unsupported
            .get(&link)
            .is_some_and(|s| s.contains(metric))
        {
            continue;
        }
        let r = attempt(dev, timer, metric, |d| {
            d.link_wrapper_for(link).error_counter(counter)
        });
        if let Reading::Unsupported(_) = r {
            dev.nvlink_unsupported
                .entry(link)
                .or_default()
                .insert(metric);
        }
        readings.push(r);
    }
    readings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_due_first_then_every_interval_and_after_an_event() {
        let mut s = HealthSchedule::new(Duration::from_secs(30));
        let due: Vec<bool> = [0, 1_000, 29_999, 30_000, 31_000]
            .iter()
            .map(|&t| s.due(1_000_000 + t))
            .collect();
        assert_eq!(due, [true, false, false, true, false]);
        s.event_seen();
        assert!(s.due(1_032_000), "the tick after an event");
        assert!(!s.due(1_033_000), "once");
        assert!(s.due(1_000), "the clock went back");
    }
}
