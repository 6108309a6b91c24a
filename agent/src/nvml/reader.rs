//! The per-tick reader: inventory, one sample per device, lost-GPU probing and the
//! NVML calls' error handling and timing.

use super::NvmlOptions;
use super::device::{DeviceState, Metric, MetricSet};
use super::events::{Events, same_handle};
use super::fields::{active_nvlinks, read_fields};
use super::health::{HealthSchedule, read_health};
use super::lists::{ProcessList, process_utilization, running_processes};
use super::mapping::{
    GpuProcess, Reading, brand_name, classify, compute_mode_name, cuda_version_string, field_batch,
    memory_fields, merge_processes, pcie_kib_to_bps, pct, pstate_number, throttle_bits,
};
use super::mig::{discover_migs, mig_processes};
use super::pcie::{self, PCIE, PcieAnswers};
use crate::cgroup::{self, ProcessIdentity, UserNames};
use crate::host;
use gpufleet_core::SourceError;
use gpufleet_core::{
    Event, EventKind, GpuInfo, GpuSample, Inventory, ProcessSample, SamplerCost, Tick, UnixMs,
};
use gpufleet_uplink::cost::{CallTimer, micros};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Everything the NVML source keeps between ticks.
pub(super) struct Reader<'n> {
    /// The library (for system-level queries).
    nvml: &'n Nvml,
    /// One entry per GPU that could be opened, in NVML index order.
    pub(super) devices: Vec<DeviceState<'n>>,
    /// Where `/proc` is.
    proc_root: PathBuf,
    /// Node name, for the inventory.
    hostname: String,
    /// uid → login name, read once.
    users: UserNames,
    /// Identity of each pid seen on a GPU, kept while the pid stays on a GPU (so `/proc`
    /// is read once per process, not once per tick).
    identities: HashMap<u32, ProcessIdentity>,
    /// The Xid / ECC event set, polled at the end of each tick; `None` when no GPU
    /// supports events.
    events: Option<Events<'n>>,
    /// When health counters are read.
    health: HealthSchedule,
}

impl<'n> Reader<'n> {
    pub(super) fn open(nvml: &'n Nvml, opts: NvmlOptions) -> Result<Self, SourceError> {
        let count = nvml.device_count().map_err(|e| SourceError::Nvml {
            call: "device_count",
            reason: e.to_string(),
        })?;
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    warn!(gpu = index, error = %e, "cannot open GPU; it will not be monitored");
                    continue;
                }
            };
            let uuid = match device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    warn!(gpu = index, error = %e, "cannot read GPU UUID; it will not be monitored");
                    continue;
                }
            };
            let mut unsupported = MetricSet::default();
            // A fanless board (an H200 SXM) answers INVALID_ARGUMENT for fan 0, not
            // NOT_SUPPORTED: its fan count says so once.
            if let Ok(0) = device.num_fans() {
                debug!(gpu = index, "no fans; fan speed stays absent");
                unsupported.insert(Metric::Fan);
            }
            let migs = discover_migs(&device, index);
            let links = active_nvlinks(&device);
            let fields = field_batch(&links);
            devices.push(DeviceState {
                migs,
                device,
                index,
                uuid,
                unsupported,
                warned: MetricSet::default(),
                last_util_ts: 0,
                lost: false,
                field_prev: vec![None; fields.len()],
                field_buf: Vec::with_capacity(fields.len()),
                fields,
                links,
                nvlink_unsupported: BTreeMap::new(),
                power_limit: None,
                list_hints: [0; 3],
                pcie_waits: false,
            });
        }
        Ok(Self {
            nvml,
            devices,
            users: UserNames::for_proc_root(&opts.proc_root),
            proc_root: opts.proc_root,
            hostname: opts.hostname,
            identities: HashMap::new(),
            events: Events::register(nvml, count),
            health: HealthSchedule::new(opts.health_interval),
        })
    }

    pub(super) fn inventory(&mut self) -> Inventory {
        let gpus = self
            .devices
            .iter()
            .map(|s| {
                let d = &s.device;
                let limits = d.power_management_limit_constraints().ok();
                let cc = d.cuda_compute_capability().ok();
                GpuInfo {
                    index: s.index,
                    uuid: s.uuid.clone(),
                    name: d.name().unwrap_or_else(|_| "unknown NVIDIA GPU".into()),
                    serial: d.serial().ok(),
                    pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                    architecture: d.architecture().ok().map(|a| a.to_string()),
                    brand: d.brand().ok().map(brand_name),
                    memory_total_bytes: d.memory_info().ok().map(|m| m.total),
                    power_limit_default_mw: d.power_management_limit_default().ok(),
                    power_limit_enforced_mw: d.enforced_power_limit().ok(),
                    power_limit_min_mw: limits.as_ref().map(|l| l.min_limit),
                    power_limit_max_mw: limits.as_ref().map(|l| l.max_limit),
                    max_clock_sm_mhz: d.max_clock_info(Clock::SM).ok(),
                    max_clock_mem_mhz: d.max_clock_info(Clock::Memory).ok(),
                    max_clock_graphics_mhz: d.max_clock_info(Clock::Graphics).ok(),
                    nvlink_count: u32::try_from(s.links.len()).ok(),
                    mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
                    compute_mode: d
                        .compute_mode()
                        .ok()
                        .map(|m| compute_mode_name(m).to_owned()),
                    persistence_mode: d.is_in_persistent_mode().ok(),
                    cuda_capability_major: cc.as_ref().and_then(|c| u32::try_from(c.major).ok()),
                    cuda_capability_minor: cc.as_ref().and_then(|c| u32::try_from(c.minor).ok()),
                    pcie_link_gen_max: d.max_pcie_link_gen().ok(),
                    pcie_link_width_max: d.max_pcie_link_width().ok(),
                    vbios_version: d.vbios_version().ok(),
                    mig_instances: s.migs.iter().map(|m| m.info.clone()).collect(),
                    temp_slowdown_c: d.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
                    temp_shutdown_c: d.temperature_threshold(TemperatureThreshold::Shutdown).ok(),
                    temp_gpu_max_c: d.temperature_threshold(TemperatureThreshold::GpuMax).ok(),
                    temp_mem_max_c: d
                        .temperature_threshold(TemperatureThreshold::MemoryMax)
                        .ok(),
                }
            })
            .collect();
        Inventory {
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_driver_version: self
                .nvml
                .sys_cuda_driver_version()
                .ok()
                .map(cuda_version_string),
            nvml_version: self.nvml.sys_nvml_version().ok(),
            gpus,
            host: host::host_info(&self.proc_root, &self.hostname),
        }
    }

    pub(super) fn sample(&mut self, now_ms: UnixMs) -> Tick {
        let mut timer = CallTimer::new();
        let mut tick = Tick {
            time_ms: now_ms,
            gpus: Vec::with_capacity(self.devices.len()),
            ..Default::default()
        };
        let mut seen_pids = Vec::new();
        let health_due = self.health.due(now_ms);
        // The PCIe calls that wait are made first, side by side (see `pcie`).
        let mut pcie = pcie::read_side_by_side(&self.devices).into_iter();
        for dev in &mut self.devices {
            if dev.lost && probe_lost(self.nvml, dev, &mut timer) {
                info!(gpu = dev.index, uuid = %dev.uuid, "GPU answers again; sampling it");
                tick.events.push(Event {
                    time_ms: now_ms,
                    gpu_uuid: dev.uuid.clone(),
                    kind: EventKind::GpuRecovered,
                    code: None,
                    detail: format!("GPU {} answers again", dev.index),
                });
            }
            let was_lost = dev.lost;
            let (sample, procs) = sample_device(dev, &mut timer, now_ms, pcie.next().flatten());
            let mig_of = mig_processes(dev, &mut timer);
            // A lost GPU's counters cannot be read: its last health stays the one known.
            // Read before the lost check: a GPU lost during this read is reported too.
            if health_due && !dev.lost {
                tick.health.push(read_health(dev, &mut timer));
                if dev.lost {
                    // As `sample_device` does: nothing cached is reported for a lost GPU.
                    dev.power_limit = None;
                }
            }
            if dev.lost && !was_lost {
                tick.events.push(Event {
                    time_ms: now_ms,
                    gpu_uuid: dev.uuid.clone(),
                    kind: EventKind::GpuLost,
                    code: None,
                    detail: format!(
                        "GPU {} has fallen off the bus or is otherwise inaccessible",
                        dev.index
                    ),
                });
            }
            for p in procs {
                seen_pids.push(p.pid);
                let id = self
                    .identities
                    .entry(p.pid)
                    .or_insert_with(|| cgroup::identify_with(&self.proc_root, p.pid, &self.users));
                tick.processes.push(ProcessSample {
                    gpu_uuid: dev.uuid.clone(),
                    pid: p.pid,
                    process_type: p.process_type,
                    user: id.user.clone(),
                    command: id.command.clone(),
                    gpu_mem_bytes: p.used_bytes,
                    sm_util_pct: p.sm_pct,
                    mem_util_pct: p.mem_pct,
                    enc_util_pct: p.enc_pct,
                    dec_util_pct: p.dec_pct,
                    workload: id.workload.clone(),
                    mig_uuid: mig_of.get(&p.pid).cloned(),
                });
            }
            tick.gpus.push(sample);
        }
        self.identities.retain(|pid, _| seen_pids.contains(pid));
        if let Some(events) = &mut self.events {
            let devices = &self.devices;
            tick.events.extend(events.poll(now_ms, |d| {
                devices
                    .iter()
                    .find(|s| same_handle(&s.device, d))
                    .map(|s| s.uuid.clone())
            }));
        }
        if tick.events.iter().any(|e| {
            matches!(
                e.kind,
                EventKind::Xid | EventKind::EccDoubleBit | EventKind::GpuLost
            )
        }) {
            self.health.event_seen();
        }
        tick.cost = Some(SamplerCost {
            // NVML runs on the sampling thread: the sampler measures that thread's CPU.
            cpu_us: None,
            wall_us: None,
            source_us: Some(micros(timer.total())),
            slowest_calls_us: timer.slowest_us(),
        });
        tick
    }
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
fn value_of<T>(dev: &mut DeviceState<'_>, metric: Metric, reading: Reading<T>) -> Option<T> {
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
fn settle<T>(
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

/// One device's tick: its sample and its processes.
pub(super) fn sample_device(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    now_ms: UnixMs,
    mut pcie: Option<PcieAnswers>,
) -> (GpuSample, Vec<GpuProcess>) {
    let util = read(dev, timer, Metric::Utilization, |d| d.utilization_rates());
    let mem = read(dev, timer, Metric::Memory, |d| d.memory_info()).map(|m| memory_fields(&m));
    let power_mw = read(dev, timer, Metric::Power, |d| d.power_usage());
    let power_limit_mw = if dev.power_limit_due(now_ms) {
        let limit = read(dev, timer, Metric::PowerLimit, |d| d.enforced_power_limit());
        dev.power_limit = Some((limit, now_ms));
        limit
    } else {
        dev.power_limit.and_then(|(limit, _)| limit)
    };
    let energy_mj = read(dev, timer, Metric::Energy, |d| d.total_energy_consumption());
    let temp_gpu_c = read(dev, timer, Metric::TempGpu, |d| {
        d.temperature(TemperatureSensor::Gpu)
    });
    let fan_pct = read(dev, timer, Metric::Fan, |d| d.fan_speed(0)).map(pct);
    let clock_sm_mhz = read(dev, timer, Metric::ClockSm, |d| d.clock_info(Clock::SM));
    let clock_mem_mhz = read(dev, timer, Metric::ClockMem, |d| {
        d.clock_info(Clock::Memory)
    });
    let clock_graphics_mhz = read(dev, timer, Metric::ClockGraphics, |d| {
        d.clock_info(Clock::Graphics)
    });
    let pstate =
        read(dev, timer, Metric::Pstate, |d| d.performance_state()).and_then(pstate_number);
    // Answered at the start of the tick (see `pcie`), or asked now; settled alike.
    let mut pcie_took = Duration::ZERO;
    let [pcie_tx_bps, pcie_rx_bps] = PCIE.map(|(metric, counter)| {
        if dev.lost || dev.unsupported.contains(metric) {
            return None;
        }
        let (result, took) = pcie
            .as_mut()
            .and_then(|p| p.take(metric))
            .unwrap_or_else(|| {
                let start = Instant::now();
                (dev.device.pcie_throughput(counter), start.elapsed())
            });
        pcie_took = pcie_took.max(took);
        let reading = settle(dev, timer, metric, result, took);
        value_of(dev, metric, reading).map(pcie_kib_to_bps)
    });
    dev.pcie_waits = pcie_took >= pcie::WAITS;
    let ecc_corrected = read(dev, timer, Metric::EccCorrected, |d| {
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
    });
    let ecc_uncorrected = read(dev, timer, Metric::EccUncorrected, |d| {
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
    });
    let throttle = read(dev, timer, Metric::Throttle, |d| {
        d.current_throttle_reasons()
    })
    .map(throttle_bits);
    let enc =
        read(dev, timer, Metric::Encoder, |d| d.encoder_utilization()).map(|u| pct(u.utilization));
    let dec =
        read(dev, timer, Metric::Decoder, |d| d.decoder_utilization()).map(|u| pct(u.utilization));
    let fields = read_fields(dev, timer, now_ms);
    let mut hints = dev.list_hints;
    let compute = read(dev, timer, Metric::ComputeProcs, |d| {
        running_processes(d, ProcessList::Compute, &mut hints[0])
    });
    let graphics = read(dev, timer, Metric::GraphicsProcs, |d| {
        running_processes(d, ProcessList::Graphics, &mut hints[1])
    });
    // The utilization samples only ever annotate the listed processes, and on a real
    // driver the call costs milliseconds of CPU even when it finds none (2.3 ms on an
    // H200): with no process listed it is not made, and the next one starts afresh.
    let listed = |l: &Option<Vec<ProcessInfo>>| l.as_ref().is_some_and(|l| !l.is_empty());
    let util_samples = if listed(&compute) || listed(&graphics) {
        let since = if dev.last_util_ts == 0 {
            // First call: the last second, not the driver's whole buffer.
            (now_ms.max(1000) as u64 - 1000) * 1000
        } else {
            dev.last_util_ts
        };
        read(dev, timer, Metric::ProcessUtil, |d| {
            process_utilization(d, since, &mut hints[2])
        })
    } else {
        dev.last_util_ts = 0;
        None
    };
    dev.list_hints = hints;
    if let Some(newest) = util_samples
        .as_ref()
        .and_then(|s| s.iter().map(|u| u.timestamp).max())
    {
        dev.last_util_ts = newest.max(dev.last_util_ts);
    }
    let processes = merge_processes(
        compute.as_deref().unwrap_or(&[]),
        graphics.as_deref().unwrap_or(&[]),
        util_samples.as_deref(),
    );
    if dev.lost {
        // Nothing cached is reported for a lost GPU; read again once it answers.
        dev.power_limit = None;
    }
    let sample = GpuSample {
        gpu_uuid: dev.uuid.clone(),
        util_gpu_pct: util.as_ref().map(|u| pct(u.gpu)),
        util_mem_pct: util.as_ref().map(|u| pct(u.memory)),
        mem_used_bytes: mem.map(|m| m.used),
        mem_total_bytes: mem.map(|m| m.total),
        mem_reserved_bytes: mem.map(|m| m.reserved),
        power_mw,
        power_instant_mw: fields.power_instant_mw,
        power_limit_mw,
        energy_mj,
        temp_gpu_c,
        temp_mem_c: fields.temp_mem_c,
        fan_pct,
        clock_sm_mhz,
        clock_mem_mhz,
        clock_graphics_mhz,
        pstate,
        pcie_tx_bps,
        pcie_rx_bps,
        nvlink_tx_bps: fields.nvlink_tx_bps,
        nvlink_rx_bps: fields.nvlink_rx_bps,
        nvlinks: fields.nvlinks,
        ecc_corrected_volatile: ecc_corrected,
        ecc_uncorrected_volatile: ecc_uncorrected,
        throttle_reasons: throttle,
        enc_util_pct: enc,
        dec_util_pct: dec,
    };
    (sample, processes)
}

/// Asks a lost GPU, through a fresh handle, whether it answers again; on success the
/// handle replaces the old one and the GPU is sampled from this tick on.
pub(super) fn probe_lost<'n>(
    nvml: &'n Nvml,
    dev: &mut DeviceState<'n>,
    timer: &mut CallTimer,
) -> bool {
    let start = Instant::now();
    let fresh = nvml
        .device_by_uuid(dev.uuid.as_str())
        .and_then(|d| d.uuid().map(|_| d));
    timer.record(dev.index, "probe_lost", start.elapsed());
    match fresh {
        Ok(device) => {
            dev.device = device;
            dev.lost = false;
            true
        }
        Err(e) => {
            debug!(gpu = dev.index, error = %e, "GPU still lost");
            false
        }
    }
}
