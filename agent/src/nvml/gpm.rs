//! GPU Performance Monitoring (GPM, Hopper and newer): SM activity and occupancy, tensor
//! and FP pipe activity, DRAM bandwidth, PCIe and NVLink traffic, per GPU and per MIG
//! instance, without the profiling counters DCGM's profiling fields take (which clash
//! with Nsight and CUPTI).
//!
//! GPM gives a figure over the window between two samples: each read takes a sample and
//! asks the metrics between it and the previous one, which it then replaces, so each
//! reading covers the whole time since the last (no gaps) and is carried by the ticks
//! between reads, like the PCIe rates. The first read only starts a window; a read less
//! than [`MIN_WINDOW_MS`] after the last (by tick time, the wall clock the ticks are
//! stamped with) keeps the window open; a clock that went back starts a new one.
//!
//! Support is decided by the sample call's own answer: NOT_SUPPORTED (or a missing
//! symbol) means no GPM on that GPU (or MIG instance), for good. The support query is
//! asked once and only logged beside it: one binding's version bug made it answer an
//! error (or "no") on GPUs that sample fine, and a wrong answer there must not hide GPM.
//! A metric the GPU does not give (per-metric NOT_SUPPORTED) is absent, never 0.
//!
//! A profiler (Nsight Compute, DCGM's profiling module) holding the counters makes the
//! sample call answer IN_USE: that is logged once, GPM is absent and asked again after
//! [`PROFILER_RETRY_MS`] of tick time. Any other failure makes this read's GPM absent and restarts the
//! window; it never costs the rest of the tick.

use super::NO_INSTANCE_ID;
use super::device::{DeviceState, MigDevice, Window};
use gpufleet_core::{GpmMetrics, MigGpm, UnixMs};
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::gpm::GpmMetricResult;
use std::time::Instant;
use tracing::{debug, info, warn};

/// The shortest window a GPM figure is taken over (NVML asks for 100 ms at least).
pub(super) const MIN_WINDOW_MS: UnixMs = 100;
/// How long GPM is left alone once a profiler was found holding the counters.
pub(super) const PROFILER_RETRY_MS: UnixMs = 60_000;

/// The metrics asked, in one call per window.
const METRICS: [GpmMetricId; 14] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::HmmaTensorUtil,
    GpmMetricId::ImmaTensorUtil,
    GpmMetricId::DfmaTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
];

/// A GPM activity (percent, as NVML gives it) in hundredths of a percent.
pub fn gpm_cpct(pct: f64) -> Option<u32> {
    pct.is_finite()
        .then(|| (pct * 100.0).round().clamp(0.0, 10_000.0) as u32)
}

/// A GPM rate (MiB/s, as NVML gives it) in bytes per second.
pub fn gpm_bps(mib_per_s: f64) -> Option<u64> {
    (mib_per_s.is_finite() && mib_per_s >= 0.0).then(|| (mib_per_s * 1_048_576.0).round() as u64)
}

/// The metrics NVML answered, in [`METRICS`] order (that of [`GpmMetrics::NAMES`]:
/// activities first, then rates); a failed one is absent.
pub fn gpm_metrics(answers: &[Option<f64>]) -> GpmMetrics {
    let activities = GpmMetrics::NAMES.len() - 4;
    let values = std::array::from_fn(|k| {
        let v = answers.get(k).copied().flatten()?;
        if k < activities {
            gpm_cpct(v).map(u64::from)
        } else {
            gpm_bps(v)
        }
    });
    // Activities are at most 10 000: they always fit.
    GpmMetrics::from_values(values).unwrap_or_default()
}

/// The GPM readings of a GPU's MIG instances that have one (`migs`: its MIG devices, in
/// the order of `windows`).
fn mig_readings(windows: &[Window<'_>], migs: &[MigDevice<'_>]) -> Vec<MigGpm> {
    windows
        .iter()
        .zip(migs)
        .filter(|(w, _)| !w.last.is_empty())
        .map(|(w, m)| MigGpm {
            mig_uuid: m.info.uuid.clone(),
            gpu_instance_id: m.info.gpu_instance_id,
            gpm: w.last,
        })
        .collect()
}

/// Asks the support query once (logged only; see the module doc).
pub(super) fn query_support(dev: &mut DeviceState<'_>) {
    let answer = dev.device.gpm_support().map_err(|e| e.to_string());
    debug!(gpu = dev.index, answer = ?answer, "GPM support query");
    dev.gpm.query = Some(answer);
    dev.gpm.migs = dev.migs.iter().map(|_| Window::default()).collect();
}

/// What a sample call's failure means.
enum Failure {
    Unsupported,
    ProfilerBusy,
    Lost,
    Other(String),
}

fn failure(e: NvmlError) -> Failure {
    match e {
        NvmlError::NotSupported
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::NoPermission => Failure::Unsupported,
        NvmlError::InUse => Failure::ProfilerBusy,
        NvmlError::GpuLost => Failure::Lost,
        e => Failure::Other(e.to_string()),
    }
}

/// The GPM of the GPU and its MIG instances for this tick: read when `due`, else the last
/// reading carried. Absent for a lost GPU, one without GPM, or while a profiler holds the
/// counters.
pub(super) fn read_gpm(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    due: bool,
    now_ms: UnixMs,
) -> (GpmMetrics, Vec<MigGpm>) {
    if dev.lost {
        dev.gpm.forget();
        return Default::default();
    }
    if !due {
        return (dev.gpm.whole.last, mig_readings(&dev.gpm.migs, &dev.migs));
    }
    if let Some(since) = dev.gpm.busy_since
        && (since..since.saturating_add(PROFILER_RETRY_MS)).contains(&now_ms)
    {
        return Default::default();
    }
    let whole = read_window(dev, timer, None, now_ms);
    let mut busy = matches!(whole, Err(Failure::ProfilerBusy));
    note(dev, None, whole);
    for k in 0..dev.migs.len() {
        let id = dev.migs[k].info.gpu_instance_id;
        if busy || dev.lost || id == NO_INSTANCE_ID {
            continue;
        }
        let r = read_window(dev, timer, Some((k, id)), now_ms);
        busy |= matches!(r, Err(Failure::ProfilerBusy));
        note(dev, Some(k), r);
    }
    if busy {
        if dev.gpm.busy_since.is_none() {
            warn!(
                gpu = dev.index,
                retry_s = PROFILER_RETRY_MS / 1000,
                "GPM counters are held by a profiler (Nsight Compute, DCGM profiling); GPM is absent until it lets go"
            );
        }
        dev.gpm.busy_since = Some(now_ms);
        dev.gpm.forget();
        return Default::default();
    }
    if dev.gpm.busy_since.take().is_some() {
        info!(
            gpu = dev.index,
            "the profiler let go of the GPM counters; GPM is read again"
        );
    }
    if dev.lost {
        dev.gpm.forget();
        return Default::default();
    }
    (dev.gpm.whole.last, mig_readings(&dev.gpm.migs, &dev.migs))
}

/// Records a window's outcome: its reading, or why there is none.
fn note(dev: &mut DeviceState<'_>, mig: Option<usize>, r: Result<(), Failure>) {
    let index = dev.index;
    let query = dev.gpm.query.clone();
    let Some(w) = (match mig {
        None => Some(&mut dev.gpm.whole),
        Some(k) => dev.gpm.migs.get_mut(k),
    }) else {
        return;
    };
    match r {
        Ok(()) => {}
        Err(Failure::Unsupported) => {
            w.unsupported = true;
            w.start = None;
            w.last = GpmMetrics::default();
            debug!(gpu = index, mig = ?mig, "GPM not supported; its metrics stay absent");
        }
        Err(Failure::ProfilerBusy) => {}
        Err(Failure::Lost) => {
            dev.lost = true;
        }
        Err(Failure::Other(why)) => {
            w.start = None;
            w.last = GpmMetrics::default();
            if dev.gpm.warned {
                debug!(gpu = index, mig = ?mig, error = %why, "GPM failed");
            } else {
                dev.gpm.warned = true;
                warn!(gpu = index, mig = ?mig, error = %why, "GPM failed; absent this read, asked again next (further failures logged at debug)");
            }
            return;
        }
    }
    if mig.is_none()
        && !dev.gpm.whole.unsupported
        && !dev.gpm.whole.last.is_empty()
        && let Some(q) = query.filter(|q| !matches!(q, Ok(true)))
    {
        info!(gpu = index, query = ?q, "the GPM support query said otherwise, but GPM samples: using it");
        dev.gpm.query = Some(Ok(true));
    }
}

/// Takes one sample of a window (the GPU's, or MIG device `k`'s GPU instance) and, when
/// its window is long enough, its metrics.
fn read_window(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    mig: Option<(usize, u32)>,
    now_ms: UnixMs,
) -> Result<(), Failure> {
    let w = match mig {
        None => &dev.gpm.whole,
        Some((k, _)) => match dev.gpm.migs.get(k) {
            Some(w) => w,
            None => return Ok(()),
        },
    };
    if w.unsupported {
        return Ok(());
    }
    // Too short a window stays open; a clock that went back starts a new one.
    if w.start
        .as_ref()
        .is_some_and(|(_, at)| (0..MIN_WINDOW_MS).contains(&(now_ms - at)))
    {
        return Ok(());
    }
    let started = Instant::now();
    let sample = match mig {
        None => dev.device.gpm_sample(),
        Some((_, id)) => dev.device.gpm_mig_sample(id),
    };
    let name = if mig.is_some() {
        "gpm_mig_sample"
    } else {
        "gpm_sample"
    };
    timer.record(dev.index, name, started.elapsed());
    let sample = sample.map_err(failure)?;
    let nvml = dev.device.nvml();
    let w = match mig {
        None => &mut dev.gpm.whole,
        Some((k, _)) => match dev.gpm.migs.get_mut(k) {
            Some(w) => w,
            None => return Ok(()),
        },
    };
    let Some((first, first_ms)) = w.start.replace((sample, now_ms)) else {
        return Ok(());
    };
    if now_ms < first_ms {
        return Ok(());
    }
    let Some((second, _)) = w.start.as_ref() else {
        return Ok(());
    };
    let started = Instant::now();
    let answers = gpm_metrics_get(nvml, &first, second, &METRICS);
    timer.record(dev.index, "gpm_metrics_get", started.elapsed());
    drop(first);
    let answers = answers.map_err(failure)?;
    let values: Vec<Option<f64>> = answers
        .into_iter()
        .map(|a: Result<GpmMetricResult, NvmlError>| a.ok().map(|r| r.value))
        .collect();
    w.last = gpm_metrics(&values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activities_are_hundredths_of_a_percent_and_rates_bytes() {
        assert_eq!(gpm_cpct(45.678), Some(4568));
        assert_eq!(gpm_cpct(0.004), Some(0));
        assert_eq!(gpm_cpct(100.2), Some(10_000), "clamped to 100 %");
        assert_eq!(gpm_cpct(-1.0), Some(0));
        assert_eq!(gpm_cpct(f64::NAN), None);
        assert_eq!(gpm_bps(1.0), Some(1_048_576));
        assert_eq!(gpm_bps(-3.0), None);
        assert_eq!(gpm_bps(f64::INFINITY), None);
    }

    #[test]
    fn failed_metrics_are_absent_not_zero() {
        let mut answers = vec![None; METRICS.len()];
        answers[2] = Some(62.5);
        answers[10] = Some(2.0);
        let m = gpm_metrics(&answers);
        assert_eq!(m.tensor_active_cpct, Some(6250));
        assert_eq!(m.pcie_tx_bps, Some(2 * 1_048_576));
        assert_eq!((m.sm_active_cpct, m.nvlink_rx_bps), (None, None));
        assert!(gpm_metrics(&[]).is_empty());
    }
}
