//! PCIe throughput, read side by side when the driver makes it wait.
//!
//! `nvmlDeviceGetPcieThroughput` samples the link for about 20 ms per call on a real
//! driver (0.6 ms of CPU, the rest waiting; measured on an H200), so a tick reading TX and
//! RX of 8 GPUs one after the other lasts a third of a second, longer than a 100 ms
//! interval. Once a GPU's calls are seen to wait, its two calls of each tick are made on
//! threads of their own at the start of the tick, every such GPU's together, and the tick
//! waits for the slowest alone. Calls that answer at once (the fake, drivers that keep
//! the rate) stay inline: a thread would cost more than the call.
//!
//! NVML's PCIe byte counters (fields `PCIE_COUNT_TX_BYTES` / `RX_BYTES`) answer without
//! the wait, but they are 32-bit and wrap every 4 GiB, several times a second under load
//! on an H100 (BENCHMARKS.md): rates cannot be derived from them.

use super::device::{DeviceState, Metric};
use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::error::NvmlError;
use std::time::{Duration, Instant};

/// The two PCIe calls of a tick: the metric each is remembered under, and its counter.
pub(super) const PCIE: [(Metric, PcieUtilCounter); 2] = [
    (Metric::PcieTx, PcieUtilCounter::Send),
    (Metric::PcieRx, PcieUtilCounter::Receive),
];

/// A PCIe call that takes this long was waiting, not working.
pub(super) const WAITS: Duration = Duration::from_millis(2);

/// An answer (KiB/s) and how long its call took.
pub(super) type Timed = (Result<u32, NvmlError>, Duration);

/// One GPU's PCIe answers read at the start of a tick, in [`PCIE`] order; a call not made
/// there (unsupported, no thread) is absent and made inline.
#[derive(Debug)]
pub(super) struct PcieAnswers([Option<Timed>; 2]);

impl PcieAnswers {
    /// The answer for `metric`, once.
    pub(super) fn take(&mut self, metric: Metric) -> Option<Timed> {
        let k = PCIE.iter().position(|(m, _)| *m == metric)?;
        self.0.get_mut(k)?.take()
    }
}

/// Per device, in order: its PCIe answers, read side by side, for each GPU whose calls
/// were seen to wait and that is not lost; `None` for the others (read inline). Empty
/// when no GPU's calls wait. A thread that cannot be started leaves its call inline.
pub(super) fn read_side_by_side(devices: &[DeviceState<'_>]) -> Vec<Option<PcieAnswers>> {
    if !devices.iter().any(|d| d.pcie_waits && !d.lost) {
        return Vec::new();
    }
    std::thread::scope(|scope| {
        let started: Vec<_> = devices
            .iter()
            .map(|dev| {
                let wanted = dev.pcie_waits && !dev.lost;
                PCIE.map(|(metric, counter)| {
                    if !wanted || dev.unsupported.contains(metric) {
                        return None;
                    }
                    let device = &dev.device;
                    std::thread::Builder::new()
                        .name("nvml-pcie".into())
                        .spawn_scoped(scope, move || {
                            let start = Instant::now();
                            (device.pcie_throughput(counter), start.elapsed())
                        })
                        .ok()
                })
            })
            .collect();
        started
            .into_iter()
            .map(|calls| {
                let answers = calls.map(|call| call.and_then(|c| c.join().ok()));
                answers
                    .iter()
                    .any(Option::is_some)
                    .then_some(PcieAnswers(answers))
            })
            .collect()
    })
}
